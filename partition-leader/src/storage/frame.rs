//! The record framing of the leader's partition log files: one frame per [`Write`], appended in
//! order. Pure: bytes in, bytes out, no I/O.
//!
//! A frame is `len u32, crc32 u32, payload` (big-endian; the CRC covers the payload). The payload
//! carries everything the write changed, so the file alone can replay a write that the sled
//! checkpoint does not cover yet (see the [`super::SledStorage`] docs): `base_offset i64,
//! high_watermark i64, flags u8` (bit 0: producer state follows, bit 1: an aborted-index entry
//! follows), then if bit 0 `pid i64, len u32, JSON state`, then if bit 1 `len u32, JSON entry`,
//! then the entries as one run ([`super::encode_run`]) to the end of the payload.
//!
//! [`valid_prefix`] reads frames from a file's tail until the first one that is incomplete,
//! fails its CRC or does not follow the previous write: what a crash mid-append leaves (it was
//! never acknowledged, since acknowledging needs the file's fsync).

use cluster::ProducerId;

use super::{decode_run, encode_run_into, from_json, json, run_capacity, Reader, Write};
use crate::core::{AbortedTxn, ProducerState};
use crate::error::{Error, Result};

/// Bytes before the payload: length and CRC.
pub(super) const HEADER: usize = 8;

/// Largest payload a frame may declare (a corrupt length must not make the reader allocate
/// gigabytes). Far above any write a partition accepts (batches are bounded by
/// [`crate::core::MAX_BATCH_BYTES_LIMIT`]); [`encode`] refuses a larger one rather than write a
/// frame no reader would take back.
pub(super) const MAX_PAYLOAD: usize = 256 * 1024 * 1024;

const HAS_PRODUCER: u8 = 1;
const HAS_ABORTED: u8 = 2;

/// Encodes `write` as one frame; a payload over [`MAX_PAYLOAD`] is refused (MESSAGE_TOO_LARGE),
/// nothing written.
pub(super) fn encode(write: &Write) -> Result<Vec<u8>> {
    let producer = write
        .producer
        .as_ref()
        .map(|(pid, state)| (*pid, json(state)));
    let aborted = write.aborted.as_ref().map(json);
    let mut out = Vec::with_capacity(
        HEADER
            + 17
            + producer.as_ref().map_or(0, |(_, s)| 12 + s.len())
            + aborted.as_ref().map_or(0, |a| 4 + a.len())
            + run_capacity(&write.entries),
    );
    out.extend_from_slice(&[0; HEADER]);
    out.extend_from_slice(&write.base_offset.to_be_bytes());
    out.extend_from_slice(&write.high_watermark.to_be_bytes());
    let flags = if producer.is_some() { HAS_PRODUCER } else { 0 }
        | if aborted.is_some() { HAS_ABORTED } else { 0 };
    out.push(flags);
    if let Some((pid, state)) = &producer {
        out.extend_from_slice(&pid.to_be_bytes());
        out.extend_from_slice(&(state.len() as u32).to_be_bytes());
        out.extend_from_slice(state);
    }
    if let Some(a) = &aborted {
        out.extend_from_slice(&(a.len() as u32).to_be_bytes());
        out.extend_from_slice(a);
    }
    encode_run_into(&write.entries, &mut out);
    if out.len() - HEADER > MAX_PAYLOAD {
        return Err(Error::MessageTooLarge(format!(
            "a log frame of {} bytes; the log takes at most {MAX_PAYLOAD}",
            out.len() - HEADER
        )));
    }
    let payload_len = (out.len() - HEADER) as u32;
    let crc = crc32fast::hash(&out[HEADER..]);
    out[..4].copy_from_slice(&payload_len.to_be_bytes());
    out[4..HEADER].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Decodes one whole frame (header included); a corrupt frame is a storage error.
pub(super) fn decode(frame: &[u8]) -> Result<Write> {
    let Some(payload) = payload(frame)? else {
        return Err(Error::Storage("corrupt log frame: truncated".into()));
    };
    if HEADER + payload.len() != frame.len() {
        return Err(Error::Storage("corrupt log frame: trailing bytes".into()));
    }
    decode_payload(payload)
}

/// The payload of the frame at the start of `bytes`, if a whole frame with a matching CRC is
/// there (`None`: incomplete; an error: a bad CRC or an impossible length).
fn payload(bytes: &[u8]) -> Result<Option<&[u8]>> {
    if bytes.len() < HEADER {
        return Ok(None);
    }
    let len = u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_be_bytes(bytes[4..HEADER].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(Error::Storage(format!("corrupt log frame: length {len}")));
    }
    let Some(payload) = bytes.get(HEADER..HEADER + len) else {
        return Ok(None);
    };
    if crc32fast::hash(payload) != crc {
        return Err(Error::Storage("corrupt log frame: CRC mismatch".into()));
    }
    Ok(Some(payload))
}

fn decode_payload(payload: &[u8]) -> Result<Write> {
    let mut r = Reader(payload);
    let base_offset = i64::from_be_bytes(r.array()?);
    let high_watermark = i64::from_be_bytes(r.array()?);
    let flags = r.u8()?;
    if flags & !(HAS_PRODUCER | HAS_ABORTED) != 0 {
        return Err(Error::Storage(format!("corrupt log frame: flags {flags}")));
    }
    let producer = if flags & HAS_PRODUCER != 0 {
        let pid: ProducerId = i64::from_be_bytes(r.array()?);
        let state: ProducerState = from_json(r.bytes_ref()?)?;
        Some((pid, state))
    } else {
        None
    };
    let aborted: Option<AbortedTxn> = if flags & HAS_ABORTED != 0 {
        Some(from_json(r.bytes_ref()?)?)
    } else {
        None
    };
    let entries = decode_run(r.0)?;
    if base_offset + entries.len() as i64 != high_watermark {
        return Err(Error::Storage(format!(
            "corrupt log frame: {} entries at {base_offset} do not end at {high_watermark}",
            entries.len()
        )));
    }
    Ok(Write {
        base_offset,
        entries,
        producer,
        aborted,
        high_watermark,
    })
}

/// A frame read back by [`valid_prefix`]: where it is and what it wrote.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Replayed {
    /// Position of the frame in the file.
    pub(super) position: u64,
    /// The frame's length, header included.
    pub(super) len: u32,
    pub(super) write: Write,
}

/// The frames of `tail` (a file's bytes from position `start`) that form a valid continuation
/// of a log ending at offset `next_offset`, and the file position where that prefix ends.
/// Stops at the first incomplete, corrupt or non-consecutive frame.
pub(super) fn valid_prefix(tail: &[u8], start: u64, mut next_offset: i64) -> (Vec<Replayed>, u64) {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while let Ok(Some(payload)) = payload(&tail[at..]) {
        let Ok(write) = decode_payload(payload) else {
            break;
        };
        if write.base_offset != next_offset {
            break;
        }
        let len = HEADER + payload.len();
        next_offset = write.high_watermark;
        frames.push(Replayed {
            position: start + at as u64,
            len: len as u32,
            write,
        });
        at += len;
    }
    (frames, start + at as u64)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::core::{BatchMetadata, ControlRecord, DataRecord, LogEntry};

    fn write(base: i64, n: usize, with_meta: bool) -> Write {
        let entries: Vec<_> = (0..n)
            .map(|i| {
                LogEntry::Data(DataRecord {
                    producer_id: 5,
                    producer_epoch: 1,
                    is_transactional: with_meta,
                    key: vec![i as u8],
                    null_key: false,
                    value: vec![b'v'; 10 + i],
                    null_value: false,
                    timestamp_ms: 9,
                    headers: Vec::new(),
                })
            })
            .collect();
        let state = ProducerState {
            epoch: 1,
            batches: VecDeque::from([BatchMetadata {
                first_seq: 0,
                last_seq: n as i32 - 1,
                base_offset: base,
            }]),
            txn_first_offset: Some(base),
            txn_number: Some(4),
            ended_number: None,
            coordinator_generation: 3,
            last_update_ms: 9,
        };
        Write {
            base_offset: base,
            high_watermark: base + n as i64,
            entries,
            producer: with_meta.then_some((5, state)),
            aborted: with_meta.then_some(AbortedTxn {
                producer_id: 5,
                first_offset: base,
                last_offset: base + n as i64,
            }),
        }
    }

    fn marker(base: i64) -> Write {
        Write {
            base_offset: base,
            high_watermark: base + 1,
            entries: vec![LogEntry::Control(ControlRecord {
                producer_id: 5,
                producer_epoch: 2,
                commit: true,
                coordinator_id: 1,
                coordinator_generation: 3,
                timestamp_ms: 10,
            })],
            producer: None,
            aborted: None,
        }
    }

    #[test]
    fn frames_round_trip_and_reject_corruption() {
        for w in [write(0, 3, true), write(7, 1, false), marker(4)] {
            let frame = encode(&w).unwrap();
            assert_eq!(decode(&frame).unwrap(), w);
            for cut in 0..frame.len() {
                assert!(decode(&frame[..cut]).is_err(), "cut at {cut}");
            }
            for flip in HEADER..frame.len() {
                let mut bad = frame.clone();
                bad[flip] ^= 0x40;
                assert!(decode(&bad).is_err(), "flipped byte {flip}");
            }
            let mut longer = frame.clone();
            longer.push(0);
            assert!(decode(&longer).is_err());
        }
        // A forged length never makes the reader allocate.
        let mut forged = encode(&marker(0)).unwrap();
        forged[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&forged).is_err());
    }

    #[test]
    fn the_valid_prefix_stops_at_a_torn_corrupt_or_foreign_frame() {
        let writes = [write(10, 3, true), marker(13), write(14, 2, false)];
        let mut file = Vec::new();
        for w in &writes {
            file.extend(encode(w).unwrap());
        }
        let whole = file.len() as u64;
        let (frames, end) = valid_prefix(&file, 100, 10);
        assert_eq!(end, 100 + whole);
        assert_eq!(
            frames.iter().map(|f| f.write.clone()).collect::<Vec<_>>(),
            writes.to_vec()
        );
        assert_eq!(frames[1].position, 100 + frames[0].len as u64);
        // Torn at every byte of the last frame: the first two remain.
        let two = (frames[0].len + frames[1].len) as usize;
        for cut in two..file.len() {
            let (frames, end) = valid_prefix(&file[..cut], 0, 10);
            assert_eq!(frames.len(), 2);
            assert_eq!(end, two as u64);
        }
        // A corrupt second frame ends the prefix after the first.
        let mut bad = file.clone();
        bad[frames[0].len as usize + HEADER + 3] ^= 1;
        assert_eq!(valid_prefix(&bad, 0, 10).0.len(), 1);
        // Frames that do not continue the log are not replayed.
        assert!(valid_prefix(&file, 0, 11).0.is_empty());
        // Garbage after the last frame (an append that failed half-way) is ignored.
        let mut garbage = file.clone();
        garbage.extend_from_slice(&[0xff; 40]);
        assert_eq!(valid_prefix(&garbage, 100, 10), (frames, 100 + whole));
    }

    /// A write whose frame would be over the largest payload a reader takes back is refused
    /// before anything is written (an unreadable frame would cut the log at the next restart).
    #[test]
    fn a_frame_over_the_readable_size_is_refused() {
        let mut w = write(0, 1, false);
        if let LogEntry::Data(d) = &mut w.entries[0] {
            d.value = vec![0; MAX_PAYLOAD];
        }
        let err = encode(&w).unwrap_err();
        assert!(matches!(err, Error::MessageTooLarge(_)), "{err}");
        if let LogEntry::Data(d) = &mut w.entries[0] {
            d.value.truncate(MAX_PAYLOAD - 1024);
        }
        assert_eq!(decode(&encode(&w).unwrap()).unwrap(), w);
    }
}
