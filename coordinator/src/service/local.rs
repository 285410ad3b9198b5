//! The in-process calls of the Kafka face ([`crate::kafka`]): the same decoding (`wire`) and
//! the same room methods as the `grpc` handlers, but answering with the domain result (or the
//! [`Error`]) instead of a proto reply, so the Kafka face maps errors through the one table
//! ([`crate::error_code`], then `kafka_wire::codes::kafka_code`). Nothing here decides or
//! stores anything itself.

use std::sync::Arc;

use cluster::{NodeId, Topology};
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::transaction_coordinator_server::TransactionCoordinator;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::{grpc, wire, Shared};
use crate::core::ProducerIdAndEpoch;
use crate::Error;

/// What the Kafka face calls, in-process.
#[derive(Clone)]
pub(crate) struct LocalService {
    shared: Arc<Shared>,
    grpc: grpc::CoordinatorService,
}

impl LocalService {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            grpc: grpc::CoordinatorService::new(shared.clone()),
            shared,
        }
    }

    /// The cluster topology.
    pub(crate) fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> NodeId {
        self.shared.node_id
    }

    /// NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS (or a topology disagreement) unless this
    /// node serves `key` now.
    pub(crate) fn check_owner(&self, key: &str) -> Result<(), Error> {
        self.shared.check_owner(key)
    }

    /// Becomes `true` when the coordinator is stopping.
    pub(crate) fn stopping(&self) -> watch::Receiver<bool> {
        self.shared.stop.subscribe()
    }

    /// InitProducerId (transactional or idempotent).
    pub(crate) async fn init_producer_id(
        &self,
        request: proto::InitProducerIdRequest,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let max_timeout = self.shared.config.max_transaction_timeout_ms;
        let request = wire::init_producer_id(request, max_timeout)?;
        self.shared.init_producer_id(request).await
    }

    /// AddPartitionsToTxn.
    pub(crate) async fn add_partitions(
        &self,
        request: proto::AddPartitionsToTxnRequest,
    ) -> Result<(), Error> {
        let (caller, partitions) = wire::add_partitions(request)?;
        self.shared.add_partitions(caller, partitions).await
    }

    /// AddOffsetsToTxn.
    pub(crate) async fn add_offsets(
        &self,
        request: proto::AddOffsetsToTxnRequest,
    ) -> Result<(), Error> {
        let (caller, group) = wire::add_offsets(request)?;
        self.shared.add_offsets(caller, group).await
    }

    /// TxnOffsetCommit, on this node (the transaction's coordinator).
    pub(crate) async fn txn_offset_commit(
        &self,
        request: proto::TxnOffsetCommitRequest,
    ) -> Result<(), Error> {
        let (caller, group, offsets) = wire::txn_offset_commit(request)?;
        self.shared.txn_offset_commit(caller, group, offsets).await
    }

    /// TxnOffsetCommit sent to the transaction's coordinator at `address` over gRPC (a client
    /// API, so unsigned), on this node's cached channel: its wire error code, or why it was not
    /// answered.
    pub(crate) async fn forward_txn_offset_commit(
        &self,
        address: &str,
        request: proto::TxnOffsetCommitRequest,
    ) -> Result<i32, String> {
        let reply = TransactionCoordinatorClient::new(self.shared.channel(address)?)
            .txn_offset_commit(request)
            .await
            .map_err(|s| s.to_string())?;
        Ok(reply.into_inner().error_code)
    }

    /// EndTxn: the caller's (PID, epoch) from now on.
    pub(crate) async fn end_txn(
        &self,
        request: proto::EndTxnRequest,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let (caller, result) = wire::end_txn(request)?;
        self.shared.end_txn(caller, result).await
    }

    /// OffsetFetch.
    pub(crate) async fn offset_fetch(
        &self,
        request: proto::OffsetFetchRequest,
    ) -> Result<Vec<proto::PartitionOffset>, Error> {
        let (group, partitions) = wire::offset_fetch(request)?;
        self.shared.offset_fetch(group, partitions).await
    }

    /// KIP-447: a TxnOffsetCommit of `producer_id` for `partitions` of `group` (a group this
    /// node coordinates) is about to be handed to the transaction: pending from now on, durably.
    /// Returns what to pass to [`Self::forget_pending_txn_offsets`] if it is refused.
    pub(crate) async fn record_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: cluster::ProducerId,
        partitions: Vec<cluster::TopicPartition>,
    ) -> Result<Vec<cluster::TopicPartition>, Error> {
        self.shared
            .record_pending_txn_offsets(group, producer_id, partitions)
            .await
    }

    /// The TxnOffsetCommit announced by [`Self::record_pending_txn_offsets`] was refused.
    pub(crate) async fn forget_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: cluster::ProducerId,
        partitions: Vec<cluster::TopicPartition>,
    ) {
        self.shared
            .forget_pending_txn_offsets(group, producer_id, partitions)
            .await
    }

    /// Whether a transaction's offset for `tp` of `group` is not applied yet (KIP-447's
    /// UNSTABLE_OFFSET_COMMIT for an OffsetFetch that requires stable offsets).
    pub(crate) fn txn_offset_pending(&self, group: &str, tp: &cluster::TopicPartition) -> bool {
        self.shared.txn_offset_pending(group, tp)
    }

    /// Kafka's OffsetCommit outside a transaction (the membership check is the Kafka face's).
    pub(crate) async fn offset_commit(
        &self,
        group: String,
        offsets: Vec<proto::PartitionOffset>,
    ) -> Result<(), Error> {
        let (group, offsets) = wire::offset_commit(group, offsets)?;
        self.shared.offset_commit(group, offsets).await
    }

    /// ListTransactions, as the gRPC handler answers it.
    pub(crate) async fn list_transactions(
        &self,
        request: Request<proto::ListTransactionsRequest>,
    ) -> Result<Response<proto::ListTransactionsResponse>, Status> {
        self.grpc.list_transactions(request).await
    }

    /// DescribeTransactions, as the gRPC handler answers it.
    pub(crate) async fn describe_transactions(
        &self,
        request: Request<proto::DescribeTransactionsRequest>,
    ) -> Result<Response<proto::DescribeTransactionsResponse>, Status> {
        self.grpc.describe_transactions(request).await
    }
}
