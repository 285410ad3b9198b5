//! Fencing of WriteGroupOffsetMarker at the group's coordinator, over real gRPC with real sled:
//! a late COMMIT of an older transaction (lower epoch for its PID) or from an older incarnation
//! of a transaction coordinator (lower generation) never moves a group's offsets backwards, the
//! same marker twice is a no-op, all of it survives a restart; and the marker writer treats the
//! group's permanent refusals the way it treats a leader's.

mod common;

use std::time::Duration;

use cluster::Topology;
use common::*;
use proto::{ErrorCode, TxnState, WriteGroupOffsetMarkerRequest};

/// One marker sent straight to a coordinator, as a transaction coordinator would send it.
#[derive(Clone)]
struct Marker {
    group: String,
    pid: i64,
    epoch: i32,
    commit: bool,
    offsets: Vec<(&'static str, i32, i64)>,
    coordinator_id: i32,
    generation: i64,
    /// The client transaction version (2 unless [`Marker::v1`]).
    version: i32,
    /// The transaction's number (0: not said).
    number: u64,
}

impl Marker {
    fn commit(group: &str, pid: i64, epoch: i32, offsets: &[(&'static str, i32, i64)]) -> Self {
        Self {
            group: group.into(),
            pid,
            epoch,
            commit: true,
            offsets: offsets.to_vec(),
            coordinator_id: 7,
            generation: 3,
            version: 2,
            number: 0,
        }
    }

    /// The same marker as transaction version 1, for the id's transaction number `number`.
    fn v1(mut self, number: u64) -> Self {
        self.version = 1;
        self.number = number;
        self
    }

    fn abort(group: &str, pid: i64, epoch: i32) -> Self {
        Self {
            commit: false,
            ..Self::commit(group, pid, epoch, &[])
        }
    }

    fn from(mut self, coordinator_id: i32, generation: i64) -> Self {
        self.coordinator_id = coordinator_id;
        self.generation = generation;
        self
    }

    /// Sends the marker as its coordinator would: signed with the cluster secret, naming a
    /// transactional id that coordinator owns under `topology`.
    async fn send_in(&self, topology: &Topology, client: &mut Client) -> ErrorCode {
        let mut request = WriteGroupOffsetMarkerRequest {
            group_id: self.group.clone(),
            producer_id: self.pid,
            producer_epoch: self.epoch,
            result: if self.commit {
                proto::TxnResult::Commit
            } else {
                proto::TxnResult::Abort
            } as i32,
            offsets: self
                .offsets
                .iter()
                .map(|(t, p, o)| proto::PartitionOffset {
                    topic: t.to_string(),
                    partition: *p,
                    offset: *o,
                })
                .collect(),
            coordinator_id: self.coordinator_id,
            coordinator_generation: self.generation,
            transactional_id: testkit::auth::id_owned_by(topology, self.coordinator_id),
            auth: None,
            transaction_version: self.version,
            transaction_number: self.number,
        };
        testkit::auth::sign(topology, self.coordinator_id, &mut request);
        let r = client
            .write_group_offset_marker(request)
            .await
            .unwrap()
            .into_inner();
        code(r.error_code)
    }
}

/// The group's committed offsets of t-0 and t-1 (-1: none).
async fn offsets(client: &mut Client, group: &str) -> (i64, i64) {
    let (c, o) = offset_fetch(client, group, vec![tp("t", 0), tp("t", 1)]).await;
    assert_eq!(c, ErrorCode::None);
    (o[0].2, o[1].2)
}

#[tokio::test]
async fn late_group_markers_never_move_offsets_backwards_even_after_a_restart() {
    // Coordinators 7 and 8 are in the topology but not started: the test sends their markers.
    let mut cluster = Cluster::start_with_ghosts(1, &[7, 8], |_| {}).await;
    let topology = cluster.topology.clone();
    let mut c = cluster.client(1).await;
    let late = cluster.id_owned_by(1, "group-late");
    let g = late.as_str();
    let other_group = cluster.id_owned_by(1, "group-other");

    // Transaction 1 of PID 1000 ends with epoch 5, transaction 2 with epoch 6.
    let txn1 = Marker::commit(g, 1000, 5, &[("t", 0, 10), ("t", 1, 11)]);
    let txn2 = Marker::commit(g, 1000, 6, &[("t", 0, 20)]);
    assert_eq!(txn1.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (10, 11));
    assert_eq!(txn2.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (20, 11));

    // A late, delayed COMMIT of transaction 1 (and an ABORT older still): refused, nothing moves.
    assert_eq!(
        txn1.send_in(&topology, &mut c).await,
        ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(
        Marker::abort(g, 1000, 4).send_in(&topology, &mut c).await,
        ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(offsets(&mut c, g).await, (20, 11));

    // Another PID commits t-0 = 30; then transaction 2's marker arrives again: a no-op, it
    // does not put t-0 back to 20.
    assert_eq!(
        Marker::commit(g, 2000, 0, &[("t", 0, 30)])
            .send_in(&topology, &mut c)
            .await,
        ErrorCode::None
    );
    assert_eq!(txn2.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(txn2.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (30, 11));

    // The sending coordinator restarts (generation 4); its older incarnation is fenced, even
    // for a PID the group has never seen.
    let newer = Marker::commit(g, 3000, 0, &[("t", 1, 40)]).from(7, 4);
    let zombie = Marker::commit(g, 4000, 0, &[("t", 1, 1)]).from(7, 3);
    assert_eq!(newer.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(
        zombie.send_in(&topology, &mut c).await,
        ErrorCode::TransactionCoordinatorFenced
    );
    assert_eq!(offsets(&mut c, g).await, (30, 40));
    // Generations are per sending coordinator: coordinator 8 at generation 1 is not fenced.
    assert_eq!(
        Marker::abort(g, 4000, 0)
            .from(8, 1)
            .send_in(&topology, &mut c)
            .await,
        ErrorCode::None
    );
    // Fences are per group: the same late marker applies to a group that never saw PID 1000.
    let other = Marker {
        group: other_group.clone(),
        ..txn1.clone()
    };
    assert_eq!(other.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, &other_group).await, (10, 11));

    // Everything above is durable: after a restart, the same answers and the same offsets.
    cluster.restart(1).await;
    let mut c = cluster.client(1).await;
    assert_eq!(offsets(&mut c, g).await, (30, 40));
    assert_eq!(
        txn1.send_in(&topology, &mut c).await,
        ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(
        zombie.send_in(&topology, &mut c).await,
        ErrorCode::TransactionCoordinatorFenced
    );
    // Transaction 2's marker from the sender's old incarnation is now fenced; re-sent by the
    // restarted sender (as recovery of a Prepare* does), it is a repeat: NONE, nothing moves.
    assert_eq!(
        txn2.send_in(&topology, &mut c).await,
        ErrorCode::TransactionCoordinatorFenced
    );
    assert_eq!(
        txn2.clone().from(7, 4).send_in(&topology, &mut c).await,
        ErrorCode::None
    );
    assert_eq!(newer.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(
        Marker::commit(g, 4000, 0, &[("t", 1, 1)])
            .from(8, 1)
            .send_in(&topology, &mut c)
            .await,
        ErrorCode::None,
        "PID 4000's ABORT at epoch 0 was applied: the same epoch again is a repeat"
    );
    assert_eq!(offsets(&mut c, g).await, (30, 40));
    assert_eq!(offsets(&mut c, &other_group).await, (10, 11));

    // Bad input: a typed error, nothing stored.
    assert_eq!(
        Marker::commit(g, 5000, 0, &[("t", 0, 0)])
            .from(7, -1)
            .send_in(&topology, &mut c)
            .await,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        Marker::commit(g, 5000, -1, &[("t", 0, 0)])
            .send_in(&topology, &mut c)
            .await,
        ErrorCode::InvalidRequest
    );
    assert_eq!(offsets(&mut c, g).await, (30, 40));
}

/// One transaction of `t` that commits t-0 = `offset` for `group`; returns the marker (PID, epoch).
async fn commit_offset(t: &mut Txn, pe: (i64, i32), group: &str, offset: i64) -> (i64, i32) {
    assert_eq!(t.add_offsets(pe, group).await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(pe, group, &[("t", 0, offset)]).await,
        ErrorCode::None
    );
    let marker = t.end(pe, true).await;
    t.wait_state(TxnState::CompleteCommit).await;
    marker
}

#[tokio::test]
async fn the_marker_writer_records_its_fence_so_its_own_late_marker_is_refused() {
    // The group lives on coordinator 2: the real writer's markers cross gRPC.
    let cluster = Cluster::start(2).await;
    let topology = cluster.topology.clone();
    let id = cluster.id_owned_by(1, "txn-group-fence");
    let group = cluster.id_owned_by(2, "group");
    let mut gc = cluster.client(2).await;
    let mut t = Txn::new(cluster.client(1).await, &id).with_group_client(gc.clone());

    let pe = t.init().await;
    let first = commit_offset(&mut t, pe, &group, 42).await;
    let second = commit_offset(&mut t, first, &group, 50).await;
    assert_eq!(second, (first.0, first.1 + 1));
    assert_eq!(offsets(&mut gc, &group).await.0, 50);

    // The first transaction's COMMIT marker, exactly as coordinator 1 sent it, arriving late.
    let late = Marker::commit(&group, first.0, first.1, &[("t", 0, 42)]).from(1, 1);
    assert_eq!(
        late.send_in(&topology, &mut gc).await,
        ErrorCode::InvalidProducerEpoch
    );
    // The second one again: a no-op.
    let repeat = Marker::commit(&group, second.0, second.1, &[("t", 0, 50)]).from(1, 1);
    assert_eq!(repeat.send_in(&topology, &mut gc).await, ErrorCode::None);
    assert_eq!(offsets(&mut gc, &group).await.0, 50);
}

#[tokio::test]
async fn a_group_refusing_as_fenced_stops_the_writer_without_completing() {
    let cluster = Cluster::start(2).await;
    let topology = cluster.topology.clone();
    let id = cluster.id_owned_by(1, "txn-group-gen");
    let group = cluster.id_owned_by(2, "group");
    let mut gc = cluster.client(2).await;
    let mut t = Txn::new(cluster.client(1).await, &id).with_group_client(gc.clone());
    // The group has already seen coordinator 1 at a generation above its current one (1).
    assert_eq!(
        Marker::abort(&group, 999_999, 0)
            .from(1, 100)
            .send_in(&topology, &mut gc)
            .await,
        ErrorCode::None
    );
    let pe = t.init().await;
    assert_eq!(t.add_offsets(pe, &group).await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(pe, &group, &[("t", 0, 42)]).await,
        ErrorCode::None
    );
    t.end(pe, true).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // observe the absence of completion
    assert_eq!(t.describe().await.state, TxnState::PrepareCommit as i32);
    assert_eq!(offsets(&mut gc, &group).await.0, -1);
}

#[tokio::test]
async fn a_group_holding_a_newer_epoch_acknowledges_an_abort_but_never_completes_a_commit() {
    // Coordinator 9 is in the topology but not started: the test sends its marker.
    let cluster = Cluster::start_with_ghosts(2, &[9], |_| {}).await;
    let topology = cluster.topology.clone();
    let id = cluster.id_owned_by(1, "txn-group-epoch");
    let group = cluster.id_owned_by(2, "group");
    let mut gc = cluster.client(2).await;
    let mut t = Txn::new(cluster.client(1).await, &id).with_group_client(gc.clone());
    let pe = t.init().await;
    // Something (another sender, so no generation is involved) already ended a transaction of
    // this PID at the highest epoch in this group.
    assert_eq!(
        Marker::abort(&group, pe.0, i16::MAX.into())
            .from(9, 1)
            .send_in(&topology, &mut gc)
            .await,
        ErrorCode::None
    );
    // ABORT: refused with INVALID_PRODUCER_EPOCH, counted as written, the abort completes.
    assert_eq!(t.add_offsets(pe, &group).await, ErrorCode::None);
    let pe = t.end(pe, false).await;
    t.wait_state(TxnState::CompleteAbort).await;
    // COMMIT: refused the same way, and the commit is never completed.
    assert_eq!(t.add_offsets(pe, &group).await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(pe, &group, &[("t", 0, 42)]).await,
        ErrorCode::None
    );
    t.end(pe, true).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // observe the absence of completion
    assert_eq!(t.describe().await.state, TxnState::PrepareCommit as i32);
    assert_eq!(offsets(&mut gc, &group).await.0, -1);
}

/// A group marker repeated at its epoch (transaction version 2: nothing applied) ends only what
/// is left of the transaction it closed. The PID's next transaction runs at the marker's epoch:
/// its offsets, committed meanwhile, stay pending until its own marker (KIP-447), so a stable
/// OffsetFetch never answers the offset from before it; also after the group's coordinator
/// restarted (the disk keeps each pending commit's epoch).
#[tokio::test]
async fn a_repeated_group_marker_keeps_the_next_transactions_offsets_pending() {
    let mut cluster = Cluster::start(1).await;
    let topology = cluster.topology.clone();
    let mut c = cluster.client(1).await;
    let mut t = Txn::new(c.clone(), "txn-repeat-pending");
    let pe = t.init().await;
    let first = commit_offset(&mut t, pe, "g", 42).await;
    assert_eq!(t.add_offsets(first, "g").await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(first, "g", &[("t", 0, 50)]).await,
        ErrorCode::None
    );
    // The first transaction's marker again, exactly as coordinator 1 (generation 1) sent it.
    let repeat = Marker::commit("g", first.0, first.1, &[("t", 0, 42)]).from(1, 1);
    assert_eq!(repeat.send_in(&topology, &mut c).await, ErrorCode::None);
    let (code, _) = offset_fetch_as(&mut c, "g", vec![tp("t", 0)], true).await;
    assert_eq!(
        code,
        ErrorCode::UnstableOffsetCommit,
        "the next transaction's offset is pending until its marker"
    );
    cluster.restart(1).await;
    let mut c = cluster.client(1).await;
    t.client = c.clone();
    assert_eq!(
        repeat.clone().from(1, 2).send_in(&topology, &mut c).await,
        ErrorCode::None
    );
    let (code, _) = offset_fetch_as(&mut c, "g", vec![tp("t", 0)], true).await;
    assert_eq!(
        code,
        ErrorCode::UnstableOffsetCommit,
        "still pending after a restart"
    );
    t.end(first, true).await;
    t.wait_state(TxnState::CompleteCommit).await;
    let (code, stable) = offset_fetch_as(&mut c, "g", vec![tp("t", 0)], true).await;
    assert_eq!(code, ErrorCode::None);
    assert_eq!(stable, vec![("t".to_string(), 0, 50)]);
}

/// Transaction version 1 keeps the epoch across a PID's transactions, so the transaction's
/// number tells a marker sent again from the next transaction's: sent again (delayed, or by
/// its restarted coordinator), a COMMIT never puts back offsets that another producer of the
/// group committed since, also after the group's coordinator restarted; the PID's next
/// transaction, at the same epoch, applies.
#[tokio::test]
async fn a_version_1_marker_sent_again_never_moves_offsets_back() {
    let mut cluster = Cluster::start_with_ghosts(1, &[7], |_| {}).await;
    let topology = cluster.topology.clone();
    let mut c = cluster.client(1).await;
    let group = cluster.id_owned_by(1, "group-v1");
    let g = group.as_str();

    let txn1 = Marker::commit(g, 1000, 5, &[("t", 0, 10), ("t", 1, 11)]).v1(1);
    assert_eq!(txn1.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (10, 11));
    // After a rebalance another producer commits t-0 = 20.
    assert_eq!(
        Marker::commit(g, 2000, 0, &[("t", 0, 20)])
            .send_in(&topology, &mut c)
            .await,
        ErrorCode::None
    );
    // Transaction 1's marker again: delayed, and re-sent by its restarted coordinator.
    assert_eq!(txn1.send_in(&topology, &mut c).await, ErrorCode::None);
    let resent = txn1.clone().from(7, 4);
    assert_eq!(resent.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (20, 11), "nothing moved back");
    cluster.restart(1).await;
    let mut c = cluster.client(1).await;
    assert_eq!(resent.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (20, 11), "the number is durable");

    // Transaction 2 of the PID, at the same epoch: applied.
    let txn2 = Marker::commit(g, 1000, 5, &[("t", 1, 30)]).v1(2).from(7, 4);
    assert_eq!(txn2.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (20, 30));
    // A sender that does not number its transactions (0) is applied as before the numbers.
    let unnumbered = Marker::commit(g, 1000, 5, &[("t", 1, 31)]).v1(0).from(7, 4);
    assert_eq!(unnumbered.send_in(&topology, &mut c).await, ErrorCode::None);
    assert_eq!(offsets(&mut c, g).await, (20, 31));
}

/// The real writer, end to end: a version-1 transaction commits offsets to a group on another
/// coordinator and stays in PrepareCommit (a leader does not acknowledge); another producer of
/// the group commits newer offsets; the transaction's coordinator restarts and sends the
/// markers again. The group keeps the newer offsets, the transaction completes, and the PID's
/// next transaction (same epoch) commits.
#[tokio::test]
async fn a_restarted_coordinator_resending_a_version_1_commit_keeps_newer_offsets() {
    let mut cluster = Cluster::start(2).await;
    let id = cluster.id_owned_by(1, "txn-v1-resend");
    let other = cluster.id_owned_by(1, "txn-v1-other");
    let group = cluster.id_owned_by(2, "group");
    let mut gc = cluster.client(2).await;
    let mut t = Txn::v1(cluster.client(1).await, &id).with_group_client(gc.clone());

    let pe = t.init().await;
    cluster.leaders[0].set_ack(false);
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    assert_eq!(t.add_offsets(pe, &group).await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(pe, &group, &[("t", 0, 100)]).await,
        ErrorCode::None
    );
    assert_eq!(t.end(pe, true).await, pe, "version 1 keeps the epoch");
    eventually("the group marker applied", || {
        let mut gc = gc.clone();
        let group = group.clone();
        async move { (offsets(&mut gc, &group).await.0 == 100).then_some(()) }
    })
    .await;
    assert_eq!(t.describe().await.state, TxnState::PrepareCommit as i32);

    let mut o = Txn::new(cluster.client(1).await, &other).with_group_client(gc.clone());
    let ope = o.init().await;
    commit_offset(&mut o, ope, &group, 200).await;
    assert_eq!(offsets(&mut gc, &group).await.0, 200);

    cluster.restart(1).await;
    cluster.leaders[0].set_ack(true);
    t.client = cluster.client(1).await;
    t.wait_state(TxnState::CompleteCommit).await;
    assert_eq!(
        offsets(&mut gc, &group).await.0,
        200,
        "the re-sent marker did not move the group back"
    );

    let next = commit_offset(&mut t, pe, &group, 300).await;
    assert_eq!(next, pe);
    assert_eq!(offsets(&mut gc, &group).await.0, 300);
}
