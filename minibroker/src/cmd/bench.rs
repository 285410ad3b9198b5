//! `minibroker bench`: the transactional producer against the idempotent one
//! ([`minibroker::bench`]), on the given cluster or on an embedded one started for the run.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use minibroker::bench::{BenchOptions, BenchReport};
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
    /// Records per transaction.
    #[arg(long, default_value_t = 100)]
    per_txn: usize,
    /// Records per Produce request.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Commit interval of the paced phase, ms.
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// Topic.
    #[arg(long, default_value = "input")]
    topic: String,
}

/// Runs the three phases and prints their table (or the report as JSON).
pub async fn run(target: Target, args: BenchArgs, json: bool) -> anyhow::Result<ExitCode> {
    let options = BenchOptions {
        topic: args.topic,
        duration: Duration::from_secs(args.seconds.max(1)),
        record_size: args.record_size,
        records_per_txn: args.per_txn.max(1),
        batch: args.batch.max(1),
        commit_interval: Duration::from_millis(args.commit_interval_ms),
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
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// One row per phase, then the overhead ratio.
fn print_table(report: &BenchReport) {
    println!(
        "{:<24} {:>12} {:>10} {:>8} {:>10} {:>10}",
        "PHASE", "RECORDS/S", "MIB/S", "TXNS", "COMMIT P50", "COMMIT P99"
    );
    for p in [
        &report.idempotent,
        &report.transactional_paced,
        &report.transactional_saturated,
    ] {
        println!(
            "{:<24} {:>12.0} {:>10.2} {:>8} {:>8.1}ms {:>8.1}ms",
            p.name,
            p.records_per_sec,
            p.mib_per_sec,
            p.transactions,
            p.commit_p50_ms,
            p.commit_p99_ms
        );
    }
    println!(
        "overhead ratio (idempotent / transactional saturated): {:.2}x",
        report.overhead_ratio
    );
}
