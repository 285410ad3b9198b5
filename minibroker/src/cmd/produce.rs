//! `minibroker produce`: writes `--records` generated values, or the lines of stdin (`--stdin`,
//! `KEY<sep>VALUE` with `--key-separator`, as kcat's `-K` and the console producer's
//! `parse.key`), with the idempotent producer, or with the transactional one in transactions of
//! `--per-txn` records (aborting every `--abort-every`-th).
//!
//! A transactional producer that fails aborts its transaction, as an application would; for a
//! zombie that abort is what reveals the fence (PRODUCER_FENCED), and the command says so and
//! exits with a failure. Ctrl-C or SIGTERM aborts the open transaction (so read_committed readers
//! are not held back until its timeout), prints the summary and exits 130 / 143.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use producer_client::{Admin, ClientConfig, IdempotentProducer, Target, TransactionalProducer};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

use super::{stop_signal, Stop};

/// How long an interrupted producer waits for its abort to be acknowledged.
const ABORT_ON_STOP: Duration = Duration::from_secs(10);

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
    /// Number of records (generated ones; with --stdin: at most this many, default all).
    #[arg(long)]
    records: Option<u64>,
    /// Read the records from stdin, one per line (instead of generating them).
    #[arg(long)]
    stdin: bool,
    /// With --stdin: split each line at the first SEP into key and value (a line without SEP
    /// is a value without a key). Keyed records go to the partition their key hashes to.
    #[arg(long, value_name = "SEP", requires = "stdin")]
    key_separator: Option<String>,
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

/// Default `--records` when they are generated.
const DEFAULT_RECORDS: u64 = 10;

/// What to write: generated values, or stdin's lines.
struct Workload<'a> {
    args: &'a ProduceArgs,
    partitions: i32,
    started: Instant,
    stdin: Option<tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>>,
}

impl Workload<'_> {
    /// How many records at most.
    fn limit(&self) -> u64 {
        match (self.args.records, self.stdin.is_some()) {
            (Some(n), _) => n,
            (None, true) => u64::MAX,
            (None, false) => DEFAULT_RECORDS,
        }
    }

    /// Record `n`: where it goes and its value; `None` when there are no more.
    async fn next(&mut self, n: u64) -> anyhow::Result<Option<(Target, Vec<u8>)>> {
        if n >= self.limit() {
            return Ok(None);
        }
        let Some(lines) = &mut self.stdin else {
            return Ok(Some((self.partition_of(n).into(), self.value(n))));
        };
        let Some(line) = lines.next_line().await.context("reading stdin")? else {
            return Ok(None);
        };
        let keyed = self
            .args
            .key_separator
            .as_deref()
            .and_then(|sep| line.split_once(sep));
        Ok(Some(match (keyed, self.args.partition) {
            (Some((key, value)), None) => (Target::Key(key.into()), value.into()),
            (Some((key, value)), Some(p)) => {
                (Target::PartitionWithKey(p, key.into()), value.into())
            }
            (None, _) => (self.partition_of(n).into(), line.into_bytes()),
        }))
    }

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
        .ok_or_else(|| producer_client::Error::Server {
            code: proto::ErrorCode::UnknownTopicOrPartition,
            message: format!("topic {} does not exist", args.topic),
        })?;
    let mut work = Workload {
        args: &args,
        partitions,
        started: Instant::now(),
        stdin: args
            .stdin
            .then(|| tokio::io::BufReader::new(tokio::io::stdin()).lines()),
    };
    let mut tally = Tally::new(work.limit(), json || args.stdin);
    let outcome = match &args.transactional_id {
        None => idempotent(config, &mut work, &mut tally).await?,
        Some(id) => {
            let config = config.with_transactional_id(id);
            transactional(config, id, &mut work, &mut tally, json).await?
        }
    };
    match outcome {
        Outcome::Done(pid, epoch) => {
            print_summary(&args, &tally, pid, epoch, None, json);
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Stopped(signal, pid, epoch) => {
            print_summary(&args, &tally, pid, epoch, Some(signal), json);
            Ok(signal.exit_code())
        }
        Outcome::Failed => Ok(ExitCode::FAILURE),
    }
}

/// How a run ended.
enum Outcome {
    /// Every record written; the producer's (PID, epoch).
    Done(i64, i16),
    /// A signal stopped it (the open transaction aborted).
    Stopped(Stop, i64, i16),
    /// A failure, already reported.
    Failed,
}

/// Every record with the idempotent producer; a signal stops it after what was sent is
/// delivered.
async fn idempotent(
    config: ClientConfig,
    work: &mut Workload<'_>,
    tally: &mut Tally,
) -> anyhow::Result<Outcome> {
    let mut producer = IdempotentProducer::connect(config).await?;
    let stop = stop_signal();
    tokio::pin!(stop);
    // send() returns at once; the pipeline batches and keeps requests in flight. Deliveries
    // are collected as they complete, in any order, so what stays outstanding is only what the
    // producer still holds (its buffer.memory and the requests in flight): checking them in
    // order would also keep every completed delivery queued behind a slow partition's, memory
    // the producer's bound does not cover. At most `WINDOW` outstanding.
    const WINDOW: usize = 100_000;
    let mut pending = FuturesUnordered::new();
    let mut stopped = None;
    let mut n = 0;
    loop {
        let next = tokio::select! {
            signal = &mut stop => {
                stopped = Some(signal);
                break;
            }
            next = async {
                work.pace(n).await;
                work.next(n).await
            } => next?,
        };
        let Some((target, value)) = next else { break };
        n += 1;
        pending.push(producer.send(&work.args.topic, target, value).await?);
        while let Some(Some(delivered)) = pending.next().now_or_never() {
            delivered?;
            tally.committed += 1;
            tally.progress(tally.committed);
        }
        while pending.len() > WINDOW {
            pending.next().await.expect("non-empty")?;
            tally.committed += 1;
            tally.progress(tally.committed);
        }
    }
    producer.flush().await?;
    while let Some(delivered) = pending.next().await {
        delivered?;
        tally.committed += 1;
        tally.progress(tally.committed);
    }
    let (pid, epoch) = (producer.producer_id(), producer.epoch());
    Ok(match stopped {
        Some(signal) => Outcome::Stopped(signal, pid, epoch),
        None => Outcome::Done(pid, epoch),
    })
}

/// The records in transactions; a signal aborts the open transaction.
async fn transactional(
    config: ClientConfig,
    id: &str,
    work: &mut Workload<'_>,
    tally: &mut Tally,
    json: bool,
) -> anyhow::Result<Outcome> {
    let mut producer = TransactionalProducer::connect(config).await?;
    producer.init_transactions().await?;
    if !json {
        eprintln!(
            "initialised {id}: PID {} epoch {}",
            producer.producer_id(),
            producer.epoch()
        );
    }
    let stop = stop_signal();
    tokio::pin!(stop);
    let result = tokio::select! {
        signal = &mut stop => Err(signal),
        r = transactions(&mut producer, work, tally) => Ok(r),
    };
    match result {
        Ok(Ok(())) => Ok(Outcome::Done(producer.producer_id(), producer.epoch())),
        Ok(Err(TxnFailure::Input(e))) => {
            abort_on_stop(&mut producer, id).await;
            Err(e)
        }
        Ok(Err(TxnFailure::Client(error))) => {
            report_failure(&mut producer, id, error, work.args, tally, json).await;
            Ok(Outcome::Failed)
        }
        Err(signal) => {
            // The transaction's future was dropped mid-way: what it sent is in flight or in
            // the log, and aborting at the coordinator makes all of it invisible at once.
            abort_on_stop(&mut producer, id).await;
            Ok(Outcome::Stopped(
                signal,
                producer.producer_id(),
                producer.epoch(),
            ))
        }
    }
}

/// Aborts the open transaction (if any) on the way out, bounded by [`ABORT_ON_STOP`], and says
/// what happened on stderr.
async fn abort_on_stop(producer: &mut TransactionalProducer, id: &str) {
    if !producer.in_transaction() {
        return;
    }
    // A second ctrl-c (or SIGTERM) stops waiting: the coordinator's timeout ends it then.
    let aborted = tokio::select! {
        r = tokio::time::timeout(ABORT_ON_STOP, producer.abort_transaction()) => Some(r),
        _ = stop_signal() => None,
    };
    match aborted {
        Some(Ok(Ok(()))) => eprintln!("{id}: the open transaction was aborted"),
        Some(Ok(Err(e))) => eprintln!("{id}: aborting the open transaction failed: {e}"),
        Some(Err(_)) => eprintln!(
            "{id}: the abort was not acknowledged within {}s; the coordinator aborts the transaction at its timeout",
            ABORT_ON_STOP.as_secs()
        ),
        None => eprintln!(
            "{id}: stopped again; not waiting for the abort (the coordinator aborts the transaction at its timeout)"
        ),
    }
}

/// Why [`transactions`] stopped early.
enum TxnFailure {
    /// The client library failed (reported as a transaction failure).
    Client(producer_client::Error),
    /// Reading the input failed.
    Input(anyhow::Error),
}

impl From<producer_client::Error> for TxnFailure {
    fn from(e: producer_client::Error) -> Self {
        Self::Client(e)
    }
}

/// Begin, send `--per-txn` records, commit (or abort every `--abort-every`-th), until done.
async fn transactions(
    producer: &mut TransactionalProducer,
    work: &mut Workload<'_>,
    tally: &mut Tally,
) -> Result<(), TxnFailure> {
    let args = work.args;
    let per_txn = args.per_txn.max(1);
    let mut n = 0;
    loop {
        work.pace(n).await;
        let Some(mut record) = work.next(n).await.map_err(TxnFailure::Input)? else {
            return Ok(());
        };
        tally.txns += 1;
        producer.begin_transaction()?;
        let first = n;
        let mut deliveries = Vec::new();
        loop {
            let (target, value) = record;
            deliveries.push(producer.send(&args.topic, target, value).await?);
            n += 1;
            if n - first >= per_txn {
                break;
            }
            work.pace(n).await;
            match work.next(n).await.map_err(TxnFailure::Input)? {
                Some(next) => record = next,
                None => break,
            }
        }
        let end = n;
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
            tally.aborted += end - first;
            tally.aborted_txns += 1;
        } else {
            producer.commit_transaction().await?;
            tally.committed += end - first;
        }
        tally.progress(n);
    }
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
    // Short on purpose: who, what, and the code; the details are in the debug log.
    let sentence = if fenced {
        format!(
            "{id} was fenced by a newer instance ({}); this one held PID {pid} epoch {epoch}, nothing more was committed",
            error.code_name()
        )
    } else {
        format!("{id}: the transaction failed and was aborted: {first}")
    };
    tracing::debug!(%id, first = %first, last = %error, "transactional producer stopped");
    if json {
        minibroker::outln!(
            "{}",
            json!({"topic": args.topic, "transactional": true,
                "records_committed": tally.committed, "records_aborted": tally.aborted,
                "transactions": tally.txns, "transactions_aborted": tally.aborted_txns,
                "producer_id": pid,
                "producer_epoch": epoch,
                "error": error.code_name(), "message": sentence, "fenced": fenced,
                "seconds": tally.started.elapsed().as_secs_f64()})
        );
    }
    eprintln!("error: {sentence}");
}

/// The summary of a run that finished.
fn print_summary(
    args: &ProduceArgs,
    tally: &Tally,
    pid: i64,
    epoch: i16,
    stopped: Option<Stop>,
    json: bool,
) {
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
                "producer_id": pid, "producer_epoch": epoch, "seconds": seconds,
                "stopped_by": stopped.map(Stop::name)})
        );
        return;
    }
    if let Some(signal) = stopped {
        eprintln!("{}: stopped before the last record", signal.name());
    }
    if args.transactional_id.is_some() {
        minibroker::outln!(
            "{committed} records committed, {aborted} aborted, in {txns} transactions ({aborted_txns} aborted); PID {pid} epoch {epoch}; {seconds:.2}s"
        );
    } else {
        minibroker::outln!("{committed} records written idempotently; PID {pid}; {seconds:.2}s");
    }
}
