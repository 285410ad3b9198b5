//! Unit tests of the module next to this file.
use super::*;

const MS: Duration = Duration::from_millis(1);

fn settings() -> Settings {
    Settings {
        batch_size: 3 * record_size(&rec(0)),
        linger: 5 * MS,
        max_in_flight: 5,
        delivery_timeout: 1000 * MS,
        retry_backoff: 10 * MS,
        retry_backoff_max: 40 * MS,
    }
}

fn rec(i: u32) -> Record {
    Record {
        key: vec![],
        null_key: false,
        value: format!("v{i:04}").into_bytes(),
        null_value: false,
        timestamp_ms: 0,
        headers: vec![],
    }
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

fn acc(mode: Mode) -> (Accumulator<u32>, Instant) {
    (Accumulator::new(settings(), mode, (7, 0)), Instant::now())
}

fn append(a: &mut Accumulator<u32>, p: i32, range: std::ops::Range<u32>, now: Instant) {
    for i in range {
        a.append(tp(p), rec(i), i, now).unwrap();
    }
}

fn seqs(out: &[Outbound]) -> Vec<i32> {
    out.iter().map(|o| o.base_sequence).collect()
}

/// Delivered waiters with their offsets, failed waiters with their error code names.
type Outcomes = (Vec<(u32, i64)>, Vec<(u32, &'static str)>);

fn outcomes(done: Vec<Completion<u32>>) -> Outcomes {
    let (mut ok, mut failed) = (vec![], vec![]);
    for c in done {
        match c {
            Completion::Delivered {
                base_offset,
                waiters,
                ..
            } => ok.extend(
                waiters
                    .into_iter()
                    .enumerate()
                    .map(|(i, w)| (w, base_offset + i as i64)),
            ),
            Completion::Failed { error, waiters } => {
                failed.extend(waiters.into_iter().map(|w| (w, error.code_name())))
            }
        }
    }
    (ok, failed)
}

fn transport() -> Error {
    Error::transport("leader", "connection reset")
}

fn out_of_order() -> Error {
    Error::OutOfOrderSequence("gap".into())
}

#[test]
fn batches_close_on_size_and_on_linger_with_sequences_in_order() {
    let (mut a, t0) = acc(Mode::Idempotent);
    append(&mut a, 0, 0..7, t0);
    // Two full batches closed at once; the seventh record lingers.
    let out = a.drain(t0);
    assert_eq!(seqs(&out), vec![0, 3]);
    assert_eq!(out[0].records.len(), 3);
    assert_eq!(out[0].producer, (7, 0));
    assert_eq!(a.next_deadline(), Some(t0 + 5 * MS));
    a.close_ready(t0 + 4 * MS);
    assert!(a.drain(t0 + 4 * MS).is_empty(), "linger not over yet");
    a.close_ready(t0 + 5 * MS);
    let out = a.drain(t0 + 5 * MS);
    assert_eq!(seqs(&out), vec![6]);
    assert_eq!(out[0].records.len(), 1);
}

#[test]
fn flushing_closes_at_once_and_idle_means_everything_answered() {
    let (mut a, t0) = acc(Mode::Idempotent);
    append(&mut a, 0, 0..1, t0);
    append(&mut a, 1, 1..2, t0);
    a.set_flushing(true);
    a.close_ready(t0);
    let out = a.drain(t0);
    assert_eq!(out.len(), 2);
    assert!(!a.is_idle());
    for o in &out {
        a.on_response(&o.partition, o.id, Ok((10, false)), t0);
    }
    assert!(a.is_idle());
}

#[test]
fn at_most_max_in_flight_per_partition() {
    let (mut a, t0) = acc(Mode::Idempotent);
    append(&mut a, 0, 0..21, t0); // 7 full batches
    append(&mut a, 1, 0..3, t0); // another partition has its own limit
    let out = a.drain(t0);
    let p0: Vec<_> = out.iter().filter(|o| o.partition == tp(0)).collect();
    assert_eq!(p0.len(), 5);
    assert_eq!(out.len(), 6);
    assert!(a.drain(t0).is_empty());
    let done = a.on_response(&tp(0), p0[0].id, Ok((0, false)), t0);
    assert_eq!(outcomes(done).0, vec![(0, 0), (1, 1), (2, 2)]);
    let next = a.drain(t0);
    assert_eq!(
        seqs(&next),
        vec![15],
        "one slot freed, the next sequence goes"
    );
    assert_eq!(a.in_flight(), 6);
}

#[test]
fn a_retriable_error_requeues_in_sequence_order_after_a_backoff() {
    let (mut a, t0) = acc(Mode::Idempotent);
    append(&mut a, 0, 0..9, t0);
    let out = a.drain(t0);
    assert_eq!(seqs(&out), vec![0, 3, 6]);
    // The first batch's answer is lost; the third overtook it at the leader and was
    // rejected as out of order; the second is still in flight.
    assert!(a
        .on_response(&tp(0), out[0].id, Err(transport()), t0)
        .is_empty());
    assert!(a
        .on_response(&tp(0), out[2].id, Err(out_of_order()), t0)
        .is_empty());
    assert!(a.drain(t0).is_empty(), "backoff first");
    assert_eq!(a.next_deadline(), Some(t0 + 10 * MS));
    let t1 = t0 + 10 * MS;
    let retry = a.drain(t1);
    assert_eq!(
        seqs(&retry),
        vec![0, 6],
        "in sequence order, same sequences"
    );
    assert_eq!(retry[0].records, out[0].records);
    // Answers: seq 0 was appended the first time (duplicate), seq 3 and 6 go through.
    let (ok, _) = outcomes(a.on_response(&tp(0), retry[0].id, Ok((100, true)), t1));
    assert_eq!(ok, vec![(0, 100), (1, 101), (2, 102)]);
    let (ok, _) = outcomes(a.on_response(&tp(0), out[1].id, Ok((103, false)), t1));
    assert_eq!(ok.len(), 3);
    let (ok, _) = outcomes(a.on_response(&tp(0), retry[1].id, Ok((106, false)), t1));
    assert_eq!(ok, vec![(6, 106), (7, 107), (8, 108)]);
    assert!(a.is_idle());
}

#[test]
fn out_of_order_with_nothing_before_it_in_flight_is_a_real_gap() {
    let (mut a, t0) = acc(Mode::Transactional);
    append(&mut a, 0, 0..3, t0);
    let out = a.drain(t0);
    append(&mut a, 0, 3..4, t0); // open, waiting
    let (ok, failed) = outcomes(a.on_response(&tp(0), out[0].id, Err(out_of_order()), t0));
    assert!(ok.is_empty());
    assert_eq!(
        failed,
        vec![
            (0, "OUT_OF_ORDER_SEQUENCE_NUMBER"),
            (1, "OUT_OF_ORDER_SEQUENCE_NUMBER"),
            (2, "OUT_OF_ORDER_SEQUENCE_NUMBER"),
            (3, "OUT_OF_ORDER_SEQUENCE_NUMBER")
        ],
        "the transaction fails: the waiting record too"
    );
    assert!(matches!(a.failure(), Some(Error::OutOfOrderSequence(_))));
    let (e, w) = a.append(tp(1), rec(9), 9, t0).unwrap_err();
    assert!(matches!(e, Error::OutOfOrderSequence(_)));
    assert_eq!(w, 9);
    a.reset((7, 1));
    assert!(a.failure().is_none());
    a.append(tp(0), rec(10), 10, t0).unwrap();
    a.set_flushing(true);
    a.close_ready(t0);
    let out = a.drain(t0);
    assert_eq!((out[0].producer, out[0].base_sequence), ((7, 1), 0));
}

#[test]
fn a_transactional_failure_fails_in_flight_records_and_ignores_their_answers() {
    let (mut a, t0) = acc(Mode::Transactional);
    append(&mut a, 0, 0..3, t0);
    append(&mut a, 1, 3..6, t0);
    let out = a.drain(t0);
    let fenced = Error::InvalidProducerEpoch("newer epoch".into());
    let (_, failed) = outcomes(a.on_response(&tp(0), out[0].id, Err(fenced), t0));
    assert_eq!(
        failed.len(),
        6,
        "partition 1's in-flight records resolve too"
    );
    assert!(!a.is_idle(), "partition 1's request is still out");
    let (ok, failed) = outcomes(a.on_response(&tp(1), out[1].id, Ok((0, false)), t0));
    assert!(ok.is_empty() && failed.is_empty());
    assert!(a.is_idle());
}

#[test]
fn overtaken_batches_retry_without_backoff_and_without_failing() {
    let (mut a, t0) = acc(Mode::Idempotent);
    append(&mut a, 0, 0..6, t0);
    let out = a.drain(t0);
    // The leader handled seq 3 before seq 0: UNKNOWN_PRODUCER_ID (new PID) for seq 3.
    let unknown = Error::UnknownProducerId("no state".into());
    assert!(a
        .on_response(&tp(0), out[1].id, Err(unknown), t0)
        .is_empty());
    let again = a.drain(t0);
    assert_eq!(seqs(&again), vec![3], "no backoff for an overtaken batch");
    a.on_response(&tp(0), out[0].id, Ok((0, false)), t0);
    let (ok, _) = outcomes(a.on_response(&tp(0), again[0].id, Ok((3, false)), t0));
    assert_eq!(ok.len(), 3);
    assert!(!a.needs_new_producer());
}

#[test]
fn idempotent_failure_fails_the_partitions_sent_batches_then_resequences_the_rest() {
    let (mut a, t0) = acc(Mode::Idempotent);
    let mut s = settings();
    s.max_in_flight = 2;
    a.settings = s;
    append(&mut a, 0, 0..12, t0); // seq 0, 3 in flight; 6, 9 queued
    append(&mut a, 1, 20..23, t0);
    let out = a.drain(t0);
    assert_eq!(seqs(&out), vec![0, 3, 0]);
    let (_, failed) = outcomes(a.on_response(&tp(0), out[0].id, Err(out_of_order()), t0));
    let failed: Vec<u32> = failed.into_iter().map(|(w, _)| w).collect();
    assert_eq!(
        failed,
        vec![0, 1, 2, 3, 4, 5],
        "the failed batch and the one sent after it"
    );
    assert!(
        a.drain(t0).is_empty(),
        "unsent batches wait for the new producer id"
    );
    assert!(!a.needs_new_producer(), "requests still in flight");
    a.on_response(&tp(0), out[1].id, Err(out_of_order()), t0);
    // Partition 1's batch completes under the old PID.
    let (ok, _) = outcomes(a.on_response(&tp(1), out[2].id, Ok((0, false)), t0));
    assert_eq!(ok.len(), 3);
    assert!(a.needs_new_producer());
    a.reset((8, 0));
    let out = a.drain(t0);
    assert_eq!(
        out.iter()
            .map(|o| (o.producer, o.base_sequence, o.records[0].value.clone()))
            .collect::<Vec<_>>(),
        vec![
            ((8, 0), 0, b"v0006".to_vec()),
            ((8, 0), 3, b"v0009".to_vec())
        ]
    );
}

#[test]
fn a_sent_batch_waiting_for_a_retry_is_resolved_before_the_reset() {
    let (mut a, t0) = acc(Mode::Idempotent);
    append(&mut a, 0, 0..3, t0);
    append(&mut a, 1, 3..6, t0);
    let out = a.drain(t0);
    a.on_response(&tp(1), out[1].id, Err(transport()), t0);
    a.on_response(&tp(0), out[0].id, Err(out_of_order()), t0);
    assert!(
        !a.needs_new_producer(),
        "partition 1's batch may have been appended"
    );
    let retry = a.drain(t0 + 10 * MS);
    assert_eq!(retry.len(), 1);
    assert_eq!(retry[0].producer, (7, 0), "retried under the old identity");
    a.on_response(&tp(1), retry[0].id, Ok((0, true)), t0 + 10 * MS);
    assert!(a.needs_new_producer());
}

#[test]
fn delivery_timeout_fails_waiting_and_retrying_batches() {
    let (mut a, t0) = acc(Mode::Transactional);
    append(&mut a, 0, 0..3, t0);
    let out = a.drain(t0);
    let late = t0 + 1000 * MS;
    let (_, failed) = outcomes(a.on_response(&tp(0), out[0].id, Err(transport()), late));
    assert_eq!(failed.len(), 3);
    assert!(failed.iter().all(|(_, code)| *code == "TIMEOUT"));

    let (mut a, t0) = acc(Mode::Idempotent);
    append(&mut a, 0, 0..1, t0); // lingering
    assert!(a.expire(t0 + 999 * MS).is_empty());
    let (_, failed) = outcomes(a.expire(t0 + 1000 * MS));
    assert_eq!(failed, vec![(0, "TIMEOUT")]);
    assert!(!a.needs_new_producer(), "never closed: no sequence, no gap");
}

/// A transactional record that expired before its batch ever closed (`linger.ms` longer than
/// `delivery.timeout.ms`) fails the transaction: a commit must not go ahead without it.
#[test]
fn an_expired_open_batch_fails_the_transaction() {
    let (mut a, t0) = acc(Mode::Transactional);
    let mut s = settings();
    s.linger = 10_000 * MS;
    a.settings = s;
    append(&mut a, 0, 0..1, t0); // lingering, never closed
    append(&mut a, 1, 1..2, t0 + 500 * MS);
    let (_, failed) = outcomes(a.expire(t0 + 1000 * MS));
    assert_eq!(failed, vec![(0, "TIMEOUT"), (1, "TIMEOUT")]);
    assert!(a.failure().is_some(), "the transaction cannot commit");
}

#[test]
fn sequences_wrap_at_i32_max() {
    assert_eq!(increment_sequence(i32::MAX, 1), 0);
    assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
    assert!(sequence_before(i32::MAX, 0));
    assert!(!sequence_before(0, i32::MAX));
    assert!(sequence_before(3, 6));
    assert!(!sequence_before(6, 6));
}

/// The leader forgot the PID's state (expired while the producer was idle): the batch it
/// refuses, the ones in flight behind it and the ones queued all go again, in order, under
/// the new PID from sequence 0; nothing fails and nothing goes twice under the old PID.
#[test]
fn an_idempotent_producer_whose_state_expired_resends_everything_under_a_new_pid() {
    let (mut a, t0) = acc(Mode::Idempotent);
    let mut s = settings();
    s.max_in_flight = 2;
    a.settings = s;
    append(&mut a, 0, 0..6, t0);
    let out = a.drain(t0);
    assert_eq!(seqs(&out), vec![0, 3]);
    a.on_response(&tp(0), out[0].id, Ok((0, false)), t0);
    a.on_response(&tp(0), out[1].id, Ok((3, false)), t0);
    // Idle for a day; then three batches, two in flight.
    append(&mut a, 0, 6..15, t0);
    let out = a.drain(t0);
    assert_eq!(seqs(&out), vec![6, 9]);
    let unknown = || Error::UnknownProducerId("no state for producer 7".into());
    let (ok, failed) = outcomes(a.on_response(&tp(0), out[0].id, Err(unknown()), t0));
    assert!(
        ok.is_empty() && failed.is_empty(),
        "nothing fails: {failed:?}"
    );
    assert!(
        a.drain(t0).is_empty(),
        "nothing goes again under the old PID"
    );
    assert!(!a.needs_new_producer(), "seq 9 is still out");
    // Seq 9 was sent behind 6: refused the same way, or lost on the way.
    let (ok, failed) = outcomes(a.on_response(&tp(0), out[1].id, Err(transport()), t0));
    assert!(ok.is_empty() && failed.is_empty());
    assert!(a.drain(t0).is_empty());
    assert!(a.needs_new_producer());
    a.reset((8, 0));
    let again = a.drain(t0);
    assert_eq!(
        seqs(&again),
        vec![0, 3],
        "resequenced from 0, in the old order"
    );
    assert!(again.iter().all(|o| o.producer == (8, 0)));
    let (ok, _) = outcomes(a.on_response(&tp(0), again[0].id, Ok((6, false)), t0));
    assert_eq!(
        ok,
        vec![(6, 6), (7, 7), (8, 8)],
        "the refused batch's records, in order"
    );
    let (ok, _) = outcomes(a.on_response(&tp(0), again[1].id, Ok((9, false)), t0));
    assert_eq!(
        ok.iter().map(|(w, _)| *w).collect::<Vec<_>>(),
        vec![9, 10, 11]
    );
    let last = a.drain(t0);
    assert_eq!(seqs(&last), vec![6]);
    let (ok, _) = outcomes(a.on_response(&tp(0), last[0].id, Ok((12, false)), t0));
    assert_eq!(ok.len(), 3);
    assert!(a.is_idle());
}
