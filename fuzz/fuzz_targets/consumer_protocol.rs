//! KIP-848's consumer group core (`coordinator::consumer_protocol`) driven by four consumers
//! that join (with any subscription and assignor, dynamic or static, under their member id or
//! a new one), heartbeat with what they believe they own (acknowledging revocations, or not, or
//! lying), heartbeat with stale or future epochs, leave (for good, or a static member for a
//! while), commit and go silent, in any order; and by the identities they left behind (a
//! replaced static member's old id still heartbeating and committing). After every step it
//! checks what keeps a zombie consumer from reading or committing partitions it no longer owns
//! (PROTOCOL.md section 5, KIP-848):
//! - no partition is held (assigned or being revoked) by two members at once;
//! - a consumer is only ever given partitions of topics that exist and that it subscribes to;
//! - a member's epoch never exceeds the group epoch; a member id's assigned epochs (above 0)
//!   never go down, even across its incarnations (a rejoin, a static replacement under an id
//!   in use), so an epoch a zombie holds is never current again; 0 (joined, not assigned yet)
//!   and -2 (a static member away, holding nothing it did not hold before) are the exceptions;
//! - a commit is accepted only from a member at exactly its current epoch (or, naming no member,
//!   while the group is empty);
//! - an identity that is no longer a member (a replaced static member) gets every heartbeat and
//!   commit refused;
//! - a coordinator restart (the group stored as JSON and restored, as the shell does) restores
//!   exactly what was stored, and everything above keeps holding after it;
//! - a refused heartbeat changes nothing;
//! - no panic, whatever the input.

#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use cluster::TopicPartition;
use coordinator::consumer_protocol::{
    ConsumerGroup, GroupState, Heartbeat, ASSIGNORS, STATIC_LEAVE_EPOCH,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Join {
        consumer: u8,
        topics: u8,
        regex: bool,
        assignor: Option<u8>,
        /// With `group.instance.id` = "i<consumer>".
        r#static: bool,
        /// Under a new member id (a new process) rather than its last one.
        fresh: bool,
    },
    /// A heartbeat with the epoch the consumer believes it has.
    Beat {
        consumer: u8,
        /// Acknowledge (own only what it was last told) or keep owning what it had.
        ack: bool,
        /// Send the owned partitions (a full heartbeat) or not.
        full: bool,
        /// Claim one partition more than it owns.
        lie: Option<u8>,
        /// Change its subscription.
        resubscribe: Option<u8>,
    },
    /// A heartbeat at an epoch off by `delta` from what the consumer believes.
    Zombie {
        consumer: u8,
        delta: i8,
    },
    Leave {
        consumer: u8,
        /// A static member's temporary leave (-2) rather than -1.
        temporary: bool,
    },
    /// An identity a consumer left behind (its member id before a fresh join) heartbeats and
    /// commits as it last could.
    Ghost {
        which: u8,
        full: bool,
    },
    Commit {
        consumer: u8,
        delta: i8,
        transactional: bool,
    },
    Time {
        ms: u16,
    },
    /// The coordinator restarts: the group is stored and restored.
    Restart,
}

const TOPICS: [(&str, i32); 3] = [("a", 3), ("b", 2), ("c", 1)];

/// What one consumer process believes.
#[derive(Clone, Debug, Default)]
struct Consumer {
    joined: bool,
    /// Its member id (kept across leaves: a static member comes back under it or a new one).
    id: String,
    /// How many member ids it has had.
    ids: u32,
    r#static: bool,
    epoch: i32,
    owned: BTreeSet<TopicPartition>,
    told: BTreeSet<TopicPartition>,
}

fn subscription(bits: u8) -> Vec<String> {
    let names: Vec<String> = TOPICS
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, (t, _))| t.to_string())
        .collect();
    if names.is_empty() {
        vec!["a".to_string()]
    } else {
        names
    }
}

fn check_group(
    g: &ConsumerGroup,
    epochs: &BTreeMap<String, (i32, BTreeSet<TopicPartition>)>,
    high: &mut BTreeMap<String, i32>,
) {
    let mut held = BTreeSet::new();
    for m in g.members() {
        for tp in m.assigned.iter().chain(&m.revoking) {
            assert!(held.insert(tp.clone()), "{tp} held twice");
            let exists = TOPICS
                .iter()
                .any(|(t, n)| *t == tp.topic && tp.partition < *n);
            assert!(exists, "{tp} does not exist");
        }
        for tp in &m.assigned {
            let subscribed = m.topics.contains(&tp.topic)
                || (m.regex.is_some() && (tp.topic == "a" || tp.topic == "b"));
            assert!(subscribed, "{} got {tp} without subscribing", m.id);
        }
        assert!(m.epoch <= g.group_epoch(), "member epoch above the group's");
        if let Some((_, had)) = epochs.get(&m.id) {
            if m.epoch == STATIC_LEAVE_EPOCH {
                assert!(
                    m.assigned.is_subset(had),
                    "{} got partitions while away",
                    m.id
                );
                assert!(m.revoking.is_empty(), "{} revokes while away", m.id);
            }
        }
        if m.epoch > 0 {
            let highest = high.entry(m.id.clone()).or_insert(m.epoch);
            assert!(m.epoch >= *highest, "{}'s epoch went down", m.id);
            *highest = m.epoch;
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let topics = TOPICS.iter().map(|(t, n)| (t.to_string(), *n)).collect();
    let mut g = ConsumerGroup::new("g", topics).with_timeouts(1_000, 100);
    let mut consumers: Vec<Consumer> = (0..4)
        .map(|i| Consumer {
            id: format!("m{i}"),
            ..Default::default()
        })
        .collect();
    // Identities left behind: (member id, instance id, epoch, owned) as last known.
    let mut ghosts: Vec<(String, Option<String>, i32, BTreeSet<TopicPartition>)> = Vec::new();
    let mut now = 0i64;
    // Per member id, the highest epoch above 0 it has had.
    let mut high: BTreeMap<String, i32> = BTreeMap::new();
    for op in ops.into_iter().take(256) {
        // Expiry first, so that the snapshot below is what a refused heartbeat must leave.
        g.tick(now);
        let epochs: BTreeMap<String, (i32, BTreeSet<TopicPartition>)> = g
            .members()
            .map(|m| (m.id.clone(), (m.epoch, m.assigned.clone())))
            .collect();
        let before = format!("{:?}", g.members().collect::<Vec<_>>());
        let (refused, member) = match op {
            Op::Join {
                consumer,
                topics,
                regex,
                assignor,
                r#static,
                fresh,
            } => {
                let i = usize::from(consumer % 4);
                let c = &mut consumers[i];
                if fresh {
                    ghosts.push((
                        c.id.clone(),
                        c.r#static.then(|| format!("i{i}")),
                        c.epoch,
                        c.owned.clone(),
                    ));
                    c.ids += 1;
                    c.id = format!("m{i}-{}", c.ids);
                }
                let hb = Heartbeat {
                    member_id: c.id.clone(),
                    member_epoch: 0,
                    instance_id: r#static.then(|| format!("i{i}")),
                    rebalance_timeout_ms: 500,
                    subscribed_topic_names: Some(subscription(topics)),
                    subscribed_topic_regex: regex.then(|| "[ab]".to_string()),
                    server_assignor: assignor.map(|a| ASSIGNORS[usize::from(a) % 2].to_string()),
                    owned: Some(BTreeSet::new()),
                    ..Default::default()
                };
                match g.heartbeat(hb, now) {
                    Ok(reply) => {
                        let c = &mut consumers[i];
                        c.joined = true;
                        c.r#static = r#static;
                        c.epoch = reply.member_epoch;
                        c.owned = reply.assignment.clone().unwrap_or_default();
                        c.told = c.owned.clone();
                        (false, i)
                    }
                    Err(_) => (true, i),
                }
            }
            Op::Beat {
                consumer,
                ack,
                full,
                lie,
                resubscribe,
            } => {
                let i = usize::from(consumer % 4);
                let c = consumers[i].clone();
                let mut owned = if ack { c.told.clone() } else { c.owned.clone() };
                if let Some(p) = lie {
                    let (t, n) = TOPICS[usize::from(p) % 3];
                    owned.insert(TopicPartition::new(t, i32::from(p) % n));
                }
                let hb = Heartbeat {
                    member_id: c.id.clone(),
                    member_epoch: c.epoch,
                    instance_id: c.r#static.then(|| format!("i{i}")),
                    rebalance_timeout_ms: -1,
                    subscribed_topic_names: resubscribe.map(subscription),
                    owned: full.then_some(owned.clone()),
                    ..Default::default()
                };
                match g.heartbeat(hb, now) {
                    Ok(reply) => {
                        let c = &mut consumers[i];
                        c.epoch = reply.member_epoch;
                        if full || ack {
                            c.owned = owned;
                        }
                        if let Some(told) = reply.assignment {
                            // A real consumer drops what it is no longer assigned and takes
                            // what it is given.
                            c.told = told.clone();
                            c.owned = told;
                        }
                        (false, i)
                    }
                    Err(_) => (true, i),
                }
            }
            Op::Zombie { consumer, delta } => {
                let i = usize::from(consumer % 4);
                let epoch = consumers[i].epoch.saturating_add(i32::from(delta));
                let hb = Heartbeat {
                    member_id: consumers[i].id.clone(),
                    member_epoch: epoch,
                    instance_id: consumers[i].r#static.then(|| format!("i{i}")),
                    rebalance_timeout_ms: -1,
                    owned: Some(consumers[i].owned.clone()),
                    ..Default::default()
                };
                let current = g
                    .members()
                    .find(|m| m.id == consumers[i].id)
                    .map(|m| (m.epoch, m.previous_epoch));
                let result = g.heartbeat(hb, now);
                if let (Ok(_), Some((e, prev))) = (&result, current) {
                    assert!(
                        epoch == e || epoch == prev || epoch <= 0,
                        "epoch {epoch} accepted for a member at {e}"
                    );
                }
                (result.is_err(), i)
            }
            Op::Leave {
                consumer,
                temporary,
            } => {
                let i = usize::from(consumer % 4);
                let c = &consumers[i];
                let hb = Heartbeat {
                    member_id: c.id.clone(),
                    member_epoch: if temporary { -2 } else { -1 },
                    instance_id: c.r#static.then(|| format!("i{i}")),
                    ..Default::default()
                };
                let result = g.heartbeat(hb, now);
                if result.is_ok() {
                    consumers[i] = Consumer {
                        id: c.id.clone(),
                        ids: c.ids,
                        r#static: c.r#static,
                        ..Default::default()
                    };
                }
                (result.is_err(), i)
            }
            Op::Ghost { which, full } => {
                if ghosts.is_empty() {
                    continue;
                }
                let (id, instance, epoch, owned) =
                    ghosts[usize::from(which) % ghosts.len()].clone();
                let member = g.members().any(|m| m.id == id);
                let hb = Heartbeat {
                    member_id: id.clone(),
                    member_epoch: epoch.max(1),
                    instance_id: instance,
                    rebalance_timeout_ms: -1,
                    owned: full.then_some(owned),
                    ..Default::default()
                };
                let result = g.heartbeat(hb, now);
                if !member {
                    assert!(result.is_err(), "{id}, no longer a member, heartbeated");
                    assert!(
                        g.check_commit(&id, epoch.max(1), true, true).is_err(),
                        "{id}, no longer a member, committed"
                    );
                }
                (result.is_err(), 0)
            }
            Op::Commit {
                consumer,
                delta,
                transactional,
            } => {
                let i = usize::from(consumer % 4);
                let epoch = consumers[i].epoch.saturating_add(i32::from(delta));
                let id = consumers[i].id.clone();
                let accepted = g.check_commit(&id, epoch, transactional, true).is_ok();
                let member = g.members().find(|m| m.id == id).map(|m| m.epoch);
                if accepted {
                    match member {
                        Some(e) => assert_eq!(e, epoch, "a commit at a stale epoch was accepted"),
                        None => assert!(
                            epoch < 0 && g.is_empty(),
                            "a non-member's commit was accepted"
                        ),
                    }
                }
                (false, i)
            }
            Op::Time { ms } => {
                now += i64::from(ms);
                g.tick(now);
                (false, 0)
            }
            Op::Restart => {
                let state = g.state();
                let bytes = serde_json::to_vec(&state).expect("serializes");
                let stored: GroupState = serde_json::from_slice(&bytes).expect("deserializes");
                let topics = TOPICS.iter().map(|(t, n)| (t.to_string(), *n)).collect();
                g = ConsumerGroup::restore("g", topics, stored, now).with_timeouts(1_000, 100);
                assert_eq!(
                    g.state(),
                    state,
                    "restored differently from what was stored"
                );
                (false, 0)
            }
        };
        if refused {
            assert_eq!(
                before,
                format!("{:?}", g.members().collect::<Vec<_>>()),
                "a refused heartbeat of m{member} changed the group"
            );
        }
        // Members removed meanwhile (expired) are new consumers from now on.
        for c in consumers.iter_mut() {
            if c.joined && !g.members().any(|m| m.id == c.id) {
                *c = Consumer {
                    id: c.id.clone(),
                    ids: c.ids,
                    r#static: c.r#static,
                    ..Default::default()
                };
            }
        }
        check_group(&g, &epochs, &mut high);
    }
});
