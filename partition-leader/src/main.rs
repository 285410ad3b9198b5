//! The `partition-leader` binary: flags (with environment fallbacks), tracing, and
//! [`partition_leader::serve`] until SIGTERM or ctrl-c. `--metrics-listen ADDR` (METRICS_LISTEN)
//! serves Prometheus metrics at `/metrics`; logs go to stderr (RUST_LOG, `--log-format
//! text|json` or LOG_FORMAT).

/// The allocator: mimalloc's thread-local heaps instead of glibc malloc, whose arena locks the
/// runtime's workers and the storage threads contended for (`perf`: a fifth of the
/// coordinator's CPU under load in malloc, free and their futex waits; README, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use partition_leader::LeaderConfig;

/// A mini-broker partition leader.
#[derive(Debug, Parser)]
#[command(name = "partition-leader", version, about)]
struct Args {
    /// This node's id (must be a leader in the topology).
    #[arg(long, env = "NODE_ID")]
    node_id: i32,
    /// Address to listen on, e.g. 0.0.0.0:9201.
    #[arg(long = "listen", env = "LISTEN_ADDR")]
    listen: SocketAddr,
    /// Data directory (the partition log files in `logs/`, the sled checkpoint beside them).
    #[arg(long, env = "DATA_DIR")]
    data_dir: PathBuf,
    /// Topology TOML file.
    #[arg(long, env = "TOPOLOGY")]
    topology: PathBuf,
    /// Largest batch accepted, in bytes (at most 64 MiB: the log's frames stay readable).
    #[arg(long, env = "MAX_BATCH_BYTES", default_value_t = 1024 * 1024)]
    max_batch_bytes: usize,
    /// Largest record accepted, in bytes (at most 64 MiB).
    #[arg(long, env = "MAX_RECORD_BYTES", default_value_t = 1024 * 1024)]
    max_record_bytes: usize,
    /// Also serve Kafka's protocol here (advertise it as this node's `kafka_address` in the
    /// topology).
    #[arg(long = "kafka-listen", env = "KAFKA_LISTEN_ADDR")]
    kafka_listen: Option<SocketAddr>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 0.0.0.0:9404.
    #[arg(long, env = "METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Log lines as text or json (always on stderr).
    #[arg(long, env = "LOG_FORMAT", default_value_t = cluster::logs::LogFormat::Text)]
    log_format: cluster::logs::LogFormat,
    /// Forget a producer's state at a partition this long after its last write there, when it
    /// has no transaction open there, in milliseconds (Kafka's producer.id.expiration.ms;
    /// default 1 day).
    #[arg(long, env = "PRODUCER_ID_EXPIRATION_MS", default_value_t = partition_leader::DEFAULT_PRODUCER_ID_EXPIRATION.as_millis() as u64)]
    producer_id_expiration_ms: u64,
    /// How often to look for expired producer states, in milliseconds (Kafka's
    /// producer.id.expiration.check.interval.ms; default 10 minutes).
    #[arg(long, env = "PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS", default_value_t = partition_leader::DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL.as_millis() as u64)]
    producer_id_expiration_check_interval_ms: u64,
    /// DANGER: do not fence older epochs at this leader (demonstrates that the checker catches it).
    #[arg(long, env = "UNSAFE_SKIP_EPOCH_CHECK", hide = true)]
    unsafe_skip_epoch_check: bool,
    /// File holding the cluster secret (the same on every node; see docs/PROTOCOL.md section 12).
    #[arg(long, env = "CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// The cluster secret itself (prefer the file: a flag shows in `ps`).
    #[arg(long, env = "CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    cluster::logs::init(args.log_format, "info");
    let topology = cluster::Topology::load(&args.topology)
        .with_context(|| format!("loading topology {}", args.topology.display()))?;
    if topology.leader(args.node_id).is_none() {
        anyhow::bail!("node {} is not a leader in the topology", args.node_id);
    }
    let mut config = LeaderConfig::new(args.node_id, args.data_dir, Arc::new(topology));
    config.max_batch_bytes = args.max_batch_bytes;
    config.max_record_bytes = args.max_record_bytes;
    config.unsafe_skip_epoch_check = args.unsafe_skip_epoch_check;
    config.producer_id_expiration =
        std::time::Duration::from_millis(args.producer_id_expiration_ms);
    config.producer_id_expiration_check_interval =
        std::time::Duration::from_millis(args.producer_id_expiration_check_interval_ms.max(1));
    config.cluster_secret = Some(cluster::auth::ClusterSecret::from_sources(
        args.cluster_secret_file.as_deref(),
        args.cluster_secret.as_deref(),
    )?);
    // Refuse before binding when another process holds this data directory.
    cluster::node::wait_until_unlocked(&config.data_dir, std::time::Duration::ZERO).with_context(
        || {
            format!(
                "data directory {} is in use by another process",
                config.data_dir.display()
            )
        },
    )?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let kafka_listen = args.kafka_listen.map(|a| a.to_string());
    let (kafka_listener, stop) = cluster::node::binary_extras(
        kafka_listen.as_deref(),
        args.metrics_listen.as_deref(),
        config.metrics.clone(),
    )
    .await?;
    partition_leader::serve_with_kafka(config, listener, kafka_listener, stop).await?;
    Ok(())
}
