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

use cluster::node::{lock, now_ms};
use cluster::{ProducerId, TopicPartition};
use tracing::{debug, info, warn};

use super::wire::{self, Caller, InitProducerId};
use super::{Shared, Slot};
use crate::core::{self, Outcome, PidAllocator, ProducerIdAndEpoch, TxnError, TxnMetadata};
use crate::core::{TxnResult, TxnState};
use crate::Error;

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

    /// Start: bump the generation, load owned ids, resume every Prepare*.
    pub(super) async fn load(self: &Arc<Self>) -> Result<(), Error> {
        let snapshot = self.blocking(|s| s.load()).await?;
        let generation = snapshot.generation + 1;
        self.blocking(move |s| s.put_generation(generation)).await?;
        self.generation.store(generation, Ordering::Release);
        *self.pids.lock().await = Some(PidAllocator::new(
            self.coordinator_index,
            self.topology.coordinator_count(),
            snapshot.pid_block_end,
        ));
        let mut resume = Vec::new();
        let mut owned = 0;
        {
            let mut map = lock(&self.txns);
            for meta in snapshot.txns {
                if self.topology.coordinator_for(&meta.transactional_id).id != self.node_id {
                    continue;
                }
                owned += 1;
                if let Some(job) = meta.pending_markers() {
                    resume.push(job);
                }
                map.insert(
                    meta.transactional_id.clone(),
                    Arc::new(tokio::sync::Mutex::new(Some(meta))),
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

    /// Runs one core transition for the locked id: allocate a PID if asked, persist, log,
    /// spawn markers, and return the reply.
    async fn transition(
        self: &Arc<Self>,
        stored: &mut Option<TxnMetadata>,
        step: impl Fn(Option<&TxnMetadata>, Option<ProducerId>) -> Outcome,
    ) -> Result<ProducerIdAndEpoch, Error> {
        let outcome = self
            .with_fresh_pid(|pid| step(stored.as_ref(), pid))
            .await?;
        self.apply(stored, outcome).await
    }

    /// Makes an outcome durable (before anyone is answered), then hands its markers to the
    /// marker writer.
    pub(super) async fn apply(
        self: &Arc<Self>,
        stored: &mut Option<TxnMetadata>,
        outcome: Outcome,
    ) -> Result<ProducerIdAndEpoch, Error> {
        if let Some(next) = outcome.persist {
            let value = next.clone();
            self.blocking(move |s| s.put_txn(&value)).await?;
            log_transition(stored.as_ref(), &next);
            *stored = Some(next);
        }
        if let Some(job) = outcome.markers {
            self.spawn_markers(job);
        }
        outcome.reply.map_err(Error::Protocol)
    }

    /// Takes the lock of `caller.id` (after the routing check) and runs `step` on it.
    async fn on_id(
        self: &Arc<Self>,
        id: &str,
        create: bool,
        step: impl Fn(Option<&TxnMetadata>, Option<ProducerId>) -> Outcome,
    ) -> Result<ProducerIdAndEpoch, Error> {
        self.check_owner(id)?;
        let slot = self.slot(id, create);
        let mut stored = slot.lock().await;
        self.transition(&mut stored, step).await
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
    ) -> Result<(), Error> {
        self.check_owner(&caller.id)?;
        let slot = self.slot(&caller.id, false);
        let stored = slot.lock().await;
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
            let stored = slot.lock().await;
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
        let stored = slot.lock().await;
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
                let Ok(mut stored) = slot.try_lock() else {
                    continue;
                };
                if let Err(e) = self.expire(&mut stored, now).await {
                    warn!(txn_id = %id, error = %e, "aborting a timed-out transaction failed; retrying on the next scan");
                }
            }
        }
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

/// Logs a durable transition at the level an operator needs (PROTOCOL.md's state changes at
/// info, per-request updates at debug).
fn log_transition(old: Option<&TxnMetadata>, new: &TxnMetadata) {
    let txn_id = &new.transactional_id;
    let id = new.client_identity();
    let (pid, epoch, state) = (id.producer_id, id.epoch, new.state.name());
    let Some(old) = old else {
        info!(%txn_id, pid, epoch, state, "new transactional id: producer id allocated");
        return;
    };
    if old.state == new.state && old.client_identity() == id {
        debug!(%txn_id, pid, epoch, state, "transaction updated");
        return;
    }
    let from = old.state.name();
    match new.state {
        TxnState::PrepareAbort if new.timed_out => {
            info!(%txn_id, pid, epoch, state, from, "transaction timed out: fenced, aborting")
        }
        TxnState::PrepareAbort if old.state == TxnState::Ongoing && new.last_epoch == -1 => {
            info!(%txn_id, pid, epoch, state, from, "fencing an older instance: aborting its transaction")
        }
        TxnState::CompleteCommit => info!(%txn_id, pid, epoch, state, "transaction committed"),
        TxnState::CompleteAbort => info!(%txn_id, pid, epoch, state, "transaction aborted"),
        TxnState::Ongoing => debug!(%txn_id, pid, epoch, state, from, "transaction started"),
        _ if old.client_identity() != id => {
            info!(%txn_id, pid, epoch, state, from, "producer epoch bumped")
        }
        _ => info!(%txn_id, pid, epoch, state, from, "transaction state change"),
    }
}
