//! Faults mid-protocol: a coordinator killed between PrepareCommit and CompleteCommit, a
//! partition leader restarted mid-transaction, and the consume-transform-produce application
//! killed and replaced mid-stream.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use integration_tests::{cluster, config, describe, producer, state, tp, values};
use minibroker::process::{self, ProcessOptions};
use producer_client::{Consumer, IdempotentProducer, Isolation};
use proto::TxnState;
use testkit::poll::wait_until;
use tokio::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_between_prepare_commit_and_complete_commit() {
    let mut cluster = cluster().await;
    let id = "app";
    let mut p = producer(&cluster, id).await;
    p.begin_transaction().unwrap();
    for partition in 0..3 {
        p.send_and_wait("input", partition, format!("v{partition}"))
            .await
            .unwrap();
    }
    // The leaders go away, so no COMMIT marker can be written...
    let leaders = cluster.leader_ids();
    for l in &leaders {
        cluster.kill(*l).await.unwrap();
    }
    // ... the commit is decided (PrepareCommit is durable before EndTxn answers) ...
    p.commit_transaction().await.unwrap();
    assert_eq!(state(&cluster, id).await, TxnState::PrepareCommit);
    // ... and the coordinator dies before CompleteCommit.
    let owner = cluster.coordinator_for(id);
    cluster.kill(owner).await.unwrap();
    for l in &leaders {
        cluster.restart(*l).await.unwrap();
    }
    cluster.restart(owner).await.unwrap();

    // On start the coordinator finds PrepareCommit and finishes the commit.
    wait_until(
        Duration::from_secs(15),
        "the restarted coordinator completes the commit",
        || async { state(&cluster, id).await == TxnState::CompleteCommit },
    )
    .await;
    let mut seen = values(&cluster, "input", Isolation::ReadCommitted).await;
    seen.sort();
    assert_eq!(seen, vec!["v0", "v1", "v2"], "committed exactly once");

    // The producer carries on with the (PID, epoch) EndTxn gave it.
    p.begin_transaction().unwrap();
    p.send_and_wait("input", 0, "after").await.unwrap();
    p.commit_transaction().await.unwrap();
    let seen = values(&cluster, "input", Isolation::ReadCommitted).await;
    assert_eq!(seen.iter().filter(|v| *v == "v0").count(), 1);
    assert!(seen.contains(&"after".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_restarted_mid_transaction() {
    let mut cluster = cluster().await;
    let id = "app";
    let mut p = producer(&cluster, id).await;
    p.begin_transaction().unwrap();
    p.send_and_wait("input", 0, "before-restart").await.unwrap();
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    cluster.bounce(leader).await.unwrap();
    // The restarted leader remembers the open transaction: it still holds the LSO back.
    let mut rc = Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    rc.assign([tp("input", 0)]);
    assert!(rc
        .read_to_end(Duration::from_secs(10))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        rc.watermarks(&tp("input", 0)).unwrap().last_stable_offset,
        0
    );
    // ... and the producer's sequence state: the next sequence is accepted.
    p.send_and_wait("input", 0, "after-restart").await.unwrap();
    p.send_and_wait("input", 1, "other-partition")
        .await
        .unwrap();
    p.commit_transaction().await.unwrap();
    let by_partition =
        integration_tests::read_topic(&cluster, "input", Isolation::ReadCommitted).await;
    assert_eq!(by_partition[&0], vec!["before-restart", "after-restart"]);
    assert_eq!(by_partition[&1], vec!["other-partition"]);
    let d = describe(&cluster, id).await;
    assert_eq!(d.state, TxnState::CompleteCommit as i32);
}

const INPUT_RECORDS: usize = 10_000;

async fn committed_total(consumer: &Mutex<Consumer>, group: &str) -> u64 {
    consumer
        .lock()
        .await
        .committed_offsets(group, &[])
        .await
        .map(|o| o.values().map(|v| *v as u64).sum())
        .unwrap_or(0)
}

/// The classic exactly-once workload: 10,000 input records; processor 1 is killed mid-stream
/// (its task dropped, like a crash: whatever it had in flight is abandoned), processor 2
/// replaces it, rides out a restart of a partition leader, and is itself replaced by processor 3
/// while still running (3 fences 2), and processor 3 finishes. The output holds every input record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_transform_produce_killed_and_replaced_mid_stream() {
    let mut cluster = cluster().await;
    let group = "etl";
    let id = "etl-1";

    // Input: 10,000 records over 3 partitions, idempotently, in batches.
    let mut producer = IdempotentProducer::connect(config(&cluster)).await.unwrap();
    let mut expected = Vec::with_capacity(INPUT_RECORDS);
    for chunk in 0..(INPUT_RECORDS / 100) {
        let values: Vec<Vec<u8>> = (0..100)
            .map(|i| format!("rec-{}", chunk * 100 + i).into_bytes())
            .collect();
        expected.extend(
            values
                .iter()
                .map(|v| format!("processed({})", String::from_utf8_lossy(v))),
        );
        producer
            .send_batch("input", (chunk % 3) as i32, values)
            .await
            .unwrap();
    }

    let options = ProcessOptions {
        group: group.into(),
        transactional_id: id.into(),
        max_records_per_txn: 500,
        ..ProcessOptions::default()
    };
    let client_config = config(&cluster);
    let spawn = |stop: tokio::sync::oneshot::Receiver<()>| {
        let config = client_config.clone();
        let options = options.clone();
        tokio::spawn(async move {
            process::run(
                config,
                options,
                async {
                    let _ = stop.await;
                },
                |_| {},
            )
            .await
        })
    };
    // The progress checks read the offsets committed so far without asking for stable ones: a
    // read_committed OffsetFetch (KIP-447) waits while the killed processor's TxnOffsetCommit
    // is pending, and nothing ends that transaction until processor 2 starts.
    let offsets = Arc::new(Mutex::new(
        Consumer::new(client_config.clone(), Isolation::ReadUncommitted).unwrap(),
    ));
    let committed_at_least = |n: u64| {
        let offsets = offsets.clone();
        move || {
            let offsets = offsets.clone();
            async move { committed_total(&offsets, group).await >= n }
        }
    };

    // Processor 1 runs until ~25% is committed, then crashes.
    let (_stop1, rx1) = tokio::sync::oneshot::channel();
    let p1 = spawn(rx1);
    wait_until(
        Duration::from_secs(60),
        "processor 1 commits 2,500 records",
        committed_at_least(2_500),
    )
    .await;
    p1.abort();
    let _ = p1.await;
    let after_crash = committed_total(&offsets, group).await;

    // Processor 2 replaces it and runs until ~60%.
    let (stop2, rx2) = tokio::sync::oneshot::channel();
    let p2 = spawn(rx2);
    // A partition leader of both topics restarts under processor 2.
    wait_until(
        Duration::from_secs(60),
        "processor 2 commits 4,000 records",
        committed_at_least(4_000),
    )
    .await;
    cluster.bounce(cluster.leader_ids()[0]).await.unwrap();
    wait_until(
        Duration::from_secs(60),
        "processor 2 commits up to 6,000 records",
        committed_at_least(6_000),
    )
    .await;
    // Processor 3 starts while 2 is still running: it fences 2, which must stop with a fatal
    // error (or had nothing left to do).
    let (stop3, rx3) = tokio::sync::oneshot::channel();
    let p3 = spawn(rx3);
    wait_until(
        Duration::from_secs(60),
        "processor 3 commits every input record",
        committed_at_least(INPUT_RECORDS as u64),
    )
    .await;
    let _ = stop3.send(());
    let stats3 = p3.await.unwrap().unwrap();
    // Processor 2 was fenced: at its next transaction it stopped with the fatal error. (Had it
    // been idle it would not know yet; then it is stopped here, and the output check below still
    // proves it wrote nothing visible after the fence.)
    let p2_fenced = p2.is_finished();
    let _ = stop2.send(());
    match p2.await.unwrap() {
        Err(e) => assert!(
            e.downcast_ref::<producer_client::Error>()
                .is_some_and(|e| e.is_fatal()),
            "processor 2 must stop because it was fenced, got: {e:#}"
        ),
        Ok(_) => assert!(!p2_fenced, "processor 2 stopped without an error"),
    }
    assert!(after_crash >= 2_500);
    assert!(stats3.records > 0);

    // Every input record is in the output exactly once.
    let output = values(&cluster, "output", Isolation::ReadCommitted).await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for v in &output {
        *counts.entry(v.as_str()).or_default() += 1;
    }
    let duplicates: usize = counts.values().map(|c| c.saturating_sub(1)).sum();
    let missing = expected
        .iter()
        .filter(|v| !counts.contains_key(v.as_str()))
        .count();
    let unexpected = output.len() - (output.len() - duplicates).min(expected.len());
    assert_eq!(duplicates, 0, "duplicates in the output");
    assert_eq!(missing, 0, "input records missing from the output");
    assert_eq!(output.len(), INPUT_RECORDS, "unexpected={unexpected}");
    // The aborted work of the crashed/fenced processors is in the log but invisible.
    let raw = values(&cluster, "output", Isolation::ReadUncommitted).await;
    assert!(raw.len() >= INPUT_RECORDS);
    // Per partition the output keeps the input order.
    let by_partition: BTreeMap<i32, Vec<String>> =
        integration_tests::read_topic(&cluster, "output", Isolation::ReadCommitted).await;
    for (p, vals) in by_partition {
        let idx: Vec<usize> = vals
            .iter()
            .map(|v| {
                v.trim_start_matches("processed(rec-")
                    .trim_end_matches(')')
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(
            idx.windows(2).all(|w| w[0] < w[1]),
            "partition {p} out of order"
        );
    }
}

/// A commit sent while the coordinator is down is retried (transport errors, then
/// COORDINATOR_LOAD_IN_PROGRESS) with the same decision until the restarted coordinator answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_is_retried_across_a_coordinator_restart() {
    let mut cluster = cluster().await;
    let id = "app";
    let mut p = producer(&cluster, id).await;
    p.begin_transaction().unwrap();
    p.send_and_wait("input", 0, "v").await.unwrap();
    let owner = cluster.coordinator_for(id);
    cluster.kill(owner).await.unwrap();
    let commit = tokio::spawn(async move {
        let result = p.commit_transaction().await;
        (p, result)
    });
    cluster.restart(owner).await.unwrap();
    let (mut p, result) = commit.await.unwrap();
    result.unwrap();
    assert_eq!(
        values(&cluster, "input", Isolation::ReadCommitted).await,
        vec!["v"]
    );
    p.begin_transaction().unwrap();
    p.send_and_wait("input", 1, "w").await.unwrap();
    p.commit_transaction().await.unwrap();
}

/// The idempotent producer across a leader restart: every record once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_across_a_leader_restart() {
    let mut cluster = cluster().await;
    let mut p = IdempotentProducer::connect(config(&cluster)).await.unwrap();
    assert_eq!(p.epoch(), 0);
    for i in 0..5 {
        p.send_and_wait("input", 0, format!("v{i}")).await.unwrap();
    }
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    cluster.bounce(leader).await.unwrap();
    for i in 5..10 {
        p.send_and_wait("input", 0, format!("v{i}")).await.unwrap();
    }
    let expected: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    let by_partition =
        integration_tests::read_topic(&cluster, "input", Isolation::ReadUncommitted).await;
    assert_eq!(by_partition[&0], expected);
    let producers = producer_client::Admin::new(config(&cluster))
        .unwrap()
        .describe_producers("input", 0)
        .await
        .unwrap();
    let state = producers
        .iter()
        .find(|s| s.producer_id == p.producer_id())
        .unwrap();
    assert_eq!(state.last_sequence, 9);
}

/// A send to a leader that is down is retried (same batch, same sequence) until the leader is
/// back, and lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_is_retried_until_a_killed_leader_returns() {
    let mut cluster = cluster().await;
    let mut p = producer(&cluster, "app").await;
    p.begin_transaction().unwrap();
    p.send_and_wait("input", 0, "first").await.unwrap();
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    cluster.kill(leader).await.unwrap();
    let send = tokio::spawn(async move {
        let result = p.send_and_wait("input", 0, "second").await;
        (p, result)
    });
    cluster.restart(leader).await.unwrap();
    let (mut p, result) = send.await.unwrap();
    assert!(!result.unwrap().duplicate);
    p.commit_transaction().await.unwrap();
    let by_partition =
        integration_tests::read_topic(&cluster, "input", Isolation::ReadCommitted).await;
    assert_eq!(by_partition[&0], vec!["first", "second"]);
}
