//! The gRPC handlers of `TransactionCoordinator`. Each one only decodes (`wire`), calls one
//! method of the `state` or `groups` room, and encodes the reply with its error mapped by
//! [`crate::error_code`] (mini-redis's `Handler::run` shape). Protocol errors travel in the
//! response's `error_code`; a handler never answers a gRPC error status.

use std::sync::Arc;

use cluster::node::now_ms;
use proto::transaction_coordinator_server::TransactionCoordinator;
use tonic::{Request, Response, Status};
use tracing::{debug, instrument};

use super::state::REQUESTER;
use super::{wire, Shared};
use crate::core::ProducerIdAndEpoch;
use crate::error::{code_of, error_code};

/// The `TransactionCoordinator` gRPC service.
#[derive(Clone)]
pub(super) struct CoordinatorService {
    shared: Arc<Shared>,
}

impl CoordinatorService {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

/// The address a request came from, as the epoch history names the instance.
fn requester<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "unknown".to_string(), |a| a.to_string())
}

/// "No (PID, epoch)" in a reply that carries one.
const NO_IDENTITY: ProducerIdAndEpoch =
    ProducerIdAndEpoch::new(cluster::NO_PRODUCER_ID, cluster::NO_PRODUCER_EPOCH);

#[tonic::async_trait]
impl TransactionCoordinator for CoordinatorService {
    #[instrument(level = "debug", skip_all, fields(txn_id = ?request.get_ref().transactional_id))]
    async fn init_producer_id(
        &self,
        request: Request<proto::InitProducerIdRequest>,
    ) -> Result<Response<proto::InitProducerIdResponse>, Status> {
        debug!("InitProducerId");
        let s = &self.shared;
        let max_timeout = s.config.max_transaction_timeout_ms;
        let (txn_id, pid) = (
            request
                .get_ref()
                .transactional_id
                .clone()
                .unwrap_or_default(),
            request.get_ref().expected_producer_id,
        );
        let requester = requester(&request);
        let result = match wire::init_producer_id(request.into_inner(), max_timeout) {
            Ok(request) => {
                REQUESTER
                    .scope(requester, s.init_producer_id(request))
                    .await
            }
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared
            .count("InitProducerId", error_code, &txn_id, pid);
        let id = result.unwrap_or(NO_IDENTITY);
        Ok(Response::new(proto::InitProducerIdResponse {
            error_code,
            error_message,
            producer_id: id.producer_id,
            producer_epoch: i32::from(id.epoch),
        }))
    }

    #[instrument(level = "debug", skip_all, fields(txn_id = %request.get_ref().transactional_id))]
    async fn add_partitions_to_txn(
        &self,
        request: Request<proto::AddPartitionsToTxnRequest>,
    ) -> Result<Response<proto::AddPartitionsToTxnResponse>, Status> {
        debug!(
            partitions = request.get_ref().partitions.len(),
            "AddPartitionsToTxn"
        );
        let (txn_id, pid) = (
            request.get_ref().transactional_id.clone(),
            request.get_ref().producer_id,
        );
        let result = match wire::add_partitions(request.into_inner()) {
            Ok((caller, partitions)) => self.shared.add_partitions(caller, partitions).await,
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared
            .count("AddPartitionsToTxn", error_code, &txn_id, pid);
        Ok(Response::new(proto::AddPartitionsToTxnResponse {
            error_code,
            error_message,
        }))
    }

    #[instrument(level = "debug", skip_all, fields(txn_id = %request.get_ref().transactional_id, group = %request.get_ref().group_id))]
    async fn add_offsets_to_txn(
        &self,
        request: Request<proto::AddOffsetsToTxnRequest>,
    ) -> Result<Response<proto::AddOffsetsToTxnResponse>, Status> {
        debug!("AddOffsetsToTxn");
        let (txn_id, pid) = (
            request.get_ref().transactional_id.clone(),
            request.get_ref().producer_id,
        );
        let result = match wire::add_offsets(request.into_inner()) {
            Ok((caller, group)) => self.shared.add_offsets(caller, group).await,
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared
            .count("AddOffsetsToTxn", error_code, &txn_id, pid);
        Ok(Response::new(proto::AddOffsetsToTxnResponse {
            error_code,
            error_message,
        }))
    }

    #[instrument(level = "debug", skip_all, fields(txn_id = %request.get_ref().transactional_id, group = %request.get_ref().group_id))]
    async fn txn_offset_commit(
        &self,
        request: Request<proto::TxnOffsetCommitRequest>,
    ) -> Result<Response<proto::TxnOffsetCommitResponse>, Status> {
        debug!(offsets = request.get_ref().offsets.len(), "TxnOffsetCommit");
        let (txn_id, pid) = (
            request.get_ref().transactional_id.clone(),
            request.get_ref().producer_id,
        );
        let (error_code, error_message) = self
            .shared
            .txn_offset_commit_at_group(request.into_inner())
            .await;
        self.shared
            .count("TxnOffsetCommit", error_code, &txn_id, pid);
        Ok(Response::new(proto::TxnOffsetCommitResponse {
            error_code,
            error_message,
        }))
    }

    #[instrument(level = "debug", skip_all, fields(group = %request.get_ref().group_id))]
    async fn offset_fetch(
        &self,
        request: Request<proto::OffsetFetchRequest>,
    ) -> Result<Response<proto::OffsetFetchResponse>, Status> {
        debug!("OffsetFetch");
        let (txn_id, pid) = (String::new(), cluster::NO_PRODUCER_ID);
        let result = match wire::offset_fetch(request.into_inner()) {
            Ok((group, partitions, require_stable)) => {
                self.shared
                    .offset_fetch(group, partitions, require_stable)
                    .await
            }
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared.count("OffsetFetch", error_code, &txn_id, pid);
        Ok(Response::new(proto::OffsetFetchResponse {
            error_code,
            error_message,
            offsets: result.unwrap_or_default(),
        }))
    }

    #[instrument(level = "debug", skip_all, fields(txn_id = %request.get_ref().transactional_id, result = request.get_ref().result))]
    async fn end_txn(
        &self,
        request: Request<proto::EndTxnRequest>,
    ) -> Result<Response<proto::EndTxnResponse>, Status> {
        debug!("EndTxn");
        let (txn_id, pid) = (
            request.get_ref().transactional_id.clone(),
            request.get_ref().producer_id,
        );
        let requester = requester(&request);
        let result = match wire::end_txn(request.into_inner()) {
            Ok((caller, result)) => {
                REQUESTER
                    .scope(requester, self.shared.end_txn(caller, result))
                    .await
            }
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared.count("EndTxn", error_code, &txn_id, pid);
        let id = result.unwrap_or(NO_IDENTITY);
        Ok(Response::new(proto::EndTxnResponse {
            error_code,
            error_message,
            producer_id: id.producer_id,
            producer_epoch: i32::from(id.epoch),
        }))
    }

    #[instrument(level = "debug", skip_all, fields(filters = request.get_ref().state_filters.len()))]
    async fn list_transactions(
        &self,
        request: Request<proto::ListTransactionsRequest>,
    ) -> Result<Response<proto::ListTransactionsResponse>, Status> {
        debug!("ListTransactions");
        let (txn_id, pid) = (String::new(), cluster::NO_PRODUCER_ID);
        let result = match wire::state_filters(request.get_ref()) {
            Ok(filters) => self.shared.list_transactions(filters).await,
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared
            .count("ListTransactions", error_code, &txn_id, pid);
        Ok(Response::new(proto::ListTransactionsResponse {
            error_code,
            error_message,
            coordinator_id: self.shared.node_id,
            transactions: result.unwrap_or_default(),
        }))
    }

    #[instrument(level = "debug", skip_all, fields(ids = request.get_ref().transactional_ids.len()))]
    async fn describe_transactions(
        &self,
        request: Request<proto::DescribeTransactionsRequest>,
    ) -> Result<Response<proto::DescribeTransactionsResponse>, Status> {
        debug!("DescribeTransactions");
        let request = request.into_inner();
        let now = now_ms();
        let mut transactions = Vec::new();
        if let Err(e) = wire::describe_ids(&request) {
            // The list itself is refused: one description carries the error.
            transactions.push(proto::TransactionDescription {
                error_code: error_code(&e) as i32,
                error_message: e.detail(),
                coordinator_id: self.shared.node_id,
                ..Default::default()
            });
        } else {
            for id in &request.transactional_ids {
                transactions.push(self.shared.describe_transaction(id, now).await);
            }
        }
        for t in &transactions {
            self.shared.count(
                "DescribeTransactions",
                t.error_code,
                "",
                cluster::NO_PRODUCER_ID,
            );
        }
        Ok(Response::new(proto::DescribeTransactionsResponse {
            transactions,
        }))
    }

    #[instrument(level = "debug", skip_all, fields(txn_id = %request.get_ref().transactional_id, pid = request.get_ref().producer_id))]
    async fn verify_transaction(
        &self,
        request: Request<proto::VerifyTransactionRequest>,
    ) -> Result<Response<proto::VerifyTransactionResponse>, Status> {
        debug!("VerifyTransaction");
        let (txn_id, pid) = (
            request.get_ref().transactional_id.clone(),
            request.get_ref().producer_id,
        );
        let request = request.into_inner();
        let result = match self
            .shared
            .authenticate(&request, false)
            .and_then(|sender| self.shared.check_leader(sender))
            .and_then(|()| wire::verify_transaction(request))
        {
            Ok((caller, partition)) => self.shared.verify_transaction(caller, partition).await,
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared
            .count("VerifyTransaction", error_code, &txn_id, pid);
        Ok(Response::new(proto::VerifyTransactionResponse {
            error_code,
            error_message,
            transaction_number: result.unwrap_or(0),
        }))
    }

    #[instrument(level = "debug", skip_all, fields(group = %request.get_ref().group_id, result = request.get_ref().result))]
    async fn write_group_offset_marker(
        &self,
        request: Request<proto::WriteGroupOffsetMarkerRequest>,
    ) -> Result<Response<proto::WriteGroupOffsetMarkerResponse>, Status> {
        debug!("WriteGroupOffsetMarker");
        let (txn_id, pid) = (
            request.get_ref().transactional_id.clone(),
            request.get_ref().producer_id,
        );
        let request = request.into_inner();
        let sender = self.shared.authenticate(&request, true).and_then(|sender| {
            let (claimed, id) = (request.coordinator_id, &request.transactional_id);
            self.shared.check_marker_sender(sender, claimed, id)
        });
        let result = match sender.and_then(|()| wire::group_marker(request)) {
            Ok(marker) => self.shared.write_group_marker(marker).await,
            Err(e) => Err(e),
        };
        let (error_code, error_message) = code_of(&result);
        self.shared
            .count("WriteGroupOffsetMarker", error_code, &txn_id, pid);
        Ok(Response::new(proto::WriteGroupOffsetMarkerResponse {
            error_code,
            error_message,
        }))
    }
}
