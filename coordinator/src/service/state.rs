//! The per-id state room: routing checks, the per-id locks, PID allocation, running a core
//! transition and making its outcome durable before the reply, loading at start, and the
//! timeout scan. The only room that writes `__transaction_state` and the PID block.
//!
//! Every request method here takes decoded domain values (from `wire`), checks routing, takes
//! the id's lock, asks the core, and persists what the core decided; markers the core asks for
//! go to the `markers` room.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::time::{Duration, Instant};

use cluster::metrics::{EpochBumpCause, Metrics};
use cluster::node::{lock, now_ms};
use cluster::{ProducerId, TopicPartition};
use tracing::{debug, info, warn};

use super::wire::{self, Caller, InitProducerId};
use super::{IdSlot, Shared, Slot};
use crate::core::{self, Outcome, PidAllocator, ProducerIdAndEpoch, TxnError, TxnMetadata};
use crate::core::{TxnResult, TxnState};
use crate::Error;

tokio::task_local! {
    /// Who sent the request being handled (its address): set by the gRPC handlers that can
    /// change an epoch, read when the change is recorded in the id's history. Unset in the
    /// coordinator's own tasks (the timeout scan): "coordinator".
    pub(super) static REQUESTER: String;
}

/// A core step's answer that may ask for a fresh PID ([`TxnError::NeedProducerId`]).
trait NeedsPid {
    fn needs_pid(&self) -> bool;
}

impl NeedsPid for Outcome {
    fn needs_pid(&self) -> bool {
        self.reply == Err(TxnError::NeedProducerId)
    }
}

impl NeedsPid for Option<Outcome> {
    fn needs_pid(&self) -> bool {
        self.as_ref().is_some_and(Outcome::needs_pid)
    }
}

impl Shared {
    /// The slot of `id`. Only InitProducerId creates one (`create`); for any other request a
    /// missing id gets a detached empty slot, from which the core never persists anything.
    pub(super) fn slot(&self, id: &str, create: bool) -> Slot {
        let mut map = lock(&self.txns);
        if let Some(slot) = map.get(id) {
            return slot.clone();
        }
        let slot = Slot::default();
        if create {
            map.insert(id.to_string(), slot.clone());
        }
        slot
    }

    fn all_slots(&self) -> Vec<(String, Slot)> {
        let map = lock(&self.txns);
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// NOT_COORDINATOR unless this node owns `key`; then COORDINATOR_LOAD_IN_PROGRESS until loaded
    /// and COORDINATOR_NOT_AVAILABLE while a peer runs another topology (`membership`).
    pub(super) fn check_owner(&self, key: &str) -> Result<(), Error> {
        if self.topology.coordinator_for(key).id != self.node_id {
            return Err(Error::NotCoordinator(key.to_string()));
        }
        self.check_loaded()?;
        self.check_agreement()
    }

    fn check_loaded(&self) -> Result<(), Error> {
        if !self.loaded.load(Ordering::Acquire) {
            return Err(Error::CoordinatorLoadInProgress);
        }
        Ok(())
    }

    /// Start: bump the generation, load owned ids, run `before_serving` (the groups'
    /// restore), then serve and resume every Prepare*.
    pub(super) async fn load(
        self: &Arc<Self>,
        before_serving: impl std::future::Future<Output = Result<(), Error>>,
    ) -> Result<(), Error> {
        let snapshot = self.blocking(|s| s.load()).await?;
        let generation = snapshot.generation + 1;
        self.blocking(move |s| s.put_generation(generation)).await?;
        self.generation.store(generation, Ordering::Release);
        *self.pids.lock().await = Some(PidAllocator::new(
            self.coordinator_index,
            self.topology.coordinator_count(),
            snapshot.pid_block_end,
        ));
        self.load_pending_txn_offsets(snapshot.pending_txn_offsets)
            .await;
        let mut resume = Vec::new();
        let mut owned = 0;
        self.config.metrics.reset_transaction_states();
        {
            let mut map = lock(&self.txns);
            for meta in snapshot.txns {
                if self.topology.coordinator_for(&meta.transactional_id).id != self.node_id {
                    continue;
                }
                owned += 1;
                self.config
                    .metrics
                    .transaction_state(None, meta.state.name());
                if let Some(job) = meta.pending_markers() {
                    resume.push(job);
                }
                map.insert(
                    meta.transactional_id.clone(),
                    Arc::new(IdSlot::new(Some(meta))),
                );
            }
        }
        info!(
            node_id = self.node_id,
            generation,
            transactional_ids = owned,
            resuming = resume.len(),
            "transaction state loaded"
        );
        before_serving.await?;
        self.loaded.store(true, Ordering::Release);
        for job in resume {
            info!(txn_id = %job.transactional_id, pid = job.identity.producer_id,
                  epoch = job.identity.epoch, result = ?job.result, "resuming markers after start");
            self.spawn_markers(job);
        }
        Ok(())
    }

    async fn allocate_pid(&self) -> Result<ProducerId, Error> {
        // Held across the block write on purpose: no PID leaves before its block is durable.
        let mut pids = self.pids.lock().await;
        let allocation = pids
            .as_ref()
            .ok_or(Error::CoordinatorLoadInProgress)?
            .allocate();
        if let Some(end) = allocation.reserve {
            self.blocking(move |s| s.put_pid_block(end)).await?;
            debug!(node_id = self.node_id, end, "reserved a PID block");
        }
        *pids = Some(allocation.next);
        Ok(allocation.producer_id)
    }

    /// Runs a core step; if it asks for a fresh PID, allocates one (durably) and runs it again.
    async fn with_fresh_pid<T: NeedsPid>(
        &self,
        step: impl Fn(Option<ProducerId>) -> T,
    ) -> Result<T, Error> {
        let first = step(None);
        if !first.needs_pid() {
            return Ok(first);
        }
        let pid = self.allocate_pid().await?;
        Ok(step(Some(pid)))
    }

    /// Makes an outcome durable (before anyone is answered; through the group commit, so
    /// concurrent transitions of other ids share the flush), then hands its markers to the
    /// marker writer.
    pub(super) async fn apply(
        self: &Arc<Self>,
        stored: &mut Option<TxnMetadata>,
        outcome: Outcome,
    ) -> Result<ProducerIdAndEpoch, Error> {
        self.apply_as(stored, outcome, Write::Flushed).await
    }

    /// [`Shared::apply`], with the write made durable as `write` says.
    pub(super) async fn apply_as(
        self: &Arc<Self>,
        stored: &mut Option<TxnMetadata>,
        outcome: Outcome,
        write: Write,
    ) -> Result<ProducerIdAndEpoch, Error> {
        if let Some(mut next) = outcome.persist {
            // The epoch history is stored with the change it records (bounded).
            let cause = bump_cause(stored.as_ref(), &next);
            let now = now_ms();
            if let Some(cause) = cause {
                let requester = REQUESTER
                    .try_with(|r| r.clone())
                    .unwrap_or_else(|_| "coordinator".to_string());
                next.record_epoch_change(cause.name(), &requester, now);
            }
            let metrics = &self.config.metrics;
            match write {
                Write::Flushed => {
                    let started = Instant::now();
                    self.commit.put_txn(next.clone()).await?;
                    metrics.flushed("coordinator", started.elapsed());
                }
                Write::Queued => self.commit.queue_txn(next.clone())?,
            }
            log_transition(stored.as_ref(), &next, cause);
            observe_transition(metrics, stored.as_ref(), &next, cause, now);
            *stored = Some(next);
        }
        if let Some(job) = outcome.markers {
            self.spawn_markers(job);
        }
        outcome.reply.map_err(Error::Protocol)
    }

    /// Takes the lock of `caller.id` (after the routing check) and runs one core transition
    /// on it: allocate a PID if asked, persist, log, spawn markers, and return the reply.
    ///
    /// No spinning after EndTxn: when the answer is CONCURRENT_TRANSACTIONS and the id is in
    /// Prepare* (its markers are outstanding), the request releases the lock and waits, up to
    /// `max_prepare_wait` from its arrival, for the marker writer to complete the transaction
    /// ([`IdSlot::settled`]). Then a request that changed nothing runs again and gets the
    /// answer of the settled state; one whose CONCURRENT_TRANSACTIONS came with a persisted
    /// change (InitProducerId fencing an open transaction, section 4 step 6) keeps that
    /// answer, now sent once the abort completed, so the caller's retry finds it complete.
    /// At the deadline (or at shutdown) the answer is CONCURRENT_TRANSACTIONS as before.
    async fn on_id(
        self: &Arc<Self>,
        id: &str,
        create: bool,
        step: impl Fn(Option<&TxnMetadata>, Option<ProducerId>) -> Outcome,
    ) -> Result<ProducerIdAndEpoch, Error> {
        self.check_owner(id)?;
        let mut slot = self.slot(id, create);
        let deadline = tokio::time::Instant::now() + self.config.max_prepare_wait;
        loop {
            let mut stored = slot.meta.lock().await;
            if slot.removed.load(std::sync::atomic::Ordering::SeqCst) {
                // Expired while this request waited for the lock: the id starts over in a
                // new slot (an InitProducerId then gets a new PID).
                drop(stored);
                slot = self.slot(id, create);
                continue;
            }
            let outcome = self
                .with_fresh_pid(|pid| step(stored.as_ref(), pid))
                .await?;
            let changed = outcome.persist.is_some();
            let reply = self.apply(&mut stored, outcome).await;
            let markers_outstanding = matches!(
                reply,
                Err(Error::Protocol(TxnError::ConcurrentTransactions(_)))
            ) && stored.as_ref().is_some_and(|m| m.state.is_prepare());
            if !markers_outstanding || tokio::time::Instant::now() >= deadline {
                return reply;
            }
            // Registered before the lock is released, so a completion in between is not missed.
            let settled = slot.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            drop(stored);
            let mut stop = self.stop.subscribe();
            let woken = tokio::select! {
                _ = settled => true,
                _ = tokio::time::sleep_until(deadline) => false,
                _ = stop.wait_for(|s| *s) => false,
            };
            if !woken || changed {
                debug!(txn_id = %id, woken, "answering CONCURRENT_TRANSACTIONS after waiting for markers");
                return reply;
            }
        }
    }

    /// InitProducerId: a transactional producer's (PID, epoch), or a fresh PID at epoch 0 for
    /// an idempotent one (any coordinator hands those out).
    pub(super) async fn init_producer_id(
        self: &Arc<Self>,
        request: Option<InitProducerId>,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let Some(InitProducerId {
            id,
            timeout_ms,
            expected,
            version,
        }) = request
        else {
            self.check_loaded()?;
            let pid = self.allocate_pid().await?;
            debug!(pid, "idempotent producer id allocated");
            return Ok(ProducerIdAndEpoch::new(pid, 0));
        };
        let now = now_ms();
        self.on_id(&id, true, |meta, pid| {
            core::init_producer_id_for_version(&id, meta, timeout_ms, expected, now, pid, version)
        })
        .await
    }

    /// AddPartitionsToTxn.
    pub(super) async fn add_partitions(
        self: &Arc<Self>,
        caller: Caller,
        partitions: Vec<TopicPartition>,
    ) -> Result<(), Error> {
        let (id, now) = (caller.id, now_ms());
        self.on_id(&id, false, |meta, _| {
            core::add_partitions(&id, meta, caller.producer, &partitions, &self.topology, now)
        })
        .await
        .map(drop)
    }

    /// AddOffsetsToTxn.
    pub(super) async fn add_offsets(
        self: &Arc<Self>,
        caller: Caller,
        group: String,
    ) -> Result<(), Error> {
        let (id, now) = (caller.id, now_ms());
        self.on_id(&id, false, |meta, _| {
            core::add_offsets(&id, meta, caller.producer, &group, now)
        })
        .await
        .map(drop)
    }

    /// TxnOffsetCommit.
    pub(super) async fn txn_offset_commit(
        self: &Arc<Self>,
        caller: Caller,
        group: String,
        offsets: Vec<(TopicPartition, i64)>,
    ) -> Result<(), Error> {
        let (id, now) = (caller.id, now_ms());
        self.on_id(&id, false, |meta, _| {
            core::txn_offset_commit(
                &id,
                meta,
                caller.producer,
                &group,
                &offsets,
                &self.topology,
                now,
            )
        })
        .await
        .map(drop)
    }

    /// EndTxn: the caller's (PID, epoch) from now on.
    pub(super) async fn end_txn(
        self: &Arc<Self>,
        caller: Caller,
        result: TxnResult,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let (id, now) = (caller.id, now_ms());
        self.on_id(&id, false, |meta, pid| {
            core::end_txn(&id, meta, caller.producer, result, now, pid)
        })
        .await
    }

    /// VerifyTransaction (read only).
    pub(super) async fn verify_transaction(
        &self,
        caller: Caller,
        partition: TopicPartition,
    ) -> Result<u64, Error> {
        self.check_owner(&caller.id)?;
        let slot = self.slot(&caller.id, false);
        let stored = slot.meta.lock().await;
        core::verify_transaction(&caller.id, stored.as_ref(), caller.producer, &partition)
            .map_err(Error::Protocol)
    }

    /// ListTransactions: the ids this node holds whose wire state is in `filters` (all if
    /// empty), sorted by id.
    pub(super) async fn list_transactions(
        &self,
        filters: BTreeSet<i32>,
    ) -> Result<Vec<proto::TransactionListing>, Error> {
        self.check_loaded()?;
        let mut slots = self.all_slots();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        let mut listings = Vec::new();
        for (id, slot) in slots {
            let stored = slot.meta.lock().await;
            let Some(m) = stored.as_ref() else { continue };
            let state = wire::state(m.state) as i32;
            if filters.is_empty() || filters.contains(&state) {
                listings.push(proto::TransactionListing {
                    transactional_id: id,
                    producer_id: m.producer_id,
                    state,
                });
            }
        }
        Ok(listings)
    }

    /// DescribeTransactions for one id: its description, or the error in it.
    pub(super) async fn describe_transaction(
        &self,
        id: &str,
        now: i64,
    ) -> proto::TransactionDescription {
        let checked = wire::check_id("transactional id", id).and_then(|_| self.check_owner(id));
        if let Err(e) = checked {
            return wire::description_error(id, self.node_id, &e);
        }
        let slot = self.slot(id, false);
        let stored = slot.meta.lock().await;
        match stored.as_ref() {
            None => wire::description_unknown(id, self.node_id),
            Some(m) => wire::description(m, self.node_id, now),
        }
    }

    /// The periodic scan of PROTOCOL.md section 8.
    pub(super) async fn timeout_scan(self: Arc<Self>) {
        loop {
            if self.sleep_or_stop(self.config.timeout_scan_interval).await {
                return;
            }
            let now = now_ms();
            for (id, slot) in self.all_slots() {
                // A busy id is looked at again on the next scan.
                let Ok(mut stored) = slot.meta.try_lock() else {
                    continue;
                };
                if let Err(e) = self.expire(&mut stored, now).await {
                    warn!(txn_id = %id, error = %e, "aborting a timed-out transaction failed; retrying on the next scan");
                }
                if let Err(e) = self.remove_if_expired(&id, &slot, &mut stored, now).await {
                    warn!(txn_id = %id, error = %e, "removing an expired transactional id failed; retrying on the next scan");
                }
            }
        }
    }

    /// The timeout scan's step for one locked id that has been idle past
    /// [`super::CoordinatorConfig::transactional_id_expiration`] ([`core::is_expired_id`]): removes
    /// it, durably and after every write of it queued before, then from memory. Its PID is
    /// never handed out again: a new instance of the id gets a new one, and the old instance is
    /// fenced by it.
    async fn remove_if_expired(
        &self,
        id: &str,
        slot: &Slot,
        stored: &mut Option<TxnMetadata>,
        now: i64,
    ) -> Result<(), Error> {
        let expiration =
            i64::try_from(self.config.transactional_id_expiration.as_millis()).unwrap_or(i64::MAX);
        let Some(meta) = stored.as_ref() else {
            return Ok(());
        };
        if !core::is_expired_id(meta, now, expiration) {
            return Ok(());
        }
        self.commit.remove_txn(id.to_string()).await?;
        let meta = stored.take().expect("checked above");
        slot.removed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        {
            let mut map = lock(&self.txns);
            if map.get(id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                map.remove(id);
            }
        }
        self.config
            .metrics
            .transaction_state_removed(meta.state.name());
        info!(
            txn_id = %id,
            producer_id = meta.producer_id,
            epoch = meta.producer_epoch,
            idle_ms = now - meta.last_update_ms,
            "transactional id expired and removed"
        );
        Ok(())
    }

    /// The timeout scan's step for one locked id: aborts it if it is an Ongoing transaction
    /// older than its timeout ([`core::expire_timed_out`]), else does nothing.
    async fn expire(
        self: &Arc<Self>,
        stored: &mut Option<TxnMetadata>,
        now: i64,
    ) -> Result<(), Error> {
        let Some(meta) = stored.as_ref() else {
            return Ok(());
        };
        let expired = self
            .with_fresh_pid(|pid| core::expire_timed_out(meta, now, pid))
            .await?;
        match expired {
            None => Ok(()),
            Some(outcome) => self.apply(stored, outcome).await.map(drop),
        }
    }
}

/// How [`Shared::apply_as`] writes a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Write {
    /// Durable before `apply_as` returns: every transition a reply depends on.
    Flushed,
    /// Queued in the group commit and made durable by the next flush, which nobody waits for:
    /// Complete* only, which records what is durable already (see `commit`).
    Queued,
}

/// What moved the epoch (or the PID) from `old` to `new`, if anything did. Read from the two
/// stored states alone: a fence is an abort of an Ongoing transaction with `last_epoch` -1 (the
/// new instance's InitProducerId, PROTOCOL.md section 4 step 6) or a bump from a settled state
/// with `last_epoch` -1 (step 7); KIP-360 recovery is a settled bump that kept `last_epoch`. An
/// EndTxn(ABORT) and a KIP-360 recovery of an open transaction store the same thing and are
/// both counted as `end_txn`.
pub(super) fn bump_cause(old: Option<&TxnMetadata>, new: &TxnMetadata) -> Option<EpochBumpCause> {
    let Some(old) = old else {
        return Some(EpochBumpCause::NewProducerId);
    };
    let (before, after) = (old.client_identity(), new.client_identity());
    if before == after {
        return None;
    }
    if before.producer_id != after.producer_id {
        return Some(EpochBumpCause::Rotation);
    }
    Some(match (old.state, new.state) {
        (TxnState::Ongoing, TxnState::PrepareAbort) if new.timed_out => EpochBumpCause::Timeout,
        (TxnState::Ongoing, TxnState::PrepareAbort) if new.last_epoch == -1 => {
            EpochBumpCause::NewInstance
        }
        (_, TxnState::Empty) if new.last_epoch == -1 => EpochBumpCause::NewInstance,
        (_, TxnState::Empty) => EpochBumpCause::Kip360,
        _ => EpochBumpCause::EndTxn,
    })
}

/// Counts a durable transition in the node's metrics: the state gauge, the epoch bump and its
/// cause, and for a completed transaction how long it was open and how long its markers took.
fn observe_transition(
    metrics: &Metrics,
    old: Option<&TxnMetadata>,
    new: &TxnMetadata,
    cause: Option<EpochBumpCause>,
    now: i64,
) {
    metrics.transaction_state(old.map(|o| o.state.name()), new.state.name());
    if let Some(cause) = cause {
        metrics.epoch_bump(cause);
    }
    let Some(old) = old else { return };
    let result = match (old.state, new.state) {
        (TxnState::PrepareCommit, TxnState::CompleteCommit) => "commit",
        (TxnState::PrepareAbort, TxnState::CompleteAbort) => "abort",
        _ => return,
    };
    let ms = |from: i64| Duration::from_millis(u64::try_from(now - from).unwrap_or(0));
    let open_for = if old.txn_start_ms >= 0 {
        ms(old.txn_start_ms)
    } else {
        Duration::ZERO
    };
    metrics.transaction_completed(result, open_for, ms(old.last_update_ms));
}

/// Logs a durable transition at the level an operator needs: a new producer id, a fence, a
/// timeout, a KIP-360 recovery and a PID rotation at info with their cause; what every
/// transaction does (begin, prepare, complete) at debug.
fn log_transition(old: Option<&TxnMetadata>, new: &TxnMetadata, cause: Option<EpochBumpCause>) {
    let txn_id = &new.transactional_id;
    let id = new.client_identity();
    let (pid, epoch, state) = (id.producer_id, id.epoch, new.state.name());
    let Some(old) = old else {
        info!(%txn_id, pid, epoch, state, cause = "new_producer_id", "new transactional id: producer id allocated");
        return;
    };
    let from = old.state.name();
    match cause {
        Some(EpochBumpCause::NewInstance) if new.state == TxnState::PrepareAbort => {
            info!(%txn_id, pid, epoch, state, from, cause = "new_instance", fenced_epoch = old.producer_epoch,
                  "fencing an older instance: aborting its transaction")
        }
        Some(EpochBumpCause::NewInstance) => {
            info!(%txn_id, pid, epoch, state, from, cause = "new_instance", fenced_epoch = old.producer_epoch,
                  "new instance: producer epoch bumped, older instances fenced")
        }
        Some(EpochBumpCause::Timeout) => {
            info!(%txn_id, pid, epoch, state, from, cause = "timeout", "transaction timed out: fenced, aborting")
        }
        Some(cause @ (EpochBumpCause::Kip360 | EpochBumpCause::Rotation)) => {
            info!(%txn_id, pid, epoch, state, from, %cause, previous_pid = old.producer_id,
                  previous_epoch = old.producer_epoch, "producer epoch bumped")
        }
        Some(cause) => debug!(%txn_id, pid, epoch, state, from, %cause, "producer epoch bumped"),
        None => debug!(%txn_id, pid, epoch, state, from, "transaction state change"),
    }
}
