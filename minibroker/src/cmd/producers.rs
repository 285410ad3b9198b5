//! `minibroker producers TOPIC PARTITION`: a partition leader's producer state (DescribeProducers),
//! as a table or JSON. Read-only.

use std::process::ExitCode;

use clap::Args;
use producer_client::{Admin, ClientConfig};
use serde_json::json;

/// Arguments of `producers`.
#[derive(Args, Debug)]
pub struct ProducersArgs {
    /// Topic.
    topic: String,
    /// Partition.
    partition: i32,
}

/// Asks the partition's leader and prints its producer table.
pub async fn run(
    config: ClientConfig,
    args: ProducersArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let ProducersArgs { topic, partition } = args;
    let admin = Admin::new(config.with_max_retries(15))?;
    let producers = admin.describe_producers(&topic, partition).await?;
    if json {
        let list: Vec<_> = producers
            .iter()
            .map(|p| {
                json!({"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
                "last_sequence": p.last_sequence, "last_timestamp_ms": p.last_timestamp_ms,
                "current_txn_start_offset": p.current_txn_start_offset,
                "coordinator_generation": p.coordinator_generation})
            })
            .collect();
        minibroker::outln!("{}", serde_json::to_string(&list)?);
    } else if producers.is_empty() {
        minibroker::outln!("no producer state on {topic}-{partition}");
    } else {
        minibroker::outln!(
            "{:>8} {:>6} {:>9} {:>14} {:>11}",
            "PID",
            "EPOCH",
            "LAST SEQ",
            "TXN START OFF",
            "COORD GEN"
        );
        for p in producers {
            minibroker::outln!(
                "{:>8} {:>6} {:>9} {:>14} {:>11}",
                p.producer_id,
                p.producer_epoch,
                p.last_sequence,
                if p.current_txn_start_offset < 0 {
                    "-".to_string()
                } else {
                    p.current_txn_start_offset.to_string()
                },
                p.coordinator_generation
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
