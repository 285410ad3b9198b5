//! `minibroker demo`: the seed's fencing story on an embedded cluster, verified by the
//! read_committed checker ([`minibroker::demo`]). Exit status: the checker's verdict.

use std::process::ExitCode;

use clap::Args;

/// Arguments of `demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Transactions instance A commits before it stalls.
    #[arg(long, default_value_t = 3)]
    transactions: usize,
    /// Records per partition per transaction.
    #[arg(long, default_value_t = 2)]
    records: usize,
    /// DANGER: run partition leaders without the epoch check (the checker must fail).
    #[arg(long, hide = true)]
    unsafe_skip_epoch_check: bool,
}

/// Tells the story, prints the summary as JSON if asked, and fails if the checker did.
pub async fn run(args: DemoArgs, json: bool) -> anyhow::Result<ExitCode> {
    let summary = minibroker::demo::run(minibroker::demo::DemoOptions {
        committed_transactions: args.transactions,
        records_per_partition: args.records,
        unsafe_skip_epoch_check: args.unsafe_skip_epoch_check,
        verbose: true,
    })
    .await?;
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(if summary.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
