//! `minibroker process`: the exactly-once consume-transform-produce application
//! ([`minibroker::process`]) with progress on stderr every second and a summary at the end.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use producer_client::ClientConfig;

use super::ctrl_c;

/// Arguments of `process`.
#[derive(Args, Debug)]
pub struct ProcessArgs {
    /// Input topic.
    #[arg(long, default_value = "input")]
    input: String,
    /// Output topic.
    #[arg(long, default_value = "output")]
    output: String,
    /// Consumer group (its offsets are committed in the transactions).
    #[arg(long, default_value = "processor")]
    group: String,
    /// Transactional id.
    #[arg(long, default_value = "processor-1")]
    transactional_id: String,
    /// Largest number of records per transaction.
    #[arg(long, default_value_t = 500)]
    max_per_txn: usize,
    /// Exit once the input was idle this many milliseconds (default: run until ctrl-c).
    #[arg(long)]
    until_idle_ms: Option<u64>,
}

/// Runs the processor until ctrl-c (or idle), then prints what it did.
pub async fn run(config: ClientConfig, args: ProcessArgs, json: bool) -> anyhow::Result<ExitCode> {
    let options = minibroker::process::ProcessOptions {
        input: args.input,
        output: args.output,
        group: args.group,
        transactional_id: args.transactional_id,
        max_records_per_txn: args.max_per_txn.max(1),
        stop_when_idle: args.until_idle_ms.map(Duration::from_millis),
    };
    let mut last = Instant::now();
    let stats = minibroker::process::run(config, options, ctrl_c(), |s| {
        if !json && last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            eprintln!(
                "processed {} records in {} transactions (PID {}, epoch {})",
                s.records, s.transactions, s.producer_id, s.epoch
            );
        }
    })
    .await?;
    if json {
        minibroker::outln!("{}", serde_json::to_string(&stats)?);
    } else {
        minibroker::outln!(
            "processed {} records in {} committed transactions ({} aborted)",
            stats.records,
            stats.transactions,
            stats.aborted
        );
    }
    Ok(ExitCode::SUCCESS)
}
