//! `minibroker consume`: reads a topic with read_committed (default) or read_uncommitted, from
//! the end, the beginning or a group's committed offsets; one line (or JSON object) per record.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use producer_client::{Admin, ClientConfig, Consumer, ConsumerRecord, Isolation, TopicPartition};
use serde_json::json;

use super::ctrl_c;

/// `--isolation`.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum IsolationArg {
    /// Kafka's `read_committed` (also accepted with the underscore).
    #[value(alias = "read_committed")]
    ReadCommitted,
    /// Kafka's `read_uncommitted` (also accepted with the underscore).
    #[value(alias = "read_uncommitted")]
    ReadUncommitted,
}

/// Arguments of `consume`.
#[derive(Args, Debug)]
pub struct ConsumeArgs {
    /// Topic to read.
    #[arg(long, default_value = "input")]
    topic: String,
    /// What to see.
    #[arg(long, value_enum, default_value = "read-committed")]
    isolation: IsolationArg,
    /// Start at offset 0 (default: at the current end).
    #[arg(long)]
    from_beginning: bool,
    /// Start at this group's committed offsets.
    #[arg(long, conflicts_with = "from_beginning")]
    group: Option<String>,
    /// Keep waiting for new records (until ctrl-c).
    #[arg(long)]
    follow: bool,
    /// Stop after this many records.
    #[arg(long)]
    max: Option<usize>,
}

/// How many `--timeout`s a partition's leader may stay silent before `consume` says so (and,
/// without `--follow`, gives up).
const STALL_TIMEOUTS: u32 = 5;

/// Positions the consumer, then prints records until caught up (or `--max`, or ctrl-c with
/// `--follow`). A partition whose leader never answers is named on stderr after
/// [`STALL_TIMEOUTS`] × `timeout`; without `--follow` the command then fails instead of waiting
/// for ever.
pub async fn run(
    config: ClientConfig,
    args: ConsumeArgs,
    json: bool,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let isolation = match args.isolation {
        IsolationArg::ReadCommitted => Isolation::ReadCommitted,
        IsolationArg::ReadUncommitted => Isolation::ReadUncommitted,
    };
    let admin = Admin::new(config.clone())?;
    let mut consumer = Consumer::new(config, isolation)?;
    consumer.assign_topics(&[&args.topic]).await?;
    start_position(&admin, &mut consumer, &args, isolation).await?;
    let mut count = 0usize;
    let stop = ctrl_c();
    tokio::pin!(stop);
    let stall = timeout * STALL_TIMEOUTS;
    let mut last_progress = std::time::Instant::now();
    let mut warned = false;
    loop {
        let records = tokio::select! {
            _ = &mut stop => break,
            r = consumer.poll(Duration::from_millis(500)) => r?,
        };
        let empty = records.is_empty();
        if !empty {
            last_progress = std::time::Instant::now();
        } else if !warned && !consumer.caught_up() && last_progress.elapsed() >= stall {
            let silent = silent_partitions(&admin, &consumer).await;
            if !silent.is_empty() {
                let sentence = format!(
                    "no answer from {} for {:.0} s ({count} records read from the other partitions)",
                    silent.join(", "),
                    stall.as_secs_f64()
                );
                if !args.follow {
                    anyhow::bail!("{sentence}; is that leader running?");
                }
                eprintln!("warning: {sentence}; still waiting");
                warned = true;
            }
        }
        for r in records {
            // A closed stdout (`| head`) ends the command quietly.
            if writeln!(std::io::stdout().lock(), "{}", record_line(&r, json)).is_err() {
                return Ok(ExitCode::SUCCESS);
            }
            count += 1;
            if args.max.is_some_and(|m| count >= m) {
                break;
            }
        }
        if args.max.is_some_and(|m| count >= m) {
            break;
        }
        if empty && !args.follow && consumer.caught_up() {
            break;
        }
    }
    if !json {
        eprintln!("{count} records");
    }
    Ok(ExitCode::SUCCESS)
}

/// The assigned partitions whose leader never answered a fetch, with the leader's address.
async fn silent_partitions(admin: &Admin, consumer: &Consumer) -> Vec<String> {
    let metadata = admin.metadata().await.ok();
    consumer
        .assignment()
        .into_iter()
        .filter(|tp| consumer.watermarks(tp).is_none())
        .map(|tp| {
            let leader = metadata
                .as_ref()
                .and_then(|m| m.leader(&tp.topic, tp.partition))
                .map(|n| format!(" (leader {} at {})", n.node_id, n.address))
                .unwrap_or_default();
            format!("{tp}{leader}")
        })
        .collect()
}

/// The group's committed offsets, offset 0 (`--from-beginning`), or the current end (the LSO
/// for read_committed, the high watermark otherwise).
async fn start_position(
    admin: &Admin,
    consumer: &mut Consumer,
    args: &ConsumeArgs,
    isolation: Isolation,
) -> anyhow::Result<()> {
    if let Some(group) = &args.group {
        consumer.seek_to_committed(group).await?;
    } else if !args.from_beginning {
        for (partition, (hw, lso)) in admin.end_offsets(&args.topic).await? {
            let end = if isolation == Isolation::ReadCommitted {
                lso
            } else {
                hw
            };
            consumer.seek(&TopicPartition::new(&args.topic, partition), end)?;
        }
    }
    Ok(())
}

/// One record as a line of text or a JSON object.
fn record_line(r: &ConsumerRecord, json: bool) -> String {
    if json {
        format!(
            "{}",
            json!({"topic": r.partition.topic, "partition": r.partition.partition,
                "offset": r.offset, "key": String::from_utf8_lossy(&r.key),
                "value": String::from_utf8_lossy(&r.value), "producer_id": r.producer_id,
                "producer_epoch": r.producer_epoch, "transactional": r.is_transactional})
        )
    } else {
        format!(
            "{}@{:<6} pid={} epoch={} {}{}",
            r.partition,
            r.offset,
            r.producer_id,
            r.producer_epoch,
            if r.key.is_empty() {
                String::new()
            } else {
                format!("key={} ", String::from_utf8_lossy(&r.key))
            },
            String::from_utf8_lossy(&r.value)
        )
    }
}
