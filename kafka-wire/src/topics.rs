//! CreateTopics, CreatePartitions and DeleteTopics, answered by every node (each is its own
//! controller in Metadata) from the static topology. Topics are fixed by the topology file that
//! every node loads, so nothing here changes a topic; what each request gets is what a Kafka
//! broker answers where the same request cannot be carried out, so that an application that
//! creates its topics at start ("create if missing") runs unchanged when they are in the
//! topology, and one that needs a new topic is told exactly why it has none:
//!
//! - **CreateTopics** (2-7), per topic and in Kafka's order of checks: an invalid name (empty,
//!   `.` or `..`, longer than 249 bytes, a byte outside `[a-zA-Z0-9._-]`) is
//!   INVALID_TOPIC_EXCEPTION; a name the request repeats is INVALID_REQUEST (answered once, as
//!   Kafka does: clients refuse a response that names a topic twice); a topic of the
//!   topology is TOPIC_ALREADY_EXISTS (what "create if missing" code expects); a partition count
//!   or replication factor that is 0 or below -1 is INVALID_PARTITIONS /
//!   INVALID_REPLICATION_FACTOR; any other topic is POLICY_VIOLATION, with a message naming the
//!   topology file. `validate_only` gets the same answers.
//! - **CreatePartitions** (0-3): a repeated name is INVALID_REQUEST (once), an unknown topic
//!   UNKNOWN_TOPIC_OR_PARTITION, a count that is not above the topic's INVALID_PARTITIONS (with
//!   Kafka's message), a larger count POLICY_VIOLATION.
//! - **DeleteTopics** (1-6): as a Kafka broker with `delete.topic.enable=false`: every topic
//!   named is TOPIC_DELETION_DISABLED (INVALID_REQUEST below v3, where that code does not
//!   exist). v6 names topics by name or id and echoes both (the name of a known id, the id of
//!   a known name).
//!
//! Pure functions of the topology and the request.

use std::collections::BTreeSet;

use cluster::Topology;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};

use crate::str_bytes;

/// Why a topic cannot be created or grown here.
pub fn fixed_by_topology(topic: &str) -> String {
    format!(
        "topics are fixed by the cluster's topology file: add [[topics]] name = \"{topic}\" \
         there (with its partitions' leaders) and restart the nodes"
    )
}

/// Kafka's topic name rule (`org.apache.kafka.common.internals.Topic.validate`).
pub fn invalid_topic_name(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("Topic name is illegal, it can't be empty".into());
    }
    if name == "." || name == ".." {
        return Some("Topic name cannot be \".\" or \"..\"".into());
    }
    if name.len() > cluster::topology::MAX_TOPIC_NAME_LEN {
        return Some(format!(
            "Topic name is illegal, it can't be longer than {} characters",
            cluster::topology::MAX_TOPIC_NAME_LEN
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Some(format!(
            "Topic name {name:?} is illegal, it contains a character other than ASCII \
             alphanumerics, '.', '_' and '-'"
        ));
    }
    None
}

/// The names a request repeats.
fn repeated<'a>(names: impl Iterator<Item = &'a str>) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::new();
    names.filter(|n| !seen.insert(*n)).collect()
}

/// Each name once, in the request's order.
fn first_of_each<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut seen = BTreeSet::new();
    items
        .iter()
        .filter(|t| seen.insert(name(t).to_string()))
        .collect()
}

/// Answers a CreateTopics request.
pub fn create_topics(topology: &Topology, request: &CreateTopicsRequest) -> CreateTopicsResponse {
    let repeated = repeated(request.topics.iter().map(|t| t.name.0.as_str()));
    let mut response = CreateTopicsResponse::default();
    response.topics = first_of_each(&request.topics, |t| t.name.0.as_str())
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str();
            let (error, message) = if let Some(why) = invalid_topic_name(name) {
                (ResponseError::InvalidTopicException, why)
            } else if repeated.contains(name) {
                (
                    ResponseError::InvalidRequest,
                    format!("the request names topic {name:?} more than once"),
                )
            } else if topology.topic(name).is_some() {
                (
                    ResponseError::TopicAlreadyExists,
                    format!("Topic '{name}' already exists."),
                )
            } else if t.num_partitions == 0 || t.num_partitions < -1 {
                (
                    ResponseError::InvalidPartitions,
                    "Number of partitions was set to an invalid non-positive value.".into(),
                )
            } else if t.replication_factor == 0 || t.replication_factor < -1 {
                (
                    ResponseError::InvalidReplicationFactor,
                    "Replication factor must be larger than 0, or -1 to use the default value."
                        .into(),
                )
            } else {
                (ResponseError::PolicyViolation, fixed_by_topology(name))
            };
            let mut r = CreatableTopicResult::default();
            r.name = t.name.clone();
            r.error_code = error.code();
            r.error_message = Some(str_bytes(message));
            r
        })
        .collect();
    response
}

/// Answers a CreatePartitions request.
pub fn create_partitions(
    topology: &Topology,
    request: &CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let repeated = repeated(request.topics.iter().map(|t| t.name.0.as_str()));
    let mut response = CreatePartitionsResponse::default();
    response.results = first_of_each(&request.topics, |t| t.name.0.as_str())
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str();
            let (error, message) = match topology.topic(name) {
                _ if repeated.contains(name) => (
                    ResponseError::InvalidRequest,
                    format!("the request names topic {name:?} more than once"),
                ),
                None => (
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic {name:?} does not exist"),
                ),
                Some(topic) => {
                    let current = topic.leaders.len() as i64;
                    let asked = i64::from(t.count);
                    if asked == current {
                        (
                            ResponseError::InvalidPartitions,
                            format!("Topic already has {current} partition(s)."),
                        )
                    } else if asked < current {
                        (
                            ResponseError::InvalidPartitions,
                            format!(
                                "The topic {name} currently has {current} partition(s); \
                                 {asked} would not be an increase."
                            ),
                        )
                    } else {
                        (
                            ResponseError::PolicyViolation,
                            format!(
                                "partitions are fixed by the cluster's topology file: list \
                                 {asked} leaders for topic {name:?} there and restart the nodes"
                            ),
                        )
                    }
                }
            };
            let mut r = CreatePartitionsTopicResult::default();
            r.name = t.name.clone();
            r.error_code = error.code();
            r.error_message = Some(str_bytes(message));
            r
        })
        .collect();
    response
}

/// Answers a DeleteTopics request.
pub fn delete_topics(
    topology: &Topology,
    request: &DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let error = if version >= 3 {
        ResponseError::TopicDeletionDisabled
    } else {
        ResponseError::InvalidRequest
    };
    let message = "Topic deletion is disabled: topics are fixed by the cluster's topology file";
    // v0-5 name topics in `topic_names`, v6 in `topics` (a name, or an id).
    let named: Vec<(Option<String>, uuid::Uuid)> = if version >= 6 {
        request
            .topics
            .iter()
            .map(|t| {
                let name = t.name.as_ref().map(|n| n.0.to_string());
                match (&name, t.topic_id.is_nil()) {
                    (Some(n), true) => {
                        let id = topology.topic(n).map_or(uuid::Uuid::nil(), |_| uuid_of(n));
                        (name, id)
                    }
                    (None, false) => {
                        let name = topology
                            .topic_by_id(t.topic_id.as_bytes())
                            .map(|topic| topic.name.clone());
                        (name, t.topic_id)
                    }
                    _ => (name, t.topic_id),
                }
            })
            .collect()
    } else {
        request
            .topic_names
            .iter()
            .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
            .collect()
    };
    let mut response = DeleteTopicsResponse::default();
    response.responses = named
        .into_iter()
        .map(|(name, id)| {
            let mut r = DeletableTopicResult::default();
            r.name = name.map(|n| TopicName(str_bytes(n)));
            r.topic_id = id;
            r.error_code = error.code();
            r.error_message = Some(str_bytes(message));
            r
        })
        .collect();
    response
}

fn uuid_of(topic: &str) -> uuid::Uuid {
    uuid::Uuid::from_bytes(cluster::topic_id(topic))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;

    fn topology() -> Topology {
        Topology::parse(
            "transaction_state_partitions = 1\n[[coordinators]]\nid = 1\naddress = \"127.0.0.1:1\"\n\
             [[leaders]]\nid = 101\naddress = \"127.0.0.1:2\"\n\
             [[topics]]\nname = \"input\"\nleaders = [101, 101, 101]\n",
        )
        .unwrap()
    }

    fn creatable(name: &str, partitions: i32, replication: i16) -> CreatableTopic {
        let mut t = CreatableTopic::default();
        t.name = TopicName(str_bytes(name));
        t.num_partitions = partitions;
        t.replication_factor = replication;
        t
    }

    #[test]
    fn create_topics_answers_as_kafka_where_nothing_can_be_created() {
        let mut request = CreateTopicsRequest::default();
        request.topics = vec![
            creatable("input", 3, 1),
            creatable("new-topic", 6, 1),
            creatable("bad name", 1, 1),
            creatable("..", 1, 1),
            creatable(&"x".repeat(250), 1, 1),
            creatable("zero", 0, 1),
            creatable("norepl", -1, 0),
            creatable("twice", 1, 1),
            creatable("twice", 1, 1),
        ];
        request.validate_only = true;
        let response = create_topics(&topology(), &request);
        let codes: Vec<i16> = response.topics.iter().map(|t| t.error_code).collect();
        assert_eq!(
            codes,
            [
                ResponseError::TopicAlreadyExists,
                ResponseError::PolicyViolation,
                ResponseError::InvalidTopicException,
                ResponseError::InvalidTopicException,
                ResponseError::InvalidTopicException,
                ResponseError::InvalidPartitions,
                ResponseError::InvalidReplicationFactor,
                ResponseError::InvalidRequest,
            ]
            .map(|e| e.code())
        );
        let policy = response.topics[1].error_message.as_ref().unwrap();
        assert!(policy.contains("name = \"new-topic\""), "{policy}");
        // Error results carry Kafka's "unknown" partitions and replication factor.
        assert_eq!(response.topics[0].num_partitions, -1);
        for version in 2..=7 {
            let mut buf = bytes::BytesMut::new();
            kafka_protocol::protocol::Encodable::encode(&response, &mut buf, version).unwrap();
        }
    }

    #[test]
    fn create_partitions_grows_nothing() {
        let topic = |name: &str, count| {
            let mut t = CreatePartitionsTopic::default();
            t.name = TopicName(str_bytes(name));
            t.count = count;
            t
        };
        let mut request = CreatePartitionsRequest::default();
        request.topics = vec![
            topic("input", 3),
            topic("input2", 4),
            topic("input", 2),
            topic("missing", 4),
        ];
        let response = create_partitions(&topology(), &request);
        let codes: Vec<i16> = response.results.iter().map(|t| t.error_code).collect();
        assert_eq!(
            codes,
            [
                ResponseError::InvalidRequest,
                ResponseError::UnknownTopicOrPartition,
                ResponseError::UnknownTopicOrPartition,
            ]
            .map(|e| e.code())
        );
        request.topics = vec![topic("input", 3), topic("missing", 4)];
        let response = create_partitions(&topology(), &request);
        assert_eq!(
            response.results[0].error_message.as_deref(),
            Some("Topic already has 3 partition(s).")
        );
        request.topics = vec![topic("input", 5), topic("missing", 4)];
        let response = create_partitions(&topology(), &request);
        assert_eq!(
            response.results[0].error_code,
            ResponseError::PolicyViolation.code()
        );
        request.topics = vec![topic("input", 1)];
        let response = create_partitions(&topology(), &request);
        assert_eq!(
            response.results[0].error_code,
            ResponseError::InvalidPartitions.code()
        );
    }

    #[test]
    fn delete_topics_is_disabled_and_v6_echoes_names_and_ids() {
        let mut request = DeleteTopicsRequest::default();
        request.topic_names = vec![TopicName(str_bytes("input"))];
        let old = delete_topics(&topology(), &request, 2);
        assert_eq!(
            old.responses[0].error_code,
            ResponseError::InvalidRequest.code()
        );
        let v5 = delete_topics(&topology(), &request, 5);
        assert_eq!(
            v5.responses[0].error_code,
            ResponseError::TopicDeletionDisabled.code()
        );
        let by_name = {
            let mut t = DeleteTopicState::default();
            t.name = Some(TopicName(str_bytes("input")));
            t
        };
        let by_id = {
            let mut t = DeleteTopicState::default();
            t.topic_id = uuid_of("input");
            t
        };
        request.topics = vec![by_name, by_id];
        let v6 = delete_topics(&topology(), &request, 6);
        for r in &v6.responses {
            assert_eq!(r.name.as_ref().unwrap().0.as_str(), "input");
            assert_eq!(r.topic_id, uuid_of("input"));
            assert_eq!(r.error_code, ResponseError::TopicDeletionDisabled.code());
        }
    }
}
