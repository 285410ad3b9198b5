//! WriteTxnMarkers on one partition (PROTOCOL.md section 9), in three steps:
//! 1. [`validate_marker`]: wire validation (negative PID, epoch out of range, negative
//!    generation are INVALID_REQUEST); touches no state;
//! 2. [`check_marker_fence`]: the fencing decision, the cluster-wide rule of
//!    [`cluster::marker_fence`] (shared with the coordinator's group-offset markers): an older
//!    epoch is INVALID_PRODUCER_EPOCH, an older coordinator generation
//!    TRANSACTION_COORDINATOR_FENCED;
//! 3. the plan: close the open transaction with a control record ([`close_txn`]), or only
//!    remember a raised epoch ([`record_epoch`]), or acknowledge a late repeat
//!    ([`repeat_marker`]).
//!
//! Reads the [`PartitionState`], changes nothing: the answer is a [`Plan`].

use std::collections::VecDeque;

use cluster::marker_fence::{self, Decision, Fenced};
use cluster::{ProducerEpoch, ProducerId};

use super::{
    AbortedTxn, ControlRecord, Marker, PartitionState, Plan, ProducerState, NO_GENERATION,
};
use crate::error::{Error, Result};

impl PartitionState {
    /// The marker rules of PROTOCOL.md section 9: older epoch -> INVALID_PRODUCER_EPOCH, older
    /// coordinator generation -> TRANSACTION_COORDINATOR_FENCED, else close the open transaction
    /// with a control record, adopt the epoch and reset the sequence window.
    pub fn plan_marker(&self, m: &Marker, now_ms: i64) -> Result<Plan> {
        let epoch = validate_marker(m)?;
        let pid = m.producer_id;
        let current = self.producers.get(&pid);
        let decision = check_marker_fence(pid, epoch, m.coordinator_generation, current)?;
        let noop = self.noop();
        let next = current.cloned().unwrap_or(ProducerState {
            epoch,
            batches: VecDeque::new(),
            txn_first_offset: None,
            txn_number: None,
            ended_number: None,
            coordinator_generation: NO_GENERATION,
            last_update_ms: now_ms,
        });
        let raises_epoch = decision == Decision::Apply;
        // Transaction version 1: the marker carries the data's epoch; the sequence window is
        // kept (the producer carries on at this epoch), as Kafka's producer state does. A
        // marker numbered below the open transaction is a late one of an earlier transaction.
        let ends_at_same_epoch = m.keeps_epoch()
            && current.is_some_and(|s| epoch == s.epoch && !is_earlier_transaction(m, s));
        Ok(match current.and_then(|s| s.txn_first_offset) {
            Some(first) if raises_epoch || ends_at_same_epoch => {
                close_txn(m, epoch, next, first, noop, now_ms)
            }
            _ if raises_epoch => record_epoch(m, epoch, next, noop, now_ms),
            _ => repeat_marker(m, next, noop, now_ms),
        })
    }

    /// A plan that appends nothing and changes nothing.
    fn noop(&self) -> Plan {
        Plan {
            base_offset: self.high_watermark,
            record_count: 0,
            control: None,
            producer: None,
            aborted: None,
            high_watermark: self.high_watermark,
        }
    }
}

/// Whether version-1 marker `m` ends an earlier transaction than the one open in `state`: both
/// numbers known and the marker's below. (Unknown either way: the marker closes it, as before
/// numbers existed.)
fn is_earlier_transaction(m: &Marker, state: &ProducerState) -> bool {
    m.transaction_number > 0
        && state
            .txn_number
            .is_some_and(|open| m.transaction_number < open)
}

/// Step 1: the marker as the wire sent it; returns its epoch.
fn validate_marker(m: &Marker) -> Result<ProducerEpoch> {
    if m.producer_id < 0 {
        return Err(Error::InvalidRequest(format!(
            "marker producer id {} is negative",
            m.producer_id
        )));
    }
    let epoch = cluster::epoch_from_wire(m.producer_epoch, false).ok_or_else(|| {
        Error::InvalidRequest(format!(
            "marker epoch {} is outside [0, {}]",
            m.producer_epoch,
            i16::MAX
        ))
    })?;
    if m.coordinator_generation < 0 {
        return Err(Error::InvalidRequest(format!(
            "coordinator generation {} is negative",
            m.coordinator_generation
        )));
    }
    Ok(epoch)
}

/// Step 2, the fencing decision: the cluster-wide marker rule ([`cluster::marker_fence`],
/// shared with group offset markers) against what the PID's state here has seen.
pub(crate) fn check_marker_fence(
    pid: ProducerId,
    epoch: ProducerEpoch,
    generation: i64,
    state: Option<&ProducerState>,
) -> Result<Decision> {
    let recorded = marker_fence::Recorded {
        producer_epoch: state.map(|s| s.epoch),
        coordinator_generation: state.map(|s| s.coordinator_generation),
    };
    marker_fence::check(recorded, epoch, generation).map_err(|fenced| match fenced {
        Fenced::InvalidProducerEpoch { recorded, .. } => Error::InvalidProducerEpoch(format!(
            "marker for producer {pid} has epoch {epoch}, older than the current {recorded}"
        )),
        Fenced::CoordinatorFenced { recorded, .. } => Error::TransactionCoordinatorFenced(
            format!(
                "marker for producer {pid} is from coordinator generation {generation}, older than {recorded}"
            ),
        ),
    })
}

/// The marker ends the transaction open here since `first`: a control record, the epoch
/// adopted, the window reset (kept when the epoch stays, transaction version 1), and (ABORT)
/// an aborted-index entry.
fn close_txn(
    m: &Marker,
    epoch: ProducerEpoch,
    mut next: ProducerState,
    first: i64,
    noop: Plan,
    now_ms: i64,
) -> Plan {
    let pid = m.producer_id;
    let base_offset = noop.base_offset;
    if epoch != next.epoch {
        next.batches.clear();
    }
    next.epoch = epoch;
    next.txn_first_offset = None;
    next.txn_number = None;
    next.ended_number = ended(m, next.ended_number);
    next.coordinator_generation = m.coordinator_generation;
    next.last_update_ms = now_ms;
    Plan {
        record_count: 0,
        control: Some(ControlRecord {
            producer_id: pid,
            producer_epoch: epoch,
            commit: m.commit,
            coordinator_id: m.coordinator_id,
            coordinator_generation: m.coordinator_generation,
            timestamp_ms: now_ms,
        }),
        producer: Some((pid, next)),
        aborted: (!m.commit).then_some(AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: base_offset,
        }),
        high_watermark: base_offset + 1,
        ..noop
    }
}

/// Nothing open here: remember the epoch so a zombie is rejected here too.
fn record_epoch(
    m: &Marker,
    epoch: ProducerEpoch,
    mut next: ProducerState,
    noop: Plan,
    now_ms: i64,
) -> Plan {
    next.epoch = epoch;
    next.batches.clear();
    next.ended_number = ended(m, next.ended_number);
    next.coordinator_generation = m.coordinator_generation;
    next.last_update_ms = now_ms;
    Plan {
        producer: Some((m.producer_id, next)),
        ..noop
    }
}

/// The ended-transaction number once marker `m` is applied: its number, if above.
fn ended(m: &Marker, ended: Option<u64>) -> Option<u64> {
    if m.transaction_number > 0 && ended.is_none_or(|n| n < m.transaction_number) {
        Some(m.transaction_number)
    } else {
        ended
    }
}

/// Same epoch, nothing open here: a repeat of the marker that ended the previous transaction,
/// or (version 1) the marker of a transaction whose data has not reached this partition yet.
/// Only a newer coordinator generation and a higher ended-transaction number are remembered:
/// the data of that transaction, verified before the marker came, is then refused rather than
/// opening a transaction no marker will close.
fn repeat_marker(m: &Marker, mut next: ProducerState, noop: Plan, now_ms: i64) -> Plan {
    let ended = ended(m, next.ended_number);
    if next.coordinator_generation < m.coordinator_generation || ended != next.ended_number {
        next.coordinator_generation = next.coordinator_generation.max(m.coordinator_generation);
        next.ended_number = ended;
        next.last_update_ms = now_ms;
        return Plan {
            producer: Some((m.producer_id, next)),
            ..noop
        };
    }
    noop
}
