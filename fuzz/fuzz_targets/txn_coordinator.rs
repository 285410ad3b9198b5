//! The transaction coordinator's core (`coordinator::core`) for one transactional id, driven by
//! arbitrary requests of three instances of the application (a live one and zombies: each
//! keeps the (PID, epoch) its last successful InitProducerId or EndTxn gave it), on either
//! transaction version, plus the coordinator's own events (markers completing, time passing
//! and the timeout scan). Every decision is applied as the shell applies it (a new PID when
//! the core asks for one). After every step it checks what PROTOCOL.md sections 4-8 promise:
//! - exactly one writer: at most one instance holds the id's current (PID, epoch);
//! - a fenced instance is refused: a request from an instance whose pair is neither the
//!   current one nor the one just before it (whose retries are recognised) changes nothing
//!   and is answered with an error;
//! - the id's identity only moves forward: the epoch of a PID never goes down, and a PID is
//!   never handed out again once replaced;
//! - a decided transaction is never undecided: Prepare* only leaves to its own Complete*, a
//!   commit completes only after PrepareCommit (an abort with nothing open completes at once);
//! - VerifyTransaction (what leaders ask before a transaction's first write) says yes only to
//!   the current pair, for a partition of the open transaction;
//! - no panic, whatever the input.

#![no_main]

use std::collections::BTreeSet;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use cluster::{TopicPartition, Topology};
use coordinator::core::{
    self, Outcome, ProducerIdAndEpoch, TransactionVersion, TxnError, TxnMetadata, TxnResult,
    TxnState,
};
use libfuzzer_sys::fuzz_target;

const ID: &str = "app";
const TIMEOUT_MS: i32 = 10_000;

#[derive(Arbitrary, Debug)]
enum Op {
    Init {
        instance: u8,
        expected: bool,
        version_1: bool,
    },
    Add {
        instance: u8,
        partition: u8,
    },
    Offsets {
        instance: u8,
        offset: u8,
    },
    End {
        instance: u8,
        commit: bool,
    },
    Verify {
        instance: u8,
        partition: u8,
    },
    Markers,
    Time {
        ms: u16,
    },
}

fn topology() -> &'static Topology {
    static TOPOLOGY: OnceLock<Topology> = OnceLock::new();
    TOPOLOGY.get_or_init(|| {
        Topology::parse(
            "transaction_state_partitions = 1\n\
             [[coordinators]]\nid = 1\naddress = \"127.0.0.1:1\"\n\
             [[leaders]]\nid = 101\naddress = \"127.0.0.1:2\"\n\
             [[topics]]\nname = \"t\"\nleaders = [101, 101, 101]\n",
        )
        .expect("the fuzz topology parses")
    })
}

struct World {
    meta: Option<TxnMetadata>,
    instances: [Option<ProducerIdAndEpoch>; 3],
    next_pid: i64,
    /// PIDs replaced by a rotation: never current again.
    retired: BTreeSet<i64>,
    now: i64,
}

fuzz_target!(|ops: Vec<Op>| {
    let mut world = World {
        meta: None,
        instances: [None; 3],
        next_pid: 1_000,
        retired: BTreeSet::new(),
        now: 1_000_000,
    };
    for op in ops.into_iter().take(128) {
        world.now += 1;
        step(&mut world, op);
        one_writer(&world);
    }
});

/// Calls `decide` as the shell does: without a PID, then with a new one if the core asks.
fn with_pid(world: &mut World, decide: impl Fn(Option<i64>) -> Outcome) -> Outcome {
    let outcome = decide(None);
    if !matches!(outcome.reply, Err(TxnError::NeedProducerId)) {
        return outcome;
    }
    world.next_pid += 1;
    decide(Some(world.next_pid))
}

/// Applies a decision's new metadata, checking the transition; returns the reply.
fn apply(world: &mut World, outcome: Outcome) -> Result<ProducerIdAndEpoch, TxnError> {
    if let Some(next) = outcome.persist {
        if let Some(old) = &world.meta {
            transition(old, &next, &mut world.retired);
        }
        world.meta = Some(next);
    }
    outcome.reply
}

fn transition(old: &TxnMetadata, next: &TxnMetadata, retired: &mut BTreeSet<i64>) {
    let (was, now) = (old.client_identity(), next.client_identity());
    if now.producer_id == was.producer_id {
        assert!(
            now.epoch >= was.epoch,
            "the epoch went down: {was} -> {now}"
        );
    } else {
        assert!(
            !retired.contains(&now.producer_id) && now.producer_id > was.producer_id,
            "a PID came back: {was} -> {now}"
        );
        retired.insert(was.producer_id);
    }
    use TxnState::*;
    let allowed: &[TxnState] = match old.state {
        // Decided: only its own completion.
        PrepareCommit => &[PrepareCommit, CompleteCommit],
        PrepareAbort => &[PrepareAbort, CompleteAbort],
        // Open: more partitions, or a decision (EndTxn, a new instance, the timeout).
        Ongoing => &[Ongoing, PrepareCommit, PrepareAbort],
        // Settled: a new transaction, a new epoch, or an empty abort (PROTOCOL.md section 6:
        // ABORT at the current epoch bumps it, nothing to write); never a commit out of nothing.
        Empty | CompleteCommit | CompleteAbort => &[Empty, Ongoing, CompleteAbort, old.state],
    };
    assert!(
        allowed.contains(&next.state),
        "{} became {}",
        old.state,
        next.state
    );
}

/// Whether `caller` may be answered anything but a refusal: the current pair, or the one just
/// before it (a retry the coordinator recognises).
fn may_act(world: &World, caller: ProducerIdAndEpoch) -> bool {
    world
        .meta
        .as_ref()
        .is_some_and(|m| m.client_identity() == caller || m.last_identity() == Some(caller))
}

fn step(world: &mut World, op: Op) {
    let now = world.now;
    let tp = |p: u8| TopicPartition::new("t", i32::from(p % 3));
    match op {
        Op::Init {
            instance,
            expected,
            version_1,
        } => {
            let i = usize::from(instance % 3);
            let expected = if expected { world.instances[i] } else { None };
            let version = if version_1 {
                TransactionVersion::V1
            } else {
                TransactionVersion::V2
            };
            let meta = world.meta.clone();
            let outcome = with_pid(world, |pid| {
                core::init_producer_id_for_version(
                    ID,
                    meta.as_ref(),
                    TIMEOUT_MS,
                    expected,
                    now,
                    pid,
                    version,
                )
            });
            if let Some(expected) = expected {
                if !may_act(world, expected) {
                    assert!(outcome.persist.is_none() && outcome.reply.is_err());
                }
            }
            if let Ok(identity) = apply(world, outcome) {
                world.instances[i] = Some(identity);
            }
        }
        Op::Add {
            instance,
            partition,
        } => request(world, instance, |meta, caller| {
            core::add_partitions(ID, meta, caller, &[tp(partition)], topology(), now)
        }),
        Op::Offsets { instance, offset } => {
            request(world, instance, |meta, caller| {
                core::add_offsets(ID, meta, caller, "group", now)
            });
            request(world, instance, |meta, caller| {
                let offsets = [(tp(0), i64::from(offset))];
                core::txn_offset_commit(ID, meta, caller, "group", &offsets, topology(), now)
            });
        }
        Op::End { instance, commit } => {
            let i = usize::from(instance % 3);
            let Some(caller) = world.instances[i] else {
                return;
            };
            let result = if commit {
                TxnResult::Commit
            } else {
                TxnResult::Abort
            };
            let allowed = may_act(world, caller);
            let meta = world.meta.clone();
            let outcome = with_pid(world, |pid| {
                core::end_txn(ID, meta.as_ref(), caller, result, now, pid)
            });
            if !allowed {
                assert!(
                    outcome.persist.is_none() && outcome.reply.is_err(),
                    "a fenced EndTxn of {caller} was accepted"
                );
            }
            if let Ok(identity) = apply(world, outcome) {
                world.instances[i] = Some(identity);
            }
        }
        Op::Verify {
            instance,
            partition,
        } => {
            let Some(caller) = world.instances[usize::from(instance % 3)] else {
                return;
            };
            let answer = core::verify_transaction(ID, world.meta.as_ref(), caller, &tp(partition));
            if answer.is_ok() {
                let meta = world.meta.as_ref().expect("a yes needs metadata");
                assert_eq!(caller, meta.client_identity(), "a fenced pair verified");
                assert_eq!(meta.state, TxnState::Ongoing);
                assert!(meta.partitions.contains(&tp(partition)));
            }
        }
        Op::Markers => {
            let Some(meta) = world.meta.clone() else {
                return;
            };
            if let Some(job) = meta.pending_markers() {
                let outcome = core::complete_markers(&meta, &job, now);
                let _ = apply(world, outcome);
            }
        }
        Op::Time { ms } => {
            world.now += i64::from(ms);
            let now = world.now;
            let Some(meta) = world.meta.clone() else {
                return;
            };
            let timed_out = core::is_timed_out(&meta, now);
            let fresh = world.next_pid + 1;
            if let Some(outcome) = core::expire_timed_out(&meta, now, Some(fresh)) {
                assert!(timed_out);
                let rotated = outcome
                    .persist
                    .as_ref()
                    .is_some_and(|m| m.client_identity().producer_id == fresh);
                if rotated {
                    world.next_pid = fresh;
                }
                let _ = apply(world, outcome);
                let state = world.meta.as_ref().map(|m| m.state);
                assert_eq!(state, Some(TxnState::PrepareAbort), "a timeout aborts");
            }
        }
    }
}

/// A request of instance `instance` with its pair; a fenced one must be refused.
fn request(
    world: &mut World,
    instance: u8,
    decide: impl Fn(Option<&TxnMetadata>, ProducerIdAndEpoch) -> Outcome,
) {
    let Some(caller) = world.instances[usize::from(instance % 3)] else {
        return;
    };
    let allowed = world
        .meta
        .as_ref()
        .is_some_and(|m| m.client_identity() == caller);
    let outcome = decide(world.meta.as_ref(), caller);
    if !allowed {
        assert!(
            outcome.persist.is_none() && outcome.reply.is_err(),
            "a request of the fenced {caller} was accepted"
        );
    }
    let _ = apply(world, outcome);
}

/// Exactly one writer: at most one instance holds the id's current pair.
fn one_writer(world: &World) {
    let Some(meta) = &world.meta else {
        return;
    };
    let current = meta.client_identity();
    let holders = world
        .instances
        .iter()
        .filter(|i| **i == Some(current))
        .count();
    assert!(holders <= 1, "{holders} instances hold {current}");
}
