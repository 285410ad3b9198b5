//! The static cluster topology that every node and the client tooling read from one TOML file.
//!
//! ```toml
//! transaction_state_partitions = 8
//!
//! [[coordinators]]
//! id = 1
//! address = "127.0.0.1:9101"
//! # optional: the node's Kafka listener as Kafka clients reach it
//! kafka_address = "127.0.0.1:9092"
//!
//! [[leaders]]
//! id = 101
//! address = "127.0.0.1:9201"
//!
//! [[topics]]
//! name = "orders"
//! # partition i is led by leaders[i]
//! leaders = [101, 101, 101]
//! ```
//!
//! Routing (PROTOCOL.md section 1): a transactional id (or group id) maps to the state partition
//! `java_hash(id) & 0x7fffffff mod P`, exactly as Kafka's `partitionFor`, and state partition `p`
//! is owned by the coordinator at index `p mod C` of the coordinators sorted by id. Both are pure
//! functions of the file, so every node agrees without talking.
//!
//! CAVEATS: the topology is static. There is no reassignment of state partitions or partition
//! leadership; a restarted node comes back at the same address with the same data directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A node's id (coordinators and leaders share one id space).
pub type NodeId = i32;

/// Longest topic name accepted in a topology file (Kafka's limit).
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// A node with the address other nodes and clients reach it at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Unique node id.
    pub id: NodeId,
    /// `host:port` that others dial.
    pub address: String,
    /// `host:port` of the node's Kafka listener as clients reach it (advertised in Kafka's
    /// Metadata and FindCoordinator), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_address: Option<String>,
}

/// A topic and, per partition index, the id of the leader that owns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    /// Topic name.
    pub name: String,
    /// `leaders[i]` is the node id of partition `i`'s leader.
    pub leaders: Vec<NodeId>,
}

/// The whole cluster shape, as parsed and validated from the topology file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Number of `__transaction_state` partitions (P).
    pub transaction_state_partitions: i32,
    /// Transaction (and group) coordinators.
    pub coordinators: Vec<Node>,
    /// Partition leaders.
    #[serde(default)]
    pub leaders: Vec<Node>,
    /// Topics and their partition leadership.
    #[serde(default)]
    pub topics: Vec<Topic>,
}

/// Why a topology file was rejected. Each message names the problem.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The file could not be read.
    #[error("cannot read topology file {path}: {source}")]
    Io {
        /// The path that was read.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("topology file is not valid: {0}")]
    Parse(String),
    /// The file parsed but describes an impossible cluster.
    #[error("invalid topology: {0}")]
    Invalid(String),
}

impl Topology {
    /// Reads, parses and validates a topology file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TopologyError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and validates topology TOML.
    pub fn parse(text: &str) -> Result<Self, TopologyError> {
        let topology: Topology =
            toml::from_str(text).map_err(|e| TopologyError::Parse(e.to_string()))?;
        topology.validate()?;
        Ok(topology)
    }

    /// Renders the topology as TOML (what [`Topology::parse`] reads back).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a topology always serialises")
    }

    /// Checks every structural rule; the error names the first problem found.
    pub fn validate(&self) -> Result<(), TopologyError> {
        let invalid = |m: String| Err(TopologyError::Invalid(m));
        if self.transaction_state_partitions <= 0 {
            return invalid(format!(
                "transaction_state_partitions must be positive, got {}",
                self.transaction_state_partitions
            ));
        }
        if self.coordinators.is_empty() {
            return invalid("at least one coordinator is required".into());
        }
        let mut ids = BTreeSet::new();
        for node in self.coordinators.iter().chain(&self.leaders) {
            if !ids.insert(node.id) {
                return invalid(format!("node id {} is used twice", node.id));
            }
            if node.address.trim().is_empty() {
                return invalid(format!("node {} has an empty address", node.id));
            }
            if let Some(kafka) = &node.kafka_address {
                if kafka
                    .rsplit_once(':')
                    .is_none_or(|(_, port)| port.parse::<u16>().is_err())
                {
                    return invalid(format!(
                        "node {} has kafka_address {kafka:?}, which is not host:port",
                        node.id
                    ));
                }
            }
        }
        let leader_ids: BTreeSet<NodeId> = self.leaders.iter().map(|n| n.id).collect();
        let mut names = BTreeSet::new();
        for topic in &self.topics {
            if topic.name.is_empty() || topic.name.len() > MAX_TOPIC_NAME_LEN {
                return invalid(format!(
                    "topic name {:?} must be 1..={MAX_TOPIC_NAME_LEN} bytes",
                    topic.name
                ));
            }
            if !names.insert(topic.name.as_str()) {
                return invalid(format!("topic {} is declared twice", topic.name));
            }
            if topic.leaders.is_empty() {
                return invalid(format!("topic {} has no partitions", topic.name));
            }
            for (partition, leader) in topic.leaders.iter().enumerate() {
                if !leader_ids.contains(leader) {
                    return invalid(format!(
                        "topic {} partition {partition} names leader {leader}, which is not in [[leaders]]",
                        topic.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// Coordinators sorted by id: the order state partitions are dealt out in.
    fn sorted_coordinators(&self) -> Vec<&Node> {
        let mut nodes: Vec<&Node> = self.coordinators.iter().collect();
        nodes.sort_by_key(|n| n.id);
        nodes
    }

    /// The `__transaction_state` partition a transactional id or group id maps to.
    pub fn state_partition(&self, key: &str) -> i32 {
        state_partition_for(key, self.transaction_state_partitions)
    }

    /// The coordinator that owns state partition `partition`.
    pub fn coordinator_for_partition(&self, partition: i32) -> &Node {
        let nodes = self.sorted_coordinators();
        let index = partition.rem_euclid(nodes.len() as i32) as usize;
        nodes[index]
    }

    /// The coordinator that owns a transactional id or group id.
    pub fn coordinator_for(&self, key: &str) -> &Node {
        self.coordinator_for_partition(self.state_partition(key))
    }

    /// The state partitions coordinator `id` owns (empty if `id` is not a coordinator).
    pub fn owned_state_partitions(&self, id: NodeId) -> BTreeSet<i32> {
        (0..self.transaction_state_partitions)
            .filter(|p| self.coordinator_for_partition(*p).id == id)
            .collect()
    }

    /// `coordinator_index(id)` is this coordinator's position among the coordinators sorted by
    /// id, and `coordinator_count()` their number: used to stride PID allocation so PIDs never
    /// collide across coordinators.
    pub fn coordinator_index(&self, id: NodeId) -> Option<usize> {
        self.sorted_coordinators().iter().position(|n| n.id == id)
    }

    /// Number of coordinators.
    pub fn coordinator_count(&self) -> usize {
        self.coordinators.len()
    }

    /// A coordinator by id.
    pub fn coordinator(&self, id: NodeId) -> Option<&Node> {
        self.coordinators.iter().find(|n| n.id == id)
    }

    /// A leader by id.
    pub fn leader(&self, id: NodeId) -> Option<&Node> {
        self.leaders.iter().find(|n| n.id == id)
    }

    /// A topic by name.
    pub fn topic(&self, name: &str) -> Option<&Topic> {
        self.topics.iter().find(|t| t.name == name)
    }

    /// The topic's id (Kafka's topic UUID), or `None` if there is no such topic: see
    /// [`topic_id`].
    pub fn topic_id(&self, name: &str) -> Option<[u8; 16]> {
        self.topic(name).map(|t| topic_id(&t.name))
    }

    /// The topic whose id is `id`.
    pub fn topic_by_id(&self, id: &[u8; 16]) -> Option<&Topic> {
        self.topics.iter().find(|t| topic_id(&t.name) == *id)
    }

    /// The leader of `topic`/`partition`, or `None` if the topic or partition does not exist.
    pub fn leader_for(&self, topic: &str, partition: i32) -> Option<&Node> {
        let topic = self.topic(topic)?;
        let leader = *topic.leaders.get(usize::try_from(partition).ok()?)?;
        self.leader(leader)
    }

    /// Whether `topic`/`partition` exists.
    pub fn partition_exists(&self, topic: &str, partition: i32) -> bool {
        self.leader_for(topic, partition).is_some()
    }

    /// Every (topic, partition) that leader `id` owns.
    pub fn partitions_led_by(&self, id: NodeId) -> Vec<(String, i32)> {
        self.topics
            .iter()
            .flat_map(|t| {
                t.leaders
                    .iter()
                    .enumerate()
                    .filter(move |(_, l)| **l == id)
                    .map(move |(p, _)| (t.name.clone(), p as i32))
            })
            .collect()
    }

    /// Partitions per topic, for display.
    pub fn partition_counts(&self) -> BTreeMap<String, usize> {
        self.topics
            .iter()
            .map(|t| (t.name.clone(), t.leaders.len()))
            .collect()
    }
}

/// Java's `String.hashCode` over UTF-16 code units: the stable hash Kafka routes by.
pub fn java_string_hash(key: &str) -> i32 {
    key.encode_utf16()
        .fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(unit as i32))
}

/// Kafka's `partitionFor`: `Utils.abs(hash) % partitions` where `Utils.abs` masks the sign bit.
pub fn state_partition_for(key: &str, partitions: i32) -> i32 {
    (java_string_hash(key) & 0x7fff_ffff) % partitions.max(1)
}

/// A topic's id: topics are static (the topology names them), so the id is derived from the
/// name, the same on every node and across restarts: the first 16 bytes of SHA-256 over a fixed
/// prefix and the name. Never one of Kafka's reserved ids (all zero; 0...01, the metadata
/// topic's), and, as Kafka's `Uuid.randomUuid` makes them, never one whose URL-safe base64
/// form starts with '-' (the first byte's top six bits not 62): such a hash is hashed again.
pub fn topic_id(name: &str) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut round = 0u32;
    loop {
        let mut hasher = Sha256::new();
        hasher.update(b"mini-broker topic id\0");
        hasher.update(round.to_be_bytes());
        hasher.update(name.as_bytes());
        let digest = hasher.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        let reserved = id[..15].iter().all(|b| *b == 0) && id[15] <= 1;
        if !reserved && id[0] >> 2 != 62 {
            return id;
        }
        round += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_are_stable_distinct_and_never_reserved() {
        let ids: Vec<[u8; 16]> = (0..2000)
            .map(|i| super::topic_id(&format!("t{i}")))
            .collect();
        let distinct: BTreeSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            assert_ne!(id[..15], [0u8; 15]);
            assert_ne!(id[0] >> 2, 62, "base64 would start with '-'");
        }
        assert_eq!(super::topic_id("input"), super::topic_id("input"));
        let t = Topology::parse(
            "transaction_state_partitions = 1\n[[coordinators]]\nid = 1\naddress = \"a:1\"\n\
             [[leaders]]\nid = 2\naddress = \"b:1\"\n[[topics]]\nname = \"input\"\nleaders = [2]\n",
        )
        .unwrap();
        let id = t.topic_id("input").unwrap();
        assert_eq!(t.topic_by_id(&id).unwrap().name, "input");
        assert_eq!(t.topic_id("nope"), None);
        assert!(t.topic_by_id(&[0; 16]).is_none());
    }

    /// The derivation is pinned: a changed prefix or hash would give every topic a new id, which
    /// clients holding the old ones (a KIP-848 assignment) would no longer resolve.
    #[test]
    fn topic_ids_are_pinned_and_a_dash_leading_hash_is_hashed_again() {
        let hex = |id: [u8; 16]| id.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(topic_id("input")), "3be0af69e11a52999b75044c8aa0c464");
        assert_eq!(hex(topic_id("output")), "9deb715576920542fef0ea506e0b9f24");
        // "t2" hashes first to f8..., whose base64 starts with '-': its id is the second round.
        assert_eq!(hex(topic_id("t2")), "b9c804574079eb60bfd2c3f7811d2243");
    }

    fn sample() -> Topology {
        Topology::parse(
            r#"
            transaction_state_partitions = 8
            [[coordinators]]
            id = 2
            address = "c2:1"
            [[coordinators]]
            id = 1
            address = "c1:1"
            [[leaders]]
            id = 101
            address = "l1:1"
            kafka_address = "l1:9092"
            [[leaders]]
            id = 102
            address = "l2:1"
            [[topics]]
            name = "orders"
            leaders = [101, 102, 101]
            "#,
        )
        .unwrap()
    }

    #[test]
    fn java_hash_matches_java() {
        // Values from java.lang.String#hashCode.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(java_string_hash("transactional-id-1"), 1_051_133_891);
    }

    #[test]
    fn state_partition_is_stable_and_in_range() {
        let t = sample();
        for key in ["", "a", "txn-a", "transactional-id-1", "ünïcødé"] {
            let p = t.state_partition(key);
            assert!((0..8).contains(&p));
            assert_eq!(p, t.state_partition(key));
        }
    }

    #[test]
    fn state_partitions_are_dealt_to_coordinators_sorted_by_id() {
        let t = sample();
        assert_eq!(t.coordinator_for_partition(0).id, 1);
        assert_eq!(t.coordinator_for_partition(1).id, 2);
        assert_eq!(
            t.owned_state_partitions(1).into_iter().collect::<Vec<_>>(),
            vec![0, 2, 4, 6]
        );
        assert!(t.owned_state_partitions(101).is_empty());
        assert_eq!(t.coordinator_index(2), Some(1));
    }

    #[test]
    fn leaders_by_partition() {
        let t = sample();
        assert_eq!(t.leader_for("orders", 1).unwrap().id, 102);
        assert!(t.leader_for("orders", 3).is_none());
        assert!(t.leader_for("orders", -1).is_none());
        assert!(t.leader_for("nope", 0).is_none());
        assert_eq!(
            t.partitions_led_by(101),
            vec![("orders".to_string(), 0), ("orders".to_string(), 2)]
        );
    }

    #[test]
    fn kafka_addresses_are_optional() {
        let t = sample();
        assert_eq!(
            t.leader(101).unwrap().kafka_address.as_deref(),
            Some("l1:9092")
        );
        assert_eq!(t.leader(102).unwrap().kafka_address, None);
        assert!(!t.to_toml().contains("l2:9092"));
    }

    #[test]
    fn round_trips_through_toml() {
        let t = sample();
        assert_eq!(Topology::parse(&t.to_toml()).unwrap(), t);
    }

    #[test]
    fn invalid_files_name_the_problem() {
        let cases = [
            ("transaction_state_partitions = 0\n[[coordinators]]\nid=1\naddress=\"a\"", "must be positive"),
            ("transaction_state_partitions = 1", "coordinators"),
            ("transaction_state_partitions = 1\ncoordinators = []", "at least one coordinator"),
            ("transaction_state_partitions = 1\n[[coordinators]]\nid=1\naddress=\"a\"\n[[leaders]]\nid=1\naddress=\"b\"", "node id 1 is used twice"),
            ("transaction_state_partitions = 1\n[[coordinators]]\nid=1\naddress=\"a\"\n[[topics]]\nname=\"t\"\nleaders=[7]", "leader 7"),
            ("transaction_state_partitions = 1\n[[coordinators]]\nid=1\naddress=\"a\"\n[[topics]]\nname=\"t\"\nleaders=[]", "no partitions"),
            ("transaction_state_partitions = 1\n[[coordinators]]\nid=1\naddress=\" \"", "empty address"),
            ("transaction_state_partitions = 1\n[[coordinators]]\nid=1\naddress=\"a:1\"\nkafka_address=\"nope\"", "not host:port"),
            ("bogus = 1", "not valid"),
            ("\u{0}\u{1}garbage", "not valid"),
        ];
        for (text, needle) in cases {
            let err = Topology::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        let err = Topology::load("/definitely/not/here.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/definitely/not/here.toml"), "{err}");
    }
}
