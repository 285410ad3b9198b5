//! [`Consumer`]: explicit partition assignment, seek, long-poll fetch, and a group's committed
//! offsets.
//!
//! `read_committed` asks the leaders for records below the last stable offset only, without
//! aborted or control records (the leader filters; PROTOCOL.md section 9). The consumer keeps one
//! position per assigned partition and moves it to each Fetch's `next_offset`.
//!
//! CAVEATS: no group membership or rebalancing (assignment is explicit, as Kafka's `assign()`),
//! and no auto-commit: offsets are committed through a transaction
//! ([`crate::TransactionalProducer::send_offsets_to_transaction`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use cluster::TopicPartition;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use proto::{CoordinatorKeyType, FetchRequest, IsolationLevel, OffsetFetchRequest};

use crate::config::ClientConfig;
use crate::error::{Error, Result, WireError};
use crate::net::{Connections, NodeAddr};
use crate::transactional::coordinator_rpc;

/// What a consumer may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Only committed transactional records (and non-transactional ones), below the LSO.
    ReadCommitted,
    /// Everything up to the high watermark, including open and aborted transactions.
    ReadUncommitted,
}

impl Isolation {
    fn wire(self) -> IsolationLevel {
        match self {
            Isolation::ReadCommitted => IsolationLevel::ReadCommitted,
            Isolation::ReadUncommitted => IsolationLevel::ReadUncommitted,
        }
    }
}

/// A record as fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerRecord {
    /// Topic and partition.
    pub partition: TopicPartition,
    /// Offset in the partition.
    pub offset: i64,
    /// Key (may be empty).
    pub key: Vec<u8>,
    /// Value.
    pub value: Vec<u8>,
    /// Kafka's null key (`key` is then empty), as a Kafka client produced it.
    pub null_key: bool,
    /// Kafka's null value, a tombstone (`value` is then empty).
    pub null_value: bool,
    /// Producer timestamp.
    pub timestamp_ms: i64,
    /// Writer's PID (-1 for a plain producer).
    pub producer_id: i64,
    /// Writer's epoch.
    pub producer_epoch: i32,
    /// Written inside a transaction.
    pub is_transactional: bool,
}

/// The high watermark and last stable offset a partition's leader last reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermarks {
    /// End of the log.
    pub high_watermark: i64,
    /// First offset read_committed readers may not see yet.
    pub last_stable_offset: i64,
}

/// A consumer with explicit assignment.
#[derive(Debug)]
pub struct Consumer {
    conn: Connections,
    isolation: Isolation,
    positions: BTreeMap<TopicPartition, i64>,
    watermarks: HashMap<TopicPartition, Watermarks>,
    group_coordinators: HashMap<String, Option<NodeAddr>>,
    max_bytes: i32,
}

impl Consumer {
    /// A consumer (nothing is dialled until the first poll).
    pub fn new(config: ClientConfig, isolation: Isolation) -> Result<Self> {
        Ok(Self {
            conn: Connections::new(config)?,
            isolation,
            positions: BTreeMap::new(),
            watermarks: HashMap::new(),
            group_coordinators: HashMap::new(),
            max_bytes: 1 << 20,
        })
    }

    /// The isolation level.
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// Sets the per-partition Fetch size limit.
    pub fn set_max_bytes(&mut self, max_bytes: i32) {
        self.max_bytes = max_bytes.max(1);
    }

    /// Replaces the assignment; new partitions start at offset 0.
    pub fn assign(&mut self, partitions: impl IntoIterator<Item = TopicPartition>) {
        let old = std::mem::take(&mut self.positions);
        for tp in partitions {
            let position = old.get(&tp).copied().unwrap_or(0);
            self.positions.insert(tp, position);
        }
    }

    /// Assigns every partition of `topics` (from the cluster metadata).
    pub async fn assign_topics(&mut self, topics: &[&str]) -> Result<()> {
        let mut all = Vec::new();
        for topic in topics {
            let count = self.conn.partition_count(topic).await?;
            all.extend((0..count).map(|p| TopicPartition::new(*topic, p)));
        }
        self.assign(all);
        Ok(())
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.positions.keys().cloned().collect()
    }

    /// Moves the position of an assigned partition.
    pub fn seek(&mut self, tp: &TopicPartition, offset: i64) -> Result<()> {
        match self.positions.get_mut(tp) {
            Some(position) => {
                *position = offset;
                Ok(())
            }
            None => Err(Error::IllegalState(format!("{tp} is not assigned"))),
        }
    }

    /// The next offset to fetch from `tp`.
    pub fn position(&self, tp: &TopicPartition) -> Option<i64> {
        self.positions.get(tp).copied()
    }

    /// All positions.
    pub fn positions(&self) -> &BTreeMap<TopicPartition, i64> {
        &self.positions
    }

    /// What the leader of `tp` last reported.
    pub fn watermarks(&self, tp: &TopicPartition) -> Option<Watermarks> {
        self.watermarks.get(tp).copied()
    }

    /// Whether every assigned partition's position has reached the end the isolation level
    /// allows (LSO for read_committed, high watermark otherwise), as of the last fetches.
    pub fn caught_up(&self) -> bool {
        self.positions
            .iter()
            .all(|(tp, pos)| match self.watermarks.get(tp) {
                None => false,
                Some(w) => {
                    let end = match self.isolation {
                        Isolation::ReadCommitted => w.last_stable_offset,
                        Isolation::ReadUncommitted => w.high_watermark,
                    };
                    *pos >= end
                }
            })
    }

    /// Forgets the reported watermarks (so [`Consumer::caught_up`] needs fresh fetches).
    pub fn clear_watermarks(&mut self) {
        self.watermarks.clear();
    }

    /// Fetches from every assigned partition, waiting up to `timeout` for data (long poll).
    /// Returns as soon as any partition has records. Transient errors (a leader down) skip
    /// that partition for this round; OFFSET_OUT_OF_RANGE and other hard errors are returned.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            let started = Instant::now();
            let remaining = deadline.saturating_duration_since(started);
            let (records, transient) = self.fetch_round(remaining).await?;
            if !records.is_empty() {
                return Ok(records);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(records);
            }
            // A round that came back at once with nothing (a leader down, or one that does not
            // long-poll) waits a little instead of spinning.
            if transient || now - started < Duration::from_millis(2) {
                let pause = if transient {
                    self.conn.config().retry_backoff
                } else {
                    Duration::from_millis(5)
                };
                tokio::time::sleep(pause.min(deadline - now)).await;
            }
        }
    }

    async fn fetch_round(&mut self, wait: Duration) -> Result<(Vec<ConsumerRecord>, bool)> {
        let metadata = self.conn.metadata().await?;
        let max_wait_ms = wait.as_millis().min(i32::MAX as u128) as i32;
        let mut fetches = FuturesUnordered::new();
        for (tp, offset) in &self.positions {
            let Some(leader) = metadata.leader(&tp.topic, tp.partition).cloned() else {
                return Err(Error::Server {
                    code: proto::ErrorCode::UnknownTopicOrPartition,
                    message: format!("{tp} does not exist"),
                });
            };
            let conn = self.conn.clone();
            let request = FetchRequest {
                topic: tp.topic.clone(),
                partition: tp.partition,
                offset: *offset,
                max_bytes: self.max_bytes,
                isolation_level: self.isolation.wire() as i32,
                max_wait_ms,
            };
            let tp = tp.clone();
            fetches.push(async move {
                let result = match conn.leader(&leader.address) {
                    Ok(mut client) => conn
                        .rpc(&leader.address, wait, client.fetch(request))
                        .await
                        .and_then(WireError::checked),
                    Err(e) => Err(e),
                };
                (tp, result)
            });
        }
        let mut out = Vec::new();
        let mut transient = false;
        let mut first = true;
        loop {
            let next = if first {
                fetches.next().await
            } else {
                // Take whatever else is already answered; drop the rest (their positions do
                // not move, so nothing is lost).
                match fetches.next().now_or_never() {
                    Some(next) => next,
                    None => break,
                }
            };
            let Some((tp, result)) = next else { break };
            match result {
                Ok(response) => {
                    self.watermarks.insert(
                        tp.clone(),
                        Watermarks {
                            high_watermark: response.high_watermark,
                            last_stable_offset: response.last_stable_offset,
                        },
                    );
                    let position = self.positions.get(&tp).copied().unwrap_or(0);
                    if response.next_offset > position {
                        self.positions.insert(tp.clone(), response.next_offset);
                    }
                    out.extend(response.records.into_iter().map(|r| ConsumerRecord {
                        partition: tp.clone(),
                        offset: r.offset,
                        key: r.key,
                        value: r.value,
                        null_key: r.null_key,
                        null_value: r.null_value,
                        timestamp_ms: r.timestamp_ms,
                        producer_id: r.producer_id,
                        producer_epoch: r.producer_epoch,
                        is_transactional: r.is_transactional,
                    }));
                }
                Err(e) if e.is_retriable() => {
                    tracing::debug!(%tp, error = %e, "fetch failed; will retry");
                    if matches!(e, Error::NotLeader(_)) {
                        self.conn.invalidate_metadata();
                    }
                    transient = true;
                }
                Err(e) => return Err(e),
            }
            if !out.is_empty() {
                first = false;
            }
        }
        Ok((out, transient))
    }

    /// Polls until [`Consumer::caught_up`] (with fresh watermarks) or until `timeout` passes;
    /// returns every record read.
    pub async fn read_to_end(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = Instant::now() + timeout;
        self.clear_watermarks();
        let mut out = Vec::new();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let batch = self.poll(remaining.min(Duration::from_millis(50))).await?;
            let empty = batch.is_empty();
            out.extend(batch);
            if empty && self.caught_up() {
                return Ok(out);
            }
            if Instant::now() >= deadline {
                return Err(Error::IllegalState(format!(
                    "did not reach the end of the assigned partitions within {timeout:?}"
                )));
            }
        }
    }

    /// OffsetFetch: the offsets group `group` committed for `partitions` (all of its offsets if
    /// empty), from the group's coordinator (FindCoordinator, key type GROUP). Partitions without
    /// a committed offset are left out. A read_committed consumer waits (retrying with backoff)
    /// while a transaction's offsets for them await their marker.
    pub async fn committed_offsets(
        &mut self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, i64>> {
        let request = OffsetFetchRequest {
            group_id: group.to_string(),
            partitions: partitions.iter().cloned().map(Into::into).collect(),
            // KIP-447, as Kafka's consumer asks: a read_committed consumer never starts from an
            // offset that a committed transaction is about to replace (UNSTABLE_OFFSET_COMMIT
            // is retried until its marker is applied).
            require_stable: self.isolation == Isolation::ReadCommitted,
        };
        let coordinator = self
            .group_coordinators
            .entry(group.to_string())
            .or_default();
        let response = coordinator_rpc(
            &self.conn,
            coordinator,
            group,
            CoordinatorKeyType::Group,
            request,
            |mut c, r| async move { c.offset_fetch(r).await },
        )
        .await?;
        Ok(response
            .offsets
            .into_iter()
            .filter(|o| o.offset >= 0)
            .map(|o| (TopicPartition::new(o.topic, o.partition), o.offset))
            .collect())
    }

    /// Moves every assigned partition to `group`'s committed offset (0 where it has none).
    pub async fn seek_to_committed(&mut self, group: &str) -> Result<()> {
        let assigned = self.assignment();
        let committed = self.committed_offsets(group, &assigned).await?;
        for tp in assigned {
            let offset = committed.get(&tp).copied().unwrap_or(0);
            self.positions.insert(tp, offset);
        }
        Ok(())
    }
}
