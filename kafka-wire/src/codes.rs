//! mini-broker's wire error codes (`proto::ErrorCode`, what the cores and gRPC shells produce)
//! mapped to Kafka's error codes, in one table, so both faces report the same decision.
//!
//! Only one row is not a name-for-name match: TRANSACTION_TIMED_OUT (beyond Kafka) has no Kafka
//! code; it is sent as INVALID_PRODUCER_ID_MAPPING, which librdkafka and the Java client treat as
//! abortable with an epoch bump (KIP-360) where the coordinator answers AddPartitionsToTxn or
//! EndTxn, and as abortable where a leader answers Produce. So the timed-out producer aborts and
//! carries on with the bumped epoch, as PROTOCOL.md section 8 wants; INVALID_PRODUCER_EPOCH,
//! what Kafka answers there, is fatal "fenced" in both clients. (kafka-python treats either code
//! as fatal.)

use kafka_protocol::error::ResponseError;
use proto::ErrorCode;

/// Kafka's "no error".
pub const NONE: i16 = 0;

/// The Kafka error code for a mini-broker error code.
pub fn kafka_code(code: ErrorCode) -> i16 {
    use ErrorCode as E;
    use ResponseError as K;
    let k = match code {
        E::None => return NONE,
        E::NotCoordinator => K::NotCoordinator,
        E::CoordinatorLoadInProgress => K::CoordinatorLoadInProgress,
        E::ConcurrentTransactions => K::ConcurrentTransactions,
        E::ProducerFenced => K::ProducerFenced,
        E::InvalidProducerEpoch => K::InvalidProducerEpoch,
        E::InvalidProducerIdMapping => K::InvalidProducerIdMapping,
        E::InvalidTxnState => K::InvalidTxnState,
        E::InvalidTransactionTimeout => K::InvalidTransactionTimeout,
        E::OutOfOrderSequenceNumber => K::OutOfOrderSequenceNumber,
        E::UnknownTopicOrPartition => K::UnknownTopicOrPartition,
        E::TransactionCoordinatorFenced => K::TransactionCoordinatorFenced,
        E::InvalidRequest => K::InvalidRequest,
        E::NotLeaderOrFollower => K::NotLeaderOrFollower,
        E::MessageTooLarge => K::MessageTooLarge,
        E::TransactionTimedOut => K::InvalidProducerIdMapping,
        E::UnknownProducerId => K::UnknownProducerId,
        E::OffsetOutOfRange => K::OffsetOutOfRange,
        E::KafkaStorageError => K::KafkaStorageError,
        E::CoordinatorNotAvailable => K::CoordinatorNotAvailable,
        E::UnstableOffsetCommit => K::UnstableOffsetCommit,
        E::UnknownServerError => K::UnknownServerError,
        E::ClusterAuthorizationFailed => K::ClusterAuthorizationFailed,
        E::InconsistentClusterId => K::InconsistentClusterId,
        E::GroupIdNotFound => K::GroupIdNotFound,
    };
    k.code()
}

/// [`kafka_code`] of a raw `error_code` field from a gRPC response (an unknown value is
/// UNKNOWN_SERVER_ERROR).
pub fn kafka_code_of(raw: i32) -> i16 {
    kafka_code(error_code_of(raw))
}

/// The mini-broker code of a raw `error_code` field (an unknown value is UNKNOWN_SERVER_ERROR).
pub fn error_code_of(raw: i32) -> ErrorCode {
    ErrorCode::try_from(raw).unwrap_or(ErrorCode::UnknownServerError)
}

/// A Kafka error code by name, for the errors only the Kafka face produces.
pub fn code(error: ResponseError) -> i16 {
    error.code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_maps_and_names_match_where_kafka_has_the_name() {
        let mut mapped = 0;
        for raw in 0..=64 {
            let Ok(ours) = ErrorCode::try_from(raw) else {
                continue;
            };
            mapped += 1;
            let theirs = kafka_code(ours);
            if ours == ErrorCode::None {
                assert_eq!(theirs, 0);
                continue;
            }
            let k = ResponseError::try_from_code(theirs).expect("a Kafka code");
            let ours_name = ours.as_str_name().replace('_', "").to_lowercase();
            let theirs_name = format!("{k:?}").to_lowercase();
            if ours != ErrorCode::TransactionTimedOut {
                assert_eq!(ours_name, theirs_name, "{ours:?} -> {k:?}");
            }
        }
        assert_eq!(mapped, 25, "every proto error code is checked");
        assert_eq!(kafka_code(ErrorCode::ProducerFenced), 90);
        assert_eq!(kafka_code(ErrorCode::InvalidProducerEpoch), 47);
        assert_eq!(
            kafka_code(ErrorCode::TransactionTimedOut),
            49,
            "abortable, not fatal, in librdkafka and the Java client"
        );
        assert_eq!(kafka_code_of(999), -1);
    }
}
