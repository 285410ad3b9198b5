//! [`EmbeddedCluster`]: a whole mini-broker cluster inside one process, for the demo, `dev` and
//! the integration tests.
//!
//! Every node also serves Kafka's protocol on its own loopback port ([`EmbeddedCluster::kafka_bootstrap`]).
//! It binds every listener on `127.0.0.1:0` first, then writes the topology with the real
//! addresses to `<dir>/topology.toml`, then starts each node with that topology:
//! `coordinator::serve` for the coordinators and `partition_leader::serve` for the leaders, each
//! with its own sled directory under `<dir>/node-<id>`.
//!
//! [`EmbeddedCluster::kill`] stops a node (its `shutdown` future resolves; `serve` returns once
//! sled is flushed and closed) and [`EmbeddedCluster::restart`] starts it again with the same
//! data directory on the same port (the bind is retried briefly while the old socket goes away).
//!
//! CAVEATS: a kill is a *clean* stop of the node's task (in-flight requests are answered first,
//! sled is closed). A process crash cannot be simulated in-process, but what a node acknowledged
//! is durable before the reply anyway, which is what a clean stop cannot hide; marker retries in
//! flight are dropped, which is the interesting part.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{Node, NodeId, Topic, Topology};
use producer_client::ClientConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Node ids the embedded cluster uses: coordinators `1, 2, ...`, leaders `101, 102, ...`.
pub const FIRST_COORDINATOR_ID: NodeId = 1;
/// See [`FIRST_COORDINATOR_ID`].
pub const FIRST_LEADER_ID: NodeId = 101;

/// How to build the cluster.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// Number of coordinators (default 2).
    pub coordinators: usize,
    /// Number of partition leaders (default 3).
    pub leaders: usize,
    /// Topics and their partition counts; partition `i` is led by leader `i mod leaders`
    /// (default `input` and `output`, 3 partitions each).
    pub topics: Vec<(String, usize)>,
    /// `__transaction_state` partitions (default 8).
    pub transaction_state_partitions: i32,
    /// Coordinators' timeout scan interval (default 1 s; tests use less).
    pub timeout_scan_interval: Duration,
    /// Coordinators' marker retry backoff (default 100 ms).
    pub marker_retry_backoff: Duration,
    /// Coordinators' largest accepted transaction timeout.
    pub max_transaction_timeout_ms: i32,
    /// DANGER: leaders skip the epoch check (to show that the demo's checker catches it).
    pub unsafe_skip_epoch_check: bool,
    /// Coordinators' `group.initial.rebalance.delay.ms` (default 3 s, as Kafka's).
    pub group_initial_rebalance_delay: Duration,
    /// Coordinators' `group.consumer.heartbeat.interval.ms` for KIP-848 consumer groups
    /// (default 5 s, as Kafka's; tests use less).
    pub group_consumer_heartbeat_interval: Duration,
    /// Coordinators' `group.consumer.session.timeout.ms` for KIP-848 consumer groups (default
    /// 45 s, as Kafka's; tests use less).
    pub group_consumer_session_timeout: Duration,
    /// Coordinators' `group.max.size` and `group.consumer.max.size` (classic and KIP-848
    /// groups; default Kafka's, `Integer.MAX_VALUE`).
    pub group_max_sizes: (usize, usize),
    /// Leaders' `producer.id.expiration.ms` and how often they look for expired states
    /// (default 1 day and 10 minutes, as Kafka's; tests use less).
    pub producer_id_expiration: (Duration, Duration),
    /// Where the data lives; `None`: a temporary directory removed on drop.
    pub data_dir: Option<PathBuf>,
    /// Fixed ports: node `k` (coordinators first, then leaders) listens on `base_port + k`.
    /// `None`: ephemeral ports.
    pub base_port: Option<u16>,
    /// Serve each node's Prometheus metrics over HTTP on an ephemeral loopback port
    /// ([`EmbeddedCluster::metrics_address`]). The registries exist either way
    /// ([`EmbeddedCluster::metrics`]).
    pub metrics_endpoints: bool,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        Self {
            coordinators: 2,
            leaders: 3,
            topics: vec![("input".into(), 3), ("output".into(), 3)],
            transaction_state_partitions: 8,
            timeout_scan_interval: Duration::from_secs(1),
            marker_retry_backoff: Duration::from_millis(100),
            max_transaction_timeout_ms: cluster::MAX_TRANSACTION_TIMEOUT_MS,
            unsafe_skip_epoch_check: false,
            group_initial_rebalance_delay: coordinator::DEFAULT_GROUP_INITIAL_REBALANCE_DELAY,
            group_consumer_heartbeat_interval:
                coordinator::DEFAULT_GROUP_CONSUMER_HEARTBEAT_INTERVAL,
            group_consumer_session_timeout: coordinator::DEFAULT_GROUP_CONSUMER_SESSION_TIMEOUT,
            group_max_sizes: (
                coordinator::DEFAULT_GROUP_MAX_SIZE,
                coordinator::DEFAULT_GROUP_MAX_SIZE,
            ),
            producer_id_expiration: (
                partition_leader::DEFAULT_PRODUCER_ID_EXPIRATION,
                partition_leader::DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL,
            ),
            data_dir: None,
            base_port: None,
            metrics_endpoints: false,
        }
    }
}

/// Why the cluster could not start or a node could not be controlled.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// Binding, writing the topology, creating directories.
    #[error("embedded cluster I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// No node has this id.
    #[error("no node with id {0} in the embedded cluster")]
    UnknownNode(NodeId),
    /// A node's `serve` failed.
    #[error("node {node} failed: {message}")]
    Node {
        /// The node.
        node: NodeId,
        /// What it reported.
        message: String,
    },
    /// The cluster did not answer in time.
    #[error("the embedded cluster did not become ready within {0:?}")]
    NotReady(Duration),
    /// The topology is invalid (bad options).
    #[error(transparent)]
    Topology(#[from] cluster::TopologyError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Coordinator,
    Leader,
}

struct Running {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), String>>,
}

struct NodeSlot {
    role: Role,
    address: SocketAddr,
    kafka_address: SocketAddr,
    data_dir: PathBuf,
    running: Option<Running>,
    /// A topology this node runs instead of the cluster's (a misconfiguration, for tests).
    topology: Option<Arc<Topology>>,
    /// The node's metrics; kept across restarts (counters keep counting).
    metrics: cluster::metrics::Metrics,
    /// Where they are served, with the endpoint's stop signal.
    metrics_endpoint: Option<(SocketAddr, tokio::sync::watch::Sender<bool>)>,
}

/// An in-process cluster. Dropping it stops every node (without waiting); call
/// [`EmbeddedCluster::shutdown`] to stop them cleanly.
pub struct EmbeddedCluster {
    options: EmbeddedOptions,
    _temp: Option<tempfile::TempDir>,
    dir: PathBuf,
    topology: Arc<Topology>,
    topology_path: PathBuf,
    nodes: BTreeMap<NodeId, NodeSlot>,
    /// The secret every node of this cluster signs and checks internal requests with.
    secret: cluster::auth::ClusterSecret,
}

impl std::fmt::Debug for EmbeddedCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedCluster")
            .field("dir", &self.dir)
            .field("nodes", &self.nodes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl EmbeddedCluster {
    /// Starts the default cluster: 2 coordinators, 3 leaders, topics `input` and `output`.
    pub async fn start() -> Result<Self, EmbeddedError> {
        Self::start_with(EmbeddedOptions::default()).await
    }

    /// Starts a cluster and waits until every node answers.
    pub async fn start_with(options: EmbeddedOptions) -> Result<Self, EmbeddedError> {
        let (temp, dir) = match &options.data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                (None, dir.clone())
            }
            None => {
                let temp = tempfile::Builder::new().prefix("minibroker-").tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };

        // 1. Bind every listener (gRPC and Kafka), so the topology can name the real addresses.
        let listeners = bind_listeners(&options).await?;
        // 2. The topology, written where the CLI and the nodes read it.
        let topology = topology_of(&options, &listeners)?;
        let topology_path = dir.join("topology.toml");
        std::fs::write(&topology_path, topology.to_toml())?;

        let mut cluster = Self {
            options,
            _temp: temp,
            dir: dir.clone(),
            topology: Arc::new(topology),
            topology_path,
            nodes: BTreeMap::new(),
            secret: cluster::auth::ClusterSecret::generate(),
        };
        // For tools an operator runs against this cluster as a member (an ABORT marker).
        std::fs::write(cluster.secret_path(), cluster.secret.expose())?;

        // 3. Start every node on its listener.
        for (id, role, listener, kafka) in listeners {
            let data_dir = dir.join(format!("node-{id}"));
            std::fs::create_dir_all(&data_dir)?;
            let address = listener.local_addr()?;
            let kafka_address = kafka.local_addr()?;
            let metrics = cluster::metrics::Metrics::new();
            let metrics_endpoint = if cluster.options.metrics_endpoints {
                let (stop, stopped) = tokio::sync::watch::channel(false);
                let (bound, _) =
                    cluster::metrics::spawn_endpoint("127.0.0.1:0", metrics.clone(), stopped)
                        .await?;
                Some((bound, stop))
            } else {
                None
            };
            cluster.nodes.insert(
                id,
                NodeSlot {
                    role,
                    address,
                    kafka_address,
                    data_dir,
                    running: None,
                    topology: None,
                    metrics,
                    metrics_endpoint,
                },
            );
            cluster.spawn(id, listener, kafka)?;
        }
        cluster.wait_ready(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    fn spawn(
        &mut self,
        id: NodeId,
        listener: TcpListener,
        kafka: TcpListener,
    ) -> Result<(), EmbeddedError> {
        let options = self.options.clone();
        let secret = self.secret.clone();
        let slot = self
            .nodes
            .get_mut(&id)
            .ok_or(EmbeddedError::UnknownNode(id))?;
        let topology = slot.topology.clone().unwrap_or(self.topology.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
        };
        let data_dir = slot.data_dir.clone();
        let metrics = slot.metrics.clone();
        let task = match slot.role {
            Role::Coordinator => {
                let mut config = coordinator::CoordinatorConfig::new(id, data_dir, topology);
                config.metrics = metrics;
                config.timeout_scan_interval = options.timeout_scan_interval;
                config.marker_retry_backoff = options.marker_retry_backoff;
                config.max_transaction_timeout_ms = options.max_transaction_timeout_ms;
                config.group_initial_rebalance_delay = options.group_initial_rebalance_delay;
                config.group_consumer_heartbeat_interval =
                    options.group_consumer_heartbeat_interval;
                config.group_consumer_session_timeout = options.group_consumer_session_timeout;
                (config.group_max_size, config.group_consumer_max_size) = options.group_max_sizes;
                config.cluster_secret = Some(secret);
                config.peer_check_interval = Duration::from_millis(200);
                tokio::spawn(async move {
                    coordinator::serve_with_kafka(config, listener, Some(kafka), shutdown)
                        .await
                        .map_err(|e| e.to_string())
                })
            }
            Role::Leader => {
                let mut config = partition_leader::LeaderConfig::new(id, data_dir, topology);
                config.unsafe_skip_epoch_check = options.unsafe_skip_epoch_check;
                config.cluster_secret = Some(secret);
                config.metrics = metrics;
                (
                    config.producer_id_expiration,
                    config.producer_id_expiration_check_interval,
                ) = options.producer_id_expiration;
                tokio::spawn(async move {
                    partition_leader::serve_with_kafka(config, listener, Some(kafka), shutdown)
                        .await
                        .map_err(|e| e.to_string())
                })
            }
        };
        slot.running = Some(Running { shutdown: tx, task });
        Ok(())
    }

    /// Polls Metadata on every running node until each answers, or fails after `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), EmbeddedError> {
        let deadline = Instant::now() + timeout;
        for (id, slot) in &self.nodes {
            if slot.running.is_none() {
                continue;
            }
            let address = slot.address.to_string();
            loop {
                let ok = match proto::cluster_client::ClusterClient::connect(format!(
                    "http://{address}"
                ))
                .await
                {
                    Ok(mut client) => client
                        .metadata(proto::MetadataRequest { topics: vec![] })
                        .await
                        .is_ok(),
                    Err(_) => false,
                };
                // A coordinator is ready once it has loaded its state (and checked its peers):
                // until then it answers COORDINATOR_LOAD_IN_PROGRESS.
                let ok = ok && (slot.role != Role::Coordinator || loaded(&address).await);
                if ok {
                    break;
                }
                if let Some(Running { task, .. }) = &slot.running {
                    if task.is_finished() {
                        return Err(EmbeddedError::Node {
                            node: *id,
                            message: "stopped while starting".into(),
                        });
                    }
                }
                if Instant::now() >= deadline {
                    return Err(EmbeddedError::NotReady(timeout));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    }

    /// The topology every node runs with.
    pub fn topology(&self) -> Arc<Topology> {
        self.topology.clone()
    }

    /// Where the topology file is.
    pub fn topology_path(&self) -> &Path {
        &self.topology_path
    }

    /// The cluster's directory (topology file and one data directory per node).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every node's Kafka address, coordinators first: a Kafka client's `bootstrap.servers`.
    pub fn kafka_bootstrap(&self) -> Vec<String> {
        self.nodes
            .values()
            .map(|s| s.kafka_address.to_string())
            .collect()
    }

    /// The Kafka address of node `id`.
    pub fn kafka_address(&self, id: NodeId) -> Option<SocketAddr> {
        self.nodes.get(&id).map(|s| s.kafka_address)
    }

    /// Every node's address, coordinators first: a bootstrap list.
    pub fn bootstrap(&self) -> Vec<String> {
        self.nodes.values().map(|s| s.address.to_string()).collect()
    }

    /// Node `id`'s metrics registry.
    pub fn metrics(&self, id: NodeId) -> Option<&cluster::metrics::Metrics> {
        self.nodes.get(&id).map(|s| &s.metrics)
    }

    /// Where node `id`'s metrics are served (with [`EmbeddedOptions::metrics_endpoints`]).
    pub fn metrics_address(&self, id: NodeId) -> Option<SocketAddr> {
        self.nodes
            .get(&id)
            .and_then(|s| s.metrics_endpoint.as_ref())
            .map(|(address, _)| *address)
    }

    /// A client configuration bootstrapping from every node.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::new(self.bootstrap())
    }

    /// The address of node `id`.
    pub fn address(&self, id: NodeId) -> Option<SocketAddr> {
        self.nodes.get(&id).map(|s| s.address)
    }

    /// The data directory of node `id`.
    pub fn data_dir(&self, id: NodeId) -> Option<&Path> {
        self.nodes.get(&id).map(|s| s.data_dir.as_path())
    }

    /// Coordinator node ids.
    pub fn coordinator_ids(&self) -> Vec<NodeId> {
        self.ids(Role::Coordinator)
    }

    /// Leader node ids.
    pub fn leader_ids(&self) -> Vec<NodeId> {
        self.ids(Role::Leader)
    }

    fn ids(&self, role: Role) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, s)| s.role == role)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The coordinator that owns `transactional_id` (or a group id).
    pub fn coordinator_for(&self, key: &str) -> NodeId {
        self.topology.coordinator_for(key).id
    }

    /// Whether node `id` is running.
    pub fn is_running(&self, id: NodeId) -> bool {
        self.nodes.get(&id).is_some_and(|s| s.running.is_some())
    }

    /// Stops node `id` and waits until its `serve` returned (sled closed). Stopping a stopped
    /// node does nothing.
    pub async fn kill(&mut self, id: NodeId) -> Result<(), EmbeddedError> {
        let slot = self
            .nodes
            .get_mut(&id)
            .ok_or(EmbeddedError::UnknownNode(id))?;
        let Some(running) = slot.running.take() else {
            return Ok(());
        };
        let _ = running.shutdown.send(());
        match running.task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(EmbeddedError::Node { node: id, message }),
            Err(e) => Err(EmbeddedError::Node {
                node: id,
                message: e.to_string(),
            }),
        }
    }

    /// Starts node `id` again with its data directory, on its address.
    pub async fn restart(&mut self, id: NodeId) -> Result<(), EmbeddedError> {
        let slot = self.nodes.get(&id).ok_or(EmbeddedError::UnknownNode(id))?;
        if slot.running.is_some() {
            return Ok(());
        }
        let (address, kafka_address) = (slot.address, slot.kafka_address);
        let listener = rebind(address).await?;
        let kafka = rebind(kafka_address).await?;
        self.spawn(id, listener, kafka)?;
        tracing::info!(node = id, %address, "node restarted");
        Ok(())
    }

    /// Restarts (killed) node `id` with `topology` instead of the cluster's: a node started with
    /// another topology file, for showing what the nodes do about it.
    pub async fn restart_with_topology(
        &mut self,
        id: NodeId,
        topology: Topology,
    ) -> Result<(), EmbeddedError> {
        let slot = self
            .nodes
            .get_mut(&id)
            .ok_or(EmbeddedError::UnknownNode(id))?;
        slot.topology = Some(Arc::new(topology));
        self.restart(id).await
    }

    /// The file holding [`EmbeddedCluster::cluster_secret`] (in the cluster's directory).
    pub fn secret_path(&self) -> PathBuf {
        self.dir.join("cluster.secret")
    }

    /// The cluster secret every node was started with (tests sign internal requests with it).
    pub fn cluster_secret(&self) -> &cluster::auth::ClusterSecret {
        &self.secret
    }

    /// Kills then restarts node `id`.
    pub async fn bounce(&mut self, id: NodeId) -> Result<(), EmbeddedError> {
        self.kill(id).await?;
        self.restart(id).await
    }

    /// Stops every node cleanly.
    pub async fn shutdown(mut self) -> Result<(), EmbeddedError> {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        let mut first_error = None;
        for id in ids {
            if let Err(e) = self.kill(id).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Binds `address` again after a node stopped (retried briefly while the old socket goes away).
async fn rebind(address: SocketAddr) -> Result<TcpListener, EmbeddedError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind(address).await {
            Ok(l) => return Ok(l),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(%address, error = %e, "rebinding; retrying");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        for slot in self.nodes.values_mut() {
            if let Some(running) = slot.running.take() {
                let _ = running.shutdown.send(());
            }
            if let Some((_, stop)) = slot.metrics_endpoint.take() {
                let _ = stop.send(true);
            }
        }
    }
}

/// A node's gRPC and Kafka listeners.
type Listeners = (NodeId, Role, TcpListener, TcpListener);

/// Step 1 of [`EmbeddedCluster::start_with`]: a gRPC listener per node (coordinators first), on
/// `base_port` and up, or on ephemeral ports; and a Kafka listener per node on an ephemeral port.
async fn bind_listeners(options: &EmbeddedOptions) -> Result<Vec<Listeners>, EmbeddedError> {
    let mut listeners = Vec::new();
    let ids: Vec<(NodeId, Role)> = (0..options.coordinators)
        .map(|i| (FIRST_COORDINATOR_ID + i as NodeId, Role::Coordinator))
        .chain((0..options.leaders).map(|i| (FIRST_LEADER_ID + i as NodeId, Role::Leader)))
        .collect();
    for (k, (id, role)) in ids.iter().enumerate() {
        let port = options.base_port.map_or(0, |b| b + k as u16);
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let kafka = TcpListener::bind(("127.0.0.1", 0)).await?;
        listeners.push((*id, *role, listener, kafka));
    }
    Ok(listeners)
}

/// Step 2 of [`EmbeddedCluster::start_with`]: the topology naming the bound addresses, topics'
/// partitions spread round robin over the leaders; validated.
fn topology_of(
    options: &EmbeddedOptions,
    listeners: &[Listeners],
) -> Result<Topology, EmbeddedError> {
    let node = |id: NodeId, l: &TcpListener, k: &TcpListener| -> Result<Node, EmbeddedError> {
        Ok(Node {
            id,
            address: l.local_addr()?.to_string(),
            kafka_address: Some(k.local_addr()?.to_string()),
        })
    };
    let mut coordinators = Vec::new();
    let mut leaders = Vec::new();
    for (id, role, l, k) in listeners {
        match role {
            Role::Coordinator => coordinators.push(node(*id, l, k)?),
            Role::Leader => leaders.push(node(*id, l, k)?),
        }
    }
    let topics = options
        .topics
        .iter()
        .map(|(name, partitions)| Topic {
            name: name.clone(),
            leaders: (0..*partitions)
                .map(|p| FIRST_LEADER_ID + (p % options.leaders.max(1)) as NodeId)
                .collect(),
        })
        .collect();
    let topology = Topology {
        transaction_state_partitions: options.transaction_state_partitions,
        coordinators,
        leaders,
        topics,
    };
    topology.validate()?;
    Ok(topology)
}

/// Whether the coordinator at `address` has loaded its state (ListTransactions answers NONE).
async fn loaded(address: &str) -> bool {
    let client = proto::transaction_coordinator_client::TransactionCoordinatorClient::connect(
        format!("http://{address}"),
    )
    .await;
    let Ok(mut client) = client else {
        return false;
    };
    client
        .list_transactions(proto::ListTransactionsRequest {
            state_filters: vec![],
        })
        .await
        .is_ok_and(|r| r.into_inner().error_code == proto::ErrorCode::None as i32)
}
