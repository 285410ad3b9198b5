//! The tonic shell: converts proto <-> domain, calls the [`crate::core`], performs the I/O
//! the core asked for (durable writes, coordinator verification), and maps errors to wire codes in
//! one place ([`Error::to_wire`]).
//!
//! Concurrency: every partition has a `tokio::sync::Mutex` (the write lock) that is held from the
//! core's check, across the append to the engine (sled's memory, no flush), until the new state
//! is applied. That serialisation is the point: offsets, sequence windows and open transactions of
//! a partition change one write at a time, and a plan is always applied to the state it was
//! computed from. The lock is NOT held across the flush: the write then waits for a group flush
//! (`flush`) shared by every write of every partition appended meanwhile, and only then are
//! readers' watermarks moved on ([`core::Watermarks`]) and the request answered. So nothing is
//! acknowledged or read before it is durable, and concurrent producers (on one partition or many)
//! share flushes. Duplicates and repeated markers are answered only after a flush covers what
//! they repeat. The in-memory [`PartitionState`] sits behind a std `Mutex` that is only held for
//! the (sync) core calls, never across an `.await`. The append, apply and wait run in a spawned
//! task that owns the write lock, so a client that disconnects mid-write cannot leave sled and
//! memory out of step.
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
//! Operations: the server also carries the standard gRPC health service (SERVING once the
//! partitions are loaded, NOT_SERVING when one goes offline or the leader stops) and server
//! reflection; the handlers count every answer in [`LeaderConfig::metrics`], and each durable
//! write its flush latency, its size and the partition's LSO lag.
//!
//! CAVEATS: no quotas, no fetch sessions, no follower replication (NOT_LEADER_OR_FOLLOWER only
//! reflects the static topology).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::health::{self, NodeHealth, LEADER_SERVICE};
use cluster::metrics::Metrics;
use cluster::node;
use cluster::{NodeId, TopicPartition, Topology};
use proto::partition_leader_server::{PartitionLeader, PartitionLeaderServer};
use proto::{
    DescribeProducersRequest, DescribeProducersResponse, FetchRequest, FetchResponse,
    MarkerPartitionResult, ProduceRequest, ProduceResponse, ProducerStateDescription, TxnResult,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use tokio::sync::{watch, Notify, OwnedMutexGuard};
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use crate::core::{self, LogEntry, Marker, PartitionState, Plan};
use crate::error::{Error, Result};
use crate::storage::{Storage, Write};
use crate::verify::TxnVerifier;

mod fetch;
mod flush;
mod marker;
mod produce;

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
    /// Largest batch accepted (default 1 MiB; at most [`core::MAX_BATCH_BYTES_LIMIT`]).
    pub max_batch_bytes: usize,
    /// Largest record accepted (default 1 MiB; at most [`core::MAX_BATCH_BYTES_LIMIT`]).
    pub max_record_bytes: usize,
    /// DANGER, for demonstrating that the checker catches broken fencing: skip the epoch checks.
    pub unsafe_skip_epoch_check: bool,
    /// The cluster secret internal requests are signed and checked with ([`cluster::auth`]).
    /// `None` (the default): WriteTxnMarkers is refused from every caller.
    pub cluster_secret: Option<cluster::auth::ClusterSecret>,
    /// Where this node counts what it does (serve them with [`cluster::metrics::serve_http`]).
    pub metrics: Metrics,
    /// How long a PID's state is kept at a partition after its last change when it has no
    /// transaction open there (Kafka's `producer.id.expiration.ms`; default
    /// [`DEFAULT_PRODUCER_ID_EXPIRATION`]).
    pub producer_id_expiration: Duration,
    /// How often expired producer states are looked for (Kafka's
    /// `producer.id.expiration.check.interval.ms`; default
    /// [`DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL`]).
    pub producer_id_expiration_check_interval: Duration,
}

/// Default of [`LeaderConfig::producer_id_expiration`]: one day, as Kafka's.
pub const DEFAULT_PRODUCER_ID_EXPIRATION: Duration = Duration::from_secs(24 * 60 * 60);

/// Kafka clients' default `delivery.timeout.ms`: how long a producer may retry one batch. A
/// producer state forgotten sooner can let a retry of an appended batch in again (a warning at
/// start: tests run with a short expiry on purpose).
const RETRY_WINDOW: Duration = Duration::from_secs(120);

/// What a leader warns of at start about its producer state expiry, if anything.
fn expiry_warning(expiration: Duration) -> Option<String> {
    (expiration < RETRY_WINDOW).then(|| {
        format!(
            "producer.id.expiration.ms is {} ms, below Kafka clients' default delivery.timeout.ms \
             ({} ms): a producer's retry may arrive after its state was forgotten and be appended twice",
            expiration.as_millis(),
            RETRY_WINDOW.as_millis()
        )
    })
}

/// Default of [`LeaderConfig::producer_id_expiration_check_interval`]: ten minutes, as Kafka's.
pub const DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL: Duration = Duration::from_secs(10 * 60);

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
            cluster_secret: None,
            metrics: Metrics::new(),
            producer_id_expiration: DEFAULT_PRODUCER_ID_EXPIRATION,
            producer_id_expiration_check_interval: DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL,
        }
    }

    /// What this node signs internal requests with, if it has a secret.
    pub fn credentials(&self) -> Option<cluster::auth::Credentials> {
        self.cluster_secret
            .clone()
            .map(|secret| cluster::auth::Credentials {
                secret,
                node_id: self.node_id,
                fingerprint: self.topology.fingerprint(),
            })
    }

    fn limits(&self) -> core::Limits {
        core::Limits {
            max_batch_bytes: self.max_batch_bytes,
            max_record_bytes: self.max_record_bytes,
        }
    }
}

/// Unix time in milliseconds: the `now_ms` handed to the core ([`cluster::node::now_ms`]).
pub use cluster::node::now_ms;

/// A storage call on the blocking pool ([`cluster::node::blocking`]).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    node::blocking(f)
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
        node::lock(&self.state)
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
    /// What internal requests are checked with (`None`: no secret, markers refused).
    credentials: Option<cluster::auth::Credentials>,
    /// The markers accepted lately: one seen again is a replay.
    replays: cluster::auth::ReplayGuard,
    unsafe_skip_epoch_check: bool,
    topology: Arc<Topology>,
    limits: core::Limits,
    partitions: HashMap<TopicPartition, Arc<Partition>>,
    storage: Arc<dyn Storage>,
    /// The group commit every write waits on.
    flush: Arc<flush::GroupFlush>,
    verifier: Arc<dyn TxnVerifier>,
    shutdown: watch::Receiver<bool>,
    metrics: Metrics,
    /// Set by [`serve_with`]: turned NOT_SERVING when a partition goes offline.
    health: std::sync::OnceLock<NodeHealth>,
    /// [`LeaderConfig::producer_id_expiration`].
    producer_id_expiration: Duration,
}

/// The PartitionLeader gRPC service.
#[derive(Clone)]
pub struct LeaderService {
    inner: Arc<Inner>,
}

impl LeaderService {
    /// This leader's settings, as DescribeConfigs shows them for its BROKER resource (Kafka's
    /// names): the batch limit and how long an idle producer's state is kept.
    pub fn broker_configs(&self) -> Vec<kafka_wire::configs::ConfigEntry> {
        use kafka_wire::configs::{ConfigEntry, ConfigType};
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        vec![
            ConfigEntry::new(
                "message.max.bytes",
                self.inner.limits.max_batch_bytes,
                ConfigType::Int,
            ),
            ConfigEntry::new(
                "producer.id.expiration.ms",
                ms(self.inner.producer_id_expiration),
                ConfigType::Int,
            ),
        ]
    }

    /// Loads every partition this node leads from `storage` (blocking I/O: call it from
    /// `spawn_blocking` or before the runtime is busy). Long polls end when `shutdown` turns true
    /// or its sender is dropped.
    pub fn open(
        config: &LeaderConfig,
        storage: Arc<dyn Storage>,
        verifier: Arc<dyn TxnVerifier>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self> {
        for (name, value) in [
            ("max_batch_bytes", config.max_batch_bytes),
            ("max_record_bytes", config.max_record_bytes),
        ] {
            if value == 0 || value > core::MAX_BATCH_BYTES_LIMIT {
                return Err(Error::Config(format!(
                    "{name} is {value}: it must be in [1, {}]",
                    core::MAX_BATCH_BYTES_LIMIT
                )));
            }
        }
        let mut partitions = HashMap::new();
        for (topic, partition) in config.topology.partitions_led_by(config.node_id) {
            let tp = TopicPartition::new(topic, partition);
            let loaded = storage.load(&tp)?;
            let mut state = PartitionState::restore(
                config.unsafe_skip_epoch_check,
                loaded.high_watermark,
                loaded.producers,
                loaded.aborted,
            )
            .map_err(|e| Error::Storage(format!("{tp}: {e}")))?;
            state.set_log_start_offset(loaded.log_start_offset);
            info!(
                partition = %tp,
                high_watermark = state.high_watermark(),
                last_stable_offset = state.last_stable_offset(),
                producers = state.producers().len(),
                "partition loaded"
            );
            config
                .metrics
                .lso_lag(&tp, state.high_watermark() - state.last_stable_offset());
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
                credentials: config.credentials(),
                replays: cluster::auth::ReplayGuard::starting_at(cluster::node::now_ms()),
                unsafe_skip_epoch_check: config.unsafe_skip_epoch_check,
                topology: config.topology.clone(),
                limits: config.limits(),
                partitions,
                flush: flush::GroupFlush::new(storage.clone(), config.metrics.clone()),
                storage,
                verifier,
                shutdown,
                metrics: config.metrics.clone(),
                health: std::sync::OnceLock::new(),
                producer_id_expiration: config.producer_id_expiration,
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
        let max_decoding = self.max_decoded_bytes();
        PartitionLeaderServer::new(self).max_decoding_message_size(max_decoding)
    }

    /// The most bytes one request's batch may take once decoded (a gRPC message, a Kafka
    /// batch's decompressed records): room for every batch within the configured limits,
    /// nothing near what a forged length could ask for.
    pub(crate) fn max_decoded_bytes(&self) -> usize {
        (self.inner.limits.max_batch_bytes.saturating_mul(2))
            .saturating_add(1024 * 1024)
            .max(4 * 1024 * 1024)
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

    /// Makes `plan` durable (with `entries`) and applies it; returns once it is durable and
    /// visible to readers. Runs in its own task (so it completes even if the request is
    /// dropped): under the write lock, the write is appended to the engine and applied to the
    /// state (the partition's next write is planned after it); the lock is released; the write
    /// waits for a group flush ([`flush`]) covering it; then the readers' watermarks move on.
    ///
    /// If the append fails, the engine may still hold part of it, so the partition's state is
    /// reloaded from the engine (if even that fails the partition goes offline). If the flush
    /// fails, memory already matches the engine, which keeps the write and may persist it with
    /// a later flush: the write is not acknowledged and may or may not survive, as in Kafka.
    async fn persist(
        &self,
        guard: OwnedMutexGuard<()>,
        part: Arc<Partition>,
        plan: Plan,
        entries: Vec<LogEntry>,
    ) -> Result<()> {
        let service = self.clone();
        tokio::spawn(async move {
            if plan.is_noop() {
                part.state().apply(&plan);
                let (ticket, marks) = (service.inner.flush.latest(), part.state().watermarks());
                drop(guard);
                return service.settle(&part, ticket, marks).await;
            }
            let (flush, store, held) = (
                service.inner.flush.clone(),
                service.inner.storage.clone(),
                part.clone(),
            );
            // One blocking call: append, apply, release the lock, and flush if no round runs.
            let appended = node::blocking(move || {
                let records = entries.len();
                let write = Write::new(&plan, entries);
                if let Err(e) = store.append(&held.tp, &write) {
                    return Err((e, guard));
                }
                held.state().apply(&plan);
                let ticket = flush.appended(records);
                let marks = held.state().watermarks();
                drop(guard);
                flush.lead();
                Ok((ticket, marks))
            })
            .await
            .map_err(|e| Error::Internal(format!("storage task failed: {e}")))?;
            match appended {
                Ok((ticket, marks)) => service.settle(&part, ticket, marks).await,
                Err((e, guard)) => {
                    // Still under the write lock: memory again as the engine holds it.
                    service.reload_after_failure(&part, &e).await;
                    drop(guard);
                    Err(e)
                }
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("write task failed: {e}")))?
    }

    /// Waits for a flush covering `ticket`, then publishes `marks` (taken under the write lock
    /// with the ticket) to readers and wakes long polls.
    pub(crate) async fn settle(
        &self,
        part: &Arc<Partition>,
        ticket: u64,
        marks: core::Watermarks,
    ) -> Result<()> {
        self.inner.flush.durable(ticket).await?;
        let lag = {
            let mut state = part.state();
            state.publish(marks);
            let visible = state.visible();
            visible.high_watermark - visible.last_stable_offset
        };
        self.inner.metrics.lso_lag(&part.tp, lag);
        part.appended.notify_waiters();
        Ok(())
    }

    /// After a failed append: the state again as the engine holds it, readers still limited to
    /// what they saw; the partition goes offline if even that fails.
    async fn reload_after_failure(&self, part: &Arc<Partition>, error: &Error) {
        warn!(partition = %part.tp, "write failed, reloading the partition: {error}");
        let (tp, storage) = (part.tp.clone(), self.inner.storage.clone());
        let skip = self.inner.unsafe_skip_epoch_check;
        let reloaded = blocking(move || {
            let loaded = storage.load(&tp)?;
            let mut state = PartitionState::restore(
                skip,
                loaded.high_watermark,
                loaded.producers,
                loaded.aborted,
            )?;
            state.set_log_start_offset(loaded.log_start_offset);
            Ok(state)
        })
        .await;
        match reloaded {
            Ok(mut state) => {
                let mut current = part.state();
                state.limit_visible(current.visible());
                *current = state;
            }
            Err(reload) => {
                tracing::error!(partition = %part.tp, "partition offline: {reload}");
                part.offline
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                if let Some(health) = self.inner.health.get() {
                    health.set_serving(false).await;
                }
            }
        }
        part.appended.notify_waiters();
    }

    /// DeleteRecords: moves the partition's log start to `offset` (-1: the high watermark
    /// readers see) as [`PartitionState::delete_records_target`] decides, durably, under the
    /// write lock (no write is planned meanwhile); returns the log start (Kafka's low
    /// watermark). Fetches below it are OFFSET_OUT_OF_RANGE on the Kafka face from then on, and
    /// ListOffsets(earliest) answers it. The records stay on disk, unread.
    pub async fn delete_records(&self, topic: &str, partition: i32, offset: i64) -> Result<i64> {
        let part = self.partition(topic, partition)?;
        let _write_lock = part.write_lock.lock().await;
        part.check_online()?;
        let target = part.state().delete_records_target(offset)?;
        if let Some(start) = target {
            let (storage, tp) = (self.inner.storage.clone(), part.tp.clone());
            blocking(move || storage.set_log_start(&tp, start)).await?;
            part.state().set_log_start_offset(start);
            info!(partition = %part.tp, log_start_offset = start, "records deleted before the new log start");
        }
        let start = part.state().log_start_offset();
        Ok(start)
    }

    /// [`LeaderConfig::producer_id_expiration`] in milliseconds.
    pub(crate) fn producer_expiration_ms(&self) -> i64 {
        i64::try_from(self.inner.producer_id_expiration.as_millis()).unwrap_or(i64::MAX)
    }

    /// One expiry scan: forgets, partition by partition under its write lock (so no write is
    /// planned against a state being forgotten), the producer states that expired
    /// ([`PartitionState::expired_producers`]), in the engine and in memory; returns how many.
    pub async fn expire_producers(&self) -> usize {
        let expiration = self.producer_expiration_ms();
        let mut forgotten = 0;
        for part in self.inner.partitions.values() {
            let _write_lock = part.write_lock.lock().await;
            if part.check_online().is_err() {
                continue;
            }
            let pids = part.state().expired_producers(now_ms(), expiration);
            if pids.is_empty() {
                continue;
            }
            let (storage, tp, expired) =
                (self.inner.storage.clone(), part.tp.clone(), pids.clone());
            if let Err(e) = blocking(move || storage.forget_producers(&tp, &expired)).await {
                // Forgotten in memory all the same: the engine's copy comes back at most at a
                // restart, as old as it was, and expires again.
                warn!(partition = %part.tp, "forgetting expired producer states in storage failed: {e}");
            }
            part.state().forget_producers(&pids);
            let first = &pids[..pids.len().min(8)];
            info!(partition = %part.tp, producers = pids.len(), ?first,
                  "expired producer states forgotten");
            self.inner.metrics.producers_expired(pids.len());
            forgotten += pids.len();
        }
        forgotten
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
        Ok(Response::new(
            self.produce_answered(request.into_inner()).await,
        ))
    }

    #[instrument(skip_all, fields(partitions = request.get_ref().partitions.len()))]
    async fn produce_partitions(
        &self,
        request: Request<proto::ProducePartitionsRequest>,
    ) -> Result<Response<proto::ProducePartitionsResponse>, Status> {
        let response = self.produce_partitions_inner(request.into_inner()).await;
        // The request itself, besides each entry counted as a Produce.
        self.inner.metrics.request(
            "ProducePartitions",
            proto::ErrorCode::None as i32,
            "",
            cluster::NO_PRODUCER_ID,
        );
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
        self.inner
            .metrics
            .request("Fetch", response.error_code, "", cluster::NO_PRODUCER_ID);
        Ok(Response::new(response))
    }

    #[instrument(skip_all, fields(pid = request.get_ref().producer_id, epoch = request.get_ref().producer_epoch))]
    async fn write_txn_markers(
        &self,
        request: Request<WriteTxnMarkersRequest>,
    ) -> Result<Response<WriteTxnMarkersResponse>, Status> {
        let request = request.into_inner();
        // Only the coordinator owning the transactional id may end its transaction here.
        let decided: std::result::Result<bool, (i32, String)> = self
            .authenticate_marker(&request)
            .and_then(|()| match TxnResult::try_from(request.result) {
                Ok(TxnResult::Commit) => Ok(true),
                Ok(TxnResult::Abort) => Ok(false),
                Err(_) => Err(Error::InvalidRequest(format!(
                    "unknown transaction result {}",
                    request.result
                ))),
            })
            .map_err(|e| e.to_wire());
        let results = futures::future::join_all(request.partitions.into_iter().map(|tp| {
            let decided = decided.clone();
            async move {
                let (error_code, error_message) = match decided {
                    Err(refused) => refused,
                    Ok(commit) => {
                        let marker = Marker {
                            producer_id: request.producer_id,
                            producer_epoch: request.producer_epoch,
                            commit,
                            coordinator_id: request.coordinator_id,
                            coordinator_generation: request.coordinator_generation,
                            transaction_version: request.transaction_version,
                            transaction_number: request.transaction_number,
                        };
                        match self.write_marker(&tp, marker).await {
                            Ok(()) => (proto::ErrorCode::None as i32, String::new()),
                            Err(e) => {
                                warn!(partition = %format!("{}-{}", tp.topic, tp.partition), "marker rejected: {e}");
                                e.to_wire()
                            }
                        }
                    }
                };
                self.inner.metrics.request(
                    "WriteTxnMarkers",
                    error_code,
                    "",
                    request.producer_id,
                );
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

    async fn write_txn_markers_batch(
        &self,
        request: Request<proto::WriteTxnMarkersBatchRequest>,
    ) -> Result<Response<proto::WriteTxnMarkersBatchResponse>, Status> {
        self.write_txn_markers_batch_of(request.into_inner())
            .await
            .map(Response::new)
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
        self.inner.metrics.request(
            "DescribeProducers",
            response.error_code,
            "",
            cluster::NO_PRODUCER_ID,
        );
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
    let open_dir = dir.clone();
    let storage = Arc::new(
        blocking(move || {
            // Waits (bounded) for a previous instance to release sled's lock file.
            node::prepare_sled_dir(&open_dir, node::SLED_LOCK_WAIT)
                .map_err(|e| Error::Storage(e.to_string()))?;
            crate::storage::SledStorage::open(open_dir)
        })
        .await?,
    );
    let verifier = Arc::new(
        crate::verify::GrpcVerifier::new(config.topology.clone(), VERIFY_TIMEOUT)
            .with_credentials(config.credentials()),
    );
    let result = serve_inner(
        config,
        storage.clone(),
        verifier,
        listener,
        kafka_listener,
        shutdown,
    )
    .await;
    let flushing = storage.clone();
    let flushed = blocking(move || flushing.flush()).await;
    // Waits (bounded) for stragglers holding the storage, then closes sled and its lock file.
    let closed = node::close_sled(storage, dir, node::SLED_LOCK_WAIT)
        .await
        .map_err(|e| Error::Storage(e.to_string()));
    result.and(flushed).and(closed)
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

/// Runs [`LeaderService::expire_producers`] every `interval` until the leader stops.
async fn expire_producers_periodically(service: LeaderService, interval: Duration) {
    let mut stopping = service.stopping();
    loop {
        tokio::select! {
            _ = stopping.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(interval) => {}
        }
        service.expire_producers().await;
    }
}

/// How often the health check looks at [`Storage::problem`].
const PROBLEM_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// Turns the health check NOT_SERVING (for good: the fix is a restart) once the storage
/// reports a problem that fails no write, e.g. its checkpoints failing; ends at stop.
async fn watch_storage(
    storage: Arc<dyn Storage>,
    health: NodeHealth,
    mut stopping: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stopping.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(PROBLEM_CHECK_INTERVAL) => {}
        }
        if let Some(problem) = storage.problem() {
            tracing::error!("storage problem, health NOT_SERVING until restart: {problem}");
            health.set_serving(false).await;
            return;
        }
    }
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
    let watched = storage.clone();
    let expiry_interval = config.producer_id_expiration_check_interval;
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
    // SERVING once the partitions are loaded; NOT_SERVING when one goes offline or on stop.
    let (health, health_service) = NodeHealth::new(LEADER_SERVICE).await;
    let reflection = health::reflection(LEADER_SERVICE)
        .map_err(|e| Error::Internal(format!("reflection: {e}")))?;
    health.set_serving(true).await;
    let _ = service.inner.health.set(health.clone());
    tokio::spawn(watch_storage(watched, health.clone(), service.stopping()));
    if let Some(warning) = expiry_warning(service.inner.producer_id_expiration) {
        warn!("{warning}");
    }
    tokio::spawn(expire_producers_periodically(
        service.clone(),
        expiry_interval,
    ));
    let kafka = kafka_listener.map(|kafka_listener| {
        let mut kafka_config = kafka_wire::ServerConfig::new(node_id, topology.clone());
        kafka_config.metrics = Some(service.inner.metrics.clone());
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
        health.set_serving(false).await;
        let _ = stop_tx.send(true);
    };
    let served = node::grpc_server()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(cluster::ClusterService::new(topology).into_server())
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(node::incoming(listener), shutdown)
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
    use super::*;

    #[test]
    fn an_expiry_shorter_than_a_clients_retries_is_warned_of() {
        assert_eq!(expiry_warning(DEFAULT_PRODUCER_ID_EXPIRATION), None);
        assert_eq!(expiry_warning(RETRY_WINDOW), None);
        let warning = expiry_warning(Duration::from_millis(1_500)).unwrap();
        assert!(warning.contains("1500 ms"), "{warning}");
    }
}
