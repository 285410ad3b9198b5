//! One file per command (mini-redis's `cmd/`): each holds its clap arguments and an async `run`
//! that talks to a cluster through `producer-client` (or runs the library's embedded cluster,
//! demo, processor or benchmark) and prints text or, with `--json`, one JSON document.
//!
//! Rooms and what each may touch:
//! - this file: the [`Command`] enum, the cluster [`Target`] (`--topology` / `--bootstrap`) and
//!   [`dispatch`]; no output of its own;
//! - [`demo`], [`dev`], [`bench`]: start an embedded cluster in this process (bench only when no
//!   target is given);
//! - [`produce`], [`consume`], [`process`]: data traffic through producers and consumers;
//! - [`transactions`], [`producers`]: read-only admin queries.

use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};
use producer_client::ClientConfig;

pub mod bench;
pub mod consume;
pub mod demo;
pub mod dev;
pub mod process;
pub mod produce;
pub mod producers;
pub mod transactions;

/// Where the cluster is, for the commands that talk to one.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// Cluster topology file (as written by `minibroker dev`).
    #[arg(long, global = true, env = "TOPOLOGY")]
    topology: Option<std::path::PathBuf>,
    /// Address(es) of any node, comma-separated (instead of --topology).
    #[arg(long, global = true, env = "BOOTSTRAP", value_delimiter = ',')]
    bootstrap: Vec<String>,
}

impl Target {
    /// The client configuration for the given cluster; an error naming the flags if none is.
    pub fn config(&self) -> anyhow::Result<ClientConfig> {
        if !self.bootstrap.is_empty() {
            return Ok(ClientConfig::new(self.bootstrap.clone()));
        }
        let Some(path) = &self.topology else {
            bail!("no cluster given: pass --topology FILE (or set TOPOLOGY), or --bootstrap ADDR; `minibroker dev` starts a local cluster and prints its topology file");
        };
        let topology = cluster::Topology::load(path)?;
        Ok(ClientConfig::new(
            topology
                .coordinators
                .iter()
                .chain(&topology.leaders)
                .map(|n| n.address.clone()),
        ))
    }

    /// Whether a cluster was given at all.
    pub fn given(&self) -> bool {
        self.topology.is_some() || !self.bootstrap.is_empty()
    }
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the fencing story of the seed on an embedded cluster and verify it.
    Demo(demo::DemoArgs),
    /// Run an embedded cluster in the foreground (until ctrl-c) and print its topology.
    Dev(dev::DevArgs),
    /// Produce records, transactionally or idempotently.
    Produce(produce::ProduceArgs),
    /// Read records from a topic.
    Consume(consume::ConsumeArgs),
    /// Inspect transactions at the coordinators.
    Transactions {
        #[command(subcommand)]
        command: transactions::TransactionsCommand,
    },
    /// Show a partition leader's producer state for TOPIC PARTITION.
    Producers(producers::ProducersArgs),
    /// Run the exactly-once consume-transform-produce application.
    Process(process::ProcessArgs),
    /// Benchmark the transactional producer against the idempotent one.
    Bench(bench::BenchArgs),
    /// Run a Jepsen-style fault run (SIGKILL, SIGSTOP, zombie producers) and check exactly-once.
    Chaos(minibroker::chaos::cli::ChaosArgs),
    /// One chaos producer instance (started by `chaos`).
    #[command(hide = true)]
    ChaosWorker(minibroker::chaos::cli::WorkerArgs),
    /// Run one cluster node in this process.
    #[command(hide = true)]
    Node(minibroker::node::NodeArgs),
}

/// Runs one command; `json` asks for machine-readable output.
pub async fn dispatch(command: Command, target: Target, json: bool) -> anyhow::Result<ExitCode> {
    match command {
        Command::Demo(args) => demo::run(args, json).await,
        Command::Dev(args) => dev::run(args, json).await,
        Command::Produce(args) => produce::run(target.config()?, args, json).await,
        Command::Consume(args) => consume::run(target.config()?, args, json).await,
        Command::Transactions { command } => {
            transactions::run(target.config()?, command, json).await
        }
        Command::Producers(args) => producers::run(target.config()?, args, json).await,
        Command::Process(args) => process::run(target.config()?, args, json).await,
        Command::Bench(args) => bench::run(target, args, json).await,
        Command::Chaos(args) => minibroker::chaos::cli::chaos(args, json).await,
        Command::ChaosWorker(args) => minibroker::chaos::cli::worker(args).await,
        Command::Node(args) => {
            minibroker::node::run(args, minibroker::node::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Resolves on ctrl-c: the end of `dev`, `consume --follow` and `process`.
pub async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}
