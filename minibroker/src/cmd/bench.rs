//! `minibroker bench`: the producer pipeline against the leader's own gRPC figure, and the
//! transactional producer against the idempotent one
//! ([`minibroker::bench`]), on the given cluster or on an embedded one started for the run.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use minibroker::bench::BenchOptions;
use minibroker::EmbeddedCluster;

use super::Target;

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Seconds per phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Record value size in bytes.
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Commit interval of the transactional phase, ms.
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// The producers' linger.ms.
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    /// The producers' batch.size, bytes.
    #[arg(long, default_value_t = 128 * 1024)]
    batch_size: usize,
    /// Producers of the concurrent phase.
    #[arg(long, default_value_t = 8)]
    producers: usize,
    /// Topic.
    #[arg(long, default_value = "input")]
    topic: String,
}

/// Runs every phase and prints their table (or the report as JSON).
pub async fn run(target: Target, args: BenchArgs, json: bool) -> anyhow::Result<ExitCode> {
    let options = BenchOptions {
        topic: args.topic,
        duration: Duration::from_secs(args.seconds.max(1)),
        record_size: args.record_size,
        commit_interval: Duration::from_millis(args.commit_interval_ms),
        linger: Duration::from_millis(args.linger_ms),
        batch_size: args.batch_size,
        producers: args.producers,
    };
    let (config, cluster) = if target.given() {
        (target.config()?, None)
    } else {
        let cluster = EmbeddedCluster::start().await?;
        if !json {
            eprintln!(
                "benchmarking against an embedded cluster in {}",
                cluster.dir().display()
            );
        }
        (cluster.client_config(), Some(cluster))
    };
    let report = minibroker::bench::run(config, options, |p| {
        if !json {
            eprintln!(
                "{:<24} {:>9.0} records/s  {:>7.2} MiB/s",
                p.name, p.records_per_sec, p.mib_per_sec
            );
        }
    })
    .await?;
    if let Some(cluster) = cluster {
        let _ = cluster.shutdown().await;
    }
    if json {
        minibroker::outln!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    Ok(ExitCode::SUCCESS)
}
