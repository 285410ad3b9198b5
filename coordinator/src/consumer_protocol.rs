//! KIP-848's consumer group protocol (ConsumerGroupHeartbeat, `group.protocol=consumer`) as a
//! pure state machine: the coordinator assigns the partitions, members reconcile one heartbeat
//! at a time, and every member carries a **member epoch** that fences it the way a producer
//! epoch fences a producer.
//!
//! How a group moves, as in Kafka's group coordinator (`GroupMetadataManager`,
//! `CurrentAssignmentBuilder`):
//! 1. A member joins with member epoch 0 and its subscription (topic names, or a regular
//!    expression). A join, a departure or a changed subscription bumps the **group epoch**, and
//!    the coordinator computes the **target assignment** for that epoch at once (the `uniform`
//!    assignor by default, `range` on request; both in [`assign`]).
//! 2. Each member reconciles toward its target on its heartbeats:
//!    - partitions it holds that the target takes away must be **revoked first**: the member
//!      keeps its epoch and is told to drop them (state UNREVOKED_PARTITIONS) and acknowledges
//!      by heartbeating without them;
//!    - then it moves to the target's epoch and gets its new partitions, but only those no other
//!      member still holds (state UNRELEASED_PARTITIONS until they are released).
//!
//!    So no partition is ever held by two members at once: what a member is given is free.
//! 3. A member that stops heartbeating for its session timeout, or that keeps partitions it was
//!    told to revoke past its rebalance timeout, is removed and its partitions are freed.
//!
//! Fencing: a heartbeat whose member epoch is ahead of the member's, or behind it other than
//! the one accepted case (the previous epoch, holding only partitions still assigned: the reply
//! that bumped it was lost), is FENCED_MEMBER_EPOCH; an unknown member id is UNKNOWN_MEMBER_ID.
//! An offset commit ([`ConsumerGroup::check_commit`]) must carry the member's current epoch
//! exactly (STALE_MEMBER_EPOCH otherwise), so a zombie consumer that lost its partitions can no
//! longer move their offsets, and a transactional one cannot commit with them (KIP-447 with
//! member epochs).
//!
//! Choices where Kafka's behaviour is not needed or not wanted here:
//! - A join (epoch 0) with the id of a known member replaces it: the old incarnation is removed
//!   (its partitions are freed, its epoch is no longer anyone's) and the new one starts over.
//!   Kafka answers FENCED_MEMBER_EPOCH until the old one's session expires.
//!
//! Static membership (`group.instance.id`), as in Kafka:
//! - A static member's temporary leave (epoch -2) keeps it in the group at epoch -2 with its
//!   partitions: nobody else gets them, and the group epoch does not move. Partitions it was
//!   still revoking are freed.
//! - A join with the instance id of a member at -2 **replaces** it: the new member id takes its
//!   assignment and target, at the target epoch, with no rebalance for anyone (unless the
//!   subscription changed). The old member id is gone: its heartbeats and commits are refused.
//! - A join with an instance id held by a live member (epoch >= 0) under another member id is
//!   UNRELEASED_INSTANCE_ID; the same member id rejoining (its join reply was lost) replaces
//!   itself.
//! - A heartbeat or a leave that names an instance id held by another member id is
//!   FENCED_INSTANCE_ID, so a replaced static consumer (a zombie) can neither heartbeat nor
//!   make the new holder leave; an instance id nobody holds is UNKNOWN_MEMBER_ID.
//! - A member at -2 that does not come back within the session timeout is removed like any
//!   silent member, and its partitions move.
//! - Membership is stored, as Kafka stores it: the shell writes [`ConsumerGroup::state`]
//!   durably before it answers a heartbeat that changed it, and a restarted coordinator
//!   [`ConsumerGroup::restore`]s the group, whose members go on at their epochs (sessions start
//!   over at the restore); the fence holds across the restart. Expiries found outside a
//!   heartbeat (the periodic sweep, a describe) are stored with the group's next change: a
//!   restart before it brings such a member back for one more session, holding only what it
//!   held (nobody else was given its partitions, which takes a stored change).
//! - No rack awareness; no group size limit.

use std::collections::{BTreeMap, BTreeSet};

use cluster::TopicPartition;

/// Kafka's `group.consumer.session.timeout.ms` default.
pub const DEFAULT_SESSION_TIMEOUT_MS: i64 = 45_000;
/// Kafka's `group.consumer.heartbeat.interval.ms` default.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: i32 = 5_000;
/// The member epoch of a join.
pub const JOIN_EPOCH: i32 = 0;
/// The member epoch of a leave.
pub const LEAVE_EPOCH: i32 = -1;
/// The member epoch of a static member's temporary leave.
pub const STATIC_LEAVE_EPOCH: i32 = -2;
/// The server-side assignors this coordinator has (`group.remote.assignor`).
pub const ASSIGNORS: [&str; 2] = ["uniform", "range"];
/// The longest subscription regular expression accepted, in bytes.
pub const MAX_REGEX_LEN: usize = 1024;

/// Why a heartbeat or a commit was refused (each is one of Kafka's error codes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConsumerGroupError {
    /// INVALID_REQUEST.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// UNKNOWN_MEMBER_ID.
    #[error("unknown member {0:?}")]
    UnknownMemberId(String),
    /// FENCED_MEMBER_EPOCH.
    #[error("member epoch {got} does not match the member's {current}: the member must rejoin")]
    FencedMemberEpoch {
        /// The caller's.
        got: i32,
        /// The member's.
        current: i32,
    },
    /// STALE_MEMBER_EPOCH.
    #[error("member epoch {got} is not the member's {current}")]
    StaleMemberEpoch {
        /// The caller's.
        got: i32,
        /// The member's.
        current: i32,
    },
    /// UNSUPPORTED_ASSIGNOR.
    #[error("unknown assignor {0:?}")]
    UnsupportedAssignor(String),
    /// UNRELEASED_INSTANCE_ID.
    #[error("instance id {0:?} is held by a live member")]
    UnreleasedInstanceId(String),
    /// FENCED_INSTANCE_ID: the instance id is held by another member id now.
    #[error("instance id {0:?} is held by another member: this one was replaced")]
    FencedInstanceId(String),
    /// UNSUPPORTED_VERSION: a member of this protocol must commit with OffsetCommit v9+.
    #[error("members of a consumer-protocol group commit with OffsetCommit v9 or later")]
    UnsupportedVersion,
    /// GROUP_MAX_SIZE_REACHED: a new member would take the group past
    /// `group.consumer.max.size`.
    #[error("the group has its maximum of {0} members")]
    GroupMaxSizeReached(usize),
}

/// One ConsumerGroupHeartbeat, decoded (topic ids already resolved to names by the shell; an
/// owned partition of an unknown topic id is left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Heartbeat {
    /// The member's id (client-generated from v1; empty on a v0 join: the coordinator makes one).
    pub member_id: String,
    /// 0 joins, -1 leaves, -2 leaves a static member, otherwise the member's epoch.
    pub member_epoch: i32,
    /// `group.instance.id` (static membership).
    pub instance_id: Option<String>,
    /// -1: unchanged.
    pub rebalance_timeout_ms: i32,
    /// `None`: unchanged.
    pub subscribed_topic_names: Option<Vec<String>>,
    /// `None`: unchanged; an empty string clears it.
    pub subscribed_topic_regex: Option<String>,
    /// `None`: unchanged.
    pub server_assignor: Option<String>,
    /// The partitions the member owns now (`None`: unchanged since its last heartbeat).
    pub owned: Option<BTreeSet<TopicPartition>>,
    /// Who sent it: its client id (the request header's), as ConsumerGroupDescribe shows it.
    pub client_id: String,
    /// Who sent it: its address.
    pub client_host: String,
}

/// What a heartbeat is answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// The member's id.
    pub member_id: String,
    /// Its epoch now (-1 / -2 after a leave).
    pub member_epoch: i32,
    /// How often it should heartbeat.
    pub heartbeat_interval_ms: i32,
    /// Its assignment, when the member must learn it (a join, a full heartbeat, a change).
    pub assignment: Option<BTreeSet<TopicPartition>>,
}

/// Where a member is in its reconciliation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MemberState {
    /// At the target assignment's epoch, holding all of its target.
    Stable,
    /// Told to revoke partitions, waiting for its acknowledgement.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions other members still hold.
    UnreleasedPartitions,
}

impl MemberState {
    /// Kafka's name for it.
    pub fn name(&self) -> &'static str {
        match self {
            MemberState::Stable => "STABLE",
            MemberState::UnrevokedPartitions => "UNREVOKED_PARTITIONS",
            MemberState::UnreleasedPartitions => "UNRELEASED_PARTITIONS",
        }
    }
}

/// One member.
#[derive(Clone, Debug)]
pub struct Member {
    /// Its id.
    pub id: String,
    /// Its `group.instance.id`.
    pub instance_id: Option<String>,
    /// Its epoch (0 until its first assignment).
    pub epoch: i32,
    /// The epoch before the last bump (accepted once if the bump's reply was lost).
    pub previous_epoch: i32,
    /// Its reconciliation state.
    pub state: MemberState,
    /// The topics it subscribes to by name.
    pub topics: BTreeSet<String>,
    /// Its subscription regular expression, if any.
    pub regex: Option<String>,
    /// The same, compiled to match whole topic names.
    matcher: Option<regex::Regex>,
    /// Its server assignor choice (`None`: the default).
    pub assignor: Option<String>,
    /// Its rebalance timeout.
    pub rebalance_timeout_ms: i64,
    /// Its client id, as it last heartbeated.
    pub client_id: String,
    /// Its address, as it last heartbeated.
    pub client_host: String,
    /// The partitions it holds now.
    pub assigned: BTreeSet<TopicPartition>,
    /// The partitions it was told to revoke and has not yet acknowledged.
    pub revoking: BTreeSet<TopicPartition>,
    /// The assignment it was last sent.
    sent: Option<BTreeSet<TopicPartition>>,
    /// When it last heartbeated.
    last_heartbeat_ms: i64,
    /// When it was told to revoke (the rebalance timeout runs from here).
    revoke_since_ms: Option<i64>,
}

/// A consumer-protocol group: members, epochs and the target assignment.
#[derive(Clone, Debug)]
pub struct ConsumerGroup {
    group_id: String,
    /// The topics that exist and their partition counts (the topology's).
    topics: BTreeMap<String, i32>,
    group_epoch: i32,
    target_epoch: i32,
    target: BTreeMap<String, BTreeSet<TopicPartition>>,
    members: BTreeMap<String, Member>,
    /// Who holds each held partition (assigned or revoking).
    owners: BTreeMap<TopicPartition, String>,
    session_timeout_ms: i64,
    heartbeat_interval_ms: i32,
    /// The assignor of the last target assignment.
    assignor: &'static str,
    /// Member ids handed out to v0 joins.
    next_member: u64,
    /// Makes those ids unique to this life of the group.
    incarnation: String,
    /// Kafka's `group.consumer.max.size` ([`ConsumerGroup::with_max_size`]).
    max_size: usize,
}

/// What is stored of a group so that a restarted coordinator goes on with it (Kafka keeps the
/// same in `__consumer_offsets`): the epochs, the target assignment, and each member with its
/// subscription, epochs and partitions. Not stored: timers (a restored member's session and
/// rebalance timeout start over at the restore), what the configuration gives (timeouts) and
/// what the topology gives (the topics).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupState {
    /// The group epoch.
    pub group_epoch: i32,
    /// The target assignment's epoch.
    pub target_epoch: i32,
    /// The assignor of the target assignment.
    pub assignor: String,
    /// The target assignment, by member id.
    pub target: BTreeMap<String, BTreeSet<TopicPartition>>,
    /// The members.
    pub members: Vec<MemberRecord>,
}

/// One member, as [`GroupState`] stores it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberRecord {
    /// Its id.
    pub id: String,
    /// Its `group.instance.id`.
    pub instance_id: Option<String>,
    /// Its epoch (-2: a static member away).
    pub epoch: i32,
    /// Its previous epoch.
    pub previous_epoch: i32,
    /// Its reconciliation state.
    pub state: MemberState,
    /// The topics it subscribes to by name.
    pub topics: BTreeSet<String>,
    /// Its subscription regular expression.
    pub regex: Option<String>,
    /// Its server assignor choice.
    pub assignor: Option<String>,
    /// Its rebalance timeout.
    pub rebalance_timeout_ms: i64,
    /// Its client id.
    pub client_id: String,
    /// Its address.
    pub client_host: String,
    /// The partitions it holds.
    pub assigned: BTreeSet<TopicPartition>,
    /// The partitions it was told to revoke.
    pub revoking: BTreeSet<TopicPartition>,
}

impl ConsumerGroup {
    /// What a restarted coordinator needs of this group ([`GroupState`]).
    pub fn state(&self) -> GroupState {
        GroupState {
            group_epoch: self.group_epoch,
            target_epoch: self.target_epoch,
            assignor: self.assignor.to_string(),
            target: self.target.clone(),
            members: self
                .members
                .values()
                .map(|m| MemberRecord {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    epoch: m.epoch,
                    previous_epoch: m.previous_epoch,
                    state: m.state,
                    topics: m.topics.clone(),
                    regex: m.regex.clone(),
                    assignor: m.assignor.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    assigned: m.assigned.clone(),
                    revoking: m.revoking.clone(),
                })
                .collect(),
        }
    }

    /// The group `group_id` over `topics` as `state` left it, at `now_ms`: every member's
    /// session (and a revoking member's rebalance timeout) starts over now, and every member
    /// is sent its assignment again on its next heartbeat. A partition that two stored members
    /// claim stays with the first (a store this coordinator wrote never has one).
    pub fn restore(
        group_id: &str,
        topics: BTreeMap<String, i32>,
        state: GroupState,
        now_ms: i64,
    ) -> Self {
        let mut group = Self::new(group_id, topics);
        group.group_epoch = state.group_epoch;
        group.target_epoch = state.target_epoch;
        group.assignor = ASSIGNORS
            .into_iter()
            .find(|a| *a == state.assignor)
            .unwrap_or(ASSIGNORS[0]);
        group.target = state.target;
        for r in state.members {
            let mut held = |partitions: BTreeSet<TopicPartition>| -> BTreeSet<TopicPartition> {
                partitions
                    .into_iter()
                    .filter(|tp| match group.owners.entry(tp.clone()) {
                        std::collections::btree_map::Entry::Occupied(_) => false,
                        std::collections::btree_map::Entry::Vacant(v) => {
                            v.insert(r.id.clone());
                            true
                        }
                    })
                    .collect()
            };
            let assigned = held(r.assigned);
            let revoking = held(r.revoking);
            let matcher = r
                .regex
                .as_deref()
                .and_then(|re| regex::Regex::new(&format!("^(?:{re})$")).ok());
            group.members.insert(
                r.id.clone(),
                Member {
                    id: r.id,
                    instance_id: r.instance_id,
                    epoch: r.epoch,
                    previous_epoch: r.previous_epoch,
                    state: r.state,
                    topics: r.topics,
                    regex: r.regex,
                    matcher,
                    assignor: r.assignor,
                    rebalance_timeout_ms: r.rebalance_timeout_ms,
                    client_id: r.client_id,
                    client_host: r.client_host,
                    revoke_since_ms: (!revoking.is_empty()).then_some(now_ms),
                    assigned,
                    revoking,
                    sent: None,
                    last_heartbeat_ms: now_ms,
                },
            );
        }
        group
    }

    /// An empty group over `topics` (name -> partition count).
    pub fn new(group_id: &str, topics: BTreeMap<String, i32>) -> Self {
        Self {
            group_id: group_id.to_string(),
            topics,
            group_epoch: 0,
            target_epoch: 0,
            target: BTreeMap::new(),
            members: BTreeMap::new(),
            owners: BTreeMap::new(),
            session_timeout_ms: DEFAULT_SESSION_TIMEOUT_MS,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            assignor: ASSIGNORS[0],
            next_member: 0,
            incarnation: String::new(),
            max_size: usize::MAX,
        }
    }

    /// With Kafka's `group.consumer.session.timeout.ms` and `heartbeat.interval.ms`.
    pub fn with_timeouts(mut self, session_timeout_ms: i64, heartbeat_interval_ms: i32) -> Self {
        self.session_timeout_ms = session_timeout_ms.max(1);
        self.heartbeat_interval_ms = heartbeat_interval_ms.max(1);
        self
    }

    /// With Kafka's `group.consumer.max.size`: a join that would add a member beyond `max`
    /// members is GROUP_MAX_SIZE_REACHED (a static member replacing its instance's holder, or
    /// a known member joining again, adds none). A group restored with more members keeps
    /// them.
    pub fn with_max_size(mut self, max: usize) -> Self {
        self.max_size = max;
        self
    }

    /// Makes the member ids this group hands out (v0 joins) unique to this life.
    pub fn with_incarnation(mut self, incarnation: &str) -> Self {
        self.incarnation = incarnation.to_string();
        self
    }

    /// The group's id.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    /// The group epoch.
    pub fn group_epoch(&self) -> i32 {
        self.group_epoch
    }

    /// The target assignment's epoch.
    pub fn target_epoch(&self) -> i32 {
        self.target_epoch
    }

    /// The server assignor the group's target assignment comes from.
    pub fn assignor(&self) -> &'static str {
        self.assignor
    }

    /// The topics `member` subscribes to now (its names and its regular expression's matches
    /// among the topics that exist).
    pub fn subscription_of(&self, member: &Member) -> BTreeSet<String> {
        self.subscribed(member)
    }

    /// No members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members, by id.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// A member's target assignment.
    pub fn target_of(&self, member_id: &str) -> BTreeSet<TopicPartition> {
        self.target.get(member_id).cloned().unwrap_or_default()
    }

    /// Kafka's group state name: Empty, Assigning (target behind the group epoch; never here,
    /// the target is computed at once), Reconciling (a member not yet at the target) or Stable.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.target_epoch != self.group_epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.epoch != self.target_epoch || m.state != MemberState::Stable)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The topics a member subscribes to: its names and its regular expression's matches,
    /// among the topics that exist.
    fn subscribed(&self, m: &Member) -> BTreeSet<String> {
        self.topics
            .keys()
            .filter(|t| {
                m.topics.contains(*t) || m.matcher.as_ref().is_some_and(|re| re.is_match(t))
            })
            .cloned()
            .collect()
    }

    /// Handles one heartbeat at `now_ms`: silent members are expired first ([`Self::tick`]).
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        now_ms: i64,
    ) -> Result<HeartbeatReply, ConsumerGroupError> {
        validate(&hb)?;
        self.tick(now_ms);
        if hb.member_epoch == LEAVE_EPOCH || hb.member_epoch == STATIC_LEAVE_EPOCH {
            let id = match &hb.instance_id {
                Some(instance) => self.static_holder(instance, &hb.member_id)?,
                None if self.members.contains_key(&hb.member_id) => hb.member_id.clone(),
                None => return Err(ConsumerGroupError::UnknownMemberId(hb.member_id)),
            };
            if hb.member_epoch == STATIC_LEAVE_EPOCH {
                self.leave_temporarily(&id);
            } else {
                self.remove(&id);
            }
            return Ok(HeartbeatReply {
                member_id: hb.member_id,
                member_epoch: hb.member_epoch,
                heartbeat_interval_ms: 0,
                assignment: None,
            });
        }
        let mut changed = false;
        let joining = hb.member_epoch == JOIN_EPOCH;
        let member_id = if joining {
            let id = if hb.member_id.is_empty() {
                self.next_member += 1;
                format!(
                    "{}-{}-{}",
                    self.group_id, self.incarnation, self.next_member
                )
            } else {
                hb.member_id.clone()
            };
            // A static member coming back: it replaces the holder of its instance id, if the
            // holder left temporarily (-2) or is itself.
            let replaced = match hb
                .instance_id
                .as_deref()
                .and_then(|i| self.static_member(i))
            {
                Some(holder) if holder == id => Some(holder),
                Some(holder) if self.members[&holder].epoch == STATIC_LEAVE_EPOCH => Some(holder),
                Some(_) => {
                    let instance = hb.instance_id.clone().unwrap_or_default();
                    return Err(ConsumerGroupError::UnreleasedInstanceId(instance));
                }
                None => None,
            };
            if let Some(holder) = replaced {
                if holder != id && self.members.contains_key(&id) {
                    // Its new id was some other member's: that one goes first.
                    self.remove(&id);
                }
                self.replace(&holder, &id, hb.instance_id.clone(), now_ms);
            } else {
                if self.members.contains_key(&id) {
                    // A new incarnation of a known member: the old one goes, partitions and all.
                    self.remove(&id);
                } else if self.members.len() >= self.max_size {
                    return Err(ConsumerGroupError::GroupMaxSizeReached(self.max_size));
                }
                self.members.insert(
                    id.clone(),
                    Member {
                        id: id.clone(),
                        instance_id: hb.instance_id.clone(),
                        epoch: 0,
                        previous_epoch: -1,
                        state: MemberState::Stable,
                        topics: BTreeSet::new(),
                        regex: None,
                        matcher: None,
                        assignor: None,
                        rebalance_timeout_ms: i64::from(hb.rebalance_timeout_ms.max(0)),
                        client_id: String::new(),
                        client_host: String::new(),
                        assigned: BTreeSet::new(),
                        revoking: BTreeSet::new(),
                        sent: None,
                        last_heartbeat_ms: now_ms,
                        revoke_since_ms: None,
                    },
                );
                changed = true;
            }
            id
        } else {
            if let Some(instance) = &hb.instance_id {
                self.static_holder(instance, &hb.member_id)?;
            }
            let m = self
                .members
                .get(&hb.member_id)
                .ok_or_else(|| ConsumerGroupError::UnknownMemberId(hb.member_id.clone()))?;
            if hb.member_epoch > m.epoch
                || (hb.member_epoch < m.epoch
                    && (hb.member_epoch != m.previous_epoch
                        || !hb.owned.as_ref().is_some_and(|o| o.is_subset(&m.assigned))))
            {
                return Err(ConsumerGroupError::FencedMemberEpoch {
                    got: hb.member_epoch,
                    current: m.epoch,
                });
            }
            hb.member_id.clone()
        };
        let member = self.members.get_mut(&member_id).expect("present");
        member.last_heartbeat_ms = now_ms;
        member.client_id = hb.client_id;
        member.client_host = hb.client_host;
        if hb.rebalance_timeout_ms >= 0 {
            member.rebalance_timeout_ms = i64::from(hb.rebalance_timeout_ms);
        }
        if let Some(names) = hb.subscribed_topic_names {
            let names: BTreeSet<String> = names.into_iter().collect();
            changed |= names != member.topics;
            member.topics = names;
        }
        if let Some(regex) = hb.subscribed_topic_regex {
            let regex = (!regex.is_empty()).then_some(regex);
            if regex != member.regex {
                changed = true;
                // Checked by `validate`: it compiles.
                member.matcher = regex
                    .as_deref()
                    .and_then(|r| regex::Regex::new(&format!("^(?:{r})$")).ok());
                member.regex = regex;
            }
        }
        if let Some(assignor) = hb.server_assignor {
            changed |= Some(&assignor) != member.assignor.as_ref();
            member.assignor = Some(assignor);
        }
        if changed {
            self.group_epoch += 1;
            self.compute_target();
        }
        let owned = hb.owned;
        self.reconcile(&member_id, owned.as_ref(), now_ms);
        let member = self.members.get_mut(&member_id).expect("present");
        let send = joining || owned.is_some() || member.sent.as_ref() != Some(&member.assigned);
        let assignment = send.then(|| member.assigned.clone());
        if send {
            member.sent = Some(member.assigned.clone());
        }
        Ok(HeartbeatReply {
            member_id,
            member_epoch: member.epoch,
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            assignment,
        })
    }

    /// The live member holding `instance_id`.
    fn static_member(&self, instance_id: &str) -> Option<String> {
        self.members
            .values()
            .find(|m| m.instance_id.as_deref() == Some(instance_id))
            .map(|m| m.id.clone())
    }

    /// The member holding `instance_id`, if it is `member_id`: UNKNOWN_MEMBER_ID if nobody
    /// holds it, FENCED_INSTANCE_ID if another member does (`member_id` was replaced).
    fn static_holder(
        &self,
        instance_id: &str,
        member_id: &str,
    ) -> Result<String, ConsumerGroupError> {
        match self.static_member(instance_id) {
            None => Err(ConsumerGroupError::UnknownMemberId(member_id.to_string())),
            Some(holder) if holder != member_id => Err(ConsumerGroupError::FencedInstanceId(
                instance_id.to_string(),
            )),
            Some(holder) => Ok(holder),
        }
    }

    /// A static member's temporary leave: it stays, at epoch -2, with its partitions (nobody
    /// else gets them until it is replaced or its session expires); what it was still revoking
    /// is freed. The group epoch does not move.
    fn leave_temporarily(&mut self, member_id: &str) {
        let Some(m) = self.members.get_mut(member_id) else {
            return;
        };
        let revoking = std::mem::take(&mut m.revoking);
        m.epoch = STATIC_LEAVE_EPOCH;
        m.state = MemberState::Stable;
        m.revoke_since_ms = None;
        m.sent = None;
        for tp in &revoking {
            if self.owners.get(tp).map(String::as_str) == Some(member_id) {
                self.owners.remove(tp);
            }
        }
    }

    /// A static member's return under `new_id`: the member `old_id` becomes `new_id`, with its
    /// partitions, its subscription and its target, at epoch 0 (reconciliation then brings it to
    /// the target epoch), or at its own epoch if it is the same live member joining again.
    /// Partitions the old one was still revoking are freed.
    fn replace(&mut self, old_id: &str, new_id: &str, instance_id: Option<String>, now_ms: i64) {
        let Some(mut m) = self.members.remove(old_id) else {
            return;
        };
        for tp in m.revoking.iter() {
            if self.owners.get(tp).map(String::as_str) == Some(old_id) {
                self.owners.remove(tp);
            }
        }
        for tp in &m.assigned {
            self.owners.insert(tp.clone(), new_id.to_string());
        }
        if let Some(target) = self.target.remove(old_id) {
            self.target.insert(new_id.to_string(), target);
        }
        if old_id != new_id || m.epoch < 0 {
            m.epoch = 0;
            m.previous_epoch = -1;
        }
        m.id = new_id.to_string();
        m.instance_id = instance_id;
        m.state = MemberState::Stable;
        m.revoking.clear();
        m.revoke_since_ms = None;
        m.sent = None;
        m.last_heartbeat_ms = now_ms;
        self.members.insert(new_id.to_string(), m);
    }

    /// Removes a member: its partitions are freed and the group epoch is bumped.
    fn remove(&mut self, member_id: &str) {
        if let Some(m) = self.members.remove(member_id) {
            for tp in m.assigned.iter().chain(&m.revoking) {
                if self.owners.get(tp).map(String::as_str) == Some(member_id) {
                    self.owners.remove(tp);
                }
            }
            self.group_epoch += 1;
            self.compute_target();
        }
    }

    /// Recomputes the target assignment for the current group epoch.
    fn compute_target(&mut self) {
        let subscriptions: BTreeMap<String, BTreeSet<String>> = self
            .members
            .values()
            .map(|m| (m.id.clone(), self.subscribed(m)))
            .collect();
        // The group's assignor: the one most members chose (ties by name), else uniform.
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = m.assignor.as_deref() {
                *votes.entry(a).or_default() += 1;
            }
        }
        let chosen = votes
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map_or(ASSIGNORS[0], |(a, _)| a);
        let assignor = ASSIGNORS
            .into_iter()
            .find(|a| *a == chosen)
            .unwrap_or(ASSIGNORS[0]);
        self.target = assign(assignor, &subscriptions, &self.topics, &self.target);
        self.assignor = assignor;
        self.target_epoch = self.group_epoch;
    }

    /// Moves `member_id` toward its target as Kafka's `CurrentAssignmentBuilder` does.
    fn reconcile(
        &mut self,
        member_id: &str,
        owned: Option<&BTreeSet<TopicPartition>>,
        now_ms: i64,
    ) {
        let target = self.target_of(member_id);
        let target_epoch = self.target_epoch;
        let Some(m) = self.members.get(member_id) else {
            return;
        };
        if m.state == MemberState::UnrevokedPartitions {
            // Acknowledged once it owns none of what it was told to revoke.
            let acked = owned.is_some_and(|o| o.is_disjoint(&m.revoking));
            if !acked {
                // Still waiting; if the target moved meanwhile (its subscription changed, say),
                // what it must give up now is revoked too.
                let more: BTreeSet<TopicPartition> =
                    m.assigned.difference(&target).cloned().collect();
                if !more.is_empty() {
                    let m = self.members.get_mut(member_id).expect("present");
                    m.assigned.retain(|tp| !more.contains(tp));
                    m.revoking.extend(more);
                }
                return;
            }
            let revoked = m.revoking.clone();
            for tp in &revoked {
                if self.owners.get(tp).map(String::as_str) == Some(member_id) {
                    self.owners.remove(tp);
                }
            }
            let m = self.members.get_mut(member_id).expect("present");
            m.revoking.clear();
            m.revoke_since_ms = None;
            m.state = MemberState::Stable;
        }
        let m = self.members.get(member_id).expect("present");
        if m.epoch == target_epoch && m.state == MemberState::Stable {
            return;
        }
        let keep: BTreeSet<TopicPartition> = m.assigned.intersection(&target).cloned().collect();
        let revoke: BTreeSet<TopicPartition> = m.assigned.difference(&target).cloned().collect();
        let m = self.members.get_mut(member_id).expect("present");
        if !revoke.is_empty() {
            m.assigned = keep;
            m.revoking = revoke;
            m.state = MemberState::UnrevokedPartitions;
            m.revoke_since_ms = Some(now_ms);
            return;
        }
        let mut assigned = keep;
        let mut unreleased = false;
        for tp in target.difference(&m.assigned.clone()) {
            match self.owners.get(tp) {
                Some(holder) if holder != member_id => unreleased = true,
                _ => {
                    assigned.insert(tp.clone());
                }
            }
        }
        for tp in &assigned {
            self.owners.insert(tp.clone(), member_id.to_string());
        }
        let m = self.members.get_mut(member_id).expect("present");
        if m.epoch != target_epoch {
            m.previous_epoch = m.epoch;
            m.epoch = target_epoch;
        }
        m.assigned = assigned;
        m.state = if unreleased {
            MemberState::UnreleasedPartitions
        } else {
            MemberState::Stable
        };
    }

    /// Removes members whose session expired, and members that still hold partitions they
    /// were told to revoke past their rebalance timeout; returns their ids.
    pub fn tick(&mut self, now_ms: i64) -> Vec<String> {
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                now_ms - m.last_heartbeat_ms > self.session_timeout_ms
                    || m.revoke_since_ms
                        .is_some_and(|since| now_ms - since > m.rebalance_timeout_ms)
            })
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            self.remove(id);
        }
        expired
    }

    /// May this caller commit offsets for the group? As Kafka's `ConsumerGroup.
    /// validateOffsetCommit`: a caller outside the group (epoch < 0, no member) only while the
    /// group is empty; otherwise a member, at exactly its current epoch (STALE_MEMBER_EPOCH),
    /// and a plain commit only with OffsetCommit v9+ (`member_epochs`).
    pub fn check_commit(
        &self,
        member_id: &str,
        member_epoch: i32,
        transactional: bool,
        member_epochs: bool,
    ) -> Result<(), ConsumerGroupError> {
        if member_epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        if !self.members.contains_key(member_id) {
            return Err(ConsumerGroupError::UnknownMemberId(member_id.to_string()));
        }
        if !transactional && !member_epochs {
            return Err(ConsumerGroupError::UnsupportedVersion);
        }
        self.check_member_epoch(member_id, member_epoch)
    }

    /// May this caller read the group's offsets? As Kafka's `ConsumerGroup.validateOffsetFetch`:
    /// a caller naming no member and no epoch (an admin tool) always; otherwise a member at
    /// exactly its current epoch.
    pub fn check_fetch(
        &self,
        member_id: &str,
        member_epoch: i32,
    ) -> Result<(), ConsumerGroupError> {
        if member_epoch < 0 && member_id.is_empty() {
            return Ok(());
        }
        self.check_member_epoch(member_id, member_epoch)
    }

    /// A member at exactly its current epoch: UNKNOWN_MEMBER_ID / STALE_MEMBER_EPOCH otherwise.
    fn check_member_epoch(
        &self,
        member_id: &str,
        member_epoch: i32,
    ) -> Result<(), ConsumerGroupError> {
        let m = self
            .members
            .get(member_id)
            .ok_or_else(|| ConsumerGroupError::UnknownMemberId(member_id.to_string()))?;
        if member_epoch != m.epoch {
            return Err(ConsumerGroupError::StaleMemberEpoch {
                got: member_epoch,
                current: m.epoch,
            });
        }
        Ok(())
    }

    /// The topics some member subscribes to (for OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC).
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| self.subscribed(m))
            .collect()
    }
}

/// INVALID_REQUEST / UNSUPPORTED_ASSIGNOR for a malformed heartbeat, as Kafka's
/// `throwIfConsumerGroupHeartbeatRequestIsInvalid`.
fn validate(hb: &Heartbeat) -> Result<(), ConsumerGroupError> {
    let invalid = |why: &str| Err(ConsumerGroupError::InvalidRequest(why.to_string()));
    if hb.member_id.len() > cluster::MAX_ID_LEN {
        return invalid("MemberId is too long");
    }
    if hb.instance_id.as_ref().is_some_and(|i| i.is_empty()) {
        return invalid("InstanceId can't be empty");
    }
    if hb.member_epoch < STATIC_LEAVE_EPOCH {
        return invalid("MemberEpoch is invalid");
    }
    if hb.member_epoch == JOIN_EPOCH {
        if hb.rebalance_timeout_ms == -1 {
            return invalid("RebalanceTimeoutMs must be provided in first request");
        }
        if hb.owned.as_ref().is_some_and(|o| !o.is_empty()) {
            return invalid("TopicPartitions must be empty when (re-)joining");
        }
        let names = hb
            .subscribed_topic_names
            .as_ref()
            .is_some_and(|n| !n.is_empty());
        let regex = hb
            .subscribed_topic_regex
            .as_ref()
            .is_some_and(|r| !r.is_empty());
        if !names && !regex {
            return invalid(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request",
            );
        }
    } else if hb.member_id.is_empty() {
        return invalid("MemberId can't be empty");
    }
    if hb.member_epoch == STATIC_LEAVE_EPOCH && hb.instance_id.is_none() {
        return invalid("InstanceId can't be null when leaving as a static member");
    }
    if let Some(regex) = &hb.subscribed_topic_regex {
        if regex.len() > MAX_REGEX_LEN || regex::Regex::new(regex).is_err() {
            // Kafka answers INVALID_REGULAR_EXPRESSION from v1; INVALID_REQUEST says as much.
            return invalid("SubscribedTopicRegex is not a valid regular expression");
        }
    }
    if let Some(a) = &hb.server_assignor {
        if !ASSIGNORS.contains(&a.as_str()) {
            return Err(ConsumerGroupError::UnsupportedAssignor(a.clone()));
        }
    }
    Ok(())
}

/// The target assignment: every partition of every subscribed topic to exactly one member
/// that subscribes to it.
/// - `uniform` (Kafka's default): sticky and balanced. Each member keeps what `previous`
///   gave it and still subscribes to; the rest goes to the least-loaded subscriber; then
///   partitions move from a member holding two or more above the least-loaded subscriber of
///   their topic until none does.
/// - `range`: per topic, the subscribers in id order get contiguous ranges, the first
///   `partitions % members` one more.
pub fn assign(
    assignor: &str,
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    topics: &BTreeMap<String, i32>,
    previous: &BTreeMap<String, BTreeSet<TopicPartition>>,
) -> BTreeMap<String, BTreeSet<TopicPartition>> {
    let mut out: BTreeMap<String, BTreeSet<TopicPartition>> = subscriptions
        .keys()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    let subscribers = |topic: &str| -> Vec<&String> {
        subscriptions
            .iter()
            .filter(|(_, t)| t.contains(topic))
            .map(|(m, _)| m)
            .collect()
    };
    if assignor == "range" {
        for (topic, &count) in topics {
            let members = subscribers(topic);
            if members.is_empty() {
                continue;
            }
            let (n, m) = (count.max(0) as usize, members.len());
            let mut next = 0usize;
            for (i, member) in members.iter().enumerate() {
                let take = n / m + usize::from(i < n % m);
                for p in next..next + take {
                    out.get_mut(*member)
                        .expect("listed")
                        .insert(TopicPartition::new(topic.as_str(), p as i32));
                }
                next += take;
            }
        }
        return out;
    }
    // uniform: sticky first.
    let mut owner: BTreeMap<TopicPartition, String> = BTreeMap::new();
    for (member, held) in previous {
        let Some(subscribed) = subscriptions.get(member) else {
            continue;
        };
        for tp in held {
            let exists = topics.get(&tp.topic).is_some_and(|&n| tp.partition < n);
            if exists && subscribed.contains(&tp.topic) {
                owner.insert(tp.clone(), member.clone());
                out.get_mut(member).expect("listed").insert(tp.clone());
            }
        }
    }
    for (topic, &count) in topics {
        let members = subscribers(topic);
        if members.is_empty() {
            continue;
        }
        for p in 0..count.max(0) {
            let tp = TopicPartition::new(topic.as_str(), p);
            if owner.contains_key(&tp) {
                continue;
            }
            let least = members
                .iter()
                .min_by_key(|m| (out[m.as_str()].len(), m.as_str()))
                .expect("non-empty");
            owner.insert(tp.clone(), (*least).clone());
            out.get_mut(least.as_str()).expect("listed").insert(tp);
        }
    }
    // Balance: each move lowers the sum of squared loads, so this ends.
    loop {
        let mut moved = false;
        let held: Vec<(TopicPartition, String)> = owner
            .iter()
            .map(|(tp, m)| (tp.clone(), m.clone()))
            .collect();
        for (tp, from) in held {
            let members = subscribers(&tp.topic);
            let least = members
                .iter()
                .min_by_key(|m| (out[m.as_str()].len(), m.as_str()))
                .expect("the owner subscribes");
            if out[&from].len() > out[least.as_str()].len() + 1 {
                out.get_mut(&from).expect("listed").remove(&tp);
                out.get_mut(least.as_str())
                    .expect("listed")
                    .insert(tp.clone());
                owner.insert(tp, (*least).clone());
                moved = true;
            }
        }
        if !moved {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics() -> BTreeMap<String, i32> {
        [("orders".to_string(), 4), ("audit".to_string(), 2)]
            .into_iter()
            .collect()
    }

    fn join(id: &str, topics: &[&str]) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
            owned: Some(BTreeSet::new()),
            ..Default::default()
        }
    }

    fn beat(id: &str, epoch: i32, owned: &BTreeSet<TopicPartition>) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: -1,
            owned: Some(owned.clone()),
            ..Default::default()
        }
    }

    fn tp(t: &str, p: i32) -> TopicPartition {
        TopicPartition::new(t, p)
    }

    /// Heartbeats every member with what it holds until nothing changes (static members away
    /// at -2 stay silent); no partition is ever held by two members at once along the way.
    fn settle(g: &mut ConsumerGroup, now: i64) {
        for _ in 0..10 {
            let ids: Vec<(String, i32, BTreeSet<TopicPartition>)> = g
                .members()
                .filter(|m| m.epoch >= 0)
                .map(|m| (m.id.clone(), m.epoch, m.assigned.clone()))
                .collect();
            for (id, epoch, held) in ids {
                g.heartbeat(beat(&id, epoch, &held), now).unwrap();
                assert_no_double_ownership(g);
            }
        }
    }

    fn assert_no_double_ownership(g: &ConsumerGroup) {
        let mut seen = BTreeSet::new();
        for m in g.members() {
            for tp in m.assigned.iter().chain(&m.revoking) {
                assert!(seen.insert(tp.clone()), "{tp} held twice");
            }
        }
    }

    #[test]
    fn a_lone_member_gets_every_partition_of_its_topics_at_epoch_one() {
        let mut g = ConsumerGroup::new("g", topics());
        let r = g.heartbeat(join("a", &["orders", "missing"]), 0).unwrap();
        assert_eq!(r.member_epoch, 1);
        assert_eq!(r.assignment.unwrap().len(), 4);
        assert_eq!(g.state_name(), "Stable");
        // Nothing changed: no assignment in the reply.
        let held = g.members().next().unwrap().assigned.clone();
        let r = g.heartbeat(beat("a", 1, &held), 10).unwrap();
        assert_eq!(r.member_epoch, 1);
        assert!(r.assignment.is_some(), "a full heartbeat gets it");
        let mut quiet = beat("a", 1, &held);
        quiet.owned = None;
        assert_eq!(g.heartbeat(quiet, 20).unwrap().assignment, None);
    }

    #[test]
    fn a_second_member_gets_partitions_only_after_the_first_revoked_them() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(join("a", &["orders"]), 0).unwrap();
        let a_all: BTreeSet<_> = (0..4).map(|p| tp("orders", p)).collect();
        let rb = g.heartbeat(join("b", &["orders"]), 10).unwrap();
        // B is at the new epoch but gets nothing yet: A still holds everything.
        assert_eq!(rb.member_epoch, 2);
        assert_eq!(rb.assignment, Some(BTreeSet::new()));
        // A is told to revoke two, keeping its epoch.
        let ra = g.heartbeat(beat("a", 1, &a_all), 20).unwrap();
        assert_eq!(ra.member_epoch, 1);
        let kept = ra.assignment.unwrap();
        assert_eq!(kept.len(), 2);
        // Until A acknowledges, B still gets nothing.
        let rb = g.heartbeat(beat("b", 2, &BTreeSet::new()), 30).unwrap();
        assert_eq!(rb.assignment, Some(BTreeSet::new()));
        // A acknowledges (owns only what it kept): it moves to epoch 2, B gets the rest.
        let ra = g.heartbeat(beat("a", 1, &kept), 40).unwrap();
        assert_eq!(ra.member_epoch, 2);
        let rb = g.heartbeat(beat("b", 2, &BTreeSet::new()), 50).unwrap();
        let b_got = rb.assignment.unwrap();
        assert_eq!(b_got.len(), 2);
        assert!(b_got.is_disjoint(&kept));
        assert_eq!(g.state_name(), "Stable");
    }

    #[test]
    fn epochs_ahead_or_stale_are_fenced_except_the_previous_with_a_subset() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(join("a", &["orders"]), 0).unwrap();
        let held = g.members().next().unwrap().assigned.clone();
        assert_eq!(
            g.heartbeat(beat("a", 2, &held), 1),
            Err(ConsumerGroupError::FencedMemberEpoch { got: 2, current: 1 })
        );
        // Bump A to epoch 3 through two joins and leaves of others.
        g.heartbeat(join("b", &["audit"]), 2).unwrap();
        g.heartbeat(beat("a", 1, &held), 3).unwrap();
        assert_eq!(g.members().next().unwrap().epoch, 2);
        // The previous epoch with a subset of the assignment: accepted (the reply was lost).
        let r = g.heartbeat(beat("a", 1, &held), 4).unwrap();
        assert_eq!(r.member_epoch, 2);
        // The previous epoch claiming a partition it does not hold: fenced.
        let mut more = held.clone();
        more.insert(tp("audit", 0));
        assert!(matches!(
            g.heartbeat(beat("a", 1, &more), 5),
            Err(ConsumerGroupError::FencedMemberEpoch { .. })
        ));
        // Older than the previous: fenced.
        assert!(matches!(
            g.heartbeat(beat("a", 0, &held), 6),
            Err(ConsumerGroupError::InvalidRequest(_))
                | Err(ConsumerGroupError::FencedMemberEpoch { .. })
        ));
        assert_eq!(
            g.heartbeat(beat("zombie", 2, &held), 7),
            Err(ConsumerGroupError::UnknownMemberId("zombie".into()))
        );
    }

    #[test]
    fn a_member_waiting_to_revoke_is_told_to_revoke_more_when_its_target_moves() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(join("a", &["orders", "audit"]), 0).unwrap();
        let all = g.members().next().unwrap().assigned.clone();
        g.heartbeat(join("b", &["orders", "audit"]), 1).unwrap();
        // A is told to revoke some and does not acknowledge yet.
        g.heartbeat(beat("a", 1, &all), 2).unwrap();
        // A drops "audit" from its subscription while still waiting.
        let mut resubscribe = beat("a", 1, &all);
        resubscribe.subscribed_topic_names = Some(vec!["orders".into()]);
        let told = g.heartbeat(resubscribe, 3).unwrap().assignment.unwrap();
        assert!(told.iter().all(|tp| tp.topic == "orders"), "{told:?}");
        let a = g.members().find(|m| m.id == "a").unwrap();
        assert!(a.revoking.iter().any(|tp| tp.topic == "audit"));
        assert_no_double_ownership(&g);
    }

    #[test]
    fn commits_need_the_members_exact_epoch() {
        let mut g = ConsumerGroup::new("g", topics());
        assert_eq!(
            g.check_commit("", -1, false, true),
            Ok(()),
            "empty group: simple commit"
        );
        g.heartbeat(join("a", &["orders"]), 0).unwrap();
        assert_eq!(g.check_commit("a", 1, false, true), Ok(()));
        assert_eq!(
            g.check_commit("a", 1, true, false),
            Ok(()),
            "TxnOffsetCommit v3"
        );
        assert_eq!(
            g.check_commit("a", 1, false, false),
            Err(ConsumerGroupError::UnsupportedVersion)
        );
        assert_eq!(
            g.check_commit("", -1, false, true),
            Err(ConsumerGroupError::UnknownMemberId(String::new()))
        );
        // B joins and A reconciles to epoch 2: A's epoch-1 commits are stale from then on.
        let held = g.members().next().unwrap().assigned.clone();
        g.heartbeat(join("b", &["orders"]), 1).unwrap();
        let kept = g
            .heartbeat(beat("a", 1, &held), 2)
            .unwrap()
            .assignment
            .unwrap();
        g.heartbeat(beat("a", 1, &kept), 3).unwrap();
        assert_eq!(
            g.check_commit("a", 1, true, true),
            Err(ConsumerGroupError::StaleMemberEpoch { got: 1, current: 2 })
        );
        assert_eq!(g.check_commit("a", 2, true, true), Ok(()));
        assert_eq!(
            g.check_commit("gone", 2, true, true),
            Err(ConsumerGroupError::UnknownMemberId("gone".into()))
        );
    }

    #[test]
    fn offset_fetches_naming_a_member_need_its_exact_epoch() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(join("a", &["orders"]), 0).unwrap();
        assert_eq!(g.check_fetch("", -1), Ok(()), "an admin tool");
        assert_eq!(g.check_fetch("a", 1), Ok(()));
        assert_eq!(
            g.check_fetch("a", 0),
            Err(ConsumerGroupError::StaleMemberEpoch { got: 0, current: 1 })
        );
        assert_eq!(
            g.check_fetch("zombie", 1),
            Err(ConsumerGroupError::UnknownMemberId("zombie".into()))
        );
    }

    #[test]
    fn silent_members_and_members_that_do_not_revoke_are_removed() {
        let mut g = ConsumerGroup::new("g", topics()).with_timeouts(1_000, 100);
        g.heartbeat(join("a", &["orders"]), 0).unwrap();
        let held = g.members().next().unwrap().assigned.clone();
        g.heartbeat(join("b", &["orders"]), 500).unwrap();
        // A is told to revoke at 600 and never acknowledges; it keeps heartbeating.
        g.heartbeat(beat("a", 1, &held), 600).unwrap();
        g.heartbeat(beat("a", 1, &held), 900).unwrap();
        g.heartbeat(beat("b", 2, &BTreeSet::new()), 900).unwrap();
        // Its rebalance timeout (30 s) has not passed, its session is fresh: still there.
        assert_eq!(g.members().count(), 2);
        // B goes silent for longer than the session: removed, A is alone again.
        g.heartbeat(beat("a", 1, &held), 1_800).unwrap();
        assert_eq!(g.tick(1_950), vec!["b".to_string()]);
        let mut short = ConsumerGroup::new("h", topics()).with_timeouts(60_000, 100);
        let mut j = join("a", &["orders"]);
        j.rebalance_timeout_ms = 100;
        short.heartbeat(j, 0).unwrap();
        let held = short.members().next().unwrap().assigned.clone();
        short.heartbeat(join("b", &["orders"]), 10).unwrap();
        short.heartbeat(beat("a", 1, &held), 20).unwrap();
        assert_eq!(
            short.tick(200),
            vec!["a".to_string()],
            "did not revoke in time"
        );
        let rb = short
            .heartbeat(beat("b", 2, &BTreeSet::new()), 210)
            .unwrap();
        assert_eq!(rb.member_epoch, 3);
        assert_eq!(rb.assignment.unwrap().len(), 4);
    }

    #[test]
    fn leaving_frees_partitions_and_a_rejoin_with_a_known_id_starts_over() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(join("a", &["orders"]), 0).unwrap();
        g.heartbeat(join("b", &["orders"]), 1).unwrap();
        settle(&mut g, 2);
        let leave = Heartbeat {
            member_id: "a".into(),
            member_epoch: LEAVE_EPOCH,
            ..Default::default()
        };
        assert_eq!(g.heartbeat(leave, 3).unwrap().member_epoch, LEAVE_EPOCH);
        settle(&mut g, 4);
        assert_eq!(g.members().next().unwrap().assigned.len(), 4);
        let before = g.members().next().unwrap().epoch;
        g.heartbeat(join("b", &["orders"]), 5).unwrap();
        let b = g.members().next().unwrap();
        assert!(b.epoch > before, "a new incarnation gets a new epoch");
        assert_eq!(
            g.check_commit("b", before, false, true),
            Err(ConsumerGroupError::StaleMemberEpoch {
                got: before,
                current: b.epoch
            })
        );
    }

    fn static_join(id: &str, instance: &str) -> Heartbeat {
        Heartbeat {
            instance_id: Some(instance.into()),
            ..join(id, &["orders"])
        }
    }

    fn leave(id: &str, epoch: i32, instance: Option<&str>) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: epoch,
            instance_id: instance.map(str::to_string),
            ..Default::default()
        }
    }

    fn held(g: &ConsumerGroup, id: &str) -> BTreeSet<TopicPartition> {
        g.members()
            .find(|m| m.id == id)
            .map(|m| m.assigned.clone())
            .unwrap_or_default()
    }

    #[test]
    fn static_instance_ids_are_held_by_one_live_member() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(static_join("a", "i1"), 0).unwrap();
        assert_eq!(
            g.heartbeat(static_join("b", "i1"), 1),
            Err(ConsumerGroupError::UnreleasedInstanceId("i1".into()))
        );
        // A heartbeat or a leave naming an instance id nobody holds: unknown.
        let mut unknown = beat("a", 1, &held(&g, "a"));
        unknown.instance_id = Some("i9".into());
        assert_eq!(
            g.heartbeat(unknown, 2),
            Err(ConsumerGroupError::UnknownMemberId("a".into()))
        );
        assert_eq!(
            g.heartbeat(leave("a", STATIC_LEAVE_EPOCH, Some("i9")), 2),
            Err(ConsumerGroupError::UnknownMemberId("a".into()))
        );
        // The holder's own join again (its reply was lost): it keeps its place and partitions.
        let epoch = g.group_epoch();
        let r = g.heartbeat(static_join("a", "i1"), 3).unwrap();
        assert_eq!(r.assignment.unwrap().len(), 4);
        assert_eq!(g.group_epoch(), epoch);
        // A permanent leave (-1) with the instance id frees the instance id and the partitions.
        g.heartbeat(leave("a", LEAVE_EPOCH, Some("i1")), 4).unwrap();
        assert!(g.is_empty());
        assert_eq!(
            g.heartbeat(static_join("b", "i1"), 5)
                .unwrap()
                .assignment
                .unwrap()
                .len(),
            4
        );
    }

    #[test]
    fn a_static_member_away_keeps_its_partitions_and_its_replacement_fences_the_old_one() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(static_join("a", "i1"), 0).unwrap();
        g.heartbeat(join("b", &["orders"]), 1).unwrap();
        settle(&mut g, 2);
        let (a_parts, b_parts) = (held(&g, "a"), held(&g, "b"));
        assert_eq!((a_parts.len(), b_parts.len()), (2, 2));
        let (epoch, a_epoch) = (
            g.group_epoch(),
            g.members().find(|m| m.id == "a").unwrap().epoch,
        );

        // a restarts: its temporary leave keeps it, and its partitions, at epoch -2.
        let r = g
            .heartbeat(leave("a", STATIC_LEAVE_EPOCH, Some("i1")), 3)
            .unwrap();
        assert_eq!(r.member_epoch, STATIC_LEAVE_EPOCH);
        assert_eq!(g.group_epoch(), epoch, "a temporary leave is no rebalance");
        settle(&mut g, 4);
        assert_eq!(
            held(&g, "b"),
            b_parts,
            "b never gets a's partitions meanwhile"
        );
        assert_eq!(held(&g, "a"), a_parts);
        // The old a, still running, cannot heartbeat or commit at its epoch any more.
        assert_eq!(
            g.heartbeat(beat("a", a_epoch, &a_parts), 5),
            Err(ConsumerGroupError::FencedMemberEpoch {
                got: a_epoch,
                current: STATIC_LEAVE_EPOCH
            })
        );
        assert!(g.check_commit("a", a_epoch, true, true).is_err());

        // The new process joins with the instance id under a new member id: it takes a's
        // partitions at the group's epoch, and nobody rebalances.
        let r = g.heartbeat(static_join("a2", "i1"), 6).unwrap();
        assert_eq!(r.member_epoch, epoch);
        assert_eq!(r.assignment.unwrap(), a_parts);
        assert_eq!(g.group_epoch(), epoch);
        assert_eq!(g.state_name(), "Stable");
        assert_eq!(held(&g, "b"), b_parts);
        assert!(g.check_commit("a2", epoch, true, true).is_ok());

        // The replaced member id is fenced by its instance id, and cannot make a2 leave.
        let mut zombie = beat("a", a_epoch, &a_parts);
        zombie.instance_id = Some("i1".into());
        let before = format!("{:?}", g.members().collect::<Vec<_>>());
        assert_eq!(
            g.heartbeat(zombie, 7),
            Err(ConsumerGroupError::FencedInstanceId("i1".into()))
        );
        for epoch in [LEAVE_EPOCH, STATIC_LEAVE_EPOCH] {
            assert_eq!(
                g.heartbeat(leave("a", epoch, Some("i1")), 7),
                Err(ConsumerGroupError::FencedInstanceId("i1".into()))
            );
        }
        assert_eq!(
            g.heartbeat(beat("a", a_epoch, &a_parts), 7),
            Err(ConsumerGroupError::UnknownMemberId("a".into()))
        );
        assert_eq!(
            g.check_commit("a", a_epoch, true, true),
            Err(ConsumerGroupError::UnknownMemberId("a".into()))
        );
        assert_eq!(before, format!("{:?}", g.members().collect::<Vec<_>>()));
    }

    #[test]
    fn a_static_member_that_does_not_return_within_its_session_is_removed() {
        let mut g = ConsumerGroup::new("g", topics()).with_timeouts(1_000, 100);
        g.heartbeat(static_join("a", "i1"), 0).unwrap();
        let mut a_parts = held(&g, "a");
        assert_eq!(a_parts.len(), 4);
        // c joins: a is told to revoke two partitions... and leaves for a while before it
        // acknowledges: what it was revoking is freed at once, what it keeps stays its own.
        g.heartbeat(join("c", &["orders"]), 1).unwrap();
        let a_epoch = g.members().find(|m| m.id == "a").unwrap().epoch;
        g.heartbeat(beat("a", a_epoch, &a_parts), 2).unwrap();
        let revoking = g.members().find(|m| m.id == "a").unwrap().revoking.clone();
        assert_eq!(revoking.len(), 2);
        g.heartbeat(leave("a", STATIC_LEAVE_EPOCH, Some("i1")), 3)
            .unwrap();
        a_parts.retain(|tp| !revoking.contains(tp));
        assert_eq!(held(&g, "a"), a_parts);
        settle(&mut g, 4);
        assert_eq!(
            held(&g, "c"),
            revoking,
            "the revoked partitions moved, the rest did not"
        );
        // Past the session timeout (from its last heartbeat, at 2) a is removed and its
        // partitions move too.
        settle(&mut g, 1_003);
        assert!(g.members().all(|m| m.id != "a"));
        settle(&mut g, 1_004);
        assert_eq!(held(&g, "c").len(), 4);
    }

    #[test]
    fn a_restored_group_goes_on_where_it_was_and_still_fences() {
        let mut g = ConsumerGroup::new("g", topics());
        g.heartbeat(static_join("a", "i1"), 0).unwrap();
        g.heartbeat(join("b", &["orders", "audit"]), 1).unwrap();
        settle(&mut g, 2);
        // c joins and a is told to revoke, mid-rebalance: the state is stored as it is.
        g.heartbeat(join("c", &["orders"]), 3).unwrap();
        let a_epoch = g.members().find(|m| m.id == "a").unwrap().epoch;
        g.heartbeat(beat("a", a_epoch, &held(&g, "a")), 3).unwrap();
        let state = g.state();
        let bytes = serde_json::to_vec(&state).unwrap();
        let stored: GroupState = serde_json::from_slice(&bytes).unwrap();
        let mut r = ConsumerGroup::restore("g", topics(), stored, 100);
        assert_eq!(r.state(), state, "restored as stored");
        assert_eq!(r.group_epoch(), g.group_epoch());
        // Every member goes on at its epoch; the rebalance completes without double ownership.
        settle(&mut r, 101);
        assert_no_double_ownership(&r);
        assert_eq!(r.state_name(), "Stable");
        let all: usize = r.members().map(|m| m.assigned.len()).sum();
        assert_eq!(all, 6);
        // A zombie at an older epoch is still fenced; an unknown member is still unknown.
        let b_epoch = r.members().find(|m| m.id == "b").unwrap().epoch;
        assert!(matches!(
            r.heartbeat(beat("b", b_epoch + 1, &BTreeSet::new()), 102),
            Err(ConsumerGroupError::FencedMemberEpoch { .. })
        ));
        assert!(r.check_commit("b", b_epoch, true, true).is_ok());
        assert_eq!(
            r.check_commit("zz", b_epoch, true, true),
            Err(ConsumerGroupError::UnknownMemberId("zz".into()))
        );
        // Sessions start over at the restore: silent members expire a session after it.
        r.tick(100 + DEFAULT_SESSION_TIMEOUT_MS + 102);
        assert!(r.is_empty());
    }

    #[test]
    fn a_restore_never_gives_a_partition_to_two_members() {
        let mut state = GroupState::default();
        let record = |id: &str| MemberRecord {
            id: id.into(),
            instance_id: None,
            epoch: 1,
            previous_epoch: 0,
            state: MemberState::Stable,
            topics: ["orders".to_string()].into(),
            regex: Some("(".into()),
            assignor: None,
            rebalance_timeout_ms: 1,
            client_id: String::new(),
            client_host: String::new(),
            assigned: [tp("orders", 0)].into(),
            revoking: [tp("orders", 0), tp("orders", 1)].into(),
        };
        state.members = vec![record("a"), record("b")];
        let r = ConsumerGroup::restore("g", topics(), state, 0);
        assert_no_double_ownership(&r);
        let held: usize = r
            .members()
            .map(|m| m.assigned.len() + m.revoking.len())
            .sum();
        assert_eq!(held, 2);
    }

    #[test]
    fn malformed_heartbeats_are_refused_and_change_nothing() {
        let mut g = ConsumerGroup::new("g", topics());
        let cases = [
            Heartbeat {
                member_epoch: 0,
                rebalance_timeout_ms: 100,
                ..Default::default()
            },
            Heartbeat {
                member_epoch: -3,
                member_id: "a".into(),
                ..Default::default()
            },
            Heartbeat {
                member_epoch: 5,
                ..Default::default()
            },
            {
                let mut j = join("a", &["orders"]);
                j.subscribed_topic_regex = Some("(".into());
                j
            },
            {
                let mut j = join("a", &["orders"]);
                j.owned = Some([tp("orders", 0)].into());
                j
            },
            {
                let mut j = join("a", &["orders"]);
                j.member_id = "x".repeat(cluster::MAX_ID_LEN + 1);
                j
            },
        ];
        for hb in cases {
            assert!(matches!(
                g.heartbeat(hb, 0),
                Err(ConsumerGroupError::InvalidRequest(_))
            ));
        }
        let mut j = join("a", &["orders"]);
        j.server_assignor = Some("sticky".into());
        assert_eq!(
            g.heartbeat(j, 0),
            Err(ConsumerGroupError::UnsupportedAssignor("sticky".into()))
        );
        assert!(g.is_empty());
        assert_eq!(g.group_epoch(), 0);
    }

    #[test]
    fn a_regex_subscription_matches_whole_topic_names() {
        let mut g = ConsumerGroup::new("g", topics());
        let mut j = join("a", &[]);
        j.subscribed_topic_names = Some(vec![]);
        j.subscribed_topic_regex = Some("ord.*".into());
        let got = g.heartbeat(j, 0).unwrap().assignment.unwrap();
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|t| t.topic == "orders"));
    }

    #[test]
    fn assignors_give_every_partition_once_balanced_and_uniform_is_sticky() {
        let subs = |ms: &[&str]| -> BTreeMap<String, BTreeSet<String>> {
            ms.iter()
                .map(|m| {
                    (
                        m.to_string(),
                        ["orders".to_string(), "audit".to_string()].into(),
                    )
                })
                .collect()
        };
        for assignor in ASSIGNORS {
            for members in [
                &["a"][..],
                &["a", "b"],
                &["a", "b", "c"],
                &["a", "b", "c", "d", "e", "f", "g"],
            ] {
                let out = assign(assignor, &subs(members), &topics(), &BTreeMap::new());
                let all: Vec<_> = out.values().flatten().collect();
                assert_eq!(all.len(), 6, "{assignor} {members:?}");
                assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 6);
                if assignor == "uniform" {
                    let loads: Vec<usize> = out.values().map(BTreeSet::len).collect();
                    assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1);
                }
            }
        }
        let two = assign("uniform", &subs(&["a", "b"]), &topics(), &BTreeMap::new());
        let three = assign("uniform", &subs(&["a", "b", "c"]), &topics(), &two);
        // A third member takes only what it needs: a and b each keep two of their three.
        for m in ["a", "b"] {
            assert_eq!(three[m].intersection(&two[m]).count(), 2);
        }
    }

    #[test]
    fn partitions_are_never_held_twice_through_joins_and_leaves() {
        let mut g = ConsumerGroup::new("g", topics());
        let mut now = 0;
        for round in 0..6 {
            let id = format!("m{round}");
            g.heartbeat(join(&id, &["orders", "audit"]), now).unwrap();
            assert_no_double_ownership(&g);
            settle(&mut g, now);
            now += 10;
            if round % 2 == 1 {
                let leave = Heartbeat {
                    member_id: format!("m{}", round - 1),
                    member_epoch: LEAVE_EPOCH,
                    ..Default::default()
                };
                g.heartbeat(leave, now).unwrap();
                settle(&mut g, now);
            }
            let held: usize = g.members().map(|m| m.assigned.len()).sum();
            assert_eq!(held, 6, "round {round}: every partition held once settled");
            assert_eq!(g.state_name(), "Stable");
        }
    }

    /// Kafka's `group.consumer.max.size`: a group of 2 takes no third member, and the refused
    /// join changes nothing; a member joining again, or a static member's next instance
    /// replacing it, adds none; a place freed by a leave is taken.
    #[test]
    fn a_full_consumer_group_takes_no_new_member() {
        let mut g = ConsumerGroup::new("g", topics()).with_max_size(2);
        let mut a = join("a", &["orders"]);
        a.instance_id = Some("i-a".into());
        g.heartbeat(a.clone(), 0).unwrap();
        g.heartbeat(join("b", &["orders"]), 1).unwrap();
        settle(&mut g, 2);
        let before = g.state();
        assert_eq!(
            g.heartbeat(join("c", &["orders"]), 3),
            Err(ConsumerGroupError::GroupMaxSizeReached(2))
        );
        assert_eq!(g.state(), before, "a refused join changes nothing");
        // A's temporary leave, then its next instance under a new member id.
        let held = g.members().find(|m| m.id == "a").unwrap().assigned.clone();
        let mut away = beat("a", g.group_epoch(), &held);
        away.member_epoch = STATIC_LEAVE_EPOCH;
        away.instance_id = Some("i-a".into());
        g.heartbeat(away, 4).unwrap();
        let mut a2 = a.clone();
        a2.member_id = "a2".into();
        g.heartbeat(a2, 5).unwrap();
        g.heartbeat(join("b", &["orders"]), 6).unwrap();
        assert_eq!(g.members().count(), 2);
        let mut leave = beat("b", 0, &BTreeSet::new());
        leave.member_epoch = LEAVE_EPOCH;
        g.heartbeat(leave, 7).unwrap();
        g.heartbeat(join("c", &["orders"]), 8).unwrap();
        assert_eq!(g.members().count(), 2);
    }
}
