//! The coordinator's Kafka face: the transactional APIs and group offsets, decoded with
//! `kafka-protocol` and answered by calling the gRPC service's functions in-process (the same
//! input checks, routing, per-id locks, [`crate::core`] rules, durable writes and markers), then
//! encoded. Errors go through the one mapping (`service::error_code`, then
//! `kafka_wire::codes::kafka_code`).
//!
//! Transaction version: Kafka clients that do not implement KIP-890 part 2 (librdkafka,
//! kafka-python: no EndTxn v5) are on transaction version 1, so this face sends InitProducerId
//! with version 1 and the coordinator records it for the id; its EndTxn then keeps the epoch
//! and its markers carry it ([`crate::core::end_txn_v1`], PROTOCOL.md section 6). EndTxn is
//! capped at v4 and InitProducerId at v4 accordingly.
//!
//! | API                  | versions | notes |
//! |----------------------|----------|-------|
//! | InitProducerId       | 0-4      | v3+: the KIP-360 expected (PID, epoch) |
//! | AddPartitionsToTxn   | 0-3      | v4+ is the broker-to-broker batched form |
//! | AddOffsetsToTxn      | 0-3      | |
//! | TxnOffsetCommit      | 0-3      | v3: generation and member id (KIP-447) |
//! | EndTxn               | 0-4      | v5 is transaction version 2 |
//! | OffsetFetch          | 1-7      | v8+ is the batched form |
//! | ListTransactions     | 0-1      | |
//! | DescribeTransactions | 0        | |
//!
//! Choices: AddPartitionsToTxn answers every partition of the request with the one error the
//! core returns (it adds all or nothing), as Kafka does for a request-level failure; an
//! unknown partition is UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED.
//! TxnOffsetCommit answers every partition with the request's error too.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{
    TopicData, TransactionState as DescribedState,
};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedState;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse,
    ListTransactionsRequest, ListTransactionsResponse, OffsetFetchRequest, OffsetFetchResponse,
    ProducerId, RequestKind, ResponseKind, TopicName, TransactionalId, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use kafka_wire::{codes, str_bytes, ApiRange, Handler, Request};
use proto::transaction_coordinator_server::TransactionCoordinator;

use crate::core::TransactionVersion;
use crate::service::{error_code, CoordinatorService};
use crate::Error;

/// The coordinator's [`Handler`].
pub struct KafkaCoordinator {
    service: CoordinatorService,
}

impl KafkaCoordinator {
    /// The Kafka face of a coordinator's service.
    pub(crate) fn new(service: CoordinatorService) -> Self {
        Self { service }
    }
}

/// The Kafka code of a coordinator error.
fn kafka_error(e: &Error) -> i16 {
    codes::kafka_code(error_code(e))
}

/// The Kafka code of a unit result.
fn kafka_result<T>(r: &Result<T, Error>) -> i16 {
    r.as_ref().err().map_or(codes::NONE, kafka_error)
}

/// Kafka's name of a transaction state (ListTransactions, DescribeTransactions).
fn state_name(state: i32) -> &'static str {
    match proto::TxnState::try_from(state) {
        Ok(proto::TxnState::Empty) => "Empty",
        Ok(proto::TxnState::Ongoing) => "Ongoing",
        Ok(proto::TxnState::PrepareCommit) => "PrepareCommit",
        Ok(proto::TxnState::PrepareAbort) => "PrepareAbort",
        Ok(proto::TxnState::CompleteCommit) => "CompleteCommit",
        Ok(proto::TxnState::CompleteAbort) => "CompleteAbort",
        Err(_) => "Unknown",
    }
}

impl Handler for KafkaCoordinator {
    fn apis(&self) -> Vec<ApiRange> {
        kafka_wire::apis::COORDINATOR_APIS.to_vec()
    }

    async fn handle(&self, request: Request) -> kafka_wire::Result<Option<ResponseKind>> {
        let version = request.version;
        let response = match request.body {
            RequestKind::InitProducerId(r) => {
                ResponseKind::InitProducerId(self.init_producer_id(r).await)
            }
            RequestKind::AddPartitionsToTxn(r) => {
                ResponseKind::AddPartitionsToTxn(self.add_partitions(r).await)
            }
            RequestKind::AddOffsetsToTxn(r) => {
                ResponseKind::AddOffsetsToTxn(self.add_offsets(r).await)
            }
            RequestKind::TxnOffsetCommit(r) => {
                ResponseKind::TxnOffsetCommit(self.txn_offset_commit(r).await)
            }
            RequestKind::EndTxn(r) => ResponseKind::EndTxn(self.end_txn(r).await),
            RequestKind::OffsetFetch(r) => {
                ResponseKind::OffsetFetch(self.offset_fetch(r, version).await)
            }
            RequestKind::ListTransactions(r) => {
                ResponseKind::ListTransactions(self.list_transactions(r).await)
            }
            RequestKind::DescribeTransactions(r) => {
                ResponseKind::DescribeTransactions(self.describe_transactions(r).await)
            }
            _ => {
                return Err(kafka_wire::Error::Close(format!(
                    "{:?} is not served by a coordinator",
                    request.api_key
                )))
            }
        };
        Ok(Some(response))
    }
}

impl KafkaCoordinator {
    async fn init_producer_id(&self, r: InitProducerIdRequest) -> InitProducerIdResponse {
        let grpc = proto::InitProducerIdRequest {
            transactional_id: r.transactional_id.map(|t| t.0.to_string()),
            transaction_timeout_ms: r.transaction_timeout_ms,
            expected_producer_id: r.producer_id.0,
            expected_producer_epoch: i32::from(r.producer_epoch),
            transaction_version: TransactionVersion::V1.to_wire(),
        };
        let mut response = InitProducerIdResponse::default();
        match self.service.init_producer_id(grpc).await {
            Ok(pair) => {
                response.producer_id = ProducerId(pair.producer_id);
                response.producer_epoch = pair.epoch;
            }
            Err(e) => {
                response.error_code = kafka_error(&e);
                response.producer_id = ProducerId(-1);
                response.producer_epoch = -1;
            }
        }
        response
    }

    async fn add_partitions(&self, r: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
        let partitions: Vec<proto::TopicPartition> = r
            .v3_and_below_topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|&p| proto::TopicPartition {
                    topic: t.name.0.to_string(),
                    partition: p,
                })
            })
            .collect();
        let grpc = proto::AddPartitionsToTxnRequest {
            transactional_id: r.v3_and_below_transactional_id.0.to_string(),
            producer_id: r.v3_and_below_producer_id.0,
            producer_epoch: i32::from(r.v3_and_below_producer_epoch),
            partitions,
        };
        let result = self.service.add_partitions(grpc).await;
        let code = kafka_result(&result);
        let unknown = ResponseError::UnknownTopicOrPartition.code();
        let topology = self.service.topology();
        let mut response = AddPartitionsToTxnResponse::default();
        response.results_by_topic_v3_and_below = r
            .v3_and_below_topics
            .iter()
            .map(|t| {
                let mut topic = AddPartitionsToTxnTopicResult::default();
                topic.name = t.name.clone();
                topic.results_by_partition = t
                    .partitions
                    .iter()
                    .map(|&p| {
                        let mut out = AddPartitionsToTxnPartitionResult::default();
                        out.partition_index = p;
                        out.partition_error_code =
                            if code == unknown && topology.partition_exists(&t.name.0, p) {
                                ResponseError::OperationNotAttempted.code()
                            } else {
                                code
                            };
                        out
                    })
                    .collect();
                topic
            })
            .collect();
        response
    }

    async fn add_offsets(&self, r: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
        let grpc = proto::AddOffsetsToTxnRequest {
            transactional_id: r.transactional_id.0.to_string(),
            producer_id: r.producer_id.0,
            producer_epoch: i32::from(r.producer_epoch),
            group_id: r.group_id.0.to_string(),
        };
        let mut response = AddOffsetsToTxnResponse::default();
        response.error_code = kafka_result(&self.service.add_offsets(grpc).await);
        response
    }

    async fn txn_offset_commit(&self, r: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
        let offsets = r
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| proto::PartitionOffset {
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    offset: p.committed_offset,
                })
            })
            .collect();
        let grpc = proto::TxnOffsetCommitRequest {
            transactional_id: r.transactional_id.0.to_string(),
            producer_id: r.producer_id.0,
            producer_epoch: i32::from(r.producer_epoch),
            group_id: r.group_id.0.to_string(),
            offsets,
        };
        let code = kafka_result(&self.service.txn_offset_commit(grpc).await);
        let mut response = TxnOffsetCommitResponse::default();
        response.topics = r
            .topics
            .iter()
            .map(|t| {
                let mut topic = TxnOffsetCommitResponseTopic::default();
                topic.name = t.name.clone();
                topic.partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut out = TxnOffsetCommitResponsePartition::default();
                        out.partition_index = p.partition_index;
                        out.error_code = code;
                        out
                    })
                    .collect();
                topic
            })
            .collect();
        response
    }

    async fn end_txn(&self, r: EndTxnRequest) -> EndTxnResponse {
        let grpc = proto::EndTxnRequest {
            transactional_id: r.transactional_id.0.to_string(),
            producer_id: r.producer_id.0,
            producer_epoch: i32::from(r.producer_epoch),
            result: if r.committed {
                proto::TxnResult::Commit
            } else {
                proto::TxnResult::Abort
            } as i32,
        };
        let mut response = EndTxnResponse::default();
        response.producer_id = ProducerId(-1);
        response.producer_epoch = -1;
        match self.service.end_txn(grpc).await {
            Ok(pair) => {
                response.producer_id = ProducerId(pair.producer_id);
                response.producer_epoch = pair.epoch;
            }
            Err(e) => response.error_code = kafka_error(&e),
        }
        response
    }

    async fn offset_fetch(&self, r: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
        let partitions: Vec<proto::TopicPartition> = r
            .topics
            .iter()
            .flatten()
            .flat_map(|t| {
                t.partition_indexes.iter().map(|&p| proto::TopicPartition {
                    topic: t.name.0.to_string(),
                    partition: p,
                })
            })
            .collect();
        let grpc = proto::OffsetFetchRequest {
            group_id: r.group_id.0.to_string(),
            partitions,
        };
        let mut response = OffsetFetchResponse::default();
        match self.service.offset_fetch(grpc).await {
            Ok(offsets) => {
                for o in offsets {
                    let mut p = OffsetFetchResponsePartition::default();
                    p.partition_index = o.partition;
                    p.committed_offset = o.offset;
                    p.committed_leader_epoch = -1;
                    p.metadata = Some(str_bytes(""));
                    match response
                        .topics
                        .iter_mut()
                        .find(|t| t.name.0.as_str() == o.topic)
                    {
                        Some(t) => t.partitions.push(p),
                        None => {
                            let mut t = OffsetFetchResponseTopic::default();
                            t.name = TopicName(str_bytes(o.topic));
                            t.partitions.push(p);
                            response.topics.push(t);
                        }
                    }
                }
            }
            Err(e) => {
                let code = kafka_error(&e);
                if version >= 2 {
                    response.error_code = code;
                } else {
                    // v1 has no top-level error: every requested partition carries it.
                    for t in r.topics.iter().flatten() {
                        let mut topic = OffsetFetchResponseTopic::default();
                        topic.name = t.name.clone();
                        topic.partitions = t
                            .partition_indexes
                            .iter()
                            .map(|&i| {
                                let mut p = OffsetFetchResponsePartition::default();
                                p.partition_index = i;
                                p.committed_offset = -1;
                                p.error_code = code;
                                p
                            })
                            .collect();
                        response.topics.push(topic);
                    }
                }
            }
        }
        response
    }

    async fn list_transactions(&self, r: ListTransactionsRequest) -> ListTransactionsResponse {
        let mut response = ListTransactionsResponse::default();
        let mut filters = Vec::new();
        for name in &r.state_filters {
            match (0..6).find(|&s| state_name(s) == name.as_str()) {
                Some(s) => filters.push(s),
                None => response.unknown_state_filters.push(name.clone()),
            }
        }
        if !response.unknown_state_filters.is_empty() && filters.is_empty() {
            return response;
        }
        let grpc = proto::ListTransactionsRequest {
            state_filters: filters,
        };
        let listed = match self
            .service
            .list_transactions(tonic::Request::new(grpc))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(_) => {
                response.error_code = ResponseError::UnknownServerError.code();
                return response;
            }
        };
        response.error_code = codes::kafka_code_of(listed.error_code);
        response.transaction_states = listed
            .transactions
            .into_iter()
            .filter(|t| {
                r.producer_id_filters.is_empty()
                    || r.producer_id_filters.contains(&ProducerId(t.producer_id))
            })
            .map(|t| {
                let mut s = ListedState::default();
                s.transactional_id = TransactionalId(str_bytes(t.transactional_id));
                s.producer_id = ProducerId(t.producer_id);
                s.transaction_state = str_bytes(state_name(t.state));
                s
            })
            .collect();
        response
    }

    async fn describe_transactions(
        &self,
        r: DescribeTransactionsRequest,
    ) -> DescribeTransactionsResponse {
        let grpc = proto::DescribeTransactionsRequest {
            transactional_ids: r
                .transactional_ids
                .iter()
                .map(|t| t.0.to_string())
                .collect(),
        };
        let mut response = DescribeTransactionsResponse::default();
        let described = match self
            .service
            .describe_transactions(tonic::Request::new(grpc))
            .await
        {
            Ok(d) => d.into_inner(),
            Err(_) => return response,
        };
        response.transaction_states = described
            .transactions
            .into_iter()
            .map(|t| {
                let mut s = DescribedState::default();
                s.error_code = codes::kafka_code_of(t.error_code);
                s.transactional_id = TransactionalId(str_bytes(t.transactional_id));
                s.transaction_state = str_bytes(state_name(t.state));
                s.transaction_timeout_ms = t.transaction_timeout_ms;
                s.transaction_start_time_ms = t.transaction_start_ms;
                s.producer_id = ProducerId(t.producer_id);
                s.producer_epoch = t.producer_epoch as i16;
                for tp in t.partitions {
                    match s.topics.iter_mut().find(|d| d.topic.0.as_str() == tp.topic) {
                        Some(d) => d.partitions.push(tp.partition),
                        None => {
                            let mut d = TopicData::default();
                            d.topic = TopicName(str_bytes(tp.topic));
                            d.partitions.push(tp.partition);
                            s.topics.push(d);
                        }
                    }
                }
                s
            })
            .collect();
        response
    }
}
