//! [`IdempotentProducer`]: exactly-once *per partition* writes without transactions.
//!
//! InitProducerId without a transactional id gets a fresh PID (epoch 0) from any coordinator;
//! every Produce carries (PID, epoch, sequence) so that a retried batch is appended once. There
//! is no fencing across instances (PROTOCOL.md, seed: "only transactional producers get
//! coordinator-driven cross-instance fencing").
//!
//! On an error that leaves the sequence state in doubt (OUT_OF_ORDER_SEQUENCE_NUMBER,
//! UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH) the error is returned and the next send first
//! gets a new PID, restarting the sequences at 0: the failed record may be lost, never duplicated.

use std::collections::HashMap;
use std::time::Duration;

use cluster::TopicPartition;
use proto::InitProducerIdRequest;

use crate::config::ClientConfig;
use crate::error::{Error, Result, WireError};
use crate::net::Connections;
use crate::partitioner::Target;
use crate::produce::{self, RecordMetadata};

/// An idempotent, non-transactional producer.
#[derive(Debug)]
pub struct IdempotentProducer {
    conn: Connections,
    producer_id: i64,
    epoch: i16,
    sequences: HashMap<TopicPartition, i32>,
}

impl IdempotentProducer {
    /// Connects and gets a PID (InitProducerId without a transactional id).
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        let conn = Connections::new(config)?;
        let mut producer = Self {
            conn,
            producer_id: -1,
            epoch: -1,
            sequences: HashMap::new(),
        };
        producer.init().await?;
        Ok(producer)
    }

    /// The producer id.
    pub fn producer_id(&self) -> i64 {
        self.producer_id
    }

    /// The epoch (0 unless re-initialised).
    pub fn epoch(&self) -> i16 {
        self.epoch
    }

    async fn init(&mut self) -> Result<()> {
        let mut backoff = self.conn.backoff();
        loop {
            let metadata = self.conn.metadata().await?;
            let mut last = None;
            for node in &metadata.coordinators {
                let mut client = self.conn.coordinator(&node.address)?;
                let request = InitProducerIdRequest {
                    transactional_id: None,
                    transaction_timeout_ms: self.conn.config().transaction_timeout_ms,
                    expected_producer_id: -1,
                    expected_producer_epoch: -1,
                    // Transaction version 2: every transaction ends with an epoch bump.
                    transaction_version: 2,
                };
                let result = self
                    .conn
                    .rpc(
                        &node.address,
                        Duration::ZERO,
                        client.init_producer_id(request),
                    )
                    .await
                    .and_then(WireError::checked);
                match result {
                    Ok(r) => {
                        self.producer_id = r.producer_id;
                        self.epoch = cluster::epoch_from_wire(r.producer_epoch, false).unwrap_or(0);
                        self.sequences.clear();
                        tracing::info!(
                            pid = self.producer_id,
                            epoch = self.epoch,
                            "idempotent producer initialised"
                        );
                        return Ok(());
                    }
                    Err(e) if e.is_retriable() => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            let err =
                last.unwrap_or_else(|| Error::Config("the cluster has no coordinators".into()));
            if !backoff.wait().await {
                return Err(err);
            }
        }
    }

    /// Sends one record and waits for the acknowledgement.
    pub async fn send(
        &mut self,
        topic: &str,
        target: impl Into<Target>,
        value: impl Into<Vec<u8>>,
    ) -> Result<RecordMetadata> {
        self.send_batch(topic, target, vec![value.into()]).await
    }

    /// Sends several records to one partition as one batch.
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
        if self.producer_id < 0 {
            self.init().await?;
        }
        let target = target.into();
        let tp = produce::resolve(&self.conn, topic, &target).await?;
        let result = produce::produce_next(
            &self.conn,
            &mut self.sequences,
            tp,
            (self.producer_id, self.epoch),
            None,
            produce::records(target.key(), values),
        )
        .await;
        if result.as_ref().is_err_and(Error::needs_epoch_bump) {
            // Start over with a fresh PID at the next send.
            self.producer_id = -1;
        }
        result
    }
}
