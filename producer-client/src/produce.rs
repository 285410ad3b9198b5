//! What both producers share: building record batches, resolving a target to a partition, and
//! sending one Produce with retries (the raw requests of [`crate::RawRequests`]; the producers
//! send through the pipeline).
//!
//! A Produce is retried with the *same* batch (same PID, epoch and base sequence): if the first
//! attempt was appended and only its answer was lost, the leader recognises the duplicate among
//! the PID's last five batches and answers with the original offset (idempotence).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cluster::TopicPartition;
use proto::{ProduceRequest, Record, RecordBatch};

use crate::error::{Error, Result, WireError};
use crate::net::Connections;
use crate::partitioner::{partition_for_key, Target};

/// Where a record landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordMetadata {
    /// Topic and partition.
    pub partition: TopicPartition,
    /// Offset of the (first) record.
    pub offset: i64,
    /// The leader recognised the batch as a retry of one it had already appended.
    pub duplicate: bool,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn records(key: &[u8], values: Vec<Vec<u8>>) -> Vec<Record> {
    let timestamp_ms = now_ms();
    values
        .into_iter()
        .map(|value| Record {
            key: key.to_vec(),
            value,
            timestamp_ms,
            headers: Vec::new(),
            null_key: false,
            null_value: false,
        })
        .collect()
}

/// A batch of `records` from (PID, epoch) starting at `base_sequence`; transactional when it
/// names a `transactional_id`.
pub(crate) fn batch(
    (producer_id, epoch): (i64, i16),
    base_sequence: i32,
    transactional_id: Option<&str>,
    records: Vec<Record>,
) -> RecordBatch {
    RecordBatch {
        producer_id,
        producer_epoch: i32::from(epoch),
        base_sequence,
        is_transactional: transactional_id.is_some(),
        transactional_id: transactional_id.unwrap_or_default().to_string(),
        records,
    }
}

/// Resolves a [`Target`] to a partition of `topic`, checking that it exists.
pub(crate) async fn resolve(
    conn: &Connections,
    topic: &str,
    target: &Target,
) -> Result<TopicPartition> {
    let count = conn.partition_count(topic).await?;
    let partition = match target {
        Target::Partition(p) | Target::PartitionWithKey(p, _) => *p,
        Target::Key(key) => partition_for_key(key, count),
    };
    if !(0..count).contains(&partition) {
        return Err(Error::Server {
            code: proto::ErrorCode::UnknownTopicOrPartition,
            message: format!("{topic} has {count} partitions, not {partition}"),
        });
    }
    Ok(TopicPartition::new(topic, partition))
}

/// Sends one batch to the partition's leader, retrying retriable errors with the same batch.
pub(crate) async fn produce(
    conn: &Connections,
    tp: &TopicPartition,
    batch: RecordBatch,
) -> Result<RecordMetadata> {
    let mut backoff = conn.backoff();
    loop {
        let leader = conn.leader_for(&tp.topic, tp.partition).await?;
        let mut client = conn.leader(&leader.address)?;
        let request = ProduceRequest {
            topic: tp.topic.clone(),
            partition: tp.partition,
            batch: Some(batch.clone()),
        };
        let result = conn
            .rpc(&leader.address, Duration::ZERO, client.produce(request))
            .await
            .and_then(WireError::checked);
        match result {
            Ok(r) => {
                tracing::debug!(%tp, pid = batch.producer_id, epoch = batch.producer_epoch,
                    seq = batch.base_sequence, offset = r.base_offset, duplicate = r.duplicate, "produced");
                return Ok(RecordMetadata {
                    partition: tp.clone(),
                    offset: r.base_offset,
                    duplicate: r.duplicate,
                });
            }
            Err(e) if e.is_retriable() => {
                if matches!(e, Error::NotLeader(_)) {
                    conn.invalidate_metadata();
                }
                tracing::debug!(%tp, error = %e, "produce failed; retrying");
                if !backoff.wait_for(&e).await {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}
