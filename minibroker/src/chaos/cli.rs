//! The `minibroker chaos` and `minibroker chaos-worker` commands: flags, runs, the report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::checker::AnomalyKind;
use super::worker::WorkerOptions;
use super::{ChaosOptions, RunReport};

/// `minibroker chaos` flags.
#[derive(Clone, Debug, clap::Args)]
pub struct ChaosArgs {
    /// Seed of the first run (run k uses seed + k).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of runs.
    #[arg(long, default_value_t = 1)]
    pub runs: u64,
    /// Seconds of faults per run.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Concurrent transactional ids.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Records per transaction.
    #[arg(long, default_value_t = 4)]
    pub records_per_txn: u64,
    /// Mean milliseconds between faults.
    #[arg(long, default_value_t = 700)]
    pub fault_interval_ms: u64,
    /// Keep each run's directory (history.jsonl, node logs, data) under this directory.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// DANGER: leaders skip the epoch check; the checker must report zombie writes.
    #[arg(long, hide = true)]
    pub unsafe_skip_epoch_check: bool,
    /// Cut the power of nodes too: each node keeps its data on an ext4 disk of its own whose
    /// device has a volatile write cache (`cluster::power_cut`), and a `power-cut` freezes a
    /// node, keeps only what its disk's media hold (dirty pages, uncommitted file-system
    /// metadata and writes never flushed from the device's cache are gone) and starts it again
    /// on that. Needs root, loop devices and mkfs.ext4.
    #[arg(long)]
    pub power_cuts: bool,
    /// The producers' client: our library over gRPC, or a real Kafka client in Python
    /// (librdkafka through confluent-kafka, or kafka-python) over the nodes' Kafka listeners,
    /// transaction version 1.
    #[arg(long, value_enum, default_value_t = ChaosClient::Grpc)]
    pub client: ChaosClient,
    /// The Python interpreter that imports the Kafka client (with `--client librdkafka` or
    /// `kafka-python`).
    #[arg(long, env = "MINIBROKER_KAFKA_PYTHON", default_value = "python3")]
    pub python: PathBuf,
}

/// Which client the chaos producers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosClient {
    /// Our client library over gRPC (`minibroker chaos-worker`).
    Grpc,
    /// librdkafka through confluent-kafka, over Kafka's protocol.
    Librdkafka,
    /// kafka-python, over Kafka's protocol.
    KafkaPython,
}

/// `minibroker chaos-worker` flags (started by `chaos`, not by hand).
#[derive(Clone, Debug, clap::Args)]
pub struct WorkerArgs {
    /// Node addresses, comma-separated.
    #[arg(long = "nodes", value_delimiter = ',')]
    pub bootstrap: Vec<String>,
    /// Transactional id.
    #[arg(long)]
    pub transactional_id: String,
    /// Instance name.
    #[arg(long)]
    pub instance: String,
    /// Topic.
    #[arg(long)]
    pub topic: String,
    /// Partitions of the topic.
    #[arg(long)]
    pub partitions: i32,
    /// Records per transaction.
    #[arg(long)]
    pub records_per_txn: u64,
    /// Chance of an aborted transaction.
    #[arg(long)]
    pub abort_ratio: f64,
    /// Transaction timeout.
    #[arg(long)]
    pub transaction_timeout_ms: i32,
    /// Random seed.
    #[arg(long)]
    pub seed: u64,
}

/// Runs `chaos-worker`.
pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    super::worker::run(WorkerOptions {
        bootstrap: args.bootstrap,
        transactional_id: args.transactional_id,
        instance: args.instance,
        topic: args.topic,
        partitions: args.partitions,
        records_per_txn: args.records_per_txn,
        abort_ratio: args.abort_ratio,
        transaction_timeout_ms: args.transaction_timeout_ms,
        seed: args.seed,
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `chaos`: every run, a table per run (stderr with `--json`), exit 1 on any anomaly.
pub async fn chaos(args: ChaosArgs, json: bool) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("finding the minibroker executable")?;
    let mut reports = Vec::new();
    for k in 0..args.runs.max(1) {
        let mut options = ChaosOptions::new(exe.clone());
        options.seed = args.seed + k;
        options.duration = Duration::from_secs(args.duration.max(1));
        options.producers = args.producers.max(1);
        options.records_per_txn = args.records_per_txn.max(1);
        options.fault_interval = Duration::from_millis(args.fault_interval_ms.max(10));
        options.keep = args
            .keep
            .as_ref()
            .map(|d| d.join(format!("run-{}", options.seed)));
        options.unsafe_skip_epoch_check = args.unsafe_skip_epoch_check;
        options.power_cuts = args.power_cuts;
        options.kafka_client = match args.client {
            ChaosClient::Grpc => None,
            ChaosClient::Librdkafka => Some("librdkafka"),
            ChaosClient::KafkaPython => Some("kafka-python"),
        }
        .map(|library| super::KafkaClient {
            library,
            python: args.python.clone(),
        });
        eprintln!(
            "chaos run {}/{} (seed {}): {} producers ({:?}), faults for {} s",
            k + 1,
            args.runs.max(1),
            options.seed,
            options.producers,
            args.client,
            options.duration.as_secs()
        );
        let report = super::run(options).await?;
        eprint!("{}", table(&report));
        reports.push(report);
    }
    let failed = reports.iter().any(|r| !r.verdict.passed());
    if json {
        crate::outln!(
            "{}",
            serde_json::to_string(&serde_json::json!({
                "passed": !failed,
                "runs": reports,
            }))?
        );
    }
    if reports.len() > 1 {
        eprint!("{}", totals(&reports));
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One run as a table.
pub fn table(report: &RunReport) -> String {
    let v = &report.verdict;
    let mut out = String::new();
    let faults: Vec<String> = report
        .faults
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    out += &format!(
        "  transactions: {} committed, {} aborted, {} unknown; {} records acked, {} read_committed\n",
        v.committed, v.aborted, v.unknown, v.acked_records, v.committed_records_read
    );
    out += &format!(
        "  producers: {} instances, {} requests refused as fenced\n",
        v.instances, v.fenced_requests
    );
    out += &format!("  faults: {}\n", faults.join(", "));
    if report.partial_writebacks > 0 {
        out += &format!(
            "  power faults after a partial write-back of the device cache: {}\n",
            report.partial_writebacks
        );
    }
    out += &format!("  {:<32} {:>6}\n", "anomaly", "count");
    for (kind, n) in v.by_kind() {
        out += &format!("  {:<32} {:>6}\n", kind.name(), n);
    }
    for a in v.anomalies.iter().take(20) {
        out += &format!("  ! {}: {}\n", a.kind, a.detail);
    }
    if let Some(h) = &report.history {
        out += &format!("  history: {}\n", h.display());
    }
    out += &format!(
        "  verdict: {} ({:.1} s)\n",
        if v.passed() { "PASS" } else { "FAIL" },
        report.seconds
    );
    out
}

fn totals(reports: &[RunReport]) -> String {
    let mut anomalies = std::collections::BTreeMap::<AnomalyKind, usize>::new();
    let (mut committed, mut faults) = (0, 0);
    for r in reports {
        committed += r.verdict.committed;
        faults += r.faults.values().sum::<usize>();
        for (k, n) in r.verdict.by_kind() {
            *anomalies.entry(k).or_default() += n;
        }
    }
    let mut out = format!(
        "total: {} runs, {committed} committed transactions, {faults} faults; anomalies: ",
        reports.len()
    );
    let list: Vec<String> = anomalies.iter().map(|(k, n)| format!("{k} {n}")).collect();
    out += &list.join(", ");
    out.push('\n');
    out
}
