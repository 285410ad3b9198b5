//! The tonic shell around [`crate::core`]: [`serve`] and the `TransactionCoordinator` service.
//!
//! Rooms (one file per job; each may touch only what is listed):
//! - this file: configuration, [`serve`] / [`serve_with_storage`] (open, load, serve, stop),
//!   and `Shared`, the state every room works on, with its task and stop plumbing.
//! - `wire`: proto -> domain (input checks: ids 1..=255 bytes, epochs in [0, 32767], lists of at
//!   most [`MAX_LIST_LEN`] entries; INVALID_REQUEST, nothing stored) and domain -> proto.
//!   Pure functions; no state, no I/O.
//! - `grpc`: the gRPC handlers. Each only decodes (`wire`), calls one `Shared` method, and
//!   encodes the reply with the error mapped by [`crate::error_code`] (mini-redis's
//!   `Handler::run` shape).
//! - `state`: the per-id state: routing checks (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS),
//!   the per-id locks, PID allocation, running a core transition and persisting its outcome,
//!   loading at start, and the timeout scan. The only room that writes `__transaction_state`.
//! - `markers`: the marker writer: sends what a [`crate::core::MarkerJob`] owes to leaders and
//!   group coordinators through ONE deliver-with-backoff loop, asks the core what each reply
//!   means ([`crate::core::marker_reply`]), and completes the transaction.
//! - `leader_queue`: per leader, the queue whose task sends the WriteTxnMarkers of several
//!   transactions in one WriteTxnMarkersBatch (one WriteTxnMarkers each to a leader without it).
//! - `groups`: the receiving side of group markers, OffsetFetch and (KIP-447) TxnOffsetCommit:
//!   the only room that writes `__consumer_offsets` and `__group_marker_state`. `keyed_lock`:
//!   its per-group locks, kept only while held or waited for.
//! - `local`: what the Kafka face ([`crate::kafka`]) calls in-process: the same decoding and
//!   room methods as `grpc`, answering with the domain result or the [`Error`].
//! - `membership`: signing the internal requests this node sends, authenticating the ones it
//!   receives ([`cluster::auth`]), and the topology agreement with its peers; touches no storage.
//! - `commit`: the group commit writer: `state`'s writes of `__transaction_state` for different
//!   ids queue there and share one flush; each waiter is released after the flush covering it.
//!   Complete* is queued without a waiter: the next flush covers it (see `commit` for why).
//!
//! Serialisation: one `tokio::sync::Mutex` per transactional id (a map of them behind a std
//! `Mutex` that is never held across `.await`). Holding the per-id lock across the sled write is
//! the point: it orders every transition of an id after the previous one is durable. Requests
//! for one id queue on it for the milliseconds of a write instead of being refused (see the core's
//! module docs). Different ids do not wait for each other: their writes meet in the group
//! commit (`commit`) and share one flush. A request the core answers CONCURRENT_TRANSACTIONS only
//! because the id is in Prepare* (markers outstanding) does not bounce: `state` releases the
//! id's lock and waits, up to [`CoordinatorConfig::max_prepare_wait`], for the marker writer to
//! complete the transaction (the slot's `settled` signal), then runs the request again; past the
//! deadline it is answered CONCURRENT_TRANSACTIONS as before. The PID allocator has its own tokio lock, held across the PID-block write so no
//! PID is handed out before its block is durable (lock order: id, then allocator).
//!
//! Markers (PROTOCOL.md section 7): per decided transaction a task sends WriteTxnMarkers to each
//! leader (partitions grouped per leader, leaders in parallel; the rounds of different
//! transactions queued for the same leader meanwhile go out together in one
//! WriteTxnMarkersBatch, see `leader_queue`) and WriteGroupOffsetMarker to each
//! group's coordinator (this node short-circuits locally), retrying with exponential backoff
//! (`marker_retry_backoff` doubling up to 32x) until every partition answers NONE; then it
//! persists Complete*. Permanent marker errors, the same for a partition's leader and a group's
//! coordinator: TRANSACTION_COORDINATOR_FENCED means a newer incarnation of this coordinator
//! exists, so this one stops and never completes the transaction; INVALID_PRODUCER_EPOCH (the
//! leader or group already holds a newer epoch for the PID) is logged and counted as
//! acknowledged for an ABORT (nothing can become visible), while for a COMMIT the writer stops
//! and leaves PrepareCommit, so a commit that was not written is never completed (the next
//! start tries again). Every other error is retried. The rule is [`crate::core::marker_reply`].
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
//! async lock (held across the read of the fence and the sled write: serialising the two is the
//! point; `keyed_lock`: removed once nobody holds or waits for it), [`crate::core::write_group_marker`] decides, and an accepted marker's
//! offsets and fence are written in one durable storage call before the reply. A marker to a
//! group this node owns short-circuits to that same path, so local and remote markers are fenced
//! alike.
//!
//! Start: open sled on the blocking pool ([`cluster::node::open_sled`], waiting for a previous
//! instance's lock file), serve at once (answering COORDINATOR_LOAD_IN_PROGRESS), bump and
//! persist the generation, load the owned ids, re-send the markers of every Prepare*, then start
//! the timeout scan (every `timeout_scan_interval`). Stop: stop accepting, let tonic drain the
//! connections, stop and join every background task, close the group commit queue
//! and join its writer (after the marker tasks, which may still queue a completion), flush, and close sled
//! ([`cluster::node::close_sled`]: its lock file is released when [`serve`] returns).
//!
//! Operations: beside `Cluster` and `TransactionCoordinator` the server carries the standard
//! gRPC health service ([`cluster::health`]: NOT_SERVING until the state is loaded, after a
//! storage write failed (sled fails every write after an I/O error until the process restarts),
//! and from the moment the coordinator starts stopping) and server reflection. Every handler counts its answer
//! in [`CoordinatorConfig::metrics`] (by API and error code, fenced ones by id and PID); `state`
//! counts each durable transition (state gauge, epoch bumps by cause, transaction and marker
//! durations, flush latency) and records epoch changes in the id's bounded history, naming the
//! requester (its address, from the `REQUESTER` task-local the handlers set).
//!
//! CAVEATS: DescribeTransactions answers INVALID_PRODUCER_ID_MAPPING for an unknown id (Kafka's
//! TRANSACTIONAL_ID_NOT_FOUND is not in the proto); an id idle past
//! [`CoordinatorConfig::transactional_id_expiration`] is removed by the timeout scan (an
//! InitProducerId waiting for its lock meanwhile looks it up again and starts it afresh), group
//! locks are never removed from memory; a marker writer stopped by a permanent error leaves its id in Prepare*
//! (CONCURRENT_TRANSACTIONS) until the next start retries it; a coordinator whose data directory
//! is lost restarts at generation 1 and is then fenced by every group (and leader) that saw it
//! at a higher generation.

mod commit;
mod groups;
mod grpc;
mod keyed_lock;
mod leader_queue;
mod local;
mod markers;
mod membership;
mod state;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::auth::{ClusterSecret, Credentials};
use cluster::health::{self, NodeHealth, COORDINATOR_SERVICE};
use cluster::metrics::Metrics;
use cluster::node::{self, lock};
use cluster::{ClusterService, NodeId, Topology};
use proto::transaction_coordinator_server::TransactionCoordinatorServer;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tracing::{error, info};

use crate::core::{PidAllocator, TxnMetadata};
use crate::storage::{SledStorage, Storage, StorageError};
use crate::Error;

pub use crate::error::error_code;
pub(crate) use local::LocalService;
pub use wire::MAX_LIST_LEN;

/// Default of [`CoordinatorConfig::max_prepare_wait`].
pub const DEFAULT_MAX_PREPARE_WAIT: Duration = Duration::from_secs(5);

/// Default of [`CoordinatorConfig::transactional_id_expiration`]: 7 days, as Kafka's.
pub const DEFAULT_TRANSACTIONAL_ID_EXPIRATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Default of [`CoordinatorConfig::group_initial_rebalance_delay`]: 3 s, as Kafka's.
pub const DEFAULT_GROUP_INITIAL_REBALANCE_DELAY: Duration = Duration::from_secs(3);

/// Default of [`CoordinatorConfig::group_consumer_heartbeat_interval`]: 5 s, as Kafka's
/// `group.consumer.heartbeat.interval.ms`.
pub const DEFAULT_GROUP_CONSUMER_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// Default of [`CoordinatorConfig::group_consumer_session_timeout`]: 45 s, as Kafka's
/// `group.consumer.session.timeout.ms`.
pub const DEFAULT_GROUP_CONSUMER_SESSION_TIMEOUT: Duration = Duration::from_secs(45);

/// Default of [`CoordinatorConfig::group_max_size`] and
/// [`CoordinatorConfig::group_consumer_max_size`]: Kafka's (`Integer.MAX_VALUE`).
pub const DEFAULT_GROUP_MAX_SIZE: usize = i32::MAX as usize;

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
    /// The cluster secret internal requests are signed and checked with ([`cluster::auth`]).
    /// `None` (the default): this node's internal APIs refuse every caller.
    pub cluster_secret: Option<ClusterSecret>,
    /// How often the peers' topology fingerprints are checked (default 1s).
    pub peer_check_interval: Duration,
    /// How long a request that finds its id's markers still being written (PrepareCommit /
    /// PrepareAbort) waits for them to complete before it is answered CONCURRENT_TRANSACTIONS
    /// (default 5s, half the client's request timeout; zero answers at once).
    pub max_prepare_wait: Duration,
    /// How long a transactional id with no transaction open or being finished is kept after
    /// its last change before it is removed (Kafka's `transactional.id.expiration.ms`,
    /// default [`DEFAULT_TRANSACTIONAL_ID_EXPIRATION`]); checked by the timeout scan.
    pub transactional_id_expiration: Duration,
    /// How long the first rebalance of an empty consumer group waits for more members (Kafka's
    /// `group.initial.rebalance.delay.ms`, default [`DEFAULT_GROUP_INITIAL_REBALANCE_DELAY`]).
    pub group_initial_rebalance_delay: Duration,
    /// How often members of KIP-848 consumer groups heartbeat (Kafka's
    /// `group.consumer.heartbeat.interval.ms`).
    pub group_consumer_heartbeat_interval: Duration,
    /// How long a KIP-848 consumer group member may stay silent before it is removed (Kafka's
    /// `group.consumer.session.timeout.ms`).
    pub group_consumer_session_timeout: Duration,
    /// The most members a classic group takes (Kafka's `group.max.size`): a new member beyond
    /// it is GROUP_MAX_SIZE_REACHED.
    pub group_max_size: usize,
    /// The most members a KIP-848 group takes (Kafka's `group.consumer.max.size`).
    pub group_consumer_max_size: usize,
    /// Where this node counts what it does (serve them with [`cluster::metrics::serve_http`]).
    pub metrics: Metrics,
}

impl CoordinatorConfig {
    /// A config with the defaults (and a fresh [`Metrics`] registry).
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
            cluster_secret: None,
            peer_check_interval: Duration::from_secs(1),
            max_prepare_wait: DEFAULT_MAX_PREPARE_WAIT,
            transactional_id_expiration: DEFAULT_TRANSACTIONAL_ID_EXPIRATION,
            group_initial_rebalance_delay: DEFAULT_GROUP_INITIAL_REBALANCE_DELAY,
            group_consumer_heartbeat_interval: DEFAULT_GROUP_CONSUMER_HEARTBEAT_INTERVAL,
            group_consumer_session_timeout: DEFAULT_GROUP_CONSUMER_SESSION_TIMEOUT,
            group_max_size: DEFAULT_GROUP_MAX_SIZE,
            group_consumer_max_size: DEFAULT_GROUP_MAX_SIZE,
            metrics: Metrics::new(),
        }
    }

    /// This node's index among the coordinators, or a configuration error.
    fn coordinator_index(&self) -> Result<usize, Error> {
        self.topology
            .coordinator_index(self.node_id)
            .ok_or_else(|| {
                Error::Config(format!(
                    "node {} is not a coordinator in the topology",
                    self.node_id
                ))
            })
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
    config.coordinator_index()?;
    let dir = config.data_dir.clone();
    let open_dir = dir.clone();
    let storage = node::blocking(move || SledStorage::open(open_dir))
        .await
        .map_err(|e| StorageError::Task(e.to_string()))??;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let result = serve_inner(config, storage.clone(), listener, kafka_listener, shutdown).await;
    // Every task was joined: this is the last reference, and closing it releases the lock file.
    node::close_sled(storage, dir, node::SLED_LOCK_WAIT)
        .await
        .map_err(StorageError::Io)?;
    result
}

/// [`serve_with_kafka`] over any [`Storage`] (e.g. [`crate::storage::MemoryStorage`]);
/// `config.data_dir` is ignored. Flushes the storage before returning.
pub async fn serve_with_storage(
    config: CoordinatorConfig,
    storage: Arc<dyn Storage>,
    listener: tokio::net::TcpListener,
    kafka_listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_inner(config, storage, listener, kafka_listener, shutdown).await
}

async fn serve_inner(
    config: CoordinatorConfig,
    storage: Arc<dyn Storage>,
    listener: tokio::net::TcpListener,
    kafka_listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let topology = config.topology.clone();
    let index = config.coordinator_index()?;
    let (stop, _) = watch::channel(false);
    let fingerprint = topology.fingerprint();
    let credentials = config.cluster_secret.clone().map(|secret| Credentials {
        secret,
        node_id: config.node_id,
        fingerprint: fingerprint.clone(),
    });
    let storage_failed = Arc::new(watch::channel(false).0);
    let (commit, writer) = commit::GroupCommit::start(storage.clone(), storage_failed.clone())?;
    let shared = Arc::new(Shared {
        credentials,
        replays: cluster::auth::ReplayGuard::starting_at(cluster::node::now_ms()),
        fingerprint,
        peers: Mutex::new(membership::PeerView::Unchecked),
        node_id: config.node_id,
        coordinator_index: index,
        topology: topology.clone(),
        config,
        storage,
        commit,
        generation: AtomicI64::new(-1),
        loaded: AtomicBool::new(false),
        txns: Mutex::new(HashMap::new()),
        groups: keyed_lock::KeyedLocks::default(),
        group_state_writes: keyed_lock::KeyedLocks::default(),
        pending_txn_offsets: Mutex::new(crate::core::PendingTxnOffsets::default()),
        pending_writes: keyed_lock::KeyedLocks::default(),
        pids: tokio::sync::Mutex::new(None),
        channels: Mutex::new(HashMap::new()),
        leader_queues: Mutex::new(HashMap::new()),
        stop,
        storage_failed,
        tasks: Mutex::new(JoinSet::new()),
    });

    // Whoever stops first (the caller's shutdown, or a failed load) stops everything.
    let stop_tx = shared.stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut server_stop = shared.stop.subscribe();
    // NOT_SERVING until loaded, and again from the moment the coordinator starts stopping.
    let (health, health_service) = NodeHealth::new(COORDINATOR_SERVICE).await;
    let reflection = health::reflection(COORDINATOR_SERVICE)
        .map_err(|e| Error::Config(format!("reflection: {e}")))?;
    let mut stopping = shared.stop.subscribe();
    let unhealthy = health.clone();
    tokio::spawn(async move {
        let _ = stopping.wait_for(|stopped| *stopped).await;
        unhealthy.set_serving(false).await;
    });
    // The Kafka face holds the consumer groups; the Groups gRPC service shows them, with or
    // without a Kafka listener.
    let face = Arc::new(crate::kafka::KafkaCoordinator::new(LocalService::new(
        shared.clone(),
    )));
    let server = cluster::node::grpc_server()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(ClusterService::new(topology).into_server())
        .add_service(TransactionCoordinatorServer::new(
            grpc::CoordinatorService::new(shared.clone()),
        ))
        .add_service(proto::groups_server::GroupsServer::new(
            crate::group_service::GroupService::new(face.clone(), shared.node_id),
        ))
        .serve_with_incoming_shutdown(node::incoming(listener), async move {
            let _ = server_stop.wait_for(|stopped| *stopped).await;
        });
    let server = tokio::spawn(server);
    if let Some(kafka_listener) = kafka_listener {
        // Joined with the other background tasks below, so it ends before the storage closes.
        let mut kafka_config =
            kafka_wire::ServerConfig::new(shared.node_id, shared.topology.clone());
        kafka_config.metrics = Some(shared.config.metrics.clone());
        let handler = face.clone();
        let mut stopped = shared.stop.subscribe();
        let sweeper = handler.clone();
        shared.spawn(async move { sweeper.drop_idle_groups_periodically().await });
        shared.spawn(async move {
            let stop = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = kafka_wire::serve(kafka_listener, kafka_config, handler, stop).await {
                tracing::warn!("kafka listener failed: {e}");
            }
        });
    }
    // The first check before loading: once loaded, the coordinator knows whether it may serve.
    shared.refresh_peers().await;
    let peers = shared.clone();
    shared.spawn(async move { peers.check_peers().await });

    // The groups are restored before the node serves, as Kafka's coordinator loads
    // `__consumer_offsets` before it answers for a group.
    let restoring = face.clone();
    let loaded = shared
        .load(async move { restoring.restore_groups().await })
        .await;
    if let Err(e) = &loaded {
        error!(node_id = shared.node_id, error = %e, "loading transaction state failed; stopping");
        let _ = shared.stop.send(true);
    } else {
        if !shared.stopping() && !*shared.storage_failed.borrow() {
            health.set_serving(true).await;
        }
        // A failed write turns the node NOT_SERVING until it restarts.
        let (mut failed, unhealthy) = (shared.storage_failed.subscribe(), health.clone());
        let node_id = shared.node_id;
        let mut stopped = shared.stop.subscribe();
        shared.spawn(async move {
            let storage_failed = tokio::select! {
                r = failed.wait_for(|f| *f) => r.is_ok(),
                _ = stopped.wait_for(|s| *s) => false,
            };
            if storage_failed {
                error!(node_id, "the storage failed: NOT_SERVING; restart the node once the disk is fixed (nothing acknowledged is lost)");
                unhealthy.set_serving(false).await;
            }
        });
        let scan = shared.clone();
        shared.spawn(async move { scan.timeout_scan().await });
    }

    let served = match server.await {
        Ok(served) => served.map_err(Error::from),
        Err(e) => Err(Error::Config(format!("server task failed: {e}"))),
    };
    let _ = shared.stop.send(true);
    shared.join_tasks().await;
    // Last: the marker writers joined above may have queued their completions.
    shared.commit.close();
    if let Err(e) = commit::GroupCommit::join(writer).await {
        error!(node_id = shared.node_id, error = %e, "group commit writer failed");
    }
    let flushed = shared.blocking(|s| s.flush()).await;
    info!(node_id = shared.node_id, "coordinator stopped");
    loaded?;
    served?;
    flushed?;
    Ok(())
}

/// One transactional id's metadata behind its own lock, and the signal its waiters need.
#[derive(Debug, Default)]
struct IdSlot {
    meta: tokio::sync::Mutex<Option<TxnMetadata>>,
    /// Set (under `meta`'s lock) when the id expired and the slot left the map: whoever finds
    /// it set after taking the lock looks the id up again.
    removed: std::sync::atomic::AtomicBool,
    /// Notified when the id leaves PrepareCommit/PrepareAbort (its markers completed).
    settled: tokio::sync::Notify,
}

impl IdSlot {
    fn new(meta: Option<TxnMetadata>) -> Self {
        Self {
            meta: tokio::sync::Mutex::new(meta),
            removed: std::sync::atomic::AtomicBool::new(false),
            settled: tokio::sync::Notify::new(),
        }
    }
}

/// The slot of one transactional id.
type Slot = Arc<IdSlot>;

/// State shared by the gRPC handlers and the background tasks.
struct Shared {
    node_id: NodeId,
    /// What internal requests are signed and checked with (`None`: no secret configured).
    credentials: Option<Credentials>,
    /// The markers accepted lately: one seen again is a replay (`membership`).
    replays: cluster::auth::ReplayGuard,
    /// This node's topology fingerprint.
    fingerprint: String,
    /// The peers' topologies as last checked (`membership`).
    peers: Mutex<membership::PeerView>,
    coordinator_index: usize,
    topology: Arc<Topology>,
    config: CoordinatorConfig,
    storage: Arc<dyn Storage>,
    /// The group commit writer in front of `storage` for `__transaction_state`.
    commit: commit::GroupCommit,
    generation: AtomicI64,
    loaded: AtomicBool,
    /// Per-id metadata, each behind its own lock (see the module docs).
    txns: Mutex<HashMap<String, Slot>>,
    /// Per-group locks serialising the group markers this node applies (see the module docs);
    /// a group's lock lives only while it is held or waited for.
    groups: keyed_lock::KeyedLocks,
    /// Per group: orders its membership changes with their writes to storage (see
    /// `group_state_change`).
    group_state_writes: keyed_lock::KeyedLocks,
    /// KIP-447: transactional offsets of the groups this node coordinates whose marker has
    /// not been applied yet (recorded by the Kafka face, completed by `write_group_marker`).
    pending_txn_offsets: Mutex<crate::core::PendingTxnOffsets>,
    /// Orders the changes of a group's pending offsets that span memory and disk, per group: a
    /// commit records (memory, then disk) under the group's read guard, so commits record side
    /// by side; a refused commit's release and a group marker's removal (memory and disk) take
    /// the group's write guard, so a disk removal never deletes the record of a commit that
    /// recorded after the memory decided. Other groups go on meanwhile.
    pending_writes: keyed_lock::KeyedLocks<tokio::sync::RwLock<()>>,
    /// `None` until loaded.
    pids: tokio::sync::Mutex<Option<PidAllocator>>,
    /// One lazily connected channel per peer address.
    channels: Mutex<HashMap<String, Channel>>,
    /// One marker queue per leader address (see `leader_queue`).
    leader_queues: Mutex<HashMap<String, leader_queue::LeaderQueue>>,
    /// `true` once the coordinator is stopping.
    stop: watch::Sender<bool>,
    /// `true` once a write to the storage failed: sled keeps failing every write after an I/O
    /// error (a full disk, a failing device) until the process restarts, so from then on the
    /// health check says NOT_SERVING (see [`Shared::storage_error`]).
    storage_failed: Arc<watch::Sender<bool>>,
    /// Marker writers and the timeout scan.
    tasks: Mutex<JoinSet<()>>,
}

impl Shared {
    /// Counts one answered request in the node's metrics (by API and error code; a fenced one
    /// by transactional id and PID too).
    fn count(&self, request: &str, error_code: i32, txn_id: &str, pid: cluster::ProducerId) {
        self.config
            .metrics
            .request(request, error_code, txn_id, pid);
    }

    fn generation(&self) -> i64 {
        self.generation.load(Ordering::Acquire)
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = lock(&self.tasks);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Joins every background task; a task spawned while joining (e.g. by the last timeout
    /// scan) sees `stop` and ends at once, and is joined by the next round, so no task outlives
    /// `serve` holding the storage open.
    async fn join_tasks(&self) {
        loop {
            let mut tasks = std::mem::take(&mut *lock(&self.tasks));
            if tasks.is_empty() {
                break;
            }
            while tasks.join_next().await.is_some() {}
        }
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
        let result = node::blocking(move || f(storage.as_ref()))
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?;
        if let Err(e @ (StorageError::Sled(_) | StorageError::Io(_))) = &result {
            storage_error(&self.storage_failed, e);
        }
        result
    }
}

/// A write to the storage failed with `error`: recorded once (see `Shared::storage_failed`).
fn storage_error(failed: &watch::Sender<bool>, error: &dyn std::fmt::Display) {
    if !failed.send_replace(true) {
        error!(error = %error, "storage write failed; the node turns NOT_SERVING");
    }
}

/// Exponential backoff for the background retries (marker delivery, persisting completion):
/// `marker_retry_backoff` doubling up to 32x.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    fn new(first: Duration) -> Self {
        Self {
            next: first,
            max: first * 32,
        }
    }

    /// Waits the current backoff and doubles it; true if the coordinator started stopping.
    async fn wait(&mut self, shared: &Shared) -> bool {
        let stopped = shared.sleep_or_stop(self.next).await;
        self.next = (self.next * 2).min(self.max);
        stopped
    }
}
