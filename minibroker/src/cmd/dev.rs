//! `minibroker dev`: an embedded cluster in the foreground until ctrl-c or SIGTERM, with its
//! topology file and addresses (gRPC and the Kafka bootstrap) printed (text or JSON) so other
//! commands and Kafka clients can use it. On either signal it stops every node cleanly and
//! removes its temporary directory (not a `--data-dir`).

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use minibroker::{EmbeddedCluster, EmbeddedOptions};
use serde_json::json;

use super::stop_signal;

/// Arguments of `dev`.
#[derive(Args, Debug)]
pub struct DevArgs {
    /// Keep data here instead of a temporary directory.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Listen on fixed ports from here (coordinators first, then leaders).
    #[arg(long)]
    base_port: Option<u16>,
    /// Also copy the topology file to this path.
    #[arg(long)]
    write_topology: Option<std::path::PathBuf>,
    /// Write the Kafka bootstrap list (`host:port,...`, every node's Kafka listener) here.
    #[arg(long)]
    kafka_bootstrap_file: Option<std::path::PathBuf>,
    /// Serve each node's Prometheus metrics on a loopback port (printed).
    #[arg(long)]
    metrics: bool,
    /// KIP-848 groups: how often members heartbeat (Kafka's
    /// `group.consumer.heartbeat.interval.ms`; default 5000).
    #[arg(long, value_name = "MS")]
    group_consumer_heartbeat_interval_ms: Option<u64>,
    /// KIP-848 groups: how long a silent member (or a static member away) keeps its place
    /// (Kafka's `group.consumer.session.timeout.ms`; default 45000).
    #[arg(long, value_name = "MS")]
    group_consumer_session_timeout_ms: Option<u64>,
    /// Classic groups: the most members a group takes; a new member beyond it is
    /// GROUP_MAX_SIZE_REACHED (Kafka's `group.max.size`; default 2147483647).
    #[arg(long, value_name = "N")]
    group_max_size: Option<usize>,
    /// KIP-848 groups: the most members a group takes (Kafka's `group.consumer.max.size`;
    /// default 2147483647).
    #[arg(long, value_name = "N")]
    group_consumer_max_size: Option<usize>,
}

/// Starts the cluster, prints where it is, runs until ctrl-c, shuts it down.
pub async fn run(args: DevArgs, json: bool) -> anyhow::Result<ExitCode> {
    let DevArgs {
        data_dir,
        base_port,
        write_topology,
        kafka_bootstrap_file,
        metrics,
        group_consumer_heartbeat_interval_ms,
        group_consumer_session_timeout_ms,
        group_max_size,
        group_consumer_max_size,
    } = args;
    let temporary = data_dir.is_none();
    let defaults = EmbeddedOptions::default();
    let ms = |value: Option<u64>, default| value.map_or(default, std::time::Duration::from_millis);
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        data_dir,
        base_port,
        metrics_endpoints: metrics,
        group_consumer_heartbeat_interval: ms(
            group_consumer_heartbeat_interval_ms,
            defaults.group_consumer_heartbeat_interval,
        ),
        group_consumer_session_timeout: ms(
            group_consumer_session_timeout_ms,
            defaults.group_consumer_session_timeout,
        ),
        group_max_sizes: (
            group_max_size.unwrap_or(defaults.group_max_sizes.0),
            group_consumer_max_size.unwrap_or(defaults.group_max_sizes.1),
        ),
        ..defaults
    })
    .await?;
    let metrics_of = |id| {
        cluster
            .metrics_address(id)
            .map(|a| format!("http://{a}/metrics"))
    };
    let path = match write_topology {
        Some(path) => {
            std::fs::copy(cluster.topology_path(), &path)
                .with_context(|| format!("cannot write the topology to {}", path.display()))?;
            path
        }
        None => cluster.topology_path().to_path_buf(),
    };
    let topology = cluster.topology();
    let kafka_bootstrap = cluster.kafka_bootstrap().join(",");
    if let Some(file) = &kafka_bootstrap_file {
        std::fs::write(file, format!("{kafka_bootstrap}\n")).with_context(|| {
            format!(
                "cannot write the Kafka bootstrap list to {}",
                file.display()
            )
        })?;
    }
    if json {
        minibroker::outln!(
            "{}",
            json!({"topology": path, "data_dir": cluster.dir(), "kafka_bootstrap": kafka_bootstrap,
                "coordinators": topology.coordinators.iter().map(|n| json!({"id": n.id, "address": n.address, "metrics": metrics_of(n.id)})).collect::<Vec<_>>(),
                "leaders": topology.leaders.iter().map(|n| json!({"id": n.id, "address": n.address, "metrics": metrics_of(n.id)})).collect::<Vec<_>>()})
        );
    } else {
        minibroker::outln!("mini-broker dev cluster is running (ctrl-c to stop)");
        minibroker::outln!("  topology: {}", path.display());
        minibroker::outln!("  data:     {}", cluster.dir().display());
        minibroker::outln!("  kafka:    {kafka_bootstrap}");
        for n in &topology.coordinators {
            minibroker::outln!("  coordinator {:>3}  {}", n.id, n.address);
        }
        if metrics {
            for n in topology.coordinators.iter().chain(&topology.leaders) {
                if let Some(url) = metrics_of(n.id) {
                    minibroker::outln!("  metrics     {:>3}  {url}", n.id);
                }
            }
        }
        for n in &topology.leaders {
            let parts: Vec<String> = topology
                .partitions_led_by(n.id)
                .iter()
                .map(|(t, p)| format!("{t}-{p}"))
                .collect();
            minibroker::outln!(
                "  leader      {:>3}  {}  ({})",
                n.id,
                n.address,
                parts.join(", ")
            );
        }
        minibroker::outln!("\ntry:\n  export TOPOLOGY={}", path.display());
        minibroker::outln!("  minibroker produce --transactional-id app-1 --records 100 --per-txn 10 --abort-every 3");
        minibroker::outln!("  minibroker consume --from-beginning");
        minibroker::outln!("  minibroker transactions list");
        minibroker::outln!("  minibroker groups list");
        minibroker::outln!("  kcat -b {kafka_bootstrap} -L");
    }
    let signal = stop_signal().await;
    let dir = cluster.dir().to_path_buf();
    cluster.shutdown().await?;
    if temporary {
        eprintln!(
            "{}: dev cluster stopped, {} removed",
            signal.name(),
            dir.display()
        );
    } else {
        eprintln!(
            "{}: dev cluster stopped, data kept in {}",
            signal.name(),
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
