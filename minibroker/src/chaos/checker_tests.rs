//! Unit tests of the module next to this file.
use super::super::history::{ReadRecord, SendOk};
use super::*;

fn w(instance: &str, event: WorkerEvent) -> Entry {
    Entry::Worker {
        txid: instance.split('#').next().unwrap().to_string(),
        instance: instance.to_string(),
        event,
    }
}

fn init(instance: &str, at_us: i64) -> Entry {
    w(
        instance,
        WorkerEvent::InitOk {
            at_us,
            pid: 1,
            epoch: 0,
        },
    )
}

fn send(instance: &str, txn: u64, n: u64, at: Option<(i32, i64)>, sent_us: i64) -> Entry {
    w(
        instance,
        WorkerEvent::Send {
            txn,
            value: format!("{instance}/{txn}/{n}"),
            sent_us,
            at_us: sent_us + 1,
            ok: at.map(|(partition, offset)| SendOk { partition, offset }),
            error: at.is_none().then(|| "fenced".to_string()),
            fatal: at.is_none(),
        },
    )
}

fn end(instance: &str, txn: u64, commit: bool, ok: bool) -> Vec<Entry> {
    vec![
        w(
            instance,
            WorkerEvent::EndStart {
                txn,
                commit,
                sent_us: 50,
            },
        ),
        w(
            instance,
            WorkerEvent::End {
                txn,
                commit,
                sent_us: 50,
                at_us: 60,
                error: (!ok).then(|| "timeout".to_string()),
                fatal: false,
            },
        ),
    ]
}

fn rec(partition: i32, offset: i64, value: &str) -> ReadRecord {
    ReadRecord {
        partition,
        offset,
        value: value.to_string(),
    }
}

/// p#0 commits txn 0 (two records on partitions 0 and 1) and aborts txn 1.
fn healthy() -> (Vec<Entry>, FinalRead) {
    let mut h = vec![
        init("p#0", 10),
        send("p#0", 0, 0, Some((0, 0)), 20),
        send("p#0", 0, 1, Some((1, 0)), 21),
    ];
    h.extend(end("p#0", 0, true, true));
    h.push(send("p#0", 1, 0, Some((0, 2)), 70));
    h.extend(end("p#0", 1, false, true));
    let read = FinalRead {
        committed: vec![rec(0, 0, "p#0/0/0"), rec(1, 0, "p#0/0/1")],
        uncommitted: vec![
            rec(0, 0, "p#0/0/0"),
            rec(0, 2, "p#0/1/0"),
            rec(1, 0, "p#0/0/1"),
        ],
        ..FinalRead::default()
    };
    (h, read)
}

fn kinds(v: &Verdict) -> Vec<AnomalyKind> {
    v.anomalies.iter().map(|a| a.kind).collect()
}

#[test]
fn a_healthy_history_passes() {
    let (h, read) = healthy();
    let v = check(&h, &read);
    assert!(v.passed(), "{:?}", v.anomalies);
    assert_eq!((v.committed, v.aborted, v.unknown), (1, 1, 0));
    assert_eq!(v.acked_records, 3);
}

#[test]
fn value_names_its_transaction() {
    assert_eq!(txn_of_value("p2#1/17/3"), Some(("p2#1".to_string(), 17)));
    assert_eq!(txn_of_value("a/b/c/4/5"), Some(("a/b/c".to_string(), 4)));
    assert_eq!(txn_of_value("garbage"), None);
}

#[test]
fn a_missing_committed_record_is_a_lost_write() {
    let (h, mut read) = healthy();
    read.committed.remove(1);
    assert_eq!(kinds(&check(&h, &read)), vec![AnomalyKind::LostWrite]);
}

#[test]
fn a_value_twice_is_a_duplicate() {
    let (h, mut read) = healthy();
    read.uncommitted.push(rec(2, 0, "p#0/0/0"));
    assert_eq!(kinds(&check(&h, &read)), vec![AnomalyKind::Duplicate]);
}

#[test]
fn an_aborted_record_visible_is_reported() {
    let (h, mut read) = healthy();
    read.committed.insert(1, rec(0, 2, "p#0/1/0"));
    assert_eq!(kinds(&check(&h, &read)), vec![AnomalyKind::AbortedVisible]);
}

#[test]
fn a_transaction_that_never_sent_its_commit_counts_as_aborted() {
    let (mut h, mut read) = healthy();
    h.push(send("p#0", 2, 0, Some((2, 0)), 80));
    read.uncommitted.push(rec(2, 0, "p#0/2/0"));
    assert!(check(&h, &read).passed());
    // An unreported record of a transaction that never committed, visible: aborted visible.
    read.committed.push(rec(2, 1, "p#0/3/0"));
    assert_eq!(kinds(&check(&h, &read)), vec![AnomalyKind::AbortedVisible]);
}

#[test]
fn an_unknown_outcome_may_go_either_way_but_never_in_part() {
    let (mut h, read) = healthy();
    h.push(send("p#0", 2, 0, Some((2, 0)), 80));
    h.push(send("p#0", 2, 1, Some((2, 1)), 81));
    h.extend(end("p#0", 2, true, false));
    let mut none = read.clone();
    none.uncommitted
        .extend([rec(2, 0, "p#0/2/0"), rec(2, 1, "p#0/2/1")]);
    assert!(check(&h, &none).passed());
    let mut all = none.clone();
    all.committed
        .extend([rec(2, 0, "p#0/2/0"), rec(2, 1, "p#0/2/1")]);
    let v = check(&h, &all);
    assert!(v.passed(), "{:?}", v.anomalies);
    assert_eq!(v.unknown, 1);
    let mut part = none;
    part.committed.push(rec(2, 0, "p#0/2/0"));
    assert_eq!(kinds(&check(&h, &part)), vec![AnomalyKind::TornTransaction]);
}

#[test]
fn records_out_of_send_order_are_reported() {
    let (h, mut read) = healthy();
    // txn 1's record before txn 0's on partition 0 (and not at the acked offsets).
    read.uncommitted = vec![
        rec(0, 0, "p#0/1/0"),
        rec(0, 2, "p#0/0/0"),
        rec(1, 0, "p#0/0/1"),
    ];
    read.committed = vec![rec(0, 2, "p#0/0/0"), rec(1, 0, "p#0/0/1")];
    let k = kinds(&check(&h, &read));
    assert!(k.contains(&AnomalyKind::OffsetOrder), "{k:?}");
}

#[test]
fn watermarks_going_backwards_and_vanished_reads_are_reported() {
    let (mut h, read) = healthy();
    let observed = |at_us, hw, lso, records: Vec<(i64, String)>| Entry::Observed {
        at_us,
        partition: 0,
        high_watermark: hw,
        last_stable_offset: lso,
        records,
    };
    h.push(observed(1, 3, 1, vec![(0, "p#0/0/0".into())]));
    h.push(observed(2, 3, 3, vec![]));
    assert!(check(&h, &read).passed());
    h.push(observed(3, 2, 2, vec![]));
    h.push(observed(4, 3, 3, vec![(1, "p#0/0/0".into())]));
    assert_eq!(
        kinds(&check(&h, &read)),
        vec![AnomalyKind::WatermarkBackwards, AnomalyKind::VanishedRead]
    );
}

#[test]
fn open_transactions_and_held_lsos_after_quiescence_are_hanging() {
    let (h, mut read) = healthy();
    read.open_transactions.push("p".into());
    read.held_partitions.push((0, 3, 2));
    assert_eq!(
        kinds(&check(&h, &read)),
        vec![AnomalyKind::HangingTransaction; 2]
    );
}

#[test]
fn a_write_sent_after_the_replacement_was_initialised_is_a_zombie_write() {
    let (mut h, mut read) = healthy();
    h.push(init("p#1", 100));
    // Sent before p#1's init returned: fine (the abort markers follow it).
    h.push(send("p#0", 2, 0, Some((2, 0)), 90));
    // Sent after: a zombie write accepted.
    h.push(send("p#0", 2, 1, Some((2, 1)), 150));
    // Sent after and refused: what fencing is for.
    h.push(send("p#0", 2, 2, None, 160));
    read.uncommitted
        .extend([rec(2, 0, "p#0/2/0"), rec(2, 1, "p#0/2/1")]);
    let v = check(&h, &read);
    assert_eq!(kinds(&v), vec![AnomalyKind::ZombieWrite]);
    assert_eq!(v.fenced_requests, 1);
    assert_eq!(v.instances, 2);
}
