//! `minibroker produce`: writes `--records` values with the idempotent producer, or with the
//! transactional one in transactions of `--per-txn` records (aborting every `--abort-every`-th).
//! A transactional producer that fails aborts its transaction, as an application would; for a
//! zombie that abort is what reveals the fence (PRODUCER_FENCED), and the command says so and
//! exits with a failure.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use producer_client::{Admin, ClientConfig, IdempotentProducer, TransactionalProducer};
use serde_json::json;

/// Arguments of `produce`.
#[derive(Args, Debug)]
pub struct ProduceArgs {
    /// Topic to write.
    #[arg(long, default_value = "input")]
    topic: String,
    /// Transactional id (transactional producer). Without it, --idempotent is implied.
    #[arg(long, conflicts_with = "idempotent")]
    transactional_id: Option<String>,
    /// Use the idempotent (non-transactional) producer.
    #[arg(long)]
    idempotent: bool,
    /// Number of records.
    #[arg(long, default_value_t = 10)]
    records: u64,
    /// Records per transaction.
    #[arg(long, default_value_t = 10)]
    per_txn: u64,
    /// Abort every K-th transaction instead of committing it (0: never).
    #[arg(long, default_value_t = 0)]
    abort_every: u64,
    /// Write every record to this partition (default: round robin).
    #[arg(long)]
    partition: Option<i32>,
    /// Value prefix; values are `<prefix>-<n>`.
    #[arg(long, default_value = "record")]
    value_prefix: String,
    /// Pad values to this many bytes.
    #[arg(long, default_value_t = 0)]
    size: usize,
    /// A producer setting by its Kafka name, e.g. `linger.ms=5`, `batch.size=131072`,
    /// `max.in.flight.requests.per.connection=5`, `buffer.memory=33554432` (repeatable).
    #[arg(long = "producer-property", value_name = "NAME=VALUE")]
    producer_property: Vec<String>,
    /// Send at most this many records per second (default: as fast as the producer goes).
    #[arg(long, value_name = "RECORDS_PER_SEC")]
    throughput: Option<f64>,
}

/// What to write: record `n`'s value and partition.
struct Workload<'a> {
    args: &'a ProduceArgs,
    partitions: i32,
    started: Instant,
}

impl Workload<'_> {
    fn value(&self, n: u64) -> Vec<u8> {
        let mut v = format!("{}-{n}", self.args.value_prefix).into_bytes();
        if v.len() < self.args.size {
            v.resize(self.args.size, b'.');
        }
        v
    }

    /// With `--throughput`, waits until record `n` is due (as kafka-producer-perf-test paces).
    async fn pace(&self, n: u64) {
        if let Some(rate) = self.args.throughput.filter(|r| *r > 0.0) {
            let due = self.started + Duration::from_secs_f64(n as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
    }

    fn partition_of(&self, n: u64) -> i32 {
        self.args
            .partition
            .unwrap_or((n % self.partitions as u64) as i32)
    }
}

/// What was written so far, and the progress line on stderr (once a second, text mode only).
struct Tally {
    committed: u64,
    aborted: u64,
    txns: u64,
    aborted_txns: u64,
    started: Instant,
    last_progress: Instant,
    total: u64,
    quiet: bool,
}

impl Tally {
    fn new(total: u64, quiet: bool) -> Self {
        Self {
            committed: 0,
            aborted: 0,
            txns: 0,
            aborted_txns: 0,
            started: Instant::now(),
            last_progress: Instant::now(),
            total,
            quiet,
        }
    }

    fn progress(&mut self, done: u64) {
        if !self.quiet && self.last_progress.elapsed() >= Duration::from_secs(1) {
            self.last_progress = Instant::now();
            eprintln!(
                "produced {done}/{} records ({:.0}/s)",
                self.total,
                done as f64 / self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// Produces the records and prints the summary; a fenced or failed transactional producer
/// exits with a failure after saying why.
pub async fn run(config: ClientConfig, args: ProduceArgs, json: bool) -> anyhow::Result<ExitCode> {
    let mut config = config;
    for property in &args.producer_property {
        let (name, value) = property
            .split_once('=')
            .with_context(|| format!("--producer-property {property:?} is not NAME=VALUE"))?;
        config = config.set(name.trim(), value)?;
    }
    let admin = Admin::new(config.clone())?;
    let partitions = admin
        .metadata()
        .await?
        .partition_count(&args.topic)
        .with_context(|| format!("topic {} does not exist", args.topic))?;
    let work = Workload {
        args: &args,
        partitions,
        started: Instant::now(),
    };
    let mut tally = Tally::new(args.records, json);
    let (pid, epoch) = match &args.transactional_id {
        None => idempotent(config, &work, &mut tally).await?,
        Some(id) => {
            let config = config.with_transactional_id(id);
            match transactional(config, id, &work, &mut tally, json).await? {
                Some(pair) => pair,
                None => return Ok(ExitCode::FAILURE),
            }
        }
    };
    print_summary(&args, &tally, pid, epoch, json);
    Ok(ExitCode::SUCCESS)
}

/// Every record with the idempotent producer; returns its (PID, epoch).
async fn idempotent(
    config: ClientConfig,
    work: &Workload<'_>,
    tally: &mut Tally,
) -> anyhow::Result<(i64, i16)> {
    let mut producer = IdempotentProducer::connect(config).await?;
    // send() returns at once; the pipeline batches and keeps requests in flight. The
    // deliveries are checked in order, keeping at most `WINDOW` outstanding.
    const WINDOW: usize = 100_000;
    let mut pending = std::collections::VecDeque::new();
    for n in 0..work.args.records {
        work.pace(n).await;
        pending.push_back(
            producer
                .send(&work.args.topic, work.partition_of(n), work.value(n))
                .await?,
        );
        while pending.len() > WINDOW {
            pending.pop_front().expect("non-empty").await?;
            tally.committed += 1;
            tally.progress(tally.committed);
        }
    }
    producer.flush().await?;
    for delivery in pending {
        delivery.await?;
        tally.committed += 1;
        tally.progress(tally.committed);
    }
    Ok((producer.producer_id(), producer.epoch()))
}

/// The records in transactions; returns the (PID, epoch), or `None` once a failure was
/// reported.
async fn transactional(
    config: ClientConfig,
    id: &str,
    work: &Workload<'_>,
    tally: &mut Tally,
    json: bool,
) -> anyhow::Result<Option<(i64, i16)>> {
    let mut producer = TransactionalProducer::connect(config).await?;
    producer.init_transactions().await?;
    if !json {
        eprintln!(
            "initialised {id}: PID {} epoch {}",
            producer.producer_id(),
            producer.epoch()
        );
    }
    if let Err(error) = transactions(&mut producer, work, tally).await {
        report_failure(&mut producer, id, error, work.args, tally, json).await;
        return Ok(None);
    }
    Ok(Some((producer.producer_id(), producer.epoch())))
}

/// Begin, send `--per-txn` records, commit (or abort every `--abort-every`-th), until done.
async fn transactions(
    producer: &mut TransactionalProducer,
    work: &Workload<'_>,
    tally: &mut Tally,
) -> Result<(), producer_client::Error> {
    let args = work.args;
    let per_txn = args.per_txn.max(1);
    let mut n = 0;
    while n < args.records {
        tally.txns += 1;
        producer.begin_transaction()?;
        let end = (n + per_txn).min(args.records);
        let mut deliveries = Vec::new();
        for i in n..end {
            work.pace(i).await;
            deliveries.push(
                producer
                    .send(&args.topic, work.partition_of(i), work.value(i))
                    .await?,
            );
        }
        // Every record is written before the decision, so an aborted transaction's records
        // are in the log (and hidden from read_committed readers).
        producer.flush().await?;
        for delivery in deliveries {
            delivery.await?;
        }
        // `is_multiple_of` is newer than the workspace's rust-version (1.85).
        #[allow(clippy::manual_is_multiple_of)]
        let abort = args.abort_every > 0 && tally.txns % args.abort_every == 0;
        if abort {
            producer.abort_transaction().await?;
            tally.aborted += end - n;
            tally.aborted_txns += 1;
        } else {
            producer.commit_transaction().await?;
            tally.committed += end - n;
        }
        n = end;
        tally.progress(n);
    }
    Ok(())
}

/// What an application does with a failed transaction: abort it. For a zombie (its epoch is
/// older than the current one) the abort is what reveals the fence: the coordinator answers
/// PRODUCER_FENCED. Then one sentence on stderr (and the summary as JSON if asked).
async fn report_failure(
    producer: &mut TransactionalProducer,
    id: &str,
    error: producer_client::Error,
    args: &ProduceArgs,
    tally: &Tally,
    json: bool,
) {
    let first = error.to_string();
    let error = if error.is_abortable() {
        match producer.abort_transaction().await {
            Err(abort_error) if abort_error.is_fatal() => abort_error,
            _ => error,
        }
    } else {
        error
    };
    let fenced = error.is_fatal();
    let (pid, epoch) = (producer.producer_id(), producer.epoch());
    let sentence = match (fenced, first == error.to_string()) {
        (true, true) => format!(
            "{id} was fenced by a newer instance (PID {pid} epoch {epoch} is stale): {error}; stopping without committing"
        ),
        (true, false) => format!(
            "{id} was fenced by a newer instance (PID {pid} epoch {epoch} is stale): {first}; the abort that followed got {error}; stopping without committing"
        ),
        (false, _) => format!("{id}: the transaction failed and was aborted: {first}"),
    };
    if json {
        minibroker::outln!(
            "{}",
            json!({"topic": args.topic, "transactional": true,
                "records_committed": tally.committed, "records_aborted": tally.aborted,
                "transactions": tally.txns, "transactions_aborted": tally.aborted_txns,
                "producer_id": pid,
                "producer_epoch": epoch,
                "error": error.code_name(), "fenced": fenced,
                "seconds": tally.started.elapsed().as_secs_f64()})
        );
    }
    eprintln!("error: {sentence}");
}

/// The summary of a run that finished.
fn print_summary(args: &ProduceArgs, tally: &Tally, pid: i64, epoch: i16, json: bool) {
    let seconds = tally.started.elapsed().as_secs_f64();
    let Tally {
        committed,
        aborted,
        txns,
        aborted_txns,
        ..
    } = *tally;
    if json {
        minibroker::outln!(
            "{}",
            json!({"topic": args.topic, "transactional": args.transactional_id.is_some(),
                "records_committed": committed, "records_aborted": aborted,
                "transactions": txns, "transactions_aborted": aborted_txns,
                "producer_id": pid, "producer_epoch": epoch, "seconds": seconds})
        );
    } else if args.transactional_id.is_some() {
        minibroker::outln!(
            "{committed} records committed, {aborted} aborted, in {txns} transactions ({aborted_txns} aborted); PID {pid} epoch {epoch}; {seconds:.2}s"
        );
    } else {
        minibroker::outln!("{committed} records written idempotently; PID {pid}; {seconds:.2}s");
    }
}
