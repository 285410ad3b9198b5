//! The mini-broker wire protocol, generated from `proto/minibroker.proto`.
//!
//! Three gRPC services: `Cluster` (answered by every node), `TransactionCoordinator` and
//! `PartitionLeader`. Protocol errors travel as data in every response's `error_code`
//! ([`ErrorCode`]), so clients branch on codes, never on message text.

#![allow(missing_docs)]
#![allow(clippy::all)]

tonic::include_proto!("minibroker.v1");

/// The largest producer epoch (Kafka's `Short.MAX_VALUE`).
pub const MAX_EPOCH: i32 = i16::MAX as i32;

/// "No producer id" / "no epoch", as in Kafka.
pub const NO_PRODUCER_ID: i64 = -1;
/// See [`NO_PRODUCER_ID`].
pub const NO_PRODUCER_EPOCH: i32 = -1;

impl ErrorCode {
    /// Decodes a wire value; unknown values (a newer peer) become `UnknownServerError`.
    pub fn from_wire(value: i32) -> Self {
        Self::try_from(value).unwrap_or(Self::UnknownServerError)
    }
}
