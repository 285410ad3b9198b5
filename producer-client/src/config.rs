//! [`ClientConfig`]: where the cluster is and how patient the client is.

use std::time::Duration;

use crate::error::{Error, Result};

/// Settings shared by every client type. Build one with [`ClientConfig::new`] and the `with_*`
/// methods; the defaults suit a local cluster.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of any node(s); the client learns the rest through Metadata/FindCoordinator.
    pub bootstrap: Vec<String>,
    /// The transactional id (required by [`crate::TransactionalProducer`]).
    pub transactional_id: Option<String>,
    /// Asked of the coordinator in InitProducerId (Kafka's `transaction.timeout.ms`).
    pub transaction_timeout_ms: i32,
    /// Deadline of one request (a long-poll Fetch gets its wait added to this).
    pub request_timeout: Duration,
    /// Deadline for opening a connection.
    pub connect_timeout: Duration,
    /// First retry backoff; doubles per attempt, with jitter.
    pub retry_backoff: Duration,
    /// Cap on one backoff.
    pub retry_backoff_max: Duration,
    /// How many times a retriable error is retried before it reaches the application
    /// (coordinator and metadata requests; Produce is bounded by `delivery_timeout` instead).
    pub max_retries: u32,
    /// Kafka's `linger.ms`: how long a batch waits for more records before it closes.
    pub linger: Duration,
    /// Kafka's `batch.size`: a batch closes once it holds this many bytes (records count their
    /// key, value and a fixed overhead). Default 128 KiB, not Kafka's 16 KiB: every Produce
    /// costs our leader a flush (Kafka's broker does not fsync per request), so a batch of ~16
    /// records of 1 KiB leaves the leader half idle (`minibroker produce`: 0.44x the leader's
    /// figure at 16 KiB, 0.80x at 128 KiB, one run).
    pub batch_size: usize,
    /// Kafka's `max.in.flight.requests.per.connection`: Produce requests outstanding per
    /// partition, 1..=5 (the leader remembers the last 5 batches of a PID, which is what makes
    /// a retry of any of them recognisable).
    pub max_in_flight_requests_per_connection: usize,
    /// Kafka's `buffer.memory`: bytes of records a producer holds that are not acknowledged yet;
    /// `send` waits for room.
    pub buffer_memory: usize,
    /// Kafka's `max.block.ms`: how long `send` waits for `buffer.memory` before it fails.
    pub max_block: Duration,
    /// Kafka's `delivery.timeout.ms`: how long a record may wait for its acknowledgement, retries
    /// included.
    pub delivery_timeout: Duration,
    /// Kafka's `max.request.size`: batches for several partitions of one leader travel in one
    /// Produce request up to this many bytes of records (a single larger batch still goes alone).
    pub max_request_size: usize,
}

impl ClientConfig {
    /// A configuration with defaults, bootstrapping from `bootstrap`.
    pub fn new<I, S>(bootstrap: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            bootstrap: bootstrap.into_iter().map(Into::into).collect(),
            transactional_id: None,
            transaction_timeout_ms: cluster::DEFAULT_TRANSACTION_TIMEOUT_MS,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            retry_backoff: Duration::from_millis(20),
            retry_backoff_max: Duration::from_millis(500),
            max_retries: 60,
            linger: Duration::from_millis(5),
            batch_size: 128 * 1024,
            max_in_flight_requests_per_connection: 5,
            buffer_memory: 32 * 1024 * 1024,
            max_block: Duration::from_secs(60),
            delivery_timeout: Duration::from_secs(120),
            max_request_size: 1024 * 1024,
        }
    }

    /// Sets one producer setting by its Kafka name: `linger.ms`, `batch.size`,
    /// `max.in.flight.requests.per.connection`, `buffer.memory`, `max.block.ms`,
    /// `delivery.timeout.ms`, `max.request.size`, `request.timeout.ms`, `retry.backoff.ms`, `retry.backoff.max.ms`,
    /// `transaction.timeout.ms` or `transactional.id`.
    pub fn set(mut self, name: &str, value: &str) -> Result<Self> {
        let number = || {
            value.trim().parse::<u64>().map_err(|_| {
                Error::Config(format!(
                    "{name} must be a non-negative integer, got {value:?}"
                ))
            })
        };
        let ms = || number().map(Duration::from_millis);
        let size = || {
            number().and_then(|n| {
                usize::try_from(n).map_err(|_| Error::Config(format!("{name} is too large")))
            })
        };
        match name {
            "linger.ms" => self.linger = ms()?,
            "batch.size" => self.batch_size = size()?,
            "max.in.flight.requests.per.connection" => {
                self.max_in_flight_requests_per_connection = size()?
            }
            "buffer.memory" => self.buffer_memory = size()?,
            "max.block.ms" => self.max_block = ms()?,
            "delivery.timeout.ms" => self.delivery_timeout = ms()?,
            "max.request.size" => self.max_request_size = size()?,
            "request.timeout.ms" => self.request_timeout = ms()?,
            "retry.backoff.ms" => self.retry_backoff = ms()?,
            "retry.backoff.max.ms" => self.retry_backoff_max = ms()?,
            "transaction.timeout.ms" => {
                self.transaction_timeout_ms = i32::try_from(number()?).map_err(|_| {
                    Error::Config(format!("{name} must fit in 32 bits, got {value}"))
                })?
            }
            "transactional.id" => self.transactional_id = Some(value.to_string()),
            _ => return Err(Error::Config(format!("unknown producer setting {name:?}"))),
        }
        self.validate()?;
        Ok(self)
    }

    /// Sets `linger.ms`.
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Sets `batch.size` (bytes).
    pub fn with_batch_size(mut self, bytes: usize) -> Self {
        self.batch_size = bytes;
        self
    }

    /// Sets `max.in.flight.requests.per.connection` (1..=5).
    pub fn with_max_in_flight(mut self, requests: usize) -> Self {
        self.max_in_flight_requests_per_connection = requests;
        self
    }

    /// Sets `buffer.memory` (bytes).
    pub fn with_buffer_memory(mut self, bytes: usize) -> Self {
        self.buffer_memory = bytes;
        self
    }

    /// Sets `max.block.ms`.
    pub fn with_max_block(mut self, max_block: Duration) -> Self {
        self.max_block = max_block;
        self
    }

    /// Sets `delivery.timeout.ms`.
    pub fn with_delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Sets the transactional id.
    pub fn with_transactional_id(mut self, id: impl Into<String>) -> Self {
        self.transactional_id = Some(id.into());
        self
    }

    /// Sets the transaction timeout asked of the coordinator.
    pub fn with_transaction_timeout_ms(mut self, ms: i32) -> Self {
        self.transaction_timeout_ms = ms;
        self
    }

    /// Sets the per-request deadline.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the retry budget.
    pub fn with_max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Sets the first backoff and its cap.
    pub fn with_retry_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.retry_backoff = first;
        self.retry_backoff_max = max;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.bootstrap.is_empty() || self.bootstrap.iter().any(|a| a.trim().is_empty()) {
            return Err(Error::Config(
                "at least one non-empty bootstrap address is required".into(),
            ));
        }
        if self.transaction_timeout_ms <= 0 {
            return Err(Error::Config(format!(
                "transaction_timeout_ms must be positive, got {}",
                self.transaction_timeout_ms
            )));
        }
        if !(1..=5).contains(&self.max_in_flight_requests_per_connection) {
            return Err(Error::Config(format!(
                "max.in.flight.requests.per.connection must be 1..=5 (the leader remembers 5 batches per producer), got {}",
                self.max_in_flight_requests_per_connection
            )));
        }
        if self.batch_size == 0 {
            return Err(Error::Config("batch.size must be positive".into()));
        }
        if self.buffer_memory < self.batch_size || u32::try_from(self.buffer_memory).is_err() {
            return Err(Error::Config(format!(
                "buffer.memory must be at least batch.size ({}) and below 4 GiB, got {}",
                self.batch_size, self.buffer_memory
            )));
        }
        if self.delivery_timeout.is_zero() {
            return Err(Error::Config("delivery.timeout.ms must be positive".into()));
        }
        if let Some(id) = &self.transactional_id {
            if id.is_empty() || id.len() > cluster::MAX_ID_LEN {
                return Err(Error::Config(format!(
                    "transactional_id must be 1..={} bytes",
                    cluster::MAX_ID_LEN
                )));
            }
        }
        Ok(())
    }
}

/// Bounded exponential backoff with full jitter.
#[derive(Debug)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    attempts_left: u32,
    attempt: u32,
}

impl Backoff {
    pub(crate) fn new(config: &ClientConfig) -> Self {
        Self {
            first: config.retry_backoff.max(Duration::from_millis(1)),
            max: config.retry_backoff_max.max(config.retry_backoff),
            attempts_left: config.max_retries,
            attempt: 0,
        }
    }

    /// Sleeps before the next attempt, or returns `false` when the budget is spent.
    pub(crate) async fn wait(&mut self) -> bool {
        self.wait_from(self.first).await
    }

    /// Like [`Backoff::wait`], but CONCURRENT_TRANSACTIONS starts from 1 ms: it usually means
    /// the previous transaction's markers are still being written, which takes a few ms (Kafka's
    /// client uses a short backoff for this case too).
    pub(crate) async fn wait_for(&mut self, error: &crate::Error) -> bool {
        let first = if matches!(error, crate::Error::ConcurrentTransactions(_)) {
            self.first.min(Duration::from_millis(1))
        } else {
            self.first
        };
        self.wait_from(first).await
    }

    async fn wait_from(&mut self, first: Duration) -> bool {
        if self.attempts_left == 0 {
            return false;
        }
        self.attempts_left -= 1;
        let exp = first
            .saturating_mul(1u32 << self.attempt.min(16))
            .min(self.max);
        self.attempt += 1;
        // Jitter in [exp/2, exp]: spreads retries of many clients without starving any one.
        let half = exp / 2;
        let jitter = rand::random::<f64>();
        tokio::time::sleep(half + half.mul_f64(jitter)).await;
        true
    }
}

/// Wraps a bare `host:port` as the URI tonic dials.
pub(crate) fn uri(address: &str) -> String {
    if address.starts_with("http://") || address.starts_with("https://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_problem() {
        assert!(ClientConfig::new(["a:1"]).validate().is_ok());
        let empty: [&str; 0] = [];
        assert!(ClientConfig::new(empty).validate().is_err());
        assert!(ClientConfig::new([" "]).validate().is_err());
        let e = ClientConfig::new(["a:1"])
            .with_transaction_timeout_ms(0)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("transaction_timeout_ms"), "{e}");
        let e = ClientConfig::new(["a:1"])
            .with_transactional_id("x".repeat(256))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("transactional_id"), "{e}");
        assert!(ClientConfig::new(["a:1"])
            .with_transactional_id("")
            .validate()
            .is_err());
    }

    #[test]
    fn kafka_names_set_the_pipeline() {
        let c = ClientConfig::new(["a:1"])
            .set("linger.ms", "7")
            .and_then(|c| c.set("batch.size", "65536"))
            .and_then(|c| c.set("max.in.flight.requests.per.connection", "3"))
            .and_then(|c| c.set("buffer.memory", "1048576"))
            .and_then(|c| c.set("max.block.ms", "100"))
            .and_then(|c| c.set("delivery.timeout.ms", "5000"))
            .unwrap();
        assert_eq!(c.linger, Duration::from_millis(7));
        assert_eq!(c.batch_size, 65536);
        assert_eq!(c.max_in_flight_requests_per_connection, 3);
        assert_eq!(c.buffer_memory, 1 << 20);
        assert_eq!(c.max_block, Duration::from_millis(100));
        assert_eq!(c.delivery_timeout, Duration::from_secs(5));
        let e = ClientConfig::new(["a:1"])
            .set("max.in.flight.requests.per.connection", "6")
            .unwrap_err();
        assert!(e.to_string().contains("1..=5"), "{e}");
        assert!(ClientConfig::new(["a:1"]).set("linger.ms", "-1").is_err());
        assert!(ClientConfig::new(["a:1"]).set("acks", "all").is_err());
        let e = ClientConfig::new(["a:1"])
            .set("buffer.memory", "10")
            .unwrap_err();
        assert!(e.to_string().contains("buffer.memory"), "{e}");
    }

    #[test]
    fn uri_adds_a_scheme_once() {
        assert_eq!(uri("127.0.0.1:1"), "http://127.0.0.1:1");
        assert_eq!(uri("http://h:1"), "http://h:1");
    }

    #[tokio::test]
    async fn backoff_is_bounded_and_runs_out() {
        let config = ClientConfig::new(["a:1"])
            .with_retry_backoff(Duration::from_millis(1), Duration::from_millis(4))
            .with_max_retries(5);
        let mut backoff = Backoff::new(&config);
        let start = std::time::Instant::now();
        for _ in 0..5 {
            assert!(backoff.wait().await);
        }
        assert!(!backoff.wait().await, "the budget is spent");
        // 5 waits of at most 4 ms each (plus scheduling slack).
        assert!(start.elapsed() < Duration::from_millis(500));
    }
}
