//! Unit tests of the transitions (`txn`) and the stored types: every row of PROTOCOL.md
//! sections 4-8, and a randomized simulation of the invariants.

use cluster::Topology;

use super::*;

const ID: &str = "txn-a";
const NOW: i64 = 1_000_000;
const TIMEOUT: i32 = 60_000;

fn topology() -> Topology {
    Topology::parse(
        r#"
        transaction_state_partitions = 4
        [[coordinators]]
        id = 1
        address = "c1:1"
        [[leaders]]
        id = 101
        address = "l1:1"
        [[leaders]]
        id = 102
        address = "l2:1"
        [[topics]]
        name = "t"
        leaders = [101, 102]
        "#,
    )
    .unwrap()
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

fn pe(pid: ProducerId, epoch: ProducerEpoch) -> ProducerIdAndEpoch {
    ProducerIdAndEpoch::new(pid, epoch)
}

/// One id's stored state plus a PID source, applying outcomes like the shell does.
struct World {
    meta: Option<TxnMetadata>,
    next_pid: ProducerId,
    now: i64,
    topology: Topology,
    sent: Vec<MarkerJob>,
}

impl World {
    fn new() -> Self {
        Self {
            meta: None,
            next_pid: 1000,
            now: NOW,
            topology: topology(),
            sent: vec![],
        }
    }

    fn meta(&self) -> &TxnMetadata {
        self.meta.as_ref().unwrap()
    }

    fn apply(&mut self, mut f: impl FnMut(&Self, Option<ProducerId>) -> Outcome) -> Outcome {
        let mut out = f(self, None);
        if out.reply == Err(TxnError::NeedProducerId) {
            out = f(self, Some(self.next_pid));
            self.next_pid += 1;
        }
        if let Some(m) = &out.persist {
            self.meta = Some(m.clone());
        }
        if let Some(job) = &out.markers {
            self.sent.push(job.clone());
        }
        out
    }

    fn init(&mut self, expected: Option<ProducerIdAndEpoch>) -> Outcome {
        self.apply(|w, pid| init_producer_id(ID, w.meta.as_ref(), TIMEOUT, expected, w.now, pid))
    }

    fn add(&mut self, caller: ProducerIdAndEpoch, parts: &[i32]) -> Outcome {
        let parts: Vec<_> = parts.iter().map(|p| tp(*p)).collect();
        self.apply(|w, _| add_partitions(ID, w.meta.as_ref(), caller, &parts, &w.topology, w.now))
    }

    fn add_group(&mut self, caller: ProducerIdAndEpoch, group: &str) -> Outcome {
        self.apply(|w, _| add_offsets(ID, w.meta.as_ref(), caller, group, w.now))
    }

    fn commit_offsets(
        &mut self,
        caller: ProducerIdAndEpoch,
        group: &str,
        o: &[(i32, i64)],
    ) -> Outcome {
        let o: Vec<_> = o.iter().map(|(p, v)| (tp(*p), *v)).collect();
        self.apply(|w, _| {
            txn_offset_commit(ID, w.meta.as_ref(), caller, group, &o, &w.topology, w.now)
        })
    }

    fn end(&mut self, caller: ProducerIdAndEpoch, result: TxnResult) -> Outcome {
        self.apply(|w, pid| end_txn(ID, w.meta.as_ref(), caller, result, w.now, pid))
    }

    fn complete(&mut self) -> Outcome {
        let job = self.meta().pending_markers().expect("markers pending");
        self.apply(|w, _| complete_markers(w.meta(), &job, w.now))
    }

    fn expire(&mut self) -> Option<Outcome> {
        let mut out = expire_timed_out(self.meta(), self.now, None)?;
        if out.reply == Err(TxnError::NeedProducerId) {
            out = expire_timed_out(self.meta(), self.now, Some(self.next_pid))?;
            self.next_pid += 1;
        }
        if let Some(m) = &out.persist {
            self.meta = Some(m.clone());
        }
        if let Some(job) = &out.markers {
            self.sent.push(job.clone());
        }
        Some(out)
    }

    fn state(&self) -> TxnState {
        self.meta().state
    }

    /// A fresh id at epoch 0 and (PID, epoch).
    fn started() -> (Self, ProducerIdAndEpoch) {
        let mut w = Self::new();
        let id = w.init(None).reply.unwrap();
        (w, id)
    }

    /// An id with an Ongoing transaction on partitions 0 and 1.
    fn ongoing() -> (Self, ProducerIdAndEpoch) {
        let (mut w, id) = Self::started();
        w.add(id, &[0, 1]).reply.unwrap();
        (w, id)
    }

    /// Forces the stored epoch (to test exhaustion without 32k bumps).
    fn set_epoch(&mut self, epoch: ProducerEpoch) -> ProducerIdAndEpoch {
        let m = self.meta.as_mut().unwrap();
        m.producer_epoch = epoch;
        m.last_epoch = NO_PRODUCER_EPOCH;
        m.client_identity()
    }
}

fn code(out: &Outcome) -> &'static str {
    match &out.reply {
        Ok(_) => "NONE",
        Err(e) => err_name(e),
    }
}

fn err_name(e: &TxnError) -> &'static str {
    e.name()
}

/// Builds a world in each state, with the current identity.
fn in_state(state: TxnState) -> (World, ProducerIdAndEpoch) {
    let (mut w, id) = World::started();
    let id = match state {
        TxnState::Empty => id,
        TxnState::Ongoing => {
            w.add(id, &[0]).reply.unwrap();
            id
        }
        TxnState::PrepareCommit | TxnState::PrepareAbort => {
            w.add(id, &[0]).reply.unwrap();
            let r = if state == TxnState::PrepareCommit {
                TxnResult::Commit
            } else {
                TxnResult::Abort
            };
            w.end(id, r).reply.unwrap()
        }
        TxnState::CompleteCommit | TxnState::CompleteAbort => {
            w.add(id, &[0]).reply.unwrap();
            let r = if state == TxnState::CompleteCommit {
                TxnResult::Commit
            } else {
                TxnResult::Abort
            };
            let id = w.end(id, r).reply.unwrap();
            w.complete();
            id
        }
    };
    assert_eq!(w.state(), state);
    (w, id)
}

const ALL: [TxnState; 6] = [
    TxnState::Empty,
    TxnState::Ongoing,
    TxnState::PrepareCommit,
    TxnState::PrepareAbort,
    TxnState::CompleteCommit,
    TxnState::CompleteAbort,
];

// ---- section 4: InitProducerId -------------------------------------------------------

#[test]
fn validation_of_ids_and_timeouts() {
    assert!(validate_id("transactional id", "a").is_ok());
    assert!(validate_id("transactional id", &"x".repeat(255)).is_ok());
    assert_eq!(
        err_name(&validate_id("id", "").unwrap_err()),
        "INVALID_REQUEST"
    );
    assert_eq!(
        err_name(&validate_id("id", &"x".repeat(256)).unwrap_err()),
        "INVALID_REQUEST"
    );
    assert_eq!(
        err_name(&validate_id("id", &"x".repeat(100 * 1024)).unwrap_err()),
        "INVALID_REQUEST"
    );
    for bad in [0, -1, i32::MIN, 900_001] {
        assert_eq!(
            err_name(&validate_timeout(bad, 900_000).unwrap_err()),
            "INVALID_TRANSACTION_TIMEOUT"
        );
    }
    assert!(validate_timeout(1, 900_000).is_ok());
    assert!(validate_timeout(900_000, 900_000).is_ok());
}

#[test]
fn init_unknown_id_allocates_pid_at_epoch_0() {
    let mut w = World::new();
    // Without a PID the core asks for one and changes nothing.
    let out = init_producer_id(ID, None, TIMEOUT, None, NOW, None);
    assert_eq!(out.reply, Err(TxnError::NeedProducerId));
    assert!(out.persist.is_none());
    let out = w.init(None);
    assert_eq!(out.reply, Ok(pe(1000, 0)));
    let m = w.meta();
    assert_eq!(
        (m.state, m.last_epoch, m.timeout_ms),
        (TxnState::Empty, -1, TIMEOUT)
    );
    assert!(out.markers.is_none());
}

#[test]
fn init_unknown_id_with_expected_still_allocates() {
    let mut w = World::new();
    assert_eq!(w.init(Some(pe(5, 5))).reply, Ok(pe(1000, 0)));
}

#[test]
fn init_existing_id_bumps_epoch_in_every_settled_state() {
    for state in [
        TxnState::Empty,
        TxnState::CompleteCommit,
        TxnState::CompleteAbort,
    ] {
        let (mut w, id) = in_state(state);
        let out = w.init(None);
        assert_eq!(out.reply, Ok(pe(id.producer_id, id.epoch + 1)), "{state}");
        assert_eq!(w.state(), TxnState::Empty);
        assert_eq!(
            w.meta().last_epoch,
            -1,
            "no expected: the old epoch is not reclaimable"
        );
        assert!(out.markers.is_none());
    }
}

#[test]
fn init_in_prepare_is_concurrent_even_with_expected() {
    for state in [TxnState::PrepareCommit, TxnState::PrepareAbort] {
        let (mut w, id) = in_state(state);
        let before = w.meta.clone();
        assert_eq!(code(&w.init(None)), "CONCURRENT_TRANSACTIONS");
        assert_eq!(code(&w.init(Some(id))), "CONCURRENT_TRANSACTIONS");
        assert_eq!(code(&w.init(Some(pe(77, 3)))), "CONCURRENT_TRANSACTIONS");
        assert_eq!(w.meta, before);
    }
}

#[test]
fn init_in_ongoing_fences_and_aborts_with_the_new_epoch() {
    let (mut w, id) = World::ongoing();
    let out = w.init(None);
    assert_eq!(code(&out), "CONCURRENT_TRANSACTIONS");
    let m = w.meta().clone();
    assert_eq!(m.state, TxnState::PrepareAbort);
    assert_eq!(m.producer_epoch, id.epoch + 1);
    assert_eq!(
        m.last_epoch, -1,
        "the fenced instance cannot reclaim the id"
    );
    let job = out.markers.unwrap();
    assert_eq!(job.result, TxnResult::Abort);
    assert_eq!(job.identity, pe(id.producer_id, id.epoch + 1));
    assert_eq!(job.partitions, [tp(0), tp(1)].into_iter().collect());
    // The old instance is fenced everywhere, including its recovery path.
    assert_eq!(code(&w.add(id, &[0])), "PRODUCER_FENCED");
    assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
    // The retry of the new instance waits for the abort, then bumps above it.
    assert_eq!(code(&w.init(None)), "CONCURRENT_TRANSACTIONS");
    w.complete();
    assert_eq!(w.state(), TxnState::CompleteAbort);
    assert_eq!(w.init(None).reply, Ok(pe(id.producer_id, id.epoch + 2)));
    assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
}

#[test]
fn init_with_expected_current_bumps_and_remembers_last_epoch() {
    for state in [
        TxnState::Empty,
        TxnState::CompleteCommit,
        TxnState::CompleteAbort,
    ] {
        let (mut w, id) = in_state(state);
        let bumped = w.init(Some(id)).reply.unwrap();
        assert_eq!(bumped, pe(id.producer_id, id.epoch + 1));
        assert_eq!(w.meta().last_epoch, id.epoch);
        // A retry of that bump gets the same answer, nothing written.
        let retry = w.init(Some(id));
        assert_eq!(retry.reply, Ok(bumped));
        assert!(retry.persist.is_none());
        // The new pair may bump again; then the first pair is fenced.
        let again = w.init(Some(bumped)).reply.unwrap();
        assert_eq!(again.epoch, bumped.epoch + 1);
        assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
    }
}

#[test]
fn init_with_expected_last_epoch_in_ongoing_answers_current() {
    let (mut w, id) = World::started();
    let bumped = w.init(Some(id)).reply.unwrap();
    w.add(bumped, &[0]).reply.unwrap();
    let out = w.init(Some(id));
    assert_eq!(out.reply, Ok(bumped));
    assert!(out.persist.is_none());
    assert_eq!(w.state(), TxnState::Ongoing);
}

#[test]
fn kip360_recovery_in_ongoing_never_fences_its_own_instance() {
    // Section 4 step 6: the current instance bumps with expected == current (e.g. after its
    // EndTxn(ABORT) failed on storage); the open transaction is aborted and the instance lives.
    let (mut w, id) = World::ongoing();
    assert_eq!(code(&w.init(Some(id))), "CONCURRENT_TRANSACTIONS");
    assert_eq!(w.state(), TxnState::PrepareAbort);
    assert_eq!(w.meta().last_epoch, id.epoch);
    // Its retry while the markers are out is still CONCURRENT_TRANSACTIONS, never fenced.
    assert_eq!(code(&w.init(Some(id))), "CONCURRENT_TRANSACTIONS");
    w.complete();
    let recovered = w.init(Some(id)).reply.unwrap();
    assert_eq!(recovered, pe(id.producer_id, id.epoch + 1));
    // And its next transaction commits.
    w.add(recovered, &[0]).reply.unwrap();
    let next = w.end(recovered, TxnResult::Commit).reply.unwrap();
    assert_eq!(next, pe(id.producer_id, id.epoch + 2));
    w.complete();
    assert_eq!(w.state(), TxnState::CompleteCommit);
}

#[test]
fn a_new_instance_in_ongoing_fences_the_old_one_for_good() {
    let (mut w, id) = World::ongoing();
    assert_eq!(code(&w.init(None)), "CONCURRENT_TRANSACTIONS");
    assert_eq!(w.meta().last_epoch, NO_PRODUCER_EPOCH);
    w.complete();
    let new = w.init(None).reply.unwrap();
    assert!(new.epoch > id.epoch);
    // The old instance cannot reclaim the id through the KIP-360 path.
    assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
}

#[test]
fn end_txn_at_the_bumped_epoch_during_prepare_is_concurrent_not_fenced() {
    // Section 6: the client that already got EndTxn's reply (and the bumped epoch) and starts
    // early while the markers are out gets CONCURRENT_TRANSACTIONS (Kafka: PRODUCER_FENCED).
    for result in [TxnResult::Commit, TxnResult::Abort] {
        let (mut w, id) = World::ongoing();
        let bumped = w.end(id, result).reply.unwrap();
        assert!(w.state().is_prepare());
        for again in [TxnResult::Commit, TxnResult::Abort] {
            let before = w.meta.clone();
            assert_eq!(code(&w.end(bumped, again)), "CONCURRENT_TRANSACTIONS");
            assert_eq!(w.meta, before);
        }
        assert_eq!(code(&w.add(bumped, &[1])), "CONCURRENT_TRANSACTIONS");
        w.complete();
        w.add(bumped, &[1]).reply.unwrap();
    }
}

#[test]
fn init_with_wrong_expected_is_fenced() {
    let (mut w, id) = World::started();
    w.init(None).reply.unwrap(); // epoch 1, last -1
    for bad in [id, pe(id.producer_id, 5), pe(99, 1), pe(99, 0)] {
        let before = w.meta.clone();
        assert_eq!(code(&w.init(Some(bad))), "PRODUCER_FENCED", "{bad}");
        assert_eq!(w.meta, before);
    }
}

#[test]
fn init_updates_the_timeout() {
    let (mut w, _) = World::started();
    w.apply(|w, pid| init_producer_id(ID, w.meta.as_ref(), 5_000, None, w.now, pid));
    assert_eq!(w.meta().timeout_ms, 5_000);
}

#[test]
fn init_epoch_exhaustion_rotates_pid() {
    let (mut w, _) = World::started();
    let old = w.set_epoch(MAX_CLIENT_EPOCH - 1);
    // 32765 -> 32766 is an ordinary bump.
    let at_max = w.init(Some(old)).reply.unwrap();
    assert_eq!(at_max, pe(old.producer_id, MAX_CLIENT_EPOCH));
    // 32766 -> new PID, epoch 0.
    let rotated = w.init(Some(at_max)).reply.unwrap();
    assert_eq!(rotated, pe(1001, 0));
    let m = w.meta().clone();
    assert_eq!(m.previous_producer_id, old.producer_id);
    assert_eq!(m.last_epoch, MAX_CLIENT_EPOCH);
    // A retry with the old PID and 32766 gets the new pair, not PRODUCER_FENCED.
    let retry = w.init(Some(at_max));
    assert_eq!(retry.reply, Ok(rotated));
    assert!(retry.persist.is_none());
    // The old PID is fenced on the data plane.
    assert_eq!(code(&w.add(at_max, &[0])), "PRODUCER_FENCED");
    // The new PID works and its next bump forgets the old one.
    w.add(rotated, &[0]).reply.unwrap();
    let next = w.end(rotated, TxnResult::Commit).reply.unwrap();
    assert_eq!(next, pe(1001, 1));
    w.complete();
    assert_eq!(code(&w.init(Some(at_max))), "PRODUCER_FENCED");
}

#[test]
fn init_exhaustion_without_expected() {
    let (mut w, _) = World::started();
    let old = w.set_epoch(MAX_CLIENT_EPOCH);
    let rotated = w.init(None).reply.unwrap();
    assert_eq!(rotated, pe(1001, 0));
    assert_eq!(w.meta().previous_producer_id, old.producer_id);
    assert_eq!(code(&w.init(Some(old))), "PRODUCER_FENCED");
}

#[test]
fn fence_at_exhaustion_uses_marker_epoch_and_next_pid() {
    let (mut w, _) = World::ongoing();
    let old = w.set_epoch(MAX_CLIENT_EPOCH);
    let out = w.init(None);
    assert_eq!(code(&out), "CONCURRENT_TRANSACTIONS");
    assert_eq!(
        out.markers.unwrap().identity,
        pe(old.producer_id, MARKER_ONLY_EPOCH)
    );
    assert_eq!(w.meta().next_producer_id, 1001);
    w.complete();
    let m = w.meta().clone();
    assert_eq!(
        (m.producer_id, m.producer_epoch, m.previous_producer_id),
        (1001, 0, old.producer_id)
    );
    assert_eq!(code(&w.init(Some(old))), "PRODUCER_FENCED");
    assert_eq!(w.init(None).reply, Ok(pe(1001, 1)));
}

// ---- section 5: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit ---------------------

#[test]
fn add_partitions_opens_transaction_and_unions() {
    let (mut w, id) = World::started();
    w.now = NOW + 5;
    let out = w.add(id, &[0]);
    assert_eq!(out.reply, Ok(id));
    assert_eq!(w.state(), TxnState::Ongoing);
    assert_eq!(w.meta().txn_start_ms, NOW + 5);
    w.now = NOW + 10;
    // Adding nothing new writes nothing.
    assert!(w.add(id, &[0]).persist.is_none());
    assert!(w.add(id, &[]).persist.is_none());
    assert!(w.add(id, &[1, 0]).persist.is_some());
    assert_eq!(w.meta().partitions.len(), 2);
    assert_eq!(
        w.meta().txn_start_ms,
        NOW + 5,
        "start time kept while Ongoing"
    );
}

#[test]
fn add_nothing_in_empty_writes_nothing() {
    let (mut w, id) = World::started();
    let out = w.add(id, &[]);
    assert_eq!(out.reply, Ok(id));
    assert!(out.persist.is_none());
    assert_eq!(w.state(), TxnState::Empty);
}

#[test]
fn add_requests_in_every_state() {
    // (state, expected code for a current-epoch add)
    for state in ALL {
        let (mut w, id) = in_state(state);
        let expect = if state.is_prepare() {
            "CONCURRENT_TRANSACTIONS"
        } else {
            "NONE"
        };
        let before = w.meta.clone();
        assert_eq!(code(&w.add(id, &[1])), expect, "add partitions in {state}");
        w.meta = before.clone();
        assert_eq!(
            code(&w.add_group(id, "g")),
            expect,
            "add offsets in {state}"
        );
        w.meta = before.clone();
        // TxnOffsetCommit needs the group in an Ongoing transaction.
        let commit_expect = if state.is_prepare() {
            "CONCURRENT_TRANSACTIONS"
        } else {
            "INVALID_TXN_STATE"
        };
        assert_eq!(
            code(&w.commit_offsets(id, "g", &[(0, 5)])),
            commit_expect,
            "offset commit in {state}"
        );
        assert_eq!(w.meta, before);
        if !state.is_prepare() {
            assert_eq!(w.add(id, &[1]).reply, Ok(id));
            assert_eq!(w.state(), TxnState::Ongoing);
            assert!(w.meta().partitions.contains(&tp(1)));
            if state.is_settled() && state != TxnState::Empty {
                assert!(
                    !w.meta().partitions.contains(&tp(0)),
                    "previous txn's partitions cleared"
                );
            }
        }
    }
}

#[test]
fn add_errors_in_protocol_order() {
    for state in ALL {
        let (mut w, id) = in_state(state);
        let before = w.meta.clone();
        let stale = pe(id.producer_id, id.epoch - 1);
        let newer = pe(id.producer_id, id.epoch + 1);
        let alien = pe(id.producer_id + 7, id.epoch);
        assert_eq!(
            code(&w.add(alien, &[0])),
            "INVALID_PRODUCER_ID_MAPPING",
            "{state}"
        );
        assert_eq!(
            code(&w.add_group(alien, "g")),
            "INVALID_PRODUCER_ID_MAPPING"
        );
        assert_eq!(
            code(&w.commit_offsets(alien, "g", &[(0, 1)])),
            "INVALID_PRODUCER_ID_MAPPING"
        );
        if stale.epoch >= 0 {
            assert_eq!(code(&w.add(stale, &[0])), "PRODUCER_FENCED", "{state}");
            assert_eq!(code(&w.add_group(stale, "g")), "PRODUCER_FENCED");
            assert_eq!(
                code(&w.commit_offsets(stale, "g", &[(0, 1)])),
                "PRODUCER_FENCED"
            );
        }
        assert_eq!(code(&w.add(newer, &[0])), "PRODUCER_FENCED");
        // Unknown partitions, only for an otherwise valid request.
        if !state.is_prepare() {
            assert_eq!(code(&w.add(id, &[0, 9])), "UNKNOWN_TOPIC_OR_PARTITION");
            assert_eq!(code(&w.add(id, &[-1])), "UNKNOWN_TOPIC_OR_PARTITION");
        } else {
            assert_eq!(code(&w.add(id, &[9])), "CONCURRENT_TRANSACTIONS");
        }
        assert_eq!(w.meta, before, "nothing stored in {state}");
    }
    // Unknown id.
    let w = World::new();
    let out = add_partitions(ID, None, pe(1, 0), &[tp(0)], &w.topology, NOW);
    assert_eq!(code(&out), "INVALID_PRODUCER_ID_MAPPING");
    assert_eq!(
        code(&add_offsets(ID, None, pe(1, 0), "g", NOW)),
        "INVALID_PRODUCER_ID_MAPPING"
    );
}

#[test]
fn unknown_topic_adds_nothing_even_with_known_partitions() {
    let (mut w, id) = World::ongoing();
    let before = w.meta.clone();
    let parts = vec![tp(0), TopicPartition::new("nope", 0)];
    let out = add_partitions(ID, w.meta.as_ref(), id, &parts, &w.topology, NOW);
    assert_eq!(code(&out), "UNKNOWN_TOPIC_OR_PARTITION");
    assert!(out.persist.is_none());
    w.meta = before;
}

#[test]
fn offsets_pending_until_commit() {
    let (mut w, id) = World::started();
    assert_eq!(
        code(&w.commit_offsets(id, "g", &[(0, 5)])),
        "INVALID_TXN_STATE"
    );
    w.add_group(id, "g").reply.unwrap();
    assert_eq!(w.state(), TxnState::Ongoing);
    assert!(
        w.add_group(id, "g").persist.is_none(),
        "adding a group twice writes nothing"
    );
    assert_eq!(
        code(&w.commit_offsets(id, "other", &[(0, 5)])),
        "INVALID_TXN_STATE"
    );
    assert_eq!(
        code(&w.commit_offsets(id, "g", &[(7, 5)])),
        "UNKNOWN_TOPIC_OR_PARTITION"
    );
    assert!(w
        .commit_offsets(id, "g", &[(0, 5), (1, 9)])
        .persist
        .is_some());
    assert!(
        w.commit_offsets(id, "g", &[(0, 5)]).persist.is_none(),
        "same offsets write nothing"
    );
    w.commit_offsets(id, "g", &[(0, 6)]).reply.unwrap();
    let out = w.end(id, TxnResult::Commit);
    let job = out.markers.unwrap();
    assert_eq!(
        job.groups["g"],
        [(tp(0), 6), (tp(1), 9)].into_iter().collect()
    );
    assert!(job.partitions.is_empty());
    w.complete();
    assert!(w.meta().groups.is_empty());
}

#[test]
fn abort_carries_groups_too() {
    let (mut w, id) = World::started();
    w.add_group(id, "g").reply.unwrap();
    w.commit_offsets(id, "g", &[(0, 5)]).reply.unwrap();
    let job = w.end(id, TxnResult::Abort).markers.unwrap();
    assert_eq!(job.result, TxnResult::Abort);
    assert!(job.groups.contains_key("g"));
}

// ---- section 6: EndTxn ---------------------------------------------------------------

#[test]
fn end_txn_commit_bumps_and_completes() {
    let (mut w, id) = World::ongoing();
    let out = w.end(id, TxnResult::Commit);
    let new = out.reply.clone().unwrap();
    assert_eq!(new, pe(id.producer_id, id.epoch + 1));
    assert_eq!(w.state(), TxnState::PrepareCommit);
    assert_eq!(w.meta().last_epoch, id.epoch);
    let job = out.markers.unwrap();
    assert_eq!(job.identity, new, "markers carry the new epoch");
    assert_eq!(job.partitions.len(), 2);
    let by_leader = job.partitions_by_leader(&w.topology);
    assert_eq!(by_leader[&Some(101)], vec![tp(0)]);
    assert_eq!(by_leader[&Some(102)], vec![tp(1)]);
    let done = w.complete();
    assert_eq!(done.reply, Ok(new));
    assert_eq!(w.state(), TxnState::CompleteCommit);
    assert!(w.meta().partitions.is_empty());
    assert_eq!(w.meta().txn_start_ms, -1);
    // The new epoch starts the next transaction.
    assert_eq!(w.add(new, &[0]).reply, Ok(new));
}

#[test]
fn end_txn_abort_bumps_and_completes() {
    let (mut w, id) = World::ongoing();
    let new = w.end(id, TxnResult::Abort).reply.unwrap();
    assert_eq!(w.state(), TxnState::PrepareAbort);
    w.complete();
    assert_eq!(w.state(), TxnState::CompleteAbort);
    assert_eq!(w.meta().client_identity(), new);
}

#[test]
fn end_txn_in_every_state_at_current_epoch() {
    for state in ALL {
        for result in [TxnResult::Commit, TxnResult::Abort] {
            let (mut w, id) = in_state(state);
            let out = w.end(id, result);
            let expect = match (state, result) {
                (TxnState::Ongoing, _) => "NONE",
                (s, _) if s.is_prepare() => "CONCURRENT_TRANSACTIONS",
                (_, TxnResult::Commit) => "INVALID_TXN_STATE",
                (_, TxnResult::Abort) => "NONE",
            };
            assert_eq!(code(&out), expect, "{state} {result:?}");
            if state.is_settled() && result == TxnResult::Abort {
                // Empty abort: bump, straight to CompleteAbort, no markers.
                assert_eq!(out.reply, Ok(pe(id.producer_id, id.epoch + 1)));
                assert_eq!(w.state(), TxnState::CompleteAbort);
                assert!(out.markers.is_none());
                assert_eq!(w.meta().last_epoch, id.epoch);
            }
        }
    }
}

#[test]
fn end_txn_retries() {
    for result in [TxnResult::Commit, TxnResult::Abort] {
        let other = if result == TxnResult::Commit {
            TxnResult::Abort
        } else {
            TxnResult::Commit
        };
        let (mut w, id) = World::ongoing();
        let new = w.end(id, result).reply.unwrap();
        // While Prepare*: same decision -> CONCURRENT, other -> INVALID_TXN_STATE.
        assert_eq!(code(&w.end(id, result)), "CONCURRENT_TRANSACTIONS");
        assert_eq!(code(&w.end(id, other)), "INVALID_TXN_STATE");
        w.complete();
        // Complete*: same decision -> OK with the current pair, nothing written.
        let retry = w.end(id, result);
        assert_eq!(retry.reply, Ok(new));
        assert!(retry.persist.is_none());
        assert_eq!(code(&w.end(id, other)), "INVALID_TXN_STATE");
        // Older than the retry epoch -> fenced.
        if id.epoch > 0 {
            assert_eq!(
                code(&w.end(pe(id.producer_id, id.epoch - 1), result)),
                "PRODUCER_FENCED"
            );
        }
    }
}

#[test]
fn end_txn_retry_after_later_bump_is_fenced() {
    let (mut w, id) = World::ongoing();
    let new = w.end(id, TxnResult::Commit).reply.unwrap();
    w.complete();
    w.add(new, &[0]).reply.unwrap();
    // Ongoing at `new`, last_epoch = id.epoch: the retry's transaction is long done.
    assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
    // A bump without expected forgets the last epoch altogether.
    let (mut w, id) = World::ongoing();
    w.end(id, TxnResult::Commit).reply.unwrap();
    w.complete();
    w.init(None).reply.unwrap();
    assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
}

#[test]
fn end_txn_errors() {
    let (mut w, id) = World::ongoing();
    let before = w.meta.clone();
    assert_eq!(
        code(&w.end(pe(id.producer_id + 1, id.epoch), TxnResult::Commit)),
        "INVALID_PRODUCER_ID_MAPPING"
    );
    assert_eq!(
        code(&w.end(pe(id.producer_id, id.epoch + 3), TxnResult::Commit)),
        "PRODUCER_FENCED"
    );
    assert_eq!(w.meta, before);
    assert_eq!(
        code(&end_txn(ID, None, id, TxnResult::Abort, NOW, None)),
        "INVALID_PRODUCER_ID_MAPPING"
    );
    // An older instance's EndTxn after it was fenced by InitProducerId.
    w.init(None);
    w.complete();
    assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
    assert_eq!(code(&w.end(id, TxnResult::Abort)), "PRODUCER_FENCED");
}

#[test]
fn end_txn_exhaustion_uses_next_pid() {
    let (mut w, _) = World::ongoing();
    let old = w.set_epoch(MAX_CLIENT_EPOCH);
    let out = w.end(old, TxnResult::Commit);
    let new = out.reply.clone().unwrap();
    assert_eq!(new, pe(1001, 0));
    let job = out.markers.unwrap();
    assert_eq!(
        job.identity,
        pe(old.producer_id, MARKER_ONLY_EPOCH),
        "markers close the old PID"
    );
    let m = w.meta().clone();
    assert_eq!(
        (m.producer_id, m.producer_epoch, m.next_producer_id),
        (old.producer_id, MARKER_ONLY_EPOCH, 1001)
    );
    assert_eq!(m.client_identity(), new);
    // In Prepare: the new pair is answered CONCURRENT (not a mapping error) ...
    assert_eq!(code(&w.add(new, &[0])), "CONCURRENT_TRANSACTIONS");
    assert_eq!(
        code(&w.end(new, TxnResult::Commit)),
        "CONCURRENT_TRANSACTIONS"
    );
    // ... and the retry of the old pair too.
    assert_eq!(
        code(&w.end(old, TxnResult::Commit)),
        "CONCURRENT_TRANSACTIONS"
    );
    w.complete();
    let m = w.meta().clone();
    assert_eq!(
        (
            m.producer_id,
            m.producer_epoch,
            m.previous_producer_id,
            m.next_producer_id
        ),
        (1001, 0, old.producer_id, -1)
    );
    // Retry after rotation: old PID with 32766 gets the new pair.
    assert_eq!(w.end(old, TxnResult::Commit).reply, Ok(new));
    assert_eq!(code(&w.end(old, TxnResult::Abort)), "INVALID_TXN_STATE");
    assert_eq!(w.init(Some(old)).reply, Ok(new));
    // The new pair carries on.
    w.add(new, &[1]).reply.unwrap();
    assert_eq!(w.end(new, TxnResult::Abort).reply, Ok(pe(1001, 1)));
}

#[test]
fn empty_abort_at_exhaustion_rotates_directly() {
    let (mut w, _) = World::started();
    let old = w.set_epoch(MAX_CLIENT_EPOCH);
    let out = w.end(old, TxnResult::Abort);
    assert_eq!(out.reply, Ok(pe(1001, 0)));
    assert!(out.markers.is_none());
    assert_eq!(w.state(), TxnState::CompleteAbort);
    assert_eq!(w.end(old, TxnResult::Abort).reply, Ok(pe(1001, 0)));
}

// ---- section 7: markers ----------------------------------------------------------------

#[test]
fn complete_markers_ignores_stale_jobs() {
    let (mut w, id) = World::ongoing();
    w.end(id, TxnResult::Commit).reply.unwrap();
    let mut job = w.meta().pending_markers().unwrap();
    job.result = TxnResult::Abort;
    let out = complete_markers(w.meta(), &job, NOW);
    assert!(out.persist.is_none());
    w.complete();
    // Completing twice does nothing.
    let job = MarkerJob {
        result: TxnResult::Commit,
        ..job
    };
    assert!(complete_markers(w.meta(), &job, NOW).persist.is_none());
}

#[test]
fn pending_markers_only_in_prepare() {
    for state in ALL {
        let (w, _) = in_state(state);
        assert_eq!(
            w.meta().pending_markers().is_some(),
            state.is_prepare(),
            "{state}"
        );
    }
}

#[test]
fn groups_by_coordinator() {
    let (mut w, id) = World::started();
    w.add_group(id, "g1").reply.unwrap();
    w.add_group(id, "g2").reply.unwrap();
    let job = w.end(id, TxnResult::Commit).markers.unwrap();
    let by = job.groups_by_coordinator(&w.topology);
    assert_eq!(by[&1].len(), 2);
}

// ---- section 8: timeout ----------------------------------------------------------------

#[test]
fn timeout_scan_only_aborts_old_ongoing() {
    for state in ALL {
        let (mut w, _) = in_state(state);
        w.now = NOW + i64::from(TIMEOUT) + 1;
        assert_eq!(w.expire().is_some(), state == TxnState::Ongoing, "{state}");
    }
    let (mut w, _) = World::ongoing();
    w.now = NOW + i64::from(TIMEOUT);
    assert!(w.expire().is_none(), "exactly the timeout is not over it");
}

#[test]
fn timeout_fences_with_a_distinct_error() {
    let (mut w, id) = World::ongoing();
    w.now = NOW + i64::from(TIMEOUT) + 1;
    let out = w.expire().unwrap();
    let bumped = pe(id.producer_id, id.epoch + 1);
    assert_eq!(out.reply, Ok(bumped));
    assert_eq!(out.markers.unwrap().identity, bumped);
    let m = w.meta().clone();
    assert_eq!(
        (m.state, m.last_epoch, m.timed_out),
        (TxnState::PrepareAbort, id.epoch, true)
    );
    // The late producer is told plainly, also by its leaders' verification.
    assert_eq!(
        verify_transaction(ID, w.meta.as_ref(), id, &tp(0)).map_err(|e| err_name(&e)),
        Err("TRANSACTION_TIMED_OUT")
    );
    assert_eq!(code(&w.add(id, &[0])), "TRANSACTION_TIMED_OUT");
    assert_eq!(code(&w.add_group(id, "g")), "TRANSACTION_TIMED_OUT");
    assert_eq!(
        code(&w.commit_offsets(id, "g", &[(0, 1)])),
        "TRANSACTION_TIMED_OUT"
    );
    assert_eq!(code(&w.end(id, TxnResult::Commit)), "TRANSACTION_TIMED_OUT");
    assert_eq!(
        code(&w.end(id, TxnResult::Abort)),
        "CONCURRENT_TRANSACTIONS"
    );
    w.complete();
    assert_eq!(code(&w.end(id, TxnResult::Commit)), "TRANSACTION_TIMED_OUT");
    // Its own late abort is a retry answered with the bumped pair ...
    assert_eq!(w.end(id, TxnResult::Abort).reply, Ok(bumped));
    // ... as is its recovery InitProducerId.
    assert_eq!(w.init(Some(id)).reply, Ok(bumped));
    // It carries on with the bumped epoch.
    assert_eq!(w.add(bumped, &[0]).reply, Ok(bumped));
}

#[test]
fn newer_instance_after_timeout_still_fences() {
    let (mut w, id) = World::ongoing();
    w.now = NOW + i64::from(TIMEOUT) + 1;
    w.expire().unwrap();
    w.complete();
    let newer = w.init(None).reply.unwrap();
    assert_eq!(newer.epoch, id.epoch + 2);
    assert!(!w.meta().timed_out);
    assert_eq!(
        verify_transaction(ID, w.meta.as_ref(), id, &tp(0)).map_err(|e| err_name(&e)),
        Err("INVALID_PRODUCER_EPOCH")
    );
    assert_eq!(code(&w.add(id, &[0])), "PRODUCER_FENCED");
    assert_eq!(code(&w.end(id, TxnResult::Abort)), "PRODUCER_FENCED");
    assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
}

#[test]
fn timeout_at_exhaustion_rotates() {
    let (mut w, _) = World::ongoing();
    let old = w.set_epoch(MAX_CLIENT_EPOCH);
    w.now = NOW + i64::from(TIMEOUT) + 1;
    let out = w.expire().unwrap();
    assert_eq!(out.reply, Ok(pe(1001, 0)));
    assert_eq!(
        out.markers.unwrap().identity,
        pe(old.producer_id, MARKER_ONLY_EPOCH)
    );
    w.complete();
    assert_eq!(code(&w.add(old, &[0])), "TRANSACTION_TIMED_OUT");
    assert_eq!(w.end(old, TxnResult::Abort).reply, Ok(pe(1001, 0)));
}

// ---- VerifyTransaction -------------------------------------------------------------------

#[test]
fn verify_transaction_rows() {
    let (mut w, id) = World::ongoing();
    let v = |w: &World, c, p| {
        verify_transaction(ID, w.meta.as_ref(), c, &tp(p)).map_err(|e| err_name(&e))
    };
    // Yes, with the open transaction's number (the id's first).
    assert_eq!(v(&w, id, 0), Ok(1));
    assert_eq!(v(&w, id, 1), Ok(1));
    assert_eq!(
        v(&w, pe(id.producer_id, id.epoch + 1), 0),
        Err("INVALID_PRODUCER_EPOCH")
    );
    assert_eq!(
        v(&w, pe(id.producer_id + 1, id.epoch), 0),
        Err("INVALID_PRODUCER_ID_MAPPING")
    );
    let new = w.end(id, TxnResult::Commit).reply.unwrap();
    assert_eq!(v(&w, id, 0), Err("INVALID_PRODUCER_EPOCH"));
    assert_eq!(v(&w, new, 0), Err("CONCURRENT_TRANSACTIONS"));
    w.complete();
    assert_eq!(v(&w, new, 0), Err("INVALID_TXN_STATE"));
    w.add(new, &[1]).reply.unwrap();
    assert_eq!(v(&w, new, 0), Err("INVALID_TXN_STATE"));
    assert_eq!(v(&w, new, 1), Ok(2), "the next transaction");
    assert_eq!(
        verify_transaction(ID, None, new, &tp(0)).map_err(|e| err_name(&e)),
        Err("INVALID_PRODUCER_ID_MAPPING")
    );
}

#[test]
fn metadata_round_trips_through_json() {
    let (mut w, id) = World::ongoing();
    w.add_group(id, "g").reply.unwrap();
    w.commit_offsets(id, "g", &[(1, 42)]).reply.unwrap();
    let json = serde_json::to_vec(w.meta()).unwrap();
    let back: TxnMetadata = serde_json::from_slice(&json).unwrap();
    assert_eq!(&back, w.meta());
}

// ---- randomized simulation of the invariants (PROTOCOL.md section 11) -------------------

/// A tiny deterministic generator (no dependency, reproducible by seed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Random interleavings of several producer instances, the timeout scan and marker
/// completion against one id. After every step: only the current pair may add or end; a PID's
/// epochs never go down; markers carry an epoch above every epoch that wrote in the
/// transaction; a decided transaction completes with its decision; rotated PIDs are fresh.
///
/// One piece on purpose: the invariants are checked between every two random steps against
/// state the whole loop carries (epochs seen per PID, epochs that wrote in the open
/// transaction), so splitting it would only pass that state around.
#[test]
fn random_interleavings_keep_the_invariants() {
    // (accepted writes, marker checks, rotations, timeouts, commits completed)
    let mut stats = [0u32; 5];
    for seed in 0..300u64 {
        let mut rng = Lcg(seed);
        let mut w = World::new();
        // Half the runs start near exhaustion to cross the rotation.
        if seed % 2 == 1 {
            let mut meta = TxnMetadata::new(ID, 1, TIMEOUT, NOW);
            meta.producer_epoch = MAX_CLIENT_EPOCH - 3;
            w.meta = Some(meta);
            w.next_pid = 1000;
        }
        let mut handles: Vec<Option<ProducerIdAndEpoch>> = vec![None; 3];
        let mut max_epoch: BTreeMap<ProducerId, ProducerEpoch> = BTreeMap::new();
        let mut used_pids: BTreeSet<ProducerId> = w.meta.iter().map(|m| m.producer_id).collect();
        let mut writers_in_txn: Vec<ProducerIdAndEpoch> = Vec::new();
        for step in 0..300i64 {
            let h = rng.next(3) as usize;
            let before = w.meta.clone();
            let caller = handles[h].unwrap_or(pe(-1, -1));
            let op = rng.next(9);
            let out = match op {
                0 => w.init(None),
                1 => w.init(handles[h]),
                2 | 3 => w.add(caller, &[rng.next(2) as i32]),
                4 => w.add_group(caller, "g"),
                5 => w.commit_offsets(caller, "g", &[(0, step)]),
                6 => w.end(
                    caller,
                    if rng.next(2) == 0 {
                        TxnResult::Commit
                    } else {
                        TxnResult::Abort
                    },
                ),
                7 => match w.meta.as_ref().and_then(|m| m.pending_markers()) {
                    Some(job) => w.apply(|w, _| complete_markers(w.meta(), &job, w.now)),
                    None => continue,
                },
                _ if w.meta.is_none() => continue,
                _ => {
                    w.now += i64::from(TIMEOUT) / 2;
                    match w.expire() {
                        Some(out) => out,
                        None => continue,
                    }
                }
            };
            let ctx = format!("seed {seed} step {step} op {op} handle {h} caller {caller}");
            // Only the current pair may write into or end a transaction.
            if matches!(op, 2..=6) && out.reply.is_ok() {
                let current = before.as_ref().unwrap().client_identity();
                let retry = before.as_ref().unwrap().last_identity() == Some(caller);
                assert!(
                    caller == current || (op == 6 && retry),
                    "{ctx}: {caller} acted, current {current}"
                );
                if matches!(op, 2..=5) && out.persist.is_some() {
                    writers_in_txn.push(caller);
                    stats[0] += 1;
                }
            }
            if let Some(next) = &out.persist {
                let prev_state = before.as_ref().map(|m| m.state);
                // Decided transactions complete with their decision.
                if let Some(prev) = prev_state.filter(|s| s.is_prepare()) {
                    assert_eq!(
                        TxnResult::of_state(next.state),
                        TxnResult::of_state(prev),
                        "{ctx}"
                    );
                    assert!(
                        matches!(
                            next.state,
                            TxnState::CompleteCommit | TxnState::CompleteAbort
                        ),
                        "{ctx}"
                    );
                }
                // Epochs per PID never go down; new PIDs are fresh.
                for pair in [next.client_identity(), next.marker_identity()] {
                    let max = max_epoch.entry(pair.producer_id).or_insert(pair.epoch);
                    if pair == next.marker_identity() && !next.state.is_prepare() {
                        continue;
                    }
                    assert!(pair.epoch >= *max, "{ctx}: {pair} after epoch {max}");
                    *max = pair.epoch;
                }
                let pid = next.client_identity().producer_id;
                if before.as_ref().is_none_or(|b| !b.knows_pid(pid)) && next.next_producer_id != pid
                {
                    assert!(used_pids.insert(pid), "{ctx}: pid {pid} reused");
                }
                if next.previous_producer_id
                    != before.as_ref().map_or(-1, |b| b.previous_producer_id)
                {
                    stats[2] += 1;
                }
                if next.timed_out && !before.as_ref().is_some_and(|b| b.timed_out) {
                    stats[3] += 1;
                }
                if next.state == TxnState::CompleteCommit
                    && prev_state != Some(TxnState::CompleteCommit)
                {
                    stats[4] += 1;
                }
                if next.next_producer_id != NO_PRODUCER_ID {
                    assert!(
                        used_pids.insert(next.next_producer_id),
                        "{ctx}: next pid reused"
                    );
                }
                if next.state.is_settled() && !prev_state.is_some_and(|s| s == TxnState::Ongoing) {
                    writers_in_txn.clear();
                }
            }
            // Markers carry an epoch above every epoch that wrote in the transaction.
            if let Some(job) = &out.markers {
                for writer in writers_in_txn.drain(..) {
                    if writer.producer_id == job.identity.producer_id {
                        stats[1] += 1;
                        assert!(
                            job.identity.epoch > writer.epoch,
                            "{ctx}: marker {} vs writer {writer}",
                            job.identity
                        );
                    }
                }
            }
            // The caller adopts the pair of an OK Init/EndTxn reply, like a client.
            if matches!(op, 0 | 1 | 6) {
                if let Ok(pair) = out.reply {
                    handles[h] = Some(pair);
                }
            }
        }
    }
    // The runs exercised what they claim to.
    let [writes, marker_checks, rotations, timeouts, commits] = stats;
    assert!(writes > 1000 && marker_checks > 300, "{stats:?}");
    assert!(
        rotations > 20 && timeouts > 20 && commits > 100,
        "{stats:?}"
    );
}

// ---- transaction version 1: one test per rule that differs from version 2 ----------------

impl World {
    /// A version-1 client: InitProducerId recorded the version; an Ongoing transaction.
    fn ongoing_v1() -> (Self, ProducerIdAndEpoch) {
        let mut w = World::new();
        let id = w
            .apply(|w, pid| {
                init_producer_id_for_version(
                    ID,
                    w.meta.as_ref(),
                    TIMEOUT,
                    None,
                    w.now,
                    pid,
                    TransactionVersion::V1,
                )
            })
            .reply
            .unwrap();
        assert_eq!(w.meta().client_transaction_version, TransactionVersion::V1);
        w.add(id, &[0, 1]).reply.unwrap();
        (w, id)
    }
}

#[test]
fn v1_init_producer_id_records_the_version_and_v2_takes_it_back() {
    let (mut w, id) = World::ongoing_v1();
    w.end(id, TxnResult::Commit).reply.unwrap();
    w.complete();
    // Our own client's InitProducerId (version 2) switches the id back.
    let out = w.apply(|w, pid| {
        init_producer_id_for_version(
            ID,
            w.meta.as_ref(),
            TIMEOUT,
            None,
            w.now,
            pid,
            TransactionVersion::V2,
        )
    });
    assert_eq!(out.reply.unwrap().epoch, id.epoch + 1);
    assert_eq!(w.meta().client_transaction_version, TransactionVersion::V2);
    // A retry that changes nothing but the version still writes it.
    let meta = w.meta().clone();
    let mut last = meta.clone();
    last.last_epoch = meta.producer_epoch - 1;
    let retry = ProducerIdAndEpoch::new(meta.producer_id, meta.producer_epoch - 1);
    let out = init_producer_id_for_version(
        ID,
        Some(&last),
        TIMEOUT,
        Some(retry),
        NOW,
        None,
        TransactionVersion::V1,
    );
    assert_eq!(out.reply.unwrap(), meta.client_identity());
    assert_eq!(
        out.persist.unwrap().client_transaction_version,
        TransactionVersion::V1
    );
}

#[test]
fn v1_end_txn_keeps_the_epoch_and_markers_carry_it() {
    let (mut w, id) = World::ongoing_v1();
    let out = w.end(id, TxnResult::Commit);
    assert_eq!(out.reply.unwrap(), id, "no bump");
    assert_eq!(w.meta().state, TxnState::PrepareCommit);
    let job = out.markers.unwrap();
    assert_eq!(job.identity, id, "markers carry the data's epoch");
    assert_eq!(job.transaction_version, TransactionVersion::V1);
    w.complete();
    assert_eq!(w.meta().state, TxnState::CompleteCommit);
    assert_eq!(w.meta().client_identity(), id);
    // The next transaction runs at the same epoch.
    w.add(id, &[1]).reply.unwrap();
    assert_eq!(w.end(id, TxnResult::Abort).markers.unwrap().identity, id);
}

#[test]
fn v1_end_txn_retries_and_wrong_decisions() {
    let (mut w, id) = World::ongoing_v1();
    w.end(id, TxnResult::Commit).reply.unwrap();
    // Prepare*: a retry is CONCURRENT_TRANSACTIONS.
    assert_eq!(
        code(&w.end(id, TxnResult::Commit)),
        "CONCURRENT_TRANSACTIONS"
    );
    w.complete();
    // Complete*: the same decision is OK without a write, the other one INVALID_TXN_STATE.
    let out = w.end(id, TxnResult::Commit);
    assert_eq!((out.reply, out.persist), (Ok(id), None));
    assert_eq!(code(&w.end(id, TxnResult::Abort)), "INVALID_TXN_STATE");
}

#[test]
fn v1_end_txn_in_empty_commit_is_invalid_abort_is_a_no_op() {
    let (w, id) = World::ongoing_v1();
    let mut empty = w.meta().clone();
    empty.state = TxnState::Empty;
    empty.partitions.clear();
    let out = end_txn(ID, Some(&empty), id, TxnResult::Abort, NOW, None);
    assert_eq!((out.reply, out.persist), (Ok(id), None));
    let out = end_txn(ID, Some(&empty), id, TxnResult::Commit, NOW, None);
    assert_eq!(code(&out), "INVALID_TXN_STATE");
}

#[test]
fn v1_end_txn_from_an_older_epoch_is_fenced_without_a_retry_window() {
    let (mut w, id) = World::ongoing_v1();
    // A newer instance fences the open transaction (a bump, as in version 2).
    assert_eq!(code(&w.init(None)), "CONCURRENT_TRANSACTIONS");
    w.complete();
    assert!(w.meta().client_identity().epoch > id.epoch);
    assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
    assert_eq!(code(&w.end(id, TxnResult::Abort)), "PRODUCER_FENCED");
    let stranger = ProducerIdAndEpoch::new(id.producer_id + 99, 0);
    assert_eq!(
        code(&w.end(stranger, TxnResult::Abort)),
        "INVALID_PRODUCER_ID_MAPPING"
    );
}

#[test]
fn transaction_versions_from_the_wire() {
    assert_eq!(
        TransactionVersion::from_wire(0),
        Some(TransactionVersion::V2)
    );
    assert_eq!(
        TransactionVersion::from_wire(1),
        Some(TransactionVersion::V1)
    );
    assert_eq!(
        TransactionVersion::from_wire(2),
        Some(TransactionVersion::V2)
    );
    assert_eq!(TransactionVersion::from_wire(3), None);
    assert_eq!(TransactionVersion::V1.to_wire(), 1);
    // Records stored before versions existed read as version 2.
    let mut json = serde_json::to_value(TxnMetadata::new(ID, 1, TIMEOUT, NOW)).unwrap();
    json.as_object_mut()
        .unwrap()
        .remove("client_transaction_version");
    let meta: TxnMetadata = serde_json::from_value(json).unwrap();
    assert_eq!(meta.client_transaction_version, TransactionVersion::V2);
}

#[test]
fn the_epoch_history_keeps_the_last_changes_only() {
    let mut meta = TxnMetadata::new("h", 7, 60_000, 0);
    for at in 0..(MAX_EPOCH_HISTORY as i64 + 10) {
        meta.producer_epoch = at as i16;
        meta.record_epoch_change("end_txn", "127.0.0.1:1", at);
    }
    assert_eq!(meta.history.len(), MAX_EPOCH_HISTORY);
    assert_eq!(meta.history[0].at_ms, 10);
    assert_eq!(meta.history[0].epoch, 10);
    let last = meta.history.last().unwrap();
    assert_eq!(
        (last.producer_id, last.epoch),
        (7, MAX_EPOCH_HISTORY as i16 + 9)
    );
    // Values stored before the history existed still load.
    let mut json = serde_json::to_value(&meta).unwrap();
    json.as_object_mut().unwrap().remove("history");
    let old: TxnMetadata = serde_json::from_value(json).unwrap();
    assert!(old.history.is_empty());
}

/// transactional.id.expiration.ms: only an id with no transaction open or being finished, and
/// only once it has been idle for the whole expiration.
#[test]
fn only_a_settled_idle_id_expires() {
    for state in ALL {
        let (w, _) = in_state(state);
        let last = w.meta().last_update_ms;
        let settled = state.is_settled();
        assert_eq!(
            is_expired_id(w.meta(), last + 1000, 1000),
            settled,
            "{state:?}"
        );
        assert_eq!(
            is_expired_id(w.meta(), last + 5000, 1000),
            settled,
            "{state:?}"
        );
        assert!(!is_expired_id(w.meta(), last + 999, 1000), "{state:?}");
    }
}

#[test]
fn every_transaction_gets_the_next_number_and_its_markers_carry_it() {
    let (mut w, id) = World::started();
    assert_eq!(w.meta().transaction_number, 0, "none begun yet");
    w.add(id, &[0]).reply.unwrap();
    assert_eq!(w.meta().transaction_number, 1);
    // A second add in the same transaction does not count.
    w.add_group(id, "g").reply.unwrap();
    assert_eq!(w.meta().transaction_number, 1);
    let next = w.end(id, TxnResult::Commit).reply.unwrap();
    assert_eq!(w.meta().pending_markers().unwrap().transaction_number, 1);
    w.complete();
    // The next transaction, begun by its first add (a group only here): number 2, and the
    // stored value keeps it (a restarted coordinator re-sends markers with the same number).
    w.add_group(next, "g").reply.unwrap();
    w.end(next, TxnResult::Abort).reply.unwrap();
    let stored: TxnMetadata =
        serde_json::from_slice(&serde_json::to_vec(w.meta()).unwrap()).unwrap();
    assert_eq!(stored.pending_markers().unwrap().transaction_number, 2);
    // A value written before the numbers existed reads as 0 (not known).
    let mut old = serde_json::to_value(w.meta()).unwrap();
    old.as_object_mut().unwrap().remove("transaction_number");
    let old: TxnMetadata = serde_json::from_value(old).unwrap();
    assert_eq!(old.transaction_number, 0);
}
