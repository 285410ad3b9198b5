//! The transaction coordinator's state machine: PROTOCOL.md sections 2-8 as pure functions.
//!
//! What: [`TxnMetadata`] is everything the coordinator stores per transactional id (section 2).
//! Each request is a function of the stored metadata, the request and `now_ms`:
//! [`init_producer_id`], [`add_partitions`], [`add_offsets`], [`txn_offset_commit`], [`end_txn`],
//! [`verify_transaction`], plus the coordinator's own steps [`complete_markers`] (Prepare* ->
//! Complete* once every marker was acknowledged) and [`expire_timed_out`] (section 8). Each
//! returns an [`Outcome`]: the metadata to persist (if anything changed), the markers to send
//! (a [`MarkerJob`]) and the reply. The shell persists first, then replies, then sends markers.
//! On the receiving side of a group's marker, [`write_group_marker`] fences it against what the
//! group recorded ([`GroupMarkerFence`]) and says what to write ([`GroupMarkerWrite`]).
//!
//! Why: no tonic, tokio or sled types here, no clock and no randomness, so every row of the
//! protocol is a plain unit test (`core/tests.rs`, the tests beside each room, and `testdata/`),
//! and the service is a thin shell that only does I/O.
//!
//! Rooms (one file per job; everything is re-exported here, so paths are `core::X`):
//! - this file: the stored types ([`TxnMetadata`], [`TxnState`], identities), the one error
//!   type [`TxnError`] with its wire code, and [`Outcome`].
//! - `txn`: the per-request transitions and the fencing check, plus the timeout scan's step.
//! - `markers`: the transaction coordinator's side of markers: [`MarkerJob`], what a marker
//!   reply means ([`marker_reply`]), and [`complete_markers`].
//! - `group`: the group coordinator's side: [`write_group_marker`] over the shared
//!   [`cluster::marker_fence`] rule.
//! - `pid`: [`PidAllocator`].
//!
//! How fencing reads: [`check_producer`] is the one place that decides whether a (PID, epoch)
//! is the current producer of an id, the way toydb checks a Raft term before anything else.
//!
//! Identities. A settled id has one (PID, epoch). `last_epoch` is the epoch the client held just
//! before the latest bump (or -1 when the bump was a fence, so the fenced instance cannot reclaim
//! the id). Epoch exhaustion: a bump from epoch 32766 (`i16::MAX - 1`) rotates to a new PID at
//! epoch 0 and records the old PID as `previous_pid`; the old (PID, 32766) is then the "last
//! identity" and its retries are recognised. When a transaction ends at 32766, its markers are
//! written with (old PID, 32767) while the client is already told (`next_pid`, 0); until
//! Complete*, the metadata holds pid = old, epoch = 32767, next_pid = new (Kafka's layout), and
//! [`TxnMetadata::client_identity`] is what clients are compared with.
//!
//! Choices where PROTOCOL.md is silent (Kafka's behaviour unless said otherwise):
//! - "Transition in flight" is the shell's per-id lock: a request that arrives while a transition
//!   is being written waits the milliseconds the write takes and then sees the new state, which
//!   is indistinguishable from arriving just after it. The only observable in-flight window is
//!   PrepareCommit/PrepareAbort (markers outstanding), answered CONCURRENT_TRANSACTIONS where the
//!   protocol says so. So an older epoch during Prepare* gets PRODUCER_FENCED, not CONCURRENT.
//! - InitProducerId on an Ongoing transaction (fencing, section 4 step 6) answers
//!   CONCURRENT_TRANSACTIONS after persisting the fence (Kafka's way); the caller retries and
//!   its retry, arriving in CompleteAbort, bumps once more. The new instance therefore ends two
//!   epochs above the fenced one; the markers already carried an epoch above the old instance.
//! - InitProducerId for an unknown id allocates a PID even when an expected (PID, epoch) is
//!   given (step 3 comes before step 5).
//! - InitProducerId in Empty/Complete* leaves the id Empty with the new timeout (Kafka).
//! - A PID "matches" an id if it is the current client PID or the PID of the last identity
//!   (the PID before a rotation), so a stale producer on a rotated-away PID is fenced rather than
//!   told INVALID_PRODUCER_ID_MAPPING.
//! - EndTxn at the current epoch while Prepare* -> CONCURRENT_TRANSACTIONS. EndTxn with the last
//!   identity while Empty/Ongoing (the bump it retries was superseded) -> PRODUCER_FENCED.
//! - **(beyond Kafka)** `timed_out`: set when the timeout scan did the latest bump. The producer
//!   holding the last identity then gets TRANSACTION_TIMED_OUT (instead of PRODUCER_FENCED) for
//!   AddPartitions/AddOffsets/TxnOffsetCommit and for an EndTxn(COMMIT); its EndTxn(ABORT) is a
//!   retry answered with the bumped identity, and InitProducerId(expected = its identity) too.
//!   Any later bump clears the flag, so a real newer instance fences it with PRODUCER_FENCED.
//! - An empty ABORT (Empty/Complete*) goes straight to CompleteAbort with the bump: there are no
//!   markers to write.
//! - Complete* clears partitions, groups and the start time (Kafka).
//! - VerifyTransaction: unknown id / PID -> INVALID_PRODUCER_ID_MAPPING, other epoch ->
//!   INVALID_PRODUCER_EPOCH (what the leader returns to the producer), except for the producer
//!   whose transaction the timeout aborted: TRANSACTION_TIMED_OUT, as it is told here, Prepare* ->
//!   CONCURRENT_TRANSACTIONS, not Ongoing or partition not added -> INVALID_TXN_STATE.
//! - Group markers (WriteGroupOffsetMarker, the group coordinator's side): fenced per group the
//!   way a leader fences WriteTxnMarkers per partition (section 9): epoch below the one last
//!   applied for the PID -> INVALID_PRODUCER_EPOCH, then generation below the one recorded for
//!   the sending coordinator -> TRANSACTION_COORDINATOR_FENCED, equal epoch -> NONE without
//!   writing offsets; see [`write_group_marker`]. Kafka has no such check (its offset commit
//!   markers go through the log of `__consumer_offsets`); here they are direct RPCs, so a late
//!   COMMIT must be refused explicitly or it could move a group's offsets backwards.
//!
//! Transaction version 1 (Kafka clients without KIP-890 part 2): an id records its client's
//! version at InitProducerId ([`init_producer_id_for_version`]); for version 1, [`end_txn`]
//! hands over to [`end_txn_v1`] (the epoch is kept, markers carry it), and a group marker at an
//! already applied epoch is the next transaction. Fencing and the timeout abort bump the epoch
//! for both versions.
//!
//! CAVEATS: no two-phase
//! "PrepareEpochFence" state (the fence is a PrepareAbort); no expiry of idle transactional ids
//! (Kafka's `transactional.id.expiration.ms`), nor of a group's per-PID and per-coordinator
//! fencing records; the timeout of a Prepare* is never checked (markers are retried until
//! acknowledged); the PID stride assumes the set of coordinators never changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cluster::{ProducerEpoch, ProducerId, TopicPartition};
use proto::ErrorCode;
use serde::{Deserialize, Serialize};

mod group;
mod markers;
mod pid;
#[cfg(test)]
mod tests;
mod txn;

pub use group::{
    write_group_marker, GroupMarker, GroupMarkerFence, GroupMarkerWrite, PendingTxnOffsets,
};
pub use markers::{complete_markers, marker_reply, marker_unroutable, MarkerJob, MarkerReply};
pub use pid::{PidAllocation, PidAllocator, PID_BLOCK_SIZE};
pub use txn::{
    add_offsets, add_partitions, check_producer, end_txn, end_txn_v1, expire_timed_out,
    init_producer_id, init_producer_id_for_version, is_expired_id, is_timed_out, txn_offset_commit,
    validate_id, validate_timeout, verify_transaction,
};

/// A transactional id, chosen by the application.
pub type TransactionalId = String;

pub use cluster::{NO_PRODUCER_EPOCH, NO_PRODUCER_ID};
/// The last epoch a client is ever given for a PID (`i16::MAX - 1`): the next bump rotates.
pub const MAX_CLIENT_EPOCH: ProducerEpoch = i16::MAX - 1;
/// The epoch markers carry when a transaction ends at [`MAX_CLIENT_EPOCH`] (never given to a client).
pub const MARKER_ONLY_EPOCH: ProducerEpoch = i16::MAX;

/// PROTOCOL.md section 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TxnState {
    /// A PID and epoch, no transaction open.
    Empty,
    /// Partitions or groups were added.
    Ongoing,
    /// Commit decided and durable; markers being written.
    PrepareCommit,
    /// Abort decided and durable; markers being written.
    PrepareAbort,
    /// Every commit marker acknowledged.
    CompleteCommit,
    /// Every abort marker acknowledged.
    CompleteAbort,
}

impl TxnState {
    /// PrepareCommit or PrepareAbort.
    pub fn is_prepare(self) -> bool {
        matches!(self, Self::PrepareCommit | Self::PrepareAbort)
    }

    /// Empty, CompleteCommit or CompleteAbort: no transaction open, none being finished.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            Self::Empty | Self::CompleteCommit | Self::CompleteAbort
        )
    }

    /// Kafka's name of the state.
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::Ongoing => "Ongoing",
            Self::PrepareCommit => "PrepareCommit",
            Self::PrepareAbort => "PrepareAbort",
            Self::CompleteCommit => "CompleteCommit",
            Self::CompleteAbort => "CompleteAbort",
        }
    }
}

impl std::fmt::Display for TxnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a transaction ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TxnResult {
    /// Make everything visible.
    Commit,
    /// Drop everything.
    Abort,
}

impl TxnResult {
    fn prepare_state(self) -> TxnState {
        match self {
            Self::Commit => TxnState::PrepareCommit,
            Self::Abort => TxnState::PrepareAbort,
        }
    }

    fn complete_state(self) -> TxnState {
        match self {
            Self::Commit => TxnState::CompleteCommit,
            Self::Abort => TxnState::CompleteAbort,
        }
    }

    /// The decision a Prepare* or Complete* state records.
    pub fn of_state(state: TxnState) -> Option<Self> {
        match state {
            TxnState::PrepareCommit | TxnState::CompleteCommit => Some(Self::Commit),
            TxnState::PrepareAbort | TxnState::CompleteAbort => Some(Self::Abort),
            TxnState::Empty | TxnState::Ongoing => None,
        }
    }
}

/// A (PID, epoch) pair: what a producer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProducerIdAndEpoch {
    /// The PID.
    pub producer_id: ProducerId,
    /// The epoch.
    pub epoch: ProducerEpoch,
}

impl ProducerIdAndEpoch {
    /// A pair.
    pub const fn new(producer_id: ProducerId, epoch: ProducerEpoch) -> Self {
        Self { producer_id, epoch }
    }
}

impl std::fmt::Display for ProducerIdAndEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(pid {}, epoch {})", self.producer_id, self.epoch)
    }
}

/// Kafka's client transaction version (KIP-890, Kafka's `clientTransactionVersion`): which
/// EndTxn rules apply to a transactional id. Recorded at InitProducerId, from the client's face.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransactionVersion {
    /// Version 1, for Kafka clients without KIP-890 part 2 (librdkafka, kafka-python): EndTxn
    /// keeps the epoch and the markers carry it ([`end_txn_v1`]).
    V1,
    /// Version 2, our client: every transaction ends with an epoch bump ([`end_txn`]).
    #[default]
    V2,
}

impl TransactionVersion {
    /// From a wire value: 1 is version 1; 0 (unset) and 2 are version 2; anything else `None`.
    pub fn from_wire(value: i32) -> Option<Self> {
        match value {
            1 => Some(Self::V1),
            0 | 2 => Some(Self::V2),
            _ => None,
        }
    }

    /// The wire value (1 or 2).
    pub fn to_wire(self) -> i32 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }
}

/// Pending offsets of one consumer group in a transaction (visible only after commit).
pub type PendingOffsets = BTreeMap<TopicPartition, i64>;

/// Everything stored per transactional id (PROTOCOL.md section 2), persisted as one value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMetadata {
    /// The id this is about.
    pub transactional_id: TransactionalId,
    /// Current PID (during a rotating Prepare*, still the old PID the markers use).
    pub producer_id: ProducerId,
    /// Current epoch (during a rotating Prepare*, [`MARKER_ONLY_EPOCH`]).
    pub producer_epoch: ProducerEpoch,
    /// The epoch the client held before the latest bump, or -1 (fence, or none).
    pub last_epoch: ProducerEpoch,
    /// The PID before the latest rotation, or -1.
    pub previous_producer_id: ProducerId,
    /// During a rotating Prepare*: the PID the client was already given (at epoch 0), else -1.
    pub next_producer_id: ProducerId,
    /// Transaction timeout.
    pub timeout_ms: i32,
    /// State.
    pub state: TxnState,
    /// Partitions in the open (or finishing) transaction.
    pub partitions: BTreeSet<TopicPartition>,
    /// Consumer groups in the transaction, with their pending offsets.
    #[serde(with = "groups_serde")]
    pub groups: BTreeMap<String, PendingOffsets>,
    /// When the open transaction started (left Empty/Complete*), or -1.
    pub txn_start_ms: i64,
    /// Last state change.
    pub last_update_ms: i64,
    /// (beyond Kafka) The latest bump was the timeout scan's abort.
    pub timed_out: bool,
    /// The client transaction version of the producer that last called InitProducerId (records
    /// written before versions existed read as version 2).
    #[serde(default)]
    pub client_transaction_version: TransactionVersion,
    /// (beyond Kafka) The number of the open (or latest) transaction among this id's
    /// transactions: 1 for the first, bumped each time one begins (0: none yet, or a record
    /// written before it existed). The group markers carry it, so a group's coordinator tells a
    /// version-1 marker sent again (same PID and epoch) from the next transaction's.
    #[serde(default)]
    pub transaction_number: u64,
    /// (beyond Kafka) The last [`MAX_EPOCH_HISTORY`] epoch changes, oldest first: what
    /// `transactions history` shows. Not part of the stored value: storage keeps one record per
    /// change beside it (see [`crate::storage`]), so a write costs the same whatever the length
    /// of the history; values written before that carry it inline and still load. Shared
    /// (`Arc`): the copies of the metadata a transition makes, and a new change, copy pointers
    /// only.
    #[serde(
        default,
        skip_serializing,
        deserialize_with = "history_serde::deserialize"
    )]
    pub history: Arc<Vec<Arc<EpochChange>>>,
}

mod history_serde {
    use super::*;
    use serde::Deserializer;

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<Vec<Arc<EpochChange>>>, D::Error> {
        let history = Vec::<EpochChange>::deserialize(d)?;
        Ok(Arc::new(history.into_iter().map(Arc::new).collect()))
    }
}

/// How many epoch changes [`TxnMetadata::history`] keeps.
pub const MAX_EPOCH_HISTORY: usize = 64;

/// One epoch change of a transactional id: the (PID, epoch) it moved to, why, when, and who
/// asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochChange {
    /// The PID after the change.
    pub producer_id: ProducerId,
    /// The epoch after the change (the client's; see [`TxnMetadata::client_identity`]).
    pub epoch: ProducerEpoch,
    /// Why (`new_producer_id`, `new_instance`, `kip360`, `end_txn`, `timeout`, `rotation`).
    pub cause: String,
    /// When (Unix ms).
    pub at_ms: i64,
    /// Who caused it: the client's address as the coordinator saw it, or `coordinator` for its
    /// own timeout scan.
    pub instance: String,
    /// The change's number among all the id's changes (1 for the first; 0 in histories stored
    /// inline before it existed): the key of its record in storage.
    #[serde(default)]
    pub seq: u64,
}

impl TxnMetadata {
    /// Appends one change to the history, dropping the oldest beyond [`MAX_EPOCH_HISTORY`].
    pub fn record_epoch_change(&mut self, cause: &str, instance: &str, at_ms: i64) {
        let identity = self.client_identity();
        let seq = self.history.last().map_or(1, |c| c.seq + 1);
        let history = Arc::make_mut(&mut self.history);
        history.push(Arc::new(EpochChange {
            producer_id: identity.producer_id,
            epoch: identity.epoch,
            cause: cause.to_string(),
            at_ms,
            instance: instance.to_string(),
            seq,
        }));
        let excess = history.len().saturating_sub(MAX_EPOCH_HISTORY);
        history.drain(..excess);
    }
}

/// serde_json maps need string keys; offsets are stored as lists of (partition, offset).
mod groups_serde {
    use super::*;
    use serde::{Deserializer, Serializer};

    type Wire = BTreeMap<String, Vec<(TopicPartition, i64)>>;

    pub fn serialize<S: Serializer>(
        groups: &BTreeMap<String, PendingOffsets>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let wire: Wire = groups
            .iter()
            .map(|(g, o)| {
                (
                    g.clone(),
                    o.iter().map(|(tp, v)| (tp.clone(), *v)).collect(),
                )
            })
            .collect();
        wire.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, PendingOffsets>, D::Error> {
        let wire = Wire::deserialize(d)?;
        Ok(wire
            .into_iter()
            .map(|(g, o)| (g, o.into_iter().collect()))
            .collect())
    }
}

impl TxnMetadata {
    /// A fresh id: `producer_id` at epoch 0, Empty.
    pub fn new(id: &str, producer_id: ProducerId, timeout_ms: i32, now_ms: i64) -> Self {
        Self {
            transactional_id: id.to_string(),
            producer_id,
            producer_epoch: 0,
            last_epoch: NO_PRODUCER_EPOCH,
            previous_producer_id: NO_PRODUCER_ID,
            next_producer_id: NO_PRODUCER_ID,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            groups: BTreeMap::new(),
            txn_start_ms: -1,
            last_update_ms: now_ms,
            timed_out: false,
            client_transaction_version: TransactionVersion::V2,
            transaction_number: 0,
            history: Arc::default(),
        }
    }

    /// The (PID, epoch) the current client holds: `(next_pid, 0)` during a rotating Prepare*.
    pub fn client_identity(&self) -> ProducerIdAndEpoch {
        if self.next_producer_id != NO_PRODUCER_ID {
            ProducerIdAndEpoch::new(self.next_producer_id, 0)
        } else {
            ProducerIdAndEpoch::new(self.producer_id, self.producer_epoch)
        }
    }

    /// The (PID, epoch) the client held just before the latest bump, if its retries are
    /// recognised (`last_epoch` != -1). Right after a rotation it names `previous_pid`.
    pub fn last_identity(&self) -> Option<ProducerIdAndEpoch> {
        if self.last_epoch == NO_PRODUCER_EPOCH {
            return None;
        }
        let rotated = self.next_producer_id == NO_PRODUCER_ID
            && self.producer_epoch == 0
            && self.previous_producer_id != NO_PRODUCER_ID;
        let pid = if rotated {
            self.previous_producer_id
        } else {
            self.producer_id
        };
        Some(ProducerIdAndEpoch::new(pid, self.last_epoch))
    }

    /// The (PID, epoch) markers are written with (meaningful in Prepare*).
    pub fn marker_identity(&self) -> ProducerIdAndEpoch {
        ProducerIdAndEpoch::new(self.producer_id, self.producer_epoch)
    }

    /// Whether `pid` names this id: the client's PID or the PID of the last identity.
    pub fn knows_pid(&self, pid: ProducerId) -> bool {
        pid == self.client_identity().producer_id
            || self.last_identity().is_some_and(|l| l.producer_id == pid)
    }

    /// The error for a known PID whose epoch is not current: TRANSACTION_TIMED_OUT for the
    /// producer whose transaction the timeout scan aborted, PRODUCER_FENCED for anyone else.
    fn stale_producer_error(&self, caller: ProducerIdAndEpoch) -> TxnError {
        if self.timed_out && self.last_identity() == Some(caller) {
            TxnError::TransactionTimedOut(format!(
                "{}: the transaction of {caller} exceeded its {} ms timeout and was aborted; \
                 abort, then continue with {}",
                self.transactional_id,
                self.timeout_ms,
                self.client_identity()
            ))
        } else {
            TxnError::ProducerFenced(format!(
                "{}: {caller} is not the current producer {}",
                self.transactional_id,
                self.client_identity()
            ))
        }
    }

    /// Bump in a settled state (InitProducerId, empty abort): epoch + 1, or rotation from 32766.
    fn bump_settled(
        &self,
        state: TxnState,
        last_epoch: ProducerEpoch,
        fresh_pid: Option<ProducerId>,
        now_ms: i64,
    ) -> Result<Self, TxnError> {
        let mut next = self.clone();
        if self.producer_epoch >= MAX_CLIENT_EPOCH {
            next.previous_producer_id = self.producer_id;
            next.producer_id = fresh_pid.ok_or(TxnError::NeedProducerId)?;
            next.producer_epoch = 0;
        } else {
            next.producer_epoch = self.producer_epoch + 1;
        }
        next.last_epoch = last_epoch;
        next.next_producer_id = NO_PRODUCER_ID;
        next.state = state;
        next.partitions.clear();
        next.groups.clear();
        next.txn_start_ms = -1;
        next.last_update_ms = now_ms;
        next.timed_out = false;
        Ok(next)
    }

    /// Bump into Prepare* (EndTxn, fence, timeout): epoch + 1; from 32766 the markers use
    /// 32767 and the client is given (`next_pid`, 0).
    fn bump_prepare(
        &self,
        result: TxnResult,
        last_epoch: ProducerEpoch,
        fresh_pid: Option<ProducerId>,
        now_ms: i64,
    ) -> Result<Self, TxnError> {
        let mut next = self.clone();
        if self.producer_epoch >= MAX_CLIENT_EPOCH {
            next.next_producer_id = fresh_pid.ok_or(TxnError::NeedProducerId)?;
            next.producer_epoch = MARKER_ONLY_EPOCH;
        } else {
            next.producer_epoch = self.producer_epoch + 1;
        }
        next.last_epoch = last_epoch;
        next.state = result.prepare_state();
        next.last_update_ms = now_ms;
        next.timed_out = false;
        Ok(next)
    }

    /// The markers a Prepare* state still owes (None in any other state).
    pub fn pending_markers(&self) -> Option<MarkerJob> {
        let result = TxnResult::of_state(self.state).filter(|_| self.state.is_prepare())?;
        Some(MarkerJob {
            transactional_id: self.transactional_id.clone(),
            transaction_version: self.client_transaction_version,
            transaction_number: self.transaction_number,
            identity: self.marker_identity(),
            result,
            partitions: self.partitions.clone(),
            groups: self.groups.clone(),
        })
    }
}

/// A protocol decision that is not "OK". Each variant is one of Kafka's error codes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// INVALID_REQUEST.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// INVALID_TRANSACTION_TIMEOUT.
    #[error("invalid transaction timeout: {0}")]
    InvalidTransactionTimeout(String),
    /// CONCURRENT_TRANSACTIONS (retriable).
    #[error("concurrent transactions: {0}")]
    ConcurrentTransactions(String),
    /// PRODUCER_FENCED (fatal for the producer).
    #[error("producer fenced: {0}")]
    ProducerFenced(String),
    /// INVALID_PRODUCER_ID_MAPPING.
    #[error("invalid producer id mapping: {0}")]
    InvalidProducerIdMapping(String),
    /// INVALID_PRODUCER_EPOCH (VerifyTransaction and group markers).
    #[error("invalid producer epoch: {0}")]
    InvalidProducerEpoch(String),
    /// INVALID_TXN_STATE.
    #[error("invalid transaction state: {0}")]
    InvalidTxnState(String),
    /// UNKNOWN_TOPIC_OR_PARTITION.
    #[error("unknown topic or partition: {0}")]
    UnknownTopicOrPartition(String),
    /// TRANSACTION_TIMED_OUT (beyond Kafka; abortable).
    #[error("transaction timed out: {0}")]
    TransactionTimedOut(String),
    /// TRANSACTION_COORDINATOR_FENCED (group markers from an older coordinator generation).
    #[error("transaction coordinator fenced: {0}")]
    TransactionCoordinatorFenced(String),
    /// Internal: the transition needs a freshly allocated PID; call again with one.
    #[error("a new producer id is needed")]
    NeedProducerId,
}

impl TxnError {
    /// The wire code of this decision: the ONE mapping from [`TxnError`] to a code (the
    /// service's [`crate::error_code`] delegates here).
    pub fn code(&self) -> ErrorCode {
        match self {
            TxnError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            TxnError::InvalidTransactionTimeout(_) => ErrorCode::InvalidTransactionTimeout,
            TxnError::ConcurrentTransactions(_) => ErrorCode::ConcurrentTransactions,
            TxnError::ProducerFenced(_) => ErrorCode::ProducerFenced,
            TxnError::InvalidProducerIdMapping(_) => ErrorCode::InvalidProducerIdMapping,
            TxnError::InvalidProducerEpoch(_) => ErrorCode::InvalidProducerEpoch,
            TxnError::InvalidTxnState(_) => ErrorCode::InvalidTxnState,
            TxnError::UnknownTopicOrPartition(_) => ErrorCode::UnknownTopicOrPartition,
            TxnError::TransactionTimedOut(_) => ErrorCode::TransactionTimedOut,
            TxnError::TransactionCoordinatorFenced(_) => ErrorCode::TransactionCoordinatorFenced,
            TxnError::NeedProducerId => ErrorCode::UnknownServerError,
        }
    }

    /// The Kafka name of the error code (what golden scripts and logs print), from the wire
    /// table; the internal [`TxnError::NeedProducerId`] never leaves the coordinator and is
    /// named for logs only.
    pub fn name(&self) -> &'static str {
        match self {
            TxnError::NeedProducerId => "NEED_PRODUCER_ID",
            other => other.code().name(),
        }
    }

    /// The human detail without the error's name: what travels as `error_message` next to the
    /// code (the code already names the error; clients print their own name for it).
    pub fn detail(&self) -> String {
        match self {
            TxnError::InvalidRequest(d)
            | TxnError::InvalidTransactionTimeout(d)
            | TxnError::ConcurrentTransactions(d)
            | TxnError::ProducerFenced(d)
            | TxnError::InvalidProducerIdMapping(d)
            | TxnError::InvalidProducerEpoch(d)
            | TxnError::InvalidTxnState(d)
            | TxnError::UnknownTopicOrPartition(d)
            | TxnError::TransactionTimedOut(d)
            | TxnError::TransactionCoordinatorFenced(d) => d.clone(),
            TxnError::NeedProducerId => self.to_string(),
        }
    }
}

/// What a transition decided: what to persist, which markers to send, what to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// New metadata to make durable before replying (None: nothing changed).
    pub persist: Option<TxnMetadata>,
    /// Markers to send once `persist` is durable.
    pub markers: Option<MarkerJob>,
    /// The reply: the caller's (PID, epoch) from now on, or the error code.
    pub reply: Result<ProducerIdAndEpoch, TxnError>,
}

impl Outcome {
    fn reject(error: TxnError) -> Self {
        Self {
            persist: None,
            markers: None,
            reply: Err(error),
        }
    }

    fn unchanged(identity: ProducerIdAndEpoch) -> Self {
        Self {
            persist: None,
            markers: None,
            reply: Ok(identity),
        }
    }

    fn write(meta: TxnMetadata, reply: Result<ProducerIdAndEpoch, TxnError>) -> Self {
        let markers = meta.pending_markers();
        Self {
            persist: Some(meta),
            markers,
            reply,
        }
    }
}
