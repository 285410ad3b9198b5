//! Tests of the service shell's own duties: COORDINATOR_LOAD_IN_PROGRESS while loading, storage
//! failures (typed error, nothing changed), per-id serialisation under concurrency, and the
//! marker writer's handling of permanent leader errors.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use coordinator::core::{GroupMarkerFence, GroupMarkerWrite, PendingOffsets, TxnMetadata};
use coordinator::storage::{GroupProtocol, MemoryStorage, Snapshot, Storage, StorageError};
use proto::{ErrorCode, TxnState};
use testkit::kafka::{delete_groups, list_groups, offset_delete};

/// Memory storage whose `load` waits for a gate and whose writes can be made to fail.
#[derive(Default)]
struct TestStorage {
    inner: MemoryStorage,
    gate: Mutex<bool>,
    opened: Condvar,
    fail_writes: AtomicBool,
    /// Reading the stored groups fails (at the restore, before the node serves).
    fail_group_reads: AtomicBool,
    /// While set, a removal (an expired id) waits in the storage.
    hold_removals: Mutex<bool>,
    removals_released: Condvar,
    /// A removal reached the storage.
    removal_started: AtomicBool,
    /// Removals fail (after `removal_started` is set).
    fail_removals: AtomicBool,
    /// While set, a read of a group's committed offsets reads them and then waits in the
    /// storage (before returning what it read).
    hold_offset_reads: Mutex<bool>,
    offset_reads_released: Condvar,
    /// An offset read reached the storage.
    offset_read_started: AtomicBool,
    /// A group marker's offsets were written.
    group_marker_applied: AtomicBool,
    /// While set, the next write of pending transactional offsets waits in the storage (before
    /// writing) until `release_pending_put`; only that one.
    hold_next_pending_put: AtomicBool,
    /// The held write of pending offsets reached the storage.
    pending_put_held: AtomicBool,
    pending_put_released: Mutex<bool>,
    pending_put_releases: Condvar,
}

impl TestStorage {
    fn open_gate(&self) {
        *self.gate.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn release_pending_put(&self) {
        *self.pending_put_released.lock().unwrap() = true;
        self.pending_put_releases.notify_all();
    }

    fn check(&self) -> Result<(), StorageError> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(StorageError::Task("injected disk failure".into()));
        }
        Ok(())
    }
}

/// Opens the storage's gate when dropped.
struct OpenGateOnDrop(Arc<TestStorage>);

impl Drop for OpenGateOnDrop {
    fn drop(&mut self) {
        self.0.open_gate();
    }
}

impl Storage for TestStorage {
    fn load(&self) -> Result<Snapshot, StorageError> {
        let mut open = self.gate.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        self.inner.load()
    }
    fn put_txn(&self, meta: &TxnMetadata) -> Result<(), StorageError> {
        self.check()?;
        self.inner.put_txn(meta)
    }
    fn remove_txns(&self, ids: &[String]) -> Result<(), StorageError> {
        self.check()?;
        self.removal_started.store(true, Ordering::SeqCst);
        if self.fail_removals.load(Ordering::SeqCst) {
            return Err(StorageError::Task("injected disk failure".into()));
        }
        let mut held = self.hold_removals.lock().unwrap();
        while *held {
            held = self.removals_released.wait(held).unwrap();
        }
        self.inner.remove_txns(ids)
    }
    fn put_generation(&self, generation: i64) -> Result<(), StorageError> {
        self.check()?;
        self.inner.put_generation(generation)
    }
    fn put_pid_block(&self, end: i64) -> Result<(), StorageError> {
        self.check()?;
        self.inner.put_pid_block(end)
    }
    fn group_marker_fence(
        &self,
        group: &str,
        producer_id: i64,
        coordinator_id: i32,
    ) -> Result<GroupMarkerFence, StorageError> {
        self.inner
            .group_marker_fence(group, producer_id, coordinator_id)
    }
    fn apply_group_marker(&self, write: &GroupMarkerWrite) -> Result<(), StorageError> {
        self.check()?;
        self.inner.apply_group_marker(write)?;
        self.group_marker_applied.store(true, Ordering::SeqCst);
        Ok(())
    }
    fn put_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[cluster::TopicPartition],
        recorded_ms: i64,
    ) -> Result<(), StorageError> {
        self.check()?;
        if self.hold_next_pending_put.swap(false, Ordering::SeqCst) {
            self.pending_put_held.store(true, Ordering::SeqCst);
            let mut released = self.pending_put_released.lock().unwrap();
            while !*released {
                released = self.pending_put_releases.wait(released).unwrap();
            }
        }
        self.inner
            .put_pending_txn_offsets(group, producer_id, epoch, partitions, recorded_ms)
    }
    fn remove_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: i64,
        holds: &[(cluster::TopicPartition, i16)],
    ) -> Result<(), StorageError> {
        self.check()?;
        self.inner
            .remove_pending_txn_offsets(group, producer_id, holds)
    }
    fn commit_group_offsets(
        &self,
        group: &str,
        offsets: &PendingOffsets,
    ) -> Result<(), StorageError> {
        self.check()?;
        self.inner.commit_group_offsets(group, offsets)
    }
    fn delete_group_offsets(
        &self,
        group: &str,
        partitions: &[cluster::TopicPartition],
    ) -> Result<(), StorageError> {
        self.check()?;
        self.inner.delete_group_offsets(group, partitions)
    }
    fn offset_groups(&self) -> Result<Vec<String>, StorageError> {
        self.inner.offset_groups()
    }
    fn put_group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
        state: Option<&[u8]>,
    ) -> Result<(), StorageError> {
        self.check()?;
        self.inner.put_group_state(protocol, group, state)
    }
    fn group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.group_state(protocol, group)
    }
    fn group_states(
        &self,
        protocol: GroupProtocol,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        if self.fail_group_reads.load(Ordering::SeqCst) {
            return Err(StorageError::Task("injected read failure".into()));
        }
        self.inner.group_states(protocol)
    }
    fn group_offsets(&self, group: &str) -> Result<PendingOffsets, StorageError> {
        let offsets = self.inner.group_offsets(group);
        let mut held = self.hold_offset_reads.lock().unwrap();
        if *held {
            self.offset_read_started.store(true, Ordering::SeqCst);
        }
        while *held {
            held = self.offset_reads_released.wait(held).unwrap();
        }
        offsets
    }
    fn flush(&self) -> Result<(), StorageError> {
        Ok(())
    }
}

/// Starts a coordinator over `storage` with the topology of a one-coordinator [`Cluster`].
async fn serve_on(
    cluster: &Cluster,
    storage: Arc<TestStorage>,
) -> (
    Client,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), coordinator::Error>>,
) {
    serve_on_with(cluster, storage, |_| {}).await
}

/// [`serve_on`] with the config changed by `tune`.
async fn serve_on_with(
    cluster: &Cluster,
    storage: Arc<TestStorage>,
    tune: impl FnOnce(&mut coordinator::CoordinatorConfig),
) -> (
    Client,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), coordinator::Error>>,
) {
    // Reuse the cluster's topology but a new listener: node 1's address in the topology is the
    // cluster's own coordinator, which is fine for everything except FindCoordinator.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config =
        coordinator::CoordinatorConfig::new(1, "/nonexistent", cluster.topology.clone());
    config.cluster_secret = Some(testkit::auth::secret());
    config.marker_retry_backoff = Duration::from_millis(10);
    tune(&mut config);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(coordinator::serve_with_storage(
        config,
        storage,
        listener,
        None,
        async move {
            let _ = rx.await;
        },
    ));
    let client = eventually("connect", || async move {
        proto::transaction_coordinator_client::TransactionCoordinatorClient::connect(format!(
            "http://{addr}"
        ))
        .await
        .ok()
    })
    .await;
    (client, tx, task)
}

#[tokio::test]
async fn load_in_progress_until_state_is_loaded() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    let (client, stop, task) = serve_on(&cluster, storage.clone()).await;
    let mut t = Txn::new(client.clone(), "txn-load");
    let r = t.init_raw(60_000, (-1, -1)).await;
    assert_eq!(code(r.error_code), ErrorCode::CoordinatorLoadInProgress);
    assert_eq!(
        t.add((0, 0), vec![tp("t", 0)]).await,
        ErrorCode::CoordinatorLoadInProgress
    );
    assert_eq!(
        code(t.describe().await.error_code),
        ErrorCode::CoordinatorLoadInProgress
    );
    // Routing comes first: an id of another coordinator would be NOT_COORDINATOR even now
    // (one coordinator here, so everything is ours).
    storage.open_gate();
    let pe = t.init().await;
    assert_eq!(pe.1, 0);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn storage_failure_is_a_typed_error_and_changes_nothing() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (client, stop, task) = serve_on(&cluster, storage.clone()).await;
    let mut t = Txn::new(client.clone(), "txn-disk");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    let before = stable(t.describe().await);
    storage.fail_writes.store(true, Ordering::SeqCst);
    assert_eq!(
        t.add(pe, vec![tp("t", 1)]).await,
        ErrorCode::KafkaStorageError
    );
    let r = t.end_raw(pe, true).await;
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    assert!(r.error_message.contains("injected"), "{}", r.error_message);
    let mut fresh = Txn::new(client.clone(), "txn-disk-new");
    let r = fresh.init_raw(60_000, (-1, -1)).await;
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    assert_eq!(
        stable(t.describe().await),
        before,
        "memory unchanged by a failed write"
    );
    assert_eq!(
        code(fresh.describe().await.error_code),
        ErrorCode::InvalidProducerIdMapping
    );
    // The disk heals: the same requests succeed.
    storage.fail_writes.store(false, Ordering::SeqCst);
    assert_eq!(t.add(pe, vec![tp("t", 1)]).await, ErrorCode::None);
    assert_eq!(t.end(pe, true).await, (pe.0, pe.1 + 1));
    t.wait_state(TxnState::CompleteCommit).await;
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// PROTOCOL.md section 4 step 6: the client's own KIP-360 recovery never fences it. The
/// transaction is Ongoing, EndTxn(ABORT) fails on storage, the client bumps with expected =
/// its current (PID, epoch) as producer-client does, retries CONCURRENT_TRANSACTIONS, and
/// carries on: its next transaction commits.
#[tokio::test]
async fn a_kip360_recovery_after_a_failed_abort_never_fences_the_only_instance() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (client, stop, task) = serve_on(&cluster, storage.clone()).await;
    let mut t = Txn::new(client.clone(), "txn-self-fence");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    storage.fail_writes.store(true, Ordering::SeqCst);
    let r = t.end_raw(pe, false).await;
    assert_eq!(code(r.error_code), ErrorCode::KafkaStorageError);
    storage.fail_writes.store(false, Ordering::SeqCst);
    // The KIP-360 bump: expected = current, retried while the abort's markers are out.
    let recovered = eventually("the KIP-360 bump", || {
        let mut t = Txn::new(client.clone(), "txn-self-fence");
        async move {
            let r = t.init_raw(60_000, pe).await;
            match code(r.error_code) {
                ErrorCode::ConcurrentTransactions => None,
                other => Some((other, r.producer_id, r.producer_epoch)),
            }
        }
    })
    .await;
    assert_eq!(
        recovered,
        (ErrorCode::None, pe.0, pe.1 + 1),
        "never PRODUCER_FENCED"
    );
    let recovered = (recovered.1, recovered.2);
    assert_eq!(t.add(recovered, vec![tp("t", 1)]).await, ErrorCode::None);
    assert_eq!(t.end(recovered, true).await, (pe.0, pe.1 + 2));
    t.wait_state(TxnState::CompleteCommit).await;
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_one_id_are_serialised() {
    let cluster = Cluster::start(1).await;
    let client = cluster.client(1).await;
    let mut t = Txn::new(client.clone(), "txn-concurrent");
    let pe = t.init().await;
    // 30 concurrent AddPartitions of overlapping partitions: all OK, the union is stored.
    let mut tasks = Vec::new();
    for i in 0..30 {
        let mut t = Txn::new(client.clone(), "txn-concurrent");
        tasks.push(tokio::spawn(async move {
            t.add(pe, vec![tp("t", i % 3), tp("u", 0)]).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), ErrorCode::None);
    }
    let d = t.describe().await;
    assert_eq!(d.partitions.len(), 4);
    t.end(pe, false).await;
    t.wait_state(TxnState::CompleteAbort).await;
    // 20 concurrent InitProducerId: every reply a distinct epoch (each one a durable bump).
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let mut t = Txn::new(client.clone(), "txn-concurrent");
        tasks.push(tokio::spawn(async move { t.init().await }));
    }
    let mut epochs = Vec::new();
    for task in tasks {
        let (pid, epoch) = task.await.unwrap();
        assert_eq!(pid, pe.0);
        epochs.push(epoch);
    }
    epochs.sort();
    epochs.dedup();
    assert_eq!(epochs.len(), 20, "{epochs:?}");
    assert_eq!(t.describe().await.producer_epoch, *epochs.last().unwrap());
}

#[tokio::test]
async fn a_fenced_coordinator_generation_stops_the_marker_writer() {
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-gen-fenced");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    cluster.leaders[0].set_reply(ErrorCode::TransactionCoordinatorFenced);
    t.end(pe, true).await;
    let leader = cluster.leaders[0].clone();
    eventually("the refused marker", || {
        let leader = leader.clone();
        async move { (!leader.markers().is_empty()).then_some(()) }
    })
    .await;
    // The writer stopped: no more attempts, and the commit is not completed by this incarnation.
    let seen = cluster.leaders[0].markers().len();
    tokio::time::sleep(Duration::from_millis(200)).await; // observe the absence of retries
    assert_eq!(cluster.leaders[0].markers().len(), seen);
    assert_eq!(t.describe().await.state, TxnState::PrepareCommit as i32);
}

#[tokio::test]
async fn invalid_producer_epoch_counts_for_abort_but_never_completes_a_commit() {
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-newer-epoch");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    cluster.leaders[0].set_reply(ErrorCode::InvalidProducerEpoch);
    let pe = t.end(pe, false).await;
    t.wait_state(TxnState::CompleteAbort).await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    t.end(pe, true).await;
    let leader = cluster.leaders[0].clone();
    eventually("the refused commit marker", || {
        let leader = leader.clone();
        async move {
            leader
                .markers()
                .iter()
                .any(|m| m.result == proto::TxnResult::Commit as i32)
                .then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await; // observe the absence of completion
    assert_eq!(t.describe().await.state, TxnState::PrepareCommit as i32);
}

#[tokio::test]
async fn health_is_not_serving_until_loaded_and_reflection_lists_the_services() {
    use testkit::standard::{health, reflected_services, reflection_knows};
    use tonic_health::pb::health_check_response::ServingStatus;

    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = coordinator::CoordinatorConfig::new(1, "/nonexistent", cluster.topology.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(coordinator::serve_with_storage(
        config,
        storage.clone(),
        listener,
        None,
        async move {
            let _ = stopped.await;
        },
    ));
    // Still loading (the storage's load waits for the gate): the node and its service are
    // NOT_SERVING, the topology service already serves.
    let node = eventually("health answers", || {
        let addr = addr.clone();
        async move { health(&addr, "").await.ok() }
    })
    .await;
    assert_eq!(node, ServingStatus::NotServing);
    let service = "minibroker.v1.TransactionCoordinator";
    assert_eq!(health(&addr, service).await, Ok(ServingStatus::NotServing));
    assert_eq!(
        health(&addr, "minibroker.v1.Cluster").await,
        Ok(ServingStatus::Serving)
    );
    assert!(health(&addr, "minibroker.v1.PartitionLeader")
        .await
        .unwrap_err()
        .starts_with("NotFound"));

    storage.open_gate();
    testkit::poll::wait_until(Duration::from_secs(10), "SERVING once loaded", || {
        let addr = addr.clone();
        async move { health(&addr, service).await == Ok(ServingStatus::Serving) }
    })
    .await;
    assert_eq!(health(&addr, "").await, Ok(ServingStatus::Serving));

    assert_eq!(
        reflected_services(&addr).await.unwrap(),
        vec![
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "minibroker.v1.Cluster",
            "minibroker.v1.TransactionCoordinator",
        ]
    );
    assert_eq!(reflection_knows(&addr, service).await, Ok(true));
    assert_eq!(
        reflection_knows(&addr, "minibroker.v1.InitProducerIdRequest").await,
        Ok(true)
    );

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// At start, a pending transactional offset older than twice the maximum transaction timeout is
/// removed from disk (its marker is lost for good); a younger one is kept.
#[tokio::test]
async fn expired_pending_offsets_are_removed_at_start() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let old = now - 2 * i64::from(cluster::MAX_TRANSACTION_TIMEOUT_MS) - 1_000;
    storage
        .inner
        .put_pending_txn_offsets("g", 7, 0, &[cluster::TopicPartition::new("t", 0)], old)
        .unwrap();
    storage
        .inner
        .put_pending_txn_offsets("g", 8, 0, &[cluster::TopicPartition::new("t", 1)], now)
        .unwrap();
    storage.open_gate();
    let (client, stop, task) = serve_on(&cluster, storage.clone()).await;
    // Loaded once an id answers.
    let mut t = Txn::new(client.clone(), "txn-pending-load");
    t.init().await;
    let left: Vec<_> = storage
        .inner
        .load()
        .unwrap()
        .pending_txn_offsets
        .into_iter()
        .map(|p| (p.producer_id, p.partition))
        .collect();
    assert_eq!(left, vec![(8, cluster::TopicPartition::new("t", 1))]);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// An InitProducerId that waits for its id's lock while the timeout scan removes the id
/// (expired) starts the id afresh in the map: a new PID, which the next InitProducerId bumps.
/// Working on the removed slot instead would store that PID where nothing finds it again, and
/// the next InitProducerId would hand out yet another PID for the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_racing_the_expiry_of_its_id_starts_it_afresh_once() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    *storage.hold_removals.lock().unwrap() = true;
    let (client, stop, task) = serve_on_with(&cluster, storage.clone(), |c| {
        c.transactional_id_expiration = Duration::from_millis(1000);
        c.timeout_scan_interval = Duration::from_millis(20);
    })
    .await;
    let mut t = Txn::new(client.clone(), "txn-expiring");
    let old = t.init().await;
    // The scan holds the id's lock while its removal waits in the storage ...
    eventually("the removal reached the storage", || {
        let storage = storage.clone();
        async move { storage.removal_started.load(Ordering::SeqCst).then_some(()) }
    })
    .await;
    // ... and an InitProducerId queues for that lock.
    let racing = tokio::spawn({
        let client = client.clone();
        async move { Txn::new(client, "txn-expiring").init().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    *storage.hold_removals.lock().unwrap() = false;
    storage.removals_released.notify_all();
    let fresh = racing.await.unwrap();
    assert!(fresh.0 != old.0 && fresh.1 == 0, "{fresh:?} after {old:?}");
    let bumped = t.init().await;
    assert_eq!(bumped, (fresh.0, 1), "the fresh PID was lost");
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// A removal of an expired id that the storage refuses leaves the id as it was, in memory and
/// on disk: the old instance keeps its PID (a restart finds it, and its next InitProducerId
/// bumps that PID).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_the_storage_refuses_leaves_the_expired_id_as_it_was() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    storage.fail_removals.store(true, Ordering::SeqCst);
    let (mut client, stop, task) = serve_on_with(&cluster, storage.clone(), |c| {
        c.transactional_id_expiration = Duration::from_millis(300);
        c.timeout_scan_interval = Duration::from_millis(20);
    })
    .await;
    let mut t = Txn::new(client.clone(), "txn-kept");
    let (pid, epoch) = t.init().await;
    eventually("the removal reached the storage", || {
        let storage = storage.clone();
        async move { storage.removal_started.load(Ordering::SeqCst).then_some(()) }
    })
    .await;
    let d = describe(&mut client, "txn-kept").await;
    assert_eq!(
        (d.error_code, d.producer_id, d.producer_epoch),
        (0, pid, epoch),
        "still held in memory"
    );
    let _ = stop.send(());
    let _ = task.await.unwrap();
    assert!(
        storage
            .inner
            .load()
            .unwrap()
            .txns
            .iter()
            .any(|m| m.transactional_id == "txn-kept"),
        "still on disk"
    );

    // A restart (the disk fixed) finds the id with its PID; its next instance bumps that PID.
    storage.fail_removals.store(false, Ordering::SeqCst);
    let (client, stop, task) = serve_on(&cluster, storage.clone()).await;
    let next = Txn::new(client, "txn-kept").init().await;
    assert_eq!(next, (pid, epoch + 1));
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// Starts coordinator 1 over `storage` with a Kafka listener, in a topology with a leader for
/// topic `input` and the coordinators of `more_coordinators` (TOML) besides node 1: the gRPC
/// and Kafka addresses, the stop signal and the task.
async fn serve_kafka(
    storage: Arc<TestStorage>,
    more_coordinators: &str,
) -> (
    std::net::SocketAddr,
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), coordinator::Error>>,
) {
    let (grpc, kafka, _, stop, task) = serve_kafka_in(storage, more_coordinators).await;
    (grpc, kafka, stop, task)
}

/// [`serve_kafka`], also returning the topology (to sign what another coordinator sends).
async fn serve_kafka_in(
    storage: Arc<TestStorage>,
    more_coordinators: &str,
) -> (
    std::net::SocketAddr,
    std::net::SocketAddr,
    Arc<cluster::Topology>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), coordinator::Error>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let kafka_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let kafka = kafka_listener.local_addr().unwrap();
    let grpc_addr = listener.local_addr().unwrap();
    let topology = Arc::new(
        cluster::Topology::parse(&format!(
            "transaction_state_partitions = 4\n\
             [[coordinators]]\nid = 1\naddress = \"{grpc_addr}\"\n\
             {more_coordinators}\
             [[leaders]]\nid = 101\naddress = \"127.0.0.1:1\"\n\
             [[topics]]\nname = \"input\"\nleaders = [101]\n"
        ))
        .unwrap(),
    );
    let mut config = coordinator::CoordinatorConfig::new(1, "/nonexistent", topology.clone());
    config.cluster_secret = Some(testkit::auth::secret());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(coordinator::serve_with_storage(
        config,
        storage,
        listener,
        Some(kafka_listener),
        async move {
            let _ = stopped.await;
        },
    ));
    (grpc_addr, kafka, topology, stop, task)
}

/// A TxnOffsetCommit naming a member that reaches the Kafka face before the state is loaded is
/// COORDINATOR_LOAD_IN_PROGRESS (the client retries; UNKNOWN_MEMBER_ID would make it abort the
/// transaction) and creates nothing: the group, once loaded, hands out member ids of the
/// loaded generation, not of generation -1.
#[tokio::test]
async fn a_kafka_txn_offset_commit_before_load_is_load_in_progress_and_creates_no_group() {
    use kafka_protocol::messages::{ApiKey, ResponseKind};
    use testkit::kafka::{call, join_group, OffsetTxn};
    let storage = Arc::new(TestStorage::default());
    let (_, kafka, stop, task) = serve_kafka(storage.clone(), "").await;
    let group = "early-group";
    let t = OffsetTxn {
        txn: "early-txn",
        group,
        txn_coordinator: kafka,
        group_coordinator: kafka,
        producer: (0, 0),
    };
    let load_in_progress = kafka_protocol::ResponseError::CoordinatorLoadInProgress.code();
    // A failed assertion opens the gate too (the test's runtime waits for the load to end).
    let _gate = OpenGateOnDrop(storage.clone());
    assert_eq!(
        t.commit_offset("consumer-1.0.1-1", 0, 5).await,
        load_in_progress
    );

    storage.open_gate();
    let member = eventually("the group is served", || async {
        let ResponseKind::JoinGroup(j) =
            call(kafka, ApiKey::JoinGroup, 5, join_group(group, "")).await
        else {
            panic!("JoinGroup response")
        };
        (j.error_code != load_in_progress).then_some((j.error_code, j.member_id.to_string()))
    })
    .await;
    assert_eq!(
        member.0,
        kafka_protocol::ResponseError::MemberIdRequired.code()
    );
    assert!(
        !member.1.contains(".-1."),
        "a membership was created before load: {}",
        member.1
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// A TxnOffsetCommit naming a member, sent to the Kafka face of a node that does not coordinate
/// the group, is NOT_COORDINATOR (the client looks the coordinator up again), as every other
/// group request there; it is not checked against a membership of its own.
#[tokio::test]
async fn a_kafka_txn_offset_commit_on_a_non_owner_is_not_coordinator() {
    use testkit::kafka::OffsetTxn;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let other = "[[coordinators]]\nid = 2\naddress = \"127.0.0.1:1\"\n";
    let (grpc_addr, kafka, stop, task) = serve_kafka(storage.clone(), other).await;
    let topology = cluster::Topology::parse(&format!(
        "transaction_state_partitions = 4\n\
         [[coordinators]]\nid = 1\naddress = \"{grpc_addr}\"\n{other}\
         [[leaders]]\nid = 101\naddress = \"127.0.0.1:1\"\n"
    ))
    .unwrap();
    let group: &'static str = (0..)
        .map(|i| format!("group-{i}"))
        .find(|g| topology.coordinator_for(g).id == 2)
        .map(|g| &*Box::leak(g.into_boxed_str()))
        .unwrap();
    let t = OffsetTxn {
        txn: "txn-elsewhere",
        group,
        txn_coordinator: kafka,
        group_coordinator: kafka,
        producer: (0, 0),
    };
    assert_eq!(
        t.commit_offset("consumer-2.1.1-1", 0, 5).await,
        kafka_protocol::ResponseError::NotCoordinator.code()
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// KIP-447 through the Kafka face: a stable OffsetFetch reads the committed offsets and the
/// pending state as one snapshot. Here its read of the offsets (still without the
/// transaction's) is held in the storage while the transaction commits: the group marker has
/// to wait for the fetch, which then answers UNSTABLE_OFFSET_COMMIT, never the old offset as
/// stable (a read_committed consumer would process that input again).
#[tokio::test]
async fn a_stable_offset_fetch_never_answers_an_offset_from_before_a_marker_as_stable() {
    use testkit::kafka::{offset_fetch_v7, OffsetTxn};
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (grpc_addr, kafka, stop, task) = serve_kafka(storage.clone(), "").await;
    let (txn, group) = ("stale-offset-txn", "stale-offset-group");
    connect(&grpc_addr.to_string()).await;
    let t = OffsetTxn::init(kafka, kafka, txn, group).await;
    t.add_offsets().await;
    assert_eq!(t.commit_offset("", -1, 5).await, 0);

    *storage.hold_offset_reads.lock().unwrap() = true;
    let fetch = tokio::spawn(offset_fetch_v7(kafka, group, true));
    eventually("the fetch read the offsets", || async {
        storage
            .offset_read_started
            .load(Ordering::SeqCst)
            .then_some(())
    })
    .await;
    t.end(true).await;
    // Time for the marker to be applied, were the fetch not in its way (it is applied within
    // milliseconds otherwise).
    for _ in 0..100 {
        if storage.group_marker_applied.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    *storage.hold_offset_reads.lock().unwrap() = false;
    storage.offset_reads_released.notify_all();
    let (code, answer) = fetch.await.unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        answer,
        (
            kafka_protocol::ResponseError::UnstableOffsetCommit.code(),
            -1
        ),
        "an offset from before the marker was answered as stable"
    );
    // Then the marker lands and the new offset is stable.
    let stable = eventually("the offset is stable", || async {
        let (_, (code, offset)) = offset_fetch_v7(kafka, group, true).await;
        (code == 0).then_some(offset)
    })
    .await;
    assert_eq!(stable, 5);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// KIP-447: a refused TxnOffsetCommit gives back only its own hold on the pending partitions.
/// A zombie at (P, e0) and the live instance at (P, e1) (same PID, bumped epoch) commit an
/// offset of the same partition; the zombie's commit records first (its write held in the
/// storage), the live one's is accepted, then the zombie's is refused (PRODUCER_FENCED). The
/// partition stays pending for the live transaction: a stable OffsetFetch must not answer the
/// offset from before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_of_a_zombie_keeps_the_live_commit_pending() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (mut client, stop, task) = serve_on(&cluster, storage.clone()).await;
    let mut zombie = Txn::new(client.clone(), "txn-pending-zombie");
    let old = zombie.init().await;
    let mut live = Txn::new(client.clone(), "txn-pending-zombie");
    let new = live.init().await;
    assert_eq!((new.0, new.1), (old.0, old.1 + 1));
    assert_eq!(live.add_offsets(new, "g").await, ErrorCode::None);

    storage.hold_next_pending_put.store(true, Ordering::SeqCst);
    let fenced = tokio::spawn(async move { zombie.commit_offsets(old, "g", &[("t", 0, 5)]).await });
    eventually("the zombie's commit is recorded", || async {
        storage
            .pending_put_held
            .load(Ordering::SeqCst)
            .then_some(())
    })
    .await;
    assert_eq!(
        live.commit_offsets(new, "g", &[("t", 0, 7)]).await,
        ErrorCode::None
    );
    storage.release_pending_put();
    assert_eq!(fenced.await.unwrap(), ErrorCode::ProducerFenced);

    let (code, _) = offset_fetch_as(&mut client, "g", vec![tp("t", 0)], true).await;
    assert_eq!(
        code,
        ErrorCode::UnstableOffsetCommit,
        "the live transaction's offset is pending until its marker"
    );
    // Its marker ends it: the offset is stable.
    live.end(new, true).await;
    let stable = eventually("the offset is stable", || {
        let mut client = client.clone();
        async move {
            let (code, offsets) = offset_fetch_as(&mut client, "g", vec![tp("t", 0)], true).await;
            (code == ErrorCode::None).then_some(offsets)
        }
    })
    .await;
    assert_eq!(stable, vec![("t".to_string(), 0, 7)]);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// The pending offsets are ordered per group: a group's marker does not wait for a commit of
/// another group whose write is still on its way to disk.
#[tokio::test]
async fn a_group_marker_does_not_wait_for_a_commit_of_another_group() {
    let cluster = Cluster::start(1).await;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (mut client, stop, task) = serve_on(&cluster, storage.clone()).await;
    let mut held = Txn::new(client.clone(), "txn-held-group");
    let held_pe = held.init().await;
    assert_eq!(held.add_offsets(held_pe, "ga").await, ErrorCode::None);
    let mut free = Txn::new(client.clone(), "txn-free-group");
    let free_pe = free.init().await;
    assert_eq!(free.add_offsets(free_pe, "gb").await, ErrorCode::None);

    storage.hold_next_pending_put.store(true, Ordering::SeqCst);
    let slow =
        tokio::spawn(async move { held.commit_offsets(held_pe, "ga", &[("t", 0, 5)]).await });
    eventually("group ga's commit is on its way to disk", || async {
        storage
            .pending_put_held
            .load(Ordering::SeqCst)
            .then_some(())
    })
    .await;
    // Group gb's transaction commits, and its marker applies meanwhile.
    assert_eq!(
        free.commit_offsets(free_pe, "gb", &[("t", 0, 7)]).await,
        ErrorCode::None
    );
    free.end(free_pe, true).await;
    let completed = tokio::time::timeout(
        Duration::from_secs(5),
        free.wait_state(TxnState::CompleteCommit),
    )
    .await;
    // Released before any assertion, so a failure does not leave the write blocked.
    storage.release_pending_put();
    completed.expect("gb's marker waited for ga's commit");
    let (code, offsets) = offset_fetch_as(&mut client, "gb", vec![tp("t", 0)], true).await;
    assert_eq!((code, offsets), (ErrorCode::None, vec![("t".into(), 0, 7)]));
    assert_eq!(slow.await.unwrap(), ErrorCode::None);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// KIP-447: the membership check of a TxnOffsetCommit holds from before its offsets are pending
/// until the commit goes on. A member's commit passes the check, then waits to record its
/// offsets (here: its write held in the storage) while the group rebalances to a generation
/// without it; once its offsets are pending it is checked again, refused (ILLEGAL_GENERATION)
/// and its hold given back, so it never reaches the transaction and the group's next owner of
/// the partition reads no pending offset of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_offset_commit_overtaken_by_a_rebalance_is_fenced_once_pending() {
    use kafka_protocol::messages::{ApiKey, ResponseKind};
    use testkit::kafka::{call, join_group, offset_fetch_v7, sync_group_alone, OffsetTxn};
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (_, kafka, stop, task) = serve_kafka(storage.clone(), "").await;
    let group = "race-group";
    let joined = |member: &str| {
        let request = join_group(group, member);
        async move {
            let ResponseKind::JoinGroup(j) = call(kafka, ApiKey::JoinGroup, 5, request).await
            else {
                panic!("JoinGroup response")
            };
            (j.error_code, j.member_id.to_string(), j.generation_id)
        }
    };
    let (code, member, _) = eventually("the coordinator has loaded", || async {
        let answer = joined("").await;
        (answer.0 != 14).then_some(answer)
    })
    .await;
    assert_eq!(code, 79, "MEMBER_ID_REQUIRED");
    assert_eq!(joined(&member).await, (0, member.clone(), 1));
    // The leader (alone) assigns: Stable. (A rejoin while the group awaits the assignment
    // would be answered with generation 1 again, as in Kafka.)
    let ResponseKind::SyncGroup(synced) = call(
        kafka,
        ApiKey::SyncGroup,
        3,
        sync_group_alone(group, &member, 1),
    )
    .await
    else {
        panic!("SyncGroup response")
    };
    assert_eq!(synced.error_code, 0);
    let t = OffsetTxn::init(kafka, kafka, "race-txn", group).await;
    t.add_offsets().await;

    storage.hold_next_pending_put.store(true, Ordering::SeqCst);
    let commit = {
        let t = OffsetTxn { ..t };
        let member = member.clone();
        tokio::spawn(async move { t.commit_offset(&member, 1, 5).await })
    };
    eventually("the commit is recording its offsets", || async {
        storage
            .pending_put_held
            .load(Ordering::SeqCst)
            .then_some(())
    })
    .await;
    // The group moves on to generation 2 meanwhile.
    assert_eq!(joined(&member).await, (0, member.clone(), 2));
    storage.release_pending_put();
    assert_eq!(commit.await.unwrap(), 22, "ILLEGAL_GENERATION");
    assert_eq!(
        offset_fetch_v7(kafka, group, true).await,
        (0, (0, -1)),
        "nothing pending, nothing committed"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// DescribeGroups answers every group on its own: an empty or over-long group id is
/// INVALID_GROUP_ID, a group before the state is loaded COORDINATOR_LOAD_IN_PROGRESS, an unknown
/// one Dead; describing creates no group (ListGroups stays empty).
#[tokio::test]
async fn describe_groups_answers_bad_and_unknown_groups_each_and_creates_none() {
    use kafka_protocol::messages::{
        ApiKey, DescribeGroupsRequest, GroupId, ListGroupsRequest, RequestKind, ResponseKind,
    };
    use testkit::kafka::call;
    let storage = Arc::new(TestStorage::default());
    let (_, kafka, stop, task) = serve_kafka(storage.clone(), "").await;
    let _gate = OpenGateOnDrop(storage.clone());
    let describe = || async move {
        let mut r = DescribeGroupsRequest::default();
        let long = "x".repeat(cluster::MAX_ID_LEN + 1);
        r.groups = ["", long.as_str(), "nobody"]
            .into_iter()
            .map(|g| GroupId(kafka_wire::str_bytes(g)))
            .collect();
        let ResponseKind::DescribeGroups(d) = call(
            kafka,
            ApiKey::DescribeGroups,
            5,
            RequestKind::DescribeGroups(r),
        )
        .await
        else {
            panic!("DescribeGroups response")
        };
        d.groups
            .iter()
            .map(|g| (g.error_code, g.group_state.to_string()))
            .collect::<Vec<_>>()
    };
    let (invalid, loading) = (24, 14);
    let before = describe().await;
    assert_eq!(
        before[..2],
        [(invalid, String::new()), (invalid, String::new())]
    );
    assert_eq!(before[2], (loading, String::new()), "before load");

    storage.open_gate();
    let after = eventually("the coordinator has loaded", || async {
        let answer = describe().await;
        (answer[2].0 != loading).then_some(answer)
    })
    .await;
    assert_eq!(after[2], (0, "Dead".to_string()));
    let ResponseKind::ListGroups(listed) = call(
        kafka,
        ApiKey::ListGroups,
        4,
        RequestKind::ListGroups(ListGroupsRequest::default()),
    )
    .await
    else {
        panic!("ListGroups response")
    };
    assert_eq!((listed.error_code, listed.groups.len()), (0, 0));
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// The stored groups are restored before the node serves: when they cannot be read, the load
/// fails and the coordinator stops with the storage's error instead of serving groups it does not
/// hold (their members would be told they are unknown, and rebalance).
#[tokio::test]
async fn a_coordinator_that_cannot_read_its_groups_does_not_serve() {
    let storage = Arc::new(TestStorage::default());
    storage.fail_group_reads.store(true, Ordering::SeqCst);
    storage.open_gate();
    let (_, _, _stop, task) = serve_kafka(storage.clone(), "").await;
    let ended = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the coordinator stops by itself")
        .unwrap();
    match ended {
        Err(coordinator::Error::Storage(e)) => {
            assert!(e.to_string().contains("injected read failure"), "{e}")
        }
        other => panic!("expected the storage's error, got {other:?}"),
    }
}

/// Durable before acknowledged, for a classic group: a SyncGroup whose generation cannot be
/// stored is answered with the storage's error and no assignment, and nothing is stored; once
/// the disk heals, the same SyncGroup gets the assignment, and the generation is stored first.
/// The last member's LeaveGroup removes the record before it is answered.
#[tokio::test]
async fn a_classic_generation_is_handed_out_only_once_stored() {
    use kafka_protocol::messages::{ApiKey, GroupId, LeaveGroupRequest, RequestKind, ResponseKind};
    use testkit::kafka::{call, join_group, sync_group_alone};
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (_, kafka, stop, task) = serve_kafka(storage.clone(), "").await;
    let group = "durable-group";
    let joined = eventually("the coordinator has loaded", || async {
        let ResponseKind::JoinGroup(r) =
            call(kafka, ApiKey::JoinGroup, 3, join_group(group, "")).await
        else {
            panic!("JoinGroup response")
        };
        (r.error_code == 0).then_some(r)
    })
    .await;
    let member = joined.member_id.to_string();
    let sync = || async {
        let ResponseKind::SyncGroup(r) = call(
            kafka,
            ApiKey::SyncGroup,
            3,
            sync_group_alone(group, &member, joined.generation_id),
        )
        .await
        else {
            panic!("SyncGroup response")
        };
        r.error_code
    };
    let stored = || {
        storage
            .inner
            .group_state(GroupProtocol::Classic, group)
            .unwrap()
    };
    storage.fail_writes.store(true, Ordering::SeqCst);
    let refused = sync().await;
    assert_ne!(refused, 0, "answered without storing the generation");
    assert_eq!(stored(), None);
    storage.fail_writes.store(false, Ordering::SeqCst);
    assert_eq!(sync().await, 0);
    let record: coordinator::consumer_groups::ClassicGroupRecord =
        serde_json::from_slice(&stored().expect("stored before the answer")).unwrap();
    assert_eq!(record.generation, joined.generation_id);
    assert_eq!(record.members[0].member_id, member);

    let mut leave = LeaveGroupRequest::default();
    leave.group_id = GroupId(kafka_wire::str_bytes(group));
    leave.member_id = kafka_wire::str_bytes(&member);
    let ResponseKind::LeaveGroup(left) =
        call(kafka, ApiKey::LeaveGroup, 1, RequestKind::LeaveGroup(leave)).await
    else {
        panic!("LeaveGroup response")
    };
    assert_eq!(left.error_code, 0);
    assert_eq!(stored(), None, "the Empty group's record is gone");
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// The Groups gRPC service refuses bad input with a typed error and creates nothing: before the
/// state is loaded COORDINATOR_LOAD_IN_PROGRESS; then an empty or over-long group id is
/// INVALID_REQUEST, an unknown group GROUP_ID_NOT_FOUND, a group another coordinator owns
/// NOT_COORDINATOR; ListGroups stays empty.
#[tokio::test]
async fn the_groups_service_refuses_bad_and_unknown_groups_and_creates_none() {
    use proto::groups_client::GroupsClient;
    let storage = Arc::new(TestStorage::default());
    // A second coordinator (never started) owns some group ids.
    let (grpc, _, stop, task) = serve_kafka(
        storage.clone(),
        "[[coordinators]]\nid = 2\naddress = \"127.0.0.1:1\"\n",
    )
    .await;
    let _gate = OpenGateOnDrop(storage.clone());
    let mut client = GroupsClient::new(
        tonic::transport::Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect_lazy(),
    );
    let topology = cluster::Topology::parse(&format!(
        "transaction_state_partitions = 4\n[[coordinators]]\nid = 1\naddress = \"{grpc}\"\n\
         [[coordinators]]\nid = 2\naddress = \"127.0.0.1:1\"\n\
         [[leaders]]\nid = 101\naddress = \"127.0.0.1:1\"\n\
         [[topics]]\nname = \"input\"\nleaders = [101]\n"
    ))
    .unwrap();
    let (mine, theirs) = {
        let owned_by = |node| {
            (0..)
                .map(|i| format!("group-{i}"))
                .find(|g| topology.coordinator_for(g).id == node)
                .unwrap()
        };
        (owned_by(1), owned_by(2))
    };
    let describe = |group: String| {
        let mut client = client.clone();
        async move {
            let r = client
                .describe_group(proto::DescribeGroupRequest { group_id: group })
                .await
                .unwrap()
                .into_inner();
            ErrorCode::from_wire(r.error_code)
        }
    };
    assert_eq!(
        describe(mine.clone()).await,
        ErrorCode::CoordinatorLoadInProgress
    );
    storage.open_gate();
    eventually("the coordinator has loaded", || async {
        (describe(mine.clone()).await != ErrorCode::CoordinatorLoadInProgress).then_some(())
    })
    .await;
    assert_eq!(describe(mine).await, ErrorCode::GroupIdNotFound);
    assert_eq!(describe(theirs).await, ErrorCode::NotCoordinator);
    assert_eq!(describe(String::new()).await, ErrorCode::InvalidRequest);
    assert_eq!(
        describe("x".repeat(cluster::MAX_ID_LEN + 1)).await,
        ErrorCode::InvalidRequest
    );
    let listed = client
        .list_groups(proto::ListGroupsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((listed.error_code, listed.groups.len()), (0, 0));
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// A group whose offsets a transaction has pending (its TxnOffsetCommit accepted, its marker
/// not applied) is in use: DeleteGroups is NON_EMPTY_GROUP and OffsetDelete
/// CONCURRENT_TRANSACTIONS for the partition, and nothing is deleted, so the transaction's
/// COMMIT never brings back offsets deleted after it was accepted. Once the marker is applied
/// the offset can be deleted; a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION; a
/// storage failure is NOT_COORDINATOR and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_a_transactions_offsets_pending_is_not_deleted_until_the_marker() {
    use testkit::kafka::{offset_fetch_v7, OffsetTxn};
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (_, kafka, stop, task) = serve_kafka(storage.clone(), "").await;
    let group = "pending-group";
    eventually("the coordinator has loaded", || async {
        (delete_groups(kafka, &[group]).await != [14]).then_some(())
    })
    .await;
    let t = OffsetTxn::init(kafka, kafka, "pending-txn", group).await;
    t.add_offsets().await;
    assert_eq!(t.commit_offset("", -1, 5).await, 0);
    let (non_empty, concurrent, unknown, not_found) = (68, 51, 3, 69);
    assert_eq!(delete_groups(kafka, &[group]).await, [non_empty]);
    assert_eq!(
        offset_delete(kafka, group, &[("input", 0)]).await,
        (0, vec![concurrent])
    );

    t.end(true).await;
    eventually("the marker is applied", || async {
        (offset_fetch_v7(kafka, group, true).await == (0, (0, 5))).then_some(())
    })
    .await;
    assert_eq!(list_groups(kafka).await, [(group.into(), "Empty".into())]);

    storage.fail_writes.store(true, Ordering::SeqCst);
    assert_eq!(
        delete_groups(kafka, &[group]).await,
        [16],
        "NOT_COORDINATOR"
    );
    assert_eq!(
        offset_delete(kafka, group, &[("input", 0)]).await,
        (16, vec![])
    );
    storage.fail_writes.store(false, Ordering::SeqCst);
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, 5)));

    assert_eq!(
        offset_delete(kafka, group, &[("input", 0), ("nope", 0)]).await,
        (0, vec![0, unknown])
    );
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, -1)));
    assert!(list_groups(kafka).await.is_empty());
    assert_eq!(delete_groups(kafka, &[group]).await, [not_found]);
    assert_eq!(
        offset_delete(kafka, group, &[("input", 0)]).await,
        (not_found, vec![])
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// A deleted group's offsets stay deleted when the marker that wrote them comes again (its
/// transaction's coordinator, restarted in Prepare*, sends it once more): the group's marker
/// fences outlive the deletion, so the marker is a repeat and writes nothing. A later
/// transaction's marker writes the group anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_offsets_stay_deleted_when_their_marker_comes_again() {
    use testkit::kafka::offset_fetch_v7;
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    // Coordinator 7 is in the topology but not started: the test sends its markers.
    let ghost = "[[coordinators]]\nid = 7\naddress = \"127.0.0.1:1\"\n";
    let (grpc, kafka, topology, stop, task) = serve_kafka_in(storage.clone(), ghost).await;
    let group = testkit::auth::id_owned_by(&topology, 1);
    let group = group.as_str();
    let client = eventually("the coordinator answers", || async {
        proto::transaction_coordinator_client::TransactionCoordinatorClient::connect(format!(
            "http://{grpc}"
        ))
        .await
        .ok()
    })
    .await;
    let marker = |epoch: i32, offset: i64| {
        let mut request = proto::WriteGroupOffsetMarkerRequest {
            group_id: group.to_string(),
            producer_id: 1000,
            producer_epoch: epoch,
            result: proto::TxnResult::Commit as i32,
            offsets: vec![proto::PartitionOffset {
                topic: "input".into(),
                partition: 0,
                offset,
            }],
            coordinator_id: 7,
            coordinator_generation: 3,
            transactional_id: testkit::auth::id_owned_by(&topology, 7),
            auth: None,
            transaction_version: 2,
            transaction_number: 0,
        };
        testkit::auth::sign(&topology, 7, &mut request);
        request
    };
    let send = |request| {
        let mut client = client.clone();
        async move {
            let r = client.write_group_offset_marker(request).await;
            r.unwrap().into_inner().error_code
        }
    };
    let first =
        eventually("the coordinator has loaded", || {
            let answer = send(marker(5, 10));
            async move {
                Some(answer.await).filter(|c| *c != ErrorCode::CoordinatorLoadInProgress as i32)
            }
        })
        .await;
    assert_eq!(first, ErrorCode::None as i32);
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, 10)));

    assert_eq!(delete_groups(kafka, &[group]).await, [0]);
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, -1)));
    assert!(list_groups(kafka).await.is_empty());

    // The same marker again: a repeat, nothing written.
    assert_eq!(send(marker(5, 10)).await, ErrorCode::None as i32);
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, -1)));
    assert_eq!(
        delete_groups(kafka, &[group]).await,
        [69],
        "GROUP_ID_NOT_FOUND"
    );

    // The PID's next transaction commits: the group has offsets again.
    assert_eq!(send(marker(6, 20)).await, ErrorCode::None as i32);
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, 20)));
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// DeleteGroups racing a TxnOffsetCommit whose pending offsets are being written: the deletion
/// waits for that write (it needs the pending entries held still) and then finds them, so it is
/// NON_EMPTY_GROUP and deletes nothing; it never deletes between the commit's acceptance and
/// its pending record, which would let the transaction's COMMIT bring the offsets back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_racing_a_txn_offset_commit_waits_for_its_pending_record() {
    use testkit::kafka::{offset_fetch_v7, OffsetTxn};
    let storage = Arc::new(TestStorage::default());
    storage.open_gate();
    let (_, kafka, stop, task) = serve_kafka(storage.clone(), "").await;
    let group = "racing-group";
    eventually("the coordinator has loaded", || async {
        (delete_groups(kafka, &[group]).await != [14]).then_some(())
    })
    .await;
    // The group has a committed offset (a first transaction), so there is something to delete.
    let t = OffsetTxn::init(kafka, kafka, "racing-txn", group).await;
    t.add_offsets().await;
    assert_eq!(t.commit_offset("", -1, 3).await, 0);
    t.end(true).await;
    eventually("the first marker is applied", || async {
        (offset_fetch_v7(kafka, group, true).await == (0, (0, 3))).then_some(())
    })
    .await;

    t.add_offsets().await;
    storage.hold_next_pending_put.store(true, Ordering::SeqCst);
    let commit = {
        let t = OffsetTxn { ..t };
        tokio::spawn(async move { t.commit_offset("", -1, 7).await })
    };
    eventually("the commit is recording its pending offsets", || async {
        storage
            .pending_put_held
            .load(Ordering::SeqCst)
            .then_some(())
    })
    .await;
    let deletion = tokio::spawn(async move { delete_groups(kafka, &[group]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !deletion.is_finished(),
        "the deletion waits for the pending record"
    );
    storage.release_pending_put();
    assert_eq!(commit.await.unwrap(), 0);
    assert_eq!(deletion.await.unwrap(), [68], "NON_EMPTY_GROUP");
    assert_eq!(
        offset_fetch_v7(kafka, group, false).await,
        (0, (0, 3)),
        "nothing deleted"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
