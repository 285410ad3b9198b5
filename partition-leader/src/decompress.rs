//! Bounded decompression of a produced record batch's records (the Kafka face).
//!
//! A compressed batch is small on the wire and may be huge once inflated: a 64 MiB gzip frame of
//! zeros inflates to tens of gigabytes, and a 5-byte snappy header may claim 4 GiB. The decoder
//! of `kafka-protocol` inflates everything it is given, before any size check, so the leader
//! hands it this function instead: it stops at `limit` bytes of output and answers
//! [`DecompressError::TooLarge`] (MESSAGE_TOO_LARGE), so a request never costs more memory than
//! the batch limits allow, whatever its bytes claim.
//!
//! Formats: gzip (one or more members, as Kafka's `GZIPInputStream` reads them), snappy in the
//! xerial framing Kafka's clients write and raw snappy (the fallback Kafka accepts too); lz4 and
//! zstd are not built in ([`DecompressError::Unsupported`], UNSUPPORTED_COMPRESSION_TYPE).

use std::io::Read;

use bytes::Bytes;
use kafka_protocol::records::Compression;

/// The xerial snappy stream header: magic, version 1, compatible version 1.
const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";

/// Why a batch's records could not be decompressed.
#[derive(Debug, thiserror::Error)]
pub enum DecompressError {
    /// A codec this leader is built without.
    #[error("{0:?} compression is not supported by this broker")]
    Unsupported(Compression),
    /// The output would exceed the limit (nothing beyond it was inflated).
    #[error("the batch's records decompress to more than {0} bytes")]
    TooLarge(usize),
    /// Bytes the codec rejects.
    #[error("corrupt {codec} data: {detail}")]
    Corrupt {
        /// The codec.
        codec: &'static str,
        /// What it said.
        detail: String,
    },
}

/// The records of a batch compressed with `compression`, inflated to at most `limit` bytes.
pub fn decompress(
    records: &Bytes,
    compression: Compression,
    limit: usize,
) -> Result<Bytes, DecompressError> {
    match compression {
        Compression::None => Ok(records.clone()),
        Compression::Gzip => gzip(records, limit).map(Bytes::from),
        Compression::Snappy => snappy(records, limit).map(Bytes::from),
        other => Err(DecompressError::Unsupported(other)),
    }
}

fn corrupt(codec: &'static str, detail: impl ToString) -> DecompressError {
    DecompressError::Corrupt {
        codec,
        detail: detail.to_string(),
    }
}

fn gzip(records: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    let mut out = Vec::new();
    // One byte past the limit tells "exactly the limit" from "more".
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    flate2::read::MultiGzDecoder::new(records)
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| corrupt("gzip", e))?;
    if out.len() > limit {
        return Err(DecompressError::TooLarge(limit));
    }
    Ok(out)
}

fn snappy(records: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    let mut out = Vec::new();
    let mut decoder = snap::raw::Decoder::new();
    let mut block = |compressed: &[u8], out: &mut Vec<u8>| {
        // The block's claimed length is checked before anything is allocated for it.
        let len = snap::raw::decompress_len(compressed).map_err(|e| corrupt("snappy", e))?;
        let start = out.len();
        if start.saturating_add(len) > limit {
            return Err(DecompressError::TooLarge(limit));
        }
        out.resize(start + len, 0);
        let written = decoder
            .decompress(compressed, &mut out[start..])
            .map_err(|e| corrupt("snappy", e))?;
        out.truncate(start + written);
        Ok(())
    };
    let Some(mut rest) = records.strip_prefix(XERIAL_HEADER.as_slice()) else {
        block(records, &mut out)?;
        return Ok(out);
    };
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(corrupt("snappy", "a truncated block length"));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if tail.len() < len {
            return Err(corrupt(
                "snappy",
                format!("a block of {len} bytes with {} left", tail.len()),
            ));
        }
        let (compressed, next) = tail.split_at(len);
        block(compressed, &mut out)?;
        rest = next;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzipped(data: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        Bytes::from(e.finish().unwrap())
    }

    fn xerial(blocks: &[&[u8]]) -> Bytes {
        let mut out = XERIAL_HEADER.to_vec();
        for b in blocks {
            let c = snap::raw::Encoder::new().compress_vec(b).unwrap();
            out.extend_from_slice(&(c.len() as u32).to_be_bytes());
            out.extend_from_slice(&c);
        }
        Bytes::from(out)
    }

    #[test]
    fn each_codec_round_trips_within_the_limit() {
        let data = b"records ".repeat(100);
        assert_eq!(
            decompress(&gzipped(&data), Compression::Gzip, 800).unwrap(),
            data
        );
        assert_eq!(
            decompress(
                &xerial(&[&data[..300], &data[300..]]),
                Compression::Snappy,
                800
            )
            .unwrap(),
            data
        );
        let raw = Bytes::from(snap::raw::Encoder::new().compress_vec(&data).unwrap());
        assert_eq!(decompress(&raw, Compression::Snappy, 800).unwrap(), data);
        let plain = Bytes::from(data.clone());
        assert_eq!(decompress(&plain, Compression::None, 1).unwrap(), plain);
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 16 MiB of zeros: about 16 KiB of gzip.
        let bomb = gzipped(&vec![0u8; 16 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert!(matches!(
            decompress(&bomb, Compression::Gzip, 1 << 20),
            Err(DecompressError::TooLarge(_))
        ));
        assert!(matches!(
            decompress(
                &xerial(&[&[0u8; 600], &[0u8; 600]]),
                Compression::Snappy,
                1000
            ),
            Err(DecompressError::TooLarge(1000))
        ));
        // A raw snappy header claiming ~4 GiB: refused before anything is allocated.
        let claim = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x00]);
        assert!(matches!(
            decompress(&claim, Compression::Snappy, 1 << 20),
            Err(DecompressError::TooLarge(_))
        ));
    }

    #[test]
    fn garbage_and_unbuilt_codecs_are_typed_errors() {
        let garbage = Bytes::from_static(b"\x1f\x8b not really gzip");
        assert!(matches!(
            decompress(&garbage, Compression::Gzip, 1 << 20),
            Err(DecompressError::Corrupt { codec: "gzip", .. })
        ));
        let mut truncated = xerial(&[b"abc"]).to_vec();
        truncated.truncate(truncated.len() - 1);
        assert!(matches!(
            decompress(&Bytes::from(truncated), Compression::Snappy, 1 << 20),
            Err(DecompressError::Corrupt {
                codec: "snappy",
                ..
            })
        ));
        for codec in [Compression::Lz4, Compression::Zstd] {
            assert!(matches!(
                decompress(&Bytes::new(), codec, 1),
                Err(DecompressError::Unsupported(_))
            ));
        }
    }
}
