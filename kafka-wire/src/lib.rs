//! Kafka's binary protocol as a second, external face of every mini-broker node.
//!
//! gRPC stays the protocol between our own nodes and for our client; this crate lets unchanged
//! Kafka clients (librdkafka / confluent-kafka, kafka-python, kcat) talk to the same nodes. It
//! holds only what is common to every node; the node crates implement [`Handler`] for their own
//! APIs (`coordinator::kafka`, `partition_leader::kafka`) by calling the same cores and service
//! functions their gRPC handlers call. No protocol rule lives here.
//!
//! Modules:
//! - [`server`]: the listener and the connection loop (one tokio task per connection, framing
//!   with a size limit checked before allocating, requests answered in order).
//! - [`apis`]: the API/version table and ApiVersions.
//! - [`metadata`]: Metadata and FindCoordinator, answered from the static [`cluster::Topology`]
//!   (every node answers them the same way).
//! - [`configs`]: DescribeConfigs, a topic's configuration and the node's own settings.
//! - [`codes`]: mini-broker's wire error codes -> Kafka's error codes, in one table.
//! - [`observe`]: what a response counts in the node's metrics (error codes, who was fenced).
//! - [`refuse`]: the answers of a node of the other role (NOT_LEADER_OR_FOLLOWER,
//!   NOT_COORDINATOR), since every node advertises the cluster's whole table.
//!
//! One request walked through: [`server::serve`] accepts a connection and spawns its task; the
//! task reads a 4-byte length, refuses it if it is over [`server::ServerConfig::max_frame_bytes`],
//! reads the frame, peeks api key and version, checks them against the cluster's [`apis::ApiTable`] (an
//! unknown key or version closes the connection, except ApiVersions, which answers
//! UNSUPPORTED_VERSION as Kafka does), decodes header and body with `kafka-protocol`, answers
//! ApiVersions/Metadata/FindCoordinator/DescribeConfigs itself and hands everything else to the node's
//! [`Handler`], then encodes the response with the request's correlation id and writes it. The
//! next request of the connection is read only after that (Kafka mutes a connection while one of
//! its requests is in flight), so responses are in request order and pipelined requests simply
//! wait in the socket buffer.
//!
//! CAVEATS: no TLS, no SASL, no quotas (throttle time is always 0), no fetch sessions (every
//! Fetch response has session id 0, which tells clients to send full fetches), topics are
//! static, so their ids (Metadata v10+) are derived from their names ([`cluster::topic_id`]),
//! and Fetch stops below the versions that fetch by topic id.

pub mod apis;
pub mod codes;
pub mod configs;
pub mod metadata;
pub mod observe;
pub mod refuse;
pub mod server;
pub mod topics;

pub use apis::{ApiRange, ApiTable};
pub use server::{serve, Handler, Request, ServerConfig};

/// What can go wrong on a Kafka connection. Every variant costs that one connection only.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket failed or the peer went away mid-frame.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A frame announced more bytes than the limit (nothing was allocated for it).
    #[error("frame of {size} bytes is over the {limit} byte limit")]
    FrameTooLarge {
        /// Announced size.
        size: i64,
        /// The configured limit.
        limit: usize,
    },
    /// A frame too short to hold a request header, or a negative length.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// An API key this node does not know, or a version it does not implement.
    #[error("unsupported api key {key} version {version}")]
    Unsupported {
        /// The raw api key.
        key: i16,
        /// The requested version.
        version: i16,
    },
    /// The request did not decode (garbage, truncated).
    #[error("request did not decode: {0}")]
    Decode(String),
    /// A response did not encode (a bug: a field out of range for the version).
    #[error("response did not encode: {0}")]
    Encode(String),
    /// The peer was too slow to send a frame it had announced, or idle for too long.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The handler decided the connection must close (e.g. a request it cannot answer).
    #[error("closed by the handler: {0}")]
    Close(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand for a `kafka-protocol` string.
pub fn str_bytes(s: impl Into<String>) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.into())
}

/// Splits a `host:port` address into its host and port (`None` if it is not one).
pub fn host_port(address: &str) -> Option<(String, i32)> {
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), i32::from(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_splits_addresses() {
        assert_eq!(
            host_port("127.0.0.1:9092"),
            Some(("127.0.0.1".into(), 9092))
        );
        assert_eq!(host_port("[::1]:9092"), Some(("::1".into(), 9092)));
        assert_eq!(host_port("broker:70000"), None);
        assert_eq!(host_port("nope"), None);
    }
}
