//! The chaos checker: reads a run's history and the final read-back and lists every way
//! exactly-once was broken. Pure: no network, no clock, no code shared with what it checks
//! (it does not use the client library, the cores or the services, only [`super::history`]).
//!
//! Each transaction of each producer instance gets one outcome from the history alone:
//! - **committed**: its EndTxn(COMMIT) returned success;
//! - **aborted**: its EndTxn(ABORT) returned success, or it never sent EndTxn(COMMIT) at all
//!   (then nothing can have committed it: a new instance, the timeout and the coordinator only
//!   ever abort);
//! - **unknown**: EndTxn(COMMIT) was sent and no success came back (an error, a killed or fenced
//!   process): it may have committed or not, but never in part.
//!
//! Record values are `<instance>/<txn>/<n>`, unique in the run, so every record read back names
//! its transaction even if the worker died before it could report the send.
//!
//! The anomalies ([`AnomalyKind`]): a committed record missing or moved (lost write); a value read
//! twice (duplicate); a record of an aborted transaction visible to read_committed; an unknown
//! transaction visible in part (torn); one instance's records out of send order on a partition, or
//! read at another offset than acknowledged; a high watermark or LSO that went backwards; a record
//! read_committed once saw that later vanished; a transaction still open or an LSO still held after
//! quiescence (hanging); a write or commit accepted from an instance although it was sent after a
//! newer instance of the same transactional id had been initialised (zombie write).
//!
//! CAVEATS: "sent after the newer instance's InitProducerId returned" compares wall-clock times of
//! processes on one machine; a zombie request sent *before* that moment and accepted is correct
//! behaviour (the abort markers follow it) and is not reported.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::Serialize;

use super::history::{Entry, FinalRead, WorkerEvent};

/// The kinds of anomaly, in the order the report lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    /// An acknowledged record of a committed transaction is missing (or at another offset).
    LostWrite,
    /// A value appears more than once.
    Duplicate,
    /// A record of an aborted transaction is visible to read_committed.
    AbortedVisible,
    /// Some but not all acknowledged records of a transaction are visible to read_committed.
    TornTransaction,
    /// Records of one instance out of send order on a partition, or not at the acknowledged offset.
    OffsetOrder,
    /// A partition's high watermark or LSO went backwards between two polls.
    WatermarkBackwards,
    /// A record read_committed returned during the run is not there (same offset) at the end.
    VanishedRead,
    /// A transaction still open, or an LSO below the high watermark, after quiescence.
    HangingTransaction,
    /// A write or commit accepted although sent after a newer instance was initialised.
    ZombieWrite,
}

impl AnomalyKind {
    /// Every kind, in report order.
    pub const ALL: [AnomalyKind; 9] = [
        AnomalyKind::LostWrite,
        AnomalyKind::Duplicate,
        AnomalyKind::AbortedVisible,
        AnomalyKind::TornTransaction,
        AnomalyKind::OffsetOrder,
        AnomalyKind::WatermarkBackwards,
        AnomalyKind::VanishedRead,
        AnomalyKind::HangingTransaction,
        AnomalyKind::ZombieWrite,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::LostWrite => "lost committed write",
            AnomalyKind::Duplicate => "duplicate",
            AnomalyKind::AbortedVisible => "aborted record visible",
            AnomalyKind::TornTransaction => "torn transaction",
            AnomalyKind::OffsetOrder => "offset order",
            AnomalyKind::WatermarkBackwards => "HW/LSO backwards",
            AnomalyKind::VanishedRead => "read_committed record vanished",
            AnomalyKind::HangingTransaction => "hanging transaction",
            AnomalyKind::ZombieWrite => "zombie write accepted",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One anomaly and what shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// Which rule broke.
    pub kind: AnomalyKind,
    /// The evidence, for a human.
    pub detail: String,
}

/// What the history says happened, and what went wrong.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verdict {
    /// Transactions whose commit was acknowledged.
    pub committed: usize,
    /// Transactions known to be aborted.
    pub aborted: usize,
    /// Transactions whose commit was sent but not acknowledged.
    pub unknown: usize,
    /// Records acknowledged by a leader.
    pub acked_records: usize,
    /// Sends or commits refused because the instance was fenced.
    pub fenced_requests: usize,
    /// Producer instances started.
    pub instances: usize,
    /// Faults injected.
    pub faults: usize,
    /// Records read back with read_committed.
    pub committed_records_read: usize,
    /// Every anomaly found (empty: exactly-once held).
    pub anomalies: Vec<Anomaly>,
}

impl Verdict {
    /// Anomalies counted by kind (every kind present, zero included).
    pub fn by_kind(&self) -> BTreeMap<AnomalyKind, usize> {
        let mut out: BTreeMap<AnomalyKind, usize> =
            AnomalyKind::ALL.iter().map(|k| (*k, 0)).collect();
        for a in &self.anomalies {
            *out.entry(a.kind).or_default() += 1;
        }
        out
    }

    /// Whether no anomaly was found.
    pub fn passed(&self) -> bool {
        self.anomalies.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Committed,
    Aborted,
    Unknown,
}

/// A transaction of one instance: `(instance, txn)`.
type TxnKey = (String, u64);

#[derive(Default)]
struct TxnFacts {
    /// Acknowledged values and where they landed.
    acked: BTreeMap<String, (i32, i64)>,
    commit_sent: bool,
    commit_ok: bool,
    abort_ok: bool,
}

impl TxnFacts {
    fn outcome(&self) -> Outcome {
        if self.commit_ok {
            Outcome::Committed
        } else if self.abort_ok || !self.commit_sent {
            Outcome::Aborted
        } else {
            Outcome::Unknown
        }
    }
}

/// The transaction a chaos value belongs to: `p2#1/17/3` -> `("p2#1", 17)`.
pub fn txn_of_value(value: &str) -> Option<TxnKey> {
    let mut parts = value.rsplitn(3, '/');
    let _n: u64 = parts.next()?.parse().ok()?;
    let txn: u64 = parts.next()?.parse().ok()?;
    let instance = parts.next()?;
    Some((instance.to_string(), txn))
}

/// Checks `history` and `read`; see the module docs for the rules.
pub fn check(history: &[Entry], read: &FinalRead) -> Verdict {
    let mut verdict = Verdict::default();
    let mut txns: BTreeMap<TxnKey, TxnFacts> = BTreeMap::new();
    // Per instance: its values in send order.
    let mut send_order: HashMap<String, usize> = HashMap::new();
    // Per txid: (instance, init reply time), in history order.
    let mut inits: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    // Accepted requests: (txid, instance, sent_us, what).
    let mut accepted: Vec<(String, String, i64, String)> = Vec::new();

    for (index, entry) in history.iter().enumerate() {
        match entry {
            Entry::Fault { .. } => verdict.faults += 1,
            Entry::Observed { .. } => {}
            Entry::Worker {
                txid,
                instance,
                event,
            } => match event {
                WorkerEvent::InitOk { at_us, .. } => {
                    verdict.instances += 1;
                    inits
                        .entry(txid.clone())
                        .or_default()
                        .push((instance.clone(), *at_us));
                }
                WorkerEvent::Send {
                    txn,
                    value,
                    sent_us,
                    ok,
                    fatal,
                    ..
                } => {
                    send_order.insert(value.clone(), index);
                    if *fatal {
                        verdict.fenced_requests += 1;
                    }
                    if let Some(ok) = ok {
                        verdict.acked_records += 1;
                        txns.entry((instance.clone(), *txn))
                            .or_default()
                            .acked
                            .insert(value.clone(), (ok.partition, ok.offset));
                        accepted.push((
                            txid.clone(),
                            instance.clone(),
                            *sent_us,
                            format!("send of {value}"),
                        ));
                    }
                }
                WorkerEvent::EndStart { txn, commit, .. } => {
                    if *commit {
                        txns.entry((instance.clone(), *txn))
                            .or_default()
                            .commit_sent = true;
                    }
                }
                WorkerEvent::End {
                    txn,
                    commit,
                    sent_us,
                    error,
                    fatal,
                    ..
                } => {
                    if *fatal {
                        verdict.fenced_requests += 1;
                    }
                    let facts = txns.entry((instance.clone(), *txn)).or_default();
                    if *commit {
                        facts.commit_sent = true;
                    }
                    if error.is_none() {
                        if *commit {
                            facts.commit_ok = true;
                            accepted.push((
                                txid.clone(),
                                instance.clone(),
                                *sent_us,
                                format!("commit of transaction {txn}"),
                            ));
                        } else {
                            facts.abort_ok = true;
                        }
                    }
                }
                WorkerEvent::Begin { txn } => {
                    txns.entry((instance.clone(), *txn)).or_default();
                }
                WorkerEvent::InitFailed { .. } | WorkerEvent::Exit { .. } => {}
            },
        }
    }

    for facts in txns.values() {
        match facts.outcome() {
            Outcome::Committed => verdict.committed += 1,
            Outcome::Aborted => verdict.aborted += 1,
            Outcome::Unknown => verdict.unknown += 1,
        }
    }
    verdict.committed_records_read = read.committed.len();

    let mut anomalies = Vec::new();
    check_duplicates(read, &mut anomalies);
    check_visibility(&txns, read, &mut anomalies);
    check_order(&txns, &send_order, read, &mut anomalies);
    check_observations(history, read, &mut anomalies);
    check_quiescence(read, &mut anomalies);
    check_zombies(&inits, &accepted, &mut anomalies);
    anomalies.sort_by_key(|a| a.kind);
    verdict.anomalies = anomalies;
    verdict
}

fn anomaly(kind: AnomalyKind, detail: String) -> Anomaly {
    Anomaly { kind, detail }
}

fn check_duplicates(read: &FinalRead, out: &mut Vec<Anomaly>) {
    for (isolation, records) in [
        ("read_committed", &read.committed),
        ("read_uncommitted", &read.uncommitted),
    ] {
        let mut seen: HashMap<&str, (i32, i64)> = HashMap::new();
        for r in records {
            if let Some((p, o)) = seen.insert(&r.value, (r.partition, r.offset)) {
                out.push(anomaly(
                    AnomalyKind::Duplicate,
                    format!(
                        "{} at {p}@{o} and {}@{} ({isolation})",
                        r.value, r.partition, r.offset
                    ),
                ));
            }
        }
    }
}

/// Lost writes, aborted records visible, torn transactions.
fn check_visibility(txns: &BTreeMap<TxnKey, TxnFacts>, read: &FinalRead, out: &mut Vec<Anomaly>) {
    let visible: HashMap<&str, (i32, i64)> = read
        .committed
        .iter()
        .map(|r| (r.value.as_str(), (r.partition, r.offset)))
        .collect();
    let mut visible_by_txn: BTreeMap<TxnKey, BTreeSet<&str>> = BTreeMap::new();
    for r in &read.committed {
        if let Some(key) = txn_of_value(&r.value) {
            visible_by_txn.entry(key).or_default().insert(&r.value);
        }
    }
    let empty = TxnFacts::default();
    let keys: BTreeSet<&TxnKey> = txns.keys().chain(visible_by_txn.keys()).collect();
    for key in keys {
        let facts = txns.get(key).unwrap_or(&empty);
        let seen = visible_by_txn.get(key);
        let name = format!("{}/{}", key.0, key.1);
        match facts.outcome() {
            Outcome::Committed => {
                for (value, at) in &facts.acked {
                    match visible.get(value.as_str()) {
                        None => out.push(anomaly(
                            AnomalyKind::LostWrite,
                            format!(
                                "{value} (committed in {name}, acked at {}@{}) is not visible",
                                at.0, at.1
                            ),
                        )),
                        Some(found) if found != at => out.push(anomaly(
                            AnomalyKind::LostWrite,
                            format!(
                                "{value} acked at {}@{} but read at {}@{}",
                                at.0, at.1, found.0, found.1
                            ),
                        )),
                        Some(_) => {}
                    }
                }
            }
            Outcome::Aborted => {
                if let Some(seen) = seen {
                    out.push(anomaly(
                        AnomalyKind::AbortedVisible,
                        format!(
                            "{} record(s) of aborted {name} visible, e.g. {}",
                            seen.len(),
                            seen.iter().next().copied().unwrap_or_default()
                        ),
                    ));
                }
            }
            Outcome::Unknown => {
                let Some(seen) = seen else { continue };
                let missing: Vec<&String> = facts
                    .acked
                    .keys()
                    .filter(|v| !seen.contains(v.as_str()))
                    .collect();
                if !missing.is_empty() {
                    out.push(anomaly(
                        AnomalyKind::TornTransaction,
                        format!(
                            "{name}: {} record(s) visible, {} acked record(s) not, e.g. {}",
                            seen.len(),
                            missing.len(),
                            missing[0]
                        ),
                    ));
                }
            }
        }
    }
}

/// Each instance's records in send order on every partition; acked offsets honoured.
fn check_order(
    txns: &BTreeMap<TxnKey, TxnFacts>,
    send_order: &HashMap<String, usize>,
    read: &FinalRead,
    out: &mut Vec<Anomaly>,
) {
    let mut acked: HashMap<&str, (i32, i64)> = HashMap::new();
    for facts in txns.values() {
        for (value, at) in &facts.acked {
            acked.insert(value, *at);
        }
    }
    // (partition, instance) -> (last send index, its value)
    let mut last: HashMap<(i32, String), (usize, &str)> = HashMap::new();
    // A value read more than once is a duplicate (reported there), not a moved record.
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for r in &read.uncommitted {
        *copies.entry(r.value.as_str()).or_default() += 1;
    }
    for r in &read.uncommitted {
        if let Some(at) = acked.get(r.value.as_str()) {
            if *at != (r.partition, r.offset) && copies[r.value.as_str()] == 1 {
                out.push(anomaly(
                    AnomalyKind::OffsetOrder,
                    format!(
                        "{} acked at {}@{} but read at {}@{}",
                        r.value, at.0, at.1, r.partition, r.offset
                    ),
                ));
            }
        }
        let (Some(index), Some((instance, _))) = (send_order.get(&r.value), txn_of_value(&r.value))
        else {
            continue;
        };
        let slot = (r.partition, instance);
        if let Some((before, before_value)) = last.get(&slot) {
            if before > index {
                out.push(anomaly(
                    AnomalyKind::OffsetOrder,
                    format!(
                        "partition {}: {} (sent later) is before {} at offset {}",
                        r.partition, before_value, r.value, r.offset
                    ),
                ));
            }
        }
        last.insert(slot, (*index, &r.value));
    }
}

/// Watermarks never go backwards; what read_committed saw stays.
fn check_observations(history: &[Entry], read: &FinalRead, out: &mut Vec<Anomaly>) {
    let final_committed: HashMap<(i32, i64), &str> = read
        .committed
        .iter()
        .map(|r| ((r.partition, r.offset), r.value.as_str()))
        .collect();
    let mut marks: HashMap<i32, (i64, i64)> = HashMap::new();
    for entry in history {
        let Entry::Observed {
            partition,
            high_watermark,
            last_stable_offset,
            records,
            ..
        } = entry
        else {
            continue;
        };
        if let Some((hw, lso)) = marks.get(partition) {
            if high_watermark < hw || last_stable_offset < lso {
                out.push(anomaly(
                    AnomalyKind::WatermarkBackwards,
                    format!(
                        "partition {partition}: HW {hw} -> {high_watermark}, LSO {lso} -> {last_stable_offset}"
                    ),
                ));
            }
        }
        let (hw, lso) = marks.entry(*partition).or_insert((i64::MIN, i64::MIN));
        *hw = (*hw).max(*high_watermark);
        *lso = (*lso).max(*last_stable_offset);
        for (offset, value) in records {
            if final_committed.get(&(*partition, *offset)) != Some(&value.as_str()) {
                out.push(anomaly(
                    AnomalyKind::VanishedRead,
                    format!("{value} was read at {partition}@{offset} and is gone"),
                ));
            }
        }
    }
}

fn check_quiescence(read: &FinalRead, out: &mut Vec<Anomaly>) {
    for id in &read.open_transactions {
        out.push(anomaly(
            AnomalyKind::HangingTransaction,
            format!("{id} is still open after quiescence"),
        ));
    }
    for (partition, hw, lso) in &read.held_partitions {
        out.push(anomaly(
            AnomalyKind::HangingTransaction,
            format!("partition {partition}: LSO {lso} held below HW {hw} after quiescence"),
        ));
    }
}

fn check_zombies(
    inits: &BTreeMap<String, Vec<(String, i64)>>,
    accepted: &[(String, String, i64, String)],
    out: &mut Vec<Anomaly>,
) {
    for (txid, instance, sent_us, what) in accepted {
        let Some(instances) = inits.get(txid) else {
            continue;
        };
        let Some(mine) = instances.iter().position(|(i, _)| i == instance) else {
            continue;
        };
        if let Some((newer, at)) = instances[mine + 1..].iter().find(|(_, at)| *at < *sent_us) {
            out.push(anomaly(
                AnomalyKind::ZombieWrite,
                format!(
                    "{what} by {instance} accepted, sent {} ms after {newer} ({txid}) was initialised",
                    (sent_us - at) / 1000
                ),
            ));
        }
    }
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
