//! The partition leader's Kafka face: Produce, Fetch, ListOffsets, DescribeProducers,
//! DeleteRecords and the idempotent producer's InitProducerId, decoded with `kafka-protocol` and answered through the
//! same [`LeaderService`] functions and [`crate::core`] rules as the gRPC handlers.
//!
//! - **Produce** (v3-9): each partition's RecordBatch v2 (CRC checked by the decoder) becomes one
//!   `ProduceBatch` with its PID, epoch, base sequence, transactional flag and the request's
//!   `transactional_id` (which feeds the leader's KIP-890 verification), and goes through
//!   `LeaderService::produce_inner`: the same section-9 checks, the same durable write. Kafka
//!   requires exactly one batch per partition from v3 on; more is INVALID_RECORD. A control batch
//!   from a client is INVALID_RECORD. **acks**: `acks=-1` and `acks=1` are both answered once the
//!   write is durable (everything is, before any reply); `acks=0` is written the same way and, as
//!   Kafka's protocol says, answered with nothing. Any other value is INVALID_REQUIRED_ACKS.
//! - **Fetch** (v4-11): Kafka serves raw batches and lets the client filter, and so does this:
//!   read_uncommitted returns everything below the high watermark; read_committed everything below
//!   the LSO *including* aborted data and the COMMIT/ABORT control batches at their offsets, plus
//!   the aborted-transactions list `(pid, first offset)` for the range, exactly the inputs
//!   librdkafka, kafka-python and the Java client filter with. Batches are rebuilt from the stored
//!   records: one batch per run of records from the same (PID, epoch, transactional) producer, and
//!   one control batch per marker. Long poll: up to `max_wait_ms` (capped like gRPC's) until any
//!   requested partition has something to read. A fetch below the log start is
//!   OFFSET_OUT_OF_RANGE (the client resets, by its `auto.offset.reset`).
//! - **DeleteRecords** (v0-2): the partition's log start moves to the offset (-1: the high
//!   watermark readers see), durably, never backwards; past that high watermark is
//!   OFFSET_OUT_OF_RANGE. The answer is the low watermark. The records below stay on disk,
//!   unread; producer states stay, so a producer whose records were deleted is still fenced and
//!   deduplicated.
//! - **ListOffsets** (v1-7): earliest (-2) is the log start (0 unless DeleteRecords moved it),
//!   latest (-1) the high watermark,
//!   or the LSO for read_committed; a timestamp finds the first record at or after it, and
//!   max-timestamp (-3, KIP-734) the first record with the largest timestamp (both below that
//!   bound; a scan of the log, there is no time index).
//! - **DescribeProducers** (v0): the leader's producer state, as the gRPC call shows it.
//! - **InitProducerId** (v0-4) without a transactional id: forwarded over gRPC to a coordinator
//!   (any one hands out idempotent PIDs). With one: NOT_COORDINATOR (clients ask the
//!   transaction coordinator, which FindCoordinator names).
//!
//! Record headers are stored with the record and served back in order, a key repeated as often
//! as it was sent (the gRPC Fetch returns them too; the vendored `kafka-protocol` keeps them as
//! a list). A null key or value (a tombstone) is stored as null, apart from an empty one, and
//! comes back null.
//!
//! CAVEATS: the batch
//! boundaries, sequence numbers and timestamps type of what a client sent are not kept (Fetch
//! rebuilds batches, with `CreateTime`); lz4 and zstd batches are UNSUPPORTED_COMPRESSION_TYPE.
//! A gzip or snappy batch is inflated to at most twice the batch limit plus 1 MiB
//! ([`crate::decompress`]); beyond that it is MESSAGE_TOO_LARGE, before the exact limits apply.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_response::DeleteRecordsPartitionResult;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse as DescribePartition, ProducerState as DescribedProducer,
    TopicResponse as DescribeTopic,
};
use kafka_protocol::messages::fetch_response::{AbortedTransaction, PartitionData};
use kafka_protocol::messages::list_offsets_response::ListOffsetsPartitionResponse;
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, FetchRequest, FetchResponse,
    InitProducerIdRequest, InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse,
    ProduceRequest, ProduceResponse, ProducerId, RequestKind, ResponseKind,
};
use kafka_protocol::records::{
    Compression, Record as KafkaRecord, RecordBatchDecoder, RecordBatchEncoder,
    RecordEncodeOptions, TimestampType,
};
use kafka_wire::{codes, str_bytes, ApiRange, Handler, Request};
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use tracing::debug;

use crate::core::LogEntry;
use crate::decompress::DecompressError;
use crate::error::{Error, Result};
use crate::service::{blocking, LeaderService, Partition, MAX_FETCH_BYTES, MAX_WAIT_CAP};

/// Kafka's isolation level byte for read_committed.
const READ_COMMITTED: i8 = 1;

/// ListOffsets' special timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// KIP-734 (ListOffsets v7): the record with the largest timestamp.
const MAX_TIMESTAMP: i64 = -3;

/// What one ListOffsets query for a time looks for, fed the partition's entries in offset
/// order: the first record at or after `timestamp`, or for [`MAX_TIMESTAMP`] the first record
/// with the largest timestamp. `(-1, -1)`: none.
struct TimestampSearch {
    timestamp: i64,
    found: (i64, i64),
}

impl TimestampSearch {
    fn new(timestamp: i64) -> Self {
        Self {
            timestamp,
            found: (-1, -1),
        }
    }

    /// Takes entry `offset`; `false` once the answer is known.
    fn visit(&mut self, offset: i64, entry: &LogEntry) -> bool {
        let LogEntry::Data(d) = entry else {
            return true;
        };
        if self.timestamp == MAX_TIMESTAMP {
            if self.found.0 < 0 || d.timestamp_ms > self.found.1 {
                self.found = (offset, d.timestamp_ms);
            }
            return true;
        }
        if d.timestamp_ms >= self.timestamp {
            self.found = (offset, d.timestamp_ms);
            return false;
        }
        true
    }
}

/// The leader's [`Handler`].
pub struct KafkaLeader {
    service: LeaderService,
}

impl KafkaLeader {
    /// The Kafka face of `service`.
    pub fn new(service: LeaderService) -> Self {
        Self { service }
    }
}

/// The Kafka error code of a leader [`Error`] (through the one wire mapping).
fn error_code(e: &Error) -> i16 {
    codes::kafka_code(e.code())
}

impl Handler for KafkaLeader {
    fn apis(&self) -> Vec<ApiRange> {
        kafka_wire::apis::LEADER_APIS.to_vec()
    }

    fn broker_configs(&self) -> Vec<kafka_wire::configs::ConfigEntry> {
        self.service.broker_configs()
    }

    async fn handle(&self, request: Request) -> kafka_wire::Result<Option<ResponseKind>> {
        let version = request.version;
        Ok(match request.body {
            RequestKind::Produce(r) => self.produce(r).await.map(ResponseKind::Produce),
            RequestKind::Fetch(r) => Some(ResponseKind::Fetch(self.fetch(r).await)),
            RequestKind::ListOffsets(r) => Some(ResponseKind::ListOffsets(
                self.list_offsets(r, version).await,
            )),
            RequestKind::DescribeProducers(r) => {
                Some(ResponseKind::DescribeProducers(self.describe_producers(r)))
            }
            RequestKind::InitProducerId(r) => {
                Some(ResponseKind::InitProducerId(self.init_producer_id(r).await))
            }
            RequestKind::DeleteRecords(r) => {
                Some(ResponseKind::DeleteRecords(self.delete_records(r).await))
            }
            other => {
                return Err(kafka_wire::Error::Close(format!(
                    "{:?} is not served by a partition leader",
                    std::mem::discriminant(&other)
                )))
            }
        })
    }
}

/// One produced batch, decoded into the gRPC shape `produce_inner` takes.
///
/// Compressed records are inflated to at most `max_decompressed` bytes (MESSAGE_TOO_LARGE
/// beyond), so a small request can never make the leader allocate more than that.
fn decode_batch(
    topic: &str,
    partition: i32,
    transactional_id: Option<&str>,
    records: Option<Bytes>,
    max_decompressed: usize,
) -> std::result::Result<proto::ProduceRequest, (i16, String)> {
    let invalid = |m: String| (ResponseError::InvalidRecord.code(), m);
    let mut bytes = records.ok_or_else(|| invalid("no records".into()))?;
    let inflate = |records: &mut Bytes, compression| {
        crate::decompress::decompress(records, compression, max_decompressed)
            .map_err(anyhow::Error::from)
    };
    let set = RecordBatchDecoder::decode_with_custom_compression(&mut bytes, Some(inflate))
        .map_err(|e| {
            let code = match e.downcast_ref::<DecompressError>() {
                Some(DecompressError::Unsupported(_)) => ResponseError::UnsupportedCompressionType,
                Some(DecompressError::TooLarge(_)) => ResponseError::MessageTooLarge,
                _ => ResponseError::CorruptMessage,
            };
            (code.code(), e.to_string())
        })?;
    if !bytes.is_empty() {
        return Err(invalid(
            "more than one record batch; a produce request carries exactly one per partition"
                .into(),
        ));
    }
    if set.version != 2 {
        return Err(invalid(format!(
            "record batch v{} (only v2 is accepted)",
            set.version
        )));
    }
    let Some(first) = set.records.first() else {
        return Err(invalid("an empty record batch".into()));
    };
    if first.control {
        return Err(invalid("clients may not write control batches".into()));
    }
    let batch = proto::RecordBatch {
        producer_id: first.producer_id,
        producer_epoch: i32::from(first.producer_epoch),
        base_sequence: first.sequence,
        is_transactional: first.transactional,
        transactional_id: transactional_id.unwrap_or_default().to_string(),
        records: set
            .records
            .iter()
            .map(|r| proto::Record {
                key: r.key.as_ref().map(|k| k.to_vec()).unwrap_or_default(),
                null_key: r.key.is_none(),
                value: r.value.as_ref().map(|v| v.to_vec()).unwrap_or_default(),
                null_value: r.value.is_none(),
                timestamp_ms: r.timestamp,
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| proto::RecordHeader {
                        key: k.to_string(),
                        value: v.as_ref().map(|v| v.to_vec()),
                    })
                    .collect(),
            })
            .collect(),
    };
    Ok(proto::ProduceRequest {
        topic: topic.to_string(),
        partition,
        batch: Some(batch),
    })
}

impl KafkaLeader {
    async fn produce(&self, request: ProduceRequest) -> Option<ProduceResponse> {
        let acks = request.acks;
        let transactional_id = request.transactional_id.as_ref().map(|t| t.0.to_string());
        let mut jobs = Vec::new();
        for topic in &request.topic_data {
            let name = topic.name.0.to_string();
            for p in &topic.partition_data {
                let (name, index, records) = (name.clone(), p.index, p.records.clone());
                let transactional_id = transactional_id.clone();
                let service = self.service.clone();
                jobs.push(async move {
                    let result = if !matches!(acks, -1..=1) {
                        Err((
                            ResponseError::InvalidRequiredAcks.code(),
                            format!("acks={acks}; use -1, 1 or 0"),
                        ))
                    } else {
                        let decoded = decode_batch(
                            &name,
                            index,
                            transactional_id.as_deref(),
                            records,
                            service.max_decoded_bytes(),
                        );
                        match decoded {
                            Err(e) => Err(e),
                            // One request at a time per connection (kafka-wire): a PID
                            // without state may resume at any sequence, as in Kafka.
                            Ok(grpc) => match service.produce_inner(grpc, true).await {
                                Ok(r) => Ok(r.base_offset),
                                Err(e) => Err((error_code(&e), e.detail())),
                            },
                        }
                    };
                    let mut response = PartitionProduceResponse::default();
                    response.index = index;
                    response.log_start_offset = 0;
                    match result {
                        Ok(base_offset) => response.base_offset = base_offset,
                        Err((code, message)) => {
                            debug!(topic = %name, partition = index, code, "kafka produce rejected: {message}");
                            response.error_code = code;
                            response.base_offset = -1;
                            response.error_message = Some(str_bytes(message));
                        }
                    }
                    (name, response)
                });
            }
        }
        let results = futures::future::join_all(jobs).await;
        if acks == 0 {
            return None;
        }
        let mut response = ProduceResponse::default();
        for (name, partition) in results {
            push_topic(
                &mut response.responses,
                name,
                partition,
                |t| &mut t.name,
                |t| &mut t.partition_responses,
            );
        }
        Some(response)
    }

    async fn fetch(&self, request: FetchRequest) -> FetchResponse {
        let read_committed = request.isolation_level == READ_COMMITTED;
        let wait = Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_WAIT_CAP);
        let deadline = tokio::time::Instant::from_std(Instant::now() + wait);
        let mut total_left = (request.max_bytes.max(0) as usize).min(MAX_FETCH_BYTES);
        // Resolve every requested partition (errors answered per partition).
        let mut wanted = Vec::new();
        for topic in &request.topics {
            let name = topic.topic.0.to_string();
            for p in &topic.partitions {
                let part = self.service.partition(&name, p.partition);
                wanted.push((
                    name.clone(),
                    p.partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    part,
                ));
            }
        }
        // Long poll: until any partition has something at its offset, the deadline, or stop.
        let mut stopping = self.service.stopping();
        loop {
            let parts: Vec<&Arc<Partition>> =
                wanted.iter().filter_map(|w| w.4.as_ref().ok()).collect();
            let notified: Vec<_> = parts
                .iter()
                .map(|p| Box::pin(p.appended.notified()))
                .collect();
            let mut notified = notified;
            for n in &mut notified {
                n.as_mut().enable();
            }
            let ready = wanted.iter().any(|(_, _, offset, _, part)| match part {
                Err(_) => true,
                Ok(part) => part
                    .state()
                    .fetch_view(*offset, read_committed)
                    .map_or(true, |v| v.upper > *offset),
            });
            if ready
                || notified.is_empty()
                || tokio::time::Instant::now() >= deadline
                || *stopping.borrow()
            {
                break;
            }
            tokio::select! {
                _ = futures::future::select_all(notified) => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = stopping.changed() => {}
            }
        }
        let mut response = FetchResponse::default();
        response.session_id = 0;
        for (name, index, offset, partition_max, part) in wanted {
            let mut data = PartitionData::default();
            data.partition_index = index;
            let limit = (partition_max.max(0) as usize).min(total_left);
            match self
                .read_partition(part, offset, read_committed, limit)
                .await
            {
                Ok(read) => {
                    data.high_watermark = read.high_watermark;
                    data.last_stable_offset = read.last_stable_offset;
                    data.log_start_offset = read.log_start_offset;
                    data.aborted_transactions = read_committed.then(|| {
                        read.aborted
                            .iter()
                            .map(|(pid, first)| {
                                let mut a = AbortedTransaction::default();
                                a.producer_id = ProducerId(*pid);
                                a.first_offset = *first;
                                a
                            })
                            .collect()
                    });
                    total_left = total_left.saturating_sub(read.records.len());
                    data.records = Some(read.records);
                }
                Err(e) => {
                    data.error_code = error_code(&e);
                    data.high_watermark = -1;
                    data.records = Some(Bytes::new());
                }
            }
            push_topic(
                &mut response.responses,
                name,
                data,
                |t| &mut t.topic,
                |t| &mut t.partitions,
            );
        }
        response
    }

    /// Reads one partition from `offset` up to the HW (or LSO), at most about `limit` bytes
    /// (at least one batch when there is one).
    async fn read_partition(
        &self,
        part: Result<Arc<Partition>>,
        offset: i64,
        read_committed: bool,
        limit: usize,
    ) -> Result<RawRead> {
        let part = part?;
        let (view, log_start_offset) = {
            let state = part.state();
            (
                state.fetch_view(offset, read_committed)?,
                state.log_start_offset(),
            )
        };
        let storage = self.service.storage();
        let tp = part.tp.clone();
        let upper = view.upper;
        let (entries, end) = blocking(move || {
            let mut entries = Vec::new();
            let mut budget = SizeBudget::new(limit);
            let mut end = offset;
            storage.scan(&tp, offset, upper, &mut |o, entry| {
                if !budget.admit(o, &entry) {
                    return false;
                }
                entries.push((o, entry));
                end = o + 1;
                true
            })?;
            Ok((entries, end))
        })
        .await?;
        let records = encode_entries(&entries)?;
        let aborted = view
            .aborted
            .iter()
            .filter(|a| a.first_offset < end && a.last_offset >= offset)
            .map(|a| (a.producer_id, a.first_offset))
            .collect();
        Ok(RawRead {
            high_watermark: view.high_watermark,
            last_stable_offset: view.last_stable_offset,
            log_start_offset,
            aborted,
            records,
        })
    }

    async fn list_offsets(&self, request: ListOffsetsRequest, version: i16) -> ListOffsetsResponse {
        let read_committed = version >= 2 && request.isolation_level == READ_COMMITTED;
        let mut response = ListOffsetsResponse::default();
        for topic in &request.topics {
            let name = topic.name.0.to_string();
            for p in &topic.partitions {
                let mut out = ListOffsetsPartitionResponse::default();
                out.partition_index = p.partition_index;
                if version >= 4 {
                    out.leader_epoch = 0;
                }
                match self
                    .offset_for(&name, p.partition_index, p.timestamp, read_committed)
                    .await
                {
                    Ok((offset, timestamp)) => {
                        out.offset = offset;
                        out.timestamp = timestamp;
                    }
                    Err(e) => {
                        out.error_code = error_code(&e);
                        out.offset = -1;
                        out.timestamp = -1;
                    }
                }
                push_topic(
                    &mut response.topics,
                    name.clone(),
                    out,
                    |t| &mut t.name,
                    |t| &mut t.partitions,
                );
            }
        }
        response
    }

    /// (offset, timestamp) for one ListOffsets query.
    async fn offset_for(
        &self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        read_committed: bool,
    ) -> Result<(i64, i64)> {
        let part = self.service.partition(topic, partition)?;
        let (hw, lso, start) = {
            let state = part.state();
            let visible = state.visible();
            let start = state.log_start_offset();
            (visible.high_watermark, visible.last_stable_offset, start)
        };
        let upper = if read_committed { lso } else { hw };
        match timestamp {
            EARLIEST => Ok((start, -1)),
            LATEST => Ok((upper, -1)),
            t if t < 0 && t != MAX_TIMESTAMP => Err(Error::InvalidRequest(format!(
                "timestamp {t} is not supported (use -1, -2, -3 or a time)"
            ))),
            t => {
                let storage = self.service.storage();
                let tp = part.tp.clone();
                blocking(move || {
                    let mut search = TimestampSearch::new(t);
                    storage.scan(&tp, start, upper, &mut |o, entry| search.visit(o, &entry))?;
                    Ok(search.found)
                })
                .await
            }
        }
    }

    /// DeleteRecords: each partition's log start moved to its offset (-1: the high watermark),
    /// durably ([`LeaderService::delete_records`]); the low watermark, or the partition's error
    /// (OFFSET_OUT_OF_RANGE past the high watermark, NOT_LEADER_OR_FOLLOWER elsewhere).
    async fn delete_records(&self, request: DeleteRecordsRequest) -> DeleteRecordsResponse {
        let mut response = DeleteRecordsResponse::default();
        for topic in &request.topics {
            let name = topic.name.0.to_string();
            for p in &topic.partitions {
                let mut out = DeleteRecordsPartitionResult::default();
                out.partition_index = p.partition_index;
                match self
                    .service
                    .delete_records(&name, p.partition_index, p.offset)
                    .await
                {
                    Ok(low_watermark) => out.low_watermark = low_watermark,
                    Err(e) => {
                        out.low_watermark = -1;
                        out.error_code = error_code(&e);
                    }
                }
                push_topic(
                    &mut response.topics,
                    name.clone(),
                    out,
                    |t| &mut t.name,
                    |t| &mut t.partitions,
                );
            }
        }
        response
    }

    fn describe_producers(&self, request: DescribeProducersRequest) -> DescribeProducersResponse {
        let mut response = DescribeProducersResponse::default();
        for topic in &request.topics {
            let mut out = DescribeTopic::default();
            out.name = topic.name.clone();
            for &index in &topic.partition_indexes {
                let mut p = DescribePartition::default();
                p.partition_index = index;
                let grpc = proto::DescribeProducersRequest {
                    topic: topic.name.0.to_string(),
                    partition: index,
                };
                match self.service.describe_producers_inner(grpc) {
                    Ok(r) => {
                        p.active_producers = r
                            .producers
                            .into_iter()
                            .map(|s| {
                                let mut d = DescribedProducer::default();
                                d.producer_id = ProducerId(s.producer_id);
                                d.producer_epoch = s.producer_epoch;
                                d.last_sequence = s.last_sequence;
                                d.last_timestamp = s.last_timestamp_ms;
                                d.coordinator_epoch =
                                    s.coordinator_generation.clamp(-1, i32::MAX as i64) as i32;
                                d.current_txn_start_offset = s.current_txn_start_offset;
                                d
                            })
                            .collect();
                    }
                    Err(e) => {
                        p.error_code = error_code(&e);
                        p.error_message = Some(str_bytes(e.detail()));
                    }
                }
                out.partitions.push(p);
            }
            response.topics.push(out);
        }
        response
    }

    async fn init_producer_id(&self, request: InitProducerIdRequest) -> InitProducerIdResponse {
        let mut response = InitProducerIdResponse::default();
        response.producer_id = ProducerId(-1);
        response.producer_epoch = -1;
        if request.transactional_id.is_some() {
            response.error_code = ResponseError::NotCoordinator.code();
            return response;
        }
        let grpc = proto::InitProducerIdRequest {
            transactional_id: None,
            transaction_timeout_ms: request.transaction_timeout_ms,
            expected_producer_id: -1,
            expected_producer_epoch: -1,
            transaction_version: 1,
        };
        let mut last = ResponseError::CoordinatorNotAvailable.code();
        for coordinator in &self.service.topology().coordinators {
            let address = format!("http://{}", coordinator.address);
            let Ok(mut client) = TransactionCoordinatorClient::connect(address).await else {
                continue;
            };
            let call = client.init_producer_id(grpc.clone());
            match tokio::time::timeout(Duration::from_secs(5), call).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    last = codes::kafka_code_of(r.error_code);
                    if last == codes::NONE {
                        response.producer_id = ProducerId(r.producer_id);
                        response.producer_epoch = r.producer_epoch as i16;
                        return response;
                    }
                }
                _ => continue,
            }
        }
        response.error_code = last;
        response
    }
}

/// What one partition's read found.
struct RawRead {
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    /// (pid, first offset) of the aborted transactions in the range (read_committed).
    aborted: Vec<(i64, i64)>,
    records: Bytes,
}

/// The fixed part of a RecordBatch v2 (base offset to record count).
const BATCH_HEADER_BYTES: usize = 61;

/// What a read may still take of `max_bytes`: each entry is charged an upper bound of its
/// encoded size (varints at their widest, headers included, and a batch header when it starts a
/// batch of its own, as [`encode_entries`] groups them), so what is served never exceeds the
/// limit, except for a first entry larger than it (served alone, as Kafka serves a first batch
/// larger than `max_bytes` so that a consumer always progresses).
struct SizeBudget {
    left: usize,
    /// The last admitted entry: its offset and its batch key.
    last: Option<(i64, Option<BatchKey>)>,
}

impl SizeBudget {
    fn new(limit: usize) -> Self {
        Self {
            left: limit,
            last: None,
        }
    }

    /// Takes `entry` at `offset` if it fits (the first entry always does).
    fn admit(&mut self, offset: i64, entry: &LogEntry) -> bool {
        let key = batch_key(entry);
        let joins = key.is_some()
            && self
                .last
                .is_some_and(|(last, last_key)| last_key == key && last + 1 == offset);
        let size = record_size_bound(entry) + if joins { 0 } else { BATCH_HEADER_BYTES };
        if self.last.is_some() && size > self.left {
            return false;
        }
        self.left = self.left.saturating_sub(size);
        self.last = Some((offset, key));
        true
    }
}

/// The most bytes one record can take in a batch: length, attributes, timestamp and offset
/// deltas, key and value lengths and the header count as the widest varints, then its bytes.
fn record_size_bound(entry: &LogEntry) -> usize {
    const FIXED: usize = 5 + 1 + 10 + 5 + 5 + 5 + 5;
    match entry {
        LogEntry::Data(d) => {
            let headers: usize = d
                .headers
                .iter()
                .map(|h| 10 + h.key.len() + h.value.as_ref().map_or(0, Vec::len))
                .sum();
            FIXED + d.key.len() + d.value.len() + headers
        }
        // Key: version and type (4 bytes); value: version and coordinator epoch (6 bytes).
        LogEntry::Control(_) => FIXED + 4 + 6,
    }
}

/// Which data records share a batch: one (PID, epoch, transactional) producer's run of
/// consecutive offsets. A control record (no key) is a batch of its own.
type BatchKey = (i64, i16, bool);

fn batch_key(entry: &LogEntry) -> Option<BatchKey> {
    match entry {
        LogEntry::Data(d) => Some((d.producer_id, d.producer_epoch, d.is_transactional)),
        LogEntry::Control(_) => None,
    }
}

/// The Kafka record of a stored entry (sequence counts from the start of its run).
fn kafka_record(offset: i64, entry: &LogEntry, sequence: i32) -> KafkaRecord {
    let mut headers = Vec::new();
    let (pid, epoch, transactional, control, timestamp, key, value) = match entry {
        LogEntry::Data(d) => {
            for h in &d.headers {
                headers.push((
                    str_bytes(h.key.clone()),
                    h.value.as_ref().map(|v| Bytes::from(v.clone())),
                ));
            }
            (
                d.producer_id,
                d.producer_epoch,
                d.is_transactional,
                false,
                d.timestamp_ms,
                (!d.null_key).then(|| Bytes::from(d.key.clone())),
                (!d.null_value).then(|| Bytes::from(d.value.clone())),
            )
        }
        LogEntry::Control(c) => {
            // Kafka's control record: key (version 0, type 0 = ABORT / 1 = COMMIT), value
            // (version 0, coordinator epoch).
            let mut key = BytesMut::with_capacity(4);
            key.extend_from_slice(&0i16.to_be_bytes());
            key.extend_from_slice(&i16::from(c.commit).to_be_bytes());
            let mut value = BytesMut::with_capacity(6);
            value.extend_from_slice(&0i16.to_be_bytes());
            let coordinator_epoch = c.coordinator_generation.clamp(0, i32::MAX as i64) as i32;
            value.extend_from_slice(&coordinator_epoch.to_be_bytes());
            (
                c.producer_id,
                c.producer_epoch,
                true,
                true,
                c.timestamp_ms,
                Some(key.freeze()),
                Some(value.freeze()),
            )
        }
    };
    let mut record = KafkaRecord {
        transactional,
        control,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: pid,
        producer_epoch: epoch,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence,
        timestamp,
        key,
        value,
        headers: Default::default(),
    };
    record.headers.extend(headers);
    record
}

/// Encodes stored entries as RecordBatch v2: one batch per run of data records of one
/// (PID, epoch, transactional) producer, one batch per control record.
fn encode_entries(entries: &[(i64, LogEntry)]) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    let mut start = 0;
    while start < entries.len() {
        let run_key = batch_key(&entries[start].1);
        let mut end = start + 1;
        if run_key.is_some() {
            while end < entries.len()
                && batch_key(&entries[end].1) == run_key
                && entries[end].0 == entries[end - 1].0 + 1
            {
                end += 1;
            }
        }
        // Kafka's base sequence: -1 (no sequence) for a control batch and for records of no
        // producer; a producer's run counts from 0.
        let first_sequence = match run_key {
            Some((pid, _, _)) if pid >= 0 => 0,
            _ => -1,
        };
        let base = entries[start].0;
        let records: Vec<KafkaRecord> = entries[start..end]
            .iter()
            .map(|(o, e)| kafka_record(*o, e, first_sequence + (o - base) as i32))
            .collect();
        RecordBatchEncoder::encode(&mut buf, &records, &options)
            .map_err(|e| Error::Internal(format!("encoding a record batch: {e}")))?;
        start = end;
    }
    Ok(buf.freeze())
}

/// Appends `item` under topic `name` in a response's topic list (creating the topic entry).
fn push_topic<T: Default, I>(
    topics: &mut Vec<T>,
    name: String,
    item: I,
    name_of: impl Fn(&mut T) -> &mut kafka_protocol::messages::TopicName,
    items_of: impl Fn(&mut T) -> &mut Vec<I>,
) {
    for t in topics.iter_mut() {
        if name_of(t).0.as_str() == name {
            items_of(t).push(item);
            return;
        }
    }
    let mut t = T::default();
    *name_of(&mut t) = kafka_protocol::messages::TopicName(str_bytes(name));
    items_of(&mut t).push(item);
    topics.push(t);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{ControlRecord, DataRecord};

    fn data(pid: i64, epoch: i16, txn: bool, key: &str) -> LogEntry {
        LogEntry::Data(DataRecord {
            producer_id: pid,
            producer_epoch: epoch,
            is_transactional: txn,
            key: key.as_bytes().to_vec(),
            null_key: false,
            value: format!("v-{key}").into_bytes(),
            null_value: false,
            timestamp_ms: 1_700_000_000_000,
            headers: Vec::new(),
        })
    }

    #[test]
    fn a_timestamp_query_finds_the_first_record_at_or_after_it_or_the_largest() {
        let at = |ms| {
            let LogEntry::Data(mut d) = data(1, 0, false, "k") else {
                unreachable!()
            };
            d.timestamp_ms = ms;
            LogEntry::Data(d)
        };
        let marker = LogEntry::Control(ControlRecord {
            producer_id: 1,
            producer_epoch: 0,
            commit: true,
            coordinator_id: 1,
            coordinator_generation: 1,
            timestamp_ms: 999,
        });
        let log = [at(10), at(50), marker, at(30), at(50)];
        let search = |timestamp| {
            let mut s = TimestampSearch::new(timestamp);
            for (offset, entry) in log.iter().enumerate() {
                if !s.visit(offset as i64, entry) {
                    break;
                }
            }
            s.found
        };
        assert_eq!(search(20), (1, 50));
        assert_eq!(search(10), (0, 10));
        assert_eq!(search(51), (-1, -1), "markers are not records");
        assert_eq!(search(MAX_TIMESTAMP), (1, 50), "the first of the largest");
        let mut empty = TimestampSearch::new(MAX_TIMESTAMP);
        assert!(empty.visit(0, &log[2]));
        assert_eq!(empty.found, (-1, -1));
    }

    #[test]
    fn headers_are_served_back_in_order() {
        let LogEntry::Data(mut d) = data(1, 0, false, "k") else {
            unreachable!()
        };
        let header = |key: &str, value: Option<&[u8]>| crate::core::Header {
            key: key.into(),
            value: value.map(<[u8]>::to_vec),
        };
        d.headers = vec![
            header("b", Some(b"2")),
            header("a", None),
            header("b", Some(b"3")),
        ];
        let encoded = encode_entries(&[(0, LogEntry::Data(d.clone()))]).unwrap();
        let mut bytes = encoded.clone();
        let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        let headers: Vec<(String, Option<Bytes>)> = sets[0].records[0]
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        assert_eq!(
            headers,
            vec![
                ("b".into(), Some(Bytes::from_static(b"2"))),
                ("a".into(), None),
                ("b".into(), Some(Bytes::from_static(b"3"))),
            ]
        );
        // Produced with a repeated key: every header reaches the leader, in order.
        let grpc = decode_batch("t", 0, None, Some(encoded), LIMIT).unwrap();
        let produced: Vec<(String, Option<Vec<u8>>)> = grpc.batch.unwrap().records[0]
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        let stored: Vec<(String, Option<Vec<u8>>)> =
            d.headers.into_iter().map(|h| (h.key, h.value)).collect();
        assert_eq!(produced, stored);
    }

    #[test]
    fn stored_entries_encode_as_batches_clients_can_filter() {
        let entries = vec![
            (0, data(7, 0, true, "a")),
            (1, data(7, 0, true, "b")),
            (2, data(-1, -1, false, "plain")),
            (
                3,
                LogEntry::Control(ControlRecord {
                    producer_id: 7,
                    producer_epoch: 0,
                    commit: false,
                    coordinator_id: 1,
                    coordinator_generation: 3,
                    timestamp_ms: 1_700_000_000_001,
                }),
            ),
        ];
        let mut bytes = encode_entries(&entries).unwrap();
        let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        assert_eq!(
            sets.len(),
            3,
            "a run of pid 7, a plain record, a control batch"
        );
        let records: Vec<&KafkaRecord> = sets.iter().flat_map(|s| &s.records).collect();
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![0, 1, 2, 3]);
        assert!(records[0].transactional && !records[0].control);
        assert_eq!(records[1].key.as_deref(), Some(&b"b"[..]));
        assert_eq!(records[1].value.as_deref(), Some(&b"v-b"[..]));
        assert_eq!(records[2].producer_id, -1);
        assert!(records[3].control && records[3].transactional);
        assert_eq!(
            records[3].key.as_deref(),
            Some(&[0u8, 0, 0, 0][..]),
            "ABORT"
        );
        assert_eq!(records[3].value.as_deref(), Some(&[0u8, 0, 0, 0, 0, 3][..]));
        let sequences: Vec<i32> = records.iter().map(|r| r.sequence).collect();
        assert_eq!(
            sequences,
            vec![0, 1, -1, -1],
            "a producer's run counts from 0; no producer and a control batch carry -1, as Kafka's"
        );
    }

    /// What a read serves never exceeds its limit, whatever the records (headers, runs of one
    /// producer, markers, producer-less records), unless it is one entry larger than the limit.
    #[test]
    fn a_read_never_serves_more_than_its_limit_unless_one_entry_is_larger() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut served_some = 0;
        for _ in 0..2_000 {
            let mut entries = Vec::new();
            for offset in 0..next(40) as i64 {
                let entry = match next(6) {
                    0 => LogEntry::Control(ControlRecord {
                        producer_id: next(3) as i64,
                        producer_epoch: 0,
                        commit: true,
                        coordinator_id: 1,
                        coordinator_generation: 1,
                        timestamp_ms: 1_700_000_000_000,
                    }),
                    kind => {
                        let LogEntry::Data(mut d) = data(next(3) as i64 - 1, 0, kind % 2 == 0, "k")
                        else {
                            unreachable!()
                        };
                        d.key = vec![b'k'; next(300) as usize];
                        d.value = vec![b'v'; next(2_000) as usize];
                        d.timestamp_ms += next(1 << 40) as i64;
                        for h in 0..next(4) {
                            d.headers.push(crate::core::Header {
                                key: format!("h{h}").repeat(next(50) as usize),
                                value: (h % 2 == 0).then(|| vec![b'x'; next(500) as usize]),
                            });
                        }
                        LogEntry::Data(d)
                    }
                };
                entries.push((offset, entry));
            }
            let limit = next(20_000) as usize;
            let mut budget = SizeBudget::new(limit);
            let admitted: Vec<(i64, LogEntry)> = entries
                .iter()
                .take_while(|(o, e)| budget.admit(*o, e))
                .cloned()
                .collect();
            assert_eq!(
                admitted.is_empty(),
                entries.is_empty(),
                "a first entry always"
            );
            let size = encode_entries(&admitted).unwrap().len();
            assert!(
                size <= limit || admitted.len() == 1,
                "{} entries encode to {size} bytes over the limit {limit}",
                admitted.len()
            );
            if admitted.len() > 1 && admitted.len() < entries.len() {
                served_some += 1;
            }
        }
        assert!(
            served_some > 100,
            "the limit cut reads short: {served_some}"
        );
    }

    const LIMIT: usize = 1 << 20;

    /// One batch of `records`, encoded as a client would.
    fn encoded(records: &[KafkaRecord], compression: Compression) -> BytesMut {
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut buf, records, &options).unwrap();
        buf
    }

    /// Rewrites the batch's CRC-32C after a field was changed, as a forger would.
    fn reseal(batch: &mut BytesMut) {
        let crc = crc32c::crc32c(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    fn records(n: i64) -> Vec<KafkaRecord> {
        (0..n)
            .map(|i| {
                let mut r = kafka_record(i, &data(9, 2, false, &format!("k{i}")), i as i32);
                r.offset = i;
                r
            })
            .collect()
    }

    /// The error code of a batch `decode_batch` refuses, with its message.
    fn refused(batch: BytesMut) -> (i16, String) {
        decode_batch("t", 0, None, Some(batch.freeze()), LIMIT).unwrap_err()
    }

    #[test]
    fn forged_counts_and_deltas_are_corrupt_messages_not_aborts() {
        // A record count of i32::MAX (or negative) with a valid CRC: the decoder must not
        // reserve room for it (an allocation of hundreds of GB aborts the process).
        for count in [i32::MAX, -1] {
            let mut forged = encoded(&records(1), Compression::None);
            forged[57..61].copy_from_slice(&count.to_be_bytes());
            reseal(&mut forged);
            let (code, message) = refused(forged);
            assert_eq!(
                code,
                ResponseError::CorruptMessage.code(),
                "{count}: {message}"
            );
        }
        // A base timestamp of i64::MAX plus a record's delta of 1: an overflow, refused.
        let mut late = records(2);
        late[1].timestamp = late[0].timestamp + 1;
        let mut forged = encoded(&late, Compression::None);
        forged[27..35].copy_from_slice(&i64::MAX.to_be_bytes());
        reseal(&mut forged);
        let (code, message) = refused(forged);
        assert_eq!(code, ResponseError::CorruptMessage.code(), "{message}");
    }

    #[test]
    fn compressed_batches_decode_within_the_limit_and_bombs_do_not() {
        for compression in [Compression::Gzip, Compression::Snappy] {
            let batch = encoded(&records(3), compression);
            let grpc = decode_batch("t", 0, None, Some(batch.freeze()), LIMIT).unwrap();
            assert_eq!(grpc.batch.unwrap().records[2].key, b"k2", "{compression:?}");
        }
        // One record of 4 MiB of zeros: a few KiB on the wire, over the limit inflated.
        let mut big = records(1);
        big[0].value = Some(Bytes::from(vec![0u8; 4 << 20]));
        for compression in [Compression::Gzip, Compression::Snappy] {
            let bomb = encoded(&big, compression);
            assert!(
                bomb.len() < 256 << 10,
                "{compression:?}: {} bytes",
                bomb.len()
            );
            let (code, message) = refused(bomb);
            assert_eq!(
                code,
                ResponseError::MessageTooLarge.code(),
                "{compression:?}: {message}"
            );
        }
    }

    /// A null key and a null value (a tombstone) go through the leader as nulls, an empty key
    /// and value as empty ones: produced, stored and fetched, Kafka's distinction survives.
    #[test]
    fn null_and_empty_keys_and_values_survive_produce_and_fetch() {
        type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);
        let kinds: [KeyValue<'_>; 4] = [
            (None, None),
            (Some(b""), Some(b"")),
            (Some(b"k"), None),
            (None, Some(b"v")),
        ];
        let sent: Vec<KafkaRecord> = kinds
            .iter()
            .enumerate()
            .map(|(i, (key, value))| {
                let mut r = kafka_record(i as i64, &data(9, 2, false, "x"), i as i32);
                r.offset = i as i64;
                r.key = key.map(Bytes::copy_from_slice);
                r.value = value.map(Bytes::copy_from_slice);
                r
            })
            .collect();
        let batch = encoded(&sent, Compression::None);
        let grpc = decode_batch("t", 0, None, Some(batch.freeze()), LIMIT).unwrap();
        let records = grpc.batch.unwrap().records;
        let flags: Vec<(bool, bool)> = records.iter().map(|r| (r.null_key, r.null_value)).collect();
        assert_eq!(
            flags,
            [(true, true), (false, false), (false, true), (true, false)]
        );
        // Stored as the core keeps them, then encoded for a Fetch: the same nulls come back.
        for (i, (r, (key, value))) in records.into_iter().zip(kinds).enumerate() {
            let entry = LogEntry::Data(DataRecord {
                producer_id: 9,
                producer_epoch: 2,
                is_transactional: false,
                key: r.key,
                null_key: r.null_key,
                value: r.value,
                null_value: r.null_value,
                timestamp_ms: 1,
                headers: Vec::new(),
            });
            let fetched = kafka_record(i as i64, &entry, 0);
            assert_eq!(fetched.key.as_deref(), key, "record {i}");
            assert_eq!(fetched.value.as_deref(), value, "record {i}");
        }
    }

    #[test]
    fn produce_batches_decode_into_the_grpc_shape_or_a_kafka_error() {
        let records: Vec<KafkaRecord> = (0..3)
            .map(|i| {
                let mut r = kafka_record(i, &data(9, 2, true, &format!("k{i}")), 5 + i as i32);
                r.offset = i;
                r.headers.push((str_bytes("h"), None));
                r
            })
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        let grpc = decode_batch("t", 1, Some("txn"), Some(buf.clone().freeze()), LIMIT).unwrap();
        assert_eq!(grpc.batch.as_ref().unwrap().records[0].headers.len(), 1);
        assert_eq!(
            grpc.batch.as_ref().unwrap().records[0].headers[0],
            proto::RecordHeader {
                key: "h".into(),
                value: None
            }
        );
        let batch = grpc.batch.unwrap();
        assert_eq!(
            (batch.producer_id, batch.producer_epoch, batch.base_sequence),
            (9, 2, 5)
        );
        assert!(batch.is_transactional);
        assert_eq!(batch.transactional_id, "txn");
        assert_eq!(batch.records.len(), 3);
        assert_eq!(batch.records[2].key, b"k2");

        // Two batches in one partition: INVALID_RECORD. A flipped byte: the CRC catches it.
        let mut two = buf.clone();
        two.extend_from_slice(&buf);
        let (code, _) = decode_batch("t", 1, None, Some(two.freeze()), LIMIT).unwrap_err();
        assert_eq!(code, ResponseError::InvalidRecord.code());
        let mut corrupt = buf.clone();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        let (code, _) = decode_batch("t", 1, None, Some(corrupt.freeze()), LIMIT).unwrap_err();
        assert_eq!(code, ResponseError::CorruptMessage.code());
        let (code, _) = decode_batch("t", 1, None, None, LIMIT).unwrap_err();
        assert_eq!(code, ResponseError::InvalidRecord.code());
    }
}
