//! `minibroker process`: the classic exactly-once consume-transform-produce application.
//!
//! On start it calls InitProducerId with its transactional id (fencing any previous instance and
//! aborting its open transaction, which waits for a commit that was already decided to
//! complete), then reads its group's committed offsets (OffsetFetch at the group coordinator) and
//! resumes from there. Each round polls `input` with read_committed, writes the transformed
//! records to the same partition of `output`, and commits the consumed offsets *in the same
//! transaction* (AddOffsetsToTxn + TxnOffsetCommit). A crash at any point leaves either the whole
//! round (output records and offsets) or none of it, so the output holds every input record
//! exactly once.
//!
//! An abortable error aborts the round, rewinds the consumer to the committed offsets and goes on;
//! a fatal one (fenced by a newer instance) stops the processor.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use producer_client::{
    ClientConfig, Consumer, ConsumerRecord, Isolation, TopicPartition, TransactionalProducer,
};

/// Processor settings.
#[derive(Clone, Debug)]
pub struct ProcessOptions {
    /// Topic to read.
    pub input: String,
    /// Topic to write.
    pub output: String,
    /// Consumer group whose offsets the transactions commit.
    pub group: String,
    /// Transactional id (one per processor; a replacement uses the same one).
    pub transactional_id: String,
    /// Largest number of input records per transaction.
    pub max_records_per_txn: usize,
    /// Stop once the input has been idle (and fully processed) this long. `None`: run until
    /// `stop` resolves.
    pub stop_when_idle: Option<Duration>,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        Self {
            input: "input".into(),
            output: "output".into(),
            group: "processor".into(),
            transactional_id: "processor-1".into(),
            max_records_per_txn: 500,
            stop_when_idle: None,
        }
    }
}

/// What a processor run did. Its JSON keys are the ones `produce --json` uses for the same
/// things (`records_committed`, `transactions_aborted`, `producer_epoch`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ProcessStats {
    /// Committed transactions.
    pub transactions: u64,
    /// Input records whose output was committed.
    #[serde(rename = "records_committed")]
    pub records: u64,
    /// Aborted rounds.
    #[serde(rename = "transactions_aborted")]
    pub aborted: u64,
    /// (PID, epoch) after the last commit.
    pub producer_id: i64,
    /// See `producer_id`.
    #[serde(rename = "producer_epoch")]
    pub epoch: i16,
}

/// The transformation: `processed(<value>)`, keeping the key.
pub fn transform(record: &ConsumerRecord) -> Vec<u8> {
    let mut out = b"processed(".to_vec();
    out.extend_from_slice(&record.value);
    out.push(b')');
    out
}

/// Runs the processor until `stop` resolves (or the input is idle, see
/// [`ProcessOptions::stop_when_idle`]). `progress` is called after every commit.
pub async fn run(
    config: ClientConfig,
    options: ProcessOptions,
    stop: impl Future<Output = ()>,
    mut progress: impl FnMut(&ProcessStats),
) -> anyhow::Result<ProcessStats> {
    tokio::pin!(stop);
    let mut producer = TransactionalProducer::connect(
        config
            .clone()
            .with_transactional_id(&options.transactional_id),
    )
    .await?;
    // Fence the previous instance first: once this returns, its last transaction is complete
    // (committed or aborted), so the group's committed offsets below are final.
    producer.init_transactions().await?;
    let mut consumer = Consumer::new(config, Isolation::ReadCommitted)?;
    // Fetch about one transaction's worth per partition, not a megabyte that is mostly rewound.
    consumer.set_max_bytes(64 * 1024);
    consumer.assign_topics(&[&options.input]).await?;
    consumer.seek_to_committed(&options.group).await?;
    tracing::info!(txn_id = %options.transactional_id, pid = producer.producer_id(),
        epoch = producer.epoch(), positions = ?consumer.positions(), "processor started");

    let mut stats = ProcessStats {
        producer_id: producer.producer_id(),
        epoch: producer.epoch(),
        ..ProcessStats::default()
    };
    let mut idle_since = Instant::now();
    loop {
        let records = tokio::select! {
            _ = &mut stop => return Ok(stats),
            r = consumer.poll(Duration::from_millis(100)) => r?,
        };
        if records.is_empty() {
            if let Some(idle) = options.stop_when_idle {
                if idle_since.elapsed() >= idle && consumer.caught_up() {
                    return Ok(stats);
                }
            }
            continue;
        }
        idle_since = Instant::now();
        // Bound the transaction: process a prefix, rewind the rest.
        let mut records = records;
        if records.len() > options.max_records_per_txn {
            let rest = records.split_off(options.max_records_per_txn);
            let mut rewind: BTreeMap<TopicPartition, i64> = BTreeMap::new();
            for r in &rest {
                let o = rewind.entry(r.partition.clone()).or_insert(r.offset);
                *o = (*o).min(r.offset);
            }
            for (tp, offset) in rewind {
                consumer.seek(&tp, offset)?;
            }
        }
        let count = records.len() as u64;
        match process_round(&mut producer, &options, records).await {
            Ok(()) => {
                stats.transactions += 1;
                stats.records += count;
                stats.producer_id = producer.producer_id();
                stats.epoch = producer.epoch();
                progress(&stats);
            }
            Err(e) if e.is_abortable() => {
                tracing::warn!(error = %e, "round failed; aborting and rewinding");
                producer.abort_transaction().await?;
                stats.aborted += 1;
                consumer.seek_to_committed(&options.group).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn process_round(
    producer: &mut TransactionalProducer,
    options: &ProcessOptions,
    records: Vec<ConsumerRecord>,
) -> Result<(), producer_client::Error> {
    producer.begin_transaction()?;
    let mut by_partition: BTreeMap<i32, Vec<Vec<u8>>> = BTreeMap::new();
    let mut offsets: BTreeMap<TopicPartition, i64> = BTreeMap::new();
    for r in &records {
        by_partition
            .entry(r.partition.partition)
            .or_default()
            .push(transform(r));
        let next = offsets.entry(r.partition.clone()).or_insert(0);
        *next = (*next).max(r.offset + 1);
    }
    for (partition, values) in by_partition {
        producer
            .send_batch(&options.output, partition, values)
            .await?;
    }
    producer
        .send_offsets_to_transaction(&offsets, &options.group)
        .await?;
    producer.commit_transaction().await
}
