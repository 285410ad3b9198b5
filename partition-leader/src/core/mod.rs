//! The pure core of a partition leader: per-(partition, PID) producer state, the Produce checks of
//! PROTOCOL.md section 9 in their order, transaction markers, LSO bookkeeping and the
//! read_committed filter. No I/O, no clocks (time comes in as `now_ms`), no async: every
//! transition is a function of the state and the request.
//!
//! How a write flows through it: the shell calls [`validate_batch`] (bad input never reaches the
//! state), then [`PartitionState::check_produce`], which answers
//! - [`ProduceDecision::Duplicate`]: one of the PID's last [`PRODUCER_WINDOW`] batches again, so
//!   the original offset is returned and nothing is appended;
//! - [`ProduceDecision::NeedsVerification`]: a transactional batch would open a transaction on this
//!   partition, so the shell must first ask the owning coordinator (KIP-890 part 1) and call again
//!   with its [`Verified`] answer;
//! - [`ProduceDecision::Append`]: a [`Plan`], i.e. exactly what to persist (offsets, the PID's new
//!   state, an aborted-index entry). The shell writes the plan to the engine, THEN calls
//!   [`PartitionState::apply`], so the next write on the partition is planned against it while
//!   the flush is still to come (group commit: many writes, one flush).
//!
//! Two views of the log: the checks read the log END (everything written to the engine); readers
//! see only up to the [`Watermarks`] the shell [`PartitionState::publish`]es once a flush covered
//! the write. So no reader ever sees a record or an LSO that a crash could take back, and nothing
//! is acknowledged before that flush either (the shell's rule).
//!
//! Markers go the same way through [`PartitionState::plan_marker`]. Fetch asks for a
//! [`FetchView`] (HW, LSO, the aborted ranges that overlap the read) and filters entries with
//! [`FetchView::is_visible`].
//!
//! Fencing reads like a term check: after the duplicate check, an epoch below the stored one is
//! rejected before anything else looks at the batch.
//!
//! Choices where PROTOCOL.md is silent:
//! - A PID with no state here must start at sequence 0 over gRPC; anything else is
//!   UNKNOWN_PRODUCER_ID (the proto's definition of that code), because one client's concurrent
//!   gRPC requests may be handled in any order. Over Kafka's protocol (a connection's requests
//!   handled in order) it may start at any sequence, Kafka's own rule since KIP-360, which
//!   Kafka clients rely on after expiry (below): [`BatchHeader::any_first_sequence`].
//! - Expiry (Kafka's `producer.id.expiration.ms`): [`PartitionState::expired_producers`] names
//!   the PIDs with no transaction open here whose state has not changed for the expiration
//!   time; the shell forgets them ([`PartitionState::forget_producers`]). Fencing does not rest
//!   on that state alone: a transactional batch for a PID without state opens a transaction, so
//!   it is verified with the coordinator first, which refuses an old epoch (or an id it no longer
//!   knows); a continuing idempotent batch of a forgotten PID is UNKNOWN_PRODUCER_ID over gRPC
//!   and goes on over Kafka's protocol. What is lost is the duplicate window of an idle
//!   idempotent producer, as in Kafka.
//! - Plain producers (`producer_id == -1`) skip every check; their epoch and sequence are ignored.
//!   A transactional batch without a PID is INVALID_REQUEST.
//! - Transaction version 2: every marker carries an epoch above the transaction it ends. So a
//!   marker closes the PID's open transaction only when its epoch is ABOVE the stored epoch; a
//!   marker at the stored epoch is a late repeat of the marker that ended the previous
//!   transaction (which may already have been followed by a new transaction at that same epoch)
//!   and is acknowledged without appending anything. This is what makes markers idempotent.
//! - A marker when no transaction is open here (an unknown PID, or a partition the transaction
//!   was added to but never wrote to) appends no control record; it persists the PID's raised
//!   epoch (and coordinator generation) so a zombie is still rejected here afterwards.
//! - Transaction version 1 (Kafka clients without KIP-890 part 2): a marker at the stored epoch
//!   closes the open transaction, since the PID's transactions share the epoch. (Beyond Kafka)
//!   The transaction keeps the number its verification answered ([`Verified`]), and a version-1
//!   marker with a lower number is a late repeat of an earlier transaction's marker: it is
//!   acknowledged and closes nothing, so it cannot commit or abort the next transaction's data.
//! - A transactional batch with a higher epoch while an older transaction of the PID is still open
//!   here (its marker has not arrived) is CONCURRENT_TRANSACTIONS (retriable) rather than joining
//!   the old transaction.
//! - Record timestamps `< 0` are replaced by the leader's `now_ms` (Kafka's NO_TIMESTAMP).
//! - Batch size is the sum of key + value bytes plus [`RECORD_OVERHEAD_BYTES`] per record and
//!   [`HEADER_OVERHEAD_BYTES`] per header (so a flood of empty records or headers is bounded
//!   too); a record's size is its key + value bytes (headers' included).
//! - `unsafe_skip_epoch_check` (for demonstrating that the checker catches broken fencing) skips
//!   check 2 for Produce only: a batch with an older epoch is then appended as-is, without
//!   sequence checks and without touching the PID's state or opening a transaction, so it is
//!   visible to read_committed readers. Markers, and the coordinator's verification, still check.
//!
//! Rooms (one file per step of the protocol; each may read and change only what it names):
//! - [`batch`]: wire validation of a Produce batch ([`validate_batch`]); touches no state.
//! - `produce`: [`PartitionState::check_produce`], section 9's checks one function each:
//!   duplicate, epoch fence, sequence, transaction state. Reads the state, returns a [`Plan`].
//! - `marker`: [`PartitionState::plan_marker`]: wire validation of the marker, then the fencing
//!   decision (`check_marker_fence`, one small function), then the plan. Reads the state.
//! - `fetch`: [`PartitionState::fetch_view`] and [`FetchView::is_visible`]; read-only.
//! - this file: the types, restore, and [`PartitionState::apply`], the only place the state
//!   changes.
//!
//! CAVEATS: no log retention or compaction; no producer-state snapshots, the state is persisted
//! with every write instead; no per-PID coordinator id, only its generation.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use cluster::{ProducerEpoch, ProducerId};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod batch;
mod fetch;
mod marker;
mod produce;
#[cfg(test)]
mod tests;

pub use batch::{increment_sequence, validate_batch};

/// How many recent batches per PID are remembered for duplicate detection (Kafka's 5).
pub const PRODUCER_WINDOW: usize = 5;

/// Bytes charged per record on top of key and value when sizing a batch.
pub const RECORD_OVERHEAD_BYTES: usize = 16;

/// Bytes charged per record header on top of its key and value when sizing a batch (what the
/// log stores besides them: the key's length, the null flag, the value's length), so that a
/// flood of empty headers is bounded too.
pub const HEADER_OVERHEAD_BYTES: usize = 9;

/// The largest batch limit a leader may be configured with: whatever a batch under it
/// becomes in the log (its records, the producer state, the aborted index) stays far below the
/// largest frame the log reads back.
pub const MAX_BATCH_BYTES_LIMIT: usize = 64 * 1024 * 1024;

/// "No producer id": a plain, non-idempotent producer (the cluster-wide constant).
pub use cluster::NO_PRODUCER_ID;

/// "No coordinator generation yet" (no marker seen for the PID).
pub const NO_GENERATION: i64 = -1;

/// Size limits for Produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest batch (sum of record sizes plus per-record overhead).
    pub max_batch_bytes: usize,
    /// Largest record (key + value).
    pub max_record_bytes: usize,
}

/// A record header (Kafka's): a key and a value that may be null.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Header key.
    pub key: String,
    /// Header value; `None` is Kafka's null.
    pub value: Option<Vec<u8>>,
}

impl Header {
    /// Bytes it takes against the record size limit.
    pub fn size(&self) -> usize {
        self.key.len() + self.value.as_ref().map_or(0, Vec::len)
    }
}

/// A data record as a producer sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Record key (may be empty).
    pub key: Vec<u8>,
    /// Record value (may be empty).
    pub value: Vec<u8>,
    /// Kafka's null key (`key` is then empty): kept apart from an empty key.
    pub null_key: bool,
    /// Kafka's null value, a tombstone (`value` is then empty): kept apart from an empty value.
    pub null_value: bool,
    /// Producer timestamp; `< 0` means "none" and is replaced by the append time.
    pub timestamp_ms: i64,
    /// Headers, in order (Kafka clients' record headers; empty from our client).
    pub headers: Vec<Header>,
}

/// A Produce batch as received (already converted from the wire, not yet validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceBatch {
    /// PID, or `-1` for a plain producer.
    pub producer_id: i64,
    /// Wire epoch (int32).
    pub producer_epoch: i32,
    /// Sequence of the first record.
    pub base_sequence: i32,
    /// Whether the batch belongs to a transaction.
    pub is_transactional: bool,
    /// The transactional id (transactional batches only).
    pub transactional_id: String,
    /// The records.
    pub records: Vec<Record>,
}

/// The validated header of a batch: what the checks look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    /// PID, or [`NO_PRODUCER_ID`].
    pub producer_id: ProducerId,
    /// Epoch (`-1` for a plain producer).
    pub epoch: ProducerEpoch,
    /// First sequence (`-1` for a plain producer).
    pub first_seq: i32,
    /// Last sequence, wrapped at `i32::MAX` (`-1` for a plain producer).
    pub last_seq: i32,
    /// Number of records (at least 1).
    pub record_count: i64,
    /// Transactional batch.
    pub transactional: bool,
    /// Where a PID this partition has no state for (never seen, or forgotten by expiry) may
    /// start: at any sequence (set by the shell for Kafka's protocol, whose connections are
    /// handled one request at a time, in order: Kafka's own rule since KIP-360), or only at 0
    /// (`false`, the gRPC face: one client's concurrent requests may be handled in any order,
    /// so a new PID's later batch could otherwise land before its first).
    pub any_first_sequence: bool,
}

/// One remembered batch of a PID: its sequence range and where it landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMetadata {
    /// First sequence.
    pub first_seq: i32,
    /// Last sequence.
    pub last_seq: i32,
    /// Offset of its first record.
    pub base_offset: i64,
}

/// What a partition remembers about one PID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    /// The highest epoch seen (from a batch or a marker).
    pub epoch: ProducerEpoch,
    /// The last [`PRODUCER_WINDOW`] batches at `epoch`, oldest first.
    pub batches: VecDeque<BatchMetadata>,
    /// First offset of the PID's open transaction on this partition.
    pub txn_first_offset: Option<i64>,
    /// The open transaction's number among its transactional id's, as its verification
    /// answered ([`Verified`]; `None`: not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn_number: Option<u64>,
    /// The highest transaction number a version-1 marker here ended (or announced while
    /// nothing was open here): a Produce verified for that transaction or an earlier one is
    /// late, and must not open a transaction that no marker will close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_number: Option<u64>,
    /// Coordinator generation of the last marker, or [`NO_GENERATION`].
    pub coordinator_generation: i64,
    /// When the state last changed (`now_ms` of that request).
    pub last_update_ms: i64,
}

impl ProducerState {
    /// Last sequence written at the current epoch, if any.
    pub fn last_sequence(&self) -> Option<i32> {
        self.batches.back().map(|b| b.last_seq)
    }
}

/// A closed, aborted transaction: records of `producer_id` in `[first_offset, last_offset]` are
/// invisible to read_committed readers (`last_offset` is the ABORT marker's offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    /// The PID.
    pub producer_id: ProducerId,
    /// First offset of the transaction on this partition.
    pub first_offset: i64,
    /// Offset of its ABORT marker.
    pub last_offset: i64,
}

/// A data record in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataRecord {
    /// PID or `-1`.
    pub producer_id: ProducerId,
    /// Epoch or `-1`.
    pub producer_epoch: ProducerEpoch,
    /// Part of a transaction.
    pub is_transactional: bool,
    /// Key.
    pub key: Vec<u8>,
    /// Value.
    pub value: Vec<u8>,
    /// Kafka's null key (`key` is then empty).
    pub null_key: bool,
    /// Kafka's null value (`value` is then empty).
    pub null_value: bool,
    /// Timestamp (producer's, or append time).
    pub timestamp_ms: i64,
    /// Headers, in order.
    pub headers: Vec<Header>,
}

/// A COMMIT or ABORT marker in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlRecord {
    /// PID whose transaction it ends.
    pub producer_id: ProducerId,
    /// The (bumped) epoch the transaction ended with.
    pub producer_epoch: ProducerEpoch,
    /// COMMIT (true) or ABORT.
    pub commit: bool,
    /// The coordinator that wrote it.
    pub coordinator_id: i32,
    /// Its generation.
    pub coordinator_generation: i64,
    /// Append time.
    pub timestamp_ms: i64,
}

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEntry {
    /// A producer's record.
    Data(DataRecord),
    /// A transaction marker.
    Control(ControlRecord),
}

impl LogEntry {
    /// The PID the entry belongs to.
    pub fn producer_id(&self) -> ProducerId {
        match self {
            LogEntry::Data(d) => d.producer_id,
            LogEntry::Control(c) => c.producer_id,
        }
    }
}

/// Builds the log entries of a validated batch.
pub fn data_entries(header: &BatchHeader, records: Vec<Record>, now_ms: i64) -> Vec<LogEntry> {
    records
        .into_iter()
        .map(|r| {
            LogEntry::Data(DataRecord {
                producer_id: header.producer_id,
                producer_epoch: header.epoch,
                is_transactional: header.transactional,
                key: r.key,
                null_key: r.null_key,
                value: r.value,
                null_value: r.null_value,
                timestamp_ms: if r.timestamp_ms < 0 {
                    now_ms
                } else {
                    r.timestamp_ms
                },
                headers: r.headers,
            })
        })
        .collect()
}

/// A WriteTxnMarkers request for one partition (already converted from the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    /// PID.
    pub producer_id: i64,
    /// Wire epoch: the bumped epoch the transaction ended with (transaction version 2), or the
    /// epoch its data was written with (version 1, see [`Marker::keeps_epoch`]).
    pub producer_epoch: i32,
    /// COMMIT (true) or ABORT.
    pub commit: bool,
    /// Sending coordinator.
    pub coordinator_id: i32,
    /// Its generation.
    pub coordinator_generation: i64,
    /// The transaction's client transaction version (KIP-890): 1 = the marker carries the
    /// epoch the transaction's data was written with (Kafka clients without KIP-890 part 2);
    /// 0 or 2 = the bumped epoch.
    pub transaction_version: i32,
    /// The transaction's number among its transactional id's (0: not known).
    pub transaction_number: u64,
}

impl Marker {
    /// Version 1: a marker at the PID's current epoch ends the transaction open at that epoch.
    pub fn keeps_epoch(&self) -> bool {
        self.transaction_version == 1
    }
}

/// What a write must persist, computed from the state before the write. Apply it with
/// [`PartitionState::apply`] only after the engine holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Offset of the first appended entry (the high watermark before the write).
    pub base_offset: i64,
    /// Number of data records to append at `base_offset` (0 for a marker).
    pub record_count: i64,
    /// The control record to append at `base_offset` (markers only).
    pub control: Option<ControlRecord>,
    /// The PID's new state, if it changes.
    pub producer: Option<(ProducerId, ProducerState)>,
    /// A new entry for the aborted index.
    pub aborted: Option<AbortedTxn>,
    /// The high watermark after the write.
    pub high_watermark: i64,
}

impl Plan {
    /// Whether the plan changes nothing (a repeated marker).
    pub fn is_noop(&self) -> bool {
        self.record_count == 0
            && self.control.is_none()
            && self.producer.is_none()
            && self.aborted.is_none()
    }
}

/// The coordinator's yes to VerifyTransaction: the batch's (PID, epoch) may open a transaction
/// on the partition (KIP-890 part 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The number of that transaction among its transactional id's (0: not said).
    pub transaction_number: u64,
    /// Until when (milliseconds, the clock of `now_ms`) the answer may be used; the default
    /// never ends. The leader sets it to the instant it asked plus the producer-state expiry:
    /// what a marker taught this partition after the answer (the transaction's end,
    /// [`ProducerState::ended_number`]) lives in a producer state that expiry may forget after
    /// that long, and a batch held up past it must be verified again.
    pub valid_until_ms: i64,
}

impl Default for Verified {
    fn default() -> Self {
        Self {
            transaction_number: 0,
            valid_until_ms: i64::MAX,
        }
    }
}

impl Verified {
    /// The number as the producer state keeps it.
    fn number(self) -> Option<u64> {
        (self.transaction_number > 0).then_some(self.transaction_number)
    }
}

/// The answer to a Produce check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProduceDecision {
    /// A batch already written: answer with its original offset, append nothing.
    Duplicate {
        /// The original base offset.
        base_offset: i64,
    },
    /// Verify with the coordinator, then check again with its [`Verified`] answer.
    NeedsVerification,
    /// Persist this plan, then apply it.
    Append(Plan),
}

/// What a fetch may read: offsets below `upper`, minus what [`FetchView::is_visible`] filters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchView {
    /// High watermark at the time of the view.
    pub high_watermark: i64,
    /// Last stable offset at the time of the view.
    pub last_stable_offset: i64,
    /// Exclusive upper bound of the read (HW, or LSO for read_committed).
    pub upper: i64,
    /// Aborted transactions overlapping the read (read_committed only).
    pub aborted: Vec<AbortedTxn>,
    /// read_committed isolation.
    pub read_committed: bool,
}

impl FetchView {
    /// Whether the entry at `offset` is returned to the reader: never a control record; with
    /// read_committed, never a record inside an aborted transaction of its PID.
    pub fn is_visible(&self, offset: i64, entry: &LogEntry) -> bool {
        match entry {
            LogEntry::Control(_) => false,
            LogEntry::Data(d) => {
                offset < self.upper
                    && !(self.read_committed
                        && self.aborted.iter().any(|a| {
                            a.producer_id == d.producer_id
                                && a.first_offset <= offset
                                && offset <= a.last_offset
                        }))
            }
        }
    }
}

/// Where readers may read up to: a high watermark and a last stable offset of the log as it was
/// after some write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermarks {
    /// The next offset (read_uncommitted reads below it).
    pub high_watermark: i64,
    /// The smallest first offset of an open transaction, else the high watermark
    /// (read_committed reads below it).
    pub last_stable_offset: i64,
}

/// The state of one partition: high watermark, producer states, open transactions, aborted index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionState {
    unsafe_skip_epoch_check: bool,
    high_watermark: i64,
    /// What readers see: published after the flush covering a write ([`PartitionState::publish`]).
    visible: Watermarks,
    producers: BTreeMap<ProducerId, ProducerState>,
    /// `(first offset, PID)` of every open transaction: its minimum is the LSO.
    open_txns: BTreeSet<(i64, ProducerId)>,
    /// Aborted transactions keyed by `last_offset` (unique: the marker's offset).
    aborted: BTreeMap<i64, AbortedTxn>,
    /// The first offset readers may read (Kafka's log start offset): 0 until DeleteRecords
    /// moves it ([`PartitionState::delete_records_target`]).
    log_start_offset: i64,
}

impl PartitionState {
    /// An empty partition.
    pub fn new(unsafe_skip_epoch_check: bool) -> Self {
        Self {
            unsafe_skip_epoch_check,
            ..Self::default()
        }
    }

    /// Rebuilds the state from what storage loaded, checking that it is consistent.
    pub fn restore(
        unsafe_skip_epoch_check: bool,
        high_watermark: i64,
        producers: impl IntoIterator<Item = (ProducerId, ProducerState)>,
        aborted: impl IntoIterator<Item = AbortedTxn>,
    ) -> Result<Self> {
        let mut state = Self::new(unsafe_skip_epoch_check);
        if high_watermark < 0 {
            return Err(Error::Storage(format!(
                "stored high watermark {high_watermark} is negative"
            )));
        }
        state.high_watermark = high_watermark;
        for (pid, p) in producers {
            let beyond = p.txn_first_offset.is_some_and(|o| o >= high_watermark)
                || p.batches.iter().any(|b| b.base_offset >= high_watermark);
            if beyond {
                return Err(Error::Storage(format!(
                    "producer {pid} state points beyond the high watermark {high_watermark}"
                )));
            }
            if let Some(first) = p.txn_first_offset {
                state.open_txns.insert((first, pid));
            }
            state.producers.insert(pid, p);
        }
        for a in aborted {
            if a.last_offset >= high_watermark || a.first_offset > a.last_offset {
                return Err(Error::Storage(format!(
                    "aborted index entry {a:?} is invalid"
                )));
            }
            state.aborted.insert(a.last_offset, a);
        }
        // Everything loaded is on disk.
        state.visible = state.watermarks();
        Ok(state)
    }

    /// The log end's watermarks: what [`PartitionState::publish`] makes visible once the writes
    /// applied so far are durable.
    pub fn watermarks(&self) -> Watermarks {
        Watermarks {
            high_watermark: self.high_watermark,
            last_stable_offset: self.last_stable_offset(),
        }
    }

    /// What readers see ([`PartitionState::fetch_view`] reads up to it).
    pub fn visible(&self) -> Watermarks {
        self.visible
    }

    /// Makes the log visible up to `marks`, taken with [`PartitionState::watermarks`] after
    /// writes that are now durable. Never moves backwards (flushes complete in any order), and
    /// never past the log end (a reload may have replaced the state meanwhile).
    pub fn publish(&mut self, marks: Watermarks) {
        let end = self.watermarks();
        self.visible = Watermarks {
            high_watermark: marks
                .high_watermark
                .min(end.high_watermark)
                .max(self.visible.high_watermark),
            last_stable_offset: marks
                .last_stable_offset
                .min(end.last_stable_offset)
                .max(self.visible.last_stable_offset),
        };
    }

    /// Limits what readers see to `marks` (after a reload from the engine, which may hold
    /// writes that no flush has covered yet).
    pub fn limit_visible(&mut self, marks: Watermarks) {
        self.visible = Watermarks {
            high_watermark: self.visible.high_watermark.min(marks.high_watermark),
            last_stable_offset: self
                .visible
                .last_stable_offset
                .min(marks.last_stable_offset),
        };
    }

    /// The first offset readers may read (Kafka's log start offset).
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }

    /// DeleteRecords to `offset` (-1: the high watermark readers see): the new log start to
    /// make durable, `None` if the log already starts there or later (nothing to write), or
    /// OFFSET_OUT_OF_RANGE for an offset past that high watermark or below -1, as in Kafka. The
    /// log start never moves back, and producer states stay (a deleted record's producer is
    /// still fenced and deduplicated as before).
    pub fn delete_records_target(&self, offset: i64) -> Result<Option<i64>> {
        let high_watermark = self.visible.high_watermark;
        let target = match offset {
            -1 => high_watermark,
            o if (0..=high_watermark).contains(&o) => o,
            o => {
                return Err(Error::OffsetOutOfRange(format!(
                    "cannot delete records before offset {o}: it is outside [0, {high_watermark}] \
                     (-1 means the high watermark)"
                )))
            }
        };
        Ok((target > self.log_start_offset).then_some(target))
    }

    /// Moves the log start to `offset` (loaded, or made durable after
    /// [`PartitionState::delete_records_target`]); never backwards, never past the log end.
    pub fn set_log_start_offset(&mut self, offset: i64) {
        self.log_start_offset = self.log_start_offset.max(offset.min(self.high_watermark));
    }

    /// The next offset to be written.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// The smallest first offset of an open transaction, else the high watermark.
    pub fn last_stable_offset(&self) -> i64 {
        self.open_txns
            .first()
            .map(|(offset, _)| *offset)
            .unwrap_or(self.high_watermark)
    }

    /// Every PID's state, by PID.
    pub fn producers(&self) -> &BTreeMap<ProducerId, ProducerState> {
        &self.producers
    }

    /// One PID's state.
    pub fn producer(&self, pid: ProducerId) -> Option<&ProducerState> {
        self.producers.get(&pid)
    }

    /// The aborted index, in marker order.
    pub fn aborted_txns(&self) -> impl Iterator<Item = &AbortedTxn> {
        self.aborted.values()
    }

    /// The PIDs whose state may be forgotten at `now_ms` (Kafka's `producer.id.expiration.ms`):
    /// no transaction open on this partition, and no change for at least `expiration_ms`.
    pub fn expired_producers(&self, now_ms: i64, expiration_ms: i64) -> Vec<ProducerId> {
        self.producers
            .iter()
            .filter(|(_, p)| {
                p.txn_first_offset.is_none()
                    && now_ms.saturating_sub(p.last_update_ms) >= expiration_ms
            })
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Forgets the state of `pids`, as named by [`PartitionState::expired_producers`] on this
    /// same state; a PID with a transaction open here is kept whatever the caller asks (its
    /// records hold the LSO, and only its marker may release them).
    pub fn forget_producers(&mut self, pids: &[ProducerId]) {
        for pid in pids {
            if self
                .producers
                .get(pid)
                .is_some_and(|p| p.txn_first_offset.is_none())
            {
                self.producers.remove(pid);
            }
        }
    }

    /// Applies a durable plan computed by [`check_produce`](Self::check_produce) or
    /// [`plan_marker`](Self::plan_marker) against this same state.
    pub fn apply(&mut self, plan: &Plan) {
        debug_assert_eq!(plan.base_offset, self.high_watermark, "stale plan");
        if let Some((pid, next)) = &plan.producer {
            if let Some(first) = self.producers.get(pid).and_then(|p| p.txn_first_offset) {
                self.open_txns.remove(&(first, *pid));
            }
            if let Some(first) = next.txn_first_offset {
                self.open_txns.insert((first, *pid));
            }
            self.producers.insert(*pid, next.clone());
        }
        if let Some(a) = plan.aborted {
            self.aborted.insert(a.last_offset, a);
        }
        self.high_watermark = plan.high_watermark;
    }
}
