//! Produce in the shell: the proto batch becomes a [`ProduceBatch`], the core validates it, then
//! each round takes the write lock and asks the core for a [`ProduceDecision`]: a duplicate is
//! answered, a needed verification is done with the lock released (then the round runs again),
//! an append is made durable and applied. May touch: the partition's write lock and state, the
//! verifier, storage (through `persist`).

use proto::{
    ProducePartitionsRequest, ProducePartitionsResponse, ProduceRequest, ProduceResponse,
    RecordBatch,
};
use std::collections::BTreeMap;
use tokio::sync::OwnedMutexGuard;
use tracing::{debug, info};

use super::{now_ms, LeaderService, Partition};
use crate::core::{self, BatchHeader, Plan, ProduceBatch, ProduceDecision, Record};
use crate::error::{Error, Result};
use std::sync::Arc;

/// How many times one batch may be verified: a second answer is needed only when the first
/// outlived the producer-state expiry while the batch waited for its partition.
const MAX_VERIFICATIONS: u32 = 3;

/// What one round under the write lock decided.
enum Round {
    /// Answer the client.
    Done(ProduceResponse),
    /// Verify with the coordinator (the lock is already released), then run again.
    Verify,
}

impl LeaderService {
    /// ProducePartitions: every entry as its own Produce; one partition's entries in order,
    /// partitions at once (their writes share a group flush). Answers in request order.
    pub(crate) async fn produce_partitions_inner(
        &self,
        request: ProducePartitionsRequest,
    ) -> ProducePartitionsResponse {
        let count = request.partitions.len();
        let mut lanes: BTreeMap<(String, i32), Vec<(usize, ProduceRequest)>> = BTreeMap::new();
        for (i, entry) in request.partitions.into_iter().enumerate() {
            lanes
                .entry((entry.topic.clone(), entry.partition))
                .or_default()
                .push((i, entry));
        }
        let answered = futures::future::join_all(lanes.into_values().map(|lane| async move {
            let mut answers = Vec::with_capacity(lane.len());
            for (i, entry) in lane {
                answers.push((i, self.produce_answered(entry).await));
            }
            answers
        }))
        .await;
        let mut responses = vec![ProduceResponse::default(); count];
        for (i, response) in answered.into_iter().flatten() {
            responses[i] = response;
        }
        ProducePartitionsResponse { responses }
    }

    /// One Produce, its error as the wire answer, counted in the metrics.
    pub(crate) async fn produce_answered(&self, request: ProduceRequest) -> ProduceResponse {
        let pid = request
            .batch
            .as_ref()
            .map_or(cluster::NO_PRODUCER_ID, |b| b.producer_id);
        let response = self
            .produce_inner(request, false)
            .await
            .unwrap_or_else(|e| {
                let (error_code, error_message) = e.to_wire();
                debug!(error_message, "produce rejected");
                ProduceResponse {
                    error_code,
                    error_message,
                    base_offset: -1,
                    duplicate: false,
                    high_watermark: -1,
                }
            });
        self.inner
            .metrics
            .request("Produce", response.error_code, "", pid);
        response
    }

    /// One batch: section 9's checks and the durable write. `any_first_sequence`: a PID
    /// without state here may start at any sequence ([`BatchHeader::any_first_sequence`]: only
    /// for a face that handles a connection's requests one at a time, in order).
    pub(crate) async fn produce_inner(
        &self,
        request: ProduceRequest,
        any_first_sequence: bool,
    ) -> Result<ProduceResponse> {
        let part = self.partition(&request.topic, request.partition)?;
        let batch = batch_from_wire(
            request
                .batch
                .ok_or_else(|| Error::InvalidRequest("missing batch".into()))?,
        );
        let header = BatchHeader {
            any_first_sequence,
            ..core::validate_batch(&self.inner.limits, &batch)?
        };
        let mut records = Some(batch.records);
        let mut verified = None;
        let mut verifications = 0;
        loop {
            let round = match self
                .produce_round(
                    &part,
                    &header,
                    &batch.transactional_id,
                    verified,
                    &mut records,
                )
                .await
            {
                Err(Error::InvalidProducerEpoch(message))
                    if header.transactional && !batch.transactional_id.is_empty() =>
                {
                    return Err(self
                        .why_fenced(&batch.transactional_id, &header, &part.tp, message)
                        .await)
                }
                other => other?,
            };
            match round {
                Round::Done(response) => return Ok(response),
                // Asked again only when the answer outlived the producer-state expiry while
                // the batch waited (see `core::Verified::valid_until_ms`).
                Round::Verify if verifications == MAX_VERIFICATIONS => {
                    return Err(Error::Internal(format!(
                        "verification asked for {MAX_VERIFICATIONS} times"
                    )))
                }
                Round::Verify => {
                    verifications += 1;
                    let asked_ms = now_ms();
                    let answer = self
                        .inner
                        .verifier
                        .verify(
                            &batch.transactional_id,
                            header.producer_id,
                            header.epoch,
                            &part.tp,
                        )
                        .await?;
                    verified = Some(core::Verified {
                        valid_until_ms: asked_ms.saturating_add(self.producer_expiration_ms()),
                        ..answer
                    });
                }
            }
        }
    }

    /// A transactional batch below its PID's epoch here was fenced by a newer instance, or its
    /// transaction was aborted by the timeout (whose markers carry the bumped epoch). The
    /// coordinator knows which: a producer that timed out is told TRANSACTION_TIMED_OUT
    /// (abortable; it may abort and carry on), as the coordinator itself tells it (PROTOCOL.md
    /// section 8), not that another instance fenced it. Any other answer, or none, leaves
    /// INVALID_PRODUCER_EPOCH. Only the refusal's code depends on it: nothing is appended either
    /// way.
    async fn why_fenced(
        &self,
        transactional_id: &str,
        header: &BatchHeader,
        tp: &cluster::TopicPartition,
        message: String,
    ) -> Error {
        let answer = self
            .inner
            .verifier
            .verify(transactional_id, header.producer_id, header.epoch, tp)
            .await;
        match answer {
            Err(timed_out @ Error::TransactionTimedOut(_)) => timed_out,
            _ => Error::InvalidProducerEpoch(message),
        }
    }

    /// One check of the batch under the write lock, and what follows from it.
    async fn produce_round(
        &self,
        part: &Arc<Partition>,
        header: &BatchHeader,
        transactional_id: &str,
        verified: Option<core::Verified>,
        records: &mut Option<Vec<Record>>,
    ) -> Result<Round> {
        let guard = part.write_lock.clone().lock_owned().await;
        part.check_online()?;
        let now = now_ms();
        let decision = part.state().check_produce(header, verified, now);
        let decision = match decision {
            Err(e @ Error::InvalidProducerEpoch(_)) => {
                info!(partition = %part.tp, pid = header.producer_id, epoch = header.epoch,
                      cause = "older_epoch", "fenced a zombie producer: {e}");
                return Err(e);
            }
            other => other?,
        };
        match decision {
            ProduceDecision::Duplicate { base_offset } => {
                debug!(partition = %part.tp, pid = header.producer_id, base_offset,
                       "duplicate batch");
                // Answered once what it repeats is durable (it may still await its flush).
                let (high_watermark, marks) = {
                    let state = part.state();
                    (state.high_watermark(), state.watermarks())
                };
                let ticket = self.inner.flush.latest();
                drop(guard);
                self.settle(part, ticket, marks).await?;
                Ok(Round::Done(ProduceResponse {
                    base_offset,
                    duplicate: true,
                    high_watermark,
                    ..Default::default()
                }))
            }
            ProduceDecision::NeedsVerification => {
                drop(guard);
                Ok(Round::Verify)
            }
            ProduceDecision::Append(plan) => {
                let records = records.take().expect("appended once");
                let response = self
                    .append(guard, part, header, transactional_id, plan, records, now)
                    .await?;
                Ok(Round::Done(response))
            }
        }
    }

    /// Makes the batch durable and applied, then answers with its offsets.
    #[allow(clippy::too_many_arguments)] // one call site; the arguments are one round's context
    async fn append(
        &self,
        guard: OwnedMutexGuard<()>,
        part: &Arc<Partition>,
        header: &BatchHeader,
        transactional_id: &str,
        plan: Plan,
        records: Vec<Record>,
        now: i64,
    ) -> Result<ProduceResponse> {
        let entries = core::data_entries(header, records, now);
        let (base_offset, high_watermark) = (plan.base_offset, plan.high_watermark);
        if let Some((pid, p)) = &plan.producer {
            if p.txn_first_offset == Some(base_offset) {
                debug!(partition = %part.tp, pid, epoch = p.epoch, first_offset = base_offset,
                       txn_id = %transactional_id, "transaction opened");
            }
        }
        self.persist(guard, part.clone(), plan, entries).await?;
        debug!(partition = %part.tp, pid = header.producer_id, base_offset,
               records = header.record_count, "appended");
        Ok(ProduceResponse {
            base_offset,
            duplicate: false,
            high_watermark,
            ..Default::default()
        })
    }
}

/// The proto batch as the core's [`ProduceBatch`] (not yet validated).
fn batch_from_wire(batch: RecordBatch) -> ProduceBatch {
    ProduceBatch {
        producer_id: batch.producer_id,
        producer_epoch: batch.producer_epoch,
        base_sequence: batch.base_sequence,
        is_transactional: batch.is_transactional,
        transactional_id: batch.transactional_id,
        records: batch
            .records
            .into_iter()
            .map(|r| Record {
                // A null key or value carries no bytes.
                null_key: r.null_key && r.key.is_empty(),
                key: r.key,
                null_value: r.null_value && r.value.is_empty(),
                value: r.value,
                timestamp_ms: r.timestamp_ms,
                headers: r
                    .headers
                    .into_iter()
                    .map(|h| core::Header {
                        key: h.key,
                        value: h.value,
                    })
                    .collect(),
            })
            .collect(),
    }
}
