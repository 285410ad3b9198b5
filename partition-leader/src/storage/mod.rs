//! Durable partition logs behind a small [`Storage`] trait, with a disk engine ([`SledStorage`]:
//! log files for the records, a sled checkpoint of the metadata, see `storage/engine.rs`) and an
//! in-memory engine for tests ([`MemoryStorage`]).
//!
//! A [`Write`] is everything one Produce or marker changes on a partition: the appended entries,
//! the PID's new producer state, a new aborted-index entry and the new high watermark.
//! [`Storage::append`] applies it atomically but NOT yet durably; [`Storage::flush`] then makes
//! everything appended so far durable. The shell acknowledges a write only after a flush that
//! began after its append returned.
//!
//! Entry codec (this file): [`encode_entry`] for one entry, [`encode_run`] for consecutive
//! entries (how a write's records sit in a log file frame, `storage/frame.rs`, and how the
//! sled `records/..` trees of older logs hold them: one entry or one run per value).
//!
//! Choice (the issue leaves it open): producer state and the aborted index are PERSISTED
//! (checkpointed) rather than rebuilt from the whole log on load, so a start costs O(PIDs +
//! aborted transactions + the tail written since the last checkpoint), not O(log).
//!
//! Group commit: append and flush are separate calls, so the shell appends many writes (of any
//! partitions) and makes them durable with one flush (`service::flush`).
//!
//! CAVEATS: no retention or compaction; DeleteRecords only records a log start
//! ([`Storage::set_log_start`]), the records below it stay on disk. A failed flush leaves the write appended, to be made
//! durable by a later flush: the write was not acknowledged, and the service reloads the
//! partition from the engine after any failed write so that memory and disk agree (an
//! unacknowledged write may or may not survive, as in Kafka).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use cluster::{ProducerId, TopicPartition};

mod engine;
mod frame;

pub use engine::SledStorage;

use crate::core::{AbortedTxn, ControlRecord, DataRecord, Header, LogEntry, Plan, ProducerState};
use crate::error::{Error, Result};

/// Everything one Produce or marker persists on a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// Offset of `entries[0]`.
    pub base_offset: i64,
    /// Entries to append at consecutive offsets.
    pub entries: Vec<LogEntry>,
    /// The PID's new state.
    pub producer: Option<(ProducerId, ProducerState)>,
    /// A new aborted-index entry.
    pub aborted: Option<AbortedTxn>,
    /// High watermark after the write.
    pub high_watermark: i64,
}

impl Write {
    /// The write for a core [`Plan`] and the entries it appends.
    pub fn new(plan: &Plan, entries: Vec<LogEntry>) -> Self {
        debug_assert_eq!(
            plan.base_offset + entries.len() as i64,
            plan.high_watermark,
            "entries do not match the plan"
        );
        Self {
            base_offset: plan.base_offset,
            entries,
            producer: plan.producer.clone(),
            aborted: plan.aborted,
            high_watermark: plan.high_watermark,
        }
    }
}

/// What [`Storage::load`] returns for a partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadedPartition {
    /// The next offset.
    pub high_watermark: i64,
    /// Producer states.
    pub producers: Vec<(ProducerId, ProducerState)>,
    /// The aborted index.
    pub aborted: Vec<AbortedTxn>,
    /// The log start offset (0 unless DeleteRecords moved it).
    pub log_start_offset: i64,
}

/// A partition-log store. Implementations are synchronous; the shell calls them from
/// `spawn_blocking`.
pub trait Storage: Send + Sync + 'static {
    /// Loads a partition's state (empty if it was never written).
    fn load(&self, tp: &TopicPartition) -> Result<LoadedPartition>;
    /// Applies a write atomically, NOT yet durable: the next [`Storage::flush`] that starts after
    /// this returns makes it durable.
    fn append(&self, tp: &TopicPartition, write: &Write) -> Result<()>;
    /// [`Storage::append`] then [`Storage::flush`]: durable when this returns `Ok`.
    fn write(&self, tp: &TopicPartition, write: &Write) -> Result<()> {
        self.append(tp, write)?;
        self.flush()
    }
    /// Visits entries with offsets in `[from, to)` in order until `visit` returns `false`.
    fn scan(
        &self,
        tp: &TopicPartition,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(i64, LogEntry) -> bool,
    ) -> Result<()>;
    /// Makes everything appended so far durable.
    fn flush(&self) -> Result<()>;
    /// Records, durably, that the partition's log starts at `offset` (DeleteRecords); the
    /// caller holds the partition's write lock. The records below stay on disk, unread.
    fn set_log_start(&self, tp: &TopicPartition, offset: i64) -> Result<()>;
    /// Forgets the producer states of `pids` (expired, see
    /// [`crate::core::PartitionState::expired_producers`]); the caller holds the partition's
    /// write lock. Not durable by itself, and it need not be: a state a crash brings back (from
    /// the checkpoint or the log's tail) is as old as it was, so the next expiry scan forgets it
    /// again. A later write of one of the PIDs stores its state afresh.
    fn forget_producers(&self, tp: &TopicPartition, pids: &[ProducerId]) -> Result<()>;
    /// A fault that fails no write but needs an operator (a restart), e.g. the engine's
    /// checkpoints failing: the health check turns NOT_SERVING while there is one.
    fn problem(&self) -> Option<String> {
        None
    }
}

// ----------------------------------------------------------------------------------------------
// Entry codec
// ----------------------------------------------------------------------------------------------

const TAG_DATA: u8 = 0;
const TAG_CONTROL: u8 = 1;
/// A data record with headers (records without keep [`TAG_DATA`], so older logs read the same).
const TAG_DATA_WITH_HEADERS: u8 = 2;
/// A run of consecutive entries in one value (see [`encode_run`]).
const TAG_RUN: u8 = 3;

/// Encodes an entry. Data: `0, pid i64, epoch i16, txn u8, ts i64, key_len u32, key, value_len
/// u32, value`; with headers the tag is 2 and `count u32` follows, then per header `key_len u32,
/// key, null u8` and, unless null, `value_len u32, value`. Control: `1, pid i64, epoch i16,
/// commit u8, coordinator i32, generation i64, ts i64`. All integers big-endian.
pub fn encode_entry(entry: &LogEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(entry));
    encode_entry_into(entry, &mut out);
    out
}

/// An upper bound of an entry's encoded size, headers apart (for capacity only).
fn encoded_len(entry: &LogEntry) -> usize {
    match entry {
        LogEntry::Data(d) => 32 + d.key.len() + d.value.len(),
        LogEntry::Control(_) => 32,
    }
}

/// Encodes several consecutive entries as one value: `3, count u32`, then per entry `len u32`
/// and its [`encode_entry`] bytes. One entry alone is stored as its plain encoding.
pub fn encode_run(entries: &[LogEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(run_capacity(entries));
    encode_run_into(entries, &mut out);
    out
}

/// An upper bound of [`encode_run`]'s size, headers apart (for capacity only).
fn run_capacity(entries: &[LogEntry]) -> usize {
    5 + entries.iter().map(|e| 4 + encoded_len(e)).sum::<usize>()
}

/// [`encode_run`], appended to `out`.
fn encode_run_into(entries: &[LogEntry], out: &mut Vec<u8>) {
    if let [one] = entries {
        return encode_entry_into(one, out);
    }
    out.push(TAG_RUN);
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for entry in entries {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        encode_entry_into(entry, out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
}

/// Visits the entries of a run stored at offset `base` that fall in `[from, to)`; `false` once
/// the visitor stopped or the run reached `to` (nothing after it is wanted).
fn visit_run(
    base: i64,
    entries: Vec<LogEntry>,
    from: i64,
    to: i64,
    visit: &mut dyn FnMut(i64, LogEntry) -> bool,
) -> bool {
    for (i, entry) in entries.into_iter().enumerate() {
        let offset = base + i as i64;
        if offset < from {
            continue;
        }
        if offset >= to || !visit(offset, entry) {
            return false;
        }
    }
    true
}

/// Decodes a stored value: a run ([`encode_run`]) or one entry ([`encode_entry`]).
pub fn decode_run(bytes: &[u8]) -> Result<Vec<LogEntry>> {
    if bytes.first() != Some(&TAG_RUN) {
        return Ok(vec![decode_entry(bytes)?]);
    }
    let mut r = Reader(&bytes[1..]);
    let count = u32::from_be_bytes(r.array()?) as usize;
    // Each entry takes at least 5 bytes: never reserve more than the bytes left allow.
    let mut entries = Vec::with_capacity(count.min(r.0.len() / 5));
    for _ in 0..count {
        let len = u32::from_be_bytes(r.array()?) as usize;
        entries.push(decode_entry(r.take(len)?)?);
    }
    if !r.0.is_empty() {
        return Err(Error::Storage("corrupt log run: trailing bytes".into()));
    }
    Ok(entries)
}

/// How many entries a stored value holds, read from its head only.
fn run_len(bytes: &[u8]) -> Result<i64> {
    if bytes.first() != Some(&TAG_RUN) {
        return Ok(1);
    }
    let mut r = Reader(&bytes[1..]);
    Ok(u32::from_be_bytes(r.array()?) as i64)
}

/// The stored length of Kafka's null key or value: no bytes follow. A real key or value is
/// never this long (batches are far smaller), so logs written before nulls were kept read the
/// same.
const NULL_LEN: u32 = u32::MAX;

/// The stored length of a key or value.
fn nullable_len(bytes: &[u8], null: bool) -> u32 {
    if null {
        NULL_LEN
    } else {
        bytes.len() as u32
    }
}

fn encode_entry_into(entry: &LogEntry, out: &mut Vec<u8>) {
    match entry {
        LogEntry::Data(d) => {
            out.push(if d.headers.is_empty() {
                TAG_DATA
            } else {
                TAG_DATA_WITH_HEADERS
            });
            out.extend_from_slice(&d.producer_id.to_be_bytes());
            out.extend_from_slice(&d.producer_epoch.to_be_bytes());
            out.push(d.is_transactional as u8);
            out.extend_from_slice(&d.timestamp_ms.to_be_bytes());
            out.extend_from_slice(&nullable_len(&d.key, d.null_key).to_be_bytes());
            out.extend_from_slice(&d.key);
            out.extend_from_slice(&nullable_len(&d.value, d.null_value).to_be_bytes());
            out.extend_from_slice(&d.value);
            if !d.headers.is_empty() {
                out.extend_from_slice(&(d.headers.len() as u32).to_be_bytes());
                for h in &d.headers {
                    out.extend_from_slice(&(h.key.len() as u32).to_be_bytes());
                    out.extend_from_slice(h.key.as_bytes());
                    match &h.value {
                        None => out.push(1),
                        Some(v) => {
                            out.push(0);
                            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                            out.extend_from_slice(v);
                        }
                    }
                }
            }
        }
        LogEntry::Control(c) => {
            out.push(TAG_CONTROL);
            out.extend_from_slice(&c.producer_id.to_be_bytes());
            out.extend_from_slice(&c.producer_epoch.to_be_bytes());
            out.push(c.commit as u8);
            out.extend_from_slice(&c.coordinator_id.to_be_bytes());
            out.extend_from_slice(&c.coordinator_generation.to_be_bytes());
            out.extend_from_slice(&c.timestamp_ms.to_be_bytes());
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::Storage("corrupt log entry: truncated".into()));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("take returned N bytes"))
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(Error::Storage(format!("corrupt log entry: bool {b}"))),
        }
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        Ok(self.bytes_ref()?.to_vec())
    }
    /// A key or value: its bytes, and whether it is Kafka's null ([`NULL_LEN`], no bytes).
    fn nullable_bytes(&mut self) -> Result<(Vec<u8>, bool)> {
        let len: [u8; 4] = self.array()?;
        if u32::from_be_bytes(len) == NULL_LEN {
            return Ok((Vec::new(), true));
        }
        let len = u32::from_be_bytes(len) as usize;
        Ok((self.take(len)?.to_vec(), false))
    }
    fn bytes_ref(&mut self) -> Result<&'a [u8]> {
        let len = u32::from_be_bytes(self.array()?) as usize;
        self.take(len)
    }
    fn headers(&mut self) -> Result<Vec<Header>> {
        let count = u32::from_be_bytes(self.array()?) as usize;
        // Each header takes at least 5 bytes: never reserve more than the bytes left allow.
        let mut headers = Vec::with_capacity(count.min(self.0.len() / 5));
        for _ in 0..count {
            let key = String::from_utf8(self.bytes()?)
                .map_err(|_| Error::Storage("corrupt log entry: header key".into()))?;
            let value = if self.bool()? {
                None
            } else {
                Some(self.bytes()?)
            };
            headers.push(Header { key, value });
        }
        Ok(headers)
    }
}

/// Decodes what [`encode_entry`] wrote; corrupt input is a storage error, never a panic.
pub fn decode_entry(bytes: &[u8]) -> Result<LogEntry> {
    let mut r = Reader(bytes);
    let entry = match r.u8()? {
        tag @ (TAG_DATA | TAG_DATA_WITH_HEADERS) => {
            let producer_id = i64::from_be_bytes(r.array()?);
            let producer_epoch = i16::from_be_bytes(r.array()?);
            let is_transactional = r.bool()?;
            let timestamp_ms = i64::from_be_bytes(r.array()?);
            let (key, null_key) = r.nullable_bytes()?;
            let (value, null_value) = r.nullable_bytes()?;
            LogEntry::Data(DataRecord {
                producer_id,
                producer_epoch,
                is_transactional,
                key,
                value,
                null_key,
                null_value,
                timestamp_ms,
                headers: if tag == TAG_DATA_WITH_HEADERS {
                    r.headers()?
                } else {
                    Vec::new()
                },
            })
        }
        TAG_CONTROL => LogEntry::Control(ControlRecord {
            producer_id: i64::from_be_bytes(r.array()?),
            producer_epoch: i16::from_be_bytes(r.array()?),
            commit: r.bool()?,
            coordinator_id: i32::from_be_bytes(r.array()?),
            coordinator_generation: i64::from_be_bytes(r.array()?),
            timestamp_ms: i64::from_be_bytes(r.array()?),
        }),
        tag => return Err(Error::Storage(format!("corrupt log entry: tag {tag}"))),
    };
    if !r.0.is_empty() {
        return Err(Error::Storage("corrupt log entry: trailing bytes".into()));
    }
    Ok(entry)
}

fn offset_from_key(key: &[u8]) -> Result<i64> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| Error::Storage(format!("corrupt key of {} bytes", key.len())))?;
    Ok(i64::from_be_bytes(bytes))
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("plain structs always serialise")
}

fn from_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Storage(format!("corrupt stored value: {e}")))
}

// ----------------------------------------------------------------------------------------------
// In-memory engine
// ----------------------------------------------------------------------------------------------

#[derive(Default)]
struct MemPartition {
    records: BTreeMap<i64, LogEntry>,
    producers: BTreeMap<ProducerId, ProducerState>,
    aborted: BTreeMap<i64, AbortedTxn>,
    high_watermark: i64,
    log_start_offset: i64,
}

/// The in-memory engine, for tests. Share one behind an `Arc` to "restart" a service over it.
#[derive(Default)]
pub struct MemoryStorage {
    parts: Mutex<HashMap<TopicPartition, MemPartition>>,
    fail_writes: AtomicBool,
    fail_flushes: AtomicBool,
    hold_flushes: AtomicBool,
    appends: AtomicU64,
    flushes: AtomicU64,
    fail_loads: AtomicBool,
    problem: Mutex<Option<String>>,
}

impl MemoryStorage {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every following write fail (to test that failed writes change nothing).
    pub fn set_fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::SeqCst);
    }

    /// Makes every following flush fail, while appends still apply: like sled when the flush
    /// fails after the transaction was applied in memory.
    pub fn set_fail_flushes(&self, fail: bool) {
        self.fail_flushes.store(fail, Ordering::SeqCst);
    }

    /// While set, a flush waits (on its blocking thread) until it is cleared: writes can pile up
    /// behind one flush, as behind a slow disk.
    pub fn hold_flushes(&self, hold: bool) {
        self.hold_flushes.store(hold, Ordering::SeqCst);
    }

    /// Appends applied so far.
    pub fn appends(&self) -> u64 {
        self.appends.load(Ordering::SeqCst)
    }

    /// Flushes completed (or failed) so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Makes every following load fail.
    pub fn set_fail_loads(&self, fail: bool) {
        self.fail_loads.store(fail, Ordering::SeqCst);
    }

    /// Reports `problem` from [`Storage::problem`] (as the engine does when its checkpoints
    /// fail).
    pub fn set_problem(&self, problem: Option<&str>) {
        *self.problem.lock().unwrap_or_else(|e| e.into_inner()) = problem.map(str::to_string);
    }
}

impl Storage for MemoryStorage {
    fn load(&self, tp: &TopicPartition) -> Result<LoadedPartition> {
        if self.fail_loads.load(Ordering::SeqCst) {
            return Err(Error::Storage("injected load failure".into()));
        }
        let parts = self.parts.lock().expect("memory storage poisoned");
        Ok(parts
            .get(tp)
            .map(|p| LoadedPartition {
                high_watermark: p.high_watermark,
                producers: p.producers.iter().map(|(k, v)| (*k, v.clone())).collect(),
                aborted: p.aborted.values().copied().collect(),
                log_start_offset: p.log_start_offset,
            })
            .unwrap_or_default())
    }

    fn set_log_start(&self, tp: &TopicPartition, offset: i64) -> Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(Error::Storage("injected write failure".into()));
        }
        let mut parts = self.parts.lock().expect("memory storage poisoned");
        parts.entry(tp.clone()).or_default().log_start_offset = offset;
        Ok(())
    }

    fn append(&self, tp: &TopicPartition, w: &Write) -> Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(Error::Storage("injected write failure".into()));
        }
        let mut parts = self.parts.lock().expect("memory storage poisoned");
        let p = parts.entry(tp.clone()).or_default();
        for (i, entry) in w.entries.iter().enumerate() {
            p.records.insert(w.base_offset + i as i64, entry.clone());
        }
        if let Some((pid, state)) = &w.producer {
            p.producers.insert(*pid, state.clone());
        }
        if let Some(a) = w.aborted {
            p.aborted.insert(a.last_offset, a);
        }
        p.high_watermark = w.high_watermark;
        self.appends.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn forget_producers(&self, tp: &TopicPartition, pids: &[ProducerId]) -> Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(Error::Storage("injected write failure".into()));
        }
        let mut parts = self.parts.lock().expect("memory storage poisoned");
        if let Some(p) = parts.get_mut(tp) {
            for pid in pids {
                p.producers.remove(pid);
            }
        }
        Ok(())
    }

    fn scan(
        &self,
        tp: &TopicPartition,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(i64, LogEntry) -> bool,
    ) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let parts = self.parts.lock().expect("memory storage poisoned");
        if let Some(p) = parts.get(tp) {
            for (offset, entry) in p.records.range(from..to) {
                if !visit(*offset, entry.clone()) {
                    break;
                }
            }
        }
        Ok(())
    }

    fn problem(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn flush(&self) -> Result<()> {
        while self.hold_flushes.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.flushes.fetch_add(1, Ordering::SeqCst);
        if self.fail_flushes.load(Ordering::SeqCst) {
            return Err(Error::Storage("injected flush failure".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::core::BatchMetadata;

    fn data(pid: i64, value: &[u8]) -> LogEntry {
        LogEntry::Data(DataRecord {
            producer_id: pid,
            producer_epoch: 3,
            is_transactional: true,
            key: b"k".to_vec(),
            null_key: false,
            value: value.to_vec(),
            null_value: false,
            timestamp_ms: 1234,
            headers: Vec::new(),
        })
    }

    fn control() -> LogEntry {
        LogEntry::Control(ControlRecord {
            producer_id: 7,
            producer_epoch: 4,
            commit: false,
            coordinator_id: 2,
            coordinator_generation: 9,
            timestamp_ms: 5,
        })
    }

    fn sample_writes() -> Vec<Write> {
        let state = ProducerState {
            epoch: 3,
            batches: VecDeque::from([BatchMetadata {
                first_seq: 0,
                last_seq: 1,
                base_offset: 0,
            }]),
            txn_first_offset: Some(0),
            txn_number: None,
            ended_number: None,
            coordinator_generation: -1,
            last_update_ms: 10,
        };
        let closed = ProducerState {
            epoch: 4,
            batches: VecDeque::new(),
            txn_first_offset: None,
            txn_number: None,
            ended_number: None,
            coordinator_generation: 9,
            last_update_ms: 11,
        };
        vec![
            Write {
                base_offset: 0,
                entries: vec![data(7, b"a"), data(7, b"b")],
                producer: Some((7, state)),
                aborted: None,
                high_watermark: 2,
            },
            Write {
                base_offset: 2,
                entries: vec![control()],
                producer: Some((7, closed)),
                aborted: Some(AbortedTxn {
                    producer_id: 7,
                    first_offset: 0,
                    last_offset: 2,
                }),
                high_watermark: 3,
            },
        ]
    }

    fn collect(s: &dyn Storage, tp: &TopicPartition, from: i64, to: i64) -> Vec<(i64, LogEntry)> {
        let mut out = Vec::new();
        s.scan(tp, from, to, &mut |o, e| {
            out.push((o, e));
            true
        })
        .unwrap();
        out
    }

    fn exercise(s: &dyn Storage) -> LoadedPartition {
        let tp = TopicPartition::new("t", 0);
        let other = TopicPartition::new("t", 1);
        assert_eq!(s.load(&tp).unwrap(), LoadedPartition::default());
        for w in sample_writes() {
            s.write(&tp, &w).unwrap();
        }
        let loaded = s.load(&tp).unwrap();
        assert_eq!(loaded.high_watermark, 3);
        assert_eq!(loaded.producers.len(), 1);
        assert_eq!(loaded.producers[0].1.epoch, 4);
        assert_eq!(loaded.aborted.len(), 1);
        assert_eq!(
            collect(s, &tp, 0, 10),
            vec![(0, data(7, b"a")), (1, data(7, b"b")), (2, control())]
        );
        assert_eq!(collect(s, &tp, 1, 2), vec![(1, data(7, b"b"))]);
        assert!(collect(s, &tp, 2, 2).is_empty());
        assert!(collect(s, &other, 0, 10).is_empty());
        // Early stop.
        let mut seen = 0;
        s.scan(&tp, 0, 10, &mut |_, _| {
            seen += 1;
            false
        })
        .unwrap();
        assert_eq!(seen, 1);
        loaded
    }

    /// A plain idempotent write of PID 8 at `base_offset`.
    fn idempotent_write(base_offset: i64, last_update_ms: i64) -> Write {
        Write {
            base_offset,
            entries: vec![data(8, b"i")],
            producer: Some((
                8,
                ProducerState {
                    epoch: 0,
                    batches: VecDeque::from([BatchMetadata {
                        first_seq: 0,
                        last_seq: 0,
                        base_offset,
                    }]),
                    txn_first_offset: None,
                    txn_number: None,
                    ended_number: None,
                    coordinator_generation: -1,
                    last_update_ms,
                },
            )),
            aborted: None,
            high_watermark: base_offset + 1,
        }
    }

    fn pids(loaded: &LoadedPartition) -> Vec<ProducerId> {
        loaded.producers.iter().map(|(pid, _)| *pid).collect()
    }

    /// [`sample_writes`] (PID 7) then [`idempotent_write`] (PID 8).
    fn write_pids_7_and_8(s: &dyn Storage, tp: &TopicPartition) {
        for w in sample_writes() {
            s.write(tp, &w).unwrap();
        }
        s.write(tp, &idempotent_write(3, 12)).unwrap();
    }

    /// Forgets PID 7 (written by [`sample_writes`]) and keeps 8; a later write of 7 stores it
    /// afresh. Returns after that write.
    fn exercise_forget(s: &dyn Storage, tp: &TopicPartition) {
        write_pids_7_and_8(s, tp);
        s.forget_producers(tp, &[7]).unwrap();
        assert_eq!(pids(&s.load(tp).unwrap()), vec![8]);
        assert_eq!(collect(s, tp, 0, 10).len(), 4, "the records stay");
        let mut again = idempotent_write(4, 20);
        let state = again.producer.take().unwrap().1;
        again.producer = Some((7, state));
        s.write(tp, &again).unwrap();
        assert_eq!(pids(&s.load(tp).unwrap()), vec![7, 8]);
    }

    #[test]
    fn memory_forgets_producers() {
        exercise_forget(&MemoryStorage::new(), &TopicPartition::new("t", 0));
    }

    /// Forgotten states stay forgotten across a reopen, whether they were still waiting for a
    /// checkpoint or already in sled's; a state written after the forgetting is kept.
    #[test]
    fn sled_forgotten_producers_stay_forgotten_after_a_reopen() {
        let tp = TopicPartition::new("t", 0);
        // 1. Forgotten while still waiting for a checkpoint (the close writes the checkpoint).
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStorage::open(dir.path()).unwrap();
            write_pids_7_and_8(&s, &tp);
            assert!(
                s.uncheckpointed() > 0,
                "the test needs a pending checkpoint"
            );
            s.forget_producers(&tp, &[7]).unwrap();
        }
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(pids(&s.load(&tp).unwrap()), vec![8]);
        drop(s);
        // 2. Forgotten once in sled's checkpoint.
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStorage::open(dir.path()).unwrap();
            write_pids_7_and_8(&s, &tp);
        }
        {
            let s = SledStorage::open(dir.path()).unwrap();
            assert_eq!(s.uncheckpointed(), 0);
            assert_eq!(pids(&s.load(&tp).unwrap()), vec![7, 8]);
            s.forget_producers(&tp, &[7]).unwrap();
        }
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(pids(&s.load(&tp).unwrap()), vec![8]);
        drop(s);
        // 3. Forgotten, then written again.
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStorage::open(dir.path()).unwrap();
            exercise_forget(&s, &tp);
        }
        let s = SledStorage::open(dir.path()).unwrap();
        let loaded = s.load(&tp).unwrap();
        assert_eq!(pids(&loaded), vec![7, 8]);
        assert_eq!(loaded.producers[0].1.last_update_ms, 20, "the newer state");
    }

    /// A data record with a header and a null-valued header.
    fn with_headers() -> LogEntry {
        let LogEntry::Data(mut d) = data(3, b"v") else {
            unreachable!()
        };
        d.headers = vec![
            Header {
                key: "trace".into(),
                value: Some(b"abc".to_vec()),
            },
            Header {
                key: "nothing".into(),
                value: None,
            },
        ];
        LogEntry::Data(d)
    }

    #[test]
    fn records_without_headers_keep_the_original_encoding() {
        let bytes = encode_entry(&data(1, b"value"));
        assert_eq!(bytes[0], TAG_DATA);
        let bytes = encode_entry(&with_headers());
        assert_eq!(bytes[0], TAG_DATA_WITH_HEADERS);
        // A forged header count cannot make the decoder reserve much.
        let mut forged = encode_entry(&data(1, b"v"));
        forged[0] = TAG_DATA_WITH_HEADERS;
        forged.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_entry(&forged).is_err());
    }

    #[test]
    fn codec_round_trips_and_rejects_corruption() {
        for e in [data(1, b"value"), data(-1, b""), control(), with_headers()] {
            let bytes = encode_entry(&e);
            assert_eq!(decode_entry(&bytes).unwrap(), e);
            for cut in 0..bytes.len() {
                assert!(decode_entry(&bytes[..cut]).is_err());
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode_entry(&longer).is_err());
        }
        assert!(decode_entry(&[9]).is_err());
        let mut bad_bool = encode_entry(&control());
        bad_bool[11] = 2;
        assert!(decode_entry(&bad_bool).is_err());
    }

    /// Kafka's null key and null value (a tombstone) are kept apart from empty ones, and an
    /// entry stored before nulls were kept (every length real) reads as it did.
    #[test]
    fn null_keys_and_values_are_kept_apart_from_empty_ones() {
        let with = |null_key, null_value| {
            let LogEntry::Data(mut d) = data(1, b"") else {
                unreachable!()
            };
            d.key.clear();
            (d.null_key, d.null_value) = (null_key, null_value);
            LogEntry::Data(d)
        };
        let variants = [
            with(false, false),
            with(true, false),
            with(false, true),
            with(true, true),
        ];
        for e in &variants {
            let bytes = encode_entry(e);
            assert_eq!(&decode_entry(&bytes).unwrap(), e);
            for cut in 0..bytes.len() {
                assert!(decode_entry(&bytes[..cut]).is_err());
            }
        }
        assert_eq!(decode_run(&encode_run(&variants)).unwrap(), variants);
        // The stored bytes of a record with an empty key and value did not change.
        let empty = encode_entry(&variants[0]);
        assert_eq!(&empty[empty.len() - 8..], &[0; 8]);
        // A null that claims bytes after it: trailing bytes, refused.
        let mut forged = encode_entry(&variants[3]);
        forged.push(0);
        assert!(decode_entry(&forged).is_err());
    }

    #[test]
    fn runs_round_trip_and_reject_corruption() {
        let entries = vec![data(1, b"a"), with_headers(), control(), data(2, b"")];
        let bytes = encode_run(&entries);
        assert_eq!(bytes[0], TAG_RUN);
        assert_eq!(decode_run(&bytes).unwrap(), entries);
        assert_eq!(run_len(&bytes).unwrap(), 4);
        for cut in 0..bytes.len() {
            assert!(decode_run(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_run(&longer).is_err());
        // A forged count cannot make the decoder reserve much.
        let mut forged = bytes.clone();
        forged[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_run(&forged).is_err());
        // One entry is stored as its plain encoding, as every record was before runs.
        assert_eq!(encode_run(&[control()]), encode_entry(&control()));
        assert_eq!(
            decode_run(&encode_entry(&control())).unwrap(),
            vec![control()]
        );
        assert_eq!(run_len(&encode_entry(&control())).unwrap(), 1);
    }

    #[test]
    fn memory_engine() {
        let s = MemoryStorage::new();
        exercise(&s);
        s.set_fail_writes(true);
        let tp = TopicPartition::new("t", 0);
        assert!(s.write(&tp, &sample_writes()[0]).is_err());
    }

    #[test]
    fn sled_engine_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = {
            let s = SledStorage::open(dir.path()).unwrap();
            exercise(&s)
        };
        let s = SledStorage::open(dir.path()).unwrap();
        let tp = TopicPartition::new("t", 0);
        assert_eq!(s.load(&tp).unwrap(), loaded);
        assert_eq!(collect(&s, &tp, 0, 10).len(), 3);
    }

    /// DeleteRecords' log start is durable on its own (no flush of the log needed), read back
    /// by the next load and after a reopen, per partition; the records stay readable to the
    /// engine (the service stops serving them).
    #[test]
    fn the_log_start_is_kept_per_partition_and_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (t0, t1) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
        {
            let s = SledStorage::open(dir.path()).unwrap();
            exercise(&s);
            assert_eq!(s.load(&t0).unwrap().log_start_offset, 0);
            s.set_log_start(&t0, 2).unwrap();
            assert_eq!(s.load(&t0).unwrap().log_start_offset, 2);
            assert_eq!(s.load(&t1).unwrap().log_start_offset, 0);
        }
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(s.load(&t0).unwrap().log_start_offset, 2);
        assert_eq!(collect(&s, &t0, 0, 10).len(), 3);
        s.poison();
        assert!(s.set_log_start(&t0, 3).is_err());

        let m = MemoryStorage::new();
        m.set_log_start(&t0, 4).unwrap();
        assert_eq!(m.load(&t0).unwrap().log_start_offset, 4);
        m.set_fail_writes(true);
        assert!(m.set_log_start(&t0, 5).is_err());
        assert_eq!(m.load(&t0).unwrap().log_start_offset, 4);
    }

    #[test]
    fn sled_load_detects_a_mismatched_high_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        SledStorage::open(dir.path())
            .unwrap()
            .write(&tp, &sample_writes()[0])
            .unwrap();
        let s = SledStorage::open(dir.path()).unwrap();
        s.db.open_tree("meta/0/t")
            .unwrap()
            .insert(engine::HW_KEY, &7i64.to_be_bytes())
            .unwrap();
        assert!(matches!(s.load(&tp), Err(Error::Storage(_))));
        let s = {
            drop(s);
            SledStorage::open(dir.path()).unwrap()
        };
        s.db.open_tree("producers/0/t")
            .unwrap()
            .insert(7i64.to_be_bytes(), b"not json".as_slice())
            .unwrap();
        s.db.open_tree("meta/0/t")
            .unwrap()
            .insert(engine::HW_KEY, &2i64.to_be_bytes())
            .unwrap();
        assert!(matches!(s.load(&tp), Err(Error::Storage(_))));
    }

    fn log_file(dir: &std::path::Path) -> std::path::PathBuf {
        // Topic "t" is 0x74.
        dir.join("logs").join("0-74.log")
    }

    /// A partition written before the log files existed (sled `records/..` values of one entry
    /// and of a run) goes on in its log file; scans from any offset read both, in order.
    #[test]
    fn sled_logs_of_the_older_layout_read_on_and_continue_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let old = [data(100, b"one"), data(101, b"run-a"), data(102, b"run-b")];
        {
            let s = SledStorage::open(dir.path()).unwrap();
            let trees = s.trees(&tp).unwrap();
            trees
                .records
                .insert(0i64.to_be_bytes(), encode_entry(&old[0]))
                .unwrap();
            trees
                .records
                .insert(1i64.to_be_bytes(), encode_run(&old[1..]))
                .unwrap();
            trees
                .meta
                .insert(engine::HW_KEY, &3i64.to_be_bytes())
                .unwrap();
        }
        let new: Vec<_> = (0..4).map(|i| data(i, b"new")).collect();
        {
            let s = SledStorage::open(dir.path()).unwrap();
            assert_eq!(s.load(&tp).unwrap().high_watermark, 3);
            for (i, pair) in new.chunks(2).enumerate() {
                s.write(
                    &tp,
                    &Write {
                        base_offset: 3 + 2 * i as i64,
                        entries: pair.to_vec(),
                        producer: None,
                        aborted: None,
                        high_watermark: 5 + 2 * i as i64,
                    },
                )
                .unwrap();
            }
        }
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(s.load(&tp).unwrap().high_watermark, 7);
        let all: Vec<(i64, LogEntry)> = old
            .iter()
            .chain(&new)
            .cloned()
            .enumerate()
            .map(|(i, e)| (i as i64, e))
            .collect();
        for from in -1..8 {
            for to in from..9 {
                let want: Vec<_> = all
                    .iter()
                    .filter(|(o, _)| *o >= from && *o < to)
                    .cloned()
                    .collect();
                assert_eq!(collect(&s, &tp, from, to), want, "[{from}, {to})");
            }
        }
        // An early stop inside the older part ends the scan.
        let mut seen = 0;
        s.scan(&tp, 0, 7, &mut |_, _| {
            seen += 1;
            seen < 2
        })
        .unwrap();
        assert_eq!(seen, 2);
    }

    /// What a crash leaves: a file tail beyond the checkpoint (a flush synced it, sled never
    /// persisted the checkpoint) is replayed; a torn or garbage tail (never acknowledged) is cut.
    #[test]
    fn sled_start_replays_the_tail_after_the_checkpoint_and_cuts_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let writes = sample_writes();
        let after_first = {
            let s = SledStorage::open(dir.path()).unwrap();
            s.write(&tp, &writes[0]).unwrap();
            s.load(&tp).unwrap()
        };
        // The first write's checkpoint, as sled held it then.
        let saved: Vec<(String, Vec<(sled::IVec, sled::IVec)>)> = {
            let s = SledStorage::open(dir.path()).unwrap();
            ["index", "producers", "aborted", "meta"]
                .iter()
                .map(|kind| {
                    let tree = s.db.open_tree(format!("{kind}/0/t")).unwrap();
                    (
                        kind.to_string(),
                        tree.iter().map(|kv| kv.unwrap()).collect(),
                    )
                })
                .collect()
        };
        let full = {
            let s = SledStorage::open(dir.path()).unwrap();
            s.write(&tp, &writes[1]).unwrap();
            s.load(&tp).unwrap()
        };
        assert_ne!(full, after_first);
        // Puts sled back as it was after the first write (its later checkpoint lost).
        let restore_first_checkpoint = || {
            let s = SledStorage::open(dir.path()).unwrap();
            for (kind, kvs) in &saved {
                let tree = s.db.open_tree(format!("{kind}/0/t")).unwrap();
                tree.clear().unwrap();
                for (k, v) in kvs {
                    tree.insert(k, v.clone()).unwrap();
                }
            }
            s.db.flush().unwrap();
        };
        restore_first_checkpoint();
        {
            let s = SledStorage::open(dir.path()).unwrap();
            assert_eq!(s.load(&tp).unwrap(), full, "the tail is replayed");
            assert_eq!(collect(&s, &tp, 0, 10).len(), 3);
        }
        // A torn last frame and garbage after it: cut back to the last whole frame.
        let len = std::fs::metadata(log_file(dir.path())).unwrap().len();
        {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(log_file(dir.path()))
                .unwrap();
            file.set_len(len - 3).unwrap();
        }
        // The checkpoint now says more than the file holds: only the replayed case is
        // recoverable, so restore the first checkpoint (as after a crash before the second).
        restore_first_checkpoint();
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(s.load(&tp).unwrap(), after_first, "the torn write is gone");
        assert!(std::fs::metadata(log_file(dir.path())).unwrap().len() < len - 3);
        assert_eq!(collect(&s, &tp, 0, 10).len(), 2);
        // The log goes on where the cut left it.
        s.write(&tp, &writes[1]).unwrap();
        drop(s);
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(s.load(&tp).unwrap(), full);
    }

    /// Cuts the log file of `dir` right after its last whole frame (the zeros grown ahead of
    /// the writes go), as a file whose last append filled it exactly; returns how many frames
    /// it holds.
    fn end_file_at_last_frame(dir: &std::path::Path) -> usize {
        let bytes = std::fs::read(log_file(dir)).unwrap();
        let (frames, valid_end) = frame::valid_prefix(&bytes, 0, 0);
        std::fs::OpenOptions::new()
            .write(true)
            .open(log_file(dir))
            .unwrap()
            .set_len(valid_end)
            .unwrap();
        frames.len()
    }

    /// A replayed tail is made durable before it is served, even when no cut is needed: an
    /// append that ended exactly at the file's end and was never synced (the process died
    /// before its fdatasync) would otherwise be served, and its retry acknowledged as a
    /// duplicate, while only the page cache holds it.
    #[test]
    fn sled_a_replayed_tail_is_synced_before_it_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let writes = sample_writes();
        {
            let s = SledStorage::open(dir.path()).unwrap();
            // Appended, not flushed: no fdatasync ran, no checkpoint covers it.
            s.append(&tp, &writes[0]).unwrap();
        }
        // The file ends where the frame does (no zeros grown ahead to cut).
        assert_eq!(end_file_at_last_frame(dir.path()), 1);
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(s.load(&tp).unwrap().high_watermark, 2, "replayed");
        assert_eq!(s.opening_syncs.load(Ordering::SeqCst), 1, "and synced");
        // Written again first (after a failed fdatasync the page cache holds such bytes as
        // clean: a sync alone would write nothing): exactly the replayed frame's bytes.
        let frame_bytes = std::fs::metadata(log_file(dir.path())).unwrap().len();
        assert_eq!(s.opening_rewrites.load(Ordering::SeqCst), frame_bytes);
        // Opening a log whose every frame is checkpointed syncs and rewrites nothing.
        s.flush().unwrap();
        drop(s);
        end_file_at_last_frame(dir.path());
        let s = SledStorage::open(dir.path()).unwrap();
        s.load(&tp).unwrap();
        assert_eq!(s.opening_syncs.load(Ordering::SeqCst), 0);
        assert_eq!(s.opening_rewrites.load(Ordering::SeqCst), 0);
    }

    /// After a failed fdatasync the engine refuses every append, load and flush (the service
    /// then takes the partition offline); what was durable before is intact after a restart.
    #[test]
    fn sled_a_poisoned_engine_refuses_everything_until_restart() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let writes = sample_writes();
        let s = SledStorage::open(dir.path()).unwrap();
        s.write(&tp, &writes[0]).unwrap();
        let before = s.load(&tp).unwrap();
        s.poison();
        assert!(matches!(s.append(&tp, &writes[1]), Err(Error::Storage(_))));
        assert!(matches!(s.load(&tp), Err(Error::Storage(_))));
        assert!(matches!(s.flush(), Err(Error::Storage(_))));
        drop(s);
        let s = SledStorage::open(dir.path()).unwrap();
        assert_eq!(s.load(&tp).unwrap(), before);
        s.write(&tp, &writes[1]).unwrap();
    }

    /// A failed checkpoint fails no write: it stops the checkpoints (sled's errors last until
    /// restart), keeps nothing more in memory for them, reports the problem, and a restart
    /// replays the log file from the last good checkpoint.
    #[test]
    fn sled_a_failed_checkpoint_stops_checkpoints_and_fails_no_write() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let writes = sample_writes();
        let s = SledStorage::open(dir.path()).unwrap();
        s.fail_checkpoints();
        s.write(&tp, &writes[0]).unwrap();
        assert!(s.problem().is_none());
        assert_eq!(s.uncheckpointed(), 1);
        // Past the checkpoint interval, so the next flush checkpoints (and fails to).
        std::thread::sleep(std::time::Duration::from_millis(300));
        s.write(&tp, &writes[1]).unwrap();
        let problem = s.problem().expect("a failed checkpoint is reported");
        assert!(problem.contains("restart"), "{problem}");
        assert_eq!(s.uncheckpointed(), 0);
        let third = Write {
            base_offset: 3,
            entries: vec![data(8, b"c")],
            producer: None,
            aborted: None,
            high_watermark: 4,
        };
        s.write(&tp, &third).unwrap();
        assert_eq!(
            s.uncheckpointed(),
            0,
            "entries kept for checkpoints that never come"
        );
        let before = s.load(&tp).unwrap();
        let records = collect(&s, &tp, 0, 10);
        assert_eq!(before.high_watermark, 4);
        drop(s);
        let s = SledStorage::open(dir.path()).unwrap();
        assert!(s.problem().is_none());
        assert_eq!(s.load(&tp).unwrap(), before);
        assert_eq!(collect(&s, &tp, 0, 10), records);
    }

    /// A write that does not continue the log is refused and changes nothing.
    #[test]
    fn sled_refuses_a_write_that_does_not_continue_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let s = SledStorage::open(dir.path()).unwrap();
        let mut w = sample_writes()[0].clone();
        w.base_offset = 5;
        w.high_watermark = 7;
        assert!(matches!(s.append(&tp, &w), Err(Error::Storage(_))));
        assert_eq!(s.load(&tp).unwrap(), LoadedPartition::default());
        s.flush().unwrap();
        assert_eq!(std::fs::metadata(log_file(dir.path())).unwrap().len(), 0);
    }
}
