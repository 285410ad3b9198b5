//! The mini-broker transaction coordinator (issue 2; PROTOCOL.md sections 1-8).
//!
//! Modules:
//! - [`core`]: the pure state machine. Per transactional id, [`core::TxnMetadata`]; per request
//!   a function returning what to persist, which markers to send and the reply.
//! - [`storage`]: a small [`storage::Storage`] trait with a sled engine (trees
//!   `__transaction_state`, `__consumer_offsets`, `__group_marker_state`, `__coordinator_meta`)
//!   and an in-memory engine.
//! - [`kafka`]: the Kafka face (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
//!   TxnOffsetCommit, EndTxn, OffsetFetch, ListTransactions, DescribeTransactions), calling the
//!   gRPC service's functions in-process.
//! - [`membership`]: Kafka's classic consumer-group membership (JoinGroup, SyncGroup,
//!   Heartbeat, LeaveGroup) as a pure state machine, and the KIP-447 generation check.
//! - [`service`]: the tonic shell: [`serve`], proto <-> domain, routing and input checks,
//!   per-id serialisation, markers to partition leaders, recovery on start, the timeout scan.
//!
//! One request, EndTxn(COMMIT), walked through: the `service` checks the input (id length,
//! epoch range) and that this node owns the id (`topology.coordinator_for`), takes the id's lock,
//! calls [`core::end_txn`], which answers with new metadata (PrepareCommit, epoch + 1) and a
//! [`core::MarkerJob`]; the shell makes the metadata durable through [`storage::Storage`], replies
//! OK with the bumped (PID, epoch), and spawns the marker writer: WriteTxnMarkers to every leader
//! in parallel (and WriteGroupOffsetMarker to each group's coordinator), retried with backoff until
//! acknowledged; then [`core::complete_markers`] moves the id to CompleteCommit, which is
//! persisted too. A crash between the two writes leaves PrepareCommit on disk; the next start
//! re-sends the markers and completes the commit.
//!
//! The group's coordinator fences each WriteGroupOffsetMarker the way a partition leader fences
//! WriteTxnMarkers ([`core::write_group_marker`]): per group it records the epoch last applied
//! per PID and the highest generation seen per sending coordinator, so a late COMMIT of an older
//! transaction (INVALID_PRODUCER_EPOCH) or from an older incarnation of the transaction
//! coordinator (TRANSACTION_COORDINATOR_FENCED) never moves committed offsets backwards, and the
//! same marker twice changes nothing.

pub mod core;
pub mod kafka;
pub mod membership;
pub mod service;
pub mod storage;

pub use service::{serve, serve_with_kafka, serve_with_storage, CoordinatorConfig};

/// The coordinator library's error: protocol decisions plus I/O, storage and transport.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The id or group is owned by another coordinator (NOT_COORDINATOR).
    #[error("not the coordinator of {0:?}")]
    NotCoordinator(String),
    /// State is still being loaded after a start (COORDINATOR_LOAD_IN_PROGRESS).
    #[error("coordinator is loading its state")]
    CoordinatorLoadInProgress,
    /// A protocol decision (mapped to an error code on the wire).
    #[error(transparent)]
    Protocol(#[from] core::TxnError),
    /// The storage engine failed.
    #[error("storage: {0}")]
    Storage(#[from] storage::StorageError),
    /// The gRPC server failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Bad configuration (e.g. this node is not a coordinator in the topology).
    #[error("configuration: {0}")]
    Config(String),
    /// An I/O error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The human detail that travels as `error_message`: without the error's name for protocol
    /// decisions (the code names them), the full text for everything else.
    pub fn detail(&self) -> String {
        match self {
            Error::Protocol(e) => e.detail(),
            other => other.to_string(),
        }
    }
}
