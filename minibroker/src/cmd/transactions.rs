//! `minibroker transactions list|describe`: the coordinators' view of transactional ids
//! (ListTransactions, DescribeTransactions), as tables or JSON. Read-only.

use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use producer_client::{Admin, ClientConfig};
use serde_json::json;

/// `transactions` subcommands.
#[derive(Subcommand, Debug)]
pub enum TransactionsCommand {
    /// Every transactional id on every coordinator.
    List {
        /// Only these states (e.g. ongoing, prepare-commit).
        #[arg(long = "state", value_enum)]
        states: Vec<StateArg>,
    },
    /// One transactional id in detail.
    Describe {
        /// The transactional id.
        id: String,
    },
}

/// A transaction state, as `--state` spells it.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum StateArg {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl From<StateArg> for proto::TxnState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Empty => proto::TxnState::Empty,
            StateArg::Ongoing => proto::TxnState::Ongoing,
            StateArg::PrepareCommit => proto::TxnState::PrepareCommit,
            StateArg::PrepareAbort => proto::TxnState::PrepareAbort,
            StateArg::CompleteCommit => proto::TxnState::CompleteCommit,
            StateArg::CompleteAbort => proto::TxnState::CompleteAbort,
        }
    }
}

/// The state's protocol name without its `TXN_STATE_` prefix.
fn state_name(state: i32) -> String {
    proto::TxnState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("TXN_STATE_").to_string())
        .unwrap_or_else(|_| format!("UNKNOWN({state})"))
}

/// Runs `transactions list` or `transactions describe`.
pub async fn run(
    config: ClientConfig,
    command: TransactionsCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(config)?;
    match command {
        TransactionsCommand::List { states } => list(&admin, states, json).await?,
        TransactionsCommand::Describe { id } => describe(&admin, &id, json).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Every transactional id on every coordinator, optionally only in `states`.
async fn list(admin: &Admin, states: Vec<StateArg>, json: bool) -> anyhow::Result<()> {
    let states: Vec<proto::TxnState> = states.into_iter().map(Into::into).collect();
    let list = admin.list_transactions(&states).await?;
    if json {
        let list: Vec<_> = list
            .iter()
            .map(|(c, t)| {
                json!({"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                "state": state_name(t.state), "coordinator_id": c})
            })
            .collect();
        minibroker::outln!("{}", serde_json::to_string(&list)?);
    } else if list.is_empty() {
        minibroker::outln!("no transactional ids");
    } else {
        minibroker::outln!(
            "{:<32} {:>8} {:<16} {:>11}",
            "TRANSACTIONAL ID",
            "PID",
            "STATE",
            "COORDINATOR"
        );
        for (c, t) in list {
            minibroker::outln!(
                "{:<32} {:>8} {:<16} {:>11}",
                t.transactional_id,
                t.producer_id,
                state_name(t.state),
                c
            );
        }
    }
    Ok(())
}

/// One transactional id in detail.
async fn describe(admin: &Admin, id: &str, json: bool) -> anyhow::Result<()> {
    let d = admin.describe_transaction(id).await?;
    let partitions: Vec<String> = d
        .partitions
        .iter()
        .map(|p| format!("{}-{}", p.topic, p.partition))
        .collect();
    if json {
        minibroker::outln!(
            "{}",
            json!({"transactional_id": d.transactional_id, "producer_id": d.producer_id,
                "producer_epoch": d.producer_epoch, "last_epoch": d.last_epoch,
                "previous_producer_id": d.previous_producer_id, "next_producer_id": d.next_producer_id,
                "state": state_name(d.state), "transaction_timeout_ms": d.transaction_timeout_ms,
                "partitions": partitions, "groups": d.groups,
                "transaction_start_ms": d.transaction_start_ms, "last_update_ms": d.last_update_ms,
                "age_ms": d.age_ms, "coordinator_id": d.coordinator_id})
        );
    } else {
        minibroker::outln!("transactional id   {}", d.transactional_id);
        minibroker::outln!("coordinator        {}", d.coordinator_id);
        minibroker::outln!("producer id        {}", d.producer_id);
        minibroker::outln!(
            "epoch              {} (last epoch {})",
            d.producer_epoch,
            d.last_epoch
        );
        minibroker::outln!(
            "previous/next PID  {} / {}",
            d.previous_producer_id,
            d.next_producer_id
        );
        minibroker::outln!("state              {}", state_name(d.state));
        minibroker::outln!("timeout            {} ms", d.transaction_timeout_ms);
        minibroker::outln!(
            "partitions         {}",
            if partitions.is_empty() {
                "-".into()
            } else {
                partitions.join(", ")
            }
        );
        minibroker::outln!(
            "groups             {}",
            if d.groups.is_empty() {
                "-".into()
            } else {
                d.groups.join(", ")
            }
        );
        minibroker::outln!("open for           {} ms", d.age_ms);
    }
    Ok(())
}
