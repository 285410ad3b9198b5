//! The producer pipeline's pure core: per-partition record accumulators, batch closing,
//! sequence numbers, in-flight bookkeeping and the retry/fail decisions (no tokio, no tonic).
//!
//! # How a record travels
//!
//! 1. [`Accumulator::append`] puts the record in its partition's *open* batch. The open batch
//!    has no sequence yet.
//! 2. The batch *closes* when it reaches `batch.size` bytes, when it is `linger.ms` old, or when
//!    a flush asks for it ([`Accumulator::close_ready`]). Closing assigns the batch its
//!    producer (PID, epoch) and base sequence, and moves it to the partition's queue; sequences
//!    are therefore in queue order and never change while the batch can still be appended.
//! 3. [`Accumulator::drain`] hands out queued batches in sequence order while the partition has
//!    fewer than `max.in.flight.requests.per.connection` requests outstanding. Each one records
//!    whether a lower sequence of the partition was still unacknowledged when it was sent.
//! 4. [`Accumulator::on_response`] decides what the leader's answer means (the core decides,
//!    the shell delivers):
//!    - success (or a duplicate of an appended batch): deliver;
//!    - a retriable error (transport, NOT_LEADER...): queue the batch again, *in sequence
//!      order*, behind a backoff; the leader's last-five-batches window recognises any batch
//!      that was in fact appended, so a retry never duplicates;
//!    - OUT_OF_ORDER_SEQUENCE_NUMBER / UNKNOWN_PRODUCER_ID for a batch that was sent while a
//!      lower sequence was still unacknowledged: that lower batch had not reached the leader
//!      yet (requests on one connection may be processed out of order), so it is queued again
//!      like a retriable error;
//!    - idempotent, UNKNOWN_PRODUCER_ID for a batch sent with nothing unacknowledged before it:
//!      the leader forgot the PID's state (it expired after an idle spell), so none of the
//!      partition's batches under that PID was appended; they all wait, as if never sent, for a
//!      new PID and fresh sequences (Kafka's KIP-360) instead of failing;
//!    - anything else, or the same errors for a batch sent with nothing unacknowledged before
//!      it: the batch fails ([`Mode`] says what else fails with it).
//! 5. `delivery.timeout.ms` bounds the whole life of a record ([`Accumulator::expire`], and a
//!    retriable error past the deadline fails the batch).
//!
//! # Failures, by mode
//!
//! - [`Mode::Transactional`]: the first failed batch fails the transaction: every pending
//!   record (open, queued, in flight) resolves with that error, and the accumulator refuses
//!   records until [`Accumulator::reset`] (after the abort). In-flight requests stay tracked,
//!   without their records' waiters, until their answer arrives, so that a flush after a
//!   failure still waits for the network to be quiet.
//! - [`Mode::Idempotent`]: a batch that fails after its sequence was assigned leaves a gap, and a
//!   batch that was sent and failed may or may not have been appended. As Kafka's idempotent
//!   producer does, the failed batch and every batch of that partition that was already sent
//!   fail; the accumulator then holds every batch never sent, waits until nothing is in flight
//!   and no sent batch waits for a retry ([`Accumulator::needs_new_producer`]), and the shell
//!   gets a new (PID, epoch) and calls [`Accumulator::reset`], which gives every batch never
//!   sent a fresh sequence. A failed record may be lost; none is ever duplicated or reordered
//!   within what was acknowledged.
//!
//! Memory (`buffer.memory`) is the shell's business: each record's waiter carries its share of
//! the memory budget, released when the waiter is dropped.
//!
//! CAVEATS: no compression; a record bigger than `batch.size` gets a batch of its own; batches
//! are per partition and the shell sends one Produce per batch (the protocol's Produce names
//! one partition).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use cluster::TopicPartition;
use proto::Record;

use crate::error::Error;

/// What the failure of one batch does to the others (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Inside a transaction: the first failure fails everything pending.
    Transactional,
    /// Idempotent: the failed partition's sent batches fail, then a new (PID, epoch).
    Idempotent,
}

/// The pipeline's settings, named after Kafka's producer configs.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// `batch.size`: a batch closes once it holds this many bytes.
    pub batch_size: usize,
    /// `linger.ms`: a batch closes this long after its first record at the latest.
    pub linger: Duration,
    /// `max.in.flight.requests.per.connection` (per partition here), 1..=5.
    pub max_in_flight: usize,
    /// `delivery.timeout.ms`: the longest a record may wait for its acknowledgement.
    pub delivery_timeout: Duration,
    /// `retry.backoff.ms`: first backoff after a retriable error; doubles per attempt.
    pub retry_backoff: Duration,
    /// `retry.backoff.max.ms`.
    pub retry_backoff_max: Duration,
}

/// A closed batch on its way to a leader: what the shell needs to build one Produce.
#[derive(Clone, Debug)]
pub(crate) struct Outbound {
    /// Identifies the batch in [`Accumulator::on_response`].
    pub id: u64,
    /// Where it goes.
    pub partition: TopicPartition,
    /// (PID, epoch) assigned at close.
    pub producer: (i64, i16),
    /// Base sequence assigned at close.
    pub base_sequence: i32,
    /// The records (a copy: the batch keeps its own for a retry).
    pub records: Vec<Record>,
}

/// A batch's outcome, for the shell to hand to the records' waiters (in record order).
#[derive(Debug)]
pub(crate) enum Completion<W> {
    /// Appended (or recognised as a duplicate of an appended batch) at `base_offset`.
    Delivered {
        /// The partition.
        partition: TopicPartition,
        /// Offset of the first record.
        base_offset: i64,
        /// The leader recognised a retry.
        duplicate: bool,
        /// One per record, in order: record `i` is at `base_offset + i`.
        waiters: Vec<W>,
    },
    /// Failed with `error`.
    Failed {
        /// Why.
        error: Error,
        /// One per record.
        waiters: Vec<W>,
    },
}

#[derive(Debug)]
struct Batch<W> {
    id: u64,
    records: Vec<Record>,
    waiters: Vec<W>,
    bytes: usize,
    created: Instant,
    /// Set at close.
    producer: (i64, i16),
    /// Set at close.
    base_sequence: i32,
    /// Sent at least once: its outcome may be unknown.
    sent: bool,
    attempts: u32,
    /// A lower sequence of the partition was unacknowledged when this batch was last sent.
    sent_behind_unacked: bool,
}

#[derive(Debug)]
struct PartitionQueue<W> {
    open: Option<Batch<W>>,
    /// Closed, not in flight, in sequence order.
    queued: VecDeque<Batch<W>>,
    /// Sent, answer pending, in sequence order.
    in_flight: Vec<Batch<W>>,
    next_sequence: i32,
    /// No send before this instant (backoff after a retriable error).
    retry_at: Option<Instant>,
    /// Idempotent: the (PID, epoch) this partition's leader no longer has state for (it
    /// expired there): none of its batches here can have been appended, so every one that
    /// comes back unanswered or refused goes again under the next PID (see `on_response`).
    lost_producer: Option<(i64, i16)>,
}

impl<W> Default for PartitionQueue<W> {
    fn default() -> Self {
        Self {
            open: None,
            queued: VecDeque::new(),
            in_flight: Vec::new(),
            next_sequence: 0,
            retry_at: None,
            lost_producer: None,
        }
    }
}

impl<W> PartitionQueue<W> {
    fn is_empty(&self) -> bool {
        self.open.is_none() && self.queued.is_empty() && self.in_flight.is_empty()
    }

    /// Queues `batch` again in its sequence order (to be sent again).
    fn requeue(&mut self, batch: Batch<W>) {
        let at = sequence_slot(self.queued.iter(), batch.base_sequence);
        self.queued.insert(at, batch);
    }
}

/// Where a batch starting at `base_sequence` goes among `batches` (in sequence order).
fn sequence_slot<'a, W: 'a>(
    batches: impl ExactSizeIterator<Item = &'a Batch<W>>,
    base_sequence: i32,
) -> usize {
    let len = batches.len();
    batches
        .map(|b| b.base_sequence)
        .position(|s| sequence_before(base_sequence, s))
        .unwrap_or(len)
}

/// `sequence + increment`, wrapping from `i32::MAX` to 0 (Kafka's `incrementSequence`).
pub(crate) fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

/// Bytes a record counts for in `batch.size` and `buffer.memory` (payload plus a fixed
/// per-record overhead).
pub(crate) fn record_size(record: &Record) -> usize {
    record.key.len() + record.value.len() + RECORD_OVERHEAD
}

/// Per-record bookkeeping counted against `batch.size` and `buffer.memory`.
pub(crate) const RECORD_OVERHEAD: usize = 32;

/// Every partition's accumulator, for one producer.
#[derive(Debug)]
pub(crate) struct Accumulator<W> {
    settings: Settings,
    mode: Mode,
    producer: (i64, i16),
    partitions: BTreeMap<TopicPartition, PartitionQueue<W>>,
    next_id: u64,
    /// Close every open batch now (a flush is waiting).
    flushing: bool,
    /// Transactional: the error that failed the transaction (sticky until `reset`).
    failed: Option<Error>,
    /// Idempotent: a batch failed; hold new batches until a new (PID, epoch).
    reset_pending: bool,
}

impl<W> Accumulator<W> {
    /// An empty accumulator writing as `producer`.
    pub(crate) fn new(settings: Settings, mode: Mode, producer: (i64, i16)) -> Self {
        Self {
            settings,
            mode,
            producer,
            partitions: BTreeMap::new(),
            next_id: 0,
            flushing: false,
            failed: None,
            reset_pending: false,
        }
    }

    /// The (PID, epoch) new batches get.
    pub(crate) fn producer(&self) -> (i64, i16) {
        self.producer
    }

    /// The error that failed the transaction, if one did.
    pub(crate) fn failure(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    /// Appends one record to `partition`'s open batch. Refused (record and waiter handed back)
    /// once a transactional accumulator has failed.
    pub(crate) fn append(
        &mut self,
        partition: TopicPartition,
        record: Record,
        waiter: W,
        now: Instant,
    ) -> Result<(), (Error, W)> {
        if let Some(e) = &self.failed {
            return Err((e.clone(), waiter));
        }
        let size = record_size(&record);
        let batch_size = self.settings.batch_size;
        let producer = self.producer;
        let queue = self.partitions.entry(partition).or_default();
        if queue
            .open
            .as_ref()
            .is_some_and(|open| open.bytes + size > batch_size)
        {
            Self::close(queue, producer);
        }
        let open = queue.open.get_or_insert_with(|| {
            self.next_id += 1;
            Batch {
                id: self.next_id,
                records: Vec::new(),
                waiters: Vec::new(),
                bytes: 0,
                created: now,
                producer: (-1, -1),
                base_sequence: -1,
                sent: false,
                attempts: 0,
                sent_behind_unacked: false,
            }
        });
        open.records.push(record);
        open.waiters.push(waiter);
        open.bytes += size;
        if open.bytes >= batch_size {
            Self::close(queue, producer);
        }
        Ok(())
    }

    fn close(queue: &mut PartitionQueue<W>, producer: (i64, i16)) {
        if let Some(mut batch) = queue.open.take() {
            batch.producer = producer;
            batch.base_sequence = queue.next_sequence;
            queue.next_sequence =
                increment_sequence(queue.next_sequence, batch.records.len() as i32);
            queue.queued.push_back(batch);
        }
    }

    /// Asks that every open batch close at once (a flush), or stops asking.
    pub(crate) fn set_flushing(&mut self, flushing: bool) {
        self.flushing = flushing;
    }

    /// Closes the open batches that are `linger.ms` old (all of them while flushing).
    pub(crate) fn close_ready(&mut self, now: Instant) {
        let linger = self.settings.linger;
        let (producer, flushing) = (self.producer, self.flushing);
        for queue in self.partitions.values_mut() {
            if queue
                .open
                .as_ref()
                .is_some_and(|b| flushing || now >= b.created + linger)
            {
                Self::close(queue, producer);
            }
        }
    }

    /// The batches to send now, in sequence order per partition, marked in flight.
    pub(crate) fn drain(&mut self, now: Instant) -> Vec<Outbound> {
        let max = self.settings.max_in_flight.max(1);
        let hold_unsent = self.reset_pending;
        let mut out = Vec::new();
        for (tp, queue) in &mut self.partitions {
            if queue.retry_at.is_some_and(|at| now < at) {
                continue;
            }
            queue.retry_at = None;
            while queue.in_flight.len() < max {
                // Waiting for a new producer id: only batches already sent under the old one
                // may go (they must be resolved before the reset).
                let Some(front) = queue.queued.front() else {
                    break;
                };
                if hold_unsent && !front.sent {
                    break;
                }
                let mut batch = queue.queued.pop_front().expect("front exists");
                batch.sent_behind_unacked = queue
                    .in_flight
                    .iter()
                    .any(|b| sequence_before(b.base_sequence, batch.base_sequence));
                batch.sent = true;
                batch.attempts += 1;
                out.push(Outbound {
                    id: batch.id,
                    partition: tp.clone(),
                    producer: batch.producer,
                    base_sequence: batch.base_sequence,
                    records: batch.records.clone(),
                });
                let at = sequence_slot(queue.in_flight.iter(), batch.base_sequence);
                queue.in_flight.insert(at, batch);
            }
        }
        out
    }

    /// What the leader's answer to batch `id` means; returns the batches now finished.
    pub(crate) fn on_response(
        &mut self,
        partition: &TopicPartition,
        id: u64,
        result: Result<(i64, bool), Error>,
        now: Instant,
    ) -> Vec<Completion<W>> {
        let Some(queue) = self.partitions.get_mut(partition) else {
            return Vec::new();
        };
        let Some(at) = queue.in_flight.iter().position(|b| b.id == id) else {
            return Vec::new();
        };
        let mut batch = queue.in_flight.remove(at);
        let error = match result {
            Ok((base_offset, duplicate)) => {
                let done = Completion::Delivered {
                    partition: partition.clone(),
                    base_offset,
                    duplicate,
                    waiters: std::mem::take(&mut batch.waiters),
                };
                return vec![done];
            }
            Err(e) => e,
        };
        if batch.waiters.is_empty() {
            // Already failed (a transaction that failed elsewhere): nothing to retry.
            return Vec::new();
        }
        let transient_gap = batch.sent_behind_unacked
            && matches!(
                error,
                Error::OutOfOrderSequence(_) | Error::UnknownProducerId(_)
            );
        if self.mode == Mode::Idempotent
            && !transient_gap
            && queue.lost_producer != Some(batch.producer)
            && matches!(error, Error::UnknownProducerId(_))
        {
            // Every lower sequence was acknowledged, so the leader had this PID's state and
            // forgot it (it expired after an idle spell; Kafka's producer.id.expiration.ms). A
            // leader without state appends no batch of the PID above sequence 0, so none of the
            // partition's batches under this PID was appended: they all go again, in order,
            // under a new PID (as Kafka's producer does, KIP-360) instead of failing.
            tracing::info!(%partition, producer_id = batch.producer.0, error = %error,
                "the leader forgot this producer's state; its batches go again under a new producer id");
            queue.lost_producer = Some(batch.producer);
            for b in &mut queue.queued {
                if b.producer == batch.producer {
                    b.sent = false;
                }
            }
            self.reset_pending = true;
        }
        if queue.lost_producer == Some(batch.producer)
            && (error.is_retriable()
                || matches!(
                    error,
                    Error::UnknownProducerId(_) | Error::OutOfOrderSequence(_)
                ))
        {
            // Never appended (above): it waits for the new PID like a batch never sent.
            batch.sent = false;
            queue.requeue(batch);
            return Vec::new();
        }
        if error.is_retriable() || transient_gap {
            if now >= batch.created + self.settings.delivery_timeout {
                let error = Error::Timeout(format!(
                    "delivery.timeout.ms ({} ms) expired for a batch of {} record(s) to {partition} after {} attempt(s); last error: {error}",
                    self.settings.delivery_timeout.as_millis(),
                    batch.records.len(),
                    batch.attempts,
                ));
                return self.fail_batch(partition, batch, error);
            }
            if !transient_gap {
                let backoff = self
                    .settings
                    .retry_backoff
                    .saturating_mul(1u32 << batch.attempts.saturating_sub(1).min(16))
                    .min(self.settings.retry_backoff_max);
                queue.retry_at = Some(
                    queue
                        .retry_at
                        .map_or(now + backoff, |t| t.max(now + backoff)),
                );
            }
            queue.requeue(batch);
            return Vec::new();
        }
        self.fail_batch(partition, batch, error)
    }

    /// `batch` (already taken out of its queue) failed for good.
    fn fail_batch(
        &mut self,
        partition: &TopicPartition,
        mut batch: Batch<W>,
        error: Error,
    ) -> Vec<Completion<W>> {
        let mut done = vec![Completion::Failed {
            error: error.clone(),
            waiters: std::mem::take(&mut batch.waiters),
        }];
        match self.mode {
            Mode::Transactional => done.extend(self.fail_all(error)),
            Mode::Idempotent => {
                self.reset_pending = true;
                if let Some(queue) = self.partitions.get_mut(partition) {
                    // Every batch of this partition whose outcome is tied to the failed one's
                    // sequences: the sent ones (in flight ones stay tracked until answered).
                    for b in &mut queue.in_flight {
                        if !b.waiters.is_empty() {
                            done.push(Completion::Failed {
                                error: error.clone(),
                                waiters: std::mem::take(&mut b.waiters),
                            });
                        }
                    }
                    let (sent, unsent): (VecDeque<_>, VecDeque<_>) =
                        queue.queued.drain(..).partition(|b| b.sent);
                    queue.queued = unsent;
                    for mut b in sent {
                        done.push(Completion::Failed {
                            error: error.clone(),
                            waiters: std::mem::take(&mut b.waiters),
                        });
                    }
                }
                tracing::info!(%partition, error = %error,
                    "a batch failed; the idempotent producer will get a new producer id");
            }
        }
        done
    }

    /// Fails every pending record with `error` (a transaction failed or is being aborted);
    /// transactional accumulators then refuse records until [`Accumulator::reset`].
    pub(crate) fn fail_all(&mut self, error: Error) -> Vec<Completion<W>> {
        if self.mode == Mode::Transactional && self.failed.is_none() {
            self.failed = Some(error.clone());
        }
        let mut done = Vec::new();
        let mut fail = |waiters: Vec<W>| {
            if !waiters.is_empty() {
                done.push(Completion::Failed {
                    error: error.clone(),
                    waiters,
                });
            }
        };
        for queue in self.partitions.values_mut() {
            if let Some(b) = queue.open.take() {
                fail(b.waiters);
            }
            for b in queue.queued.drain(..) {
                fail(b.waiters);
            }
            for b in &mut queue.in_flight {
                fail(std::mem::take(&mut b.waiters));
            }
        }
        self.partitions.retain(|_, q| !q.is_empty());
        done
    }

    /// Fails the records whose `delivery.timeout.ms` passed while they were not in flight.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Completion<W>> {
        let timeout = self.settings.delivery_timeout;
        let mut expired = Vec::new();
        for (tp, queue) in &mut self.partitions {
            if queue
                .open
                .as_ref()
                .is_some_and(|b| now >= b.created + timeout)
            {
                expired.push((tp.clone(), queue.open.take().expect("checked")));
            }
            while queue
                .queued
                .front()
                .is_some_and(|b| now >= b.created + timeout)
            {
                expired.push((tp.clone(), queue.queued.pop_front().expect("checked")));
            }
        }
        let mut done = Vec::new();
        for (tp, batch) in expired {
            let error = Error::Timeout(format!(
                "delivery.timeout.ms ({} ms) expired for {} record(s) to {tp} before they were acknowledged",
                timeout.as_millis(),
                batch.records.len()
            ));
            if batch.base_sequence < 0 {
                // Never closed: no sequence, no gap. A transaction that lost records cannot
                // commit, though (as after any failed batch): it fails as a whole.
                done.push(Completion::Failed {
                    error: error.clone(),
                    waiters: batch.waiters,
                });
                if self.mode == Mode::Transactional {
                    done.extend(self.fail_all(error));
                }
            } else {
                done.extend(self.fail_batch(&tp, batch, error));
            }
        }
        done
    }

    /// Idempotent: a batch failed, nothing is in flight and no sent batch waits for a retry;
    /// time to get a new (PID, epoch) and call [`Accumulator::reset`].
    pub(crate) fn needs_new_producer(&self) -> bool {
        self.reset_pending
            && self
                .partitions
                .values()
                .all(|q| q.in_flight.is_empty() && q.queued.iter().all(|b| !b.sent))
    }

    /// Adopts a new (PID, epoch): sequences restart at 0 and every closed batch never sent gets
    /// a fresh one (in its old order). Clears a transactional failure.
    pub(crate) fn reset(&mut self, producer: (i64, i16)) {
        self.producer = producer;
        self.failed = None;
        self.reset_pending = false;
        for queue in self.partitions.values_mut() {
            queue.next_sequence = 0;
            queue.retry_at = None;
            queue.lost_producer = None;
            // In-flight leftovers (already failed) keep their old identity until answered.
            for b in &mut queue.queued {
                b.producer = producer;
                b.base_sequence = queue.next_sequence;
                queue.next_sequence =
                    increment_sequence(queue.next_sequence, b.records.len() as i32);
            }
        }
        self.partitions.retain(|_, q| !q.is_empty());
    }

    /// Nothing open, queued or in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.partitions.values().all(PartitionQueue::is_empty)
    }

    /// Batches sent and not answered yet, over every partition.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.partitions.values().map(|q| q.in_flight.len()).sum()
    }

    /// When something needs doing without new input: a linger or a backoff ending, a delivery
    /// timeout passing.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let timeout = self.settings.delivery_timeout;
        let linger = self.settings.linger;
        let mut next: Option<Instant> = None;
        let mut at = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        for queue in self.partitions.values() {
            if let Some(b) = &queue.open {
                at(b.created + linger.min(timeout));
            }
            if let Some(b) = queue.queued.front() {
                at(b.created + timeout);
                if let Some(r) = queue.retry_at {
                    at(r);
                }
            }
        }
        next
    }
}

/// Whether sequence `a` comes before `b` (both within one producer's window; wrapping).
fn sequence_before(a: i32, b: i32) -> bool {
    // The window is far smaller than half the sequence space, so the shorter way round wins.
    let forward = if b >= a {
        i64::from(b) - i64::from(a)
    } else {
        i64::from(b) + i64::from(i32::MAX) + 1 - i64::from(a)
    };
    forward > 0 && forward < i64::from(i32::MAX) / 2
}

#[cfg(test)]
#[path = "accumulator_tests.rs"]
mod tests;
