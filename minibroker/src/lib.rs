//! The `minibroker` command line, and the in-process cluster it (and the integration tests)
//! run on.
//!
//! Library modules (what the commands and the integration tests share):
//! - [`embedded`]: [`embedded::EmbeddedCluster`]: 2 coordinators and 3 partition leaders in
//!   this process, on loopback ports, with sled in a temporary directory; kill/restart by id.
//! - [`demo`]: the seed's fencing story, told step by step and verified by a read_committed
//!   checker (`minibroker demo`). `demo/mod.rs` holds the options, the summary and the setup;
//!   `demo/tale.rs` tells the story, one method per numbered step, and may touch the cluster
//!   only through clients.
//! - [`process`]: the exactly-once consume-transform-produce application (`minibroker process`).
//! - [`mod@bench`]: transactional vs idempotent producer throughput (`minibroker bench`), one
//!   function per phase.
//! - [`chaos`]: `minibroker chaos`: nodes and producers as child processes, a nemesis of
//!   SIGKILLs, SIGSTOPs and zombie producers, and a checker that reads the history.
//! - [`out`]: standard output that ends quietly on a closed pipe ([`outln!`]).
//! - [`node`]: `minibroker node coordinator|leader`: one node in this process.
//!
//! The binary (`src/main.rs`) only parses the arguments, sets up tracing and the runtime, and
//! dispatches to one file per command under `src/cmd/` (mini-redis's layout):
//! - `cmd/mod.rs`: the command enum, the cluster target (`--topology` / `--bootstrap`) and the
//!   dispatch; prints nothing itself;
//! - `cmd/demo.rs`, `cmd/dev.rs`, `cmd/bench.rs`: start an embedded cluster in the process
//!   (`bench` only when no cluster is given) and call the library modules above;
//! - `cmd/produce.rs`, `cmd/consume.rs`, `cmd/process.rs`: data traffic through
//!   `producer-client` producers and consumers;
//! - `cmd/transactions.rs`, `cmd/producers.rs`: read-only admin queries;
//! - `chaos` and `node` dispatch straight to the library modules of the same names.
//!
//! Every command prints text, or one JSON document with `--json`; errors go to stderr and a
//! non-zero exit status.

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod embedded;
pub mod node;
pub mod out;
pub mod process;

pub use embedded::{EmbeddedCluster, EmbeddedOptions};
