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
    /// Print machine-readable JSON instead of text: stdout holds only JSON (errors too, as
    /// `{"error": CODE, "message": ...}`); stories and progress go to stderr.
    #[arg(long, global = true)]
    json: bool,
    /// Log lines (RUST_LOG, default: errors only) as text or json; always on stderr.
    #[arg(long, global = true, env = "LOG_FORMAT", default_value_t = cluster::logs::LogFormat::Text)]
    log_format: cluster::logs::LogFormat,
    #[command(flatten)]
    target: cmd::Target,
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cluster::logs::init(cli.log_format, "error");
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
            let message = sentence(&e);
            if cli.json {
                minibroker::outln!(
                    "{}",
                    serde_json::json!({"error": error_code(&e), "message": message})
                );
            }
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes in one sentence, each cause once: a cause whose text the sentence
/// already holds (an OS error its wrapper quoted) is not repeated.
fn sentence(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The `error` key of a JSON error: the protocol's code name when the cluster answered one,
/// else what kind of failure it was.
fn error_code(e: &anyhow::Error) -> &'static str {
    if let Some(e) = e.downcast_ref::<producer_client::Error>() {
        return e.code_name();
    }
    if e.downcast_ref::<cmd::Unreachable>().is_some() {
        return "CLUSTER_UNREACHABLE";
    }
    "ERROR"
}
