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
//! name, the same on every node and across restarts (topics are static). From v10 a request may
//! name a topic by id with a null name, as librdkafka's KIP-848 consumer does for the topic ids
//! of its assignment: the answer carries the name; an unknown id (the zero id included) is
//! UNKNOWN_TOPIC_ID with a null name, as in Kafka.

use cluster::{Node, Topology};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse,
    TopicName,
};

use crate::{host_port, str_bytes};

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

/// A topic a Metadata request asks for.
enum Asked {
    /// By name (every version).
    Name(String),
    /// By topic id, with a null name (v10+).
    Id(uuid::Uuid),
}

/// The Metadata response for `request` at `version`, as node `node_id` answers it.
pub fn metadata(
    topology: &Topology,
    node_id: i32,
    request: &MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let mut response = MetadataResponse::default();
    response.brokers = all_nodes(topology)
        .filter_map(|n| {
            let (host, port) = host_port(n.kafka_address.as_deref()?)?;
            let mut b = MetadataResponseBroker::default();
            b.node_id = BrokerId(n.id);
            b.host = str_bytes(host);
            b.port = port;
            Some(b)
        })
        .collect();
    response.cluster_id = Some(str_bytes(CLUSTER_ID));
    response.controller_id = BrokerId(node_id);
    // Each topic asked for, by name, or (v10+) by id with a null name; null: every topic.
    let asked: Vec<Asked> = match &request.topics {
        // v0: an empty list means every topic; v1+: null means every topic.
        Some(topics) if !(version == 0 && topics.is_empty()) => topics
            .iter()
            .map(|t| {
                let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
                // An empty name with an id counts as no name (an id is what it asks by).
                if version >= 10 && name.is_empty() && (t.name.is_none() || !t.topic_id.is_nil()) {
                    Asked::Id(t.topic_id)
                } else {
                    Asked::Name(name)
                }
            })
            .collect(),
        _ => topology
            .topics
            .iter()
            .map(|t| Asked::Name(t.name.clone()))
            .collect(),
    };
    response.topics = asked
        .into_iter()
        .map(|asked| {
            let mut t = MetadataResponseTopic::default();
            t.topic_authorized_operations = i32::MIN;
            let topic = match asked {
                Asked::Name(name) => {
                    t.name = Some(TopicName(str_bytes(name.clone())));
                    let topic = topology.topic(&name);
                    if topic.is_none() {
                        t.error_code = ResponseError::UnknownTopicOrPartition.code();
                    }
                    topic
                }
                Asked::Id(id) => {
                    t.topic_id = id;
                    let topic = topology.topic_by_id(id.as_bytes());
                    match topic {
                        Some(topic) => t.name = Some(TopicName(str_bytes(topic.name.clone()))),
                        None => {
                            t.error_code = ResponseError::UnknownTopicId.code();
                            // Nullable from v12; an empty name before.
                            t.name = (version < 12).then(|| TopicName(str_bytes("")));
                        }
                    }
                    topic
                }
            };
            if let Some(topic) = topic {
                if version >= 10 {
                    t.topic_id = uuid::Uuid::from_bytes(cluster::topic_id(&topic.name));
                }
                t.partitions = topic
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
                    .collect();
            }
            t
        })
        .collect();
    response.cluster_authorized_operations = i32::MIN;
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
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;

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

    #[test]
    fn metadata_v10_to_12_carries_topic_ids_and_answers_topics_asked_by_id() {
        let t = topology();
        let id = uuid::Uuid::from_bytes(t.topic_id("t").unwrap());
        assert!(!id.is_nil());
        let mut request = MetadataRequest::default();
        request.topics = None;
        for version in 10..=12 {
            let response = metadata(&t, 1, &request, version);
            assert_eq!(response.topics[0].topic_id, id, "v{version}");
            // Every encoding of the version works.
            let mut buf = bytes::BytesMut::new();
            kafka_protocol::protocol::Encodable::encode(&response, &mut buf, version).unwrap();
        }
        assert!(metadata(&t, 1, &request, 9).topics[0].topic_id.is_nil());
        // By id, with a null name: the name comes back.
        let mut by_id = MetadataRequestTopic::default();
        by_id.topic_id = id;
        by_id.name = None;
        let mut unknown = MetadataRequestTopic::default();
        unknown.topic_id = uuid::Uuid::from_bytes([7; 16]);
        let mut nil = MetadataRequestTopic::default();
        nil.name = None;
        let mut by_name = MetadataRequestTopic::default();
        by_name.name = Some(TopicName(str_bytes("t")));
        request.topics = Some(vec![by_id, unknown, nil, by_name]);
        let response = metadata(&t, 1, &request, 12);
        let topics = &response.topics;
        assert_eq!(topics[0].name.as_ref().unwrap().0.as_str(), "t");
        assert_eq!((topics[0].error_code, topics[0].partitions.len()), (0, 2));
        for unknown in &topics[1..3] {
            assert_eq!(unknown.error_code, ResponseError::UnknownTopicId.code());
            assert!(unknown.name.is_none() && unknown.partitions.is_empty());
        }
        assert_eq!((topics[3].topic_id, topics[3].error_code), (id, 0));
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
