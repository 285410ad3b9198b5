//! The tonic shell around [`crate::core`]: [`serve`] and the `TransactionCoordinator` service.
//!
//! What it does, per request: convert proto -> domain and check the input (ids 1..=255 bytes,
//! epochs in [0, 32767], timeouts in (0, max], lists of at most [`MAX_LIST_LEN`] entries:
//! INVALID_REQUEST / INVALID_TRANSACTION_TIMEOUT, nothing stored); check routing (NOT_COORDINATOR
//! unless `topology.coordinator_for(id)` is this node, COORDINATOR_LOAD_IN_PROGRESS until the
//! state is loaded); take the id's lock; call the core; make its metadata durable; reply; hand
//! its markers to a background writer. Errors become wire codes in one place, [`error_code`].
//!
//! Serialisation: one `tokio::sync::Mutex` per transactional id (a map of them behind a std
//! `Mutex` that is never held across `.await`). Holding the per-id lock across the sled write is
//! the point: it orders every transition of an id after the previous one is durable. Requests
//! for one id queue on it for the milliseconds of a write instead of being refused (see the core's
//! module docs). The PID allocator has its own tokio lock, held across the PID-block write so no
//! PID is handed out before its block is durable (lock order: id, then allocator).
//!
//! Markers (PROTOCOL.md section 7): per decided transaction a task sends WriteTxnMarkers to each
//! leader (partitions grouped per leader, leaders in parallel) and WriteGroupOffsetMarker to each
//! group's coordinator (this node short-circuits locally), retrying with exponential backoff
//! (`marker_retry_backoff` doubling up to 32x) until every partition answers NONE; then it
//! persists Complete*. Permanent marker errors, the same for a partition's leader and a group's
//! coordinator: TRANSACTION_COORDINATOR_FENCED means a newer incarnation of this coordinator
//! exists, so this one stops and never completes the transaction; INVALID_PRODUCER_EPOCH (the
//! leader or group already holds a newer epoch for the PID) is logged and counted as
//! acknowledged for an ABORT (nothing can become visible), while for a COMMIT the writer stops
//! and leaves PrepareCommit, so a commit that was not written is never completed (the next
//! start tries again). Every other error is retried.
//!
//! For a group, INVALID_PRODUCER_EPOCH on a COMMIT cannot reach a live writer: the group only
//! records an epoch above this marker's once a later transaction of the same PID ended, and that
//! transaction could not start before this one was Complete*, i.e. before this marker was
//! acknowledged. Seeing it means a stale writer (e.g. a paused older incarnation) or lost
//! storage; stopping (logged at error, PrepareCommit kept) is the choice that can never complete
//! a commit whose offsets were not written, at the price of a transaction left in PrepareCommit
//! (retried at each start) for an operator to look at. Treating it as acknowledged ("something
//! newer committed, so ours must have") would rest on that argument alone; it is kept identical
//! to the leader case instead, so the rule has one statement.
//!
//! Group markers on the receiving side (this node coordinates the group): per group, one
//! `tokio::sync::Mutex` (held across the read of the fence and the sled write: serialising the
//! two is the point), [`core::write_group_marker`] decides, and an accepted marker's offsets and
//! fence are written in one durable storage call before the reply. A marker to a group this node
//! owns short-circuits to that same path, so local and remote markers are fenced alike.
//!
//! Start: open sled (waiting for a previous instance's lock file), serve at once (answering
//! COORDINATOR_LOAD_IN_PROGRESS), bump and persist the generation, load the owned ids, re-send
//! the markers of every Prepare*, then start the timeout scan (every `timeout_scan_interval`).
//! Stop: stop accepting, let tonic drain the connections, stop and join every background task,
//! flush, drop sled and wait until its lock file is released, so the directory can be reopened
//! as soon as [`serve`] returns.
//!
//! CAVEATS: DescribeTransactions answers INVALID_PRODUCER_ID_MAPPING for an unknown id (Kafka's
//! TRANSACTIONAL_ID_NOT_FOUND is not in the proto); ids and group locks are never expired from
//! memory; a marker writer stopped by a permanent error leaves its id in Prepare*
//! (CONCURRENT_TRANSACTIONS) until the next start retries it; a coordinator whose data directory
//! is lost restarts at generation 1 and is then fenced by every group (and leader) that saw it
//! at a higher generation.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cluster::{ClusterService, NodeId, ProducerId, TopicPartition, Topology};
use proto::partition_leader_client::PartitionLeaderClient;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::transaction_coordinator_server::{TransactionCoordinator, TransactionCoordinatorServer};
use proto::ErrorCode;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tracing::{debug, error, info, warn};

use crate::core::{self, MarkerJob, Outcome, PendingOffsets, ProducerIdAndEpoch, TxnError};
use crate::core::{PidAllocator, TxnMetadata, TxnResult, TxnState};
use crate::storage::{SledStorage, Storage, StorageError};
use crate::Error;

/// Longest list (partitions, offsets, ids) accepted in one request.
pub const MAX_LIST_LEN: usize = 10_000;
/// Per-RPC deadline for markers sent to other nodes.
const MARKER_RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// How to run a coordinator.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// This node's id (must be a coordinator in the topology).
    pub node_id: NodeId,
    /// Where the sled database lives (tree `__transaction_state`).
    pub data_dir: std::path::PathBuf,
    /// The cluster.
    pub topology: Arc<Topology>,
    /// How often Ongoing transactions are checked against their timeout (default 1s).
    pub timeout_scan_interval: Duration,
    /// First backoff between marker retries (default 100ms; doubles up to 32x).
    pub marker_retry_backoff: Duration,
    /// Largest transaction timeout accepted (default [`cluster::MAX_TRANSACTION_TIMEOUT_MS`]).
    pub max_transaction_timeout_ms: i32,
}

impl CoordinatorConfig {
    /// A config with the defaults.
    pub fn new(
        node_id: NodeId,
        data_dir: impl Into<std::path::PathBuf>,
        topology: Arc<Topology>,
    ) -> Self {
        Self {
            node_id,
            data_dir: data_dir.into(),
            topology,
            timeout_scan_interval: Duration::from_secs(1),
            marker_retry_backoff: Duration::from_millis(100),
            max_transaction_timeout_ms: cluster::MAX_TRANSACTION_TIMEOUT_MS,
        }
    }
}

/// Serves Cluster + TransactionCoordinator on an already bound listener until `shutdown`
/// resolves. Opens sled in `config.data_dir`, bumps and persists the coordinator generation,
/// loads state (answering COORDINATOR_LOAD_IN_PROGRESS meanwhile), completes Prepare*
/// transactions, runs the timeout scan. Returns after shutdown with sled flushed and closed
/// (the directory can be reopened at once).
pub async fn serve(
    config: CoordinatorConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_with_kafka(config, listener, None, shutdown).await
}

/// [`serve`], plus Kafka's protocol on `kafka_listener` when given (see [`crate::kafka`]).
pub async fn serve_with_kafka(
    config: CoordinatorConfig,
    listener: tokio::net::TcpListener,
    kafka_listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    if config.topology.coordinator_index(config.node_id).is_none() {
        return Err(Error::Config(format!(
            "node {} is not a coordinator in the topology",
            config.node_id
        )));
    }
    let dir = config.data_dir.clone();
    let config_dir = dir.clone();
    std::fs::create_dir_all(&dir)?;
    let storage = tokio::task::spawn_blocking(move || SledStorage::open(dir))
        .await
        .map_err(|e| StorageError::Task(e.to_string()))??;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let result = serve_inner(config, storage.clone(), listener, kafka_listener, shutdown).await;
    // The last reference: dropping it closes sled; then wait until sled's background threads
    // released the lock file, so the directory can be reopened as soon as `serve` returns.
    let dir = config_dir;
    tokio::task::spawn_blocking(move || {
        drop(storage);
        crate::storage::wait_until_unlocked(&dir, crate::storage::LOCK_WAIT)
    })
    .await
    .map_err(|e| StorageError::Task(e.to_string()))??;
    result
}

/// [`serve`] over any [`Storage`] (e.g. [`crate::storage::MemoryStorage`]); `config.data_dir` is
/// ignored. Flushes the storage before returning.
pub async fn serve_with_storage(
    config: CoordinatorConfig,
    storage: Arc<dyn Storage>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_inner(config, storage, listener, None, shutdown).await
}

async fn serve_inner(
    config: CoordinatorConfig,
    storage: Arc<dyn Storage>,
    listener: tokio::net::TcpListener,
    kafka_listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let topology = config.topology.clone();
    let index = topology.coordinator_index(config.node_id).ok_or_else(|| {
        Error::Config(format!(
            "node {} is not a coordinator in the topology",
            config.node_id
        ))
    })?;
    let (stop, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        node_id: config.node_id,
        coordinator_index: index,
        topology: topology.clone(),
        config,
        storage,
        generation: AtomicI64::new(-1),
        loaded: AtomicBool::new(false),
        txns: Mutex::new(HashMap::new()),
        groups: Mutex::new(HashMap::new()),
        pids: tokio::sync::Mutex::new(None),
        channels: Mutex::new(HashMap::new()),
        stop,
        tasks: Mutex::new(JoinSet::new()),
    });

    // Whoever stops first (the caller's shutdown, or a failed load) stops everything.
    let stop_tx = shared.stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut server_stop = shared.stop.subscribe();
    let server = tonic::transport::Server::builder()
        .add_service(ClusterService::new(topology).into_server())
        .add_service(TransactionCoordinatorServer::new(CoordinatorService {
            shared: shared.clone(),
        }))
        .serve_with_incoming_shutdown(
            // Small request/response RPCs: no Nagle delay on accepted connections.
            tokio_stream::StreamExt::map(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                |stream| {
                    if let Ok(s) = &stream {
                        let _ = s.set_nodelay(true);
                    }
                    stream
                },
            ),
            async move {
                let _ = server_stop.wait_for(|stopped| *stopped).await;
            },
        );
    let server = tokio::spawn(server);
    if let Some(kafka_listener) = kafka_listener {
        // Joined with the other background tasks below, so it ends before the storage closes.
        let kafka_config = kafka_wire::ServerConfig::new(shared.node_id, shared.topology.clone());
        let handler = Arc::new(crate::kafka::KafkaCoordinator::new(CoordinatorService {
            shared: shared.clone(),
        }));
        let mut stopped = shared.stop.subscribe();
        shared.spawn(async move {
            let stop = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = kafka_wire::serve(kafka_listener, kafka_config, handler, stop).await {
                warn!("kafka listener failed: {e}");
            }
        });
    }

    let loaded = shared.load().await;
    if let Err(e) = &loaded {
        error!(node_id = shared.node_id, error = %e, "loading transaction state failed; stopping");
        let _ = shared.stop.send(true);
    } else {
        let scan = shared.clone();
        shared.spawn(async move { scan.timeout_scan().await });
    }

    let served = match server.await {
        Ok(served) => served.map_err(Error::from),
        Err(e) => Err(Error::Config(format!("server task failed: {e}"))),
    };
    let _ = shared.stop.send(true);
    // Join every background task; a task spawned while joining (e.g. by the last timeout scan)
    // sees `stop` and ends at once, and is joined by the next round, so no task outlives `serve`
    // holding the storage open.
    loop {
        let mut tasks =
            std::mem::take(&mut *shared.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        if tasks.is_empty() {
            break;
        }
        while tasks.join_next().await.is_some() {}
    }
    let flushed = shared.blocking(|s| s.flush()).await;
    info!(node_id = shared.node_id, "coordinator stopped");
    loaded?;
    served?;
    flushed?;
    Ok(())
}

type Slot = Arc<tokio::sync::Mutex<Option<TxnMetadata>>>;

/// State shared by the gRPC handlers and the background tasks.
struct Shared {
    node_id: NodeId,
    coordinator_index: usize,
    topology: Arc<Topology>,
    config: CoordinatorConfig,
    storage: Arc<dyn Storage>,
    generation: AtomicI64,
    loaded: AtomicBool,
    /// Per-id metadata, each behind its own lock (see the module docs).
    txns: Mutex<HashMap<String, Slot>>,
    /// Per-group locks serialising the group markers this node applies (see the module docs).
    groups: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `None` until loaded.
    pids: tokio::sync::Mutex<Option<PidAllocator>>,
    /// One lazily connected channel per peer address.
    channels: Mutex<HashMap<String, Channel>>,
    /// `true` once the coordinator is stopping.
    stop: watch::Sender<bool>,
    /// Marker writers and the timeout scan.
    tasks: Mutex<JoinSet<()>>,
}

/// Unix time in milliseconds.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// How one marker destination ended.
#[derive(Debug, PartialEq, Eq)]
enum Delivery {
    Acknowledged,
    /// Shutdown or a permanent error: the transaction must not be completed by this task.
    Stopped,
}

impl Shared {
    fn generation(&self) -> i64 {
        self.generation.load(Ordering::Acquire)
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Sleeps for `d`; true if the coordinator started stopping meanwhile.
    async fn sleep_or_stop(&self, d: Duration) -> bool {
        let mut stop = self.stop.subscribe();
        tokio::select! {
            _ = tokio::time::sleep(d) => self.stopping(),
            _ = stop.wait_for(|s| *s) => true,
        }
    }

    /// Runs a storage call on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Storage) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let storage = self.storage.clone();
        tokio::task::spawn_blocking(move || f(storage.as_ref()))
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?
    }

    /// The slot of `id`. Only InitProducerId creates one (`create`); for any other request a
    /// missing id gets a detached empty slot, from which the core never persists anything.
    fn slot(&self, id: &str, create: bool) -> Slot {
        let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = map.get(id) {
            return slot.clone();
        }
        let slot = Slot::default();
        if create {
            map.insert(id.to_string(), slot.clone());
        }
        slot
    }

    fn all_slots(&self) -> Vec<(String, Slot)> {
        let map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// NOT_COORDINATOR unless this node owns `key`; then COORDINATOR_LOAD_IN_PROGRESS until loaded.
    fn check_owner(&self, key: &str) -> Result<(), Error> {
        if self.topology.coordinator_for(key).id != self.node_id {
            return Err(Error::NotCoordinator(key.to_string()));
        }
        self.check_loaded()
    }

    fn check_loaded(&self) -> Result<(), Error> {
        if !self.loaded.load(Ordering::Acquire) {
            return Err(Error::CoordinatorLoadInProgress);
        }
        Ok(())
    }

    /// Start: bump the generation, load owned ids, resume every Prepare*.
    async fn load(self: &Arc<Self>) -> Result<(), Error> {
        let snapshot = self.blocking(|s| s.load()).await?;
        let generation = snapshot.generation + 1;
        self.blocking(move |s| s.put_generation(generation)).await?;
        self.generation.store(generation, Ordering::Release);
        *self.pids.lock().await = Some(PidAllocator::new(
            self.coordinator_index,
            self.topology.coordinator_count(),
            snapshot.pid_block_end,
        ));
        let mut resume = Vec::new();
        let mut owned = 0;
        {
            let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
            for meta in snapshot.txns {
                if self.topology.coordinator_for(&meta.transactional_id).id != self.node_id {
                    continue;
                }
                owned += 1;
                if let Some(job) = meta.pending_markers() {
                    resume.push(job);
                }
                map.insert(
                    meta.transactional_id.clone(),
                    Arc::new(tokio::sync::Mutex::new(Some(meta))),
                );
            }
        }
        info!(
            node_id = self.node_id,
            generation,
            transactional_ids = owned,
            resuming = resume.len(),
            "transaction state loaded"
        );
        self.loaded.store(true, Ordering::Release);
        for job in resume {
            info!(txn_id = %job.transactional_id, pid = job.identity.producer_id,
                  epoch = job.identity.epoch, result = ?job.result, "resuming markers after start");
            self.spawn_markers(job);
        }
        Ok(())
    }

    async fn allocate_pid(&self) -> Result<ProducerId, Error> {
        // Held across the block write on purpose: no PID leaves before its block is durable.
        let mut pids = self.pids.lock().await;
        let allocation = pids
            .as_ref()
            .ok_or(Error::CoordinatorLoadInProgress)?
            .allocate();
        if let Some(end) = allocation.reserve {
            self.blocking(move |s| s.put_pid_block(end)).await?;
            debug!(node_id = self.node_id, end, "reserved a PID block");
        }
        *pids = Some(allocation.next);
        Ok(allocation.producer_id)
    }

    /// Runs one core transition for the locked id: allocate a PID if asked, persist, log,
    /// spawn markers, and return the reply.
    async fn transition(
        self: &Arc<Self>,
        stored: &mut Option<TxnMetadata>,
        step: impl Fn(Option<&TxnMetadata>, Option<ProducerId>) -> Outcome,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let mut outcome = step(stored.as_ref(), None);
        if outcome.reply == Err(TxnError::NeedProducerId) {
            let pid = self.allocate_pid().await?;
            outcome = step(stored.as_ref(), Some(pid));
        }
        self.apply(stored, outcome).await
    }

    async fn apply(
        self: &Arc<Self>,
        stored: &mut Option<TxnMetadata>,
        outcome: Outcome,
    ) -> Result<ProducerIdAndEpoch, Error> {
        if let Some(next) = outcome.persist {
            let value = next.clone();
            self.blocking(move |s| s.put_txn(&value)).await?;
            log_transition(stored.as_ref(), &next);
            *stored = Some(next);
        }
        if let Some(job) = outcome.markers {
            self.spawn_markers(job);
        }
        outcome.reply.map_err(Error::Protocol)
    }

    fn spawn_markers(self: &Arc<Self>, job: MarkerJob) {
        let shared = self.clone();
        self.spawn(async move { shared.write_markers(job).await });
    }

    fn channel(&self, address: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad address {address:?}: {e}"))?
            .connect_timeout(Duration::from_secs(1))
            .timeout(MARKER_RPC_TIMEOUT)
            .connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// Sends every marker of `job` until acknowledged, then completes the transaction.
    async fn write_markers(self: Arc<Self>, job: MarkerJob) {
        let leaders = job
            .partitions_by_leader(&self.topology)
            .into_iter()
            .map(|(leader, partitions)| self.markers_to_leader(&job, leader, partitions));
        let groups = job
            .groups_by_coordinator(&self.topology)
            .into_iter()
            .map(|(node, groups)| self.group_markers_to(&job, node, groups));
        let (leaders, groups) = futures::future::join(
            futures::future::join_all(leaders),
            futures::future::join_all(groups),
        )
        .await;
        if leaders
            .iter()
            .chain(&groups)
            .any(|d| *d != Delivery::Acknowledged)
        {
            return;
        }
        // Every marker is written: persist Complete*, retrying a failing disk until stopped.
        let slot = self.slot(&job.transactional_id, false);
        let mut backoff = self.config.marker_retry_backoff;
        loop {
            let mut stored = slot.lock().await;
            let Some(meta) = stored.as_ref() else { return };
            let outcome = core::complete_markers(meta, &job, now_ms());
            match self.apply(&mut stored, outcome).await {
                Ok(_) => return,
                Err(e) => {
                    error!(txn_id = %job.transactional_id, error = %e, "persisting completion failed; retrying")
                }
            }
            drop(stored);
            if self.sleep_or_stop(backoff).await {
                return;
            }
            backoff = (backoff * 2).min(self.config.marker_retry_backoff * 32);
        }
    }

    async fn markers_to_leader(
        &self,
        job: &MarkerJob,
        leader: Option<NodeId>,
        partitions: Vec<TopicPartition>,
    ) -> Delivery {
        let txn_id = &job.transactional_id;
        let Some(address) = leader
            .and_then(|id| self.topology.leader(id))
            .map(|n| n.address.clone())
        else {
            error!(%txn_id, ?partitions, "no leader in the topology for these partitions");
            return match job.result {
                TxnResult::Abort => Delivery::Acknowledged,
                TxnResult::Commit => Delivery::Stopped,
            };
        };
        let mut remaining: BTreeSet<TopicPartition> = partitions.into_iter().collect();
        let mut backoff = self.config.marker_retry_backoff;
        loop {
            if self.stopping() {
                return Delivery::Stopped;
            }
            let request = proto::WriteTxnMarkersRequest {
                producer_id: job.identity.producer_id,
                producer_epoch: i32::from(job.identity.epoch),
                result: wire_result(job.result) as i32,
                coordinator_id: self.node_id,
                coordinator_generation: self.generation(),
                partitions: remaining.iter().cloned().map(Into::into).collect(),
                transaction_version: job.transaction_version.to_wire(),
            };
            let reply = match self.channel(&address) {
                Err(e) => Err(e),
                Ok(channel) => PartitionLeaderClient::new(channel)
                    .write_txn_markers(request)
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|s| s.to_string()),
            };
            match reply {
                Err(e) => {
                    debug!(%txn_id, leader = ?leader, error = %e, "marker request failed; retrying")
                }
                Ok(reply) => {
                    for result in reply.results {
                        let Some(tp) = result.partition.map(TopicPartition::from) else {
                            continue;
                        };
                        match ErrorCode::from_wire(result.error_code) {
                            ErrorCode::None => {
                                remaining.remove(&tp);
                            }
                            ErrorCode::TransactionCoordinatorFenced => {
                                error!(%txn_id, partition = %tp, generation = self.generation(),
                                       "a newer incarnation of this coordinator wrote markers; stopping");
                                return Delivery::Stopped;
                            }
                            ErrorCode::InvalidProducerEpoch if job.result == TxnResult::Abort => {
                                warn!(%txn_id, partition = %tp, "leader holds a newer epoch; abort marker counted as written");
                                remaining.remove(&tp);
                            }
                            ErrorCode::InvalidProducerEpoch => {
                                error!(%txn_id, partition = %tp, pid = job.identity.producer_id,
                                       epoch = job.identity.epoch,
                                       "leader refuses the commit marker with a newer epoch; leaving PrepareCommit");
                                return Delivery::Stopped;
                            }
                            code => {
                                debug!(%txn_id, partition = %tp, ?code, message = %result.error_message,
                                       "marker not acknowledged; retrying")
                            }
                        }
                    }
                }
            }
            if remaining.is_empty() {
                return Delivery::Acknowledged;
            }
            if self.sleep_or_stop(backoff).await {
                return Delivery::Stopped;
            }
            backoff = (backoff * 2).min(self.config.marker_retry_backoff * 32);
        }
    }

    async fn group_markers_to(
        &self,
        job: &MarkerJob,
        node: NodeId,
        groups: Vec<(String, PendingOffsets)>,
    ) -> Delivery {
        let mut remaining = groups;
        let mut backoff = self.config.marker_retry_backoff;
        loop {
            if self.stopping() {
                return Delivery::Stopped;
            }
            let txn_id = &job.transactional_id;
            let mut still = Vec::new();
            for (group, offsets) in remaining {
                let marker = core::GroupMarker {
                    group_id: group.clone(),
                    producer_id: job.identity.producer_id,
                    epoch: job.identity.epoch,
                    result: job.result,
                    offsets: offsets.clone(),
                    coordinator_id: self.node_id,
                    coordinator_generation: self.generation(),
                    transaction_version: job.transaction_version,
                };
                let reply = if node == self.node_id {
                    let result = self.write_group_marker_locally(marker).await;
                    let (code, message) = code_of(&result);
                    Ok((ErrorCode::from_wire(code), message))
                } else {
                    self.write_group_marker_remote(node, marker).await
                };
                match reply {
                    Ok((ErrorCode::None, _)) => {}
                    Ok((ErrorCode::TransactionCoordinatorFenced, message)) => {
                        error!(%txn_id, %group, generation = self.generation(), %message,
                               "a newer incarnation of this coordinator wrote group markers; stopping");
                        return Delivery::Stopped;
                    }
                    Ok((ErrorCode::InvalidProducerEpoch, message))
                        if job.result == TxnResult::Abort =>
                    {
                        warn!(%txn_id, %group, %message,
                              "group holds a newer epoch; abort marker counted as written");
                    }
                    Ok((ErrorCode::InvalidProducerEpoch, message)) => {
                        // Unreachable for a live writer (module docs): never complete the commit.
                        error!(%txn_id, %group, pid = job.identity.producer_id,
                               epoch = job.identity.epoch, %message,
                               "group refuses the commit marker with a newer epoch; leaving PrepareCommit");
                        return Delivery::Stopped;
                    }
                    Ok((code, message)) => {
                        debug!(%txn_id, %group, ?code, %message, "group marker not acknowledged; retrying");
                        still.push((group, offsets));
                    }
                    Err(e) => {
                        debug!(%txn_id, %group, error = %e, "group marker failed; retrying");
                        still.push((group, offsets));
                    }
                }
            }
            remaining = still;
            if remaining.is_empty() {
                return Delivery::Acknowledged;
            }
            if self.sleep_or_stop(backoff).await {
                return Delivery::Stopped;
            }
            backoff = (backoff * 2).min(self.config.marker_retry_backoff * 32);
        }
    }

    /// Sends one group marker to coordinator `node`: its reply code and message, or a
    /// transport error (retried).
    async fn write_group_marker_remote(
        &self,
        node: NodeId,
        marker: core::GroupMarker,
    ) -> Result<(ErrorCode, String), String> {
        let address = self
            .topology
            .coordinator(node)
            .map(|n| n.address.clone())
            .ok_or_else(|| format!("coordinator {node} is not in the topology"))?;
        let request = proto::WriteGroupOffsetMarkerRequest {
            offsets: wire_offsets(&marker.offsets),
            group_id: marker.group_id,
            producer_id: marker.producer_id,
            producer_epoch: i32::from(marker.epoch),
            result: wire_result(marker.result) as i32,
            coordinator_id: marker.coordinator_id,
            coordinator_generation: marker.coordinator_generation,
            transaction_version: marker.transaction_version.to_wire(),
        };
        let reply = TransactionCoordinatorClient::new(self.channel(&address)?)
            .write_group_offset_marker(request)
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        Ok((ErrorCode::from_wire(reply.error_code), reply.error_message))
    }

    /// The lock of `group` (created on first use; see the module docs).
    fn group_lock(&self, group: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        groups.entry(group.to_string()).or_default().clone()
    }

    /// The group coordinator's side of a group marker: fence it against what the group
    /// recorded ([`core::write_group_marker`]); if accepted, make its offsets (COMMIT) and its
    /// epoch and generation durable before answering.
    async fn write_group_marker_locally(&self, marker: core::GroupMarker) -> Result<(), Error> {
        self.check_owner(&marker.group_id)?;
        let lock = self.group_lock(&marker.group_id);
        // Held across the read and the write on purpose: a second marker for this group must
        // be checked against the fence the first one writes.
        let _guard = lock.lock().await;
        let (group, pid, coordinator) = (
            marker.group_id.clone(),
            marker.producer_id,
            marker.coordinator_id,
        );
        let fence = {
            let group = group.clone();
            self.blocking(move |s| s.group_marker_fence(&group, pid, coordinator))
                .await?
        };
        let (epoch, generation, result) =
            (marker.epoch, marker.coordinator_generation, marker.result);
        match core::write_group_marker(&fence, marker) {
            Err(e) => {
                warn!(%group, pid, epoch, coordinator, generation, ?result,
                      recorded_epoch = ?fence.producer_epoch,
                      recorded_generation = ?fence.coordinator_generation,
                      error = %e, "group marker refused");
                Err(Error::Protocol(e))
            }
            Ok(None) => {
                debug!(%group, pid, epoch, coordinator, generation, "group marker repeated; nothing to write");
                Ok(())
            }
            Ok(Some(write)) => {
                let offsets = write.offsets.len();
                self.blocking(move |s| s.apply_group_marker(&write)).await?;
                debug!(%group, pid, epoch, coordinator, generation, ?result, offsets, "group marker applied");
                Ok(())
            }
        }
    }

    /// The periodic scan of PROTOCOL.md section 8.
    async fn timeout_scan(self: Arc<Self>) {
        loop {
            if self.sleep_or_stop(self.config.timeout_scan_interval).await {
                return;
            }
            let now = now_ms();
            for (id, slot) in self.all_slots() {
                // A busy id is looked at again on the next scan.
                let Ok(mut stored) = slot.try_lock() else {
                    continue;
                };
                if !stored.as_ref().is_some_and(|m| core::is_timed_out(m, now)) {
                    continue;
                }
                let result = self
                    .transition(&mut stored, |meta, pid| {
                        meta.and_then(|m| core::expire_timed_out(m, now, pid))
                            .unwrap_or_else(|| Outcome {
                                persist: None,
                                markers: None,
                                reply: Err(TxnError::InvalidTxnState("not expired".into())),
                            })
                    })
                    .await;
                if let Err(e) = result {
                    warn!(txn_id = %id, error = %e, "aborting a timed-out transaction failed; retrying on the next scan");
                }
            }
        }
    }
}

fn log_transition(old: Option<&TxnMetadata>, new: &TxnMetadata) {
    let txn_id = &new.transactional_id;
    let id = new.client_identity();
    let (pid, epoch, state) = (id.producer_id, id.epoch, new.state.name());
    let Some(old) = old else {
        info!(%txn_id, pid, epoch, state, "new transactional id: producer id allocated");
        return;
    };
    if old.state == new.state && old.client_identity() == id {
        debug!(%txn_id, pid, epoch, state, "transaction updated");
        return;
    }
    let from = old.state.name();
    match new.state {
        TxnState::PrepareAbort if new.timed_out => {
            info!(%txn_id, pid, epoch, state, from, "transaction timed out: fenced, aborting")
        }
        TxnState::PrepareAbort if old.state == TxnState::Ongoing && new.last_epoch == -1 => {
            info!(%txn_id, pid, epoch, state, from, "fencing an older instance: aborting its transaction")
        }
        TxnState::CompleteCommit => info!(%txn_id, pid, epoch, state, "transaction committed"),
        TxnState::CompleteAbort => info!(%txn_id, pid, epoch, state, "transaction aborted"),
        TxnState::Ongoing => debug!(%txn_id, pid, epoch, state, from, "transaction started"),
        _ if old.client_identity() != id => {
            info!(%txn_id, pid, epoch, state, from, "producer epoch bumped")
        }
        _ => info!(%txn_id, pid, epoch, state, from, "transaction state change"),
    }
}

fn wire_result(result: TxnResult) -> proto::TxnResult {
    match result {
        TxnResult::Commit => proto::TxnResult::Commit,
        TxnResult::Abort => proto::TxnResult::Abort,
    }
}

fn wire_state(state: TxnState) -> proto::TxnState {
    match state {
        TxnState::Empty => proto::TxnState::Empty,
        TxnState::Ongoing => proto::TxnState::Ongoing,
        TxnState::PrepareCommit => proto::TxnState::PrepareCommit,
        TxnState::PrepareAbort => proto::TxnState::PrepareAbort,
        TxnState::CompleteCommit => proto::TxnState::CompleteCommit,
        TxnState::CompleteAbort => proto::TxnState::CompleteAbort,
    }
}

fn wire_offsets(offsets: &PendingOffsets) -> Vec<proto::PartitionOffset> {
    offsets
        .iter()
        .map(|(tp, offset)| proto::PartitionOffset {
            topic: tp.topic.clone(),
            partition: tp.partition,
            offset: *offset,
        })
        .collect()
}

/// The one mapping from errors to wire codes.
pub fn error_code(error: &Error) -> ErrorCode {
    match error {
        Error::NotCoordinator(_) => ErrorCode::NotCoordinator,
        Error::CoordinatorLoadInProgress => ErrorCode::CoordinatorLoadInProgress,
        Error::Protocol(e) => match e {
            TxnError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            TxnError::InvalidTransactionTimeout(_) => ErrorCode::InvalidTransactionTimeout,
            TxnError::ConcurrentTransactions(_) => ErrorCode::ConcurrentTransactions,
            TxnError::ProducerFenced(_) => ErrorCode::ProducerFenced,
            TxnError::InvalidProducerIdMapping(_) => ErrorCode::InvalidProducerIdMapping,
            TxnError::InvalidProducerEpoch(_) => ErrorCode::InvalidProducerEpoch,
            TxnError::InvalidTxnState(_) => ErrorCode::InvalidTxnState,
            TxnError::UnknownTopicOrPartition(_) => ErrorCode::UnknownTopicOrPartition,
            TxnError::TransactionTimedOut(_) => ErrorCode::TransactionTimedOut,
            TxnError::TransactionCoordinatorFenced(_) => ErrorCode::TransactionCoordinatorFenced,
            TxnError::NeedProducerId => ErrorCode::UnknownServerError,
        },
        Error::Storage(_) => ErrorCode::KafkaStorageError,
        Error::Transport(_) | Error::Config(_) | Error::Io(_) => ErrorCode::UnknownServerError,
    }
}

/// `(error_code, error_message)` of a result.
fn code_of<T>(result: &Result<T, Error>) -> (i32, String) {
    match result {
        Ok(_) => (ErrorCode::None as i32, String::new()),
        Err(e) => (error_code(e) as i32, e.detail()),
    }
}

// ---- input validation (INVALID_REQUEST before anything else) ---------------------------------

fn invalid(message: impl Into<String>) -> Error {
    Error::Protocol(TxnError::InvalidRequest(message.into()))
}

fn check_id(what: &str, id: &str) -> Result<(), Error> {
    core::validate_id(what, id).map_err(Error::Protocol)
}

fn check_producer(pid: i64, epoch: i32) -> Result<ProducerIdAndEpoch, Error> {
    if pid < 0 {
        return Err(invalid(format!("producer id {pid} is negative")));
    }
    let epoch = cluster::epoch_from_wire(epoch, false)
        .ok_or_else(|| invalid(format!("producer epoch {epoch} is not in [0, 32767]")))?;
    Ok(ProducerIdAndEpoch::new(pid, epoch))
}

fn check_list_len(what: &str, len: usize) -> Result<(), Error> {
    if len > MAX_LIST_LEN {
        return Err(invalid(format!(
            "{len} {what}, over the limit of {MAX_LIST_LEN}"
        )));
    }
    Ok(())
}

fn check_topic(topic: &str) -> Result<(), Error> {
    if topic.is_empty() || topic.len() > cluster::topology::MAX_TOPIC_NAME_LEN {
        return Err(invalid(format!(
            "topic name must be 1..={} bytes",
            cluster::topology::MAX_TOPIC_NAME_LEN
        )));
    }
    Ok(())
}

fn check_partitions(partitions: Vec<proto::TopicPartition>) -> Result<Vec<TopicPartition>, Error> {
    check_list_len("partitions", partitions.len())?;
    partitions
        .into_iter()
        .map(|tp| {
            check_topic(&tp.topic)?;
            Ok(TopicPartition::from(tp))
        })
        .collect()
}

fn check_transaction_version(version: i32) -> Result<core::TransactionVersion, Error> {
    core::TransactionVersion::from_wire(version)
        .ok_or_else(|| invalid(format!("transaction version {version} is not 1 or 2")))
}

fn check_result(result: i32) -> Result<TxnResult, Error> {
    match proto::TxnResult::try_from(result) {
        Ok(proto::TxnResult::Commit) => Ok(TxnResult::Commit),
        Ok(proto::TxnResult::Abort) => Ok(TxnResult::Abort),
        Err(_) => Err(invalid(format!("transaction result {result} is unknown"))),
    }
}

/// The `TransactionCoordinator` gRPC service (also what the Kafka face calls, in-process).
#[derive(Clone)]
pub(crate) struct CoordinatorService {
    shared: Arc<Shared>,
}

impl CoordinatorService {
    /// The cluster topology.
    pub(crate) fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> NodeId {
        self.shared.node_id
    }

    /// NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS unless this node serves `key` now.
    pub(crate) fn check_owner(&self, key: &str) -> Result<(), Error> {
        self.shared.check_owner(key)
    }

    /// Whether the coordinator is stopping.
    pub(crate) fn stopping(&self) -> watch::Receiver<bool> {
        self.shared.stop.subscribe()
    }

    /// Kafka's OffsetCommit outside a transaction (the membership check is the Kafka face's):
    /// the same input checks as TxnOffsetCommit, then the offsets are written durably under the
    /// group's lock, which the group markers take too.
    pub(crate) async fn offset_commit(
        &self,
        group: String,
        offsets: Vec<proto::PartitionOffset>,
    ) -> Result<(), Error> {
        let s = &self.shared;
        check_id("group id", &group)?;
        check_list_len("offsets", offsets.len())?;
        let mut checked = PendingOffsets::new();
        for o in offsets {
            check_topic(&o.topic)?;
            if o.offset < 0 {
                return Err(invalid(format!("offset {} is negative", o.offset)));
            }
            if !s.topology.partition_exists(&o.topic, o.partition) {
                return Err(Error::Protocol(core::TxnError::UnknownTopicOrPartition(
                    format!(
                        "{}-{} does not exist; no offset was committed",
                        o.topic, o.partition
                    ),
                )));
            }
            checked.insert(TopicPartition::new(o.topic, o.partition), o.offset);
        }
        s.check_owner(&group)?;
        let lock = s.group_lock(&group);
        let _guard = lock.lock().await;
        s.blocking(move |st| st.commit_group_offsets(&group, &checked))
            .await?;
        Ok(())
    }

    pub(crate) async fn init_producer_id(
        &self,
        request: proto::InitProducerIdRequest,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let s = &self.shared;
        let Some(id) = request.transactional_id else {
            // Idempotent producer: any coordinator hands out a fresh PID at epoch 0.
            s.check_loaded()?;
            let pid = s.allocate_pid().await?;
            debug!(pid, "idempotent producer id allocated");
            return Ok(ProducerIdAndEpoch::new(pid, 0));
        };
        // Step 1: shape of the request.
        check_id("transactional id", &id)?;
        let version = check_transaction_version(request.transaction_version)?;
        core::validate_timeout(
            request.transaction_timeout_ms,
            s.config.max_transaction_timeout_ms,
        )?;
        let expected = match (
            request.expected_producer_id,
            request.expected_producer_epoch,
        ) {
            (-1, -1) => None,
            (pid, epoch) => Some(check_producer(pid, epoch)?),
        };
        // Step 2: routing.
        s.check_owner(&id)?;
        let slot = s.slot(&id, true);
        let mut stored = slot.lock().await;
        let (timeout, now) = (request.transaction_timeout_ms, now_ms());
        s.transition(&mut stored, |meta, pid| {
            core::init_producer_id_for_version(&id, meta, timeout, expected, now, pid, version)
        })
        .await
    }

    pub(crate) async fn add_partitions(
        &self,
        request: proto::AddPartitionsToTxnRequest,
    ) -> Result<(), Error> {
        let s = &self.shared;
        let id = request.transactional_id;
        check_id("transactional id", &id)?;
        let caller = check_producer(request.producer_id, request.producer_epoch)?;
        let partitions = check_partitions(request.partitions)?;
        s.check_owner(&id)?;
        let slot = s.slot(&id, false);
        let mut stored = slot.lock().await;
        let now = now_ms();
        s.transition(&mut stored, |meta, _| {
            core::add_partitions(&id, meta, caller, &partitions, &s.topology, now)
        })
        .await
        .map(drop)
    }

    pub(crate) async fn add_offsets(
        &self,
        request: proto::AddOffsetsToTxnRequest,
    ) -> Result<(), Error> {
        let s = &self.shared;
        let id = request.transactional_id;
        check_id("transactional id", &id)?;
        let caller = check_producer(request.producer_id, request.producer_epoch)?;
        check_id("group id", &request.group_id)?;
        s.check_owner(&id)?;
        let slot = s.slot(&id, false);
        let mut stored = slot.lock().await;
        let (group, now) = (request.group_id, now_ms());
        s.transition(&mut stored, |meta, _| {
            core::add_offsets(&id, meta, caller, &group, now)
        })
        .await
        .map(drop)
    }

    pub(crate) async fn txn_offset_commit(
        &self,
        request: proto::TxnOffsetCommitRequest,
    ) -> Result<(), Error> {
        let s = &self.shared;
        let id = request.transactional_id;
        check_id("transactional id", &id)?;
        let caller = check_producer(request.producer_id, request.producer_epoch)?;
        check_id("group id", &request.group_id)?;
        check_list_len("offsets", request.offsets.len())?;
        let mut offsets = Vec::with_capacity(request.offsets.len());
        for o in request.offsets {
            check_topic(&o.topic)?;
            if o.offset < 0 {
                return Err(invalid(format!("offset {} is negative", o.offset)));
            }
            offsets.push((TopicPartition::new(o.topic, o.partition), o.offset));
        }
        s.check_owner(&id)?;
        let slot = s.slot(&id, false);
        let mut stored = slot.lock().await;
        let (group, now) = (request.group_id, now_ms());
        s.transition(&mut stored, |meta, _| {
            core::txn_offset_commit(&id, meta, caller, &group, &offsets, &s.topology, now)
        })
        .await
        .map(drop)
    }

    pub(crate) async fn end_txn(
        &self,
        request: proto::EndTxnRequest,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let s = &self.shared;
        let id = request.transactional_id;
        check_id("transactional id", &id)?;
        let caller = check_producer(request.producer_id, request.producer_epoch)?;
        let result = check_result(request.result)?;
        s.check_owner(&id)?;
        let slot = s.slot(&id, false);
        let mut stored = slot.lock().await;
        let now = now_ms();
        s.transition(&mut stored, |meta, pid| {
            core::end_txn(&id, meta, caller, result, now, pid)
        })
        .await
    }

    async fn verify(&self, request: proto::VerifyTransactionRequest) -> Result<(), Error> {
        let s = &self.shared;
        let id = request.transactional_id;
        check_id("transactional id", &id)?;
        let caller = check_producer(request.producer_id, request.producer_epoch)?;
        let partition = request
            .partition
            .ok_or_else(|| invalid("partition is missing"))?;
        check_topic(&partition.topic)?;
        s.check_owner(&id)?;
        let slot = s.slot(&id, false);
        let stored = slot.lock().await;
        core::verify_transaction(&id, stored.as_ref(), caller, &partition.into())
            .map_err(Error::Protocol)
    }

    pub(crate) async fn offset_fetch(
        &self,
        request: proto::OffsetFetchRequest,
    ) -> Result<Vec<proto::PartitionOffset>, Error> {
        let s = &self.shared;
        check_id("group id", &request.group_id)?;
        let partitions = check_partitions(request.partitions)?;
        s.check_owner(&request.group_id)?;
        let group = request.group_id;
        let committed = s.blocking(move |st| st.group_offsets(&group)).await?;
        if partitions.is_empty() {
            return Ok(wire_offsets(&committed));
        }
        Ok(partitions
            .into_iter()
            .map(|tp| proto::PartitionOffset {
                offset: committed.get(&tp).copied().unwrap_or(-1),
                topic: tp.topic,
                partition: tp.partition,
            })
            .collect())
    }

    async fn group_marker(
        &self,
        request: proto::WriteGroupOffsetMarkerRequest,
    ) -> Result<(), Error> {
        check_id("group id", &request.group_id)?;
        let identity = check_producer(request.producer_id, request.producer_epoch)?;
        let result = check_result(request.result)?;
        if request.coordinator_generation < 0 {
            return Err(invalid(format!(
                "coordinator generation {} is negative",
                request.coordinator_generation
            )));
        }
        let transaction_version = check_transaction_version(request.transaction_version)?;
        check_list_len("offsets", request.offsets.len())?;
        let mut offsets = PendingOffsets::new();
        for o in request.offsets {
            check_topic(&o.topic)?;
            offsets.insert(TopicPartition::new(o.topic, o.partition), o.offset);
        }
        self.shared
            .write_group_marker_locally(core::GroupMarker {
                group_id: request.group_id,
                producer_id: identity.producer_id,
                epoch: identity.epoch,
                result,
                offsets,
                coordinator_id: request.coordinator_id,
                coordinator_generation: request.coordinator_generation,
                transaction_version,
            })
            .await
    }

    async fn describe_one(&self, id: &str, now: i64) -> proto::TransactionDescription {
        let s = &self.shared;
        let base = proto::TransactionDescription {
            transactional_id: id.to_string(),
            coordinator_id: s.node_id,
            producer_id: -1,
            producer_epoch: -1,
            last_epoch: -1,
            previous_producer_id: -1,
            next_producer_id: -1,
            transaction_start_ms: -1,
            ..Default::default()
        };
        let checked = check_id("transactional id", id).and_then(|_| s.check_owner(id));
        if let Err(e) = checked {
            return proto::TransactionDescription {
                error_code: error_code(&e) as i32,
                error_message: e.detail(),
                ..base
            };
        }
        let slot = s.slot(id, false);
        let stored = slot.lock().await;
        let Some(m) = stored.as_ref() else {
            return proto::TransactionDescription {
                error_code: ErrorCode::InvalidProducerIdMapping as i32,
                error_message: format!("transactional id {id:?} is unknown"),
                ..base
            };
        };
        proto::TransactionDescription {
            error_code: ErrorCode::None as i32,
            error_message: String::new(),
            transactional_id: id.to_string(),
            producer_id: m.producer_id,
            producer_epoch: i32::from(m.producer_epoch),
            last_epoch: i32::from(m.last_epoch),
            previous_producer_id: m.previous_producer_id,
            next_producer_id: m.next_producer_id,
            state: wire_state(m.state) as i32,
            transaction_timeout_ms: m.timeout_ms,
            partitions: m.partitions.iter().cloned().map(Into::into).collect(),
            groups: m.groups.keys().cloned().collect(),
            transaction_start_ms: m.txn_start_ms,
            last_update_ms: m.last_update_ms,
            age_ms: if m.txn_start_ms >= 0 {
                (now - m.txn_start_ms).max(0)
            } else {
                0
            },
            coordinator_id: s.node_id,
        }
    }
}

#[tonic::async_trait]
impl TransactionCoordinator for CoordinatorService {
    async fn init_producer_id(
        &self,
        request: Request<proto::InitProducerIdRequest>,
    ) -> Result<Response<proto::InitProducerIdResponse>, Status> {
        let request = request.into_inner();
        debug!(txn_id = ?request.transactional_id, "InitProducerId");
        let result = CoordinatorService::init_producer_id(self, request).await;
        let (error_code, error_message) = code_of(&result);
        let id = result.unwrap_or(ProducerIdAndEpoch::new(-1, -1));
        Ok(Response::new(proto::InitProducerIdResponse {
            error_code,
            error_message,
            producer_id: id.producer_id,
            producer_epoch: i32::from(id.epoch),
        }))
    }

    async fn add_partitions_to_txn(
        &self,
        request: Request<proto::AddPartitionsToTxnRequest>,
    ) -> Result<Response<proto::AddPartitionsToTxnResponse>, Status> {
        let request = request.into_inner();
        debug!(txn_id = %request.transactional_id, partitions = request.partitions.len(), "AddPartitionsToTxn");
        let (error_code, error_message) = code_of(&self.add_partitions(request).await);
        Ok(Response::new(proto::AddPartitionsToTxnResponse {
            error_code,
            error_message,
        }))
    }

    async fn add_offsets_to_txn(
        &self,
        request: Request<proto::AddOffsetsToTxnRequest>,
    ) -> Result<Response<proto::AddOffsetsToTxnResponse>, Status> {
        let request = request.into_inner();
        debug!(txn_id = %request.transactional_id, group = %request.group_id, "AddOffsetsToTxn");
        let (error_code, error_message) = code_of(&self.add_offsets(request).await);
        Ok(Response::new(proto::AddOffsetsToTxnResponse {
            error_code,
            error_message,
        }))
    }

    async fn txn_offset_commit(
        &self,
        request: Request<proto::TxnOffsetCommitRequest>,
    ) -> Result<Response<proto::TxnOffsetCommitResponse>, Status> {
        let request = request.into_inner();
        debug!(txn_id = %request.transactional_id, group = %request.group_id, "TxnOffsetCommit");
        let result = CoordinatorService::txn_offset_commit(self, request).await;
        let (error_code, error_message) = code_of(&result);
        Ok(Response::new(proto::TxnOffsetCommitResponse {
            error_code,
            error_message,
        }))
    }

    async fn offset_fetch(
        &self,
        request: Request<proto::OffsetFetchRequest>,
    ) -> Result<Response<proto::OffsetFetchResponse>, Status> {
        let request = request.into_inner();
        debug!(group = %request.group_id, "OffsetFetch");
        let result = CoordinatorService::offset_fetch(self, request).await;
        let (error_code, error_message) = code_of(&result);
        Ok(Response::new(proto::OffsetFetchResponse {
            error_code,
            error_message,
            offsets: result.unwrap_or_default(),
        }))
    }

    async fn end_txn(
        &self,
        request: Request<proto::EndTxnRequest>,
    ) -> Result<Response<proto::EndTxnResponse>, Status> {
        let request = request.into_inner();
        debug!(txn_id = %request.transactional_id, result = request.result, "EndTxn");
        let result = CoordinatorService::end_txn(self, request).await;
        let (error_code, error_message) = code_of(&result);
        let id = result.unwrap_or(ProducerIdAndEpoch::new(-1, -1));
        Ok(Response::new(proto::EndTxnResponse {
            error_code,
            error_message,
            producer_id: id.producer_id,
            producer_epoch: i32::from(id.epoch),
        }))
    }

    async fn list_transactions(
        &self,
        request: Request<proto::ListTransactionsRequest>,
    ) -> Result<Response<proto::ListTransactionsResponse>, Status> {
        let request = request.into_inner();
        let s = &self.shared;
        let mut response = proto::ListTransactionsResponse {
            coordinator_id: s.node_id,
            ..Default::default()
        };
        let filters: Result<BTreeSet<i32>, Error> = request
            .state_filters
            .iter()
            .map(|f| {
                proto::TxnState::try_from(*f)
                    .map(|st| st as i32)
                    .map_err(|_| invalid(format!("state filter {f} is unknown")))
            })
            .collect();
        let checked = check_list_len("state filters", request.state_filters.len())
            .and(filters)
            .and_then(|f| s.check_loaded().map(|_| f));
        let filters = match checked {
            Ok(f) => f,
            Err(e) => {
                response.error_code = error_code(&e) as i32;
                response.error_message = e.detail();
                return Ok(Response::new(response));
            }
        };
        let mut slots = s.all_slots();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, slot) in slots {
            let stored = slot.lock().await;
            let Some(m) = stored.as_ref() else { continue };
            let state = wire_state(m.state) as i32;
            if filters.is_empty() || filters.contains(&state) {
                response.transactions.push(proto::TransactionListing {
                    transactional_id: id,
                    producer_id: m.producer_id,
                    state,
                });
            }
        }
        Ok(Response::new(response))
    }

    async fn describe_transactions(
        &self,
        request: Request<proto::DescribeTransactionsRequest>,
    ) -> Result<Response<proto::DescribeTransactionsResponse>, Status> {
        let request = request.into_inner();
        let now = now_ms();
        let mut transactions = Vec::new();
        if let Err(e) = check_list_len("transactional ids", request.transactional_ids.len()) {
            transactions.push(proto::TransactionDescription {
                error_code: error_code(&e) as i32,
                error_message: e.detail(),
                coordinator_id: self.shared.node_id,
                ..Default::default()
            });
        } else {
            for id in &request.transactional_ids {
                transactions.push(self.describe_one(id, now).await);
            }
        }
        Ok(Response::new(proto::DescribeTransactionsResponse {
            transactions,
        }))
    }

    async fn verify_transaction(
        &self,
        request: Request<proto::VerifyTransactionRequest>,
    ) -> Result<Response<proto::VerifyTransactionResponse>, Status> {
        let request = request.into_inner();
        debug!(txn_id = %request.transactional_id, pid = request.producer_id, "VerifyTransaction");
        let (error_code, error_message) = code_of(&self.verify(request).await);
        Ok(Response::new(proto::VerifyTransactionResponse {
            error_code,
            error_message,
        }))
    }

    async fn write_group_offset_marker(
        &self,
        request: Request<proto::WriteGroupOffsetMarkerRequest>,
    ) -> Result<Response<proto::WriteGroupOffsetMarkerResponse>, Status> {
        let request = request.into_inner();
        debug!(group = %request.group_id, result = request.result, "WriteGroupOffsetMarker");
        let (error_code, error_message) = code_of(&self.group_marker(request).await);
        Ok(Response::new(proto::WriteGroupOffsetMarkerResponse {
            error_code,
            error_message,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_code() {
        let p = |e| error_code(&Error::Protocol(e));
        assert_eq!(
            p(TxnError::ProducerFenced(String::new())),
            ErrorCode::ProducerFenced
        );
        assert_eq!(
            p(TxnError::TransactionTimedOut(String::new())),
            ErrorCode::TransactionTimedOut
        );
        assert_eq!(
            p(TxnError::TransactionCoordinatorFenced(String::new())),
            ErrorCode::TransactionCoordinatorFenced
        );
        assert_eq!(
            p(TxnError::InvalidProducerEpoch(String::new())),
            ErrorCode::InvalidProducerEpoch
        );
        assert_eq!(p(TxnError::NeedProducerId), ErrorCode::UnknownServerError);
        // The core's names for its errors are the wire code's names.
        for e in [
            TxnError::InvalidRequest(String::new()),
            TxnError::InvalidTransactionTimeout(String::new()),
            TxnError::ConcurrentTransactions(String::new()),
            TxnError::ProducerFenced(String::new()),
            TxnError::InvalidProducerIdMapping(String::new()),
            TxnError::InvalidProducerEpoch(String::new()),
            TxnError::InvalidTxnState(String::new()),
            TxnError::UnknownTopicOrPartition(String::new()),
            TxnError::TransactionTimedOut(String::new()),
            TxnError::TransactionCoordinatorFenced(String::new()),
        ] {
            assert_eq!(e.name(), p(e.clone()).as_str_name());
        }
        assert_eq!(
            error_code(&Error::NotCoordinator("x".into())),
            ErrorCode::NotCoordinator
        );
        assert_eq!(
            error_code(&Error::CoordinatorLoadInProgress),
            ErrorCode::CoordinatorLoadInProgress
        );
        assert_eq!(
            error_code(&Error::Storage(StorageError::Task("x".into()))),
            ErrorCode::KafkaStorageError
        );
    }

    #[test]
    fn input_checks() {
        assert!(check_producer(-1, 0).is_err());
        assert!(check_producer(0, -1).is_err());
        assert!(check_producer(0, 32768).is_err());
        assert!(check_producer(0, 32767).is_ok());
        assert!(check_result(7).is_err());
        assert!(check_list_len("x", MAX_LIST_LEN).is_ok());
        assert!(check_list_len("x", MAX_LIST_LEN + 1).is_err());
        assert!(check_topic("").is_err());
        assert!(check_topic(&"t".repeat(250)).is_err());
    }
}
