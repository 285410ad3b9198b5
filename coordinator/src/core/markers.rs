//! The transaction coordinator's side of markers (PROTOCOL.md section 7): the [`MarkerJob`] a
//! decided transaction owes, what a destination's reply to a marker means ([`marker_reply`]:
//! the core decides, the shell only delivers), and [`complete_markers`] once all are written.

use std::collections::{BTreeMap, BTreeSet};

use cluster::{NodeId, TopicPartition, Topology};
use proto::ErrorCode;

use super::*;

/// The markers to write for a decided transaction (PROTOCOL.md section 7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkerJob {
    /// The transaction's id.
    pub transactional_id: TransactionalId,
    /// Version 1: the markers carry the epoch the data was written with, not a bumped one.
    pub transaction_version: TransactionVersion,
    /// The transaction's number among its id's ([`TxnMetadata::transaction_number`]).
    pub transaction_number: u64,
    /// (PID, bumped epoch) the markers carry.
    pub identity: ProducerIdAndEpoch,
    /// COMMIT or ABORT.
    pub result: TxnResult,
    /// Partitions to write a marker into.
    pub partitions: BTreeSet<TopicPartition>,
    /// Groups to send a group-offset marker to (with the offsets to commit).
    pub groups: BTreeMap<String, PendingOffsets>,
}

impl MarkerJob {
    /// The partitions grouped by the leader that owns them (partitions without a leader in the
    /// topology are under `None`; they cannot occur after the add-time check).
    pub fn partitions_by_leader(
        &self,
        topology: &Topology,
    ) -> BTreeMap<Option<NodeId>, Vec<TopicPartition>> {
        let mut by_leader: BTreeMap<Option<NodeId>, Vec<TopicPartition>> = BTreeMap::new();
        for tp in &self.partitions {
            let leader = topology.leader_for(&tp.topic, tp.partition).map(|n| n.id);
            by_leader.entry(leader).or_default().push(tp.clone());
        }
        by_leader
    }

    /// The groups grouped by the coordinator that owns them.
    pub fn groups_by_coordinator(
        &self,
        topology: &Topology,
    ) -> BTreeMap<NodeId, Vec<(String, PendingOffsets)>> {
        let mut by_node: BTreeMap<NodeId, Vec<(String, PendingOffsets)>> = BTreeMap::new();
        for (group, offsets) in &self.groups {
            by_node
                .entry(topology.coordinator_for(group).id)
                .or_default()
                .push((group.clone(), offsets.clone()));
        }
        by_node
    }
}

/// Every marker of `job` was acknowledged: Prepare* -> Complete* (section 7). Does nothing if
/// the metadata is no longer the Prepare* that `job` was made from.
pub fn complete_markers(meta: &TxnMetadata, job: &MarkerJob, now_ms: i64) -> Outcome {
    if meta.pending_markers().as_ref() != Some(job) {
        return Outcome::unchanged(meta.client_identity());
    }
    let mut next = meta.clone();
    if meta.next_producer_id != NO_PRODUCER_ID {
        next.previous_producer_id = meta.producer_id;
        next.producer_id = meta.next_producer_id;
        next.producer_epoch = 0;
        next.next_producer_id = NO_PRODUCER_ID;
    }
    next.state = job.result.complete_state();
    next.partitions.clear();
    next.groups.clear();
    next.txn_start_ms = -1;
    next.last_update_ms = now_ms;
    let identity = next.client_identity();
    Outcome {
        persist: Some(next),
        markers: None,
        reply: Ok(identity),
    }
}

/// What the marker writer does with one destination's answer to a marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerReply {
    /// Written (or, for an ABORT, superseded by a newer epoch): never send it again.
    Acknowledged,
    /// Not written yet (a transient error or no answer): send it again after a backoff.
    Retry,
    /// Permanent: this writer must stop and never complete the transaction (a newer
    /// incarnation of this coordinator exists, or a COMMIT was refused for a newer epoch).
    Stop,
}

/// The ONE rule for a marker reply, the same for a partition's leader and a group's
/// coordinator: NONE is acknowledged; TRANSACTION_COORDINATOR_FENCED stops the writer;
/// INVALID_PRODUCER_EPOCH (the destination holds a newer epoch for the PID) counts as
/// acknowledged for an ABORT (nothing can become visible) and stops the writer for a COMMIT (a
/// commit that was not written is never completed; PrepareCommit stays for the next start);
/// anything else is retried.
pub fn marker_reply(result: TxnResult, code: ErrorCode) -> MarkerReply {
    match code {
        ErrorCode::None => MarkerReply::Acknowledged,
        ErrorCode::TransactionCoordinatorFenced => MarkerReply::Stop,
        ErrorCode::InvalidProducerEpoch => match result {
            TxnResult::Abort => MarkerReply::Acknowledged,
            TxnResult::Commit => MarkerReply::Stop,
        },
        _ => MarkerReply::Retry,
    }
}

/// A destination the topology cannot route (a partition without a leader; it cannot occur
/// after the add-time check): an ABORT has nothing to hide there, a COMMIT must not complete.
pub fn marker_unroutable(result: TxnResult) -> MarkerReply {
    match result {
        TxnResult::Abort => MarkerReply::Acknowledged,
        TxnResult::Commit => MarkerReply::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reply_row() {
        use MarkerReply::*;
        for (result, code, want) in [
            (TxnResult::Commit, ErrorCode::None, Acknowledged),
            (TxnResult::Abort, ErrorCode::None, Acknowledged),
            (
                TxnResult::Commit,
                ErrorCode::TransactionCoordinatorFenced,
                Stop,
            ),
            (
                TxnResult::Abort,
                ErrorCode::TransactionCoordinatorFenced,
                Stop,
            ),
            (TxnResult::Commit, ErrorCode::InvalidProducerEpoch, Stop),
            (
                TxnResult::Abort,
                ErrorCode::InvalidProducerEpoch,
                Acknowledged,
            ),
            (TxnResult::Commit, ErrorCode::NotLeaderOrFollower, Retry),
            (TxnResult::Commit, ErrorCode::KafkaStorageError, Retry),
            (TxnResult::Abort, ErrorCode::UnknownServerError, Retry),
        ] {
            assert_eq!(marker_reply(result, code), want, "{result:?} {code:?}");
        }
        assert_eq!(marker_unroutable(TxnResult::Abort), Acknowledged);
        assert_eq!(marker_unroutable(TxnResult::Commit), Stop);
    }
}
