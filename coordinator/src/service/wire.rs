//! Proto <-> domain, and the input checks that come before anything else (INVALID_REQUEST,
//! nothing stored): ids 1..=255 bytes, producer ids non-negative, epochs in [0, 32767], topic
//! names within the topology's limit, lists of at most [`MAX_LIST_LEN`] entries, known enum
//! values. Pure functions: no state, no I/O, no routing (that is `state`'s).

use std::collections::BTreeSet;

use cluster::TopicPartition;
use proto::ErrorCode;

use crate::core::{self, GroupMarker, PendingOffsets, ProducerIdAndEpoch, TxnMetadata};
use crate::core::{TransactionVersion, TxnError, TxnResult, TxnState};
use crate::error::{error_code, Error};

/// Longest list (partitions, offsets, ids) accepted in one request.
pub const MAX_LIST_LEN: usize = 10_000;

/// A request of a known producer on a transactional id: the id and the caller's (PID, epoch).
pub(super) struct Caller {
    pub(super) id: String,
    pub(super) producer: ProducerIdAndEpoch,
}

/// The offsets of a TxnOffsetCommit, in request order.
pub(super) type CommitOffsets = Vec<(TopicPartition, i64)>;

/// A decoded InitProducerId of a transactional producer.
pub(super) struct InitProducerId {
    pub(super) id: String,
    pub(super) timeout_ms: i32,
    pub(super) expected: Option<ProducerIdAndEpoch>,
    /// The client's transaction version (KIP-890): 1 for Kafka clients, 2 (or unset) for ours.
    pub(super) version: TransactionVersion,
}

/// InitProducerId: `None` for an idempotent producer (no transactional id). The timeout is
/// checked against `max_timeout_ms` (INVALID_TRANSACTION_TIMEOUT), after the id and before the
/// expected (PID, epoch), PROTOCOL.md section 4 step 1.
pub(super) fn init_producer_id(
    request: proto::InitProducerIdRequest,
    max_timeout_ms: i32,
) -> Result<Option<InitProducerId>, Error> {
    let Some(id) = request.transactional_id else {
        return Ok(None);
    };
    check_id("transactional id", &id)?;
    let version = check_transaction_version(request.transaction_version)?;
    core::validate_timeout(request.transaction_timeout_ms, max_timeout_ms)?;
    let expected = match (
        request.expected_producer_id,
        request.expected_producer_epoch,
    ) {
        (-1, -1) => None,
        (pid, epoch) => Some(check_producer(pid, epoch)?),
    };
    Ok(Some(InitProducerId {
        id,
        timeout_ms: request.transaction_timeout_ms,
        expected,
        version,
    }))
}

/// The id and caller every transactional request but InitProducerId starts with.
fn caller(id: String, producer_id: i64, epoch: i32) -> Result<Caller, Error> {
    check_id("transactional id", &id)?;
    let producer = check_producer(producer_id, epoch)?;
    Ok(Caller { id, producer })
}

/// AddPartitionsToTxn.
pub(super) fn add_partitions(
    request: proto::AddPartitionsToTxnRequest,
) -> Result<(Caller, Vec<TopicPartition>), Error> {
    let caller = caller(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
    )?;
    Ok((caller, check_partitions(request.partitions)?))
}

/// AddOffsetsToTxn: the caller and the group.
pub(super) fn add_offsets(
    request: proto::AddOffsetsToTxnRequest,
) -> Result<(Caller, String), Error> {
    let caller = caller(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
    )?;
    check_id("group id", &request.group_id)?;
    Ok((caller, request.group_id))
}

/// TxnOffsetCommit: the caller, the group and its offsets (non-negative).
pub(super) fn txn_offset_commit(
    request: proto::TxnOffsetCommitRequest,
) -> Result<(Caller, String, CommitOffsets), Error> {
    let caller = caller(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
    )?;
    check_id("group id", &request.group_id)?;
    check_list_len("offsets", request.offsets.len())?;
    let mut offsets = Vec::with_capacity(request.offsets.len());
    for o in request.offsets {
        check_topic(&o.topic)?;
        if o.offset < 0 {
            return Err(invalid(format!("offset {} is negative", o.offset)));
        }
        offsets.push((TopicPartition::new(o.topic, o.partition), o.offset));
    }
    Ok((caller, request.group_id, offsets))
}

/// EndTxn: the caller and its decision.
pub(super) fn end_txn(request: proto::EndTxnRequest) -> Result<(Caller, TxnResult), Error> {
    let caller = caller(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
    )?;
    Ok((caller, check_result(request.result)?))
}

/// VerifyTransaction: the caller and the partition it wants to write to.
pub(super) fn verify_transaction(
    request: proto::VerifyTransactionRequest,
) -> Result<(Caller, TopicPartition), Error> {
    let caller = caller(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
    )?;
    let partition = request
        .partition
        .ok_or_else(|| invalid("partition is missing"))?;
    check_topic(&partition.topic)?;
    Ok((caller, partition.into()))
}

/// OffsetFetch: the group and the partitions asked for (empty: all).
pub(super) fn offset_fetch(
    request: proto::OffsetFetchRequest,
) -> Result<(String, Vec<TopicPartition>, bool), Error> {
    check_id("group id", &request.group_id)?;
    let partitions = check_partitions(request.partitions)?;
    Ok((request.group_id, partitions, request.require_stable))
}

/// WriteGroupOffsetMarker, as the group's coordinator receives it.
pub(super) fn group_marker(
    request: proto::WriteGroupOffsetMarkerRequest,
) -> Result<GroupMarker, Error> {
    check_id("group id", &request.group_id)?;
    let identity = check_producer(request.producer_id, request.producer_epoch)?;
    let result = check_result(request.result)?;
    let transaction_version = check_transaction_version(request.transaction_version)?;
    if request.coordinator_generation < 0 {
        return Err(invalid(format!(
            "coordinator generation {} is negative",
            request.coordinator_generation
        )));
    }
    check_list_len("offsets", request.offsets.len())?;
    let mut offsets = PendingOffsets::new();
    for o in request.offsets {
        check_topic(&o.topic)?;
        offsets.insert(TopicPartition::new(o.topic, o.partition), o.offset);
    }
    Ok(GroupMarker {
        group_id: request.group_id,
        producer_id: identity.producer_id,
        epoch: identity.epoch,
        result,
        offsets,
        coordinator_id: request.coordinator_id,
        coordinator_generation: request.coordinator_generation,
        transaction_version,
        transaction_number: request.transaction_number,
    })
}

/// ListTransactions: the state filters (wire values; empty: all states).
pub(super) fn state_filters(
    request: &proto::ListTransactionsRequest,
) -> Result<BTreeSet<i32>, Error> {
    check_list_len("state filters", request.state_filters.len())?;
    request
        .state_filters
        .iter()
        .map(|f| {
            proto::TxnState::try_from(*f)
                .map(|st| st as i32)
                .map_err(|_| invalid(format!("state filter {f} is unknown")))
        })
        .collect()
}

/// DescribeTransactions: the ids (their shape is checked per id, into each description).
pub(super) fn describe_ids(request: &proto::DescribeTransactionsRequest) -> Result<(), Error> {
    check_list_len("transactional ids", request.transactional_ids.len())
}

// ---- domain -> proto ----------------------------------------------------------------------

/// A core result on the wire.
pub(super) fn result(result: TxnResult) -> proto::TxnResult {
    match result {
        TxnResult::Commit => proto::TxnResult::Commit,
        TxnResult::Abort => proto::TxnResult::Abort,
    }
}

/// A core state on the wire.
pub(super) fn state(state: TxnState) -> proto::TxnState {
    match state {
        TxnState::Empty => proto::TxnState::Empty,
        TxnState::Ongoing => proto::TxnState::Ongoing,
        TxnState::PrepareCommit => proto::TxnState::PrepareCommit,
        TxnState::PrepareAbort => proto::TxnState::PrepareAbort,
        TxnState::CompleteCommit => proto::TxnState::CompleteCommit,
        TxnState::CompleteAbort => proto::TxnState::CompleteAbort,
    }
}

/// Offsets on the wire.
pub(super) fn offsets(offsets: &PendingOffsets) -> Vec<proto::PartitionOffset> {
    offsets
        .iter()
        .map(|(tp, offset)| proto::PartitionOffset {
            topic: tp.topic.clone(),
            partition: tp.partition,
            offset: *offset,
        })
        .collect()
}

/// A group marker on the wire (to the group's coordinator).
pub(super) fn group_marker_request(
    marker: GroupMarker,
    transactional_id: &str,
) -> proto::WriteGroupOffsetMarkerRequest {
    proto::WriteGroupOffsetMarkerRequest {
        transactional_id: transactional_id.to_string(),
        auth: None,
        offsets: offsets(&marker.offsets),
        group_id: marker.group_id,
        producer_id: marker.producer_id,
        producer_epoch: i32::from(marker.epoch),
        result: result(marker.result) as i32,
        coordinator_id: marker.coordinator_id,
        coordinator_generation: marker.coordinator_generation,
        transaction_version: marker.transaction_version.to_wire(),
        transaction_number: marker.transaction_number,
    }
}

/// The description of `id` when it could not be described: the error, and -1 everywhere.
pub(super) fn description_error(
    id: &str,
    coordinator_id: i32,
    error: &Error,
) -> proto::TransactionDescription {
    proto::TransactionDescription {
        error_code: error_code(error) as i32,
        error_message: error.detail(),
        ..description_base(id, coordinator_id)
    }
}

/// The description of an unknown id.
pub(super) fn description_unknown(id: &str, coordinator_id: i32) -> proto::TransactionDescription {
    proto::TransactionDescription {
        error_code: ErrorCode::InvalidProducerIdMapping as i32,
        error_message: format!("transactional id {id:?} is unknown"),
        ..description_base(id, coordinator_id)
    }
}

fn description_base(id: &str, coordinator_id: i32) -> proto::TransactionDescription {
    proto::TransactionDescription {
        transactional_id: id.to_string(),
        coordinator_id,
        producer_id: -1,
        producer_epoch: -1,
        last_epoch: -1,
        previous_producer_id: -1,
        next_producer_id: -1,
        transaction_start_ms: -1,
        ..Default::default()
    }
}

/// The description of stored metadata at `now`.
pub(super) fn description(
    m: &TxnMetadata,
    coordinator_id: i32,
    now: i64,
) -> proto::TransactionDescription {
    proto::TransactionDescription {
        error_code: ErrorCode::None as i32,
        error_message: String::new(),
        transactional_id: m.transactional_id.clone(),
        producer_id: m.producer_id,
        producer_epoch: i32::from(m.producer_epoch),
        last_epoch: i32::from(m.last_epoch),
        previous_producer_id: m.previous_producer_id,
        next_producer_id: m.next_producer_id,
        state: state(m.state) as i32,
        transaction_timeout_ms: m.timeout_ms,
        partitions: m.partitions.iter().cloned().map(Into::into).collect(),
        groups: m.groups.keys().cloned().collect(),
        transaction_start_ms: m.txn_start_ms,
        last_update_ms: m.last_update_ms,
        age_ms: if m.txn_start_ms >= 0 {
            (now - m.txn_start_ms).max(0)
        } else {
            0
        },
        coordinator_id,
        history: m
            .history
            .iter()
            .map(|c| proto::EpochChange {
                producer_id: c.producer_id,
                producer_epoch: i32::from(c.epoch),
                cause: c.cause.clone(),
                at_ms: c.at_ms,
                instance: c.instance.clone(),
            })
            .collect(),
    }
}

// ---- input checks (INVALID_REQUEST before anything else) ----------------------------------

fn invalid(message: impl Into<String>) -> Error {
    Error::Protocol(TxnError::InvalidRequest(message.into()))
}

pub(super) fn check_id(what: &str, id: &str) -> Result<(), Error> {
    core::validate_id(what, id).map_err(Error::Protocol)
}

fn check_producer(pid: i64, epoch: i32) -> Result<ProducerIdAndEpoch, Error> {
    if pid < 0 {
        return Err(invalid(format!("producer id {pid} is negative")));
    }
    let epoch = cluster::epoch_from_wire(epoch, false)
        .ok_or_else(|| invalid(format!("producer epoch {epoch} is not in [0, 32767]")))?;
    Ok(ProducerIdAndEpoch::new(pid, epoch))
}

fn check_list_len(what: &str, len: usize) -> Result<(), Error> {
    if len > MAX_LIST_LEN {
        return Err(invalid(format!(
            "{len} {what}, over the limit of {MAX_LIST_LEN}"
        )));
    }
    Ok(())
}

fn check_topic(topic: &str) -> Result<(), Error> {
    if topic.is_empty() || topic.len() > cluster::topology::MAX_TOPIC_NAME_LEN {
        return Err(invalid(format!(
            "topic name must be 1..={} bytes",
            cluster::topology::MAX_TOPIC_NAME_LEN
        )));
    }
    Ok(())
}

fn check_partitions(partitions: Vec<proto::TopicPartition>) -> Result<Vec<TopicPartition>, Error> {
    check_list_len("partitions", partitions.len())?;
    partitions
        .into_iter()
        .map(|tp| {
            check_topic(&tp.topic)?;
            Ok(TopicPartition::from(tp))
        })
        .collect()
}

/// A client transaction version on the wire: 0 (unset) or 2 is version 2, 1 is version 1.
pub(super) fn check_transaction_version(version: i32) -> Result<TransactionVersion, Error> {
    TransactionVersion::from_wire(version)
        .ok_or_else(|| invalid(format!("transaction version {version} is not 1 or 2")))
}

/// Kafka's OffsetCommit outside a transaction: the group and its offsets (non-negative,
/// partitions checked against the topology by the caller).
pub(super) fn offset_commit(
    group: String,
    offsets: Vec<proto::PartitionOffset>,
) -> Result<(String, CommitOffsets), Error> {
    check_id("group id", &group)?;
    check_list_len("offsets", offsets.len())?;
    let mut checked = Vec::with_capacity(offsets.len());
    for o in offsets {
        check_topic(&o.topic)?;
        if o.offset < 0 {
            return Err(invalid(format!("offset {} is negative", o.offset)));
        }
        checked.push((TopicPartition::new(o.topic, o.partition), o.offset));
    }
    Ok((group, checked))
}

fn check_result(result: i32) -> Result<TxnResult, Error> {
    match proto::TxnResult::try_from(result) {
        Ok(proto::TxnResult::Commit) => Ok(TxnResult::Commit),
        Ok(proto::TxnResult::Abort) => Ok(TxnResult::Abort),
        Err(_) => Err(invalid(format!("transaction result {result} is unknown"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_checks() {
        assert!(check_producer(-1, 0).is_err());
        assert!(check_producer(0, -1).is_err());
        assert!(check_producer(0, 32768).is_err());
        assert!(check_producer(0, 32767).is_ok());
        assert!(check_result(7).is_err());
        assert!(check_transaction_version(3).is_err());
        assert!(check_transaction_version(-1).is_err());
        assert_eq!(
            check_transaction_version(0).unwrap(),
            TransactionVersion::V2
        );
        assert_eq!(
            check_transaction_version(1).unwrap(),
            TransactionVersion::V1
        );
        assert!(offset_commit(
            "g".into(),
            vec![proto::PartitionOffset {
                topic: "t".into(),
                partition: 0,
                offset: -1,
            }]
        )
        .is_err());
        assert!(check_list_len("x", MAX_LIST_LEN).is_ok());
        assert!(check_list_len("x", MAX_LIST_LEN + 1).is_err());
        assert!(check_topic("").is_err());
        assert!(check_topic(&"t".repeat(250)).is_err());
    }
}
