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
//!   with `verified = true`;
//! - [`ProduceDecision::Append`]: a [`Plan`], i.e. exactly what to persist (offsets, the PID's new
//!   state, an aborted-index entry). The shell makes the plan durable, THEN calls
//!   [`PartitionState::apply`]. Nothing in memory changes before the write is durable, so a failed
//!   flush leaves the state as it was.
//!
//! Markers go the same way through [`PartitionState::plan_marker`]. Fetch asks for a
//! [`FetchView`] (HW, LSO, the aborted ranges that overlap the read) and filters entries with
//! [`FetchView::is_visible`].
//!
//! Fencing reads like a term check: after the duplicate check, an epoch below the stored one is
//! rejected before anything else looks at the batch.
//!
//! Choices where PROTOCOL.md is silent:
//! - A PID with no state here must start at sequence 0; anything else is UNKNOWN_PRODUCER_ID (the
//!   proto's definition of that code). There is no log retention, so state is never lost and
//!   Kafka's "accept any sequence from an unknown producer" leniency is not needed.
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
//! - A transactional batch with a higher epoch while an older transaction of the PID is still open
//!   here (its marker has not arrived) is CONCURRENT_TRANSACTIONS (retriable) rather than joining
//!   the old transaction.
//! - Record timestamps `< 0` are replaced by the leader's `now_ms` (Kafka's NO_TIMESTAMP).
//! - Batch size is the sum of key + value bytes plus [`RECORD_OVERHEAD_BYTES`] per record (so a
//!   flood of empty records is bounded too); a record's size is its key + value bytes.
//! - `unsafe_skip_epoch_check` (for demonstrating that the checker catches broken fencing) skips
//!   check 2 for Produce only: a batch with an older epoch is then appended as-is, without
//!   sequence checks and without touching the PID's state or opening a transaction, so it is
//!   visible to read_committed readers. Markers, and the coordinator's verification, still check.
//!
//! CAVEATS: no log retention or compaction, so producer state never expires (Kafka expires it
//! after `transactional.id.expiration.ms`); no producer-state snapshots, the state is persisted
//! with every write instead; no per-PID coordinator id, only its generation.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use cluster::{ProducerEpoch, ProducerId};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How many recent batches per PID are remembered for duplicate detection (Kafka's 5).
pub const PRODUCER_WINDOW: usize = 5;

/// Bytes charged per record on top of key and value when sizing a batch.
pub const RECORD_OVERHEAD_BYTES: usize = 16;

/// "No producer id": a plain, non-idempotent producer.
pub const NO_PRODUCER_ID: ProducerId = -1;

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
}

/// `sequence + increment`, wrapping from `i32::MAX` to 0 (Kafka's `incrementSequence`).
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

/// Rejects malformed or oversized batches before they reach any state.
pub fn validate_batch(limits: &Limits, batch: &ProduceBatch) -> Result<BatchHeader> {
    if batch.records.is_empty() {
        return Err(Error::InvalidRequest(
            "a batch needs at least one record".into(),
        ));
    }
    let count = batch.records.len();
    if count > i32::MAX as usize {
        return Err(Error::InvalidRequest(format!(
            "{count} records in one batch"
        )));
    }
    let mut batch_bytes = 0usize;
    for (i, r) in batch.records.iter().enumerate() {
        let size = r.key.len() + r.value.len() + r.headers.iter().map(Header::size).sum::<usize>();
        if size > limits.max_record_bytes {
            return Err(Error::MessageTooLarge(format!(
                "record {i} is {size} bytes, the limit is {}",
                limits.max_record_bytes
            )));
        }
        batch_bytes += size + RECORD_OVERHEAD_BYTES;
    }
    if batch_bytes > limits.max_batch_bytes {
        return Err(Error::MessageTooLarge(format!(
            "batch is {batch_bytes} bytes, the limit is {}",
            limits.max_batch_bytes
        )));
    }
    let record_count = count as i64;
    if batch.producer_id == NO_PRODUCER_ID {
        if batch.is_transactional {
            return Err(Error::InvalidRequest(
                "a transactional batch needs a producer id".into(),
            ));
        }
        return Ok(BatchHeader {
            producer_id: NO_PRODUCER_ID,
            epoch: -1,
            first_seq: -1,
            last_seq: -1,
            record_count,
            transactional: false,
        });
    }
    if batch.producer_id < 0 {
        return Err(Error::InvalidRequest(format!(
            "producer id {} is negative",
            batch.producer_id
        )));
    }
    let epoch = cluster::epoch_from_wire(batch.producer_epoch, false).ok_or_else(|| {
        Error::InvalidRequest(format!(
            "producer epoch {} is outside [0, {}]",
            batch.producer_epoch,
            i16::MAX
        ))
    })?;
    if batch.base_sequence < 0 {
        return Err(Error::InvalidRequest(format!(
            "base sequence {} is negative",
            batch.base_sequence
        )));
    }
    if batch.is_transactional
        && (batch.transactional_id.is_empty() || batch.transactional_id.len() > cluster::MAX_ID_LEN)
    {
        return Err(Error::InvalidRequest(format!(
            "a transactional batch needs a transactional id of 1..={} bytes",
            cluster::MAX_ID_LEN
        )));
    }
    Ok(BatchHeader {
        producer_id: batch.producer_id,
        epoch,
        first_seq: batch.base_sequence,
        last_seq: increment_sequence(batch.base_sequence, (count - 1) as i32),
        record_count,
        transactional: batch.is_transactional,
    })
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
                value: r.value,
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
}

impl Marker {
    /// Version 1: a marker at the PID's current epoch ends the transaction open at that epoch.
    pub fn keeps_epoch(&self) -> bool {
        self.transaction_version == 1
    }
}

/// What a write must persist, computed from the state before the write. Apply it with
/// [`PartitionState::apply`] only after it is durable.
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

/// The answer to a Produce check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProduceDecision {
    /// A batch already written: answer with its original offset, append nothing.
    Duplicate {
        /// The original base offset.
        base_offset: i64,
    },
    /// Verify with the coordinator, then check again with `verified = true`.
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

/// The state of one partition: high watermark, producer states, open transactions, aborted index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionState {
    unsafe_skip_epoch_check: bool,
    high_watermark: i64,
    producers: BTreeMap<ProducerId, ProducerState>,
    /// `(first offset, PID)` of every open transaction: its minimum is the LSO.
    open_txns: BTreeSet<(i64, ProducerId)>,
    /// Aborted transactions keyed by `last_offset` (unique: the marker's offset).
    aborted: BTreeMap<i64, AbortedTxn>,
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
        Ok(state)
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

    /// The Produce checks of PROTOCOL.md section 9, in order. `verified` says the coordinator
    /// already confirmed that this batch's (PID, epoch) may open a transaction here.
    pub fn check_produce(
        &self,
        h: &BatchHeader,
        verified: bool,
        now_ms: i64,
    ) -> Result<ProduceDecision> {
        let base_offset = self.high_watermark;
        let append = |producer: Option<ProducerState>| {
            ProduceDecision::Append(Plan {
                base_offset,
                record_count: h.record_count,
                control: None,
                producer: producer.map(|p| (h.producer_id, p)),
                aborted: None,
                high_watermark: base_offset + h.record_count,
            })
        };
        let this_batch = BatchMetadata {
            first_seq: h.first_seq,
            last_seq: h.last_seq,
            base_offset,
        };
        if h.producer_id == NO_PRODUCER_ID {
            return Ok(append(None));
        }
        let pid = h.producer_id;
        let Some(state) = self.producers.get(&pid) else {
            // A PID this partition has never seen.
            if h.first_seq != 0 {
                return Err(Error::UnknownProducerId(format!(
                    "no state for producer {pid} and its batch starts at sequence {} (not 0)",
                    h.first_seq
                )));
            }
            if h.transactional && !verified {
                return Ok(ProduceDecision::NeedsVerification);
            }
            return Ok(append(Some(ProducerState {
                epoch: h.epoch,
                batches: VecDeque::from([this_batch]),
                txn_first_offset: h.transactional.then_some(base_offset),
                coordinator_generation: NO_GENERATION,
                last_update_ms: now_ms,
            })));
        };

        // 1. Exactly one of the last batches again: answer with the original offset.
        if h.epoch == state.epoch {
            if let Some(b) = state
                .batches
                .iter()
                .find(|b| b.first_seq == h.first_seq && b.last_seq == h.last_seq)
            {
                return Ok(ProduceDecision::Duplicate {
                    base_offset: b.base_offset,
                });
            }
        }

        // 2. Fencing: an older epoch is a zombie.
        if h.epoch < state.epoch {
            if self.unsafe_skip_epoch_check {
                // DANGER: broken fencing on purpose (see the module docs).
                return Ok(append(None));
            }
            return Err(Error::InvalidProducerEpoch(format!(
                "producer {pid} epoch {} is older than the current epoch {}",
                h.epoch, state.epoch
            )));
        }

        // 3. Sequence.
        let new_epoch = h.epoch > state.epoch;
        let expected = if new_epoch {
            0
        } else {
            state
                .last_sequence()
                .map(|s| increment_sequence(s, 1))
                .unwrap_or(0)
        };
        if h.first_seq != expected {
            return Err(Error::OutOfOrderSequenceNumber(format!(
                "producer {pid} epoch {}: expected sequence {expected}, got {}{}",
                h.epoch,
                h.first_seq,
                if new_epoch {
                    " (a new epoch must start at 0)"
                } else {
                    ""
                }
            )));
        }

        // 4 and 5. Transactions.
        match (h.transactional, state.txn_first_offset) {
            (true, None) if !verified => return Ok(ProduceDecision::NeedsVerification),
            (true, Some(first)) if new_epoch => {
                return Err(Error::ConcurrentTransactions(format!(
                    "producer {pid}: the transaction at epoch {} opened at offset {first} has not \
                     received its marker yet",
                    state.epoch
                )));
            }
            (false, Some(first)) => {
                return Err(Error::InvalidTxnState(format!(
                    "producer {pid} sent a non-transactional batch while its transaction opened \
                     at offset {first} is open"
                )));
            }
            _ => {}
        }

        let mut next = state.clone();
        if new_epoch {
            next.epoch = h.epoch;
            next.batches.clear();
        }
        next.batches.push_back(this_batch);
        while next.batches.len() > PRODUCER_WINDOW {
            next.batches.pop_front();
        }
        if h.transactional && next.txn_first_offset.is_none() {
            next.txn_first_offset = Some(base_offset);
        }
        next.last_update_ms = now_ms;
        Ok(append(Some(next)))
    }

    /// The marker rules of PROTOCOL.md section 9: older epoch -> INVALID_PRODUCER_EPOCH, older
    /// coordinator generation -> TRANSACTION_COORDINATOR_FENCED, else close the open transaction
    /// with a control record, adopt the epoch and reset the sequence window.
    pub fn plan_marker(&self, m: &Marker, now_ms: i64) -> Result<Plan> {
        if m.producer_id < 0 {
            return Err(Error::InvalidRequest(format!(
                "marker producer id {} is negative",
                m.producer_id
            )));
        }
        let epoch = cluster::epoch_from_wire(m.producer_epoch, false).ok_or_else(|| {
            Error::InvalidRequest(format!(
                "marker epoch {} is outside [0, {}]",
                m.producer_epoch,
                i16::MAX
            ))
        })?;
        if m.coordinator_generation < 0 {
            return Err(Error::InvalidRequest(format!(
                "coordinator generation {} is negative",
                m.coordinator_generation
            )));
        }
        let pid = m.producer_id;
        let base_offset = self.high_watermark;
        let noop = Plan {
            base_offset,
            record_count: 0,
            control: None,
            producer: None,
            aborted: None,
            high_watermark: base_offset,
        };
        let current = self.producers.get(&pid);
        if let Some(state) = current {
            if epoch < state.epoch {
                return Err(Error::InvalidProducerEpoch(format!(
                    "marker for producer {pid} has epoch {epoch}, older than the current {}",
                    state.epoch
                )));
            }
            if m.coordinator_generation < state.coordinator_generation {
                return Err(Error::TransactionCoordinatorFenced(format!(
                    "marker for producer {pid} is from coordinator generation {}, older than {}",
                    m.coordinator_generation, state.coordinator_generation
                )));
            }
        }
        let mut next = current.cloned().unwrap_or(ProducerState {
            epoch,
            batches: VecDeque::new(),
            txn_first_offset: None,
            coordinator_generation: NO_GENERATION,
            last_update_ms: now_ms,
        });
        let raises_epoch = current.is_none_or(|s| epoch > s.epoch);
        // Transaction version 1: the marker carries the data's epoch; the sequence window is
        // kept (the producer carries on at this epoch), as Kafka's producer state does.
        let ends_at_same_epoch = m.keeps_epoch() && current.is_some_and(|s| epoch == s.epoch);
        match current.and_then(|s| s.txn_first_offset) {
            Some(first) if raises_epoch || ends_at_same_epoch => {
                next.epoch = epoch;
                if raises_epoch {
                    next.batches.clear();
                }
                next.txn_first_offset = None;
                next.coordinator_generation = m.coordinator_generation;
                next.last_update_ms = now_ms;
                Ok(Plan {
                    record_count: 0,
                    control: Some(ControlRecord {
                        producer_id: pid,
                        producer_epoch: epoch,
                        commit: m.commit,
                        coordinator_id: m.coordinator_id,
                        coordinator_generation: m.coordinator_generation,
                        timestamp_ms: now_ms,
                    }),
                    producer: Some((pid, next)),
                    aborted: (!m.commit).then_some(AbortedTxn {
                        producer_id: pid,
                        first_offset: first,
                        last_offset: base_offset,
                    }),
                    high_watermark: base_offset + 1,
                    ..noop
                })
            }
            _ if raises_epoch => {
                // Nothing open here: remember the epoch so a zombie is rejected here too.
                next.epoch = epoch;
                next.batches.clear();
                next.coordinator_generation = m.coordinator_generation;
                next.last_update_ms = now_ms;
                Ok(Plan {
                    producer: Some((pid, next)),
                    ..noop
                })
            }
            _ => {
                // Same epoch: a repeat of the marker that ended the previous transaction.
                if next.coordinator_generation < m.coordinator_generation {
                    next.coordinator_generation = m.coordinator_generation;
                    next.last_update_ms = now_ms;
                    return Ok(Plan {
                        producer: Some((pid, next)),
                        ..noop
                    });
                }
                Ok(noop)
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

    /// What a fetch from `offset` may read. `offset` must be in `[0, high watermark]`.
    pub fn fetch_view(&self, offset: i64, read_committed: bool) -> Result<FetchView> {
        if offset < 0 || offset > self.high_watermark {
            return Err(Error::OffsetOutOfRange(format!(
                "offset {offset} is outside [0, {}]",
                self.high_watermark
            )));
        }
        let lso = self.last_stable_offset();
        let upper = if read_committed {
            lso
        } else {
            self.high_watermark
        };
        let aborted = if read_committed {
            self.aborted
                .range(offset..)
                .map(|(_, a)| *a)
                .filter(|a| a.first_offset < upper)
                .collect()
        } else {
            Vec::new()
        };
        Ok(FetchView {
            high_watermark: self.high_watermark,
            last_stable_offset: lso,
            upper,
            aborted,
            read_committed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_batch_bytes: 1024,
        max_record_bytes: 256,
    };

    fn batch(pid: i64, epoch: i32, seq: i32, n: usize, txn: bool) -> ProduceBatch {
        ProduceBatch {
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            is_transactional: txn,
            transactional_id: if txn { "t".into() } else { String::new() },
            records: (0..n)
                .map(|i| Record {
                    key: vec![],
                    value: vec![i as u8],
                    timestamp_ms: 1,
                    headers: Vec::new(),
                })
                .collect(),
        }
    }

    fn header(pid: i64, epoch: i32, seq: i32, n: usize, txn: bool) -> BatchHeader {
        validate_batch(&LIMITS, &batch(pid, epoch, seq, n, txn)).unwrap()
    }

    fn marker(pid: i64, epoch: i32, commit: bool, generation: i64) -> Marker {
        Marker {
            producer_id: pid,
            producer_epoch: epoch,
            commit,
            coordinator_id: 1,
            coordinator_generation: generation,
            transaction_version: 2,
        }
    }

    /// Runs a Produce to completion (verification always succeeds); returns the base offset and
    /// whether it was a duplicate.
    fn produce(s: &mut PartitionState, h: &BatchHeader) -> Result<(i64, bool)> {
        let mut decision = s.check_produce(h, false, 10)?;
        if decision == ProduceDecision::NeedsVerification {
            decision = s.check_produce(h, true, 10)?;
        }
        match decision {
            ProduceDecision::Duplicate { base_offset } => Ok((base_offset, true)),
            ProduceDecision::Append(plan) => {
                s.apply(&plan);
                Ok((plan.base_offset, false))
            }
            ProduceDecision::NeedsVerification => panic!("verified twice"),
        }
    }

    fn write_marker(s: &mut PartitionState, m: &Marker) -> Result<Plan> {
        let plan = s.plan_marker(m, 20)?;
        s.apply(&plan);
        Ok(plan)
    }

    fn code(r: Result<impl std::fmt::Debug>) -> proto::ErrorCode {
        r.unwrap_err().code()
    }

    #[test]
    fn sequences_increase_and_offsets_follow() {
        let mut s = PartitionState::new(false);
        assert_eq!(
            produce(&mut s, &header(1, 0, 0, 3, false)).unwrap(),
            (0, false)
        );
        assert_eq!(
            produce(&mut s, &header(1, 0, 3, 2, false)).unwrap(),
            (3, false)
        );
        assert_eq!(s.high_watermark(), 5);
        assert_eq!(s.producer(1).unwrap().last_sequence(), Some(4));
        // A gap.
        assert_eq!(
            code(produce(&mut s, &header(1, 0, 6, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
        assert_eq!(s.high_watermark(), 5);
    }

    #[test]
    fn duplicate_returns_original_offset_and_appends_nothing() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 2, false)).unwrap();
        produce(&mut s, &header(1, 0, 2, 2, false)).unwrap();
        let before = s.clone();
        assert_eq!(
            produce(&mut s, &header(1, 0, 0, 2, false)).unwrap(),
            (0, true)
        );
        assert_eq!(
            produce(&mut s, &header(1, 0, 2, 2, false)).unwrap(),
            (2, true)
        );
        assert_eq!(s, before);
        // Same first sequence, different range: not a duplicate, out of order.
        assert_eq!(
            code(produce(&mut s, &header(1, 0, 2, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
    }

    #[test]
    fn duplicate_window_is_five_batches() {
        let mut s = PartitionState::new(false);
        for i in 0..6 {
            produce(&mut s, &header(1, 0, i, 1, false)).unwrap();
        }
        // Batches 1..=5 are remembered, batch 0 (the 6th-oldest) is not.
        for i in 1..6 {
            assert_eq!(
                produce(&mut s, &header(1, 0, i, 1, false)).unwrap(),
                (i as i64, true)
            );
        }
        assert_eq!(
            code(produce(&mut s, &header(1, 0, 0, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
        assert_eq!(s.high_watermark(), 6);
    }

    #[test]
    fn sequence_wraps_at_i32_max() {
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(increment_sequence(5, 1), 6);
        let mut s = PartitionState::new(false);
        // Reach i32::MAX - 1 via the state directly (2^31 batches would take a while).
        produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
        let mut p = s.producer(1).unwrap().clone();
        p.batches.back_mut().unwrap().last_seq = i32::MAX - 2;
        s.producers.insert(1, p);
        // A batch of 3 starting at MAX-1 holds MAX-1, MAX, 0.
        let h = header(1, 0, i32::MAX - 1, 3, false);
        assert_eq!(h.last_seq, 0);
        produce(&mut s, &h).unwrap();
        assert_eq!(s.producer(1).unwrap().last_sequence(), Some(0));
        produce(&mut s, &header(1, 0, 1, 1, false)).unwrap();
        // Exactly at MAX: the next one is 0.
        let mut p = s.producer(1).unwrap().clone();
        p.batches.back_mut().unwrap().last_seq = i32::MAX;
        s.producers.insert(1, p);
        assert_eq!(
            code(produce(&mut s, &header(1, 0, i32::MAX, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
        produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
    }

    #[test]
    fn older_epoch_is_fenced_and_higher_epoch_starts_at_zero() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 3, 0, 1, false)).unwrap();
        assert_eq!(
            code(produce(&mut s, &header(1, 2, 1, 1, false))),
            proto::ErrorCode::InvalidProducerEpoch
        );
        // An older epoch is fenced even when it names a remembered range of that epoch.
        assert_eq!(
            code(produce(&mut s, &header(1, 2, 0, 1, false))),
            proto::ErrorCode::InvalidProducerEpoch
        );
        assert_eq!(
            code(produce(&mut s, &header(1, 4, 1, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
        produce(&mut s, &header(1, 4, 0, 1, false)).unwrap();
        let p = s.producer(1).unwrap();
        assert_eq!(p.epoch, 4);
        assert_eq!(p.batches.len(), 1, "a new epoch starts a new window");
        // The old epoch's batch is no longer a duplicate: fenced.
        assert_eq!(
            code(produce(&mut s, &header(1, 3, 0, 1, false))),
            proto::ErrorCode::InvalidProducerEpoch
        );
        assert_eq!(s.high_watermark(), 2);
    }

    #[test]
    fn unknown_pid_must_start_at_zero() {
        let mut s = PartitionState::new(false);
        assert_eq!(
            code(produce(&mut s, &header(7, 0, 5, 1, false))),
            proto::ErrorCode::UnknownProducerId
        );
        assert_eq!(s, PartitionState::new(false));
        produce(&mut s, &header(7, 2, 0, 1, false)).unwrap();
    }

    #[test]
    fn plain_producers_skip_checks() {
        let mut s = PartitionState::new(false);
        let mut b = batch(-1, 77, 99, 2, false);
        let h = validate_batch(&LIMITS, &b).unwrap();
        assert_eq!(produce(&mut s, &h).unwrap(), (0, false));
        assert_eq!(produce(&mut s, &h).unwrap(), (2, false), "no dedup");
        assert!(s.producers().is_empty());
        b.is_transactional = true;
        b.transactional_id = "t".into();
        assert_eq!(
            code(validate_batch(&LIMITS, &b)),
            proto::ErrorCode::InvalidRequest
        );
    }

    #[test]
    fn transactional_batch_opening_a_txn_needs_verification_once() {
        let mut s = PartitionState::new(false);
        let h = header(1, 0, 0, 2, true);
        assert_eq!(
            s.check_produce(&h, false, 1).unwrap(),
            ProduceDecision::NeedsVerification
        );
        produce(&mut s, &h).unwrap();
        assert_eq!(s.producer(1).unwrap().txn_first_offset, Some(0));
        // Later batches of the open transaction need no verification.
        assert!(matches!(
            s.check_produce(&header(1, 0, 2, 1, true), false, 1)
                .unwrap(),
            ProduceDecision::Append(_)
        ));
        // After the marker closes it, the next transaction is verified again.
        write_marker(&mut s, &marker(1, 1, true, 0)).unwrap();
        assert_eq!(
            s.check_produce(&header(1, 1, 0, 1, true), false, 1)
                .unwrap(),
            ProduceDecision::NeedsVerification
        );
    }

    #[test]
    fn non_transactional_batch_while_txn_open_is_invalid_txn_state() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
        assert_eq!(
            code(produce(&mut s, &header(1, 0, 1, 1, false))),
            proto::ErrorCode::InvalidTxnState
        );
        assert_eq!(s.high_watermark(), 1);
    }

    #[test]
    fn higher_epoch_txn_batch_while_old_txn_open_is_retriable() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
        assert_eq!(
            code(produce(&mut s, &header(1, 1, 0, 1, true))),
            proto::ErrorCode::ConcurrentTransactions
        );
    }

    #[test]
    fn marker_closes_txn_adopts_epoch_and_resets_window() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 2, true)).unwrap();
        produce(&mut s, &header(1, 0, 2, 1, true)).unwrap();
        assert_eq!(s.last_stable_offset(), 0);
        let plan = write_marker(&mut s, &marker(1, 1, false, 3)).unwrap();
        assert!(plan.control.is_some());
        assert_eq!(plan.base_offset, 3);
        assert_eq!(s.high_watermark(), 4);
        assert_eq!(s.last_stable_offset(), 4);
        let p = s.producer(1).unwrap();
        assert_eq!(p.epoch, 1);
        assert!(p.batches.is_empty());
        assert_eq!(p.txn_first_offset, None);
        assert_eq!(p.coordinator_generation, 3);
        assert_eq!(
            s.aborted_txns().copied().collect::<Vec<_>>(),
            vec![AbortedTxn {
                producer_id: 1,
                first_offset: 0,
                last_offset: 3
            }]
        );
        // The window was reset: the new epoch starts at 0, the old epoch is fenced.
        assert_eq!(
            code(produce(&mut s, &header(1, 1, 3, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
        assert_eq!(
            code(produce(&mut s, &header(1, 0, 3, 1, true))),
            proto::ErrorCode::InvalidProducerEpoch
        );
        assert_eq!(
            produce(&mut s, &header(1, 1, 0, 1, true)).unwrap(),
            (4, false)
        );
    }

    #[test]
    fn markers_are_idempotent() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
        write_marker(&mut s, &marker(1, 1, true, 0)).unwrap();
        let after_first = s.clone();
        assert!(write_marker(&mut s, &marker(1, 1, true, 0))
            .unwrap()
            .is_noop());
        assert_eq!(s, after_first);
        // A late repeat after the next transaction (same epoch, TV2) opened: does not close it.
        produce(&mut s, &header(1, 1, 0, 1, true)).unwrap();
        assert!(write_marker(&mut s, &marker(1, 1, true, 0))
            .unwrap()
            .is_noop());
        assert_eq!(s.producer(1).unwrap().txn_first_offset, Some(2));
        assert_eq!(s.last_stable_offset(), 2);
        // Its real marker does.
        write_marker(&mut s, &marker(1, 2, true, 0)).unwrap();
        assert_eq!(s.last_stable_offset(), 4);
    }

    #[test]
    fn marker_checks_epoch_then_generation() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 5, 0, 1, true)).unwrap();
        write_marker(&mut s, &marker(1, 6, true, 4)).unwrap();
        let before = s.clone();
        assert_eq!(
            code(write_marker(&mut s, &marker(1, 5, false, 9))),
            proto::ErrorCode::InvalidProducerEpoch
        );
        assert_eq!(
            code(write_marker(&mut s, &marker(1, 7, false, 3))),
            proto::ErrorCode::TransactionCoordinatorFenced
        );
        assert_eq!(s, before);
        // A newer generation repeating the same marker is acknowledged and remembered.
        let plan = write_marker(&mut s, &marker(1, 6, true, 5)).unwrap();
        assert!(plan.control.is_none());
        assert_eq!(s.producer(1).unwrap().coordinator_generation, 5);
        assert_eq!(s.high_watermark(), before.high_watermark());
    }

    #[test]
    fn marker_for_unknown_pid_records_epoch_and_appends_nothing() {
        let mut s = PartitionState::new(false);
        let plan = write_marker(&mut s, &marker(9, 4, false, 1)).unwrap();
        assert_eq!(plan.control, None);
        assert_eq!(plan.record_count, 0);
        assert_eq!(s.high_watermark(), 0);
        assert_eq!(s.producer(9).unwrap().epoch, 4);
        // The zombie (epoch 3) that never wrote here is now rejected here.
        assert_eq!(
            code(produce(&mut s, &header(9, 3, 0, 1, true))),
            proto::ErrorCode::InvalidProducerEpoch
        );
        assert_eq!(s.high_watermark(), 0);
        assert_eq!(s.aborted_txns().count(), 0);
    }

    #[test]
    fn marker_without_open_txn_raises_epoch_of_known_pid() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
        write_marker(&mut s, &marker(1, 2, false, 0)).unwrap();
        assert_eq!(s.high_watermark(), 1);
        assert_eq!(
            code(produce(&mut s, &header(1, 0, 1, 1, false))),
            proto::ErrorCode::InvalidProducerEpoch
        );
    }

    #[test]
    fn bad_markers_are_invalid_request() {
        let s = PartitionState::new(false);
        for m in [
            marker(-1, 0, true, 0),
            marker(1, -1, true, 0),
            marker(1, 32768, true, 0),
            marker(1, 0, true, -1),
        ] {
            assert_eq!(code(s.plan_marker(&m, 0)), proto::ErrorCode::InvalidRequest);
        }
    }

    #[test]
    fn lso_with_interleaved_transactions_of_several_pids() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(-1, 0, 0, 1, false)).unwrap(); // 0 plain
        produce(&mut s, &header(1, 0, 0, 1, true)).unwrap(); // 1 pid 1 opens
        produce(&mut s, &header(2, 0, 0, 1, true)).unwrap(); // 2 pid 2 opens
        produce(&mut s, &header(1, 0, 1, 1, true)).unwrap(); // 3
        produce(&mut s, &header(3, 0, 0, 1, true)).unwrap(); // 4 pid 3 opens
        assert_eq!(s.high_watermark(), 5);
        assert_eq!(s.last_stable_offset(), 1);
        // Ending a later transaction does not move the LSO.
        write_marker(&mut s, &marker(2, 1, true, 0)).unwrap(); // 5
        assert_eq!(s.last_stable_offset(), 1);
        // Ending the earliest moves it to the next open one.
        write_marker(&mut s, &marker(1, 1, false, 0)).unwrap(); // 6
        assert_eq!(s.last_stable_offset(), 4);
        write_marker(&mut s, &marker(3, 1, true, 0)).unwrap(); // 7
        assert_eq!(s.last_stable_offset(), 8);
        assert_eq!(s.high_watermark(), 8);

        let view = s.fetch_view(0, true).unwrap();
        assert_eq!(view.upper, 8);
        let data = |pid| {
            LogEntry::Data(DataRecord {
                producer_id: pid,
                producer_epoch: 0,
                is_transactional: true,
                key: vec![],
                value: vec![],
                timestamp_ms: 0,
                headers: Vec::new(),
            })
        };
        let visible: Vec<i64> = [(0, -1), (1, 1), (2, 2), (3, 1), (4, 3)]
            .into_iter()
            .filter(|(o, pid)| view.is_visible(*o, &data(*pid)))
            .map(|(o, _)| o)
            .collect();
        assert_eq!(visible, vec![0, 2, 4]);
        let uncommitted = s.fetch_view(0, false).unwrap();
        assert!(uncommitted.is_visible(1, &data(1)));
        let control = LogEntry::Control(ControlRecord {
            producer_id: 2,
            producer_epoch: 1,
            commit: true,
            coordinator_id: 1,
            coordinator_generation: 0,
            timestamp_ms: 0,
        });
        assert!(!view.is_visible(5, &control));
        assert!(!uncommitted.is_visible(5, &control));
    }

    #[test]
    fn read_committed_stops_at_lso() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(-1, 0, 0, 2, false)).unwrap();
        produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
        produce(&mut s, &header(-1, 0, 0, 1, false)).unwrap();
        let view = s.fetch_view(0, true).unwrap();
        assert_eq!(
            (view.upper, view.last_stable_offset, view.high_watermark),
            (2, 2, 4)
        );
        assert_eq!(s.fetch_view(0, false).unwrap().upper, 4);
        assert_eq!(
            code(s.fetch_view(5, false)),
            proto::ErrorCode::OffsetOutOfRange
        );
        assert_eq!(
            code(s.fetch_view(-1, true)),
            proto::ErrorCode::OffsetOutOfRange
        );
        assert!(s.fetch_view(4, true).is_ok());
    }

    #[test]
    fn bad_batches_are_rejected_before_any_state() {
        let too_big_record = ProduceBatch {
            records: vec![Record {
                key: vec![0; 100],
                value: vec![0; 157],
                timestamp_ms: 0,
                headers: Vec::new(),
            }],
            ..batch(1, 0, 0, 1, false)
        };
        let too_big_batch = ProduceBatch {
            records: (0..8)
                .map(|_| Record {
                    key: vec![],
                    value: vec![0; 200],
                    timestamp_ms: 0,
                    headers: Vec::new(),
                })
                .collect(),
            ..batch(1, 0, 0, 1, false)
        };
        let many_empty = batch(1, 0, 0, 1024 / RECORD_OVERHEAD_BYTES + 1, false);
        let mut no_txn_id = batch(1, 0, 0, 1, true);
        no_txn_id.transactional_id.clear();
        let mut long_txn_id = batch(1, 0, 0, 1, true);
        long_txn_id.transactional_id = "x".repeat(cluster::MAX_ID_LEN + 1);
        let cases = [
            (batch(1, 0, 0, 0, false), proto::ErrorCode::InvalidRequest),
            (batch(-2, 0, 0, 1, false), proto::ErrorCode::InvalidRequest),
            (
                batch(i64::MIN, 0, 0, 1, false),
                proto::ErrorCode::InvalidRequest,
            ),
            (batch(1, -1, 0, 1, false), proto::ErrorCode::InvalidRequest),
            (
                batch(1, 32768, 0, 1, false),
                proto::ErrorCode::InvalidRequest,
            ),
            (
                batch(1, i32::MAX, 0, 1, false),
                proto::ErrorCode::InvalidRequest,
            ),
            (batch(1, 0, -1, 1, false), proto::ErrorCode::InvalidRequest),
            (
                batch(1, 0, i32::MIN, 1, false),
                proto::ErrorCode::InvalidRequest,
            ),
            (no_txn_id, proto::ErrorCode::InvalidRequest),
            (long_txn_id, proto::ErrorCode::InvalidRequest),
            (too_big_record, proto::ErrorCode::MessageTooLarge),
            (too_big_batch, proto::ErrorCode::MessageTooLarge),
            (many_empty, proto::ErrorCode::MessageTooLarge),
        ];
        for (b, expected) in cases {
            assert_eq!(code(validate_batch(&LIMITS, &b)), expected, "{b:?}");
        }
        // Limits are inclusive.
        let exact = ProduceBatch {
            records: vec![Record {
                key: vec![0; 56],
                value: vec![0; 200],
                timestamp_ms: 0,
                headers: Vec::new(),
            }],
            ..batch(1, 0, 0, 1, false)
        };
        assert!(validate_batch(&LIMITS, &exact).is_ok());
        // An absurd but valid sequence for a known PID is just out of order.
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 1, false)).unwrap();
        let before = s.clone();
        assert_eq!(
            code(produce(&mut s, &header(1, 0, i32::MAX, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
        assert_eq!(
            code(produce(&mut s, &header(1, i16::MAX as i32, 7, 1, false))),
            proto::ErrorCode::OutOfOrderSequenceNumber
        );
        assert_eq!(s, before);
    }

    #[test]
    fn timestamps_default_to_append_time() {
        let h = header(1, 0, 0, 1, false);
        let entries = data_entries(
            &h,
            vec![
                Record {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    timestamp_ms: -1,
                    headers: Vec::new(),
                },
                Record {
                    key: vec![],
                    value: vec![],
                    timestamp_ms: 5,
                    headers: Vec::new(),
                },
            ],
            99,
        );
        let ts: Vec<i64> = entries
            .iter()
            .map(|e| match e {
                LogEntry::Data(d) => d.timestamp_ms,
                LogEntry::Control(_) => unreachable!(),
            })
            .collect();
        assert_eq!(ts, vec![99, 5]);
    }

    #[test]
    fn unsafe_skip_epoch_check_lets_a_zombie_append() {
        let mut s = PartitionState::new(true);
        produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
        write_marker(&mut s, &marker(1, 1, false, 0)).unwrap();
        let state_before = s.producer(1).unwrap().clone();
        // The zombie at epoch 0 writes, with any sequence.
        assert_eq!(
            produce(&mut s, &header(1, 0, 17, 1, true)).unwrap(),
            (2, false)
        );
        assert_eq!(s.producer(1).unwrap(), &state_before);
        // ... and it is visible to read_committed readers: that is the broken fencing.
        let view = s.fetch_view(0, true).unwrap();
        assert_eq!(view.upper, 3);
        // Markers still check epochs.
        assert_eq!(
            code(write_marker(&mut s, &marker(1, 0, true, 0))),
            proto::ErrorCode::InvalidProducerEpoch
        );
    }

    #[test]
    fn restore_rebuilds_open_txns_and_rejects_inconsistent_state() {
        let mut s = PartitionState::new(false);
        produce(&mut s, &header(1, 0, 0, 1, true)).unwrap();
        produce(&mut s, &header(2, 0, 0, 1, true)).unwrap();
        write_marker(&mut s, &marker(2, 1, false, 0)).unwrap();
        let restored = PartitionState::restore(
            false,
            s.high_watermark(),
            s.producers().clone(),
            s.aborted_txns().copied().collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(restored, s);
        assert_eq!(restored.last_stable_offset(), 0);
        assert!(PartitionState::restore(false, 0, s.producers().clone(), vec![]).is_err());
        assert!(PartitionState::restore(false, -1, vec![], vec![]).is_err());
    }
}
