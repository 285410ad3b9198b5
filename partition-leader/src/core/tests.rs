//! Unit tests of the pure core: every transition and every error row of section 9.

use super::*;

const LIMITS: Limits = Limits {
    max_batch_bytes: 1024,
    max_record_bytes: 256,
};

fn batch(pid: i64, epoch: i32, seq: i32, n: usize, txn: bool) -> ProduceBatch {
    ProduceBatch {
        producer_id: pid,
        producer_epoch: epoch,
        base_sequence: seq,
        is_transactional: txn,
        transactional_id: if txn { "t".into() } else { String::new() },
        records: (0..n)
            .map(|i| Record {
                key: vec![],
                null_key: false,
                value: vec![i as u8],
                null_value: false,
                timestamp_ms: 1,
                headers: Vec::new(),
            })
            .collect(),
    }
}

fn header(pid: i64, epoch: i32, seq: i32, n: usize, txn: bool) -> BatchHeader {
    validate_batch(&LIMITS, &batch(pid, epoch, seq, n, txn)).unwrap()
}

fn marker(pid: i64, epoch: i32, commit: bool, generation: i64) -> Marker {
    Marker {
        producer_id: pid,
        producer_epoch: epoch,
        commit,
        coordinator_id: 1,
        coordinator_generation: generation,
        transaction_version: 2,
        transaction_number: 0,
    }
}

/// Runs a Produce to completion (verification always succeeds); returns the base offset and
/// whether it was a duplicate.
fn produce(s: &mut PartitionState, h: &BatchHeader) -> Result<(i64, bool)> {
    let mut decision = s.check_produce(h, None, 10)?;
    if decision == ProduceDecision::NeedsVerification {
        decision = s.check_produce(h, Some(Verified::default()), 10)?;
    }
    match decision {
        ProduceDecision::Duplicate { base_offset } => Ok((base_offset, true)),
        ProduceDecision::Append(plan) => {
            s.apply(&plan);
            // The shell publishes after the flush covering the write.
            s.publish(s.watermarks());
            Ok((plan.base_offset, false))
        }
        ProduceDecision::NeedsVerification => panic!("verified twice"),
    }
}

fn write_marker(s: &mut PartitionState, m: &Marker) -> Result<Plan> {
    let plan = s.plan_marker(m, 20)?;
    s.apply(&plan);
    s.publish(s.watermarks());
    Ok(plan)
}

fn code(r: Result<impl std::fmt::Debug>) -> proto::ErrorCode {
    r.unwrap_err().code()
}

#[test]
fn sequences_increase_and_offsets_follow() {
    let mut s = PartitionState::new(false);
    assert_eq!(
        produce(&mut s, &header(1, 0, 0, 3, false)).unwrap(),
        (0, false)
    );
    assert_eq!(
        produce(&mut s, &header(1, 0, 3, 2, false)).unwrap(),
        (3, false)
    );
    assert_eq!(s.high_watermark(), 5);
    assert_eq!(s.producer(1).unwrap().last_sequence(), Some(4));
    // A gap.
    assert_eq!(
        code(produce(&mut s, &header(1, 0, 6, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    assert_eq!(s.high_watermark(), 5);
}

#[test]
fn duplicate_returns_original_offset_and_appends_nothing() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 2, false)).unwrap();
    produce(&mut s, &header(1, 0, 2, 2, false)).unwrap();
    let before = s.clone();
    assert_eq!(
        produce(&mut s, &header(1, 0, 0, 2, false)).unwrap(),
        (0, true)
    );
    assert_eq!(
        produce(&mut s, &header(1, 0, 2, 2, false)).unwrap(),
        (2, true)
    );
    assert_eq!(s, before);
    // Same first sequence, different range: not a duplicate, out of order.
    assert_eq!(
        code(produce(&mut s, &header(1, 0, 2, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
}

#[test]
fn duplicate_window_is_five_batches() {
    let mut s = PartitionState::new(false);
    for i in 0..6 {
        produce(&mut s, &header(1, 0, i, 1, false)).unwrap();
    }
    // Batches 1..=5 are remembered, batch 0 (the 6th-oldest) is not.
    for i in 1..6 {
        assert_eq!(
            produce(&mut s, &header(1, 0, i, 1, false)).unwrap(),
            (i as i64, true)
        );
    }
    assert_eq!(
        code(produce(&mut s, &header(1, 0, 0, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    assert_eq!(s.high_watermark(), 6);
}

#[test]
fn sequence_wraps_at_i32_max() {
    assert_eq!(increment_sequence(i32::MAX, 1), 0);
    assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
    assert_eq!(increment_sequence(5, 1), 6);
    let mut s = PartitionState::new(false);
    // Reach i32::MAX - 1 via the state directly (2^31 batches would take a while).
    produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
    let mut p = s.producer(1).unwrap().clone();
    p.batches.back_mut().unwrap().last_seq = i32::MAX - 2;
    s.producers.insert(1, p);
    // A batch of 3 starting at MAX-1 holds MAX-1, MAX, 0.
    let h = header(1, 0, i32::MAX - 1, 3, false);
    assert_eq!(h.last_seq, 0);
    produce(&mut s, &h).unwrap();
    assert_eq!(s.producer(1).unwrap().last_sequence(), Some(0));
    produce(&mut s, &header(1, 0, 1, 1, false)).unwrap();
    // Exactly at MAX: the next one is 0.
    let mut p = s.producer(1).unwrap().clone();
    p.batches.back_mut().unwrap().last_seq = i32::MAX;
    s.producers.insert(1, p);
    assert_eq!(
        code(produce(&mut s, &header(1, 0, i32::MAX, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
}

#[test]
fn older_epoch_is_fenced_and_higher_epoch_starts_at_zero() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 3, 0, 1, false)).unwrap();
    assert_eq!(
        code(produce(&mut s, &header(1, 2, 1, 1, false))),
        proto::ErrorCode::InvalidProducerEpoch
    );
    // An older epoch is fenced even when it names a remembered range of that epoch.
    assert_eq!(
        code(produce(&mut s, &header(1, 2, 0, 1, false))),
        proto::ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(
        code(produce(&mut s, &header(1, 4, 1, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    produce(&mut s, &header(1, 4, 0, 1, false)).unwrap();
    let p = s.producer(1).unwrap();
    assert_eq!(p.epoch, 4);
    assert_eq!(p.batches.len(), 1, "a new epoch starts a new window");
    // The old epoch's batch is no longer a duplicate: fenced.
    assert_eq!(
        code(produce(&mut s, &header(1, 3, 0, 1, false))),
        proto::ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(s.high_watermark(), 2);
}

#[test]
fn unknown_pid_must_start_at_zero() {
    let mut s = PartitionState::new(false);
    assert_eq!(
        code(produce(&mut s, &header(7, 0, 5, 1, false))),
        proto::ErrorCode::UnknownProducerId
    );
    assert_eq!(s, PartitionState::new(false));
    produce(&mut s, &header(7, 2, 0, 1, false)).unwrap();
}

/// Over Kafka's protocol (requests of a connection handled in order), a PID without state may
/// start anywhere, as in Kafka: its state starts there and the next batch must follow it. A
/// transactional one is still verified by the coordinator first.
#[test]
fn where_the_face_allows_it_an_unknown_pid_starts_at_any_sequence() {
    let resumed = |pid, seq, txn| BatchHeader {
        any_first_sequence: true,
        ..header(pid, 0, seq, 2, txn)
    };
    let mut s = PartitionState::new(false);
    produce(&mut s, &resumed(7, 5, false)).unwrap();
    assert_eq!(s.producer(7).unwrap().last_sequence(), Some(6));
    assert_eq!(
        code(produce(&mut s, &header(7, 0, 9, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    produce(&mut s, &header(7, 0, 7, 1, false)).unwrap();
    assert_eq!(
        s.check_produce(&resumed(8, 3, true), None, 10).unwrap(),
        ProduceDecision::NeedsVerification
    );
    assert_eq!(s.high_watermark(), 3);
}

#[test]
fn plain_producers_skip_checks() {
    let mut s = PartitionState::new(false);
    let mut b = batch(-1, 77, 99, 2, false);
    let h = validate_batch(&LIMITS, &b).unwrap();
    assert_eq!(produce(&mut s, &h).unwrap(), (0, false));
    assert_eq!(produce(&mut s, &h).unwrap(), (2, false), "no dedup");
    assert!(s.producers().is_empty());
    b.is_transactional = true;
    b.transactional_id = "t".into();
    assert_eq!(
        code(validate_batch(&LIMITS, &b)),
        proto::ErrorCode::InvalidRequest
    );
}

#[test]
fn transactional_batch_opening_a_txn_needs_verification_once() {
    let mut s = PartitionState::new(false);
    let h = header(1, 0, 0, 2, true);
    assert_eq!(
        s.check_produce(&h, None, 1).unwrap(),
        ProduceDecision::NeedsVerification
    );
    produce(&mut s, &h).unwrap();
    assert_eq!(s.producer(1).unwrap().txn_first_offset, Some(0));
    // Later batches of the open transaction need no verification.
    assert!(matches!(
        s.check_produce(&header(1, 0, 2, 1, true), None, 1).unwrap(),
        ProduceDecision::Append(_)
    ));
    // After the marker closes it, the next transaction is verified again.
    write_marker(&mut s, &marker(1, 1, true, 0)).unwrap();
    assert_eq!(
        s.check_produce(&header(1, 1, 0, 1, true), None, 1).unwrap(),
        ProduceDecision::NeedsVerification
    );
}

#[test]
fn non_transactional_batch_while_txn_open_is_invalid_txn_state() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
    assert_eq!(
        code(produce(&mut s, &header(1, 0, 1, 1, false))),
        proto::ErrorCode::InvalidTxnState
    );
    assert_eq!(s.high_watermark(), 1);
}

#[test]
fn higher_epoch_txn_batch_while_old_txn_open_is_retriable() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
    assert_eq!(
        code(produce(&mut s, &header(1, 1, 0, 1, true))),
        proto::ErrorCode::ConcurrentTransactions
    );
}

#[test]
fn marker_closes_txn_adopts_epoch_and_resets_window() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 2, true)).unwrap();
    produce(&mut s, &header(1, 0, 2, 1, true)).unwrap();
    assert_eq!(s.last_stable_offset(), 0);
    let plan = write_marker(&mut s, &marker(1, 1, false, 3)).unwrap();
    assert!(plan.control.is_some());
    assert_eq!(plan.base_offset, 3);
    assert_eq!(s.high_watermark(), 4);
    assert_eq!(s.last_stable_offset(), 4);
    let p = s.producer(1).unwrap();
    assert_eq!(p.epoch, 1);
    assert!(p.batches.is_empty());
    assert_eq!(p.txn_first_offset, None);
    assert_eq!(p.coordinator_generation, 3);
    assert_eq!(
        s.aborted_txns().copied().collect::<Vec<_>>(),
        vec![AbortedTxn {
            producer_id: 1,
            first_offset: 0,
            last_offset: 3
        }]
    );
    // The window was reset: the new epoch starts at 0, the old epoch is fenced.
    assert_eq!(
        code(produce(&mut s, &header(1, 1, 3, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    assert_eq!(
        code(produce(&mut s, &header(1, 0, 3, 1, true))),
        proto::ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(
        produce(&mut s, &header(1, 1, 0, 1, true)).unwrap(),
        (4, false)
    );
}

#[test]
fn markers_are_idempotent() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
    write_marker(&mut s, &marker(1, 1, true, 0)).unwrap();
    let after_first = s.clone();
    assert!(write_marker(&mut s, &marker(1, 1, true, 0))
        .unwrap()
        .is_noop());
    assert_eq!(s, after_first);
    // A late repeat after the next transaction (same epoch, TV2) opened: does not close it.
    produce(&mut s, &header(1, 1, 0, 1, true)).unwrap();
    assert!(write_marker(&mut s, &marker(1, 1, true, 0))
        .unwrap()
        .is_noop());
    assert_eq!(s.producer(1).unwrap().txn_first_offset, Some(2));
    assert_eq!(s.last_stable_offset(), 2);
    // Its real marker does.
    write_marker(&mut s, &marker(1, 2, true, 0)).unwrap();
    assert_eq!(s.last_stable_offset(), 4);
}

#[test]
fn marker_checks_epoch_then_generation() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 5, 0, 1, true)).unwrap();
    write_marker(&mut s, &marker(1, 6, true, 4)).unwrap();
    let before = s.clone();
    assert_eq!(
        code(write_marker(&mut s, &marker(1, 5, false, 9))),
        proto::ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(
        code(write_marker(&mut s, &marker(1, 7, false, 3))),
        proto::ErrorCode::TransactionCoordinatorFenced
    );
    assert_eq!(s, before);
    // A newer generation repeating the same marker is acknowledged and remembered.
    let plan = write_marker(&mut s, &marker(1, 6, true, 5)).unwrap();
    assert!(plan.control.is_none());
    assert_eq!(s.producer(1).unwrap().coordinator_generation, 5);
    assert_eq!(s.high_watermark(), before.high_watermark());
}

#[test]
fn marker_for_unknown_pid_records_epoch_and_appends_nothing() {
    let mut s = PartitionState::new(false);
    let plan = write_marker(&mut s, &marker(9, 4, false, 1)).unwrap();
    assert_eq!(plan.control, None);
    assert_eq!(plan.record_count, 0);
    assert_eq!(s.high_watermark(), 0);
    assert_eq!(s.producer(9).unwrap().epoch, 4);
    // The zombie (epoch 3) that never wrote here is now rejected here.
    assert_eq!(
        code(produce(&mut s, &header(9, 3, 0, 1, true))),
        proto::ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(s.high_watermark(), 0);
    assert_eq!(s.aborted_txns().count(), 0);
}

#[test]
fn marker_without_open_txn_raises_epoch_of_known_pid() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
    write_marker(&mut s, &marker(1, 2, false, 0)).unwrap();
    assert_eq!(s.high_watermark(), 1);
    assert_eq!(
        code(produce(&mut s, &header(1, 0, 1, 1, false))),
        proto::ErrorCode::InvalidProducerEpoch
    );
}

#[test]
fn bad_markers_are_invalid_request() {
    let s = PartitionState::new(false);
    for m in [
        marker(-1, 0, true, 0),
        marker(1, -1, true, 0),
        marker(1, 32768, true, 0),
        marker(1, 0, true, -1),
    ] {
        assert_eq!(code(s.plan_marker(&m, 0)), proto::ErrorCode::InvalidRequest);
    }
}

#[test]
fn lso_with_interleaved_transactions_of_several_pids() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(-1, 0, 0, 1, false)).unwrap(); // 0 plain
    produce(&mut s, &header(1, 0, 0, 1, true)).unwrap(); // 1 pid 1 opens
    produce(&mut s, &header(2, 0, 0, 1, true)).unwrap(); // 2 pid 2 opens
    produce(&mut s, &header(1, 0, 1, 1, true)).unwrap(); // 3
    produce(&mut s, &header(3, 0, 0, 1, true)).unwrap(); // 4 pid 3 opens
    assert_eq!(s.high_watermark(), 5);
    assert_eq!(s.last_stable_offset(), 1);
    // Ending a later transaction does not move the LSO.
    write_marker(&mut s, &marker(2, 1, true, 0)).unwrap(); // 5
    assert_eq!(s.last_stable_offset(), 1);
    // Ending the earliest moves it to the next open one.
    write_marker(&mut s, &marker(1, 1, false, 0)).unwrap(); // 6
    assert_eq!(s.last_stable_offset(), 4);
    write_marker(&mut s, &marker(3, 1, true, 0)).unwrap(); // 7
    assert_eq!(s.last_stable_offset(), 8);
    assert_eq!(s.high_watermark(), 8);

    let view = s.fetch_view(0, true).unwrap();
    assert_eq!(view.upper, 8);
    let data = |pid| {
        LogEntry::Data(DataRecord {
            producer_id: pid,
            producer_epoch: 0,
            is_transactional: true,
            key: vec![],
            null_key: false,
            value: vec![],
            null_value: false,
            timestamp_ms: 0,
            headers: Vec::new(),
        })
    };
    let visible: Vec<i64> = [(0, -1), (1, 1), (2, 2), (3, 1), (4, 3)]
        .into_iter()
        .filter(|(o, pid)| view.is_visible(*o, &data(*pid)))
        .map(|(o, _)| o)
        .collect();
    assert_eq!(visible, vec![0, 2, 4]);
    let uncommitted = s.fetch_view(0, false).unwrap();
    assert!(uncommitted.is_visible(1, &data(1)));
    let control = LogEntry::Control(ControlRecord {
        producer_id: 2,
        producer_epoch: 1,
        commit: true,
        coordinator_id: 1,
        coordinator_generation: 0,
        timestamp_ms: 0,
    });
    assert!(!view.is_visible(5, &control));
    assert!(!uncommitted.is_visible(5, &control));
}

#[test]
fn read_committed_stops_at_lso() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(-1, 0, 0, 2, false)).unwrap();
    produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
    produce(&mut s, &header(-1, 0, 0, 1, false)).unwrap();
    let view = s.fetch_view(0, true).unwrap();
    assert_eq!(
        (view.upper, view.last_stable_offset, view.high_watermark),
        (2, 2, 4)
    );
    assert_eq!(s.fetch_view(0, false).unwrap().upper, 4);
    assert_eq!(
        code(s.fetch_view(5, false)),
        proto::ErrorCode::OffsetOutOfRange
    );
    assert_eq!(
        code(s.fetch_view(-1, true)),
        proto::ErrorCode::OffsetOutOfRange
    );
    assert!(s.fetch_view(4, true).is_ok());
}

#[test]
fn bad_batches_are_rejected_before_any_state() {
    let too_big_record = ProduceBatch {
        records: vec![Record {
            key: vec![0; 100],
            null_key: false,
            value: vec![0; 157],
            null_value: false,
            timestamp_ms: 0,
            headers: Vec::new(),
        }],
        ..batch(1, 0, 0, 1, false)
    };
    let too_big_batch = ProduceBatch {
        records: (0..8)
            .map(|_| Record {
                key: vec![],
                null_key: false,
                value: vec![0; 200],
                null_value: false,
                timestamp_ms: 0,
                headers: Vec::new(),
            })
            .collect(),
        ..batch(1, 0, 0, 1, false)
    };
    let many_empty = batch(1, 0, 0, 1024 / RECORD_OVERHEAD_BYTES + 1, false);
    // Empty headers (no key, no value) take room in the log too: they count against the batch.
    let empty_headers = ProduceBatch {
        records: vec![Record {
            key: vec![],
            null_key: false,
            value: vec![],
            null_value: false,
            timestamp_ms: 0,
            headers: vec![
                Header {
                    key: String::new(),
                    value: None,
                };
                1024 / HEADER_OVERHEAD_BYTES + 1
            ],
        }],
        ..batch(1, 0, 0, 1, false)
    };
    let mut no_txn_id = batch(1, 0, 0, 1, true);
    no_txn_id.transactional_id.clear();
    let mut long_txn_id = batch(1, 0, 0, 1, true);
    long_txn_id.transactional_id = "x".repeat(cluster::MAX_ID_LEN + 1);
    let cases = [
        (batch(1, 0, 0, 0, false), proto::ErrorCode::InvalidRequest),
        (batch(-2, 0, 0, 1, false), proto::ErrorCode::InvalidRequest),
        (
            batch(i64::MIN, 0, 0, 1, false),
            proto::ErrorCode::InvalidRequest,
        ),
        (batch(1, -1, 0, 1, false), proto::ErrorCode::InvalidRequest),
        (
            batch(1, 32768, 0, 1, false),
            proto::ErrorCode::InvalidRequest,
        ),
        (
            batch(1, i32::MAX, 0, 1, false),
            proto::ErrorCode::InvalidRequest,
        ),
        (batch(1, 0, -1, 1, false), proto::ErrorCode::InvalidRequest),
        (
            batch(1, 0, i32::MIN, 1, false),
            proto::ErrorCode::InvalidRequest,
        ),
        (no_txn_id, proto::ErrorCode::InvalidRequest),
        (long_txn_id, proto::ErrorCode::InvalidRequest),
        (too_big_record, proto::ErrorCode::MessageTooLarge),
        (too_big_batch, proto::ErrorCode::MessageTooLarge),
        (many_empty, proto::ErrorCode::MessageTooLarge),
        (empty_headers, proto::ErrorCode::MessageTooLarge),
    ];
    for (b, expected) in cases {
        assert_eq!(code(validate_batch(&LIMITS, &b)), expected, "{b:?}");
    }
    // Limits are inclusive.
    let exact = ProduceBatch {
        records: vec![Record {
            key: vec![0; 56],
            null_key: false,
            value: vec![0; 200],
            null_value: false,
            timestamp_ms: 0,
            headers: Vec::new(),
        }],
        ..batch(1, 0, 0, 1, false)
    };
    assert!(validate_batch(&LIMITS, &exact).is_ok());
    // An absurd but valid sequence for a known PID is just out of order.
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
    let before = s.clone();
    assert_eq!(
        code(produce(&mut s, &header(1, 0, i32::MAX, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    assert_eq!(
        code(produce(&mut s, &header(1, i16::MAX as i32, 7, 1, false))),
        proto::ErrorCode::OutOfOrderSequenceNumber
    );
    assert_eq!(s, before);
}

#[test]
fn timestamps_default_to_append_time() {
    let h = header(1, 0, 0, 1, false);
    let entries = data_entries(
        &h,
        vec![
            Record {
                key: b"k".to_vec(),
                null_key: false,
                value: b"v".to_vec(),
                null_value: false,
                timestamp_ms: -1,
                headers: Vec::new(),
            },
            Record {
                key: vec![],
                null_key: false,
                value: vec![],
                null_value: false,
                timestamp_ms: 5,
                headers: Vec::new(),
            },
        ],
        99,
    );
    let ts: Vec<i64> = entries
        .iter()
        .map(|e| match e {
            LogEntry::Data(d) => d.timestamp_ms,
            LogEntry::Control(_) => unreachable!(),
        })
        .collect();
    assert_eq!(ts, vec![99, 5]);
}

#[test]
fn unsafe_skip_epoch_check_lets_a_zombie_append() {
    let mut s = PartitionState::new(true);
    produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
    write_marker(&mut s, &marker(1, 1, false, 0)).unwrap();
    let state_before = s.producer(1).unwrap().clone();
    // The zombie at epoch 0 writes, with any sequence.
    assert_eq!(
        produce(&mut s, &header(1, 0, 17, 1, true)).unwrap(),
        (2, false)
    );
    assert_eq!(s.producer(1).unwrap(), &state_before);
    // ... and it is visible to read_committed readers: that is the broken fencing.
    let view = s.fetch_view(0, true).unwrap();
    assert_eq!(view.upper, 3);
    // Markers still check epochs.
    assert_eq!(
        code(write_marker(&mut s, &marker(1, 0, true, 0))),
        proto::ErrorCode::InvalidProducerEpoch
    );
}

#[test]
fn restore_rebuilds_open_txns_and_rejects_inconsistent_state() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
    produce(&mut s, &header(2, 0, 0, 1, true)).unwrap();
    write_marker(&mut s, &marker(2, 1, false, 0)).unwrap();
    let restored = PartitionState::restore(
        false,
        s.high_watermark(),
        s.producers().clone(),
        s.aborted_txns().copied().collect::<Vec<_>>(),
    )
    .unwrap();
    assert_eq!(restored, s);
    assert_eq!(restored.last_stable_offset(), 0);
    assert!(PartitionState::restore(false, 0, s.producers().clone(), vec![]).is_err());
    assert!(PartitionState::restore(false, -1, vec![], vec![]).is_err());
}

#[test]
fn v1_marker_at_the_current_epoch_closes_the_txn_and_keeps_the_window() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 3, 0, 2, true)).unwrap();
    // Version 2: a marker at the data's own epoch is a repeat of an older one, nothing closes.
    let plan = write_marker(&mut s, &marker(1, 3, true, 1)).unwrap();
    assert!(plan.control.is_none());
    assert_eq!(s.last_stable_offset(), 0);
    // Version 1: the same marker ends the transaction open at that epoch.
    let v1 = Marker {
        transaction_version: 1,
        ..marker(1, 3, true, 1)
    };
    let plan = write_marker(&mut s, &v1).unwrap();
    assert!(plan.control.is_some());
    assert_eq!(s.last_stable_offset(), s.high_watermark());
    let p = s.producer(1).unwrap();
    assert_eq!((p.epoch, p.txn_first_offset), (3, None));
    assert!(
        !p.batches.is_empty(),
        "the producer carries on at this epoch"
    );
    // The next batch continues the sequence at the same epoch; a repeat of the marker with
    // nothing open writes nothing.
    produce(&mut s, &header(1, 3, 2, 1, true)).unwrap();
    let hw = s.high_watermark();
    let plan = write_marker(&mut s, &v1).unwrap();
    assert!(plan.control.is_some(), "closes the second transaction");
    assert_eq!(s.high_watermark(), hw + 1);
    assert!(write_marker(&mut s, &v1).unwrap().control.is_none());
}

/// A write the engine holds but no flush has covered: the next write is planned after it, but
/// readers see nothing of it until the shell publishes.
#[test]
fn readers_see_only_published_writes() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 2, false)).unwrap();
    let published = s.watermarks();
    // Applied, not published: a transactional batch and a plain batch.
    let ProduceDecision::Append(plan) = s
        .check_produce(&header(2, 0, 0, 1, true), Some(Verified::default()), 10)
        .unwrap()
    else {
        panic!("append expected")
    };
    s.apply(&plan);
    let ProduceDecision::Append(plan) = s
        .check_produce(&header(1, 0, 2, 1, false), None, 10)
        .unwrap()
    else {
        panic!("append expected")
    };
    assert_eq!(plan.base_offset, 3, "planned after the unflushed write");
    s.apply(&plan);
    // The PID's sequence moved on already: its retry is a duplicate, not a second append.
    assert_eq!(
        s.check_produce(&header(1, 0, 2, 1, false), None, 10)
            .unwrap(),
        ProduceDecision::Duplicate { base_offset: 3 }
    );
    for read_committed in [false, true] {
        let view = s.fetch_view(0, read_committed).unwrap();
        assert_eq!((view.high_watermark, view.last_stable_offset), (2, 2));
        assert_eq!(view.upper, 2);
    }
    // Reading at the log end is in range and reads nothing.
    assert_eq!(s.fetch_view(4, false).unwrap().upper, 2);
    assert_eq!(s.visible(), published);

    s.publish(s.watermarks());
    let view = s.fetch_view(0, false).unwrap();
    assert_eq!(
        (view.high_watermark, view.last_stable_offset, view.upper),
        (4, 2, 4)
    );
    assert_eq!(
        s.fetch_view(0, true).unwrap().upper,
        2,
        "the open transaction holds the LSO"
    );
}

#[test]
fn publishing_never_moves_back_nor_past_the_log_end() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 3, false)).unwrap();
    let three = s.watermarks();
    s.publish(Watermarks {
        high_watermark: 1,
        last_stable_offset: 1,
    });
    assert_eq!(s.visible(), three, "an older publish does not move back");
    s.publish(Watermarks {
        high_watermark: 9,
        last_stable_offset: 9,
    });
    assert_eq!(s.visible(), three, "nothing past the log end");
    s.limit_visible(Watermarks {
        high_watermark: 2,
        last_stable_offset: 2,
    });
    assert_eq!(s.visible().high_watermark, 2);
}

#[test]
fn a_restored_partition_is_visible_up_to_what_was_loaded() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(1, 0, 0, 3, true)).unwrap();
    let restored =
        PartitionState::restore(false, s.high_watermark(), s.producers().clone(), Vec::new())
            .unwrap();
    assert_eq!(
        restored.visible(),
        Watermarks {
            high_watermark: 3,
            last_stable_offset: 0
        }
    );
}

/// Runs a Produce at `now_ms` (verification always succeeds).
fn produce_at(s: &mut PartitionState, h: &BatchHeader, now_ms: i64) {
    let mut decision = s.check_produce(h, None, now_ms).unwrap();
    if decision == ProduceDecision::NeedsVerification {
        decision = s
            .check_produce(h, Some(Verified::default()), now_ms)
            .unwrap();
    }
    let ProduceDecision::Append(plan) = decision else {
        panic!("expected an append, got {decision:?}");
    };
    s.apply(&plan);
}

#[test]
fn only_idle_producers_without_an_open_transaction_expire() {
    let mut s = PartitionState::new(false);
    produce_at(&mut s, &header(1, 0, 0, 1, false), 1_000); // idle idempotent
    produce_at(&mut s, &header(2, 0, 0, 1, true), 1_000); // transaction open
    produce_at(&mut s, &header(3, 0, 0, 1, false), 1_500); // more recent
                                                           // The closed transaction of a fourth PID: its marker is its last change.
    produce_at(&mut s, &header(4, 0, 0, 1, true), 1_000);
    let plan = s.plan_marker(&marker(4, 1, true, 0), 1_000).unwrap();
    s.apply(&plan);
    assert!(
        s.expired_producers(1_999, 1_000).is_empty(),
        "under the bound"
    );
    assert_eq!(
        s.expired_producers(2_000, 1_000),
        vec![1, 4],
        "at the bound"
    );
    assert_eq!(s.expired_producers(2_500, 1_000), vec![1, 3, 4]);
    assert_eq!(
        s.expired_producers(i64::MAX, 1_000),
        vec![1, 3, 4],
        "an open transaction never expires"
    );
    let lso = s.last_stable_offset();
    // Asked to forget everyone, it still keeps the open transaction.
    s.forget_producers(&[1, 2, 3, 4, 99]);
    assert_eq!(s.producers().keys().copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(
        s.last_stable_offset(),
        lso,
        "the open transaction still holds the LSO"
    );
    assert_eq!(s.high_watermark(), 5);
}

#[test]
fn a_forgotten_producer_is_still_fenced_or_starts_afresh() {
    let mut s = PartitionState::new(false);
    produce_at(&mut s, &header(1, 3, 0, 2, false), 0);
    produce_at(&mut s, &header(2, 5, 0, 1, true), 0);
    write_marker(&mut s, &marker(2, 6, false, 0)).unwrap();
    let expired = s.expired_producers(100, 50);
    assert_eq!(expired, vec![1, 2]);
    s.forget_producers(&expired);
    assert!(s.producers().is_empty());
    // The idempotent producer's next batch continues its sequence: it learns its state is gone.
    assert_eq!(
        code(s.check_produce(&header(1, 3, 2, 1, false), None, 200)),
        proto::ErrorCode::UnknownProducerId
    );
    // A zombie of the transactional PID (epoch 5, fenced by the abort marker at 6) opening a
    // new transaction is not let in on the leader's word: the coordinator must verify it.
    assert_eq!(
        s.check_produce(&header(2, 5, 0, 1, true), None, 200)
            .unwrap(),
        ProduceDecision::NeedsVerification
    );
    // The same zombie resuming at its next sequence over Kafka's protocol: verified too.
    let resumed = BatchHeader {
        any_first_sequence: true,
        ..header(2, 5, 1, 1, true)
    };
    assert_eq!(
        s.check_produce(&resumed, None, 200).unwrap(),
        ProduceDecision::NeedsVerification
    );
    // A producer that starts afresh at sequence 0 gets a new window.
    produce_at(&mut s, &header(1, 4, 0, 1, false), 200);
    assert_eq!(s.producer(1).unwrap().last_sequence(), Some(0));
}

/// A version-1 marker of PID 1 at epoch 3 ending transaction `number`.
fn v1_marker(commit: bool, number: u64) -> Marker {
    Marker {
        transaction_version: 1,
        transaction_number: number,
        ..marker(1, 3, commit, 1)
    }
}

/// Runs a transactional Produce whose verification answers transaction `number`.
fn produce_verified(s: &mut PartitionState, h: &BatchHeader, number: u64) {
    let verified = Verified {
        transaction_number: number,
        ..Verified::default()
    };
    let decision = match s.check_produce(h, None, 10).unwrap() {
        ProduceDecision::NeedsVerification => s.check_produce(h, Some(verified), 10).unwrap(),
        other => other,
    };
    let ProduceDecision::Append(plan) = decision else {
        panic!("expected an append, got {decision:?}");
    };
    s.apply(&plan);
    s.publish(s.watermarks());
}

/// Transaction version 1, the race KIP-890 closes: a batch verified while its transaction
/// was open reaches the partition after that transaction's marker. Appended, it would open a
/// transaction no marker will ever close (the LSO held back for good, and the producer's next
/// transaction here refused as CONCURRENT_TRANSACTIONS). It is refused instead.
#[test]
fn a_v1_batch_verified_before_its_transactions_marker_is_refused_after_it() {
    let verified = |number| {
        Some(Verified {
            transaction_number: number,
            ..Verified::default()
        })
    };
    let mut s = PartitionState::new(false);
    // Transaction 4 writes here and commits.
    produce_verified(&mut s, &header(1, 3, 0, 2, true), 4);
    write_marker(&mut s, &v1_marker(true, 4)).unwrap();
    assert_eq!(s.producer(1).unwrap().ended_number, Some(4));
    // A second batch of transaction 4, verified before the marker, arrives after it.
    let late = header(1, 3, 2, 1, true);
    let err = s.check_produce(&late, verified(4), 10).unwrap_err();
    assert_eq!(err.code(), proto::ErrorCode::InvalidTxnState, "{err}");
    // Transaction 5's marker reaches this partition before any of its data (its data was
    // verified, then held up): nothing is open, the number is remembered, durably.
    let plan = write_marker(&mut s, &v1_marker(false, 5)).unwrap();
    assert!(plan.control.is_none(), "nothing was open here");
    assert_eq!(
        plan.producer.as_ref().map(|(_, p)| p.ended_number),
        Some(Some(5)),
        "written with the plan, so a restart keeps it"
    );
    let err = s.check_produce(&late, verified(5), 10).unwrap_err();
    assert_eq!(err.code(), proto::ErrorCode::InvalidTxnState, "{err}");
    assert_eq!(s.last_stable_offset(), s.high_watermark(), "nothing hangs");
    // The same marker again changes nothing more.
    assert!(write_marker(&mut s, &v1_marker(false, 5))
        .unwrap()
        .producer
        .is_none());
    // Transaction 6 opens and is closed by its marker as usual; a batch with no number
    // (a verification that did not say) is appended as before numbers existed.
    produce_verified(&mut s, &late, 6);
    assert!(write_marker(&mut s, &v1_marker(true, 6))
        .unwrap()
        .control
        .is_some());
    produce_verified(&mut s, &header(1, 3, 3, 1, true), 0);
}

/// The same race, held up longer than the producer-state expiry: the state that remembered the
/// transaction's end may be forgotten by then, so the answer no longer counts and the batch
/// is verified again (where the coordinator refuses it) instead of opening a transaction no
/// marker will close.
#[test]
fn a_verification_older_than_the_producer_expiry_is_asked_again() {
    const EXPIRY: i64 = 86_400_000;
    let asked_at = |ms: i64, number| {
        Some(Verified {
            transaction_number: number,
            valid_until_ms: ms + EXPIRY,
        })
    };
    let mut s = PartitionState::new(false);
    produce_verified(&mut s, &header(1, 3, 0, 2, true), 4);
    // The next batch of transaction 4 is verified at 5 ms, then held up; the marker ends
    // transaction 4 at 20 ms.
    write_marker(&mut s, &v1_marker(true, 4)).unwrap();
    let late = BatchHeader {
        any_first_sequence: true,
        ..header(1, 3, 2, 1, true)
    };
    // Still within the expiry: refused by what the marker recorded.
    let err = s
        .check_produce(&late, asked_at(5, 4), 5 + EXPIRY - 1)
        .unwrap_err();
    assert_eq!(err.code(), proto::ErrorCode::InvalidTxnState, "{err}");
    // At the expiry the answer no longer counts, even while the state is still known.
    assert_eq!(
        s.check_produce(&late, asked_at(5, 4), 5 + EXPIRY).unwrap(),
        ProduceDecision::NeedsVerification
    );
    // The expiry scan forgets the PID (its state last changed at the marker, 20 ms).
    let now = 20 + EXPIRY;
    assert_eq!(s.expired_producers(now, EXPIRY), vec![1]);
    s.forget_producers(&[1]);
    assert!(s.producer(1).is_none());
    // With the state gone, only the answer's age stands between the late batch and a
    // transaction that no marker would close.
    assert_eq!(
        s.check_produce(&late, asked_at(5, 4), now).unwrap(),
        ProduceDecision::NeedsVerification
    );
    assert_eq!(s.last_stable_offset(), s.high_watermark(), "nothing hangs");
    // A fresh answer (the coordinator verified it again: a new transaction) is appended.
    let ProduceDecision::Append(plan) = s.check_produce(&late, asked_at(now, 5), now).unwrap()
    else {
        panic!("a fresh verification appends");
    };
    assert_eq!(plan.producer.unwrap().1.txn_number, Some(5));
}

#[test]
fn a_late_v1_marker_of_an_earlier_transaction_closes_nothing() {
    let mut s = PartitionState::new(false);
    // Transaction 4 of the id writes and commits; transaction 5 opens at the same epoch.
    produce_verified(&mut s, &header(1, 3, 0, 2, true), 4);
    assert_eq!(s.producer(1).unwrap().txn_number, Some(4));
    assert!(write_marker(&mut s, &v1_marker(true, 4))
        .unwrap()
        .control
        .is_some());
    assert_eq!(s.producer(1).unwrap().txn_number, None);
    produce_verified(&mut s, &header(1, 3, 2, 1, true), 5);
    let open = s.producer(1).unwrap().txn_first_offset;
    assert!(open.is_some());
    // Transaction 4's COMMIT again (an attempt delayed in the network): acknowledged, nothing
    // appended, transaction 5 stays open and invisible.
    let lso = s.last_stable_offset();
    let plan = write_marker(&mut s, &v1_marker(true, 4)).unwrap();
    assert!(plan.control.is_none());
    assert_eq!(s.producer(1).unwrap().txn_first_offset, open);
    assert_eq!(s.last_stable_offset(), lso);
    // Transaction 5's own marker closes it.
    assert!(write_marker(&mut s, &v1_marker(false, 5))
        .unwrap()
        .control
        .is_some());
    assert_eq!(s.last_stable_offset(), s.high_watermark());
    // Without both numbers, a version-1 marker at the epoch closes what is open, as before.
    produce_verified(&mut s, &header(1, 3, 3, 1, true), 0);
    assert!(write_marker(&mut s, &v1_marker(true, 4))
        .unwrap()
        .control
        .is_some());
    produce_verified(&mut s, &header(1, 3, 4, 1, true), 7);
    assert!(write_marker(&mut s, &v1_marker(true, 0))
        .unwrap()
        .control
        .is_some());
}

/// DeleteRecords: the log start moves to an offset up to the high watermark readers see (-1:
/// that high watermark), never backwards; past it, or below -1, is OFFSET_OUT_OF_RANGE; a fetch
/// below the log start is OFFSET_OUT_OF_RANGE; producer states stay (a deleted producer's
/// zombie is still fenced).
#[test]
fn delete_records_moves_the_log_start_forward_only_and_within_what_readers_see() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(7, 1, 0, 5, false)).unwrap();
    assert_eq!(s.log_start_offset(), 0);
    assert_eq!(s.delete_records_target(3).unwrap(), Some(3));
    assert_eq!(s.delete_records_target(-1).unwrap(), Some(5));
    for bad in [6, -2, i64::MIN, i64::MAX] {
        assert_eq!(
            code(s.delete_records_target(bad)),
            proto::ErrorCode::OffsetOutOfRange,
            "{bad}"
        );
    }
    s.set_log_start_offset(3);
    assert_eq!(s.log_start_offset(), 3);
    // Nothing to write at or below the log start; it never moves back.
    assert_eq!(s.delete_records_target(2).unwrap(), None);
    assert_eq!(s.delete_records_target(3).unwrap(), None);
    s.set_log_start_offset(1);
    assert_eq!(s.log_start_offset(), 3);
    // Never past the log end, even when told so (a stale value).
    s.set_log_start_offset(100);
    assert_eq!(s.log_start_offset(), 5);
    s.set_log_start_offset(3);
    assert_eq!(s.log_start_offset(), 5);

    let mut s = PartitionState::new(false);
    produce(&mut s, &header(7, 1, 0, 5, false)).unwrap();
    s.set_log_start_offset(3);
    assert_eq!(
        code(s.fetch_view(2, false)),
        proto::ErrorCode::OffsetOutOfRange
    );
    assert_eq!(s.fetch_view(3, true).unwrap().upper, 5);
    // The producer is still known: its older epoch is fenced, its next batch continues.
    assert_eq!(
        code(produce(&mut s, &header(7, 0, 5, 1, false))),
        proto::ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(produce(&mut s, &header(7, 1, 5, 1, false)).unwrap().0, 5);
}

/// A write not yet durable is not counted: DeleteRecords stops at what readers see.
#[test]
fn delete_records_does_not_reach_writes_readers_do_not_see_yet() {
    let mut s = PartitionState::new(false);
    produce(&mut s, &header(7, 1, 0, 2, false)).unwrap();
    let ProduceDecision::Append(plan) = s
        .check_produce(&header(7, 1, 2, 3, false), None, 10)
        .unwrap()
    else {
        panic!("an append")
    };
    // Applied, not yet published (its flush has not covered it).
    s.apply(&plan);
    assert_eq!(s.high_watermark(), 5);
    assert_eq!(s.visible().high_watermark, 2);
    assert_eq!(s.delete_records_target(-1).unwrap(), Some(2));
    assert_eq!(
        code(s.delete_records_target(4)),
        proto::ErrorCode::OffsetOutOfRange
    );
}
