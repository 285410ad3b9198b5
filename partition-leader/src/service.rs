//! The tonic shell: converts proto <-> domain, calls the [`crate::core`], performs the I/O
//! the core asked for (durable writes, coordinator verification), and maps errors to wire codes in
//! one place ([`Error::to_wire`]).
//!
//! Concurrency: every partition has a `tokio::sync::Mutex` (the write lock) that is held from the
//! core's check, across the durable sled write + flush, until the new state is applied. That
//! serialisation is the point: offsets, sequence windows and open transactions of a partition
//! change one write at a time, and a plan is always applied to the state it was computed from.
//! The in-memory [`PartitionState`] sits behind a std `Mutex` that is only held for the (sync)
//! core calls, never across an `.await`, so fetches read a consistent snapshot without waiting
//! for flushes. The durable write and the apply run in a spawned task that owns the write lock,
//! so a client that disconnects mid-write cannot leave sled and memory out of step.
//!
//! Verification is never done under the write lock: the lock is released, the coordinator is
//! asked, and the check is run again from the start with `verified = true` (the PID's state may
//! have changed meanwhile, e.g. a marker raised its epoch, which the re-check then rejects).
//!
//! Fetch: read_uncommitted reads up to the high watermark, read_committed up to the LSO, both
//! without control records; read_committed also skips aborted transactions. At least one record
//! is returned when any is available, even over `max_bytes`. Long poll: a fetch with nothing to
//! read waits on the partition's `Notify` (woken by every write) up to `max_wait_ms`, capped at
//! [`MAX_WAIT_CAP`], and is released at once on shutdown.
//!
//! CAVEATS: no quotas, no fetch sessions, no follower replication (NOT_LEADER_OR_FOLLOWER only
//! reflects the static topology).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cluster::{NodeId, TopicPartition, Topology};
use proto::partition_leader_server::{PartitionLeader, PartitionLeaderServer};
use proto::{
    DescribeProducersRequest, DescribeProducersResponse, FetchRequest, FetchResponse,
    FetchedRecord, IsolationLevel, MarkerPartitionResult, ProduceRequest, ProduceResponse,
    ProducerStateDescription, TxnResult, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use tokio::sync::{watch, Notify, OwnedMutexGuard};
use tonic::{Request, Response, Status};
use tracing::{debug, info, instrument, warn};

use crate::core::{
    self, LogEntry, Marker, PartitionState, Plan, ProduceBatch, ProduceDecision, Record,
};
use crate::error::{Error, Result};
use crate::storage::{Storage, Write};
use crate::verify::TxnVerifier;

/// Longest a fetch may long-poll, whatever `max_wait_ms` asks for.
pub const MAX_WAIT_CAP: Duration = Duration::from_secs(30);

/// Largest `max_bytes` honoured for one fetch (larger requests are clamped).
pub const MAX_FETCH_BYTES: usize = 16 * 1024 * 1024;

/// Default for [`LeaderConfig::max_batch_bytes`] and [`LeaderConfig::max_record_bytes`].
pub const DEFAULT_MAX_BYTES: usize = 1024 * 1024;

/// Timeout of one VerifyTransaction call to a coordinator.
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// Configuration of a partition leader.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// This node's id (a leader in the topology).
    pub node_id: NodeId,
    /// The sled database lives here.
    pub data_dir: std::path::PathBuf,
    /// The cluster shape.
    pub topology: Arc<Topology>,
    /// Largest batch accepted (default 1 MiB).
    pub max_batch_bytes: usize,
    /// Largest record accepted (default 1 MiB).
    pub max_record_bytes: usize,
    /// DANGER, for demonstrating that the checker catches broken fencing: skip the epoch checks.
    pub unsafe_skip_epoch_check: bool,
}

impl LeaderConfig {
    /// A configuration with the defaults.
    pub fn new(
        node_id: NodeId,
        data_dir: impl Into<std::path::PathBuf>,
        topology: Arc<Topology>,
    ) -> Self {
        Self {
            node_id,
            data_dir: data_dir.into(),
            topology,
            max_batch_bytes: DEFAULT_MAX_BYTES,
            max_record_bytes: DEFAULT_MAX_BYTES,
            unsafe_skip_epoch_check: false,
        }
    }

    fn limits(&self) -> core::Limits {
        core::Limits {
            max_batch_bytes: self.max_batch_bytes,
            max_record_bytes: self.max_record_bytes,
        }
    }
}

/// Unix time in milliseconds: the `now_ms` handed to the core.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("storage task failed: {e}")))?
}

/// One partition this node leads.
pub(crate) struct Partition {
    pub(crate) tp: TopicPartition,
    /// Serialises writes; held across the durable write (see the module docs).
    write_lock: Arc<tokio::sync::Mutex<()>>,
    /// The core state; only locked for synchronous core calls.
    state: Mutex<PartitionState>,
    /// Woken after every applied write (long-polling fetches wait on it).
    pub(crate) appended: Notify,
    /// Set when a failed write could not be reconciled with storage: the partition answers
    /// KAFKA_STORAGE_ERROR until the leader restarts (Kafka takes the log dir offline).
    offline: std::sync::atomic::AtomicBool,
}

impl Partition {
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, PartitionState> {
        self.state.lock().expect("partition state poisoned")
    }

    /// KAFKA_STORAGE_ERROR once the partition went offline.
    pub(crate) fn check_online(&self) -> Result<()> {
        if self.offline.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Storage(format!(
                "{} is offline after a storage failure; restart the leader",
                self.tp
            )));
        }
        Ok(())
    }
}

struct Inner {
    node_id: NodeId,
    unsafe_skip_epoch_check: bool,
    topology: Arc<Topology>,
    limits: core::Limits,
    partitions: HashMap<TopicPartition, Arc<Partition>>,
    storage: Arc<dyn Storage>,
    verifier: Arc<dyn TxnVerifier>,
    shutdown: watch::Receiver<bool>,
}

/// The PartitionLeader gRPC service.
#[derive(Clone)]
pub struct LeaderService {
    inner: Arc<Inner>,
}

impl LeaderService {
    /// Loads every partition this node leads from `storage` (blocking I/O: call it from
    /// `spawn_blocking` or before the runtime is busy). Long polls end when `shutdown` turns true
    /// or its sender is dropped.
    pub fn open(
        config: &LeaderConfig,
        storage: Arc<dyn Storage>,
        verifier: Arc<dyn TxnVerifier>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self> {
        let mut partitions = HashMap::new();
        for (topic, partition) in config.topology.partitions_led_by(config.node_id) {
            let tp = TopicPartition::new(topic, partition);
            let loaded = storage.load(&tp)?;
            let state = PartitionState::restore(
                config.unsafe_skip_epoch_check,
                loaded.high_watermark,
                loaded.producers,
                loaded.aborted,
            )
            .map_err(|e| Error::Storage(format!("{tp}: {e}")))?;
            info!(
                partition = %tp,
                high_watermark = state.high_watermark(),
                last_stable_offset = state.last_stable_offset(),
                producers = state.producers().len(),
                "partition loaded"
            );
            partitions.insert(
                tp.clone(),
                Arc::new(Partition {
                    tp,
                    write_lock: Arc::new(tokio::sync::Mutex::new(())),
                    state: Mutex::new(state),
                    appended: Notify::new(),
                    offline: std::sync::atomic::AtomicBool::new(false),
                }),
            );
        }
        if config.unsafe_skip_epoch_check {
            warn!("unsafe_skip_epoch_check is ON: zombie producers are NOT fenced at this leader");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                node_id: config.node_id,
                unsafe_skip_epoch_check: config.unsafe_skip_epoch_check,
                topology: config.topology.clone(),
                limits: config.limits(),
                partitions,
                storage,
                verifier,
                shutdown,
            }),
        })
    }

    /// The storage engine (the Kafka face scans it for Fetch and ListOffsets).
    pub(crate) fn storage(&self) -> Arc<dyn Storage> {
        self.inner.storage.clone()
    }

    /// Turns true when the leader is stopping (long polls end).
    pub(crate) fn stopping(&self) -> watch::Receiver<bool> {
        self.inner.shutdown.clone()
    }

    /// The cluster topology.
    pub(crate) fn topology(&self) -> &Arc<Topology> {
        &self.inner.topology
    }

    /// Wraps the service for `tonic::transport::Server::add_service`, with message limits that
    /// let every batch within the configured limits through.
    pub fn into_server(self) -> PartitionLeaderServer<Self> {
        let max_decoding = (self.inner.limits.max_batch_bytes.saturating_mul(2))
            .saturating_add(1024 * 1024)
            .max(4 * 1024 * 1024);
        PartitionLeaderServer::new(self).max_decoding_message_size(max_decoding)
    }

    pub(crate) fn partition(&self, topic: &str, partition: i32) -> Result<Arc<Partition>> {
        let tp = TopicPartition::new(topic, partition);
        let Some(leader) = self.inner.topology.leader_for(topic, partition) else {
            return Err(Error::UnknownTopicOrPartition(format!(
                "{tp} does not exist"
            )));
        };
        if leader.id != self.inner.node_id {
            return Err(Error::NotLeaderOrFollower(format!(
                "{tp} is led by node {} at {}, not by node {}",
                leader.id, leader.address, self.inner.node_id
            )));
        }
        let part = self
            .inner
            .partitions
            .get(&tp)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("{tp} was not loaded")))?;
        part.check_online()?;
        Ok(part)
    }

    /// Makes `plan` durable (with `entries`), then applies it and wakes long polls. Runs in its
    /// own task owning the write lock, so it completes even if the request is dropped.
    ///
    /// If the write fails, the engine may still hold part of it (sled applies the transaction
    /// before the flush fails, and a later flush would persist it), so the partition's state is
    /// reloaded from the engine: memory then matches what will be on disk, and the unacknowledged
    /// write may or may not survive, as in Kafka. If even that fails the partition goes offline.
    async fn persist(
        &self,
        guard: OwnedMutexGuard<()>,
        part: Arc<Partition>,
        plan: Plan,
        entries: Vec<LogEntry>,
    ) -> Result<()> {
        let storage = self.inner.storage.clone();
        let skip = self.inner.unsafe_skip_epoch_check;
        tokio::spawn(async move {
            let _guard = guard;
            if !plan.is_noop() {
                let write = Write::new(&plan, entries);
                let tp = part.tp.clone();
                let store = storage.clone();
                if let Err(e) = blocking(move || store.write(&tp, &write)).await {
                    warn!(partition = %part.tp, "write failed, reloading the partition: {e}");
                    let tp = part.tp.clone();
                    let reloaded = blocking(move || {
                        let loaded = storage.load(&tp)?;
                        PartitionState::restore(
                            skip,
                            loaded.high_watermark,
                            loaded.producers,
                            loaded.aborted,
                        )
                    })
                    .await;
                    match reloaded {
                        Ok(state) => *part.state() = state,
                        Err(reload) => {
                            tracing::error!(partition = %part.tp, "partition offline: {reload}");
                            part.offline
                                .store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    part.appended.notify_waiters();
                    return Err(e);
                }
            }
            part.state().apply(&plan);
            part.appended.notify_waiters();
            Ok(())
        })
        .await
        .map_err(|e| Error::Internal(format!("write task failed: {e}")))?
    }

    pub(crate) async fn produce_inner(&self, request: ProduceRequest) -> Result<ProduceResponse> {
        let part = self.partition(&request.topic, request.partition)?;
        let batch = request
            .batch
            .ok_or_else(|| Error::InvalidRequest("missing batch".into()))?;
        let batch = ProduceBatch {
            producer_id: batch.producer_id,
            producer_epoch: batch.producer_epoch,
            base_sequence: batch.base_sequence,
            is_transactional: batch.is_transactional,
            transactional_id: batch.transactional_id,
            records: batch
                .records
                .into_iter()
                .map(|r| Record {
                    key: r.key,
                    value: r.value,
                    timestamp_ms: r.timestamp_ms,
                    headers: r
                        .headers
                        .into_iter()
                        .map(|h| core::Header {
                            key: h.key,
                            value: h.value,
                        })
                        .collect(),
                })
                .collect(),
        };
        let header = core::validate_batch(&self.inner.limits, &batch)?;
        let mut records = Some(batch.records);
        let mut verified = false;
        loop {
            let guard = part.write_lock.clone().lock_owned().await;
            part.check_online()?;
            let now = now_ms();
            let decision = part.state().check_produce(&header, verified, now);
            let decision = match decision {
                Err(e @ Error::InvalidProducerEpoch(_)) => {
                    info!(partition = %part.tp, pid = header.producer_id, epoch = header.epoch,
                          "fenced a zombie producer: {e}");
                    return Err(e);
                }
                other => other?,
            };
            match decision {
                ProduceDecision::Duplicate { base_offset } => {
                    debug!(partition = %part.tp, pid = header.producer_id, base_offset,
                           "duplicate batch");
                    let high_watermark = part.state().high_watermark();
                    return Ok(ProduceResponse {
                        base_offset,
                        duplicate: true,
                        high_watermark,
                        ..Default::default()
                    });
                }
                ProduceDecision::NeedsVerification => {
                    if verified {
                        return Err(Error::Internal("verification asked for twice".into()));
                    }
                    drop(guard);
                    self.inner
                        .verifier
                        .verify(
                            &batch.transactional_id,
                            header.producer_id,
                            header.epoch,
                            &part.tp,
                        )
                        .await?;
                    verified = true;
                }
                ProduceDecision::Append(plan) => {
                    let records = records.take().expect("appended once");
                    let entries = core::data_entries(&header, records, now);
                    let (base_offset, high_watermark) = (plan.base_offset, plan.high_watermark);
                    if let Some((pid, p)) = &plan.producer {
                        if p.txn_first_offset == Some(base_offset) {
                            info!(partition = %part.tp, pid, epoch = p.epoch, first_offset = base_offset,
                                  txn_id = %batch.transactional_id, "transaction opened");
                        }
                    }
                    self.persist(guard, part.clone(), plan, entries).await?;
                    debug!(partition = %part.tp, pid = header.producer_id, base_offset,
                           records = header.record_count, "appended");
                    return Ok(ProduceResponse {
                        base_offset,
                        duplicate: false,
                        high_watermark,
                        ..Default::default()
                    });
                }
            }
        }
    }

    async fn fetch_inner(&self, request: FetchRequest) -> Result<FetchResponse> {
        let part = self.partition(&request.topic, request.partition)?;
        let read_committed = match IsolationLevel::try_from(request.isolation_level) {
            Ok(IsolationLevel::ReadCommitted) => true,
            Ok(IsolationLevel::ReadUncommitted) => false,
            Err(_) => {
                return Err(Error::InvalidRequest(format!(
                    "unknown isolation level {}",
                    request.isolation_level
                )))
            }
        };
        if request.max_bytes < 0 || request.max_wait_ms < 0 {
            return Err(Error::InvalidRequest(
                "max_bytes and max_wait_ms must not be negative".into(),
            ));
        }
        let max_bytes = (request.max_bytes as usize).min(MAX_FETCH_BYTES);
        let wait = Duration::from_millis(request.max_wait_ms as u64).min(MAX_WAIT_CAP);
        let deadline = tokio::time::Instant::from_std(Instant::now() + wait);
        let mut shutdown = self.inner.shutdown.clone();
        let view = loop {
            let notified = part.appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let view = part.state().fetch_view(request.offset, read_committed)?;
            if view.upper > request.offset
                || tokio::time::Instant::now() >= deadline
                || *shutdown.borrow()
            {
                break view;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        let view = part.state().fetch_view(request.offset, read_committed)?;
                        break view;
                    }
                }
            }
        };

        let (high_watermark, last_stable_offset) = (view.high_watermark, view.last_stable_offset);
        let storage = self.inner.storage.clone();
        let tp = part.tp.clone();
        let from = request.offset;
        let (records, next_offset) = blocking(move || {
            let mut records = Vec::new();
            let mut bytes = 0usize;
            let mut next_offset = view.upper.max(from);
            storage.scan(&tp, from, view.upper, &mut |offset, entry| {
                if view.is_visible(offset, &entry) {
                    let LogEntry::Data(d) = entry else {
                        unreachable!("control records are never visible")
                    };
                    let size = d.key.len() + d.value.len() + core::RECORD_OVERHEAD_BYTES;
                    if !records.is_empty() && bytes + size > max_bytes {
                        next_offset = offset;
                        return false;
                    }
                    bytes += size;
                    records.push(FetchedRecord {
                        offset,
                        key: d.key,
                        value: d.value,
                        timestamp_ms: d.timestamp_ms,
                        producer_id: d.producer_id,
                        producer_epoch: d.producer_epoch as i32,
                        is_transactional: d.is_transactional,
                        headers: d
                            .headers
                            .into_iter()
                            .map(|h| proto::RecordHeader {
                                key: h.key,
                                value: h.value,
                            })
                            .collect(),
                    });
                }
                true
            })?;
            Ok((records, next_offset))
        })
        .await?;
        debug!(partition = %part.tp, offset = from, returned = records.len(), next_offset,
               read_committed, "fetch");
        Ok(FetchResponse {
            high_watermark,
            last_stable_offset,
            records,
            next_offset,
            ..Default::default()
        })
    }

    async fn write_marker(&self, tp: &proto::TopicPartition, marker: Marker) -> Result<()> {
        let part = self.partition(&tp.topic, tp.partition)?;
        let guard = part.write_lock.clone().lock_owned().await;
        part.check_online()?;
        let plan = part.state().plan_marker(&marker, now_ms())?;
        let entries: Vec<LogEntry> = plan
            .control
            .clone()
            .map(LogEntry::Control)
            .into_iter()
            .collect();
        if let Some(control) = &plan.control {
            info!(partition = %part.tp, pid = marker.producer_id, epoch = control.producer_epoch,
                  commit = control.commit, offset = plan.base_offset,
                  aborted = ?plan.aborted, "transaction marker written");
        } else if plan.is_noop() {
            debug!(partition = %part.tp, pid = marker.producer_id, "repeated marker");
        } else {
            info!(partition = %part.tp, pid = marker.producer_id, epoch = marker.producer_epoch,
                  "marker without an open transaction: epoch recorded");
        }
        self.persist(guard, part, plan, entries).await
    }

    pub(crate) fn describe_producers_inner(
        &self,
        request: DescribeProducersRequest,
    ) -> Result<DescribeProducersResponse> {
        let part = self.partition(&request.topic, request.partition)?;
        let state = part.state();
        let producers = state
            .producers()
            .iter()
            .map(|(pid, p)| ProducerStateDescription {
                producer_id: *pid,
                producer_epoch: p.epoch as i32,
                last_sequence: p.last_sequence().unwrap_or(-1),
                last_timestamp_ms: p.last_update_ms,
                current_txn_start_offset: p.txn_first_offset.unwrap_or(-1),
                coordinator_generation: p.coordinator_generation,
            })
            .collect();
        Ok(DescribeProducersResponse {
            producers,
            ..Default::default()
        })
    }
}

#[tonic::async_trait]
impl PartitionLeader for LeaderService {
    #[instrument(skip_all, fields(topic = %request.get_ref().topic, partition = request.get_ref().partition))]
    async fn produce(
        &self,
        request: Request<ProduceRequest>,
    ) -> Result<Response<ProduceResponse>, Status> {
        let response = self
            .produce_inner(request.into_inner())
            .await
            .unwrap_or_else(|e| {
                let (error_code, error_message) = e.to_wire();
                debug!(error_message, "produce rejected");
                ProduceResponse {
                    error_code,
                    error_message,
                    base_offset: -1,
                    duplicate: false,
                    high_watermark: -1,
                }
            });
        Ok(Response::new(response))
    }

    #[instrument(skip_all, fields(topic = %request.get_ref().topic, partition = request.get_ref().partition))]
    async fn fetch(
        &self,
        request: Request<FetchRequest>,
    ) -> Result<Response<FetchResponse>, Status> {
        let response = self
            .fetch_inner(request.into_inner())
            .await
            .unwrap_or_else(|e| {
                let (error_code, error_message) = e.to_wire();
                FetchResponse {
                    error_code,
                    error_message,
                    high_watermark: -1,
                    last_stable_offset: -1,
                    records: vec![],
                    next_offset: -1,
                }
            });
        Ok(Response::new(response))
    }

    #[instrument(skip_all, fields(pid = request.get_ref().producer_id, epoch = request.get_ref().producer_epoch))]
    async fn write_txn_markers(
        &self,
        request: Request<WriteTxnMarkersRequest>,
    ) -> Result<Response<WriteTxnMarkersResponse>, Status> {
        let request = request.into_inner();
        let commit = match TxnResult::try_from(request.result) {
            Ok(TxnResult::Commit) => Ok(true),
            Ok(TxnResult::Abort) => Ok(false),
            Err(_) => Err(format!("unknown transaction result {}", request.result)),
        };
        let results = futures::future::join_all(request.partitions.into_iter().map(|tp| {
            let commit = commit.clone();
            async move {
                let result = match commit {
                    Err(message) => Err(Error::InvalidRequest(message)),
                    Ok(commit) => {
                        let marker = Marker {
                            producer_id: request.producer_id,
                            producer_epoch: request.producer_epoch,
                            commit,
                            coordinator_id: request.coordinator_id,
                            coordinator_generation: request.coordinator_generation,
                            transaction_version: request.transaction_version,
                        };
                        self.write_marker(&tp, marker).await
                    }
                };
                let (error_code, error_message) = match result {
                    Ok(()) => (proto::ErrorCode::None as i32, String::new()),
                    Err(e) => {
                        warn!(partition = %format!("{}-{}", tp.topic, tp.partition), "marker rejected: {e}");
                        e.to_wire()
                    }
                };
                MarkerPartitionResult {
                    partition: Some(tp),
                    error_code,
                    error_message,
                }
            }
        }))
        .await;
        Ok(Response::new(WriteTxnMarkersResponse { results }))
    }

    async fn describe_producers(
        &self,
        request: Request<DescribeProducersRequest>,
    ) -> Result<Response<DescribeProducersResponse>, Status> {
        let response = self
            .describe_producers_inner(request.into_inner())
            .unwrap_or_else(|e| {
                let (error_code, error_message) = e.to_wire();
                DescribeProducersResponse {
                    error_code,
                    error_message,
                    producers: vec![],
                }
            });
        Ok(Response::new(response))
    }
}

/// Serves Cluster + PartitionLeader on an already bound listener until `shutdown` resolves,
/// over a sled database in `config.data_dir` and the real coordinator verifier. Returns after
/// shutdown with sled flushed and closed, so the directory can be reopened at once.
pub async fn serve(
    config: LeaderConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_with_kafka(config, listener, None, shutdown).await
}

/// [`serve`], plus Kafka's protocol on `kafka_listener` when given (see [`crate::kafka`]).
pub async fn serve_with_kafka(
    config: LeaderConfig,
    listener: tokio::net::TcpListener,
    kafka_listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let dir = config.data_dir.clone();
    let storage = Arc::new(blocking(move || crate::storage::SledStorage::open(dir)).await?);
    let verifier = Arc::new(crate::verify::GrpcVerifier::new(
        config.topology.clone(),
        VERIFY_TIMEOUT,
    ));
    let result = serve_inner(
        config,
        storage.clone(),
        verifier,
        listener,
        kafka_listener,
        shutdown,
    )
    .await;
    // Wait (bounded) for stragglers holding the storage, then flush and close sled.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&storage) > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if Arc::strong_count(&storage) > 1 {
        warn!("storage still referenced at shutdown; closing it anyway");
    }
    let flushed = blocking(move || {
        storage.flush()?;
        drop(storage);
        Ok(())
    })
    .await;
    result.and(flushed)
}

/// Accepted connections with `TCP_NODELAY` set: tonic only sets it on listeners it binds
/// itself, and without it a one-record Produce waits for Nagle + delayed ACK on every reply.
fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// [`serve`] over any storage engine and verifier (tests use the in-memory engine or a fake
/// coordinator). Does not close `storage`.
pub async fn serve_with(
    config: LeaderConfig,
    storage: Arc<dyn Storage>,
    verifier: Arc<dyn TxnVerifier>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_inner(config, storage, verifier, listener, None, shutdown).await
}

async fn serve_inner(
    config: LeaderConfig,
    storage: Arc<dyn Storage>,
    verifier: Arc<dyn TxnVerifier>,
    listener: tokio::net::TcpListener,
    kafka_listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let node_id = config.node_id;
    let topology = config.topology.clone();
    let service =
        blocking(move || LeaderService::open(&config, storage, verifier, stop_rx)).await?;
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(
        node_id,
        address,
        partitions = service.inner.partitions.len(),
        "partition leader serving"
    );
    let kafka = kafka_listener.map(|kafka_listener| {
        let kafka_config = kafka_wire::ServerConfig::new(node_id, topology.clone());
        let handler = Arc::new(crate::kafka::KafkaLeader::new(service.clone()));
        let mut stopped = service.stopping();
        tokio::spawn(kafka_wire::serve(
            kafka_listener,
            kafka_config,
            handler,
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        ))
    });
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let served = tonic::transport::Server::builder()
        .add_service(cluster::ClusterService::new(topology).into_server())
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await;
    if let Some(kafka) = kafka {
        match kafka.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!("kafka listener failed: {e}"),
            Err(e) => warn!("kafka listener task failed: {e}"),
        }
    }
    served?;
    info!(node_id, "partition leader stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use proto::{ErrorCode, RecordBatch};

    use super::*;
    use crate::storage::MemoryStorage;

    const TOPOLOGY: &str = r#"
        transaction_state_partitions = 4
        [[coordinators]]
        id = 1
        address = "127.0.0.1:1"
        [[leaders]]
        id = 101
        address = "127.0.0.1:2"
        [[leaders]]
        id = 102
        address = "127.0.0.1:3"
        [[topics]]
        name = "t"
        leaders = [101, 101, 102]
    "#;

    /// A coordinator stand-in: answers `answer`, counts calls, and can hold a call until the
    /// test opens the gate.
    struct FakeVerifier {
        answer: Mutex<Result<(), ErrorCode>>,
        calls: AtomicUsize,
        gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    }

    #[tonic::async_trait]
    impl TxnVerifier for FakeVerifier {
        async fn verify(
            &self,
            _transactional_id: &str,
            _producer_id: cluster::ProducerId,
            _producer_epoch: cluster::ProducerEpoch,
            _partition: &TopicPartition,
        ) -> Result<()> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let gate = self.gate.lock().unwrap().clone();
            if let Some(gate) = gate {
                let _permit = gate.acquire().await.unwrap();
            }
            match *self.answer.lock().unwrap() {
                Ok(()) => Ok(()),
                Err(code) => crate::verify::verification_result(code, "fake".into()),
            }
        }
    }

    struct Harness {
        service: LeaderService,
        verifier: Arc<FakeVerifier>,
        storage: Arc<MemoryStorage>,
        stop: watch::Sender<bool>,
    }

    fn config() -> LeaderConfig {
        let mut config = LeaderConfig::new(
            101,
            "/nonexistent",
            Arc::new(Topology::parse(TOPOLOGY).unwrap()),
        );
        config.max_batch_bytes = 4096;
        config.max_record_bytes = 1024;
        config
    }

    fn harness_over(storage: Arc<MemoryStorage>) -> Harness {
        let verifier = Arc::new(FakeVerifier {
            answer: Mutex::new(Ok(())),
            calls: AtomicUsize::new(0),
            gate: Mutex::new(None),
        });
        let (stop, stop_rx) = watch::channel(false);
        let service =
            LeaderService::open(&config(), storage.clone(), verifier.clone(), stop_rx).unwrap();
        Harness {
            service,
            verifier,
            storage,
            stop,
        }
    }

    fn harness() -> Harness {
        harness_over(Arc::new(MemoryStorage::new()))
    }

    fn batch(pid: i64, epoch: i32, seq: i32, values: &[&str], txn: bool) -> RecordBatch {
        RecordBatch {
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            is_transactional: txn,
            transactional_id: if txn { "txn-a".into() } else { String::new() },
            records: values
                .iter()
                .map(|v| proto::Record {
                    key: vec![],
                    value: v.as_bytes().to_vec(),
                    timestamp_ms: 0,
                    headers: Vec::new(),
                })
                .collect(),
        }
    }

    async fn produce_to(h: &Harness, partition: i32, b: RecordBatch) -> ProduceResponse {
        h.service
            .produce(Request::new(ProduceRequest {
                topic: "t".into(),
                partition,
                batch: Some(b),
            }))
            .await
            .unwrap()
            .into_inner()
    }

    async fn produce(h: &Harness, b: RecordBatch) -> ProduceResponse {
        produce_to(h, 0, b).await
    }

    async fn fetch(
        h: &Harness,
        offset: i64,
        committed: bool,
        max_bytes: i32,
        wait: i32,
    ) -> FetchResponse {
        h.service
            .fetch(Request::new(FetchRequest {
                topic: "t".into(),
                partition: 0,
                offset,
                max_bytes,
                isolation_level: if committed {
                    IsolationLevel::ReadCommitted as i32
                } else {
                    IsolationLevel::ReadUncommitted as i32
                },
                max_wait_ms: wait,
            }))
            .await
            .unwrap()
            .into_inner()
    }

    async fn markers(
        h: &Harness,
        pid: i64,
        epoch: i32,
        commit: bool,
        partitions: &[(&str, i32)],
    ) -> Vec<ErrorCode> {
        h.service
            .write_txn_markers(Request::new(WriteTxnMarkersRequest {
                producer_id: pid,
                producer_epoch: epoch,
                result: if commit {
                    TxnResult::Commit
                } else {
                    TxnResult::Abort
                } as i32,
                coordinator_id: 1,
                coordinator_generation: 1,
                transaction_version: 2,
                partitions: partitions
                    .iter()
                    .map(|(t, p)| proto::TopicPartition {
                        topic: t.to_string(),
                        partition: *p,
                    })
                    .collect(),
            }))
            .await
            .unwrap()
            .into_inner()
            .results
            .into_iter()
            .map(|r| ErrorCode::from_wire(r.error_code))
            .collect()
    }

    fn values(r: &FetchResponse) -> Vec<String> {
        r.records
            .iter()
            .map(|r| String::from_utf8(r.value.clone()).unwrap())
            .collect()
    }

    fn code(c: i32) -> ErrorCode {
        ErrorCode::from_wire(c)
    }

    #[tokio::test]
    async fn routing_errors() {
        let h = harness();
        let r = produce_to(&h, 2, batch(1, 0, 0, &["a"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::NotLeaderOrFollower);
        assert!(r.error_message.contains("102"), "{}", r.error_message);
        let r = produce_to(&h, 3, batch(1, 0, 0, &["a"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::UnknownTopicOrPartition);
        let r = produce_to(&h, -1, batch(1, 0, 0, &["a"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::UnknownTopicOrPartition);
        let r = h
            .service
            .describe_producers(Request::new(DescribeProducersRequest {
                topic: "nope".into(),
                partition: 0,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.error_code), ErrorCode::UnknownTopicOrPartition);
        assert_eq!(
            markers(&h, 1, 1, true, &[("t", 0), ("t", 2), ("x", 0)]).await,
            vec![
                ErrorCode::None,
                ErrorCode::NotLeaderOrFollower,
                ErrorCode::UnknownTopicOrPartition
            ]
        );
        let r = h
            .service
            .produce(Request::new(ProduceRequest {
                topic: "t".into(),
                partition: 0,
                batch: None,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.error_code), ErrorCode::InvalidRequest);
    }

    #[tokio::test]
    async fn verification_happens_once_per_transaction_and_its_answer_is_passed_back() {
        let h = harness();
        *h.verifier.answer.lock().unwrap() = Err(ErrorCode::InvalidTxnState);
        let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
        assert_eq!(code(r.error_code), ErrorCode::InvalidTxnState);
        *h.verifier.answer.lock().unwrap() = Err(ErrorCode::CoordinatorNotAvailable);
        let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
        assert_eq!(code(r.error_code), ErrorCode::CoordinatorNotAvailable);
        *h.verifier.answer.lock().unwrap() = Err(ErrorCode::ProducerFenced);
        let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
        assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
        assert_eq!(fetch(&h, 0, false, 1000, 0).await.high_watermark, 0);

        *h.verifier.answer.lock().unwrap() = Ok(());
        let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
        assert_eq!((code(r.error_code), r.base_offset), (ErrorCode::None, 0));
        let r = produce(&h, batch(1, 0, 1, &["b", "c"], true)).await;
        assert_eq!(
            (code(r.error_code), r.base_offset, r.high_watermark),
            (ErrorCode::None, 1, 3)
        );
        assert_eq!(h.verifier.calls.load(Ordering::SeqCst), 4);
        // A duplicate of the first batch.
        let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
        assert_eq!((r.base_offset, r.duplicate), (0, true));
        // Idempotent producers never verify.
        produce(&h, batch(2, 0, 0, &["x"], false)).await;
        assert_eq!(h.verifier.calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn state_is_checked_again_after_verification() {
        let h = harness();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *h.verifier.gate.lock().unwrap() = Some(gate.clone());
        let service = h.service.clone();
        let pending = tokio::spawn(async move {
            service
                .produce(Request::new(ProduceRequest {
                    topic: "t".into(),
                    partition: 0,
                    batch: Some(batch(1, 0, 0, &["late"], true)),
                }))
                .await
                .unwrap()
                .into_inner()
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.verifier.calls.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "verification never started");
            tokio::task::yield_now().await;
        }
        // The partition is not locked during verification: a fencing marker gets through.
        assert_eq!(
            markers(&h, 1, 1, false, &[("t", 0)]).await,
            vec![ErrorCode::None]
        );
        gate.add_permits(1);
        let r = pending.await.unwrap();
        assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
        assert_eq!(fetch(&h, 0, false, 1000, 0).await.high_watermark, 0);
    }

    #[tokio::test]
    async fn read_committed_filters_and_read_uncommitted_does_not() {
        let h = harness();
        produce(&h, batch(1, 0, 0, &["a1", "a2"], true)).await; // 0, 1: aborted
        produce(&h, batch(2, 0, 0, &["b1"], true)).await; // 2: committed
        produce(&h, batch(3, 0, 0, &["plain"], false)).await; // 3
        produce(&h, batch(1, 0, 2, &["a3"], true)).await; // 4: aborted
        let r = fetch(&h, 0, true, 1000, 0).await;
        assert_eq!(
            (r.last_stable_offset, r.high_watermark, r.next_offset),
            (0, 5, 0)
        );
        assert!(r.records.is_empty());
        assert_eq!(
            markers(&h, 1, 1, false, &[("t", 0)]).await,
            vec![ErrorCode::None]
        ); // 5
        let r = fetch(&h, 0, true, 1000, 0).await;
        assert_eq!(r.last_stable_offset, 2);
        assert!(r.records.is_empty(), "{:?}", values(&r));
        assert_eq!(r.next_offset, 2);
        assert_eq!(
            markers(&h, 2, 1, true, &[("t", 0)]).await,
            vec![ErrorCode::None]
        ); // 6
        let r = fetch(&h, 0, true, 1000, 0).await;
        assert_eq!(values(&r), vec!["b1", "plain"]);
        assert_eq!((r.last_stable_offset, r.next_offset), (7, 7));
        let r = fetch(&h, 0, false, 1000, 0).await;
        assert_eq!(values(&r), vec!["a1", "a2", "b1", "plain", "a3"]);
        assert_eq!(r.next_offset, 7);
        // Offsets are reported.
        assert_eq!(
            r.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        // Out of range.
        assert_eq!(
            code(fetch(&h, 8, true, 1000, 0).await.error_code),
            ErrorCode::OffsetOutOfRange
        );
        assert_eq!(
            code(fetch(&h, -1, false, 1000, 0).await.error_code),
            ErrorCode::OffsetOutOfRange
        );
        assert_eq!(
            code(fetch(&h, 0, false, -1, 0).await.error_code),
            ErrorCode::InvalidRequest
        );
    }

    #[tokio::test]
    async fn max_bytes_returns_at_least_one_record() {
        let h = harness();
        produce(&h, batch(1, 0, 0, &["aaaa", "bbbb", "cccc"], false)).await;
        let per_record = 4 + core::RECORD_OVERHEAD_BYTES as i32;
        let r = fetch(&h, 0, false, 0, 0).await;
        assert_eq!((values(&r), r.next_offset), (vec!["aaaa".to_string()], 1));
        let r = fetch(&h, 1, false, 2 * per_record, 0).await;
        assert_eq!(
            (values(&r), r.next_offset),
            (vec!["bbbb".to_string(), "cccc".to_string()], 3)
        );
        let r = fetch(&h, 3, false, 100, 0).await;
        assert_eq!((r.records.len(), r.next_offset), (0, 3));
    }

    #[tokio::test]
    async fn long_poll_wakes_on_append_and_on_shutdown() {
        let h = harness();
        let service = h.service.clone();
        let waiting = tokio::spawn(async move {
            service
                .fetch(Request::new(FetchRequest {
                    topic: "t".into(),
                    partition: 0,
                    offset: 0,
                    max_bytes: 1000,
                    isolation_level: IsolationLevel::ReadCommitted as i32,
                    max_wait_ms: 20_000,
                }))
                .await
                .unwrap()
                .into_inner()
        });
        tokio::task::yield_now().await;
        let started = Instant::now();
        produce(&h, batch(1, 0, 0, &["v"], false)).await;
        let r = waiting.await.unwrap();
        assert_eq!(values(&r), vec!["v"]);
        assert!(started.elapsed() < Duration::from_secs(10));
        // A short wait with nothing new times out empty.
        let r = fetch(&h, 1, true, 1000, 30).await;
        assert_eq!((r.error_code, r.records.len(), r.next_offset), (0, 0, 1));
        // Shutdown releases a long poll at once.
        let service = h.service.clone();
        let waiting = tokio::spawn(async move {
            service
                .fetch(Request::new(FetchRequest {
                    topic: "t".into(),
                    partition: 0,
                    offset: 1,
                    max_bytes: 1000,
                    isolation_level: 0,
                    max_wait_ms: 30_000,
                }))
                .await
                .unwrap()
                .into_inner()
        });
        tokio::task::yield_now().await;
        h.stop.send(true).unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.records.len(), 0);
    }

    #[tokio::test]
    async fn failed_write_changes_nothing() {
        let h = harness();
        produce(&h, batch(1, 0, 0, &["a"], false)).await;
        h.storage.set_fail_writes(true);
        let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
        assert_eq!(
            markers(&h, 1, 1, true, &[("t", 0)]).await,
            vec![ErrorCode::KafkaStorageError]
        );
        h.storage.set_fail_writes(false);
        // The same batch is not a duplicate: it was never acknowledged.
        let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
        assert_eq!(
            (code(r.error_code), r.base_offset, r.duplicate),
            (ErrorCode::None, 1, false)
        );
    }

    #[tokio::test]
    async fn a_write_that_failed_after_applying_is_reloaded_not_forgotten() {
        let h = harness();
        produce(&h, batch(1, 0, 0, &["a"], false)).await;
        h.storage.set_fail_after_write(true);
        let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
        h.storage.set_fail_after_write(false);
        // Memory now matches the engine, which kept the write: the retry is a duplicate.
        let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
        assert_eq!(
            (code(r.error_code), r.base_offset, r.duplicate),
            (ErrorCode::None, 1, true)
        );
        assert_eq!(values(&fetch(&h, 0, false, 1000, 0).await), vec!["a", "b"]);
    }

    #[tokio::test]
    async fn a_partition_that_cannot_reload_goes_offline_until_restart() {
        let h = harness();
        produce(&h, batch(1, 0, 0, &["a"], false)).await;
        h.storage.set_fail_writes(true);
        h.storage.set_fail_loads(true);
        let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
        h.storage.set_fail_writes(false);
        h.storage.set_fail_loads(false);
        assert_eq!(
            code(fetch(&h, 0, false, 1000, 0).await.error_code),
            ErrorCode::KafkaStorageError
        );
        let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
        // Other partitions are unaffected; a restart brings it back.
        assert_eq!(
            code(
                produce_to(&h, 1, batch(2, 0, 0, &["x"], false))
                    .await
                    .error_code
            ),
            ErrorCode::None
        );
        let h2 = harness_over(h.storage.clone());
        let r = produce(&h2, batch(1, 0, 1, &["b"], false)).await;
        assert_eq!((code(r.error_code), r.base_offset), (ErrorCode::None, 1));
    }

    #[tokio::test]
    async fn bad_markers_and_batches_store_nothing() {
        let h = harness();
        for (pid, epoch) in [(-1, 0), (1, -1), (1, 40_000)] {
            assert_eq!(
                markers(&h, pid, epoch, true, &[("t", 0)]).await,
                vec![ErrorCode::InvalidRequest]
            );
        }
        let r = h
            .service
            .write_txn_markers(Request::new(WriteTxnMarkersRequest {
                producer_id: 1,
                producer_epoch: 1,
                result: 7,
                coordinator_id: 1,
                coordinator_generation: 1,
                transaction_version: 2,
                partitions: vec![proto::TopicPartition {
                    topic: "t".into(),
                    partition: 0,
                }],
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.results[0].error_code), ErrorCode::InvalidRequest);
        for b in [
            batch(1, 0, 0, &[], false),
            batch(1, 0, -5, &["a"], false),
            batch(1, 99_999, 0, &["a"], false),
            batch(-7, 0, 0, &["a"], false),
        ] {
            assert_eq!(
                code(produce(&h, b).await.error_code),
                ErrorCode::InvalidRequest
            );
        }
        let big = "x".repeat(1025);
        assert_eq!(
            code(produce(&h, batch(1, 0, 0, &[&big], false)).await.error_code),
            ErrorCode::MessageTooLarge
        );
        let r = produce(&h, batch(1, 0, 7, &["a"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::UnknownProducerId);
        let r = fetch(&h, 0, false, 1000, 0).await;
        assert_eq!(r.high_watermark, 0);
        let d = h
            .service
            .describe_producers(Request::new(DescribeProducersRequest {
                topic: "t".into(),
                partition: 0,
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(d.producers.is_empty());
    }

    #[tokio::test]
    async fn state_survives_a_restart_over_the_same_storage() {
        let h = harness();
        produce(&h, batch(1, 0, 0, &["a"], true)).await;
        produce(&h, batch(2, 0, 0, &["b"], true)).await;
        markers(&h, 2, 1, false, &[("t", 0)]).await;
        markers(&h, 9, 3, false, &[("t", 1)]).await;
        let describe = |svc: LeaderService, partition| async move {
            svc.describe_producers(Request::new(DescribeProducersRequest {
                topic: "t".into(),
                partition,
            }))
            .await
            .unwrap()
            .into_inner()
        };
        let before = (
            describe(h.service.clone(), 0).await,
            describe(h.service.clone(), 1).await,
        );
        let fetched = fetch(&h, 0, false, 1000, 0).await;
        let h2 = harness_over(h.storage.clone());
        assert_eq!(
            before,
            (
                describe(h2.service.clone(), 0).await,
                describe(h2.service.clone(), 1).await
            )
        );
        assert_eq!(before.0.producers[0].current_txn_start_offset, 0);
        assert_eq!(fetch(&h2, 0, false, 1000, 0).await, fetched);
        assert_eq!(fetch(&h2, 0, true, 1000, 0).await.last_stable_offset, 0);
        // Fencing still holds after the restart.
        let r = produce_to(&h2, 1, batch(9, 2, 0, &["zombie"], true)).await;
        assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
        let r = produce(&h2, batch(2, 0, 1, &["zombie"], true)).await;
        assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_producers_markers_and_readers_keep_the_invariants() {
        let h = Arc::new(harness());
        let mut tasks = Vec::new();
        // Idempotent producers that resend every batch once (a lost reply).
        for pid in 1..=4i64 {
            let h = h.clone();
            tasks.push(tokio::spawn(async move {
                for seq in 0..40 {
                    let value = format!("p{pid}-{seq}");
                    let first = produce(&h, batch(pid, 0, seq, &[&value], false)).await;
                    assert_eq!(
                        code(first.error_code),
                        ErrorCode::None,
                        "{}",
                        first.error_message
                    );
                    let again = produce(&h, batch(pid, 0, seq, &[&value], false)).await;
                    assert_eq!(
                        (again.base_offset, again.duplicate),
                        (first.base_offset, true)
                    );
                }
            }));
        }
        // A transactional producer: odd transactions abort, even ones commit.
        {
            let h = h.clone();
            tasks.push(tokio::spawn(async move {
                for txn in 0..10i32 {
                    let commit = txn % 2 == 0;
                    let tag = if commit { "commit" } else { "abort" };
                    for seq in 0..3 {
                        let value = format!("{tag}-{txn}-{seq}");
                        let r = produce(&h, batch(9, txn, seq, &[&value], true)).await;
                        assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
                    }
                    assert_eq!(
                        markers(&h, 9, txn + 1, commit, &[("t", 0)]).await,
                        vec![ErrorCode::None]
                    );
                }
            }));
        }
        // A read_committed reader that must never see an aborted or open record.
        let reader = {
            let h = h.clone();
            tokio::spawn(async move {
                let mut offset = 0;
                let mut seen = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(20);
                while seen.len() < 4 * 40 + 5 * 3 {
                    assert!(Instant::now() < deadline, "reader stalled at {offset}");
                    let r = fetch(&h, offset, true, 64, 50).await;
                    assert_eq!(r.error_code, 0, "{}", r.error_message);
                    assert!(r.next_offset <= r.last_stable_offset);
                    for v in values(&r) {
                        assert!(!v.starts_with("abort"), "{v} visible to read_committed");
                        seen.push(v);
                    }
                    offset = r.next_offset;
                }
                seen
            })
        };
        for t in tasks {
            t.await.unwrap();
        }
        let seen = reader.await.unwrap();
        // Exactly once, in each producer's order.
        for pid in 1..=4 {
            let mine: Vec<&String> = seen
                .iter()
                .filter(|v| v.starts_with(&format!("p{pid}-")))
                .collect();
            let expected: Vec<String> = (0..40).map(|s| format!("p{pid}-{s}")).collect();
            assert_eq!(mine, expected.iter().collect::<Vec<_>>());
        }
        let committed: Vec<&String> = seen.iter().filter(|v| v.starts_with("commit")).collect();
        assert_eq!(committed.len(), 15);
        // Offsets are dense and the log holds every record once plus the 10 markers.
        let all = fetch(&h, 0, false, i32::MAX, 0).await;
        assert_eq!(all.high_watermark, 4 * 40 + 10 * 3 + 10);
        assert_eq!(all.records.len() as i64, all.high_watermark - 10);
    }
}
