//! Durable state of a coordinator, behind a small trait.
//!
//! What is stored:
//! - per transactional id, its [`TxnMetadata`] (tree `__transaction_state`, key = the id's bytes,
//!   value = JSON: small, readable with `sled` tooling, and versionable with serde defaults);
//! - the committed offsets of the consumer groups this node coordinates (tree
//!   `__consumer_offsets`, key = length-prefixed group + length-prefixed topic + big-endian
//!   partition, value = big-endian i64 offset);
//! - per group, what fences its markers (see [`crate::core::write_group_marker`]), tree
//!   `__group_marker_state`: key = length-prefixed group + `b'p'` + big-endian PID, value =
//!   big-endian i16 epoch of the last marker applied for that PID, then the big-endian u64
//!   number of its transaction when the marker carried one; key = length-prefixed group +
//!   `b'c'` + big-endian coordinator id, value = big-endian i64 highest generation seen from it.
//!   [`Storage::apply_group_marker`] writes a marker's offsets and these records in one sled
//!   transaction over both trees, so a crash never leaves offsets without their fence;
//! - per group, the transactional offset commits whose transaction's marker has not been
//!   applied yet (KIP-447, see [`crate::core::PendingTxnOffsets`]), tree
//!   `__pending_txn_offsets`: key = length-prefixed group + big-endian PID + length-prefixed
//!   topic + big-endian partition + big-endian i16 epoch of the commit (records written before
//!   the epoch was kept end at the partition), value = big-endian i64 Unix ms when it was
//!   recorded.
//!   [`Storage::apply_group_marker`] removes the marker's PID's records in the same sled
//!   transaction that writes its offsets (when the marker ends its transaction);
//! - in tree `__coordinator_meta`: the coordinator generation (bumped at every start) and the
//!   PID block bound (see [`crate::core::PidAllocator`]);
//! - per transactional id, its last [`MAX_EPOCH_HISTORY`] epoch changes
//!   ([`TxnMetadata::history`]), one record per change in tree `__transaction_history`, in a
//!   ring of [`MAX_EPOCH_HISTORY`] slots: key = length-prefixed id + big-endian slot
//!   ([`EpochChange::seq`] modulo [`MAX_EPOCH_HISTORY`]), value = JSON (which carries the
//!   `seq`). A write stores the newest change's record over the one that just fell out of the
//!   window: one overwrite, nothing to trim, whatever the length of the history (the metadata
//!   value itself does not carry it; values written before carry it inline, and records keyed
//!   by `seq` come from before the ring: [`Storage::load`] moves both into the ring once).
//!
//! [`Storage::put_txns`] writes several ids' metadata with one flush: the service's group
//! commit (`service/commit.rs`) gathers the transitions of concurrent requests into it. An id
//! that comes twice in one lot (a queued Complete* and the id's next transition: about one
//! write in four at 64 busy ids) is written once, with its last value.
//!
//! Why a trait: the service is written against [`Storage`]; [`SledStorage`] is the real engine,
//! [`MemoryStorage`] the one for tests that do not need a disk. Every write method returns only
//! once the write is durable (sled `flush`), because the protocol replies only after persisting.
//!
//! CAVEATS: the methods are synchronous (sled is); the service calls them on tokio's blocking
//! pool. JSON is not the most compact encoding; a transaction of 10,000 partitions is ~300 KB per
//! write. No compaction or expiry of old ids, nor of a group's per-PID fencing records. A
//! transition's history record and its metadata are two sled writes in one flush: both are
//! durable before the write returns, but a crash during that flush may keep the record
//! without the metadata (a change that was never acknowledged then shows in the history).
//! The writes of one group commit are single sled operations, not a sled batch (which would
//! cost an IO-buffer write of its own): a crash during its flush may keep a part of them, none
//! of which was acknowledged.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use cluster::node::lock;
use cluster::{NodeId, ProducerEpoch, ProducerId, TopicPartition};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use crate::core::{
    EpochChange, GroupMarkerFence, GroupMarkerWrite, PendingOffsets, PendingTxnOffsets,
    TxnMetadata, MAX_EPOCH_HISTORY,
};

/// Name of the sled tree holding transaction metadata.
pub const TXN_STATE_TREE: &str = "__transaction_state";
/// Name of the sled tree holding committed group offsets.
pub const GROUP_OFFSETS_TREE: &str = "__consumer_offsets";
/// Name of the sled tree holding the per-group fencing records of group markers.
pub const GROUP_MARKER_TREE: &str = "__group_marker_state";
/// Name of the sled tree holding the pending transactional offset commits of the groups.
pub const PENDING_OFFSETS_TREE: &str = "__pending_txn_offsets";
/// Name of the sled tree holding the epoch changes of each transactional id.
pub const TXN_HISTORY_TREE: &str = "__transaction_history";
/// Name of the sled tree holding the KIP-848 consumer groups' state
/// ([`crate::consumer_protocol::GroupState`], as JSON), by group id.
pub const CONSUMER_GROUP_TREE: &str = "__consumer_group_state";
/// Name of the sled tree holding the classic groups' last Stable generation
/// ([`crate::consumer_groups::ClassicGroupRecord`], JSON), key = the group id's bytes.
pub const CLASSIC_GROUP_TREE: &str = "__classic_group_state";

/// Which protocol's membership a stored group state is: each has a tree of its own, so a
/// group id that moves from one protocol to the other never has one's record read as the
/// other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupProtocol {
    /// Classic groups (JoinGroup/SyncGroup): [`CLASSIC_GROUP_TREE`].
    Classic,
    /// KIP-848 consumer groups: [`CONSUMER_GROUP_TREE`].
    Consumer,
}
/// Name of the sled tree holding the generation and the PID block.
pub const META_TREE: &str = "__coordinator_meta";
const GENERATION_KEY: &[u8] = b"generation";
const PID_BLOCK_KEY: &[u8] = b"pid_block_end";

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The sled engine failed.
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A stored value could not be decoded.
    #[error("corrupt value under {key:?}: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A file-system error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The blocking task running a storage call failed.
    #[error("storage task: {0}")]
    Task(String),
    /// The group commit that carried this write failed (the message of the batch's error).
    #[error("group commit: {0}")]
    GroupCommit(String),
    /// Encoding failed.
    #[error("encode: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Everything read at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every stored transactional id.
    pub txns: Vec<TxnMetadata>,
    /// The last persisted generation (0 if never started).
    pub generation: i64,
    /// The persisted PID block bound (0 if none).
    pub pid_block_end: i64,
    /// The pending transactional offset commits of the groups.
    pub pending_txn_offsets: Vec<PendingTxnOffset>,
}

/// One partition of a group with a transactional offset commit whose marker has not been
/// applied yet (see [`crate::core::PendingTxnOffsets`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PendingTxnOffset {
    /// The group.
    pub group: String,
    /// The transaction's producer.
    pub producer_id: ProducerId,
    /// The partition.
    pub partition: TopicPartition,
    /// The epoch of the commit (`PendingTxnOffsets::UNKNOWN_EPOCH` for a record written before
    /// the epoch was kept).
    pub epoch: ProducerEpoch,
    /// When it was recorded (Unix ms).
    pub recorded_ms: i64,
}

/// The coordinator's durable state. Every write is durable when it returns.
pub trait Storage: Send + Sync + 'static {
    /// Reads everything (at start).
    fn load(&self) -> Result<Snapshot, StorageError>;
    /// Stores one id's metadata.
    fn put_txn(&self, meta: &TxnMetadata) -> Result<(), StorageError>;
    /// Stores several ids' metadata (a group commit: one flush covers them all); durable when
    /// it returns, like every write. The default writes them one by one.
    fn put_txns(&self, metas: &[TxnMetadata]) -> Result<(), StorageError> {
        metas.iter().try_for_each(|meta| self.put_txn(meta))
    }
    /// Stores several ids' metadata without waiting for durability: the next flush (any
    /// durable write, [`Storage::flush`], or the engine's periodic one) covers it. The service
    /// uses it only for Complete* (see `service/commit.rs`). The default is [`Storage::put_txns`].
    fn write_txns(&self, metas: &[TxnMetadata]) -> Result<(), StorageError> {
        self.put_txns(metas)
    }
    /// Removes the ids' metadata and history (expired ids), without waiting for durability,
    /// as [`Storage::write_txns`]: the next flush covers it.
    fn remove_txns(&self, ids: &[String]) -> Result<(), StorageError>;
    /// Stores the coordinator generation.
    fn put_generation(&self, generation: i64) -> Result<(), StorageError>;
    /// Stores the PID block bound.
    fn put_pid_block(&self, end: i64) -> Result<(), StorageError>;
    /// What `group` recorded about `producer_id` and `coordinator_id` (fences group markers).
    fn group_marker_fence(
        &self,
        group: &str,
        producer_id: ProducerId,
        coordinator_id: NodeId,
    ) -> Result<GroupMarkerFence, StorageError>;
    /// Applies an accepted group marker, atomically: its offsets become the group's committed
    /// offsets (other partitions kept), its epoch, transaction number and generation are
    /// recorded, and, when it ends its transaction ([`GroupMarkerWrite::ends_transaction`]),
    /// its PID's pending transactional offset commits in the group are removed.
    fn apply_group_marker(&self, write: &GroupMarkerWrite) -> Result<(), StorageError>;
    /// Records, durably, that (`producer_id`, `epoch`) has a transactional offset commit for
    /// `partitions` of `group` whose marker is not applied yet (recorded at `recorded_ms`).
    fn put_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        partitions: &[TopicPartition],
        recorded_ms: i64,
    ) -> Result<(), StorageError>;
    /// Removes, durably, what [`Storage::put_pending_txn_offsets`] recorded for `producer_id`
    /// in `group`, for these (partition, epoch) holds.
    fn remove_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: ProducerId,
        holds: &[(TopicPartition, ProducerEpoch)],
    ) -> Result<(), StorageError>;
    /// Commits `offsets` for `group` outside any transaction (Kafka's OffsetCommit); durable
    /// when this returns.
    fn commit_group_offsets(
        &self,
        group: &str,
        offsets: &PendingOffsets,
    ) -> Result<(), StorageError>;
    /// The committed offsets of `group`.
    fn group_offsets(&self, group: &str) -> Result<PendingOffsets, StorageError>;
    /// Removes the committed offsets of `group` for `partitions` (Kafka's DeleteGroups and
    /// OffsetDelete); durable when this returns. The group's marker fences stay: a marker
    /// sent again after the deletion is still known, and puts nothing back.
    fn delete_group_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<(), StorageError>;
    /// Every group with committed offsets, each once (in no particular order).
    fn offset_groups(&self) -> Result<Vec<String>, StorageError>;
    /// Stores a group's membership state of `protocol` (`None`: removes it, the group is
    /// empty); durable when this returns.
    fn put_group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
        state: Option<&[u8]>,
    ) -> Result<(), StorageError>;
    /// A group's stored membership state of `protocol`.
    fn group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
    ) -> Result<Option<Vec<u8>>, StorageError>;
    /// Every stored group membership state of `protocol`, by group id.
    fn group_states(&self, protocol: GroupProtocol)
        -> Result<Vec<(String, Vec<u8>)>, StorageError>;
    /// Flushes everything (at shutdown).
    fn flush(&self) -> Result<(), StorageError>;
}

/// The sled engine.
#[derive(Clone, Debug)]
pub struct SledStorage {
    db: sled::Db,
    txns: sled::Tree,
    history: sled::Tree,
    offsets: sled::Tree,
    markers: sled::Tree,
    pending: sled::Tree,
    meta: sled::Tree,
    consumer_groups: sled::Tree,
    classic_groups: sled::Tree,
    /// Per id, the newest history record known to be stored (filled by [`Storage::load`],
    /// kept by the writes): a write that changed no epoch then skips the record without
    /// reading sled. An id missing here has its newest record written again (same bytes).
    stored_history: Arc<Mutex<HashMap<String, u64>>>,
}

impl SledStorage {
    /// Opens (or creates) the database in `dir` ([`cluster::node::open_sled`]: creates the
    /// directory and first waits, up to [`cluster::node::SLED_LOCK_WAIT`], for a previous
    /// instance to release sled's lock file). Blocking: the service calls it on the blocking pool.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StorageError> {
        let db = cluster::node::open_sled(dir.as_ref(), cluster::node::SLED_LOCK_WAIT)?;
        Ok(Self {
            txns: db.open_tree(TXN_STATE_TREE)?,
            history: db.open_tree(TXN_HISTORY_TREE)?,
            offsets: db.open_tree(GROUP_OFFSETS_TREE)?,
            markers: db.open_tree(GROUP_MARKER_TREE)?,
            pending: db.open_tree(PENDING_OFFSETS_TREE)?,
            meta: db.open_tree(META_TREE)?,
            consumer_groups: db.open_tree(CONSUMER_GROUP_TREE)?,
            classic_groups: db.open_tree(CLASSIC_GROUP_TREE)?,
            stored_history: Arc::default(),
            db,
        })
    }

    fn durable(&self) -> Result<(), StorageError> {
        self.db.flush()?;
        Ok(())
    }

    /// The history record a write of `meta` adds: its newest change, unless stored already
    /// (a write that changed no epoch), in the ring slot of the change that just fell out of
    /// the window. One overwrite: a new key plus the removal of an old one cost sled several
    /// times as much (node splits and merges). Returns the newest change's number when it is
    /// written (for [`SledStorage::stored_history`], once the write succeeded).
    fn history_ops(
        &self,
        meta: &TxnMetadata,
        stored: impl Fn(&str) -> Option<u64>,
        ops: &mut Vec<TreeOp>,
    ) -> Result<Option<u64>, StorageError> {
        let Some(last) = meta.history.last().filter(|c| c.seq > 0) else {
            return Ok(None);
        };
        let id = meta.transactional_id.as_str();
        if stored(id).is_some_and(|s| s >= last.seq) {
            return Ok(None);
        }
        ops.push((
            history_key(id, last.seq),
            Some(serde_json::to_vec(&**last)?),
        ));
        Ok(Some(last.seq))
    }

    /// The tree of `protocol`'s group states.
    fn group_tree(&self, protocol: GroupProtocol) -> &sled::Tree {
        match protocol {
            GroupProtocol::Classic => &self.classic_groups,
            GroupProtocol::Consumer => &self.consumer_groups,
        }
    }

    fn read_i64(&self, key: &[u8]) -> Result<i64, StorageError> {
        match self.meta.get(key)? {
            None => Ok(0),
            Some(v) => Ok(i64::from_be_bytes(v.as_ref().try_into().map_err(|_| {
                StorageError::Corrupt {
                    key: String::from_utf8_lossy(key).into_owned(),
                    reason: format!("{} bytes, expected 8", v.len()),
                }
            })?)),
        }
    }
}

fn group_prefix(group: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(group.len() + 2);
    key.extend_from_slice(&(group.len() as u16).to_be_bytes());
    key.extend_from_slice(group.as_bytes());
    key
}

fn offset_key(group: &str, tp: &TopicPartition) -> Vec<u8> {
    let mut key = group_prefix(group);
    key.extend_from_slice(&(tp.topic.len() as u16).to_be_bytes());
    key.extend_from_slice(tp.topic.as_bytes());
    key.extend_from_slice(&tp.partition.to_be_bytes());
    key
}

fn pid_fence_key(group: &str, producer_id: ProducerId) -> Vec<u8> {
    let mut key = group_prefix(group);
    key.push(b'p');
    key.extend_from_slice(&producer_id.to_be_bytes());
    key
}

fn pending_prefix(group: &str, producer_id: ProducerId) -> Vec<u8> {
    let mut key = group_prefix(group);
    key.extend_from_slice(&producer_id.to_be_bytes());
    key
}

/// The key of a pending commit of (`producer_id`, `epoch`) for `tp`; an `epoch` below 0 (an
/// entry loaded without one) is the key written before the epoch was kept.
fn pending_key(
    group: &str,
    producer_id: ProducerId,
    tp: &TopicPartition,
    epoch: ProducerEpoch,
) -> Vec<u8> {
    let mut key = pending_prefix(group, producer_id);
    key.extend_from_slice(&(tp.topic.len() as u16).to_be_bytes());
    key.extend_from_slice(tp.topic.as_bytes());
    key.extend_from_slice(&tp.partition.to_be_bytes());
    if epoch >= 0 {
        key.extend_from_slice(&epoch.to_be_bytes());
    }
    key
}

/// Decodes a key of [`pending_key`] and its value.
fn decode_pending(key: &[u8], value: &[u8]) -> Option<PendingTxnOffset> {
    let len = u16::from_be_bytes(key.get(..2)?.try_into().ok()?) as usize;
    let group = std::str::from_utf8(key.get(2..2 + len)?).ok()?;
    let producer_id = i64::from_be_bytes(key.get(2 + len..10 + len)?.try_into().ok()?);
    let partition = decode_offset_key(10 + len, key)?;
    let end = 10 + len + 2 + partition.topic.len() + 4;
    let epoch = match key.get(end..)? {
        [] => PendingTxnOffsets::UNKNOWN_EPOCH,
        [a, b] => ProducerEpoch::from_be_bytes([*a, *b]),
        _ => return None,
    };
    let recorded_ms = i64::from_be_bytes(value.try_into().ok()?);
    Some(PendingTxnOffset {
        group: group.to_string(),
        producer_id,
        partition,
        epoch,
        recorded_ms,
    })
}

fn coordinator_fence_key(group: &str, coordinator_id: NodeId) -> Vec<u8> {
    let mut key = group_prefix(group);
    key.push(b'c');
    key.extend_from_slice(&coordinator_id.to_be_bytes());
    key
}

/// The value of a PID's fence record: the epoch, then the transaction number when known.
fn encode_pid_fence(epoch: ProducerEpoch, number: Option<u64>) -> Vec<u8> {
    let mut value = epoch.to_be_bytes().to_vec();
    if let Some(number) = number {
        value.extend_from_slice(&number.to_be_bytes());
    }
    value
}

/// Decodes [`encode_pid_fence`] (a bare epoch was written before the numbers existed).
fn decode_pid_fence(
    key: &[u8],
    value: &[u8],
) -> Result<(ProducerEpoch, Option<u64>), StorageError> {
    match value.len() {
        2 => Ok((ProducerEpoch::from_be_bytes(decode_be(key, value)?), None)),
        _ => {
            let [a, b, number @ ..] = decode_be::<10>(key, value)?;
            Ok((
                ProducerEpoch::from_be_bytes([a, b]),
                Some(u64::from_be_bytes(number)),
            ))
        }
    }
}

/// Decodes a fixed-size big-endian value stored under `key`.
fn decode_be<const N: usize>(key: &[u8], value: &[u8]) -> Result<[u8; N], StorageError> {
    value.try_into().map_err(|_| StorageError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: format!("{} bytes, expected {N}", value.len()),
    })
}

fn history_prefix(transactional_id: &str) -> Vec<u8> {
    group_prefix(transactional_id)
}

/// The key of the ring slot that holds change `seq` of `transactional_id`.
fn history_key(transactional_id: &str, seq: u64) -> Vec<u8> {
    let mut key = history_prefix(transactional_id);
    key.extend_from_slice(&(seq % MAX_EPOCH_HISTORY as u64).to_be_bytes());
    key
}

/// The transactional id a history record's key names.
fn history_key_id(key: &[u8]) -> Option<&str> {
    let len = u16::from_be_bytes(key.get(..2)?.try_into().ok()?) as usize;
    std::str::from_utf8(key.get(2..2 + len)?).ok()
}

/// One change to a tree: insert (`Some`) or remove (`None`).
type TreeOp = (Vec<u8>, Option<Vec<u8>>);

/// Applies `ops` to `tree` one by one, in order (no atomicity among them).
fn apply_each(tree: &sled::Tree, ops: Vec<TreeOp>) -> Result<(), StorageError> {
    for (key, value) in ops {
        match value {
            Some(value) => tree.insert(key, value)?,
            None => tree.remove(key)?,
        };
    }
    Ok(())
}

/// Applies `ops` to `tree`: one by one when there are few (sled's batch has a fixed cost), as
/// one atomic batch otherwise.
fn apply(tree: &sled::Tree, ops: Vec<TreeOp>) -> Result<(), StorageError> {
    if ops.len() <= 2 {
        return apply_each(tree, ops);
    }
    let mut batch = sled::Batch::default();
    for (key, value) in ops {
        match value {
            Some(value) => batch.insert(key, value),
            None => batch.remove(key),
        }
    }
    tree.apply_batch(batch)?;
    Ok(())
}

/// The group whose prefix starts `key` ([`group_prefix`]).
fn decode_group_prefix(key: &[u8]) -> Option<&str> {
    let len = u16::from_be_bytes(key.get(..2)?.try_into().ok()?) as usize;
    std::str::from_utf8(key.get(2..2 + len)?).ok()
}

/// The first key after every key that starts with `prefix`; `None` if there is none.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn decode_offset_key(prefix_len: usize, key: &[u8]) -> Option<TopicPartition> {
    let rest = key.get(prefix_len..)?;
    let len = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let topic = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
    let partition = i32::from_be_bytes(rest.get(2 + len..2 + len + 4)?.try_into().ok()?);
    Some(TopicPartition::new(topic, partition))
}

impl Storage for SledStorage {
    fn load(&self) -> Result<Snapshot, StorageError> {
        let corrupt = |key: &[u8], reason: String| StorageError::Corrupt {
            key: String::from_utf8_lossy(key).into_owned(),
            reason,
        };
        // Per id, its records with their keys (slot keys, or `seq` keys from before the ring).
        type Records = Vec<(sled::IVec, Arc<EpochChange>)>;
        let mut histories: HashMap<String, Records> = HashMap::new();
        for entry in self.history.iter() {
            let (key, value) = entry?;
            let id = history_key_id(&key).ok_or_else(|| corrupt(&key, "bad key".into()))?;
            let change: EpochChange =
                serde_json::from_slice(&value).map_err(|e| corrupt(&key, e.to_string()))?;
            histories
                .entry(id.to_string())
                .or_default()
                .push((key, Arc::new(change)));
        }
        let mut txns = Vec::new();
        let mut stored = lock(&self.stored_history);
        stored.clear();
        let mut migrated = sled::Batch::default();
        let mut migrating = false;
        for entry in self.txns.iter() {
            let (key, value) = entry?;
            let mut meta: TxnMetadata =
                serde_json::from_slice(&value).map_err(|e| corrupt(&key, e.to_string()))?;
            match histories.remove(&meta.transactional_id) {
                Some(mut records) => {
                    // Newest first, by the number each record carries (a ring's keys do not
                    // sort by it). The newest MAX_EPOCH_HISTORY stay, one per slot, each in its
                    // slot; a record beyond the window or under another key (written before
                    // the ring) goes, from disk too. A batch applies its last operation per
                    // key, so the removals go in before the moves into slots.
                    records.sort_by_key(|(_, change)| std::cmp::Reverse(change.seq));
                    let id = &meta.transactional_id;
                    let mut kept: BTreeMap<Vec<u8>, Arc<EpochChange>> = BTreeMap::new();
                    let mut moves = Vec::new();
                    for (key, change) in records {
                        let slot = history_key(id, change.seq);
                        let keep = kept.len() < MAX_EPOCH_HISTORY && !kept.contains_key(&slot);
                        let in_slot = key.as_ref() == slot.as_slice();
                        if !keep || !in_slot {
                            migrated.remove(key);
                            migrating = true;
                        }
                        if keep {
                            if !in_slot {
                                moves.push((slot.clone(), serde_json::to_vec(&*change)?));
                            }
                            kept.insert(slot, change);
                        }
                    }
                    for (slot, value) in moves {
                        migrated.insert(slot, value);
                    }
                    let mut history: Vec<_> = kept.into_values().collect();
                    history.sort_by_key(|change| change.seq);
                    meta.history = Arc::new(history);
                }
                None if !meta.history.is_empty() => {
                    // Stored inline by an older version: one record per change from now on.
                    let history = Arc::make_mut(&mut meta.history);
                    for (change, seq) in history.iter_mut().zip(1..) {
                        let change = Arc::make_mut(change);
                        change.seq = seq;
                        let key = history_key(&meta.transactional_id, seq);
                        migrated.insert(key, serde_json::to_vec(change)?);
                    }
                    migrating = true;
                }
                None => {}
            }
            if let Some(last) = meta.history.last() {
                stored.insert(meta.transactional_id.clone(), last.seq);
            }
            txns.push(meta);
        }
        if migrating {
            self.history.apply_batch(migrated)?;
            self.durable()?;
        }
        let mut pending_txn_offsets = Vec::new();
        for entry in self.pending.iter() {
            let (key, value) = entry?;
            let pending = decode_pending(&key, &value)
                .ok_or_else(|| corrupt(&key, "bad pending offset entry".into()))?;
            pending_txn_offsets.push(pending);
        }
        Ok(Snapshot {
            txns,
            generation: self.read_i64(GENERATION_KEY)?,
            pid_block_end: self.read_i64(PID_BLOCK_KEY)?,
            pending_txn_offsets,
        })
    }

    fn put_txn(&self, meta: &TxnMetadata) -> Result<(), StorageError> {
        self.put_txns(std::slice::from_ref(meta))
    }

    fn put_txns(&self, metas: &[TxnMetadata]) -> Result<(), StorageError> {
        // One flush for the lot: the group commit's whole point.
        self.write_txns(metas)?;
        self.durable()
    }

    fn write_txns(&self, metas: &[TxnMetadata]) -> Result<(), StorageError> {
        // An id written twice in one lot (a queued Complete* and the next transition of the
        // same id, which the group commit often gathers into one flush) needs only its last
        // value: nothing in the lot is acknowledged before the flush that covers all of it.
        // Every value's history record is still written.
        let mut last_write: HashMap<&str, usize> = HashMap::new();
        if metas.len() > 1 {
            for (i, meta) in metas.iter().enumerate() {
                last_write.insert(meta.transactional_id.as_str(), i);
            }
        }
        let superseded = |i: usize, id: &str| last_write.get(id).is_some_and(|last| *last != i);
        let mut txns = Vec::with_capacity(metas.len());
        let mut history = Vec::new();
        // The records this lot writes (the same change again later in the lot is not written
        // twice); `stored_history` learns them once they are written.
        let mut written: HashMap<&str, u64> = HashMap::new();
        let mut stored = lock(&self.stored_history);
        for (i, meta) in metas.iter().enumerate() {
            let id = meta.transactional_id.as_str();
            let known = |id: &str| written.get(id).or_else(|| stored.get(id)).copied();
            if let Some(seq) = self.history_ops(meta, known, &mut history)? {
                written.insert(id, seq);
            }
            if !superseded(i, id) {
                txns.push((id.as_bytes().to_vec(), Some(serde_json::to_vec(meta)?)));
            }
        }
        // The history records go first, so the metadata is never ahead of its history. One
        // operation at a time, not as sled batches: a batch rolls sled's IO buffer (a write
        // of its own), and no atomicity across ids is needed, since nothing here is
        // acknowledged before the flush that follows; sled recovers a prefix of its log, so a
        // crash keeps at most the first part of the lot.
        apply_each(&self.history, history)?;
        for (id, seq) in written {
            stored.insert(id.to_string(), seq);
        }
        apply_each(&self.txns, txns)
    }

    fn remove_txns(&self, ids: &[String]) -> Result<(), StorageError> {
        let mut history = Vec::new();
        for id in ids {
            for key in self.history.scan_prefix(history_prefix(id)).keys() {
                history.push((key?.to_vec(), None));
            }
        }
        let txns = ids
            .iter()
            .map(|id| (id.as_bytes().to_vec(), None))
            .collect();
        // The history goes first: a crash in between leaves metadata without history (loaded
        // with an empty history; the next scan expires it again), never history records
        // without metadata, which a new instance of the id would inherit.
        apply(&self.history, history)?;
        let mut stored = lock(&self.stored_history);
        for id in ids {
            stored.remove(id);
        }
        apply(&self.txns, txns)
    }

    fn put_generation(&self, generation: i64) -> Result<(), StorageError> {
        self.meta
            .insert(GENERATION_KEY, &generation.to_be_bytes())?;
        self.durable()
    }

    fn put_pid_block(&self, end: i64) -> Result<(), StorageError> {
        self.meta.insert(PID_BLOCK_KEY, &end.to_be_bytes())?;
        self.durable()
    }

    fn group_marker_fence(
        &self,
        group: &str,
        producer_id: ProducerId,
        coordinator_id: NodeId,
    ) -> Result<GroupMarkerFence, StorageError> {
        let read = |key: Vec<u8>| -> Result<Option<sled::IVec>, StorageError> {
            Ok(self.markers.get(key)?)
        };
        let pid_key = pid_fence_key(group, producer_id);
        let (producer_epoch, transaction_number) = match read(pid_key.clone())? {
            None => (None, None),
            Some(v) => {
                let (epoch, number) = decode_pid_fence(&pid_key, &v)?;
                (Some(epoch), number)
            }
        };
        let coordinator_key = coordinator_fence_key(group, coordinator_id);
        let coordinator_generation = match read(coordinator_key.clone())? {
            None => None,
            Some(v) => Some(i64::from_be_bytes(decode_be(&coordinator_key, &v)?)),
        };
        Ok(GroupMarkerFence {
            producer_epoch,
            coordinator_generation,
            transaction_number,
        })
    }

    fn apply_group_marker(&self, write: &GroupMarkerWrite) -> Result<(), StorageError> {
        let group = write.group_id.as_str();
        let offsets: Vec<(Vec<u8>, [u8; 8])> = write
            .offsets
            .iter()
            .map(|(tp, offset)| (offset_key(group, tp), offset.to_be_bytes()))
            .collect();
        let pid_key = pid_fence_key(group, write.producer_id);
        let coordinator_key = coordinator_fence_key(group, write.coordinator_id);
        let completed = if write.ends_transaction {
            self.pending
                .scan_prefix(pending_prefix(group, write.producer_id))
                .keys()
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let pid_fence = encode_pid_fence(write.producer_epoch, write.transaction_number);
        // One transaction over the trees: the offsets never become durable without the
        // fence that keeps an older marker from overwriting them, nor while still pending.
        (&self.offsets, &self.markers, &self.pending)
            .transaction(|(offsets_tree, markers_tree, pending_tree)| {
                for (key, value) in &offsets {
                    offsets_tree.insert(key.as_slice(), &value[..])?;
                }
                for key in &completed {
                    pending_tree.remove(key)?;
                }
                markers_tree.insert(pid_key.as_slice(), pid_fence.as_slice())?;
                markers_tree.insert(
                    coordinator_key.as_slice(),
                    &write.coordinator_generation.to_be_bytes(),
                )?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                TransactionError::Storage(e) => StorageError::Sled(e),
                TransactionError::Abort(()) => StorageError::Task("group marker aborted".into()),
            })?;
        self.durable()
    }

    fn put_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        partitions: &[TopicPartition],
        recorded_ms: i64,
    ) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for tp in partitions {
            batch.insert(
                pending_key(group, producer_id, tp, epoch),
                &recorded_ms.to_be_bytes()[..],
            );
        }
        self.pending.apply_batch(batch)?;
        self.durable()
    }

    fn remove_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: ProducerId,
        holds: &[(TopicPartition, ProducerEpoch)],
    ) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for (tp, epoch) in holds {
            batch.remove(pending_key(group, producer_id, tp, *epoch));
        }
        self.pending.apply_batch(batch)?;
        self.durable()
    }

    fn commit_group_offsets(
        &self,
        group: &str,
        offsets: &PendingOffsets,
    ) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for (tp, offset) in offsets {
            batch.insert(offset_key(group, tp), &offset.to_be_bytes()[..]);
        }
        self.offsets.apply_batch(batch)?;
        self.durable()
    }

    fn group_offsets(&self, group: &str) -> Result<PendingOffsets, StorageError> {
        let prefix = group_prefix(group);
        let mut out = BTreeMap::new();
        for entry in self.offsets.scan_prefix(&prefix) {
            let (key, value) = entry?;
            let corrupt = || StorageError::Corrupt {
                key: String::from_utf8_lossy(&key).into_owned(),
                reason: "bad group offset entry".into(),
            };
            let tp = decode_offset_key(prefix.len(), &key).ok_or_else(corrupt)?;
            let offset = i64::from_be_bytes(value.as_ref().try_into().map_err(|_| corrupt())?);
            out.insert(tp, offset);
        }
        Ok(out)
    }

    fn delete_group_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for tp in partitions {
            batch.remove(offset_key(group, tp));
        }
        self.offsets.apply_batch(batch)?;
        self.durable()
    }

    fn offset_groups(&self) -> Result<Vec<String>, StorageError> {
        // One seek per group: past its last key to the next group's first.
        let mut groups = Vec::new();
        let mut from: Vec<u8> = Vec::new();
        while let Some(entry) = self.offsets.range(from.as_slice()..).next() {
            let (key, _) = entry?;
            let group = decode_group_prefix(&key).ok_or_else(|| StorageError::Corrupt {
                key: String::from_utf8_lossy(&key).into_owned(),
                reason: "bad group offset key".into(),
            })?;
            let Some(next) = prefix_end(&group_prefix(group)) else {
                groups.push(group.to_string());
                break;
            };
            groups.push(group.to_string());
            from = next;
        }
        Ok(groups)
    }

    fn put_group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
        state: Option<&[u8]>,
    ) -> Result<(), StorageError> {
        let tree = self.group_tree(protocol);
        match state {
            Some(state) => tree.insert(group.as_bytes(), state)?,
            None => tree.remove(group.as_bytes())?,
        };
        self.durable()
    }

    fn group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .group_tree(protocol)
            .get(group.as_bytes())?
            .map(|v| v.to_vec()))
    }

    fn group_states(
        &self,
        protocol: GroupProtocol,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        self.group_tree(protocol)
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                Ok((String::from_utf8_lossy(&key).into_owned(), value.to_vec()))
            })
            .collect()
    }

    fn flush(&self) -> Result<(), StorageError> {
        self.durable()
    }
}

/// The in-memory engine (tests; "durable" means "in this process").
#[derive(Debug, Default)]
pub struct MemoryStorage {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    txns: BTreeMap<String, TxnMetadata>,
    offsets: BTreeMap<String, PendingOffsets>,
    /// Per group: per PID the epoch, per coordinator the generation.
    fences: BTreeMap<String, MemoryFences>,
    generation: i64,
    pid_block_end: i64,
    /// (group, PID, partition, epoch) -> recorded ms.
    pending: BTreeMap<(String, ProducerId, TopicPartition, ProducerEpoch), i64>,
    /// Groups' membership states.
    group_states: BTreeMap<(GroupProtocol, String), Vec<u8>>,
}

#[derive(Debug, Default)]
struct MemoryFences {
    /// Per PID: the epoch and the transaction number.
    epochs: BTreeMap<ProducerId, (ProducerEpoch, Option<u64>)>,
    generations: BTreeMap<NodeId, i64>,
}

impl MemoryStorage {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut MemoryState) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut state)
    }
}

impl Storage for MemoryStorage {
    fn load(&self) -> Result<Snapshot, StorageError> {
        Ok(self.with(|s| Snapshot {
            txns: s.txns.values().cloned().collect(),
            generation: s.generation,
            pid_block_end: s.pid_block_end,
            pending_txn_offsets: s
                .pending
                .iter()
                .map(
                    |((group, producer_id, partition, epoch), recorded_ms)| PendingTxnOffset {
                        group: group.clone(),
                        producer_id: *producer_id,
                        partition: partition.clone(),
                        epoch: *epoch,
                        recorded_ms: *recorded_ms,
                    },
                )
                .collect(),
        }))
    }

    fn put_txn(&self, meta: &TxnMetadata) -> Result<(), StorageError> {
        self.with(|s| s.txns.insert(meta.transactional_id.clone(), meta.clone()));
        Ok(())
    }

    fn remove_txns(&self, ids: &[String]) -> Result<(), StorageError> {
        self.with(|s| ids.iter().for_each(|id| drop(s.txns.remove(id))));
        Ok(())
    }

    fn put_generation(&self, generation: i64) -> Result<(), StorageError> {
        self.with(|s| s.generation = generation);
        Ok(())
    }

    fn put_pid_block(&self, end: i64) -> Result<(), StorageError> {
        self.with(|s| s.pid_block_end = end);
        Ok(())
    }

    fn group_marker_fence(
        &self,
        group: &str,
        producer_id: ProducerId,
        coordinator_id: NodeId,
    ) -> Result<GroupMarkerFence, StorageError> {
        Ok(self.with(|s| {
            let fences = s.fences.get(group);
            let pid = fences.and_then(|f| f.epochs.get(&producer_id).copied());
            GroupMarkerFence {
                producer_epoch: pid.map(|(epoch, _)| epoch),
                coordinator_generation: fences
                    .and_then(|f| f.generations.get(&coordinator_id).copied()),
                transaction_number: pid.and_then(|(_, number)| number),
            }
        }))
    }

    fn apply_group_marker(&self, write: &GroupMarkerWrite) -> Result<(), StorageError> {
        self.with(|s| {
            let stored = s.offsets.entry(write.group_id.clone()).or_default();
            stored.extend(write.offsets.iter().map(|(tp, o)| (tp.clone(), *o)));
            let fences = s.fences.entry(write.group_id.clone()).or_default();
            fences.epochs.insert(
                write.producer_id,
                (write.producer_epoch, write.transaction_number),
            );
            fences
                .generations
                .insert(write.coordinator_id, write.coordinator_generation);
            if write.ends_transaction {
                s.pending.retain(|(g, pid, _, _), _| {
                    !(g == &write.group_id && *pid == write.producer_id)
                });
            }
        });
        Ok(())
    }

    fn put_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        partitions: &[TopicPartition],
        recorded_ms: i64,
    ) -> Result<(), StorageError> {
        self.with(|s| {
            for tp in partitions {
                s.pending.insert(
                    (group.to_string(), producer_id, tp.clone(), epoch),
                    recorded_ms,
                );
            }
        });
        Ok(())
    }

    fn remove_pending_txn_offsets(
        &self,
        group: &str,
        producer_id: ProducerId,
        holds: &[(TopicPartition, ProducerEpoch)],
    ) -> Result<(), StorageError> {
        self.with(|s| {
            for (tp, epoch) in holds {
                s.pending
                    .remove(&(group.to_string(), producer_id, tp.clone(), *epoch));
            }
        });
        Ok(())
    }

    fn commit_group_offsets(
        &self,
        group: &str,
        offsets: &PendingOffsets,
    ) -> Result<(), StorageError> {
        self.with(|s| {
            let stored = s.offsets.entry(group.to_string()).or_default();
            stored.extend(offsets.iter().map(|(tp, o)| (tp.clone(), *o)));
        });
        Ok(())
    }

    fn group_offsets(&self, group: &str) -> Result<PendingOffsets, StorageError> {
        Ok(self.with(|s| s.offsets.get(group).cloned().unwrap_or_default()))
    }

    fn delete_group_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<(), StorageError> {
        self.with(|s| {
            if let Some(stored) = s.offsets.get_mut(group) {
                for tp in partitions {
                    stored.remove(tp);
                }
                if stored.is_empty() {
                    s.offsets.remove(group);
                }
            }
        });
        Ok(())
    }

    fn offset_groups(&self) -> Result<Vec<String>, StorageError> {
        Ok(self.with(|s| {
            s.offsets
                .iter()
                .filter(|(_, o)| !o.is_empty())
                .map(|(g, _)| g.clone())
                .collect()
        }))
    }

    fn put_group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
        state: Option<&[u8]>,
    ) -> Result<(), StorageError> {
        let key = (protocol, group.to_string());
        self.with(|s| match state {
            Some(state) => s.group_states.insert(key, state.to_vec()),
            None => s.group_states.remove(&key),
        });
        Ok(())
    }

    fn group_state(
        &self,
        protocol: GroupProtocol,
        group: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.with(|s| s.group_states.get(&(protocol, group.to_string())).cloned()))
    }

    fn group_states(
        &self,
        protocol: GroupProtocol,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self.with(|s| {
            s.group_states
                .iter()
                .filter(|((p, _), _)| *p == protocol)
                .map(|((_, g), v)| (g.clone(), v.clone()))
                .collect()
        }))
    }

    fn flush(&self) -> Result<(), StorageError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(store: &dyn Storage) {
        assert_eq!(store.load().unwrap(), Snapshot::default());
        let mut meta = TxnMetadata::new("txn-a", 7, 1000, 5);
        meta.partitions.insert(TopicPartition::new("t", 1));
        store.put_txn(&meta).unwrap();
        meta.producer_epoch = 3;
        store.put_txn(&meta).unwrap();
        store
            .put_txn(&TxnMetadata::new("txn-b", 8, 1000, 5))
            .unwrap();
        store.put_generation(4).unwrap();
        store.put_pid_block(2000).unwrap();
        let snap = store.load().unwrap();
        assert_eq!(snap.txns.len(), 2);
        assert_eq!(snap.txns[0], meta);
        assert_eq!((snap.generation, snap.pid_block_end), (4, 2000));

        // A group commit: several ids, one of them updated, in one call.
        meta.producer_epoch = 4;
        let c = TxnMetadata::new("txn-c", 9, 1000, 5);
        store.put_txns(&[meta.clone(), c.clone()]).unwrap();
        store.put_txns(&[]).unwrap();
        let snap = store.load().unwrap();
        assert_eq!(snap.txns.len(), 3);
        assert_eq!(snap.txns[0], meta);
        assert_eq!(snap.txns[2], c);

        let tp = |t: &str, p| TopicPartition::new(t, p);
        let marker = |group: &str, offsets: PendingOffsets, pid, epoch, generation| {
            store
                .apply_group_marker(&GroupMarkerWrite {
                    group_id: group.into(),
                    offsets,
                    producer_id: pid,
                    producer_epoch: epoch,
                    transaction_number: Some(epoch as u64 + 10),
                    coordinator_id: 1,
                    coordinator_generation: generation,
                    ends_transaction: true,
                })
                .unwrap()
        };
        assert_eq!(
            store.group_marker_fence("g", 7, 1).unwrap(),
            GroupMarkerFence::default()
        );
        marker("g", [(tp("t", 0), 5), (tp("t", 1), 6)].into(), 7, 1, 2);
        marker("g", [(tp("t", 0), 9)].into(), 7, 2, 3);
        // A group whose name is a prefix of another does not leak into it.
        marker("gg", [(tp("t", 0), 1)].into(), 8, 0, 4);
        assert_eq!(
            store.group_offsets("g").unwrap(),
            [(tp("t", 0), 9), (tp("t", 1), 6)].into()
        );
        assert!(store.group_offsets("none").unwrap().is_empty());
        let fence = |epoch: Option<i16>, generation| GroupMarkerFence {
            producer_epoch: epoch,
            coordinator_generation: generation,
            transaction_number: epoch.map(|e| e as u64 + 10),
        };
        assert_eq!(
            store.group_marker_fence("g", 7, 1).unwrap(),
            fence(Some(2), Some(3))
        );
        assert_eq!(
            store.group_marker_fence("g", 8, 2).unwrap(),
            fence(None, None)
        );
        assert_eq!(
            store.group_marker_fence("gg", 8, 1).unwrap(),
            fence(Some(0), Some(4))
        );
        // A plain OffsetCommit: offsets only, the fences are untouched.
        store
            .commit_group_offsets("g", &[(tp("t", 1), 11), (tp("u", 0), 3)].into())
            .unwrap();
        assert_eq!(
            store.group_offsets("g").unwrap(),
            [(tp("t", 0), 9), (tp("t", 1), 11), (tp("u", 0), 3)].into()
        );
        assert_eq!(
            store.group_marker_fence("g", 7, 1).unwrap(),
            fence(Some(2), Some(3))
        );
        // Deleting offsets (DeleteGroups, OffsetDelete): only those named, and a partition
        // without an offset is no error; the fences stay.
        let before = store.offset_groups().unwrap();
        assert!(before.contains(&"g".to_string()), "{before:?}");
        store
            .delete_group_offsets("g", &[tp("t", 1), tp("none", 0)])
            .unwrap();
        assert_eq!(
            store.group_offsets("g").unwrap(),
            [(tp("t", 0), 9), (tp("u", 0), 3)].into()
        );
        assert_eq!(store.offset_groups().unwrap(), before);
        store
            .delete_group_offsets("g", &[tp("t", 0), tp("u", 0)])
            .unwrap();
        assert!(store.group_offsets("g").unwrap().is_empty());
        let after: Vec<String> = before.into_iter().filter(|g| g != "g").collect();
        assert_eq!(store.offset_groups().unwrap(), after);
        assert_eq!(
            store.group_marker_fence("g", 7, 1).unwrap(),
            fence(Some(2), Some(3))
        );
        store.flush().unwrap();
    }

    /// Groups are listed once each, in order, whatever their names (one a prefix of another,
    /// bytes at their maximum).
    /// Group states: stored, replaced, removed, kept apart per protocol, and kept across a
    /// reopen.
    fn group_state(store: &dyn Storage) {
        use GroupProtocol::{Classic, Consumer};
        assert_eq!(store.group_state(Consumer, "g").unwrap(), None);
        store.put_group_state(Consumer, "g", Some(b"one")).unwrap();
        store
            .put_group_state(Consumer, "h", Some(b"other"))
            .unwrap();
        store.put_group_state(Consumer, "g", Some(b"two")).unwrap();
        store
            .put_group_state(Classic, "g", Some(b"classic"))
            .unwrap();
        assert_eq!(
            store.group_state(Consumer, "g").unwrap().as_deref(),
            Some(&b"two"[..])
        );
        store.put_group_state(Consumer, "h", None).unwrap();
        assert_eq!(store.group_state(Consumer, "h").unwrap(), None);
        assert_eq!(
            store.group_states(Consumer).unwrap(),
            vec![("g".to_string(), b"two".to_vec())]
        );
        assert_eq!(
            store.group_states(Classic).unwrap(),
            vec![("g".to_string(), b"classic".to_vec())]
        );
        store.put_group_state(Classic, "g", None).unwrap();
        assert_eq!(
            store.group_state(Consumer, "g").unwrap().as_deref(),
            Some(&b"two"[..]),
            "one protocol's removal leaves the other's state"
        );
    }

    #[test]
    fn group_state_both_engines_and_across_a_reopen() {
        group_state(&MemoryStorage::new());
        let dir = tempfile::tempdir().unwrap();
        group_state(&SledStorage::open(dir.path()).unwrap());
        let reopened = SledStorage::open(dir.path()).unwrap();
        assert_eq!(
            reopened
                .group_state(GroupProtocol::Consumer, "g")
                .unwrap()
                .as_deref(),
            Some(&b"two"[..])
        );
        assert_eq!(
            reopened.group_state(GroupProtocol::Consumer, "h").unwrap(),
            None
        );
        assert_eq!(
            reopened.group_state(GroupProtocol::Classic, "g").unwrap(),
            None
        );
    }

    #[test]
    fn offset_groups_lists_each_group_once() {
        let tp = |t: &str, p| TopicPartition::new(t, p);
        let names = ["g", "gg", "g\u{ff}", "\u{10ffff}", "h"];
        let dir = tempfile::tempdir().unwrap();
        let sled = SledStorage::open(dir.path()).unwrap();
        let memory = MemoryStorage::new();
        for store in [&sled as &dyn Storage, &memory] {
            for (n, group) in names.iter().enumerate() {
                let offsets = (0..3).map(|p| (tp("t", p), n as i64)).collect();
                store.commit_group_offsets(group, &offsets).unwrap();
            }
            let mut expected: Vec<String> = names.iter().map(|g| g.to_string()).collect();
            expected.sort();
            let mut listed = store.offset_groups().unwrap();
            // sled orders by the key (length first), the memory engine by name.
            listed.sort();
            assert_eq!(listed, expected);
        }
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }

    #[test]
    fn memory_engine() {
        exercise(&MemoryStorage::new());
    }

    #[test]
    fn sled_engine_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStorage::open(dir.path()).unwrap();
            exercise(&store);
        }
        // Reopening at once works: `open` waits for the previous instance's lock to go.
        let store = SledStorage::open(dir.path()).unwrap();
        let snap = store.load().unwrap();
        assert_eq!(snap.txns.len(), 3);
        assert_eq!(snap.generation, 4);
        // `exercise` deleted g's offsets at the end; its fences outlive them.
        assert!(store.group_offsets("g").unwrap().is_empty());
        assert_eq!(
            store.group_marker_fence("g", 7, 1).unwrap(),
            GroupMarkerFence {
                producer_epoch: Some(2),
                coordinator_generation: Some(3),
                transaction_number: Some(12),
            }
        );
    }

    #[test]
    fn a_pid_fence_without_a_transaction_number_reads_as_not_known() {
        // A marker that carried no number, and a record written before the numbers existed
        // (a bare epoch).
        let dir = tempfile::tempdir().unwrap();
        let store = SledStorage::open(dir.path()).unwrap();
        store
            .apply_group_marker(&GroupMarkerWrite {
                group_id: "g".into(),
                offsets: PendingOffsets::new(),
                producer_id: 7,
                producer_epoch: 3,
                transaction_number: None,
                coordinator_id: 1,
                coordinator_generation: 1,
                ends_transaction: true,
            })
            .unwrap();
        let fence = store.group_marker_fence("g", 7, 1).unwrap();
        assert_eq!(
            (fence.producer_epoch, fence.transaction_number),
            (Some(3), None)
        );
        store
            .markers
            .insert(pid_fence_key("g", 8), &5i16.to_be_bytes())
            .unwrap();
        let fence = store.group_marker_fence("g", 8, 1).unwrap();
        assert_eq!(
            (fence.producer_epoch, fence.transaction_number),
            (Some(5), None)
        );
        // Anything else is corrupt, not a guess.
        store
            .markers
            .insert(pid_fence_key("g", 9), &[1u8, 2, 3])
            .unwrap();
        assert!(matches!(
            store.group_marker_fence("g", 9, 1),
            Err(StorageError::Corrupt { .. })
        ));
    }

    /// `n` epoch changes of `id`, each written as the service writes them.
    fn changes(store: &dyn Storage, id: &str, n: i64) -> TxnMetadata {
        let mut meta = TxnMetadata::new(id, 7, 1000, 0);
        for at in 0..n {
            meta.producer_epoch = at as i16;
            meta.record_epoch_change("end_txn", "127.0.0.1:1", at);
            store.put_txn(&meta).unwrap();
            // A write that changes no epoch leaves the history as it is.
            meta.last_update_ms = at;
            store.put_txn(&meta).unwrap();
        }
        meta
    }

    /// Pending transactional offsets: recorded per epoch, removed per (partition, epoch),
    /// removed with their PID's group marker when it ends the transaction (and only that
    /// PID's, only in that group), kept by a repeated one, read back by `load`.
    fn pending_offsets(store: &dyn Storage) {
        let tp = |p| TopicPartition::new("input", p);
        let pending = |group: &str, producer_id, epoch, p, recorded_ms| PendingTxnOffset {
            group: group.to_string(),
            producer_id,
            partition: tp(p),
            epoch,
            recorded_ms,
        };
        store
            .put_pending_txn_offsets("g", 7, 1, &[tp(0), tp(1), tp(2)], 100)
            .unwrap();
        // A zombie of PID 7 at an older epoch, for a partition the live instance holds too.
        store
            .put_pending_txn_offsets("g", 7, 0, &[tp(1)], 150)
            .unwrap();
        store
            .put_pending_txn_offsets("g", 8, 0, &[tp(0)], 200)
            .unwrap();
        store
            .put_pending_txn_offsets("h", 7, 1, &[tp(0)], 300)
            .unwrap();
        store
            .remove_pending_txn_offsets("g", 7, &[(tp(2), 1), (tp(1), 0)])
            .unwrap();
        let mut loaded = store.load().unwrap().pending_txn_offsets;
        loaded.sort();
        assert_eq!(
            loaded,
            vec![
                pending("g", 7, 1, 0, 100),
                pending("g", 7, 1, 1, 100),
                pending("g", 8, 0, 0, 200),
                pending("h", 7, 1, 0, 300),
            ]
        );
        let marker = |ends_transaction| GroupMarkerWrite {
            group_id: "g".into(),
            producer_id: 7,
            producer_epoch: 2,
            transaction_number: Some(1),
            coordinator_id: 1,
            coordinator_generation: 1,
            offsets: [(tp(0), 42)].into(),
            ends_transaction,
        };
        // A repeat that records a generation keeps them (the service ends what it must).
        store.apply_group_marker(&marker(false)).unwrap();
        assert_eq!(store.load().unwrap().pending_txn_offsets.len(), 4);
        // PID 7's marker for g: its offsets applied, its pending records gone with them.
        store.apply_group_marker(&marker(true)).unwrap();
        let mut loaded = store.load().unwrap().pending_txn_offsets;
        loaded.sort();
        assert_eq!(
            loaded,
            vec![pending("g", 8, 0, 0, 200), pending("h", 7, 1, 0, 300)]
        );
        store
            .remove_pending_txn_offsets("g", 8, &[(tp(0), 0)])
            .unwrap();
        store
            .remove_pending_txn_offsets("h", 7, &[(tp(0), 1)])
            .unwrap();
        assert!(store.load().unwrap().pending_txn_offsets.is_empty());
    }

    #[test]
    fn pending_offsets_both_engines_and_across_a_reopen() {
        pending_offsets(&MemoryStorage::new());
        let dir = tempfile::tempdir().unwrap();
        pending_offsets(&SledStorage::open(dir.path()).unwrap());
        {
            let store = SledStorage::open(dir.path()).unwrap();
            store
                .put_pending_txn_offsets(
                    "group-with-a-long-name",
                    9,
                    4,
                    &[TopicPartition::new("t", 3)],
                    5,
                )
                .unwrap();
            // A record written before the epoch was kept: its key ends at the partition.
            let legacy = pending_key("g", 9, &TopicPartition::new("t", 1), -1);
            store.pending.insert(legacy, &6i64.to_be_bytes()).unwrap();
        }
        let store = SledStorage::open(dir.path()).unwrap();
        let mut loaded = store.load().unwrap().pending_txn_offsets;
        loaded.sort();
        let legacy = PendingTxnOffset {
            group: "g".into(),
            producer_id: 9,
            partition: TopicPartition::new("t", 1),
            epoch: PendingTxnOffsets::UNKNOWN_EPOCH,
            recorded_ms: 6,
        };
        assert_eq!(
            loaded,
            vec![
                legacy.clone(),
                PendingTxnOffset {
                    group: "group-with-a-long-name".into(),
                    producer_id: 9,
                    partition: TopicPartition::new("t", 3),
                    epoch: 4,
                    recorded_ms: 5,
                },
            ]
        );
        // The legacy record is removed by its own hold.
        store
            .remove_pending_txn_offsets("g", 9, &[(legacy.partition, legacy.epoch)])
            .unwrap();
        assert_eq!(store.load().unwrap().pending_txn_offsets.len(), 1);
    }

    #[test]
    fn the_history_is_kept_per_change_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        // The ring went round once and 21 slots further.
        let n = MAX_EPOCH_HISTORY as i64 + 21;
        let (a, b) = {
            let store = SledStorage::open(dir.path()).unwrap();
            let a = changes(&store, "a", n);
            // An id whose name is a prefix of another keeps its own history.
            let b = changes(&store, "ab", 3);
            // The value itself does not carry the history.
            let value = store.txns.get("a").unwrap().unwrap();
            assert!(!String::from_utf8_lossy(&value).contains("127.0.0.1"));
            // Never more records on disk than the window: each change overwrote the slot
            // of the one that fell out.
            assert_eq!(store.history.len(), MAX_EPOCH_HISTORY + 3);
            (a, b)
        };
        let store = SledStorage::open(dir.path()).unwrap();
        let snap = store.load().unwrap();
        assert_eq!(snap.txns, vec![a.clone(), b]);
        assert_eq!(store.history.len(), MAX_EPOCH_HISTORY + 3);
        assert_eq!(a.history.len(), MAX_EPOCH_HISTORY);
        assert_eq!(a.history[0].epoch, (n - MAX_EPOCH_HISTORY as i64) as i16);
        assert_eq!(a.history.last().unwrap().seq, n as u64);
        // Loaded in order of the changes, not of the slots.
        assert!(a.history.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
        // The memory engine keeps the same.
        let memory = MemoryStorage::new();
        assert_eq!(changes(&memory, "a", n), a);
        assert_eq!(memory.load().unwrap().txns, vec![a]);
    }

    /// An id written twice in one lot (a queued Complete* and the next transition) is stored
    /// once, with its last value; each value's new epoch change still gets its record.
    #[test]
    fn an_id_written_twice_in_one_lot_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = TxnMetadata::new("a", 7, 1000, 0);
        first.record_epoch_change("end_txn", "127.0.0.1:1", 1);
        let other = TxnMetadata::new("b", 8, 1000, 0);
        let mut last = first.clone();
        last.producer_epoch = 1;
        last.record_epoch_change("end_txn", "127.0.0.1:1", 2);
        {
            let store = SledStorage::open(dir.path()).unwrap();
            let mut events = store.txns.watch_prefix("a");
            store
                .put_txns(&[first, other.clone(), last.clone()])
                .unwrap();
            let mut inserts = Vec::new();
            while let Ok(event) = events.next_timeout(std::time::Duration::from_millis(200)) {
                if let sled::Event::Insert { value, .. } = event {
                    inserts.push(serde_json::from_slice::<TxnMetadata>(&value).unwrap());
                }
            }
            assert_eq!(inserts.len(), 1, "{inserts:?}");
            assert_eq!(inserts[0].producer_epoch, 1);
            assert_eq!(store.history.len(), 2);
        }
        let store = SledStorage::open(dir.path()).unwrap();
        assert_eq!(store.load().unwrap().txns, vec![last, other]);
    }

    /// Records keyed by their number (as stored before the ring), a window and a half of
    /// them, move into their slots at load; what is beyond the window goes, and later
    /// writes go round the ring from there.
    #[test]
    fn a_history_keyed_by_change_number_moves_into_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let n = MAX_EPOCH_HISTORY as u64 + MAX_EPOCH_HISTORY as u64 / 2;
        let mut meta = TxnMetadata::new("old", 7, 1000, 0);
        for at in 0..n {
            meta.producer_epoch = at as i16;
            meta.record_epoch_change("end_txn", "127.0.0.1:1", at as i64);
        }
        assert_eq!(meta.history.last().unwrap().seq, n);
        {
            let store = SledStorage::open(dir.path()).unwrap();
            store
                .txns
                .insert("old", serde_json::to_vec(&meta).unwrap())
                .unwrap();
            // A full window of records plus 5 older ones a trim had not removed yet.
            for seq in n - MAX_EPOCH_HISTORY as u64 - 4..=n {
                let mut key = history_prefix("old");
                key.extend_from_slice(&seq.to_be_bytes());
                let change = EpochChange {
                    seq,
                    epoch: (seq - 1) as i16,
                    ..(*meta.history[0]).clone()
                };
                store
                    .history
                    .insert(key, serde_json::to_vec(&change).unwrap())
                    .unwrap();
            }
        }
        let store = SledStorage::open(dir.path()).unwrap();
        let loaded = store.load().unwrap().txns.remove(0);
        let seqs: Vec<u64> = loaded.history.iter().map(|c| c.seq).collect();
        let expected: Vec<u64> = (n + 1 - MAX_EPOCH_HISTORY as u64..=n).collect();
        assert_eq!(seqs, expected);
        assert!(loaded.history.iter().all(|c| c.epoch as u64 == c.seq - 1));
        assert_eq!(store.history.len(), MAX_EPOCH_HISTORY);
        for change in loaded.history.iter() {
            let stored = store
                .history
                .get(history_key("old", change.seq))
                .unwrap()
                .unwrap();
            let stored: EpochChange = serde_json::from_slice(&stored).unwrap();
            assert_eq!(stored.seq, change.seq);
        }
        // The next change overwrites the slot of the oldest; a reload sees the same.
        let mut meta = loaded;
        meta.producer_epoch += 1;
        meta.record_epoch_change("end_txn", "127.0.0.1:1", 0);
        store.put_txn(&meta).unwrap();
        assert_eq!(store.history.len(), MAX_EPOCH_HISTORY);
        drop(store);
        let store = SledStorage::open(dir.path()).unwrap();
        assert_eq!(store.load().unwrap().txns, vec![meta]);
    }

    /// An expired id's removal takes its metadata and its history records, and only its
    /// own (not those of an id its name is a prefix of); across a reopen too.
    #[test]
    fn a_removed_id_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let b = {
            let store = SledStorage::open(dir.path()).unwrap();
            changes(&store, "a", 4);
            let b = changes(&store, "ab", 3);
            store.remove_txns(&["a".to_string()]).unwrap();
            store.flush().unwrap();
            b
        };
        let store = SledStorage::open(dir.path()).unwrap();
        assert_eq!(store.history.len(), 3);
        assert_eq!(store.load().unwrap().txns, vec![b.clone()]);
        // A new instance of the id starts with no history of the old one.
        let fresh = changes(&store, "a", 1);
        assert_eq!(fresh.history.len(), 1);
        let memory = MemoryStorage::new();
        changes(&memory, "a", 4);
        let b = changes(&memory, "ab", 3);
        memory.remove_txns(&["a".to_string()]).unwrap();
        assert_eq!(memory.load().unwrap().txns, vec![b]);
    }

    #[test]
    fn a_history_stored_inline_moves_to_its_own_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut meta = TxnMetadata::new("old", 7, 1000, 0);
        for at in 0..3 {
            meta.producer_epoch = at as i16;
            meta.record_epoch_change("end_txn", "127.0.0.1:1", at);
        }
        // As an older version stored it: the history inside the value, without numbers.
        let mut json = serde_json::to_value(&meta).unwrap();
        let history: Vec<serde_json::Value> = meta
            .history
            .iter()
            .map(|c| {
                let mut c = serde_json::to_value(&**c).unwrap();
                c.as_object_mut().unwrap().remove("seq");
                c
            })
            .collect();
        json["history"] = serde_json::Value::Array(history);
        {
            let store = SledStorage::open(dir.path()).unwrap();
            store
                .txns
                .insert("old", serde_json::to_vec(&json).unwrap())
                .unwrap();
            assert_eq!(store.load().unwrap().txns, vec![meta.clone()]);
            // The next write no longer carries it inline, and a new change is numbered on.
            meta.producer_epoch = 3;
            meta.record_epoch_change("end_txn", "127.0.0.1:1", 3);
            store.put_txn(&meta).unwrap();
        }
        let store = SledStorage::open(dir.path()).unwrap();
        let loaded = store.load().unwrap().txns;
        assert_eq!(loaded, vec![meta]);
        let seqs: Vec<u64> = loaded[0].history.iter().map(|c| c.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4]);
    }

    #[test]
    fn corrupt_values_are_reported_not_panicked() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStorage::open(dir.path()).unwrap();
        store.txns.insert("bad", &b"{not json"[..]).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("bad"), "{err}");
        store
            .markers
            .insert(pid_fence_key("g", 7), &b"x"[..])
            .unwrap();
        let err = store.group_marker_fence("g", 7, 1).unwrap_err();
        assert!(matches!(err, StorageError::Corrupt { .. }), "{err}");
    }
}
