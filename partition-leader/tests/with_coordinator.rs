//! End-to-end gRPC tests with the REAL coordinator (from the `coordinator` crate) and real
//! leaders on loopback: fencing InitProducerId and its abort markers, late Produce after EndTxn,
//! read_committed over committed/aborted/open transactions, and leader restarts mid-protocol.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::Topology;
use common::*;
use coordinator::CoordinatorConfig;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::*;
use tokio::sync::oneshot;
use tonic::transport::Channel;

struct Cluster {
    topology: Arc<Topology>,
    coordinator: TransactionCoordinatorClient<Channel>,
    leaders: Vec<Leader>,
    _coordinator_stop: oneshot::Sender<()>,
    _dirs: Vec<tempfile::TempDir>,
}

async fn cluster() -> Cluster {
    let mut listeners = bind(3).await;
    let coordinator_listener = listeners.remove(0);
    let coordinator_addr = coordinator_listener.local_addr().unwrap();
    let leader_addrs = [
        listeners[0].local_addr().unwrap(),
        listeners[1].local_addr().unwrap(),
    ];
    let topology: Arc<Topology> = topology(&[coordinator_addr], &leader_addrs);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut config = CoordinatorConfig::new(1, dirs[2].path(), topology.clone());
    config.marker_retry_backoff = Duration::from_millis(20);
    config.cluster_secret = Some(testkit::auth::secret());
    config.timeout_scan_interval = Duration::from_millis(100);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(coordinator::serve(
        config,
        coordinator_listener,
        async move {
            let _ = stopped.await;
        },
    ));
    let leaders = listeners
        .into_iter()
        .zip([101, 102])
        .zip(&dirs)
        .map(|((l, id), d)| Leader::start(id, l, d.path().to_path_buf(), topology.clone()))
        .collect();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{coordinator_addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    Cluster {
        topology,
        coordinator: TransactionCoordinatorClient::new(channel),
        leaders,
        _coordinator_stop: stop,
        _dirs: dirs,
    }
}

fn retriable(c: ErrorCode) -> bool {
    matches!(
        c,
        ErrorCode::ConcurrentTransactions
            | ErrorCode::CoordinatorLoadInProgress
            | ErrorCode::NotCoordinator
            | ErrorCode::CoordinatorNotAvailable
    )
}

/// Retries a coordinator call while it answers a retriable code (bounded by a deadline).
macro_rules! retry {
    ($call:expr) => {{
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = $call.await.unwrap().into_inner();
            if !retriable(ErrorCode::from_wire(r.error_code)) || Instant::now() > deadline {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }};
}

async fn init(c: &mut TransactionCoordinatorClient<Channel>, id: &str) -> (i64, i32) {
    init_version(c, id, 2).await
}

/// InitProducerId for a client of transaction `version` (1: EndTxn keeps the epoch).
async fn init_version(
    c: &mut TransactionCoordinatorClient<Channel>,
    id: &str,
    version: i32,
) -> (i64, i32) {
    let r = retry!(c.init_producer_id(InitProducerIdRequest {
        transactional_id: Some(id.into()),
        transaction_timeout_ms: 60_000,
        expected_producer_id: -1,
        expected_producer_epoch: -1,
        transaction_version: version,
    }));
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    (r.producer_id, r.producer_epoch)
}

async fn add(c: &mut TransactionCoordinatorClient<Channel>, id: &str, pe: (i64, i32), ps: &[i32]) {
    let r = retry!(c.add_partitions_to_txn(AddPartitionsToTxnRequest {
        transactional_id: id.into(),
        producer_id: pe.0,
        producer_epoch: pe.1,
        partitions: ps
            .iter()
            .map(|p| proto::TopicPartition {
                topic: TOPIC.into(),
                partition: *p,
            })
            .collect(),
    }));
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
}

async fn end(
    c: &mut TransactionCoordinatorClient<Channel>,
    id: &str,
    pe: (i64, i32),
    commit: bool,
) -> (i64, i32) {
    let r = retry!(c.end_txn(requests::end_txn(id, pe, commit)));
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    (r.producer_id, r.producer_epoch)
}

/// Waits until the partition has no open transaction (its markers arrived).
async fn wait_stable(leader: &Leader, partition: i32) {
    let c = leader.client();
    eventually(&format!("partition {partition} to become stable"), || {
        let mut c = c.clone();
        async move {
            let r = fetch(&mut c, partition, 0, true).await;
            (r.error_code == 0 && r.last_stable_offset == r.high_watermark).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn fencing_init_producer_id_aborts_everywhere_and_the_leaders_reject_the_zombie() {
    let mut c = cluster().await;
    let old = init(&mut c.coordinator, "txn-a").await;
    add(&mut c.coordinator, "txn-a", old, &[0, 1]).await;
    let (mut l0, mut l1) = (c.leaders[0].client(), c.leaders[1].client());
    let r = produce(
        &mut l0,
        0,
        batch(old.0, old.1, 0, &["a1", "a2"], Some("txn-a")),
    )
    .await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    // t-1 was added but never written.

    // A new instance: InitProducerId fences the open transaction (aborts it, markers go out).
    let new = init(&mut c.coordinator, "txn-a").await;
    assert_eq!(new.0, old.0);
    assert!(new.1 > old.1 + 1, "{new:?}");
    wait_stable(&c.leaders[0], 0).await;

    // Both leaders hold the marker's epoch, including the one the transaction never wrote to.
    for (client, partition) in [(&mut l0, 0), (&mut l1, 1)] {
        let d = describe(client, partition).await;
        assert_eq!(d.producers.len(), 1, "partition {partition}");
        assert!(d.producers[0].producer_epoch > old.1);
        assert_eq!(d.producers[0].current_txn_start_offset, -1);
    }
    // The zombie is rejected by the leaders themselves (no coordinator round trip).
    let r = produce(
        &mut l0,
        0,
        batch(old.0, old.1, 2, &["zombie"], Some("txn-a")),
    )
    .await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    assert!(
        !r.error_message.contains("coordinator:"),
        "{}",
        r.error_message
    );
    let r = produce(
        &mut l1,
        1,
        batch(old.0, old.1, 0, &["zombie"], Some("txn-a")),
    )
    .await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    assert!(
        !r.error_message.contains("coordinator:"),
        "{}",
        r.error_message
    );

    // Nothing of the old transaction is visible; the new instance commits normally.
    assert!(fetch(&mut l0, 0, 0, true).await.records.is_empty());
    assert_eq!(values(&fetch(&mut l0, 0, 0, false).await), vec!["a1", "a2"]);
    add(&mut c.coordinator, "txn-a", new, &[1]).await;
    let r = produce(&mut l1, 1, batch(new.0, new.1, 0, &["new"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    end(&mut c.coordinator, "txn-a", new, true).await;
    wait_stable(&c.leaders[1], 1).await;
    assert_eq!(values(&fetch(&mut l1, 1, 0, true).await), vec!["new"]);
}

#[tokio::test]
async fn a_late_produce_after_end_txn_is_rejected_and_opens_nothing() {
    let mut c = cluster().await;
    let pe = init(&mut c.coordinator, "txn-b").await;
    add(&mut c.coordinator, "txn-b", pe, &[0]).await;
    let mut l0 = c.leaders[0].client();
    produce(&mut l0, 0, batch(pe.0, pe.1, 0, &["b1"], Some("txn-b"))).await;
    let next = end(&mut c.coordinator, "txn-b", pe, true).await;
    assert_eq!((next.0, next.1), (pe.0, pe.1 + 1));
    wait_stable(&c.leaders[0], 0).await;

    // The finished transaction's delayed next batch, where it wrote and where it never did.
    let r = produce(&mut l0, 0, batch(pe.0, pe.1, 1, &["late"], Some("txn-b"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let r = produce(&mut l0, 2, batch(pe.0, pe.1, 0, &["late"], Some("txn-b"))).await;
    assert_eq!(
        code(r.error_code),
        ErrorCode::InvalidProducerEpoch,
        "{}",
        r.error_message
    );
    // The current epoch without AddPartitionsToTxn cannot open a transaction either.
    let r = produce(
        &mut l0,
        2,
        batch(next.0, next.1, 0, &["unadded"], Some("txn-b")),
    )
    .await;
    assert_eq!(
        code(r.error_code),
        ErrorCode::InvalidTxnState,
        "{}",
        r.error_message
    );
    let f = fetch(&mut l0, 2, 0, true).await;
    assert_eq!((f.high_watermark, f.last_stable_offset), (0, 0));
    assert!(describe(&mut l0, 2).await.producers.is_empty());
    assert_eq!(values(&fetch(&mut l0, 0, 0, true).await), vec!["b1"]);
}

#[tokio::test]
async fn read_committed_sees_only_committed_transactions() {
    let mut c = cluster().await;
    let mut l0 = c.leaders[0].client();
    let a = init(&mut c.coordinator, "commit-me").await;
    let b = init(&mut c.coordinator, "abort-me").await;
    let o = init(&mut c.coordinator, "leave-open").await;
    for (id, pe) in [("commit-me", a), ("abort-me", b), ("leave-open", o)] {
        add(&mut c.coordinator, id, pe, &[0]).await;
    }
    produce(&mut l0, 0, batch(a.0, a.1, 0, &["c1"], Some("commit-me"))).await;
    produce(&mut l0, 0, batch(b.0, b.1, 0, &["x1"], Some("abort-me"))).await;
    produce(&mut l0, 0, batch(a.0, a.1, 1, &["c2"], Some("commit-me"))).await;
    produce(&mut l0, 0, batch(b.0, b.1, 1, &["x2"], Some("abort-me"))).await;
    end(&mut c.coordinator, "commit-me", a, true).await;
    end(&mut c.coordinator, "abort-me", b, false).await;
    eventually("the markers to arrive", || {
        let mut l0 = l0.clone();
        async move { (fetch(&mut l0, 0, 0, true).await.last_stable_offset == 6).then_some(()) }
    })
    .await;
    produce(&mut l0, 0, batch(o.0, o.1, 0, &["o1"], Some("leave-open"))).await;
    let committed = fetch(&mut l0, 0, 0, true).await;
    assert_eq!(values(&committed), vec!["c1", "c2"]);
    assert_eq!(
        (committed.last_stable_offset, committed.high_watermark),
        (6, 7)
    );
    assert_eq!(
        values(&fetch(&mut l0, 0, 0, false).await),
        vec!["c1", "x1", "c2", "x2", "o1"]
    );
}

#[tokio::test]
async fn leader_restarts_mid_transaction_keep_everything_and_fencing_holds() {
    let mut c = cluster().await;
    let pe = init(&mut c.coordinator, "txn-r").await;
    add(&mut c.coordinator, "txn-r", pe, &[0, 1]).await;
    let mut l0 = c.leaders[0].client();
    let mut l1 = c.leaders[1].client();
    produce(
        &mut l0,
        0,
        batch(pe.0, pe.1, 0, &["r1", "r2"], Some("txn-r")),
    )
    .await;
    produce(&mut l1, 1, batch(pe.0, pe.1, 0, &["s1"], Some("txn-r"))).await;

    // Restart between Produce and marker: the state is identical afterwards.
    let before = snapshot(&mut l0, 0).await;
    assert_eq!(before.0.last_stable_offset, 0);
    c.leaders[0].restart().await;
    let mut l0 = c.leaders[0].client();
    assert_eq!(snapshot(&mut l0, 0).await, before);

    // Commit while leader 101 is down: the coordinator retries its marker until it is back.
    c.leaders[0].stop().await;
    let next = end(&mut c.coordinator, "txn-r", pe, true).await;
    wait_stable(&c.leaders[1], 1).await;
    c.leaders[0].restart().await;
    wait_stable(&c.leaders[0], 0).await;
    let mut l0 = c.leaders[0].client();
    assert_eq!(values(&fetch(&mut l0, 0, 0, true).await), vec!["r1", "r2"]);

    // Restart between marker and fetch: identical.
    let before = (snapshot(&mut l0, 0).await, snapshot(&mut l1, 1).await);
    c.leaders[0].restart().await;
    c.leaders[1].restart().await;
    let mut l0 = c.leaders[0].client();
    let mut l1 = c.leaders[1].client();
    assert_eq!(
        (snapshot(&mut l0, 0).await, snapshot(&mut l1, 1).await),
        before
    );

    // Fencing holds after the restarts.
    let r = produce(&mut l0, 0, batch(pe.0, pe.1, 2, &["zombie"], Some("txn-r"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let r = produce(&mut l1, 1, batch(pe.0, pe.1, 1, &["zombie"], None)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    // And the current epoch carries on from sequence 0.
    add(&mut c.coordinator, "txn-r", next, &[0]).await;
    let r = produce(&mut l0, 0, batch(next.0, next.1, 0, &["r3"], Some("txn-r"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    for leader in &mut c.leaders {
        leader.stop().await;
    }
}

/// Transaction version 1 keeps the epoch across a producer's transactions. A COMMIT marker of
/// a finished transaction that arrives late (an attempt delayed in the network) carries the same
/// PID and epoch as the next transaction, which is open here; it carries the finished one's
/// number, which the leader tells from the open one's (learnt from the verification of its
/// first write): it closes nothing. The next transaction then aborts, and none of its records
/// is ever visible.
#[tokio::test]
async fn a_late_version_1_commit_marker_never_commits_the_next_transaction() {
    let mut c = cluster().await;
    let id = "txn-v1-late";
    let pe = init_version(&mut c.coordinator, id, 1).await;
    let mut l0 = c.leaders[0].client();
    add(&mut c.coordinator, id, pe, &[0]).await;
    let r = produce(&mut l0, 0, batch(pe.0, pe.1, 0, &["first"], Some(id))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!(end(&mut c.coordinator, id, pe, true).await, pe);
    wait_stable(&c.leaders[0], 0).await;
    // The first transaction's marker, exactly as its coordinator (generation 1) sent it.
    let mut late = WriteTxnMarkersRequest {
        producer_id: pe.0,
        producer_epoch: pe.1,
        result: TxnResult::Commit as i32,
        coordinator_id: 1,
        coordinator_generation: 1,
        partitions: vec![proto::TopicPartition {
            topic: TOPIC.into(),
            partition: 0,
        }],
        transactional_id: id.into(),
        auth: None,
        transaction_version: 1,
        transaction_number: 1,
    };
    testkit::auth::sign(&c.topology, 1, &mut late);

    // The next transaction, at the same epoch, writes and is still open.
    add(&mut c.coordinator, id, pe, &[0]).await;
    let r = produce(&mut l0, 0, batch(pe.0, pe.1, 1, &["second"], Some(id))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    let r = l0.write_txn_markers(late).await.unwrap().into_inner();
    assert_eq!(
        code(r.results[0].error_code),
        ErrorCode::None,
        "acknowledged as a repeat"
    );
    let d = describe(&mut l0, 0).await;
    assert_ne!(
        d.producers[0].current_txn_start_offset, -1,
        "the open transaction stays open"
    );
    assert_eq!(values(&fetch(&mut l0, 0, 0, true).await), vec!["first"]);

    end(&mut c.coordinator, id, pe, false).await;
    wait_stable(&c.leaders[0], 0).await;
    assert_eq!(
        values(&fetch(&mut l0, 0, 0, true).await),
        vec!["first"],
        "the aborted transaction is never visible"
    );
}
