//! `minibroker dev`: an embedded cluster in the foreground until ctrl-c, with its topology file
//! and addresses (gRPC and the Kafka bootstrap) printed (text or JSON) so other commands and
//! Kafka clients can use it.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use minibroker::{EmbeddedCluster, EmbeddedOptions};
use serde_json::json;

use super::ctrl_c;

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
}

/// Starts the cluster, prints where it is, runs until ctrl-c, shuts it down.
pub async fn run(args: DevArgs, json: bool) -> anyhow::Result<ExitCode> {
    let DevArgs {
        data_dir,
        base_port,
        write_topology,
        kafka_bootstrap_file,
    } = args;
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        data_dir,
        base_port,
        ..EmbeddedOptions::default()
    })
    .await?;
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
        println!(
            "{}",
            json!({"topology": path, "data_dir": cluster.dir(), "kafka_bootstrap": kafka_bootstrap,
                "coordinators": topology.coordinators.iter().map(|n| json!({"id": n.id, "address": n.address})).collect::<Vec<_>>(),
                "leaders": topology.leaders.iter().map(|n| json!({"id": n.id, "address": n.address})).collect::<Vec<_>>()})
        );
    } else {
        println!("mini-broker dev cluster is running (ctrl-c to stop)");
        println!("  topology: {}", path.display());
        println!("  data:     {}", cluster.dir().display());
        println!("  kafka:    {kafka_bootstrap}");
        for n in &topology.coordinators {
            println!("  coordinator {:>3}  {}", n.id, n.address);
        }
        for n in &topology.leaders {
            let parts: Vec<String> = topology
                .partitions_led_by(n.id)
                .iter()
                .map(|(t, p)| format!("{t}-{p}"))
                .collect();
            println!(
                "  leader      {:>3}  {}  ({})",
                n.id,
                n.address,
                parts.join(", ")
            );
        }
        println!("\ntry:\n  export TOPOLOGY={}", path.display());
        println!("  minibroker produce --transactional-id app-1 --records 100 --per-txn 10 --abort-every 3");
        println!("  minibroker consume --from-beginning");
        println!("  minibroker transactions list");
        println!("  kcat -b {kafka_bootstrap} -L");
    }
    ctrl_c().await;
    if !json {
        println!("stopping");
    }
    cluster.shutdown().await?;
    Ok(ExitCode::SUCCESS)
}
