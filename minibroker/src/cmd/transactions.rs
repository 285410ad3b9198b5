//! `minibroker transactions list|describe|find-hanging|abort`, like Kafka's
//! `kafka-transactions.sh`: the coordinators' view of transactional ids (ListTransactions,
//! DescribeTransactions), as tables or JSON; hanging transactions; and ending one by hand.
//!
//! A transaction hangs when it holds back read_committed readers with nobody to end it:
//! - open (Ongoing or Prepare*) at its coordinator for longer than its timeout (the timeout
//!   scan should have aborted it: the coordinator is stuck, e.g. on markers it cannot deliver);
//! - open at a partition leader (it holds the LSO) while no coordinator has an open
//!   transaction for that PID (the coordinator lost its state, or a marker was lost).
//!
//! `abort ID` ends the first kind through the coordinator: an InitProducerId without an
//! expected (PID, epoch), exactly what a new instance of the application would send, so the
//! coordinator aborts the open transaction with markers at a new epoch and the producer that
//! held it is fenced. `abort --topic T --partition P --producer-id PID` ends the second kind: an
//! ABORT marker for that PID, written to that partition's leader at the next epoch and at the
//! coordinator generation the leader recorded for the PID; refused while a coordinator still
//! has the PID's transaction open (abort it by id then).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::{Subcommand, ValueEnum};
use minibroker::demo::timeline::{history_timeline, HistoryEntry};
use producer_client::{Admin, ClientConfig, RawRequests, TopicPartition};
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
    /// Every epoch a transactional id went through: cause, time, and the instance (client
    /// address) that caused it (the last 64, kept in `__transaction_state`).
    History {
        /// The transactional id.
        id: String,
        /// Also draw it as an SVG sequence diagram to this file (`-`: stdout, instead of the
        /// table).
        #[arg(long, value_name = "FILE.svg")]
        svg: Option<std::path::PathBuf>,
    },
    /// Transactions that hold read_committed readers back with nobody to end them.
    FindHanging,
    /// End a hanging transaction: by transactional id (through its coordinator, fencing its
    /// producer), or by partition and producer id (an ABORT marker at the leader).
    Abort {
        /// The transactional id whose open transaction to abort.
        #[arg(conflicts_with_all = ["topic", "partition", "producer_id"], required_unless_present = "producer_id")]
        id: Option<String>,
        /// Topic of a partition whose LSO the producer holds.
        #[arg(long, requires_all = ["partition", "producer_id"])]
        topic: Option<String>,
        /// That partition.
        #[arg(long, requires = "topic")]
        partition: Option<i32>,
        /// The producer id holding it.
        #[arg(long, requires = "topic")]
        producer_id: Option<i64>,
        /// With --topic: the cluster secret file. An ABORT marker is an internal request that
        /// leaders accept only from cluster members (docs/PROTOCOL.md section 12).
        #[arg(long, env = "CLUSTER_SECRET_FILE", requires = "topic")]
        cluster_secret_file: Option<std::path::PathBuf>,
        /// With --topic: the cluster's topology file (the marker is signed under it).
        #[arg(long = "topology-file", requires = "topic")]
        topology_file: Option<std::path::PathBuf>,
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
    let admin = Admin::new(config.clone())?;
    match command {
        TransactionsCommand::List { states } => list(&admin, states, json).await?,
        TransactionsCommand::Describe { id } => describe(&admin, &id, json).await?,
        TransactionsCommand::History { id, svg } => history(&admin, &id, svg, json).await?,
        TransactionsCommand::FindHanging => {
            let hanging = find_hanging(&admin).await?;
            print_hanging(&hanging, json)?;
        }
        TransactionsCommand::Abort { id: Some(id), .. } => {
            abort_by_id(&admin, &config, &id, json).await?
        }
        TransactionsCommand::Abort {
            topic: Some(topic),
            partition: Some(partition),
            producer_id: Some(pid),
            cluster_secret_file,
            topology_file,
            ..
        } => {
            let member = member_credentials(cluster_secret_file, topology_file)?;
            abort_on_partition(
                &admin,
                &config,
                &member,
                TopicPartition::new(topic, partition),
                pid,
                json,
            )
            .await?
        }
        TransactionsCommand::Abort { .. } => {
            bail!("transactions abort needs a transactional id, or --topic, --partition and --producer-id")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `history ID`: the id's epoch changes, oldest first.
async fn history(
    admin: &Admin,
    id: &str,
    svg: Option<std::path::PathBuf>,
    json: bool,
) -> anyhow::Result<()> {
    let d = admin.describe_transaction(id).await?;
    if let Some(path) = svg {
        let changes: Vec<HistoryEntry> = d
            .history
            .iter()
            .map(|c| HistoryEntry {
                producer_id: c.producer_id,
                epoch: c.producer_epoch,
                cause: c.cause.clone(),
                instance: c.instance.clone(),
            })
            .collect();
        let picture =
            history_timeline(&format!("coordinator {}", d.coordinator_id), &changes).to_svg();
        if path.as_os_str() == "-" {
            minibroker::outln!("{}", picture.trim_end());
            return Ok(());
        }
        std::fs::write(&path, picture)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        eprintln!("history of {id} drawn to {}", path.display());
    }
    if json {
        let changes: Vec<_> = d
            .history
            .iter()
            .map(|c| {
                json!({"producer_id": c.producer_id, "producer_epoch": c.producer_epoch,
                    "cause": c.cause, "at_ms": c.at_ms, "instance": c.instance})
            })
            .collect();
        minibroker::outln!(
            "{}",
            json!({"transactional_id": d.transactional_id, "coordinator_id": d.coordinator_id,
                "history": changes})
        );
        return Ok(());
    }
    minibroker::outln!(
        "{:<24} {:>8} {:>6}  {:<16} {}",
        "AT (UTC)",
        "PID",
        "EPOCH",
        "CAUSE",
        "INSTANCE"
    );
    for c in &d.history {
        minibroker::outln!(
            "{:<24} {:>8} {:>6}  {:<16} {}",
            utc(c.at_ms),
            c.producer_id,
            c.producer_epoch,
            c.cause,
            c.instance
        );
    }
    Ok(())
}

/// `ms` since 1970 as `YYYY-MM-DD HH:MM:SS.mmm` (UTC; the civil-from-days algorithm).
fn utc(ms: i64) -> String {
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// A hanging transaction, as `find-hanging` reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Hanging {
    /// `open_past_timeout` (at its coordinator) or `lso_held_without_coordinator` (at a leader).
    pub kind: &'static str,
    /// The transactional id, when a coordinator knows it.
    pub transactional_id: Option<String>,
    /// The producer id.
    pub producer_id: i64,
    /// The producer epoch.
    pub producer_epoch: i32,
    /// Its state at the coordinator (`-` when none knows it).
    pub state: String,
    /// The partitions it holds.
    pub partitions: Vec<String>,
    /// How long it has been open, in ms (coordinator's view; -1 when unknown).
    pub age_ms: i64,
    /// Its timeout, in ms (-1 when unknown).
    pub transaction_timeout_ms: i32,
    /// First offset of the open transaction at the leader (-1 when unknown).
    pub first_offset: i64,
    /// What to run to end it.
    pub fix: String,
}

fn is_open(state: i32) -> bool {
    matches!(
        proto::TxnState::try_from(state),
        Ok(proto::TxnState::Ongoing
            | proto::TxnState::PrepareCommit
            | proto::TxnState::PrepareAbort)
    )
}

/// Both kinds of hanging transaction (see the module docs).
async fn find_hanging(admin: &Admin) -> anyhow::Result<Vec<Hanging>> {
    let listings = admin.list_transactions(&[]).await?;
    let mut hanging = Vec::new();
    let mut open_pids = std::collections::BTreeSet::new();
    for (_, t) in &listings {
        if !is_open(t.state) {
            continue;
        }
        open_pids.insert(t.producer_id);
        let d = admin.describe_transaction(&t.transactional_id).await?;
        if is_open(d.state) && d.age_ms > i64::from(d.transaction_timeout_ms) {
            hanging.push(Hanging {
                kind: "open_past_timeout",
                transactional_id: Some(d.transactional_id.clone()),
                producer_id: d.producer_id,
                producer_epoch: d.producer_epoch,
                state: state_name(d.state),
                partitions: d
                    .partitions
                    .iter()
                    .map(|p| format!("{}-{}", p.topic, p.partition))
                    .collect(),
                age_ms: d.age_ms,
                transaction_timeout_ms: d.transaction_timeout_ms,
                first_offset: -1,
                fix: format!("minibroker transactions abort {}", d.transactional_id),
            });
        }
    }
    let metadata = admin.metadata().await?;
    let mut topics: Vec<(&String, usize)> = metadata
        .topics
        .iter()
        .map(|(name, leaders)| (name, leaders.len()))
        .collect();
    topics.sort();
    for (topic, partitions) in topics {
        for partition in 0..partitions as i32 {
            for p in admin.describe_producers(topic, partition).await? {
                if p.current_txn_start_offset < 0 || open_pids.contains(&p.producer_id) {
                    continue;
                }
                hanging.push(Hanging {
                    kind: "lso_held_without_coordinator",
                    transactional_id: None,
                    producer_id: p.producer_id,
                    producer_epoch: p.producer_epoch,
                    state: "-".into(),
                    partitions: vec![format!("{topic}-{partition}")],
                    age_ms: -1,
                    transaction_timeout_ms: -1,
                    first_offset: p.current_txn_start_offset,
                    fix: format!(
                        "minibroker transactions abort --topic {topic} --partition {partition} --producer-id {}",
                        p.producer_id
                    ),
                });
            }
        }
    }
    Ok(hanging)
}

fn print_hanging(hanging: &[Hanging], json: bool) -> anyhow::Result<()> {
    if json {
        minibroker::outln!("{}", serde_json::to_string(hanging)?);
        return Ok(());
    }
    if hanging.is_empty() {
        minibroker::outln!("no hanging transactions");
        return Ok(());
    }
    for h in hanging {
        let what = match h.kind {
            "open_past_timeout" => format!(
                "{} ({}) open for {} ms, past its timeout of {} ms",
                h.transactional_id.as_deref().unwrap_or("?"),
                h.state,
                h.age_ms,
                h.transaction_timeout_ms
            ),
            _ => format!(
                "PID {} epoch {} holds the LSO of {} at offset {}; no coordinator has its transaction open",
                h.producer_id,
                h.producer_epoch,
                h.partitions.join(", "),
                h.first_offset
            ),
        };
        minibroker::outln!("{what}\n    fix: {}", h.fix);
    }
    Ok(())
}

/// `abort ID`: fences the id's producer through its coordinator, which aborts the open
/// transaction; waits until the abort is complete.
async fn abort_by_id(
    admin: &Admin,
    config: &ClientConfig,
    id: &str,
    json: bool,
) -> anyhow::Result<()> {
    let before = admin.describe_transaction(id).await?;
    if !is_open(before.state) {
        let state = state_name(before.state);
        if json {
            minibroker::outln!(
                "{}",
                json!({"transactional_id": id, "aborted": false, "state": state,
                    "producer_id": before.producer_id, "producer_epoch": before.producer_epoch})
            );
        } else {
            minibroker::outln!("{id} has no open transaction (state {state}); nothing to abort");
        }
        return Ok(());
    }
    // CONCURRENT_TRANSACTIONS while the abort markers are written: RawRequests retries it, so
    // this returns once the transaction is CompleteAbort and the id holds a new epoch.
    let raw = RawRequests::new(config.clone().with_request_timeout(Duration::from_secs(10)))?;
    let (pid, epoch) = raw
        .init_producer_id(id, before.transaction_timeout_ms, None)
        .await?;
    if json {
        minibroker::outln!(
            "{}",
            json!({"transactional_id": id, "aborted": true, "state": state_name(before.state),
                "producer_id": pid, "producer_epoch": epoch,
                "fenced_producer_epoch": before.producer_epoch})
        );
    } else {
        minibroker::outln!(
            "aborted the open transaction of {id} ({}, PID {} epoch {}); its producer is fenced, the id now holds epoch {epoch}",
            state_name(before.state),
            before.producer_id,
            before.producer_epoch
        );
    }
    Ok(())
}

/// The cluster secret and topology an operator's ABORT marker is signed with.
fn member_credentials(
    secret_file: Option<std::path::PathBuf>,
    topology_file: Option<std::path::PathBuf>,
) -> anyhow::Result<(cluster::auth::ClusterSecret, cluster::Topology)> {
    let (Some(secret_file), Some(topology_file)) = (secret_file, topology_file) else {
        bail!("an ABORT marker is an internal request: pass --cluster-secret-file FILE and --topology-file FILE (the cluster's own)");
    };
    Ok((
        cluster::auth::ClusterSecret::load(&secret_file)?,
        cluster::Topology::load(&topology_file)?,
    ))
}

/// `abort --topic --partition --producer-id`: an ABORT marker at the partition's leader, signed
/// with the cluster secret as a coordinator of the topology (an operator holding the secret acts
/// as a cluster member, as Kafka's tool needs CLUSTER_ACTION).
async fn abort_on_partition(
    admin: &Admin,
    config: &ClientConfig,
    member: &(cluster::auth::ClusterSecret, cluster::Topology),
    tp: TopicPartition,
    pid: i64,
    json: bool,
) -> anyhow::Result<()> {
    let producers = admin.describe_producers(&tp.topic, tp.partition).await?;
    let Some(state) = producers.iter().find(|p| p.producer_id == pid) else {
        bail!("{tp} has no producer state for PID {pid}");
    };
    if state.current_txn_start_offset < 0 {
        bail!("PID {pid} has no open transaction on {tp}; nothing to abort");
    }
    let listings = admin.list_transactions(&[]).await?;
    if let Some((_, t)) = listings
        .iter()
        .find(|(_, t)| t.producer_id == pid && is_open(t.state))
    {
        bail!(
            "PID {pid} has an open transaction at its coordinator ({}); abort it there with `minibroker transactions abort {}`",
            t.transactional_id, t.transactional_id
        );
    }
    let Ok(epoch) = i16::try_from(state.producer_epoch + 1) else {
        bail!("PID {pid} is at the last epoch on {tp}; an ABORT marker above it cannot be written");
    };
    let (secret, topology) = member;
    let coordinator_id = topology.coordinators.first().map_or(0, |c| c.id);
    // The marker names an id that coordinator owns: leaders accept markers from owners only.
    let Some(owned_id) = (0..100_000)
        .map(|n| format!("operator-abort-{n}"))
        .find(|id| topology.coordinator_for(id).id == coordinator_id)
    else {
        bail!("coordinator {coordinator_id} owns no transactional id");
    };
    let credentials = cluster::auth::Credentials {
        secret: secret.clone(),
        node_id: coordinator_id,
        fingerprint: topology.fingerprint(),
    };
    let raw = RawRequests::new(config.clone())?;
    // At the generation the leader recorded for the PID (none yet: 0), so the leader's marker
    // fence accepts it and a later marker of a real coordinator still passes.
    let generation = state.coordinator_generation.max(0);
    raw.write_abort_marker(&tp, pid, epoch, generation, &owned_id, &credentials)
        .await?;
    if json {
        minibroker::outln!(
            "{}",
            json!({"topic": tp.topic, "partition": tp.partition, "producer_id": pid,
                "aborted": true, "producer_epoch": epoch,
                "first_offset": state.current_txn_start_offset})
        );
    } else {
        minibroker::outln!(
            "wrote an ABORT marker for PID {pid} on {tp} at epoch {epoch}: the transaction open since offset {} is aborted",
            state.current_txn_start_offset
        );
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(super::utc(951_782_400_123), "2000-02-29 00:00:00.123");
        assert_eq!(super::utc(1_764_598_861_001), "2025-12-01 14:21:01.001");
    }
}
