//! The partition leader's log entry codec (`partition_leader::storage`): any stored bytes
//! decode to entries or a storage error, never a panic or an allocation the bytes cannot back;
//! and arbitrary entries (data with null or empty keys and values and repeated headers,
//! markers), alone or as a run, decode to exactly what was encoded.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use partition_leader::core::{ControlRecord, DataRecord, Header, LogEntry};
use partition_leader::storage::{decode_entry, decode_run, encode_entry, encode_run};

#[derive(Arbitrary, Debug)]
enum Entry {
    Data {
        producer_id: i64,
        producer_epoch: i16,
        is_transactional: bool,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        timestamp_ms: i64,
        headers: Vec<(String, Option<Vec<u8>>)>,
    },
    Control {
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_id: i32,
        coordinator_generation: i64,
        timestamp_ms: i64,
    },
}

impl Entry {
    fn into_log(self) -> LogEntry {
        match self {
            Entry::Data {
                producer_id,
                producer_epoch,
                is_transactional,
                key,
                value,
                timestamp_ms,
                headers,
            } => LogEntry::Data(DataRecord {
                producer_id,
                producer_epoch,
                is_transactional,
                null_key: key.is_none(),
                key: key.unwrap_or_default(),
                null_value: value.is_none(),
                value: value.unwrap_or_default(),
                timestamp_ms,
                headers: headers
                    .into_iter()
                    .map(|(key, value)| Header { key, value })
                    .collect(),
            }),
            Entry::Control {
                producer_id,
                producer_epoch,
                commit,
                coordinator_id,
                coordinator_generation,
                timestamp_ms,
            } => LogEntry::Control(ControlRecord {
                producer_id,
                producer_epoch,
                commit,
                coordinator_id,
                coordinator_generation,
                timestamp_ms,
            }),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<Entry>,
    stored: Vec<u8>,
}

fuzz_target!(|input: Input| {
    // Whatever is stored: an answer, never a panic.
    let _ = decode_entry(&input.stored);
    let _ = decode_run(&input.stored);

    let entries: Vec<LogEntry> = input.entries.into_iter().map(Entry::into_log).collect();
    for entry in &entries {
        assert_eq!(&decode_entry(&encode_entry(entry)).unwrap(), entry);
    }
    if !entries.is_empty() {
        assert_eq!(decode_run(&encode_run(&entries)).unwrap(), entries);
    }
});
