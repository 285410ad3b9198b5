//! The mini-broker wire protocol, generated from `proto/minibroker.proto`.
//!
//! Three gRPC services: `Cluster` (answered by every node), `TransactionCoordinator` and
//! `PartitionLeader`. Protocol errors travel as data in every response's `error_code`
//! ([`ErrorCode`]), so clients branch on codes, never on message text.
//!
//! The error table lives here, once: each code is named (Kafka's name) and described next to its
//! number in `minibroker.proto`; [`ErrorCode::name`] is that name and [`ErrorCode::is_retriable`]
//! its class. Every crate maps its own error enum to an [`ErrorCode`] in exactly one function and
//! derives names and classes from these, never by hand.

#![allow(missing_docs)]
#![allow(clippy::all)]

tonic::include_proto!("minibroker.v1");

/// The encoded `FileDescriptorSet` of `minibroker.proto`: what gRPC server reflection serves, so
/// grpcurl-style tools can list and call the services without the .proto file.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/minibroker_descriptor.bin"));

/// The largest producer epoch (Kafka's `Short.MAX_VALUE`).
pub const MAX_EPOCH: i32 = i16::MAX as i32;

impl ErrorCode {
    /// Decodes a wire value; unknown values (a newer peer) become `UnknownServerError`.
    pub fn from_wire(value: i32) -> Self {
        Self::try_from(value).unwrap_or(Self::UnknownServerError)
    }

    /// Kafka's name of the code (`PRODUCER_FENCED`, ...): what golden scripts, logs and the CLI
    /// print. The proto enum's names are Kafka's, so this is the generated name.
    pub fn name(self) -> &'static str {
        self.as_str_name()
    }

    /// Retriable: transient, the caller retries with backoff (the codes marked "Retriable" in
    /// `minibroker.proto`). Every other code is final for the request that got it.
    pub fn is_retriable(self) -> bool {
        matches!(
            self,
            Self::NotCoordinator
                | Self::CoordinatorLoadInProgress
                | Self::ConcurrentTransactions
                | Self::NotLeaderOrFollower
                | Self::CoordinatorNotAvailable
                | Self::UnstableOffsetCommit
        )
    }
}
