//! Shared harness for the gRPC tests: real partition leaders on 127.0.0.1:0 over sled in temp
//! directories, a test-only fake coordinator (VerifyTransaction only) served over real gRPC, a
//! topology built from the bound addresses, and small client helpers.

#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::Topology;
use partition_leader::LeaderConfig;
use proto::partition_leader_client::PartitionLeaderClient;
use proto::transaction_coordinator_server::{TransactionCoordinator, TransactionCoordinatorServer};
use proto::*;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

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
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), partition_leader::Error>>>,
}

impl Leader {
    /// Starts leader `id` on `listener`.
    pub fn start(id: i32, listener: TcpListener, dir: PathBuf, topology: Arc<Topology>) -> Self {
        let mut leader = Leader {
            id,
            addr: listener.local_addr().unwrap(),
            dir,
            topology,
            skip_epoch_check: false,
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

/// What the fake coordinator knows about a transactional id.
#[derive(Clone, Debug, Default)]
pub struct FakeTxn {
    pub producer_id: i64,
    pub epoch: i32,
    pub partitions: BTreeSet<(String, i32)>,
}

/// A coordinator stand-in: answers VerifyTransaction from a table the test edits.
/// `permissive` makes it answer NONE to everything (to show the LEADER rejects on its own).
#[derive(Clone, Default)]
pub struct FakeCoordinator {
    pub txns: Arc<Mutex<HashMap<String, FakeTxn>>>,
    pub permissive: Arc<Mutex<bool>>,
    pub verify_calls: Arc<Mutex<usize>>,
}

#[tonic::async_trait]
impl TransactionCoordinator for FakeCoordinator {
    async fn init_producer_id(
        &self,
        _: Request<InitProducerIdRequest>,
    ) -> Result<Response<InitProducerIdResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn add_partitions_to_txn(
        &self,
        _: Request<AddPartitionsToTxnRequest>,
    ) -> Result<Response<AddPartitionsToTxnResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn add_offsets_to_txn(
        &self,
        _: Request<AddOffsetsToTxnRequest>,
    ) -> Result<Response<AddOffsetsToTxnResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn txn_offset_commit(
        &self,
        _: Request<TxnOffsetCommitRequest>,
    ) -> Result<Response<TxnOffsetCommitResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn offset_fetch(
        &self,
        _: Request<OffsetFetchRequest>,
    ) -> Result<Response<OffsetFetchResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn end_txn(&self, _: Request<EndTxnRequest>) -> Result<Response<EndTxnResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn list_transactions(
        &self,
        _: Request<ListTransactionsRequest>,
    ) -> Result<Response<ListTransactionsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn describe_transactions(
        &self,
        _: Request<DescribeTransactionsRequest>,
    ) -> Result<Response<DescribeTransactionsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn write_group_offset_marker(
        &self,
        _: Request<WriteGroupOffsetMarkerRequest>,
    ) -> Result<Response<WriteGroupOffsetMarkerResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn verify_transaction(
        &self,
        request: Request<VerifyTransactionRequest>,
    ) -> Result<Response<VerifyTransactionResponse>, Status> {
        *self.verify_calls.lock().unwrap() += 1;
        let r = request.into_inner();
        let code = if *self.permissive.lock().unwrap() {
            ErrorCode::None
        } else {
            let tp = r.partition.unwrap_or_default();
            match self.txns.lock().unwrap().get(&r.transactional_id) {
                None => ErrorCode::InvalidProducerIdMapping,
                Some(t) if t.producer_id != r.producer_id => ErrorCode::InvalidProducerIdMapping,
                Some(t) if t.epoch != r.producer_epoch => ErrorCode::ProducerFenced,
                Some(t) if !t.partitions.contains(&(tp.topic, tp.partition)) => {
                    ErrorCode::InvalidTxnState
                }
                Some(_) => ErrorCode::None,
            }
        };
        Ok(Response::new(VerifyTransactionResponse {
            error_code: code as i32,
            error_message: String::new(),
        }))
    }
}

impl FakeCoordinator {
    /// Serves the fake on `listener` for the rest of the test.
    pub fn serve(&self, listener: TcpListener) {
        let svc = TransactionCoordinatorServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    }

    /// Sets what the coordinator knows about `txn_id`.
    pub fn set(&self, txn_id: &str, producer_id: i64, epoch: i32, partitions: &[i32]) {
        self.txns.lock().unwrap().insert(
            txn_id.to_string(),
            FakeTxn {
                producer_id,
                epoch,
                partitions: partitions.iter().map(|p| (TOPIC.to_string(), *p)).collect(),
            },
        );
    }
}

/// A batch of string values.
pub fn batch(pid: i64, epoch: i32, seq: i32, values: &[&str], txn_id: Option<&str>) -> RecordBatch {
    RecordBatch {
        producer_id: pid,
        producer_epoch: epoch,
        base_sequence: seq,
        is_transactional: txn_id.is_some(),
        transactional_id: txn_id.unwrap_or_default().to_string(),
        records: values
            .iter()
            .map(|v| proto::Record {
                key: b"k".to_vec(),
                value: v.as_bytes().to_vec(),
                timestamp_ms: 1,
                headers: Vec::new(),
            })
            .collect(),
    }
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
    c.fetch(FetchRequest {
        topic: TOPIC.into(),
        partition,
        offset,
        max_bytes: 1 << 20,
        isolation_level: if committed {
            IsolationLevel::ReadCommitted as i32
        } else {
            IsolationLevel::ReadUncommitted as i32
        },
        max_wait_ms: 0,
    })
    .await
    .unwrap()
    .into_inner()
}

/// The values of a fetch.
pub fn values(r: &FetchResponse) -> Vec<String> {
    r.records
        .iter()
        .map(|r| String::from_utf8(r.value.clone()).unwrap())
        .collect()
}

/// WriteTxnMarkers for `partitions` of the test topic; returns the per-partition codes.
pub async fn markers(
    c: &mut PartitionLeaderClient<Channel>,
    pid: i64,
    epoch: i32,
    commit: bool,
    generation: i64,
    partitions: &[i32],
) -> Vec<ErrorCode> {
    c.write_txn_markers(WriteTxnMarkersRequest {
        producer_id: pid,
        producer_epoch: epoch,
        result: if commit {
            TxnResult::Commit
        } else {
            TxnResult::Abort
        } as i32,
        coordinator_id: 1,
        coordinator_generation: generation,
        transaction_version: 2,
        partitions: partitions
            .iter()
            .map(|p| proto::TopicPartition {
                topic: TOPIC.into(),
                partition: *p,
            })
            .collect(),
    })
    .await
    .unwrap()
    .into_inner()
    .results
    .into_iter()
    .map(|r| ErrorCode::from_wire(r.error_code))
    .collect()
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

/// Polls `f` until it returns true or `timeout` passes.
pub async fn wait_for<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Shorthand for a code.
pub fn code(c: i32) -> ErrorCode {
    ErrorCode::from_wire(c)
}
