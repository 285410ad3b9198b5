//! gRPC tests of the partition leader against a test-only fake coordinator (VerifyTransaction
//! only): markers sent by the test, restarts over sled, bad input. The end-to-end tests with the
//! real coordinator are in `with_coordinator.rs`.

mod common;

use std::time::Duration;

use common::*;
use proto::ErrorCode;

struct Cluster {
    coordinator: FakeCoordinator,
    leaders: Vec<Leader>,
    _dirs: Vec<tempfile::TempDir>,
}

async fn cluster() -> Cluster {
    cluster_with(|_| {}).await
}

async fn cluster_with(configure: fn(&mut partition_leader::LeaderConfig)) -> Cluster {
    let mut listeners = bind(3).await;
    let coordinator_listener = listeners.remove(0);
    let leader_addrs = [
        listeners[0].local_addr().unwrap(),
        listeners[1].local_addr().unwrap(),
    ];
    let topology = topology(&[coordinator_listener.local_addr().unwrap()], &leader_addrs);
    let coordinator = FakeCoordinator::for_topic(TOPIC);
    coordinator.serve(coordinator_listener);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let leaders = listeners
        .into_iter()
        .zip([101, 102])
        .zip(&dirs)
        .map(|((l, id), d)| {
            Leader::start_with(id, l, d.path().to_path_buf(), topology.clone(), configure)
        })
        .collect();
    Cluster {
        coordinator,
        leaders,
        _dirs: dirs,
    }
}

#[tokio::test]
async fn abort_markers_fence_the_old_epoch_at_the_leader_even_where_nothing_was_written() {
    let c = cluster().await;
    // The coordinator would say yes to anything: every rejection below is the leader's own.
    c.coordinator.set("txn-a", 10, 0, &[0, 1]);
    let (mut l0, mut l1) = (c.leaders[0].client(), c.leaders[1].client());
    let r = produce(&mut l0, 0, batch(10, 0, 0, &["a1", "a2"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    *c.coordinator.permissive.lock().unwrap() = true;

    // The new instance's InitProducerId bumped to epoch 1; the coordinator aborts at both
    // partitions of the old transaction (t-1 was added but never written).
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 10, 1, false, 1, &[0]).await,
        vec![ErrorCode::None]
    );
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l1, 10, 1, false, 1, &[1]).await,
        vec![ErrorCode::None]
    );

    let r = produce(&mut l0, 0, batch(10, 0, 2, &["zombie"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let r = produce(&mut l1, 1, batch(10, 0, 0, &["zombie"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let r = produce(&mut l1, 1, batch(10, 0, 0, &["zombie"], None)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    // Rejected by the leader's own epoch check: the coordinator (which would say yes) is asked
    // afterwards only why, for each transactional zombie batch, to tell a timed-out producer
    // apart (its answer cannot let a batch in).
    assert_eq!(
        *c.coordinator.verify_calls.lock().unwrap(),
        3,
        "one verification, then one question per refused transactional batch"
    );

    // Nothing of the old transaction is visible to read_committed; read_uncommitted sees it.
    let committed = fetch(&mut l0, 0, 0, true).await;
    assert!(committed.records.is_empty());
    assert_eq!(
        (committed.high_watermark, committed.last_stable_offset),
        (3, 3)
    );
    assert_eq!(values(&fetch(&mut l0, 0, 0, false).await), vec!["a1", "a2"]);
    assert_eq!(fetch(&mut l1, 1, 0, false).await.high_watermark, 0);
    // The new epoch writes from sequence 0.
    let r = produce(&mut l1, 1, batch(10, 1, 0, &["new"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None);
}

#[tokio::test]
async fn a_late_produce_from_a_finished_transaction_does_not_open_a_new_one() {
    let c = cluster().await;
    c.coordinator.set("txn-b", 20, 0, &[0]);
    let mut l0 = c.leaders[0].client();
    produce(&mut l0, 0, batch(20, 0, 0, &["b1"], Some("txn-b"))).await;
    // EndTxn(COMMIT) at epoch 0 -> epoch 1, markers with epoch 1; the next transaction is empty.
    c.coordinator.set("txn-b", 20, 1, &[]);
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 20, 1, true, 1, &[0]).await,
        vec![ErrorCode::None]
    );
    // A delayed retry of the finished transaction's next batch, here and on a partition the
    // transaction never touched (no state there: the coordinator's verification rejects it).
    let r = produce(&mut l0, 0, batch(20, 0, 1, &["late"], Some("txn-b"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let r = produce(&mut l0, 2, batch(20, 0, 0, &["late"], Some("txn-b"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    // At the current epoch but for a partition not added: INVALID_TXN_STATE, nothing opened.
    let r = produce(&mut l0, 2, batch(20, 1, 0, &["unadded"], Some("txn-b"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidTxnState);
    let r2 = fetch(&mut l0, 2, 0, true).await;
    assert_eq!((r2.high_watermark, r2.last_stable_offset), (0, 0));
    assert!(describe(&mut l0, 2).await.producers.is_empty());
    let r0 = fetch(&mut l0, 0, 0, true).await;
    assert_eq!(values(&r0), vec!["b1"]);
    assert_eq!(r0.last_stable_offset, r0.high_watermark);
}

#[tokio::test]
async fn read_committed_never_sees_open_or_aborted_records() {
    let c = cluster().await;
    c.coordinator.set("a", 1, 0, &[0]);
    c.coordinator.set("b", 2, 0, &[0]);
    let mut l0 = c.leaders[0].client();
    produce(&mut l0, 0, batch(1, 0, 0, &["a1"], Some("a"))).await; // 0
    produce(&mut l0, 0, batch(2, 0, 0, &["b1"], Some("b"))).await; // 1
    produce(&mut l0, 0, batch(3, 0, 0, &["idem"], None)).await; // 2
    produce(&mut l0, 0, batch(-1, -1, -1, &["plain"], None)).await; // 3
    produce(&mut l0, 0, batch(1, 0, 1, &["a2"], Some("a"))).await; // 4
    assert!(fetch(&mut l0, 0, 0, true).await.records.is_empty());
    assert_eq!(
        values(&fetch(&mut l0, 0, 0, false).await),
        vec!["a1", "b1", "idem", "plain", "a2"]
    );
    // A read_committed long poll is released when b commits... but a is still open at 0.
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 2, 1, true, 1, &[0]).await,
        vec![ErrorCode::None]
    ); // 5
    assert!(fetch(&mut l0, 0, 0, true).await.records.is_empty());
    let mut poller = l0.clone();
    let poll = tokio::spawn(async move {
        poller
            .fetch(proto::FetchRequest {
                topic: TOPIC.into(),
                partition: 0,
                offset: 0,
                max_bytes: 1 << 20,
                isolation_level: proto::IsolationLevel::ReadCommitted as i32,
                max_wait_ms: 20_000,
            })
            .await
            .unwrap()
            .into_inner()
    });
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 1, 1, false, 1, &[0]).await,
        vec![ErrorCode::None]
    ); // 6
    let polled = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(values(&polled), vec!["b1", "idem", "plain"]);
    let all = fetch(&mut l0, 0, 0, true).await;
    assert_eq!(values(&all), vec!["b1", "idem", "plain"]);
    assert_eq!(
        (all.next_offset, all.last_stable_offset, all.high_watermark),
        (7, 7, 7)
    );
    assert_eq!(
        values(&fetch(&mut l0, 0, 0, false).await),
        vec!["a1", "b1", "idem", "plain", "a2"]
    );
}

#[tokio::test]
async fn restarts_between_produce_and_marker_and_between_marker_and_fetch_change_nothing() {
    let mut c = cluster().await;
    c.coordinator.set("a", 1, 0, &[0, 1]);
    c.coordinator.set("b", 2, 0, &[0]);
    let mut l0 = c.leaders[0].client();
    produce(&mut l0, 0, batch(1, 0, 0, &["a1", "a2"], Some("a"))).await;
    produce(&mut l0, 0, batch(2, 0, 0, &["b1"], Some("b"))).await;
    produce(&mut l0, 0, batch(3, 0, 0, &["i1"], None)).await;
    produce(&mut l0, 0, batch(2, 0, 1, &["b2"], Some("b"))).await;
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 2, 1, true, 1, &[0]).await,
        vec![ErrorCode::None]
    );

    // Restart between Produce and marker (a is open).
    let before = snapshot(&mut l0, 0).await;
    assert_eq!(before.1.last_stable_offset, 0);
    c.leaders[0].restart().await;
    let mut l0 = c.leaders[0].client();
    assert_eq!(snapshot(&mut l0, 0).await, before);
    // Duplicate detection survived too.
    let r = produce(&mut l0, 0, batch(3, 0, 0, &["i1"], None)).await;
    assert_eq!((r.base_offset, r.duplicate), (3, true));

    // The marker arrives after the restart; then restart between marker and fetch.
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 1, 1, false, 1, &[0]).await,
        vec![ErrorCode::None]
    );
    let before = snapshot(&mut l0, 0).await;
    assert_eq!(values(&before.1), vec!["b1", "i1", "b2"]);
    let mut l1 = c.leaders[1].client();
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l1, 1, 1, false, 1, &[1]).await,
        vec![ErrorCode::None]
    );
    let before1 = snapshot(&mut l1, 1).await;
    c.leaders[0].restart().await;
    c.leaders[1].restart().await;
    let mut l0 = c.leaders[0].client();
    let mut l1 = c.leaders[1].client();
    assert_eq!(snapshot(&mut l0, 0).await, before);
    assert_eq!(snapshot(&mut l1, 1).await, before1);
    // Fencing holds after the restarts, also where a never wrote; the marker stays idempotent.
    *c.coordinator.permissive.lock().unwrap() = true;
    let r = produce(&mut l0, 0, batch(1, 0, 2, &["zombie"], Some("a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let r = produce(&mut l1, 1, batch(1, 0, 0, &["zombie"], Some("a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 1, 1, false, 1, &[0]).await,
        vec![ErrorCode::None]
    );
    assert_eq!(snapshot(&mut l0, 0).await, before);
    // An older coordinator generation is fenced.
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 1, 2, false, 0, &[0]).await,
        vec![ErrorCode::TransactionCoordinatorFenced]
    );
    for leader in &mut c.leaders {
        leader.stop().await;
    }
    // The aborted index on disk, read back directly (the directory reopens at once).
    use partition_leader::storage::Storage;
    let storage = partition_leader::storage::SledStorage::open(&c.leaders[0].dir).unwrap();
    let loaded = storage
        .load(&cluster::TopicPartition::new(TOPIC, 0))
        .unwrap();
    assert_eq!(
        loaded.aborted,
        vec![partition_leader::core::AbortedTxn {
            producer_id: 1,
            first_offset: 0,
            last_offset: 6
        }]
    );
    assert_eq!(loaded.high_watermark, 7);
}

#[tokio::test]
async fn bad_input_gets_typed_errors_and_stores_nothing() {
    let c = cluster().await;
    let mut l0 = c.leaders[0].client();
    let big = "x".repeat(16 * 1024 + 1);
    let many: Vec<String> = (0..8).map(|_| "y".repeat(9 * 1024)).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let long_id = "i".repeat(300);
    let cases = [
        (batch(1, 0, 0, &[], None), ErrorCode::InvalidRequest),
        (batch(1, 0, -1, &["a"], None), ErrorCode::InvalidRequest),
        (
            batch(1, 0, i32::MIN, &["a"], None),
            ErrorCode::InvalidRequest,
        ),
        (batch(1, -3, 0, &["a"], None), ErrorCode::InvalidRequest),
        (batch(1, 32_768, 0, &["a"], None), ErrorCode::InvalidRequest),
        (batch(-2, 0, 0, &["a"], None), ErrorCode::InvalidRequest),
        (
            batch(i64::MIN, 0, 0, &["a"], None),
            ErrorCode::InvalidRequest,
        ),
        (
            batch(-1, -1, -1, &["a"], Some("t")),
            ErrorCode::InvalidRequest,
        ),
        (batch(1, 0, 0, &["a"], Some("")), ErrorCode::InvalidRequest),
        (
            batch(1, 0, 0, &["a"], Some(&long_id)),
            ErrorCode::InvalidRequest,
        ),
        (batch(1, 0, 0, &[&big], None), ErrorCode::MessageTooLarge),
        (batch(1, 0, 0, &many, None), ErrorCode::MessageTooLarge),
        (batch(1, 0, 5, &["a"], None), ErrorCode::UnknownProducerId),
        (
            batch(1, 0, i32::MAX, &["a"], None),
            ErrorCode::UnknownProducerId,
        ),
    ];
    for (b, expected) in cases {
        let r = produce(&mut l0, 0, b).await;
        assert_eq!(code(r.error_code), expected, "{}", r.error_message);
        assert!(!r.error_message.is_empty());
    }
    for (topic, partition, expected) in [
        ("nope", 0, ErrorCode::UnknownTopicOrPartition),
        (TOPIC, 3, ErrorCode::UnknownTopicOrPartition),
        (TOPIC, -1, ErrorCode::UnknownTopicOrPartition),
        (TOPIC, 1, ErrorCode::NotLeaderOrFollower),
    ] {
        let r = l0
            .produce(proto::ProduceRequest {
                topic: topic.into(),
                partition,
                batch: Some(batch(1, 0, 0, &["a"], None)),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.error_code), expected);
        let r = l0
            .fetch(proto::FetchRequest {
                topic: topic.into(),
                partition,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.error_code), expected);
    }
    // Markers: bad fields, unknown partitions; a marker for an unknown PID appends nothing.
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, -5, 1, true, 1, &[0, 3]).await,
        vec![
            ErrorCode::InvalidRequest,
            ErrorCode::UnknownTopicOrPartition
        ]
    );
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 5, 99_999, true, 1, &[0]).await,
        vec![ErrorCode::InvalidRequest]
    );
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 5, 1, true, -1, &[0]).await,
        vec![ErrorCode::InvalidRequest]
    );
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 77, 3, false, 1, &[0]).await,
        vec![ErrorCode::None]
    );
    // Fetch: bad offsets and fields.
    for (offset, max_bytes, isolation, wait, expected) in [
        (1, 100, 0, 0, ErrorCode::OffsetOutOfRange),
        (-1, 100, 0, 0, ErrorCode::OffsetOutOfRange),
        (0, -1, 0, 0, ErrorCode::InvalidRequest),
        (0, 100, 9, 0, ErrorCode::InvalidRequest),
        (0, 100, 1, -1, ErrorCode::InvalidRequest),
    ] {
        let r = l0
            .fetch(proto::FetchRequest {
                topic: TOPIC.into(),
                partition: 0,
                offset,
                max_bytes,
                isolation_level: isolation,
                max_wait_ms: wait,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.error_code), expected);
    }
    // Nothing was stored except the unknown PID's epoch.
    let (uncommitted, committed, producers) = snapshot(&mut l0, 0).await;
    assert_eq!(
        (uncommitted.high_watermark, committed.high_watermark),
        (0, 0)
    );
    assert_eq!(producers.producers.len(), 1);
    assert_eq!(
        (
            producers.producers[0].producer_id,
            producers.producers[0].producer_epoch
        ),
        (77, 3)
    );
    let r = produce(&mut l0, 0, batch(77, 2, 0, &["zombie"], None)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
}

#[tokio::test]
async fn unsafe_skip_epoch_check_lets_a_zombie_through() {
    let mut listeners = bind(3).await;
    let coordinator_listener = listeners.remove(0);
    let addrs = [
        listeners[0].local_addr().unwrap(),
        listeners[1].local_addr().unwrap(),
    ];
    let topology = topology(&[coordinator_listener.local_addr().unwrap()], &addrs);
    let coordinator = FakeCoordinator::for_topic(TOPIC);
    coordinator.serve(coordinator_listener);
    coordinator.set("z", 5, 0, &[0]);
    let dir = tempfile::tempdir().unwrap();
    let mut leader = Leader::start(101, listeners.remove(0), dir.path().into(), topology);
    leader.skip_epoch_check = true;
    leader.restart().await;
    let mut l0 = leader.client();
    produce(&mut l0, 0, batch(5, 0, 0, &["z1"], Some("z"))).await;
    assert_eq!(
        markers(&leader.topology, &mut l0, 5, 1, false, 1, &[0]).await,
        vec![ErrorCode::None]
    );
    let r = produce(&mut l0, 0, batch(5, 0, 1, &["zombie"], Some("z"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None);
    // The broken fencing is visible to read_committed readers: what the checker must catch.
    assert_eq!(values(&fetch(&mut l0, 0, 0, true).await), vec!["zombie"]);
    leader.stop().await;
}

#[tokio::test]
async fn unreachable_coordinator_is_retriable_and_appends_nothing() {
    // The coordinator's address is a port nobody listens on.
    let dead = bind(1).await.remove(0).local_addr().unwrap();
    let mut listeners = bind(2).await;
    let addrs = [
        listeners[0].local_addr().unwrap(),
        listeners[1].local_addr().unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut leader = Leader::start(
        101,
        listeners.remove(0),
        dir.path().into(),
        topology(&[dead], &addrs),
    );
    let mut l0 = leader.client();
    let r = produce(&mut l0, 0, batch(1, 0, 0, &["t1"], Some("txn"))).await;
    assert_eq!(code(r.error_code), ErrorCode::CoordinatorNotAvailable);
    // Idempotent producers do not need the coordinator.
    let r = produce(&mut l0, 0, batch(2, 0, 0, &["i1"], None)).await;
    assert_eq!(code(r.error_code), ErrorCode::None);
    let (uncommitted, _, producers) = snapshot(&mut l0, 0).await;
    assert_eq!(values(&uncommitted), vec!["i1"]);
    assert_eq!(producers.producers.len(), 1);
    leader.stop().await;
}

#[tokio::test]
async fn serves_cluster_metadata_and_stops_promptly_during_a_long_poll() {
    let c = cluster().await;
    let mut leader = c.leaders.into_iter().next().unwrap();
    let mut cluster_client =
        proto::cluster_client::ClusterClient::connect(format!("http://{}", leader.addr))
            .await
            .unwrap();
    let metadata = cluster_client
        .metadata(proto::MetadataRequest { topics: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(metadata.topics[0].partitions.len(), 3);
    assert_eq!(metadata.topics[0].partitions[1].leader_id, 102);

    let mut poller = leader.client();
    let poll = tokio::spawn(async move {
        poller
            .fetch(proto::FetchRequest {
                topic: TOPIC.into(),
                partition: 0,
                offset: 0,
                max_bytes: 1000,
                isolation_level: 0,
                max_wait_ms: 30_000,
            })
            .await
    });
    // The leader answers while the poll waits (it does not hold the partition), then stops.
    let mut probe = leader.client();
    let d = describe(&mut probe, 0).await;
    assert_eq!(code(d.error_code), ErrorCode::None);
    assert!(!poll.is_finished());
    drop(probe);
    let started = std::time::Instant::now();
    leader.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let polled = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long poll was not released")
        .unwrap();
    // Released with an empty answer (or the connection closed under it).
    if let Ok(r) = polled {
        assert!(r.into_inner().records.is_empty());
    }
}

#[tokio::test]
async fn a_marker_batch_is_written_as_one_request_per_transaction_would_be() {
    let c = cluster().await;
    c.coordinator.set("txn-a", 10, 0, &[0]);
    c.coordinator.set("txn-b", 20, 0, &[0]);
    let mut l0 = c.leaders[0].client();
    let r = produce(&mut l0, 0, batch(10, 0, 0, &["a1"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    let r = produce(&mut l0, 0, batch(20, 0, 0, &["b1"], Some("txn-b"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    let marker =
        |pid: i64, epoch: i32, commit: bool, generation: i64| proto::WriteTxnMarkersRequest {
            producer_id: pid,
            producer_epoch: epoch,
            result: if commit {
                proto::TxnResult::Commit
            } else {
                proto::TxnResult::Abort
            } as i32,
            coordinator_id: 1,
            coordinator_generation: generation,
            partitions: vec![proto::TopicPartition {
                topic: TOPIC.into(),
                partition: 0,
            }],
            transactional_id: String::new(),
            auth: None,
            transaction_version: 2,
            transaction_number: 0,
        };
    let topology = c.leaders[0].topology.clone();
    let signed = |mut m: proto::WriteTxnMarkersRequest| {
        testkit::auth::sign_marker(&topology, &mut m);
        m
    };
    // A commit for txn-a, an abort for txn-b, and a marker of a PID the partition never saw
    // at an invalid result: each answered on its own, in request order.
    let mut bad = marker(30, 1, true, 1);
    bad.result = 77;
    let responses = l0
        .write_txn_markers_batch(proto::WriteTxnMarkersBatchRequest {
            markers: vec![
                signed(marker(10, 1, true, 1)),
                signed(marker(20, 1, false, 1)),
                signed(bad),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .responses;
    let codes: Vec<Vec<ErrorCode>> = responses
        .iter()
        .map(|r| r.results.iter().map(|p| code(p.error_code)).collect())
        .collect();
    assert_eq!(
        codes,
        vec![
            vec![ErrorCode::None],
            vec![ErrorCode::None],
            vec![ErrorCode::InvalidRequest]
        ]
    );
    // read_committed sees the committed transaction only.
    let committed = fetch(&mut l0, 0, 0, true).await;
    assert_eq!(values(&committed), vec!["a1"]);
    // The same markers again change nothing (each transaction's fence applies as alone).
    let responses = l0
        .write_txn_markers_batch(proto::WriteTxnMarkersBatchRequest {
            markers: vec![
                signed(marker(10, 1, true, 1)),
                signed(marker(20, 1, false, 1)),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .responses;
    assert_eq!(responses.len(), 2);
    assert_eq!(values(&fetch(&mut l0, 0, 0, true).await), vec!["a1"]);
}

/// Kafka's producer.id.expiration.ms: idle producer states are forgotten, durably; an open
/// transaction's state stays (it holds the LSO); and forgetting lets no zombie in: the
/// transactional one must pass the coordinator, the idempotent one learns its state is gone.
#[tokio::test]
async fn idle_producer_states_expire_and_zombies_stay_out() {
    let mut c = cluster_with(|config| {
        // Long enough that the setup below finishes well within it on a loaded machine.
        config.producer_id_expiration = Duration::from_millis(2_000);
        config.producer_id_expiration_check_interval = Duration::from_millis(50);
    })
    .await;
    let mut l0 = c.leaders[0].client();
    // PID 10: a transaction aborted by its new instance's bump (epoch 1).
    c.coordinator.set("txn-a", 10, 0, &[0]);
    let r = produce(&mut l0, 0, batch(10, 0, 0, &["a"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!(
        markers(&c.leaders[0].topology, &mut l0, 10, 1, false, 1, &[0]).await,
        vec![ErrorCode::None]
    );
    c.coordinator.set("txn-a", 10, 1, &[]);
    // PID 20: idempotent. PID 30: a transaction left open.
    let r = produce(&mut l0, 0, batch(20, 0, 0, &["i0"], None)).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    c.coordinator.set("txn-b", 30, 0, &[0]);
    let r = produce(&mut l0, 0, batch(30, 0, 0, &["open"], Some("txn-b"))).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    let open_at = r.base_offset;
    let pids = |d: &proto::DescribeProducersResponse| {
        let mut p: Vec<i64> = d.producers.iter().map(|p| p.producer_id).collect();
        p.sort();
        p
    };
    assert_eq!(pids(&describe(&mut l0, 0).await), vec![10, 20, 30]);

    let l = l0.clone();
    eventually("idle producer states forgotten", || {
        let mut l = l.clone();
        async move { (pids(&describe(&mut l, 0).await) == vec![30]).then_some(()) }
    })
    .await;
    let committed = fetch(&mut l0, 0, 0, true).await;
    assert_eq!(
        committed.last_stable_offset, open_at,
        "the open transaction holds the LSO"
    );

    // The zombie of PID 10 (epoch 0) continuing: no state, and its sequence is not 0.
    let r = produce(&mut l0, 0, batch(10, 0, 1, &["zombie"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::UnknownProducerId);
    // Opening a transaction at sequence 0: the coordinator is asked, and fences it.
    let verified = *c.coordinator.verify_calls.lock().unwrap();
    let r = produce(&mut l0, 0, batch(10, 0, 0, &["zombie"], Some("txn-a"))).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    assert_eq!(*c.coordinator.verify_calls.lock().unwrap(), verified + 1);
    // The idempotent producer's next batch: its state is gone.
    let r = produce(&mut l0, 0, batch(20, 0, 1, &["i1"], None)).await;
    assert_eq!(code(r.error_code), ErrorCode::UnknownProducerId);
    let uncommitted = fetch(&mut l0, 0, 0, false).await;
    assert!(
        !values(&uncommitted).contains(&"zombie".to_string()),
        "no zombie record in the log"
    );

    // Forgotten for good: a restart does not bring the states back.
    c.leaders[0].restart().await;
    let mut l0 = c.leaders[0].client();
    let l = l0.clone();
    eventually("leader back", || {
        let mut l = l.clone();
        async move {
            l.describe_producers(proto::DescribeProducersRequest {
                topic: TOPIC.into(),
                partition: 0,
            })
            .await
            .ok()
        }
    })
    .await;
    assert_eq!(pids(&describe(&mut l0, 0).await), vec![30]);
    let committed = fetch(&mut l0, 0, 0, true).await;
    assert_eq!(committed.last_stable_offset, open_at);
}
