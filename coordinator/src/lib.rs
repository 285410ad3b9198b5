//! The mini-broker transaction coordinator (issue 2; PROTOCOL.md sections 1-8).
//!
//! Modules:
//! - [`core`]: the pure state machine. Per transactional id, [`core::TxnMetadata`]; per request
//!   a function returning what to persist, which markers to send and the reply.
//! - [`storage`]: a small [`storage::Storage`] trait with a sled engine (trees
//!   `__transaction_state`, `__consumer_offsets`, `__group_marker_state`, `__coordinator_meta`)
//!   and an in-memory engine.
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
mod error;
pub mod service;
pub mod storage;

pub use error::{error_code, Error};
pub use service::{serve, serve_with_storage, CoordinatorConfig};
