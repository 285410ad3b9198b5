//! Group commit and waiting out Prepare*: a request that finds its id's markers outstanding
//! waits for them instead of bouncing CONCURRENT_TRANSACTIONS, and a coordinator PROCESS killed
//! (SIGKILL) right after acknowledging concurrent transitions finds all of them after restart,
//! and one killed right after acknowledging a group's or an offset's deletion keeps it deleted.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use proto::{ErrorCode, TxnState};

fn long_wait(config: &mut coordinator::CoordinatorConfig) {
    config.max_prepare_wait = Duration::from_secs(20);
}

/// Waits until the fake leader has refused `more` marker requests beyond `seen`: time in
/// which a bouncing coordinator would long have answered.
async fn marker_attempts(leader: &FakeLeader, seen: usize, more: usize) {
    let leader = leader.clone();
    eventually("more marker attempts", || {
        let leader = leader.clone();
        async move { (leader.markers().len() >= seen + more).then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn init_after_end_txn_waits_for_the_markers_instead_of_bouncing() {
    let cluster = Cluster::start_with(1, long_wait).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-next");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    let leader = cluster.leaders[0].clone();
    leader.set_ack(false);
    let ended = t.end(pe, true).await;
    t.wait_state(TxnState::PrepareCommit).await;

    // The next InitProducerId arrives while the markers are outstanding: it waits.
    let mut next = Txn::new(cluster.client(1).await, "txn-next");
    let init = tokio::spawn(async move { next.init_raw(60_000, (-1, -1)).await });
    let seen = leader.markers().len();
    marker_attempts(&leader, seen, 5).await;
    assert!(
        !init.is_finished(),
        "InitProducerId answered while the markers were outstanding"
    );
    leader.set_ack(true);
    let r = tokio::time::timeout(Duration::from_secs(10), init)
        .await
        .expect("answered once the markers completed")
        .unwrap();
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!((r.producer_id, r.producer_epoch), (ended.0, ended.1 + 1));
    assert_eq!(t.describe().await.state, TxnState::Empty as i32);
}

#[tokio::test]
async fn end_txn_of_the_next_transaction_waits_too() {
    // EndTxn at the bumped epoch while the previous transaction is PrepareAbort: today's
    // CONCURRENT_TRANSACTIONS becomes a wait, then the request is answered on the settled state
    // (here an empty abort: OK with the next epoch).
    let cluster = Cluster::start_with(1, long_wait).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-early");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 1)]).await, ErrorCode::None);
    let leader = cluster.leaders[1].clone();
    leader.set_ack(false);
    let bumped = t.end(pe, false).await;
    t.wait_state(TxnState::PrepareAbort).await;
    let mut early = Txn::new(cluster.client(1).await, "txn-early");
    let end = tokio::spawn(async move { early.end_raw(bumped, false).await });
    let seen = leader.markers().len();
    marker_attempts(&leader, seen, 5).await;
    assert!(!end.is_finished(), "EndTxn answered during PrepareAbort");
    leader.set_ack(true);
    let r = end.await.unwrap();
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!((r.producer_id, r.producer_epoch), (bumped.0, bumped.1 + 1));
}

#[tokio::test]
async fn the_wait_is_bounded_and_then_answers_concurrent_transactions() {
    // The harness's wait is 200ms: markers that never complete still get the old answer.
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-stuck");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    cluster.leaders[0].set_ack(false);
    t.end(pe, true).await;
    t.wait_state(TxnState::PrepareCommit).await;
    let started = std::time::Instant::now();
    let r = t.init_raw(60_000, (-1, -1)).await;
    assert_eq!(code(r.error_code), ErrorCode::ConcurrentTransactions);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn fencing_init_answers_once_the_abort_completed() {
    let cluster = Cluster::start_with(1, long_wait).await;
    let mut old = Txn::new(cluster.client(1).await, "txn-fence");
    let pe = old.init().await;
    assert_eq!(old.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    let leader = cluster.leaders[0].clone();
    leader.set_ack(false);
    let mut new = Txn::new(cluster.client(1).await, "txn-fence");
    let init = tokio::spawn(async move { new.init_raw(60_000, (-1, -1)).await });
    old.wait_state(TxnState::PrepareAbort).await;
    let seen = leader.markers().len();
    marker_attempts(&leader, seen, 3).await;
    assert!(!init.is_finished());
    leader.set_ack(true);
    // Kafka's answer is kept (the caller retries), but only once the abort is complete, so
    // the retry succeeds at once.
    let r = init.await.unwrap();
    assert_eq!(code(r.error_code), ErrorCode::ConcurrentTransactions);
    assert_eq!(old.describe().await.state, TxnState::CompleteAbort as i32);
    let r = old.init_raw(60_000, (-1, -1)).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!(r.producer_epoch, pe.1 + 2);
}

#[tokio::test]
async fn sigkill_after_a_group_commit_loses_no_acknowledged_transition() {
    const IDS: usize = 32;
    // Leader 101 refuses every marker: an EndTxn's PrepareCommit stays the durable state.
    let leader = FakeLeader::default();
    leader.set_ack(false);
    let (dir, addr) = killable_setup(&leader).await;
    let first_log = dir.path().join("first.log");
    let process = spawn_coordinator(dir.path(), &addr, &first_log);
    let client = connect(&addr).await;

    // Concurrent transitions of different ids: Init, AddPartitions, and for every other id
    // EndTxn(COMMIT). Each reply is an acknowledgement that the transition is durable.
    let mut tasks = Vec::new();
    for i in 0..IDS {
        let mut t = Txn::new(client.clone(), &format!("kill-{i}"));
        tasks.push(tokio::spawn(async move {
            let pe = t.init().await;
            let partition = (i % 3) as i32;
            assert_eq!(t.add(pe, vec![tp("t", partition)]).await, ErrorCode::None);
            if i % 2 == 0 {
                let bumped = t.end(pe, true).await;
                (t.id, bumped, TxnState::PrepareCommit, partition)
            } else {
                (t.id, pe, TxnState::Ongoing, partition)
            }
        }));
    }
    let mut acknowledged = BTreeMap::new();
    for task in tasks {
        let (id, pe, state, partition) = task.await.unwrap();
        acknowledged.insert(id, (pe, state, partition));
    }
    // At once: no clean stop, no flush at shutdown.
    process.kill();
    let sizes = testkit::logs::numbers(&first_log, "group commit flushed", "writes");
    assert!(
        sizes.iter().any(|&n| n > 1),
        "no flush carried more than one write: {sizes:?}"
    );

    let second_log = dir.path().join("second.log");
    let _process = spawn_coordinator(dir.path(), &addr, &second_log);
    let mut client = connect(&addr).await;
    for (id, ((pid, epoch), state, partition)) in &acknowledged {
        let d = describe(&mut client, id).await;
        assert_eq!(d.error_code, 0, "{id}: {}", d.error_message);
        assert_eq!(d.state, *state as i32, "{id}");
        // For PrepareCommit: the bumped (PID, epoch) EndTxn answered, which the markers carry.
        assert_eq!((d.producer_id, d.producer_epoch), (*pid, *epoch), "{id}");
        let partitions: Vec<_> = d.partitions.iter().map(|p| p.partition).collect();
        assert_eq!(partitions, vec![*partition], "{id}");
    }
}

#[tokio::test]
async fn sigkill_right_after_complete_keeps_every_commit() {
    // Complete* is not flushed on its own (service/commit.rs): killed before the next flush,
    // the coordinator restarts in PrepareCommit, sends the markers again and completes.
    const IDS: usize = 16;
    let leader = FakeLeader::default();
    let (dir, addr) = killable_setup(&leader).await;
    let process = spawn_coordinator(dir.path(), &addr, &dir.path().join("first.log"));
    let client = connect(&addr).await;
    let mut tasks = Vec::new();
    for i in 0..IDS {
        let mut t = Txn::new(client.clone(), &format!("done-{i}"));
        tasks.push(tokio::spawn(async move {
            let pe = t.init().await;
            assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
            let bumped = t.end(pe, true).await;
            t.wait_state(TxnState::CompleteCommit).await;
            (t.id, bumped)
        }));
    }
    let mut committed = Vec::new();
    for task in tasks {
        committed.push(task.await.unwrap());
    }
    // At once, while the last Complete* writes may not be flushed yet.
    process.kill();
    let markers_before = leader.markers().len();
    assert!(markers_before >= IDS);

    let _process = spawn_coordinator(dir.path(), &addr, &dir.path().join("second.log"));
    let client = connect(&addr).await;
    for (id, bumped) in committed {
        let mut t = Txn::new(client.clone(), &id);
        let d = t.wait_state(TxnState::CompleteCommit).await;
        assert_eq!((d.producer_id, d.producer_epoch), bumped, "{id}");
        // The producer's next transaction starts from the committed one.
        assert_eq!(t.init().await, (bumped.0, bumped.1 + 1), "{id}");
    }
}

/// DeleteGroups and OffsetDelete are durable when answered: a coordinator killed (SIGKILL, no
/// clean stop) right after both answered has, after restart, neither the deleted group's
/// offsets nor the deleted partition's, and keeps the rest.
#[tokio::test]
async fn sigkill_right_after_a_deletion_keeps_it_deleted() {
    use testkit::kafka::{
        committed_offsets, delete_groups, list_groups, offset_commit, offset_delete,
    };
    let leader = FakeLeader::default();
    let (dir, addr) = killable_setup(&leader).await;
    let kafka = testkit::process::free_address();
    let extra = ["--kafka-listen", kafka.as_str()];
    let kafka: std::net::SocketAddr = kafka.parse().unwrap();
    let process =
        spawn_coordinator_with_args(dir.path(), &addr, &dir.path().join("first.log"), &extra);
    connect(&addr).await;
    let all = [("t", 0, 5), ("t", 1, 6), ("t", 2, 7)];
    for group in ["deleted", "trimmed", "kept"] {
        assert_eq!(offset_commit(kafka, group, &all).await, [0, 0, 0]);
    }
    assert_eq!(delete_groups(kafka, &["deleted"]).await, [0]);
    assert_eq!(
        offset_delete(kafka, "trimmed", &[("t", 1)]).await,
        (0, vec![0])
    );
    // At once: no clean stop, no flush at shutdown.
    process.kill();

    let _process =
        spawn_coordinator_with_args(dir.path(), &addr, &dir.path().join("second.log"), &extra);
    connect(&addr).await;
    let offsets = |group| committed_offsets(kafka, group);
    assert!(offsets("deleted").await.is_empty());
    assert_eq!(
        offsets("trimmed").await,
        [("t".to_string(), 0, 5), ("t".to_string(), 2, 7)]
    );
    assert_eq!(offsets("kept").await.len(), 3);
    let listed: Vec<String> = list_groups(kafka)
        .await
        .into_iter()
        .map(|(g, _)| g)
        .collect();
    assert_eq!(listed, ["kept", "trimmed"]);
}
