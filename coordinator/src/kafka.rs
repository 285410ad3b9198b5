//! The coordinator's Kafka face: the transactional APIs and group offsets, decoded with
//! `kafka-protocol` and answered by calling the service's rooms in-process (`service/local.rs`) (the same
//! input checks, routing, per-id locks, [`crate::core`] rules, durable writes and markers), then
//! encoded. Errors go through the one mapping ([`crate::error_code`], then
//! `kafka_wire::codes::kafka_code`), except a storage failure: NOT_COORDINATOR, as Kafka's
//! coordinators answer it (see `face_code`).
//!
//! Transaction version: Kafka clients that do not implement KIP-890 part 2 (librdkafka,
//! kafka-python: no EndTxn v5) are on transaction version 1, so this face sends InitProducerId
//! with version 1 and the coordinator records it for the id; its EndTxn then keeps the epoch
//! and its markers carry it ([`crate::core::end_txn_v1`], PROTOCOL.md section 6). EndTxn is
//! capped at v4 and InitProducerId at v4 accordingly.
//!
//! | API                  | versions | notes |
//! |----------------------|----------|-------|
//! | InitProducerId       | 0-4      | v3+: the KIP-360 expected (PID, epoch) |
//! | AddPartitionsToTxn   | 0-3      | v4+ is the broker-to-broker batched form |
//! | AddOffsetsToTxn      | 0-3      | |
//! | TxnOffsetCommit      | 0-3      | v3: generation and member id (KIP-447) |
//! | EndTxn               | 0-4      | v5 is transaction version 2 |
//! | OffsetFetch          | 1-9      | v7: require_stable (KIP-447); v8: batched groups; v9: KIP-848 member epoch |
//! | ListTransactions     | 0-1      | |
//! | DescribeTransactions | 0        | |
//! | OffsetCommit         | 2-9      | outside transactions; checked against the membership (v9: member epochs) |
//! | JoinGroup            | 0-7      | v4+: MEMBER_ID_REQUIRED first (KIP-394) |
//! | SyncGroup            | 0-5      | |
//! | Heartbeat            | 0-4      | |
//! | LeaveGroup           | 0-4      | v3+: batched members |
//! | ListGroups           | 0-5      | v4: states filter; v5: types filter (KIP-848) |
//! | DescribeGroups       | 0-5      | v6+ adds error messages (KIP-1043) |
//! | DeleteGroups         | 0-2      | decided by [`crate::group_admin`] |
//! | OffsetDelete         | 0        | KIP-496; decided by [`crate::group_admin`] |
//! | ConsumerGroupHeartbeat | 0-1    | KIP-848; decided by [`crate::consumer_protocol`] |
//! | ConsumerGroupDescribe | 0-1     | KIP-848 groups; any other group is GROUP_ID_NOT_FOUND |
//!
//! KIP-848 consumer groups ([`crate::consumer_protocol`]) live in this face too, one
//! [`ConsumerGroup`] per group in a map behind one lock (a heartbeat is decided without I/O and
//! nothing waits: the member learns what changed on its next heartbeat); an Empty one is
//! dropped at once. Their commits are checked by member epoch (STALE_MEMBER_EPOCH).
//!
//! Classic consumer groups: membership ([`crate::consumer_groups`]) lives in this face, one
//! [`GroupMembership`] per group behind a lock, in memory. JoinGroup and SyncGroup are parked
//! until the core has their answer (woken on every change of the group, and re-checked every
//! 100 ms so a deadline or an expired session is noticed); every group request first lets the
//! core expire silent members. Every membership hands out member ids of its own life
//! (`<client id>-<node>.<coordinator generation>.<n>-<m>`), so a zombie member from before a
//! coordinator restart, or from before its idle group was dropped, never holds a live member's
//! id. Idle groups (Empty, nobody waiting, no request on them) are dropped every minute (a
//! timer, and any group request once the last sweep is a minute old), so memberships do not
//! pile up; their offsets are stored apart and stay. Every group request, TxnOffsetCommit
//! included, is first NOT_COORDINATOR on a node that does not coordinate the group and
//! COORDINATOR_LOAD_IN_PROGRESS before the state is loaded (the listener serves from the
//! start), before any membership is looked at or created. KIP-447: a TxnOffsetCommit (v3) or an
//! OffsetCommit that names a member and generation is checked against the group first: an
//! older generation is ILLEGAL_GENERATION, an unknown member UNKNOWN_MEMBER_ID, another static
//! instance FENCED_INSTANCE_ID, and nothing is recorded. An accepted TxnOffsetCommit leaves its
//! partitions pending ([`crate::core::PendingTxnOffsets`], durable before the commit is handed
//! on, so a restart keeps them) until the transaction's marker for
//! the group is applied; an OffsetFetch v7 with require_stable gets UNSTABLE_OFFSET_COMMIT for
//! a pending partition (the client retries), so a consumer taking a partition over never
//! starts from the offset before a transaction that already committed.
//!
//! Choices: AddPartitionsToTxn answers every partition of the request with the one error the
//! core returns (it adds all or nothing), as Kafka does for a request-level failure; an
//! unknown partition is UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED.
//! TxnOffsetCommit answers every partition with the request's error too.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{
    TopicData, TransactionState as DescribedState,
};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedState;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse,
    ListTransactionsRequest, ListTransactionsResponse, OffsetFetchRequest, OffsetFetchResponse,
    ProducerId, RequestKind, ResponseKind, TopicName, TransactionalId, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use kafka_wire::{codes, str_bytes, ApiRange, Handler, Request};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment, TopicPartitions as HeartbeatTopicPartitions,
};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
};
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    SyncGroupRequest, SyncGroupResponse,
};

use crate::consumer_groups::{
    ClassicGroupRecord, CommitKind, GroupError, GroupMembership, JoinRequest,
};
use crate::consumer_protocol::{ConsumerGroup, ConsumerGroupError, GroupState, Heartbeat};
use crate::core::TransactionVersion;
use crate::error_code;
use crate::group_admin::{self, AdminError, Membership};
use crate::service::LocalService;
use crate::storage::GroupProtocol;
use crate::Error;
use cluster::TopicPartition;

/// The coordinator's [`Handler`].
pub struct KafkaCoordinator {
    service: LocalService,
    groups: Mutex<Groups>,
    /// KIP-848 consumer groups ([`crate::consumer_protocol`]), by group id. Lock order: after
    /// `groups` when both are held.
    consumer_groups: Mutex<HashMap<String, ConsumerGroup>>,
    /// Memberships created so far: with the node's incarnation, what makes each membership's
    /// member ids its own ([`GroupMembership::with_incarnation`]).
    lives: AtomicU64,
}

/// The groups this face knows, and when idle ones were last dropped.
struct Groups {
    slots: HashMap<String, Arc<GroupSlot>>,
    swept: Instant,
}

/// How often idle groups are dropped (by a timer, and by a group request that finds the last
/// sweep this old).
const IDLE_GROUP_SWEEP: Duration = Duration::from_secs(60);

/// Drops the groups that are idle ([`GroupMembership::is_idle`], after expiring silent
/// members) and that no request holds (only the map refers to the slot; a request gets a
/// slot only through the map, under its lock, which the caller holds). A dropped group
/// starts over at generation 0 with member ids of a new life; its offsets are stored apart and
/// stay. Returns how many were dropped.
fn drop_idle_groups(slots: &mut HashMap<String, Arc<GroupSlot>>, now_ms: i64) -> usize {
    let before = slots.len();
    slots.retain(|_, slot| {
        if Arc::strong_count(slot) > 1 {
            return true;
        }
        let mut g = slot.lock();
        g.tick(now_ms);
        !g.is_idle()
    });
    before - slots.len()
}

/// What ListGroups shows of a group.
struct GroupSummary {
    /// "classic" or "consumer"; `None` for a group known only by its offsets.
    group_type: Option<&'static str>,
    state: &'static str,
    protocol_type: String,
    members: usize,
}

/// One group's membership and the wake-up of its parked requests.
struct GroupSlot {
    membership: Mutex<GroupMembership>,
    changed: tokio::sync::Notify,
}

impl GroupSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, GroupMembership> {
        self.membership
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs `f` on the group in `slot` after expiring its silent members, then wakes its parked
/// requests (the group may have changed).
fn on_slot<T>(
    group_id: &str,
    slot: &GroupSlot,
    f: impl FnOnce(&mut GroupMembership, i64) -> T,
) -> T {
    let now = cluster::node::now_ms();
    let result = {
        let mut g = slot.lock();
        let expired = g.tick(now);
        if !expired.is_empty() {
            tracing::info!(group = group_id, ?expired, "group members expired");
        }
        f(&mut g, now)
    };
    slot.changed.notify_waiters();
    result
}

/// Who sent a JoinGroup or a ConsumerGroupHeartbeat: its client id (the header's) and its
/// address, as DescribeGroups and ConsumerGroupDescribe
/// shows them.
struct Client {
    id: String,
    host: String,
}

impl Client {
    /// The sender of a request with `header`, from `peer`.
    fn of(header: &kafka_protocol::messages::RequestHeader, peer: Option<SocketAddr>) -> Self {
        Self {
            id: header
                .client_id
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_default(),
            host: peer.map(|p| format!("/{}", p.ip())).unwrap_or_default(),
        }
    }
}

/// How often a parked JoinGroup/SyncGroup re-checks its group.
const PARK_RECHECK: Duration = Duration::from_millis(100);

impl KafkaCoordinator {
    /// The Kafka face of a coordinator's service.
    pub(crate) fn new(service: LocalService) -> Self {
        Self {
            service,
            groups: Mutex::new(Groups {
                slots: HashMap::new(),
                swept: Instant::now(),
            }),
            consumer_groups: Mutex::new(HashMap::new()),
            lives: AtomicU64::new(0),
        }
    }

    fn groups(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn consumer_groups(&self) -> std::sync::MutexGuard<'_, HashMap<String, ConsumerGroup>> {
        self.consumer_groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the KIP-848 group `group_id` if this face holds it, after expiring its
    /// silent members. What the expiry changed is stored by the group's next heartbeat or the
    /// next sweep, which also drops the group once it is Empty (its offsets are stored apart and
    /// stay; a member of its past is unknown to any later one).
    fn on_consumer_group<T>(
        &self,
        group_id: &str,
        f: impl FnOnce(&mut ConsumerGroup) -> T,
    ) -> Option<T> {
        let mut groups = self.consumer_groups();
        let group = groups.get_mut(group_id)?;
        let expired = group.tick(cluster::node::now_ms());
        if !expired.is_empty() {
            tracing::info!(group = group_id, ?expired, "consumer group members removed");
        }
        Some(f(group))
    }

    /// Expires the silent members of every KIP-848 group this face holds, stores what that
    /// changed, and drops (from memory and storage) the groups left Empty.
    async fn sweep_consumer_groups(&self) {
        let ids: Vec<String> = self.consumer_groups().keys().cloned().collect();
        for group_id in ids {
            if let Err(e) = self.sweep_consumer_group(&group_id).await {
                tracing::debug!(group = %group_id, "consumer group not swept: {e}");
            }
        }
    }

    /// Expires the silent members of the KIP-848 group `group_id`, if this face holds it, and
    /// stores what that changed (its removal, from memory too, once it is Empty).
    async fn sweep_consumer_group(&self, group_id: &str) -> Result<(), Error> {
        self.service
            .group_state_change(
                GroupProtocol::Consumer,
                group_id.to_string(),
                || {
                    let mut groups = self.consumer_groups();
                    let Some(group) = groups.get_mut(group_id) else {
                        return (None, ());
                    };
                    let before = group.state();
                    let expired = group.tick(cluster::node::now_ms());
                    if !expired.is_empty() {
                        tracing::info!(group = %group_id, ?expired, "consumer group members removed");
                    }
                    (change_to_store(&mut groups, group_id, before), ())
                },
                |_| {},
            )
            .await
    }

    /// Restores every stored group this coordinator serves, of both protocols, at start, once
    /// the transaction state is loaded and before the node serves (its group requests are
    /// COORDINATOR_LOAD_IN_PROGRESS until then, as Kafka's while it loads
    /// `__consumer_offsets`): describes, commits, protocol checks and heartbeats all see the
    /// groups as they were. A stored state that cannot be read is logged and left out (its
    /// members rejoin). Fails only if storage cannot be read.
    pub(crate) async fn restore_groups(&self) -> Result<(), Error> {
        let topics = topic_sizes(self.service.topology());
        let consumer = self
            .service
            .restore_group_states(GroupProtocol::Consumer, |group_id, bytes| {
                let mut groups = self.consumer_groups();
                if groups.contains_key(group_id) {
                    return;
                }
                if let Some(group) = self.restored_group(group_id, topics.clone(), &bytes) {
                    groups.insert(group_id.to_string(), group);
                }
            })
            .await?;
        let classic = self
            .service
            .restore_group_states(GroupProtocol::Classic, |group_id, bytes| {
                let Some(record) = stored_classic_record(group_id, &bytes) else {
                    return;
                };
                let mut groups = self.groups();
                if groups.slots.contains_key(group_id) {
                    return;
                }
                let membership = GroupMembership::restore(
                    group_id,
                    self.service.group_initial_rebalance_delay_ms(),
                    record,
                    cluster::node::now_ms(),
                );
                let slot = self.new_slot(membership);
                groups.slots.insert(group_id.to_string(), slot);
            })
            .await?;
        tracing::info!(
            consumer_groups = consumer,
            classic_groups = classic,
            "consumer groups restored"
        );
        Ok(())
    }

    /// A KIP-848 group from its stored state (`None`, logged, if the state cannot be read),
    /// with this coordinator's timeouts and a new life for the member ids it hands out.
    fn restored_group(
        &self,
        group_id: &str,
        topics: std::collections::BTreeMap<String, i32>,
        bytes: &[u8],
    ) -> Option<ConsumerGroup> {
        let state = stored_group_state(group_id, bytes)?;
        let now = cluster::node::now_ms();
        Some(self.with_settings(ConsumerGroup::restore(group_id, topics, state, now)))
    }

    /// `group` with this coordinator's KIP-848 timeouts and size limit, and a new life for its
    /// member ids.
    fn with_settings(&self, group: ConsumerGroup) -> ConsumerGroup {
        let (interval, session) = self.service.group_consumer_timeouts_ms();
        let life = self.lives.fetch_add(1, Ordering::Relaxed) + 1;
        group
            .with_timeouts(session, interval)
            .with_max_size(self.service.group_max_sizes().1)
            .with_incarnation(&format!("{}.{life}", self.service.incarnation()))
    }

    /// Drops idle groups every [`IDLE_GROUP_SWEEP`] until the coordinator stops (a group
    /// request also does, when the last sweep is that old).
    pub(crate) async fn drop_idle_groups_periodically(&self) {
        let mut stopping = self.service.stopping();
        loop {
            tokio::select! {
                _ = stopping.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(IDLE_GROUP_SWEEP) => {}
            }
            self.settle_classic_groups().await;
            self.sweep(&mut self.groups());
            self.sweep_consumer_groups().await;
        }
    }

    /// Drops the idle groups now (see [`drop_idle_groups`]).
    fn sweep(&self, groups: &mut Groups) {
        groups.swept = Instant::now();
        let dropped = drop_idle_groups(&mut groups.slots, cluster::node::now_ms());
        if dropped > 0 {
            tracing::debug!(dropped, "idle consumer groups dropped");
        }
    }

    /// The group's slot, created Empty if unknown (with member ids of a new life); idle groups
    /// are dropped first when the last sweep is [`IDLE_GROUP_SWEEP`] old.
    fn group(&self, group_id: &str) -> Arc<GroupSlot> {
        let mut groups = self.groups();
        if groups.swept.elapsed() >= IDLE_GROUP_SWEEP {
            self.sweep(&mut groups);
        }
        groups
            .slots
            .entry(group_id.to_string())
            .or_insert_with(|| {
                self.new_slot(GroupMembership::with_initial_delay(
                    group_id,
                    self.service.group_initial_rebalance_delay_ms(),
                ))
            })
            .clone()
    }

    /// A slot for `membership`, with this coordinator's size limit, whose member ids will be
    /// of a new life.
    fn new_slot(&self, membership: GroupMembership) -> Arc<GroupSlot> {
        let life = self.lives.fetch_add(1, Ordering::Relaxed) + 1;
        let incarnation = format!("{}.{life}", self.service.incarnation());
        let membership = membership
            .with_incarnation(&incarnation)
            .with_max_size(self.service.group_max_sizes().0);
        Arc::new(GroupSlot {
            membership: Mutex::new(membership),
            changed: tokio::sync::Notify::new(),
        })
    }

    /// Makes the classic group `group_id` durable as it is now, when storage does not hold
    /// that already ([`GroupMembership::to_store`]: a new Stable generation, a static member
    /// replaced in place, an Empty group's removal), before an answer that shows it goes out;
    /// under the group's write lock, so that the group's writes reach storage in order and
    /// what the group believes storage holds is what it holds.
    async fn settle(&self, group_id: &str) -> Result<(), Error> {
        let Some(slot) = self.groups().slots.get(group_id).cloned() else {
            return Ok(());
        };
        if slot.lock().to_store().is_none() {
            return Ok(());
        }
        self.service
            .group_state_change(
                GroupProtocol::Classic,
                group_id.to_string(),
                || {
                    let Some(record) = slot.lock().to_store() else {
                        return (None, None);
                    };
                    let bytes = record
                        .as_ref()
                        .map(|r| serde_json::to_vec(r).expect("a group record serializes"));
                    (Some(bytes), Some(record))
                },
                |record| {
                    if let Some(record) = record {
                        slot.lock().stored(record.clone());
                    }
                },
            )
            .await?;
        Ok(())
    }

    /// Expires the silent members of every classic group this face holds and stores what
    /// that changed (the removal of the groups left Empty, which are then idle).
    async fn settle_classic_groups(&self) {
        for (group_id, _) in self.known_groups() {
            if let Err(e) = self.expire_and_settle(&group_id).await {
                tracing::debug!(group = %group_id, "classic group not stored: {e}");
            }
        }
    }

    /// Expires the silent members of the classic group `group_id`, if this face holds it, and
    /// stores what that changed ([`KafkaCoordinator::settle`]): an admin request then sees an
    /// Empty group as idle.
    async fn expire_and_settle(&self, group_id: &str) -> Result<(), Error> {
        let slot = self.groups().slots.get(group_id).cloned();
        if let Some(slot) = slot {
            on_slot(group_id, &slot, |_, _| ());
        }
        self.settle(group_id).await
    }

    /// INVALID_GROUP_ID for an empty id, NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS if this
    /// node does not serve the group now.
    fn check_group(&self, group_id: &str) -> Result<(), i16> {
        if group_id.is_empty() || group_id.len() > cluster::MAX_ID_LEN {
            return Err(ResponseError::InvalidGroupId.code());
        }
        self.service
            .check_owner(group_id)
            .map_err(|e| kafka_error(&e))
    }

    /// Runs `f` on the group (after expiring silent members) and wakes its parked requests.
    fn with_group<T>(&self, group_id: &str, f: impl FnOnce(&mut GroupMembership, i64) -> T) -> T {
        on_slot(group_id, &self.group(group_id), f)
    }

    /// The groups this face holds now, with their slots (none created).
    fn known_groups(&self) -> Vec<(String, Arc<GroupSlot>)> {
        self.groups()
            .slots
            .iter()
            .map(|(id, slot)| (id.clone(), slot.clone()))
            .collect()
    }

    /// Runs `decide` on what this face holds of `group_id`'s membership (DeleteGroups,
    /// OffsetDelete: [`group_admin::Membership`]), with the groups' map locked so that nobody
    /// gets the group's slot meanwhile; an idle membership is dropped when `decide` says so
    /// (its group was deleted). A membership some request holds is at work: Active.
    fn on_admin_membership<T>(
        &self,
        group_id: &str,
        decide: impl FnOnce(&Membership) -> (T, bool),
    ) -> T {
        let mut groups = self.groups();
        let kip848 =
            self.on_consumer_group(group_id, |g| (!g.is_empty()).then(|| g.subscribed_topics()));
        if let Some(Some(subscribed)) = kip848 {
            let membership = Membership::Active {
                consumer: true,
                subscribed: Some(subscribed),
            };
            return decide(&membership).0;
        }
        let membership = match groups.slots.get(group_id) {
            None => Membership::None,
            Some(slot) => {
                let (idle, consumer, subscribed) = on_slot(group_id, slot, |g, _| {
                    let consumer = g.protocol_type() == "consumer";
                    let subscribed = consumer
                        .then(|| group_admin::subscribed_topics(g.protocol_metadata()))
                        .flatten();
                    (g.is_idle(), consumer, subscribed)
                });
                // Only the map refers to it: no request is at work on it.
                if idle && Arc::strong_count(slot) == 1 {
                    Membership::Idle
                } else {
                    Membership::Active {
                        consumer,
                        subscribed,
                    }
                }
            }
        };
        let (answer, drop_idle) = decide(&membership);
        if drop_idle && membership == Membership::Idle {
            groups.slots.remove(group_id);
        }
        answer
    }

    /// Parks until `poll` has an answer or `wait` passed (`None`).
    async fn park<T>(
        &self,
        group_id: &str,
        wait: Duration,
        mut poll: impl FnMut(&mut GroupMembership) -> Option<T>,
    ) -> Option<T> {
        let slot = self.group(group_id);
        let deadline = tokio::time::Instant::now() + wait;
        let mut stopping = self.service.stopping();
        loop {
            let notified = slot.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let answer = {
                let mut g = slot.lock();
                g.tick(cluster::node::now_ms());
                poll(&mut g)
            };
            if let Some(answer) = answer {
                slot.changed.notify_waiters();
                return Some(answer);
            }
            if tokio::time::Instant::now() >= deadline || *stopping.borrow() {
                return None;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(PARK_RECHECK) => {}
                _ = stopping.changed() => {}
            }
        }
    }
}

impl KafkaCoordinator {
    /// A JoinGroup's or SyncGroup's answer, once the group is durable as the answer shows it
    /// ([`KafkaCoordinator::settle`]); the error code of the write instead if it failed (the
    /// member retries or rejoins).
    async fn settled<T>(
        &self,
        group_id: &str,
        answer: Option<Result<T, GroupError>>,
    ) -> Option<Result<T, i16>> {
        match answer? {
            Err(e) => Some(Err(group_code(&e))),
            Ok(answer) => match self.settle(group_id).await {
                Ok(()) => Some(Ok(answer)),
                Err(e) => {
                    tracing::warn!(group = %group_id, "group not stored, answer withheld: {e}");
                    Some(Err(kafka_error(&e)))
                }
            },
        }
    }
}

/// What to store after a change of the KIP-848 group `group_id`, which was `before`: nothing if
/// its state is unchanged, its new state (JSON), or, when it is Empty now, its removal (from
/// `groups` too; nothing to store if it had no members before either: a refused first join).
fn change_to_store(
    groups: &mut HashMap<String, ConsumerGroup>,
    group_id: &str,
    before: GroupState,
) -> Option<Option<Vec<u8>>> {
    let group = groups.get(group_id)?;
    if group.is_empty() {
        groups.remove(group_id);
        return (!before.members.is_empty()).then_some(None);
    }
    let after = group.state();
    (after != before).then(|| Some(serde_json::to_vec(&after).expect("a group state serializes")))
}

/// A KIP-848 group's stored state, read back; `None` (logged) if the bytes are not one: the
/// group is then not restored and its members rejoin.
fn stored_group_state(group_id: &str, bytes: &[u8]) -> Option<GroupState> {
    serde_json::from_slice::<GroupState>(bytes)
        .map_err(|e| {
            tracing::error!(group = %group_id, "stored consumer group state unreadable, ignored: {e}");
        })
        .ok()
}

/// A classic group's stored record, read back; `None` (logged) if the bytes are not one: the
/// group is then not restored and its members rejoin.
fn stored_classic_record(group_id: &str, bytes: &[u8]) -> Option<ClassicGroupRecord> {
    serde_json::from_slice::<ClassicGroupRecord>(bytes)
        .map_err(|e| {
            tracing::error!(group = %group_id, "stored classic group record unreadable, ignored: {e}");
        })
        .ok()
}

/// The topology's topics and their partition counts, as KIP-848 groups take them.
fn topic_sizes(topology: &cluster::Topology) -> std::collections::BTreeMap<String, i32> {
    topology
        .topics
        .iter()
        .map(|t| (t.name.clone(), t.leaders.len() as i32))
        .collect()
}

/// Kafka's code for a group decision.
fn group_code(e: &GroupError) -> i16 {
    match e {
        GroupError::UnknownMemberId(_) => ResponseError::UnknownMemberId,
        GroupError::IllegalGeneration { .. } => ResponseError::IllegalGeneration,
        GroupError::RebalanceInProgress => ResponseError::RebalanceInProgress,
        GroupError::InconsistentGroupProtocol(_) => ResponseError::InconsistentGroupProtocol,
        GroupError::MemberIdRequired(_) => ResponseError::MemberIdRequired,
        GroupError::FencedInstanceId(_) => ResponseError::FencedInstanceId,
        GroupError::InvalidSessionTimeout(_) => ResponseError::InvalidSessionTimeout,
        GroupError::GroupMaxSizeReached(_) => ResponseError::GroupMaxSizeReached,
    }
    .code()
}

/// `partitions` grouped by topic, as KIP-848's assignments carry them.
fn by_topic(
    partitions: &std::collections::BTreeSet<TopicPartition>,
) -> std::collections::BTreeMap<&str, Vec<i32>> {
    let mut grouped: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for tp in partitions {
        grouped.entry(&tp.topic).or_default().push(tp.partition);
    }
    grouped
}

/// A topic's id (the topology's), as Kafka's protocol carries it.
fn topic_uuid(topology: &cluster::Topology, topic: &str) -> Option<uuid::Uuid> {
    topology.topic_id(topic).map(uuid::Uuid::from_bytes)
}

/// The name of the topic with id `id`, if there is one.
fn topic_name_by_id(topology: &cluster::Topology, id: &uuid::Uuid) -> Option<String> {
    topology.topic_by_id(id.as_bytes()).map(|t| t.name.clone())
}

/// Kafka's code for a refused ConsumerGroupHeartbeat or a commit a KIP-848 group refused.
fn consumer_code(e: &ConsumerGroupError) -> i16 {
    match e {
        ConsumerGroupError::InvalidRequest(_) => ResponseError::InvalidRequest,
        ConsumerGroupError::UnknownMemberId(_) => ResponseError::UnknownMemberId,
        ConsumerGroupError::FencedMemberEpoch { .. } => ResponseError::FencedMemberEpoch,
        ConsumerGroupError::StaleMemberEpoch { .. } => ResponseError::StaleMemberEpoch,
        ConsumerGroupError::UnsupportedAssignor(_) => ResponseError::UnsupportedAssignor,
        ConsumerGroupError::UnreleasedInstanceId(_) => ResponseError::UnreleasedInstanceId,
        ConsumerGroupError::FencedInstanceId(_) => ResponseError::FencedInstanceId,
        ConsumerGroupError::UnsupportedVersion => ResponseError::UnsupportedVersion,
        ConsumerGroupError::GroupMaxSizeReached(_) => ResponseError::GroupMaxSizeReached,
    }
    .code()
}

/// Kafka's code for a refused DeleteGroups or OffsetDelete.
fn admin_code(e: &AdminError) -> i16 {
    match e {
        AdminError::GroupIdNotFound(_) => ResponseError::GroupIdNotFound,
        AdminError::NonEmptyGroup { .. } => ResponseError::NonEmptyGroup,
        AdminError::GroupSubscribedToTopic(_) => ResponseError::GroupSubscribedToTopic,
        AdminError::PendingTransaction(_) => ResponseError::ConcurrentTransactions,
        AdminError::UnknownTopicOrPartition(_) => ResponseError::UnknownTopicOrPartition,
    }
    .code()
}

/// The Kafka code this face answers for one of our codes: the one mapping
/// (`kafka_wire::codes::kafka_code`), except a storage failure, answered NOT_COORDINATOR as
/// Kafka's own coordinators answer a failed write of their logs (its TransactionStateManager
/// and GroupMetadataManager). Every client retries that with the same request, so an EndTxn
/// keeps its decision; librdkafka turns KAFKA_STORAGE_ERROR from EndTxn into an abortable error,
/// and a commit that the coordinator may still complete after its restart would be reported to
/// the application as failed, to be aborted and produced again.
fn face_code(code: proto::ErrorCode) -> i16 {
    match code {
        proto::ErrorCode::KafkaStorageError => ResponseError::NotCoordinator.code(),
        other => codes::kafka_code(other),
    }
}

/// PRODUCER_FENCED (KIP-588) as a client on an older version of the request knows it:
/// INVALID_PRODUCER_EPOCH below `since`, the first version that may carry it, as Kafka answers
/// (InitProducerId v4, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn v2). Fatal either way.
fn fenced_as_known(code: i16, version: i16, since: i16) -> i16 {
    if code == ResponseError::ProducerFenced.code() && version < since {
        ResponseError::InvalidProducerEpoch.code()
    } else {
        code
    }
}

/// [`face_code`] of a raw `error_code` field (an unknown value is UNKNOWN_SERVER_ERROR).
fn face_code_of(raw: i32) -> i16 {
    face_code(codes::error_code_of(raw))
}

/// The Kafka code of a coordinator error.
fn kafka_error(e: &Error) -> i16 {
    face_code(error_code(e))
}

/// The Kafka code of a unit result.
fn kafka_result<T>(r: &Result<T, Error>) -> i16 {
    r.as_ref().err().map_or(codes::NONE, kafka_error)
}

/// Kafka's name of a transaction state (ListTransactions, DescribeTransactions).
fn state_name(state: i32) -> &'static str {
    match proto::TxnState::try_from(state) {
        Ok(proto::TxnState::Empty) => "Empty",
        Ok(proto::TxnState::Ongoing) => "Ongoing",
        Ok(proto::TxnState::PrepareCommit) => "PrepareCommit",
        Ok(proto::TxnState::PrepareAbort) => "PrepareAbort",
        Ok(proto::TxnState::CompleteCommit) => "CompleteCommit",
        Ok(proto::TxnState::CompleteAbort) => "CompleteAbort",
        Err(_) => "Unknown",
    }
}

/// Tells the group, when dropped unanswered, that a parked SyncGroup ended without reading
/// its answer ([`GroupMembership::sync_abandoned`]).
struct SyncAbandoned<'a> {
    face: &'a KafkaCoordinator,
    group_id: &'a str,
    member_id: &'a str,
    answered: bool,
}

impl Drop for SyncAbandoned<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.face.with_group(self.group_id, |g, now| {
                g.sync_abandoned(self.member_id, now)
            });
        }
    }
}

impl Handler for KafkaCoordinator {
    fn apis(&self) -> Vec<ApiRange> {
        kafka_wire::apis::COORDINATOR_APIS.to_vec()
    }

    fn broker_configs(&self) -> Vec<kafka_wire::configs::ConfigEntry> {
        self.service.broker_configs()
    }

    async fn handle(&self, request: Request) -> kafka_wire::Result<Option<ResponseKind>> {
        let version = request.version;
        let response = match request.body {
            RequestKind::InitProducerId(r) => {
                let mut response = self.init_producer_id(r).await;
                response.error_code = fenced_as_known(response.error_code, version, 4);
                ResponseKind::InitProducerId(response)
            }
            RequestKind::AddPartitionsToTxn(r) => {
                let mut response = self.add_partitions(r).await;
                for t in &mut response.results_by_topic_v3_and_below {
                    for p in &mut t.results_by_partition {
                        p.partition_error_code =
                            fenced_as_known(p.partition_error_code, version, 2);
                    }
                }
                ResponseKind::AddPartitionsToTxn(response)
            }
            RequestKind::AddOffsetsToTxn(r) => {
                let mut response = self.add_offsets(r).await;
                response.error_code = fenced_as_known(response.error_code, version, 2);
                ResponseKind::AddOffsetsToTxn(response)
            }
            RequestKind::TxnOffsetCommit(r) => {
                ResponseKind::TxnOffsetCommit(self.txn_offset_commit(r).await)
            }
            RequestKind::EndTxn(r) => {
                let mut response = self.end_txn(r).await;
                response.error_code = fenced_as_known(response.error_code, version, 2);
                ResponseKind::EndTxn(response)
            }
            RequestKind::OffsetFetch(r) => {
                ResponseKind::OffsetFetch(self.offset_fetch(r, version).await)
            }
            RequestKind::ListTransactions(r) => {
                ResponseKind::ListTransactions(self.list_transactions(r).await)
            }
            RequestKind::DescribeTransactions(r) => {
                ResponseKind::DescribeTransactions(self.describe_transactions(r).await)
            }
            RequestKind::OffsetCommit(r) => {
                ResponseKind::OffsetCommit(self.offset_commit(r, version).await)
            }
            RequestKind::ConsumerGroupHeartbeat(r) => {
                let client = Client::of(&request.header, request.peer);
                ResponseKind::ConsumerGroupHeartbeat(
                    self.consumer_group_heartbeat(r, version, client).await,
                )
            }
            RequestKind::ConsumerGroupDescribe(r) => {
                ResponseKind::ConsumerGroupDescribe(self.consumer_group_describe(r, version))
            }
            RequestKind::JoinGroup(r) => {
                let client = Client::of(&request.header, request.peer);
                ResponseKind::JoinGroup(self.join_group(r, version, client).await)
            }
            RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(self.sync_group(r, version).await),
            RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(self.heartbeat(r)),
            RequestKind::LeaveGroup(r) => {
                ResponseKind::LeaveGroup(self.leave_group(r, version).await)
            }
            RequestKind::ListGroups(r) => {
                ResponseKind::ListGroups(self.list_groups(r, version).await)
            }
            RequestKind::DeleteGroups(r) => ResponseKind::DeleteGroups(self.delete_groups(r).await),
            RequestKind::OffsetDelete(r) => ResponseKind::OffsetDelete(self.offset_delete(r).await),
            RequestKind::DescribeGroups(r) => {
                ResponseKind::DescribeGroups(self.describe_groups(r, version).await)
            }
            _ => {
                return Err(kafka_wire::Error::Close(format!(
                    "{:?} is not served by a coordinator",
                    request.api_key
                )))
            }
        };
        Ok(Some(response))
    }
}

impl KafkaCoordinator {
    /// KIP-447: a commit that names a member and generation must match the group's. Only after
    /// [`Self::check_group`]: this may create the group's membership.
    fn check_group_commit(
        &self,
        group_id: &str,
        member_id: &str,
        generation: i32,
        instance_id: Option<&str>,
        kind: CommitKind,
        member_epochs: bool,
    ) -> Result<(), i16> {
        // A KIP-848 group: the member's exact epoch (STALE_MEMBER_EPOCH otherwise).
        let transactional = kind == CommitKind::Transactional;
        if let Some(checked) = self.on_consumer_group(group_id, |g| {
            g.check_commit(member_id, generation, transactional, member_epochs)
        }) {
            return checked.map_err(|e| {
                tracing::info!(
                    group = group_id,
                    member_id,
                    member_epoch = generation,
                    "offset commit fenced by the consumer group: {e}"
                );
                consumer_code(&e)
            });
        }
        if generation < 0 && member_id.is_empty() && instance_id.is_none() {
            // Not from a group member (Kafka's "simple" commit): the transaction's checks only.
            let known = self.groups().slots.contains_key(group_id);
            if !known {
                return Ok(());
            }
        }
        self.with_group(group_id, |g, _| {
            g.check_commit(member_id, generation, instance_id, kind)
        })
        .map_err(|e| {
            tracing::info!(
                group = group_id,
                member_id,
                generation,
                "offset commit fenced by the group: {e}"
            );
            group_code(&e)
        })
    }

    async fn offset_commit(&self, r: OffsetCommitRequest, version: i16) -> OffsetCommitResponse {
        let group_id = r.group_id.0.to_string();
        let code = match self.check_group(&group_id).and_then(|()| {
            self.check_group_commit(
                &group_id,
                &r.member_id,
                r.generation_id_or_member_epoch,
                r.group_instance_id.as_deref(),
                CommitKind::Plain,
                version >= 9,
            )
        }) {
            Err(code) => code,
            Ok(()) => {
                let offsets = r
                    .topics
                    .iter()
                    .flat_map(|t| {
                        t.partitions.iter().map(|p| proto::PartitionOffset {
                            topic: t.name.0.to_string(),
                            partition: p.partition_index,
                            offset: p.committed_offset,
                        })
                    })
                    .collect();
                kafka_result(&self.service.offset_commit(group_id, offsets).await)
            }
        };
        let mut response = OffsetCommitResponse::default();
        response.topics = r
            .topics
            .iter()
            .map(|t| {
                let mut topic = OffsetCommitResponseTopic::default();
                topic.name = t.name.clone();
                topic.partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut out = OffsetCommitResponsePartition::default();
                        out.partition_index = p.partition_index;
                        out.error_code = code;
                        out
                    })
                    .collect();
                topic
            })
            .collect();
        response
    }

    /// ConsumerGroupHeartbeat (KIP-848) v0-1: decided by [`ConsumerGroup::heartbeat`] under
    /// the groups' lock, and a heartbeat that changed the group ([`ConsumerGroup::state`]) is
    /// answered once the group's new state is durable, so a restarted coordinator goes on with
    /// the group as its members last heard of it: a group this face does not hold is restored
    /// from storage first (a stored state it cannot read is logged and treated as none: the
    /// members then rejoin). Changes of one group are stored in the order they were made (the
    /// service's per-group write lock). Topic ids are translated to and
    /// from names with the topology's ids; an owned partition of an unknown topic id is left
    /// out. A group id held by a classic group with members is GROUP_ID_NOT_FOUND, as Kafka
    /// answers for a group of the other protocol. From v1 the client makes its member id
    /// (KIP-1082): an empty one is INVALID_REQUEST.
    async fn consumer_group_heartbeat(
        &self,
        r: ConsumerGroupHeartbeatRequest,
        version: i16,
        client: Client,
    ) -> ConsumerGroupHeartbeatResponse {
        let mut response = ConsumerGroupHeartbeatResponse::default();
        let group_id = r.group_id.0.to_string();
        let refuse = |mut response: ConsumerGroupHeartbeatResponse, code: i16, why: String| {
            response.error_code = code;
            response.error_message = Some(str_bytes(why));
            response
        };
        if let Err(code) = self.check_group(&group_id) {
            response.error_code = code;
            return response;
        }
        if version >= 1 && r.member_id.is_empty() {
            let code = ResponseError::InvalidRequest.code();
            return refuse(response, code, "MemberId can't be empty".into());
        }
        let classic = self.groups().slots.get(&group_id).cloned();
        if let Some(slot) = classic {
            if !on_slot(&group_id, &slot, |g, _| g.member_ids().is_empty()) {
                let code = ResponseError::GroupIdNotFound.code();
                return refuse(
                    response,
                    code,
                    format!("group {group_id} is a classic group"),
                );
            }
            // An Empty classic group's record goes before the group id changes protocol: a
            // restart must not bring its members back beside this group's.
            if let Err(e) = self.settle(&group_id).await {
                return refuse(response, kafka_error(&e), e.to_string());
            }
        }
        let topology = self.service.topology();
        let owned = r.topic_partitions.as_ref().map(|topics| {
            topics
                .iter()
                .filter_map(|t| {
                    let name = topic_name_by_id(topology, &t.topic_id)?;
                    Some(
                        t.partitions
                            .iter()
                            .map(move |&p| TopicPartition::new(name.clone(), p)),
                    )
                })
                .flatten()
                .collect()
        });
        let heartbeat = Heartbeat {
            member_id: r.member_id.to_string(),
            member_epoch: r.member_epoch,
            instance_id: r.instance_id.as_ref().map(|i| i.to_string()),
            rebalance_timeout_ms: r.rebalance_timeout_ms,
            subscribed_topic_names: r
                .subscribed_topic_names
                .as_ref()
                .map(|names| names.iter().map(|n| n.0.to_string()).collect()),
            subscribed_topic_regex: r.subscribed_topic_regex.as_ref().map(|x| x.to_string()),
            server_assignor: r.server_assignor.as_ref().map(|a| a.to_string()),
            owned,
            client_id: client.id,
            client_host: client.host,
        };
        let joining = heartbeat.member_epoch == crate::consumer_protocol::JOIN_EPOCH;
        let topics = topic_sizes(topology);
        let changed = self
            .service
            .group_state_change(
                GroupProtocol::Consumer,
                group_id.clone(),
                || {
                    let now = cluster::node::now_ms();
                    let mut groups = self.consumer_groups();
                    if !groups.contains_key(&group_id) {
                        // Every stored group was restored before the node served: one this
                        // face does not hold has nothing stored.
                        if !joining {
                            let e = ConsumerGroupError::UnknownMemberId(heartbeat.member_id);
                            return (None, Err(e));
                        }
                        let group = self.with_settings(ConsumerGroup::new(&group_id, topics));
                        groups.insert(group_id.clone(), group);
                    }
                    let group = groups.get_mut(&group_id).expect("inserted");
                    let before = group.state();
                    let result = group.heartbeat(heartbeat, now);
                    (change_to_store(&mut groups, &group_id, before), result)
                },
                |_| {},
            )
            .await;
        let result = match changed {
            Ok(result) => result,
            Err(e) => {
                tracing::warn!(group = %group_id, "ConsumerGroupHeartbeat not stored: {e}");
                return refuse(response, kafka_error(&e), e.to_string());
            }
        };
        match result {
            Err(e) => {
                tracing::info!(group = %group_id, member = %r.member_id, "ConsumerGroupHeartbeat refused: {e}");
                refuse(response, consumer_code(&e), e.to_string())
            }
            Ok(reply) => {
                if joining {
                    tracing::info!(group = %group_id, member = %reply.member_id,
                                   epoch = reply.member_epoch, "consumer joined (KIP-848)");
                }
                response.member_id = Some(str_bytes(reply.member_id));
                response.member_epoch = reply.member_epoch;
                response.heartbeat_interval_ms = reply.heartbeat_interval_ms;
                response.assignment = reply.assignment.map(|assigned| {
                    let mut assignment = Assignment::default();
                    assignment.topic_partitions = by_topic(&assigned)
                        .into_iter()
                        .filter_map(|(topic, partitions)| {
                            let mut t = HeartbeatTopicPartitions::default();
                            t.topic_id = topic_uuid(topology, topic)?;
                            t.partitions = partitions;
                            Some(t)
                        })
                        .collect();
                    assignment
                });
                response
            }
        }
    }

    /// ConsumerGroupDescribe (KIP-848) v0-1: each KIP-848 group's state, epochs, assignor and
    /// members with their subscriptions, current and target assignments. A group that is not
    /// a KIP-848 group here (a classic one, or unknown) is GROUP_ID_NOT_FOUND, as in Kafka;
    /// admin clients then describe it with DescribeGroups. NOT_COORDINATOR and
    /// COORDINATOR_LOAD_IN_PROGRESS per group as for every group request. Authorized
    /// operations are not computed (no ACLs): `i32::MIN`.
    fn consumer_group_describe(
        &self,
        r: ConsumerGroupDescribeRequest,
        version: i16,
    ) -> ConsumerGroupDescribeResponse {
        use kafka_protocol::messages::consumer_group_describe_response as cgd;
        let topology = self.service.topology();
        let assignment = |partitions: &std::collections::BTreeSet<TopicPartition>| {
            let mut out = cgd::Assignment::default();
            out.topic_partitions = by_topic(partitions)
                .into_iter()
                .filter_map(|(topic, partitions)| {
                    let mut t = cgd::TopicPartitions::default();
                    t.topic_id = topic_uuid(topology, topic)?;
                    t.topic_name = TopicName(str_bytes(topic));
                    t.partitions = partitions;
                    Some(t)
                })
                .collect();
            out
        };
        let mut response = ConsumerGroupDescribeResponse::default();
        for group in r.group_ids {
            let group_id = group.0.to_string();
            let mut out = cgd::DescribedGroup::default();
            out.group_id = group;
            out.authorized_operations = i32::MIN;
            if let Err(code) = self.check_group(&group_id) {
                out.error_code = code;
                response.groups.push(out);
                continue;
            }
            let described = self.on_consumer_group(&group_id, |g| {
                out.group_state = str_bytes(g.state_name());
                out.group_epoch = g.group_epoch();
                out.assignment_epoch = g.target_epoch();
                out.assignor_name = str_bytes(g.assignor());
                out.members = g
                    .members()
                    .map(|m| {
                        let mut member = cgd::Member::default();
                        member.member_id = str_bytes(&m.id);
                        member.instance_id = m.instance_id.as_deref().map(str_bytes);
                        member.member_epoch = m.epoch;
                        member.client_id = str_bytes(&m.client_id);
                        member.client_host = str_bytes(&m.client_host);
                        member.subscribed_topic_names =
                            m.topics.iter().map(|t| TopicName(str_bytes(t))).collect();
                        member.subscribed_topic_regex = m.regex.as_deref().map(str_bytes);
                        member.assignment = assignment(&m.assigned);
                        member.target_assignment = assignment(&g.target_of(&m.id));
                        if version >= 1 {
                            member.member_type = 1;
                        }
                        member
                    })
                    .collect();
            });
            if described.is_none() {
                out.error_code = ResponseError::GroupIdNotFound.code();
                out.error_message = Some(str_bytes(format!(
                    "group {group_id} is not a consumer-protocol group"
                )));
            }
            response.groups.push(out);
        }
        response
    }

    async fn join_group(
        &self,
        r: JoinGroupRequest,
        version: i16,
        client: Client,
    ) -> JoinGroupResponse {
        let mut response = JoinGroupResponse::default();
        response.generation_id = -1;
        let group_id = r.group_id.0.to_string();
        if let Err(code) = self.check_group(&group_id) {
            response.error_code = code;
            return response;
        }
        match self.on_consumer_group(&group_id, |g| !g.is_empty()) {
            Some(true) => {
                // The group's members use KIP-848's protocol; a classic member cannot join them.
                response.error_code = ResponseError::InconsistentGroupProtocol.code();
                return response;
            }
            Some(false) => {
                // An Empty KIP-848 group's state goes before the group id changes protocol.
                if let Err(e) = self.sweep_consumer_group(&group_id).await {
                    response.error_code = kafka_error(&e);
                    return response;
                }
            }
            None => {}
        }
        let rebalance_timeout_ms = if version >= 1 {
            r.rebalance_timeout_ms
        } else {
            r.session_timeout_ms
        };
        let instance = r.group_instance_id.as_ref().map(|i| i.to_string());
        let request = JoinRequest {
            member_id: r.member_id.to_string(),
            group_instance_id: instance.clone(),
            client_id: client.id,
            client_host: client.host,
            require_known_member_id: version >= 4,
            session_timeout_ms: r.session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type: r.protocol_type.to_string(),
            protocols: r
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.to_vec()))
                .collect(),
        };
        let member_id = match self.with_group(&group_id, |g, now| g.join(request, now)) {
            Ok(id) => id,
            Err(e) => {
                if let GroupError::MemberIdRequired(id) = &e {
                    response.member_id = str_bytes(id.clone());
                }
                response.error_code = group_code(&e);
                return response;
            }
        };
        let wait =
            Duration::from_millis(rebalance_timeout_ms.max(0) as u64) + Duration::from_secs(5);
        let answer = self
            .park(&group_id, wait, |g| {
                // Replaced while parked (KIP-345): fenced, so that the old instance does not
                // rejoin as new and replace its replacement in turn.
                if let Err(fenced) = g.fence_instance(&member_id, instance.as_deref()) {
                    return Some(Err(fenced));
                }
                g.join_result(&member_id)
            })
            .await;
        let answer = self.settled(&group_id, answer).await;
        match answer {
            None => response.error_code = ResponseError::RebalanceInProgress.code(),
            Some(Err(code)) => response.error_code = code,
            Some(Ok(joined)) => {
                tracing::info!(group = %group_id, member = %joined.member_id, generation = joined.generation,
                               leader = %joined.leader, "member joined");
                response.generation_id = joined.generation;
                response.protocol_name = Some(str_bytes(joined.protocol));
                if version >= 7 {
                    response.protocol_type = Some(str_bytes(joined.protocol_type));
                }
                response.leader = str_bytes(joined.leader);
                response.member_id = str_bytes(joined.member_id);
                response.members = joined
                    .members
                    .into_iter()
                    .map(|(id, instance, metadata)| {
                        let mut m = JoinGroupResponseMember::default();
                        m.member_id = str_bytes(id);
                        if version >= 5 {
                            m.group_instance_id = instance.map(str_bytes);
                        }
                        m.metadata = metadata.into();
                        m
                    })
                    .collect();
            }
        }
        response
    }

    async fn sync_group(&self, r: SyncGroupRequest, version: i16) -> SyncGroupResponse {
        let mut response = SyncGroupResponse::default();
        let group_id = r.group_id.0.to_string();
        if let Err(code) = self.check_group(&group_id) {
            response.error_code = code;
            return response;
        }
        let member_id = r.member_id.to_string();
        let generation = r.generation_id;
        let assignments = r
            .assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.to_vec()))
            .collect();
        let instance = r.group_instance_id.as_ref().map(|i| i.to_string());
        if let Err(e) = self.with_group(&group_id, |g, now| {
            g.fence_instance(&member_id, instance.as_deref())?;
            g.sync(&member_id, generation, assignments, now)
        }) {
            response.error_code = group_code(&e);
            return response;
        }
        // Whatever ends the wait without an answer (the 60 s bound, or the connection closing
        // and dropping this future) tells the group, so the member's session counts again.
        let mut abandoned = SyncAbandoned {
            face: self,
            group_id: &group_id,
            member_id: &member_id,
            answered: false,
        };
        let answer = self
            .park(&group_id, Duration::from_secs(60), |g| {
                if let Err(fenced) = g.fence_instance(&member_id, instance.as_deref()) {
                    return Some(Err(fenced));
                }
                g.sync_result(&member_id, generation)
            })
            .await;
        abandoned.answered = answer.is_some();
        drop(abandoned);
        let answer = self.settled(&group_id, answer).await;
        match answer {
            None => response.error_code = ResponseError::RebalanceInProgress.code(),
            Some(Err(code)) => response.error_code = code,
            Some(Ok(assignment)) => {
                response.assignment = assignment.into();
                if version >= 5 {
                    response.protocol_type = r.protocol_type.clone();
                    response.protocol_name = r.protocol_name.clone();
                }
            }
        }
        response
    }

    fn heartbeat(&self, r: HeartbeatRequest) -> HeartbeatResponse {
        let mut response = HeartbeatResponse::default();
        let group_id = r.group_id.0.to_string();
        response.error_code = match self.check_group(&group_id) {
            Err(code) => code,
            Ok(()) => self
                .with_group(&group_id, |g, now| {
                    g.fence_instance(&r.member_id, r.group_instance_id.as_deref())?;
                    g.heartbeat(&r.member_id, r.generation_id, now)
                })
                .map_or_else(|e| group_code(&e), |()| 0),
        };
        response
    }

    /// ListGroups: the groups this coordinator holds a membership for (silent members expired
    /// first), with their protocol type and, from v4, their state, and, as in Kafka, the
    /// groups known only by their committed offsets (a membership dropped while idle, or
    /// lost in a restart): Empty, with no protocol type. v4's states filter keeps the groups
    /// in one of the named states, v5's types filter those of the named types, `classic` or
    /// `consumer` (KIP-848) (case does not matter, as in Kafka); v5 answers each group's type.
    async fn list_groups(&self, r: ListGroupsRequest, version: i16) -> ListGroupsResponse {
        let lower = |filter: &[kafka_protocol::protocol::StrBytes], since: i16| -> Vec<String> {
            if version >= since {
                filter.iter().map(|s| s.to_ascii_lowercase()).collect()
            } else {
                Vec::new()
            }
        };
        let (states, types) = (lower(&r.states_filter, 4), lower(&r.types_filter, 5));
        let mut response = ListGroupsResponse::default();
        let groups = match self.group_summaries().await {
            Ok(groups) => groups,
            Err(e) => {
                response.error_code = kafka_error(&e);
                return response;
            }
        };
        for (group_id, g) in groups {
            if !states.is_empty() && !states.contains(&g.state.to_ascii_lowercase()) {
                continue;
            }
            // A group known only by its offsets lists as classic, as Kafka lists it.
            let group_type = g.group_type.unwrap_or("classic");
            if !types.is_empty() && !types.iter().any(|t| t == group_type) {
                continue;
            }
            let mut listed = ListedGroup::default();
            listed.group_id = GroupId(str_bytes(&group_id));
            listed.protocol_type = str_bytes(&g.protocol_type);
            listed.group_state = str_bytes(g.state);
            listed.group_type = str_bytes(group_type);
            response.groups.push(listed);
        }
        response
    }

    /// Every group this node coordinates that this face holds (silent members expired
    /// first), and every group known only by its committed offsets (a membership dropped while
    /// idle, or never held: Empty, no protocol type), by group id.
    async fn group_summaries(
        &self,
    ) -> Result<std::collections::BTreeMap<String, GroupSummary>, Error> {
        let mut groups: std::collections::BTreeMap<String, GroupSummary> = self
            .known_groups()
            .into_iter()
            .filter(|(group_id, _)| self.check_group(group_id).is_ok())
            .map(|(group_id, slot)| {
                let summary = on_slot(&group_id, &slot, |g, _| GroupSummary {
                    group_type: Some("classic"),
                    state: g.state().name(),
                    protocol_type: g.protocol_type().to_string(),
                    members: g.member_ids().len(),
                });
                (group_id, summary)
            })
            .collect();
        let kip848: Vec<(String, GroupSummary)> = self
            .consumer_groups()
            .iter()
            .filter(|(group_id, _)| self.check_group(group_id).is_ok())
            .map(|(group_id, g)| {
                let summary = GroupSummary {
                    group_type: Some("consumer"),
                    state: g.state_name(),
                    protocol_type: "consumer".to_string(),
                    members: g.members().count(),
                };
                (group_id.clone(), summary)
            })
            .collect();
        groups.extend(kip848);
        for group_id in self.service.offset_groups().await? {
            groups.entry(group_id).or_insert(GroupSummary {
                group_type: None,
                state: "Empty",
                protocol_type: String::new(),
                members: 0,
            });
        }
        Ok(groups)
    }

    /// Every group this node coordinates, as the Groups gRPC service lists them.
    pub(crate) async fn group_listings(&self) -> Result<Vec<proto::GroupListing>, Error> {
        Ok(self
            .group_summaries()
            .await?
            .into_iter()
            .map(|(group_id, g)| proto::GroupListing {
                group_id,
                group_type: g.group_type.unwrap_or_default().to_string(),
                state: g.state.to_string(),
                members: i32::try_from(g.members).unwrap_or(i32::MAX),
            })
            .collect())
    }

    /// One group as the Groups gRPC service describes it: its type, state, epoch
    /// (generation), protocol, members with the partitions each holds, and its committed
    /// offsets. A group this node coordinates but knows nothing of is GROUP_ID_NOT_FOUND.
    pub(crate) async fn group_description(
        &self,
        group_id: &str,
    ) -> Result<proto::DescribeGroupResponse, Error> {
        self.service.check_owner(group_id)?;
        let mut d = proto::DescribeGroupResponse {
            group_id: group_id.to_string(),
            ..Default::default()
        };
        let kip848 = self.on_consumer_group(group_id, |g| {
            d.group_type = "consumer".into();
            d.state = g.state_name().into();
            d.epoch = g.group_epoch();
            d.protocol = g.assignor().into();
            d.members = g
                .members()
                .map(|m| proto::GroupMember {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone().unwrap_or_default(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    member_epoch: m.epoch,
                    assigned: m.assigned.iter().cloned().map(Into::into).collect(),
                })
                .collect();
        });
        let slot = self.groups().slots.get(group_id).cloned();
        if let (None, Some(slot)) = (kip848, slot) {
            on_slot(group_id, &slot, |g, _| {
                let described = g.describe();
                d.group_type = "classic".into();
                d.state = described.state.into();
                d.epoch = g.generation();
                d.protocol = described.protocol;
                let consumer = described.protocol_type == "consumer";
                d.members = described
                    .members
                    .into_iter()
                    .map(|m| proto::GroupMember {
                        assigned: consumer
                            .then(|| group_admin::assigned_partitions(&m.assignment))
                            .flatten()
                            .unwrap_or_default()
                            .into_iter()
                            .map(Into::into)
                            .collect(),
                        member_id: m.member_id,
                        instance_id: m.instance_id.unwrap_or_default(),
                        client_id: m.client_id,
                        client_host: m.client_host,
                        member_epoch: g.generation(),
                    })
                    .collect();
            });
        }
        let request = proto::OffsetFetchRequest {
            group_id: group_id.to_string(),
            partitions: Vec::new(),
            require_stable: false,
        };
        let (committed, _) = self.service.offset_fetch(request).await?;
        d.committed = committed;
        if d.group_type.is_empty() {
            if d.committed.is_empty() {
                return Err(Error::GroupIdNotFound(group_id.to_string()));
            }
            d.state = "Empty".into();
        }
        Ok(d)
    }

    /// DeleteGroups: each group on its own, as [`group_admin::delete_group`] decides under
    /// the group's locks: an Empty group (or one known only by its offsets) loses its
    /// committed offsets, durably, and its idle membership; one with members, or with a
    /// transaction's offsets awaiting their marker, is NON_EMPTY_GROUP; one unknown here is
    /// GROUP_ID_NOT_FOUND. Its marker fences stay (a marker sent again puts nothing back).
    async fn delete_groups(&self, r: DeleteGroupsRequest) -> DeleteGroupsResponse {
        let mut response = DeleteGroupsResponse::default();
        for group in r.groups_names {
            let group_id = group.0.to_string();
            let mut result = DeletableGroupResult::default();
            result.group_id = group;
            result.error_code = match self.check_group(&group_id) {
                Err(code) => code,
                Ok(()) => self.delete_group(&group_id).await,
            };
            response.results.push(result);
        }
        response
    }

    async fn delete_group(&self, group_id: &str) -> i16 {
        if let Err(e) = self.expire_and_settle(group_id).await {
            return kafka_error(&e);
        }
        let decision = self
            .service
            .delete_group_offsets(group_id.to_string(), |committed, pending| {
                self.on_admin_membership(group_id, |membership| {
                    match group_admin::delete_group(group_id, membership, committed, pending) {
                        Ok(delete) => ((delete, Ok(())), true),
                        Err(e) => ((Vec::new(), Err(e)), false),
                    }
                })
            })
            .await;
        match decision {
            Ok(Ok(())) => {
                tracing::info!(group = group_id, "group deleted");
                0
            }
            Ok(Err(e)) => {
                tracing::info!(group = group_id, "DeleteGroups refused: {e}");
                admin_code(&e)
            }
            Err(e) => kafka_error(&e),
        }
    }

    /// OffsetDelete (KIP-496): the committed offsets of the named partitions, deleted durably
    /// as [`group_admin::delete_offsets`] decides under the group's locks: not for a topic a
    /// member of the group subscribes to (GROUP_SUBSCRIBED_TO_TOPIC), a partition that does
    /// not exist (UNKNOWN_TOPIC_OR_PARTITION), or one whose offset a transaction has pending
    /// (CONCURRENT_TRANSACTIONS, until its marker); a group with members of another protocol
    /// than "consumer" is NON_EMPTY_GROUP and an unknown one GROUP_ID_NOT_FOUND, for the
    /// whole request.
    async fn offset_delete(&self, r: OffsetDeleteRequest) -> OffsetDeleteResponse {
        let mut response = OffsetDeleteResponse::default();
        let group_id = r.group_id.0.to_string();
        if let Err(code) = self.check_group(&group_id) {
            response.error_code = code;
            return response;
        }
        let requested: Vec<TopicPartition> = r
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| TopicPartition::new(t.name.0.as_str(), p.partition_index))
            })
            .collect();
        let topology = self.service.topology();
        if let Err(e) = self.expire_and_settle(&group_id).await {
            response.error_code = kafka_error(&e);
            return response;
        }
        let decision = self
            .service
            .delete_group_offsets(group_id.clone(), |committed, pending| {
                self.on_admin_membership(&group_id, |membership| {
                    let exists =
                        |tp: &TopicPartition| topology.partition_exists(&tp.topic, tp.partition);
                    match group_admin::delete_offsets(
                        &group_id, membership, committed, pending, &requested, exists,
                    ) {
                        Ok(outcomes) => {
                            let delete = outcomes
                                .iter()
                                .filter(|(_, r)| r.is_ok())
                                .map(|(tp, _)| tp.clone())
                                .collect();
                            ((delete, Ok(outcomes)), false)
                        }
                        Err(e) => ((Vec::new(), Err(e)), false),
                    }
                })
            })
            .await;
        let mut outcomes = match decision {
            Ok(Ok(outcomes)) => outcomes.into_iter(),
            Ok(Err(e)) => {
                tracing::info!(group = %group_id, "OffsetDelete refused: {e}");
                response.error_code = admin_code(&e);
                return response;
            }
            Err(e) => {
                response.error_code = kafka_error(&e);
                return response;
            }
        };
        // The outcomes come in the request's order.
        response.topics = r
            .topics
            .iter()
            .map(|t| {
                let mut topic = OffsetDeleteResponseTopic::default();
                topic.name = t.name.clone();
                topic.partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut out = OffsetDeleteResponsePartition::default();
                        out.partition_index = p.partition_index;
                        if let Some((tp, Err(e))) = outcomes.next() {
                            tracing::info!(group = %group_id, partition = %tp, "offset not deleted: {e}");
                            out.error_code = admin_code(&e);
                        }
                        out
                    })
                    .collect();
                topic
            })
            .collect();
        response
    }

    /// DescribeGroups: each group's state, protocol and members
    /// ([`GroupMembership::describe`]); NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS per
    /// group as for every group request. A group without a membership here is Empty when it
    /// has committed offsets and Dead otherwise (Kafka's answer for a group it does not know,
    /// before v6). A KIP-848 group with members is GROUP_ID_NOT_FOUND, as in Kafka (it is
    /// described by ConsumerGroupDescribe). Authorized operations are not computed (no ACLs):
    /// `i32::MIN`, Kafka's "not requested".
    async fn describe_groups(
        &self,
        r: DescribeGroupsRequest,
        version: i16,
    ) -> DescribeGroupsResponse {
        let mut response = DescribeGroupsResponse::default();
        for group in r.groups {
            let group_id = group.0.to_string();
            let mut out = DescribedGroup::default();
            out.group_id = group;
            out.authorized_operations = i32::MIN;
            if let Err(code) = self.check_group(&group_id) {
                out.error_code = code;
                response.groups.push(out);
                continue;
            }
            if self.on_consumer_group(&group_id, |g| !g.is_empty()) == Some(true) {
                // A KIP-848 group: described by ConsumerGroupDescribe, as in Kafka.
                out.error_code = ResponseError::GroupIdNotFound.code();
                response.groups.push(out);
                continue;
            }
            let slot = self.groups().slots.get(&group_id).cloned();
            let description = slot.map(|slot| on_slot(&group_id, &slot, |g, _| g.describe()));
            match description {
                Some(d) => {
                    out.group_state = str_bytes(d.state);
                    out.protocol_type = str_bytes(&d.protocol_type);
                    out.protocol_data = str_bytes(&d.protocol);
                    out.members = d
                        .members
                        .into_iter()
                        .map(|m| {
                            let mut member = DescribedGroupMember::default();
                            member.member_id = str_bytes(&m.member_id);
                            if version >= 4 {
                                member.group_instance_id = m.instance_id.as_deref().map(str_bytes);
                            }
                            member.client_id = str_bytes(&m.client_id);
                            member.client_host = str_bytes(&m.client_host);
                            member.member_metadata = m.metadata.into();
                            member.member_assignment = m.assignment.into();
                            member
                        })
                        .collect();
                }
                None => {
                    let request = proto::OffsetFetchRequest {
                        group_id: group_id.clone(),
                        partitions: Vec::new(),
                        require_stable: false,
                    };
                    match self.service.offset_fetch(request).await {
                        Ok((offsets, _)) => {
                            let state = if offsets.is_empty() { "Dead" } else { "Empty" };
                            out.group_state = str_bytes(state);
                        }
                        Err(e) => out.error_code = kafka_error(&e),
                    }
                }
            }
            response.groups.push(out);
        }
        response
    }

    async fn leave_group(&self, r: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
        let mut response = LeaveGroupResponse::default();
        let group_id = r.group_id.0.to_string();
        if let Err(code) = self.check_group(&group_id) {
            response.error_code = code;
            return response;
        }
        let members: Vec<(String, Option<kafka_protocol::protocol::StrBytes>)> = if version >= 3 {
            r.members
                .iter()
                .map(|m| (m.member_id.to_string(), m.group_instance_id.clone()))
                .collect()
        } else {
            vec![(r.member_id.to_string(), None)]
        };
        let results: Vec<(String, Option<kafka_protocol::protocol::StrBytes>, i16)> = self
            .with_group(&group_id, |g, now| {
                members
                    .into_iter()
                    .map(|(id, instance)| {
                        // KIP-345: a static member may leave by its instance id alone; one
                        // naming another member than the instance's current one is fenced.
                        let named = match (id.is_empty(), instance.as_deref()) {
                            (true, Some(i)) => g.static_member(i).unwrap_or_default().to_string(),
                            _ => id.clone(),
                        };
                        let code = g
                            .fence_instance(&named, instance.as_deref())
                            .and_then(|()| g.leave(&named, now))
                            .map_or_else(|e| group_code(&e), |()| 0);
                        (id, instance, code)
                    })
                    .collect()
            });
        // The last member out: the group's record goes before the answer, so a restart does
        // not bring the members back.
        if let Err(e) = self.settle(&group_id).await {
            response.error_code = kafka_error(&e);
            return response;
        }
        if version >= 3 {
            response.members = results
                .into_iter()
                .map(|(id, instance, code)| {
                    let mut m = MemberResponse::default();
                    m.member_id = str_bytes(id);
                    m.group_instance_id = instance;
                    m.error_code = code;
                    m
                })
                .collect();
        } else {
            response.error_code = results.first().map_or(0, |r| r.2);
        }
        response
    }

    async fn init_producer_id(&self, r: InitProducerIdRequest) -> InitProducerIdResponse {
        let grpc = proto::InitProducerIdRequest {
            transactional_id: r.transactional_id.map(|t| t.0.to_string()),
            transaction_timeout_ms: r.transaction_timeout_ms,
            expected_producer_id: r.producer_id.0,
            expected_producer_epoch: i32::from(r.producer_epoch),
            transaction_version: TransactionVersion::V1.to_wire(),
        };
        let mut response = InitProducerIdResponse::default();
        match self.service.init_producer_id(grpc).await {
            Ok(pair) => {
                response.producer_id = ProducerId(pair.producer_id);
                response.producer_epoch = pair.epoch;
            }
            Err(e) => {
                response.error_code = kafka_error(&e);
                response.producer_id = ProducerId(-1);
                response.producer_epoch = -1;
            }
        }
        response
    }

    async fn add_partitions(&self, r: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
        let partitions: Vec<proto::TopicPartition> = r
            .v3_and_below_topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|&p| proto::TopicPartition {
                    topic: t.name.0.to_string(),
                    partition: p,
                })
            })
            .collect();
        let grpc = proto::AddPartitionsToTxnRequest {
            transactional_id: r.v3_and_below_transactional_id.0.to_string(),
            producer_id: r.v3_and_below_producer_id.0,
            producer_epoch: i32::from(r.v3_and_below_producer_epoch),
            partitions,
        };
        let result = self.service.add_partitions(grpc).await;
        let code = kafka_result(&result);
        let unknown = ResponseError::UnknownTopicOrPartition.code();
        let topology = self.service.topology();
        let mut response = AddPartitionsToTxnResponse::default();
        response.results_by_topic_v3_and_below = r
            .v3_and_below_topics
            .iter()
            .map(|t| {
                let mut topic = AddPartitionsToTxnTopicResult::default();
                topic.name = t.name.clone();
                topic.results_by_partition = t
                    .partitions
                    .iter()
                    .map(|&p| {
                        let mut out = AddPartitionsToTxnPartitionResult::default();
                        out.partition_index = p;
                        out.partition_error_code =
                            if code == unknown && topology.partition_exists(&t.name.0, p) {
                                ResponseError::OperationNotAttempted.code()
                            } else {
                                code
                            };
                        out
                    })
                    .collect();
                topic
            })
            .collect();
        response
    }

    async fn add_offsets(&self, r: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
        let grpc = proto::AddOffsetsToTxnRequest {
            transactional_id: r.transactional_id.0.to_string(),
            producer_id: r.producer_id.0,
            producer_epoch: i32::from(r.producer_epoch),
            group_id: r.group_id.0.to_string(),
        };
        let mut response = AddOffsetsToTxnResponse::default();
        response.error_code = kafka_result(&self.service.add_offsets(grpc).await);
        response
    }

    async fn txn_offset_commit(&self, r: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
        let offsets = r
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| proto::PartitionOffset {
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    offset: p.committed_offset,
                })
            })
            .collect();
        let group_id = r.group_id.0.to_string();
        // This node must serve the group (and have loaded) before the membership is looked at:
        // a request before the load is COORDINATOR_LOAD_IN_PROGRESS, on a non-owner
        // NOT_COORDINATOR, as for every group request, and neither creates a membership.
        let check = || {
            self.check_group_commit(
                &group_id,
                &r.member_id,
                r.generation_id,
                r.group_instance_id.as_deref(),
                CommitKind::Transactional,
                true,
            )
        };
        let fenced = self.check_group(&group_id).and_then(|()| check());
        let grpc = proto::TxnOffsetCommitRequest {
            transactional_id: r.transactional_id.0.to_string(),
            producer_id: r.producer_id.0,
            producer_epoch: i32::from(r.producer_epoch),
            group_id: r.group_id.0.to_string(),
            offsets,
            auth: None,
        };
        let code = match fenced {
            Err(code) => code,
            // KIP-447's pending offsets, then the transaction's coordinator (this node or the
            // owner, over gRPC), as for our own client.
            // The membership is checked again once the offsets are pending (a rebalance
            // meanwhile must not let the partitions' new owner read the old offset as stable).
            Ok(()) => match self.service.txn_offset_commit(grpc, check).await {
                Ok(raw) => face_code_of(raw),
                Err(code) => code,
            },
        };
        let mut response = TxnOffsetCommitResponse::default();
        response.topics = r
            .topics
            .iter()
            .map(|t| {
                let mut topic = TxnOffsetCommitResponseTopic::default();
                topic.name = t.name.clone();
                topic.partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut out = TxnOffsetCommitResponsePartition::default();
                        out.partition_index = p.partition_index;
                        out.error_code = code;
                        out
                    })
                    .collect();
                topic
            })
            .collect();
        response
    }

    async fn end_txn(&self, r: EndTxnRequest) -> EndTxnResponse {
        let grpc = proto::EndTxnRequest {
            transactional_id: r.transactional_id.0.to_string(),
            producer_id: r.producer_id.0,
            producer_epoch: i32::from(r.producer_epoch),
            result: if r.committed {
                proto::TxnResult::Commit
            } else {
                proto::TxnResult::Abort
            } as i32,
        };
        let mut response = EndTxnResponse::default();
        response.producer_id = ProducerId(-1);
        response.producer_epoch = -1;
        match self.service.end_txn(grpc).await {
            Ok(pair) => {
                response.producer_id = ProducerId(pair.producer_id);
                response.producer_epoch = pair.epoch;
            }
            Err(e) => response.error_code = kafka_error(&e),
        }
        response
    }

    /// OffsetFetch: one group (v1-7) or a batch of groups (v8+), each as
    /// [`Self::fetch_group`] answers it. From v9 a request may name the member and its epoch
    /// (KIP-848 consumers do): for a KIP-848 group it must be a member at exactly its current
    /// epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID otherwise, for that group), so a zombie
    /// consumer cannot even read the offsets of the group it was fenced from.
    async fn offset_fetch(&self, r: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
        // KIP-447 (v7+): a read_committed consumer asks for stable offsets only.
        let require_stable = version >= 7 && r.require_stable;
        let mut response = OffsetFetchResponse::default();
        if version >= 8 {
            use kafka_protocol::messages::offset_fetch_response::{
                OffsetFetchResponseGroup, OffsetFetchResponsePartitions, OffsetFetchResponseTopics,
            };
            for group in &r.groups {
                let group_id = group.group_id.0.to_string();
                let mut out = OffsetFetchResponseGroup::default();
                out.group_id = group.group_id.clone();
                let member = group.member_id.as_ref().map(|m| m.to_string());
                let fenced = if version >= 9 && (member.is_some() || group.member_epoch >= 0) {
                    self.on_consumer_group(&group_id, |g| {
                        g.check_fetch(member.as_deref().unwrap_or(""), group.member_epoch)
                    })
                    .and_then(Result::err)
                } else {
                    None
                };
                if let Some(e) = fenced {
                    tracing::info!(group = %group_id, member = ?member, epoch = group.member_epoch,
                                   "offset fetch fenced by the consumer group: {e}");
                    out.error_code = consumer_code(&e);
                    response.groups.push(out);
                    continue;
                }
                let asked = group.topics.as_ref().map(|topics| {
                    topics
                        .iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
                        .collect()
                });
                match self.fetch_group(&group_id, asked, require_stable).await {
                    Err(code) => out.error_code = code,
                    Ok(fetched) => {
                        for (topic, p) in fetched {
                            let mut partition = OffsetFetchResponsePartitions::default();
                            partition.partition_index = p.partition_index;
                            partition.committed_offset = p.committed_offset;
                            partition.committed_leader_epoch = p.committed_leader_epoch;
                            partition.metadata = p.metadata;
                            partition.error_code = p.error_code;
                            match out.topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                                Some(t) => t.partitions.push(partition),
                                None => {
                                    let mut t = OffsetFetchResponseTopics::default();
                                    t.name = TopicName(str_bytes(topic));
                                    t.partitions.push(partition);
                                    out.topics.push(t);
                                }
                            }
                        }
                    }
                }
                response.groups.push(out);
            }
            return response;
        }
        let asked = r.topics.as_ref().map(|topics| {
            topics
                .iter()
                .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
                .collect()
        });
        match self.fetch_group(&r.group_id.0, asked, require_stable).await {
            Ok(fetched) => {
                for (topic, p) in fetched {
                    match response
                        .topics
                        .iter_mut()
                        .find(|t| t.name.0.as_str() == topic)
                    {
                        Some(t) => t.partitions.push(p),
                        None => {
                            let mut t = OffsetFetchResponseTopic::default();
                            t.name = TopicName(str_bytes(topic));
                            t.partitions.push(p);
                            response.topics.push(t);
                        }
                    }
                }
            }
            Err(code) => {
                if version >= 2 {
                    response.error_code = code;
                } else {
                    // v1 has no top-level error: every requested partition carries it.
                    for t in r.topics.iter().flatten() {
                        let mut topic = OffsetFetchResponseTopic::default();
                        topic.name = t.name.clone();
                        topic.partitions = t
                            .partition_indexes
                            .iter()
                            .map(|&i| {
                                let mut p = OffsetFetchResponsePartition::default();
                                p.partition_index = i;
                                p.committed_offset = -1;
                                p.error_code = code;
                                p
                            })
                            .collect();
                        response.topics.push(topic);
                    }
                }
            }
        }
        response
    }

    /// One group's committed offsets of the `asked` partitions (`None`: all of the group's),
    /// with their topics; with `require_stable`, a partition whose offset a transaction has
    /// pending is UNSTABLE_OFFSET_COMMIT (the client retries). The request's error otherwise.
    async fn fetch_group(
        &self,
        group_id: &str,
        asked: Option<Vec<(String, Vec<i32>)>>,
        require_stable: bool,
    ) -> Result<Vec<(String, OffsetFetchResponsePartition)>, i16> {
        let partitions: Vec<proto::TopicPartition> = asked
            .iter()
            .flatten()
            .flat_map(|(topic, partitions)| {
                partitions.iter().map(|&p| proto::TopicPartition {
                    topic: topic.clone(),
                    partition: p,
                })
            })
            .collect();
        let grpc = proto::OffsetFetchRequest {
            group_id: group_id.to_string(),
            partitions,
            // Decided per partition below, as Kafka answers it.
            require_stable: false,
        };
        let (offsets, pending) = self
            .service
            .offset_fetch(grpc)
            .await
            .map_err(|e| kafka_error(&e))?;
        Ok(offsets
            .into_iter()
            .map(|o| {
                let mut p = OffsetFetchResponsePartition::default();
                p.partition_index = o.partition;
                p.committed_offset = o.offset;
                p.committed_leader_epoch = -1;
                p.metadata = Some(str_bytes(""));
                if require_stable
                    && pending
                        .iter()
                        .any(|tp| tp.topic == o.topic && tp.partition == o.partition)
                {
                    tracing::debug!(group = %group_id, topic = %o.topic, partition = o.partition,
                                    "offset fetch: a transaction's offset is pending");
                    p.committed_offset = -1;
                    p.error_code = ResponseError::UnstableOffsetCommit.code();
                }
                (o.topic, p)
            })
            .collect())
    }

    async fn list_transactions(&self, r: ListTransactionsRequest) -> ListTransactionsResponse {
        let mut response = ListTransactionsResponse::default();
        let mut filters = Vec::new();
        for name in &r.state_filters {
            match (0..6).find(|&s| state_name(s) == name.as_str()) {
                Some(s) => filters.push(s),
                None => response.unknown_state_filters.push(name.clone()),
            }
        }
        if !response.unknown_state_filters.is_empty() && filters.is_empty() {
            return response;
        }
        let grpc = proto::ListTransactionsRequest {
            state_filters: filters,
        };
        let listed = match self
            .service
            .list_transactions(tonic::Request::new(grpc))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(_) => {
                response.error_code = ResponseError::UnknownServerError.code();
                return response;
            }
        };
        response.error_code = face_code_of(listed.error_code);
        response.transaction_states = listed
            .transactions
            .into_iter()
            .filter(|t| {
                r.producer_id_filters.is_empty()
                    || r.producer_id_filters.contains(&ProducerId(t.producer_id))
            })
            .map(|t| {
                let mut s = ListedState::default();
                s.transactional_id = TransactionalId(str_bytes(t.transactional_id));
                s.producer_id = ProducerId(t.producer_id);
                s.transaction_state = str_bytes(state_name(t.state));
                s
            })
            .collect();
        response
    }

    async fn describe_transactions(
        &self,
        r: DescribeTransactionsRequest,
    ) -> DescribeTransactionsResponse {
        let grpc = proto::DescribeTransactionsRequest {
            transactional_ids: r
                .transactional_ids
                .iter()
                .map(|t| t.0.to_string())
                .collect(),
        };
        let mut response = DescribeTransactionsResponse::default();
        let described = match self
            .service
            .describe_transactions(tonic::Request::new(grpc))
            .await
        {
            Ok(d) => d.into_inner(),
            Err(_) => return response,
        };
        response.transaction_states = described
            .transactions
            .into_iter()
            .map(|t| {
                let mut s = DescribedState::default();
                s.error_code = face_code_of(t.error_code);
                s.transactional_id = TransactionalId(str_bytes(t.transactional_id));
                s.transaction_state = str_bytes(state_name(t.state));
                s.transaction_timeout_ms = t.transaction_timeout_ms;
                s.transaction_start_time_ms = t.transaction_start_ms;
                s.producer_id = ProducerId(t.producer_id);
                s.producer_epoch = t.producer_epoch as i16;
                for tp in t.partitions {
                    match s.topics.iter_mut().find(|d| d.topic.0.as_str() == tp.topic) {
                        Some(d) => d.partitions.push(tp.partition),
                        None => {
                            let mut d = TopicData::default();
                            d.topic = TopicName(str_bytes(tp.topic));
                            d.partitions.push(tp.partition);
                            s.topics.push(d);
                        }
                    }
                }
                s
            })
            .collect();
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A KIP-848 group's change is stored only when its state changed; an emptied group is
    /// removed (from memory and storage), unless it never had members (a refused first join
    /// stores nothing).
    #[test]
    fn only_changed_consumer_groups_are_stored() {
        use crate::consumer_protocol::Heartbeat;
        let topics: std::collections::BTreeMap<String, i32> = [("t".to_string(), 2)].into();
        let join = |id: &str| Heartbeat {
            member_id: id.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 1_000,
            subscribed_topic_names: Some(vec!["t".into()]),
            owned: Some(Default::default()),
            ..Default::default()
        };
        let mut groups = HashMap::new();
        groups.insert("g".to_string(), ConsumerGroup::new("g", topics.clone()));
        // A refused first join: nothing to store, the empty group dropped.
        let before = groups["g"].state();
        let mut bad = join("a");
        bad.rebalance_timeout_ms = -1;
        assert!(groups.get_mut("g").unwrap().heartbeat(bad, 0).is_err());
        assert_eq!(change_to_store(&mut groups, "g", before), None);
        assert!(groups.is_empty());
        // A join: its state stored, readable back.
        groups.insert("g".to_string(), ConsumerGroup::new("g", topics.clone()));
        let before = groups["g"].state();
        let reply = groups
            .get_mut("g")
            .unwrap()
            .heartbeat(join("a"), 0)
            .unwrap();
        let stored = change_to_store(&mut groups, "g", before).unwrap().unwrap();
        assert_eq!(stored_group_state("g", &stored), Some(groups["g"].state()));
        // Stored bytes that are not a group state (a damaged or foreign value) restore nothing.
        assert_eq!(stored_group_state("g", &stored[..stored.len() / 2]), None);
        assert_eq!(stored_group_state("g", b"\xff garbage"), None);
        // The same for a classic group's record, and one protocol's value is not the other's.
        assert_eq!(stored_classic_record("g", &stored), None);
        assert_eq!(stored_classic_record("g", b"\xff garbage"), None);
        let record = crate::consumer_groups::ClassicGroupRecord {
            generation: 3,
            protocol_type: "consumer".into(),
            protocol: "range".into(),
            leader: "m".into(),
            members: Vec::new(),
        };
        let bytes = serde_json::to_vec(&record).unwrap();
        assert_eq!(stored_classic_record("g", &bytes), Some(record));
        assert_eq!(stored_classic_record("g", &bytes[..bytes.len() - 1]), None);
        assert_eq!(stored_group_state("g", &bytes), None);
        // A heartbeat that changes nothing stores nothing.
        let before = groups["g"].state();
        let mut beat = join("a");
        beat.member_epoch = reply.member_epoch;
        beat.rebalance_timeout_ms = -1;
        beat.subscribed_topic_names = None;
        beat.owned = reply.assignment;
        groups.get_mut("g").unwrap().heartbeat(beat, 1).unwrap();
        assert_eq!(change_to_store(&mut groups, "g", before), None);
        // The last member leaves: the group is removed, from storage too.
        let before = groups["g"].state();
        let leave = Heartbeat {
            member_id: "a".into(),
            member_epoch: crate::consumer_protocol::LEAVE_EPOCH,
            ..Default::default()
        };
        groups.get_mut("g").unwrap().heartbeat(leave, 2).unwrap();
        assert_eq!(change_to_store(&mut groups, "g", before), Some(None));
        assert!(groups.is_empty());
    }

    /// A failed write of the coordinator's state is retriable for Kafka clients (the request is
    /// sent again, an EndTxn with its decision), as Kafka's coordinators answer it; a timed-out
    /// transaction is abortable for librdkafka and the Java client, not fatal.
    #[test]
    fn storage_failures_are_retriable_and_timeouts_abortable_for_kafka_clients() {
        let storage = Error::Storage(crate::storage::StorageError::Task("no space".into()));
        assert_eq!(kafka_error(&storage), ResponseError::NotCoordinator.code());
        assert_eq!(
            face_code_of(proto::ErrorCode::KafkaStorageError as i32),
            ResponseError::NotCoordinator.code()
        );
        assert_eq!(
            face_code(proto::ErrorCode::TransactionTimedOut),
            ResponseError::InvalidProducerIdMapping.code()
        );
        assert_eq!(
            face_code(proto::ErrorCode::ProducerFenced),
            ResponseError::ProducerFenced.code()
        );
    }

    /// A client on a request version from before KIP-588 does not know PRODUCER_FENCED: it is
    /// told INVALID_PRODUCER_EPOCH, as Kafka tells it.
    #[test]
    fn producer_fenced_is_invalid_producer_epoch_for_versions_that_predate_it() {
        let (fenced, epoch) = (
            ResponseError::ProducerFenced.code(),
            ResponseError::InvalidProducerEpoch.code(),
        );
        assert_eq!(fenced_as_known(fenced, 3, 4), epoch);
        assert_eq!(fenced_as_known(fenced, 4, 4), fenced);
        assert_eq!(fenced_as_known(fenced, 1, 2), epoch);
        assert_eq!(fenced_as_known(0, 0, 2), 0);
        assert_eq!(fenced_as_known(epoch, 5, 2), epoch);
    }

    fn slot(g: GroupMembership) -> Arc<GroupSlot> {
        Arc::new(GroupSlot {
            membership: Mutex::new(g),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn joined(group: &str) -> GroupMembership {
        let mut g = GroupMembership::new(group);
        let m = g
            .join(
                JoinRequest {
                    member_id: String::new(),
                    group_instance_id: None,
                    client_id: "c".into(),
                    client_host: String::new(),
                    require_known_member_id: false,
                    session_timeout_ms: 10_000,
                    rebalance_timeout_ms: 10_000,
                    protocol_type: "consumer".into(),
                    protocols: vec![("range".into(), Vec::new())],
                },
                0,
            )
            .unwrap();
        g.join_result(&m).unwrap().unwrap();
        g
    }

    /// Only a group that is idle and that no request holds is dropped; a group whose members
    /// all went silent is idle once their sessions expired.
    #[test]
    fn idle_groups_nobody_holds_are_dropped() {
        let mut slots = HashMap::new();
        slots.insert("idle".to_string(), slot(GroupMembership::new("idle")));
        slots.insert("live".to_string(), slot(joined("live")));
        let held = slot(GroupMembership::new("held"));
        slots.insert("held".to_string(), held.clone());
        assert_eq!(drop_idle_groups(&mut slots, 1_000), 1);
        let mut left: Vec<_> = slots.keys().cloned().collect();
        left.sort();
        assert_eq!(left, vec!["held", "live"]);
        drop(held);
        // The live group's member was last seen at 0 with a 10 s session.
        assert_eq!(drop_idle_groups(&mut slots, 5_000), 1);
        assert_eq!(slots.keys().collect::<Vec<_>>(), vec!["live"]);
        assert_eq!(drop_idle_groups(&mut slots, 10_001), 1);
        assert!(slots.is_empty());
    }
}
