//! Kafka's DeleteGroups and OffsetDelete as decisions: given what the coordinator holds of a
//! group (its membership, its committed offsets, the partitions a transaction has offsets
//! pending for), which offsets go and what each caller is answered. Pure: the Kafka face
//! gathers the facts under the group's locks (`service/groups.rs`) and deletes what these
//! functions return.
//!
//! Kafka's rules (its group coordinator's `handleDeleteGroups` / `handleDeleteOffsets`):
//! - a group is deleted only while Empty (NON_EMPTY_GROUP otherwise); one this coordinator
//!   knows nothing of (no membership, no committed offsets, no transaction's offsets pending)
//!   is GROUP_ID_NOT_FOUND;
//! - a partition's offset may be deleted from a group with members only if the group is a
//!   consumer group not subscribed to the partition's topic (GROUP_SUBSCRIBED_TO_TOPIC); a
//!   non-consumer group with members is NON_EMPTY_GROUP; a partition that does not exist is
//!   UNKNOWN_TOPIC_OR_PARTITION.
//!
//! Past Kafka: offsets a transaction has committed for the group but whose marker has not been
//! applied (KIP-447's pending offsets) keep the group in use. DeleteGroups is NON_EMPTY_GROUP
//! and OffsetDelete is CONCURRENT_TRANSACTIONS for those partitions, until the marker lands.
//! Otherwise the transaction's COMMIT, applied after the deletion, would bring back offsets
//! the operator just deleted. The group's marker fences are never deleted, so a marker sent
//! again after a deletion is still recognised as applied and puts nothing back.

use std::collections::BTreeSet;

use cluster::TopicPartition;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription};
use kafka_protocol::protocol::Decodable;

/// What the coordinator holds of a group's membership when an admin request comes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership {
    /// No membership (none was ever created here, or it was dropped while idle).
    None,
    /// Empty, with nobody joined, waiting, or holding a member id.
    Idle,
    /// Members, or a request at work on the group.
    Active {
        /// Its protocol type is "consumer", so its members' subscriptions can be read.
        consumer: bool,
        /// The topics its members subscribe to, in any protocol they offer; `None` when a
        /// subscription could not be read (then every topic counts as subscribed).
        subscribed: Option<BTreeSet<String>>,
    },
}

/// Why an admin request on a group, or on one of its partitions, was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// GROUP_ID_NOT_FOUND.
    #[error("group {0:?} does not exist here")]
    GroupIdNotFound(String),
    /// NON_EMPTY_GROUP.
    #[error("group {group:?} is in use: {why}")]
    NonEmptyGroup {
        /// The group.
        group: String,
        /// What uses it.
        why: String,
    },
    /// GROUP_SUBSCRIBED_TO_TOPIC.
    #[error("a member of the group subscribes to topic {0:?}")]
    GroupSubscribedToTopic(String),
    /// CONCURRENT_TRANSACTIONS: a transaction's offset for the partition awaits its marker.
    #[error("a transaction's offset for {0} is not applied yet; retry once it is")]
    PendingTransaction(TopicPartition),
    /// UNKNOWN_TOPIC_OR_PARTITION.
    #[error("{0} does not exist")]
    UnknownTopicOrPartition(TopicPartition),
}

/// DeleteGroups for one group: the partitions whose committed offsets are deleted (every one
/// in `committed`), or why the group stays.
pub fn delete_group(
    group: &str,
    membership: &Membership,
    committed: &BTreeSet<TopicPartition>,
    pending: &[TopicPartition],
) -> Result<Vec<TopicPartition>, AdminError> {
    if let Membership::Active { .. } = membership {
        return Err(AdminError::NonEmptyGroup {
            group: group.to_string(),
            why: "it has members".into(),
        });
    }
    if let Some(tp) = pending.first() {
        return Err(AdminError::NonEmptyGroup {
            group: group.to_string(),
            why: format!("a transaction's offset for {tp} is not applied yet"),
        });
    }
    if *membership == Membership::None && committed.is_empty() {
        return Err(AdminError::GroupIdNotFound(group.to_string()));
    }
    Ok(committed.iter().cloned().collect())
}

/// One partition's answer to OffsetDelete (`Ok`: its offset is deleted, or it had none).
pub type PartitionOutcome = (TopicPartition, Result<(), AdminError>);

/// OffsetDelete: every requested partition with its answer (the `Ok` ones are deleted), or the
/// group's error (then nothing is deleted). `exists` says whether a partition exists.
pub fn delete_offsets(
    group: &str,
    membership: &Membership,
    committed: &BTreeSet<TopicPartition>,
    pending: &[TopicPartition],
    requested: &[TopicPartition],
    exists: impl Fn(&TopicPartition) -> bool,
) -> Result<Vec<PartitionOutcome>, AdminError> {
    let subscribed = match membership {
        Membership::None if committed.is_empty() && pending.is_empty() => {
            return Err(AdminError::GroupIdNotFound(group.to_string()))
        }
        Membership::None | Membership::Idle => None,
        Membership::Active {
            consumer: false, ..
        } => {
            return Err(AdminError::NonEmptyGroup {
                group: group.to_string(),
                why: "it has members of a protocol other than \"consumer\"".into(),
            })
        }
        Membership::Active { subscribed, .. } => Some(subscribed.as_ref()),
    };
    Ok(requested
        .iter()
        .map(|tp| {
            let outcome = if !exists(tp) {
                Err(AdminError::UnknownTopicOrPartition(tp.clone()))
            } else if subscribed.is_some_and(|s| s.is_none_or(|s| s.contains(&tp.topic))) {
                Err(AdminError::GroupSubscribedToTopic(tp.topic.clone()))
            } else if pending.contains(tp) {
                Err(AdminError::PendingTransaction(tp.clone()))
            } else {
                Ok(())
            };
            (tp.clone(), outcome)
        })
        .collect())
}

/// The topics named by consumer-protocol subscriptions (each a JoinGroup's protocol metadata:
/// a version, then Kafka's `ConsumerProtocolSubscription`); `None` if one cannot be read. A
/// version newer than this reader knows is read as the newest it knows (later versions only
/// append fields), as Kafka's `ConsumerProtocol` does.
pub fn subscribed_topics<'a>(
    subscriptions: impl IntoIterator<Item = &'a [u8]>,
) -> Option<BTreeSet<String>> {
    const NEWEST: i16 = 3;
    let mut topics = BTreeSet::new();
    for metadata in subscriptions {
        let version = i16::from_be_bytes(metadata.get(..2)?.try_into().ok()?);
        if version < 0 {
            return None;
        }
        let mut buf = bytes::Bytes::copy_from_slice(&metadata[2..]);
        let subscription =
            ConsumerProtocolSubscription::decode(&mut buf, version.min(NEWEST)).ok()?;
        topics.extend(subscription.topics.iter().map(|t| t.to_string()));
    }
    Some(topics)
}

/// The partitions of a consumer-protocol assignment (a SyncGroup's assignment bytes: a
/// version, then Kafka's `ConsumerProtocolAssignment`); `None` if it cannot be read (empty
/// bytes are no partitions). A newer version is read as the newest this reader knows.
pub fn assigned_partitions(assignment: &[u8]) -> Option<Vec<TopicPartition>> {
    const NEWEST: i16 = 3;
    if assignment.is_empty() {
        return Some(Vec::new());
    }
    let version = i16::from_be_bytes(assignment.get(..2)?.try_into().ok()?);
    if version < 0 {
        return None;
    }
    let mut buf = bytes::Bytes::copy_from_slice(&assignment[2..]);
    let decoded = ConsumerProtocolAssignment::decode(&mut buf, version.min(NEWEST)).ok()?;
    Some(
        decoded
            .assigned_partitions
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| TopicPartition::new(t.topic.as_str(), *p))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition::new(topic, partition)
    }

    /// A consumer-protocol assignment's partitions, at any version this reader knows or a
    /// newer one; no bytes are no partitions; damaged bytes or a negative version are `None`,
    /// never a panic.
    #[test]
    fn assigned_partitions_read_the_consumer_protocol() {
        use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as Assigned;
        let encoded = |version: i16| {
            let mut a = ConsumerProtocolAssignment::default();
            let mut t = Assigned::default();
            t.topic = kafka_protocol::messages::TopicName(StrBytes::from_static_str("input"));
            t.partitions = vec![2, 0];
            a.assigned_partitions = vec![t];
            let mut bytes = bytes::BytesMut::from(&version.to_be_bytes()[..]);
            a.encode(&mut bytes, version.min(3)).unwrap();
            bytes.to_vec()
        };
        for version in [0, 1, 3, 7] {
            assert_eq!(
                assigned_partitions(&encoded(version)),
                Some(vec![tp("input", 2), tp("input", 0)]),
                "version {version}"
            );
        }
        assert_eq!(assigned_partitions(&[]), Some(vec![]));
        let mut negative = encoded(0);
        negative[..2].copy_from_slice(&(-1i16).to_be_bytes());
        assert_eq!(assigned_partitions(&negative), None);
        assert_eq!(assigned_partitions(&[0]), None);
        assert_eq!(assigned_partitions(&[0, 0, 0xff, 0xff, 0xff]), None);
        let whole = encoded(0);
        for cut in 1..whole.len() {
            let _ = assigned_partitions(&whole[..cut]);
        }
    }

    fn set(tps: &[TopicPartition]) -> BTreeSet<TopicPartition> {
        tps.iter().cloned().collect()
    }

    fn consumer(topics: &[&str]) -> Membership {
        Membership::Active {
            consumer: true,
            subscribed: Some(topics.iter().map(|t| t.to_string()).collect()),
        }
    }

    #[test]
    fn a_group_is_deleted_only_when_empty_and_no_transaction_holds_its_offsets() {
        let committed = set(&[tp("in", 0), tp("in", 1)]);
        for membership in [Membership::None, Membership::Idle] {
            assert_eq!(
                delete_group("g", &membership, &committed, &[]),
                Ok(vec![tp("in", 0), tp("in", 1)])
            );
        }
        // An idle membership without offsets is a group (Empty); nothing at all is not.
        assert_eq!(
            delete_group("g", &Membership::Idle, &set(&[]), &[]),
            Ok(vec![])
        );
        assert_eq!(
            delete_group("g", &Membership::None, &set(&[]), &[]),
            Err(AdminError::GroupIdNotFound("g".into()))
        );
        assert!(matches!(
            delete_group("g", &consumer(&["in"]), &committed, &[]),
            Err(AdminError::NonEmptyGroup { why, .. }) if why.contains("members")
        ));
        // A transaction's offsets not applied yet: deleting now would let its COMMIT bring
        // them back after the deletion.
        assert!(matches!(
            delete_group("g", &Membership::None, &committed, &[tp("in", 1)]),
            Err(AdminError::NonEmptyGroup { why, .. }) if why.contains("not applied")
        ));
        assert!(matches!(
            delete_group("g", &Membership::None, &set(&[]), &[tp("in", 1)]),
            Err(AdminError::NonEmptyGroup { .. })
        ));
    }

    #[test]
    fn offsets_are_deleted_unless_subscribed_unknown_or_pending() {
        let committed = set(&[tp("in", 0), tp("other", 0)]);
        let exists = |t: &TopicPartition| t.topic != "gone";
        let requested = [tp("in", 0), tp("other", 0), tp("gone", 0), tp("other", 1)];
        let outcomes = |membership: &Membership, pending: &[TopicPartition]| {
            delete_offsets("g", membership, &committed, pending, &requested, exists)
        };
        // Empty: everything that exists, with or without an offset.
        assert_eq!(
            outcomes(&Membership::Idle, &[]),
            Ok(vec![
                (tp("in", 0), Ok(())),
                (tp("other", 0), Ok(())),
                (
                    tp("gone", 0),
                    Err(AdminError::UnknownTopicOrPartition(tp("gone", 0)))
                ),
                (tp("other", 1), Ok(())),
            ])
        );
        // A consumer group subscribed to "in": its offsets stay, "other"'s go.
        let active = outcomes(&consumer(&["in"]), &[]).unwrap();
        assert_eq!(
            active[0].1,
            Err(AdminError::GroupSubscribedToTopic("in".into()))
        );
        assert_eq!(active[1].1, Ok(()));
        // A subscription that could not be read covers every topic.
        let unreadable = Membership::Active {
            consumer: true,
            subscribed: None,
        };
        let outcome = outcomes(&unreadable, &[]).unwrap();
        assert!(outcome[..2]
            .iter()
            .all(|(_, r)| matches!(r, Err(AdminError::GroupSubscribedToTopic(_)))));
        // A non-consumer group with members: the whole request.
        let connect = Membership::Active {
            consumer: false,
            subscribed: None,
        };
        assert!(matches!(
            outcomes(&connect, &[]),
            Err(AdminError::NonEmptyGroup { .. })
        ));
        // A pending transactional offset.
        assert_eq!(
            outcomes(&Membership::None, &[tp("other", 0)]).unwrap()[1].1,
            Err(AdminError::PendingTransaction(tp("other", 0)))
        );
        // Nothing known of the group.
        let nothing = delete_offsets("g", &Membership::None, &set(&[]), &[], &requested, exists);
        assert_eq!(nothing, Err(AdminError::GroupIdNotFound("g".into())));
        // Only a transaction's pending offsets: the group exists (as Kafka creates it on a
        // TxnOffsetCommit).
        let pending = [tp("in", 0)];
        let only_pending = delete_offsets(
            "g",
            &Membership::None,
            &set(&[]),
            &pending,
            &requested,
            exists,
        );
        assert_eq!(
            only_pending.unwrap()[0].1,
            Err(AdminError::PendingTransaction(tp("in", 0)))
        );
    }

    fn subscription(version: i16, topics: &[&str]) -> Vec<u8> {
        let mut s = ConsumerProtocolSubscription::default();
        s.topics = topics
            .iter()
            .map(|t| StrBytes::from_string(t.to_string()))
            .collect();
        let mut buf = bytes::BytesMut::new();
        buf.extend_from_slice(&version.to_be_bytes());
        s.encode(&mut buf, version.min(3)).unwrap();
        buf.to_vec()
    }

    #[test]
    fn subscriptions_are_read_from_every_version_and_garbage_reads_as_unknown() {
        let a = subscription(0, &["in", "other"]);
        let b = subscription(3, &["third"]);
        let newer = subscription(7, &["later"]);
        assert_eq!(
            subscribed_topics([a.as_slice(), b.as_slice(), newer.as_slice()]),
            Some(["in", "other", "third", "later"].map(String::from).into())
        );
        assert_eq!(subscribed_topics([]), Some(BTreeSet::new()));
        for garbage in [
            &[][..],
            &[0][..],
            &[0xff, 0xff, 1][..],
            &[0, 0, 0, 9, 1][..],
        ] {
            assert_eq!(
                subscribed_topics([a.as_slice(), garbage]),
                None,
                "{garbage:?}"
            );
        }
    }
}
