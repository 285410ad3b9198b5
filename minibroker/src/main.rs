//! `minibroker`: the mini-broker command line. See `minibroker --help`.
//!
//! This file only parses the arguments, sets up tracing and the runtime, and dispatches to one
//! file per command under `cmd/`.

use std::process::ExitCode;

use clap::Parser;

mod cmd;

/// mini-broker: Kafka's producer fencing (InitProducerId, epochs, transactions), runnable.
#[derive(Parser, Debug)]
#[command(name = "minibroker", version, about)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    target: cmd::Target,
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cmd::dispatch(cli.command, cli.target, cli.json)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
