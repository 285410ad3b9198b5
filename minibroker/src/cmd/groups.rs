//! `minibroker groups list|describe`, like Kafka's `kafka-consumer-groups.sh --list /
//! --describe`: the consumer groups the coordinators hold (the Kafka face's classic and
//! KIP-848 groups, and the groups known only by their committed offsets), each group's
//! members with their epochs and partitions, and its committed offsets with the lag of each
//! partition. Read-only.
//!
//! Lag is counted to the partition's last stable offset (LSO): what a read_committed consumer
//! can still read; the high watermark is shown beside it (the records of open transactions lie
//! between the two).

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use clap::Subcommand;
use producer_client::{Admin, ClientConfig, TopicPartition};
use serde_json::json;

/// `groups` subcommands.
#[derive(Subcommand, Debug)]
pub enum GroupsCommand {
    /// Every group on every coordinator.
    List,
    /// One group: members, partitions, committed offsets and lag.
    Describe {
        /// The group id.
        group: String,
    },
}

/// Runs a `groups` subcommand.
pub async fn run(
    config: ClientConfig,
    command: GroupsCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(config.with_max_retries(15))?;
    match command {
        GroupsCommand::List => list(&admin, json).await?,
        GroupsCommand::Describe { group } => describe(&admin, &group, json).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Every group, one line each.
async fn list(admin: &Admin, json: bool) -> anyhow::Result<()> {
    let groups = admin.list_groups().await?;
    if json {
        let list: Vec<_> = groups
            .iter()
            .map(|(c, g)| {
                json!({"group_id": g.group_id, "type": g.group_type, "state": g.state,
                "members": g.members, "coordinator_id": c})
            })
            .collect();
        minibroker::outln!("{}", serde_json::to_string(&list)?);
    } else if groups.is_empty() {
        minibroker::outln!("no consumer groups");
    } else {
        minibroker::outln!(
            "{:<32} {:<9} {:<20} {:>7} {:>11}",
            "GROUP",
            "TYPE",
            "STATE",
            "MEMBERS",
            "COORDINATOR"
        );
        for (c, g) in groups {
            let kind = if g.group_type.is_empty() {
                "-"
            } else {
                &g.group_type
            };
            minibroker::outln!(
                "{:<32} {:<9} {:<20} {:>7} {:>11}",
                g.group_id,
                kind,
                g.state,
                g.members,
                c
            );
        }
    }
    Ok(())
}

/// One partition of a group's report: its committed offset, the partition's ends, and its
/// owner.
struct PartitionRow {
    tp: TopicPartition,
    committed: Option<i64>,
    /// (high watermark, LSO).
    ends: Option<(i64, i64)>,
    owner: Option<String>,
}

impl PartitionRow {
    /// LSO - committed, when both are known.
    fn lag(&self) -> Option<i64> {
        let committed = self.committed?;
        let (_, lso) = self.ends?;
        Some((lso - committed).max(0))
    }
}

/// One group in detail.
async fn describe(admin: &Admin, group: &str, json: bool) -> anyhow::Result<()> {
    let d = admin.describe_group(group).await?;
    // Every partition the group commits to or a member holds, with its owner.
    let mut rows: BTreeMap<TopicPartition, PartitionRow> = BTreeMap::new();
    let row = |tp: TopicPartition| PartitionRow {
        tp,
        committed: None,
        ends: None,
        owner: None,
    };
    for o in &d.committed {
        let tp = TopicPartition::new(o.topic.clone(), o.partition);
        rows.entry(tp.clone()).or_insert_with(|| row(tp)).committed = Some(o.offset);
    }
    for m in &d.members {
        for p in &m.assigned {
            let tp = TopicPartition::new(p.topic.clone(), p.partition);
            rows.entry(tp.clone()).or_insert_with(|| row(tp)).owner = Some(m.member_id.clone());
        }
    }
    let topics: BTreeSet<String> = rows.keys().map(|tp| tp.topic.clone()).collect();
    for topic in topics {
        // A topic the cluster does not know (offsets left from an older topology) has no ends.
        if let Ok(ends) = admin.end_offsets(&topic).await {
            for (partition, end) in ends {
                if let Some(r) = rows.get_mut(&TopicPartition::new(topic.clone(), partition)) {
                    r.ends = Some(end);
                }
            }
        }
    }
    if json {
        let members: Vec<_> = d
            .members
            .iter()
            .map(|m| {
                let assigned: Vec<String> = m
                    .assigned
                    .iter()
                    .map(|p| format!("{}-{}", p.topic, p.partition))
                    .collect();
                json!({"member_id": m.member_id, "instance_id": m.instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "member_epoch": m.member_epoch, "assigned": assigned})
            })
            .collect();
        let partitions: Vec<_> = rows
            .values()
            .map(|r| {
                json!({"topic": r.tp.topic, "partition": r.tp.partition,
                "committed": r.committed, "high_watermark": r.ends.map(|e| e.0),
                "last_stable_offset": r.ends.map(|e| e.1), "lag": r.lag(), "owner": r.owner})
            })
            .collect();
        minibroker::outln!(
            "{}",
            serde_json::to_string(&json!({"group_id": d.group_id, "type": d.group_type,
            "state": d.state, "epoch": d.epoch, "protocol": d.protocol,
            "coordinator_id": d.coordinator_id, "members": members, "partitions": partitions}))?
        );
        return Ok(());
    }
    let kind = if d.group_type.is_empty() {
        "known by its offsets"
    } else {
        &d.group_type
    };
    let epoch = if d.group_type == "consumer" {
        "group epoch"
    } else {
        "generation"
    };
    minibroker::outln!(
        "group {} ({kind}), {}, {epoch} {}, protocol {}, coordinator {}",
        d.group_id,
        d.state,
        d.epoch,
        if d.protocol.is_empty() {
            "-"
        } else {
            &d.protocol
        },
        d.coordinator_id
    );
    minibroker::outln!();
    if d.members.is_empty() {
        minibroker::outln!("no members");
    } else {
        minibroker::outln!(
            "{:<40} {:<12} {:<16} {:<16} {:>6}  PARTITIONS",
            "MEMBER",
            "INSTANCE",
            "CLIENT",
            "HOST",
            "EPOCH"
        );
        for m in &d.members {
            let assigned: Vec<String> = m
                .assigned
                .iter()
                .map(|p| format!("{}-{}", p.topic, p.partition))
                .collect();
            minibroker::outln!(
                "{:<40} {:<12} {:<16} {:<16} {:>6}  {}",
                m.member_id,
                if m.instance_id.is_empty() {
                    "-"
                } else {
                    &m.instance_id
                },
                m.client_id,
                m.client_host,
                m.member_epoch,
                if assigned.is_empty() {
                    "-".to_string()
                } else {
                    assigned.join(",")
                }
            );
        }
    }
    minibroker::outln!();
    if rows.is_empty() {
        minibroker::outln!("no committed offsets");
        return Ok(());
    }
    let dash = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
    minibroker::outln!(
        "{:<24} {:>9} {:>10} {:>10} {:>14} {:>8}  OWNER",
        "TOPIC",
        "PARTITION",
        "COMMITTED",
        "LSO",
        "HIGH-WATERMARK",
        "LAG"
    );
    for r in rows.values() {
        minibroker::outln!(
            "{:<24} {:>9} {:>10} {:>10} {:>14} {:>8}  {}",
            r.tp.topic,
            r.tp.partition,
            dash(r.committed),
            dash(r.ends.map(|e| e.1)),
            dash(r.ends.map(|e| e.0)),
            dash(r.lag()),
            r.owner.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}
