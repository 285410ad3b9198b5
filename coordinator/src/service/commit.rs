//! The group commit room: one writer task makes the transitions of concurrent requests durable
//! together, with one flush for all of them.
//!
//! How: [`GroupCommit::put_txn`] queues the new metadata of one id and waits. The writer, a
//! dedicated thread (storage calls block; a thread of its own costs the same one hand-off per
//! request as tokio's blocking pool did, and keeps the batch in one place), takes the first
//! queued write, drains everything else already queued (up to [`MAX_BATCH`]), writes the lot
//! with [`Storage::put_txns`] (sled: one atomic batch, one flush), then releases every waiter
//! with the result. While one flush runs, the next
//! requests queue up, so the batch grows with the load and nothing waits for a timer: a lone
//! request pays one write and one flush, as before.
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
//! is one request waiting for its reply; a panic in the storage engine ends the writer, after
//! which every write fails (typed error) until restart.

use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use cluster::node::lock;
use tokio::sync::{oneshot, watch};
use tracing::{debug, warn};

use crate::core::TxnMetadata;
use crate::storage::{Storage, StorageError};

/// Most writes one flush covers (a bound on one batch's size, not a wait).
pub(super) const MAX_BATCH: usize = 1024;

/// What a waiter receives: the batch's result.
#[cfg(test)]
type Written = oneshot::Receiver<Result<(), String>>;

/// One queued write and the waiter it releases (`None`: a write nobody waits for, which needs
/// no flush of its own).
struct Pending {
    meta: TxnMetadata,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// The queue in front of the writer task.
pub(super) struct GroupCommit {
    /// `None` once closed.
    queue: Mutex<Option<mpsc::Sender<Pending>>>,
}

impl GroupCommit {
    /// Starts the writer thread over `storage`; join it after [`GroupCommit::close`] (e.g.
    /// with [`GroupCommit::join`]).
    /// A failed batch sets `failed` (see `Shared::storage_failed`).
    pub(super) fn start(
        storage: Arc<dyn Storage>,
        failed: Arc<watch::Sender<bool>>,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (tx, rx) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("txn-group-commit".into())
            .spawn(move || write_batches(storage.as_ref(), &failed, rx))?;
        let commit = Self {
            queue: Mutex::new(Some(tx)),
        };
        Ok((commit, writer))
    }

    /// Waits (off the async threads) for a closed writer to finish what was queued.
    pub(super) async fn join(writer: JoinHandle<()>) -> Result<(), String> {
        cluster::node::blocking(move || writer.join().map_err(|_| "panicked".to_string()))
            .await
            .map_err(|e| e.to_string())?
    }

    /// Makes `meta` durable together with whatever else is queued; returns once the flush
    /// covering it returned.
    pub(super) async fn put_txn(&self, meta: TxnMetadata) -> Result<(), StorageError> {
        let (done, written) = oneshot::channel();
        self.enqueue(meta, Some(done))?;
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
        self.enqueue(meta, None)
    }

    /// Queues `meta` (synchronously: it is in the queue when this returns); the receiver
    /// resolves once the flush covering it returned.
    #[cfg(test)]
    fn submit(&self, meta: TxnMetadata) -> Result<Written, StorageError> {
        let (done, written) = oneshot::channel();
        self.enqueue(meta, Some(done))?;
        Ok(written)
    }

    fn enqueue(
        &self,
        meta: TxnMetadata,
        done: Option<oneshot::Sender<Result<(), String>>>,
    ) -> Result<(), StorageError> {
        let queued = match lock(&self.queue).as_ref() {
            None => false,
            Some(queue) => queue.send(Pending { meta, done }).is_ok(),
        };
        if !queued {
            return Err(StorageError::GroupCommit(
                "the coordinator is stopping".into(),
            ));
        }
        Ok(())
    }

    /// Refuses new writes; the writer finishes what is queued and ends.
    pub(super) fn close(&self) {
        lock(&self.queue).take();
    }
}

/// The writer thread: one batch at a time until the queue is closed and empty.
fn write_batches(
    storage: &dyn Storage,
    failed: &watch::Sender<bool>,
    queue: mpsc::Receiver<Pending>,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (metas, waiters): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.meta, p.done)).unzip();
        let writes = metas.len();
        let waiters: Vec<_> = waiters.into_iter().flatten().collect();
        let result = if waiters.is_empty() {
            // Only Complete* writes: the next flush covers them.
            storage.write_txns(&metas)
        } else {
            storage.put_txns(&metas)
        }
        .map_err(|e| e.to_string());
        if let Err(e) = &result {
            warn!(writes, error = %e, "group commit failed");
            super::storage_error(failed, e);
        }
        if waiters.is_empty() {
            debug!(
                writes,
                ok = result.is_ok(),
                "group commit written, left to the next flush"
            );
        } else {
            debug!(writes, ok = result.is_ok(), "group commit flushed");
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

    use super::*;
    use crate::core::{GroupMarkerFence, GroupMarkerWrite, PendingOffsets};
    use crate::storage::{MemoryStorage, Snapshot};
    use cluster::{NodeId, ProducerId};

    /// Memory storage that records each batch's size (flushed, and written without a flush);
    /// the first flushed batch waits for `gate`.
    struct Gated {
        inner: MemoryStorage,
        batches: Mutex<Vec<usize>>,
        unflushed: Mutex<Vec<usize>>,
        entered: Mutex<std_mpsc::Sender<()>>,
        gate: Mutex<std_mpsc::Receiver<()>>,
        fail: bool,
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
                batches.len() == 1
            };
            if first {
                let _ = lock(&self.entered).send(());
                let _ = lock(&self.gate).recv();
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
            partitions: &[cluster::TopicPartition],
            recorded_ms: i64,
        ) -> Result<(), StorageError> {
            self.inner
                .put_pending_txn_offsets(group, producer_id, partitions, recorded_ms)
        }
        fn remove_pending_txn_offsets(
            &self,
            group: &str,
            producer_id: ProducerId,
            partitions: Option<&[cluster::TopicPartition]>,
        ) -> Result<(), StorageError> {
            self.inner
                .remove_pending_txn_offsets(group, producer_id, partitions)
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
            unflushed: Mutex::new(Vec::new()),
            entered: Mutex::new(entered_tx),
            gate: Mutex::new(gate_rx),
            fail,
        });
        (storage, entered_rx, gate_tx)
    }

    fn meta(id: &str) -> TxnMetadata {
        TxnMetadata::new(id, 7, 1000, 0)
    }

    /// Runs the scenario: one write inside the storage, three more queued behind it, then
    /// the storage is released.
    async fn one_then_three(fail: bool) -> (Arc<Gated>, Vec<Result<(), StorageError>>) {
        let (storage, entered, gate) = gated(fail);
        let failed = Arc::new(watch::channel(false).0);
        let (commit, writer) = GroupCommit::start(storage.clone(), failed.clone()).unwrap();
        let commit = Arc::new(commit);
        let first = tokio::spawn({
            let commit = commit.clone();
            async move { commit.put_txn(meta("a")).await }
        });
        // Wait until the writer is inside the first batch's write ...
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        // ... so these three are queued behind it (`submit` returns once queued).
        let rest: Vec<Written> = ["b", "c", "d"]
            .into_iter()
            .map(|id| commit.submit(meta(id)).unwrap())
            .collect();
        gate.send(()).unwrap();
        let mut results = vec![first.await.unwrap()];
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
        let (storage, entered, gate) = gated(false);
        let failed = Arc::new(watch::channel(false).0);
        let (commit, writer) = GroupCommit::start(storage.clone(), failed).unwrap();
        let commit = Arc::new(commit);
        let first = tokio::spawn({
            let commit = commit.clone();
            async move { commit.put_txn(meta("a")).await }
        });
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
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
}
