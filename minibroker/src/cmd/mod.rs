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
//! - [`transactions`], [`producers`], [`groups`]: admin queries (read-only, but for
//!   `transactions abort`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand};
use producer_client::ClientConfig;

pub mod bench;
pub mod consume;
pub mod demo;
pub mod dev;
pub mod groups;
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
    /// Seconds to wait for the first node to answer before giving up.
    #[arg(
        long,
        global = true,
        env = "MINIBROKER_TIMEOUT",
        default_value_t = 3.0,
        value_name = "SECONDS"
    )]
    timeout: f64,
}

/// Nothing answered at any of the cluster's addresses within `--timeout`.
#[derive(Debug, thiserror::Error)]
#[error("no mini-broker node answers at {} (waited {:.1} s): start one with `minibroker dev --write-topology /tmp/mb.toml` (then --topology /tmp/mb.toml) or `docker-compose up -d` (then --bootstrap 127.0.0.1:9101 with docker-compose.host.yml), or pass a longer --timeout", .addresses.join(", "), .waited.as_secs_f64())]
pub struct Unreachable {
    /// The addresses tried.
    pub addresses: Vec<String>,
    /// How long the command waited.
    pub waited: Duration,
}

impl Target {
    /// The client configuration for the given cluster, once one of its nodes answered
    /// Metadata within `--timeout` ([`Unreachable`] otherwise, in one sentence).
    pub async fn connect(&self) -> anyhow::Result<ClientConfig> {
        let config = self.config()?;
        let waited = self.timeout_duration();
        probe(&config.bootstrap, waited).await?;
        Ok(config)
    }

    /// `--timeout` as a duration (at least 100 ms).
    pub fn timeout_duration(&self) -> Duration {
        Duration::from_secs_f64(self.timeout.max(0.1))
    }

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

    /// Refuses a cluster for a command that starts its own (`demo`, `dev`): one sentence that
    /// says so instead of silently ignoring the flag.
    pub fn refuse(&self, command: &str, instead: &str) -> anyhow::Result<()> {
        if self.given() {
            let given = if self.topology.is_some() {
                "--topology (or TOPOLOGY)"
            } else {
                "--bootstrap (or BOOTSTRAP)"
            };
            bail!("`minibroker {command}` starts its own in-process cluster and does not use {given}; {instead}");
        }
        Ok(())
    }
}

/// Asks every address for Metadata at once; Ok as soon as one answers, [`Unreachable`] if none
/// does within `waited`.
async fn probe(addresses: &[String], waited: Duration) -> Result<(), Unreachable> {
    let mut asks = tokio::task::JoinSet::new();
    for address in addresses {
        let address = address.clone();
        asks.spawn(async move {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                .ok()?
                .connect_timeout(waited);
            let channel = endpoint.connect().await.ok()?;
            proto::cluster_client::ClusterClient::new(channel)
                .metadata(proto::MetadataRequest { topics: vec![] })
                .await
                .ok()
        });
    }
    let answered = tokio::time::timeout(waited, async {
        while let Some(asked) = asks.join_next().await {
            if matches!(asked, Ok(Some(_))) {
                return true;
            }
        }
        false
    })
    .await;
    if answered == Ok(true) {
        return Ok(());
    }
    Err(Unreachable {
        addresses: addresses.to_vec(),
        waited,
    })
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
    /// Inspect consumer groups at the coordinators: members, partitions, offsets, lag.
    Groups {
        #[command(subcommand)]
        command: groups::GroupsCommand,
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
        Command::Demo(args) => {
            target.refuse(
                "demo",
                "against a compose cluster run scripts/compose-demo.sh, which tells the same story with containers",
            )?;
            demo::run(args, json).await
        }
        Command::Dev(args) => {
            target.refuse(
                "dev",
                "drop the flag, or use the cluster you named directly",
            )?;
            dev::run(args, json).await
        }
        Command::Produce(args) => produce::run(target.connect().await?, args, json).await,
        Command::Consume(args) => {
            let timeout = target.timeout_duration();
            consume::run(target.connect().await?, args, json, timeout).await
        }
        Command::Transactions { command } => {
            transactions::run(target.connect().await?, command, json).await
        }
        Command::Groups { command } => groups::run(target.connect().await?, command, json).await,
        Command::Producers(args) => producers::run(target.connect().await?, args, json).await,
        Command::Process(args) => process::run(target.connect().await?, args, json).await,
        Command::Bench(args) => bench::run(target, args, json).await,
        Command::Chaos(args) => minibroker::chaos::cli::chaos(args, json).await,
        Command::ChaosWorker(args) => minibroker::chaos::cli::worker(args).await,
        Command::Node(args) => {
            minibroker::node::run(args, minibroker::node::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A signal that asks a command to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGINT (ctrl-c).
    Interrupt,
    /// SIGTERM (`kill`, `docker stop`).
    Terminate,
}

impl Stop {
    /// The conventional exit status of a command stopped by this signal (128 + its number),
    /// after it cleaned up.
    pub fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            Stop::Interrupt => 130,
            Stop::Terminate => 143,
        })
    }

    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Interrupt => "SIGINT",
            Stop::Terminate => "SIGTERM",
        }
    }
}

/// Resolves on ctrl-c (SIGINT) or SIGTERM, saying which: the end of `dev`, `consume --follow`,
/// `process`, and an interrupted `produce`. Installed when first polled.
pub async fn stop_signal() -> Stop {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Stop::Interrupt,
        _ = term => Stop::Terminate,
    }
}

/// Resolves on ctrl-c or SIGTERM (see [`stop_signal`]).
pub async fn ctrl_c() {
    stop_signal().await;
}
