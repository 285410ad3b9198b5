//! [`IdempotentProducer`]: exactly-once *per partition* writes without transactions.
//!
//! InitProducerId without a transactional id gets a fresh PID (epoch 0) from any coordinator;
//! every Produce carries (PID, epoch, sequence) so that a retried batch is appended once. There
//! is no fencing across instances (PROTOCOL.md, seed: "only transactional producers get
//! coordinator-driven cross-instance fencing").
//!
//! `send` goes through the pipeline (module `pipeline`): it returns a [`DeliveryFuture`] at
//! once; records are batched per partition (`linger.ms`, `batch.size`) with up to
//! `max.in.flight.requests.per.connection` Produce requests per partition in flight.
//!
//! When a batch fails for good (OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID with nothing
//! before it in flight, INVALID_PRODUCER_EPOCH, `delivery.timeout.ms`), that batch and the
//! partition's batches already sent fail, and the pipeline gets a new PID once nothing is in
//! flight, restarting the sequences at 0 for every batch not sent yet: a failed record may be
//! lost, never duplicated.

use std::time::Duration;

use proto::InitProducerIdRequest;

use crate::accumulator::Mode;
use crate::config::ClientConfig;
use crate::error::{Error, Result, WireError};
use crate::net::Connections;
use crate::partitioner::Target;
use crate::pipeline::{DeliveryFuture, Pipeline};
use crate::produce::{self, RecordMetadata};

/// InitProducerId without a transactional id, asked of the coordinators in turn with backoff.
pub(crate) async fn init_producer_id(conn: &Connections) -> Result<(i64, i16)> {
    let mut backoff = conn.backoff();
    loop {
        let metadata = conn.metadata().await?;
        let mut last = None;
        for node in &metadata.coordinators {
            let mut client = conn.coordinator(&node.address)?;
            let request = InitProducerIdRequest {
                transactional_id: None,
                transaction_timeout_ms: conn.config().transaction_timeout_ms,
                expected_producer_id: -1,
                expected_producer_epoch: -1,
                // Transaction version 2: every transaction ends with an epoch bump.
                transaction_version: 2,
            };
            let result = conn
                .rpc(
                    &node.address,
                    Duration::ZERO,
                    client.init_producer_id(request),
                )
                .await
                .and_then(WireError::checked);
            match result {
                Ok(r) => {
                    let epoch = cluster::epoch_from_wire(r.producer_epoch, false).unwrap_or(0);
                    tracing::info!(
                        pid = r.producer_id,
                        epoch,
                        "idempotent producer initialised"
                    );
                    return Ok((r.producer_id, epoch));
                }
                Err(e) if e.is_retriable() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        let err = last.unwrap_or_else(|| Error::Config("the cluster has no coordinators".into()));
        if !backoff.wait().await {
            return Err(err);
        }
    }
}

/// An idempotent, non-transactional producer.
#[derive(Debug)]
pub struct IdempotentProducer {
    conn: Connections,
    pipeline: Pipeline,
}

impl IdempotentProducer {
    /// Connects, gets a PID (InitProducerId without a transactional id) and starts the pipeline.
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        let conn = Connections::new(config)?;
        let producer = init_producer_id(&conn).await?;
        let pipeline = Pipeline::start(conn.clone(), Mode::Idempotent, producer, None);
        Ok(Self { conn, pipeline })
    }

    /// The producer id new batches are written with.
    pub fn producer_id(&self) -> i64 {
        self.pipeline.producer().0
    }

    /// The epoch (0 unless re-initialised).
    pub fn epoch(&self) -> i16 {
        self.pipeline.producer().1
    }

    /// Appends one record to its partition's batch and returns at once (after waiting for
    /// `buffer.memory` if it is full, at most `max.block.ms`). The [`DeliveryFuture`] resolves
    /// to where the record landed, or why it did not.
    pub async fn send(
        &mut self,
        topic: &str,
        target: impl Into<Target>,
        value: impl Into<Vec<u8>>,
    ) -> Result<DeliveryFuture> {
        let target = target.into();
        let tp = produce::resolve(&self.conn, topic, &target).await?;
        let mut records = produce::records(target.key(), vec![value.into()]);
        let record = records.pop().expect("one record");
        self.pipeline.append(tp, record).await
    }

    /// [`IdempotentProducer::send`], then a flush, then waits for the acknowledgement (Java's
    /// `producer.send(record); producer.flush(); future.get()`): one record per round trip, for
    /// tests and tools.
    pub async fn send_and_wait(
        &mut self,
        topic: &str,
        target: impl Into<Target>,
        value: impl Into<Vec<u8>>,
    ) -> Result<RecordMetadata> {
        let delivery = self.send(topic, target, value).await?;
        self.pipeline.flush().await;
        delivery.await
    }

    /// Sends several records to one partition and waits for all of them; returns the first
    /// record's metadata (they are consecutive in the partition when nothing else writes it).
    pub async fn send_batch(
        &mut self,
        topic: &str,
        target: impl Into<Target>,
        values: Vec<Vec<u8>>,
    ) -> Result<RecordMetadata> {
        if values.is_empty() {
            return Err(Error::IllegalState(
                "a batch needs at least one record".into(),
            ));
        }
        let target = target.into();
        let mut futures = Vec::with_capacity(values.len());
        for value in values {
            futures.push(self.send(topic, target.clone(), value).await?);
        }
        self.pipeline.flush().await;
        let mut first = None;
        for f in futures {
            let m = f.await?;
            first.get_or_insert(m);
        }
        Ok(first.expect("at least one record"))
    }

    /// Closes every open batch and waits until every record sent so far is acknowledged or
    /// failed (the outcome of each is on its [`DeliveryFuture`]).
    pub async fn flush(&mut self) -> Result<()> {
        self.pipeline.flush().await;
        Ok(())
    }
}
