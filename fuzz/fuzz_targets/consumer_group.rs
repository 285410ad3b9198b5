//! The classic consumer group protocol's core (`coordinator::consumer_groups`) driven by four
//! consumers (two of them may be static, KIP-345, sharing two group instance ids) joining,
//! syncing, heartbeating, leaving, committing and going silent in any order, as the Kafka face
//! drives it. After every step it checks what keeps a zombie consumer from committing for
//! partitions it no longer owns (PROTOCOL.md section 5, KIP-447 and KIP-345):
//! - a commit is accepted only from a current member, at the group's generation, under the
//!   group instance id that member holds (and for a plain commit, not while the group waits
//!   for its assignment);
//! - a group instance id is held by one member at most, and a member replaced by a new
//!   instance is fenced;
//! - the generation never goes down, but at a coordinator restart (the `Restart` step: the
//!   group is restored from what the shell stored, [`GroupMembership::to_store`], which it
//!   does before a JoinGroup or SyncGroup answer, at a LeaveGroup and at the periodic sweep),
//!   which brings it back no further than the last generation whose assignment was handed
//!   out; member ids are never handed out twice, across restarts too;
//! - a member is never handed two different assignments for one generation, across restarts
//!   (a generation handed out is stored, so a restart never forms it again otherwise);
//! - the leader of a completed round is a member; DescribeGroups shows exactly the members;
//! - no panic, whatever the input.

#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use coordinator::consumer_groups::{
    ClassicGroupRecord, CommitKind, GroupMembership, GroupState, JoinRequest,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Join {
        consumer: u8,
        instance: Option<bool>,
        v4: bool,
        protocol: bool,
    },
    JoinAnswer {
        consumer: u8,
    },
    Sync {
        consumer: u8,
    },
    SyncAnswer {
        consumer: u8,
    },
    Heartbeat {
        consumer: u8,
    },
    Leave {
        consumer: u8,
    },
    Commit {
        consumer: u8,
        transactional: bool,
        instance: Option<bool>,
        generation_offset: i8,
    },
    Time {
        ms: u16,
    },
    /// The coordinator restarts: the group is restored from what was stored.
    Restart,
}

/// What the shell keeps beside the group: the stored record, the lives so far, and what was
/// handed out.
#[derive(Default)]
struct Shell {
    /// What storage holds.
    disk: Option<ClassicGroupRecord>,
    /// Restarts so far.
    lives: u32,
    /// Per (member id, generation): the assignment a SyncGroup answer handed out.
    assigned: BTreeMap<(String, i32), Vec<u8>>,
    /// The highest generation a SyncGroup answer handed out since the group was last removed
    /// from storage.
    answered: i32,
}

impl Shell {
    /// Stores what the group asks to be stored, as the shell does before an answer.
    fn settle(&mut self, group: &mut GroupMembership) {
        if let Some(record) = group.to_store() {
            // Through JSON, as the shell stores it.
            let bytes = record.as_ref().map(|r| serde_json::to_vec(r).unwrap());
            self.disk = bytes.map(|b| serde_json::from_slice(&b).unwrap());
            if self.disk.is_none() {
                self.answered = 0;
            }
            group.stored(record);
        }
    }
}

/// What one consumer process believes: its member id and the generation it was given.
#[derive(Clone, Debug, Default)]
struct Consumer {
    member_id: String,
    generation: i32,
    instance: Option<String>,
}

fuzz_target!(|ops: Vec<Op>| {
    // Four consumers and `group.max.size` 3: the fourth is refused at times.
    let mut group = GroupMembership::with_initial_delay("g", 50)
        .with_incarnation("1.1.1")
        .with_max_size(3);
    let mut consumers = vec![Consumer::default(); 4];
    let mut handed_out: BTreeSet<String> = BTreeSet::new();
    let mut now: i64 = 1_000_000;
    let mut generation = group.generation();
    let mut shell = Shell::default();
    for op in ops.into_iter().take(200) {
        now += 1;
        if let Op::Restart = op {
            shell.lives += 1;
            let incarnation = format!("1.{}.1", shell.lives + 1);
            group = match shell.disk.clone() {
                Some(record) => GroupMembership::restore("g", 50, record, now),
                None => GroupMembership::with_initial_delay("g", 50),
            }
            .with_incarnation(&incarnation)
            .with_max_size(3);
            assert!(
                group.generation() >= shell.answered,
                "restored at {} below generation {} handed out",
                group.generation(),
                shell.answered
            );
            assert_eq!(
                group.to_store(),
                None,
                "a restored group is what was stored"
            );
        } else {
            step(
                &mut group,
                &mut consumers,
                &mut handed_out,
                &mut shell,
                &mut now,
                op,
            );
            assert!(group.generation() >= generation, "the generation went down");
        }
        generation = group.generation();
        invariants(&group);
    }
});

fn instance_name(which: Option<bool>) -> Option<String> {
    which.map(|b| if b { "a".into() } else { "b".into() })
}

fn step(
    group: &mut GroupMembership,
    consumers: &mut [Consumer],
    handed_out: &mut BTreeSet<String>,
    shell: &mut Shell,
    now: &mut i64,
    op: Op,
) {
    match op {
        Op::Join {
            consumer,
            instance,
            v4,
            protocol,
        } => {
            let c = &mut consumers[usize::from(consumer % 4)];
            if instance.is_some() {
                c.instance = instance_name(instance);
            }
            let request = JoinRequest {
                member_id: c.member_id.clone(),
                group_instance_id: c.instance.clone(),
                client_id: "fuzz".into(),
                client_host: "/127.0.0.1".into(),
                require_known_member_id: v4,
                session_timeout_ms: 6_000,
                rebalance_timeout_ms: 3_000,
                protocol_type: "consumer".into(),
                protocols: vec![(
                    if protocol { "range" } else { "roundrobin" }.into(),
                    vec![0, 1],
                )],
            };
            let known = c.member_id.clone();
            match group.join(request, *now) {
                Ok(id) | Err(coordinator::consumer_groups::GroupError::MemberIdRequired(id)) => {
                    if id != known {
                        assert!(
                            handed_out.insert(id.clone()),
                            "member id {id} handed out twice"
                        );
                    }
                    c.member_id = id;
                }
                Err(_) => {}
            }
        }
        Op::JoinAnswer { consumer } => {
            let c = &mut consumers[usize::from(consumer % 4)];
            if c.member_id.is_empty() {
                return;
            }
            if let Some(Ok(answer)) = group.join_result(&c.member_id) {
                assert_eq!(answer.member_id, c.member_id);
                assert!(answer.generation <= group.generation());
                shell.settle(group);
                c.generation = answer.generation;
            }
        }
        Op::Sync { consumer } => {
            let c = &consumers[usize::from(consumer % 4)];
            if c.member_id.is_empty() {
                return;
            }
            // A leader assigns every member listed; a follower sends nothing.
            let assignments = group
                .member_ids()
                .into_iter()
                .map(|m| (m, vec![7]))
                .collect();
            let _ = group.sync(&c.member_id, c.generation, assignments, *now);
        }
        Op::SyncAnswer { consumer } => {
            let c = &consumers[usize::from(consumer % 4)];
            if c.member_id.is_empty() {
                return;
            }
            if let Some(Ok(assignment)) = group.sync_result(&c.member_id, c.generation) {
                shell.settle(group);
                assert_eq!(group.to_store(), None, "answered before stored");
                let key = (c.member_id.clone(), c.generation);
                let before = shell.assigned.insert(key, assignment.clone());
                assert!(
                    before.is_none_or(|b| b == assignment),
                    "{} got two assignments at generation {}",
                    c.member_id,
                    c.generation
                );
                shell.answered = shell.answered.max(c.generation);
            }
        }
        Op::Heartbeat { consumer } => {
            let c = &consumers[usize::from(consumer % 4)];
            if !c.member_id.is_empty() {
                let _ = group.heartbeat(&c.member_id, c.generation, *now);
            }
        }
        Op::Leave { consumer } => {
            let c = &mut consumers[usize::from(consumer % 4)];
            if !c.member_id.is_empty() {
                let fenced = group.fence_instance(&c.member_id, c.instance.as_deref());
                if fenced.is_ok() {
                    let _ = group.leave(&c.member_id, *now);
                    shell.settle(group);
                }
            }
        }
        Op::Commit {
            consumer,
            transactional,
            instance,
            generation_offset,
        } => {
            let c = &consumers[usize::from(consumer % 4)];
            let instance = instance_name(instance).or_else(|| c.instance.clone());
            let generation = c
                .generation
                .saturating_add(i32::from(generation_offset % 2));
            let kind = if transactional {
                CommitKind::Transactional
            } else {
                CommitKind::Plain
            };
            let accepted = group
                .check_commit(&c.member_id, generation, instance.as_deref(), kind)
                .is_ok();
            if accepted && !(c.member_id.is_empty() && generation < 0 && instance.is_none()) {
                assert!(
                    group.member_ids().contains(&c.member_id),
                    "a commit of a non-member {} was accepted",
                    c.member_id
                );
                assert_eq!(
                    generation,
                    group.generation(),
                    "an old generation committed"
                );
                if let Some(instance) = &instance {
                    assert_eq!(
                        group.static_member(instance),
                        Some(c.member_id.as_str()),
                        "a replaced static member committed"
                    );
                }
                if kind == CommitKind::Plain {
                    assert_ne!(group.state(), GroupState::CompletingRebalance);
                }
            }
        }
        Op::Time { ms } => {
            *now += i64::from(ms) * 4;
            group.tick(*now);
            // The periodic sweep stores what expiry changed.
            if ms % 2 == 0 {
                shell.settle(group);
            }
        }
        Op::Restart => unreachable!("handled by the caller"),
    }
}

fn invariants(group: &GroupMembership) {
    let members = group.member_ids();
    // Where the leader acts (it assigns while the group completes its round; it is told so
    // in a Stable group), it is a member. (A leader gone during a round is replaced when the
    // round completes.)
    if matches!(
        group.state(),
        GroupState::CompletingRebalance | GroupState::Stable
    ) {
        let leader = group.leader().expect("a round completed with a leader");
        assert!(
            members.iter().any(|m| m == leader),
            "leader {leader} is no member"
        );
    }
    let described: Vec<String> = group
        .describe()
        .members
        .into_iter()
        .map(|m| m.member_id)
        .collect();
    assert_eq!(described, members);
    for instance in ["a", "b"] {
        if let Some(holder) = group.static_member(instance) {
            assert!(
                members.iter().any(|m| m == holder),
                "instance {instance} held by {holder}, no member"
            );
        }
    }
    if group.state() == GroupState::Empty {
        assert!(members.is_empty(), "an Empty group with members");
    }
}
