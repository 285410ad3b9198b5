//! What every mini-broker node and client shares: the static cluster [`Topology`] (which
//! coordinator owns which transactional id, which leader owns which partition), the protocol's
//! identifier types and limits, and the `Cluster` gRPC service (FindCoordinator, Metadata) that
//! every node serves.
//!
//! Modules:
//! - [`topology`]: the topology file, its validation, and Kafka-compatible id routing.
//! - [`service`]: the `Cluster` gRPC service over a topology.
//! - [`node`]: node plumbing both node kinds share (clock, blocking pool, TCP_NODELAY listener,
//!   stop signal, opening and closing sled with its lock file, poison-tolerant locks).
//! - [`auth`]: cluster membership: the cluster secret, the topology fingerprint, and the MAC
//!   that every internal request (markers, verification) carries and every receiver checks.
//! - [`health`]: the standard gRPC services every node serves beside its own: health
//!   (`grpc.health.v1`) and server reflection.
//! - [`logs`]: the binaries' logging set-up (stderr, `RUST_LOG`, `--log-format text|json`).
//! - [`metrics`]: a node's Prometheus metrics and the HTTP endpoint that serves them.
//! - [`marker_fence`]: the one fencing rule for transaction markers, applied by partition
//!   leaders (WriteTxnMarkers) and group coordinators (WriteGroupOffsetMarker).
//!
//! What may go where: this crate holds what is the same on every node and has no node state.
//! A rule that two nodes apply the same way (a fencing decision) lives here as a pure function;
//! plumbing both nodes need around their cores lives in [`node`]. Protocol state machines stay
//! in their nodes' cores; the wire error table (names and classes of codes) is the `proto`
//! crate's `ErrorCode`.
//!
//! One marker walked through: a coordinator's marker writer sends WriteTxnMarkers; the leader's
//! core reads the PID's recorded epoch and generation and asks [`marker_fence::check`]; a
//! refusal comes back as INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED, an accepted
//! marker is written by the leader's shell on [`node::blocking`] and answered NONE. A group
//! marker to a group coordinator goes through the same [`marker_fence::check`].

pub mod auth;
pub mod health;
pub mod logs;
pub mod marker_fence;
pub mod metrics;
pub mod node;
pub mod power_cut;
pub mod service;
pub mod topology;

pub use service::ClusterService;
pub use topology::{state_partition_for, topic_id, Node, NodeId, Topic, Topology, TopologyError};

/// A producer id (PID), allocated by a coordinator. `-1` means none.
pub type ProducerId = i64;
/// A producer epoch; only ever grows for a PID. `-1` means none.
pub type ProducerEpoch = i16;

/// "No producer id" (Kafka's `NO_PRODUCER_ID`), on the wire and in storage.
pub const NO_PRODUCER_ID: ProducerId = -1;
/// "No epoch" (Kafka's `NO_PRODUCER_EPOCH`).
pub const NO_PRODUCER_EPOCH: ProducerEpoch = -1;

/// Longest transactional id or group id accepted anywhere (bytes).
pub const MAX_ID_LEN: usize = 255;

/// Default transaction timeout a client asks for (Kafka's `transaction.timeout.ms` default).
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: i32 = 60_000;

/// Largest transaction timeout a coordinator accepts (Kafka's `transaction.max.timeout.ms`).
pub const MAX_TRANSACTION_TIMEOUT_MS: i32 = 900_000;

/// A topic partition.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// A topic partition.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

impl From<proto::TopicPartition> for TopicPartition {
    fn from(tp: proto::TopicPartition) -> Self {
        Self::new(tp.topic, tp.partition)
    }
}

impl From<TopicPartition> for proto::TopicPartition {
    fn from(tp: TopicPartition) -> Self {
        proto::TopicPartition {
            topic: tp.topic,
            partition: tp.partition,
        }
    }
}

/// Converts a wire epoch (int32) to a [`ProducerEpoch`], or `None` if it is out of range.
/// `allow_none` accepts `-1` ("no epoch").
pub fn epoch_from_wire(epoch: i32, allow_none: bool) -> Option<ProducerEpoch> {
    match epoch {
        -1 if allow_none => Some(-1),
        0..=0x7fff => Some(epoch as ProducerEpoch),
        _ => None,
    }
}
