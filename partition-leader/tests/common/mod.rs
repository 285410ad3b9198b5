//! Shared harness for the gRPC tests: real partition leaders on 127.0.0.1:0 over sled in temp
//! directories, the test kit's fake coordinator (VerifyTransaction only) served over real gRPC, a
//! topology built from the bound addresses, and small client helpers.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cluster::Topology;
use partition_leader::LeaderConfig;
use proto::partition_leader_client::PartitionLeaderClient;
use proto::*;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Topic used by the tests: partition 0 led by leader 101, partition 1 by 102.
pub const TOPIC: &str = "t";

/// Binds `n` listeners on loopback.
pub async fn bind(n: usize) -> Vec<TcpListener> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    out
}

/// Topology: coordinators at `coordinators` (ids 1, 2, ...), leaders 101 and 102, topic `t` with
/// partition 0 on 101 and 1 on 102 (and partition 2 on 101).
pub fn topology(coordinators: &[SocketAddr], leaders: &[SocketAddr; 2]) -> Arc<Topology> {
    let mut toml = String::from("transaction_state_partitions = 4\n");
    for (i, a) in coordinators.iter().enumerate() {
        toml += &format!("[[coordinators]]\nid = {}\naddress = \"{a}\"\n", i + 1);
    }
    toml += &format!(
        "[[leaders]]\nid = 101\naddress = \"{}\"\n[[leaders]]\nid = 102\naddress = \"{}\"\n",
        leaders[0], leaders[1]
    );
    toml += &format!("[[topics]]\nname = \"{TOPIC}\"\nleaders = [101, 102, 101]\n");
    Arc::new(Topology::parse(&toml).unwrap())
}

/// A running leader that can be stopped and restarted on the same address and data dir.
pub struct Leader {
    pub id: i32,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    pub topology: Arc<Topology>,
    pub skip_epoch_check: bool,
    /// Applied to the configuration at every start.
    pub configure: fn(&mut LeaderConfig),
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), partition_leader::Error>>>,
}

impl Leader {
    /// Starts leader `id` on `listener`.
    pub fn start(id: i32, listener: TcpListener, dir: PathBuf, topology: Arc<Topology>) -> Self {
        Self::start_with(id, listener, dir, topology, |_| {})
    }

    /// Starts leader `id` on `listener`, its configuration changed by `configure`.
    pub fn start_with(
        id: i32,
        listener: TcpListener,
        dir: PathBuf,
        topology: Arc<Topology>,
        configure: fn(&mut LeaderConfig),
    ) -> Self {
        let mut leader = Leader {
            id,
            addr: listener.local_addr().unwrap(),
            dir,
            topology,
            skip_epoch_check: false,
            configure,
            stop: None,
            handle: None,
        };
        leader.spawn(listener);
        leader
    }

    fn spawn(&mut self, listener: TcpListener) {
        let mut config = LeaderConfig::new(self.id, self.dir.clone(), self.topology.clone());
        config.max_batch_bytes = 64 * 1024;
        config.max_record_bytes = 16 * 1024;
        config.unsafe_skip_epoch_check = self.skip_epoch_check;
        config.cluster_secret = Some(testkit::auth::secret());
        (self.configure)(&mut config);
        let (tx, rx) = oneshot::channel();
        self.stop = Some(tx);
        self.handle = Some(tokio::spawn(partition_leader::serve(
            config,
            listener,
            async move {
                let _ = rx.await;
            },
        )));
    }

    /// Stops the leader and waits until sled is closed.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(20), h)
                .await
                .expect("leader did not stop")
                .unwrap()
                .unwrap();
        }
    }

    /// Stops and starts again on the same address and data directory.
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.spawn(listener);
    }

    /// A client (connects lazily; reconnects after a restart).
    pub fn client(&self) -> PartitionLeaderClient<Channel> {
        client(self.addr)
    }
}

/// A lazily connected leader client.
pub fn client(addr: SocketAddr) -> PartitionLeaderClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    PartitionLeaderClient::new(channel)
}

#[allow(unused_imports)] // each test binary uses its own subset
pub use testkit::requests::{self, code, values};
#[allow(unused_imports)]
pub use testkit::{eventually, FakeCoordinator, FakeTxn};

/// A batch of string values.
pub fn batch(pid: i64, epoch: i32, seq: i32, values: &[&str], txn_id: Option<&str>) -> RecordBatch {
    requests::batch((pid, epoch, seq), values, txn_id, b"k", 1)
}

/// Produce to partition `partition` of the test topic.
pub async fn produce(
    c: &mut PartitionLeaderClient<Channel>,
    partition: i32,
    b: RecordBatch,
) -> ProduceResponse {
    c.produce(ProduceRequest {
        topic: TOPIC.into(),
        partition,
        batch: Some(b),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Fetch everything visible from `offset`.
pub async fn fetch(
    c: &mut PartitionLeaderClient<Channel>,
    partition: i32,
    offset: i64,
    committed: bool,
) -> FetchResponse {
    c.fetch(requests::fetch(
        TOPIC,
        partition,
        offset,
        committed,
        1 << 20,
        0,
    ))
    .await
    .unwrap()
    .into_inner()
}

/// WriteTxnMarkers for `partitions` of the test topic; returns the per-partition codes.
///
/// A marker signed before the leader's service started (a leader still starting, or just
/// restarted) is COORDINATOR_LOAD_IN_PROGRESS for every partition; it is signed again and
/// resent, as the coordinator's marker writer does, for up to 5 s.
pub async fn markers(
    topology: &Topology,
    c: &mut PartitionLeaderClient<Channel>,
    pid: i64,
    epoch: i32,
    commit: bool,
    generation: i64,
    partitions: &[i32],
) -> Vec<ErrorCode> {
    let partitions: Vec<(&str, i32)> = partitions.iter().map(|p| (TOPIC, *p)).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut request = requests::markers(pid, epoch, commit, generation, &partitions);
        testkit::auth::sign_marker(topology, &mut request);
        let codes = c
            .write_txn_markers(request)
            .await
            .map(|r| requests::marker_codes(r.into_inner()))
            .unwrap();
        let starting = !codes.is_empty()
            && codes
                .iter()
                .all(|code| *code == ErrorCode::CoordinatorLoadInProgress);
        if !starting || tokio::time::Instant::now() >= deadline {
            return codes;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// DescribeProducers for a partition of the test topic.
pub async fn describe(
    c: &mut PartitionLeaderClient<Channel>,
    partition: i32,
) -> DescribeProducersResponse {
    c.describe_producers(DescribeProducersRequest {
        topic: TOPIC.into(),
        partition,
    })
    .await
    .unwrap()
    .into_inner()
}

/// Everything observable about a partition: both fetches and the producer table.
pub async fn snapshot(
    c: &mut PartitionLeaderClient<Channel>,
    partition: i32,
) -> (FetchResponse, FetchResponse, DescribeProducersResponse) {
    (
        fetch(c, partition, 0, false).await,
        fetch(c, partition, 0, true).await,
        describe(c, partition).await,
    )
}

/// Writes `dir/topology.toml` for [`spawn_leader_process`]: leader 101 at `addr` leads all
/// `partitions` of topic `t` (the coordinator's address is never dialled).
pub fn write_leader_topology(dir: &std::path::Path, addr: &str, partitions: usize) {
    let leaders = vec!["101"; partitions].join(", ");
    std::fs::write(
        dir.join("topology.toml"),
        format!(
            "transaction_state_partitions = 1\n\
             [[coordinators]]\nid = 1\naddress = \"127.0.0.1:1\"\n\
             [[leaders]]\nid = 101\naddress = \"{addr}\"\n\
             [[topics]]\nname = \"t\"\nleaders = [{leaders}]\n"
        ),
    )
    .unwrap();
}

/// Starts the partition-leader binary as leader 101 at `addr`, with `dir/data` and
/// `dir/topology.toml` (a process a test can SIGKILL), logging to `log`.
pub fn spawn_leader_process(
    dir: &std::path::Path,
    addr: &str,
    log: &std::path::Path,
) -> testkit::process::Node {
    testkit::process::Node::spawn(
        env!("CARGO_BIN_EXE_partition-leader"),
        101,
        addr,
        dir,
        "partition_leader",
        log,
    )
}

/// Connects to a leader process started by [`spawn_leader_process`] once it serves partition 0
/// of topic `t`.
pub async fn connect_process(addr: &str) -> PartitionLeaderClient<Channel> {
    let endpoint = format!("http://{addr}");
    testkit::eventually("leader process up", || {
        let endpoint = endpoint.clone();
        async move {
            let mut client = PartitionLeaderClient::connect(endpoint).await.ok()?;
            let r = client
                .fetch(testkit::requests::fetch("t", 0, 0, false, 1, 0))
                .await
                .ok()?;
            (r.into_inner().error_code == 0).then_some(client)
        }
    })
    .await
}
