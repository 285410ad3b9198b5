//! The coordinator's one error type and its wire code: [`Error`] is every way a request or the
//! node can fail, and [`error_code`] is the ONE place an error becomes a [`proto::ErrorCode`]
//! (protocol decisions delegate to [`TxnError::code`], which sits beside the decisions).
//! Names and classes of codes come from the wire table ([`ErrorCode::name`],
//! [`ErrorCode::is_retriable`]), never from here.

use proto::ErrorCode;

use crate::core::TxnError;
use crate::storage::StorageError;

/// The coordinator library's error: protocol decisions plus I/O, storage and transport.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The id or group is owned by another coordinator (NOT_COORDINATOR).
    #[error("not the coordinator of {0:?}")]
    NotCoordinator(String),
    /// State is still being loaded after a start (COORDINATOR_LOAD_IN_PROGRESS).
    #[error("coordinator is loading its state")]
    CoordinatorLoadInProgress,
    /// A protocol decision (mapped to an error code on the wire).
    #[error(transparent)]
    Protocol(#[from] TxnError),
    /// The storage engine failed.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// The gRPC server failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Bad configuration (e.g. this node is not a coordinator in the topology).
    #[error("configuration: {0}")]
    Config(String),
    /// An I/O error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// An internal request that is not from a cluster member allowed to send it
    /// (CLUSTER_AUTHORIZATION_FAILED), or from a node of another topology
    /// (INCONSISTENT_CLUSTER_ID). Nothing was changed.
    #[error(transparent)]
    Membership(#[from] cluster::auth::AuthError),
    /// This node's topology disagrees with a peer's: it does not serve ownership it may not have
    /// (COORDINATOR_NOT_AVAILABLE, retriable once the operator fixed the topology files).
    #[error("{0}")]
    TopologyConflict(String),
    /// KIP-447: an OffsetFetch requiring stable offsets asked for a partition whose offset a
    /// transaction committed and whose marker is not applied yet (UNSTABLE_OFFSET_COMMIT).
    #[error("{0}")]
    UnstableOffsetCommit(String),
    /// No group by that id here: no members, no committed offsets (GROUP_ID_NOT_FOUND).
    #[error("no group {0:?}")]
    GroupIdNotFound(String),
}

impl Error {
    /// The human detail that travels as `error_message`: without the error's name for protocol
    /// decisions (the code names them), the full text for everything else.
    pub fn detail(&self) -> String {
        match self {
            Error::Protocol(e) => e.detail(),
            other => other.to_string(),
        }
    }
}

/// The one mapping from errors to wire codes.
pub fn error_code(error: &Error) -> ErrorCode {
    match error {
        Error::NotCoordinator(_) => ErrorCode::NotCoordinator,
        Error::CoordinatorLoadInProgress => ErrorCode::CoordinatorLoadInProgress,
        Error::Protocol(e) => e.code(),
        Error::Storage(_) => ErrorCode::KafkaStorageError,
        Error::Membership(e) => e.code(),
        Error::TopologyConflict(_) => ErrorCode::CoordinatorNotAvailable,
        Error::UnstableOffsetCommit(_) => ErrorCode::UnstableOffsetCommit,
        Error::GroupIdNotFound(_) => ErrorCode::GroupIdNotFound,
        Error::Transport(_) | Error::Config(_) | Error::Io(_) => ErrorCode::UnknownServerError,
    }
}

/// `(error_code, error_message)` of a result: what every response carries.
pub(crate) fn code_of<T>(result: &Result<T, Error>) -> (i32, String) {
    match result {
        Ok(_) => (ErrorCode::None as i32, String::new()),
        Err(e) => (error_code(e) as i32, e.detail()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_code() {
        let p = |e| error_code(&Error::Protocol(e));
        assert_eq!(
            p(TxnError::ProducerFenced(String::new())),
            ErrorCode::ProducerFenced
        );
        assert_eq!(
            p(TxnError::TransactionTimedOut(String::new())),
            ErrorCode::TransactionTimedOut
        );
        assert_eq!(
            p(TxnError::TransactionCoordinatorFenced(String::new())),
            ErrorCode::TransactionCoordinatorFenced
        );
        assert_eq!(
            p(TxnError::InvalidProducerEpoch(String::new())),
            ErrorCode::InvalidProducerEpoch
        );
        assert_eq!(p(TxnError::NeedProducerId), ErrorCode::UnknownServerError);
        // The core's names for its errors are the wire code's names.
        for e in [
            TxnError::InvalidRequest(String::new()),
            TxnError::InvalidTransactionTimeout(String::new()),
            TxnError::ConcurrentTransactions(String::new()),
            TxnError::ProducerFenced(String::new()),
            TxnError::InvalidProducerIdMapping(String::new()),
            TxnError::InvalidProducerEpoch(String::new()),
            TxnError::InvalidTxnState(String::new()),
            TxnError::UnknownTopicOrPartition(String::new()),
            TxnError::TransactionTimedOut(String::new()),
            TxnError::TransactionCoordinatorFenced(String::new()),
        ] {
            assert_eq!(e.name(), p(e.clone()).as_str_name());
        }
        assert_eq!(
            error_code(&Error::NotCoordinator("x".into())),
            ErrorCode::NotCoordinator
        );
        assert_eq!(
            error_code(&Error::CoordinatorLoadInProgress),
            ErrorCode::CoordinatorLoadInProgress
        );
        assert_eq!(
            error_code(&Error::Storage(StorageError::Task("x".into()))),
            ErrorCode::KafkaStorageError
        );
    }
}
