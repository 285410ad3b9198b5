//! Test harness: real coordinators on 127.0.0.1:0 with sled in temp dirs, and fake partition
//! leaders served over real gRPC that acknowledge markers only when told to.

#![allow(dead_code, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cluster::{NodeId, Topology};
use coordinator::CoordinatorConfig;
use proto::partition_leader_server::PartitionLeaderServer;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::*;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

pub type Client = TransactionCoordinatorClient<Channel>;

pub use testkit::{eventually, FakeLeader};

pub struct Coordinator {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub dir: std::path::PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), coordinator::Error>>>,
}

/// A cluster of coordinators (ids 1..) and fake leaders (ids 101..), topic "t" with 3
/// partitions: 0 and 2 on leader 101, 1 on leader 102 (or all on 101 with one leader).
pub struct Cluster {
    pub topology: Arc<Topology>,
    pub coordinators: Vec<Coordinator>,
    pub leaders: Vec<FakeLeader>,
    pub tune: fn(&mut CoordinatorConfig),
    _dirs: tempfile::TempDir,
}

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

impl Cluster {
    pub async fn start(coordinators: usize) -> Self {
        Self::start_with(coordinators, |_| {}).await
    }

    pub async fn start_with(coordinators: usize, tune: fn(&mut CoordinatorConfig)) -> Self {
        Self::start_with_ghosts(coordinators, &[], tune).await
    }

    /// Like [`Cluster::start_with`], with `ghosts`: coordinators that are in the topology but not
    /// started (at an address nothing listens on), so a test can send what they would send.
    pub async fn start_with_ghosts(
        coordinators: usize,
        ghosts: &[NodeId],
        tune: fn(&mut CoordinatorConfig),
    ) -> Self {
        let dirs = tempfile::tempdir().unwrap();
        let mut listeners = Vec::new();
        for _ in 0..coordinators {
            listeners.push(bind().await);
        }
        let mut leaders = Vec::new();
        let mut leader_addrs = Vec::new();
        for _ in 0..2 {
            let leader = FakeLeader::default();
            leader.set_ack(true);
            let listener = bind().await;
            leader_addrs.push(listener.local_addr().unwrap());
            let server = tonic::transport::Server::builder()
                .add_service(PartitionLeaderServer::new(leader.clone()))
                .serve_with_incoming(cluster::node::incoming(listener));
            tokio::spawn(server);
            leaders.push(leader);
        }
        let mut toml = String::from("transaction_state_partitions = 8\n");
        for (i, l) in listeners.iter().enumerate() {
            toml += &format!(
                "[[coordinators]]\nid = {}\naddress = \"{}\"\n",
                i + 1,
                l.local_addr().unwrap()
            );
        }
        for ghost in ghosts {
            toml += &format!("[[coordinators]]\nid = {ghost}\naddress = \"127.0.0.1:1\"\n");
        }
        for (i, addr) in leader_addrs.iter().enumerate() {
            toml += &format!("[[leaders]]\nid = {}\naddress = \"{addr}\"\n", 101 + i);
        }
        toml += "[[topics]]\nname = \"t\"\nleaders = [101, 102, 101]\n";
        toml += "[[topics]]\nname = \"u\"\nleaders = [102]\n";
        let topology = Arc::new(Topology::parse(&toml).unwrap());
        let mut cluster = Cluster {
            topology,
            coordinators: Vec::new(),
            leaders,
            tune,
            _dirs: dirs,
        };
        for (i, listener) in listeners.into_iter().enumerate() {
            let id = i as NodeId + 1;
            let dir = cluster._dirs.path().join(format!("coordinator-{id}"));
            let addr = listener.local_addr().unwrap();
            let mut c = Coordinator {
                id,
                addr,
                dir,
                stop: None,
                task: None,
            };
            cluster.launch(&mut c, listener);
            cluster.coordinators.push(c);
        }
        cluster
    }

    fn launch(&self, c: &mut Coordinator, listener: TcpListener) {
        let mut config = CoordinatorConfig::new(c.id, c.dir.clone(), self.topology.clone());
        config.cluster_secret = Some(testkit::auth::secret());
        config.timeout_scan_interval = Duration::from_millis(20);
        config.marker_retry_backoff = Duration::from_millis(10);
        // Tests that expect CONCURRENT_TRANSACTIONS (markers held back on purpose) get it after
        // a short wait rather than the default's seconds.
        config.max_prepare_wait = Duration::from_millis(200);
        (self.tune)(&mut config);
        let (tx, rx) = oneshot::channel::<()>();
        c.stop = Some(tx);
        c.task = Some(tokio::spawn(coordinator::serve(
            config,
            listener,
            async move {
                let _ = rx.await;
            },
        )));
    }

    /// Stops coordinator `id` (index id - 1) and waits until `serve` returned.
    pub async fn stop(&mut self, id: NodeId) {
        let c = &mut self.coordinators[id as usize - 1];
        if let Some(stop) = c.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = c.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("serve returns promptly after shutdown")
                .unwrap()
                .expect("serve returns Ok");
        }
    }

    /// Stops and starts coordinator `id` again at the same address on the same directory.
    pub async fn restart(&mut self, id: NodeId) {
        self.stop(id).await;
        let mut c = self.coordinators.remove(id as usize - 1);
        let listener = TcpListener::bind(c.addr).await.unwrap();
        self.launch(&mut c, listener);
        self.coordinators.insert(id as usize - 1, c);
    }

    pub async fn client(&self, id: NodeId) -> Client {
        let addr = self.coordinators[id as usize - 1].addr;
        let client = eventually("connect", || async move {
            TransactionCoordinatorClient::connect(format!("http://{addr}"))
                .await
                .ok()
        })
        .await;
        // Wait until loaded (an idempotent InitProducerId answers once the state is loaded).
        let mut c = client.clone();
        eventually("coordinator loaded", || {
            let mut c = c.clone();
            async move {
                let r = c
                    .list_transactions(ListTransactionsRequest::default())
                    .await
                    .ok()?
                    .into_inner();
                (r.error_code == ErrorCode::None as i32).then_some(())
            }
        })
        .await;
        c = client;
        c
    }

    /// A transactional id owned by coordinator `id` (with a distinguishing prefix).
    pub fn id_owned_by(&self, id: NodeId, prefix: &str) -> String {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|k| self.topology.coordinator_for(k).id == id)
            .unwrap()
    }
}

pub fn tp(topic: &str, partition: i32) -> proto::TopicPartition {
    proto::TopicPartition {
        topic: topic.into(),
        partition,
    }
}

pub use testkit::requests::code;

/// A small typed wrapper over the generated client.
pub struct Txn {
    pub client: Client,
    pub id: String,
    /// The client transaction version InitProducerId asks for (2 unless [`Txn::v1`]).
    pub version: i32,
    /// Where TxnOffsetCommit goes: the group's coordinator ([`Txn::with_group_client`]; `None`:
    /// `client`, which must then coordinate the group).
    pub group_client: Option<Client>,
}

impl Txn {
    pub fn new(client: Client, id: &str) -> Self {
        Self {
            client,
            id: id.to_string(),
            version: 2,
            group_client: None,
        }
    }

    /// TxnOffsetCommit goes to `group_client` (the group's coordinator, as clients send it).
    pub fn with_group_client(self, group_client: Client) -> Self {
        Self {
            group_client: Some(group_client),
            ..self
        }
    }

    /// A client of transaction version 1 (a Kafka client without KIP-890 part 2): EndTxn keeps
    /// the epoch.
    pub fn v1(client: Client, id: &str) -> Self {
        Self {
            version: 1,
            ..Self::new(client, id)
        }
    }

    pub async fn init_raw(&mut self, timeout: i32, expected: (i64, i32)) -> InitProducerIdResponse {
        self.client
            .init_producer_id(InitProducerIdRequest {
                transactional_id: Some(self.id.clone()),
                transaction_timeout_ms: timeout,
                expected_producer_id: expected.0,
                expected_producer_epoch: expected.1,
                transaction_version: self.version,
            })
            .await
            .unwrap()
            .into_inner()
    }

    /// InitProducerId, retrying CONCURRENT_TRANSACTIONS; returns (pid, epoch).
    pub async fn init(&mut self) -> (i64, i32) {
        self.init_with_timeout(60_000).await
    }

    pub async fn init_with_timeout(&mut self, timeout: i32) -> (i64, i32) {
        let this = &*self;
        let version = self.version;
        eventually("init producer id", || {
            let mut client = this.client.clone();
            let id = this.id.clone();
            async move {
                let r = client
                    .init_producer_id(InitProducerIdRequest {
                        transactional_id: Some(id),
                        transaction_timeout_ms: timeout,
                        expected_producer_id: -1,
                        expected_producer_epoch: -1,
                        transaction_version: version,
                    })
                    .await
                    .unwrap()
                    .into_inner();
                match code(r.error_code) {
                    ErrorCode::None => Some((r.producer_id, r.producer_epoch)),
                    ErrorCode::ConcurrentTransactions | ErrorCode::CoordinatorLoadInProgress => {
                        None
                    }
                    other => panic!("init: {other:?} {}", r.error_message),
                }
            }
        })
        .await
    }

    pub async fn add(&mut self, pe: (i64, i32), parts: Vec<proto::TopicPartition>) -> ErrorCode {
        let r = self
            .client
            .add_partitions_to_txn(AddPartitionsToTxnRequest {
                transactional_id: self.id.clone(),
                producer_id: pe.0,
                producer_epoch: pe.1,
                partitions: parts,
            })
            .await
            .unwrap()
            .into_inner();
        code(r.error_code)
    }

    pub async fn add_offsets(&mut self, pe: (i64, i32), group: &str) -> ErrorCode {
        let r = self
            .client
            .add_offsets_to_txn(AddOffsetsToTxnRequest {
                transactional_id: self.id.clone(),
                producer_id: pe.0,
                producer_epoch: pe.1,
                group_id: group.into(),
            })
            .await
            .unwrap()
            .into_inner();
        code(r.error_code)
    }

    pub async fn commit_offsets(
        &mut self,
        pe: (i64, i32),
        group: &str,
        offsets: &[(&str, i32, i64)],
    ) -> ErrorCode {
        let r = self
            .group_client
            .as_ref()
            .unwrap_or(&self.client)
            .clone()
            .txn_offset_commit(TxnOffsetCommitRequest {
                transactional_id: self.id.clone(),
                producer_id: pe.0,
                producer_epoch: pe.1,
                group_id: group.into(),
                offsets: offsets
                    .iter()
                    .map(|(t, p, o)| PartitionOffset {
                        topic: t.to_string(),
                        partition: *p,
                        offset: *o,
                    })
                    .collect(),
                auth: None,
            })
            .await
            .unwrap()
            .into_inner();
        code(r.error_code)
    }

    pub async fn end_raw(&mut self, pe: (i64, i32), commit: bool) -> EndTxnResponse {
        self.client
            .end_txn(testkit::requests::end_txn(&self.id, pe, commit))
            .await
            .unwrap()
            .into_inner()
    }

    /// EndTxn expecting OK; returns the new (pid, epoch).
    pub async fn end(&mut self, pe: (i64, i32), commit: bool) -> (i64, i32) {
        let r = self.end_raw(pe, commit).await;
        assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
        (r.producer_id, r.producer_epoch)
    }

    pub async fn describe(&mut self) -> TransactionDescription {
        describe(&mut self.client, &self.id).await
    }

    /// Waits until the id is in `state`.
    pub async fn wait_state(&mut self, state: TxnState) -> TransactionDescription {
        let this = &*self;
        eventually(&format!("{} in {state:?}", self.id), || {
            let mut client = this.client.clone();
            let id = this.id.clone();
            async move {
                let d = describe(&mut client, &id).await;
                (d.state == state as i32 && d.error_code == 0).then_some(d)
            }
        })
        .await
    }
}

pub async fn describe(client: &mut Client, id: &str) -> TransactionDescription {
    let mut r = client
        .describe_transactions(DescribeTransactionsRequest {
            transactional_ids: vec![id.to_string()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.transactions.len(), 1);
    r.transactions.remove(0)
}

pub async fn offset_fetch(
    client: &mut Client,
    group: &str,
    parts: Vec<proto::TopicPartition>,
) -> (ErrorCode, Vec<(String, i32, i64)>) {
    offset_fetch_as(client, group, parts, false).await
}

/// [`offset_fetch`], requiring stable offsets (KIP-447) when `require_stable`.
pub async fn offset_fetch_as(
    client: &mut Client,
    group: &str,
    parts: Vec<proto::TopicPartition>,
    require_stable: bool,
) -> (ErrorCode, Vec<(String, i32, i64)>) {
    let r = client
        .offset_fetch(OffsetFetchRequest {
            group_id: group.into(),
            partitions: parts,
            require_stable,
        })
        .await
        .unwrap()
        .into_inner();
    (
        code(r.error_code),
        r.offsets
            .into_iter()
            .map(|o| (o.topic, o.partition, o.offset))
            .collect(),
    )
}

/// A description without the fields that change with the clock.
pub fn stable(mut d: TransactionDescription) -> TransactionDescription {
    d.age_ms = 0;
    d
}

/// A data directory and topology for a coordinator child process at a free address, with
/// leader 101 served in-process by `leader`.
pub async fn killable_setup(leader: &FakeLeader) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let leader_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let leader_addr = leader_listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PartitionLeaderServer::new(leader.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                leader_listener,
            )),
    );
    let addr = testkit::process::free_address();
    std::fs::write(
        dir.path().join("topology.toml"),
        format!(
            "transaction_state_partitions = 8\n\
             [[coordinators]]\nid = 1\naddress = \"{addr}\"\n\
             [[leaders]]\nid = 101\naddress = \"{leader_addr}\"\n\
             [[topics]]\nname = \"t\"\nleaders = [101, 101, 101]\n"
        ),
    )
    .unwrap();
    (dir, addr)
}

/// Starts the coordinator binary as node 1 at `addr`, with `dir/data` and `dir/topology.toml`
/// (a process a test can SIGKILL), logging to `log`.
pub fn spawn_coordinator(
    dir: &std::path::Path,
    addr: &str,
    log: &std::path::Path,
) -> testkit::process::Node {
    spawn_coordinator_with_args(dir, addr, log, &[])
}

/// [`spawn_coordinator`] with `extra` arguments (e.g. `--kafka-listen`).
pub fn spawn_coordinator_with_args(
    dir: &std::path::Path,
    addr: &str,
    log: &std::path::Path,
    extra: &[&str],
) -> testkit::process::Node {
    testkit::process::Node::spawn_with_args(
        env!("CARGO_BIN_EXE_coordinator"),
        1,
        addr,
        dir,
        "coordinator",
        log,
        extra,
    )
}

/// Connects to a coordinator child and waits until it has loaded its state.
pub async fn connect(addr: &str) -> Client {
    let endpoint = format!("http://{addr}");
    let client = eventually("coordinator process up", || {
        let endpoint = endpoint.clone();
        async move { Client::connect(endpoint).await.ok() }
    })
    .await;
    eventually("coordinator loaded", || {
        let mut c = client.clone();
        async move {
            let r = c
                .list_transactions(proto::ListTransactionsRequest::default())
                .await
                .ok()?
                .into_inner();
            (r.error_code == 0).then_some(())
        }
    })
    .await;
    client
}
