//! The mini-broker client: Kafka's transactional producer, an idempotent producer, a
//! `read_committed` consumer and admin requests, over the mini-broker gRPC protocol
//! (`proto/minibroker.proto`, rules in PROTOCOL.md section 10).
//!
//! # One transaction, request by request
//!
//! ```no_run
//! use producer_client::{ClientConfig, TransactionalProducer};
//!
//! # async fn run() -> Result<(), producer_client::Error> {
//! let config = ClientConfig::new(["127.0.0.1:9101"]).with_transactional_id("orders-app-1");
//! let mut producer = TransactionalProducer::connect(config).await?;
//!
//! // FindCoordinator("orders-app-1") -> the coordinator owning the id's state partition;
//! // InitProducerId -> (PID, epoch). A new id gets epoch 0; a restarted instance gets the same
//! // PID with a higher epoch, which fences every older instance and aborts its open transaction.
//! producer.init_transactions().await?;
//!
//! producer.begin_transaction()?;
//! // First write to orders-0: AddPartitionsToTxn(orders-0), then Produce(PID, epoch, seq 0).
//! // The leader checks the epoch and sequence, and verifies with the coordinator that the
//! // partition really is in this transaction before it opens the transaction there.
//! // `send` returns at once with a delivery future: the record joins orders-0's batch, which
//! // closes after `linger.ms` or at `batch.size`, with up to 5 Produce requests in flight.
//! let first = producer.send("orders", 0, "first").await?;
//! producer.send("orders", 0, "second").await?;        // same batch: sequences follow on
//! producer.send("orders", "customer-7", "x").await?;  // a key picks the partition (murmur2)
//! let _metadata = first.await?;                        // (partition, offset), once acknowledged
//!
//! // commit_transaction flushes first: every record is acknowledged before EndTxn(COMMIT): the coordinator makes the decision durable (PrepareCommit, epoch + 1),
//! // answers with the bumped (PID, epoch), then writes COMMIT markers to every partition.
//! // The producer adopts the new epoch and restarts its sequences at 0.
//! match producer.commit_transaction().await {
//!     Ok(()) => {}
//!     Err(e) if e.is_fatal() => return Err(e), // PRODUCER_FENCED: a newer instance took over
//!     Err(e) if e.is_abortable() => producer.abort_transaction().await?, // abort, carry on
//!     Err(e) => return Err(e), // retries ran out: outcome unknown, commit again later
//! }
//! # Ok(()) }
//! ```
//!
//! A `read_committed` [`Consumer`] then sees the three records exactly once, and nothing of any
//! aborted transaction.
//!
//! # Errors
//!
//! [`Error`] says which of PROTOCOL.md's classes an error is in: [`Error::is_fatal`]
//! (PRODUCER_FENCED: sticky, every later call returns it at once), [`Error::is_abortable`]
//! (abort, and the client bumps the epoch with InitProducerId(expected PID, epoch) — KIP-360) and
//! [`Error::is_retriable`] (retried inside the client with bounded jittered backoff; an EndTxn
//! with an unknown outcome is only ever retried with the same decision).
//!
//! # Modules
//!
//! - [`config`] — [`ClientConfig`] (Kafka's producer settings by their names) and the retry
//!   backoff.
//! - `accumulator` — the pipeline's pure core: batches, sequences, retry decisions.
//! - `pipeline` — the pipeline's shell: sender task, `buffer.memory`, [`DeliveryFuture`].
//! - [`error`] — [`Error`], and the single mapping from wire error codes.
//! - [`net`] — channels per node, metadata and FindCoordinator.
//! - [`transactional`] — [`TransactionalProducer`].
//! - [`idempotent`] — [`IdempotentProducer`].
//! - [`consumer`] — [`Consumer`].
//! - [`admin`] — [`Admin`] (list/describe transactions, producers) and [`RawRequests`].
//! - [`partitioner`] — key -> partition (Kafka's murmur2).
//!
//! CAVEATS: one Produce per batch (a Produce names one partition); no compression, no TLS;
//! consumer assignment is explicit.

mod accumulator;
pub mod admin;
pub mod config;
pub mod consumer;
pub mod error;
pub mod idempotent;
pub mod net;
pub mod partitioner;
mod pipeline;
mod produce;
pub mod transactional;

pub use admin::{Admin, RawRequests};
pub use cluster::TopicPartition;
pub use config::ClientConfig;
pub use consumer::{Consumer, ConsumerRecord, Isolation, Watermarks};
pub use error::{Error, Result};
pub use idempotent::IdempotentProducer;
pub use partitioner::Target;
pub use pipeline::DeliveryFuture;
pub use produce::RecordMetadata;
pub use transactional::TransactionalProducer;
