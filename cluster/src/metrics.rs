//! Prometheus metrics of one node ([`Metrics`]) and the HTTP endpoint that serves them
//! ([`serve_http`], `GET /metrics`, the node binaries' `--metrics-listen`).
//!
//! One [`Metrics`] per node (an embedded cluster runs five nodes in one process, each with its
//! own registry and endpoint). Every family is registered on every node; a labelled family
//! appears in a scrape once it has its first sample (a coordinator shows no leader families).
//!
//! | name | type | labels | what |
//! |------|------|--------|------|
//! | `kafka_network_requestmetrics_errors_total` | counter | `request`, `error` | every request answered, by API and error code (`NONE` included): Kafka's `RequestMetrics` `ErrorsPerSec` |
//! | `minibroker_fenced_requests_total` | counter | `request`, `error`, `transactional_id`, `producer_id` | requests refused with PRODUCER_FENCED or INVALID_PRODUCER_EPOCH (a leader does not know the transactional id: empty) |
//! | `minibroker_producer_epoch_bumps_total` | counter | `cause` | epoch bumps at this coordinator: `new_producer_id`, `new_instance`, `kip360`, `end_txn`, `timeout`, `rotation` |
//! | `minibroker_transactions` | gauge | `state` | transactional ids this coordinator holds, by state (`Empty`, `Ongoing`, `PrepareCommit`, ...) |
//! | `minibroker_transaction_duration_seconds` | histogram | `result` | first AddPartitions/AddOffsets to Complete* (`commit`, `abort`) |
//! | `minibroker_txn_marker_latency_seconds` | histogram | `result` | Prepare* to Complete*: writing the markers to every leader and group |
//! | `kafka_cluster_partition_laststableoffsetlag` | gauge | `topic`, `partition` | high watermark minus LSO: Kafka's `Partition` `LastStableOffsetLag` |
//! | `minibroker_sled_flush_seconds` | histogram | `node` | one durable storage call (write + sled flush) |
//! | `minibroker_group_commit_records` | histogram | none | records made durable by one sled flush at a leader |
//! | `minibroker_producer_states_expired_total` | counter | none | producer states a leader forgot (`producer.id.expiration.ms`) |
//!
//! Label values come from the protocol (error code names, transactional ids, PIDs): a cluster
//! with very many transactional ids that get fenced grows `minibroker_fenced_requests_total`
//! accordingly, which is the point of it (which instance is the zombie), and bounded in practice
//! by the ids that actually get fenced.
//!
//! The endpoint is a few lines of HTTP/1.1 over tokio (one request per connection, `Connection:
//! close`), because a scrape is all it answers; the body is the OpenMetrics text format that
//! Prometheus reads.
//!
//! CAVEATS: no per-partition request metrics, no byte rates, no JVM-style process metrics; the
//! flush histogram times the whole durable call (sled's write and its fsync together).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use proto::ErrorCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{ProducerId, TopicPartition};

/// Why a producer epoch moved (the `cause` label of `minibroker_producer_epoch_bumps_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochBumpCause {
    /// A transactional id seen for the first time got a producer id (epoch 0).
    NewProducerId,
    /// InitProducerId from a new instance: the previous instance is fenced.
    NewInstance,
    /// InitProducerId with the expected (PID, epoch): the same instance recovering (KIP-360).
    Kip360,
    /// EndTxn: every transaction ends with a bump (transaction version 2, KIP-890).
    EndTxn,
    /// The coordinator aborted a transaction older than its timeout.
    Timeout,
    /// The epoch was exhausted and the id moved to a new producer id.
    Rotation,
}

impl EpochBumpCause {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Self::NewProducerId => "new_producer_id",
            Self::NewInstance => "new_instance",
            Self::Kip360 => "kip360",
            Self::EndTxn => "end_txn",
            Self::Timeout => "timeout",
            Self::Rotation => "rotation",
        }
    }
}

impl fmt::Display for EpochBumpCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    request: String,
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FencedLabels {
    request: String,
    error: String,
    transactional_id: String,
    producer_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    topic: String,
    partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 100 us .. ~3.3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

struct Inner {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    fenced: Family<FencedLabels, Counter>,
    epoch_bumps: Family<CauseLabels, Counter>,
    transactions: Family<StateLabels, Gauge>,
    txn_duration: HistogramFamily<ResultLabels>,
    marker_latency: HistogramFamily<ResultLabels>,
    lso_lag: Family<PartitionLabels, Gauge>,
    flush: HistogramFamily<NodeLabels>,
    group_commit: Histogram,
    producers_expired: Counter,
}

/// The metrics of one node. Cheap to clone (one shared registry).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every family registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "kafka_network_requestmetrics_errors",
            "Requests answered, by API (request) and error code (NONE included)",
            requests.clone(),
        );
        let fenced = Family::<FencedLabels, Counter>::default();
        registry.register(
            "minibroker_fenced_requests",
            "Requests refused with PRODUCER_FENCED or INVALID_PRODUCER_EPOCH, by transactional id and producer id",
            fenced.clone(),
        );
        let epoch_bumps = Family::<CauseLabels, Counter>::default();
        registry.register(
            "minibroker_producer_epoch_bumps",
            "Producer epoch bumps at this coordinator, by cause",
            epoch_bumps.clone(),
        );
        let transactions = Family::<StateLabels, Gauge>::default();
        registry.register(
            "minibroker_transactions",
            "Transactional ids held by this coordinator, by state",
            transactions.clone(),
        );
        let txn_duration: HistogramFamily<ResultLabels> =
            Family::new_with_constructor(seconds_histogram);
        registry.register(
            "minibroker_transaction_duration_seconds",
            "Transactions from their first partition or group to Complete*, by result",
            txn_duration.clone(),
        );
        let marker_latency: HistogramFamily<ResultLabels> =
            Family::new_with_constructor(seconds_histogram);
        registry.register(
            "minibroker_txn_marker_latency_seconds",
            "From Prepare* to Complete*: markers written to every leader and group, by result",
            marker_latency.clone(),
        );
        let lso_lag = Family::<PartitionLabels, Gauge>::default();
        registry.register(
            "kafka_cluster_partition_laststableoffsetlag",
            "High watermark minus last stable offset, per partition this leader owns",
            lso_lag.clone(),
        );
        let flush: HistogramFamily<NodeLabels> = Family::new_with_constructor(seconds_histogram);
        registry.register(
            "minibroker_sled_flush_seconds",
            "One durable storage call (sled write and flush)",
            flush.clone(),
        );
        let group_commit = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        registry.register(
            "minibroker_group_commit_records",
            "Records made durable by one sled flush at a partition leader",
            group_commit.clone(),
        );
        let producers_expired = Counter::default();
        registry.register(
            "minibroker_producer_states_expired",
            "Producer states a leader forgot after producer.id.expiration.ms idle (per partition)",
            producers_expired.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                requests,
                fenced,
                epoch_bumps,
                transactions,
                txn_duration,
                marker_latency,
                lso_lag,
                flush,
                group_commit,
                producers_expired,
            }),
        }
    }

    /// Counts one answered request (`request` is the RPC's name, e.g. `Produce`) with its wire
    /// error code; a PRODUCER_FENCED or INVALID_PRODUCER_EPOCH answer is also counted per
    /// transactional id (empty where the node does not know it) and producer id.
    pub fn request(
        &self,
        request: &str,
        error_code: i32,
        transactional_id: &str,
        producer_id: ProducerId,
    ) {
        let code = ErrorCode::from_wire(error_code);
        self.request_named(request, code.name(), transactional_id, producer_id);
    }

    /// [`Metrics::request`] with the error's name (`NONE`, `PRODUCER_FENCED`, ...): how the
    /// Kafka face counts, under Kafka's error names.
    pub fn request_named(
        &self,
        request: &str,
        error: &str,
        transactional_id: &str,
        producer_id: ProducerId,
    ) {
        self.inner
            .requests
            .get_or_create(&RequestLabels {
                request: request.to_string(),
                error: error.to_string(),
            })
            .inc();
        if matches!(error, "PRODUCER_FENCED" | "INVALID_PRODUCER_EPOCH") {
            self.inner
                .fenced
                .get_or_create(&FencedLabels {
                    request: request.to_string(),
                    error: error.to_string(),
                    transactional_id: transactional_id.to_string(),
                    producer_id: producer_id.to_string(),
                })
                .inc();
        }
    }

    /// Counts one epoch bump.
    pub fn epoch_bump(&self, cause: EpochBumpCause) {
        self.inner
            .epoch_bumps
            .get_or_create(&CauseLabels {
                cause: cause.name().to_string(),
            })
            .inc();
    }

    /// Forgets the per-state counts (a coordinator that (re)loads its state counts it afresh;
    /// in an embedded cluster the registry outlives a node's restart).
    pub fn reset_transaction_states(&self) {
        self.inner.transactions.clear();
    }

    /// One transactional id in state `from` is gone (expired).
    pub fn transaction_state_removed(&self, from: &str) {
        self.inner
            .transactions
            .get_or_create(&StateLabels {
                state: from.to_string(),
            })
            .dec();
    }

    /// Moves one transactional id from state `from` (none: a new id) to state `to`.
    pub fn transaction_state(&self, from: Option<&str>, to: &str) {
        if from == Some(to) {
            return;
        }
        if let Some(from) = from {
            self.inner
                .transactions
                .get_or_create(&StateLabels {
                    state: from.to_string(),
                })
                .dec();
        }
        self.inner
            .transactions
            .get_or_create(&StateLabels {
                state: to.to_string(),
            })
            .inc();
    }

    /// Records a completed transaction (`result`: `commit` or `abort`): how long it was open,
    /// and how long its markers took.
    pub fn transaction_completed(&self, result: &str, open_for: Duration, markers: Duration) {
        let labels = ResultLabels {
            result: result.to_string(),
        };
        self.inner
            .txn_duration
            .get_or_create(&labels)
            .observe(open_for.as_secs_f64());
        self.inner
            .marker_latency
            .get_or_create(&labels)
            .observe(markers.as_secs_f64());
    }

    /// Sets the LSO lag (high watermark - LSO) of a partition.
    pub fn lso_lag(&self, tp: &TopicPartition, lag: i64) {
        self.inner
            .lso_lag
            .get_or_create(&PartitionLabels {
                topic: tp.topic.clone(),
                partition: tp.partition.to_string(),
            })
            .set(lag);
    }

    /// Records one durable storage call on `node` (`coordinator` or `leader`).
    pub fn flushed(&self, node: &str, took: Duration) {
        self.inner
            .flush
            .get_or_create(&NodeLabels {
                node: node.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// `count` producer states forgotten by a leader's expiry scan.
    pub fn producers_expired(&self, count: usize) {
        self.inner.producers_expired.inc_by(count as u64);
    }

    /// One group commit at a leader made `records` records durable.
    pub fn group_commit(&self, records: usize) {
        self.inner.group_commit.observe(records as f64);
    }

    /// The OpenMetrics text of every family.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Longest a scrape may take to send its request line and headers.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
const MAX_HEAD: usize = 8 * 1024;

/// Serves `GET /metrics` on an already bound listener until `shutdown` resolves: one request per
/// connection, each on its own task. Any other path answers 404, any other method 405.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => {
                    let metrics = metrics.clone();
                    tokio::spawn(async move {
                        if let Err(e) = answer(conn, &metrics).await {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    // Out of file descriptors and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Binds `address` and serves [`serve_http`] on it in a task until `stop` turns true; the
/// bound address (port 0 picks one) and the task.
pub async fn spawn_endpoint(
    address: &str,
    metrics: Metrics,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding the metrics endpoint {address}: {e}"),
        )
    })?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(serve_http(listener, metrics, async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
    }));
    Ok((bound, task))
}

async fn answer(mut conn: tokio::net::TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
            let n = conn.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    match read {
        Ok(r) => r?,
        Err(_) => return Ok(()),
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, metrics.render()),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET /metrics\n".to_string(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    conn.write_all(response.as_bytes()).await?;
    conn.shutdown().await
}

/// Fetches `http://{address}/metrics` and returns the body (for tests and the CLI; a plain
/// HTTP/1.1 GET, no client library).
pub async fn scrape(address: &str) -> std::io::Result<String> {
    let mut conn = tokio::net::TcpStream::connect(address).await?;
    conn.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut response = Vec::new();
    conn.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return Err(std::io::Error::other("malformed HTTP response"));
    };
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!(
            "scrape answered {}",
            head.lines().next().unwrap_or("")
        )));
    }
    Ok(body.to_string())
}

/// The value of the sample `name{labels}` in OpenMetrics `text`, where `labels` are the pairs
/// that must all be present (others may be too). Sums matching samples.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, label_text) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let all = labels
            .iter()
            .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
        if all {
            if let Ok(v) = value.parse::<f64>() {
                *found.get_or_insert(0.0) += v;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_requests_are_counted_by_id() {
        let m = Metrics::new();
        m.request("EndTxn", ErrorCode::None as i32, "app", 7);
        m.request("EndTxn", ErrorCode::ProducerFenced as i32, "app", 7);
        m.request("Produce", ErrorCode::InvalidProducerEpoch as i32, "", 7);
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                "kafka_network_requestmetrics_errors_total",
                &[("request", "EndTxn")]
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "minibroker_fenced_requests_total",
                &[("error", "PRODUCER_FENCED"), ("transactional_id", "app")]
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "minibroker_fenced_requests_total",
                &[("producer_id", "7")]
            ),
            Some(2.0)
        );
    }

    #[test]
    fn transaction_states_move() {
        let m = Metrics::new();
        m.transaction_state(None, "Empty");
        m.transaction_state(Some("Empty"), "Ongoing");
        m.transaction_state(Some("Ongoing"), "Ongoing");
        m.epoch_bump(EpochBumpCause::NewInstance);
        let text = m.render();
        let state = |s| sample(&text, "minibroker_transactions", &[("state", s)]);
        assert_eq!(state("Empty"), Some(0.0));
        assert_eq!(state("Ongoing"), Some(1.0));
        assert_eq!(
            sample(
                &text,
                "minibroker_producer_epoch_bumps_total",
                &[("cause", "new_instance")]
            ),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn the_endpoint_serves_the_text() {
        let m = Metrics::new();
        m.lso_lag(&TopicPartition::new("input", 0), 3);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(listener, m, async move {
            let _ = stopped.await;
        }));
        let text = scrape(&address).await.unwrap();
        assert_eq!(
            sample(
                &text,
                "kafka_cluster_partition_laststableoffsetlag",
                &[("topic", "input"), ("partition", "0")]
            ),
            Some(3.0)
        );
        assert!(text.trim_end().ends_with("# EOF"));
        stop.send(()).unwrap();
        server.await.unwrap();
    }
}
