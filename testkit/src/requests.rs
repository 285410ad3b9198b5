//! Request builders and reply readers that tests of more than one crate (or of the same crate
//! in process and over gRPC) need: the same protocol message, written once.

use proto::{
    EndTxnRequest, ErrorCode, FetchRequest, FetchResponse, IsolationLevel, RecordBatch, TxnResult,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};

/// The wire value of a COMMIT (`true`) or ABORT result.
pub fn txn_result(commit: bool) -> i32 {
    let result = if commit {
        TxnResult::Commit
    } else {
        TxnResult::Abort
    };
    result as i32
}

/// EndTxn for `id` with the caller's `(PID, epoch)`.
pub fn end_txn(id: &str, (producer_id, producer_epoch): (i64, i32), commit: bool) -> EndTxnRequest {
    EndTxnRequest {
        transactional_id: id.to_string(),
        producer_id,
        producer_epoch,
        result: txn_result(commit),
    }
}

/// A Fetch of `topic-partition` from `offset`, read_committed or read_uncommitted.
pub fn fetch(
    topic: &str,
    partition: i32,
    offset: i64,
    committed: bool,
    max_bytes: i32,
    max_wait_ms: i32,
) -> FetchRequest {
    FetchRequest {
        topic: topic.to_string(),
        partition,
        offset,
        max_bytes,
        isolation_level: if committed {
            IsolationLevel::ReadCommitted as i32
        } else {
            IsolationLevel::ReadUncommitted as i32
        },
        max_wait_ms,
    }
}

/// WriteTxnMarkers from coordinator 1 at `generation` for `(topic, partition)` pairs.
pub fn markers(
    producer_id: i64,
    producer_epoch: i32,
    commit: bool,
    generation: i64,
    partitions: &[(&str, i32)],
) -> WriteTxnMarkersRequest {
    WriteTxnMarkersRequest {
        producer_id,
        producer_epoch,
        result: txn_result(commit),
        coordinator_id: 1,
        coordinator_generation: generation,
        transactional_id: String::new(),
        auth: None,
        transaction_version: 2,
        transaction_number: 0,
        partitions: partitions
            .iter()
            .map(|(topic, partition)| proto::TopicPartition {
                topic: topic.to_string(),
                partition: *partition,
            })
            .collect(),
    }
}

/// A batch of string values (`key` on every record, timestamp `timestamp_ms`); transactional
/// when `txn_id` is given.
pub fn batch(
    (producer_id, producer_epoch, base_sequence): (i64, i32, i32),
    values: &[&str],
    txn_id: Option<&str>,
    key: &[u8],
    timestamp_ms: i64,
) -> RecordBatch {
    RecordBatch {
        producer_id,
        producer_epoch,
        base_sequence,
        is_transactional: txn_id.is_some(),
        transactional_id: txn_id.unwrap_or_default().to_string(),
        records: values
            .iter()
            .map(|v| proto::Record {
                key: key.to_vec(),
                null_key: false,
                value: v.as_bytes().to_vec(),
                null_value: false,
                timestamp_ms,
                headers: Vec::new(),
            })
            .collect(),
    }
}

/// A reply's error code as the enum (unknown codes as the proto decodes them).
pub fn code(c: i32) -> ErrorCode {
    ErrorCode::from_wire(c)
}

/// The per-partition codes of a WriteTxnMarkers reply, in request order.
pub fn marker_codes(r: WriteTxnMarkersResponse) -> Vec<ErrorCode> {
    r.results.into_iter().map(|r| code(r.error_code)).collect()
}

/// The values of a fetch, as text.
pub fn values(r: &FetchResponse) -> Vec<String> {
    r.records
        .iter()
        .map(|r| String::from_utf8(r.value.clone()).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_fill_the_wire_fields() {
        assert_eq!(txn_result(true), TxnResult::Commit as i32);
        assert_eq!(end_txn("a", (3, 4), false).result, TxnResult::Abort as i32);
        let f = fetch("t", 1, 5, true, 10, 0);
        assert_eq!(f.isolation_level, IsolationLevel::ReadCommitted as i32);
        let m = markers(1, 2, true, 7, &[("t", 0), ("u", 3)]);
        assert_eq!((m.coordinator_generation, m.partitions.len()), (7, 2));
        let b = batch((1, 0, 5), &["x", "y"], Some("id"), b"k", 9);
        assert!(b.is_transactional);
        assert_eq!(b.records[1].value, b"y");
    }
}
