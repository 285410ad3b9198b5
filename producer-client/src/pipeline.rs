//! The producer pipeline's shell: the task that closes batches, sends them and hands the
//! leaders' answers to the [`Accumulator`] core, plus `buffer.memory` and the delivery futures.
//!
//! `append` waits for room in `buffer.memory` (a semaphore of bytes; at most `max.block.ms`),
//! appends under a short lock and returns a [`DeliveryFuture`] at once. One background task per
//! producer (the *sender*, like Kafka's sender thread) wakes on new records, on answers and on
//! the core's next deadline (a linger or a backoff ending, a delivery timeout), asks the core
//! which batches to close and send, and sends them: the batches bound for one leader travel in
//! one ProducePartitions request (up to `max.request.size` of records; one partition's batches in
//! sequence order, which the leader keeps), like the partitions of Kafka's Produce request. Each
//! batch's answer goes straight back into the core under the lock; the lock is never held across
//! an `.await`.
//!
//! For an idempotent producer the sender also gets the new (PID, epoch) when the core asks for
//! one (InitProducerId without a transactional id) and resets the core with it.
//!
//! CAVEATS: the sender task ends when the producer is dropped, and records still pending then
//! resolve with an error. A leader without ProducePartitions (none of this workspace) is not
//! served by a per-batch fallback.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use cluster::TopicPartition;
use proto::{ProducePartitionsRequest, ProduceRequest, ProduceResponse, Record};
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};

use crate::accumulator::{record_size, Accumulator, Completion, Mode, Outbound, Settings};
use crate::config::ClientConfig;
use crate::error::{Error, Result, WireError};
use crate::net::Connections;
use crate::produce::{self, RecordMetadata};

/// Resolves to where the record landed, or why it did not.
///
/// Returned by `send`; await it (or drop it: the record is sent either way).
#[derive(Debug)]
#[must_use = "a delivery future tells whether the record was written"]
pub struct DeliveryFuture {
    rx: oneshot::Receiver<Result<RecordMetadata>>,
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(Error::IllegalState(
                    "the producer was dropped before the record was acknowledged".into(),
                ))
            })
        })
    }
}

/// One record's stake in the pipeline: where to send its outcome, and its share of
/// `buffer.memory` (released when the waiter is dropped, i.e. once the outcome is known).
#[derive(Debug)]
pub(crate) struct Waiter {
    tx: oneshot::Sender<Result<RecordMetadata>>,
    _memory: OwnedSemaphorePermit,
}

#[derive(Debug)]
struct Shared {
    core: Mutex<Accumulator<Waiter>>,
    /// Wakes the sender task.
    wake: Notify,
    /// Something finished (flush waits on it).
    changed: Notify,
    closed: AtomicBool,
    memory: Arc<Semaphore>,
    conn: Connections,
    transactional_id: Option<String>,
    mode: Mode,
}

impl Shared {
    fn core(&self) -> MutexGuard<'_, Accumulator<Waiter>> {
        self.core.lock().expect("accumulator poisoned")
    }

    fn resolve(&self, done: Vec<Completion<Waiter>>) {
        if done.is_empty() {
            return;
        }
        for completion in done {
            match completion {
                Completion::Delivered {
                    partition,
                    base_offset,
                    duplicate,
                    waiters,
                } => {
                    for (i, w) in waiters.into_iter().enumerate() {
                        let _ = w.tx.send(Ok(RecordMetadata {
                            partition: partition.clone(),
                            offset: base_offset + i as i64,
                            duplicate,
                        }));
                    }
                }
                Completion::Failed { error, waiters } => {
                    for w in waiters {
                        let _ = w.tx.send(Err(error.clone()));
                    }
                }
            }
        }
        self.changed.notify_waiters();
    }
}

/// A producer's pipeline: accumulator, sender task, memory budget.
#[derive(Debug)]
pub(crate) struct Pipeline {
    shared: Arc<Shared>,
    max_block: Duration,
    buffer_memory: usize,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

impl Pipeline {
    /// Starts the sender task for a producer writing as `producer`.
    pub(crate) fn start(
        conn: Connections,
        mode: Mode,
        producer: (i64, i16),
        transactional_id: Option<String>,
    ) -> Self {
        let config: &ClientConfig = conn.config();
        let settings = Settings {
            batch_size: config.batch_size,
            linger: config.linger,
            max_in_flight: config.max_in_flight_requests_per_connection,
            delivery_timeout: config.delivery_timeout,
            retry_backoff: config.retry_backoff.max(Duration::from_millis(1)),
            retry_backoff_max: config.retry_backoff_max.max(config.retry_backoff),
        };
        let (max_block, buffer_memory) = (config.max_block, config.buffer_memory);
        let shared = Arc::new(Shared {
            core: Mutex::new(Accumulator::new(settings, mode, producer)),
            wake: Notify::new(),
            changed: Notify::new(),
            closed: AtomicBool::new(false),
            memory: Arc::new(Semaphore::new(buffer_memory)),
            conn,
            transactional_id,
            mode,
        });
        tokio::spawn(sender(shared.clone()));
        Self {
            shared,
            max_block,
            buffer_memory,
        }
    }

    /// The (PID, epoch) new batches get.
    pub(crate) fn producer(&self) -> (i64, i16) {
        self.shared.core().producer()
    }

    /// The error that failed the transaction, if one did.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.shared.core().failure().cloned()
    }

    /// Appends a record for `partition`: waits for `buffer.memory` (up to `max.block.ms`), then
    /// returns at once.
    pub(crate) async fn append(
        &self,
        partition: TopicPartition,
        record: Record,
    ) -> Result<DeliveryFuture> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let size = record_size(&record);
        if size > self.buffer_memory {
            return Err(Error::Server {
                code: proto::ErrorCode::MessageTooLarge,
                message: format!(
                    "a record of {size} bytes does not fit in buffer.memory ({} bytes)",
                    self.buffer_memory
                ),
            });
        }
        let permits = u32::try_from(size).expect("buffer.memory fits in u32");
        let memory = match tokio::time::timeout(
            self.max_block,
            self.shared.memory.clone().acquire_many_owned(permits),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(Error::IllegalState("the producer is closed".into())),
            Err(_) => {
                return Err(Error::Timeout(format!(
                    "waited max.block.ms ({} ms) for {size} bytes of buffer.memory ({} bytes)",
                    self.max_block.as_millis(),
                    self.buffer_memory
                )))
            }
        };
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            tx,
            _memory: memory,
        };
        self.shared
            .core()
            .append(partition, record, waiter, Instant::now())
            .map_err(|(e, _)| e)?;
        self.shared.wake.notify_one();
        Ok(DeliveryFuture { rx })
    }

    /// Closes every open batch and waits until every record is acknowledged or failed, and no
    /// request is in flight.
    pub(crate) async fn flush(&self) {
        self.shared.core().set_flushing(true);
        self.shared.wake.notify_one();
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.shared.core().is_idle() {
                break;
            }
            // The deadline only guards against a missed wake-up; the loop re-checks.
            let _ = tokio::time::timeout(Duration::from_millis(100), changed).await;
        }
        self.shared.core().set_flushing(false);
    }

    /// Fails every pending record with `error` (transactional: and refuses new ones until
    /// [`Pipeline::reset`] or [`Pipeline::clear_failure`]).
    pub(crate) fn fail_all(&self, error: Error) {
        let done = self.shared.core().fail_all(error);
        self.shared.resolve(done);
    }

    /// Adopts a new (PID, epoch): sequences restart at 0.
    pub(crate) fn reset(&self, producer: (i64, i16)) {
        self.shared.core().reset(producer);
        self.shared.changed.notify_waiters();
        self.shared.wake.notify_one();
    }

    /// Accepts records again after a transaction's failure, keeping the (PID, epoch) and the
    /// sequences (nothing may be pending).
    pub(crate) fn clear_failure(&self) {
        let mut core = self.shared.core();
        let producer = core.producer();
        if core.failure().is_some() && core.is_idle() {
            core.reset(producer);
        }
    }
}

/// The sender task: close, expire, send; get a new producer id when the core asks for one.
async fn sender(shared: Arc<Shared>) {
    loop {
        if shared.closed.load(Ordering::SeqCst) {
            let done = shared.core().fail_all(Error::IllegalState(
                "the producer was dropped before the record was acknowledged".into(),
            ));
            shared.resolve(done);
            return;
        }
        let now = Instant::now();
        let (outbound, expired, deadline, new_producer) = {
            let mut core = shared.core();
            core.close_ready(now);
            let expired = core.expire(now);
            let outbound = core.drain(now);
            let new_producer = shared.mode == Mode::Idempotent && core.needs_new_producer();
            (outbound, expired, core.next_deadline(), new_producer)
        };
        shared.resolve(expired);
        if !outbound.is_empty() {
            tokio::spawn(send_batches(shared.clone(), outbound));
        }
        if new_producer {
            match crate::idempotent::init_producer_id(&shared.conn).await {
                Ok(producer) => {
                    tracing::info!(
                        pid = producer.0,
                        epoch = producer.1,
                        "idempotent producer re-initialised after a failed batch"
                    );
                    shared.core().reset(producer);
                    shared.changed.notify_waiters();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "InitProducerId failed; the held records fail");
                    let done = shared.core().fail_all(e);
                    shared.resolve(done);
                    tokio::time::sleep(shared.conn.config().retry_backoff_max).await;
                }
            }
            continue;
        }
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = sleep => {}
        }
    }
}

/// One attempt at each batch: grouped by leader, each group in requests of at most
/// `max.request.size` (in drain order, so one partition's batches keep their sequence order).
async fn send_batches(shared: Arc<Shared>, batches: Vec<Outbound>) {
    let conn = &shared.conn;
    let mut by_leader: Vec<(String, Vec<Outbound>)> = Vec::new();
    for batch in batches {
        match conn
            .leader_for(&batch.partition.topic, batch.partition.partition)
            .await
        {
            Ok(leader) => match by_leader.iter_mut().find(|(a, _)| *a == leader.address) {
                Some((_, group)) => group.push(batch),
                None => by_leader.push((leader.address, vec![batch])),
            },
            Err(e) => answer(&shared, &batch, batch.records.len(), Err(e)),
        }
    }
    let limit = conn.config().max_request_size;
    for (address, group) in by_leader {
        let mut request: Vec<Outbound> = Vec::new();
        let mut bytes = 0;
        for batch in group {
            let size: usize = batch.records.iter().map(record_size).sum();
            if !request.is_empty() && bytes + size > limit {
                tokio::spawn(send_request(
                    shared.clone(),
                    address.clone(),
                    std::mem::take(&mut request),
                ));
                bytes = 0;
            }
            bytes += size;
            request.push(batch);
        }
        tokio::spawn(send_request(shared.clone(), address, request));
    }
}

/// One ProducePartitions request to the leader at `address`; each batch's answer goes back
/// into the core (a failed request fails every batch it carried, each retried by the core).
async fn send_request(shared: Arc<Shared>, address: String, mut batches: Vec<Outbound>) {
    let counts: Vec<usize> = batches.iter().map(|b| b.records.len()).collect();
    // The records move into the request (the core keeps its own copy for a retry).
    let entries = batches
        .iter_mut()
        .map(|b| ProduceRequest {
            topic: b.partition.topic.clone(),
            partition: b.partition.partition,
            batch: Some(produce::batch(
                b.producer,
                b.base_sequence,
                shared.transactional_id.as_deref(),
                std::mem::take(&mut b.records),
            )),
        })
        .collect();
    let conn = &shared.conn;
    let result = async {
        let mut client = conn.leader(&address)?;
        let request = ProducePartitionsRequest {
            partitions: entries,
        };
        let r = conn
            .rpc(&address, Duration::ZERO, client.produce_partitions(request))
            .await?;
        if r.responses.len() != batches.len() {
            return Err(Error::Transport {
                address: address.clone(),
                message: format!(
                    "answered {} of {} batches",
                    r.responses.len(),
                    batches.len()
                ),
            });
        }
        Ok(r.responses)
    }
    .await;
    match result {
        Ok(responses) => {
            for ((batch, count), response) in batches.iter().zip(counts).zip(responses) {
                answer(&shared, batch, count, response.checked());
            }
        }
        Err(e) => {
            for (batch, count) in batches.iter().zip(counts) {
                answer(&shared, batch, count, Err(e.clone()));
            }
        }
    }
}

/// Hands one batch's answer to the core and wakes whoever waits on it.
fn answer(shared: &Shared, batch: &Outbound, count: usize, result: Result<ProduceResponse>) {
    let (partition, producer, seq) = (&batch.partition, batch.producer, batch.base_sequence);
    match &result {
        Ok(r) => tracing::debug!(%partition, pid = producer.0, epoch = producer.1, seq, count,
            offset = r.base_offset, duplicate = r.duplicate, "produced"),
        Err(e) => {
            if matches!(e, Error::NotLeader(_)) {
                shared.conn.invalidate_metadata();
            }
            tracing::debug!(%partition, pid = producer.0, epoch = producer.1, seq, count,
                error = %e, "produce failed");
        }
    }
    let done = shared.core().on_response(
        partition,
        batch.id,
        result.map(|r| (r.base_offset, r.duplicate)),
        Instant::now(),
    );
    shared.resolve(done);
    shared.changed.notify_waiters();
    shared.wake.notify_one();
}
