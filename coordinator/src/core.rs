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
//! protocol is a plain unit test (see the bottom of this file and `testdata/`), and the service
//! is a thin shell that only does I/O.
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
//!   INVALID_PRODUCER_EPOCH (what the leader returns to the producer), Prepare* ->
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

use cluster::{NodeId, ProducerEpoch, ProducerId, TopicPartition, Topology};
use serde::{Deserialize, Serialize};

/// A transactional id, chosen by the application.
pub type TransactionalId = String;

/// "No PID".
pub const NO_PRODUCER_ID: ProducerId = -1;
/// "No epoch".
pub const NO_PRODUCER_EPOCH: ProducerEpoch = -1;
/// The last epoch a client is ever given for a PID (`i16::MAX - 1`): the next bump rotates.
pub const MAX_CLIENT_EPOCH: ProducerEpoch = i16::MAX - 1;
/// The epoch markers carry when a transaction ends at [`MAX_CLIENT_EPOCH`] (never given to a client).
pub const MARKER_ONLY_EPOCH: ProducerEpoch = i16::MAX;
/// PIDs reserved (and persisted) per block by [`PidAllocator`].
pub const PID_BLOCK_SIZE: i64 = 1000;

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
    pub fn new(producer_id: ProducerId, epoch: ProducerEpoch) -> Self {
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
            identity: self.marker_identity(),
            result,
            partitions: self.partitions.clone(),
            groups: self.groups.clone(),
        })
    }
}

/// The markers to write for a decided transaction (PROTOCOL.md section 7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkerJob {
    /// The transaction's id.
    pub transactional_id: TransactionalId,
    /// Version 1: the markers carry the epoch the data was written with, not a bumped one.
    pub transaction_version: TransactionVersion,
    /// (PID, bumped epoch) the markers carry.
    pub identity: ProducerIdAndEpoch,
    /// COMMIT or ABORT.
    pub result: TxnResult,
    /// Partitions to write a marker into.
    pub partitions: BTreeSet<TopicPartition>,
    /// Groups to send a group-offset marker to (with the offsets to commit).
    pub groups: BTreeMap<String, PendingOffsets>,
}

impl MarkerJob {
    /// The partitions grouped by the leader that owns them (partitions without a leader in the
    /// topology are under `None`; they cannot occur after the add-time check).
    pub fn partitions_by_leader(
        &self,
        topology: &Topology,
    ) -> BTreeMap<Option<NodeId>, Vec<TopicPartition>> {
        let mut by_leader: BTreeMap<Option<NodeId>, Vec<TopicPartition>> = BTreeMap::new();
        for tp in &self.partitions {
            let leader = topology.leader_for(&tp.topic, tp.partition).map(|n| n.id);
            by_leader.entry(leader).or_default().push(tp.clone());
        }
        by_leader
    }

    /// The groups grouped by the coordinator that owns them.
    pub fn groups_by_coordinator(
        &self,
        topology: &Topology,
    ) -> BTreeMap<NodeId, Vec<(String, PendingOffsets)>> {
        let mut by_node: BTreeMap<NodeId, Vec<(String, PendingOffsets)>> = BTreeMap::new();
        for (group, offsets) in &self.groups {
            by_node
                .entry(topology.coordinator_for(group).id)
                .or_default()
                .push((group.clone(), offsets.clone()));
        }
        by_node
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
    /// The Kafka name of the error code (what golden scripts and logs print).
    pub fn name(&self) -> &'static str {
        match self {
            TxnError::InvalidRequest(_) => "INVALID_REQUEST",
            TxnError::InvalidTransactionTimeout(_) => "INVALID_TRANSACTION_TIMEOUT",
            TxnError::ConcurrentTransactions(_) => "CONCURRENT_TRANSACTIONS",
            TxnError::ProducerFenced(_) => "PRODUCER_FENCED",
            TxnError::InvalidProducerIdMapping(_) => "INVALID_PRODUCER_ID_MAPPING",
            TxnError::InvalidProducerEpoch(_) => "INVALID_PRODUCER_EPOCH",
            TxnError::InvalidTxnState(_) => "INVALID_TXN_STATE",
            TxnError::UnknownTopicOrPartition(_) => "UNKNOWN_TOPIC_OR_PARTITION",
            TxnError::TransactionTimedOut(_) => "TRANSACTION_TIMED_OUT",
            TxnError::TransactionCoordinatorFenced(_) => "TRANSACTION_COORDINATOR_FENCED",
            TxnError::NeedProducerId => "NEED_PRODUCER_ID",
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

fn concurrent(meta: &TxnMetadata) -> TxnError {
    TxnError::ConcurrentTransactions(format!(
        "{} is {}: markers are being written",
        meta.transactional_id, meta.state
    ))
}

/// Checks a transactional id's shape: 1..=255 bytes (PROTOCOL.md section 4 step 1).
pub fn validate_id(what: &str, id: &str) -> Result<(), TxnError> {
    if id.is_empty() {
        return Err(TxnError::InvalidRequest(format!("{what} is empty")));
    }
    if id.len() > cluster::MAX_ID_LEN {
        return Err(TxnError::InvalidRequest(format!(
            "{what} is {} bytes, over the {} byte limit",
            id.len(),
            cluster::MAX_ID_LEN
        )));
    }
    Ok(())
}

/// Checks a transaction timeout is in (0, max].
pub fn validate_timeout(timeout_ms: i32, max_ms: i32) -> Result<(), TxnError> {
    if timeout_ms <= 0 || timeout_ms > max_ms {
        return Err(TxnError::InvalidTransactionTimeout(format!(
            "{timeout_ms} ms is not in (0, {max_ms}]"
        )));
    }
    Ok(())
}

/// The fencing check, in one place (PROTOCOL.md section 5's order): unknown id or PID ->
/// INVALID_PRODUCER_ID_MAPPING; an epoch other than the current one -> PRODUCER_FENCED (or
/// TRANSACTION_TIMED_OUT for the producer the timeout scan aborted).
pub fn check_producer<'a>(
    id: &str,
    meta: Option<&'a TxnMetadata>,
    caller: ProducerIdAndEpoch,
) -> Result<&'a TxnMetadata, TxnError> {
    let meta = meta.ok_or_else(|| {
        TxnError::InvalidProducerIdMapping(format!("transactional id {id:?} is unknown"))
    })?;
    if !meta.knows_pid(caller.producer_id) {
        return Err(TxnError::InvalidProducerIdMapping(format!(
            "{id}: pid {} does not belong to this transactional id",
            caller.producer_id
        )));
    }
    if caller != meta.client_identity() {
        return Err(meta.stale_producer_error(caller));
    }
    Ok(meta)
}

/// InitProducerId (PROTOCOL.md section 4, steps 3-7; steps 1-2 are the shell's).
///
/// `fresh_pid` is used when a new PID is needed (unknown id, rotation); when it is needed and
/// `None`, the reply is [`TxnError::NeedProducerId`] and nothing changes: allocate one and call
/// again.
pub fn init_producer_id(
    id: &str,
    meta: Option<&TxnMetadata>,
    timeout_ms: i32,
    expected: Option<ProducerIdAndEpoch>,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
) -> Outcome {
    // Step 3: unknown id.
    let Some(meta) = meta else {
        return match fresh_pid {
            None => Outcome::reject(TxnError::NeedProducerId),
            Some(pid) => {
                let meta = TxnMetadata::new(id, pid, timeout_ms, now_ms);
                let identity = meta.client_identity();
                Outcome::write(meta, Ok(identity))
            }
        };
    };
    // Step 4: markers outstanding.
    if meta.state.is_prepare() {
        return Outcome::reject(concurrent(meta));
    }
    // Step 5: KIP-360 recovery.
    let mut last_epoch = NO_PRODUCER_EPOCH;
    if let Some(expected) = expected {
        if expected == meta.client_identity() {
            last_epoch = expected.epoch;
        } else if meta.last_identity() == Some(expected) {
            return Outcome::unchanged(meta.client_identity());
        } else {
            return Outcome::reject(TxnError::ProducerFenced(format!(
                "{id}: expected {expected} is neither the current {} nor its predecessor",
                meta.client_identity()
            )));
        }
    }
    match meta.state {
        // Step 6: fence the open transaction of an older instance.
        TxnState::Ongoing => {
            match meta.bump_prepare(TxnResult::Abort, NO_PRODUCER_EPOCH, fresh_pid, now_ms) {
                Err(e) => Outcome::reject(e),
                Ok(next) => {
                    let reply = Err(TxnError::ConcurrentTransactions(format!(
                        "{id}: fencing the open transaction of {}; retry",
                        meta.client_identity()
                    )));
                    Outcome::write(next, reply)
                }
            }
        }
        // Step 7: bump.
        _ => match meta.bump_settled(TxnState::Empty, last_epoch, fresh_pid, now_ms) {
            Err(e) => Outcome::reject(e),
            Ok(mut next) => {
                next.timeout_ms = timeout_ms;
                let identity = next.client_identity();
                Outcome::write(next, Ok(identity))
            }
        },
    }
}

/// [`init_producer_id`] for a client of transaction `version`: the same rules, and the id
/// records the version (Kafka's `clientTransactionVersion`), which decides the rules of its
/// EndTxn ([`end_txn`] or [`end_txn_v1`]) and of its markers. A successful call whose metadata
/// would not change otherwise still writes the new version.
#[allow(clippy::too_many_arguments)]
pub fn init_producer_id_for_version(
    id: &str,
    meta: Option<&TxnMetadata>,
    timeout_ms: i32,
    expected: Option<ProducerIdAndEpoch>,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
    version: TransactionVersion,
) -> Outcome {
    let mut outcome = init_producer_id(id, meta, timeout_ms, expected, now_ms, fresh_pid);
    if outcome.reply.is_err() {
        return outcome;
    }
    match (&mut outcome.persist, meta) {
        (Some(next), _) => {
            // The fence of an open transaction (step 6) answers CONCURRENT_TRANSACTIONS, so the
            // reply is Ok only when the new metadata is the caller's.
            next.client_transaction_version = version;
        }
        (None, Some(meta)) if meta.client_transaction_version != version => {
            let mut next = meta.clone();
            next.client_transaction_version = version;
            outcome.persist = Some(next);
        }
        (None, _) => {}
    }
    outcome
}

/// Shared checks of AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit (section 5):
/// fencing, then Prepare* -> CONCURRENT_TRANSACTIONS.
fn check_add<'a>(
    id: &str,
    meta: Option<&'a TxnMetadata>,
    caller: ProducerIdAndEpoch,
) -> Result<&'a TxnMetadata, TxnError> {
    let meta = check_producer(id, meta, caller)?;
    if meta.state.is_prepare() {
        return Err(concurrent(meta));
    }
    Ok(meta)
}

/// Opens the transaction if needed (start time set when leaving Empty/Complete*).
fn begin(meta: &TxnMetadata, now_ms: i64) -> TxnMetadata {
    let mut next = meta.clone();
    if meta.state.is_settled() {
        next.state = TxnState::Ongoing;
        next.partitions.clear();
        next.groups.clear();
        next.txn_start_ms = now_ms;
    }
    next.last_update_ms = now_ms;
    next
}

/// AddPartitionsToTxn (section 5). A request that adds nothing new writes nothing.
pub fn add_partitions(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    partitions: &[TopicPartition],
    topology: &Topology,
    now_ms: i64,
) -> Outcome {
    let meta = match check_add(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    if let Some(tp) = partitions
        .iter()
        .find(|tp| !topology.partition_exists(&tp.topic, tp.partition))
    {
        return Outcome::reject(TxnError::UnknownTopicOrPartition(format!(
            "{tp} does not exist; nothing was added"
        )));
    }
    let adds_something = partitions.iter().any(|tp| !meta.partitions.contains(tp));
    let nothing_to_open = meta.state.is_settled() && partitions.is_empty();
    if (meta.state == TxnState::Ongoing && !adds_something) || nothing_to_open {
        return Outcome::unchanged(caller);
    }
    let mut next = begin(meta, now_ms);
    next.partitions.extend(partitions.iter().cloned());
    Outcome::write(next, Ok(caller))
}

/// AddOffsetsToTxn (section 5): adds a consumer group to the transaction.
pub fn add_offsets(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    group: &str,
    now_ms: i64,
) -> Outcome {
    let meta = match check_add(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    if meta.state == TxnState::Ongoing && meta.groups.contains_key(group) {
        return Outcome::unchanged(caller);
    }
    let mut next = begin(meta, now_ms);
    next.groups.entry(group.to_string()).or_default();
    Outcome::write(next, Ok(caller))
}

/// TxnOffsetCommit (section 5): records pending offsets of a group already in the transaction.
pub fn txn_offset_commit(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    group: &str,
    offsets: &[(TopicPartition, i64)],
    topology: &Topology,
    now_ms: i64,
) -> Outcome {
    let meta = match check_add(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    let Some(pending) = meta
        .groups
        .get(group)
        .filter(|_| meta.state == TxnState::Ongoing)
    else {
        return Outcome::reject(TxnError::InvalidTxnState(format!(
            "{id}: group {group:?} was not added to the transaction (AddOffsetsToTxn first)"
        )));
    };
    if let Some((tp, _)) = offsets
        .iter()
        .find(|(tp, _)| !topology.partition_exists(&tp.topic, tp.partition))
    {
        return Outcome::reject(TxnError::UnknownTopicOrPartition(format!(
            "{tp} does not exist; no offset was recorded"
        )));
    }
    if offsets.iter().all(|(tp, o)| pending.get(tp) == Some(o)) {
        return Outcome::unchanged(caller);
    }
    let mut next = meta.clone();
    next.last_update_ms = now_ms;
    let entry = next.groups.entry(group.to_string()).or_default();
    for (tp, offset) in offsets {
        entry.insert(tp.clone(), *offset);
    }
    Outcome::write(next, Ok(caller))
}

/// EndTxn (section 6): one epoch per transaction. An id whose client is on transaction
/// version 1 gets [`end_txn_v1`]'s rules instead.
pub fn end_txn(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    result: TxnResult,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
) -> Outcome {
    if meta.is_some_and(|m| m.client_transaction_version == TransactionVersion::V1) {
        return end_txn_v1(id, meta, caller, result, now_ms);
    }
    let Some(meta) = meta.filter(|m| m.knows_pid(caller.producer_id)) else {
        return Outcome::reject(TxnError::InvalidProducerIdMapping(format!(
            "{id}: unknown transactional id or pid {}",
            caller.producer_id
        )));
    };
    let wrong_decision = |what: &str| {
        if meta.timed_out && result == TxnResult::Commit {
            meta.stale_producer_error(caller)
        } else {
            TxnError::InvalidTxnState(format!(
                "{id}: {what} ended with the other decision ({}); cannot {result:?}",
                meta.state
            ))
        }
    };
    if caller == meta.client_identity() {
        return match meta.state {
            TxnState::Ongoing => match meta.bump_prepare(result, caller.epoch, fresh_pid, now_ms) {
                Err(e) => Outcome::reject(e),
                Ok(next) => {
                    let identity = next.client_identity();
                    Outcome::write(next, Ok(identity))
                }
            },
            TxnState::PrepareCommit | TxnState::PrepareAbort => Outcome::reject(concurrent(meta)),
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => match result {
                TxnResult::Commit => Outcome::reject(TxnError::InvalidTxnState(format!(
                    "{id}: no transaction is open ({}); nothing to commit",
                    meta.state
                ))),
                TxnResult::Abort => {
                    match meta.bump_settled(
                        TxnState::CompleteAbort,
                        caller.epoch,
                        fresh_pid,
                        now_ms,
                    ) {
                        Err(e) => Outcome::reject(e),
                        Ok(next) => {
                            let identity = next.client_identity();
                            Outcome::write(next, Ok(identity))
                        }
                    }
                }
            },
        };
    }
    if meta.last_identity() == Some(caller) {
        // A retry of the EndTxn (or the timeout abort) that did the latest bump.
        return match (meta.state, TxnResult::of_state(meta.state)) {
            (state, Some(decided)) if state.is_prepare() => {
                if decided == result {
                    Outcome::reject(concurrent(meta))
                } else {
                    Outcome::reject(wrong_decision("the transaction"))
                }
            }
            (_, Some(decided)) => {
                if decided == result {
                    Outcome::unchanged(meta.client_identity())
                } else {
                    Outcome::reject(wrong_decision("the transaction"))
                }
            }
            (_, None) => Outcome::reject(meta.stale_producer_error(caller)),
        };
    }
    Outcome::reject(meta.stale_producer_error(caller))
}

/// EndTxn for a client on transaction version 1 (PROTOCOL.md section 6, "Transaction version
/// 1"): the epoch is kept, so the transaction's markers carry the epoch its data was written
/// with, and only the current (PID, epoch) may end it:
///
/// | state (caller is current)      | COMMIT                     | ABORT                      |
/// |--------------------------------|----------------------------|----------------------------|
/// | Ongoing                        | PrepareCommit, same epoch  | PrepareAbort, same epoch   |
/// | PrepareCommit / PrepareAbort   | CONCURRENT_TRANSACTIONS    | CONCURRENT_TRANSACTIONS    |
/// | CompleteCommit                 | OK (a retry), no write     | INVALID_TXN_STATE          |
/// | CompleteAbort                  | INVALID_TXN_STATE          | OK (a retry), no write     |
/// | Empty                          | INVALID_TXN_STATE          | OK, no write               |
///
/// Any other epoch of the id's PID is PRODUCER_FENCED (TRANSACTION_TIMED_OUT for the producer
/// the timeout scan aborted): version 1 has no "last epoch" retry, since EndTxn never bumps.
/// An unknown id or PID is INVALID_PRODUCER_ID_MAPPING.
pub fn end_txn_v1(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    result: TxnResult,
    now_ms: i64,
) -> Outcome {
    let meta = match check_producer(id, meta, caller) {
        Ok(meta) => meta,
        Err(e) => return Outcome::reject(e),
    };
    match meta.state {
        TxnState::Ongoing => {
            let mut next = meta.clone();
            next.state = result.prepare_state();
            next.last_update_ms = now_ms;
            next.timed_out = false;
            Outcome::write(next, Ok(caller))
        }
        TxnState::PrepareCommit | TxnState::PrepareAbort => Outcome::reject(concurrent(meta)),
        TxnState::CompleteCommit | TxnState::CompleteAbort | TxnState::Empty => {
            let decided = TxnResult::of_state(meta.state);
            if decided == Some(result) || (decided.is_none() && result == TxnResult::Abort) {
                Outcome::unchanged(caller)
            } else {
                Outcome::reject(TxnError::InvalidTxnState(format!(
                    "{id}: no open transaction to {result:?} ({})",
                    meta.state
                )))
            }
        }
    }
}

/// VerifyTransaction (KIP-890 part 1, PROTOCOL.md section 9 step 4): may `caller` open a
/// transaction on `partition`?
pub fn verify_transaction(
    id: &str,
    meta: Option<&TxnMetadata>,
    caller: ProducerIdAndEpoch,
    partition: &TopicPartition,
) -> Result<(), TxnError> {
    let meta = match check_producer(id, meta, caller) {
        Ok(meta) => meta,
        Err(TxnError::ProducerFenced(m) | TxnError::TransactionTimedOut(m)) => {
            return Err(TxnError::InvalidProducerEpoch(m))
        }
        Err(e) => return Err(e),
    };
    if meta.state.is_prepare() {
        return Err(concurrent(meta));
    }
    if meta.state != TxnState::Ongoing || !meta.partitions.contains(partition) {
        return Err(TxnError::InvalidTxnState(format!(
            "{id}: {partition} was not added to an ongoing transaction ({})",
            meta.state
        )));
    }
    Ok(())
}

/// Every marker of `job` was acknowledged: Prepare* -> Complete* (section 7). Does nothing if
/// the metadata is no longer the Prepare* that `job` was made from.
pub fn complete_markers(meta: &TxnMetadata, job: &MarkerJob, now_ms: i64) -> Outcome {
    if meta.pending_markers().as_ref() != Some(job) {
        return Outcome::unchanged(meta.client_identity());
    }
    let mut next = meta.clone();
    if meta.next_producer_id != NO_PRODUCER_ID {
        next.previous_producer_id = meta.producer_id;
        next.producer_id = meta.next_producer_id;
        next.producer_epoch = 0;
        next.next_producer_id = NO_PRODUCER_ID;
    }
    next.state = job.result.complete_state();
    next.partitions.clear();
    next.groups.clear();
    next.txn_start_ms = -1;
    next.last_update_ms = now_ms;
    let identity = next.client_identity();
    Outcome {
        persist: Some(next),
        markers: None,
        reply: Ok(identity),
    }
}

/// Whether the timeout scan should abort this transaction now.
pub fn is_timed_out(meta: &TxnMetadata, now_ms: i64) -> bool {
    meta.state == TxnState::Ongoing
        && meta.txn_start_ms >= 0
        && now_ms.saturating_sub(meta.txn_start_ms) > i64::from(meta.timeout_ms)
}

/// The timeout scan for one id (section 8): an Ongoing transaction older than its timeout is
/// fenced (epoch bump, `last_epoch` = the old epoch, `timed_out` set) and moved to PrepareAbort.
/// Returns `None` when there is nothing to do.
pub fn expire_timed_out(
    meta: &TxnMetadata,
    now_ms: i64,
    fresh_pid: Option<ProducerId>,
) -> Option<Outcome> {
    if !is_timed_out(meta, now_ms) {
        return None;
    }
    let old = meta.client_identity();
    Some(
        match meta.bump_prepare(TxnResult::Abort, old.epoch, fresh_pid, now_ms) {
            Err(e) => Outcome::reject(e),
            Ok(mut next) => {
                next.timed_out = true;
                let identity = next.client_identity();
                Outcome::write(next, Ok(identity))
            }
        },
    )
}

// ---- group markers: the group coordinator's side of section 7 ------------------------------

/// A WriteGroupOffsetMarker as the group's coordinator receives it: the end of a transaction
/// that included the group, sent by the transaction's coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMarker {
    /// The consumer group.
    pub group_id: String,
    /// The transaction's PID.
    pub producer_id: ProducerId,
    /// The epoch the transaction ended with: bumped, so unique and increasing per PID, under
    /// transaction version 2; the transaction's own epoch under version 1.
    pub epoch: ProducerEpoch,
    /// COMMIT or ABORT.
    pub result: TxnResult,
    /// The offsets to make visible (COMMIT only; ignored for ABORT).
    pub offsets: PendingOffsets,
    /// The sending transaction coordinator.
    pub coordinator_id: NodeId,
    /// The sender's generation (bumped at each of its starts).
    pub coordinator_generation: i64,
    /// The transaction's client transaction version: under version 1 transactions of a PID
    /// share an epoch, so an equal epoch is the next transaction, not a repeat.
    pub transaction_version: TransactionVersion,
}

/// What the group's coordinator has recorded, for one group, about a marker's sender: the
/// fencing state [`write_group_marker`] checks a marker against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupMarkerFence {
    /// The epoch of the last marker applied to this group for the marker's PID (None: never).
    pub producer_epoch: Option<ProducerEpoch>,
    /// The highest generation seen in this group from the marker's coordinator (None: never).
    pub coordinator_generation: Option<i64>,
}

/// What an accepted group marker writes, atomically and durably before the reply: the
/// offsets (empty for an ABORT or a repeat) and the new fencing state of the marker's PID
/// and coordinator in the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMarkerWrite {
    /// The consumer group.
    pub group_id: String,
    /// Offsets to commit (other partitions of the group keep theirs).
    pub offsets: PendingOffsets,
    /// The PID whose epoch is recorded.
    pub producer_id: ProducerId,
    /// The epoch to record for `producer_id`.
    pub producer_epoch: ProducerEpoch,
    /// The coordinator whose generation is recorded.
    pub coordinator_id: NodeId,
    /// The generation to record for `coordinator_id`.
    pub coordinator_generation: i64,
}

/// The group coordinator's fencing of a group marker, the way a partition leader fences
/// WriteTxnMarkers (PROTOCOL.md section 9), checked in the same order, before anything is
/// written:
///
/// | marker vs. recorded for this group            | reply                          | writes |
/// |-----------------------------------------------|--------------------------------|--------|
/// | negative PID, epoch or generation             | INVALID_REQUEST                | nothing |
/// | epoch below the PID's recorded epoch          | INVALID_PRODUCER_EPOCH         | nothing |
/// | generation below the coordinator's recorded   | TRANSACTION_COORDINATOR_FENCED | nothing |
/// | epoch equal (the same marker again)           | NONE                           | only a higher generation, no offsets |
/// | epoch equal, transaction version 1            | NONE                           | as for a higher epoch |
/// | epoch above, or a PID never seen              | NONE                           | COMMIT: offsets; both: epoch + generation |
///
/// Why this is enough: every transaction ends with an epoch bump, so each transaction's
/// marker carries an epoch no earlier marker of its PID had, and a PID's next transaction
/// cannot end before this one's markers were all acknowledged. A late COMMIT of an older
/// transaction therefore always has a lower epoch than what the group already applied, and
/// cannot move its offsets backwards. Equal epoch with another result or other offsets cannot
/// happen (one transaction, one decision); it is answered as a repeat all the same.
pub fn write_group_marker(
    fence: &GroupMarkerFence,
    marker: GroupMarker,
) -> Result<Option<GroupMarkerWrite>, TxnError> {
    let GroupMarker {
        group_id,
        producer_id,
        epoch,
        result,
        offsets,
        coordinator_id,
        coordinator_generation,
        transaction_version,
    } = marker;
    if producer_id < 0 || epoch < 0 || coordinator_generation < 0 {
        return Err(TxnError::InvalidRequest(format!(
            "group marker with producer {producer_id}, epoch {epoch}, generation \
             {coordinator_generation}: none may be negative"
        )));
    }
    if let Some(recorded) = fence.producer_epoch.filter(|&e| epoch < e) {
        return Err(TxnError::InvalidProducerEpoch(format!(
            "group {group_id:?}: marker for producer {producer_id} has epoch {epoch}, older \
             than the {recorded} already applied"
        )));
    }
    if let Some(recorded) = fence
        .coordinator_generation
        .filter(|&g| coordinator_generation < g)
    {
        return Err(TxnError::TransactionCoordinatorFenced(format!(
            "group {group_id:?}: marker from coordinator {coordinator_id} generation \
             {coordinator_generation}, older than {recorded}"
        )));
    }
    let newer_generation = fence
        .coordinator_generation
        .is_none_or(|g| coordinator_generation > g);
    // Version 1 keeps the epoch across transactions: an equal epoch is applied again (a true
    // repeat writes the same offsets; Kafka's version 1 has the same hole for a late repeat).
    let repeat =
        fence.producer_epoch == Some(epoch) && transaction_version == TransactionVersion::V2;
    if repeat && !newer_generation {
        return Ok(None);
    }
    let offsets = match result {
        TxnResult::Commit if !repeat => offsets,
        _ => PendingOffsets::new(),
    };
    Ok(Some(GroupMarkerWrite {
        group_id,
        offsets,
        producer_id,
        producer_epoch: epoch,
        coordinator_id,
        coordinator_generation,
    }))
}

/// Strided, block-persisted PID allocation: coordinator `index` of `count` hands out
/// `seq * count + index` for `seq = 0, 1, ...`, so coordinators never collide; the upper bound of
/// the sequence numbers that may have been handed out is persisted (a block of
/// [`PID_BLOCK_SIZE`] ahead) before any of them is used, so a restart never repeats a PID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidAllocator {
    index: i64,
    count: i64,
    next_seq: i64,
    reserved_end: i64,
}

/// One allocation: the PID, the block bound to persist before using it (if any), and the
/// allocator to install once that is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidAllocation {
    /// The new PID.
    pub producer_id: ProducerId,
    /// Persist this as the PID block bound before handing out `producer_id`.
    pub reserve: Option<i64>,
    /// The allocator after this allocation.
    pub next: PidAllocator,
}

impl PidAllocator {
    /// An allocator for coordinator `index` of `count`, resuming after `persisted_end` (the
    /// block bound read from storage; 0 on first start).
    pub fn new(index: usize, count: usize, persisted_end: i64) -> Self {
        Self {
            index: index as i64,
            count: count.max(1) as i64,
            next_seq: persisted_end.max(0),
            reserved_end: persisted_end.max(0),
        }
    }

    /// Allocates the next PID.
    pub fn allocate(&self) -> PidAllocation {
        let mut next = self.clone();
        let reserve = if self.next_seq >= self.reserved_end {
            next.reserved_end = self.next_seq + PID_BLOCK_SIZE;
            Some(next.reserved_end)
        } else {
            None
        };
        next.next_seq += 1;
        PidAllocation {
            producer_id: self.next_seq * self.count + self.index,
            reserve,
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "txn-a";
    const NOW: i64 = 1_000_000;
    const TIMEOUT: i32 = 60_000;

    fn topology() -> Topology {
        Topology::parse(
            r#"
            transaction_state_partitions = 4
            [[coordinators]]
            id = 1
            address = "c1:1"
            [[leaders]]
            id = 101
            address = "l1:1"
            [[leaders]]
            id = 102
            address = "l2:1"
            [[topics]]
            name = "t"
            leaders = [101, 102]
            "#,
        )
        .unwrap()
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    fn pe(pid: ProducerId, epoch: ProducerEpoch) -> ProducerIdAndEpoch {
        ProducerIdAndEpoch::new(pid, epoch)
    }

    /// One id's stored state plus a PID source, applying outcomes like the shell does.
    struct World {
        meta: Option<TxnMetadata>,
        next_pid: ProducerId,
        now: i64,
        topology: Topology,
        sent: Vec<MarkerJob>,
    }

    impl World {
        fn new() -> Self {
            Self {
                meta: None,
                next_pid: 1000,
                now: NOW,
                topology: topology(),
                sent: vec![],
            }
        }

        fn meta(&self) -> &TxnMetadata {
            self.meta.as_ref().unwrap()
        }

        fn apply(&mut self, mut f: impl FnMut(&Self, Option<ProducerId>) -> Outcome) -> Outcome {
            let mut out = f(self, None);
            if out.reply == Err(TxnError::NeedProducerId) {
                out = f(self, Some(self.next_pid));
                self.next_pid += 1;
            }
            if let Some(m) = &out.persist {
                self.meta = Some(m.clone());
            }
            if let Some(job) = &out.markers {
                self.sent.push(job.clone());
            }
            out
        }

        fn init(&mut self, expected: Option<ProducerIdAndEpoch>) -> Outcome {
            self.apply(|w, pid| {
                init_producer_id(ID, w.meta.as_ref(), TIMEOUT, expected, w.now, pid)
            })
        }

        fn add(&mut self, caller: ProducerIdAndEpoch, parts: &[i32]) -> Outcome {
            let parts: Vec<_> = parts.iter().map(|p| tp(*p)).collect();
            self.apply(|w, _| {
                add_partitions(ID, w.meta.as_ref(), caller, &parts, &w.topology, w.now)
            })
        }

        fn add_group(&mut self, caller: ProducerIdAndEpoch, group: &str) -> Outcome {
            self.apply(|w, _| add_offsets(ID, w.meta.as_ref(), caller, group, w.now))
        }

        fn commit_offsets(
            &mut self,
            caller: ProducerIdAndEpoch,
            group: &str,
            o: &[(i32, i64)],
        ) -> Outcome {
            let o: Vec<_> = o.iter().map(|(p, v)| (tp(*p), *v)).collect();
            self.apply(|w, _| {
                txn_offset_commit(ID, w.meta.as_ref(), caller, group, &o, &w.topology, w.now)
            })
        }

        fn end(&mut self, caller: ProducerIdAndEpoch, result: TxnResult) -> Outcome {
            self.apply(|w, pid| end_txn(ID, w.meta.as_ref(), caller, result, w.now, pid))
        }

        fn complete(&mut self) -> Outcome {
            let job = self.meta().pending_markers().expect("markers pending");
            self.apply(|w, _| complete_markers(w.meta(), &job, w.now))
        }

        fn expire(&mut self) -> Option<Outcome> {
            let mut out = expire_timed_out(self.meta(), self.now, None)?;
            if out.reply == Err(TxnError::NeedProducerId) {
                out = expire_timed_out(self.meta(), self.now, Some(self.next_pid))?;
                self.next_pid += 1;
            }
            if let Some(m) = &out.persist {
                self.meta = Some(m.clone());
            }
            if let Some(job) = &out.markers {
                self.sent.push(job.clone());
            }
            Some(out)
        }

        fn state(&self) -> TxnState {
            self.meta().state
        }

        /// A fresh id at epoch 0 and (PID, epoch).
        fn started() -> (Self, ProducerIdAndEpoch) {
            let mut w = Self::new();
            let id = w.init(None).reply.unwrap();
            (w, id)
        }

        /// An id with an Ongoing transaction on partitions 0 and 1.
        fn ongoing() -> (Self, ProducerIdAndEpoch) {
            let (mut w, id) = Self::started();
            w.add(id, &[0, 1]).reply.unwrap();
            (w, id)
        }

        /// Forces the stored epoch (to test exhaustion without 32k bumps).
        fn set_epoch(&mut self, epoch: ProducerEpoch) -> ProducerIdAndEpoch {
            let m = self.meta.as_mut().unwrap();
            m.producer_epoch = epoch;
            m.last_epoch = NO_PRODUCER_EPOCH;
            m.client_identity()
        }
    }

    fn code(out: &Outcome) -> &'static str {
        match &out.reply {
            Ok(_) => "NONE",
            Err(e) => err_name(e),
        }
    }

    fn err_name(e: &TxnError) -> &'static str {
        e.name()
    }

    /// Builds a world in each state, with the current identity.
    fn in_state(state: TxnState) -> (World, ProducerIdAndEpoch) {
        let (mut w, id) = World::started();
        let id = match state {
            TxnState::Empty => id,
            TxnState::Ongoing => {
                w.add(id, &[0]).reply.unwrap();
                id
            }
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                w.add(id, &[0]).reply.unwrap();
                let r = if state == TxnState::PrepareCommit {
                    TxnResult::Commit
                } else {
                    TxnResult::Abort
                };
                w.end(id, r).reply.unwrap()
            }
            TxnState::CompleteCommit | TxnState::CompleteAbort => {
                w.add(id, &[0]).reply.unwrap();
                let r = if state == TxnState::CompleteCommit {
                    TxnResult::Commit
                } else {
                    TxnResult::Abort
                };
                let id = w.end(id, r).reply.unwrap();
                w.complete();
                id
            }
        };
        assert_eq!(w.state(), state);
        (w, id)
    }

    const ALL: [TxnState; 6] = [
        TxnState::Empty,
        TxnState::Ongoing,
        TxnState::PrepareCommit,
        TxnState::PrepareAbort,
        TxnState::CompleteCommit,
        TxnState::CompleteAbort,
    ];

    // ---- section 4: InitProducerId -------------------------------------------------------

    #[test]
    fn validation_of_ids_and_timeouts() {
        assert!(validate_id("transactional id", "a").is_ok());
        assert!(validate_id("transactional id", &"x".repeat(255)).is_ok());
        assert_eq!(
            err_name(&validate_id("id", "").unwrap_err()),
            "INVALID_REQUEST"
        );
        assert_eq!(
            err_name(&validate_id("id", &"x".repeat(256)).unwrap_err()),
            "INVALID_REQUEST"
        );
        assert_eq!(
            err_name(&validate_id("id", &"x".repeat(100 * 1024)).unwrap_err()),
            "INVALID_REQUEST"
        );
        for bad in [0, -1, i32::MIN, 900_001] {
            assert_eq!(
                err_name(&validate_timeout(bad, 900_000).unwrap_err()),
                "INVALID_TRANSACTION_TIMEOUT"
            );
        }
        assert!(validate_timeout(1, 900_000).is_ok());
        assert!(validate_timeout(900_000, 900_000).is_ok());
    }

    #[test]
    fn init_unknown_id_allocates_pid_at_epoch_0() {
        let mut w = World::new();
        // Without a PID the core asks for one and changes nothing.
        let out = init_producer_id(ID, None, TIMEOUT, None, NOW, None);
        assert_eq!(out.reply, Err(TxnError::NeedProducerId));
        assert!(out.persist.is_none());
        let out = w.init(None);
        assert_eq!(out.reply, Ok(pe(1000, 0)));
        let m = w.meta();
        assert_eq!(
            (m.state, m.last_epoch, m.timeout_ms),
            (TxnState::Empty, -1, TIMEOUT)
        );
        assert!(out.markers.is_none());
    }

    #[test]
    fn init_unknown_id_with_expected_still_allocates() {
        let mut w = World::new();
        assert_eq!(w.init(Some(pe(5, 5))).reply, Ok(pe(1000, 0)));
    }

    #[test]
    fn init_existing_id_bumps_epoch_in_every_settled_state() {
        for state in [
            TxnState::Empty,
            TxnState::CompleteCommit,
            TxnState::CompleteAbort,
        ] {
            let (mut w, id) = in_state(state);
            let out = w.init(None);
            assert_eq!(out.reply, Ok(pe(id.producer_id, id.epoch + 1)), "{state}");
            assert_eq!(w.state(), TxnState::Empty);
            assert_eq!(
                w.meta().last_epoch,
                -1,
                "no expected: the old epoch is not reclaimable"
            );
            assert!(out.markers.is_none());
        }
    }

    #[test]
    fn init_in_prepare_is_concurrent_even_with_expected() {
        for state in [TxnState::PrepareCommit, TxnState::PrepareAbort] {
            let (mut w, id) = in_state(state);
            let before = w.meta.clone();
            assert_eq!(code(&w.init(None)), "CONCURRENT_TRANSACTIONS");
            assert_eq!(code(&w.init(Some(id))), "CONCURRENT_TRANSACTIONS");
            assert_eq!(code(&w.init(Some(pe(77, 3)))), "CONCURRENT_TRANSACTIONS");
            assert_eq!(w.meta, before);
        }
    }

    #[test]
    fn init_in_ongoing_fences_and_aborts_with_the_new_epoch() {
        let (mut w, id) = World::ongoing();
        let out = w.init(None);
        assert_eq!(code(&out), "CONCURRENT_TRANSACTIONS");
        let m = w.meta().clone();
        assert_eq!(m.state, TxnState::PrepareAbort);
        assert_eq!(m.producer_epoch, id.epoch + 1);
        assert_eq!(
            m.last_epoch, -1,
            "the fenced instance cannot reclaim the id"
        );
        let job = out.markers.unwrap();
        assert_eq!(job.result, TxnResult::Abort);
        assert_eq!(job.identity, pe(id.producer_id, id.epoch + 1));
        assert_eq!(job.partitions, [tp(0), tp(1)].into_iter().collect());
        // The old instance is fenced everywhere, including its recovery path.
        assert_eq!(code(&w.add(id, &[0])), "PRODUCER_FENCED");
        assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
        // The retry of the new instance waits for the abort, then bumps above it.
        assert_eq!(code(&w.init(None)), "CONCURRENT_TRANSACTIONS");
        w.complete();
        assert_eq!(w.state(), TxnState::CompleteAbort);
        assert_eq!(w.init(None).reply, Ok(pe(id.producer_id, id.epoch + 2)));
        assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
    }

    #[test]
    fn init_in_ongoing_with_expected_current_still_fences() {
        let (mut w, id) = World::ongoing();
        assert_eq!(code(&w.init(Some(id))), "CONCURRENT_TRANSACTIONS");
        assert_eq!(w.meta().last_epoch, -1);
        w.complete();
        assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
    }

    #[test]
    fn init_with_expected_current_bumps_and_remembers_last_epoch() {
        for state in [
            TxnState::Empty,
            TxnState::CompleteCommit,
            TxnState::CompleteAbort,
        ] {
            let (mut w, id) = in_state(state);
            let bumped = w.init(Some(id)).reply.unwrap();
            assert_eq!(bumped, pe(id.producer_id, id.epoch + 1));
            assert_eq!(w.meta().last_epoch, id.epoch);
            // A retry of that bump gets the same answer, nothing written.
            let retry = w.init(Some(id));
            assert_eq!(retry.reply, Ok(bumped));
            assert!(retry.persist.is_none());
            // The new pair may bump again; then the first pair is fenced.
            let again = w.init(Some(bumped)).reply.unwrap();
            assert_eq!(again.epoch, bumped.epoch + 1);
            assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
        }
    }

    #[test]
    fn init_with_expected_last_epoch_in_ongoing_answers_current() {
        let (mut w, id) = World::started();
        let bumped = w.init(Some(id)).reply.unwrap();
        w.add(bumped, &[0]).reply.unwrap();
        let out = w.init(Some(id));
        assert_eq!(out.reply, Ok(bumped));
        assert!(out.persist.is_none());
        assert_eq!(w.state(), TxnState::Ongoing);
    }

    #[test]
    fn init_with_wrong_expected_is_fenced() {
        let (mut w, id) = World::started();
        w.init(None).reply.unwrap(); // epoch 1, last -1
        for bad in [id, pe(id.producer_id, 5), pe(99, 1), pe(99, 0)] {
            let before = w.meta.clone();
            assert_eq!(code(&w.init(Some(bad))), "PRODUCER_FENCED", "{bad}");
            assert_eq!(w.meta, before);
        }
    }

    #[test]
    fn init_updates_the_timeout() {
        let (mut w, _) = World::started();
        w.apply(|w, pid| init_producer_id(ID, w.meta.as_ref(), 5_000, None, w.now, pid));
        assert_eq!(w.meta().timeout_ms, 5_000);
    }

    #[test]
    fn init_epoch_exhaustion_rotates_pid() {
        let (mut w, _) = World::started();
        let old = w.set_epoch(MAX_CLIENT_EPOCH - 1);
        // 32765 -> 32766 is an ordinary bump.
        let at_max = w.init(Some(old)).reply.unwrap();
        assert_eq!(at_max, pe(old.producer_id, MAX_CLIENT_EPOCH));
        // 32766 -> new PID, epoch 0.
        let rotated = w.init(Some(at_max)).reply.unwrap();
        assert_eq!(rotated, pe(1001, 0));
        let m = w.meta().clone();
        assert_eq!(m.previous_producer_id, old.producer_id);
        assert_eq!(m.last_epoch, MAX_CLIENT_EPOCH);
        // A retry with the old PID and 32766 gets the new pair, not PRODUCER_FENCED.
        let retry = w.init(Some(at_max));
        assert_eq!(retry.reply, Ok(rotated));
        assert!(retry.persist.is_none());
        // The old PID is fenced on the data plane.
        assert_eq!(code(&w.add(at_max, &[0])), "PRODUCER_FENCED");
        // The new PID works and its next bump forgets the old one.
        w.add(rotated, &[0]).reply.unwrap();
        let next = w.end(rotated, TxnResult::Commit).reply.unwrap();
        assert_eq!(next, pe(1001, 1));
        w.complete();
        assert_eq!(code(&w.init(Some(at_max))), "PRODUCER_FENCED");
    }

    #[test]
    fn init_exhaustion_without_expected() {
        let (mut w, _) = World::started();
        let old = w.set_epoch(MAX_CLIENT_EPOCH);
        let rotated = w.init(None).reply.unwrap();
        assert_eq!(rotated, pe(1001, 0));
        assert_eq!(w.meta().previous_producer_id, old.producer_id);
        assert_eq!(code(&w.init(Some(old))), "PRODUCER_FENCED");
    }

    #[test]
    fn fence_at_exhaustion_uses_marker_epoch_and_next_pid() {
        let (mut w, _) = World::ongoing();
        let old = w.set_epoch(MAX_CLIENT_EPOCH);
        let out = w.init(None);
        assert_eq!(code(&out), "CONCURRENT_TRANSACTIONS");
        assert_eq!(
            out.markers.unwrap().identity,
            pe(old.producer_id, MARKER_ONLY_EPOCH)
        );
        assert_eq!(w.meta().next_producer_id, 1001);
        w.complete();
        let m = w.meta().clone();
        assert_eq!(
            (m.producer_id, m.producer_epoch, m.previous_producer_id),
            (1001, 0, old.producer_id)
        );
        assert_eq!(code(&w.init(Some(old))), "PRODUCER_FENCED");
        assert_eq!(w.init(None).reply, Ok(pe(1001, 1)));
    }

    // ---- section 5: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit ---------------------

    #[test]
    fn add_partitions_opens_transaction_and_unions() {
        let (mut w, id) = World::started();
        w.now = NOW + 5;
        let out = w.add(id, &[0]);
        assert_eq!(out.reply, Ok(id));
        assert_eq!(w.state(), TxnState::Ongoing);
        assert_eq!(w.meta().txn_start_ms, NOW + 5);
        w.now = NOW + 10;
        // Adding nothing new writes nothing.
        assert!(w.add(id, &[0]).persist.is_none());
        assert!(w.add(id, &[]).persist.is_none());
        assert!(w.add(id, &[1, 0]).persist.is_some());
        assert_eq!(w.meta().partitions.len(), 2);
        assert_eq!(
            w.meta().txn_start_ms,
            NOW + 5,
            "start time kept while Ongoing"
        );
    }

    #[test]
    fn add_nothing_in_empty_writes_nothing() {
        let (mut w, id) = World::started();
        let out = w.add(id, &[]);
        assert_eq!(out.reply, Ok(id));
        assert!(out.persist.is_none());
        assert_eq!(w.state(), TxnState::Empty);
    }

    #[test]
    fn add_requests_in_every_state() {
        // (state, expected code for a current-epoch add)
        for state in ALL {
            let (mut w, id) = in_state(state);
            let expect = if state.is_prepare() {
                "CONCURRENT_TRANSACTIONS"
            } else {
                "NONE"
            };
            let before = w.meta.clone();
            assert_eq!(code(&w.add(id, &[1])), expect, "add partitions in {state}");
            w.meta = before.clone();
            assert_eq!(
                code(&w.add_group(id, "g")),
                expect,
                "add offsets in {state}"
            );
            w.meta = before.clone();
            // TxnOffsetCommit needs the group in an Ongoing transaction.
            let commit_expect = if state.is_prepare() {
                "CONCURRENT_TRANSACTIONS"
            } else {
                "INVALID_TXN_STATE"
            };
            assert_eq!(
                code(&w.commit_offsets(id, "g", &[(0, 5)])),
                commit_expect,
                "offset commit in {state}"
            );
            assert_eq!(w.meta, before);
            if !state.is_prepare() {
                assert_eq!(w.add(id, &[1]).reply, Ok(id));
                assert_eq!(w.state(), TxnState::Ongoing);
                assert!(w.meta().partitions.contains(&tp(1)));
                if state.is_settled() && state != TxnState::Empty {
                    assert!(
                        !w.meta().partitions.contains(&tp(0)),
                        "previous txn's partitions cleared"
                    );
                }
            }
        }
    }

    #[test]
    fn add_errors_in_protocol_order() {
        for state in ALL {
            let (mut w, id) = in_state(state);
            let before = w.meta.clone();
            let stale = pe(id.producer_id, id.epoch - 1);
            let newer = pe(id.producer_id, id.epoch + 1);
            let alien = pe(id.producer_id + 7, id.epoch);
            assert_eq!(
                code(&w.add(alien, &[0])),
                "INVALID_PRODUCER_ID_MAPPING",
                "{state}"
            );
            assert_eq!(
                code(&w.add_group(alien, "g")),
                "INVALID_PRODUCER_ID_MAPPING"
            );
            assert_eq!(
                code(&w.commit_offsets(alien, "g", &[(0, 1)])),
                "INVALID_PRODUCER_ID_MAPPING"
            );
            if stale.epoch >= 0 {
                assert_eq!(code(&w.add(stale, &[0])), "PRODUCER_FENCED", "{state}");
                assert_eq!(code(&w.add_group(stale, "g")), "PRODUCER_FENCED");
                assert_eq!(
                    code(&w.commit_offsets(stale, "g", &[(0, 1)])),
                    "PRODUCER_FENCED"
                );
            }
            assert_eq!(code(&w.add(newer, &[0])), "PRODUCER_FENCED");
            // Unknown partitions, only for an otherwise valid request.
            if !state.is_prepare() {
                assert_eq!(code(&w.add(id, &[0, 9])), "UNKNOWN_TOPIC_OR_PARTITION");
                assert_eq!(code(&w.add(id, &[-1])), "UNKNOWN_TOPIC_OR_PARTITION");
            } else {
                assert_eq!(code(&w.add(id, &[9])), "CONCURRENT_TRANSACTIONS");
            }
            assert_eq!(w.meta, before, "nothing stored in {state}");
        }
        // Unknown id.
        let w = World::new();
        let out = add_partitions(ID, None, pe(1, 0), &[tp(0)], &w.topology, NOW);
        assert_eq!(code(&out), "INVALID_PRODUCER_ID_MAPPING");
        assert_eq!(
            code(&add_offsets(ID, None, pe(1, 0), "g", NOW)),
            "INVALID_PRODUCER_ID_MAPPING"
        );
    }

    #[test]
    fn unknown_topic_adds_nothing_even_with_known_partitions() {
        let (mut w, id) = World::ongoing();
        let before = w.meta.clone();
        let parts = vec![tp(0), TopicPartition::new("nope", 0)];
        let out = add_partitions(ID, w.meta.as_ref(), id, &parts, &w.topology, NOW);
        assert_eq!(code(&out), "UNKNOWN_TOPIC_OR_PARTITION");
        assert!(out.persist.is_none());
        w.meta = before;
    }

    #[test]
    fn offsets_pending_until_commit() {
        let (mut w, id) = World::started();
        assert_eq!(
            code(&w.commit_offsets(id, "g", &[(0, 5)])),
            "INVALID_TXN_STATE"
        );
        w.add_group(id, "g").reply.unwrap();
        assert_eq!(w.state(), TxnState::Ongoing);
        assert!(
            w.add_group(id, "g").persist.is_none(),
            "adding a group twice writes nothing"
        );
        assert_eq!(
            code(&w.commit_offsets(id, "other", &[(0, 5)])),
            "INVALID_TXN_STATE"
        );
        assert_eq!(
            code(&w.commit_offsets(id, "g", &[(7, 5)])),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
        assert!(w
            .commit_offsets(id, "g", &[(0, 5), (1, 9)])
            .persist
            .is_some());
        assert!(
            w.commit_offsets(id, "g", &[(0, 5)]).persist.is_none(),
            "same offsets write nothing"
        );
        w.commit_offsets(id, "g", &[(0, 6)]).reply.unwrap();
        let out = w.end(id, TxnResult::Commit);
        let job = out.markers.unwrap();
        assert_eq!(
            job.groups["g"],
            [(tp(0), 6), (tp(1), 9)].into_iter().collect()
        );
        assert!(job.partitions.is_empty());
        w.complete();
        assert!(w.meta().groups.is_empty());
    }

    #[test]
    fn abort_carries_groups_too() {
        let (mut w, id) = World::started();
        w.add_group(id, "g").reply.unwrap();
        w.commit_offsets(id, "g", &[(0, 5)]).reply.unwrap();
        let job = w.end(id, TxnResult::Abort).markers.unwrap();
        assert_eq!(job.result, TxnResult::Abort);
        assert!(job.groups.contains_key("g"));
    }

    // ---- section 6: EndTxn ---------------------------------------------------------------

    #[test]
    fn end_txn_commit_bumps_and_completes() {
        let (mut w, id) = World::ongoing();
        let out = w.end(id, TxnResult::Commit);
        let new = out.reply.clone().unwrap();
        assert_eq!(new, pe(id.producer_id, id.epoch + 1));
        assert_eq!(w.state(), TxnState::PrepareCommit);
        assert_eq!(w.meta().last_epoch, id.epoch);
        let job = out.markers.unwrap();
        assert_eq!(job.identity, new, "markers carry the new epoch");
        assert_eq!(job.partitions.len(), 2);
        let by_leader = job.partitions_by_leader(&w.topology);
        assert_eq!(by_leader[&Some(101)], vec![tp(0)]);
        assert_eq!(by_leader[&Some(102)], vec![tp(1)]);
        let done = w.complete();
        assert_eq!(done.reply, Ok(new));
        assert_eq!(w.state(), TxnState::CompleteCommit);
        assert!(w.meta().partitions.is_empty());
        assert_eq!(w.meta().txn_start_ms, -1);
        // The new epoch starts the next transaction.
        assert_eq!(w.add(new, &[0]).reply, Ok(new));
    }

    #[test]
    fn end_txn_abort_bumps_and_completes() {
        let (mut w, id) = World::ongoing();
        let new = w.end(id, TxnResult::Abort).reply.unwrap();
        assert_eq!(w.state(), TxnState::PrepareAbort);
        w.complete();
        assert_eq!(w.state(), TxnState::CompleteAbort);
        assert_eq!(w.meta().client_identity(), new);
    }

    #[test]
    fn end_txn_in_every_state_at_current_epoch() {
        for state in ALL {
            for result in [TxnResult::Commit, TxnResult::Abort] {
                let (mut w, id) = in_state(state);
                let out = w.end(id, result);
                let expect = match (state, result) {
                    (TxnState::Ongoing, _) => "NONE",
                    (s, _) if s.is_prepare() => "CONCURRENT_TRANSACTIONS",
                    (_, TxnResult::Commit) => "INVALID_TXN_STATE",
                    (_, TxnResult::Abort) => "NONE",
                };
                assert_eq!(code(&out), expect, "{state} {result:?}");
                if state.is_settled() && result == TxnResult::Abort {
                    // Empty abort: bump, straight to CompleteAbort, no markers.
                    assert_eq!(out.reply, Ok(pe(id.producer_id, id.epoch + 1)));
                    assert_eq!(w.state(), TxnState::CompleteAbort);
                    assert!(out.markers.is_none());
                    assert_eq!(w.meta().last_epoch, id.epoch);
                }
            }
        }
    }

    #[test]
    fn end_txn_retries() {
        for result in [TxnResult::Commit, TxnResult::Abort] {
            let other = if result == TxnResult::Commit {
                TxnResult::Abort
            } else {
                TxnResult::Commit
            };
            let (mut w, id) = World::ongoing();
            let new = w.end(id, result).reply.unwrap();
            // While Prepare*: same decision -> CONCURRENT, other -> INVALID_TXN_STATE.
            assert_eq!(code(&w.end(id, result)), "CONCURRENT_TRANSACTIONS");
            assert_eq!(code(&w.end(id, other)), "INVALID_TXN_STATE");
            w.complete();
            // Complete*: same decision -> OK with the current pair, nothing written.
            let retry = w.end(id, result);
            assert_eq!(retry.reply, Ok(new));
            assert!(retry.persist.is_none());
            assert_eq!(code(&w.end(id, other)), "INVALID_TXN_STATE");
            // Older than the retry epoch -> fenced.
            if id.epoch > 0 {
                assert_eq!(
                    code(&w.end(pe(id.producer_id, id.epoch - 1), result)),
                    "PRODUCER_FENCED"
                );
            }
        }
    }

    #[test]
    fn end_txn_retry_after_later_bump_is_fenced() {
        let (mut w, id) = World::ongoing();
        let new = w.end(id, TxnResult::Commit).reply.unwrap();
        w.complete();
        w.add(new, &[0]).reply.unwrap();
        // Ongoing at `new`, last_epoch = id.epoch: the retry's transaction is long done.
        assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
        // A bump without expected forgets the last epoch altogether.
        let (mut w, id) = World::ongoing();
        w.end(id, TxnResult::Commit).reply.unwrap();
        w.complete();
        w.init(None).reply.unwrap();
        assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
    }

    #[test]
    fn end_txn_errors() {
        let (mut w, id) = World::ongoing();
        let before = w.meta.clone();
        assert_eq!(
            code(&w.end(pe(id.producer_id + 1, id.epoch), TxnResult::Commit)),
            "INVALID_PRODUCER_ID_MAPPING"
        );
        assert_eq!(
            code(&w.end(pe(id.producer_id, id.epoch + 3), TxnResult::Commit)),
            "PRODUCER_FENCED"
        );
        assert_eq!(w.meta, before);
        assert_eq!(
            code(&end_txn(ID, None, id, TxnResult::Abort, NOW, None)),
            "INVALID_PRODUCER_ID_MAPPING"
        );
        // An older instance's EndTxn after it was fenced by InitProducerId.
        w.init(None);
        w.complete();
        assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
        assert_eq!(code(&w.end(id, TxnResult::Abort)), "PRODUCER_FENCED");
    }

    #[test]
    fn end_txn_exhaustion_uses_next_pid() {
        let (mut w, _) = World::ongoing();
        let old = w.set_epoch(MAX_CLIENT_EPOCH);
        let out = w.end(old, TxnResult::Commit);
        let new = out.reply.clone().unwrap();
        assert_eq!(new, pe(1001, 0));
        let job = out.markers.unwrap();
        assert_eq!(
            job.identity,
            pe(old.producer_id, MARKER_ONLY_EPOCH),
            "markers close the old PID"
        );
        let m = w.meta().clone();
        assert_eq!(
            (m.producer_id, m.producer_epoch, m.next_producer_id),
            (old.producer_id, MARKER_ONLY_EPOCH, 1001)
        );
        assert_eq!(m.client_identity(), new);
        // In Prepare: the new pair is answered CONCURRENT (not a mapping error) ...
        assert_eq!(code(&w.add(new, &[0])), "CONCURRENT_TRANSACTIONS");
        assert_eq!(
            code(&w.end(new, TxnResult::Commit)),
            "CONCURRENT_TRANSACTIONS"
        );
        // ... and the retry of the old pair too.
        assert_eq!(
            code(&w.end(old, TxnResult::Commit)),
            "CONCURRENT_TRANSACTIONS"
        );
        w.complete();
        let m = w.meta().clone();
        assert_eq!(
            (
                m.producer_id,
                m.producer_epoch,
                m.previous_producer_id,
                m.next_producer_id
            ),
            (1001, 0, old.producer_id, -1)
        );
        // Retry after rotation: old PID with 32766 gets the new pair.
        assert_eq!(w.end(old, TxnResult::Commit).reply, Ok(new));
        assert_eq!(code(&w.end(old, TxnResult::Abort)), "INVALID_TXN_STATE");
        assert_eq!(w.init(Some(old)).reply, Ok(new));
        // The new pair carries on.
        w.add(new, &[1]).reply.unwrap();
        assert_eq!(w.end(new, TxnResult::Abort).reply, Ok(pe(1001, 1)));
    }

    #[test]
    fn empty_abort_at_exhaustion_rotates_directly() {
        let (mut w, _) = World::started();
        let old = w.set_epoch(MAX_CLIENT_EPOCH);
        let out = w.end(old, TxnResult::Abort);
        assert_eq!(out.reply, Ok(pe(1001, 0)));
        assert!(out.markers.is_none());
        assert_eq!(w.state(), TxnState::CompleteAbort);
        assert_eq!(w.end(old, TxnResult::Abort).reply, Ok(pe(1001, 0)));
    }

    // ---- section 7: markers ----------------------------------------------------------------

    #[test]
    fn complete_markers_ignores_stale_jobs() {
        let (mut w, id) = World::ongoing();
        w.end(id, TxnResult::Commit).reply.unwrap();
        let mut job = w.meta().pending_markers().unwrap();
        job.result = TxnResult::Abort;
        let out = complete_markers(w.meta(), &job, NOW);
        assert!(out.persist.is_none());
        w.complete();
        // Completing twice does nothing.
        let job = MarkerJob {
            result: TxnResult::Commit,
            ..job
        };
        assert_eq!(job.transaction_version, TransactionVersion::V2);
        assert!(complete_markers(w.meta(), &job, NOW).persist.is_none());
    }

    #[test]
    fn pending_markers_only_in_prepare() {
        for state in ALL {
            let (w, _) = in_state(state);
            assert_eq!(
                w.meta().pending_markers().is_some(),
                state.is_prepare(),
                "{state}"
            );
        }
    }

    #[test]
    fn groups_by_coordinator() {
        let (mut w, id) = World::started();
        w.add_group(id, "g1").reply.unwrap();
        w.add_group(id, "g2").reply.unwrap();
        let job = w.end(id, TxnResult::Commit).markers.unwrap();
        let by = job.groups_by_coordinator(&w.topology);
        assert_eq!(by[&1].len(), 2);
    }

    // ---- section 8: timeout ----------------------------------------------------------------

    #[test]
    fn timeout_scan_only_aborts_old_ongoing() {
        for state in ALL {
            let (mut w, _) = in_state(state);
            w.now = NOW + i64::from(TIMEOUT) + 1;
            assert_eq!(w.expire().is_some(), state == TxnState::Ongoing, "{state}");
        }
        let (mut w, _) = World::ongoing();
        w.now = NOW + i64::from(TIMEOUT);
        assert!(w.expire().is_none(), "exactly the timeout is not over it");
    }

    #[test]
    fn timeout_fences_with_a_distinct_error() {
        let (mut w, id) = World::ongoing();
        w.now = NOW + i64::from(TIMEOUT) + 1;
        let out = w.expire().unwrap();
        let bumped = pe(id.producer_id, id.epoch + 1);
        assert_eq!(out.reply, Ok(bumped));
        assert_eq!(out.markers.unwrap().identity, bumped);
        let m = w.meta().clone();
        assert_eq!(
            (m.state, m.last_epoch, m.timed_out),
            (TxnState::PrepareAbort, id.epoch, true)
        );
        // The late producer is told plainly.
        assert_eq!(code(&w.add(id, &[0])), "TRANSACTION_TIMED_OUT");
        assert_eq!(code(&w.add_group(id, "g")), "TRANSACTION_TIMED_OUT");
        assert_eq!(
            code(&w.commit_offsets(id, "g", &[(0, 1)])),
            "TRANSACTION_TIMED_OUT"
        );
        assert_eq!(code(&w.end(id, TxnResult::Commit)), "TRANSACTION_TIMED_OUT");
        assert_eq!(
            code(&w.end(id, TxnResult::Abort)),
            "CONCURRENT_TRANSACTIONS"
        );
        w.complete();
        assert_eq!(code(&w.end(id, TxnResult::Commit)), "TRANSACTION_TIMED_OUT");
        // Its own late abort is a retry answered with the bumped pair ...
        assert_eq!(w.end(id, TxnResult::Abort).reply, Ok(bumped));
        // ... as is its recovery InitProducerId.
        assert_eq!(w.init(Some(id)).reply, Ok(bumped));
        // It carries on with the bumped epoch.
        assert_eq!(w.add(bumped, &[0]).reply, Ok(bumped));
    }

    #[test]
    fn newer_instance_after_timeout_still_fences() {
        let (mut w, id) = World::ongoing();
        w.now = NOW + i64::from(TIMEOUT) + 1;
        w.expire().unwrap();
        w.complete();
        let newer = w.init(None).reply.unwrap();
        assert_eq!(newer.epoch, id.epoch + 2);
        assert!(!w.meta().timed_out);
        assert_eq!(code(&w.add(id, &[0])), "PRODUCER_FENCED");
        assert_eq!(code(&w.end(id, TxnResult::Abort)), "PRODUCER_FENCED");
        assert_eq!(code(&w.init(Some(id))), "PRODUCER_FENCED");
    }

    #[test]
    fn timeout_at_exhaustion_rotates() {
        let (mut w, _) = World::ongoing();
        let old = w.set_epoch(MAX_CLIENT_EPOCH);
        w.now = NOW + i64::from(TIMEOUT) + 1;
        let out = w.expire().unwrap();
        assert_eq!(out.reply, Ok(pe(1001, 0)));
        assert_eq!(
            out.markers.unwrap().identity,
            pe(old.producer_id, MARKER_ONLY_EPOCH)
        );
        w.complete();
        assert_eq!(code(&w.add(old, &[0])), "TRANSACTION_TIMED_OUT");
        assert_eq!(w.end(old, TxnResult::Abort).reply, Ok(pe(1001, 0)));
    }

    // ---- VerifyTransaction -------------------------------------------------------------------

    #[test]
    fn verify_transaction_rows() {
        let (mut w, id) = World::ongoing();
        let v = |w: &World, c, p| {
            verify_transaction(ID, w.meta.as_ref(), c, &tp(p)).map_err(|e| err_name(&e))
        };
        assert_eq!(v(&w, id, 0), Ok(()));
        assert_eq!(v(&w, id, 1), Ok(()));
        assert_eq!(
            v(&w, pe(id.producer_id, id.epoch + 1), 0),
            Err("INVALID_PRODUCER_EPOCH")
        );
        assert_eq!(
            v(&w, pe(id.producer_id + 1, id.epoch), 0),
            Err("INVALID_PRODUCER_ID_MAPPING")
        );
        let new = w.end(id, TxnResult::Commit).reply.unwrap();
        assert_eq!(v(&w, id, 0), Err("INVALID_PRODUCER_EPOCH"));
        assert_eq!(v(&w, new, 0), Err("CONCURRENT_TRANSACTIONS"));
        w.complete();
        assert_eq!(v(&w, new, 0), Err("INVALID_TXN_STATE"));
        w.add(new, &[1]).reply.unwrap();
        assert_eq!(v(&w, new, 0), Err("INVALID_TXN_STATE"));
        assert_eq!(v(&w, new, 1), Ok(()));
        assert_eq!(
            verify_transaction(ID, None, new, &tp(0)).map_err(|e| err_name(&e)),
            Err("INVALID_PRODUCER_ID_MAPPING")
        );
    }

    // ---- PID allocation and persistence format ----------------------------------------------

    #[test]
    fn pid_allocation_is_strided_and_block_persisted() {
        let a = PidAllocator::new(1, 3, 0);
        let first = a.allocate();
        assert_eq!(first.producer_id, 1);
        assert_eq!(first.reserve, Some(PID_BLOCK_SIZE));
        let second = first.next.allocate();
        assert_eq!(second.producer_id, 4);
        assert_eq!(second.reserve, None);
        // Restart: resumes after the persisted block, never repeating.
        let restarted = PidAllocator::new(1, 3, PID_BLOCK_SIZE).allocate();
        assert_eq!(restarted.producer_id, PID_BLOCK_SIZE * 3 + 1);
        assert_eq!(restarted.reserve, Some(2 * PID_BLOCK_SIZE));
        // Another coordinator never collides.
        let mut seen = BTreeSet::new();
        for index in 0..3 {
            let mut a = PidAllocator::new(index, 3, 0);
            for _ in 0..2500 {
                let next = a.allocate();
                assert!(seen.insert(next.producer_id));
                a = next.next;
            }
        }
    }

    #[test]
    fn metadata_round_trips_through_json() {
        let (mut w, id) = World::ongoing();
        w.add_group(id, "g").reply.unwrap();
        w.commit_offsets(id, "g", &[(1, 42)]).reply.unwrap();
        let json = serde_json::to_vec(w.meta()).unwrap();
        let back: TxnMetadata = serde_json::from_slice(&json).unwrap();
        assert_eq!(&back, w.meta());
    }

    // ---- randomized simulation of the invariants (PROTOCOL.md section 11) -------------------

    /// A tiny deterministic generator (no dependency, reproducible by seed).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    /// Random interleavings of several producer instances, the timeout scan and marker
    /// completion against one id. After every step: only the current pair may add or end; a PID's
    /// epochs never go down; markers carry an epoch above every epoch that wrote in the
    /// transaction; a decided transaction completes with its decision; rotated PIDs are fresh.
    #[test]
    fn random_interleavings_keep_the_invariants() {
        // (accepted writes, marker checks, rotations, timeouts, commits completed)
        let mut stats = [0u32; 5];
        for seed in 0..300u64 {
            let mut rng = Lcg(seed);
            let mut w = World::new();
            // Half the runs start near exhaustion to cross the rotation.
            if seed % 2 == 1 {
                let mut meta = TxnMetadata::new(ID, 1, TIMEOUT, NOW);
                meta.producer_epoch = MAX_CLIENT_EPOCH - 3;
                w.meta = Some(meta);
                w.next_pid = 1000;
            }
            let mut handles: Vec<Option<ProducerIdAndEpoch>> = vec![None; 3];
            let mut max_epoch: BTreeMap<ProducerId, ProducerEpoch> = BTreeMap::new();
            let mut used_pids: BTreeSet<ProducerId> =
                w.meta.iter().map(|m| m.producer_id).collect();
            let mut writers_in_txn: Vec<ProducerIdAndEpoch> = Vec::new();
            for step in 0..300i64 {
                let h = rng.next(3) as usize;
                let before = w.meta.clone();
                let caller = handles[h].unwrap_or(pe(-1, -1));
                let op = rng.next(9);
                let out = match op {
                    0 => w.init(None),
                    1 => w.init(handles[h]),
                    2 | 3 => w.add(caller, &[rng.next(2) as i32]),
                    4 => w.add_group(caller, "g"),
                    5 => w.commit_offsets(caller, "g", &[(0, step)]),
                    6 => w.end(
                        caller,
                        if rng.next(2) == 0 {
                            TxnResult::Commit
                        } else {
                            TxnResult::Abort
                        },
                    ),
                    7 => match w.meta.as_ref().and_then(|m| m.pending_markers()) {
                        Some(job) => w.apply(|w, _| complete_markers(w.meta(), &job, w.now)),
                        None => continue,
                    },
                    _ if w.meta.is_none() => continue,
                    _ => {
                        w.now += i64::from(TIMEOUT) / 2;
                        match w.expire() {
                            Some(out) => out,
                            None => continue,
                        }
                    }
                };
                let ctx = format!("seed {seed} step {step} op {op} handle {h} caller {caller}");
                // Only the current pair may write into or end a transaction.
                if matches!(op, 2..=6) && out.reply.is_ok() {
                    let current = before.as_ref().unwrap().client_identity();
                    let retry = before.as_ref().unwrap().last_identity() == Some(caller);
                    assert!(
                        caller == current || (op == 6 && retry),
                        "{ctx}: {caller} acted, current {current}"
                    );
                    if matches!(op, 2..=5) && out.persist.is_some() {
                        writers_in_txn.push(caller);
                        stats[0] += 1;
                    }
                }
                if let Some(next) = &out.persist {
                    let prev_state = before.as_ref().map(|m| m.state);
                    // Decided transactions complete with their decision.
                    if let Some(prev) = prev_state.filter(|s| s.is_prepare()) {
                        assert_eq!(
                            TxnResult::of_state(next.state),
                            TxnResult::of_state(prev),
                            "{ctx}"
                        );
                        assert!(
                            matches!(
                                next.state,
                                TxnState::CompleteCommit | TxnState::CompleteAbort
                            ),
                            "{ctx}"
                        );
                    }
                    // Epochs per PID never go down; new PIDs are fresh.
                    for pair in [next.client_identity(), next.marker_identity()] {
                        let max = max_epoch.entry(pair.producer_id).or_insert(pair.epoch);
                        if pair == next.marker_identity() && !next.state.is_prepare() {
                            continue;
                        }
                        assert!(pair.epoch >= *max, "{ctx}: {pair} after epoch {max}");
                        *max = pair.epoch;
                    }
                    let pid = next.client_identity().producer_id;
                    if before.as_ref().is_none_or(|b| !b.knows_pid(pid))
                        && next.next_producer_id != pid
                    {
                        assert!(used_pids.insert(pid), "{ctx}: pid {pid} reused");
                    }
                    if next.previous_producer_id
                        != before.as_ref().map_or(-1, |b| b.previous_producer_id)
                    {
                        stats[2] += 1;
                    }
                    if next.timed_out && !before.as_ref().is_some_and(|b| b.timed_out) {
                        stats[3] += 1;
                    }
                    if next.state == TxnState::CompleteCommit
                        && prev_state != Some(TxnState::CompleteCommit)
                    {
                        stats[4] += 1;
                    }
                    if next.next_producer_id != NO_PRODUCER_ID {
                        assert!(
                            used_pids.insert(next.next_producer_id),
                            "{ctx}: next pid reused"
                        );
                    }
                    if next.state.is_settled()
                        && !prev_state.is_some_and(|s| s == TxnState::Ongoing)
                    {
                        writers_in_txn.clear();
                    }
                }
                // Markers carry an epoch above every epoch that wrote in the transaction.
                if let Some(job) = &out.markers {
                    for writer in writers_in_txn.drain(..) {
                        if writer.producer_id == job.identity.producer_id {
                            stats[1] += 1;
                            assert!(
                                job.identity.epoch > writer.epoch,
                                "{ctx}: marker {} vs writer {writer}",
                                job.identity
                            );
                        }
                    }
                }
                // The caller adopts the pair of an OK Init/EndTxn reply, like a client.
                if matches!(op, 0 | 1 | 6) {
                    if let Ok(pair) = out.reply {
                        handles[h] = Some(pair);
                    }
                }
            }
        }
        // The runs exercised what they claim to.
        let [writes, marker_checks, rotations, timeouts, commits] = stats;
        assert!(writes > 1000 && marker_checks > 300, "{stats:?}");
        assert!(
            rotations > 20 && timeouts > 20 && commits > 100,
            "{stats:?}"
        );
    }

    // ---- transaction version 1: one test per rule that differs from version 2 ----------------

    impl World {
        /// A version-1 client: InitProducerId recorded the version; an Ongoing transaction.
        fn ongoing_v1() -> (Self, ProducerIdAndEpoch) {
            let mut w = World::new();
            let id = w
                .apply(|w, pid| {
                    init_producer_id_for_version(
                        ID,
                        w.meta.as_ref(),
                        TIMEOUT,
                        None,
                        w.now,
                        pid,
                        TransactionVersion::V1,
                    )
                })
                .reply
                .unwrap();
            assert_eq!(w.meta().client_transaction_version, TransactionVersion::V1);
            w.add(id, &[0, 1]).reply.unwrap();
            (w, id)
        }
    }

    #[test]
    fn v1_init_producer_id_records_the_version_and_v2_takes_it_back() {
        let (mut w, id) = World::ongoing_v1();
        w.end(id, TxnResult::Commit).reply.unwrap();
        w.complete();
        // Our own client's InitProducerId (version 2) switches the id back.
        let out = w.apply(|w, pid| {
            init_producer_id_for_version(
                ID,
                w.meta.as_ref(),
                TIMEOUT,
                None,
                w.now,
                pid,
                TransactionVersion::V2,
            )
        });
        assert_eq!(out.reply.unwrap().epoch, id.epoch + 1);
        assert_eq!(w.meta().client_transaction_version, TransactionVersion::V2);
        // A retry that changes nothing but the version still writes it.
        let meta = w.meta().clone();
        let mut last = meta.clone();
        last.last_epoch = meta.producer_epoch - 1;
        let retry = ProducerIdAndEpoch::new(meta.producer_id, meta.producer_epoch - 1);
        let out = init_producer_id_for_version(
            ID,
            Some(&last),
            TIMEOUT,
            Some(retry),
            NOW,
            None,
            TransactionVersion::V1,
        );
        assert_eq!(out.reply.unwrap(), meta.client_identity());
        assert_eq!(
            out.persist.unwrap().client_transaction_version,
            TransactionVersion::V1
        );
    }

    #[test]
    fn v1_end_txn_keeps_the_epoch_and_markers_carry_it() {
        let (mut w, id) = World::ongoing_v1();
        let out = w.end(id, TxnResult::Commit);
        assert_eq!(out.reply.unwrap(), id, "no bump");
        assert_eq!(w.meta().state, TxnState::PrepareCommit);
        let job = out.markers.unwrap();
        assert_eq!(job.identity, id, "markers carry the data's epoch");
        assert_eq!(job.transaction_version, TransactionVersion::V1);
        w.complete();
        assert_eq!(w.meta().state, TxnState::CompleteCommit);
        assert_eq!(w.meta().client_identity(), id);
        // The next transaction runs at the same epoch.
        w.add(id, &[1]).reply.unwrap();
        assert_eq!(w.end(id, TxnResult::Abort).markers.unwrap().identity, id);
    }

    #[test]
    fn v1_end_txn_retries_and_wrong_decisions() {
        let (mut w, id) = World::ongoing_v1();
        w.end(id, TxnResult::Commit).reply.unwrap();
        // Prepare*: a retry is CONCURRENT_TRANSACTIONS.
        assert_eq!(
            code(&w.end(id, TxnResult::Commit)),
            "CONCURRENT_TRANSACTIONS"
        );
        w.complete();
        // Complete*: the same decision is OK without a write, the other one INVALID_TXN_STATE.
        let out = w.end(id, TxnResult::Commit);
        assert_eq!((out.reply, out.persist), (Ok(id), None));
        assert_eq!(code(&w.end(id, TxnResult::Abort)), "INVALID_TXN_STATE");
    }

    #[test]
    fn v1_end_txn_in_empty_commit_is_invalid_abort_is_a_no_op() {
        let (w, id) = World::ongoing_v1();
        let mut empty = w.meta().clone();
        empty.state = TxnState::Empty;
        empty.partitions.clear();
        let out = end_txn(ID, Some(&empty), id, TxnResult::Abort, NOW, None);
        assert_eq!((out.reply, out.persist), (Ok(id), None));
        let out = end_txn(ID, Some(&empty), id, TxnResult::Commit, NOW, None);
        assert_eq!(code(&out), "INVALID_TXN_STATE");
    }

    #[test]
    fn v1_end_txn_from_an_older_epoch_is_fenced_without_a_retry_window() {
        let (mut w, id) = World::ongoing_v1();
        // A newer instance fences the open transaction (a bump, as in version 2).
        assert_eq!(code(&w.init(None)), "CONCURRENT_TRANSACTIONS");
        w.complete();
        assert!(w.meta().client_identity().epoch > id.epoch);
        assert_eq!(code(&w.end(id, TxnResult::Commit)), "PRODUCER_FENCED");
        assert_eq!(code(&w.end(id, TxnResult::Abort)), "PRODUCER_FENCED");
        let stranger = ProducerIdAndEpoch::new(id.producer_id + 99, 0);
        assert_eq!(
            code(&w.end(stranger, TxnResult::Abort)),
            "INVALID_PRODUCER_ID_MAPPING"
        );
    }

    #[test]
    fn v1_group_marker_at_an_applied_epoch_is_the_next_transaction() {
        let mut marker = group_marker(7, 3, 2);
        marker.transaction_version = TransactionVersion::V1;
        marker.offsets = [(TopicPartition::new("t", 0), 50)].into();
        let write = write_group_marker(&fence(Some(3), Some(2)), marker)
            .unwrap()
            .expect("applied");
        assert_eq!(write.offsets[&TopicPartition::new("t", 0)], 50);
        // Version 2: the same epoch is a repeat, nothing is written.
        assert_eq!(
            write_group_marker(&fence(Some(3), Some(2)), group_marker(7, 3, 2)).unwrap(),
            None
        );
    }

    #[test]
    fn transaction_versions_from_the_wire() {
        assert_eq!(
            TransactionVersion::from_wire(0),
            Some(TransactionVersion::V2)
        );
        assert_eq!(
            TransactionVersion::from_wire(1),
            Some(TransactionVersion::V1)
        );
        assert_eq!(
            TransactionVersion::from_wire(2),
            Some(TransactionVersion::V2)
        );
        assert_eq!(TransactionVersion::from_wire(3), None);
        assert_eq!(TransactionVersion::V1.to_wire(), 1);
        // Records stored before versions existed read as version 2.
        let mut json = serde_json::to_value(TxnMetadata::new(ID, 1, TIMEOUT, NOW)).unwrap();
        json.as_object_mut()
            .unwrap()
            .remove("client_transaction_version");
        let meta: TxnMetadata = serde_json::from_value(json).unwrap();
        assert_eq!(meta.client_transaction_version, TransactionVersion::V2);
    }

    // ---- group markers: one test per row of `write_group_marker` ---------------------------

    fn group_marker(pid: ProducerId, epoch: ProducerEpoch, generation: i64) -> GroupMarker {
        GroupMarker {
            group_id: "g".into(),
            producer_id: pid,
            epoch,
            result: TxnResult::Commit,
            offsets: [(TopicPartition::new("t", 0), 42)].into(),
            coordinator_id: 1,
            coordinator_generation: generation,
            transaction_version: TransactionVersion::V2,
        }
    }

    fn fence(epoch: Option<ProducerEpoch>, generation: Option<i64>) -> GroupMarkerFence {
        GroupMarkerFence {
            producer_epoch: epoch,
            coordinator_generation: generation,
        }
    }

    #[test]
    fn group_marker_first_commit_writes_offsets_epoch_and_generation() {
        let write = write_group_marker(&fence(None, None), group_marker(7, 3, 2))
            .unwrap()
            .unwrap();
        assert_eq!(
            write,
            GroupMarkerWrite {
                group_id: "g".into(),
                offsets: [(TopicPartition::new("t", 0), 42)].into(),
                producer_id: 7,
                producer_epoch: 3,
                coordinator_id: 1,
                coordinator_generation: 2,
            }
        );
    }

    #[test]
    fn group_marker_newer_epoch_applies() {
        let write = write_group_marker(&fence(Some(3), Some(2)), group_marker(7, 4, 2))
            .unwrap()
            .unwrap();
        assert_eq!(write.offsets.len(), 1);
        assert_eq!((write.producer_epoch, write.coordinator_generation), (4, 2));
        // A newer generation is adopted with it.
        let write = write_group_marker(&fence(Some(3), Some(2)), group_marker(7, 4, 5))
            .unwrap()
            .unwrap();
        assert_eq!(write.coordinator_generation, 5);
    }

    #[test]
    fn group_marker_abort_records_the_epoch_but_writes_no_offsets() {
        let mut marker = group_marker(7, 4, 2);
        marker.result = TxnResult::Abort;
        let write = write_group_marker(&fence(Some(3), Some(2)), marker)
            .unwrap()
            .unwrap();
        assert!(write.offsets.is_empty());
        assert_eq!((write.producer_epoch, write.coordinator_generation), (4, 2));
    }

    #[test]
    fn group_marker_older_epoch_is_invalid_producer_epoch() {
        for result in [TxnResult::Commit, TxnResult::Abort] {
            let mut marker = group_marker(7, 2, 9);
            marker.result = result;
            assert!(matches!(
                write_group_marker(&fence(Some(3), Some(2)), marker),
                Err(TxnError::InvalidProducerEpoch(_))
            ));
        }
    }

    #[test]
    fn group_marker_older_generation_is_coordinator_fenced() {
        // Even for a PID the group never saw, and for an equal epoch.
        for f in [fence(None, Some(5)), fence(Some(3), Some(5))] {
            assert!(matches!(
                write_group_marker(&f, group_marker(7, 3, 4)),
                Err(TxnError::TransactionCoordinatorFenced(_))
            ));
        }
    }

    #[test]
    fn group_marker_epoch_is_checked_before_generation() {
        // Both older: the leader's order (PROTOCOL.md section 9), epoch first.
        assert!(matches!(
            write_group_marker(&fence(Some(3), Some(5)), group_marker(7, 2, 4)),
            Err(TxnError::InvalidProducerEpoch(_))
        ));
    }

    #[test]
    fn group_marker_repeat_is_a_no_op() {
        assert_eq!(
            write_group_marker(&fence(Some(3), Some(2)), group_marker(7, 3, 2)),
            Ok(None)
        );
        // Also with another result or other offsets: one epoch, one transaction.
        let mut marker = group_marker(7, 3, 2);
        marker.result = TxnResult::Abort;
        assert_eq!(
            write_group_marker(&fence(Some(3), Some(2)), marker),
            Ok(None)
        );
    }

    #[test]
    fn group_marker_repeat_from_a_newer_generation_records_only_the_generation() {
        // A restarted coordinator re-sends the marker of a transaction it found in Prepare*.
        let write = write_group_marker(&fence(Some(3), Some(2)), group_marker(7, 3, 3))
            .unwrap()
            .unwrap();
        assert!(write.offsets.is_empty(), "a repeat never rewrites offsets");
        assert_eq!((write.producer_epoch, write.coordinator_generation), (3, 3));
    }

    #[test]
    fn group_marker_negative_values_are_invalid_requests() {
        for marker in [
            group_marker(-1, 0, 1),
            group_marker(7, -1, 1),
            group_marker(7, 0, -1),
        ] {
            assert!(matches!(
                write_group_marker(&GroupMarkerFence::default(), marker),
                Err(TxnError::InvalidRequest(_))
            ));
        }
    }
}
