//! `minibroker demo`: the seed's fencing story on an embedded cluster, verified by the
//! read_committed checker ([`minibroker::demo`]). Exit status: the checker's verdict.
//!
//! With `--json` the story goes to stderr and stdout holds one JSON document (the summary);
//! `--timeline FILE` also draws the story as an SVG sequence diagram. Ctrl-C or SIGTERM stops the
//! embedded cluster and removes its temporary directory before exiting (130 / 143).

use std::process::ExitCode;

use clap::Args;
use minibroker::{EmbeddedCluster, EmbeddedOptions};

use super::stop_signal;

/// Arguments of `demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Transactions instance A commits before it stalls.
    #[arg(long, default_value_t = 3)]
    transactions: usize,
    /// Records per partition per transaction.
    #[arg(long, default_value_t = 2)]
    records: usize,
    /// Write the story as an SVG sequence diagram to this file.
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<std::path::PathBuf>,
    /// DANGER: run partition leaders without the epoch check (the checker must fail).
    #[arg(long, hide = true)]
    unsafe_skip_epoch_check: bool,
}

/// Tells the story, prints the summary as JSON if asked, and fails if the checker did.
pub async fn run(args: DemoArgs, json: bool) -> anyhow::Result<ExitCode> {
    let stop = stop_signal();
    tokio::pin!(stop);
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        unsafe_skip_epoch_check: args.unsafe_skip_epoch_check,
        ..EmbeddedOptions::default()
    })
    .await?;
    let options = minibroker::demo::DemoOptions {
        committed_transactions: args.transactions,
        records_per_partition: args.records,
        unsafe_skip_epoch_check: args.unsafe_skip_epoch_check,
        verbose: true,
        story_on_stderr: json,
        timeline: args.timeline,
    };
    let outcome = tokio::select! {
        summary = minibroker::demo::run_on(&cluster, &options) => Ok(summary),
        signal = &mut stop => Err(signal),
    };
    let dir = cluster.dir().to_path_buf();
    cluster.shutdown().await?;
    let summary = match outcome {
        Ok(summary) => summary?,
        Err(signal) => {
            eprintln!(
                "{}: demo interrupted; the embedded cluster is stopped and {} removed",
                signal.name(),
                dir.display()
            );
            return Ok(signal.exit_code());
        }
    };
    if json {
        minibroker::outln!("{}", serde_json::to_string(&summary)?);
    }
    Ok(if summary.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
