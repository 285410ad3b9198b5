//! Stand-ins for the other side of an RPC. [`FakeLeader`] and [`FakeCoordinator`] implement the
//! generated gRPC traits and are served on a loopback listener by the test; [`FakeVerifier`] is
//! handed to a leader in process. Their fields are public: a test sets the answers and reads
//! what was asked.

#![allow(missing_docs)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cluster::TopicPartition;
use partition_leader::verify::{verification_result, TxnVerifier};
use proto::partition_leader_server::PartitionLeader;
use proto::transaction_coordinator_server::{TransactionCoordinator, TransactionCoordinatorServer};
use proto::*;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// A partition leader that records markers and answers each partition with `reply`
/// (NONE: acknowledged; NOT_LEADER_OR_FOLLOWER: "not now", retried).
#[derive(Clone)]
pub struct FakeLeader {
    pub reply: Arc<Mutex<ErrorCode>>,
    pub markers: Arc<Mutex<Vec<WriteTxnMarkersRequest>>>,
    /// The size of every WriteTxnMarkersBatch received.
    pub batches: Arc<Mutex<Vec<usize>>>,
    /// false: answers WriteTxnMarkersBatch UNIMPLEMENTED, like a leader that predates it.
    pub batches_supported: Arc<Mutex<bool>>,
    /// Every marker request waits for a read lock of this: hold the write lock to pause them.
    pub gate: Arc<tokio::sync::RwLock<()>>,
}

impl Default for FakeLeader {
    fn default() -> Self {
        Self {
            reply: Arc::new(Mutex::new(ErrorCode::None)),
            markers: Arc::default(),
            batches: Arc::default(),
            batches_supported: Arc::new(Mutex::new(true)),
            gate: Arc::default(),
        }
    }
}

impl FakeLeader {
    pub fn markers(&self) -> Vec<WriteTxnMarkersRequest> {
        self.markers.lock().unwrap().clone()
    }

    /// Acknowledge markers (true) or refuse them with a retriable code (false).
    pub fn set_ack(&self, ack: bool) {
        self.set_reply(if ack {
            ErrorCode::None
        } else {
            ErrorCode::NotLeaderOrFollower
        });
    }

    pub fn set_reply(&self, code: ErrorCode) {
        *self.reply.lock().unwrap() = code;
    }
}

#[tonic::async_trait]
impl PartitionLeader for FakeLeader {
    async fn produce(
        &self,
        _: Request<ProduceRequest>,
    ) -> Result<Response<ProduceResponse>, Status> {
        Err(Status::unimplemented("fake leader"))
    }

    async fn produce_partitions(
        &self,
        _: Request<proto::ProducePartitionsRequest>,
    ) -> Result<Response<proto::ProducePartitionsResponse>, Status> {
        Err(Status::unimplemented("fake leader"))
    }

    async fn fetch(&self, _: Request<FetchRequest>) -> Result<Response<FetchResponse>, Status> {
        Err(Status::unimplemented("fake leader"))
    }

    async fn write_txn_markers(
        &self,
        request: Request<WriteTxnMarkersRequest>,
    ) -> Result<Response<WriteTxnMarkersResponse>, Status> {
        let _open = self.gate.read().await;
        let request = request.into_inner();
        self.markers.lock().unwrap().push(request.clone());
        let code = *self.reply.lock().unwrap();
        Ok(Response::new(WriteTxnMarkersResponse {
            results: request
                .partitions
                .into_iter()
                .map(|tp| MarkerPartitionResult {
                    partition: Some(tp),
                    error_code: code as i32,
                    error_message: String::new(),
                })
                .collect(),
        }))
    }

    async fn write_txn_markers_batch(
        &self,
        request: Request<WriteTxnMarkersBatchRequest>,
    ) -> Result<Response<WriteTxnMarkersBatchResponse>, Status> {
        let markers = request.into_inner().markers;
        if !*self.batches_supported.lock().unwrap() {
            return Err(Status::unimplemented("an older leader"));
        }
        self.batches.lock().unwrap().push(markers.len());
        let mut responses = Vec::new();
        for m in markers {
            responses.push(self.write_txn_markers(Request::new(m)).await?.into_inner());
        }
        Ok(Response::new(WriteTxnMarkersBatchResponse { responses }))
    }

    async fn describe_producers(
        &self,
        _: Request<DescribeProducersRequest>,
    ) -> Result<Response<DescribeProducersResponse>, Status> {
        Err(Status::unimplemented("fake leader"))
    }
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
    /// The topic [`FakeCoordinator::set`] adds partitions of.
    pub topic: String,
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
            transaction_number: 0,
        }))
    }
}

impl FakeCoordinator {
    /// A fake whose transactions span partitions of `topic`.
    pub fn for_topic(topic: &str) -> Self {
        Self {
            topic: topic.to_string(),
            ..Self::default()
        }
    }

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
                partitions: partitions
                    .iter()
                    .map(|p| (self.topic.clone(), *p))
                    .collect(),
            },
        );
    }
}

/// A coordinator stand-in for a leader in process (its [`TxnVerifier`]): answers `answer`,
/// counts calls, and can hold a call until the test opens the gate.
pub struct FakeVerifier {
    pub answer: Mutex<Result<(), ErrorCode>>,
    pub calls: AtomicUsize,
    pub gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

impl Default for FakeVerifier {
    fn default() -> Self {
        Self {
            answer: Mutex::new(Ok(())),
            calls: AtomicUsize::new(0),
            gate: Mutex::new(None),
        }
    }
}

#[tonic::async_trait]
impl TxnVerifier for FakeVerifier {
    async fn verify(
        &self,
        _transactional_id: &str,
        _producer_id: cluster::ProducerId,
        _producer_epoch: cluster::ProducerEpoch,
        _partition: &TopicPartition,
    ) -> partition_leader::error::Result<partition_leader::core::Verified> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let gate = self.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            // One permit per call: each held call waits for a permit of its own.
            gate.acquire().await.unwrap().forget();
        }
        let answer = *self.answer.lock().unwrap();
        match answer {
            Ok(()) => Ok(partition_leader::core::Verified::default()),
            Err(code) => verification_result(code, "fake".into())
                .map(|()| partition_leader::core::Verified::default()),
        }
    }
}
