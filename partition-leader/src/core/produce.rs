//! The Produce checks of PROTOCOL.md section 9, one function per check, in the section's order:
//! 1. [`duplicate`]: one of the PID's last batches again;
//! 2. [`check_epoch`]: fencing, an older epoch is a zombie;
//! 3. [`check_sequence`]: the next sequence (0 after a new epoch);
//! 4. [`check_txn_state`], checks 4 and 5: a batch that opens a transaction needs
//!    verification, a new epoch cannot join an old open transaction, a plain batch cannot
//!    interleave with one.
//!
//! Reads the [`PartitionState`], changes nothing: the answer is a [`ProduceDecision`].

use std::collections::VecDeque;

use super::{
    increment_sequence, BatchHeader, BatchMetadata, PartitionState, Plan, ProduceDecision,
    ProducerState, Verified, NO_GENERATION, NO_PRODUCER_ID, PRODUCER_WINDOW,
};
use crate::error::{Error, Result};

impl PartitionState {
    /// The Produce checks of PROTOCOL.md section 9, in order. `verified`: the coordinator
    /// already confirmed that this batch's (PID, epoch) may open a transaction here.
    pub fn check_produce(
        &self,
        h: &BatchHeader,
        verified: Option<Verified>,
        now_ms: i64,
    ) -> Result<ProduceDecision> {
        if h.producer_id == NO_PRODUCER_ID {
            return Ok(self.append(h, None));
        }
        // An answer older than the producer-state expiry counts for nothing: what the
        // transaction's marker recorded here since may have been forgotten.
        let verified = verified.filter(|v| now_ms < v.valid_until_ms);
        let Some(state) = self.producers.get(&h.producer_id) else {
            return self.check_first_batch(h, verified, now_ms);
        };
        // 1. Exactly one of the last batches again: answer with the original offset.
        if let Some(decision) = duplicate(h, state) {
            return Ok(decision);
        }
        // 2. Fencing: an older epoch is a zombie.
        if let Err(fenced) = check_epoch(h, state) {
            if self.unsafe_skip_epoch_check {
                // DANGER: broken fencing on purpose (see the module docs).
                return Ok(self.append(h, None));
            }
            return Err(fenced);
        }
        // 3. Sequence.
        check_sequence(h, state)?;
        // 4 and 5. Transactions.
        if let Some(decision) = check_txn_state(h, state, verified.is_some())? {
            return Ok(decision);
        }
        check_not_ended(h, state, verified)?;
        let next = next_producer_state(h, state, self.high_watermark, verified, now_ms);
        Ok(self.append(h, Some(next)))
    }

    /// A PID this partition has no state for (never seen, or forgotten by expiry): it starts
    /// at sequence 0, or at any sequence where the face allows it
    /// ([`BatchHeader::any_first_sequence`]); a transactional batch is verified first either way
    /// (check 4), so a zombie whose state was forgotten is still refused by the coordinator.
    fn check_first_batch(
        &self,
        h: &BatchHeader,
        verified: Option<Verified>,
        now_ms: i64,
    ) -> Result<ProduceDecision> {
        if h.first_seq != 0 && !h.any_first_sequence {
            return Err(Error::UnknownProducerId(format!(
                "no state for producer {} and its batch starts at sequence {} (not 0)",
                h.producer_id, h.first_seq
            )));
        }
        let verified = match verified {
            None if h.transactional => return Ok(ProduceDecision::NeedsVerification),
            verified => verified,
        };
        let base_offset = self.high_watermark;
        Ok(self.append(
            h,
            Some(ProducerState {
                epoch: h.epoch,
                batches: VecDeque::from([this_batch(h, base_offset)]),
                txn_first_offset: h.transactional.then_some(base_offset),
                txn_number: verified
                    .filter(|_| h.transactional)
                    .and_then(Verified::number),
                ended_number: None,
                coordinator_generation: NO_GENERATION,
                last_update_ms: now_ms,
            }),
        ))
    }

    /// Appends the batch at the high watermark, with the PID's new state if it has one.
    fn append(&self, h: &BatchHeader, producer: Option<ProducerState>) -> ProduceDecision {
        let base_offset = self.high_watermark;
        ProduceDecision::Append(Plan {
            base_offset,
            record_count: h.record_count,
            control: None,
            producer: producer.map(|p| (h.producer_id, p)),
            aborted: None,
            high_watermark: base_offset + h.record_count,
        })
    }
}

/// The batch as the PID's window remembers it.
fn this_batch(h: &BatchHeader, base_offset: i64) -> BatchMetadata {
    BatchMetadata {
        first_seq: h.first_seq,
        last_seq: h.last_seq,
        base_offset,
    }
}

/// Check 1: the same epoch and exactly the sequence range of a remembered batch.
fn duplicate(h: &BatchHeader, state: &ProducerState) -> Option<ProduceDecision> {
    if h.epoch != state.epoch {
        return None;
    }
    state
        .batches
        .iter()
        .find(|b| b.first_seq == h.first_seq && b.last_seq == h.last_seq)
        .map(|b| ProduceDecision::Duplicate {
            base_offset: b.base_offset,
        })
}

/// Check 2: an epoch below the stored one is INVALID_PRODUCER_EPOCH.
fn check_epoch(h: &BatchHeader, state: &ProducerState) -> Result<()> {
    if h.epoch < state.epoch {
        return Err(Error::InvalidProducerEpoch(format!(
            "producer {} epoch {} is older than the current epoch {}",
            h.producer_id, h.epoch, state.epoch
        )));
    }
    Ok(())
}

/// Check 3: the batch must continue the PID's sequence, or start at 0 with a new epoch.
fn check_sequence(h: &BatchHeader, state: &ProducerState) -> Result<()> {
    let new_epoch = h.epoch > state.epoch;
    let expected = if new_epoch {
        0
    } else {
        state
            .last_sequence()
            .map(|s| increment_sequence(s, 1))
            .unwrap_or(0)
    };
    if h.first_seq != expected {
        return Err(Error::OutOfOrderSequenceNumber(format!(
            "producer {} epoch {}: expected sequence {expected}, got {}{}",
            h.producer_id,
            h.epoch,
            h.first_seq,
            if new_epoch {
                " (a new epoch must start at 0)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// Checks 4 and 5: the batch against the PID's open transaction here. `Some` is an answer that
/// stops the Produce (verification first); `None` lets the batch through.
fn check_txn_state(
    h: &BatchHeader,
    state: &ProducerState,
    verified: bool,
) -> Result<Option<ProduceDecision>> {
    let pid = h.producer_id;
    match (h.transactional, state.txn_first_offset) {
        (true, None) if !verified => Ok(Some(ProduceDecision::NeedsVerification)),
        (true, Some(first)) if h.epoch > state.epoch => {
            Err(Error::ConcurrentTransactions(format!(
                "producer {pid}: the transaction at epoch {} opened at offset {first} has not \
                 received its marker yet",
                state.epoch
            )))
        }
        (false, Some(first)) => Err(Error::InvalidTxnState(format!(
            "producer {pid} sent a non-transactional batch while its transaction opened at \
             offset {first} is open"
        ))),
        _ => Ok(None),
    }
}

/// A batch that would open a transaction whose marker this partition already had (version 1:
/// verified before the marker came, appended after it): INVALID_TXN_STATE, nothing appended, so
/// that no transaction is left open here that no marker will close (a hanging transaction
/// holding the LSO back).
fn check_not_ended(
    h: &BatchHeader,
    state: &ProducerState,
    verified: Option<Verified>,
) -> Result<()> {
    let opening = h.transactional && state.txn_first_offset.is_none();
    match (verified.and_then(Verified::number), state.ended_number) {
        (Some(number), Some(ended)) if opening && number <= ended => {
            Err(Error::InvalidTxnState(format!(
                "producer {}: transaction {number} already ended on this partition (its marker \
                 came first); a late batch of it is not appended",
                h.producer_id
            )))
        }
        _ => Ok(()),
    }
}

/// The PID's state once the batch is appended at `base_offset`: a new epoch resets the window,
/// the window keeps the last [`PRODUCER_WINDOW`] batches, a transactional batch opens the
/// transaction if none is open (numbered as its verification answered).
fn next_producer_state(
    h: &BatchHeader,
    state: &ProducerState,
    base_offset: i64,
    verified: Option<Verified>,
    now_ms: i64,
) -> ProducerState {
    let mut next = state.clone();
    if h.epoch > state.epoch {
        next.epoch = h.epoch;
        next.batches.clear();
    }
    next.batches.push_back(this_batch(h, base_offset));
    while next.batches.len() > PRODUCER_WINDOW {
        next.batches.pop_front();
    }
    if h.transactional && next.txn_first_offset.is_none() {
        next.txn_first_offset = Some(base_offset);
        next.txn_number = verified.and_then(Verified::number);
    }
    next.last_update_ms = now_ms;
    next
}
