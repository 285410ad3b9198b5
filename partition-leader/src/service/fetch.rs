//! Fetch in the shell, in three steps: [`FetchParams::from_wire`] checks the request;
//! `wait_for_view` long-polls until the core's [`FetchView`] has something to read (or the wait
//! ends, or the leader shuts down); `read_visible` scans storage for the visible records up to
//! `max_bytes`. May touch: the partition's state (read-only, never across an `.await`), its
//! `appended` notifier, storage (read-only).

use std::time::{Duration, Instant};

use proto::{FetchRequest, FetchResponse, FetchedRecord, IsolationLevel};
use tracing::debug;

use super::{blocking, LeaderService, Partition, MAX_FETCH_BYTES, MAX_WAIT_CAP};
use crate::core::{self, FetchView, LogEntry};
use crate::error::{Error, Result};
use crate::storage::Storage;
use cluster::TopicPartition;
use std::sync::Arc;

/// A checked Fetch request.
struct FetchParams {
    offset: i64,
    read_committed: bool,
    max_bytes: usize,
    wait: Duration,
}

impl FetchParams {
    /// INVALID_REQUEST for an unknown isolation level or a negative size or wait; clamps the
    /// size to [`MAX_FETCH_BYTES`] and the wait to [`MAX_WAIT_CAP`].
    fn from_wire(request: &FetchRequest) -> Result<Self> {
        let read_committed = match IsolationLevel::try_from(request.isolation_level) {
            Ok(IsolationLevel::ReadCommitted) => true,
            Ok(IsolationLevel::ReadUncommitted) => false,
            Err(_) => {
                return Err(Error::InvalidRequest(format!(
                    "unknown isolation level {}",
                    request.isolation_level
                )))
            }
        };
        if request.max_bytes < 0 || request.max_wait_ms < 0 {
            return Err(Error::InvalidRequest(
                "max_bytes and max_wait_ms must not be negative".into(),
            ));
        }
        Ok(Self {
            offset: request.offset,
            read_committed,
            max_bytes: (request.max_bytes as usize).min(MAX_FETCH_BYTES),
            wait: Duration::from_millis(request.max_wait_ms as u64).min(MAX_WAIT_CAP),
        })
    }
}

impl LeaderService {
    pub(super) async fn fetch_inner(&self, request: FetchRequest) -> Result<FetchResponse> {
        let part = self.partition(&request.topic, request.partition)?;
        let mut params = FetchParams::from_wire(&request)?;
        // Our own protocol starts a read below the log start (records deleted by
        // DeleteRecords) at the log start: the records carry their offsets. The Kafka face
        // answers OFFSET_OUT_OF_RANGE there, as Kafka does.
        let log_start = part.state().log_start_offset();
        if (0..log_start).contains(&params.offset) {
            params.offset = log_start;
        }
        let view = self.wait_for_view(&part, &params).await?;
        let (high_watermark, last_stable_offset) = (view.high_watermark, view.last_stable_offset);
        let storage = self.inner.storage.clone();
        let tp = part.tp.clone();
        let (from, max_bytes) = (params.offset, params.max_bytes);
        let (records, next_offset) =
            blocking(move || read_visible(&*storage, &tp, &view, from, max_bytes)).await?;
        debug!(partition = %part.tp, offset = from, returned = records.len(), next_offset,
               read_committed = params.read_committed, "fetch");
        Ok(FetchResponse {
            high_watermark,
            last_stable_offset,
            records,
            next_offset,
            ..Default::default()
        })
    }

    /// Long poll: the view once it reaches past the fetch offset, or when the wait is over or
    /// the leader shuts down.
    async fn wait_for_view(&self, part: &Arc<Partition>, p: &FetchParams) -> Result<FetchView> {
        let deadline = tokio::time::Instant::from_std(Instant::now() + p.wait);
        let mut shutdown = self.inner.shutdown.clone();
        loop {
            let notified = part.appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let view = part.state().fetch_view(p.offset, p.read_committed)?;
            if view.upper > p.offset
                || tokio::time::Instant::now() >= deadline
                || *shutdown.borrow()
            {
                return Ok(view);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        return part.state().fetch_view(p.offset, p.read_committed);
                    }
                }
            }
        }
    }
}

/// The visible records from `from` up to the view's bound, at least one when any is visible,
/// then no more than `max_bytes`; and the offset the next fetch starts at. Blocking I/O.
fn read_visible(
    storage: &dyn Storage,
    tp: &TopicPartition,
    view: &FetchView,
    from: i64,
    max_bytes: usize,
) -> Result<(Vec<FetchedRecord>, i64)> {
    let mut records = Vec::new();
    let mut bytes = 0usize;
    let mut next_offset = view.upper.max(from);
    storage.scan(tp, from, view.upper, &mut |offset, entry| {
        if view.is_visible(offset, &entry) {
            let LogEntry::Data(d) = entry else {
                unreachable!("control records are never visible")
            };
            let size = d.key.len() + d.value.len() + core::RECORD_OVERHEAD_BYTES;
            if !records.is_empty() && bytes + size > max_bytes {
                next_offset = offset;
                return false;
            }
            bytes += size;
            records.push(FetchedRecord {
                offset,
                key: d.key,
                value: d.value,
                null_key: d.null_key,
                null_value: d.null_value,
                timestamp_ms: d.timestamp_ms,
                producer_id: d.producer_id,
                producer_epoch: d.producer_epoch as i32,
                is_transactional: d.is_transactional,
                headers: d
                    .headers
                    .into_iter()
                    .map(|h| proto::RecordHeader {
                        key: h.key,
                        value: h.value,
                    })
                    .collect(),
            });
        }
        true
    })?;
    Ok((records, next_offset))
}
