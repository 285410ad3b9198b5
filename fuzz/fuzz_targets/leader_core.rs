//! The partition leader's core (`partition_leader::core::PartitionState`) driven by arbitrary
//! sequences of Produce batches (idempotent, transactional, plain; any PID, epoch, sequence),
//! transaction markers (versions 1 and 2, any epoch and coordinator generation), flushes
//! (publish), DeleteRecords, fetches and producer-state expiry, the way the shell drives it:
//! check, then apply the plan. After every step it checks what PROTOCOL.md section 9 promises
//! against a model of the log built from the applied plans:
//! - fencing: a data batch of a PID is never appended with an epoch below one the partition
//!   already holds for it (unless its state was forgotten by expiry, where the coordinator's
//!   verification is what fences);
//! - sequences: a PID's batch at an epoch continues its previous batch at that epoch (0 at a
//!   new epoch, anything for a PID the partition does not know, over Kafka's protocol);
//! - a duplicate answers the offset the original batch landed at;
//! - offsets are dense, LSO <= HW, what readers see never passes the log end, the log start
//!   never passes the high watermark, a fetch is refused exactly outside [log start, log end];
//! - no panic, whatever the input.

#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use partition_leader::core::{
    increment_sequence, BatchHeader, Marker, PartitionState, ProduceDecision, Verified,
    NO_PRODUCER_ID,
};

#[derive(Arbitrary, Debug)]
enum Op {
    Produce {
        pid: u8,
        epoch: u8,
        first_seq: u8,
        records: u8,
        transactional: bool,
        any_first_sequence: bool,
        coordinator_says_yes: bool,
    },
    Plain {
        records: u8,
    },
    Marker {
        pid: u8,
        epoch: u8,
        commit: bool,
        generation: u8,
        version_1: bool,
        number: u8,
    },
    Flush,
    DeleteRecords {
        offset: i8,
    },
    Fetch {
        offset: i8,
        read_committed: bool,
    },
    Expire {
        after_ms: u16,
    },
}

/// What the model remembers of a PID's last appended batch.
#[derive(Clone, Copy, Debug)]
struct Last {
    epoch: i16,
    first_seq: i32,
    last_seq: i32,
    base_offset: i64,
}

#[derive(Default)]
struct Model {
    /// Per PID: the highest epoch the partition holds for it (data or marker), while its state
    /// is not forgotten.
    epochs: HashMap<i64, i16>,
    /// Per PID: its last data batch, while its state is not forgotten.
    last: HashMap<i64, Last>,
}

fuzz_target!(|ops: Vec<Op>| {
    let mut state = PartitionState::new(false);
    let mut model = Model::default();
    let mut now: i64 = 1_000;
    for op in ops.into_iter().take(256) {
        now += 1;
        step(&mut state, &mut model, op, &mut now);
        check_watermarks(&state);
    }
});

fn step(state: &mut PartitionState, model: &mut Model, op: Op, now: &mut i64) {
    match op {
        Op::Produce {
            pid,
            epoch,
            first_seq,
            records,
            transactional,
            any_first_sequence,
            coordinator_says_yes,
        } => {
            let pid = i64::from(pid % 4);
            let count = i64::from(records % 5) + 1;
            let first_seq = i32::from(first_seq % 12);
            let h = BatchHeader {
                producer_id: pid,
                epoch: i16::from(epoch % 6),
                first_seq,
                last_seq: increment_sequence(first_seq, count as i32 - 1),
                record_count: count,
                transactional,
                any_first_sequence,
            };
            let mut decision = state.check_produce(&h, None, *now);
            if matches!(decision, Ok(ProduceDecision::NeedsVerification)) {
                if !coordinator_says_yes {
                    return;
                }
                decision = state.check_produce(&h, Some(Verified::default()), *now);
                assert!(
                    !matches!(decision, Ok(ProduceDecision::NeedsVerification)),
                    "verified twice: {h:?}"
                );
            }
            match decision {
                Err(_) => {}
                Ok(ProduceDecision::NeedsVerification) => unreachable!(),
                Ok(ProduceDecision::Duplicate { base_offset }) => {
                    let last = model.last.get(&pid);
                    // A duplicate of a batch the model saw (the window holds several; the
                    // last one is the one the model keeps).
                    if let Some(last) = last.filter(|l| {
                        l.epoch == h.epoch && l.first_seq == h.first_seq && l.last_seq == h.last_seq
                    }) {
                        assert_eq!(base_offset, last.base_offset, "{h:?}");
                    }
                    assert!(base_offset < state.high_watermark());
                }
                Ok(ProduceDecision::Append(plan)) => {
                    assert_eq!(plan.base_offset, state.high_watermark());
                    assert_eq!(plan.high_watermark, plan.base_offset + count);
                    if let Some(&held) = model.epochs.get(&pid) {
                        assert!(
                            h.epoch >= held,
                            "a zombie got through: {h:?} appended below epoch {held}"
                        );
                    }
                    if let Some(last) = model.last.get(&pid).filter(|l| l.epoch == h.epoch) {
                        assert_eq!(
                            h.first_seq,
                            increment_sequence(last.last_seq, 1),
                            "a gap or a reorder: {h:?} after {last:?}"
                        );
                    } else if model.epochs.contains_key(&pid) || !h.any_first_sequence {
                        assert_eq!(h.first_seq, 0, "a new epoch starts at 0: {h:?}");
                    }
                    state.apply(&plan);
                    let held = model.epochs.entry(pid).or_insert(h.epoch);
                    *held = (*held).max(h.epoch);
                    model.last.insert(
                        pid,
                        Last {
                            epoch: h.epoch,
                            first_seq: h.first_seq,
                            last_seq: h.last_seq,
                            base_offset: plan.base_offset,
                        },
                    );
                }
            }
        }
        Op::Plain { records } => {
            let count = i64::from(records % 5) + 1;
            let h = BatchHeader {
                producer_id: NO_PRODUCER_ID,
                epoch: -1,
                first_seq: -1,
                last_seq: -1,
                record_count: count,
                transactional: false,
                any_first_sequence: true,
            };
            if let Ok(ProduceDecision::Append(plan)) = state.check_produce(&h, None, *now) {
                assert_eq!(plan.high_watermark, state.high_watermark() + count);
                state.apply(&plan);
            }
        }
        Op::Marker {
            pid,
            epoch,
            commit,
            generation,
            version_1,
            number,
        } => {
            let pid = i64::from(pid % 4);
            let m = Marker {
                producer_id: pid,
                producer_epoch: i32::from(epoch % 6),
                commit,
                coordinator_id: 1,
                coordinator_generation: i64::from(generation % 4),
                transaction_version: if version_1 { 1 } else { 2 },
                transaction_number: u64::from(number % 4),
            };
            if let Ok(plan) = state.plan_marker(&m, *now) {
                if let Some(&held) = model.epochs.get(&pid) {
                    if let Some(control) = &plan.control {
                        assert!(
                            control.producer_epoch >= held,
                            "a marker below the held epoch was written: {m:?} under {held}"
                        );
                    }
                }
                let before = state.high_watermark();
                state.apply(&plan);
                assert_eq!(
                    state.high_watermark(),
                    before + i64::from(plan.control.is_some())
                );
                if let Some((_, p)) = &plan.producer {
                    let held = model.epochs.entry(pid).or_insert(p.epoch);
                    *held = (*held).max(p.epoch);
                    // A new epoch's first batch starts at 0 again.
                    if model.last.get(&pid).is_some_and(|l| l.epoch < p.epoch) {
                        model.last.remove(&pid);
                    }
                }
            }
        }
        Op::Flush => state.publish(state.watermarks()),
        Op::DeleteRecords { offset } => {
            let visible = state.visible().high_watermark;
            match state.delete_records_target(i64::from(offset)) {
                Ok(Some(target)) => {
                    assert!(target <= visible && target > state.log_start_offset());
                    state.set_log_start_offset(target);
                    assert_eq!(state.log_start_offset(), target);
                }
                Ok(None) => {}
                Err(_) => assert!(i64::from(offset) < -1 || i64::from(offset) > visible),
            }
        }
        Op::Fetch {
            offset,
            read_committed,
        } => {
            let offset = i64::from(offset);
            let inside = offset >= state.log_start_offset() && offset <= state.high_watermark();
            match state.fetch_view(offset, read_committed) {
                Ok(view) => {
                    assert!(inside, "fetch at {offset} served");
                    assert!(view.upper <= view.high_watermark);
                    assert!(view.last_stable_offset <= view.high_watermark);
                    for a in &view.aborted {
                        assert!(a.first_offset <= a.last_offset);
                        assert!(a.last_offset < state.high_watermark());
                    }
                }
                Err(_) => assert!(!inside, "fetch at {offset} refused"),
            }
        }
        Op::Expire { after_ms } => {
            *now += i64::from(after_ms);
            let expired = state.expired_producers(*now, 5_000);
            state.forget_producers(&expired);
            for pid in expired {
                model.epochs.remove(&pid);
                model.last.remove(&pid);
            }
        }
    }
}

fn check_watermarks(state: &PartitionState) {
    let end = state.watermarks();
    let visible = state.visible();
    assert!(end.last_stable_offset <= end.high_watermark);
    assert!(visible.high_watermark <= end.high_watermark);
    assert!(visible.last_stable_offset <= visible.high_watermark);
    assert!(state.log_start_offset() <= end.high_watermark);
    for a in state.aborted_txns() {
        assert!(a.first_offset <= a.last_offset && a.last_offset < end.high_watermark);
    }
    for (pid, p) in state.producers() {
        if let Some(first) = p.txn_first_offset {
            assert!(first >= end.last_stable_offset, "{pid}: {p:?}");
            assert!(first < end.high_watermark, "{pid}: {p:?}");
        }
    }
}
