//! `minibroker node coordinator|leader`: one cluster node in this process, as the `coordinator`
//! and `partition-leader` binaries run it. `minibroker chaos` starts its nodes this way, so one
//! executable is all a chaos run needs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cluster::{NodeId, Topology};

/// Which node to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeRole {
    /// A transaction (and group) coordinator.
    Coordinator,
    /// A partition leader.
    Leader,
}

/// A node's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct NodeArgs {
    /// The role.
    #[arg(value_enum)]
    pub role: NodeRole,
    /// This node's id in the topology.
    #[arg(long)]
    pub node_id: NodeId,
    /// Address to listen on.
    #[arg(long)]
    pub listen: String,
    /// Also serve Kafka's protocol here (the topology names it as this node's `kafka_address`).
    #[arg(long)]
    pub kafka_listen: Option<String>,
    /// Directory of the sled database.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The topology file.
    #[arg(long = "topology-file")]
    pub topology: PathBuf,
    /// Coordinators: how often to look for timed-out transactions, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_scan_interval_ms: u64,
    /// File holding the cluster secret (the same on every node).
    #[arg(long, env = "CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// DANGER, leaders only: skip the epoch check (for showing that the checkers catch it).
    #[arg(long, hide = true)]
    pub unsafe_skip_epoch_check: bool,
}

/// Runs the node until `shutdown` resolves.
pub async fn run(
    args: NodeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let topology = Arc::new(
        Topology::load(&args.topology)
            .with_context(|| format!("loading topology {}", args.topology.display()))?,
    );
    let secret =
        cluster::auth::ClusterSecret::from_sources(args.cluster_secret_file.as_deref(), None)?;
    // Refuse before binding when another process holds the data directory.
    cluster::node::wait_until_unlocked(&args.data_dir, Duration::ZERO).with_context(|| {
        format!(
            "data directory {} is in use by another process",
            args.data_dir.display()
        )
    })?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let kafka_listener = match &args.kafka_listen {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("binding {address}"))?,
        ),
        None => None,
    };
    match args.role {
        NodeRole::Coordinator => {
            let mut config =
                coordinator::CoordinatorConfig::new(args.node_id, args.data_dir, topology);
            config.timeout_scan_interval =
                Duration::from_millis(args.timeout_scan_interval_ms.max(1));
            config.cluster_secret = Some(secret);
            coordinator::serve_with_kafka(config, listener, kafka_listener, shutdown).await?;
        }
        NodeRole::Leader => {
            let mut config =
                partition_leader::LeaderConfig::new(args.node_id, args.data_dir, topology);
            config.unsafe_skip_epoch_check = args.unsafe_skip_epoch_check;
            config.cluster_secret = Some(secret);
            partition_leader::serve_with_kafka(config, listener, kafka_listener, shutdown).await?;
        }
    }
    Ok(())
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}
