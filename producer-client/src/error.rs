//! The client's error type, and the one place where a wire [`ErrorCode`] becomes an [`Error`].
//!
//! Every error falls into exactly one of PROTOCOL.md section 10's classes:
//! - **fatal** ([`Error::is_fatal`]): the producer was fenced by a newer instance. It can never
//!   commit again; every later call returns the same error at once.
//! - **abortable** ([`Error::is_abortable`]): the current transaction cannot commit. The
//!   application calls `abort_transaction()`; the client then bumps the epoch (KIP-360) and the
//!   producer carries on.
//! - **retriable** ([`Error::is_retriable`]): transient. The client already retried these with
//!   backoff; one reaching the application means the retries ran out. Inside a transaction the
//!   transaction then has to be aborted (a Produce may or may not have been appended), except
//!   for a commit whose outcome is unknown: call `commit_transaction()` again, never abort it.
//!
//! Anything else (bad configuration, misuse of the API, a request the server refused as invalid)
//! is none of the three: a bug to fix, not a condition to handle.

use proto::ErrorCode;

/// Everything a client call can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// PRODUCER_FENCED: a newer instance with the same transactional id owns it now. Fatal.
    #[error("producer fenced: {0}")]
    ProducerFenced(String),
    /// INVALID_PRODUCER_EPOCH: a partition leader has seen a newer epoch for this PID. Abortable.
    #[error("invalid producer epoch: {0}")]
    InvalidProducerEpoch(String),
    /// OUT_OF_ORDER_SEQUENCE_NUMBER: a leader found a gap in this producer's sequences. Abortable.
    #[error("out of order sequence number: {0}")]
    OutOfOrderSequence(String),
    /// UNKNOWN_PRODUCER_ID: a leader has no state for this PID. Abortable.
    #[error("unknown producer id: {0}")]
    UnknownProducerId(String),
    /// INVALID_PRODUCER_ID_MAPPING: the coordinator does not know this PID for the id. Abortable.
    #[error("invalid producer id mapping: {0}")]
    InvalidProducerIdMapping(String),
    /// TRANSACTION_TIMED_OUT: the coordinator aborted the transaction because it exceeded its
    /// timeout. Abortable: abort, then carry on with the bumped epoch.
    #[error("transaction timed out and was aborted by the coordinator: {0}")]
    TransactionTimedOut(String),
    /// INVALID_TXN_STATE: the request does not fit the transaction's state. Abortable.
    #[error("invalid transaction state: {0}")]
    InvalidTxnState(String),
    /// NOT_COORDINATOR: the node does not own the id. Retriable.
    #[error("not the coordinator: {0}")]
    NotCoordinator(String),
    /// COORDINATOR_LOAD_IN_PROGRESS: the coordinator is still loading its state. Retriable.
    #[error("coordinator is loading: {0}")]
    CoordinatorLoadInProgress(String),
    /// CONCURRENT_TRANSACTIONS: a transition for this id is in flight. Retriable.
    #[error("concurrent transactions: {0}")]
    ConcurrentTransactions(String),
    /// COORDINATOR_NOT_AVAILABLE: a coordinator a leader needs is unreachable. Retriable.
    #[error("coordinator not available: {0}")]
    CoordinatorNotAvailable(String),
    /// NOT_LEADER_OR_FOLLOWER: the node does not lead the partition. Retriable.
    #[error("not the leader: {0}")]
    NotLeader(String),
    /// The request did not get an answer (connection refused, reset, deadline). Retriable.
    #[error("transport error talking to {address}: {message}")]
    Transport {
        /// The node that was called.
        address: String,
        /// What went wrong.
        message: String,
    },
    /// Any other protocol error code the server answered with.
    #[error("{}: {message}", code.name())]
    Server {
        /// The wire error code.
        code: ErrorCode,
        /// The server's human message (never parsed).
        message: String,
    },
    /// A client-side deadline passed: `delivery.timeout.ms` for a record (the client retried
    /// until then; it may or may not have been appended), or `max.block.ms` for `send` waiting
    /// for `buffer.memory`. Retriable by the application.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The record was still waiting to be sent when its transaction was aborted.
    #[error("transaction aborted before the record was sent: {0}")]
    TransactionAborted(String),
    /// The client configuration is unusable.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The call does not fit the producer's state (e.g. `send` outside a transaction).
    #[error("{0}")]
    IllegalState(String),
}

/// Convenience alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Fatal: the producer can never commit again (it was fenced).
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::ProducerFenced(_))
    }

    /// Abortable: abort the transaction, and the producer carries on.
    pub fn is_abortable(&self) -> bool {
        matches!(
            self,
            Error::InvalidProducerEpoch(_)
                | Error::OutOfOrderSequence(_)
                | Error::UnknownProducerId(_)
                | Error::InvalidProducerIdMapping(_)
                | Error::TransactionTimedOut(_)
                | Error::InvalidTxnState(_)
        )
    }

    /// Retriable: transient; the client retries these itself with backoff.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Transport { .. } | Error::Timeout(_) => true,
            // The class of a code is the wire table's (`ErrorCode::is_retriable`).
            other => other.code().is_some_and(ErrorCode::is_retriable),
        }
    }

    /// Whether recovering from this abortable error needs a new epoch (KIP-360): the leaders'
    /// sequence state for the current epoch can no longer be trusted.
    pub fn needs_epoch_bump(&self) -> bool {
        matches!(
            self,
            Error::InvalidProducerEpoch(_)
                | Error::OutOfOrderSequence(_)
                | Error::UnknownProducerId(_)
                | Error::InvalidProducerIdMapping(_)
        )
    }

    /// The wire error code this error came from, if it came from one.
    pub fn code(&self) -> Option<ErrorCode> {
        Some(match self {
            Error::ProducerFenced(_) => ErrorCode::ProducerFenced,
            Error::InvalidProducerEpoch(_) => ErrorCode::InvalidProducerEpoch,
            Error::OutOfOrderSequence(_) => ErrorCode::OutOfOrderSequenceNumber,
            Error::UnknownProducerId(_) => ErrorCode::UnknownProducerId,
            Error::InvalidProducerIdMapping(_) => ErrorCode::InvalidProducerIdMapping,
            Error::TransactionTimedOut(_) => ErrorCode::TransactionTimedOut,
            Error::InvalidTxnState(_) => ErrorCode::InvalidTxnState,
            Error::NotCoordinator(_) => ErrorCode::NotCoordinator,
            Error::CoordinatorLoadInProgress(_) => ErrorCode::CoordinatorLoadInProgress,
            Error::ConcurrentTransactions(_) => ErrorCode::ConcurrentTransactions,
            Error::CoordinatorNotAvailable(_) => ErrorCode::CoordinatorNotAvailable,
            Error::NotLeader(_) => ErrorCode::NotLeaderOrFollower,
            Error::Server { code, .. } => *code,
            Error::Transport { .. }
            | Error::Timeout(_)
            | Error::TransactionAborted(_)
            | Error::Config(_)
            | Error::IllegalState(_) => return None,
        })
    }

    /// The wire name of the error code (e.g. `PRODUCER_FENCED`), or a short label.
    pub fn code_name(&self) -> &'static str {
        match self.code() {
            Some(code) => code.as_str_name(),
            None => match self {
                Error::Transport { .. } => "TRANSPORT",
                Error::Config(_) => "CONFIG",
                Error::Timeout(_) => "TIMEOUT",
                Error::TransactionAborted(_) => "TRANSACTION_ABORTED",
                _ => "ILLEGAL_STATE",
            },
        }
    }

    /// Maps a response's `error_code`/`error_message`: `Ok(())` for NONE. The one place where
    /// wire codes become client errors.
    pub fn check(code: i32, message: &str) -> Result<()> {
        let code = ErrorCode::from_wire(code);
        let m = message.to_string();
        Err(match code {
            ErrorCode::None => return Ok(()),
            ErrorCode::ProducerFenced => Error::ProducerFenced(m),
            ErrorCode::InvalidProducerEpoch => Error::InvalidProducerEpoch(m),
            ErrorCode::OutOfOrderSequenceNumber => Error::OutOfOrderSequence(m),
            ErrorCode::UnknownProducerId => Error::UnknownProducerId(m),
            ErrorCode::InvalidProducerIdMapping => Error::InvalidProducerIdMapping(m),
            ErrorCode::TransactionTimedOut => Error::TransactionTimedOut(m),
            ErrorCode::InvalidTxnState => Error::InvalidTxnState(m),
            ErrorCode::NotCoordinator => Error::NotCoordinator(m),
            ErrorCode::CoordinatorLoadInProgress => Error::CoordinatorLoadInProgress(m),
            ErrorCode::ConcurrentTransactions => Error::ConcurrentTransactions(m),
            ErrorCode::CoordinatorNotAvailable => Error::CoordinatorNotAvailable(m),
            ErrorCode::NotLeaderOrFollower => Error::NotLeader(m),
            code => Error::Server { code, message: m },
        })
    }

    /// A transport failure (gRPC status or deadline) talking to `address`.
    pub fn transport(address: &str, message: impl std::fmt::Display) -> Self {
        Error::Transport {
            address: address.to_string(),
            message: message.to_string(),
        }
    }
}

/// Responses that carry an `error_code` and `error_message`.
pub(crate) trait WireError: Sized {
    fn error(&self) -> (i32, &str);

    /// The response itself if its code is NONE, else its error ([`Error::check`]).
    fn checked(self) -> Result<Self> {
        let (code, message) = self.error();
        Error::check(code, message)?;
        Ok(self)
    }
}

macro_rules! wire_error {
    ($($t:ty),*) => {$(
        impl WireError for $t {
            fn error(&self) -> (i32, &str) {
                (self.error_code, &self.error_message)
            }
        }
    )*};
}
wire_error!(
    proto::InitProducerIdResponse,
    proto::AddPartitionsToTxnResponse,
    proto::AddOffsetsToTxnResponse,
    proto::TxnOffsetCommitResponse,
    proto::EndTxnResponse,
    proto::OffsetFetchResponse,
    proto::ListTransactionsResponse,
    proto::ProduceResponse,
    proto::FetchResponse,
    proto::DescribeProducersResponse,
    proto::ListGroupsResponse,
    proto::DescribeGroupResponse
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_exactly_one_class_or_none() {
        for value in 0..=20 {
            let Err(e) = Error::check(value, "m") else {
                assert_eq!(value, 0);
                continue;
            };
            let classes = [e.is_fatal(), e.is_abortable(), e.is_retriable()];
            assert!(classes.iter().filter(|c| **c).count() <= 1, "{e:?}");
            assert_eq!(e.code().map(|c| c as i32), Some(value), "{e:?}");
        }
        assert!(Error::check(4, "").unwrap_err().is_fatal());
        assert!(Error::check(15, "").unwrap_err().is_abortable());
        assert!(Error::check(9, "").unwrap_err().needs_epoch_bump());
        assert!(!Error::check(15, "").unwrap_err().needs_epoch_bump());
        assert!(Error::check(3, "").unwrap_err().is_retriable());
        assert!(Error::transport("a", "b").is_retriable());
        assert_eq!(
            Error::check(99, "").unwrap_err().code_name(),
            "UNKNOWN_SERVER_ERROR"
        );
    }
}
