//! Metadata and FindCoordinator, answered by every node from the static topology, the same way
//! the gRPC `Cluster` service answers them (`cluster::ClusterService`).
//!
//! Every node with a `kafka_address` is a broker with its node id; a partition's leader is the
//! topology's leader (replicas and ISR are that one node: a single replica). A leader without a
//! Kafka address makes its partitions LEADER_NOT_AVAILABLE; a coordinator without one makes
//! FindCoordinator answer COORDINATOR_NOT_AVAILABLE. Topics are never auto-created: an unknown
//! topic is UNKNOWN_TOPIC_OR_PARTITION.
//!
//! Topic ids (Metadata v10+): every topic has the id [`cluster::topic_id`] derives from its
//! name, the same on every node and across restarts (topics are static), and every topic a
//! v10+ response names carries it. What a request may ask, as Kafka's `KafkaApis` decides it:
//! - v0-9: topics by name only; a null name is asked as the empty name (as before topic ids).
//! - v10-11: by name only. A request topic with a null name or a non-zero id is refused as
//!   Kafka refuses it: the whole request fails, every topic it names answered INVALID_REQUEST
//!   (a null name as the empty one, its id echoed) with no brokers, as Kafka's error response.
//! - v12: by id, as librdkafka's KIP-848 consumer asks for the topics of its assignment. If any
//!   request topic has a non-zero id, the request is by id: each distinct id is answered once,
//!   with its topic's name, or, unknown, UNKNOWN_TOPIC_ID with a null name and the id echoed;
//!   request topics without an id are left out (names are not looked at), as in Kafka. Without
//!   any id, the request is by name, and a null name (a topic named by neither) fails the whole
//!   request with INVALID_REQUEST, as for v10-11 (Kafka itself fails it on the null name).
//!
//! Topic authorized operations stay unset (`i32::MIN`): there are no ACLs.

use cluster::{Node, Topic, Topology};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, MetadataRequest, MetadataResponse, TopicName,
};

use crate::{host_port, str_bytes};

/// DescribeCluster (0-1): the brokers Metadata lists, this node as the controller (every node
/// answers the controller's APIs), no authorized operations (there are no ACLs). v1's
/// `endpoint_type` 2 (the controllers' own endpoints, KIP-919) is UNSUPPORTED_ENDPOINT_TYPE, as a
/// Kafka broker answers it: the controllers here are the brokers.
pub fn describe_cluster(
    topology: &Topology,
    node_id: i32,
    request: &DescribeClusterRequest,
) -> DescribeClusterResponse {
    let mut response = DescribeClusterResponse::default();
    response.endpoint_type = request.endpoint_type;
    response.cluster_authorized_operations = i32::MIN;
    if request.endpoint_type != 1 {
        response.error_code = ResponseError::UnsupportedEndpointType.code();
        response.error_message = Some(str_bytes("only broker endpoints (type 1) are served"));
        return response;
    }
    response.cluster_id = str_bytes(CLUSTER_ID);
    response.controller_id = BrokerId(node_id);
    response.brokers = brokers(topology)
        .map(|(id, host, port)| {
            let mut b = DescribeClusterBroker::default();
            b.broker_id = BrokerId(id);
            b.host = str_bytes(host);
            b.port = port;
            b
        })
        .collect();
    response
}

/// Every node with a usable Kafka address: (node id, host, port), as Metadata and
/// DescribeCluster list the brokers.
fn brokers(topology: &Topology) -> impl Iterator<Item = (i32, String, i32)> + '_ {
    all_nodes(topology).filter_map(|n| {
        let (host, port) = host_port(n.kafka_address.as_deref()?)?;
        Some((n.id, host, port))
    })
}

/// The cluster id every node reports.
pub const CLUSTER_ID: &str = "mini-broker";

/// Kafka's FindCoordinator key types.
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

fn all_nodes(topology: &Topology) -> impl Iterator<Item = &Node> {
    topology.coordinators.iter().chain(&topology.leaders)
}

fn has_kafka(topology: &Topology, id: i32) -> bool {
    all_nodes(topology)
        .any(|n| n.id == id && n.kafka_address.as_deref().and_then(host_port).is_some())
}

/// What a Metadata request asks for.
#[derive(Debug, PartialEq)]
enum Asked {
    /// Every topic.
    All,
    /// These topics, by name, in the request's order (a name asked twice is answered twice).
    Names(Vec<String>),
    /// These topic ids (v12), distinct, in the request's order.
    Ids(Vec<uuid::Uuid>),
}

/// What `request` at `version` asks for, or `None` for a request Kafka refuses as a whole (the
/// module doc says the rules).
fn asked(request: &MetadataRequest, version: i16) -> Option<Asked> {
    let topics = match &request.topics {
        // v0: an empty list means every topic; v1+: null means every topic.
        Some(topics) if !(version == 0 && topics.is_empty()) => topics,
        _ => return Some(Asked::All),
    };
    let name = |t: &MetadataRequestTopic| t.name.as_ref().map(|n| n.0.to_string());
    if version < 10 {
        return Some(Asked::Names(
            topics.iter().map(|t| name(t).unwrap_or_default()).collect(),
        ));
    }
    let has_id = |t: &&MetadataRequestTopic| !t.topic_id.is_nil();
    if version >= 12 && topics.iter().any(|t| has_id(&t)) {
        let mut ids: Vec<uuid::Uuid> = Vec::new();
        for t in topics.iter().filter(has_id) {
            if !ids.contains(&t.topic_id) {
                ids.push(t.topic_id);
            }
        }
        return Some(Asked::Ids(ids));
    }
    // By name: v10-11 carry no ids, and no version a null name.
    if topics.iter().any(|t| has_id(&t) || t.name.is_none()) {
        return None;
    }
    Some(Asked::Names(topics.iter().filter_map(name).collect()))
}

/// A topic's partitions as the topology places them.
fn partitions(topology: &Topology, topic: &Topic) -> Vec<MetadataResponsePartition> {
    topic
        .leaders
        .iter()
        .enumerate()
        .map(|(index, &leader)| {
            let mut p = MetadataResponsePartition::default();
            p.partition_index = index as i32;
            p.leader_epoch = 0;
            if has_kafka(topology, leader) {
                p.leader_id = BrokerId(leader);
                p.replica_nodes = vec![BrokerId(leader)];
                p.isr_nodes = vec![BrokerId(leader)];
            } else {
                p.error_code = ResponseError::LeaderNotAvailable.code();
                p.leader_id = BrokerId(-1);
            }
            p
        })
        .collect()
}

/// The answer for one topic of the topology: its partitions, and from v10 its id.
fn known_topic(topology: &Topology, topic: &Topic, version: i16) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(TopicName(str_bytes(topic.name.clone())));
    if version >= 10 {
        t.topic_id = uuid::Uuid::from_bytes(cluster::topic_id(&topic.name));
    }
    t.partitions = partitions(topology, topic);
    t.topic_authorized_operations = i32::MIN;
    t
}

/// An answer with no partitions: `error` for the topic named `name` (or null) with id `id`.
fn failed_topic(error: ResponseError, name: Option<&str>, id: uuid::Uuid) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.error_code = error.code();
    t.name = name.map(|n| TopicName(str_bytes(n)));
    t.topic_id = id;
    t.topic_authorized_operations = i32::MIN;
    t
}

/// The Metadata response for `request` at `version`, as node `node_id` answers it.
pub fn metadata(
    topology: &Topology,
    node_id: i32,
    request: &MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let mut response = MetadataResponse::default();
    response.cluster_authorized_operations = i32::MIN;
    let Some(asked) = asked(request, version) else {
        // Kafka's error response for a refused Metadata request: every topic asked, no brokers.
        response.topics = request
            .topics
            .iter()
            .flatten()
            .map(|t| {
                let name = t.name.as_ref().map_or("", |n| n.0.as_str());
                failed_topic(ResponseError::InvalidRequest, Some(name), t.topic_id)
            })
            .collect();
        return response;
    };
    response.brokers = brokers(topology)
        .map(|(id, host, port)| {
            let mut b = MetadataResponseBroker::default();
            b.node_id = BrokerId(id);
            b.host = str_bytes(host);
            b.port = port;
            b
        })
        .collect();
    response.cluster_id = Some(str_bytes(CLUSTER_ID));
    response.controller_id = BrokerId(node_id);
    response.topics = match asked {
        Asked::All => topology
            .topics
            .iter()
            .map(|topic| known_topic(topology, topic, version))
            .collect(),
        Asked::Names(names) => names
            .iter()
            .map(|name| match topology.topic(name) {
                Some(topic) => known_topic(topology, topic, version),
                None => failed_topic(
                    ResponseError::UnknownTopicOrPartition,
                    Some(name),
                    uuid::Uuid::nil(),
                ),
            })
            .collect(),
        Asked::Ids(ids) => ids
            .into_iter()
            .map(|id| match topology.topic_by_id(id.as_bytes()) {
                Some(topic) => known_topic(topology, topic, version),
                None => failed_topic(ResponseError::UnknownTopicId, None, id),
            })
            .collect(),
    };
    response
}

/// One key's coordinator: (node id, host, port) or the Kafka error.
fn coordinator_of(
    topology: &Topology,
    key: &str,
    key_type: i8,
) -> Result<(i32, String, i32), (ResponseError, String)> {
    if key_type != KEY_TYPE_GROUP && key_type != KEY_TYPE_TRANSACTION {
        return Err((
            ResponseError::InvalidRequest,
            format!("key type {key_type} is not GROUP or TRANSACTION"),
        ));
    }
    if key.is_empty() || key.len() > cluster::MAX_ID_LEN {
        return Err((
            ResponseError::InvalidRequest,
            format!("key must be 1..={} bytes", cluster::MAX_ID_LEN),
        ));
    }
    let node = topology.coordinator_for(key);
    match node.kafka_address.as_deref().and_then(host_port) {
        Some((host, port)) => Ok((node.id, host, port)),
        None => Err((
            ResponseError::CoordinatorNotAvailable,
            format!("coordinator {} has no Kafka listener", node.id),
        )),
    }
}

/// The FindCoordinator response: one key (versions 0-3) or a batch of keys (4+).
pub fn find_coordinator(
    topology: &Topology,
    request: &FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let mut response = FindCoordinatorResponse::default();
    if version >= 4 {
        response.coordinators = request
            .coordinator_keys
            .iter()
            .map(|key| {
                let mut c = Coordinator::default();
                c.key = key.clone();
                match coordinator_of(topology, key, request.key_type) {
                    Ok((id, host, port)) => {
                        c.node_id = BrokerId(id);
                        c.host = str_bytes(host);
                        c.port = port;
                    }
                    Err((e, message)) => {
                        c.node_id = BrokerId(-1);
                        c.port = -1;
                        c.error_code = e.code();
                        c.error_message = Some(str_bytes(message));
                    }
                }
                c
            })
            .collect();
    } else {
        match coordinator_of(topology, &request.key, request.key_type) {
            Ok((id, host, port)) => {
                response.node_id = BrokerId(id);
                response.host = str_bytes(host);
                response.port = port;
            }
            Err((e, message)) => {
                response.node_id = BrokerId(-1);
                response.port = -1;
                response.error_code = e.code();
                response.error_message = Some(str_bytes(message));
            }
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology() -> Topology {
        Topology::parse(
            r#"
            transaction_state_partitions = 4
            [[coordinators]]
            id = 1
            address = "127.0.0.1:1"
            kafka_address = "127.0.0.1:9001"
            [[leaders]]
            id = 101
            address = "127.0.0.1:2"
            kafka_address = "127.0.0.1:9101"
            [[leaders]]
            id = 102
            address = "127.0.0.1:3"
            [[topics]]
            name = "t"
            leaders = [101, 102]
            "#,
        )
        .unwrap()
    }

    #[test]
    fn describe_cluster_lists_the_brokers_with_this_node_as_controller() {
        let t = topology();
        let response = describe_cluster(&t, 101, &DescribeClusterRequest::default());
        assert_eq!(response.error_code, 0);
        assert_eq!(response.controller_id, BrokerId(101));
        assert_eq!(response.cluster_id.as_str(), CLUSTER_ID);
        let brokers: Vec<(i32, i32)> = response
            .brokers
            .iter()
            .map(|b| (b.broker_id.0, b.port))
            .collect();
        assert_eq!(brokers, [(1, 9001), (101, 9101)]);
        let mut controllers = DescribeClusterRequest::default();
        controllers.endpoint_type = 2;
        let response = describe_cluster(&t, 101, &controllers);
        assert_eq!(
            response.error_code,
            ResponseError::UnsupportedEndpointType.code()
        );
        assert!(response.brokers.is_empty());
    }

    #[test]
    fn metadata_lists_kafka_brokers_and_topology_leaders() {
        let t = topology();
        let mut request = MetadataRequest::default();
        request.topics = None; // every topic
        let response = metadata(&t, 1, &request, 9);
        assert_eq!(response.brokers.len(), 2);
        assert_eq!(response.topics.len(), 1);
        let parts = &response.topics[0].partitions;
        assert_eq!(parts[0].leader_id, BrokerId(101));
        assert_eq!(parts[0].error_code, 0);
        assert_eq!(
            parts[1].error_code,
            ResponseError::LeaderNotAvailable.code()
        );

        let mut topic = MetadataRequestTopic::default();
        topic.name = Some(TopicName(str_bytes("missing")));
        request.topics = Some(vec![topic]);
        let response = metadata(&t, 1, &request, 9);
        assert_eq!(
            response.topics[0].error_code,
            ResponseError::UnknownTopicOrPartition.code()
        );
        request.topics = Some(vec![]);
        assert!(metadata(&t, 1, &request, 1).topics.is_empty());
        assert_eq!(metadata(&t, 1, &request, 0).topics.len(), 1);
    }

    fn by_name(name: &str) -> MetadataRequestTopic {
        let mut topic = MetadataRequestTopic::default();
        topic.name = Some(TopicName(str_bytes(name)));
        topic
    }

    fn by_id(id: uuid::Uuid) -> MetadataRequestTopic {
        let mut topic = MetadataRequestTopic::default();
        topic.topic_id = id;
        topic.name = None;
        topic
    }

    fn request(topics: Option<Vec<MetadataRequestTopic>>) -> MetadataRequest {
        let mut request = MetadataRequest::default();
        request.topics = topics;
        request
    }

    /// The response, checked to encode at `version`.
    fn answer(t: &Topology, request: &MetadataRequest, version: i16) -> MetadataResponse {
        let response = metadata(t, 1, request, version);
        let mut buf = bytes::BytesMut::new();
        kafka_protocol::protocol::Encodable::encode(&response, &mut buf, version)
            .unwrap_or_else(|e| panic!("v{version} encodes: {e}"));
        response
    }

    fn id_of(t: &Topology, name: &str) -> uuid::Uuid {
        uuid::Uuid::from_bytes(t.topic_id(name).unwrap())
    }

    fn name_of(topic: &MetadataResponseTopic) -> Option<&str> {
        topic.name.as_ref().map(|n| n.0.as_str())
    }

    #[test]
    fn metadata_v10_to_12_for_every_topic_carries_topic_ids() {
        let t = topology();
        let id = id_of(&t, "t");
        assert!(!id.is_nil());
        for version in 10..=12 {
            let response = answer(&t, &request(None), version);
            assert_eq!(response.topics.len(), 1);
            let topic = &response.topics[0];
            assert_eq!(
                (name_of(topic), topic.topic_id),
                (Some("t"), id),
                "v{version}"
            );
            assert_eq!((topic.error_code, topic.partitions.len()), (0, 2));
            assert_eq!(topic.topic_authorized_operations, i32::MIN);
        }
    }

    #[test]
    fn metadata_v10_to_12_by_name_carries_the_topic_id() {
        let t = topology();
        for version in 10..=12 {
            let asked = request(Some(vec![by_name("t"), by_name("missing")]));
            let topics = answer(&t, &asked, version).topics;
            assert_eq!(
                (topics[0].topic_id, topics[0].error_code),
                (id_of(&t, "t"), 0)
            );
            assert_eq!(topics[0].partitions.len(), 2);
            assert_eq!(name_of(&topics[1]), Some("missing"));
            assert_eq!(
                (topics[1].topic_id, topics[1].error_code),
                (
                    uuid::Uuid::nil(),
                    ResponseError::UnknownTopicOrPartition.code()
                )
            );
        }
    }

    #[test]
    fn metadata_v12_by_id_answers_with_the_name() {
        let t = topology();
        let id = id_of(&t, "t");
        // Asked twice, and with a topic named only: the request is by id, each id once.
        let asked = request(Some(vec![by_id(id), by_name("t"), by_id(id)]));
        let response = answer(&t, &asked, 12);
        assert_eq!(response.brokers.len(), 2);
        assert_eq!(response.topics.len(), 1);
        let topic = &response.topics[0];
        assert_eq!((name_of(topic), topic.topic_id), (Some("t"), id));
        assert_eq!((topic.error_code, topic.partitions.len()), (0, 2));
        // A name given along with the id changes nothing.
        let mut named = by_id(id);
        named.name = Some(TopicName(str_bytes("other")));
        let topics = answer(&t, &request(Some(vec![named])), 12).topics;
        assert_eq!((name_of(&topics[0]), topics[0].error_code), (Some("t"), 0));
    }

    #[test]
    fn metadata_v12_unknown_id_is_unknown_topic_id_with_a_null_name() {
        let t = topology();
        let unknown = uuid::Uuid::from_bytes([7; 16]);
        let asked = request(Some(vec![by_id(unknown), by_id(id_of(&t, "t"))]));
        let topics = answer(&t, &asked, 12).topics;
        assert_eq!(topics.len(), 2);
        assert_eq!(topics[0].error_code, ResponseError::UnknownTopicId.code());
        assert_eq!((name_of(&topics[0]), topics[0].topic_id), (None, unknown));
        assert!(topics[0].partitions.is_empty());
        assert_eq!((name_of(&topics[1]), topics[1].error_code), (Some("t"), 0));
    }

    #[test]
    fn metadata_topics_named_by_neither_or_by_id_before_v12_are_invalid_requests() {
        let t = topology();
        let id = id_of(&t, "t");
        // v10-11 take no ids and no null names; v12 no null name unless the request is by id.
        for (version, topics) in [
            (10, vec![by_name("t"), by_id(uuid::Uuid::nil())]),
            (11, vec![by_name("t"), by_id(id)]),
            (12, vec![by_name("t"), by_id(uuid::Uuid::nil())]),
        ] {
            let response = answer(&t, &request(Some(topics)), version);
            assert!(response.brokers.is_empty(), "v{version}");
            let answered: Vec<_> = response
                .topics
                .iter()
                .map(|t| (name_of(t), t.error_code, t.partitions.len()))
                .collect();
            let invalid = ResponseError::InvalidRequest.code();
            assert_eq!(answered, [(Some("t"), invalid, 0), (Some(""), invalid, 0)]);
            assert_eq!(
                response.topics[1].topic_id,
                if version == 11 { id } else { uuid::Uuid::nil() }
            );
        }
        // By id, a topic named by neither is left out.
        let asked = request(Some(vec![by_id(uuid::Uuid::nil()), by_id(id)]));
        let topics = answer(&t, &asked, 12).topics;
        assert_eq!(topics.len(), 1);
        assert_eq!((name_of(&topics[0]), topics[0].error_code), (Some("t"), 0));
    }

    #[test]
    fn metadata_v9_and_before_is_unchanged_by_topic_ids() {
        let t = topology();
        // A null name is asked as the empty name; a name asked twice is answered twice.
        let mut null_name = by_name("t");
        null_name.name = None;
        let asked = request(Some(vec![by_name("t"), null_name, by_name("t")]));
        for version in 1..=9 {
            let response = answer(&t, &asked, version);
            assert_eq!(response.brokers.len(), 2);
            let answered: Vec<_> = response
                .topics
                .iter()
                .map(|t| (name_of(t), t.error_code, t.partitions.len(), t.topic_id))
                .collect();
            let nil = uuid::Uuid::nil();
            let unknown = ResponseError::UnknownTopicOrPartition.code();
            assert_eq!(
                answered,
                [
                    (Some("t"), 0, 2, nil),
                    (Some(""), unknown, 0, nil),
                    (Some("t"), 0, 2, nil)
                ],
                "v{version}"
            );
            assert!(answer(&t, &request(None), version).topics[0]
                .topic_id
                .is_nil());
        }
    }

    #[test]
    fn find_coordinator_single_and_batched() {
        let t = topology();
        let mut request = FindCoordinatorRequest::default();
        request.key = str_bytes("txn-a");
        request.key_type = KEY_TYPE_TRANSACTION;
        let r = find_coordinator(&t, &request, 3);
        assert_eq!((r.error_code, r.node_id, r.port), (0, BrokerId(1), 9001));

        request.coordinator_keys = vec![str_bytes("g"), str_bytes("")];
        request.key_type = KEY_TYPE_GROUP;
        let r = find_coordinator(&t, &request, 4);
        assert_eq!(r.coordinators.len(), 2);
        assert_eq!(r.coordinators[0].port, 9001);
        assert_eq!(
            r.coordinators[1].error_code,
            ResponseError::InvalidRequest.code()
        );

        request.key_type = 7;
        request.key = str_bytes("x");
        assert_eq!(
            find_coordinator(&t, &request, 1).error_code,
            ResponseError::InvalidRequest.code()
        );
    }
}
