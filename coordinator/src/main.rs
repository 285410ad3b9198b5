//! The `coordinator` binary: a thin wrapper around [`coordinator::serve`].
//!
//! ```text
//! coordinator --node-id 1 --listen 0.0.0.0:9092 --data-dir /var/lib/coordinator-1 \
//!             --topology /etc/minibroker/topology.toml
//! ```
//! Every flag falls back to an environment variable (NODE_ID, LISTEN_ADDR, DATA_DIR, TOPOLOGY),
//! for compose files; `--metrics-listen ADDR` (METRICS_LISTEN) serves Prometheus metrics at
//! `/metrics`. Logs go to stderr through `tracing` (filter with RUST_LOG, default `info`; text or
//! `--log-format json`, LOG_FORMAT). SIGTERM or ctrl-c stops the server cleanly (sled flushed and closed).

/// The allocator: mimalloc's thread-local heaps instead of glibc malloc, whose arena locks the
/// runtime's workers and the storage threads contended for (`perf`: a fifth of the
/// coordinator's CPU under load in malloc, free and their futex waits; README, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// mini-broker transaction coordinator.
#[derive(Debug, Parser)]
#[command(name = "coordinator", version, about)]
struct Args {
    /// This node's id (a coordinator in the topology file).
    #[arg(long, env = "NODE_ID")]
    node_id: cluster::NodeId,
    /// Address to listen on, e.g. 0.0.0.0:9092.
    #[arg(long = "listen", env = "LISTEN_ADDR")]
    listen: String,
    /// Directory of the sled database.
    #[arg(long, env = "DATA_DIR")]
    data_dir: PathBuf,
    /// The cluster topology file (TOML).
    #[arg(long, env = "TOPOLOGY")]
    topology: PathBuf,
    /// Also serve Kafka's protocol here (advertise it as this node's `kafka_address` in the
    /// topology).
    #[arg(long = "kafka-listen", env = "KAFKA_LISTEN_ADDR")]
    kafka_listen: Option<String>,
    /// How often to look for timed-out transactions, in milliseconds.
    #[arg(long, env = "TIMEOUT_SCAN_INTERVAL_MS", default_value_t = 1000)]
    timeout_scan_interval_ms: u64,
    /// First backoff between marker retries, in milliseconds.
    #[arg(long, env = "MARKER_RETRY_BACKOFF_MS", default_value_t = 100)]
    marker_retry_backoff_ms: u64,
    /// Largest transaction timeout accepted, in milliseconds.
    #[arg(long, env = "MAX_TRANSACTION_TIMEOUT_MS", default_value_t = cluster::MAX_TRANSACTION_TIMEOUT_MS)]
    max_transaction_timeout_ms: i32,
    /// File holding the cluster secret (the same on every node; see docs/PROTOCOL.md section 12).
    #[arg(long, env = "CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// The cluster secret itself (prefer the file: a flag shows in `ps`).
    #[arg(long, env = "CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// How long a request whose id's markers are still being written waits for them before it
    /// is answered CONCURRENT_TRANSACTIONS, in milliseconds (0: answer at once).
    #[arg(long, env = "MAX_PREPARE_WAIT_MS", default_value_t = coordinator::DEFAULT_MAX_PREPARE_WAIT.as_millis() as u64)]
    max_prepare_wait_ms: u64,
    /// How long an idle transactional id (no transaction open) is kept after its last change,
    /// in milliseconds (Kafka's transactional.id.expiration.ms; default 7 days).
    #[arg(long, env = "TRANSACTIONAL_ID_EXPIRATION_MS", default_value_t = coordinator::DEFAULT_TRANSACTIONAL_ID_EXPIRATION.as_millis() as u64)]
    transactional_id_expiration_ms: u64,
    /// How long the first rebalance of an empty consumer group waits for more members, in
    /// milliseconds (Kafka's group.initial.rebalance.delay.ms; default 3000).
    #[arg(long, env = "GROUP_INITIAL_REBALANCE_DELAY_MS", default_value_t = coordinator::DEFAULT_GROUP_INITIAL_REBALANCE_DELAY.as_millis() as u64)]
    group_initial_rebalance_delay_ms: u64,
    /// How often members of KIP-848 consumer groups (`group.protocol=consumer`) heartbeat, in
    /// milliseconds (Kafka's group.consumer.heartbeat.interval.ms; default 5000).
    #[arg(long, env = "GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS", default_value_t = coordinator::DEFAULT_GROUP_CONSUMER_HEARTBEAT_INTERVAL.as_millis() as u64)]
    group_consumer_heartbeat_interval_ms: u64,
    /// How long a KIP-848 consumer group member may stay silent before it is removed, in
    /// milliseconds (Kafka's group.consumer.session.timeout.ms; default 45000).
    #[arg(long, env = "GROUP_CONSUMER_SESSION_TIMEOUT_MS", default_value_t = coordinator::DEFAULT_GROUP_CONSUMER_SESSION_TIMEOUT.as_millis() as u64)]
    group_consumer_session_timeout_ms: u64,
    /// The most members a classic consumer group takes; a new member beyond it is
    /// GROUP_MAX_SIZE_REACHED (Kafka's group.max.size; default 2147483647).
    #[arg(long, env = "GROUP_MAX_SIZE", default_value_t = coordinator::DEFAULT_GROUP_MAX_SIZE)]
    group_max_size: usize,
    /// The most members a KIP-848 consumer group takes (Kafka's group.consumer.max.size;
    /// default 2147483647).
    #[arg(long, env = "GROUP_CONSUMER_MAX_SIZE", default_value_t = coordinator::DEFAULT_GROUP_MAX_SIZE)]
    group_consumer_max_size: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 0.0.0.0:9404.
    #[arg(long, env = "METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Log lines as text or json (always on stderr).
    #[arg(long, env = "LOG_FORMAT", default_value_t = cluster::logs::LogFormat::Text)]
    log_format: cluster::logs::LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    cluster::logs::init(args.log_format, "info");
    let topology = cluster::Topology::load(&args.topology)
        .with_context(|| format!("loading topology {}", args.topology.display()))?;
    let mut config =
        coordinator::CoordinatorConfig::new(args.node_id, args.data_dir, Arc::new(topology));
    config.timeout_scan_interval = Duration::from_millis(args.timeout_scan_interval_ms.max(1));
    config.marker_retry_backoff = Duration::from_millis(args.marker_retry_backoff_ms.max(1));
    config.max_transaction_timeout_ms = args.max_transaction_timeout_ms;
    config.cluster_secret = Some(cluster::auth::ClusterSecret::from_sources(
        args.cluster_secret_file.as_deref(),
        args.cluster_secret.as_deref(),
    )?);
    // Refuse before binding when another process holds this data directory.
    cluster::node::wait_until_unlocked(&config.data_dir, Duration::ZERO).with_context(|| {
        format!(
            "data directory {} is in use by another process",
            config.data_dir.display()
        )
    })?;
    config.max_prepare_wait = Duration::from_millis(args.max_prepare_wait_ms);
    config.transactional_id_expiration = Duration::from_millis(args.transactional_id_expiration_ms);
    config.group_initial_rebalance_delay =
        Duration::from_millis(args.group_initial_rebalance_delay_ms);
    config.group_consumer_heartbeat_interval =
        Duration::from_millis(args.group_consumer_heartbeat_interval_ms.max(1));
    config.group_consumer_session_timeout =
        Duration::from_millis(args.group_consumer_session_timeout_ms.max(1));
    config.group_max_size = args.group_max_size;
    config.group_consumer_max_size = args.group_consumer_max_size;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(node_id = args.node_id, address = %listener.local_addr()?, "coordinator listening");
    let (kafka_listener, stop) = cluster::node::binary_extras(
        args.kafka_listen.as_deref(),
        args.metrics_listen.as_deref(),
        config.metrics.clone(),
    )
    .await?;
    coordinator::serve_with_kafka(config, listener, kafka_listener, stop)
        .await
        .context("coordinator failed")
}
