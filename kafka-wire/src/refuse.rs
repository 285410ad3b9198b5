//! Answers for the APIs of the other role: what a Kafka broker says when it is not the
//! partition's leader (NOT_LEADER_OR_FOLLOWER, per partition) or not the key's coordinator
//! (NOT_COORDINATOR). Clients then refresh their metadata or find the coordinator again.
//! ListTransactions and ListGroups on a node that coordinates nothing are empty lists, as on a
//! Kafka broker without transaction state or group partitions; DeleteGroups, OffsetDelete,
//! ConsumerGroupHeartbeat and ConsumerGroupDescribe are NOT_COORDINATOR.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse as DescribePartition, TopicResponse as DescribeTopic,
};
use kafka_protocol::messages::describe_transactions_response::TransactionState;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnResponse, AddPartitionsToTxnResponse, DescribeGroupsResponse,
    DescribeProducersResponse, DescribeTransactionsResponse, EndTxnResponse, FetchResponse,
    HeartbeatResponse, InitProducerIdResponse, JoinGroupResponse, LeaveGroupResponse,
    ListGroupsResponse, ListOffsetsResponse, ListTransactionsResponse, OffsetCommitResponse,
    OffsetFetchResponse, ProduceResponse, ProducerId, RequestKind, ResponseKind, SyncGroupResponse,
    TxnOffsetCommitResponse,
};
use kafka_protocol::messages::{DeleteGroupsResponse, OffsetDeleteResponse};

/// The refusal of `request` (at `version`) by a node of the other role; `None` for a request
/// that gets no response (Produce with acks=0) or that no role serves.
pub fn not_served_here(request: &RequestKind, version: i16) -> Option<ResponseKind> {
    let not_leader = ResponseError::NotLeaderOrFollower.code();
    let not_coordinator = ResponseError::NotCoordinator.code();
    Some(match request {
        RequestKind::Produce(r) => {
            if r.acks == 0 {
                return None;
            }
            let mut response = ProduceResponse::default();
            response.responses = r
                .topic_data
                .iter()
                .map(|t| {
                    let mut topic = TopicProduceResponse::default();
                    topic.name = t.name.clone();
                    topic.partition_responses = t
                        .partition_data
                        .iter()
                        .map(|p| {
                            let mut out = PartitionProduceResponse::default();
                            out.index = p.index;
                            out.error_code = not_leader;
                            out.base_offset = -1;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::Produce(response)
        }
        RequestKind::Fetch(r) => {
            let mut response = FetchResponse::default();
            response.responses = r
                .topics
                .iter()
                .map(|t| {
                    let mut topic = FetchableTopicResponse::default();
                    topic.topic = t.topic.clone();
                    topic.partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let mut out = PartitionData::default();
                            out.partition_index = p.partition;
                            out.error_code = not_leader;
                            out.high_watermark = -1;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::Fetch(response)
        }
        RequestKind::ListOffsets(r) => {
            let mut response = ListOffsetsResponse::default();
            response.topics = r
                .topics
                .iter()
                .map(|t| {
                    let mut topic = ListOffsetsTopicResponse::default();
                    topic.name = t.name.clone();
                    topic.partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let mut out = ListOffsetsPartitionResponse::default();
                            out.partition_index = p.partition_index;
                            out.error_code = not_leader;
                            out.offset = -1;
                            out.timestamp = -1;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::ListOffsets(response)
        }
        RequestKind::DeleteRecords(r) => {
            use kafka_protocol::messages::delete_records_response::{
                DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
            };
            let mut response = kafka_protocol::messages::DeleteRecordsResponse::default();
            response.topics = r
                .topics
                .iter()
                .map(|t| {
                    let mut topic = DeleteRecordsTopicResult::default();
                    topic.name = t.name.clone();
                    topic.partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let mut out = DeleteRecordsPartitionResult::default();
                            out.partition_index = p.partition_index;
                            out.low_watermark = -1;
                            out.error_code = not_leader;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::DeleteRecords(response)
        }
        RequestKind::DescribeProducers(r) => {
            let mut response = DescribeProducersResponse::default();
            response.topics = r
                .topics
                .iter()
                .map(|t| {
                    let mut topic = DescribeTopic::default();
                    topic.name = t.name.clone();
                    topic.partitions = t
                        .partition_indexes
                        .iter()
                        .map(|&p| {
                            let mut out = DescribePartition::default();
                            out.partition_index = p;
                            out.error_code = not_leader;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::DescribeProducers(response)
        }
        RequestKind::InitProducerId(_) => {
            let mut response = InitProducerIdResponse::default();
            response.error_code = not_coordinator;
            response.producer_id = ProducerId(-1);
            response.producer_epoch = -1;
            ResponseKind::InitProducerId(response)
        }
        RequestKind::AddPartitionsToTxn(r) => {
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
                            out.partition_error_code = not_coordinator;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::AddPartitionsToTxn(response)
        }
        RequestKind::AddOffsetsToTxn(_) => {
            let mut response = AddOffsetsToTxnResponse::default();
            response.error_code = not_coordinator;
            ResponseKind::AddOffsetsToTxn(response)
        }
        RequestKind::EndTxn(_) => {
            let mut response = EndTxnResponse::default();
            response.error_code = not_coordinator;
            response.producer_id = ProducerId(-1);
            response.producer_epoch = -1;
            ResponseKind::EndTxn(response)
        }
        RequestKind::TxnOffsetCommit(r) => {
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
                            out.error_code = not_coordinator;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::TxnOffsetCommit(response)
        }
        RequestKind::OffsetFetch(r) => {
            let mut response = OffsetFetchResponse::default();
            if version >= 8 {
                // Batched: each group carries the error.
                response.groups = r
                    .groups
                    .iter()
                    .map(|g| {
                        let mut out =
                            kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup::default();
                        out.group_id = g.group_id.clone();
                        out.error_code = not_coordinator;
                        out
                    })
                    .collect();
            } else if version >= 2 {
                response.error_code = not_coordinator;
            } else {
                response.topics = r
                    .topics
                    .iter()
                    .flatten()
                    .map(|t| {
                        let mut topic = OffsetFetchResponseTopic::default();
                        topic.name = t.name.clone();
                        topic.partitions = t
                            .partition_indexes
                            .iter()
                            .map(|&p| {
                                let mut out = OffsetFetchResponsePartition::default();
                                out.partition_index = p;
                                out.committed_offset = -1;
                                out.error_code = not_coordinator;
                                out
                            })
                            .collect();
                        topic
                    })
                    .collect();
            }
            ResponseKind::OffsetFetch(response)
        }
        RequestKind::ListTransactions(_) => {
            ResponseKind::ListTransactions(ListTransactionsResponse::default())
        }
        RequestKind::DescribeTransactions(r) => {
            let mut response = DescribeTransactionsResponse::default();
            response.transaction_states = r
                .transactional_ids
                .iter()
                .map(|id| {
                    let mut out = TransactionState::default();
                    out.transactional_id = id.clone();
                    out.error_code = not_coordinator;
                    out.producer_id = ProducerId(-1);
                    out.producer_epoch = -1;
                    out
                })
                .collect();
            ResponseKind::DescribeTransactions(response)
        }
        RequestKind::OffsetCommit(r) => {
            let mut response = OffsetCommitResponse::default();
            response.topics = r
                .topics
                .iter()
                .map(|t| {
                    let mut topic = OffsetCommitResponseTopic::default();
                    topic.name = t.name.clone();
                    topic.partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let mut out = OffsetCommitResponsePartition::default();
                            out.partition_index = p.partition_index;
                            out.error_code = not_coordinator;
                            out
                        })
                        .collect();
                    topic
                })
                .collect();
            ResponseKind::OffsetCommit(response)
        }
        RequestKind::JoinGroup(_) => {
            let mut response = JoinGroupResponse::default();
            response.error_code = not_coordinator;
            response.generation_id = -1;
            ResponseKind::JoinGroup(response)
        }
        RequestKind::SyncGroup(_) => {
            let mut response = SyncGroupResponse::default();
            response.error_code = not_coordinator;
            ResponseKind::SyncGroup(response)
        }
        RequestKind::Heartbeat(_) => {
            let mut response = HeartbeatResponse::default();
            response.error_code = not_coordinator;
            ResponseKind::Heartbeat(response)
        }
        RequestKind::LeaveGroup(_) => {
            let mut response = LeaveGroupResponse::default();
            response.error_code = not_coordinator;
            ResponseKind::LeaveGroup(response)
        }
        RequestKind::ListGroups(_) => ResponseKind::ListGroups(ListGroupsResponse::default()),
        RequestKind::DescribeGroups(r) => {
            let mut response = DescribeGroupsResponse::default();
            response.groups = r
                .groups
                .iter()
                .map(|g| {
                    let mut out =
                        kafka_protocol::messages::describe_groups_response::DescribedGroup::default(
                        );
                    out.group_id = g.clone();
                    out.error_code = not_coordinator;
                    out.authorized_operations = i32::MIN;
                    out
                })
                .collect();
            ResponseKind::DescribeGroups(response)
        }
        RequestKind::DeleteGroups(r) => {
            let mut response = DeleteGroupsResponse::default();
            response.results = r
                .groups_names
                .iter()
                .map(|g| {
                    let mut out = DeletableGroupResult::default();
                    out.group_id = g.clone();
                    out.error_code = not_coordinator;
                    out
                })
                .collect();
            ResponseKind::DeleteGroups(response)
        }
        RequestKind::OffsetDelete(_) => {
            let mut response = OffsetDeleteResponse::default();
            response.error_code = not_coordinator;
            ResponseKind::OffsetDelete(response)
        }
        RequestKind::ConsumerGroupDescribe(r) => {
            use kafka_protocol::messages::consumer_group_describe_response::DescribedGroup;
            let mut response = kafka_protocol::messages::ConsumerGroupDescribeResponse::default();
            response.groups = r
                .group_ids
                .iter()
                .map(|g| {
                    let mut out = DescribedGroup::default();
                    out.group_id = g.clone();
                    out.error_code = not_coordinator;
                    out.authorized_operations = i32::MIN;
                    out
                })
                .collect();
            ResponseKind::ConsumerGroupDescribe(response)
        }
        RequestKind::ConsumerGroupHeartbeat(_) => {
            let mut response = kafka_protocol::messages::ConsumerGroupHeartbeatResponse::default();
            response.error_code = not_coordinator;
            ResponseKind::ConsumerGroupHeartbeat(response)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::{COORDINATOR_APIS, LEADER_APIS};
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ApiKey, ProduceRequest};

    /// A default request of `key` (with one partition for Produce, so there is something to
    /// refuse per partition).
    fn request(key: ApiKey) -> RequestKind {
        use kafka_protocol::messages::*;
        match key {
            ApiKey::Produce => {
                let mut r = ProduceRequest::default();
                r.acks = -1;
                let mut t = TopicProduceData::default();
                t.name = TopicName(crate::str_bytes("t"));
                t.partition_data.push(PartitionProduceData::default());
                r.topic_data.push(t);
                RequestKind::Produce(r)
            }
            ApiKey::Fetch => RequestKind::Fetch(Default::default()),
            ApiKey::ListOffsets => RequestKind::ListOffsets(Default::default()),
            ApiKey::DescribeProducers => RequestKind::DescribeProducers(Default::default()),
            ApiKey::InitProducerId => RequestKind::InitProducerId(Default::default()),
            ApiKey::AddPartitionsToTxn => RequestKind::AddPartitionsToTxn(Default::default()),
            ApiKey::AddOffsetsToTxn => RequestKind::AddOffsetsToTxn(Default::default()),
            ApiKey::TxnOffsetCommit => RequestKind::TxnOffsetCommit(Default::default()),
            ApiKey::EndTxn => RequestKind::EndTxn(Default::default()),
            ApiKey::OffsetFetch => {
                let mut r = OffsetFetchRequest::default();
                let mut g = kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup::default();
                g.group_id = GroupId(crate::str_bytes("g"));
                r.groups.push(g);
                RequestKind::OffsetFetch(r)
            }
            ApiKey::ListTransactions => RequestKind::ListTransactions(Default::default()),
            ApiKey::DescribeTransactions => RequestKind::DescribeTransactions(Default::default()),
            ApiKey::OffsetCommit => RequestKind::OffsetCommit(Default::default()),
            ApiKey::JoinGroup => RequestKind::JoinGroup(Default::default()),
            ApiKey::SyncGroup => RequestKind::SyncGroup(Default::default()),
            ApiKey::Heartbeat => RequestKind::Heartbeat(Default::default()),
            ApiKey::LeaveGroup => RequestKind::LeaveGroup(Default::default()),
            ApiKey::ListGroups => RequestKind::ListGroups(Default::default()),
            ApiKey::DeleteRecords => RequestKind::DeleteRecords(Default::default()),
            ApiKey::DeleteGroups => {
                let mut r = kafka_protocol::messages::DeleteGroupsRequest::default();
                r.groups_names.push(GroupId(crate::str_bytes("g")));
                RequestKind::DeleteGroups(r)
            }
            ApiKey::OffsetDelete => RequestKind::OffsetDelete(Default::default()),
            ApiKey::ConsumerGroupHeartbeat => {
                RequestKind::ConsumerGroupHeartbeat(Default::default())
            }
            ApiKey::ConsumerGroupDescribe => {
                let mut r = ConsumerGroupDescribeRequest::default();
                r.group_ids.push(GroupId(crate::str_bytes("g")));
                RequestKind::ConsumerGroupDescribe(r)
            }
            ApiKey::DescribeGroups => {
                let mut r = DescribeGroupsRequest::default();
                r.groups.push(GroupId(crate::str_bytes("g")));
                RequestKind::DescribeGroups(r)
            }
            other => panic!("no sample request for {other:?}"),
        }
    }

    #[test]
    fn every_role_api_is_refused_with_a_response_that_encodes_at_every_version() {
        for api in LEADER_APIS.iter().chain(COORDINATOR_APIS) {
            for version in api.min..=api.max {
                let response = not_served_here(&request(api.key), version)
                    .unwrap_or_else(|| panic!("{:?} v{version} has no refusal", api.key));
                let mut buf = bytes::BytesMut::new();
                response
                    .encode(&mut buf, version)
                    .unwrap_or_else(|e| panic!("{:?} v{version}: {e}", api.key));
            }
        }
    }

    /// The Kafka face's counters (`observe::error_codes`) see the refusal of every role API: an
    /// API whose response codes are not read would answer uncounted. (APIs refused per item
    /// are left out: a default request names no item, so their refusal carries no code.)
    #[test]
    fn every_role_api_refusal_is_counted() {
        use kafka_protocol::messages::ApiKey::*;
        let per_item = [
            Fetch,
            ListOffsets,
            DescribeProducers,
            DeleteRecords,
            AddPartitionsToTxn,
            TxnOffsetCommit,
            OffsetFetch,
            ListTransactions,
            DescribeTransactions,
            OffsetCommit,
            ListGroups,
        ];
        let mut uncounted = Vec::new();
        for api in LEADER_APIS.iter().chain(COORDINATOR_APIS) {
            if per_item.contains(&api.key) {
                continue;
            }
            let response = not_served_here(&request(api.key), api.max).expect("a refusal");
            if !crate::observe::error_codes(&response)
                .iter()
                .any(|c| *c != 0)
            {
                uncounted.push(api.key);
            }
        }
        assert!(uncounted.is_empty(), "refusals not counted: {uncounted:?}");
    }

    #[test]
    fn produce_with_acks_0_gets_no_refusal_either() {
        let mut r = ProduceRequest::default();
        r.acks = 0;
        assert!(not_served_here(&RequestKind::Produce(r), 9).is_none());
        if let RequestKind::Produce(r) = request(ApiKey::Produce) {
            let Some(ResponseKind::Produce(response)) =
                not_served_here(&RequestKind::Produce(r), 9)
            else {
                panic!("a produce refusal")
            };
            assert_eq!(
                response.responses[0].partition_responses[0].error_code,
                ResponseError::NotLeaderOrFollower.code()
            );
        }
    }
}
