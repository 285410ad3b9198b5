//! The group commit room: one writer task makes the transitions of concurrent requests durable
//! together, with one flush for all of them.
//!
//! How: [`GroupCommit::put_txn`] queues the new metadata of one id and waits. The writer, a
//! dedicated thread (storage calls block; a thread of its own costs the same one hand-off per
//! request as tokio's blocking pool did, and keeps the batch in one place), takes the first
//! queued write, drains everything else already queued (up to [`MAX_BATCH`]), writes the lot
//! with [`Storage::put_txns`] (sled: one write per id, one flush), then releases every waiter
//! with the result. While one flush runs, the next
//! requests queue up, so the batch grows with the load and nothing waits for a timer. A request
//! wakes the writer only when it waits on its condition variable (a notification costs a system
//! call even when nobody waits, and under load the writer is busy writing).
//!
//! A lone write skips the writer: when nothing is queued or being written, the last flush
//! covered a single write (no load) and took under [`INLINE_FLUSH_LIMIT`] (a fast disk), the
//! request writes and flushes on its own thread. That saves the two thread hand-offs (to the
//! writer and back, ~35 us of an InitProducerId's ~500 us round trip on the benchmark
//! machine) and holds one async worker for one short flush. Writes that arrive meanwhile
//! queue for the writer, which starts on them as soon as the lone write is done; a flush that
//! carries several writes, or a slow one, sends everything through the writer again.
//!
//! The rule "durable before acknowledged" holds because a waiter is released only after the
//! flush that covers its write returned. The per-id lock (`state`) is still held across
//! [`GroupCommit::put_txn`], so the transitions of one id stay ordered; only different ids share
//! a flush. The generation and the PID block are not queued: they are written and flushed
//! directly (rare, and each must be durable before anything uses it).
//!
//! One kind of write needs no flush of its own: Complete* ([`GroupCommit::queue_txn`]). It is
//! queued like the others and nobody waits for it; a batch of such writes alone is written
//! without a flush, and the next flush (any other write's, sled's periodic one, the one at
//! stop) makes it durable. Safe because Complete* only records what is already durable: the
//! Prepare* decision was flushed before the client was answered, and every leader and group
//! flushed its marker before acknowledging it. A crash that loses a Complete* leaves
//! Prepare*, and the next start re-sends the markers (which the destinations acknowledge again
//! without applying them twice) and completes the transaction the same way: every answer given
//! from the lost Complete* state stays true. A later write of the same id is queued after it
//! (under the id's lock), so it is never overtaken on disk.
//!
//! Stop: [`GroupCommit::close`] refuses new writes; the writer writes what was already queued
//! and ends, and [`super::serve_with_storage`] joins it before the final flush, so no queued
//! write is dropped and nothing outlives `serve` holding the storage open.
//!
//! CAVEATS: a failed batch fails every write in it (each waiter gets the error; nothing it
//! asked for is acknowledged); the queue is unbounded, which is safe only because each entry
//! is one request waiting for its reply; a panic in the storage engine (on the writer or in an
//! inline write) closes the group commit: every write fails (typed error) and the node is
//! NOT_SERVING until restart.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cluster::node::lock;
use tokio::sync::{oneshot, watch};
use tracing::{debug, warn};

use crate::core::TxnMetadata;
use crate::storage::{Storage, StorageError};

/// Most writes one flush covers (a bound on one batch's size, not a wait).
pub(super) const MAX_BATCH: usize = 1024;

/// A lone write is made durable on the requesting thread only while the storage's recent
/// flushes took less than this (see [`GroupCommit::put_txn`]); a slower disk always goes
/// through the writer thread, so that no async worker is held for long.
pub(super) const INLINE_FLUSH_LIMIT: Duration = Duration::from_millis(1);

/// What a waiter receives: the batch's result.
#[cfg(test)]
type Written = oneshot::Receiver<Result<(), String>>;

/// What one queued write does to one id.
enum TxnWrite {
    /// Stores its new metadata.
    Put(TxnMetadata),
    /// Removes it (an expired id), in order with the writes queued before it.
    Remove(String),
}

/// One queued write and the waiter it releases (`None`: a write nobody waits for, which needs
/// no flush of its own).
struct Pending {
    write: TxnWrite,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// What the writer and the requests share, under one mutex.
#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    /// A batch (the writer's) or a lone write (a request's, inline) is being written: nobody
    /// else starts one, so queued writes never overtake it and it never overtakes them.
    writing: bool,
    /// No new writes; the writer ends once nothing is queued or being written.
    closed: bool,
    /// The writer thread waits on the condition variable: only then does a change need a
    /// wake-up (a notification is a system call even when nobody waits).
    writer_waits: bool,
}

/// The queue in front of the writer thread, shared with it.
struct Inner {
    queue: Mutex<Queue>,
    /// Signalled when the writer may have something to do.
    wake: Condvar,
    storage: Arc<dyn Storage>,
    failed: Arc<watch::Sender<bool>>,
    /// The last flush's duration, in microseconds, and how many writes it covered: a lone
    /// write goes inline only while the flushes are fast and carry one write each (no load).
    last_flush_us: AtomicU64,
    last_flush_writes: AtomicU64,
    /// How many times the writer thread was woken (each one a system call and a context
    /// switch): only when it has something to do.
    wakeups: AtomicU64,
}

impl Inner {
    /// Writes one batch, in order: with a flush when someone waits for it, without one for
    /// Complete* writes alone. A failure marks the storage failed (the node turns NOT_SERVING).
    fn write(&self, writes: Vec<TxnWrite>, flush: bool) -> Result<(), String> {
        let started = Instant::now();
        let count = writes.len();
        let result = self.apply(writes, flush).map_err(|e| e.to_string());
        if flush {
            let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.last_flush_us.store(took, Ordering::Relaxed);
            self.last_flush_writes
                .store(count as u64, Ordering::Relaxed);
        }
        if let Err(e) = &result {
            warn!(writes = count, error = %e, "group commit failed");
            super::storage_error(&self.failed, e);
        }
        result
    }

    fn apply(&self, writes: Vec<TxnWrite>, flush: bool) -> Result<(), StorageError> {
        if writes.iter().all(|w| matches!(w, TxnWrite::Put(_))) {
            let metas: Vec<TxnMetadata> = writes
                .into_iter()
                .filter_map(|w| match w {
                    TxnWrite::Put(meta) => Some(meta),
                    TxnWrite::Remove(_) => None,
                })
                .collect();
            return if flush {
                self.storage.put_txns(&metas)
            } else {
                self.storage.write_txns(&metas)
            };
        }
        // A removal among them (rare): runs of stores and the removals in order, one flush.
        let mut puts = Vec::new();
        for write in writes {
            match write {
                TxnWrite::Put(meta) => puts.push(meta),
                TxnWrite::Remove(id) => {
                    if !puts.is_empty() {
                        self.storage.write_txns(&std::mem::take(&mut puts))?;
                    }
                    self.storage.remove_txns(&[id])?;
                }
            }
        }
        if !puts.is_empty() {
            self.storage.write_txns(&puts)?;
        }
        if flush {
            self.storage.flush()?;
        }
        Ok(())
    }

    /// Marks the current write finished and lets the writer at what queued meanwhile. The
    /// writer is woken only when it has something to do (writes queued meanwhile, or a
    /// close to finish): after a lone inline write with nothing queued, waking it would cost
    /// a system call and a context switch for nothing.
    fn finish_writing(&self) {
        let wake = {
            let mut queue = lock(&self.queue);
            queue.writing = false;
            queue.writer_waits && (!queue.pending.is_empty() || queue.closed)
        };
        if wake {
            self.wake.notify_all();
        }
    }
}

/// A write in progress (inline or the writer's): ends it even if the storage engine panics, so
/// that the writer is never left waiting for a write that will not finish. A panic closes the
/// group commit first (before the waiters of the batch learn of it): every queued and later
/// write fails, and the storage is marked failed (NOT_SERVING) until restart, as after a
/// failed write.
struct Writing<'a>(&'a Inner);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut queue = lock(&self.0.queue);
            queue.closed = true;
            queue.pending.clear();
            drop(queue);
            super::storage_error(&self.0.failed, &"the storage engine panicked");
        }
        self.0.finish_writing();
    }
}

/// The writer thread's end, normal or by a panic in the storage engine: closes the queue and
/// drops what waits in it, so every waiter and every later write gets an error instead of
/// waiting for a writer that is gone.
struct WriterGone<'a>(&'a Inner);

impl Drop for WriterGone<'_> {
    fn drop(&mut self) {
        let mut queue = lock(&self.0.queue);
        queue.closed = true;
        queue.pending.clear();
    }
}

/// The group commit: a queue, its writer thread, and the inline path for a lone write.
pub(super) struct GroupCommit {
    inner: Arc<Inner>,
}

impl GroupCommit {
    /// Starts the writer thread over `storage`; join it after [`GroupCommit::close`] (e.g.
    /// with [`GroupCommit::join`]).
    /// A failed batch sets `failed` (see `Shared::storage_failed`).
    pub(super) fn start(
        storage: Arc<dyn Storage>,
        failed: Arc<watch::Sender<bool>>,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            storage,
            failed,
            last_flush_us: AtomicU64::new(0),
            last_flush_writes: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
        });
        let writer = std::thread::Builder::new()
            .name("txn-group-commit".into())
            .spawn({
                let inner = inner.clone();
                move || write_batches(&inner)
            })?;
        Ok((Self { inner }, writer))
    }

    /// Waits (off the async threads) for a closed writer to finish what was queued.
    pub(super) async fn join(writer: JoinHandle<()>) -> Result<(), String> {
        cluster::node::blocking(move || writer.join().map_err(|_| "panicked".to_string()))
            .await
            .map_err(|e| e.to_string())?
    }

    /// Makes `meta` durable together with whatever else is queued; returns once the flush
    /// covering it returned.
    ///
    /// A lone write (nothing queued, nothing being written, and recent flushes fast) is
    /// written and flushed right here, on the calling thread: it then pays no hand-off to the
    /// writer thread and no wake-up back (together ~35 us of an InitProducerId's ~500 us on the
    /// benchmark machine), and the async worker it holds is held for one fast flush, while
    /// the other workers go on. Writes arriving meanwhile queue up for the writer thread, which
    /// starts on them as soon as this one is done, so the batching under load is unchanged.
    pub(super) async fn put_txn(&self, meta: TxnMetadata) -> Result<(), StorageError> {
        let inner = &self.inner;
        let quiet = inner.last_flush_writes.load(Ordering::Relaxed) <= 1
            && inner.last_flush_us.load(Ordering::Relaxed) < INLINE_FLUSH_LIMIT.as_micros() as u64;
        let lone = {
            let mut queue = lock(&inner.queue);
            if queue.closed {
                return Err(stopping());
            }
            let lone = quiet && !queue.writing && queue.pending.is_empty();
            queue.writing |= lone;
            lone
        };
        if lone {
            let writing = Writing(inner);
            let result = inner.write(vec![TxnWrite::Put(meta)], true);
            drop(writing);
            debug!(ok = result.is_ok(), "lone write flushed inline");
            return result.map_err(StorageError::GroupCommit);
        }
        self.queued(TxnWrite::Put(meta)).await
    }

    /// Removes `id` (expired) after every write queued before it; returns once that is
    /// durable.
    pub(super) async fn remove_txn(&self, id: String) -> Result<(), StorageError> {
        self.queued(TxnWrite::Remove(id)).await
    }

    /// Queues `write` for the writer thread and waits for the flush covering it.
    async fn queued(&self, write: TxnWrite) -> Result<(), StorageError> {
        let (done, written) = oneshot::channel();
        self.enqueue(write, Some(done))?;
        match written.await {
            Ok(result) => result.map_err(StorageError::GroupCommit),
            Err(_) => Err(StorageError::GroupCommit(
                "the writer stopped before writing".into(),
            )),
        }
    }

    /// Queues `meta`, a Complete* write, and returns at once: written with the next batch and
    /// made durable by the next flush, which nobody waits for (see the module docs for why
    /// that is enough). Writes of the same id queued later are written after it.
    pub(super) fn queue_txn(&self, meta: TxnMetadata) -> Result<(), StorageError> {
        self.enqueue(TxnWrite::Put(meta), None)
    }

    /// Queues `meta` for the writer thread (synchronously: it is in the queue when this
    /// returns); the receiver resolves once the flush covering it returned.
    #[cfg(test)]
    fn submit(&self, meta: TxnMetadata) -> Result<Written, StorageError> {
        let (done, written) = oneshot::channel();
        self.enqueue(TxnWrite::Put(meta), Some(done))?;
        Ok(written)
    }

    fn enqueue(
        &self,
        write: TxnWrite,
        done: Option<oneshot::Sender<Result<(), String>>>,
    ) -> Result<(), StorageError> {
        let wake = {
            let mut queue = lock(&self.inner.queue);
            if queue.closed {
                return Err(stopping());
            }
            queue.pending.push_back(Pending { write, done });
            // While a write is in progress the writer could not start anyway; the end of
            // that write wakes it (`finish_writing`).
            queue.writer_waits && !queue.writing
        };
        if wake {
            self.inner.wake.notify_all();
        }
        Ok(())
    }

    /// Refuses new writes; the writer finishes what is queued (and waits for a lone write
    /// being written) and ends.
    pub(super) fn close(&self) {
        lock(&self.inner.queue).closed = true;
        self.inner.wake.notify_all();
    }
}

fn stopping() -> StorageError {
    StorageError::GroupCommit("the coordinator is stopping".into())
}

/// The writer thread: one batch at a time until the queue is closed, empty and idle.
fn write_batches(inner: &Inner) {
    let _gone = WriterGone(inner);
    loop {
        let batch: Vec<Pending> = {
            let mut queue = lock(&inner.queue);
            loop {
                if !queue.writing && !queue.pending.is_empty() {
                    break;
                }
                if queue.closed && !queue.writing && queue.pending.is_empty() {
                    return;
                }
                queue.writer_waits = true;
                queue = inner
                    .wake
                    .wait(queue)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                queue.writer_waits = false;
                inner.wakeups.fetch_add(1, Ordering::Relaxed);
            }
            queue.writing = true;
            let take = queue.pending.len().min(MAX_BATCH);
            queue.pending.drain(..take).collect()
        };
        let (batch, waiters): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.write, p.done)).unzip();
        let writes = batch.len();
        let waiters: Vec<_> = waiters.into_iter().flatten().collect();
        // Only Complete* writes: the next flush covers them.
        let flush = !waiters.is_empty();
        let writing = Writing(inner);
        let result = inner.write(batch, flush);
        drop(writing);
        if flush {
            debug!(writes, ok = result.is_ok(), "group commit flushed");
        } else {
            debug!(
                writes,
                ok = result.is_ok(),
                "group commit written, left to the next flush"
            );
        }
        for waiter in waiters {
            // A waiter that went away (its request was cancelled) needs no answer.
            let _ = waiter.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;

    use std::thread::JoinHandle;

    use super::*;
    use crate::core::{GroupMarkerFence, GroupMarkerWrite, PendingOffsets};
    use crate::storage::{GroupProtocol, MemoryStorage, Snapshot};
    use cluster::{NodeId, ProducerId};

    /// Memory storage that records each batch's size (flushed, and written without a flush);
    /// the first flushed batch waits for `gate`.
    struct Gated {
        inner: MemoryStorage,
        batches: Mutex<Vec<usize>>,
        /// Per flushed batch: written by the writer thread (else inline, by a request).
        by_writer: Mutex<Vec<bool>>,
        unflushed: Mutex<Vec<usize>>,
        entered: Mutex<std_mpsc::Sender<()>>,
        gate: Mutex<std_mpsc::Receiver<()>>,
        fail: bool,
        /// The next flushed batch panics (a bug in the storage engine).
        panic_once: std::sync::atomic::AtomicBool,
    }

    impl Storage for Gated {
        fn load(&self) -> Result<Snapshot, StorageError> {
            self.inner.load()
        }
        fn put_txn(&self, meta: &TxnMetadata) -> Result<(), StorageError> {
            self.put_txns(std::slice::from_ref(meta))
        }
        fn put_txns(&self, metas: &[TxnMetadata]) -> Result<(), StorageError> {
            let first = {
                let mut batches = lock(&self.batches);
                batches.push(metas.len());
                let writer = std::thread::current().name() == Some("txn-group-commit");
                lock(&self.by_writer).push(writer);
                batches.len() == 1
            };
            if first {
                let _ = lock(&self.entered).send(());
                let _ = lock(&self.gate).recv();
            }
            if self.panic_once.swap(false, Ordering::SeqCst) {
                panic!("storage engine bug");
            }
            if self.fail {
                return Err(StorageError::Task("disk on fire".into()));
            }
            self.inner.put_txns(metas)
        }
        fn write_txns(&self, metas: &[TxnMetadata]) -> Result<(), StorageError> {
            lock(&self.unflushed).push(metas.len());
            self.inner.put_txns(metas)
        }
        fn remove_txns(&self, ids: &[String]) -> Result<(), StorageError> {
            lock(&self.unflushed).push(ids.len());
            self.inner.remove_txns(ids)
        }
        fn put_generation(&self, generation: i64) -> Result<(), StorageError> {
            self.inner.put_generation(generation)
        }
        fn put_pid_block(&self, end: i64) -> Result<(), StorageError> {
            self.inner.put_pid_block(end)
        }
        fn group_marker_fence(
            &self,
            group: &str,
            producer_id: ProducerId,
            coordinator_id: NodeId,
        ) -> Result<GroupMarkerFence, StorageError> {
            self.inner
                .group_marker_fence(group, producer_id, coordinator_id)
        }
        fn apply_group_marker(&self, write: &GroupMarkerWrite) -> Result<(), StorageError> {
            self.inner.apply_group_marker(write)
        }
        fn put_pending_txn_offsets(
            &self,
            group: &str,
            producer_id: ProducerId,
            epoch: i16,
            partitions: &[cluster::TopicPartition],
            recorded_ms: i64,
        ) -> Result<(), StorageError> {
            self.inner
                .put_pending_txn_offsets(group, producer_id, epoch, partitions, recorded_ms)
        }
        fn remove_pending_txn_offsets(
            &self,
            group: &str,
            producer_id: ProducerId,
            holds: &[(cluster::TopicPartition, i16)],
        ) -> Result<(), StorageError> {
            self.inner
                .remove_pending_txn_offsets(group, producer_id, holds)
        }
        fn commit_group_offsets(
            &self,
            group: &str,
            offsets: &PendingOffsets,
        ) -> Result<(), StorageError> {
            self.inner.commit_group_offsets(group, offsets)
        }
        fn group_offsets(&self, group: &str) -> Result<PendingOffsets, StorageError> {
            self.inner.group_offsets(group)
        }
        fn delete_group_offsets(
            &self,
            group: &str,
            partitions: &[cluster::TopicPartition],
        ) -> Result<(), StorageError> {
            self.inner.delete_group_offsets(group, partitions)
        }
        fn offset_groups(&self) -> Result<Vec<String>, StorageError> {
            self.inner.offset_groups()
        }
        fn put_group_state(
            &self,
            protocol: GroupProtocol,
            group: &str,
            state: Option<&[u8]>,
        ) -> Result<(), StorageError> {
            self.inner.put_group_state(protocol, group, state)
        }
        fn group_state(
            &self,
            protocol: GroupProtocol,
            group: &str,
        ) -> Result<Option<Vec<u8>>, StorageError> {
            self.inner.group_state(protocol, group)
        }
        fn group_states(
            &self,
            protocol: GroupProtocol,
        ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
            self.inner.group_states(protocol)
        }
        fn flush(&self) -> Result<(), StorageError> {
            Ok(())
        }
    }

    fn gated(fail: bool) -> (Arc<Gated>, std_mpsc::Receiver<()>, std_mpsc::Sender<()>) {
        let (entered_tx, entered_rx) = std_mpsc::channel();
        let (gate_tx, gate_rx) = std_mpsc::channel();
        let storage = Arc::new(Gated {
            inner: MemoryStorage::new(),
            batches: Mutex::new(Vec::new()),
            by_writer: Mutex::new(Vec::new()),
            unflushed: Mutex::new(Vec::new()),
            entered: Mutex::new(entered_tx),
            gate: Mutex::new(gate_rx),
            fail,
            panic_once: std::sync::atomic::AtomicBool::new(false),
        });
        (storage, entered_rx, gate_tx)
    }

    fn meta(id: &str) -> TxnMetadata {
        TxnMetadata::new(id, 7, 1000, 0)
    }

    /// A group commit over gated storage whose writer is busy inside a first write ("a",
    /// through the queue: a lone `put_txn` would write inline, on this test's only thread):
    /// what is queued now waits behind it until `gate` is sent; `first` resolves after.
    struct Busy {
        storage: Arc<Gated>,
        commit: Arc<GroupCommit>,
        writer: JoinHandle<()>,
        failed: Arc<watch::Sender<bool>>,
        first: Written,
        gate: std_mpsc::Sender<()>,
    }

    async fn busy_writer(fail: bool) -> Busy {
        let (storage, entered, gate) = gated(fail);
        let failed = Arc::new(watch::channel(false).0);
        let (commit, writer) = GroupCommit::start(storage.clone(), failed.clone()).unwrap();
        let commit = Arc::new(commit);
        let first = commit.submit(meta("a")).unwrap();
        // Wait until the writer is inside the first batch's write.
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        Busy {
            storage,
            commit,
            writer,
            failed,
            first,
            gate,
        }
    }

    /// A group commit over ungated storage whose next flushed batch panics.
    fn panicking() -> (Arc<GroupCommit>, JoinHandle<()>, Arc<watch::Sender<bool>>) {
        let (storage, _entered, gate) = gated(false);
        gate.send(()).unwrap();
        let failed = Arc::new(watch::channel(false).0);
        let (commit, writer) = GroupCommit::start(storage.clone(), failed.clone()).unwrap();
        storage.panic_once.store(true, Ordering::SeqCst);
        (Arc::new(commit), writer, failed)
    }

    /// Runs the scenario: one write inside the storage, three more queued behind it, then
    /// the storage is released.
    async fn one_then_three(fail: bool) -> (Arc<Gated>, Vec<Result<(), StorageError>>) {
        let Busy {
            storage,
            commit,
            writer,
            failed,
            first,
            gate,
        } = busy_writer(fail).await;
        // The three are queued behind the first (`submit` returns once queued).
        let rest: Vec<Written> = ["b", "c", "d"]
            .into_iter()
            .map(|id| commit.submit(meta(id)).unwrap())
            .collect();
        gate.send(()).unwrap();
        let mut results = vec![first.await.unwrap().map_err(StorageError::GroupCommit)];
        for written in rest {
            results.push(written.await.unwrap().map_err(StorageError::GroupCommit));
        }
        commit.close();
        GroupCommit::join(writer).await.unwrap();
        // Closed: refused, never silently dropped.
        assert!(commit.put_txn(meta("e")).await.is_err());
        // A failed batch, and only that, marks the storage failed (the node turns NOT_SERVING).
        assert_eq!(*failed.borrow(), fail);
        (storage, results)
    }

    #[tokio::test]
    async fn writes_queued_during_a_flush_share_the_next_one() {
        let (storage, results) = one_then_three(false).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(*lock(&storage.batches), vec![1, 3]);
        let stored = storage.load().unwrap().txns;
        assert_eq!(stored.len(), 4);
    }

    #[tokio::test]
    async fn a_failed_flush_fails_every_write_it_carried() {
        let (storage, results) = one_then_three(true).await;
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert_eq!(*lock(&storage.batches), vec![1, 3]);
        assert!(storage.load().unwrap().txns.is_empty());
    }

    #[tokio::test]
    async fn a_complete_write_rides_the_next_flush_and_alone_is_not_flushed() {
        let Busy {
            storage,
            commit,
            writer,
            first,
            gate,
            ..
        } = busy_writer(false).await;
        // Queued behind the first flush: a Complete* nobody waits for, then a waited write.
        commit.queue_txn(meta("b")).unwrap();
        let waited = commit.submit(meta("c")).unwrap();
        gate.send(()).unwrap();
        first.await.unwrap().unwrap();
        waited.await.unwrap().unwrap();
        // A Complete* alone: written, not flushed (the next flush, or the one at stop, covers it).
        commit.queue_txn(meta("d")).unwrap();
        commit.close();
        GroupCommit::join(writer).await.unwrap();
        assert_eq!(*lock(&storage.batches), vec![1, 2]);
        assert_eq!(*lock(&storage.unflushed), vec![1]);
        assert_eq!(storage.load().unwrap().txns.len(), 4);
    }

    #[tokio::test]
    async fn a_lone_write_is_flushed_inline_and_load_goes_through_the_writer() {
        let Busy {
            storage,
            commit,
            writer,
            first,
            gate,
            ..
        } = busy_writer(false).await;
        // A batch of three behind a gated first one: the load is not quiet any more.
        // While the writer is busy, even a lone request's write is queued, not written inline.
        let queued = tokio::spawn({
            let commit = commit.clone();
            async move { commit.put_txn(meta("b")).await }
        });
        let rest: Vec<Written> = ["c", "d"]
            .into_iter()
            .map(|id| commit.submit(meta(id)).unwrap())
            .collect();
        tokio::task::yield_now().await;
        gate.send(()).unwrap();
        first.await.unwrap().unwrap();
        for written in rest {
            written.await.unwrap().unwrap();
        }
        queued.await.unwrap().unwrap();
        // The last flush carried several writes: the next goes through the writer too ...
        commit.put_txn(meta("e")).await.unwrap();
        // ... and once a flush carried one write, a lone write is flushed by its request,
        // without waking the writer thread (nothing for it to do).
        commit.put_txn(meta("f")).await.unwrap();
        while !lock(&commit.inner.queue).writer_waits {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let wakeups = commit.inner.wakeups.load(Ordering::Relaxed);
        for id in ["g", "h", "i"] {
            commit.put_txn(meta(id)).await.unwrap();
        }
        // A wake-up would show within this (the writer thread only has to return from its
        // wait); none comes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(commit.inner.wakeups.load(Ordering::Relaxed), wakeups);
        assert!(lock(&commit.inner.queue).writer_waits);
        commit.close();
        GroupCommit::join(writer).await.unwrap();
        let batches = lock(&storage.batches).clone();
        let by_writer = lock(&storage.by_writer).clone();
        assert_eq!(batches, vec![1, 3, 1, 1, 1, 1, 1]);
        assert_eq!(
            by_writer,
            vec![true, true, true, false, false, false, false]
        );
        assert_eq!(storage.load().unwrap().txns.len(), 9);
    }

    #[tokio::test]
    async fn a_lone_write_never_overtakes_a_queued_complete_write_of_its_id() {
        let Busy {
            storage,
            commit,
            writer,
            first,
            gate,
            ..
        } = busy_writer(false).await;
        // The Complete* of "b" is queued behind the busy writer, then "b"'s next transition
        // (as under the id's lock) is written: it must land after the Complete*.
        commit.queue_txn(meta("b")).unwrap();
        let next = tokio::spawn({
            let commit = commit.clone();
            async move { commit.put_txn(TxnMetadata::new("b", 8, 1000, 0)).await }
        });
        tokio::task::yield_now().await;
        gate.send(()).unwrap();
        first.await.unwrap().unwrap();
        next.await.unwrap().unwrap();
        commit.close();
        GroupCommit::join(writer).await.unwrap();
        let stored = storage.load().unwrap().txns;
        let b = stored.iter().find(|m| m.transactional_id == "b").unwrap();
        assert_eq!(
            b.producer_id, 8,
            "the older Complete* overwrote the newer write"
        );
    }

    #[tokio::test]
    async fn a_panic_in_an_inline_write_fails_the_writes_after_it_instead_of_stalling_them() {
        let (commit, writer, failed) = panicking();
        let panicked = tokio::spawn({
            let commit = commit.clone();
            async move { commit.put_txn(meta("a")).await }
        })
        .await;
        assert!(
            panicked.is_err(),
            "the lone write was written inline and panicked"
        );
        let next = tokio::time::timeout(Duration::from_secs(10), commit.put_txn(meta("b"))).await;
        assert!(matches!(next, Ok(Err(_))), "{next:?}");
        assert!(*failed.borrow(), "NOT_SERVING");
        GroupCommit::join(writer).await.unwrap();
    }

    #[tokio::test]
    async fn a_panic_in_the_writer_fails_every_write_instead_of_stalling_them() {
        let (commit, writer, failed) = panicking();
        let first = commit.submit(meta("a")).unwrap();
        assert!(
            first.await.is_err(),
            "the writer panicked: no answer but an error"
        );
        let next = tokio::time::timeout(Duration::from_secs(10), commit.put_txn(meta("b"))).await;
        assert!(matches!(next, Ok(Err(_))), "{next:?}");
        assert!(*failed.borrow(), "NOT_SERVING");
        assert!(GroupCommit::join(writer).await.is_err());
    }

    #[tokio::test]
    async fn a_removal_lands_after_the_writes_of_its_id_queued_before_it() {
        let Busy {
            storage,
            commit,
            writer,
            first,
            gate,
            ..
        } = busy_writer(false).await;
        // A Complete* of "b" queued behind the busy writer, then "b" expires: the removal must
        // not be overtaken by the older write (which would bring "b" back on disk).
        commit.queue_txn(meta("b")).unwrap();
        let removed = tokio::spawn({
            let commit = commit.clone();
            async move { commit.remove_txn("b".to_string()).await }
        });
        tokio::task::yield_now().await;
        gate.send(()).unwrap();
        first.await.unwrap().unwrap();
        removed.await.unwrap().unwrap();
        commit.close();
        GroupCommit::join(writer).await.unwrap();
        let stored = storage.load().unwrap().txns;
        let ids: Vec<_> = stored.iter().map(|m| m.transactional_id.as_str()).collect();
        assert_eq!(ids, vec!["a"]);
    }
}
