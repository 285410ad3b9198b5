//! Helpers for the end-to-end scenario tests in `tests/`: a cluster per test
//! ([`minibroker::EmbeddedCluster`]), polling a condition with a deadline (never sleeping as
//! synchronisation), an initialised transactional producer, reading a topic to its end, and
//! describing a transactional id.
//!
//! Scenario files:
//! - `tests/fencing.rs`: a new id gets epoch 0; a second instance gets the same PID and a higher
//!   epoch and fences the first at every service (sticky fatal error in the client); the old
//!   instance's open transaction is aborted and invisible; a zombie is rejected at a partition it
//!   never wrote to; KIP-360 recovery (OUT_OF_ORDER_SEQUENCE_NUMBER, abort, bump with the expected
//!   epoch, success); epoch exhaustion (PID rotation) unnoticed by the application; a
//!   transaction timeout reported as TRANSACTION_TIMED_OUT (abortable); EndTxn retries; keyed
//!   sends and a long-polling read_committed consumer; group offsets atomic with the transaction.
//! - `tests/faults.rs`: a coordinator killed between PrepareCommit and CompleteCommit; a leader
//!   restarted mid-transaction; a commit retried across a coordinator restart; a send retried
//!   until a killed leader returns; the idempotent producer across a leader restart; the
//!   consume-transform-produce app (10,000 records) crashed and replaced, then replaced while
//!   running (fenced), with every input record in the output exactly once.
//! - `tests/demo.rs`: `minibroker demo` passes, and fails when the leaders skip the epoch check.
//! - `tests/compose.rs` (issue 5): the docker compose scenario.
//! - `tests/kafka_fuzz.rs`: mutated and forged Kafka requests to every node: no panic, every node
//!   still serves, the stored log reads the same after a restart.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use minibroker::{EmbeddedCluster, EmbeddedOptions};
use producer_client::{
    Admin, ClientConfig, Consumer, Isolation, TopicPartition, TransactionalProducer,
};

/// Installs a tracing subscriber once (filter from `RUST_LOG`, off by default).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_test_writer()
        .try_init();
}

/// The default test cluster: 2 coordinators, 3 leaders, `input` and `output` with 3 partitions,
/// and a fast timeout scan.
pub async fn cluster() -> EmbeddedCluster {
    cluster_with(EmbeddedOptions::default()).await
}

/// A test cluster with `options` (the timeout scan runs every 50 ms unless set otherwise).
pub async fn cluster_with(mut options: EmbeddedOptions) -> EmbeddedCluster {
    init_tracing();
    if options.timeout_scan_interval == EmbeddedOptions::default().timeout_scan_interval {
        options.timeout_scan_interval = Duration::from_millis(50);
    }
    options.marker_retry_backoff = options.marker_retry_backoff.min(Duration::from_millis(20));
    EmbeddedCluster::start_with(options)
        .await
        .expect("embedded cluster starts")
}

/// A client configuration for `cluster` with short retries suited to tests.
pub fn config(cluster: &EmbeddedCluster) -> ClientConfig {
    cluster
        .client_config()
        .with_request_timeout(Duration::from_secs(5))
        .with_retry_backoff(Duration::from_millis(5), Duration::from_millis(100))
        .with_max_retries(200)
}

/// A transactional producer for `id` on `cluster`, initialised (InitProducerId done).
pub async fn producer(cluster: &EmbeddedCluster, id: &str) -> TransactionalProducer {
    let mut p = TransactionalProducer::connect(config(cluster).with_transactional_id(id))
        .await
        .expect("connect");
    p.init_transactions().await.expect("init_transactions");
    p
}

/// Waits until no transaction is open on any partition of `topic` (LSO == high watermark
/// everywhere). A commit is acknowledged once its decision is durable; its markers reach the
/// leaders a moment later (as in Kafka), so a reader that must see every committed record waits
/// for this first.
pub async fn wait_settled(cluster: &EmbeddedCluster, topic: &str) {
    let admin = Admin::new(config(cluster)).expect("admin");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ends = admin.end_offsets(topic).await.expect("end offsets");
        if ends.values().all(|(hw, lso)| hw == lso) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} still has open transactions: {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every record value of `topic` (all partitions) visible at `isolation`, per partition in
/// offset order, once every transaction on it has settled ([`wait_settled`]).
pub async fn read_topic(
    cluster: &EmbeddedCluster,
    topic: &str,
    isolation: Isolation,
) -> BTreeMap<i32, Vec<String>> {
    wait_settled(cluster, topic).await;
    read_topic_now(cluster, topic, isolation).await
}

/// Like [`read_topic`], without waiting for open transactions to settle.
pub async fn read_topic_now(
    cluster: &EmbeddedCluster,
    topic: &str,
    isolation: Isolation,
) -> BTreeMap<i32, Vec<String>> {
    let mut consumer = Consumer::new(config(cluster), isolation).expect("consumer");
    consumer.assign_topics(&[topic]).await.expect("assign");
    let records = consumer
        .read_to_end(Duration::from_secs(20))
        .await
        .expect("read to end");
    let mut out: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for r in records {
        out.entry(r.partition.partition)
            .or_default()
            .push(String::from_utf8_lossy(&r.value).into_owned());
    }
    out
}

/// Every value of `topic` at `isolation`, flattened, once settled.
pub async fn values(cluster: &EmbeddedCluster, topic: &str, isolation: Isolation) -> Vec<String> {
    read_topic(cluster, topic, isolation)
        .await
        .into_values()
        .flatten()
        .collect()
}

/// Every value of `topic` at `isolation` right now (open transactions hold read_committed back).
pub async fn values_now(
    cluster: &EmbeddedCluster,
    topic: &str,
    isolation: Isolation,
) -> Vec<String> {
    read_topic_now(cluster, topic, isolation)
        .await
        .into_values()
        .flatten()
        .collect()
}

/// DescribeTransactions for `id`.
pub async fn describe(cluster: &EmbeddedCluster, id: &str) -> proto::TransactionDescription {
    Admin::new(config(cluster))
        .expect("admin")
        .describe_transaction(id)
        .await
        .expect("describe")
}

/// The state of `id` at its coordinator.
pub async fn state(cluster: &EmbeddedCluster, id: &str) -> proto::TxnState {
    proto::TxnState::try_from(describe(cluster, id).await.state).expect("valid state")
}

/// The partition `p` of `topic`.
pub fn tp(topic: &str, p: i32) -> TopicPartition {
    TopicPartition::new(topic, p)
}

/// TEST-ONLY: rewrites the stored epoch of `id` in a *stopped* coordinator's data directory,
/// so a test can reach epoch exhaustion without 32,000 round trips. The id must be Empty or
/// Complete*; `last_epoch` is cleared so the old epoch is not a valid KIP-360 retry.
pub fn fast_forward_epoch(coordinator_dir: &Path, id: &str, epoch: i16) {
    use coordinator::storage::{SledStorage, Storage};
    let storage = SledStorage::open(coordinator_dir).expect("open the coordinator's sled");
    let snapshot = storage.load().expect("load");
    let mut meta = snapshot
        .txns
        .into_iter()
        .find(|t| t.transactional_id == id)
        .expect("the id is stored");
    assert!(
        !matches!(
            meta.state,
            coordinator::core::TxnState::Ongoing
                | coordinator::core::TxnState::PrepareCommit
                | coordinator::core::TxnState::PrepareAbort
        ),
        "fast-forward only between transactions"
    );
    meta.producer_epoch = epoch;
    meta.last_epoch = -1;
    storage.put_txn(&meta).expect("put");
    storage.flush().expect("flush");
}
