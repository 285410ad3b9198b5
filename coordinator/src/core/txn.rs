//! The per-request transitions of PROTOCOL.md sections 4-6 and 8, each a pure function of the
//! stored metadata, the request and `now_ms` returning an [`Outcome`]; and [`check_producer`],
//! the one fencing check every request of a known producer passes first.

use cluster::{ProducerId, TopicPartition, Topology};

use super::*;

fn concurrent(meta: &TxnMetadata) -> TxnError {
    TxnError::ConcurrentTransactions(format!(
        "{} is {}: markers are being written",
        meta.transactional_id, meta.state
    ))
}

/// Checks a transactional id's shape: 1..=255 bytes (PROTOCOL.md section 4 step 1).
pub fn validate_id(what: &str, id: &str) -> Result<(), TxnError> {
    if id.is_empty() {
        return Err(TxnError::InvalidRequest(format!("{what} is empty")));
    }
    if id.len() > cluster::MAX_ID_LEN {
        return Err(TxnError::InvalidRequest(format!(
            "{what} is {} bytes, over the {} byte limit",
            id.len(),
            cluster::MAX_ID_LEN
        )));
    }
    Ok(())
}

/// Checks a transaction timeout is in (0, max].
pub fn validate_timeout(timeout_ms: i32, max_ms: i32) -> Result<(), TxnError> {
    if timeout_ms <= 0 || timeout_ms > max_ms {
        return Err(TxnError::InvalidTransactionTimeout(format!(
            "{timeout_ms} ms is not in (0, {max_ms}]"
        )));
    }
    Ok(())
}

/// The fencing check, in one place (PROTOCOL.md section 5's order): unknown id or PID ->
/// INVALID_PRODUCER_ID_MAPPING; an epoch other than the current one -> PRODUCER_FENCED (or
/// TRANSACTION_TIMED_OUT for the producer the timeout scan aborted).
pub fn check_producer<'a>(
    id: &str,
    meta: Option<&'a TxnMetadata>,
    caller: ProducerIdAndEpoch,
) -> Result<&'a TxnMetadata, TxnError> {
    let meta = meta.ok_or_else(|| {
        TxnError::InvalidProducerIdMapping(format!("transactional id {id:?} is unknown"))
    })?;
    if !meta.knows_pid(caller.producer_id) {
        return Err(TxnError::InvalidProducerIdMapping(format!(
            "{id}: pid {} does not belong to this transactional id",
            caller.producer_id
        )));
    }
    if caller != meta.client_identity() {
        return Err(meta.stale_producer_error(caller));
    }
    Ok(meta)
}

/// InitProducerId (PROTOCOL.md section 4, steps 3-7; steps 1-2 are the shell's).
///
/// `fresh_pid` is used when a new PID is needed (unknown id, rotation); when it is needed and
/// `None`, the reply is [`TxnError::NeedProducerId`] and nothing changes: allocate one and call
/// again.
pub fn init_producer_id(
    id: &str,
    meta: Option<&TxnMetadata>,
    timeout_ms: i32,
    expected: Option<ProducerIdAndEpoch>,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
) -> Outcome {
    // Step 3: unknown id.
    let Some(meta) = meta else {
        return match fresh_pid {
            None => Outcome::reject(TxnError::NeedProducerId),
            Some(pid) => {
                let meta = TxnMetadata::new(id, pid, timeout_ms, now_ms);
                let identity = meta.client_identity();
                Outcome::write(meta, Ok(identity))
            }
        };
    };
    // Step 4: markers outstanding.
    if meta.state.is_prepare() {
        return Outcome::reject(concurrent(meta));
    }
    // Step 5: KIP-360 recovery.
    let mut last_epoch = NO_PRODUCER_EPOCH;
    if let Some(expected) = expected {
        if expected == meta.client_identity() {
            last_epoch = expected.epoch;
        } else if meta.last_identity() == Some(expected) {
            return Outcome::unchanged(meta.client_identity());
        } else {
            return Outcome::reject(TxnError::ProducerFenced(format!(
                "{id}: expected {expected} is neither the current {} nor its predecessor",
                meta.client_identity()
            )));
        }
    }
    match meta.state {
        // Step 6: abort the open transaction. A new instance (no expected pair) fences the old
        // one for good (`last_epoch` -1); the current instance recovering (KIP-360, expected ==
        // current) keeps `last_epoch` = its epoch, so its retry is recognised by step 5 and it
        // carries on: recovering never fences the only instance there is.
        TxnState::Ongoing => {
            match meta.bump_prepare(TxnResult::Abort, last_epoch, fresh_pid, now_ms) {
                Err(e) => Outcome::reject(e),
                Ok(next) => {
                    let reply = Err(TxnError::ConcurrentTransactions(format!(
                        "{id}: aborting the open transaction of {}; retry",
                        meta.client_identity()
                    )));
                    Outcome::write(next, reply)
                }
            }
        }
        // Step 7: bump.
        _ => match meta.bump_settled(TxnState::Empty, last_epoch, fresh_pid, now_ms) {
            Err(e) => Outcome::reject(e),
            Ok(mut next) => {
                next.timeout_ms = timeout_ms;
                let identity = next.client_identity();
                Outcome::write(next, Ok(identity))
            }
        },
    }
}

/// Shared checks of AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit (section 5):
/// fencing, then Prepare* -> CONCURRENT_TRANSACTIONS.
fn check_add<'a>(
    id: &str,
    meta: Option<&'a TxnMetadata>,
    caller: ProducerIdAndEpoch,
) -> Result<&'a TxnMetadata, TxnError> {
    let meta = check_producer(id, meta, caller)?;
    if meta.state.is_prepare() {
        return Err(concurrent(meta));
    }
    Ok(meta)
}

/// [`init_producer_id`] for a client of transaction `version`: the same rules, and the id
/// records the version (Kafka's `clientTransactionVersion`), which decides the rules of its
/// EndTxn ([`end_txn`] or [`end_txn_v1`]) and of its markers. A successful call whose metadata
/// would not change otherwise still writes the new version.
#[allow(clippy::too_many_arguments)]
pub fn init_producer_id_for_version(
    id: &str,
    meta: Option<&TxnMetadata>,
    timeout_ms: i32,
    expected: Option<ProducerIdAndEpoch>,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
    version: TransactionVersion,
) -> Outcome {
    let mut outcome = init_producer_id(id, meta, timeout_ms, expected, now_ms, fresh_pid);
    if outcome.reply.is_err() {
        return outcome;
    }
    match (&mut outcome.persist, meta) {
        (Some(next), _) => {
            // The fence of an open transaction (step 6) answers CONCURRENT_TRANSACTIONS, so the
            // reply is Ok only when the new metadata is the caller's.
            next.client_transaction_version = version;
        }
        (None, Some(meta)) if meta.client_transaction_version != version => {
            let mut next = meta.clone();
            next.client_transaction_version = version;
            outcome.persist = Some(next);
        }
        (None, _) => {}
    }
    outcome
}

/// Opens the transaction if needed (start time set and the transaction numbered when leaving
/// Empty/Complete*).
fn begin(meta: &TxnMetadata, now_ms: i64) -> TxnMetadata {
    let mut next = meta.clone();
    if meta.state.is_settled() {
        next.state = TxnState::Ongoing;
        next.transaction_number = meta.transaction_number.saturating_add(1);
        next.partitions.clear();
        next.groups.clear();
        next.txn_start_ms = now_ms;
    }
    next.last_update_ms = now_ms;
    next
}

/// AddPartitionsToTxn (section 5). A request that adds nothing new writes nothing.
pub fn add_partitions(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    partitions: &[TopicPartition],
    topology: &Topology,
    now_ms: i64,
) -> Outcome {
    let meta = match check_add(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    if let Some(tp) = partitions
        .iter()
        .find(|tp| !topology.partition_exists(&tp.topic, tp.partition))
    {
        return Outcome::reject(TxnError::UnknownTopicOrPartition(format!(
            "{tp} does not exist; nothing was added"
        )));
    }
    let adds_something = partitions.iter().any(|tp| !meta.partitions.contains(tp));
    let nothing_to_open = meta.state.is_settled() && partitions.is_empty();
    if (meta.state == TxnState::Ongoing && !adds_something) || nothing_to_open {
        return Outcome::unchanged(caller);
    }
    let mut next = begin(meta, now_ms);
    next.partitions.extend(partitions.iter().cloned());
    Outcome::write(next, Ok(caller))
}

/// AddOffsetsToTxn (section 5): adds a consumer group to the transaction.
pub fn add_offsets(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    group: &str,
    now_ms: i64,
) -> Outcome {
    let meta = match check_add(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    if meta.state == TxnState::Ongoing && meta.groups.contains_key(group) {
        return Outcome::unchanged(caller);
    }
    let mut next = begin(meta, now_ms);
    next.groups.entry(group.to_string()).or_default();
    Outcome::write(next, Ok(caller))
}

/// TxnOffsetCommit (section 5): records pending offsets of a group already in the transaction.
pub fn txn_offset_commit(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    group: &str,
    offsets: &[(TopicPartition, i64)],
    topology: &Topology,
    now_ms: i64,
) -> Outcome {
    let meta = match check_add(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    let Some(pending) = meta
        .groups
        .get(group)
        .filter(|_| meta.state == TxnState::Ongoing)
    else {
        return Outcome::reject(TxnError::InvalidTxnState(format!(
            "{id}: group {group:?} was not added to the transaction (AddOffsetsToTxn first)"
        )));
    };
    if let Some((tp, _)) = offsets
        .iter()
        .find(|(tp, _)| !topology.partition_exists(&tp.topic, tp.partition))
    {
        return Outcome::reject(TxnError::UnknownTopicOrPartition(format!(
            "{tp} does not exist; no offset was recorded"
        )));
    }
    if offsets.iter().all(|(tp, o)| pending.get(tp) == Some(o)) {
        return Outcome::unchanged(caller);
    }
    let mut next = meta.clone();
    next.last_update_ms = now_ms;
    let entry = next.groups.entry(group.to_string()).or_default();
    for (tp, offset) in offsets {
        entry.insert(tp.clone(), *offset);
    }
    Outcome::write(next, Ok(caller))
}

/// EndTxn (section 6): one epoch per transaction. An id whose client is on transaction
/// version 1 gets [`end_txn_v1`]'s rules instead.
pub fn end_txn(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    result: TxnResult,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
) -> Outcome {
    if meta.is_some_and(|m| m.client_transaction_version == TransactionVersion::V1) {
        return end_txn_v1(id, meta, caller, result, now_ms);
    }
    let Some(meta) = meta.filter(|m| m.knows_pid(caller.producer_id)) else {
        return Outcome::reject(TxnError::InvalidProducerIdMapping(format!(
            "{id}: unknown transactional id or pid {}",
            caller.producer_id
        )));
    };
    let wrong_decision = |what: &str| {
        if meta.timed_out && result == TxnResult::Commit {
            meta.stale_producer_error(caller)
        } else {
            TxnError::InvalidTxnState(format!(
                "{id}: {what} ended with the other decision ({}); cannot {result:?}",
                meta.state
            ))
        }
    };
    if caller == meta.client_identity() {
        return match meta.state {
            TxnState::Ongoing => match meta.bump_prepare(result, caller.epoch, fresh_pid, now_ms) {
                Err(e) => Outcome::reject(e),
                Ok(next) => {
                    let identity = next.client_identity();
                    Outcome::write(next, Ok(identity))
                }
            },
            TxnState::PrepareCommit | TxnState::PrepareAbort => Outcome::reject(concurrent(meta)),
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => match result {
                TxnResult::Commit => Outcome::reject(TxnError::InvalidTxnState(format!(
                    "{id}: no transaction is open ({}); nothing to commit",
                    meta.state
                ))),
                TxnResult::Abort => {
                    match meta.bump_settled(
                        TxnState::CompleteAbort,
                        caller.epoch,
                        fresh_pid,
                        now_ms,
                    ) {
                        Err(e) => Outcome::reject(e),
                        Ok(next) => {
                            let identity = next.client_identity();
                            Outcome::write(next, Ok(identity))
                        }
                    }
                }
            },
        };
    }
    if meta.last_identity() == Some(caller) {
        // A retry of the EndTxn (or the timeout abort) that did the latest bump.
        return match (meta.state, TxnResult::of_state(meta.state)) {
            (state, Some(decided)) if state.is_prepare() => {
                if decided == result {
                    Outcome::reject(concurrent(meta))
                } else {
                    Outcome::reject(wrong_decision("the transaction"))
                }
            }
            (_, Some(decided)) => {
                if decided == result {
                    Outcome::unchanged(meta.client_identity())
                } else {
                    Outcome::reject(wrong_decision("the transaction"))
                }
            }
            (_, None) => Outcome::reject(meta.stale_producer_error(caller)),
        };
    }
    Outcome::reject(meta.stale_producer_error(caller))
}

/// EndTxn for a client on transaction version 1 (PROTOCOL.md section 6, "Transaction version
/// 1"): the epoch is kept, so the transaction's markers carry the epoch its data was written
/// with, and only the current (PID, epoch) may end it:
///
/// | state (caller is current)      | COMMIT                     | ABORT                      |
/// |--------------------------------|----------------------------|----------------------------|
/// | Ongoing                        | PrepareCommit, same epoch  | PrepareAbort, same epoch   |
/// | PrepareCommit / PrepareAbort   | CONCURRENT_TRANSACTIONS    | CONCURRENT_TRANSACTIONS    |
/// | CompleteCommit                 | OK (a retry), no write     | INVALID_TXN_STATE          |
/// | CompleteAbort                  | INVALID_TXN_STATE          | OK (a retry), no write     |
/// | Empty                          | INVALID_TXN_STATE          | OK, no write               |
///
/// Any other epoch of the id's PID is PRODUCER_FENCED (TRANSACTION_TIMED_OUT for the producer
/// the timeout scan aborted): version 1 has no "last epoch" retry, since EndTxn never bumps.
/// An unknown id or PID is INVALID_PRODUCER_ID_MAPPING.
pub fn end_txn_v1(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    result: TxnResult,
    now_ms: i64,
) -> Outcome {
    let meta = match check_producer(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    match meta.state {
        TxnState::Ongoing => {
            let mut next = meta.clone();
            next.state = result.prepare_state();
            next.last_update_ms = now_ms;
            next.timed_out = false;
            Outcome::write(next, Ok(caller))
        }
        TxnState::PrepareCommit | TxnState::PrepareAbort => Outcome::reject(concurrent(meta)),
        TxnState::CompleteCommit | TxnState::CompleteAbort | TxnState::Empty => {
            let decided = TxnResult::of_state(meta.state);
            if decided == Some(result) || (decided.is_none() && result == TxnResult::Abort) {
                Outcome::unchanged(caller)
            } else {
                Outcome::reject(TxnError::InvalidTxnState(format!(
                    "{id}: no open transaction to {result:?} ({})",
                    meta.state
                )))
            }
        }
    }
}

/// VerifyTransaction (KIP-890 part 1, PROTOCOL.md section 9 step 4): may `caller` open a
/// transaction on `partition`? Yes: the open transaction's number (see
/// [`TxnMetadata::transaction_number`]), which the leader keeps with the transaction it opens.
pub fn verify_transaction(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    partition: &TopicPartition,
) -> Result<u64, TxnError> {
    // Fenced: INVALID_PRODUCER_EPOCH, what a leader answers an old epoch. The producer whose
    // transaction the timeout aborted is told so (TRANSACTION_TIMED_OUT, abortable), as the
    // coordinator tells it (section 8), so that its leaders do not call it fenced.
    let meta = match check_producer(id, meta, caller) {
        Ok(meta) => meta,
        Err(TxnError::ProducerFenced(m)) => return Err(TxnError::InvalidProducerEpoch(m)),
        Err(e) => return Err(e),
    };
    if meta.state.is_prepare() {
        return Err(concurrent(meta));
    }
    if meta.state != TxnState::Ongoing || !meta.partitions.contains(partition) {
        return Err(TxnError::InvalidTxnState(format!(
            "{id}: {partition} was not added to an ongoing transaction ({})",
            meta.state
        )));
    }
    Ok(meta.transaction_number)
}

/// Whether the timeout scan should abort this transaction now.
pub fn is_timed_out(meta: &TxnMetadata, now_ms: i64) -> bool {
    meta.state == TxnState::Ongoing
        && meta.txn_start_ms >= 0
        && now_ms.saturating_sub(meta.txn_start_ms) > i64::from(meta.timeout_ms)
}

/// Whether `meta` may be removed as expired (Kafka's `transactional.id.expiration.ms`): no
/// transaction open or being finished, and no change for `expiration_ms` or more. Its PID is
/// never handed out again, so an instance still holding it is fenced everywhere: the
/// coordinator no longer knows it, and a new instance gets a new PID.
pub fn is_expired_id(meta: &TxnMetadata, now_ms: i64, expiration_ms: i64) -> bool {
    meta.state.is_settled() && now_ms.saturating_sub(meta.last_update_ms) >= expiration_ms
}

/// The timeout scan for one id (section 8): an Ongoing transaction older than its timeout is
/// fenced (epoch bump, `last_epoch` = the old epoch, `timed_out` set) and moved to PrepareAbort.
/// Returns `None` when there is nothing to do.
pub fn expire_timed_out(
    meta: &TxnMetadata,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
) -> Option<Outcome> {
    if !is_timed_out(meta, now_ms) {
        return None;
    }
    let old = meta.client_identity();
    Some(
        match meta.bump_prepare(TxnResult::Abort, old.epoch, fresh_pid, now_ms) {
            Err(e) => Outcome::reject(e),
            Ok(mut next) => {
                next.timed_out = true;
                let identity = next.client_identity();
                Outcome::write(next, Ok(identity))
            }
        },
    )
}
