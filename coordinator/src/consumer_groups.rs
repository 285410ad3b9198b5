//! Kafka's classic consumer-group membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) as
//! a pure state machine, so `subscribe()` works for Kafka clients and a zombie consumer-producer
//! is fenced by its group (KIP-447: [`GroupMembership::check_commit`]).
//!
//! How a rebalance goes, as in Kafka's group coordinator:
//! 1. A JoinGroup (new member, or a member rejoining) moves the group to PreparingRebalance with
//!    a deadline (the largest rebalance timeout of its members). Every member must rejoin; the
//!    others learn it from Heartbeat/SyncGroup answering REBALANCE_IN_PROGRESS. A known member
//!    that rejoins with the very protocols and metadata it joined with is the exception, as in
//!    Kafka: a follower of a Stable group, or any member while the group awaits the leader's
//!    assignment (its JoinGroup answer was lost), is answered at once with the current
//!    generation (the leader with the member list again) and nobody stops. A rejoining leader
//!    of a Stable group, or a changed subscription, starts a round.
//! 2. The round completes when every member has rejoined, or at the deadline (dynamic members
//!    that did not rejoin are removed; static ones stay, below): the generation is bumped, a protocol every member supports is
//!    chosen (the leader's first such), the leader is kept if it is still a member (else the
//!    first member), and every joiner gets its JoinGroup answer; the leader's carries the member
//!    list and their metadata. State CompletingRebalance.
//! 3. The leader computes the assignment (Kafka's consumer protocol: the client does it) and
//!    sends it in its SyncGroup; the group becomes Stable and every member's SyncGroup is
//!    answered with its part.
//! 4. Members heartbeat within their session timeout; one that stops is removed by [`tick`] and
//!    the others rebalance. LeaveGroup removes a member at once.
//!
//! The shell ([`crate::kafka`]) holds one of these per group behind a lock, parks JoinGroup and
//! SyncGroup requests until [`GroupMembership::join_result`] / [`GroupMembership::sync_result`]
//! has their answer, and calls [`tick`] periodically.
//!
//! The first round of an Empty group waits `group.initial.rebalance.delay.ms` (Kafka's, 3 s by
//! default; [`GroupMembership::with_initial_delay`]) even when every member has joined, and each
//! join within it pushes it on by that much again, up to the round's deadline: consumers started
//! together get one rebalance instead of one per consumer.
//!
//! Choices: a member id is `client_id-<n>`; from JoinGroup v4 a member without an id first gets
//! MEMBER_ID_REQUIRED with its new id (KIP-394). A member's session does not expire while its
//! JoinGroup or SyncGroup is parked (Kafka does the same by resetting it on each call).
//!
//! Stored membership, as Kafka's `GroupMetadata` record in `__consumer_offsets`: a group's
//! last Stable generation ([`ClassicGroupRecord`]: generation, protocol, leader, and every
//! member with its subscription and assignment) is what storage must hold before any answer
//! that shows it goes out ([`GroupMembership::to_store`]: the SyncGroup answers that hand out
//! a generation's assignment, the JoinGroup answer of a static member that replaced another in
//! place); an Empty group's record is removed. While a round runs, storage keeps the last
//! Stable generation, as Kafka's does. A restarted coordinator restores each group Stable at
//! its stored generation ([`GroupMembership::restore`]): the members heartbeat and commit at
//! the generation they had, without a rebalance; sessions start over at the restore; a member
//! that was leaving when the coordinator stopped expires after its session. A group that was
//! Empty (nothing stored) starts over at generation 0, and then a zombie's commit from the
//! previous life is UNKNOWN_MEMBER_ID, because every life hands out its own member ids
//! ([`GroupMembership::with_incarnation`]).
//!
//! CAVEATS: no max group size.
//!
//! Static membership (KIP-345): a member joining with a `group.instance.id` that another member
//! holds replaces it, and the old member id is FENCED_INSTANCE_ID from then on. In a Stable
//! group whose protocol the newcomer does not change it takes the old member's place and
//! assignment without a rebalance (a restarted static consumer keeps its partitions and nobody
//! else stops); otherwise the group rebalances. A static member that has not rejoined by a
//! round's deadline keeps its place in the new generation, as in Kafka: the leader assigns it
//! partitions, and its session decides (it comes back and rejoins without a round, or it
//! expires and the group rebalances without it); a round in which only such members are left
//! waits on until one joins or they expire. Difference from Kafka: JoinGroup v9's
//! SkipAssignment is not used (a replaced leader's successor is answered as a follower, as
//! Kafka answers clients before v9).
//!
//! [`tick`]: GroupMembership::tick

use std::collections::BTreeMap;

/// Why a group request was refused (each is one of Kafka's error codes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// UNKNOWN_MEMBER_ID.
    #[error("unknown member {0:?}")]
    UnknownMemberId(String),
    /// ILLEGAL_GENERATION.
    #[error("generation {got} is not the group's {current}")]
    IllegalGeneration {
        /// The caller's.
        got: i32,
        /// The group's.
        current: i32,
    },
    /// REBALANCE_IN_PROGRESS.
    #[error("a rebalance is in progress")]
    RebalanceInProgress,
    /// INCONSISTENT_GROUP_PROTOCOL.
    #[error("no protocol in common with the group: {0}")]
    InconsistentGroupProtocol(String),
    /// MEMBER_ID_REQUIRED, with the id to rejoin with.
    #[error("rejoin with member id {0:?}")]
    MemberIdRequired(String),
    /// FENCED_INSTANCE_ID.
    #[error("member {0:?} is not the current member of its group instance")]
    FencedInstanceId(String),
    /// INVALID_SESSION_TIMEOUT.
    #[error("session timeout {0} ms is outside [{min}, {max}]", min = MIN_SESSION_TIMEOUT_MS, max = MAX_SESSION_TIMEOUT_MS)]
    InvalidSessionTimeout(i32),
    /// GROUP_MAX_SIZE_REACHED: a new member would take the group past `group.max.size`.
    #[error("the group has its maximum of {0} members")]
    GroupMaxSizeReached(usize),
}

/// Kafka's `group.min.session.timeout.ms` default.
pub const MIN_SESSION_TIMEOUT_MS: i32 = 6_000;
/// Kafka's `group.max.session.timeout.ms` default.
pub const MAX_SESSION_TIMEOUT_MS: i32 = 1_800_000;

/// At most this many characters of the client id start a member id.
pub const MEMBER_ID_PREFIX_LEN: usize = 64;

/// The group's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    /// No members.
    Empty,
    /// Waiting for every member to (re)join, until the deadline.
    PreparingRebalance {
        /// When the round completes with whoever joined.
        deadline_ms: i64,
    },
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Assigned.
    Stable,
}

impl GroupState {
    /// The state's name as Kafka's ListGroups and DescribeGroups spell it.
    pub fn name(&self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance { .. } => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// A group as DescribeGroups shows it ([`GroupMembership::describe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDescription {
    /// [`GroupState::name`].
    pub state: &'static str,
    /// The protocol type ("consumer"), or "" while nobody joined.
    pub protocol_type: String,
    /// The chosen protocol, in a Stable group only (else "").
    pub protocol: String,
    /// Every member.
    pub members: Vec<MemberDescription>,
}

/// One member as DescribeGroups shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberDescription {
    /// Its member id.
    pub member_id: String,
    /// Its group instance id, for a static member.
    pub instance_id: Option<String>,
    /// The client id it joined with.
    pub client_id: String,
    /// Where it joined from.
    pub client_host: String,
    /// Its metadata for the group's protocol (Stable only).
    pub metadata: Vec<u8>,
    /// Its assignment (Stable only).
    pub assignment: Vec<u8>,
}

/// A JoinGroup as the core sees it.
#[derive(Clone, Debug)]
pub struct JoinRequest {
    /// The caller's member id ("" for a new member).
    pub member_id: String,
    /// Static membership id, if any.
    pub group_instance_id: Option<String>,
    /// The client id (prefix of new member ids, and shown by DescribeGroups).
    pub client_id: String,
    /// Where the client connects from, as DescribeGroups shows it (Kafka's `/address`).
    pub client_host: String,
    /// Whether the client speaks JoinGroup v4+ (a new member must first get its id).
    pub require_known_member_id: bool,
    /// Session timeout.
    pub session_timeout_ms: i32,
    /// Rebalance timeout (v1+; v0 uses the session timeout).
    pub rebalance_timeout_ms: i32,
    /// "consumer" for consumers.
    pub protocol_type: String,
    /// (name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Vec<u8>)>,
}

/// A JoinGroup answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinResult {
    /// The new generation.
    pub generation: i32,
    /// The chosen protocol.
    pub protocol: String,
    /// The group's protocol type.
    pub protocol_type: String,
    /// The leader's member id.
    pub leader: String,
    /// This member's id.
    pub member_id: String,
    /// For the leader only: every member with its metadata for the chosen protocol.
    pub members: Vec<(String, Option<String>, Vec<u8>)>,
}

/// What is stored of a classic group, as Kafka's `GroupMetadata` record: its last Stable
/// generation ([`GroupMembership::to_store`], [`GroupMembership::restore`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClassicGroupRecord {
    /// The generation.
    pub generation: i32,
    /// Its protocol type ("consumer").
    pub protocol_type: String,
    /// The protocol chosen for the generation.
    pub protocol: String,
    /// The leader's member id.
    pub leader: String,
    /// Every member of the generation.
    pub members: Vec<ClassicMemberRecord>,
}

/// One member of a [`ClassicGroupRecord`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClassicMemberRecord {
    /// Its member id.
    pub member_id: String,
    /// Its group instance id, for a static member.
    pub instance_id: Option<String>,
    /// The client id it joined with.
    pub client_id: String,
    /// Where it joined from.
    pub client_host: String,
    /// Its session timeout.
    pub session_timeout_ms: i32,
    /// Its rebalance timeout.
    pub rebalance_timeout_ms: i32,
    /// (name, metadata) of the protocols it offered, in its order of preference.
    pub protocols: Vec<(String, Vec<u8>)>,
    /// Its assignment in the generation.
    pub assignment: Vec<u8>,
}

#[derive(Clone, Debug)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    protocols: Vec<(String, Vec<u8>)>,
    last_seen_ms: i64,
    awaiting_join: bool,
    join_result: Option<JoinResult>,
    /// A SyncGroup is parked for this member.
    awaiting_sync: bool,
    assignment: Vec<u8>,
}

/// One group's membership.
#[derive(Clone, Debug)]
pub struct GroupMembership {
    group_id: String,
    generation: i32,
    state: GroupState,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Ids handed out with MEMBER_ID_REQUIRED, not joined yet, and when each is forgotten
    /// (a session timeout after it was handed out, as Kafka's pending members).
    pending: BTreeMap<String, i64>,
    /// Static members (KIP-345): the member id that holds each group instance id now. A new
    /// instance joining with the id replaces the member that held it, and the old one is
    /// fenced from then on (FENCED_INSTANCE_ID).
    static_members: BTreeMap<String, String>,
    next_member: u64,
    /// Kafka's `group.initial.rebalance.delay.ms` (0: none).
    initial_delay_ms: i64,
    /// The first round of an Empty group completes no earlier than this, even with every
    /// member joined: each join pushes it on by `initial_delay_ms`, up to the round's deadline.
    initial_until_ms: Option<i64>,
    /// Part of every member id handed out: unique to this membership's life (see
    /// [`GroupMembership::with_incarnation`]).
    incarnation: String,
    /// What storage holds of the group, as far as it was told ([`Self::stored`]).
    stored: Option<ClassicGroupRecord>,
    /// Kafka's `group.max.size` ([`Self::with_max_size`]).
    max_size: usize,
}

impl GroupMembership {
    /// An Empty group at generation 0, without an initial rebalance delay.
    pub fn new(group_id: &str) -> Self {
        Self::with_initial_delay(group_id, 0)
    }

    /// An Empty group at generation 0 whose first round (from Empty) waits
    /// `initial_delay_ms` for more members (Kafka's `group.initial.rebalance.delay.ms`), so
    /// consumers started together get one rebalance rather than one each.
    pub fn with_initial_delay(group_id: &str, initial_delay_ms: i64) -> Self {
        Self {
            group_id: group_id.to_string(),
            generation: 0,
            state: GroupState::Empty,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            static_members: BTreeMap::new(),
            next_member: 0,
            initial_delay_ms: initial_delay_ms.max(0),
            initial_until_ms: None,
            incarnation: String::new(),
            stored: None,
            max_size: usize::MAX,
        }
    }

    /// With Kafka's `group.max.size`: a member that would join beyond `max` members is
    /// GROUP_MAX_SIZE_REACHED, as Kafka's `acceptJoiningMember` decides: an Empty group takes
    /// anyone; while a round runs, a new member is taken while fewer than `max` members have
    /// rejoined; otherwise while the group has fewer than `max` members. A member of the group
    /// (and a static member replacing its instance's holder) is always taken. A group restored
    /// with more members keeps them.
    pub fn with_max_size(mut self, max: usize) -> Self {
        self.max_size = max;
        self
    }

    /// Whether a member that is not in the group may join it ([`Self::with_max_size`]).
    fn takes_a_new_member(&self) -> bool {
        match self.state {
            GroupState::Empty => true,
            GroupState::PreparingRebalance { .. } => {
                self.members.values().filter(|m| m.awaiting_join).count() < self.max_size
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.members.len() < self.max_size
            }
        }
    }

    /// The group as storage holds it in `record` (read back at a coordinator's start): Stable
    /// at the record's generation, with its protocol, its leader, and every member with its
    /// subscription and assignment; every session starts over at `now_ms`, and nothing else
    /// waits. A record that is not consistent is taken as far as it is: a member without an
    /// id, or with an id or an instance id an earlier member of the record has, is left out
    /// (it rejoins); session timeouts are brought within Kafka's bounds; a leader that is not
    /// a member is replaced by the first member; a record without members gives an Empty group
    /// at its generation. The group then stores what it took ([`Self::to_store`]) when that
    /// differs from the record.
    pub fn restore(
        group_id: &str,
        initial_delay_ms: i64,
        record: ClassicGroupRecord,
        now_ms: i64,
    ) -> Self {
        let mut g = Self::with_initial_delay(group_id, initial_delay_ms);
        g.generation = record.generation.max(0);
        for m in &record.members {
            let taken_instance = m
                .instance_id
                .as_ref()
                .is_some_and(|i| g.static_members.contains_key(i));
            if m.member_id.is_empty() || g.members.contains_key(&m.member_id) || taken_instance {
                continue;
            }
            if let Some(instance) = &m.instance_id {
                g.static_members
                    .insert(instance.clone(), m.member_id.clone());
            }
            g.members.insert(
                m.member_id.clone(),
                Member {
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: m
                        .session_timeout_ms
                        .clamp(MIN_SESSION_TIMEOUT_MS, MAX_SESSION_TIMEOUT_MS),
                    rebalance_timeout_ms: m.rebalance_timeout_ms.max(0),
                    protocols: m.protocols.clone(),
                    last_seen_ms: now_ms,
                    awaiting_join: false,
                    join_result: None,
                    awaiting_sync: false,
                    assignment: m.assignment.clone(),
                },
            );
        }
        if let Some(first) = g.members.keys().next().cloned() {
            g.state = GroupState::Stable;
            g.protocol_type = Some(record.protocol_type.clone());
            g.protocol = Some(record.protocol.clone());
            g.leader = Some(if g.members.contains_key(&record.leader) {
                record.leader.clone()
            } else {
                first
            });
        }
        g.stored = Some(record);
        g
    }

    /// The group as [`ClassicGroupRecord`] stores it (meaningful in a Stable group).
    fn record(&self) -> ClassicGroupRecord {
        ClassicGroupRecord {
            generation: self.generation,
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol: self.protocol.clone().unwrap_or_default(),
            leader: self.leader.clone().unwrap_or_default(),
            members: self
                .members
                .iter()
                .map(|(id, m)| ClassicMemberRecord {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols: m.protocols.clone(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// What storage must be told before an answer that shows the group as it is now goes out,
    /// when storage does not hold it already ([`Self::stored`]): `Some(Some(record))` for a
    /// Stable generation (a new one, or a member replaced in place), `Some(None)` to remove
    /// the record of a group that is Empty now; `None` when there is nothing to write: storage
    /// holds it already, or a round is running (storage keeps the last Stable generation, as
    /// Kafka's does; members rejoin it after a restart).
    pub fn to_store(&self) -> Option<Option<ClassicGroupRecord>> {
        let now = match self.state {
            GroupState::Stable => Some(self.record()),
            GroupState::Empty => None,
            GroupState::PreparingRebalance { .. } | GroupState::CompletingRebalance => return None,
        };
        (now != self.stored).then_some(now)
    }

    /// Storage holds `record` for the group now (what [`Self::to_store`] gave, once durable).
    pub fn stored(&mut self, record: Option<ClassicGroupRecord>) {
        self.stored = record;
    }

    /// The same membership, whose member ids carry `incarnation` (`<client id>-<incarnation>-<n>`).
    /// The shell gives every membership it creates an incarnation no other one of the group
    /// ever had (Kafka puts a UUID in member ids for the same reason): a membership starts at
    /// generation 0 after a coordinator restart, or after an idle group was dropped, and
    /// counts its members from 1 again, so without it a zombie member of the previous life
    /// could hold the very member id and generation of a live member and get its offset
    /// commits through.
    pub fn with_incarnation(mut self, incarnation: &str) -> Self {
        self.incarnation = incarnation.to_string();
        self
    }

    /// Empty, with nobody joined or holding a member id handed out, and no record in storage
    /// to remove: dropping it loses nothing but the generation number (the offsets are stored
    /// apart).
    pub fn is_idle(&self) -> bool {
        self.state == GroupState::Empty
            && self.members.is_empty()
            && self.pending.is_empty()
            && self.stored.is_none()
    }

    /// The group's id.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    /// The current generation.
    pub fn generation(&self) -> i32 {
        self.generation
    }

    /// The state.
    pub fn state(&self) -> GroupState {
        self.state
    }

    /// The member ids.
    pub fn member_ids(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    /// The group's protocol type ("consumer"), or "" while nobody joined.
    pub fn protocol_type(&self) -> &str {
        self.protocol_type.as_deref().unwrap_or_default()
    }

    /// The leader's member id, if any.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_member += 1;
        // Kafka's member id starts with the client id; any client id is allowed there, so it
        // is cut to [`MEMBER_ID_PREFIX_LEN`] characters of a safe set, keeping member ids short.
        let prefix: String = client_id
            .chars()
            .take(MEMBER_ID_PREFIX_LEN)
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let prefix = if prefix.is_empty() {
            "member"
        } else {
            prefix.as_str()
        };
        if self.incarnation.is_empty() {
            format!("{prefix}-{}", self.next_member)
        } else {
            format!("{prefix}-{}-{}", self.incarnation, self.next_member)
        }
    }

    /// JoinGroup: returns the member id to wait with ([`Self::join_result`]).
    pub fn join(&mut self, mut request: JoinRequest, now_ms: i64) -> Result<String, GroupError> {
        if !(MIN_SESSION_TIMEOUT_MS..=MAX_SESSION_TIMEOUT_MS).contains(&request.session_timeout_ms)
        {
            return Err(GroupError::InvalidSessionTimeout(
                request.session_timeout_ms,
            ));
        }
        // A static instance whose holder it replaces adds no member.
        let replaces = request
            .group_instance_id
            .as_ref()
            .is_some_and(|i| self.static_members.contains_key(i));
        let new_member = !self.members.contains_key(&request.member_id) && !replaces;
        if new_member && !self.takes_a_new_member() {
            // A member id handed out and not joined is forgotten: the group is full.
            self.pending.remove(&request.member_id);
            return Err(GroupError::GroupMaxSizeReached(self.max_size));
        }
        let member_id = if request.member_id.is_empty() {
            let id = self.new_member_id(&request.client_id);
            // A static member gets its id at once (KIP-345 members skip KIP-394's round trip).
            if request.require_known_member_id && request.group_instance_id.is_none() {
                let expires_ms = now_ms.saturating_add(i64::from(request.session_timeout_ms));
                self.pending.insert(id.clone(), expires_ms);
                return Err(GroupError::MemberIdRequired(id));
            }
            id
        } else {
            self.fence_instance(&request.member_id, request.group_instance_id.as_deref())?;
            if !self.members.contains_key(&request.member_id)
                && !self.pending.contains_key(&request.member_id)
            {
                return Err(GroupError::UnknownMemberId(request.member_id));
            }
            if let Some(member) = self.members.get(&request.member_id) {
                // A member's group instance id is its own for its life, as Kafka keeps it: a
                // rejoin naming none keeps it; one naming an instance id the member does not
                // hold names no member (Kafka's `validateMember`), so the member is never
                // listed under two instance ids, nor an instance id under a member gone.
                match (&request.group_instance_id, &member.instance_id) {
                    (None, Some(own)) => request.group_instance_id = Some(own.clone()),
                    (Some(named), own) if own.as_ref() != Some(named) => {
                        return Err(GroupError::UnknownMemberId(request.member_id));
                    }
                    _ => {}
                }
            }
            request.member_id.clone()
        };
        if request.protocols.is_empty() || request.protocol_type.is_empty() {
            return Err(GroupError::InconsistentGroupProtocol(
                "no protocol type or protocols".into(),
            ));
        }
        if self.rejoin_unchanged(&member_id, &request, now_ms) {
            return Ok(member_id);
        }
        // A static instance that replaces its member: the old member is not one of the others.
        let replaced = request
            .group_instance_id
            .as_ref()
            .and_then(|i| self.static_members.get(i))
            .filter(|old| **old != member_id)
            .cloned();
        let others: Vec<&Member> = self
            .members
            .iter()
            .filter(|(id, _)| **id != member_id && Some(*id) != replaced.as_ref())
            .map(|(_, m)| m)
            .collect();
        if !others.is_empty() {
            if self.protocol_type.as_deref() != Some(request.protocol_type.as_str()) {
                return Err(GroupError::InconsistentGroupProtocol(format!(
                    "protocol type {:?} is not the group's {:?}",
                    request.protocol_type, self.protocol_type
                )));
            }
            let common = request.protocols.iter().any(|(name, _)| {
                others
                    .iter()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == name))
            });
            if !common {
                return Err(GroupError::InconsistentGroupProtocol(
                    "none of the member's protocols is supported by every member".into(),
                ));
            }
        }
        self.pending.remove(&member_id);
        if let (Some(old), GroupState::Stable) = (&replaced, self.state) {
            if self.protocol_after_replacing(old, &request.protocols) == self.protocol {
                self.replace_in_place(old, &member_id, request, now_ms);
                return Ok(member_id);
            }
        }
        if let Some(instance) = &request.group_instance_id {
            if let Some(old) = replaced {
                self.members.remove(&old);
                // The instance keeps its place: leading, if it led.
                if self.leader.as_deref() == Some(old.as_str()) {
                    self.leader = Some(member_id.clone());
                }
            }
            self.static_members
                .insert(instance.clone(), member_id.clone());
        }
        self.protocol_type = Some(request.protocol_type);
        let rebalance_timeout_ms = if request.rebalance_timeout_ms > 0 {
            request.rebalance_timeout_ms
        } else {
            request.session_timeout_ms
        };
        self.members.insert(
            member_id.clone(),
            Member {
                instance_id: request.group_instance_id,
                client_id: request.client_id,
                client_host: request.client_host,
                session_timeout_ms: request.session_timeout_ms,
                rebalance_timeout_ms,
                protocols: request.protocols,
                last_seen_ms: now_ms,
                awaiting_join: true,
                join_result: None,
                awaiting_sync: false,
                assignment: Vec::new(),
            },
        );
        self.prepare_rebalance(now_ms);
        self.try_complete_join(now_ms);
        Ok(member_id)
    }

    /// The protocol the group would choose if the member `old` had `protocols` instead of its
    /// own (the rule of a completed round: the leader's first protocol every member supports).
    fn protocol_after_replacing(
        &self,
        old: &str,
        protocols: &[(String, Vec<u8>)],
    ) -> Option<String> {
        let protocols_of = |id: &str| {
            if id == old {
                protocols
            } else {
                self.members.get(id).map_or(&[][..], |m| &m.protocols[..])
            }
        };
        let leader = self.leader.as_deref()?;
        protocols_of(leader)
            .iter()
            .map(|(name, _)| name)
            .find(|name| {
                self.members
                    .keys()
                    .all(|id| protocols_of(id).iter().any(|(n, _)| n == *name))
            })
            .cloned()
    }

    /// KIP-345: a new instance of a static member joins a Stable group whose protocol it does
    /// not change. It takes the old member's place as it is, assignment included, with no
    /// rebalance (a restarted static consumer keeps its partitions, and nobody else stops):
    /// the generation stays, and so does the leader, under its new id if the old member led.
    /// Its JoinGroup is answered at once with the current generation and, as Kafka does for
    /// clients that cannot skip the assignment (JoinGroup below v9), with the leader id from
    /// before the replacement and no member list, so the new instance acts as a follower and
    /// gets its assignment from SyncGroup. The old member id is fenced from now on
    /// ([`Self::fence_instance`]) and, without its instance id, unknown.
    fn replace_in_place(&mut self, old: &str, member_id: &str, request: JoinRequest, now_ms: i64) {
        let Some(mut member) = self.members.remove(old) else {
            return;
        };
        let leader_before = self.leader.clone().unwrap_or_default();
        if self.leader.as_deref() == Some(old) {
            self.leader = Some(member_id.to_string());
        }
        member.session_timeout_ms = request.session_timeout_ms;
        if request.rebalance_timeout_ms > 0 {
            member.rebalance_timeout_ms = request.rebalance_timeout_ms;
        }
        member.protocols = request.protocols;
        member.client_id = request.client_id;
        member.client_host = request.client_host;
        member.last_seen_ms = now_ms;
        member.awaiting_join = false;
        member.awaiting_sync = false;
        member.join_result = Some(JoinResult {
            generation: self.generation,
            protocol: self.protocol.clone().unwrap_or_default(),
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            leader: leader_before,
            member_id: member_id.to_string(),
            members: Vec::new(),
        });
        self.members.insert(member_id.to_string(), member);
        if let Some(instance) = request.group_instance_id {
            self.static_members.insert(instance, member_id.to_string());
        }
    }

    /// How long a round waits for every member: the largest rebalance timeout among them.
    fn rebalance_timeout_ms(&self) -> i32 {
        self.members
            .values()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0)
    }

    /// Starts a rebalance round (if one is not already running); a round from Empty waits
    /// the initial delay, pushed on by every join within it (up to the round's deadline).
    fn prepare_rebalance(&mut self, now_ms: i64) {
        if let GroupState::PreparingRebalance { deadline_ms } = self.state {
            if let Some(until) = &mut self.initial_until_ms {
                *until = (*until)
                    .max(now_ms + self.initial_delay_ms)
                    .min(deadline_ms);
            }
            return;
        }
        let from_empty = self.state == GroupState::Empty;
        let deadline_ms = now_ms + i64::from(self.rebalance_timeout_ms());
        self.state = GroupState::PreparingRebalance { deadline_ms };
        self.initial_until_ms = (from_empty && self.initial_delay_ms > 0)
            .then(|| (now_ms + self.initial_delay_ms).min(deadline_ms));
        for m in self.members.values_mut() {
            m.assignment.clear();
            // A parked SyncGroup is answered REBALANCE_IN_PROGRESS now; its session restarts
            // from this answer, as for a completed sync. The wait is over whether or not the
            // request is still there to read the answer: a member whose connection died while
            // parked must expire like any silent member.
            if m.awaiting_sync {
                m.last_seen_ms = now_ms;
                m.awaiting_sync = false;
            }
        }
    }

    /// Completes the round when everyone rejoined or the deadline passed.
    fn try_complete_join(&mut self, now_ms: i64) {
        let GroupState::PreparingRebalance { deadline_ms } = self.state else {
            return;
        };
        let all_joined = self.members.values().all(|m| m.awaiting_join);
        let delayed = self.initial_until_ms.is_some_and(|until| now_ms < until);
        if (!all_joined || delayed) && now_ms < deadline_ms {
            return;
        }
        self.initial_until_ms = None;
        // A dynamic member that has not rejoined is removed. A static one keeps its place, as
        // in Kafka (KIP-345): it is in the new generation and gets an assignment, and its
        // session decides whether it comes back (it rejoins without a round) or expires.
        self.members
            .retain(|_, m| m.awaiting_join || m.instance_id.is_some());
        if !self.members.is_empty() && !self.members.values().any(|m| m.awaiting_join) {
            // Only static members that did not rejoin: nobody could lead the generation. The
            // round waits on, as Kafka's does, until a member joins or their sessions expire.
            self.state = GroupState::PreparingRebalance {
                deadline_ms: now_ms + i64::from(self.rebalance_timeout_ms()),
            };
            return;
        }
        self.generation += 1;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.protocol_type = None;
            self.leader = None;
            return;
        }
        // The leader stays if it rejoined; else the first member that did.
        let leader = match &self.leader {
            Some(l) if self.members.get(l).is_some_and(|m| m.awaiting_join) => l.clone(),
            _ => self
                .members
                .iter()
                .find(|(_, m)| m.awaiting_join)
                .map(|(id, _)| id.clone())
                .expect("a member that joined"),
        };
        let protocol = self.members[&leader]
            .protocols
            .iter()
            .map(|(n, _)| n.clone())
            .find(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == name))
            })
            .expect("join checked a common protocol");
        let listing = self.listing(&protocol);
        let protocol_type = self.protocol_type.clone().unwrap_or_default();
        for (id, m) in self.members.iter_mut() {
            // A static member kept without rejoining has no JoinGroup to answer; its session
            // starts over with the generation (as Kafka schedules every member's next
            // heartbeat expiration here).
            m.last_seen_ms = now_ms;
            if !std::mem::take(&mut m.awaiting_join) {
                m.join_result = None;
                continue;
            }
            m.join_result = Some(JoinResult {
                generation: self.generation,
                protocol: protocol.clone(),
                protocol_type: protocol_type.clone(),
                leader: leader.clone(),
                member_id: id.clone(),
                members: if *id == leader {
                    listing.clone()
                } else {
                    Vec::new()
                },
            });
        }
        self.protocol = Some(protocol);
        self.leader = Some(leader);
        self.state = GroupState::CompletingRebalance;
    }

    /// Every member with its instance id and its metadata for `protocol` (the leader's
    /// JoinGroup answer).
    fn listing(&self, protocol: &str) -> Vec<(String, Option<String>, Vec<u8>)> {
        self.members
            .iter()
            .map(|(id, m)| {
                let metadata = m
                    .protocols
                    .iter()
                    .find(|(n, _)| n == protocol)
                    .map(|(_, md)| md.clone())
                    .unwrap_or_default();
                (id.clone(), m.instance_id.clone(), metadata)
            })
            .collect()
    }

    /// A member that joins again with the very protocols and metadata it joined with, as
    /// Kafka's group coordinator answers it: a follower of a Stable group, or any member of a
    /// group waiting for its assignment (its JoinGroup answer may have been lost), is answered
    /// at once with the current generation (the leader with the member list again) and the
    /// group goes on: no rebalance, which would stop every member. A leader rejoining a
    /// Stable group, or a member whose metadata changed (a new subscription), rebalances
    /// (returns false).
    fn rejoin_unchanged(&mut self, member_id: &str, request: &JoinRequest, now_ms: i64) -> bool {
        let Some(member) = self.members.get(member_id) else {
            return false;
        };
        if member.protocols != request.protocols
            || member.instance_id != request.group_instance_id
            || member.protocols.is_empty()
        {
            return false;
        }
        let is_leader = self.leader.as_deref() == Some(member_id);
        match self.state {
            GroupState::Stable if !is_leader => {}
            GroupState::CompletingRebalance => {}
            _ => return false,
        }
        let (Some(protocol), Some(leader)) = (self.protocol.clone(), self.leader.clone()) else {
            return false;
        };
        let result = JoinResult {
            generation: self.generation,
            members: if is_leader {
                self.listing(&protocol)
            } else {
                Vec::new()
            },
            protocol,
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            leader,
            member_id: member_id.to_string(),
        };
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_seen_ms = now_ms;
            m.join_result = Some(result);
        }
        true
    }

    /// Every member's metadata for every protocol it offered (OffsetDelete reads the
    /// subscriptions from it).
    pub fn protocol_metadata(&self) -> impl Iterator<Item = &[u8]> {
        self.members
            .values()
            .flat_map(|m| m.protocols.iter().map(|(_, md)| md.as_slice()))
    }

    /// What DescribeGroups shows, as Kafka's `GroupMetadata.summary`: the state, the protocol
    /// type, and every member with its client id and host; a Stable group also names its
    /// protocol and shows each member's metadata for it and its assignment (in any other
    /// state there is no settled assignment to show).
    pub fn describe(&self) -> GroupDescription {
        let stable = self.state == GroupState::Stable;
        let protocol = if stable {
            self.protocol.clone().unwrap_or_default()
        } else {
            String::new()
        };
        let members = self
            .members
            .iter()
            .map(|(id, m)| MemberDescription {
                member_id: id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: if stable {
                    m.protocols
                        .iter()
                        .find(|(n, _)| *n == protocol)
                        .map(|(_, md)| md.clone())
                        .unwrap_or_default()
                } else {
                    Vec::new()
                },
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    Vec::new()
                },
            })
            .collect();
        GroupDescription {
            state: self.state.name(),
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol,
            members,
        }
    }

    /// The parked JoinGroup of `member_id`: `None` while its round runs; then its answer, once
    /// (UNKNOWN_MEMBER_ID if it was removed meanwhile).
    pub fn join_result(&mut self, member_id: &str) -> Option<Result<JoinResult, GroupError>> {
        match self.members.get_mut(member_id) {
            None => Some(Err(GroupError::UnknownMemberId(member_id.to_string()))),
            Some(m) => m.join_result.take().map(Ok),
        }
    }

    /// KIP-345: a request naming a group instance id that another member holds now comes
    /// from the instance that member replaced: FENCED_INSTANCE_ID.
    pub fn fence_instance(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), GroupError> {
        match instance_id.and_then(|i| self.static_members.get(i)) {
            Some(current) if current != member_id => {
                Err(GroupError::FencedInstanceId(member_id.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// The member id that holds `instance_id` (a static member), if any.
    pub fn static_member(&self, instance_id: &str) -> Option<&str> {
        self.static_members.get(instance_id).map(String::as_str)
    }

    /// Drops the instance ids of members that are gone.
    fn forget_gone_instances(&mut self) {
        let members = &self.members;
        self.static_members.retain(|_, m| members.contains_key(m));
    }

    fn member(&self, member_id: &str, generation: i32) -> Result<&Member, GroupError> {
        let member = self
            .members
            .get(member_id)
            .ok_or_else(|| GroupError::UnknownMemberId(member_id.to_string()))?;
        if generation != self.generation {
            return Err(GroupError::IllegalGeneration {
                got: generation,
                current: self.generation,
            });
        }
        Ok(member)
    }

    /// SyncGroup: the leader brings the assignment. Park the request and poll
    /// [`Self::sync_result`].
    pub fn sync(
        &mut self,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Vec<u8>)>,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        self.member(member_id, generation)?;
        match self.state {
            GroupState::PreparingRebalance { .. } => return Err(GroupError::RebalanceInProgress),
            GroupState::Empty => return Err(GroupError::UnknownMemberId(member_id.to_string())),
            GroupState::CompletingRebalance if self.leader.as_deref() == Some(member_id) => {
                for (id, m) in self.members.iter_mut() {
                    m.assignment = assignments
                        .iter()
                        .find(|(a, _)| a == id)
                        .map(|(_, bytes)| bytes.clone())
                        .unwrap_or_default();
                    // As Kafka does when it hands out the assignment, a member whose SyncGroup
                    // waited for the leader starts a fresh session now: it could not heartbeat
                    // while it waited. Its wait is over (the parked request reads the
                    // assignment from the Stable group), so from now on its session counts: a
                    // member whose connection died while parked expires like a silent one.
                    if m.awaiting_sync {
                        m.last_seen_ms = now_ms;
                        m.awaiting_sync = false;
                    }
                }
                self.state = GroupState::Stable;
            }
            GroupState::CompletingRebalance | GroupState::Stable => {}
        }
        let waits = self.state == GroupState::CompletingRebalance;
        let m = self.members.get_mut(member_id).expect("checked");
        m.awaiting_sync = waits;
        m.last_seen_ms = now_ms;
        Ok(())
    }

    /// The parked SyncGroup of `member_id` ended without an answer (its wait timed out, or
    /// its connection closed): its session counts again from `now_ms`, so a member that went
    /// away expires instead of keeping its place in the group forever.
    pub fn sync_abandoned(&mut self, member_id: &str, now_ms: i64) {
        if let Some(m) = self.members.get_mut(member_id) {
            if m.awaiting_sync {
                m.awaiting_sync = false;
                m.last_seen_ms = now_ms;
            }
        }
    }

    /// The parked SyncGroup of `member_id` at `generation`: `None` while the leader's assignment
    /// is awaited; then the member's assignment, or the error that ends the wait.
    pub fn sync_result(
        &mut self,
        member_id: &str,
        generation: i32,
    ) -> Option<Result<Vec<u8>, GroupError>> {
        if let Err(e) = self.member(member_id, generation) {
            return Some(Err(e));
        }
        let result = match self.state {
            GroupState::Stable => Ok(self.members[member_id].assignment.clone()),
            GroupState::PreparingRebalance { .. } => Err(GroupError::RebalanceInProgress),
            GroupState::Empty => Err(GroupError::UnknownMemberId(member_id.to_string())),
            GroupState::CompletingRebalance => return None,
        };
        if let Some(m) = self.members.get_mut(member_id) {
            m.awaiting_sync = false;
        }
        Some(result)
    }

    /// Heartbeat.
    pub fn heartbeat(
        &mut self,
        member_id: &str,
        generation: i32,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_seen_ms = now_ms;
        }
        self.member(member_id, generation)?;
        match self.state {
            GroupState::PreparingRebalance { .. } => Err(GroupError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// LeaveGroup: the member is removed at once and the others rebalance. A member id handed
    /// out and not joined yet is forgotten (nothing to rebalance).
    pub fn leave(&mut self, member_id: &str, now_ms: i64) -> Result<(), GroupError> {
        if self.pending.remove(member_id).is_some() {
            return Ok(());
        }
        if self.members.remove(member_id).is_none() {
            return Err(GroupError::UnknownMemberId(member_id.to_string()));
        }
        self.forget_gone_instances();
        self.prepare_rebalance(now_ms);
        self.try_complete_join(now_ms);
        Ok(())
    }

    /// Expires members whose session ran out (not while a JoinGroup or SyncGroup of theirs is
    /// parked) and member ids handed out but not joined within a session timeout, and completes
    /// a round whose deadline passed. Returns the expired member ids.
    pub fn tick(&mut self, now_ms: i64) -> Vec<String> {
        self.pending.retain(|_, expires_ms| now_ms < *expires_ms);
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                !m.awaiting_join
                    && !m.awaiting_sync
                    && now_ms - m.last_seen_ms > i64::from(m.session_timeout_ms)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.members.remove(id);
        }
        self.forget_gone_instances();
        if !expired.is_empty() {
            self.prepare_rebalance(now_ms);
        }
        self.try_complete_join(now_ms);
        expired
    }

    /// KIP-447 / OffsetCommit: may this caller commit offsets for the group? Kafka's rules
    /// (`GroupCoordinator.validateOffsetCommit`):
    /// - a caller that names a member, a generation or an instance must be that member, in the
    ///   current generation;
    /// - a caller outside any generation (`generation` < 0, no member id, no instance id): a
    ///   plain commit (a standalone consumer) only while the group has no members, else
    ///   UNKNOWN_MEMBER_ID; a transactional one always (TxnOffsetCommit before v3 cannot carry
    ///   the member, nor can the clients that pass only the group id: their producer's epoch is
    ///   what fences them, at the transaction's coordinator);
    /// - a plain commit of a member while the group waits for its assignment
    ///   (CompletingRebalance) is REBALANCE_IN_PROGRESS: the member commits again after
    ///   SyncGroup.
    pub fn check_commit(
        &self,
        member_id: &str,
        generation: i32,
        instance_id: Option<&str>,
        kind: CommitKind,
    ) -> Result<(), GroupError> {
        if generation < 0 && member_id.is_empty() && instance_id.is_none() {
            return match kind {
                CommitKind::Transactional => Ok(()),
                CommitKind::Plain if self.members.is_empty() => Ok(()),
                CommitKind::Plain => Err(GroupError::UnknownMemberId(String::new())),
            };
        }
        // As Kafka's `validateMember`: a commit naming a group instance id must come from the
        // member that holds it now (FENCED_INSTANCE_ID if another does, UNKNOWN_MEMBER_ID if
        // nobody does); one naming none, from a member.
        match instance_id.map(|i| self.static_members.get(i)) {
            Some(None) => return Err(GroupError::UnknownMemberId(member_id.to_string())),
            Some(Some(holder)) if holder != member_id => {
                return Err(GroupError::FencedInstanceId(member_id.to_string()))
            }
            _ => {}
        }
        if !self.members.contains_key(member_id) {
            return Err(GroupError::UnknownMemberId(member_id.to_string()));
        }
        if generation != self.generation {
            return Err(GroupError::IllegalGeneration {
                got: generation,
                current: self.generation,
            });
        }
        if kind == CommitKind::Plain && self.state == GroupState::CompletingRebalance {
            return Err(GroupError::RebalanceInProgress);
        }
        Ok(())
    }
}

/// Which request commits offsets ([`GroupMembership::check_commit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitKind {
    /// OffsetCommit: applied at once.
    Plain,
    /// TxnOffsetCommit: pending until its transaction's marker.
    Transactional,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(id: &str, protocols: &[&str]) -> JoinRequest {
        JoinRequest {
            member_id: id.to_string(),
            group_instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            require_known_member_id: false,
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|p| (p.to_string(), p.as_bytes().to_vec()))
                .collect(),
        }
    }

    /// A (leader) and B joined generation 2, whose answers were read; the group awaits A's
    /// assignment: (group, a, b).
    fn completing_pair() -> (GroupMembership, String, String) {
        let mut g = GroupMembership::new("g");
        let a = g.join(join("", &["range"]), 0).unwrap();
        g.join_result(&a).unwrap().unwrap();
        g.sync(&a, 1, vec![], 0).unwrap();
        g.sync_result(&a, 1).unwrap().unwrap();
        let b = g.join(join("", &["range"]), 10).unwrap();
        g.join(join(&a, &["range"]), 20).unwrap();
        g.join_result(&a).unwrap().unwrap();
        g.join_result(&b).unwrap().unwrap();
        assert_eq!(g.state(), GroupState::CompletingRebalance);
        (g, a, b)
    }

    /// Two members joined and synced: (group, leader, follower).
    fn stable_pair() -> (GroupMembership, String, String) {
        let mut g = GroupMembership::new("g");
        let a = g.join(join("", &["range"]), 0).unwrap();
        // Alone: the round completes at once.
        let ra = g.join_result(&a).unwrap().unwrap();
        assert_eq!((ra.generation, ra.leader.as_str()), (1, a.as_str()));
        g.sync(&a, 1, vec![(a.clone(), b"all".to_vec())], 0)
            .unwrap();
        assert_eq!(g.sync_result(&a, 1).unwrap().unwrap(), b"all");
        // B joins: A must rejoin (heartbeat tells it), then the round completes.
        let b = g.join(join("", &["roundrobin", "range"]), 10).unwrap();
        assert!(g.join_result(&b).is_none(), "waits for A");
        assert_eq!(g.heartbeat(&a, 1, 11), Err(GroupError::RebalanceInProgress));
        g.join(join(&a, &["range"]), 12).unwrap();
        let ra = g.join_result(&a).unwrap().unwrap();
        let rb = g.join_result(&b).unwrap().unwrap();
        assert_eq!((ra.generation, rb.generation), (2, 2));
        assert_eq!(ra.protocol, "range", "the leader's first common protocol");
        assert_eq!(ra.members.len(), 2, "the leader gets the member list");
        assert!(rb.members.is_empty());
        // The follower's SyncGroup waits for the leader's.
        g.sync(&b, 2, vec![], 13).unwrap();
        assert_eq!(g.sync_result(&b, 2), None);
        g.sync(
            &a,
            2,
            vec![(a.clone(), b"0".to_vec()), (b.clone(), b"1".to_vec())],
            14,
        )
        .unwrap();
        assert_eq!(g.sync_result(&b, 2).unwrap().unwrap(), b"1");
        assert_eq!(g.sync_result(&a, 2).unwrap().unwrap(), b"0");
        assert_eq!(g.state(), GroupState::Stable);
        (g, a, b)
    }

    /// group.initial.rebalance.delay: consumers that join an Empty group one after another
    /// within the delay all land in its first generation; each join pushes the round on, never
    /// past its deadline; later rounds (not from Empty) are not delayed.
    #[test]
    fn the_first_round_of_an_empty_group_waits_for_more_members() {
        let mut g = GroupMembership::with_initial_delay("g", 3_000);
        let a = g.join(join("", &["range"]), 0).unwrap();
        g.tick(2_999);
        assert!(g.join_result(&a).is_none(), "alone, but within the delay");
        let b = g.join(join("", &["range"]), 2_000).unwrap();
        g.tick(4_999);
        assert!(
            g.join_result(&a).is_none(),
            "B's join pushed the round to 5 000"
        );
        g.tick(5_000);
        let (ra, rb) = (
            g.join_result(&a).unwrap().unwrap(),
            g.join_result(&b).unwrap().unwrap(),
        );
        assert_eq!(
            (ra.generation, rb.generation),
            (1, 1),
            "one rebalance for both"
        );
        assert_eq!(ra.members.len(), 2);
        g.sync(&a, 1, vec![], 5_001).unwrap();
        // A third member: not from Empty, so no delay once everyone rejoined.
        let c = g.join(join("", &["range"]), 6_000).unwrap();
        g.join(join(&a, &["range"]), 6_001).unwrap();
        g.join(join(&b, &["range"]), 6_002).unwrap();
        assert_eq!(g.join_result(&c).unwrap().unwrap().generation, 2);

        // Joins keep coming: the round still completes by its deadline (rebalance timeout).
        let mut g = GroupMembership::with_initial_delay("g", 20_000);
        let first = g.join(join("", &["range"]), 0).unwrap();
        g.join(join("", &["range"]), 15_000).unwrap();
        g.tick(29_999);
        assert!(g.join_result(&first).is_none());
        g.tick(30_000);
        assert_eq!(g.join_result(&first).unwrap().unwrap().generation, 1);
    }

    #[test]
    fn join_sync_and_a_second_member_rebalance() {
        let (g, a, _) = stable_pair();
        assert_eq!(g.leader(), Some(a.as_str()));
    }

    #[test]
    fn new_members_of_v4_clients_first_get_their_id() {
        let mut g = GroupMembership::new("g");
        let mut request = join("", &["range"]);
        request.require_known_member_id = true;
        let Err(GroupError::MemberIdRequired(id)) = g.join(request.clone(), 0) else {
            panic!("MEMBER_ID_REQUIRED expected");
        };
        request.member_id = id.clone();
        assert_eq!(g.join(request, 1).unwrap(), id);
        assert_eq!(
            g.join(join("stranger", &["range"]), 2),
            Err(GroupError::UnknownMemberId("stranger".into()))
        );
    }

    #[test]
    fn heartbeats_and_generations() {
        let (mut g, a, b) = stable_pair();
        assert_eq!(g.heartbeat(&a, 2, 20), Ok(()));
        assert_eq!(
            g.heartbeat(&a, 1, 20),
            Err(GroupError::IllegalGeneration { got: 1, current: 2 })
        );
        assert_eq!(
            g.heartbeat("x", 2, 20),
            Err(GroupError::UnknownMemberId("x".into()))
        );
        assert_eq!(g.heartbeat(&b, 2, 20), Ok(()));
    }

    #[test]
    fn a_silent_member_expires_and_the_rest_rebalance() {
        let (mut g, a, b) = stable_pair();
        g.heartbeat(&a, 2, 9_000).unwrap();
        // B's session (10 s) ran out at 14 + 10_000.
        assert_eq!(g.tick(10_100), vec![b.clone()]);
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        g.join(join(&a, &["range"]), 10_200).unwrap();
        let ra = g.join_result(&a).unwrap().unwrap();
        assert_eq!((ra.generation, ra.members.len()), (3, 1));
    }

    #[test]
    fn the_round_completes_at_the_deadline_without_the_late_member() {
        let (mut g, a, b) = stable_pair();
        g.join(join(&a, &["range"]), 100).unwrap();
        assert!(g.join_result(&a).is_none());
        // B neither rejoins nor is expired (it heartbeats), but the 30 s deadline passes.
        g.heartbeat(&b, 2, 25_000).ok();
        g.tick(30_101);
        assert_eq!(g.member_ids(), vec![a.clone()]);
        assert_eq!(g.join_result(&a).unwrap().unwrap().generation, 3);
        assert_eq!(
            g.heartbeat(&b, 2, 30_200),
            Err(GroupError::UnknownMemberId(b))
        );
    }

    #[test]
    fn leaving_rebalances_and_the_last_one_out_empties_the_group() {
        let (mut g, a, b) = stable_pair();
        g.leave(&b, 50).unwrap();
        g.join(join(&a, &["range"]), 51).unwrap();
        assert_eq!(g.join_result(&a).unwrap().unwrap().generation, 3);
        g.leave(&a, 52).unwrap();
        assert_eq!(g.state(), GroupState::Empty);
        assert_eq!(g.generation(), 4);
        assert_eq!(g.leave(&a, 53), Err(GroupError::UnknownMemberId(a)));
    }

    #[test]
    fn protocols_must_be_shared() {
        let (mut g, _, _) = stable_pair();
        assert!(matches!(
            g.join(join("", &["sticky"]), 60),
            Err(GroupError::InconsistentGroupProtocol(_))
        ));
        let mut other = join("", &["range"]);
        other.protocol_type = "connect".into();
        assert!(matches!(
            g.join(other, 61),
            Err(GroupError::InconsistentGroupProtocol(_))
        ));
        let mut bad = join("", &["range"]);
        bad.session_timeout_ms = 10;
        assert_eq!(g.join(bad, 62), Err(GroupError::InvalidSessionTimeout(10)));
    }

    use CommitKind::{Plain, Transactional as Txn};

    #[test]
    fn kip_447_commits_are_checked_against_the_generation() {
        let (mut g, a, b) = stable_pair();
        assert_eq!(g.check_commit(&a, 2, None, Txn), Ok(()));
        assert_eq!(g.check_commit(&a, 2, None, Plain), Ok(()));
        // A zombie of generation 2 after the group moved on to generation 3.
        g.leave(&b, 70).unwrap();
        g.join(join(&a, &["range"]), 71).unwrap();
        g.join_result(&a).unwrap().unwrap();
        for kind in [Txn, Plain] {
            assert_eq!(
                g.check_commit(&a, 2, None, kind),
                Err(GroupError::IllegalGeneration { got: 2, current: 3 })
            );
            assert_eq!(
                g.check_commit(&b, 3, None, kind),
                Err(GroupError::UnknownMemberId(b.clone()))
            );
        }
        // Outside any generation while the group has members: a standalone consumer's commit
        // is refused; a transactional one (no member to name before TxnOffsetCommit v3, or a
        // client given only the group id) is left to the producer's epoch, as Kafka's.
        assert_eq!(
            g.check_commit("", -1, None, Plain),
            Err(GroupError::UnknownMemberId(String::new()))
        );
        assert_eq!(g.check_commit("", -1, None, Txn), Ok(()));
        assert_eq!(
            g.check_commit("", -1, Some("i-9"), Txn),
            Err(GroupError::UnknownMemberId(String::new())),
            "naming an instance is naming a member"
        );
        let mut empty = GroupMembership::new("e");
        assert_eq!(empty.check_commit("", -1, None, Plain), Ok(()));
        assert_eq!(empty.check_commit("", -1, None, Txn), Ok(()));
        // Static membership: an instance id nobody holds names no member (Kafka's
        // `validateMember`), one another member holds is fenced, whoever sends it (a dynamic
        // member naming an instance id included).
        let mut request = join("", &["range"]);
        request.group_instance_id = Some("i-1".into());
        let m = empty.join(request, 0).unwrap();
        empty.join_result(&m).unwrap().unwrap();
        assert_eq!(
            empty.check_commit(&m, 1, Some("i-2"), Txn),
            Err(GroupError::UnknownMemberId(m.clone()))
        );
        assert_eq!(empty.check_commit(&m, 1, Some("i-1"), Txn), Ok(()));
        assert_eq!(
            g.check_commit(&a, 3, Some("i-1"), Txn),
            Err(GroupError::UnknownMemberId(a.clone())),
            "a dynamic member naming an instance id of another group's member"
        );
        assert_eq!(
            g.check_commit(&a, 3, Some("nobody"), Plain),
            Err(GroupError::UnknownMemberId(a.clone())),
            "found by the consumer_group fuzz target: it was accepted"
        );
    }

    /// Kafka's rule for a member's plain commit while the group waits for the leader's
    /// assignment: REBALANCE_IN_PROGRESS (the member commits again after SyncGroup); a
    /// transactional one stays pending until its marker, so it is taken.
    #[test]
    fn a_plain_commit_waits_for_the_assignment_a_transactional_one_does_not() {
        let mut g = GroupMembership::new("g");
        let a = g.join(join("", &["range"]), 0).unwrap();
        g.join_result(&a).unwrap().unwrap();
        assert_eq!(g.state(), GroupState::CompletingRebalance);
        assert_eq!(
            g.check_commit(&a, 1, None, Plain),
            Err(GroupError::RebalanceInProgress)
        );
        assert_eq!(g.check_commit(&a, 1, None, Txn), Ok(()));
        g.sync(&a, 1, vec![(a.clone(), b"all".to_vec())], 1)
            .unwrap();
        assert_eq!(g.state(), GroupState::Stable);
        assert_eq!(g.check_commit(&a, 1, None, Plain), Ok(()));
    }

    /// KIP-345: a new instance of a static member (same group instance id, no member id)
    /// replaces the member that held the id, and every later request of the old member naming
    /// the instance (JoinGroup, SyncGroup, Heartbeat, commits) is FENCED_INSTANCE_ID: the old
    /// process, stalled and back, cannot commit for the partitions the new one now owns.
    #[test]
    fn a_replaced_static_member_is_fenced() {
        let static_join = |member: &str| {
            let mut request = join(member, &["range"]);
            request.group_instance_id = Some("i-1".into());
            request.require_known_member_id = true;
            request
        };
        let mut g = GroupMembership::new("g");
        let old = g.join(static_join(""), 0).unwrap();
        assert_eq!(g.join_result(&old).unwrap().unwrap().generation, 1);
        g.sync(&old, 1, vec![(old.clone(), b"all".to_vec())], 1)
            .unwrap();
        assert_eq!(g.static_member("i-1"), Some(old.as_str()));
        // The replacement: a member id at once (no MEMBER_ID_REQUIRED for a static member),
        // and the old member's place in the Stable group without a rebalance: the same
        // generation, answered as a follower (the leader id from before), and its assignment
        // from SyncGroup.
        let new = g.join(static_join(""), 10).unwrap();
        assert_ne!(new, old);
        assert_eq!(g.member_ids(), vec![new.clone()], "the old member is gone");
        assert_eq!(g.static_member("i-1"), Some(new.as_str()));
        assert_eq!(g.state(), GroupState::Stable);
        let joined = g.join_result(&new).unwrap().unwrap();
        assert_eq!(
            (
                joined.generation,
                joined.leader.as_str(),
                joined.members.len()
            ),
            (1, old.as_str(), 0)
        );
        assert_eq!(g.leader(), Some(new.as_str()), "it leads the next round");
        g.sync(&new, 1, Vec::new(), 10).unwrap();
        assert_eq!(g.sync_result(&new, 1), Some(Ok(b"all".to_vec())));
        let fenced = GroupError::FencedInstanceId(old.clone());
        assert_eq!(g.join(static_join(&old), 11), Err(fenced.clone()));
        assert_eq!(g.fence_instance(&old, Some("i-1")), Err(fenced.clone()));
        assert_eq!(
            g.check_commit(&old, 1, Some("i-1"), Txn),
            Err(fenced.clone())
        );
        assert_eq!(g.check_commit(&old, 1, Some("i-1"), Plain), Err(fenced));
        // Without the instance id the old member is simply unknown, though its generation is
        // still the group's.
        assert_eq!(
            g.check_commit(&old, 1, None, Txn),
            Err(GroupError::UnknownMemberId(old.clone()))
        );
        assert_eq!(g.check_commit(&new, 1, Some("i-1"), Txn), Ok(()));
        // The instance leaves: the id is free again and the group idle.
        g.leave(&new, 20).unwrap();
        assert_eq!(g.static_member("i-1"), None);
        assert!(g.is_idle());
    }

    /// A member keeps the group instance id it joined with (found by the consumer_group fuzz
    /// target: a member that rejoined naming another one was listed under both, and when a new
    /// instance took over the first, the second stayed with a member that was gone).
    #[test]
    fn a_member_rejoining_under_another_instance_id_names_no_member() {
        let mut g = GroupMembership::new("g");
        let a = g.join(static_join("", "i-a", &["range"]), 0).unwrap();
        g.join_result(&a).unwrap().unwrap();
        assert_eq!(
            g.join(static_join(&a, "i-b", &["range"]), 1),
            Err(GroupError::UnknownMemberId(a.clone()))
        );
        assert_eq!(g.static_member("i-b"), None);
        // A dynamic member naming an instance id: the same.
        let d = g.join(join("", &["range"]), 2).unwrap();
        assert_eq!(
            g.join(static_join(&d, "i-c", &["range"]), 3),
            Err(GroupError::UnknownMemberId(d.clone()))
        );
        // A static member's rejoin that leaves its instance id out keeps it.
        assert_eq!(g.join(join(&a, &["range"]), 4), Ok(a.clone()));
        assert_eq!(g.static_member("i-a"), Some(a.as_str()));
        let described = g.describe();
        let member = described.members.iter().find(|m| m.member_id == a).unwrap();
        assert_eq!(member.instance_id.as_deref(), Some("i-a"));
        // A new instance of i-a replaces it, and nothing is left under a gone member.
        let a2 = g.join(static_join("", "i-a", &["range"]), 5).unwrap();
        assert_eq!(g.static_member("i-a"), Some(a2.as_str()));
        assert!(!g.member_ids().contains(&a));
    }

    fn static_join(member: &str, instance: &str, protocols: &[&str]) -> JoinRequest {
        let mut request = join(member, protocols);
        request.group_instance_id = Some(instance.into());
        request.require_known_member_id = true;
        request
    }

    /// A Stable group at generation 1 of two static members, "i-a" (the leader, assigned "0")
    /// and "i-b" (assigned "1"), both preferring `protocols`: (group, a, b).
    fn stable_static_pair(protocols: &[&str]) -> (GroupMembership, String, String) {
        let mut g = GroupMembership::with_initial_delay("g", 5);
        let a = g.join(static_join("", "i-a", protocols), 0).unwrap();
        let b = g.join(static_join("", "i-b", protocols), 1).unwrap();
        g.tick(10);
        let ra = g.join_result(&a).unwrap().unwrap();
        g.join_result(&b).unwrap().unwrap();
        assert_eq!((ra.generation, ra.leader.as_str()), (1, a.as_str()));
        let assignment = vec![(a.clone(), b"0".to_vec()), (b.clone(), b"1".to_vec())];
        g.sync(&a, 1, assignment, 11).unwrap();
        assert_eq!(g.state(), GroupState::Stable);
        (g, a, b)
    }

    /// Two static members with sessions longer than the rebalance timeout (as static members
    /// are configured), Stable at generation 1, and a dynamic member C that starts a round at
    /// 100: (group, a, b, c).
    fn static_pair_and_a_newcomer() -> (GroupMembership, String, String, String) {
        let long = |instance: &str| {
            let mut request = static_join("", instance, &["range"]);
            request.session_timeout_ms = 120_000;
            request
        };
        let mut g = GroupMembership::with_initial_delay("g", 5);
        let a = g.join(long("i-a"), 0).unwrap();
        let b = g.join(long("i-b"), 1).unwrap();
        g.tick(10);
        g.join_result(&a).unwrap().unwrap();
        g.join_result(&b).unwrap().unwrap();
        g.sync(
            &a,
            1,
            vec![(a.clone(), b"0".to_vec()), (b.clone(), b"1".to_vec())],
            11,
        )
        .unwrap();
        let c = g.join(join("", &["range"]), 100).unwrap();
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        (g, a, b, c)
    }

    /// KIP-345, as Kafka: a static member that has not rejoined by the round's deadline (a
    /// consumer restarting, or stuck in a long poll) keeps its place in the new generation,
    /// and comes back to its partitions without another round.
    #[test]
    fn a_static_member_late_for_a_round_keeps_its_place() {
        let (mut g, a, b, c) = static_pair_and_a_newcomer();
        g.join(static_join(&a, "i-a", &["range"]), 200).unwrap();
        assert_eq!(g.tick(30_101), Vec::<String>::new());
        assert_eq!(g.member_ids().len(), 3, "B is kept: {:?}", g.member_ids());
        let ra = g.join_result(&a).unwrap().unwrap();
        assert_eq!((ra.generation, ra.leader.as_str()), (2, a.as_str()));
        let listed: Vec<&str> = ra.members.iter().map(|(id, _, _)| id.as_str()).collect();
        assert!(listed.contains(&b.as_str()), "the leader assigns B too");
        assert_eq!(g.join_result(&c).unwrap().unwrap().generation, 2);
        assert_eq!(g.join_result(&b), None, "B has no JoinGroup to answer");
        let assignment = vec![
            (a.clone(), b"0".to_vec()),
            (b.clone(), b"1".to_vec()),
            (c.clone(), b"2".to_vec()),
        ];
        g.sync(&a, 2, assignment, 30_200).unwrap();
        assert_eq!(g.state(), GroupState::Stable);
        // B comes back: its old generation is refused, it rejoins and is answered at once.
        assert_eq!(
            g.heartbeat(&b, 1, 40_000),
            Err(GroupError::IllegalGeneration { got: 1, current: 2 })
        );
        g.join(static_join(&b, "i-b", &["range"]), 40_010).unwrap();
        assert_eq!(g.join_result(&b).unwrap().unwrap().generation, 2);
        assert_eq!(g.state(), GroupState::Stable, "no round for B's return");
        g.sync(&b, 2, vec![], 40_020).unwrap();
        assert_eq!(g.sync_result(&b, 2).unwrap().unwrap(), b"1");

        // Had B not come back, its session (120 s from the generation) would have decided.
        let (mut g, a, b, c) = static_pair_and_a_newcomer();
        g.join(static_join(&a, "i-a", &["range"]), 200).unwrap();
        g.tick(30_101);
        g.sync(&a, 2, vec![], 30_200).unwrap();
        for now in (35_000..=150_000).step_by(5_000) {
            g.heartbeat(&a, 2, now).unwrap();
            g.heartbeat(&c, 2, now).unwrap();
            assert_eq!(
                g.tick(now),
                Vec::<String>::new(),
                "B's session holds at {now}"
            );
        }
        assert_eq!(g.tick(150_102), vec![b.clone()], "B's session ran out");
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        assert_eq!(g.static_member("i-b"), None);
    }

    /// The leader is the static member that is late: a member that rejoined leads instead.
    #[test]
    fn a_late_static_leader_hands_the_lead_to_a_member_that_rejoined() {
        let (mut g, a, b, c) = static_pair_and_a_newcomer();
        g.join(static_join(&b, "i-b", &["range"]), 200).unwrap();
        g.tick(30_101);
        assert_eq!(g.member_ids().len(), 3);
        let rb = g.join_result(&b).unwrap().unwrap();
        let rc = g.join_result(&c).unwrap().unwrap();
        assert_eq!(rb.leader, rc.leader);
        assert_ne!(rb.leader, a, "A did not rejoin: it cannot lead");
        let leader = if rb.leader == b { &rb } else { &rc };
        assert_eq!(leader.members.len(), 3);
    }

    /// Nobody but late static members is left (the newcomer left again): no one can lead, so
    /// the round waits on, until a member joins or the late ones expire.
    #[test]
    fn a_round_of_late_static_members_only_waits_for_one_to_join() {
        let (mut g, a, b, c) = static_pair_and_a_newcomer();
        g.leave(&c, 200).unwrap();
        g.tick(30_101);
        assert_eq!(g.generation(), 1, "no generation without a leader");
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        // A rejoins: at the round's next deadline the generation completes with A leading.
        g.join(static_join(&a, "i-a", &["range"]), 40_000).unwrap();
        g.tick(60_102);
        let ra = g.join_result(&a).unwrap().unwrap();
        assert_eq!((ra.generation, ra.leader.as_str()), (2, a.as_str()));
        assert_eq!(g.member_ids(), vec![a.clone(), b.clone()]);

        // And if neither comes back, their sessions empty the group.
        let (mut g, _a, _b, c) = static_pair_and_a_newcomer();
        g.leave(&c, 200).unwrap();
        g.tick(30_101);
        g.tick(60_102);
        assert_eq!(g.tick(120_100).len(), 2, "both sessions ran out");
        assert_eq!(g.state(), GroupState::Empty);
    }

    /// KIP-345's point: a static member's restart does not stop the rest of the group. The
    /// other member's heartbeats go on answering NONE at the same generation, and the new
    /// instance gets the old one's partitions, with the old one's place in the group.
    #[test]
    fn a_restarted_static_member_keeps_its_assignment_without_a_rebalance() {
        for restarted_leader in [false, true] {
            let (mut g, a, b) = stable_static_pair(&["range"]);
            let (old, other, instance, part) = if restarted_leader {
                (a, b, "i-a", b"0")
            } else {
                (b, a, "i-b", b"1")
            };
            let new = g.join(static_join("", instance, &["range"]), 100).unwrap();
            assert_eq!((g.state(), g.generation()), (GroupState::Stable, 1));
            assert_eq!(
                g.heartbeat(&other, 1, 101),
                Ok(()),
                "the other member goes on"
            );
            let joined = g.join_result(&new).unwrap().unwrap();
            let leader_before = if restarted_leader { &old } else { &other };
            assert_eq!((joined.generation, &joined.leader), (1, leader_before));
            assert!(joined.members.is_empty(), "answered as a follower");
            g.sync(&new, 1, Vec::new(), 102).unwrap();
            assert_eq!(g.sync_result(&new, 1), Some(Ok(part.to_vec())));
            let mut members = vec![new.clone(), other.clone()];
            members.sort();
            assert_eq!(g.member_ids(), members);
            let leader_now = if restarted_leader { &new } else { &other };
            assert_eq!(g.leader(), Some(leader_now.as_str()));
            // The old instance, back from a stall, is fenced at the generation it knew.
            assert_eq!(
                g.check_commit(&old, 1, Some(instance), Txn),
                Err(GroupError::FencedInstanceId(old.clone()))
            );
            assert_eq!(g.check_commit(&new, 1, Some(instance), Txn), Ok(()));
            // The new instance's session started when it joined.
            g.heartbeat(&other, 1, 10_050).unwrap();
            assert_eq!(g.tick(10_050), Vec::<String>::new());
        }
    }

    /// Where the assignment cannot stand, a static replacement rebalances: a newcomer whose
    /// protocols change the group's choice, or a group still waiting for its assignment (the
    /// leader may be computing one for the old member id). A newcomer whose preferences differ
    /// but leave the choice as it was keeps the assignment.
    #[test]
    fn a_static_replacement_rebalances_where_the_assignment_cannot_stand() {
        // The follower's new instance prefers roundrobin; the leader's choice is still range.
        let (mut g, _, _) = stable_static_pair(&["range", "roundrobin"]);
        let b = g
            .join(static_join("", "i-b", &["roundrobin", "range"]), 100)
            .unwrap();
        assert_eq!((g.state(), g.generation()), (GroupState::Stable, 1));
        assert_eq!(g.join_result(&b).unwrap().unwrap().protocol, "range");
        // The leader's new instance prefers roundrobin, which every member supports: the
        // choice changes, so the group rebalances.
        let (mut g, _, b) = stable_static_pair(&["range", "roundrobin"]);
        let a2 = g
            .join(static_join("", "i-a", &["roundrobin", "range"]), 100)
            .unwrap();
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        assert_eq!(
            g.heartbeat(&b, 1, 101),
            Err(GroupError::RebalanceInProgress)
        );
        g.join(static_join(&b, "i-b", &["range", "roundrobin"]), 102)
            .unwrap();
        let joined = g.join_result(&a2).unwrap().unwrap();
        assert_eq!(
            (joined.generation, joined.protocol.as_str()),
            (2, "roundrobin")
        );
        assert_eq!(joined.members.len(), 2, "the new leader assigns");
        // The follower's new instance supports only roundrobin: refused, nothing changes.
        let (mut g, _, _) = stable_static_pair(&["range"]);
        assert!(matches!(
            g.join(static_join("", "i-b", &["roundrobin"]), 100),
            Err(GroupError::InconsistentGroupProtocol(_))
        ));
        assert_eq!((g.state(), g.generation()), (GroupState::Stable, 1));
        // CompletingRebalance: the round is redone.
        let mut g = GroupMembership::new("g");
        g.join(static_join("", "i-a", &["range"]), 0).unwrap();
        assert_eq!(g.state(), GroupState::CompletingRebalance);
        let a2 = g.join(static_join("", "i-a", &["range"]), 10).unwrap();
        assert_eq!(g.join_result(&a2).unwrap().unwrap().generation, 2);
    }

    /// A zombie member of a previous life of the group (before a coordinator restart, or
    /// before the idle group was dropped) holds a member id and generation that the new life
    /// hands out again unless their incarnations differ: its commit must be refused.
    #[test]
    fn a_zombie_of_a_previous_life_of_the_group_is_fenced() {
        let member_of = |g: &mut GroupMembership| {
            let m = g.join(join("", &["range"]), 0).unwrap();
            g.join_result(&m).unwrap().unwrap();
            m
        };
        let mut before = GroupMembership::new("g").with_incarnation("1.4.1");
        let zombie = member_of(&mut before);
        assert_eq!(before.generation(), 1);
        let mut after = GroupMembership::new("g").with_incarnation("1.5.1");
        let live = member_of(&mut after);
        assert_eq!(after.generation(), 1);
        assert_ne!(zombie, live);
        assert_eq!(
            after.check_commit(&zombie, 1, None, Txn),
            Err(GroupError::UnknownMemberId(zombie.clone()))
        );
        assert_eq!(after.check_commit(&live, 1, None, Txn), Ok(()));
        // Without incarnations the two lives hand out the same id: the hole this closes.
        let (mut a, mut b) = (GroupMembership::new("g"), GroupMembership::new("g"));
        let (old, new) = (member_of(&mut a), member_of(&mut b));
        assert_eq!(old, new);
        assert_eq!(b.check_commit(&old, 1, None, Txn), Ok(()));
    }

    #[test]
    fn only_an_empty_group_with_nobody_waiting_is_idle() {
        let mut g = GroupMembership::new("g");
        assert!(g.is_idle());
        // A member id handed out (KIP-394) and not joined yet: not idle.
        let mut request = join("", &["range"]);
        request.require_known_member_id = true;
        assert!(matches!(
            g.join(request, 0),
            Err(GroupError::MemberIdRequired(_))
        ));
        assert!(!g.is_idle());
        // ... until it has waited a session timeout (10 s) for its JoinGroup, as Kafka's
        // pending members: otherwise ids handed out to clients that never came back would keep
        // the group, and their memory, for good.
        g.tick(9_999);
        assert!(!g.is_idle());
        g.tick(10_000);
        assert!(g.is_idle(), "forgotten after a session timeout");
        // A LeaveGroup with a handed-out id forgets it at once.
        let mut request = join("", &["range"]);
        request.require_known_member_id = true;
        let Err(GroupError::MemberIdRequired(id)) = g.join(request, 20_000) else {
            panic!("a member id is required first");
        };
        assert_eq!(g.leave(&id, 20_001), Ok(()));
        assert!(g.is_idle());
        assert_eq!(
            g.join(join(&id, &["range"]), 20_002),
            Err(GroupError::UnknownMemberId(id.clone())),
            "gone"
        );
        let (mut g, a, b) = stable_pair();
        assert!(!g.is_idle());
        g.leave(&a, 80).unwrap();
        g.leave(&b, 81).unwrap();
        assert_eq!(g.state(), GroupState::Empty);
        assert!(g.is_idle());
    }

    /// A follower whose SyncGroup was parked when it died (its connection closed, so nobody
    /// reads the answer) must expire once the leader's sync hands out the assignment, or a
    /// rebalance ends the wait: otherwise its partitions stay assigned to nobody alive.
    #[test]
    fn a_follower_that_dies_while_its_sync_is_parked_expires() {
        // A and B joined generation 2; A leads; the group awaits A's assignment.
        // B parks its SyncGroup, then dies: nobody polls its result again.
        let (mut g, a, b) = completing_pair();
        g.sync(&b, 2, vec![], 100).unwrap();
        g.sync(&a, 2, vec![(b.clone(), b"1".to_vec())], 200)
            .unwrap();
        assert_eq!(g.sync_result(&a, 2).unwrap().unwrap(), b"");
        assert_eq!(g.state(), GroupState::Stable);
        // A heartbeats; B is silent for longer than its 10 s session.
        g.heartbeat(&a, 2, 9_000).unwrap();
        assert_eq!(g.tick(10_300), vec![b.clone()], "B expires");
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));

        // The same when a rebalance, not the leader's sync, ends the parked wait (A rejoins
        // with a new subscription: an unchanged rejoin would be answered without a round).
        let (mut g, a, b) = completing_pair();
        g.sync(&b, 2, vec![], 100).unwrap();
        g.join(join(&a, &["range", "roundrobin"]), 200).unwrap();
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        g.heartbeat(&a, 2, 9_000).ok();
        assert_eq!(
            g.tick(10_300),
            vec![b.clone()],
            "B never rejoined and expires"
        );

        // And when the shell gives up on the parked request (timed out or dropped).
        let (mut g, a, b) = completing_pair();
        g.sync(&b, 2, vec![], 100).unwrap();
        g.heartbeat(&a, 2, 59_000).unwrap();
        assert_eq!(g.tick(60_000), Vec::<String>::new(), "parked: not expired");
        g.sync_abandoned(&b, 60_100);
        g.heartbeat(&a, 2, 69_000).unwrap();
        assert_eq!(g.tick(70_200), vec![b.clone()]);
    }

    #[test]
    fn describe_shows_members_and_a_settled_assignment_only_when_stable() {
        let g = GroupMembership::new("g");
        let d = g.describe();
        assert_eq!((d.state, d.protocol_type.as_str()), ("Empty", ""));
        assert!(d.members.is_empty());

        let (mut g, a, b) = stable_pair();
        let d = g.describe();
        assert_eq!(d.state, "Stable");
        assert_eq!(
            (d.protocol_type.as_str(), d.protocol.as_str()),
            ("consumer", "range")
        );
        let shown: Vec<(&str, &[u8], &[u8])> = d
            .members
            .iter()
            .map(|m| (m.member_id.as_str(), &m.metadata[..], &m.assignment[..]))
            .collect();
        assert_eq!(
            shown,
            vec![
                (a.as_str(), &b"range"[..], &b"0"[..]),
                (b.as_str(), &b"range"[..], &b"1"[..])
            ],
            "each member's metadata for the chosen protocol, and its assignment"
        );
        assert!(d
            .members
            .iter()
            .all(|m| m.client_id == "c" && m.client_host == "/127.0.0.1"));

        // A round: members are shown, but no protocol, metadata or assignment.
        g.join(join(&a, &["range"]), 100).unwrap();
        let d = g.describe();
        assert_eq!((d.state, d.protocol.as_str()), ("PreparingRebalance", ""));
        assert_eq!(d.members.len(), 2);
        assert!(d
            .members
            .iter()
            .all(|m| m.metadata.is_empty() && m.assignment.is_empty()));
    }

    #[test]
    fn member_ids_start_with_a_safe_cut_of_the_client_id() {
        let mut g = GroupMembership::new("g");
        let mut request = join("", &["range"]);
        request.client_id = "my app/1".into();
        assert_eq!(g.join(request, 0).unwrap(), "my_app_1-1");
        let mut request = join("", &["range"]);
        request.client_id = "x".repeat(10_000);
        let id = g.join(request, 0).unwrap();
        assert_eq!(id, format!("{}-2", "x".repeat(MEMBER_ID_PREFIX_LEN)));
        let mut request = join("", &["range"]);
        request.client_id = String::new();
        assert_eq!(g.join(request, 0).unwrap(), "member-3");
    }

    #[test]
    fn a_follower_rejoining_unchanged_gets_the_current_generation_without_a_rebalance() {
        let (mut g, a, b) = stable_pair();
        assert_eq!(g.join(join(&b, &["roundrobin", "range"]), 100).unwrap(), b);
        let answer = g.join_result(&b).unwrap().unwrap();
        assert_eq!(answer.generation, 2);
        assert_eq!(answer.leader, a);
        assert!(answer.members.is_empty(), "a follower gets no member list");
        assert_eq!(g.state(), GroupState::Stable, "nobody else is stopped");
        assert_eq!(g.heartbeat(&a, 2, 110), Ok(()));
        g.sync(&b, 2, vec![], 120).unwrap();
        assert_eq!(
            g.sync_result(&b, 2).unwrap().unwrap(),
            b"1",
            "its assignment"
        );
    }

    #[test]
    fn a_leader_rejoining_or_a_changed_subscription_rebalances() {
        let (mut g, a, _b) = stable_pair();
        g.join(join(&a, &["range"]), 100).unwrap();
        assert!(
            matches!(g.state(), GroupState::PreparingRebalance { .. }),
            "the leader rejoins to assign anew (a new topic matched its pattern)"
        );
        let (mut g, _a, b) = stable_pair();
        g.join(join(&b, &["range"]), 100).unwrap();
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
    }

    #[test]
    fn a_member_whose_join_answer_was_lost_gets_it_again_while_the_assignment_is_awaited() {
        let (mut g, a, b) = completing_pair();
        // Both answers were lost on the way; both members join again, unchanged.
        g.join(join(&b, &["range"]), 30).unwrap();
        let again = g.join_result(&b).unwrap().unwrap();
        assert_eq!((again.generation, again.members.len()), (2, 0));
        g.join(join(&a, &["range"]), 40).unwrap();
        let again = g.join_result(&a).unwrap().unwrap();
        assert_eq!(again.generation, 2);
        assert_eq!(
            again.members.len(),
            2,
            "the leader gets the member list again"
        );
        assert_eq!(g.state(), GroupState::CompletingRebalance);
        g.sync(&a, 2, vec![(b.clone(), b"1".to_vec())], 50).unwrap();
        assert_eq!(g.state(), GroupState::Stable);
    }

    #[test]
    fn a_follower_that_waited_for_the_leaders_sync_keeps_its_session() {
        let (mut g, a, b) = completing_pair();
        // B's SyncGroup waits 9.5 s for the leader's (a busy leader); B cannot heartbeat
        // meanwhile, and its 10 s session must not run out from under it once it is answered.
        g.sync(&b, 2, vec![], 100).unwrap();
        assert_eq!(g.tick(9_000), Vec::<String>::new(), "parked: not expired");
        g.heartbeat(&a, 2, 9_000).unwrap();
        g.sync(&a, 2, vec![(b.clone(), b"1".to_vec())], 9_600)
            .unwrap();
        assert_eq!(g.sync_result(&b, 2).unwrap().unwrap(), b"1");
        assert_eq!(g.sync_result(&a, 2).unwrap().unwrap(), b"");
        assert_eq!(g.tick(10_200), Vec::<String>::new());
        assert_eq!(g.state(), GroupState::Stable);
        assert_eq!(g.heartbeat(&b, 2, 10_300), Ok(()));
        // Without heartbeats the fresh session does run out.
        g.heartbeat(&a, 2, 19_000).unwrap();
        assert_eq!(g.tick(20_400), vec![b.clone()]);
    }

    /// The record a group stores goes through JSON, as the shell stores it.
    fn through_json(record: &ClassicGroupRecord) -> ClassicGroupRecord {
        serde_json::from_slice(&serde_json::to_vec(record).unwrap()).unwrap()
    }

    /// Kafka's GroupMetadata record: a Stable generation is to be stored, and a group restored
    /// from it goes on where it was, with no rebalance: its members heartbeat and commit at
    /// their generation and are given their assignments again; the fence holds (an older
    /// generation is ILLEGAL_GENERATION, a member id the record does not hold
    /// UNKNOWN_MEMBER_ID), sessions start over at the restore, and the next round goes on from
    /// the stored generation.
    #[test]
    fn a_stable_generation_is_stored_and_a_restored_group_goes_on_from_it() {
        let (mut g, a, b) = stable_pair();
        let record = g.to_store().expect("a new generation").expect("a record");
        assert_eq!((record.generation, record.members.len()), (2, 2));
        assert_eq!(record.leader, a);
        g.stored(Some(record.clone()));
        assert_eq!(g.to_store(), None, "storage holds it");
        g.heartbeat(&b, 2, 20).unwrap();
        assert_eq!(g.to_store(), None, "a heartbeat changes nothing stored");

        let mut r = GroupMembership::restore("g", 3_000, through_json(&record), 1_000)
            .with_incarnation("2.1");
        assert_eq!((r.state(), r.generation()), (GroupState::Stable, 2));
        assert_eq!(r.leader(), Some(a.as_str()));
        assert_eq!(r.to_store(), None, "what it took is what storage holds");
        assert_eq!(r.heartbeat(&a, 2, 1_001), Ok(()));
        assert_eq!(r.heartbeat(&b, 2, 1_001), Ok(()));
        r.sync(&b, 2, vec![], 1_002).unwrap();
        assert_eq!(r.sync_result(&b, 2), Some(Ok(b"1".to_vec())));
        assert_eq!(r.check_commit(&a, 2, None, Plain), Ok(()));
        assert_eq!(
            r.check_commit(&a, 1, None, Txn),
            Err(GroupError::IllegalGeneration { got: 1, current: 2 })
        );
        assert_eq!(
            r.heartbeat("c-9", 2, 1_003),
            Err(GroupError::UnknownMemberId("c-9".into()))
        );
        let described = r.describe();
        assert_eq!(
            (described.state, described.protocol.as_str()),
            ("Stable", "range")
        );
        assert_eq!(described.members[0].assignment, b"0");
        // Sessions count from the restore: 10 s each here.
        assert_eq!(r.tick(10_900), Vec::<String>::new());
        // A newcomer starts the next round, from the stored generation, with an id of the
        // new life.
        let c = r.join(join("", &["range"]), 11_000).unwrap();
        assert!(c.contains("-2.1-"), "{c}");
        assert_eq!(
            r.to_store(),
            None,
            "storage keeps generation 2 while the round runs"
        );
        r.join(join(&a, &["range"]), 11_001).unwrap();
        r.join(join(&b, &["range"]), 11_002).unwrap();
        assert_eq!(r.join_result(&c).unwrap().unwrap().generation, 3);
        r.sync(&a, 3, vec![], 11_003).unwrap();
        assert_eq!(r.to_store().unwrap().unwrap().generation, 3);
    }

    /// A round keeps the last Stable generation in storage; a group whose members all left is
    /// Empty, its record is to be removed, and until storage was told so the group is not idle
    /// (dropping it would leave the record behind, and its members would come back at a
    /// restart).
    #[test]
    fn an_empty_group_removes_its_record_and_is_idle_only_once_removed() {
        let (mut g, a, b) = stable_pair();
        g.stored(g.to_store().unwrap());
        g.leave(&b, 30).unwrap();
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        assert_eq!(g.to_store(), None);
        g.leave(&a, 31).unwrap();
        assert_eq!(g.state(), GroupState::Empty);
        assert_eq!(g.to_store(), Some(None), "the record is removed");
        assert!(!g.is_idle(), "not dropped before the removal is stored");
        g.stored(None);
        assert_eq!(g.to_store(), None);
        assert!(g.is_idle());
        // A group that never had a Stable generation has nothing to store.
        let mut fresh = GroupMembership::new("h");
        let x = fresh.join(join("", &["range"]), 0).unwrap();
        fresh.leave(&x, 1).unwrap();
        assert_eq!((fresh.to_store(), fresh.is_idle()), (None, true));
    }

    /// A static member replaced in place (KIP-345, no rebalance) changes what is stored: the
    /// new member id holds the instance. Restored from that record, the group still fences the
    /// instance's old member id, and the new one goes on with the old one's assignment.
    #[test]
    fn a_static_replacement_is_stored_and_fences_across_a_restore() {
        let (mut g, a, old_b) = stable_static_pair(&["range"]);
        g.stored(g.to_store().unwrap());
        let new_b = g.join(static_join("", "i-b", &["range"]), 100).unwrap();
        assert_eq!(g.generation(), 1, "no rebalance");
        let record = g.to_store().expect("the replacement").unwrap();
        assert!(record.members.iter().any(|m| m.member_id == new_b));
        assert!(!record.members.iter().any(|m| m.member_id == old_b));
        let mut r = GroupMembership::restore("g", 0, through_json(&record), 5_000);
        assert_eq!(
            r.check_commit(&old_b, 1, Some("i-b"), Txn),
            Err(GroupError::FencedInstanceId(old_b.clone()))
        );
        assert_eq!(r.static_member("i-b"), Some(new_b.as_str()));
        assert_eq!(r.heartbeat(&a, 1, 5_001), Ok(()));
        r.sync(&new_b, 1, vec![], 5_002).unwrap();
        assert_eq!(r.sync_result(&new_b, 1), Some(Ok(b"1".to_vec())));
    }

    /// A record that is not consistent (damaged, or written by hand) restores what it can and
    /// never two members under one id or one instance: the first holds it, and the others
    /// rejoin; a missing leader is replaced; session timeouts come within bounds; a record
    /// without members is an Empty group at its generation, whose record is then removed.
    #[test]
    fn an_inconsistent_record_restores_what_it_can() {
        let member = |id: &str, instance: Option<&str>, session: i32| ClassicMemberRecord {
            member_id: id.into(),
            instance_id: instance.map(Into::into),
            client_id: "c".into(),
            client_host: "/h".into(),
            session_timeout_ms: session,
            rebalance_timeout_ms: -5,
            protocols: vec![("range".into(), vec![])],
            assignment: id.as_bytes().to_vec(),
        };
        let record = ClassicGroupRecord {
            generation: 4,
            protocol_type: "consumer".into(),
            protocol: "range".into(),
            leader: "gone".into(),
            members: vec![
                member("m1", Some("i"), 1),
                member("m1", None, 10_000),
                member("m2", Some("i"), 10_000),
                member("", None, 10_000),
                member("m3", None, i32::MAX),
            ],
        };
        let mut r = GroupMembership::restore("g", 0, record, 0);
        assert_eq!(r.member_ids(), ["m1", "m3"]);
        assert_eq!(r.static_member("i"), Some("m1"));
        assert_eq!(r.leader(), Some("m1"));
        let stored = r
            .to_store()
            .expect("storage is told what was taken")
            .unwrap();
        assert_eq!(stored.members[0].session_timeout_ms, MIN_SESSION_TIMEOUT_MS);
        assert_eq!(stored.members[1].session_timeout_ms, MAX_SESSION_TIMEOUT_MS);
        assert_eq!(
            r.heartbeat("m2", 4, 1),
            Err(GroupError::UnknownMemberId("m2".into()))
        );
        assert_eq!(
            r.tick(MIN_SESSION_TIMEOUT_MS as i64 + 1),
            vec!["m1".to_string()]
        );

        let empty = ClassicGroupRecord {
            generation: -3,
            protocol_type: String::new(),
            protocol: String::new(),
            leader: String::new(),
            members: vec![],
        };
        let e = GroupMembership::restore("g", 0, empty, 0);
        assert_eq!((e.state(), e.generation()), (GroupState::Empty, 0));
        assert_eq!(e.to_store(), Some(None), "the record goes");
    }

    /// Kafka's `group.max.size`: a group of 2 takes no third member, whether a round is
    /// running (counted by the members that rejoined) or not, nor hands out a member id for
    /// one (KIP-394); its members rejoin, a static member's new instance replaces it, and a
    /// place freed by a leave is taken.
    #[test]
    fn a_full_group_takes_no_new_member() {
        let mut g = GroupMembership::new("g").with_max_size(2);
        let a = g.join(static_join("", "i-a", &["range"]), 0).unwrap();
        g.join_result(&a).unwrap().unwrap();
        let b = g.join(join("", &["range"]), 1).unwrap();
        assert!(matches!(g.state(), GroupState::PreparingRebalance { .. }));
        let full = Err(GroupError::GroupMaxSizeReached(2));
        // A round is running with one member rejoined (B): a second newcomer still fits by
        // Kafka's count, then the group is full.
        let mut v4 = join("", &["range"]);
        v4.require_known_member_id = true;
        assert!(matches!(
            g.join(v4.clone(), 2),
            Err(GroupError::MemberIdRequired(_))
        ));
        g.join(join(&a, &["range"]), 3).unwrap();
        assert_eq!(g.join(join("", &["range"]), 4), full);
        assert_eq!(
            g.join(v4.clone(), 4),
            full,
            "no member id handed out either"
        );
        g.join_result(&a).unwrap().unwrap();
        g.join_result(&b).unwrap().unwrap();
        g.sync(&a, 2, vec![], 5).unwrap();
        assert_eq!(g.state(), GroupState::Stable);
        assert_eq!(g.join(join("", &["range"]), 6), full);
        // Members rejoin; a static member's new instance replaces it.
        g.join(join(&b, &["range"]), 7).unwrap();
        let a2 = g.join(static_join("", "i-a", &["range"]), 8).unwrap();
        assert_ne!(a2, a);
        assert_eq!(g.member_ids().len(), 2);
        // A leave frees a place.
        g.leave(&b, 9).unwrap();
        let c = g.join(join("", &["range"]), 10).unwrap();
        assert!(g.member_ids().contains(&c));
    }
}
