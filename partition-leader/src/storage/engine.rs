//! The leader's disk engine: partition log FILES for the records, sled for a checkpoint of the
//! metadata (index, producer states, aborted index, high watermark).
//!
//! Why files: a partition log is append-only, and sled (a B-tree) pays for every record as a key,
//! and again when it rewrites a node holding large values. Measured by the leader bench: 100
//! records of 1 KiB as one sled value cost about half of 100 keys, a file append + fdatasync
//! about a third. Kafka keeps its logs in append-only segment files for the same reason.
//!
//! Layout in the leader's data directory (sled's own files beside it):
//! - `logs/<partition>-<topic as hex>.log`: one frame per write ([`super::frame`]): the
//!   entries and everything else the write changed, with a CRC;
//! - sled, per partition (`<kind>/<partition>/<topic>`): `index/..` (big-endian base offset ->
//!   frame position u64, frame length u32, entry count u32), `producers/..` (big-endian PID ->
//!   JSON [`ProducerState`]), `aborted/..` (big-endian last offset -> JSON [`AbortedTxn`]),
//!   `meta/..` (`hw`: the high watermark, `log_end`: the file position the checkpoint covers,
//!   `log_start`: the log start offset DeleteRecords set, flushed when set);
//! - `records/..`: logs written before the files existed (one entry or one run per value),
//!   still read; new writes never go there.
//!
//! The rule "durable before acknowledged": [`Storage::append`] writes the frame into the file
//! (page cache) and updates the partition's state in memory; [`Storage::flush`] fdatasyncs
//! every file written since the last flush and THEN writes the checkpoint of what it synced into
//! sled (no sled flush needed). So sled never holds metadata whose records could be lost: the
//! checkpoint may lag (sled persists it later, or a crash loses it), never lead. A start reads the
//! checkpoint and replays the file's frames after `log_end` ([`super::frame::valid_prefix`]); a
//! torn or corrupt tail, which no acknowledged write can be in, is cut off.
//!
//! A checkpoint is written when a partition has [`CHECKPOINT_BYTES`] or [`CHECKPOINT_INTERVAL`]
//! past its last one (and at a clean close), not at every flush: a lone small write then costs
//! one fdatasync and nothing else.
//!
//! A failed fdatasync poisons the engine: every later append, load and flush fails until restart
//! (after a failed fsync the kernel may have dropped the dirty pages and a retry would report
//! success). The service then takes the partition offline at its next write (its reload fails),
//! and the health check turns NOT_SERVING, as Kafka takes a failed log directory offline.
//!
//! A failed checkpoint (sled's errors, a full disk among them, last until restart) fails no
//! write: the files are the truth. Checkpoints stop until restart, and what they would have
//! written is no longer kept in memory (it would grow without bound); [`Storage::problem`]
//! reports it, so the health check turns NOT_SERVING, and a restart replays the files from the
//! last good checkpoint.
//!
//! CAVEATS: one file per partition, no segments, retention or index files (the index lives in
//! memory and in sled); a read takes the whole frame holding the offset asked for.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cluster::{ProducerId, TopicPartition};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::frame::{self, Replayed};
use super::{
    decode_run, from_json, json, offset_from_key, run_len, visit_run, LoadedPartition, Storage,
    Write,
};
use crate::core::{AbortedTxn, LogEntry, ProducerState};
use crate::error::{Error, Result};

pub(super) const HW_KEY: &[u8] = b"hw";
const LOG_END_KEY: &[u8] = b"log_end";
/// The log start offset DeleteRecords set (absent: 0). Written and flushed on its own: it is
/// no part of a frame or of the checkpoint.
const LOG_START_KEY: &[u8] = b"log_start";

/// The log file grows by this much ahead of the writes: an fdatasync that must also record a
/// new file size costs ~1.6x one that need not (measured: 1 KiB appends, 234 us against 146 us
/// per append + fdatasync). The zeros past the log's end read as no frame.
const PREALLOCATE: u64 = 4 * 1024 * 1024;

/// A partition's checkpoint is written by the flush once this many bytes of frames, or
/// [`CHECKPOINT_INTERVAL`], are past the last one: a checkpoint costs a sled transaction, and a
/// start replays at most about this much of the file.
const CHECKPOINT_BYTES: u64 = 4 * 1024 * 1024;

/// See [`CHECKPOINT_BYTES`].
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// How many index entries a scan copies per visit of the partition's lock.
const SCAN_CHUNK: usize = 64;

#[derive(Clone)]
pub(super) struct Trees {
    /// Logs written before the log files existed.
    pub(super) records: sled::Tree,
    index: sled::Tree,
    producers: sled::Tree,
    aborted: sled::Tree,
    pub(super) meta: sled::Tree,
}

/// Where a frame is: file position, length, entry count.
#[derive(Clone, Copy, Debug)]
struct Span {
    position: u64,
    len: u32,
    count: u32,
}

impl Span {
    fn encode(&self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.position.to_be_bytes());
        out[8..12].copy_from_slice(&self.len.to_be_bytes());
        out[12..].copy_from_slice(&self.count.to_be_bytes());
        out
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        let bytes: [u8; 16] = bytes
            .try_into()
            .map_err(|_| Error::Storage(format!("corrupt index entry of {}", bytes.len())))?;
        Ok(Self {
            position: u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")),
            len: u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")),
            count: u32::from_be_bytes(bytes[12..].try_into().expect("4 bytes")),
        })
    }
}

/// A write the file holds that the sled checkpoint does not cover yet.
struct Uncheckpointed {
    base_offset: i64,
    span: Span,
    producer: Option<(ProducerId, ProducerState)>,
    aborted: Option<AbortedTxn>,
    high_watermark: i64,
    /// File position after the frame.
    end: u64,
}

/// One partition's log: its file and its state as the file holds it (checkpoint + tail).
struct PartitionLog {
    trees: Trees,
    file: Arc<File>,
    /// Where the next frame goes.
    end: u64,
    /// The file's length (zeros from `end` on).
    allocated: u64,
    index: BTreeMap<i64, Span>,
    producers: BTreeMap<ProducerId, ProducerState>,
    aborted: BTreeMap<i64, AbortedTxn>,
    high_watermark: i64,
    /// Writes since the last checkpoint, in order.
    pending: Vec<Uncheckpointed>,
    /// The file is durable up to here.
    synced: u64,
    /// When the last checkpoint was written (or the log opened).
    checkpointed_at: std::time::Instant,
}

impl PartitionLog {
    /// Whether the flush should write this partition's checkpoint now.
    fn checkpoint_due(&self) -> bool {
        let checkpointed = self.pending.first().map_or(self.end, |w| w.span.position);
        !self.pending.is_empty()
            && (self.end - checkpointed >= CHECKPOINT_BYTES
                || self.checkpointed_at.elapsed() >= CHECKPOINT_INTERVAL)
    }
}

impl PartitionLog {
    fn apply(&mut self, write: &Write, span: Span) {
        self.index.insert(write.base_offset, span);
        if let Some((pid, state)) = &write.producer {
            self.producers.insert(*pid, state.clone());
        }
        if let Some(a) = write.aborted {
            self.aborted.insert(a.last_offset, a);
        }
        self.high_watermark = write.high_watermark;
        self.end = span.position + span.len as u64;
        self.pending.push(Uncheckpointed {
            base_offset: write.base_offset,
            span,
            producer: write.producer.clone(),
            aborted: write.aborted,
            high_watermark: write.high_watermark,
            end: self.end,
        });
    }
}

/// The disk engine (see the module docs): one sled database and one log file per partition.
pub struct SledStorage {
    pub(super) db: sled::Db,
    logs_dir: PathBuf,
    logs: Mutex<HashMap<TopicPartition, Arc<Mutex<PartitionLog>>>>,
    /// One flush at a time (its checkpoints are written in order).
    flushing: Mutex<()>,
    /// A fdatasync failed: nothing is known to be durable any more.
    poisoned: AtomicBool,
    /// A checkpoint failed (sled's errors last until restart): no more checkpoints are written
    /// or kept in memory, a restart replays the files from the last good one; the health check
    /// reports it ([`Storage::problem`]).
    checkpoints_stopped: Mutex<Option<String>>,
    /// Test hook: checkpoints fail.
    #[cfg(test)]
    fail_checkpoints: AtomicBool,
    /// Test probe: how many log files were fdatasynced while being opened.
    #[cfg(test)]
    pub(super) opening_syncs: std::sync::atomic::AtomicU64,
    /// Test probe: how many replayed bytes were written again while opening.
    #[cfg(test)]
    pub(super) opening_rewrites: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::Storage(format!("{what}: {e}"))
}

/// Makes the entries of directory `dir` (a file or folder created in it) durable.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(&format!("syncing the directory {}", dir.display()), e))
}

impl SledStorage {
    /// Opens (or creates) the database and the log directory in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        // Waits, as the coordinator does, for a previous instance to release sled's lock.
        let db = cluster::node::open_sled(dir.as_ref(), cluster::node::SLED_LOCK_WAIT)
            .map_err(|e| io("opening sled", e))?;
        let logs_dir = dir.as_ref().join("logs");
        std::fs::create_dir_all(&logs_dir).map_err(|e| io("creating the log directory", e))?;
        sync_dir(dir.as_ref())?;
        Ok(Self {
            db,
            logs_dir,
            logs: Mutex::new(HashMap::new()),
            flushing: Mutex::new(()),
            poisoned: AtomicBool::new(false),
            checkpoints_stopped: Mutex::new(None),
            #[cfg(test)]
            fail_checkpoints: AtomicBool::new(false),
            #[cfg(test)]
            opening_syncs: std::sync::atomic::AtomicU64::new(0),
            #[cfg(test)]
            opening_rewrites: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Refuses to go on after a failed fdatasync (see the module docs).
    fn check_poisoned(&self) -> Result<()> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(Error::Storage(
                "an earlier fdatasync failed; restart the leader".into(),
            ));
        }
        Ok(())
    }

    #[cfg(test)]
    pub(super) fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
    }

    #[cfg(test)]
    pub(super) fn fail_checkpoints(&self) {
        self.fail_checkpoints.store(true, Ordering::SeqCst);
    }

    /// Checkpoint entries held in memory, waiting for a checkpoint (all partitions).
    #[cfg(test)]
    pub(super) fn uncheckpointed(&self) -> usize {
        lock(&self.logs)
            .values()
            .map(|l| lock(l).pending.len())
            .sum()
    }

    /// Writes a checkpoint unless checkpoints stopped; the first failure stops them (see
    /// `checkpoints_stopped`).
    fn try_checkpoint(&self, tp: &TopicPartition, trees: &Trees, writes: &[Uncheckpointed]) {
        if writes.is_empty() || lock(&self.checkpoints_stopped).is_some() {
            return;
        }
        #[cfg(test)]
        let result = if self.fail_checkpoints.load(Ordering::SeqCst) {
            Err(Error::Storage("injected checkpoint failure".into()))
        } else {
            Self::checkpoint(tp, trees, writes)
        };
        #[cfg(not(test))]
        let result = Self::checkpoint(tp, trees, writes);
        if let Err(e) = result {
            tracing::error!(
                partition = %tp,
                "checkpoint failed, checkpoints stopped until restart (writes go on; a restart \
                 replays the log files from the last checkpoint): {e}"
            );
            lock(&self.checkpoints_stopped).get_or_insert_with(|| format!("{tp}: {e}"));
        }
    }

    pub(super) fn trees(&self, tp: &TopicPartition) -> Result<Trees> {
        let name = |kind: &str| format!("{kind}/{}/{}", tp.partition, tp.topic);
        Ok(Trees {
            records: self.db.open_tree(name("records"))?,
            index: self.db.open_tree(name("index"))?,
            producers: self.db.open_tree(name("producers"))?,
            aborted: self.db.open_tree(name("aborted"))?,
            meta: self.db.open_tree(name("meta"))?,
        })
    }

    fn file_path(&self, tp: &TopicPartition) -> PathBuf {
        let hex: String = tp.topic.bytes().map(|b| format!("{b:02x}")).collect();
        self.logs_dir.join(format!("{}-{hex}.log", tp.partition))
    }

    /// The partition's log, opened (checkpoint read, tail replayed) on first use.
    fn log(&self, tp: &TopicPartition) -> Result<Arc<Mutex<PartitionLog>>> {
        let mut logs = lock(&self.logs);
        if let Some(log) = logs.get(tp) {
            return Ok(log.clone());
        }
        let log = Arc::new(Mutex::new(self.open_log(tp)?));
        logs.insert(tp.clone(), log.clone());
        Ok(log)
    }

    fn open_log(&self, tp: &TopicPartition) -> Result<PartitionLog> {
        let trees = self.trees(tp)?;
        let high_watermark = match trees.meta.get(HW_KEY)? {
            Some(v) => offset_from_key(&v)?,
            None => 0,
        };
        let checkpoint_end = match trees.meta.get(LOG_END_KEY)? {
            Some(v) => offset_from_key(&v)? as u64,
            None => 0,
        };
        let mut index = BTreeMap::new();
        for kv in trees.index.iter() {
            let (k, v) = kv?;
            index.insert(offset_from_key(&k)?, Span::decode(&v)?);
        }
        // The offset after the last stored entry must be the checkpoint's high watermark.
        let next_after_last = match index.iter().next_back() {
            Some((base, span)) => base + span.count as i64,
            None => match trees.records.last()? {
                Some((k, v)) => offset_from_key(&k)? + run_len(&v)?,
                None => 0,
            },
        };
        if next_after_last != high_watermark {
            return Err(Error::Storage(format!(
                "{tp}: stored high watermark {high_watermark} does not follow the last record \
                 ({next_after_last})"
            )));
        }
        let mut producers = BTreeMap::new();
        for kv in trees.producers.iter() {
            let (k, v) = kv?;
            producers.insert(offset_from_key(&k)?, from_json(&v)?);
        }
        let mut aborted = BTreeMap::new();
        for kv in trees.aborted.iter() {
            let (_, v) = kv?;
            let a: AbortedTxn = from_json(&v)?;
            aborted.insert(a.last_offset, a);
        }
        let path = self.file_path(tp);
        let created = !path.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io(&format!("opening {}", path.display()), e))?;
        if created {
            // The new file's name is durable before anything in it is acknowledged (an
            // fdatasync of the file does not promise its directory entry).
            sync_dir(&self.logs_dir)?;
        }
        let len = file
            .metadata()
            .map_err(|e| io("reading the log file's length", e))?
            .len();
        if len < checkpoint_end {
            return Err(Error::Storage(format!(
                "{tp}: the log file ends at {len}, before its checkpoint ({checkpoint_end})"
            )));
        }
        let mut tail = vec![0; (len - checkpoint_end) as usize];
        file.read_exact_at(&mut tail, checkpoint_end)
            .map_err(|e| io("reading the log's tail", e))?;
        let (frames, valid_end) = frame::valid_prefix(&tail, checkpoint_end, high_watermark);
        if valid_end < len {
            // The zeros grown ahead of the writes, or a torn or failed append: never
            // acknowledged (that needs the fdatasync after it).
            file.set_len(valid_end)
                .map_err(|e| io("cutting the log's torn tail", e))?;
        }
        if valid_end > checkpoint_end {
            // Written again before the sync below, so that it writes them for sure: after a
            // failed fdatasync (the previous process saw EIO, was poisoned and is now
            // restarted), Linux keeps the pages that did not reach the disk in the page cache
            // but marks them clean, so a sync of the file as it stands would report success
            // for data only memory holds.
            let replayed = (valid_end - checkpoint_end) as usize;
            file.write_all_at(&tail[..replayed], checkpoint_end)
                .map_err(|e| io("writing the log's replayed tail again", e))?;
            #[cfg(test)]
            self.opening_rewrites
                .fetch_add(replayed as u64, Ordering::SeqCst);
        }
        if valid_end < len || valid_end > checkpoint_end {
            // The cut, and the frames replayed past the checkpoint: those may be in the page
            // cache only (an append whose fdatasync never ran, never acknowledged, ending
            // exactly where the file did). They are served from now on, and a retry of theirs
            // is answered as a duplicate, so they are made durable first.
            file.sync_data()
                .map_err(|e| io("syncing the log's replayed tail", e))?;
            #[cfg(test)]
            self.opening_syncs.fetch_add(1, Ordering::SeqCst);
        }
        let mut log = PartitionLog {
            trees,
            file: Arc::new(file),
            end: checkpoint_end,
            allocated: valid_end,
            index,
            producers,
            aborted,
            high_watermark,
            pending: Vec::new(),
            synced: valid_end,
            checkpointed_at: std::time::Instant::now(),
        };
        for Replayed {
            position,
            len,
            write,
        } in frames
        {
            let count = write.entries.len() as u32;
            log.apply(
                &write,
                Span {
                    position,
                    len,
                    count,
                },
            );
        }
        Ok(log)
    }

    /// Writes the checkpoint of `writes` (all synced) into the partition's sled trees.
    fn checkpoint(tp: &TopicPartition, trees: &Trees, writes: &[Uncheckpointed]) -> Result<()> {
        let Some(last) = writes.last() else {
            return Ok(());
        };
        let index: Vec<_> = writes
            .iter()
            .map(|w| (w.base_offset.to_be_bytes(), w.span.encode()))
            .collect();
        let mut producers = BTreeMap::new();
        for w in writes {
            if let Some((pid, state)) = &w.producer {
                producers.insert(*pid, state);
            }
        }
        let producers: Vec<_> = producers
            .into_iter()
            .map(|(pid, state)| (pid.to_be_bytes(), json(state)))
            .collect();
        let aborted: Vec<_> = writes
            .iter()
            .filter_map(|w| w.aborted.as_ref())
            .map(|a| (a.last_offset.to_be_bytes(), json(a)))
            .collect();
        (&trees.index, &trees.producers, &trees.aborted, &trees.meta)
            .transaction(|(ti, tp_, ta, tm)| {
                for (k, v) in &index {
                    ti.insert(k, v)?;
                }
                for (k, v) in &producers {
                    tp_.insert(k, v.as_slice())?;
                }
                for (k, v) in &aborted {
                    ta.insert(k, v.as_slice())?;
                }
                tm.insert(HW_KEY, &last.high_watermark.to_be_bytes())?;
                tm.insert(LOG_END_KEY, &(last.end as i64).to_be_bytes())?;
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(|e: TransactionError<()>| Error::Storage(format!("{tp}: {e:?}")))?;
        Ok(())
    }

    /// Visits the entries of `[from, to)` stored before the log files existed; `false` if the
    /// visitor stopped.
    fn scan_older(
        trees: &Trees,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(i64, LogEntry) -> bool,
    ) -> Result<bool> {
        // The run holding `from` may begin before it.
        let start = match trees.records.range(..=from.to_be_bytes()).next_back() {
            Some(kv) => offset_from_key(&kv?.0)?,
            None => from,
        };
        for kv in trees.records.range(start.to_be_bytes()..to.to_be_bytes()) {
            let (k, v) = kv?;
            if !visit_run(offset_from_key(&k)?, decode_run(&v)?, from, to, visit) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A clean close checkpoints what was synced and not yet checkpointed (so a restart replays
/// nothing), and flushes sled.
impl Drop for SledStorage {
    fn drop(&mut self) {
        for (tp, log) in lock(&self.logs).iter() {
            let mut l = lock(log);
            let synced = l.synced;
            let durable = l.pending.iter().take_while(|w| w.end <= synced).count();
            let writes: Vec<_> = l.pending.drain(..durable).collect();
            self.try_checkpoint(tp, &l.trees, &writes);
        }
        if let Err(e) = self.db.flush() {
            tracing::warn!("flushing the checkpoints at close failed: {e}");
        }
    }
}

impl Storage for SledStorage {
    fn problem(&self) -> Option<String> {
        lock(&self.checkpoints_stopped)
            .as_ref()
            .map(|e| format!("checkpoints stopped after a failure, restart the leader: {e}"))
    }

    fn load(&self, tp: &TopicPartition) -> Result<LoadedPartition> {
        self.check_poisoned()?;
        let log = self.log(tp)?;
        let log = lock(&log);
        let log_start_offset = match log.trees.meta.get(LOG_START_KEY)? {
            Some(v) => offset_from_key(&v)?,
            None => 0,
        };
        Ok(LoadedPartition {
            log_start_offset,
            high_watermark: log.high_watermark,
            producers: log
                .producers
                .iter()
                .map(|(pid, s)| (*pid, s.clone()))
                .collect(),
            aborted: log.aborted.values().copied().collect(),
        })
    }

    fn append(&self, tp: &TopicPartition, w: &Write) -> Result<()> {
        self.check_poisoned()?;
        let log = self.log(tp)?;
        let mut log = lock(&log);
        if w.base_offset != log.high_watermark
            || w.base_offset + w.entries.len() as i64 != w.high_watermark
        {
            return Err(Error::Storage(format!(
                "{tp}: a write of {} entries at {} (to {}) does not continue the log at {}",
                w.entries.len(),
                w.base_offset,
                w.high_watermark,
                log.high_watermark
            )));
        }
        let bytes = frame::encode(w)?;
        let len = u32::try_from(bytes.len())
            .map_err(|_| Error::Storage(format!("{tp}: a write of {} bytes", bytes.len())))?;
        let needed = log.end + bytes.len() as u64;
        if needed > log.allocated {
            let grown = needed.max(log.allocated + PREALLOCATE);
            log.file
                .set_len(grown)
                .map_err(|e| io(&format!("{tp}: growing the log file"), e))?;
            log.allocated = grown;
        }
        // At `end`: whatever a failed append left there is overwritten.
        log.file
            .write_all_at(&bytes, log.end)
            .map_err(|e| io(&format!("{tp}: appending"), e))?;
        let span = Span {
            position: log.end,
            len,
            count: w.entries.len() as u32,
        };
        log.apply(w, span);
        Ok(())
    }

    fn scan(
        &self,
        tp: &TopicPartition,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(i64, LogEntry) -> bool,
    ) -> Result<()> {
        let from = from.max(0);
        if from >= to {
            return Ok(());
        }
        let log = self.log(tp)?;
        let (trees, file) = {
            let l = lock(&log);
            (l.trees.clone(), l.file.clone())
        };
        if !Self::scan_older(&trees, from, to, visit)? {
            return Ok(());
        }
        let mut cursor = {
            let l = lock(&log);
            // The frame holding `from` may begin before it.
            l.index
                .range(..=from)
                .next_back()
                .map_or(from, |(base, _)| *base)
        };
        loop {
            let spans: Vec<(i64, Span)> = {
                let l = lock(&log);
                l.index
                    .range(cursor..to)
                    .take(SCAN_CHUNK)
                    .map(|(b, s)| (*b, *s))
                    .collect()
            };
            let Some((last, _)) = spans.last() else {
                return Ok(());
            };
            cursor = last + 1;
            for (base, span) in spans {
                let mut bytes = vec![0; span.len as usize];
                file.read_exact_at(&mut bytes, span.position)
                    .map_err(|e| io(&format!("{tp}: reading offset {base}"), e))?;
                let write = frame::decode(&bytes)?;
                if write.base_offset != base {
                    return Err(Error::Storage(format!(
                        "{tp}: the frame indexed at {base} holds offset {}",
                        write.base_offset
                    )));
                }
                if !visit_run(base, write.entries, from, to, visit) {
                    return Ok(());
                }
            }
        }
    }

    /// Forgets the states in memory, takes them out of the writes waiting for a checkpoint,
    /// and removes them from the checkpoint in sled (not flushed: see the trait). Holds
    /// `flushing`, so no checkpoint of an older state of these PIDs can land after the removal.
    fn set_log_start(&self, tp: &TopicPartition, offset: i64) -> Result<()> {
        self.check_poisoned()?;
        let log = self.log(tp)?;
        lock(&log)
            .trees
            .meta
            .insert(LOG_START_KEY, &offset.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    fn forget_producers(&self, tp: &TopicPartition, pids: &[ProducerId]) -> Result<()> {
        let _no_checkpoint_meanwhile = lock(&self.flushing);
        self.check_poisoned()?;
        let log = self.log(tp)?;
        let trees = {
            let mut l = lock(&log);
            for pid in pids {
                l.producers.remove(pid);
            }
            for w in &mut l.pending {
                if w.producer
                    .as_ref()
                    .is_some_and(|(pid, _)| pids.contains(pid))
                {
                    w.producer = None;
                }
            }
            l.trees.clone()
        };
        if lock(&self.checkpoints_stopped).is_some() {
            // The checkpoint in sled is left as it is: a restart replays it, and the scan
            // forgets these states again.
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for pid in pids {
            batch.remove(&pid.to_be_bytes());
        }
        trees
            .producers
            .apply_batch(batch)
            .map_err(|e| Error::Storage(format!("{tp}: forgetting producer states: {e}")))
    }

    fn flush(&self) -> Result<()> {
        let _one_at_a_time = lock(&self.flushing);
        self.check_poisoned()?;
        let stopped = lock(&self.checkpoints_stopped).is_some();
        let logs: Vec<_> = lock(&self.logs)
            .iter()
            .map(|(tp, log)| (tp.clone(), log.clone()))
            .collect();
        // What each file holds now: taken BEFORE the sync, so the sync covers all of it.
        let mut synced = Vec::new();
        for (tp, log) in logs {
            let mut l = lock(&log);
            if l.end > l.synced {
                let writes = if stopped {
                    // Nothing will checkpoint them: not kept (memory stays bounded).
                    l.pending.clear();
                    Vec::new()
                } else if l.checkpoint_due() {
                    l.checkpointed_at = std::time::Instant::now();
                    std::mem::take(&mut l.pending)
                } else {
                    Vec::new()
                };
                let (file, trees, end) = (l.file.clone(), l.trees.clone(), l.end);
                drop(l);
                synced.push((tp, log, file, trees, end, writes));
            }
        }
        for (tp, log, file, _, end, _) in &synced {
            if let Err(e) = file.sync_data() {
                self.poisoned.store(true, Ordering::SeqCst);
                return Err(io(&format!("{tp}: fdatasync"), e));
            }
            let mut l = lock(log);
            l.synced = l.synced.max(*end);
        }
        // Everything synced is durable now; the checkpoints only shorten the next start, so a
        // failed one fails no write (the next start replays more of the file).
        for (tp, _, _, trees, _, writes) in synced {
            self.try_checkpoint(&tp, &trees, &writes);
        }
        Ok(())
    }
}
