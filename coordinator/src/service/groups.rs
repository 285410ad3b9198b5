//! The group room: this node as the coordinator of consumer groups. The receiving side of
//! group markers (fenced by [`core::write_group_marker`] over the shared
//! [`cluster::marker_fence`] rule), OffsetFetch (stable or not), TxnOffsetCommit as the group's
//! coordinator receives it (KIP-447's pending offsets, then handed to the transaction's
//! coordinator), and Kafka's OffsetCommit outside a transaction (the Kafka face checks the group
//! membership first). The only room that writes `__consumer_offsets` and
//! `__group_marker_state`.

use std::collections::BTreeSet;
use std::sync::Arc;

use cluster::node::lock;
use cluster::TopicPartition;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::ErrorCode;
use tracing::{debug, info, warn};

use super::{wire, Shared};
use crate::core::{self, GroupMarker};
use crate::error::code_of;
use crate::storage::{GroupProtocol, PendingTxnOffset};
use crate::Error;

impl Shared {
    /// The group coordinator's side of a group marker: fence it against what the group
    /// recorded ([`core::write_group_marker`]); if accepted, make its offsets (COMMIT) and its
    /// epoch and generation durable before answering.
    pub(super) async fn write_group_marker(&self, marker: GroupMarker) -> Result<(), Error> {
        self.check_owner(&marker.group_id)?;
        // Held across the read and the write on purpose: a second marker for this group must
        // be checked against the fence the first one writes.
        let _guard = self.groups.lock(&marker.group_id).await;
        let (group, pid, coordinator) = (
            marker.group_id.clone(),
            marker.producer_id,
            marker.coordinator_id,
        );
        let fence = {
            let group = group.clone();
            self.blocking(move |s| s.group_marker_fence(&group, pid, coordinator))
                .await?
        };
        let (epoch, generation, result) =
            (marker.epoch, marker.coordinator_generation, marker.result);
        // The pending entries change in memory and on disk as one step (see `pending_writes`).
        let _pending = self.pending_writes.write(&group).await;
        match core::write_group_marker(&fence, marker) {
            Err(e) => {
                warn!(%group, pid, epoch, coordinator, generation, ?result,
                      recorded_epoch = ?fence.producer_epoch,
                      recorded_generation = ?fence.coordinator_generation,
                      error = %e, "group marker refused");
                Err(Error::Protocol(e))
            }
            Ok(None) => {
                debug!(%group, pid, epoch, coordinator, generation, "group marker repeated; nothing to write");
                self.end_repeated_marker(&group, pid, epoch).await;
                Ok(())
            }
            Ok(Some(write)) if !write.ends_transaction => {
                // The same marker again from a newer generation of its coordinator: only that
                // generation is recorded.
                self.blocking(move |s| s.apply_group_marker(&write)).await?;
                debug!(%group, pid, epoch, coordinator, generation, "group marker repeated; generation recorded");
                self.end_repeated_marker(&group, pid, epoch).await;
                Ok(())
            }
            Ok(Some(write)) => {
                let offsets = write.offsets.len();
                self.blocking(move |s| s.apply_group_marker(&write)).await?;
                debug!(%group, pid, epoch, coordinator, generation, ?result, offsets, "group marker applied");
                // Only once the offsets are durable (and the pending records gone with them,
                // in the same sled transaction): a stable OffsetFetch then reads them. Every
                // epoch of the PID: its transaction is in Prepare* until every marker is
                // applied, so no later transaction of the PID has a commit accepted yet.
                lock(&self.pending_txn_offsets).complete(&group, pid, None);
                Ok(())
            }
        }
    }

    /// A marker of `pid` at `epoch` came again (its transaction ended here already): the PID's
    /// next transaction runs at `epoch` (version 2: the epoch the marker carried; version 1:
    /// the same epoch), so its commits here stay pending. What is left of the ended
    /// transaction below that epoch (recorded after the marker by a commit whose answer never
    /// came, or loaded from a disk written before epochs were kept) ends now, on disk too. The
    /// caller holds the group's lock and `pending_writes` exclusively.
    async fn end_repeated_marker(&self, group: &str, pid: cluster::ProducerId, epoch: i16) {
        let released = lock(&self.pending_txn_offsets).complete(group, pid, Some(epoch));
        if released.is_empty() {
            return;
        }
        let g = group.to_string();
        if let Err(e) = self
            .blocking(move |s| s.remove_pending_txn_offsets(&g, pid, &released))
            .await
        {
            warn!(%group, pid, error = %e, "could not remove pending offsets; they expire");
        }
    }

    /// KIP-447: a TxnOffsetCommit of `producer` for `partitions` of `group` is about to be
    /// handed to the transaction: pending in memory (held by this commit, see
    /// [`core::PendingTxnOffsets`]), then on disk before it goes on (so a restarted
    /// coordinator still answers UNSTABLE_OFFSET_COMMIT until the marker).
    async fn record_pending_txn_offsets(
        &self,
        group: &str,
        producer: core::ProducerIdAndEpoch,
        partitions: &[TopicPartition],
    ) -> Result<(), Error> {
        let written = {
            // Shared: commits record side by side; a removal waits (see `pending_writes`).
            let _pending = self.pending_writes.read(group).await;
            let now = cluster::node::now_ms();
            lock(&self.pending_txn_offsets).record(
                group,
                producer.producer_id,
                producer.epoch,
                partitions.iter().cloned(),
                now,
            );
            let (g, pid, tps) = (group.to_string(), producer.producer_id, partitions.to_vec());
            let epoch = producer.epoch;
            self.blocking(move |s| s.put_pending_txn_offsets(&g, pid, epoch, &tps, now))
                .await
        };
        if let Err(e) = written {
            self.forget_pending_txn_offsets(group, producer, partitions)
                .await;
            return Err(e.into());
        }
        Ok(())
    }

    /// TxnOffsetCommit as the group's coordinator receives it (Kafka clients and our own
    /// client send it there; the Kafka face checks the membership first). If this node
    /// coordinates the group, the offsets are pending (KIP-447), durably, BEFORE the
    /// transaction records them, so a stable OffsetFetch can never read the older offset in
    /// between; they stop being pending when the transaction's marker for the group is applied,
    /// or, for this commit's own hold, at once if the transaction's coordinator refuses it (what
    /// another accepted or unanswered commit holds stays, see [`core::PendingTxnOffsets`]).
    /// That coordinator is this node or, over gRPC, the owner of the transactional id, to
    /// which the commit is handed on signed. A node that does not coordinate the group takes
    /// only such a commit, from the group's coordinator, and applies it as the transaction's
    /// coordinator (so a request is forwarded at most once); a client's commit sent there
    /// (unsigned) is NOT_COORDINATOR, since the group's coordinator would never know it is
    /// pending. The transaction coordinator's answer, as a wire code and message.
    pub(super) async fn txn_offset_commit_at_group(
        self: &Arc<Self>,
        request: proto::TxnOffsetCommitRequest,
    ) -> (i32, String) {
        match self
            .txn_offset_commit_fenced(request, || Ok::<(), std::convert::Infallible>(()))
            .await
        {
            Ok(answer) => answer,
            Err(never) => match never {},
        }
    }

    /// [`Self::txn_offset_commit_at_group`], with `fence` (the Kafka face's KIP-447 membership
    /// check) asked again once the offsets are pending, before the commit goes on: a check made
    /// only before they were pending could pass, then the group rebalance while the commit
    /// waits to record them, and the partitions' new owner read the old offset as stable in
    /// between. Pending first, then checked: a rebalance after the check finds them pending
    /// (UNSTABLE_OFFSET_COMMIT until the transaction ends), and a commit whose check fails is
    /// refused with `fence`'s error and its hold given back.
    pub(crate) async fn txn_offset_commit_fenced<E>(
        self: &Arc<Self>,
        request: proto::TxnOffsetCommitRequest,
        fence: impl FnOnce() -> Result<(), E>,
    ) -> Result<(i32, String), E> {
        let (caller, group, offsets) = match wire::txn_offset_commit(request.clone()) {
            Ok(checked) => checked,
            Err(e) => return Ok(code_of::<()>(&Err(e))),
        };
        if let Err(not_coordinator) = self.check_owner(&group) {
            if request.auth.is_none() {
                return Ok(code_of::<()>(&Err(not_coordinator)));
            }
            let result = match self
                .authenticate(&request, true)
                .and_then(|sender| self.check_group_coordinator(sender, &group))
            {
                Ok(()) => self.txn_offset_commit(caller, group, offsets).await,
                Err(e) => Err(e),
            };
            return Ok(code_of(&result));
        }
        let partitions: Vec<TopicPartition> = offsets.iter().map(|(tp, _)| tp.clone()).collect();
        let producer = caller.producer;
        if let Err(e) = self
            .record_pending_txn_offsets(&group, producer, &partitions)
            .await
        {
            return Ok(code_of::<()>(&Err(e)));
        }
        if let Err(fenced) = fence() {
            self.forget_pending_txn_offsets(&group, producer, &partitions)
                .await;
            return Err(fenced);
        }
        let owner = self.topology.coordinator_for(&caller.id).clone();
        let answer = if owner.id == self.node_id {
            Ok(code_of(
                &self.txn_offset_commit(caller, group.clone(), offsets).await,
            ))
        } else {
            self.forward_txn_offset_commit(&owner, request).await
        };
        Ok(match answer {
            Ok((code, message)) => {
                if code != ErrorCode::None as i32 {
                    // Refused: the transaction does not hold these offsets.
                    self.forget_pending_txn_offsets(&group, producer, &partitions)
                        .await;
                }
                (code, message)
            }
            // No answer: the transaction may hold them, so they stay pending until its marker
            // for the group (a group in the transaction gets one, COMMIT or ABORT), or until
            // they age out (`max_pending_age_ms`).
            Err(message) => (ErrorCode::CoordinatorNotAvailable as i32, message),
        })
    }

    /// TxnOffsetCommit handed to `owner`, the transactional id's coordinator, over gRPC on
    /// this node's cached channel, signed as the group's coordinator: its answer, or why there
    /// was none (the outcome is then unknown).
    async fn forward_txn_offset_commit(
        &self,
        owner: &cluster::Node,
        mut request: proto::TxnOffsetCommitRequest,
    ) -> Result<(i32, String), String> {
        self.sign(&mut request);
        let channel = self.channel(&owner.address)?;
        match TransactionCoordinatorClient::new(channel)
            .txn_offset_commit(request)
            .await
        {
            Ok(reply) => {
                let reply = reply.into_inner();
                Ok((reply.error_code, reply.error_message))
            }
            Err(status) => {
                debug!(
                    coordinator = owner.id,
                    "forwarding TxnOffsetCommit failed: {status}"
                );
                Err(format!(
                    "the transaction's coordinator {} did not answer: {status}",
                    owner.id
                ))
            }
        }
    }

    /// The TxnOffsetCommit of `producer` for `partitions` announced by
    /// [`Self::record_pending_txn_offsets`] was refused: it gives its holds back, and a
    /// partition no commit of the PID holds any more leaves the disk too. What an accepted (or
    /// unanswered) commit holds stays pending, whatever its epoch.
    async fn forget_pending_txn_offsets(
        &self,
        group: &str,
        producer: core::ProducerIdAndEpoch,
        partitions: &[TopicPartition],
    ) {
        // Exclusive: no commit records between the memory's decision and the disk's removal
        // (its record would be removed from disk under it).
        let _pending = self.pending_writes.write(group).await;
        let producer_id = producer.producer_id;
        let released =
            lock(&self.pending_txn_offsets).forget(group, producer_id, producer.epoch, partitions);
        if released.is_empty() {
            return;
        }
        let g = group.to_string();
        if let Err(e) = self
            .blocking(move |s| s.remove_pending_txn_offsets(&g, producer_id, &released))
            .await
        {
            warn!(group, producer_id, error = %e, "could not remove pending offsets; they expire");
        }
    }

    /// How long a pending transactional offset counts: twice the maximum transaction timeout
    /// (no transaction lives longer; see [`core::PendingTxnOffsets`]).
    fn max_pending_age_ms(&self) -> i64 {
        2 * i64::from(self.config.max_transaction_timeout_ms)
    }

    /// At start: what was pending before, back in memory; entries past
    /// [`Self::max_pending_age_ms`] are removed from disk instead (their marker is lost for
    /// good, see [`core::PendingTxnOffsets`]).
    pub(super) async fn load_pending_txn_offsets(&self, stored: Vec<PendingTxnOffset>) {
        let now = cluster::node::now_ms();
        let max_age = self.max_pending_age_ms();
        let (live, expired): (Vec<_>, Vec<_>) = stored
            .into_iter()
            .partition(|p| now.saturating_sub(p.recorded_ms) < max_age);
        {
            let mut pending = lock(&self.pending_txn_offsets);
            for p in live {
                pending.record(
                    &p.group,
                    p.producer_id,
                    p.epoch,
                    [p.partition],
                    p.recorded_ms,
                );
            }
        }
        for p in expired {
            warn!(group = %p.group, pid = p.producer_id, partition = %p.partition,
                  recorded_ms = p.recorded_ms, "pending transactional offset expired; removed");
            let (group, pid, hold) = (p.group.clone(), p.producer_id, [(p.partition, p.epoch)]);
            let removed = self
                .blocking(move |s| s.remove_pending_txn_offsets(&group, pid, &hold))
                .await;
            if let Err(e) = removed {
                warn!(group = %p.group, pid, error = %e, "could not remove an expired pending offset");
            }
        }
    }

    /// Kafka's OffsetCommit outside a transaction: every partition must exist
    /// (UNKNOWN_TOPIC_OR_PARTITION, nothing written), then the offsets are written durably under
    /// the group's lock, which the group markers take too.
    pub(super) async fn offset_commit(
        &self,
        group: String,
        offsets: Vec<(TopicPartition, i64)>,
    ) -> Result<(), Error> {
        if let Some((tp, _)) = offsets
            .iter()
            .find(|(tp, _)| !self.topology.partition_exists(&tp.topic, tp.partition))
        {
            return Err(Error::Protocol(core::TxnError::UnknownTopicOrPartition(
                format!("{tp} does not exist; no offset was committed"),
            )));
        }
        self.check_owner(&group)?;
        let _guard = self.groups.lock(&group).await;
        let checked: core::PendingOffsets = offsets.into_iter().collect();
        self.blocking(move |st| st.commit_group_offsets(&group, &checked))
            .await?;
        Ok(())
    }

    /// Kafka's DeleteGroups and OffsetDelete: deletes, durably, the committed offsets of
    /// `group` that `decide` returns along with its answer, given the group's committed
    /// partitions and those a transaction has offsets pending for. Under the group's lock
    /// (markers and plain commits wait) with the pending entries held still (`pending_writes`
    /// exclusively: no TxnOffsetCommit records one meanwhile), so what `decide` saw is what
    /// is deleted (see [`crate::group_admin`]). The group's marker fences stay.
    pub(super) async fn delete_group_offsets<T>(
        &self,
        group: String,
        decide: impl FnOnce(&BTreeSet<TopicPartition>, &[TopicPartition]) -> (Vec<TopicPartition>, T),
    ) -> Result<T, Error> {
        self.check_owner(&group)?;
        let _guard = self.groups.lock(&group).await;
        let _pending = self.pending_writes.write(&group).await;
        let pending = lock(&self.pending_txn_offsets).pending_partitions(
            &group,
            cluster::node::now_ms(),
            self.max_pending_age_ms(),
        );
        let g = group.clone();
        let committed: BTreeSet<TopicPartition> = self
            .blocking(move |st| st.group_offsets(&g))
            .await?
            .into_keys()
            .collect();
        let (delete, answer) = decide(&committed, &pending);
        let delete: Vec<TopicPartition> = delete
            .into_iter()
            .filter(|tp| committed.contains(tp))
            .collect();
        if !delete.is_empty() {
            let count = delete.len();
            let g = group.clone();
            self.blocking(move |st| st.delete_group_offsets(&g, &delete))
                .await?;
            info!(%group, offsets = count, "committed offsets deleted");
        }
        Ok(answer)
    }

    /// One change of the group `group`'s membership of `protocol`, under the group's write
    /// lock, so that the changes reach storage in the order they were made: `change` returns
    /// what to store (`Some(Some(state))`, `Some(None)` to remove it, `None` for nothing) with
    /// its answer, which is returned once what it stored is durable; `written` gets the answer
    /// under the lock once a write is durable (a caller that keeps what storage holds updates
    /// it there, before any other change of the group is written).
    pub(super) async fn group_state_change<T>(
        &self,
        protocol: GroupProtocol,
        group: String,
        change: impl FnOnce() -> (Option<Option<Vec<u8>>>, T),
        written: impl FnOnce(&T),
    ) -> Result<T, Error> {
        self.check_owner(&group)?;
        let _guard = self.group_state_writes.lock(&group).await;
        let (write, answer) = change();
        if let Some(state) = write {
            self.blocking(move |st| st.put_group_state(protocol, &group, state.as_deref()))
                .await?;
            written(&answer);
        }
        Ok(answer)
    }

    /// The stored membership state of every group of `protocol` this node coordinates (by the
    /// topology: this runs at start, before the node serves), each taken under the group's
    /// write lock by `restore` (which gets the group id and its state and keeps what it does
    /// not hold already). How many were handed over.
    pub(super) async fn restore_group_states(
        &self,
        protocol: GroupProtocol,
        mut restore: impl FnMut(&str, Vec<u8>),
    ) -> Result<usize, Error> {
        let stored = self.blocking(move |st| st.group_states(protocol)).await?;
        let mut restored = 0;
        for (group, state) in stored {
            if self.topology.coordinator_for(&group).id != self.node_id {
                continue;
            }
            let _guard = self.group_state_writes.lock(&group).await;
            restore(&group, state);
            restored += 1;
        }
        Ok(restored)
    }

    /// The groups with committed offsets that this node coordinates.
    pub(super) async fn offset_groups(&self) -> Result<Vec<String>, Error> {
        let groups = self.blocking(|st| st.offset_groups()).await?;
        Ok(groups
            .into_iter()
            .filter(|g| self.check_owner(g).is_ok())
            .collect())
    }

    /// OffsetFetch: the committed offsets of `group` for `partitions` (-1 where none), or all of
    /// them when `partitions` is empty. With `require_stable` (KIP-447), UNSTABLE_OFFSET_COMMIT
    /// instead while a transaction's offset for one of them (any of the group's, when
    /// `partitions` is empty) is not applied yet.
    pub(super) async fn offset_fetch(
        &self,
        group: String,
        partitions: Vec<TopicPartition>,
        require_stable: bool,
    ) -> Result<Vec<proto::PartitionOffset>, Error> {
        let (offsets, pending) = self
            .offset_fetch_with_pending(group.clone(), partitions)
            .await?;
        if require_stable {
            if let Some(tp) = pending.into_iter().next() {
                return Err(Error::UnstableOffsetCommit(format!(
                    "a transaction's offset for {tp} of group {group} is not applied yet; retry"
                )));
            }
        }
        Ok(offsets)
    }

    /// The committed offsets of `group` for `partitions` (-1 where none; all of them when
    /// `partitions` is empty), and which of those partitions (all the group's pending ones,
    /// when `partitions` is empty) have a transaction's offset not applied yet: one snapshot.
    ///
    /// Both are read under the group's lock, which a group marker holds from its write to the
    /// end of its pending offsets: a fetch never reads the offsets from before a marker and
    /// the pending state from after it (which would answer an old offset as stable: a
    /// read_committed consumer would then process input again). The lock is held across the
    /// storage read on purpose.
    pub(super) async fn offset_fetch_with_pending(
        &self,
        group: String,
        partitions: Vec<TopicPartition>,
    ) -> Result<(Vec<proto::PartitionOffset>, Vec<TopicPartition>), Error> {
        self.check_owner(&group)?;
        let _guard = self.groups.lock(&group).await;
        let max_age = self.max_pending_age_ms();
        let pending: Vec<TopicPartition> = {
            let all = lock(&self.pending_txn_offsets).pending_partitions(
                &group,
                cluster::node::now_ms(),
                max_age,
            );
            all.into_iter()
                .filter(|tp| partitions.is_empty() || partitions.contains(tp))
                .collect()
        };
        let g = group.clone();
        let committed = self.blocking(move |st| st.group_offsets(&g)).await?;
        if partitions.is_empty() {
            return Ok((wire::offsets(&committed), pending));
        }
        let offsets = partitions
            .into_iter()
            .map(|tp| proto::PartitionOffset {
                offset: committed.get(&tp).copied().unwrap_or(-1),
                topic: tp.topic,
                partition: tp.partition,
            })
            .collect();
        Ok((offsets, pending))
    }
}
