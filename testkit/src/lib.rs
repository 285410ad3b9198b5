//! The mini-broker test kit: what more than one crate's tests need, written once. A
//! dev-dependency only (`publish = false`); no library crate depends on it.
//!
//! Modules:
//! - [`clients`]: the Python with the real Kafka clients (confluent-kafka, kafka-python), or a
//!   skip (a failure where CI requires them).
//! - [`golden`]: the one golden-script runner and format (toydb's way). A crate's test file
//!   names a folder with [`test_each_path!`] (one `#[test]` per script file) and passes each
//!   path to [`golden::run_script`] with its own [`golden::Runner`], the thing that turns one
//!   command into its output. `UPDATE_GOLDEN=1` rewrites the scripts from the actual output.
//! - [`logs`]: the numbers a node's text log reports (`group commit flushed writes=8`).
//! - [`poll`]: [`eventually`], the one polling helper: wait on a condition with a deadline,
//!   never a bare sleep ([`poll::wait_until`] is its front for a `bool` condition).
//! - [`process`]: a node binary as a child process that a test can SIGKILL (or SIGSTOP).
//! - [`power`]: a disk whose power can be cut (ext4 on a loop device,
//!   [`cluster::power_cut`]), or a skip (a failure where CI requires it).
//! - [`requests`]: protocol messages built once (EndTxn, Fetch, WriteTxnMarkers, a batch) and
//!   the values of a fetch reply.
//! - [`standard`]: clients of the standard gRPC services every node serves (health and
//!   reflection), as grpcurl or a load balancer would ask them.
//! - [`tmpfs`]: a small tmpfs to fill up (a full disk), mounted for one test.
//! - [`fakes`]: stand-ins served over real gRPC or called in process: [`FakeLeader`] (a
//!   partition leader that records markers and answers with a chosen code),
//!   [`FakeCoordinator`] (VerifyTransaction from a table the test edits) and [`FakeVerifier`]
//!   (the leader's [`partition_leader::verify::TxnVerifier`], with a gate to hold a call).
//!
//! CAVEATS: scripts are listed when the test crate is compiled (as in toydb): after adding a
//! script, touch the test file or run `cargo test` after any change to that crate. The fakes
//! implement only what the tests use; every other RPC answers `unimplemented`.

pub mod auth;
pub mod clients;
pub mod fakes;
pub mod golden;
pub mod kafka;
pub mod logs;
pub mod poll;
pub mod power;
pub mod process;
pub mod requests;
pub mod standard;
pub mod tmpfs;

pub use fakes::{FakeCoordinator, FakeLeader, FakeTxn, FakeVerifier};
pub use poll::eventually;
pub use test_each_file::test_each_path;
