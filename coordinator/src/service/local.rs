//! The in-process calls of the Kafka face ([`crate::kafka`]): the same decoding (`wire`) and
//! the same room methods as the `grpc` handlers, but answering with the domain result (or the
//! [`Error`]) instead of a proto reply, so the Kafka face maps errors through the one table
//! ([`crate::error_code`], then `kafka_wire::codes::kafka_code`). Nothing here decides or
//! stores anything itself.

use std::sync::Arc;

use cluster::Topology;
use proto::transaction_coordinator_server::TransactionCoordinator;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::{grpc, wire, Shared};
use crate::core::ProducerIdAndEpoch;
use crate::storage::GroupProtocol;
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

    /// NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS (or a topology disagreement) unless this
    /// node serves `key` now.
    pub(crate) fn check_owner(&self, key: &str) -> Result<(), Error> {
        self.shared.check_owner(key)
    }

    /// Kafka's `group.initial.rebalance.delay.ms`, as configured.
    pub(crate) fn group_initial_rebalance_delay_ms(&self) -> i64 {
        i64::try_from(self.shared.config.group_initial_rebalance_delay.as_millis())
            .unwrap_or(i64::MAX)
    }

    /// KIP-848 groups' (heartbeat interval, session timeout), in milliseconds, as configured.
    pub(crate) fn group_consumer_timeouts_ms(&self) -> (i32, i64) {
        let config = &self.shared.config;
        (
            i32::try_from(config.group_consumer_heartbeat_interval.as_millis()).unwrap_or(i32::MAX),
            i64::try_from(config.group_consumer_session_timeout.as_millis()).unwrap_or(i64::MAX),
        )
    }

    /// Kafka's `group.max.size` (classic groups) and `group.consumer.max.size` (KIP-848
    /// groups), as configured.
    pub(crate) fn group_max_sizes(&self) -> (usize, usize) {
        let config = &self.shared.config;
        (config.group_max_size, config.group_consumer_max_size)
    }

    /// This node's life: `<node id>.<coordinator generation>`, which no other node, and no
    /// earlier or later start of this one, has (the generation is bumped and persisted at every
    /// start, before anything is served).
    pub(crate) fn incarnation(&self) -> String {
        format!(
            "{}.{}",
            self.shared.config.node_id,
            self.shared.generation()
        )
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

    /// TxnOffsetCommit as the group's coordinator takes it, with `fence` asked again once its
    /// offsets are pending (see `Shared`'s `txn_offset_commit_fenced`): the wire code of the
    /// answer, or `fence`'s error.
    pub(crate) async fn txn_offset_commit<E>(
        &self,
        request: proto::TxnOffsetCommitRequest,
        fence: impl FnOnce() -> Result<(), E>,
    ) -> Result<i32, E> {
        let answer = self.shared.txn_offset_commit_fenced(request, fence).await?;
        Ok(answer.0)
    }

    /// EndTxn: the caller's (PID, epoch) from now on.
    pub(crate) async fn end_txn(
        &self,
        request: proto::EndTxnRequest,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let (caller, result) = wire::end_txn(request)?;
        self.shared.end_txn(caller, result).await
    }

    /// OffsetFetch, answered per partition as Kafka does: the committed offsets, and which of
    /// the partitions have a transaction's offset not applied yet (KIP-447's
    /// UNSTABLE_OFFSET_COMMIT for a fetch that requires stable offsets), read as one snapshot.
    pub(crate) async fn offset_fetch(
        &self,
        request: proto::OffsetFetchRequest,
    ) -> Result<(Vec<proto::PartitionOffset>, Vec<cluster::TopicPartition>), Error> {
        let (group, partitions, _) = wire::offset_fetch(request)?;
        self.shared
            .offset_fetch_with_pending(group, partitions)
            .await
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

    /// Deletes committed offsets of `group` as `decide` chooses (DeleteGroups, OffsetDelete;
    /// see `Shared`'s `delete_group_offsets`): `decide`'s answer once the deletion is durable.
    pub(crate) async fn delete_group_offsets<T>(
        &self,
        group: String,
        decide: impl FnOnce(
            &std::collections::BTreeSet<cluster::TopicPartition>,
            &[cluster::TopicPartition],
        ) -> (Vec<cluster::TopicPartition>, T),
    ) -> Result<T, Error> {
        self.shared.delete_group_offsets(group, decide).await
    }

    /// One change of a group's membership of `protocol`, stored before its answer is returned
    /// (see `Shared`'s `group_state_change`).
    pub(crate) async fn group_state_change<T>(
        &self,
        protocol: GroupProtocol,
        group: String,
        change: impl FnOnce() -> (Option<Option<Vec<u8>>>, T),
        written: impl FnOnce(&T),
    ) -> Result<T, Error> {
        self.shared
            .group_state_change(protocol, group, change, written)
            .await
    }

    /// Hands every stored group membership of `protocol` this node coordinates to `restore`
    /// (see `Shared`'s `restore_group_states`); how many.
    pub(crate) async fn restore_group_states(
        &self,
        protocol: GroupProtocol,
        restore: impl FnMut(&str, Vec<u8>),
    ) -> Result<usize, Error> {
        self.shared.restore_group_states(protocol, restore).await
    }

    /// The groups with committed offsets that this node coordinates.
    pub(crate) async fn offset_groups(&self) -> Result<Vec<String>, Error> {
        self.shared.offset_groups().await
    }

    /// This coordinator's settings, as DescribeConfigs shows them for its BROKER resource
    /// (Kafka's names).
    pub(crate) fn broker_configs(&self) -> Vec<kafka_wire::configs::ConfigEntry> {
        use kafka_wire::configs::{ConfigEntry, ConfigType::Int};
        let config = &self.shared.config;
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        vec![
            ConfigEntry::new(
                "transaction.max.timeout.ms",
                config.max_transaction_timeout_ms,
                Int,
            ),
            ConfigEntry::new(
                "transactional.id.expiration.ms",
                ms(config.transactional_id_expiration),
                Int,
            ),
            ConfigEntry::new(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                ms(config.timeout_scan_interval),
                Int,
            ),
            ConfigEntry::new(
                "group.initial.rebalance.delay.ms",
                ms(config.group_initial_rebalance_delay),
                Int,
            ),
            ConfigEntry::new(
                "group.min.session.timeout.ms",
                crate::consumer_groups::MIN_SESSION_TIMEOUT_MS,
                Int,
            ),
            ConfigEntry::new(
                "group.max.session.timeout.ms",
                crate::consumer_groups::MAX_SESSION_TIMEOUT_MS,
                Int,
            ),
        ]
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
