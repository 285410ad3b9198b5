//! The mini-broker partition leader (issue 3): it owns partition logs on disk and is the second
//! line of the fencing defence (PROTOCOL.md sections 7 and 9).
//!
//! Modules, and the rooms inside them (each room reads and changes only what it names):
//! - [`core`]: pure, synchronous producer-state checks, markers, LSO and the read_committed
//!   filter. Decides; never does I/O, never changes state except in `apply`.
//!   - `core/batch.rs`: wire validation of a Produce batch ([`core::validate_batch`]); no state.
//!   - `core/produce.rs`: [`core::PartitionState::check_produce`], one function per check of
//!     section 9 in its order: duplicate, epoch fence, sequence, transaction state. Reads state.
//!   - `core/marker.rs`: [`core::PartitionState::plan_marker`]: the marker's wire validation,
//!     then the fencing decision (`check_marker_fence`, one small function, the one to replace
//!     by a rule shared with the coordinator), then the plan. Reads state.
//!   - `core/fetch.rs`: [`core::PartitionState::fetch_view`]. Reads state.
//!   - `core/mod.rs`: the types, `restore`, and `apply`, the only writer of the state.
//! - [`storage`]: the [`storage::Storage`] trait with a disk engine (partition log files and a
//!   sled checkpoint, `storage/engine.rs`; the frame format in `storage/frame.rs`) and an
//!   in-memory engine.
//! - [`verify`]: asking the owning coordinator before a batch opens a transaction here.
//! - [`service`]: the tonic shell ([`service::LeaderService`]), [`LeaderConfig`] and [`serve`].
//!   - `service/mod.rs`: configuration, partition lookup and routing errors, `persist` (the one
//!     place that writes storage and applies a plan, under the write lock), the gRPC trait and
//!     serving;
//!   - `service/produce.rs`: proto batch -> core, the check / verify / append rounds;
//!   - `service/fetch.rs`: request checks, the long poll, the storage scan (read-only);
//!   - `service/marker.rs`: one partition's WriteTxnMarkers.
//! - [`error`]: the crate's [`Error`] and its single mapping to wire codes.
//! - [`kafka`]: the Kafka face (Produce, Fetch, ListOffsets, DescribeProducers, idempotent
//!   InitProducerId) over the same service functions the gRPC handlers call.
//!
//! Tests: unit tests of the core in `core/tests.rs`; golden scripts in `testdata/` (run by
//! `tests/golden.rs` through the shared `testkit` runner); the shell in process in
//! `tests/shell.rs`; over gRPC in `tests/leader_grpc.rs` and `tests/with_coordinator.rs`.
//!
//! One transactional Produce, walked through:
//! 1. `service` finds the partition (UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER from the
//!    static topology) and converts the proto batch;
//! 2. `core::validate_batch` rejects bad input (INVALID_REQUEST, MESSAGE_TOO_LARGE) before any
//!    state is touched;
//! 3. under the partition's write lock, `PartitionState::check_produce` runs section 9's checks
//!    in order: duplicate, epoch (fencing), sequence, transaction state;
//! 4. if the batch would open a transaction here, the lock is released and `verify` asks the
//!    coordinator; then step 3 runs again with `verified = true`;
//! 5. the returned `Plan` (offsets, the PID's new state, aborted-index entry) is written by
//!    `storage` in one sled transaction and flushed, and only then applied to memory, long
//!    polls are woken, and the reply (base offset, high watermark) is sent.
//!
//! A coordinator's WriteTxnMarkers takes the same path through `PartitionState::plan_marker`;
//! a Fetch reads a `FetchView` (HW or LSO, aborted ranges) and scans `storage`.
//!
//! CAVEATS: single replica per partition (no followers, no ISR); no retention (DeleteRecords
//! moves the log start, the disk keeps the records); the topology is static. See each module's
//! CAVEATS.

pub mod core;
pub mod decompress;
pub mod error;
pub mod kafka;
pub mod service;
pub mod storage;
pub mod verify;

pub use error::Error;
pub use service::{
    serve, serve_with, serve_with_kafka, LeaderConfig, LeaderService,
    DEFAULT_PRODUCER_ID_EXPIRATION, DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL,
};
