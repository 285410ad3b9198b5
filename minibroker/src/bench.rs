//! `minibroker bench`: the client end to end, transactional vs idempotent, in the same run.
//!
//! Both producers write 1 KiB records round-robin over the partitions of one topic, each Produce
//! carrying `batch` records and awaited before the next (the client keeps one request in flight).
//! The transactional producer wraps every `records_per_txn` records (default 100) in a
//! transaction; it runs twice:
//! - **paced**: a transaction is committed every `commit_interval` (default 100 ms): begin, 100
//!   records, commit, then wait for the next tick (Kafka Streams' `commit.interval.ms`);
//! - **saturated**: transactions back to back, to measure the protocol's cost at full speed.
//!
//! The idempotent producer runs saturated. The overhead ratio is idempotent throughput divided
//! by transactional (saturated) throughput.

use std::time::{Duration, Instant};

use producer_client::{ClientConfig, IdempotentProducer, TransactionalProducer};
use serde::Serialize;

/// Benchmark settings.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Topic to write.
    pub topic: String,
    /// Length of each phase.
    pub duration: Duration,
    /// Bytes per record value.
    pub record_size: usize,
    /// Records per transaction.
    pub records_per_txn: usize,
    /// Records per Produce request.
    pub batch: usize,
    /// Commit cadence of the paced phase.
    pub commit_interval: Duration,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            topic: "input".into(),
            duration: Duration::from_secs(10),
            record_size: 1024,
            records_per_txn: 100,
            batch: 1,
            commit_interval: Duration::from_millis(100),
        }
    }
}

/// One phase's result.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    /// Phase name.
    pub name: String,
    /// Records acknowledged (committed, for the transactional phases).
    pub records: u64,
    /// Wall time.
    pub seconds: f64,
    /// Records per second.
    pub records_per_sec: f64,
    /// MiB per second of record values.
    pub mib_per_sec: f64,
    /// Transactions committed (0 for the idempotent phase).
    pub transactions: u64,
    /// Median commit_transaction latency, ms.
    pub commit_p50_ms: f64,
    /// 99th percentile commit_transaction latency, ms.
    pub commit_p99_ms: f64,
}

/// The whole benchmark's result.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Idempotent producer, saturated.
    pub idempotent: PhaseResult,
    /// Transactional producer, a commit every `commit_interval`.
    pub transactional_paced: PhaseResult,
    /// Transactional producer, transactions back to back.
    pub transactional_saturated: PhaseResult,
    /// idempotent / transactional_saturated records per second.
    pub overhead_ratio: f64,
    /// Settings, for the record.
    pub record_size: usize,
    /// See [`BenchOptions::records_per_txn`].
    pub records_per_txn: usize,
    /// See [`BenchOptions::batch`].
    pub batch: usize,
    /// See [`BenchOptions::commit_interval`].
    pub commit_interval_ms: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn phase(
    name: &str,
    records: u64,
    elapsed: Duration,
    size: usize,
    mut commits: Vec<f64>,
) -> PhaseResult {
    commits.sort_by(|a, b| a.total_cmp(b));
    let seconds = elapsed.as_secs_f64().max(1e-9);
    PhaseResult {
        name: name.into(),
        records,
        seconds,
        records_per_sec: records as f64 / seconds,
        mib_per_sec: records as f64 * size as f64 / seconds / (1024.0 * 1024.0),
        transactions: commits.len() as u64,
        commit_p50_ms: percentile(&commits, 0.5),
        commit_p99_ms: percentile(&commits, 0.99),
    }
}

async fn partitions(config: &ClientConfig, topic: &str) -> anyhow::Result<i32> {
    let admin = producer_client::Admin::new(config.clone())?;
    let metadata = admin.metadata().await?;
    metadata
        .partition_count(topic)
        .ok_or_else(|| anyhow::anyhow!("topic {topic} does not exist"))
}

/// What every phase writes: `batch` copies of one value per Produce, round robin over
/// `partitions` (continuing where the previous phase stopped).
struct Load {
    topic: String,
    partitions: i32,
    batch: usize,
    value: Vec<u8>,
    next_partition: i32,
}

impl Load {
    fn values(&self) -> Vec<Vec<u8>> {
        vec![self.value.clone(); self.batch]
    }

    fn next(&mut self) -> i32 {
        let p = self.next_partition;
        self.next_partition = (p + 1) % self.partitions;
        p
    }
}

/// Runs the three phases one after the other. `progress` gets a line per phase.
pub async fn run(
    config: ClientConfig,
    options: BenchOptions,
    mut progress: impl FnMut(&PhaseResult),
) -> anyhow::Result<BenchReport> {
    let mut load = Load {
        topic: options.topic.clone(),
        partitions: partitions(&config, &options.topic).await?,
        batch: options.batch.clamp(1, options.records_per_txn.max(1)),
        value: vec![b'x'; options.record_size],
        next_partition: 0,
    };
    let batch = load.batch;
    let idempotent = idempotent_phase(&config, &options, &mut load).await?;
    progress(&idempotent);
    let mut results = Vec::new();
    for (name, paced) in [
        ("transactional-paced", true),
        ("transactional-saturated", false),
    ] {
        let result = transactional_phase(&config, &options, &mut load, name, paced).await?;
        progress(&result);
        results.push(result);
    }
    let transactional_saturated = results.pop().expect("two phases");
    let transactional_paced = results.pop().expect("two phases");
    let overhead_ratio =
        idempotent.records_per_sec / transactional_saturated.records_per_sec.max(1e-9);
    Ok(BenchReport {
        idempotent,
        transactional_paced,
        transactional_saturated,
        overhead_ratio,
        record_size: options.record_size,
        records_per_txn: options.records_per_txn,
        batch,
        commit_interval_ms: options.commit_interval.as_millis() as u64,
    })
}

/// Idempotent, saturated: Produce as fast as the replies come back.
async fn idempotent_phase(
    config: &ClientConfig,
    options: &BenchOptions,
    load: &mut Load,
) -> anyhow::Result<PhaseResult> {
    let mut idem = IdempotentProducer::connect(config.clone()).await?;
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < options.duration {
        let p = load.next();
        idem.send_batch(&load.topic, p, load.values()).await?;
        sent += load.batch as u64;
    }
    Ok(phase(
        "idempotent",
        sent,
        start.elapsed(),
        options.record_size,
        vec![],
    ))
}

/// Transactional: `records_per_txn` records per transaction, committed back to back
/// (saturated) or once per `commit_interval` (paced). Commit latencies are recorded.
async fn transactional_phase(
    config: &ClientConfig,
    options: &BenchOptions,
    load: &mut Load,
    name: &str,
    paced: bool,
) -> anyhow::Result<PhaseResult> {
    let mut producer = TransactionalProducer::connect(
        config
            .clone()
            .with_transactional_id(format!("bench-{name}-{}", std::process::id())),
    )
    .await?;
    producer.init_transactions().await?;
    let start = Instant::now();
    let mut committed = 0u64;
    let mut commits = Vec::new();
    let mut next_tick = start + options.commit_interval;
    while start.elapsed() < options.duration {
        producer.begin_transaction()?;
        let mut in_txn = 0;
        while in_txn < options.records_per_txn {
            let p = load.next();
            producer.send_batch(&load.topic, p, load.values()).await?;
            in_txn += load.batch;
        }
        let t = Instant::now();
        producer.commit_transaction().await?;
        commits.push(t.elapsed().as_secs_f64() * 1000.0);
        committed += in_txn as u64;
        if paced {
            let now = Instant::now();
            if next_tick > now {
                tokio::time::sleep_until(next_tick.into()).await;
            }
            next_tick += options.commit_interval;
            // Fell behind by more than a tick: do not try to catch up in a burst.
            if next_tick < Instant::now() {
                next_tick = Instant::now() + options.commit_interval;
            }
        }
    }
    Ok(phase(
        name,
        committed,
        start.elapsed(),
        options.record_size,
        commits,
    ))
}
