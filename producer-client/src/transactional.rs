//! [`TransactionalProducer`]: Kafka's transactional producer over the mini-broker protocol.
//!
//! State machine (the producer's view, not the coordinator's):
//!
//! ```text
//! Uninitialized --init_transactions--> Ready --begin_transaction--> InTransaction
//! InTransaction --commit/abort--> Ready           (EndTxn returns the bumped (PID, epoch))
//! InTransaction --abortable error--> Abortable --abort_transaction--> Ready (+ KIP-360 bump)
//! any --PRODUCER_FENCED--> Fatal                  (sticky: every later call fails at once)
//! ```
//!
//! Requests per transaction: AddPartitionsToTxn before the first write to each partition, Produce
//! with per-partition sequences starting at 0 for each epoch, AddOffsetsToTxn + TxnOffsetCommit
//! for `send_offsets_to_transaction`, then EndTxn. Coordinator requests are retried on retriable
//! errors (finding the coordinator again after NOT_COORDINATOR or a transport error); an EndTxn
//! whose outcome is unknown is retried with the same decision, and if the retries run out the
//! decision is remembered so that a commit can never be turned into an abort.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use cluster::TopicPartition;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, CoordinatorKeyType, EndTxnRequest,
    InitProducerIdRequest, PartitionOffset, TxnOffsetCommitRequest, TxnResult,
};
use tonic::transport::Channel;

use crate::accumulator::Mode;
use crate::config::ClientConfig;
use crate::error::{Error, Result, WireError};
use crate::net::{Connections, NodeAddr};
use crate::partitioner::Target;
use crate::pipeline::{DeliveryFuture, Pipeline};
use crate::produce::{self, RecordMetadata};

/// Sends `request` to the coordinator of `key` (found and cached in `coordinator`), retrying
/// retriable errors with backoff and looking the coordinator up again when it moved or died.
pub(crate) async fn coordinator_rpc<Req, Resp, F, Fut>(
    conn: &Connections,
    coordinator: &mut Option<NodeAddr>,
    key: &str,
    key_type: CoordinatorKeyType,
    request: Req,
    call: F,
) -> Result<Resp>
where
    Req: Clone,
    Resp: WireError,
    F: Fn(TransactionCoordinatorClient<Channel>, Req) -> Fut,
    Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
{
    let mut backoff = conn.backoff();
    loop {
        let node = match coordinator {
            Some(node) => node.clone(),
            None => {
                let node = conn.find_coordinator(key, key_type).await?;
                *coordinator = Some(node.clone());
                node
            }
        };
        let client = conn.coordinator(&node.address)?;
        let result = conn
            .rpc(&node.address, Duration::ZERO, call(client, request.clone()))
            .await
            .and_then(WireError::checked);
        match result {
            Ok(r) => return Ok(r),
            Err(e) if e.is_retriable() => {
                if matches!(e, Error::NotCoordinator(_) | Error::Transport { .. }) {
                    *coordinator = None;
                }
                tracing::debug!(%key, error = %e, "coordinator request failed; retrying");
                if !backoff.wait_for(&e).await {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[derive(Clone, Debug)]
enum State {
    Uninitialized,
    Ready,
    InTransaction,
    /// The transaction must be aborted; the error says why.
    Abortable(Error),
    /// Fenced: sticky.
    Fatal(Error),
}

/// A transactional producer. One instance per transactional id at a time: starting another
/// instance with the same id fences this one.
///
/// Methods take `&mut self`: a producer is driven by one task, the way Kafka's transactional API
/// is used from one thread.
#[derive(Debug)]
pub struct TransactionalProducer {
    conn: Connections,
    transactional_id: String,
    coordinator: Option<NodeAddr>,
    producer_id: i64,
    epoch: i16,
    state: State,
    partitions: BTreeSet<TopicPartition>,
    groups: BTreeSet<String>,
    /// The coordinator of each consumer group offsets were sent for (TxnOffsetCommit goes there,
    /// as in Kafka, so that it knows the offsets are pending: KIP-447).
    group_coordinators: BTreeMap<String, Option<NodeAddr>>,
    /// Accumulator and sender: owns the per-partition sequences of the current epoch.
    pipeline: Pipeline,
    /// An EndTxn whose outcome is unknown: only the same decision may be sent again.
    pending_end: Option<TxnResult>,
}

impl TransactionalProducer {
    /// A producer for `config.transactional_id`. Nothing is sent until
    /// [`TransactionalProducer::init_transactions`].
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        let transactional_id = config.transactional_id.clone().ok_or_else(|| {
            Error::Config("a transactional producer needs a transactional_id".into())
        })?;
        let conn = Connections::new(config)?;
        let pipeline = Pipeline::start(
            conn.clone(),
            Mode::Transactional,
            (-1, -1),
            Some(transactional_id.clone()),
        );
        Ok(Self {
            conn,
            transactional_id,
            coordinator: None,
            producer_id: -1,
            epoch: -1,
            state: State::Uninitialized,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            group_coordinators: BTreeMap::new(),
            pipeline,
            pending_end: None,
        })
    }

    /// The transactional id.
    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// The current producer id (-1 before `init_transactions`).
    pub fn producer_id(&self) -> i64 {
        self.producer_id
    }

    /// The current epoch (-1 before `init_transactions`).
    pub fn epoch(&self) -> i16 {
        self.epoch
    }

    /// Whether a transaction is open (including one that must be aborted).
    pub fn in_transaction(&self) -> bool {
        matches!(self.state, State::InTransaction | State::Abortable(_))
    }

    /// The fatal error, if the producer was fenced.
    pub fn fatal_error(&self) -> Option<&Error> {
        match &self.state {
            State::Fatal(e) => Some(e),
            _ => None,
        }
    }

    /// The partitions added to the open transaction.
    pub fn transaction_partitions(&self) -> impl Iterator<Item = &TopicPartition> {
        self.partitions.iter()
    }

    /// The connections (for tools that want to issue raw requests with this producer's setup).
    pub fn connections(&self) -> &Connections {
        &self.conn
    }

    fn check_not_fatal(&self) -> Result<()> {
        match &self.state {
            State::Fatal(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Records `e` against the producer's state and hands it back: fatal errors make the
    /// producer unusable, anything else inside a transaction makes the transaction abortable.
    fn fail(&mut self, e: Error) -> Error {
        if e.is_fatal() {
            tracing::warn!(txn_id = %self.transactional_id, pid = self.producer_id,
                epoch = self.epoch, error = %e, "producer fenced");
            self.state = State::Fatal(e.clone());
        } else if matches!(self.state, State::InTransaction) {
            self.state = State::Abortable(e.clone());
        }
        e
    }

    fn adopt(&mut self, producer_id: i64, epoch: i32) -> Result<()> {
        let epoch = cluster::epoch_from_wire(epoch, false).ok_or_else(|| Error::Server {
            code: proto::ErrorCode::InvalidRequest,
            message: format!("coordinator returned an out-of-range epoch {epoch}"),
        })?;
        if producer_id != self.producer_id || epoch != self.epoch {
            tracing::info!(txn_id = %self.transactional_id, pid = producer_id, epoch,
                old_pid = self.producer_id, old_epoch = self.epoch, "adopted producer id and epoch");
        }
        self.producer_id = producer_id;
        self.epoch = epoch;
        self.pipeline.reset((producer_id, epoch));
        Ok(())
    }

    /// [`coordinator_rpc`] to this id's transaction coordinator (cached in `self.coordinator`).
    async fn coordinator_request<Req, Resp, F, Fut>(
        &mut self,
        request: Req,
        call: F,
    ) -> Result<Resp>
    where
        Req: Clone,
        Resp: WireError,
        F: Fn(TransactionCoordinatorClient<Channel>, Req) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        coordinator_rpc(
            &self.conn,
            &mut self.coordinator,
            &self.transactional_id,
            CoordinatorKeyType::Transaction,
            request,
            call,
        )
        .await
    }

    async fn init_producer_id(&mut self, expected: Option<(i64, i16)>) -> Result<()> {
        let (expected_producer_id, expected_producer_epoch) =
            expected.map_or((-1, -1), |(p, e)| (p, i32::from(e)));
        let request = InitProducerIdRequest {
            transactional_id: Some(self.transactional_id.clone()),
            transaction_timeout_ms: self.conn.config().transaction_timeout_ms,
            expected_producer_id,
            expected_producer_epoch,
            // Transaction version 2: every transaction ends with an epoch bump.
            transaction_version: 2,
        };
        let response = self
            .coordinator_request(
                request,
                |mut c, r| async move { c.init_producer_id(r).await },
            )
            .await;
        match response {
            Ok(r) => self.adopt(r.producer_id, r.producer_epoch),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// InitProducerId: gets this id's (PID, epoch) from its coordinator, fencing every older
    /// instance (their open transaction is aborted). Call once, first.
    pub async fn init_transactions(&mut self) -> Result<()> {
        self.check_not_fatal()?;
        if !matches!(self.state, State::Uninitialized) {
            return Err(Error::IllegalState(
                "init_transactions was already called on this producer".into(),
            ));
        }
        self.init_producer_id(None).await?;
        self.state = State::Ready;
        Ok(())
    }

    /// Opens a transaction (locally: the coordinator learns of it at the first write).
    pub fn begin_transaction(&mut self) -> Result<()> {
        self.check_not_fatal()?;
        match self.state {
            State::Ready => {
                self.state = State::InTransaction;
                self.partitions.clear();
                self.groups.clear();
                Ok(())
            }
            State::Uninitialized => Err(Error::IllegalState(
                "call init_transactions before begin_transaction".into(),
            )),
            _ => Err(Error::IllegalState("a transaction is already open".into())),
        }
    }

    /// Moves a batch failure the pipeline saw into the producer's state (abortable, or fatal).
    fn sync_failure(&mut self) {
        if matches!(self.state, State::InTransaction) {
            if let Some(e) = self.pipeline.failure() {
                let _ = self.fail(e);
            }
        }
    }

    fn check_in_transaction(&mut self) -> Result<()> {
        self.sync_failure();
        match &self.state {
            State::InTransaction if self.pending_end.is_none() => Ok(()),
            State::InTransaction => Err(Error::IllegalState(
                "the transaction is ending (its EndTxn outcome is unknown); retry commit/abort"
                    .into(),
            )),
            State::Abortable(e) | State::Fatal(e) => Err(e.clone()),
            _ => Err(Error::IllegalState("no transaction is open".into())),
        }
    }

    async fn add_partition(&mut self, tp: &TopicPartition) -> Result<()> {
        if self.partitions.contains(tp) {
            return Ok(());
        }
        let request = AddPartitionsToTxnRequest {
            transactional_id: self.transactional_id.clone(),
            producer_id: self.producer_id,
            producer_epoch: i32::from(self.epoch),
            partitions: vec![tp.clone().into()],
        };
        self.coordinator_request(request, |mut c, r| async move {
            c.add_partitions_to_txn(r).await
        })
        .await
        .map_err(|e| self.fail(e))?;
        tracing::debug!(txn_id = %self.transactional_id, %tp, "partition added to transaction");
        self.partitions.insert(tp.clone());
        Ok(())
    }

    /// Sends one record to `topic` at `target` (a partition number or a key) inside the open
    /// transaction: AddPartitionsToTxn first if the partition is new to the transaction, then
    /// the record joins its partition's batch and a [`DeliveryFuture`] is returned at once
    /// (after waiting for `buffer.memory` if it is full, at most `max.block.ms`).
    ///
    /// If any batch of the transaction fails, the transaction becomes abortable: every pending
    /// record resolves with that error, and so do later calls.
    pub async fn send(
        &mut self,
        topic: &str,
        target: impl Into<Target>,
        value: impl Into<Vec<u8>>,
    ) -> Result<DeliveryFuture> {
        self.check_in_transaction()?;
        let target = target.into();
        let tp = produce::resolve(&self.conn, topic, &target).await?;
        self.add_partition(&tp).await?;
        let mut records = produce::records(target.key(), vec![value.into()]);
        let record = records.pop().expect("one record");
        match self.pipeline.append(tp, record).await {
            Ok(delivery) => Ok(delivery),
            Err(e) => {
                self.sync_failure();
                Err(e)
            }
        }
    }

    /// [`TransactionalProducer::send`], then a flush, then waits for the acknowledgement (Java's
    /// `producer.send(record); producer.flush(); future.get()`); a failure is also recorded
    /// against the transaction.
    pub async fn send_and_wait(
        &mut self,
        topic: &str,
        target: impl Into<Target>,
        value: impl Into<Vec<u8>>,
    ) -> Result<RecordMetadata> {
        let result = match self.send(topic, target, value).await {
            Ok(delivery) => {
                self.pipeline.flush().await;
                delivery.await
            }
            Err(e) => Err(e),
        };
        self.sync_failure();
        result
    }

    /// Sends several records to one partition and waits for all of them; returns the first
    /// record's metadata.
    pub async fn send_batch(
        &mut self,
        topic: &str,
        target: impl Into<Target>,
        values: Vec<Vec<u8>>,
    ) -> Result<RecordMetadata> {
        self.check_in_transaction()?;
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
            match f.await {
                Ok(m) => {
                    first.get_or_insert(m);
                }
                Err(e) => {
                    self.sync_failure();
                    return Err(e);
                }
            }
        }
        Ok(first.expect("at least one record"))
    }

    /// Closes every open batch and waits until every record sent so far is acknowledged or
    /// failed. Returns the transaction's error if a batch failed (the transaction must then be
    /// aborted).
    pub async fn flush(&mut self) -> Result<()> {
        self.check_not_fatal()?;
        self.pipeline.flush().await;
        self.sync_failure();
        match &self.state {
            State::Abortable(e) | State::Fatal(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Commits `offsets` (next offset to consume, per partition) for consumer group `group`
    /// as part of the open transaction: AddOffsetsToTxn once per group, then TxnOffsetCommit.
    /// They become visible to the group only if the transaction commits.
    pub async fn send_offsets_to_transaction(
        &mut self,
        offsets: &BTreeMap<TopicPartition, i64>,
        group: &str,
    ) -> Result<()> {
        self.check_in_transaction()?;
        if !self.groups.contains(group) {
            let request = AddOffsetsToTxnRequest {
                transactional_id: self.transactional_id.clone(),
                producer_id: self.producer_id,
                producer_epoch: i32::from(self.epoch),
                group_id: group.to_string(),
            };
            self.coordinator_request(
                request,
                |mut c, r| async move { c.add_offsets_to_txn(r).await },
            )
            .await
            .map_err(|e| self.fail(e))?;
            self.groups.insert(group.to_string());
        }
        let request = TxnOffsetCommitRequest {
            transactional_id: self.transactional_id.clone(),
            producer_id: self.producer_id,
            producer_epoch: i32::from(self.epoch),
            group_id: group.to_string(),
            offsets: offsets
                .iter()
                .map(|(tp, offset)| PartitionOffset {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    offset: *offset,
                })
                .collect(),
            auth: None,
        };
        // To the group's coordinator, which records the offsets as pending (a read_committed
        // consumer's OffsetFetch then waits for this transaction's marker) and hands them to
        // the transaction's coordinator.
        let coordinator = self
            .group_coordinators
            .entry(group.to_string())
            .or_default();
        let committed = coordinator_rpc(
            &self.conn,
            coordinator,
            group,
            CoordinatorKeyType::Group,
            request,
            |mut c, r| async move { c.txn_offset_commit(r).await },
        )
        .await;
        committed.map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn end_txn(&mut self, result: TxnResult) -> Result<()> {
        let request = EndTxnRequest {
            transactional_id: self.transactional_id.clone(),
            producer_id: self.producer_id,
            producer_epoch: i32::from(self.epoch),
            result: result as i32,
        };
        self.pending_end = Some(result);
        let response = self
            .coordinator_request(request, |mut c, r| async move { c.end_txn(r).await })
            .await;
        match response {
            Ok(r) => {
                self.pending_end = None;
                self.adopt(r.producer_id, r.producer_epoch)?;
                tracing::info!(txn_id = %self.transactional_id, pid = self.producer_id,
                    epoch = self.epoch, result = result.as_str_name(), "transaction ended");
                Ok(())
            }
            // Outcome unknown: keep `pending_end` so only the same decision is sent again.
            Err(e) if e.is_retriable() => Err(e),
            Err(e) => {
                self.pending_end = None;
                Err(e)
            }
        }
    }

    fn finish(&mut self) {
        self.pipeline.clear_failure();
        self.state = State::Ready;
        self.partitions.clear();
        self.groups.clear();
    }

    /// Commits the open transaction: EndTxn(COMMIT). On success the producer holds the bumped
    /// (PID, epoch) the coordinator returned and is ready for the next transaction.
    ///
    /// If the transaction hit an abortable error, that error is returned and nothing is sent:
    /// call [`TransactionalProducer::abort_transaction`].
    pub async fn commit_transaction(&mut self) -> Result<()> {
        self.check_not_fatal()?;
        if matches!(self.state, State::InTransaction) && self.pending_end.is_none() {
            // Every record of the transaction is acknowledged before EndTxn (Kafka's commit
            // flushes first); a failed batch makes the transaction abortable.
            self.pipeline.flush().await;
            self.sync_failure();
            self.check_not_fatal()?;
        }
        match &self.state {
            State::InTransaction => {}
            State::Abortable(e) => return Err(e.clone()),
            _ => return Err(Error::IllegalState("no transaction is open".into())),
        }
        if self.pending_end == Some(TxnResult::Abort) {
            return Err(Error::IllegalState(
                "an abort of this transaction is in flight; call abort_transaction again".into(),
            ));
        }
        if self.partitions.is_empty() && self.groups.is_empty() {
            // Nothing reached the coordinator: there is nothing to commit.
            self.finish();
            return Ok(());
        }
        match self.end_txn(TxnResult::Commit).await {
            Ok(()) => {
                self.finish();
                Ok(())
            }
            Err(e) if e.is_retriable() => Err(e),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Aborts the open transaction: EndTxn(ABORT), then, if the transaction failed with an error
    /// that leaves the leaders' sequence state in doubt, a KIP-360 epoch bump:
    /// InitProducerId(expected PID, epoch). PRODUCER_FENCED on either is fatal.
    pub async fn abort_transaction(&mut self) -> Result<()> {
        self.check_not_fatal()?;
        if self.in_transaction() && self.pending_end != Some(TxnResult::Commit) {
            // Records not sent yet fail; requests in flight are waited for, so that no Produce
            // of this transaction is still travelling when the abort is decided.
            self.sync_failure();
            self.pipeline.fail_all(Error::TransactionAborted(format!(
                "transaction of {} aborted",
                self.transactional_id
            )));
            self.pipeline.flush().await;
            self.check_not_fatal()?;
        }
        let mut bump = match &self.state {
            State::InTransaction => false,
            State::Abortable(e) => e.needs_epoch_bump(),
            _ => return Err(Error::IllegalState("no transaction is open".into())),
        };
        if self.pending_end == Some(TxnResult::Commit) {
            return Err(Error::IllegalState(
                "a commit of this transaction may have succeeded; call commit_transaction again, never abort".into(),
            ));
        }
        if !self.partitions.is_empty() || !self.groups.is_empty() {
            match self.end_txn(TxnResult::Abort).await {
                Ok(()) => {}
                Err(e) if e.is_fatal() => return Err(self.fail(e)),
                Err(e) if e.is_retriable() => return Err(e),
                // The coordinator no longer holds this transaction at our epoch (timed out,
                // lost its mapping...): recover through the KIP-360 bump below.
                Err(e) => {
                    tracing::info!(txn_id = %self.transactional_id, error = %e,
                        "abort not accepted; bumping the epoch instead");
                    bump = true;
                }
            }
        }
        if bump {
            let expected = (self.producer_id, self.epoch);
            self.init_producer_id(Some(expected)).await?;
            tracing::info!(txn_id = %self.transactional_id, pid = self.producer_id,
                epoch = self.epoch, "epoch bumped after an abortable error (KIP-360)");
        }
        self.finish();
        Ok(())
    }
}
