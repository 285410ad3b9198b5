//! Key -> partition, with Kafka's default partitioner hash (murmur2, sign bit masked), so the
//! mapping is stable across builds, machines and languages.

/// Kafka's `Utils.murmur2`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len() as u32;
    let mut h: u32 = SEED ^ length;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= (tail[2] as u32) << 16;
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition a key goes to among `partitions` (Kafka's `toPositive(murmur2(key)) % n`).
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

/// Where a record goes: an explicit partition, or a key hashed to one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// This partition, no key.
    Partition(i32),
    /// The partition this key hashes to; the key is stored with the record.
    Key(Vec<u8>),
    /// An explicit partition, and a key stored with the record.
    PartitionWithKey(i32, Vec<u8>),
}

impl Target {
    /// The record key, if any.
    pub fn key(&self) -> &[u8] {
        match self {
            Target::Partition(_) => &[],
            Target::Key(k) | Target::PartitionWithKey(_, k) => k,
        }
    }
}

impl From<i32> for Target {
    fn from(p: i32) -> Self {
        Target::Partition(p)
    }
}

impl From<&str> for Target {
    fn from(key: &str) -> Self {
        Target::Key(key.as_bytes().to_vec())
    }
}

impl From<String> for Target {
    fn from(key: String) -> Self {
        Target::Key(key.into_bytes())
    }
}

impl From<&[u8]> for Target {
    fn from(key: &[u8]) -> Self {
        Target::Key(key.to_vec())
    }
}

impl From<Vec<u8>> for Target {
    fn from(key: Vec<u8>) -> Self {
        Target::Key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka() {
        // Values from org.apache.kafka.common.utils.UtilsTest#testMurmur2.
        let cases: [(&[u8], i32); 3] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key), expected, "{:?}", std::str::from_utf8(key));
        }
    }

    #[test]
    fn partitions_are_in_range_and_stable() {
        for key in ["", "a", "order-17", "ünï"] {
            let p = partition_for_key(key.as_bytes(), 3);
            assert!((0..3).contains(&p));
            assert_eq!(p, partition_for_key(key.as_bytes(), 3));
        }
    }

    #[test]
    fn targets_convert_from_partitions_and_keys() {
        assert_eq!(Target::from(2), Target::Partition(2));
        assert_eq!(Target::from("k"), Target::Key(b"k".to_vec()));
        assert_eq!(Target::from(String::from("k")).key(), b"k");
        assert_eq!(Target::Partition(1).key(), b"");
        assert_eq!(Target::PartitionWithKey(1, b"z".to_vec()).key(), b"z");
    }
}
