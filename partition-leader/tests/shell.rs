//! Tests of the tonic shell in process (no network): a [`LeaderService`] over the in-memory
//! storage engine and a [`FakeVerifier`], called through the generated `PartitionLeader` trait.
//! Routing, verification once per transaction and the re-check after it, read_committed vs
//! read_uncommitted, long polls, failed writes (nothing changes, or the partition is reloaded or
//! goes offline), restarts over the same storage, and concurrent producers, markers and readers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::Topology;
use partition_leader::storage::MemoryStorage;
use partition_leader::{LeaderConfig, LeaderService};
use proto::partition_leader_server::PartitionLeader;
use proto::{
    DescribeProducersRequest, ErrorCode, FetchRequest, FetchResponse, IsolationLevel,
    ProduceRequest, ProduceResponse, RecordBatch, WriteTxnMarkersRequest,
};
use testkit::requests::{self, code, values};
use testkit::FakeVerifier;
use tokio::sync::watch;
use tonic::Request;

const TOPOLOGY: &str = r#"
    transaction_state_partitions = 4
    [[coordinators]]
    id = 1
    address = "127.0.0.1:1"
    [[leaders]]
    id = 101
    address = "127.0.0.1:2"
    [[leaders]]
    id = 102
    address = "127.0.0.1:3"
    [[topics]]
    name = "t"
    leaders = [101, 101, 102]
"#;

struct Harness {
    service: LeaderService,
    verifier: Arc<FakeVerifier>,
    storage: Arc<MemoryStorage>,
    stop: watch::Sender<bool>,
}

fn config() -> LeaderConfig {
    let mut config = LeaderConfig::new(
        101,
        "/nonexistent",
        Arc::new(Topology::parse(TOPOLOGY).unwrap()),
    );
    config.max_batch_bytes = 4096;
    config.max_record_bytes = 1024;
    config.cluster_secret = Some(testkit::auth::secret());
    config
}

fn harness_over(storage: Arc<MemoryStorage>) -> Harness {
    harness_with(storage, config())
}

fn harness_with(storage: Arc<MemoryStorage>, config: LeaderConfig) -> Harness {
    let verifier = Arc::new(FakeVerifier::default());
    let (stop, stop_rx) = watch::channel(false);
    let service = LeaderService::open(&config, storage.clone(), verifier.clone(), stop_rx).unwrap();
    Harness {
        service,
        verifier,
        storage,
        stop,
    }
}

fn harness() -> Harness {
    harness_over(Arc::new(MemoryStorage::new()))
}

fn batch(pid: i64, epoch: i32, seq: i32, values: &[&str], txn: bool) -> RecordBatch {
    requests::batch((pid, epoch, seq), values, txn.then_some("txn-a"), b"", 0)
}

async fn produce_to(h: &Harness, partition: i32, b: RecordBatch) -> ProduceResponse {
    h.service
        .produce(Request::new(ProduceRequest {
            topic: "t".into(),
            partition,
            batch: Some(b),
        }))
        .await
        .unwrap()
        .into_inner()
}

async fn produce(h: &Harness, b: RecordBatch) -> ProduceResponse {
    produce_to(h, 0, b).await
}

async fn fetch(
    h: &Harness,
    offset: i64,
    committed: bool,
    max_bytes: i32,
    wait: i32,
) -> FetchResponse {
    h.service
        .fetch(Request::new(requests::fetch(
            "t", 0, offset, committed, max_bytes, wait,
        )))
        .await
        .unwrap()
        .into_inner()
}

/// A read_uncommitted fetch of a whole partition that does not wait.
async fn fetch_from(h: &Harness, partition: i32, offset: i64, committed: bool) -> FetchResponse {
    h.service
        .fetch(Request::new(requests::fetch(
            "t",
            partition,
            offset,
            committed,
            1 << 20,
            0,
        )))
        .await
        .unwrap()
        .into_inner()
}

async fn markers(
    h: &Harness,
    pid: i64,
    epoch: i32,
    commit: bool,
    partitions: &[(&str, i32)],
) -> Vec<ErrorCode> {
    let mut request = requests::markers(pid, epoch, commit, 1, partitions);
    testkit::auth::sign_marker(&Topology::parse(TOPOLOGY).unwrap(), &mut request);
    h.service
        .write_txn_markers(Request::new(request))
        .await
        .map(|r| requests::marker_codes(r.into_inner()))
        .unwrap()
}

#[tokio::test]
async fn routing_errors() {
    let h = harness();
    let r = produce_to(&h, 2, batch(1, 0, 0, &["a"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::NotLeaderOrFollower);
    assert!(r.error_message.contains("102"), "{}", r.error_message);
    let r = produce_to(&h, 3, batch(1, 0, 0, &["a"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::UnknownTopicOrPartition);
    let r = produce_to(&h, -1, batch(1, 0, 0, &["a"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::UnknownTopicOrPartition);
    let r = h
        .service
        .describe_producers(Request::new(DescribeProducersRequest {
            topic: "nope".into(),
            partition: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::UnknownTopicOrPartition);
    assert_eq!(
        markers(&h, 1, 1, true, &[("t", 0), ("t", 2), ("x", 0)]).await,
        vec![
            ErrorCode::None,
            ErrorCode::NotLeaderOrFollower,
            ErrorCode::UnknownTopicOrPartition
        ]
    );
    let r = h
        .service
        .produce(Request::new(ProduceRequest {
            topic: "t".into(),
            partition: 0,
            batch: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::InvalidRequest);
}

#[tokio::test]
async fn verification_happens_once_per_transaction_and_its_answer_is_passed_back() {
    let h = harness();
    *h.verifier.answer.lock().unwrap() = Err(ErrorCode::InvalidTxnState);
    let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidTxnState);
    *h.verifier.answer.lock().unwrap() = Err(ErrorCode::CoordinatorNotAvailable);
    let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::CoordinatorNotAvailable);
    *h.verifier.answer.lock().unwrap() = Err(ErrorCode::ProducerFenced);
    let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    assert_eq!(fetch(&h, 0, false, 1000, 0).await.high_watermark, 0);

    *h.verifier.answer.lock().unwrap() = Ok(());
    let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
    assert_eq!((code(r.error_code), r.base_offset), (ErrorCode::None, 0));
    let r = produce(&h, batch(1, 0, 1, &["b", "c"], true)).await;
    assert_eq!(
        (code(r.error_code), r.base_offset, r.high_watermark),
        (ErrorCode::None, 1, 3)
    );
    assert_eq!(h.verifier.calls.load(Ordering::SeqCst), 4);
    // A duplicate of the first batch.
    let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
    assert_eq!((r.base_offset, r.duplicate), (0, true));
    // Idempotent producers never verify.
    produce(&h, batch(2, 0, 0, &["x"], false)).await;
    assert_eq!(h.verifier.calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn state_is_checked_again_after_verification() {
    let h = harness();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *h.verifier.gate.lock().unwrap() = Some(gate.clone());
    let service = h.service.clone();
    let pending = tokio::spawn(async move {
        service
            .produce(Request::new(ProduceRequest {
                topic: "t".into(),
                partition: 0,
                batch: Some(batch(1, 0, 0, &["late"], true)),
            }))
            .await
            .unwrap()
            .into_inner()
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.verifier.calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "verification never started");
        tokio::task::yield_now().await;
    }
    // The partition is not locked during verification: a fencing marker gets through.
    assert_eq!(
        markers(&h, 1, 1, false, &[("t", 0)]).await,
        vec![ErrorCode::None]
    );
    // Release the held verification; later ones (the leader asking why it refused) go through.
    *h.verifier.gate.lock().unwrap() = None;
    gate.add_permits(1);
    let r = pending.await.unwrap();
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    assert_eq!(fetch(&h, 0, false, 1000, 0).await.high_watermark, 0);
}

/// A verification answer counts only for the producer-state expiry (what a marker recorded
/// after it lives no longer than that): a batch held up past it is verified again before it
/// may open a transaction.
#[tokio::test]
async fn a_verification_held_up_past_the_producer_expiry_is_asked_again() {
    let mut config = config();
    config.producer_id_expiration = Duration::from_millis(300);
    let h = harness_with(Arc::new(MemoryStorage::new()), config);
    let (service, verifier) = (h.service.clone(), h.verifier.clone());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *verifier.gate.lock().unwrap() = Some(gate.clone());
    let pending = {
        let service = service.clone();
        tokio::spawn(async move {
            service
                .produce(Request::new(ProduceRequest {
                    topic: "t".into(),
                    partition: 0,
                    batch: Some(batch(1, 0, 0, &["held"], true)),
                }))
                .await
                .unwrap()
                .into_inner()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while verifier.calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "verification never started");
        tokio::task::yield_now().await;
    }
    // The first answer comes after the expiry; the second one at once.
    tokio::time::sleep(Duration::from_millis(400)).await;
    *verifier.gate.lock().unwrap() = None;
    gate.add_permits(1);
    let r = pending.await.unwrap();
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!(verifier.calls.load(Ordering::SeqCst), 2, "asked again");
    // A prompt answer is used as it is.
    let r = service
        .produce(Request::new(ProduceRequest {
            topic: "t".into(),
            partition: 1,
            batch: Some(batch(1, 0, 0, &["prompt"], true)),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!(verifier.calls.load(Ordering::SeqCst), 3);
}

/// Answers that keep going stale (each one slower than the producer-state expiry) are asked for
/// a bounded number of times; then the batch is refused, and nothing is appended.
#[tokio::test]
async fn verifications_that_keep_going_stale_are_given_up_after_three() {
    let mut config = config();
    config.producer_id_expiration = Duration::from_millis(20);
    let h = harness_with(Arc::new(MemoryStorage::new()), config);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *h.verifier.gate.lock().unwrap() = Some(gate.clone());
    let pending = {
        let service = h.service.clone();
        tokio::spawn(async move {
            service
                .produce(Request::new(ProduceRequest {
                    topic: "t".into(),
                    partition: 0,
                    batch: Some(batch(1, 0, 0, &["slow"], true)),
                }))
                .await
                .unwrap()
                .into_inner()
        })
    };
    for asked in 1..=3 {
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.verifier.calls.load(Ordering::SeqCst) < asked {
            assert!(
                Instant::now() < deadline,
                "verification {asked} never started"
            );
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        gate.add_permits(1);
    }
    let r = pending.await.unwrap();
    assert_eq!(
        code(r.error_code),
        ErrorCode::UnknownServerError,
        "{}",
        r.error_message
    );
    assert_eq!(h.verifier.calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        fetch(&h, 0, false, 1000, 0).await.high_watermark,
        0,
        "nothing appended"
    );
}

/// A transactional batch below the partition's epoch: the coordinator says why. A producer
/// whose transaction the timeout aborted (its markers carry the bumped epoch) is told
/// TRANSACTION_TIMED_OUT, abortable, as the coordinator tells it; a fenced one
/// INVALID_PRODUCER_EPOCH. Nothing is appended either way.
#[tokio::test]
async fn a_producer_below_the_epoch_is_told_whether_it_timed_out_or_was_fenced() {
    let h = harness();
    let r = produce(&h, batch(1, 0, 0, &["a"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::None);
    // The timeout scan's ABORT markers, at the bumped epoch.
    assert_eq!(
        markers(&h, 1, 1, false, &[("t", 0)]).await,
        vec![ErrorCode::None]
    );
    let hw = fetch(&h, 0, false, 1000, 0).await.high_watermark;
    let calls = h.verifier.calls.load(Ordering::SeqCst);
    *h.verifier.answer.lock().unwrap() = Err(ErrorCode::TransactionTimedOut);
    let r = produce(&h, batch(1, 0, 1, &["late"], true)).await;
    assert_eq!(
        code(r.error_code),
        ErrorCode::TransactionTimedOut,
        "{}",
        r.error_message
    );
    assert_eq!(
        h.verifier.calls.load(Ordering::SeqCst),
        calls + 1,
        "asked once"
    );
    *h.verifier.answer.lock().unwrap() = Err(ErrorCode::InvalidProducerEpoch);
    let r = produce(&h, batch(1, 0, 1, &["late"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    // A coordinator that cannot be asked leaves the leader's own answer.
    *h.verifier.answer.lock().unwrap() = Err(ErrorCode::CoordinatorNotAvailable);
    let r = produce(&h, batch(1, 0, 1, &["late"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    // An idempotent batch below the epoch is not asked about.
    let calls = h.verifier.calls.load(Ordering::SeqCst);
    let r = produce(&h, batch(1, 0, 1, &["plain"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    assert_eq!(h.verifier.calls.load(Ordering::SeqCst), calls);
    assert_eq!(
        fetch(&h, 0, false, 1000, 0).await.high_watermark,
        hw,
        "nothing appended"
    );
}

#[tokio::test]
async fn read_committed_filters_and_read_uncommitted_does_not() {
    let h = harness();
    produce(&h, batch(1, 0, 0, &["a1", "a2"], true)).await; // 0, 1: aborted
    produce(&h, batch(2, 0, 0, &["b1"], true)).await; // 2: committed
    produce(&h, batch(3, 0, 0, &["plain"], false)).await; // 3
    produce(&h, batch(1, 0, 2, &["a3"], true)).await; // 4: aborted
    let r = fetch(&h, 0, true, 1000, 0).await;
    assert_eq!(
        (r.last_stable_offset, r.high_watermark, r.next_offset),
        (0, 5, 0)
    );
    assert!(r.records.is_empty());
    assert_eq!(
        markers(&h, 1, 1, false, &[("t", 0)]).await,
        vec![ErrorCode::None]
    ); // 5
    let r = fetch(&h, 0, true, 1000, 0).await;
    assert_eq!(r.last_stable_offset, 2);
    assert!(r.records.is_empty(), "{:?}", values(&r));
    assert_eq!(r.next_offset, 2);
    assert_eq!(
        markers(&h, 2, 1, true, &[("t", 0)]).await,
        vec![ErrorCode::None]
    ); // 6
    let r = fetch(&h, 0, true, 1000, 0).await;
    assert_eq!(values(&r), vec!["b1", "plain"]);
    assert_eq!((r.last_stable_offset, r.next_offset), (7, 7));
    let r = fetch(&h, 0, false, 1000, 0).await;
    assert_eq!(values(&r), vec!["a1", "a2", "b1", "plain", "a3"]);
    assert_eq!(r.next_offset, 7);
    // Offsets are reported.
    assert_eq!(
        r.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    // Out of range.
    assert_eq!(
        code(fetch(&h, 8, true, 1000, 0).await.error_code),
        ErrorCode::OffsetOutOfRange
    );
    assert_eq!(
        code(fetch(&h, -1, false, 1000, 0).await.error_code),
        ErrorCode::OffsetOutOfRange
    );
    assert_eq!(
        code(fetch(&h, 0, false, -1, 0).await.error_code),
        ErrorCode::InvalidRequest
    );
}

#[tokio::test]
async fn max_bytes_returns_at_least_one_record() {
    let h = harness();
    produce(&h, batch(1, 0, 0, &["aaaa", "bbbb", "cccc"], false)).await;
    let per_record = 4 + partition_leader::core::RECORD_OVERHEAD_BYTES as i32;
    let r = fetch(&h, 0, false, 0, 0).await;
    assert_eq!((values(&r), r.next_offset), (vec!["aaaa".to_string()], 1));
    let r = fetch(&h, 1, false, 2 * per_record, 0).await;
    assert_eq!(
        (values(&r), r.next_offset),
        (vec!["bbbb".to_string(), "cccc".to_string()], 3)
    );
    let r = fetch(&h, 3, false, 100, 0).await;
    assert_eq!((r.records.len(), r.next_offset), (0, 3));
}

#[tokio::test]
async fn long_poll_wakes_on_append_and_on_shutdown() {
    let h = harness();
    let service = h.service.clone();
    let waiting = tokio::spawn(async move {
        service
            .fetch(Request::new(FetchRequest {
                topic: "t".into(),
                partition: 0,
                offset: 0,
                max_bytes: 1000,
                isolation_level: IsolationLevel::ReadCommitted as i32,
                max_wait_ms: 20_000,
            }))
            .await
            .unwrap()
            .into_inner()
    });
    tokio::task::yield_now().await;
    let started = Instant::now();
    produce(&h, batch(1, 0, 0, &["v"], false)).await;
    let r = waiting.await.unwrap();
    assert_eq!(values(&r), vec!["v"]);
    assert!(started.elapsed() < Duration::from_secs(10));
    // A short wait with nothing new times out empty.
    let r = fetch(&h, 1, true, 1000, 30).await;
    assert_eq!((r.error_code, r.records.len(), r.next_offset), (0, 0, 1));
    // Shutdown releases a long poll at once.
    let service = h.service.clone();
    let waiting = tokio::spawn(async move {
        service
            .fetch(Request::new(FetchRequest {
                topic: "t".into(),
                partition: 0,
                offset: 1,
                max_bytes: 1000,
                isolation_level: 0,
                max_wait_ms: 30_000,
            }))
            .await
            .unwrap()
            .into_inner()
    });
    tokio::task::yield_now().await;
    h.stop.send(true).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.records.len(), 0);
}

#[tokio::test]
async fn failed_write_changes_nothing() {
    let h = harness();
    produce(&h, batch(1, 0, 0, &["a"], false)).await;
    h.storage.set_fail_writes(true);
    let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    assert_eq!(
        markers(&h, 1, 1, true, &[("t", 0)]).await,
        vec![ErrorCode::KafkaStorageError]
    );
    h.storage.set_fail_writes(false);
    // The same batch is not a duplicate: it was never acknowledged.
    let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
    assert_eq!(
        (code(r.error_code), r.base_offset, r.duplicate),
        (ErrorCode::None, 1, false)
    );
}

#[tokio::test]
async fn a_write_that_failed_after_applying_is_reloaded_not_forgotten() {
    let h = harness();
    produce(&h, batch(1, 0, 0, &["a"], false)).await;
    h.storage.set_fail_flushes(true);
    let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    h.storage.set_fail_flushes(false);
    // Memory now matches the engine, which kept the write: the retry is a duplicate.
    let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
    assert_eq!(
        (code(r.error_code), r.base_offset, r.duplicate),
        (ErrorCode::None, 1, true)
    );
    assert_eq!(values(&fetch(&h, 0, false, 1000, 0).await), vec!["a", "b"]);
}

#[tokio::test]
async fn a_partition_that_cannot_reload_goes_offline_until_restart() {
    let h = harness();
    produce(&h, batch(1, 0, 0, &["a"], false)).await;
    h.storage.set_fail_writes(true);
    h.storage.set_fail_loads(true);
    let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    h.storage.set_fail_writes(false);
    h.storage.set_fail_loads(false);
    assert_eq!(
        code(fetch(&h, 0, false, 1000, 0).await.error_code),
        ErrorCode::KafkaStorageError
    );
    let r = produce(&h, batch(1, 0, 1, &["b"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    // Other partitions are unaffected; a restart brings it back.
    assert_eq!(
        code(
            produce_to(&h, 1, batch(2, 0, 0, &["x"], false))
                .await
                .error_code
        ),
        ErrorCode::None
    );
    let h2 = harness_over(h.storage.clone());
    let r = produce(&h2, batch(1, 0, 1, &["b"], false)).await;
    assert_eq!((code(r.error_code), r.base_offset), (ErrorCode::None, 1));
}

#[tokio::test]
async fn bad_markers_and_batches_store_nothing() {
    let h = harness();
    for (pid, epoch) in [(-1, 0), (1, -1), (1, 40_000)] {
        assert_eq!(
            markers(&h, pid, epoch, true, &[("t", 0)]).await,
            vec![ErrorCode::InvalidRequest]
        );
    }
    let mut request = WriteTxnMarkersRequest {
        producer_id: 1,
        producer_epoch: 1,
        result: 7,
        coordinator_id: 1,
        coordinator_generation: 1,
        partitions: vec![proto::TopicPartition {
            topic: "t".into(),
            partition: 0,
        }],
        transactional_id: String::new(),
        auth: None,
        transaction_version: 2,
        transaction_number: 0,
    };
    testkit::auth::sign_marker(&Topology::parse(TOPOLOGY).unwrap(), &mut request);
    let r = h
        .service
        .write_txn_markers(Request::new(request))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.results[0].error_code), ErrorCode::InvalidRequest);
    for b in [
        batch(1, 0, 0, &[], false),
        batch(1, 0, -5, &["a"], false),
        batch(1, 99_999, 0, &["a"], false),
        batch(-7, 0, 0, &["a"], false),
    ] {
        assert_eq!(
            code(produce(&h, b).await.error_code),
            ErrorCode::InvalidRequest
        );
    }
    let big = "x".repeat(1025);
    assert_eq!(
        code(produce(&h, batch(1, 0, 0, &[&big], false)).await.error_code),
        ErrorCode::MessageTooLarge
    );
    let r = produce(&h, batch(1, 0, 7, &["a"], false)).await;
    assert_eq!(code(r.error_code), ErrorCode::UnknownProducerId);
    let r = fetch(&h, 0, false, 1000, 0).await;
    assert_eq!(r.high_watermark, 0);
    let d = h
        .service
        .describe_producers(Request::new(DescribeProducersRequest {
            topic: "t".into(),
            partition: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(d.producers.is_empty());
}

#[tokio::test]
async fn state_survives_a_restart_over_the_same_storage() {
    let h = harness();
    produce(&h, batch(1, 0, 0, &["a"], true)).await;
    produce(&h, batch(2, 0, 0, &["b"], true)).await;
    markers(&h, 2, 1, false, &[("t", 0)]).await;
    markers(&h, 9, 3, false, &[("t", 1)]).await;
    let describe = |svc: LeaderService, partition| async move {
        svc.describe_producers(Request::new(DescribeProducersRequest {
            topic: "t".into(),
            partition,
        }))
        .await
        .unwrap()
        .into_inner()
    };
    let before = (
        describe(h.service.clone(), 0).await,
        describe(h.service.clone(), 1).await,
    );
    let fetched = fetch(&h, 0, false, 1000, 0).await;
    let h2 = harness_over(h.storage.clone());
    assert_eq!(
        before,
        (
            describe(h2.service.clone(), 0).await,
            describe(h2.service.clone(), 1).await
        )
    );
    assert_eq!(before.0.producers[0].current_txn_start_offset, 0);
    assert_eq!(fetch(&h2, 0, false, 1000, 0).await, fetched);
    assert_eq!(fetch(&h2, 0, true, 1000, 0).await.last_stable_offset, 0);
    // Fencing still holds after the restart.
    let r = produce_to(&h2, 1, batch(9, 2, 0, &["zombie"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let r = produce(&h2, batch(2, 0, 1, &["zombie"], true)).await;
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_markers_and_readers_keep_the_invariants() {
    let h = Arc::new(harness());
    let mut tasks = Vec::new();
    // Idempotent producers that resend every batch once (a lost reply).
    for pid in 1..=4i64 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            for seq in 0..40 {
                let value = format!("p{pid}-{seq}");
                let first = produce(&h, batch(pid, 0, seq, &[&value], false)).await;
                assert_eq!(
                    code(first.error_code),
                    ErrorCode::None,
                    "{}",
                    first.error_message
                );
                let again = produce(&h, batch(pid, 0, seq, &[&value], false)).await;
                assert_eq!(
                    (again.base_offset, again.duplicate),
                    (first.base_offset, true)
                );
            }
        }));
    }
    // A transactional producer: odd transactions abort, even ones commit.
    {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            for txn in 0..10i32 {
                let commit = txn % 2 == 0;
                let tag = if commit { "commit" } else { "abort" };
                for seq in 0..3 {
                    let value = format!("{tag}-{txn}-{seq}");
                    let r = produce(&h, batch(9, txn, seq, &[&value], true)).await;
                    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
                }
                assert_eq!(
                    markers(&h, 9, txn + 1, commit, &[("t", 0)]).await,
                    vec![ErrorCode::None]
                );
            }
        }));
    }
    // A read_committed reader that must never see an aborted or open record.
    let reader = {
        let h = h.clone();
        tokio::spawn(async move {
            let mut offset = 0;
            let mut seen = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while seen.len() < 4 * 40 + 5 * 3 {
                assert!(Instant::now() < deadline, "reader stalled at {offset}");
                let r = fetch(&h, offset, true, 64, 50).await;
                assert_eq!(r.error_code, 0, "{}", r.error_message);
                assert!(r.next_offset <= r.last_stable_offset);
                for v in values(&r) {
                    assert!(!v.starts_with("abort"), "{v} visible to read_committed");
                    seen.push(v);
                }
                offset = r.next_offset;
            }
            seen
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    let seen = reader.await.unwrap();
    // Exactly once, in each producer's order.
    for pid in 1..=4 {
        let mine: Vec<&String> = seen
            .iter()
            .filter(|v| v.starts_with(&format!("p{pid}-")))
            .collect();
        let expected: Vec<String> = (0..40).map(|s| format!("p{pid}-{s}")).collect();
        assert_eq!(mine, expected.iter().collect::<Vec<_>>());
    }
    let committed: Vec<&String> = seen.iter().filter(|v| v.starts_with("commit")).collect();
    assert_eq!(committed.len(), 15);
    // Offsets are dense and the log holds every record once plus the 10 markers.
    let all = fetch(&h, 0, false, i32::MAX, 0).await;
    assert_eq!(all.high_watermark, 4 * 40 + 10 * 3 + 10);
    assert_eq!(all.records.len() as i64, all.high_watermark - 10);
}

/// Serves a leader over `storage` on a fresh loopback port (a fake verifier) and waits until its
/// health check says SERVING: its address, the stop sender and the serving task.
async fn serve_until_serving(
    config: partition_leader::LeaderConfig,
    storage: Arc<MemoryStorage>,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), partition_leader::Error>>,
) {
    use testkit::standard::health;
    use tonic_health::pb::health_check_response::ServingStatus;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(partition_leader::serve_with(
        config,
        storage,
        Arc::new(FakeVerifier::default()),
        listener,
        async move {
            let _ = stopped.await;
        },
    ));
    testkit::poll::wait_until(Duration::from_secs(10), "SERVING", || {
        let addr = addr.clone();
        async move { health(&addr, "minibroker.v1.PartitionLeader").await == Ok(ServingStatus::Serving) }
    })
    .await;
    (addr, stop, task)
}

/// The standard services over real gRPC: SERVING once loaded, NOT_SERVING once a partition went
/// offline; reflection lists what a leader serves; the node's metrics count the produce, its
/// rejection and the LSO lag.
#[tokio::test]
async fn health_reflection_and_metrics_of_a_leader() {
    use testkit::standard::{health, reflected_services};
    use tonic_health::pb::health_check_response::ServingStatus;

    let storage = Arc::new(MemoryStorage::new());
    let config = config();
    let metrics = config.metrics.clone();
    let (addr, stop, task) = serve_until_serving(config, storage.clone()).await;
    let service = "minibroker.v1.PartitionLeader";
    assert_eq!(
        reflected_services(&addr).await.unwrap(),
        vec![
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "minibroker.v1.Cluster",
            "minibroker.v1.PartitionLeader",
        ]
    );

    let mut client =
        proto::partition_leader_client::PartitionLeaderClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    let produce = |b: RecordBatch| ProduceRequest {
        topic: "t".into(),
        partition: 0,
        batch: Some(b),
    };
    let r = client
        .produce(produce(batch(1, 0, 0, &["a", "b"], true)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::None);
    let r = client
        .produce(produce(batch(2, 1, 0, &["c"], false)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::None);
    let r = client
        .produce(produce(batch(2, 0, 1, &["zombie"], false)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::InvalidProducerEpoch);
    let text = metrics.render();
    let sample = |name, labels: &[(&str, &str)]| cluster::metrics::sample(&text, name, labels);
    assert_eq!(
        sample(
            "kafka_network_requestmetrics_errors_total",
            &[("request", "Produce"), ("error", "NONE")]
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            "minibroker_fenced_requests_total",
            &[("error", "INVALID_PRODUCER_EPOCH"), ("producer_id", "2")]
        ),
        Some(1.0)
    );
    // The open transaction (offsets 0 and 1) holds the LSO at 0 while the high watermark is 3.
    assert_eq!(
        sample(
            "kafka_cluster_partition_laststableoffsetlag",
            &[("topic", "t"), ("partition", "0")]
        ),
        Some(3.0)
    );

    storage.set_fail_writes(true);
    storage.set_fail_loads(true);
    let r = client
        .produce(produce(batch(3, 0, 0, &["x"], false)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    assert_eq!(health(&addr, service).await, Ok(ServingStatus::NotServing));
    assert_eq!(health(&addr, "").await, Ok(ServingStatus::NotServing));

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// A storage problem that fails no write (the engine's checkpoints failing) turns the health
/// check NOT_SERVING, while Produce goes on being served.
#[tokio::test]
async fn a_storage_problem_turns_the_health_check_not_serving() {
    use testkit::standard::health;
    use tonic_health::pb::health_check_response::ServingStatus;

    let storage = Arc::new(MemoryStorage::new());
    let (addr, stop, task) = serve_until_serving(config(), storage.clone()).await;
    let service = "minibroker.v1.PartitionLeader";
    // Still SERVING a second later: nothing is wrong yet.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(health(&addr, service).await, Ok(ServingStatus::Serving));

    storage.set_problem(Some("checkpoints stopped"));
    testkit::poll::wait_until(Duration::from_secs(10), "NOT_SERVING", || {
        let addr = addr.clone();
        async move { health(&addr, service).await == Ok(ServingStatus::NotServing) }
    })
    .await;
    let mut client =
        proto::partition_leader_client::PartitionLeaderClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    let r = client
        .produce(ProduceRequest {
            topic: "t".into(),
            partition: 0,
            batch: Some(batch(1, 0, 0, &["a"], false)),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::None);

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// Group commit: writes of several producers and partitions, one of them the next batch of a
/// producer whose previous batch is still waiting, are all appended while one flush is held; none
/// is answered or readable before a flush covers it; then at most two flushes answer them all. A
/// retry (a duplicate) of a waiting batch is answered only after the flush, too.
#[tokio::test]
async fn concurrent_writes_share_a_flush_and_wait_for_it() {
    let h = Arc::new(harness());
    h.storage.hold_flushes(true);
    let spawn = |partition: i32, pid: i64, seq: i32| {
        let h = h.clone();
        tokio::spawn(async move {
            let value = format!("{pid}-{seq}");
            produce_to(&h, partition, batch(pid, 0, seq, &[value.as_str()], false)).await
        })
    };
    let first = spawn(0, 1, 0);
    testkit::poll::wait_until(Duration::from_secs(5), "the first append", || async {
        h.storage.appends() == 1
    })
    .await;
    // Its flush is held; the partition's write lock is not.
    let mut tasks = vec![first, spawn(0, 1, 1)];
    for pid in 2..=7 {
        tasks.push(spawn((pid % 2) as i32, pid, 0));
    }
    testkit::poll::wait_until(Duration::from_secs(5), "eight appends", || async {
        h.storage.appends() == 8
    })
    .await;
    let retry = spawn(1, 3, 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        tasks.iter().chain([&retry]).all(|t| !t.is_finished()),
        "a write was answered before any flush"
    );
    for partition in [0, 1] {
        let r = fetch_from(&h, partition, 0, false).await;
        assert_eq!(
            (r.high_watermark, r.records.len()),
            (0, 0),
            "readable before a flush"
        );
    }
    h.storage.hold_flushes(false);
    for task in tasks {
        let r = task.await.unwrap();
        assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    }
    let r = retry.await.unwrap();
    assert!(r.duplicate, "the retry is a duplicate");
    assert!(
        h.storage.flushes() <= 2,
        "eight writes took {} flushes",
        h.storage.flushes()
    );
    let read: usize = {
        let mut n = 0;
        for partition in [0, 1] {
            n += fetch_from(&h, partition, 0, false).await.records.len();
        }
        n
    };
    assert_eq!(read, 8);
}

/// A flush that fails answers every write it covered with a storage error; they stay in the
/// engine (a later flush may persist them), so their retries are duplicates answered after a
/// good flush.
#[tokio::test]
async fn a_failed_group_flush_fails_all_its_writes() {
    let h = Arc::new(harness());
    h.storage.hold_flushes(true);
    h.storage.set_fail_flushes(true);
    let tasks: Vec<_> = (1..=4)
        .map(|pid| {
            let h = h.clone();
            tokio::spawn(async move {
                produce_to(&h, (pid % 2) as i32, batch(pid, 0, 0, &["v"], false)).await
            })
        })
        .collect();
    testkit::poll::wait_until(Duration::from_secs(5), "four appends", || async {
        h.storage.appends() == 4
    })
    .await;
    h.storage.hold_flushes(false);
    for task in tasks {
        let r = task.await.unwrap();
        assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    }
    for partition in [0, 1] {
        assert_eq!(fetch_from(&h, partition, 0, false).await.records.len(), 0);
    }
    h.storage.set_fail_flushes(false);
    for pid in 1..=4 {
        let r = produce_to(&h, (pid % 2) as i32, batch(pid, 0, 0, &["v"], false)).await;
        assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
        assert!(r.duplicate);
    }
    for partition in [0, 1] {
        assert_eq!(fetch_from(&h, partition, 0, false).await.records.len(), 2);
    }
}

/// ProducePartitions: entries of several partitions in one request, answered in request order;
/// two batches of one partition land in request order; a bad entry fails alone; the writes are
/// durable and visible like separate Produce requests.
#[tokio::test]
async fn one_request_carries_batches_of_several_partitions() {
    let h = harness();
    let entry = |partition: i32, b: RecordBatch| ProduceRequest {
        topic: "t".into(),
        partition,
        batch: Some(b),
    };
    let request = proto::ProducePartitionsRequest {
        partitions: vec![
            entry(1, batch(2, 0, 0, &["p1-a"], false)),
            entry(0, batch(1, 0, 0, &["p0-a", "p0-b"], false)),
            entry(2, batch(3, 0, 0, &["elsewhere"], false)),
            entry(0, batch(1, 0, 2, &["p0-c"], false)),
            entry(1, batch(2, 0, 5, &["gap"], false)),
        ],
    };
    let r = h
        .service
        .produce_partitions(Request::new(request))
        .await
        .unwrap()
        .into_inner();
    let answers: Vec<_> = r
        .responses
        .iter()
        .map(|r| (code(r.error_code), r.base_offset))
        .collect();
    assert_eq!(
        answers,
        vec![
            (ErrorCode::None, 0),
            (ErrorCode::None, 0),
            (ErrorCode::NotLeaderOrFollower, -1),
            (ErrorCode::None, 2),
            (ErrorCode::OutOfOrderSequenceNumber, -1),
        ]
    );
    assert_eq!(
        values(&fetch_from(&h, 0, 0, false).await),
        vec!["p0-a", "p0-b", "p0-c"]
    );
    assert_eq!(values(&fetch_from(&h, 1, 0, false).await), vec!["p1-a"]);
    // An empty request is an empty answer.
    let r = h
        .service
        .produce_partitions(Request::new(proto::ProducePartitionsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(r.responses.is_empty());
}

/// A batch limit beyond what the log can store is refused at start, with a clear error.
#[test]
fn a_leader_refuses_to_open_with_limits_the_log_cannot_store() {
    for (batch, record) in [
        (partition_leader::core::MAX_BATCH_BYTES_LIMIT + 1, 1024),
        (4096, partition_leader::core::MAX_BATCH_BYTES_LIMIT + 1),
        (0, 1024),
    ] {
        let mut config = config();
        config.max_batch_bytes = batch;
        config.max_record_bytes = record;
        let (_stop, stop_rx) = watch::channel(false);
        let storage = Arc::new(MemoryStorage::new());
        let verifier = Arc::new(FakeVerifier::default());
        let Err(err) = LeaderService::open(&config, storage, verifier, stop_rx) else {
            panic!("opened with max_batch_bytes {batch}, max_record_bytes {record}");
        };
        assert!(matches!(err, partition_leader::Error::Config(_)), "{err}");
    }
    let mut config = config();
    config.max_batch_bytes = partition_leader::core::MAX_BATCH_BYTES_LIMIT;
    let (_stop, stop_rx) = watch::channel(false);
    let opened = LeaderService::open(
        &config,
        Arc::new(MemoryStorage::new()),
        Arc::new(FakeVerifier::default()),
        stop_rx,
    );
    assert!(opened.is_ok());
}
