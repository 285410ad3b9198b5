//! The mini-broker transaction coordinator (issue 2; PROTOCOL.md sections 1-8).
//!
//! The crate is laid out in rooms, one job each. Where a change goes:
//!
//! | room | file | what it may touch |
//! |------|------|-------------------|
//! | protocol rules | [`core`] (`core/mod.rs`: stored types, [`core::TxnError`] and its wire code, [`core::Outcome`]) | nothing but its arguments: no tonic, tokio, sled, clock or randomness |
//! | per-request transitions | `core/txn.rs` ([`core::init_producer_id`], [`core::end_txn`], [`core::check_producer`], ...) | the same |
//! | marker decisions | `core/markers.rs` ([`core::MarkerJob`], [`core::marker_reply`], [`core::complete_markers`]) | the same |
//! | group markers received | `core/group.rs` ([`core::write_group_marker`] over [`cluster::marker_fence`]) | the same |
//! | PID allocation | `core/pid.rs` ([`core::PidAllocator`]) | the same |
//! | durable state | [`storage`]: the [`storage::Storage`] trait, sled and in-memory engines | its sled trees only |
//! | errors | `error.rs`: [`Error`], and [`error_code`], the one map to wire codes | nothing |
//! | start and stop | `service/mod.rs`: [`serve`], [`CoordinatorConfig`], shared state, tasks | opens and closes storage through [`cluster::node`] |
//! | proto <-> domain | `service/wire.rs`: input checks and conversions | nothing (pure) |
//! | gRPC handlers | `service/grpc.rs`: decode, call one room, encode | nothing else |
//! | per-id state | `service/state.rs`: routing, per-id locks, transitions made durable, load, timeout scan | `__transaction_state`, the PID block, the generation |
//! | group commit | `service/commit.rs`: the writer task that makes concurrent transitions durable with one flush | `__transaction_state`, through [`storage::Storage::put_txns`] |
//! | marker writer | `service/markers.rs`: the one deliver-with-backoff loop | peers over gRPC; completes through `state` |
//! | group coordinator | `service/groups.rs`: group markers received, OffsetFetch, Kafka's plain OffsetCommit, offset deletion | `__consumer_offsets`, `__group_marker_state` |
//! | in-process calls | `service/local.rs`: what the Kafka face calls (proto in, domain out), the same checks and rooms as `grpc` | nothing else |
//! | Kafka face | [`kafka`]: Kafka's transactional and group APIs decoded with `kafka-protocol`, answered through `service/local.rs` | group membership in memory |
//! | group deletion | [`group_admin`]: DeleteGroups and OffsetDelete as pure decisions (Kafka's rules, plus: a transaction's pending offsets keep the group) | nothing but its arguments |
//! | consumer groups | [`consumer_groups`]: Kafka's classic group membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) and the KIP-447 generation check, a pure state machine | nothing but its arguments |
//!
//! A new protocol rule goes into `core` (with its unit test beside it, and a golden script in
//! `testdata/` if it is a scenario); a new request field into `wire`; a new RPC into `grpc` plus
//! one method in the room that owns its state. Plumbing both node kinds share (clock, blocking
//! pool, listener, sled lifecycle) belongs in [`cluster::node`], never here.
//!
//! One request, EndTxn(COMMIT), walked through the rooms: `grpc` receives it and asks `wire` to
//! decode it (id length, epoch range, known result: INVALID_REQUEST otherwise, nothing stored);
//! `state` checks that this node owns the id (`topology.coordinator_for`, else NOT_COORDINATOR)
//! and has loaded (else COORDINATOR_LOAD_IN_PROGRESS), takes the id's lock and calls
//! [`core::end_txn`], which answers with new metadata (PrepareCommit, epoch + 1) and a
//! [`core::MarkerJob`]; `state` makes the metadata durable through the group commit
//! (`commit`: the writes of concurrent requests for other ids share its flush) and hands the job
//! to `markers`; `grpc` replies OK with the bumped (PID, epoch), its error (if
//! any) mapped by [`error_code`]. In the background, `markers` sends WriteTxnMarkers to every
//! leader in parallel (and WriteGroupOffsetMarker to each group's coordinator, which is `groups`
//! on that node), asks [`core::marker_reply`] what each answer means (acknowledged, retry, or
//! stop) and retries with backoff until acknowledged; then [`core::complete_markers`] moves the
//! id to CompleteCommit, which `state` queues in the group commit without waiting for a flush
//! of its own (it records what is durable already; the next flush covers it). A crash before
//! that write is durable leaves PrepareCommit on disk; the next start (`state`'s load) re-sends
//! the markers and completes the commit. A request for the id that arrives meanwhile (the producer's next InitProducerId or
//! EndTxn) does not bounce with CONCURRENT_TRANSACTIONS: `state` lets it wait, up to
//! [`CoordinatorConfig::max_prepare_wait`], for the completion and then answers it.
//!
//! The group's coordinator fences each WriteGroupOffsetMarker the way a partition leader fences
//! WriteTxnMarkers: both apply [`cluster::marker_fence::check`]. Per group it records the epoch
//! last applied per PID and the highest generation seen per sending coordinator, so a late
//! COMMIT of an older transaction (INVALID_PRODUCER_EPOCH) or from an older incarnation of the
//! transaction coordinator (TRANSACTION_COORDINATOR_FENCED) never moves committed offsets
//! backwards, and the same marker twice changes nothing.

pub mod consumer_groups;
pub mod consumer_protocol;
pub mod core;
mod error;
pub mod group_admin;
mod group_service;
pub mod kafka;
pub mod service;
pub mod storage;

pub use error::{error_code, Error};
pub use service::{
    serve, serve_with_kafka, serve_with_storage, CoordinatorConfig,
    DEFAULT_GROUP_CONSUMER_HEARTBEAT_INTERVAL, DEFAULT_GROUP_CONSUMER_SESSION_TIMEOUT,
    DEFAULT_GROUP_INITIAL_REBALANCE_DELAY, DEFAULT_GROUP_MAX_SIZE, DEFAULT_MAX_PREPARE_WAIT,
    DEFAULT_TRANSACTIONAL_ID_EXPIRATION,
};
