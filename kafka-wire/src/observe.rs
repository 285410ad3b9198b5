//! What the Kafka face counts in the node's [`cluster::metrics::Metrics`], the same families
//! the gRPC face counts in: every error code a response carries, under Kafka's request and
//! error names (Kafka's `RequestMetrics ErrorsPerSec` counts each occurrence, so a Produce to
//! three partitions counts three), and, for PRODUCER_FENCED and INVALID_PRODUCER_EPOCH, who was
//! refused (transactional id and producer id, as the request names them).
//!
//! Pure functions over decoded messages; the server calls them around the handler.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{RequestKind, ResponseKind};

/// Who a request speaks for: its transactional id (empty if none) and producer id (-1 if none).
pub fn caller(request: &RequestKind) -> (String, i64) {
    let none = || (String::new(), cluster::NO_PRODUCER_ID);
    match request {
        RequestKind::InitProducerId(r) => (
            r.transactional_id
                .as_ref()
                .map_or_else(String::new, |id| id.0.to_string()),
            r.producer_id.0,
        ),
        RequestKind::AddPartitionsToTxn(r) => (
            r.v3_and_below_transactional_id.0.to_string(),
            r.v3_and_below_producer_id.0,
        ),
        RequestKind::AddOffsetsToTxn(r) => (r.transactional_id.0.to_string(), r.producer_id.0),
        RequestKind::TxnOffsetCommit(r) => (r.transactional_id.0.to_string(), r.producer_id.0),
        RequestKind::EndTxn(r) => (r.transactional_id.0.to_string(), r.producer_id.0),
        RequestKind::Produce(r) => {
            let id = r
                .transactional_id
                .as_ref()
                .map_or_else(String::new, |id| id.0.to_string());
            let pid = r
                .topic_data
                .iter()
                .flat_map(|t| &t.partition_data)
                .find_map(|p| p.records.as_deref().and_then(batch_producer_id))
                .unwrap_or(cluster::NO_PRODUCER_ID);
            (id, pid)
        }
        _ => none(),
    }
}

/// The producer id in the header of a v2 record batch (magic 2), if the bytes hold one.
fn batch_producer_id(records: &[u8]) -> Option<i64> {
    // baseOffset 8, batchLength 4, partitionLeaderEpoch 4, magic 1, crc 4, attributes 2,
    // lastOffsetDelta 4, baseTimestamp 8, maxTimestamp 8, then producerId 8.
    const MAGIC_AT: usize = 16;
    const PID_AT: usize = 43;
    if records.get(MAGIC_AT) != Some(&2) {
        return None;
    }
    let bytes: [u8; 8] = records.get(PID_AT..PID_AT + 8)?.try_into().ok()?;
    Some(i64::from_be_bytes(bytes))
}

/// Every error code `response` carries, NONE included, once per occurrence: the top-level code
/// where the response has one that applies to its version, and each per-partition (or
/// per-member, per-transaction) code.
pub fn error_codes(response: &ResponseKind) -> Vec<i16> {
    let mut codes = Vec::new();
    match response {
        ResponseKind::ApiVersions(r) => codes.push(r.error_code),
        ResponseKind::Metadata(r) => codes.extend(r.topics.iter().map(|t| t.error_code)),
        ResponseKind::FindCoordinator(r) if r.coordinators.is_empty() => codes.push(r.error_code),
        ResponseKind::FindCoordinator(r) => {
            codes.extend(r.coordinators.iter().map(|c| c.error_code))
        }
        ResponseKind::Produce(r) => codes.extend(
            r.responses
                .iter()
                .flat_map(|t| &t.partition_responses)
                .map(|p| p.error_code),
        ),
        ResponseKind::Fetch(r) => {
            codes.push(r.error_code);
            codes.extend(
                r.responses
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| p.error_code),
            );
        }
        ResponseKind::ListOffsets(r) => codes.extend(
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .map(|p| p.error_code),
        ),
        ResponseKind::DescribeProducers(r) => codes.extend(
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .map(|p| p.error_code),
        ),
        ResponseKind::InitProducerId(r) => codes.push(r.error_code),
        ResponseKind::AddPartitionsToTxn(r) => codes.extend(
            r.results_by_topic_v3_and_below
                .iter()
                .flat_map(|t| &t.results_by_partition)
                .map(|p| p.partition_error_code),
        ),
        ResponseKind::AddOffsetsToTxn(r) => codes.push(r.error_code),
        ResponseKind::TxnOffsetCommit(r) => codes.extend(
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .map(|p| p.error_code),
        ),
        ResponseKind::EndTxn(r) => codes.push(r.error_code),
        ResponseKind::OffsetFetch(r) => {
            codes.push(r.error_code);
            codes.extend(
                r.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| p.error_code),
            );
        }
        ResponseKind::OffsetCommit(r) => codes.extend(
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .map(|p| p.error_code),
        ),
        ResponseKind::ListTransactions(r) => codes.push(r.error_code),
        ResponseKind::DescribeTransactions(r) => {
            codes.extend(r.transaction_states.iter().map(|t| t.error_code))
        }
        ResponseKind::JoinGroup(r) => codes.push(r.error_code),
        ResponseKind::SyncGroup(r) => codes.push(r.error_code),
        ResponseKind::Heartbeat(r) => codes.push(r.error_code),
        ResponseKind::LeaveGroup(r) => {
            codes.push(r.error_code);
            codes.extend(r.members.iter().map(|m| m.error_code));
        }
        ResponseKind::ListGroups(r) => codes.push(r.error_code),
        ResponseKind::DescribeGroups(r) => codes.extend(r.groups.iter().map(|g| g.error_code)),
        ResponseKind::DeleteRecords(r) => codes.extend(
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .map(|p| p.error_code),
        ),
        ResponseKind::DescribeConfigs(r) => codes.extend(r.results.iter().map(|r| r.error_code)),
        ResponseKind::DeleteGroups(r) => codes.extend(r.results.iter().map(|g| g.error_code)),
        ResponseKind::ConsumerGroupHeartbeat(r) => codes.push(r.error_code),
        ResponseKind::DescribeCluster(r) => codes.push(r.error_code),
        ResponseKind::CreateTopics(r) => codes.extend(r.topics.iter().map(|t| t.error_code)),
        ResponseKind::CreatePartitions(r) => codes.extend(r.results.iter().map(|t| t.error_code)),
        ResponseKind::DeleteTopics(r) => codes.extend(r.responses.iter().map(|t| t.error_code)),
        ResponseKind::ConsumerGroupDescribe(r) => {
            codes.extend(r.groups.iter().map(|g| g.error_code))
        }
        ResponseKind::OffsetDelete(r) => {
            codes.push(r.error_code);
            codes.extend(
                r.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| p.error_code),
            );
        }
        _ => {}
    }
    codes
}

/// Kafka's name of an error code (`NONE`, `PRODUCER_FENCED`, ...), or `UNKNOWN_<code>`.
pub fn error_name(code: i16) -> String {
    let Some(error) = ResponseError::try_from_code(code) else {
        return "NONE".into();
    };
    if let ResponseError::Unknown(c) = error {
        return format!("UNKNOWN_{c}");
    }
    // The variant's name, CamelCase -> SCREAMING_SNAKE_CASE (Kafka's `Errors` names).
    let camel = format!("{error:?}");
    let mut name = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };
    use kafka_protocol::messages::{EndTxnRequest, ProduceResponse, TransactionalId};
    use kafka_protocol::protocol::StrBytes;

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(0), "NONE");
        assert_eq!(error_name(90), "PRODUCER_FENCED");
        assert_eq!(error_name(47), "INVALID_PRODUCER_EPOCH");
        assert_eq!(error_name(51), "CONCURRENT_TRANSACTIONS");
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(88), "UNSTABLE_OFFSET_COMMIT");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(30_000), "UNKNOWN_30000");
    }

    #[test]
    fn every_partition_of_a_response_counts() {
        let partition = |code| {
            let mut p = PartitionProduceResponse::default();
            p.error_code = code;
            p
        };
        let mut topic = TopicProduceResponse::default();
        topic.partition_responses = vec![partition(0), partition(47), partition(0)];
        let mut response = ProduceResponse::default();
        response.responses = vec![topic];
        assert_eq!(
            error_codes(&ResponseKind::Produce(response)),
            vec![0, 47, 0]
        );
    }

    #[test]
    fn the_caller_is_read_from_the_request_and_the_batch_header() {
        let mut end = EndTxnRequest::default();
        end.transactional_id = TransactionalId(StrBytes::from_static_str("app-1"));
        end.producer_id = kafka_protocol::messages::ProducerId(7);
        assert_eq!(caller(&RequestKind::EndTxn(end)), ("app-1".into(), 7));
        let mut batch = vec![0u8; 61];
        batch[16] = 2;
        batch[43..51].copy_from_slice(&42i64.to_be_bytes());
        assert_eq!(batch_producer_id(&batch), Some(42));
        batch[16] = 1;
        assert_eq!(batch_producer_id(&batch), None, "not a v2 batch");
        assert_eq!(batch_producer_id(&[2; 20]), None, "too short");
    }
}
