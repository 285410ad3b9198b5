//! DescribeConfigs (v1-4), answered by every node: a topic's configuration, and this node's
//! own settings as a broker. Read-only: AlterConfigs and IncrementalAlterConfigs are not
//! served, so every entry is `read_only`.
//!
//! - **TOPIC**: no topic has settings of its own here, so every topic reports the same entries
//!   ([`topic_configs`]): Kafka's defaults (source DEFAULT_CONFIG) where mini-broker behaves as
//!   Kafka does, and where it does not, the value that says what it does, set by the broker
//!   (STATIC_BROKER_CONFIG): no retention, `retention.ms` -1. An unknown topic is
//!   UNKNOWN_TOPIC_OR_PARTITION.
//! - **BROKER**: the resource named by this node's id gets the settings every node has
//!   (`broker.id`, `advertised.listeners`, the transaction state partitions, the node's role)
//!   and its role's ([`crate::Handler::broker_configs`]), with source STATIC_BROKER_CONFIG (set
//!   when the node started). Kafka's clients send a broker's resource to that broker; another
//!   id is INVALID_REQUEST, as in Kafka. The empty name (cluster-wide dynamic defaults) has no
//!   entries: there are no dynamic configs.
//! - Any other resource type is INVALID_REQUEST.
//!
//! `configuration_keys` keeps only the named entries (an unknown name is left out; null or
//! an empty list means all, as in Kafka); `include_synonyms` adds each entry's own source as its one synonym.

use cluster::Topology;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};

use crate::str_bytes;

/// Kafka's resource type of a topic.
pub const RESOURCE_TOPIC: i8 = 2;
/// Kafka's resource type of a broker.
pub const RESOURCE_BROKER: i8 = 4;
/// Where a config's value comes from, as Kafka's DescribeConfigs says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// Set when the node started (Kafka's STATIC_BROKER_CONFIG).
    StaticBroker = 4,
    /// Kafka's default value (DEFAULT_CONFIG).
    Default = 5,
}

/// Kafka's type of a config value, as DescribeConfigs v3+ reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigType {
    /// `true` / `false`.
    Boolean = 1,
    /// Text.
    String = 2,
    /// A 32-bit integer.
    Int = 3,
    /// A 64-bit integer.
    Long = 5,
    /// A comma-separated list.
    List = 7,
}

/// One config entry: its name, value, type and source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEntry {
    /// Kafka's name of the setting.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// Its type.
    pub kind: ConfigType,
    /// Where the value comes from.
    pub source: ConfigSource,
}

impl ConfigEntry {
    /// An entry set when the node started.
    pub fn new(name: &'static str, value: impl ToString, kind: ConfigType) -> Self {
        Self {
            name,
            value: value.to_string(),
            kind,
            source: ConfigSource::StaticBroker,
        }
    }

    /// The same entry, whose value is Kafka's default.
    pub fn kafka_default(mut self) -> Self {
        self.source = ConfigSource::Default;
        self
    }
}

/// What every topic reports: Kafka's defaults, except `retention.ms` (no retention here: -1,
/// where Kafka keeps 7 days), which the broker sets.
pub fn topic_configs() -> Vec<ConfigEntry> {
    use ConfigType::*;
    vec![
        ConfigEntry::new("cleanup.policy", "delete", List).kafka_default(),
        ConfigEntry::new("compression.type", "producer", String).kafka_default(),
        ConfigEntry::new("message.timestamp.type", "CreateTime", String).kafka_default(),
        ConfigEntry::new("min.insync.replicas", 1, Int).kafka_default(),
        ConfigEntry::new("retention.bytes", -1, Long).kafka_default(),
        ConfigEntry::new("retention.ms", -1, Long),
        ConfigEntry::new("unclean.leader.election.enable", false, Boolean).kafka_default(),
    ]
}

/// What every node reports of itself, whatever its role.
fn node_configs(topology: &Topology, node_id: i32) -> Vec<ConfigEntry> {
    use ConfigType::*;
    let node = topology
        .coordinators
        .iter()
        .map(|n| (n, "coordinator"))
        .chain(topology.leaders.iter().map(|n| (n, "leader")))
        .find(|(n, _)| n.id == node_id);
    let mut out = vec![
        ConfigEntry::new("broker.id", node_id, Int),
        ConfigEntry::new(
            "transaction.state.log.num.partitions",
            topology.transaction_state_partitions,
            Int,
        ),
    ];
    if let Some((node, role)) = node {
        if let Some(kafka) = &node.kafka_address {
            out.push(ConfigEntry::new(
                "advertised.listeners",
                format!("PLAINTEXT://{kafka}"),
                List,
            ));
        }
        out.push(ConfigEntry::new("minibroker.role", role, String));
    }
    out
}

/// The DescribeConfigs response of node `node_id`, whose role reports `role_configs`.
pub fn describe_configs(
    topology: &Topology,
    node_id: i32,
    role_configs: &[ConfigEntry],
    request: &DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let mut response = DescribeConfigsResponse::default();
    for resource in &request.resources {
        let name = resource.resource_name.to_string();
        let mut result = DescribeConfigsResult::default();
        result.resource_type = resource.resource_type;
        result.resource_name = resource.resource_name.clone();
        let entries = match resource.resource_type {
            RESOURCE_TOPIC if topology.topic(&name).is_some() => Ok(topic_configs()),
            RESOURCE_TOPIC => Err((
                ResponseError::UnknownTopicOrPartition,
                format!("topic {name:?} does not exist"),
            )),
            RESOURCE_BROKER if name.is_empty() => Ok(Vec::new()),
            RESOURCE_BROKER => match name.parse::<i32>() {
                Ok(id) if id == node_id => {
                    let mut all = node_configs(topology, node_id);
                    all.extend(role_configs.iter().cloned());
                    Ok(all)
                }
                Ok(id) => Err((
                    ResponseError::InvalidRequest,
                    format!("this is broker {node_id}; ask broker {id} for its configs"),
                )),
                Err(_) => Err((
                    ResponseError::InvalidRequest,
                    format!("broker {name:?}: a broker is named by its id"),
                )),
            },
            other => Err((
                ResponseError::InvalidRequest,
                format!("resource type {other} is not supported (only TOPIC and BROKER)"),
            )),
        };
        match entries {
            Err((error, message)) => {
                result.error_code = error.code();
                result.error_message = Some(str_bytes(message));
            }
            Ok(entries) => {
                result.configs = entries
                    .into_iter()
                    .filter(|e| {
                        resource
                            .configuration_keys
                            .as_ref()
                            .filter(|keys| !keys.is_empty())
                            .is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name))
                    })
                    .map(|e| entry(e, request.include_synonyms, version))
                    .collect();
            }
        }
        response.results.push(result);
    }
    response
}

fn entry(e: ConfigEntry, include_synonyms: bool, version: i16) -> DescribeConfigsResourceResult {
    let source = e.source as i8;
    let mut out = DescribeConfigsResourceResult::default();
    out.name = str_bytes(e.name);
    out.value = Some(str_bytes(e.value.clone()));
    out.read_only = true;
    out.config_source = source;
    if include_synonyms {
        let mut synonym = DescribeConfigsSynonym::default();
        synonym.name = str_bytes(e.name);
        synonym.value = Some(str_bytes(e.value));
        synonym.source = source;
        out.synonyms = vec![synonym];
    }
    if version >= 3 {
        out.config_type = e.kind as i8;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::protocol::Encodable;

    fn topology() -> Topology {
        Topology::parse(
            "transaction_state_partitions = 8\n\
             [[coordinators]]\nid = 1\naddress = \"127.0.0.1:1\"\nkafka_address = \"c1:9092\"\n\
             [[leaders]]\nid = 101\naddress = \"127.0.0.1:2\"\n\
             [[topics]]\nname = \"input\"\nleaders = [101]\n",
        )
        .unwrap()
    }

    fn resource(kind: i8, name: &str, keys: Option<&[&str]>) -> DescribeConfigsResource {
        let mut r = DescribeConfigsResource::default();
        r.resource_type = kind;
        r.resource_name = str_bytes(name);
        r.configuration_keys = keys.map(|k| k.iter().map(|k| str_bytes(*k)).collect());
        r
    }

    fn ask(resources: Vec<DescribeConfigsResource>, version: i16) -> DescribeConfigsResponse {
        let mut request = DescribeConfigsRequest::default();
        request.resources = resources;
        request.include_synonyms = true;
        let role = [ConfigEntry::new(
            "transaction.max.timeout.ms",
            900_000,
            ConfigType::Int,
        )];
        let response = describe_configs(&topology(), 1, &role, &request, version);
        let mut buf = bytes::BytesMut::new();
        response.encode(&mut buf, version).unwrap();
        response
    }

    fn values(result: &DescribeConfigsResult) -> Vec<(String, String)> {
        result
            .configs
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    c.value.as_deref().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn topics_report_the_shared_defaults_and_unknown_ones_an_error() {
        let r = ask(
            vec![
                resource(RESOURCE_TOPIC, "input", None),
                resource(RESOURCE_TOPIC, "nope", None),
            ],
            4,
        );
        assert_eq!(r.results[0].error_code, 0);
        let input = values(&r.results[0]);
        assert!(
            input.contains(&("retention.ms".into(), "-1".into())),
            "{input:?}"
        );
        assert!(input.contains(&("cleanup.policy".into(), "delete".into())));
        let first = &r.results[0].configs[0];
        assert!(first.read_only);
        assert_eq!(first.config_source, ConfigSource::Default as i8);
        let retention = r.results[0]
            .configs
            .iter()
            .find(|c| c.name.as_str() == "retention.ms");
        assert_eq!(
            retention.unwrap().config_source,
            ConfigSource::StaticBroker as i8,
            "not Kafka's default"
        );
        assert_eq!(first.config_type, ConfigType::List as i8);
        assert_eq!(first.synonyms.len(), 1);
        assert_eq!(
            r.results[1].error_code,
            ResponseError::UnknownTopicOrPartition.code()
        );
        assert!(r.results[1].configs.is_empty());
    }

    #[test]
    fn a_node_describes_itself_and_refuses_other_brokers_and_types() {
        let r = ask(
            vec![
                resource(RESOURCE_BROKER, "1", None),
                resource(RESOURCE_BROKER, "101", None),
                resource(RESOURCE_BROKER, "one", None),
                resource(RESOURCE_BROKER, "", None),
                resource(8, "1", None),
            ],
            1,
        );
        let own = values(&r.results[0]);
        for expected in [
            ("broker.id", "1"),
            ("advertised.listeners", "PLAINTEXT://c1:9092"),
            ("transaction.state.log.num.partitions", "8"),
            ("minibroker.role", "coordinator"),
            ("transaction.max.timeout.ms", "900000"),
        ] {
            assert!(
                own.contains(&(expected.0.into(), expected.1.into())),
                "{expected:?} in {own:?}"
            );
        }
        assert_eq!(
            r.results[0].configs[0].config_source,
            ConfigSource::StaticBroker as i8
        );
        // v1-2 carry no type.
        assert_eq!(r.results[0].configs[0].config_type, 0);
        let invalid = ResponseError::InvalidRequest.code();
        assert_eq!(r.results[1].error_code, invalid);
        assert_eq!(r.results[2].error_code, invalid);
        assert_eq!(
            (r.results[3].error_code, r.results[3].configs.len()),
            (0, 0)
        );
        assert_eq!(r.results[4].error_code, invalid);
    }

    #[test]
    fn configuration_keys_keep_only_the_named_entries() {
        let keys: &[&str] = &["retention.ms", "no.such.key"];
        let r = ask(vec![resource(RESOURCE_TOPIC, "input", Some(keys))], 2);
        assert_eq!(
            values(&r.results[0]),
            [("retention.ms".into(), "-1".into())]
        );
        // An empty list means every entry, as null does.
        let none: &[&str] = &[];
        let r = ask(vec![resource(RESOURCE_BROKER, "1", Some(none))], 2);
        assert_eq!(r.results[0].configs.len(), 5);
    }
}
