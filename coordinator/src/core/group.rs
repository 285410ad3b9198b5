//! The group coordinator's side of section 7: a WriteGroupOffsetMarker is fenced per group by
//! the same rule a partition leader applies to WriteTxnMarkers ([`cluster::marker_fence`]), and
//! [`write_group_marker`] says what an accepted marker writes.

use std::collections::{BTreeMap, HashMap};

use cluster::marker_fence::{self, Decision, Fenced};
use cluster::{NodeId, ProducerEpoch, ProducerId, TopicPartition};

use super::{PendingOffsets, TransactionVersion, TxnError, TxnResult};

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
    /// share an epoch, so an equal epoch is the next transaction, unless
    /// `transaction_number` says it is the same one.
    pub transaction_version: TransactionVersion,
    /// The transaction's number among its transactional id's (1, 2, ...: increasing per PID,
    /// whatever the version); 0 when the sender did not say (a transaction begun before
    /// the numbers existed).
    pub transaction_number: u64,
}

/// What the group's coordinator has recorded, for one group, about a marker's sender: the
/// fencing state [`write_group_marker`] checks a marker against (the shared
/// [`cluster::marker_fence::Recorded`]), and the number of the PID's last transaction applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupMarkerFence {
    /// The epoch of the last marker applied for the PID (`None`: never).
    pub producer_epoch: Option<ProducerEpoch>,
    /// The highest generation seen from the marker's coordinator (`None`: never).
    pub coordinator_generation: Option<i64>,
    /// The number of the last transaction of the PID applied (`None`: never, or not known: a
    /// marker without a number, or recorded before the numbers existed).
    pub transaction_number: Option<u64>,
}

impl GroupMarkerFence {
    /// The part the shared marker rule checks.
    pub fn recorded(&self) -> marker_fence::Recorded {
        marker_fence::Recorded {
            producer_epoch: self.producer_epoch,
            coordinator_generation: self.coordinator_generation,
        }
    }
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
    /// The transaction number to record for `producer_id` (`None`: not known).
    pub transaction_number: Option<u64>,
    /// The coordinator whose generation is recorded.
    pub coordinator_id: NodeId,
    /// The generation to record for `coordinator_id`.
    pub coordinator_generation: i64,
    /// The marker ends its transaction here (applied): the pending offsets of every epoch of
    /// the PID end with it. `false`: the same marker again, from a newer generation of its
    /// coordinator, which records only that generation (see [`PendingTxnOffsets::complete`]).
    pub ends_transaction: bool,
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
/// | epoch equal, version 1, a higher transaction number (or none known) | NONE   | as for a higher epoch |
/// | epoch above, or a PID never seen              | NONE                           | COMMIT: offsets; both: epoch, number, generation |
///
/// Why this is enough: every transaction ends with an epoch bump, so each transaction's
/// marker carries an epoch no earlier marker of its PID had, and a PID's next transaction
/// cannot end before this one's markers were all acknowledged. A late COMMIT of an older
/// transaction therefore always has a lower epoch than what the group already applied, and
/// cannot move its offsets backwards. Equal epoch with another result or other offsets cannot
/// happen (one transaction, one decision); it is answered as a repeat all the same.
///
/// Version 1 keeps the epoch across transactions, so there the transaction number decides: a
/// marker sent again (its coordinator restarted with the transaction still in Prepare*, or an
/// earlier attempt delayed in the network) carries the number already applied and writes no
/// offsets, even when another producer of the group committed newer ones since; the next
/// transaction carries a higher one. (Kafka's version 1 applies such a late repeat to whatever
/// is pending; this project's marker carries the offsets, so it would move them back.)
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
        transaction_number,
    } = marker;
    if producer_id < 0 || epoch < 0 || coordinator_generation < 0 {
        return Err(TxnError::InvalidRequest(format!(
            "group marker with producer {producer_id}, epoch {epoch}, generation \
             {coordinator_generation}: none may be negative"
        )));
    }
    let recorded = |fenced| match fenced {
        Fenced::InvalidProducerEpoch { recorded, .. } => TxnError::InvalidProducerEpoch(format!(
            "group {group_id:?}: marker for producer {producer_id} has epoch {epoch}, older \
             than the {recorded} already applied"
        )),
        Fenced::CoordinatorFenced { recorded, .. } => {
            TxnError::TransactionCoordinatorFenced(format!(
                "group {group_id:?}: marker from coordinator {coordinator_id} generation \
                 {coordinator_generation}, older than {recorded}"
            ))
        }
    };
    let number = (transaction_number > 0).then_some(transaction_number);
    let decision = match marker_fence::check(fence.recorded(), epoch, coordinator_generation) {
        Err(fenced) => return Err(recorded(fenced)),
        // Version 1 keeps the epoch across transactions: at an equal epoch, a marker is the
        // next transaction unless both numbers are known and it is not above the one applied.
        Ok(decision @ (Decision::Nothing | Decision::RecordGeneration))
            if transaction_version == TransactionVersion::V1 =>
        {
            match (number, fence.transaction_number) {
                (Some(n), Some(applied)) if n <= applied => decision,
                _ => Decision::Apply,
            }
        }
        Ok(decision) => decision,
    };
    let (offsets, transaction_number) = match decision {
        Decision::Nothing => return Ok(None),
        Decision::RecordGeneration => (PendingOffsets::new(), fence.transaction_number),
        Decision::Apply => match result {
            TxnResult::Commit => (offsets, number),
            TxnResult::Abort => (PendingOffsets::new(), number),
        },
    };
    Ok(Some(GroupMarkerWrite {
        group_id,
        offsets,
        producer_id,
        producer_epoch: epoch,
        transaction_number,
        coordinator_id,
        coordinator_generation,
        ends_transaction: decision == Decision::Apply,
    }))
}

/// KIP-447's pending transactional offsets, as a group's coordinator tracks them: a
/// TxnOffsetCommit that reached this node (the Kafka face, where Kafka clients send it) is
/// pending for its partitions until the transaction's marker for the group is applied here. An
/// OffsetFetch that requires stable offsets (read_committed Kafka consumers) gets
/// UNSTABLE_OFFSET_COMMIT for such a partition and retries, instead of reading the offset from
/// before a transaction that has already committed (its EndTxn answered) but whose marker is
/// still on its way. A consumer that took the partition over in a rebalance would otherwise
/// start from that older offset and process those records a second time.
///
/// Each commit holds its partitions under its (PID, epoch), and every commit counts, not only
/// the first one to name a partition: [`Self::record`] takes a hold, and [`Self::forget`] (the
/// transaction's coordinator refused that commit) gives back only that commit's hold. A partition
/// stays pending while any commit that was accepted, or whose answer is not known yet, holds
/// it. So a refused commit (a zombie at an older epoch of the same PID, or a failed commit of
/// the same transaction) never clears what an accepted one relies on. A marker ends the holds of
/// the transaction it closes ([`Self::complete`]): every epoch of the PID when it is applied
/// (the transaction is still in Prepare* then, so no later transaction of the PID has an accepted
/// commit yet), only the epochs before the marker's when it is a repeat (the next transaction
/// of the PID runs at the marker's epoch, under either version, and may already have commits
/// here).
///
/// The service keeps this picture durable (`Storage::put_pending_txn_offsets`, one record per
/// group, PID, epoch and partition, kept while a commit of that epoch holds it), so a
/// restarted coordinator still
/// answers UNSTABLE_OFFSET_COMMIT until the marker, which the transaction's coordinator re-sends,
/// arrives. Each entry carries the time it was recorded, and one older than `max_age_ms` no
/// longer counts ([`Self::is_pending`]): no transaction lives longer than the maximum
/// transaction timeout, so an entry that outlives twice that (the service's choice) lost its
/// transaction's marker for good (a crash between recording it and learning that the
/// transaction refused the commit), and must not keep a partition unreadable forever.
///
/// Both faces track it: Kafka clients and our own client send TxnOffsetCommit to the group's
/// coordinator, and a node that does not coordinate the group takes only a commit the group's
/// coordinator handed on. CAVEATS: the disk keeps the epoch but not the count of the holds:
/// an entry loaded at start is one hold (the commits of that epoch are one transaction, which
/// one marker ends). An entry written before the disk kept epochs loads with
/// [`Self::UNKNOWN_EPOCH`], so any marker of its PID ends it.
#[derive(Clone, Debug, Default)]
pub struct PendingTxnOffsets {
    /// Group -> partition -> the commits holding it.
    groups: HashMap<String, BTreeMap<TopicPartition, Holds>>,
}

/// The commits holding one partition pending, by (PID, epoch).
type Holds = BTreeMap<(ProducerId, ProducerEpoch), Hold>;

/// The commits of one (PID, epoch) holding one partition pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hold {
    /// When the last of them was recorded (Unix ms).
    recorded_ms: i64,
    /// How many: accepted, or not answered yet (a refused one gave its hold back).
    commits: u32,
}

impl PendingTxnOffsets {
    /// The epoch of an entry loaded from a disk written before it kept epochs: below every
    /// epoch, so any marker of the PID ends it.
    pub const UNKNOWN_EPOCH: ProducerEpoch = -1;

    /// A TxnOffsetCommit of (`producer_id`, `epoch`) for `partitions` of `group` is about to be
    /// recorded by the transaction (at `now_ms`): they are pending, held by this commit until
    /// [`Self::forget`] gives the hold back (refused) or [`Self::complete`] ends the
    /// transaction.
    pub fn record(
        &mut self,
        group: &str,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        partitions: impl IntoIterator<Item = TopicPartition>,
        now_ms: i64,
    ) {
        let pending = self.groups.entry(group.to_string()).or_default();
        for tp in partitions {
            let hold = pending
                .entry(tp)
                .or_default()
                .entry((producer_id, epoch))
                .or_insert(Hold {
                    recorded_ms: now_ms,
                    commits: 0,
                });
            hold.recorded_ms = now_ms;
            hold.commits += 1;
        }
    }

    /// The commit of (`producer_id`, `epoch`) that [`Self::record`] announced for `partitions`
    /// was refused: it gives its holds back. Returns the partitions that (`producer_id`,
    /// `epoch`) no longer holds at all (what the disk no longer needs).
    pub fn forget(
        &mut self,
        group: &str,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        partitions: &[TopicPartition],
    ) -> Vec<(TopicPartition, ProducerEpoch)> {
        let mut released = Vec::new();
        let Some(pending) = self.groups.get_mut(group) else {
            return released;
        };
        for tp in partitions {
            let Some(holds) = pending.get_mut(tp) else {
                continue;
            };
            if let Some(hold) = holds.get_mut(&(producer_id, epoch)) {
                hold.commits -= 1;
                if hold.commits == 0 {
                    holds.remove(&(producer_id, epoch));
                    released.push((tp.clone(), epoch));
                }
            }
            if holds.is_empty() {
                pending.remove(tp);
            }
        }
        if pending.is_empty() {
            self.groups.remove(group);
        }
        released
    }

    /// A marker of `producer_id` was applied for `group` (COMMIT or ABORT): the commits of the
    /// transaction it ends are no longer pending. `before_epoch`: `None` ends every epoch of
    /// the PID (a marker applied: no later transaction has accepted commits yet), `Some(e)`
    /// only the epochs below `e` (the same marker again, at `e`: the PID's next transaction
    /// runs at `e`). Returns the (partition, epoch) holds that ended (what the disk no longer
    /// needs).
    pub fn complete(
        &mut self,
        group: &str,
        producer_id: ProducerId,
        before_epoch: Option<ProducerEpoch>,
    ) -> Vec<(TopicPartition, ProducerEpoch)> {
        let mut released = Vec::new();
        let Some(pending) = self.groups.get_mut(group) else {
            return released;
        };
        pending.retain(|tp, holds| {
            holds.retain(|&(pid, epoch), _| {
                let ends = pid == producer_id && before_epoch.is_none_or(|e| epoch < e);
                if ends {
                    released.push((tp.clone(), epoch));
                }
                !ends
            });
            !holds.is_empty()
        });
        if pending.is_empty() {
            self.groups.remove(group);
        }
        released
    }

    /// The partitions of `group` that [`Self::is_pending`] (same arguments), in order.
    pub fn pending_partitions(
        &self,
        group: &str,
        now_ms: i64,
        max_age_ms: i64,
    ) -> Vec<TopicPartition> {
        self.groups.get(group).map_or_else(Vec::new, |pending| {
            pending
                .keys()
                .filter(|tp| self.is_pending(group, tp, now_ms, max_age_ms))
                .cloned()
                .collect()
        })
    }

    /// Whether a transaction has an offset for `tp` of `group` that is not applied yet and
    /// was recorded less than `max_age_ms` before `now_ms`.
    pub fn is_pending(
        &self,
        group: &str,
        tp: &TopicPartition,
        now_ms: i64,
        max_age_ms: i64,
    ) -> bool {
        self.groups
            .get(group)
            .and_then(|pending| pending.get(tp))
            .is_some_and(|holds| {
                holds
                    .values()
                    .any(|hold| now_ms.saturating_sub(hold.recorded_ms) < max_age_ms)
            })
    }
}

#[cfg(test)]
mod tests {
    use cluster::TopicPartition;

    use super::*;

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
            transaction_number: 0,
        }
    }

    fn fence(epoch: Option<ProducerEpoch>, generation: Option<i64>) -> GroupMarkerFence {
        GroupMarkerFence {
            producer_epoch: epoch,
            coordinator_generation: generation,
            transaction_number: None,
        }
    }

    fn v1(pid: ProducerId, epoch: ProducerEpoch, generation: i64, number: u64) -> GroupMarker {
        GroupMarker {
            transaction_version: TransactionVersion::V1,
            transaction_number: number,
            ..group_marker(pid, epoch, generation)
        }
    }

    fn numbered(fence: GroupMarkerFence, number: u64) -> GroupMarkerFence {
        GroupMarkerFence {
            transaction_number: Some(number),
            ..fence
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
                transaction_number: None,
                coordinator_id: 1,
                coordinator_generation: 2,
                ends_transaction: true,
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
        assert!(
            !write.ends_transaction,
            "the transaction ended the first time"
        );
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
    fn v1_group_marker_sent_again_is_a_repeat_by_its_transaction_number() {
        // Transaction 4 of the PID was applied at epoch 3.
        let applied = numbered(fence(Some(3), Some(2)), 4);
        // Its marker again (a delayed attempt): nothing, although version 1 keeps the epoch.
        assert_eq!(write_group_marker(&applied, v1(7, 3, 2, 4)), Ok(None));
        // From its coordinator's next generation (a restart with the transaction in Prepare*):
        // only the generation, the offsets stay as they are, the number recorded stays.
        let write = write_group_marker(&applied, v1(7, 3, 3, 4))
            .unwrap()
            .unwrap();
        assert!(write.offsets.is_empty(), "never moves offsets back");
        assert_eq!(write.transaction_number, Some(4));
        assert_eq!(write.coordinator_generation, 3);
        assert!(!write.ends_transaction);
        // A lower number at the same epoch cannot be newer either.
        assert_eq!(write_group_marker(&applied, v1(7, 3, 2, 2)), Ok(None));
        // The next transaction, at the same epoch: applied, its number recorded.
        let write = write_group_marker(&applied, v1(7, 3, 2, 5))
            .unwrap()
            .unwrap();
        assert_eq!(write.offsets.len(), 1);
        assert_eq!(write.transaction_number, Some(5));
        assert!(write.ends_transaction);
    }

    #[test]
    fn v1_group_marker_without_both_numbers_is_the_next_transaction() {
        // A marker that carries no number (0), or a group that recorded none: as before the
        // numbers existed, an equal epoch is the next transaction.
        for (f, m) in [
            (numbered(fence(Some(3), Some(2)), 4), v1(7, 3, 2, 0)),
            (fence(Some(3), Some(2)), v1(7, 3, 2, 4)),
        ] {
            let write = write_group_marker(&f, m).unwrap().expect("applied");
            assert_eq!(write.offsets.len(), 1);
            assert!(write.ends_transaction);
        }
        // Version 2 never needs the number: an equal epoch is a repeat whatever it says.
        let mut marker = group_marker(7, 3, 2);
        marker.transaction_number = 9;
        assert_eq!(
            write_group_marker(&numbered(fence(Some(3), Some(2)), 4), marker),
            Ok(None)
        );
        // And a higher epoch applies whatever the numbers.
        let write = write_group_marker(&numbered(fence(Some(3), Some(2)), 4), v1(7, 4, 2, 1))
            .unwrap()
            .unwrap();
        assert!(write.ends_transaction);
        assert_eq!(write.transaction_number, Some(1));
    }

    // ---- pending transactional offsets (KIP-447) ------------------------------------------

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("input", p)
    }

    fn is(p: &PendingTxnOffsets, g: &str, t: TopicPartition) -> bool {
        p.is_pending(g, &t, 1_000, 60_000)
    }

    #[test]
    fn offsets_are_pending_from_the_commit_until_the_marker() {
        let mut pending = PendingTxnOffsets::default();
        assert!(!is(&pending, "g", tp(0)));
        pending.record("g", 7, 0, [tp(0), tp(1)], 10);
        pending.record("g", 7, 0, [tp(1), tp(2)], 20);
        pending.record("g", 8, 0, [tp(1)], 30);
        assert!(is(&pending, "g", tp(0)));
        assert!(!is(&pending, "other", tp(0)));
        // PID 7's marker: only PID 8's partition stays pending; the disk may drop PID 7's.
        assert_eq!(
            pending.complete("g", 7, None),
            vec![(tp(0), 0), (tp(1), 0), (tp(2), 0)]
        );
        assert!(
            pending.complete("g", 7, None).is_empty(),
            "nothing left of PID 7"
        );
        assert!(!is(&pending, "g", tp(0)));
        assert!(is(&pending, "g", tp(1)));
        assert!(!is(&pending, "g", tp(2)));
        pending.complete("g", 8, None);
        assert!(!is(&pending, "g", tp(1)));
        assert!(pending.groups.is_empty());
    }

    #[test]
    fn a_refused_commit_gives_back_only_its_own_hold() {
        let mut pending = PendingTxnOffsets::default();
        pending.record("g", 7, 0, [tp(0)], 10);
        pending.record("g", 7, 0, [tp(0), tp(1)], 20);
        // The second commit of the transaction is refused: the first one still holds tp(0).
        assert_eq!(pending.forget("g", 7, 0, &[tp(0), tp(1)]), vec![(tp(1), 0)]);
        assert!(is(&pending, "g", tp(0)), "the earlier commit stays");
        assert!(!is(&pending, "g", tp(1)));
        // A hold given back twice (or never taken) changes nothing.
        assert!(pending.forget("g", 7, 0, &[tp(1)]).is_empty());
        pending.complete("g", 7, None);
        assert!(pending.groups.is_empty());
    }

    #[test]
    fn a_refused_zombie_never_clears_what_the_live_instance_committed() {
        // The zombie at (7, 0) records first, the live instance at (7, 1) is accepted, then the
        // zombie's commit is refused (PRODUCER_FENCED).
        let mut pending = PendingTxnOffsets::default();
        pending.record("g", 7, 0, [tp(0)], 10);
        pending.record("g", 7, 1, [tp(0)], 20);
        assert_eq!(
            pending.forget("g", 7, 0, &[tp(0)]),
            vec![(tp(0), 0)],
            "the disk drops the zombie's record only"
        );
        assert!(is(&pending, "g", tp(0)));
        // In the other order too.
        let mut pending = PendingTxnOffsets::default();
        pending.record("g", 7, 1, [tp(0)], 10);
        pending.record("g", 7, 0, [tp(0)], 20);
        assert_eq!(pending.forget("g", 7, 0, &[tp(0)]), vec![(tp(0), 0)]);
        assert!(is(&pending, "g", tp(0)));
        assert_eq!(pending.forget("g", 7, 1, &[tp(0)]), vec![(tp(0), 1)]);
        assert!(pending.groups.is_empty());
    }

    #[test]
    fn a_repeated_marker_ends_only_the_epochs_before_its_own() {
        let mut pending = PendingTxnOffsets::default();
        // Left of the transaction at epoch 3 (and loaded from disk without an epoch); the next
        // transaction runs at 4, the epoch its marker carried.
        pending.record("g", 7, 3, [tp(0)], 10);
        pending.record("g", 7, PendingTxnOffsets::UNKNOWN_EPOCH, [tp(1)], 10);
        pending.record("g", 7, 4, [tp(2)], 20);
        pending.record("g", 8, 0, [tp(0)], 20);
        // What the disk may drop is PID 7's records of tp(0) and tp(1).
        assert_eq!(
            pending.complete("g", 7, Some(4)),
            vec![(tp(0), 3), (tp(1), PendingTxnOffsets::UNKNOWN_EPOCH)]
        );
        assert!(is(&pending, "g", tp(0)), "PID 8 holds it");
        assert!(!is(&pending, "g", tp(1)));
        assert!(is(&pending, "g", tp(2)), "the next transaction's");
        // The next transaction's own marker, at 5.
        assert_eq!(pending.complete("g", 7, Some(5)), vec![(tp(2), 4)]);
        assert!(!is(&pending, "g", tp(2)));
    }

    #[test]
    fn a_pending_offset_older_than_the_bound_no_longer_counts() {
        let tp = TopicPartition::new("input", 0);
        let mut pending = PendingTxnOffsets::default();
        pending.record("g", 7, 0, [tp.clone()], 1_000);
        assert!(pending.is_pending("g", &tp, 1_000 + 59_999, 60_000));
        assert!(!pending.is_pending("g", &tp, 1_000 + 60_000, 60_000));
        // A newer commit of another PID for the same partition still counts.
        pending.record("g", 8, 0, [tp.clone()], 50_000);
        assert!(pending.is_pending("g", &tp, 1_000 + 60_000, 60_000));
        // So does a newer commit of the same transaction: it refreshes the time.
        pending.record("g", 7, 0, [tp.clone()], 55_000);
        pending.complete("g", 8, None);
        assert!(pending.is_pending("g", &tp, 1_000 + 60_000, 60_000));
    }

    #[test]
    fn the_pending_partitions_of_a_group_are_the_ones_that_count() {
        let mut pending = PendingTxnOffsets::default();
        assert!(pending.pending_partitions("g", 0, 60_000).is_empty());
        pending.record("g", 7, 0, [tp(2), tp(0)], 1_000);
        pending.record("g", 8, 0, [tp(1)], 30_000);
        pending.record("other", 9, 0, [tp(3)], 30_000);
        assert_eq!(
            pending.pending_partitions("g", 40_000, 60_000),
            vec![tp(0), tp(1), tp(2)]
        );
        assert_eq!(
            pending.pending_partitions("g", 61_000, 60_000),
            vec![tp(1)],
            "too old to count"
        );
    }
}
