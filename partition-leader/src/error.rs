//! The crate's error type: one variant per protocol error code a leader can answer with, plus
//! storage and transport failures. [`Error::code`] is the ONE place that maps an error to the
//! wire's [`proto::ErrorCode`]; the service shell never chooses codes anywhere else.

use proto::ErrorCode;

/// Everything a partition leader can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed request: negative or out-of-range ids, epochs or sequences, empty batches, ...
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A batch or a record over the configured limit.
    #[error("message too large: {0}")]
    MessageTooLarge(String),
    /// The topic or partition does not exist in the topology.
    #[error("unknown topic or partition: {0}")]
    UnknownTopicOrPartition(String),
    /// The partition exists but another leader owns it.
    #[error("not the leader: {0}")]
    NotLeaderOrFollower(String),
    /// The batch's or marker's epoch is older than the one stored for the PID (a zombie).
    #[error("invalid producer epoch: {0}")]
    InvalidProducerEpoch(String),
    /// A sequence gap, or a new epoch that does not start at sequence 0.
    #[error("out of order sequence number: {0}")]
    OutOfOrderSequenceNumber(String),
    /// No state for this PID and the batch does not start at sequence 0 (where it must).
    #[error("unknown producer id: {0}")]
    UnknownProducerId(String),
    /// The batch does not fit the PID's transaction state on this partition.
    #[error("invalid transaction state: {0}")]
    InvalidTxnState(String),
    /// A marker from an older incarnation of the coordinator.
    #[error("transaction coordinator fenced: {0}")]
    TransactionCoordinatorFenced(String),
    /// The coordinator verification answered INVALID_PRODUCER_ID_MAPPING (passed back).
    #[error("invalid producer id mapping: {0}")]
    InvalidProducerIdMapping(String),
    /// The coordinator aborted the transaction on timeout (passed back from verification).
    #[error("transaction timed out: {0}")]
    TransactionTimedOut(String),
    /// Retriable: a transition is in flight (from verification, or an old marker is pending here).
    #[error("concurrent transactions: {0}")]
    ConcurrentTransactions(String),
    /// Retriable, passed back from verification.
    #[error("not coordinator: {0}")]
    NotCoordinator(String),
    /// Retriable, passed back from verification.
    #[error("coordinator load in progress: {0}")]
    CoordinatorLoadInProgress(String),
    /// Retriable: the coordinator to verify with could not be reached.
    #[error("coordinator not available: {0}")]
    CoordinatorNotAvailable(String),
    /// Fetch offset outside `[0, high watermark]`.
    #[error("offset out of range: {0}")]
    OffsetOutOfRange(String),
    /// The log could not be written, flushed or read (or a stored value is corrupt).
    #[error("storage error: {0}")]
    Storage(String),
    /// Anything else (an unexpected answer from a peer, a panicked task).
    #[error("internal error: {0}")]
    Internal(String),
    /// A setting the leader refuses to start with.
    #[error("configuration: {0}")]
    Config(String),
    /// The gRPC server failed.
    #[error("transport error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// An internal request (WriteTxnMarkers) not from the cluster member allowed to send it, or
    /// from a node of another topology ([`cluster::auth`]). Nothing was changed.
    #[error(transparent)]
    Membership(#[from] cluster::auth::AuthError),
}

impl Error {
    /// The wire error code for this error: the single mapping used by the service.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidRequest(_) => ErrorCode::InvalidRequest,
            Error::MessageTooLarge(_) => ErrorCode::MessageTooLarge,
            Error::UnknownTopicOrPartition(_) => ErrorCode::UnknownTopicOrPartition,
            Error::NotLeaderOrFollower(_) => ErrorCode::NotLeaderOrFollower,
            Error::InvalidProducerEpoch(_) => ErrorCode::InvalidProducerEpoch,
            Error::OutOfOrderSequenceNumber(_) => ErrorCode::OutOfOrderSequenceNumber,
            Error::UnknownProducerId(_) => ErrorCode::UnknownProducerId,
            Error::InvalidTxnState(_) => ErrorCode::InvalidTxnState,
            Error::TransactionCoordinatorFenced(_) => ErrorCode::TransactionCoordinatorFenced,
            Error::InvalidProducerIdMapping(_) => ErrorCode::InvalidProducerIdMapping,
            Error::TransactionTimedOut(_) => ErrorCode::TransactionTimedOut,
            Error::ConcurrentTransactions(_) => ErrorCode::ConcurrentTransactions,
            Error::NotCoordinator(_) => ErrorCode::NotCoordinator,
            Error::CoordinatorLoadInProgress(_) => ErrorCode::CoordinatorLoadInProgress,
            Error::CoordinatorNotAvailable(_) => ErrorCode::CoordinatorNotAvailable,
            Error::OffsetOutOfRange(_) => ErrorCode::OffsetOutOfRange,
            Error::Storage(_) => ErrorCode::KafkaStorageError,
            Error::Membership(e) => e.code(),
            Error::Internal(_) | Error::Config(_) | Error::Transport(_) => {
                ErrorCode::UnknownServerError
            }
        }
    }

    /// The error as the `(error_code, error_message)` pair every response carries. The message
    /// is the detail only: the code already names the error, and clients prefix their own name
    /// for it (so a user never reads "invalid producer epoch: invalid producer epoch: ...").
    pub fn to_wire(&self) -> (i32, String) {
        (self.code() as i32, self.detail())
    }

    /// The human detail of the error, without the error's name.
    pub fn detail(&self) -> String {
        match self {
            Error::InvalidRequest(d)
            | Error::MessageTooLarge(d)
            | Error::UnknownTopicOrPartition(d)
            | Error::NotLeaderOrFollower(d)
            | Error::InvalidProducerEpoch(d)
            | Error::OutOfOrderSequenceNumber(d)
            | Error::UnknownProducerId(d)
            | Error::InvalidTxnState(d)
            | Error::TransactionCoordinatorFenced(d)
            | Error::InvalidProducerIdMapping(d)
            | Error::TransactionTimedOut(d)
            | Error::ConcurrentTransactions(d)
            | Error::NotCoordinator(d)
            | Error::CoordinatorLoadInProgress(d)
            | Error::CoordinatorNotAvailable(d)
            | Error::OffsetOutOfRange(d)
            | Error::Storage(d)
            | Error::Internal(d)
            | Error::Config(d) => d.clone(),
            Error::Transport(e) => e.to_string(),
            Error::Membership(e) => e.to_string(),
        }
    }
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error::Storage(e.to_string())
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_message_is_the_detail_without_the_name() {
        let e = Error::InvalidProducerEpoch("producer 7 epoch 2 is older than 3".into());
        assert_eq!(
            e.to_wire(),
            (
                ErrorCode::InvalidProducerEpoch as i32,
                "producer 7 epoch 2 is older than 3".to_string()
            )
        );
        assert_eq!(
            e.to_string(),
            "invalid producer epoch: producer 7 epoch 2 is older than 3"
        );
    }
}
