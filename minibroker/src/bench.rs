//! `minibroker bench`: the client's producer pipeline end to end, against the leader's own
//! figure measured in the same run.
//!
//! Phases, one after the other, each `duration` long, 1 KiB records by default:
//! - **leader-grpc-batch100**: raw Produce requests of 100 records to partition 0, one at a time
//!   (what the leader takes over gRPC; the yardstick);
//! - **idempotent-1p**: one idempotent producer through the pipeline (`linger.ms`, `batch.size`,
//!   5 in flight) to partition 0; its ratio to the yardstick is the headline figure;
//! - **idempotent**: the same, round robin over every partition (the base of the overhead);
//! - **transactional-100ms**: a transactional producer, round robin over every partition, a
//!   commit every `commit_interval` (Kafka Streams' `commit.interval.ms`);
//! - **idempotent-NxP**: `producers` idempotent producers at once, round robin.
//!
//! Every phase sends as fast as `send` returns, then flushes; its rate counts acknowledged
//! records over the whole phase including the flush. **idempotent** and **transactional-100ms**
//! alternate in `OVERHEAD_ROUNDS` (4) slices (the disk's speed drifts over seconds; the overhead
//! is their ratio). At saturation `buffer.memory` is full, so a commit waits for what is
//! buffered (Kafka's producer does the same): the commit p50 is long, the throughput is what
//! counts.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use producer_client::{
    ClientConfig, DeliveryFuture, IdempotentProducer, RawRequests, TopicPartition,
    TransactionalProducer,
};
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
    /// Commit cadence of the transactional phase.
    pub commit_interval: Duration,
    /// The producers' `linger.ms`.
    pub linger: Duration,
    /// The producers' `batch.size`.
    pub batch_size: usize,
    /// Producers of the concurrent phase.
    pub producers: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            topic: "input".into(),
            duration: Duration::from_secs(10),
            record_size: 1024,
            commit_interval: Duration::from_millis(100),
            linger: Duration::from_millis(5),
            batch_size: 128 * 1024,
            producers: 8,
        }
    }
}

/// One phase's result.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    /// Phase name.
    pub name: String,
    /// Records acknowledged (committed, for the transactional phase).
    pub records: u64,
    /// Wall time.
    pub seconds: f64,
    /// Records per second.
    pub records_per_sec: f64,
    /// MiB per second of record values.
    pub mib_per_sec: f64,
    /// Transactions committed (0 for the others).
    pub transactions: u64,
    /// Median commit_transaction latency, ms.
    pub commit_p50_ms: f64,
    /// 99th percentile commit_transaction latency, ms.
    pub commit_p99_ms: f64,
}

/// The whole benchmark's result.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Every phase, in order.
    pub phases: Vec<PhaseResult>,
    /// idempotent-1p / leader-grpc-batch100 (target >= 0.7).
    pub pipeline_ratio: f64,
    /// idempotent / transactional-100ms records per second (target <= 1.03).
    pub overhead_ratio: f64,
    /// idempotent-NxP / leader-grpc-batch100.
    pub concurrent_ratio: f64,
    /// Settings, for the record.
    pub record_size: usize,
    /// See [`BenchOptions::linger`].
    pub linger_ms: u64,
    /// See [`BenchOptions::batch_size`].
    pub batch_size: usize,
    /// See [`BenchOptions::commit_interval`].
    pub commit_interval_ms: u64,
}

impl BenchReport {
    /// The human table.
    pub fn print(&self) {
        crate::outln!(
            "{:<24} {:>12} {:>10} {:>8} {:>10} {:>10}",
            "PHASE",
            "RECORDS/S",
            "MIB/S",
            "TXNS",
            "COMMIT P50",
            "COMMIT P99"
        );
        for p in &self.phases {
            crate::outln!(
                "{:<24} {:>12.0} {:>10.2} {:>8} {:>8.1}ms {:>8.1}ms",
                p.name,
                p.records_per_sec,
                p.mib_per_sec,
                p.transactions,
                p.commit_p50_ms,
                p.commit_p99_ms
            );
        }
        crate::outln!(
            "pipeline ratio (idempotent-1p / leader-grpc-batch100): {:.2}x",
            self.pipeline_ratio
        );
        crate::outln!(
            "concurrent ratio ({} / leader-grpc-batch100): {:.2}x",
            self.phases.last().map_or("", |p| p.name.as_str()),
            self.concurrent_ratio
        );
        crate::outln!(
            "transactional overhead (idempotent / transactional-100ms): {:.3}x",
            self.overhead_ratio
        );
    }
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

/// Slices in which the idempotent and transactional phases alternate.
const OVERHEAD_ROUNDS: u32 = 4;

/// Deliveries not checked yet; checked in order, at most `WINDOW` outstanding.
const WINDOW: usize = 50_000;

async fn settle(pending: &mut VecDeque<DeliveryFuture>, keep: usize) -> anyhow::Result<u64> {
    let mut acked = 0;
    while pending.len() > keep {
        pending.pop_front().expect("non-empty").await?;
        acked += 1;
    }
    Ok(acked)
}

/// One idempotent producer sending to `targets` round robin for `duration`, then flushing.
async fn idempotent_run(
    config: ClientConfig,
    topic: String,
    targets: Vec<i32>,
    duration: Duration,
    value: Vec<u8>,
) -> anyhow::Result<u64> {
    let mut producer = IdempotentProducer::connect(config).await?;
    let start = Instant::now();
    let mut pending = VecDeque::new();
    let mut acked = 0u64;
    let mut i = 0usize;
    while start.elapsed() < duration {
        let p = targets[i % targets.len()];
        i += 1;
        pending.push_back(producer.send(&topic, p, value.clone()).await?);
        acked += settle(&mut pending, WINDOW).await?;
    }
    producer.flush().await?;
    acked += settle(&mut pending, 0).await?;
    Ok(acked)
}

/// Runs every phase. `progress` gets a line per phase.
pub async fn run(
    config: ClientConfig,
    options: BenchOptions,
    mut progress: impl FnMut(&PhaseResult),
) -> anyhow::Result<BenchReport> {
    let n = partitions(&config, &options.topic).await?;
    let all: Vec<i32> = (0..n).collect();
    let value = vec![b'x'; options.record_size];
    let size = options.record_size;
    let producer_config = config
        .clone()
        .with_linger(options.linger)
        .with_batch_size(options.batch_size)
        .with_buffer_memory(options.batch_size.max(32 * 1024 * 1024));
    let mut phases = Vec::new();

    // The yardstick: raw Produce of 100 records, one request at a time, to partition 0.
    let raw = RawRequests::new(config.clone())?;
    let id = format!("bench-raw-{}", std::process::id());
    let (pid, epoch) = raw.init_producer_id(&id, 60_000, None).await?;
    let tp = TopicPartition::new(options.topic.clone(), 0);
    let start = Instant::now();
    let (mut sent, mut seq) = (0u64, 0i32);
    while start.elapsed() < options.duration {
        raw.produce(&tp, None, pid, epoch, seq, vec![value.clone(); 100])
            .await?;
        sent += 100;
        seq += 100;
    }
    let leader = phase("leader-grpc-batch100", sent, start.elapsed(), size, vec![]);
    progress(&leader);
    phases.push(leader);

    let start = Instant::now();
    let acked = idempotent_run(
        producer_config.clone(),
        options.topic.clone(),
        vec![0],
        options.duration,
        value.clone(),
    )
    .await?;
    let single = phase("idempotent-1p", acked, start.elapsed(), size, vec![]);
    progress(&single);
    phases.push(single);

    // Idempotent vs transactional over every partition: the overhead. The disk's speed drifts
    // over seconds, so the two alternate in OVERHEAD_ROUNDS slices and each rate is its total
    // records over its total time.
    let mut producer = TransactionalProducer::connect(
        producer_config
            .clone()
            .with_transactional_id(format!("bench-txn-{}", std::process::id())),
    )
    .await?;
    producer.init_transactions().await?;
    let slice = options.duration / OVERHEAD_ROUNDS;
    let (mut idempotent, mut idempotent_time) = (0u64, Duration::ZERO);
    let (mut committed, mut txn_time, mut commits, mut i) =
        (0u64, Duration::ZERO, Vec::new(), 0usize);
    for _ in 0..OVERHEAD_ROUNDS {
        let start = Instant::now();
        idempotent += idempotent_run(
            producer_config.clone(),
            options.topic.clone(),
            all.clone(),
            slice,
            value.clone(),
        )
        .await?;
        idempotent_time += start.elapsed();

        // Transactional, a commit every commit_interval, sending as fast as it can in between.
        let start = Instant::now();
        while start.elapsed() < slice {
            producer.begin_transaction()?;
            let txn_start = Instant::now();
            let mut deliveries = Vec::new();
            while txn_start.elapsed() < options.commit_interval {
                let p = all[i % all.len()];
                i += 1;
                deliveries.push(producer.send(&options.topic, p, value.clone()).await?);
            }
            let t = Instant::now();
            producer.commit_transaction().await?;
            commits.push(t.elapsed().as_secs_f64() * 1000.0);
            for d in deliveries {
                d.await?;
                committed += 1;
            }
        }
        txn_time += start.elapsed();
    }
    let result = phase("idempotent", idempotent, idempotent_time, size, vec![]);
    progress(&result);
    phases.push(result);
    let txn = phase("transactional-100ms", committed, txn_time, size, commits);
    progress(&txn);
    phases.push(txn);
    drop(producer);

    // Several producers at once.
    let start = Instant::now();
    let runs: Vec<_> = (0..options.producers.max(1))
        .map(|_| {
            tokio::spawn(idempotent_run(
                producer_config.clone(),
                options.topic.clone(),
                all.clone(),
                options.duration,
                value.clone(),
            ))
        })
        .collect();
    let mut acked = 0;
    for r in runs {
        acked += r.await??;
    }
    let name = format!("idempotent-{}x{n}", options.producers.max(1));
    let concurrent = phase(&name, acked, start.elapsed(), size, vec![]);
    progress(&concurrent);
    phases.push(concurrent);

    let rate = |name: &str| {
        phases
            .iter()
            .find(|p| p.name == name)
            .map_or(0.0, |p| p.records_per_sec)
    };
    let yardstick = rate("leader-grpc-batch100").max(1e-9);
    Ok(BenchReport {
        pipeline_ratio: rate("idempotent-1p") / yardstick,
        overhead_ratio: rate("idempotent") / rate("transactional-100ms").max(1e-9),
        concurrent_ratio: rate(&name) / yardstick,
        phases,
        record_size: options.record_size,
        linger_ms: options.linger.as_millis() as u64,
        batch_size: options.batch_size,
        commit_interval_ms: options.commit_interval.as_millis() as u64,
    })
}
