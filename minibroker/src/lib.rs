//! The `minibroker` command line, and the in-process cluster it (and the integration tests)
//! run on.
//!
//! Modules:
//! - [`embedded`] — [`embedded::EmbeddedCluster`]: 2 coordinators and 3 partition leaders in
//!   this process, on loopback ports, with sled in a temporary directory; kill/restart by id.
//! - [`demo`] — the seed's fencing story, told step by step and verified by a read_committed
//!   checker (`minibroker demo`).
//! - [`process`] — the exactly-once consume-transform-produce application (`minibroker process`).
//! - [`chaos`] — `minibroker chaos`: nodes and producers as child processes, a nemesis of
//!   SIGKILLs, SIGSTOPs and zombie producers, and a checker that reads the history.
//! - [`node`] — `minibroker node coordinator|leader`: one node in this process.
//! - [`mod@bench`] — transactional vs idempotent producer throughput (`minibroker bench`).
//!
//! The binary (`src/main.rs`) adds `dev`, `produce`, `consume`, `transactions` and `producers`,
//! which are thin wrappers over `producer-client`.

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod embedded;
pub mod node;
pub mod process;

pub use embedded::{EmbeddedCluster, EmbeddedOptions};
