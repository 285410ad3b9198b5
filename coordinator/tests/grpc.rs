//! gRPC tests against real coordinators on 127.0.0.1:0 with real sled directories, and fake
//! partition leaders (real gRPC) that acknowledge markers only when told to.

mod common;

use common::*;
use std::time::Duration;

use proto::{ErrorCode, TxnState};

#[tokio::test]
async fn new_id_gets_epoch_0_and_second_init_bumps() {
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-a");
    let (pid, epoch) = t.init().await;
    assert!(pid >= 0);
    assert_eq!(epoch, 0);
    assert_eq!(t.init().await, (pid, 1));
    let d = t.describe().await;
    assert_eq!(
        (d.producer_id, d.producer_epoch, d.state),
        (pid, 1, TxnState::Empty as i32)
    );
    assert_eq!(d.transaction_timeout_ms, 60_000);
    // Another id gets another PID.
    let mut other = Txn::new(cluster.client(1).await, "txn-b");
    assert_ne!(other.init().await.0, pid);
}

#[tokio::test]
async fn older_epoch_is_fenced_on_every_request() {
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-fence");
    let old = t.init().await;
    let new = t.init().await;
    assert_eq!(new, (old.0, old.1 + 1));
    assert_eq!(
        t.add(old, vec![tp("t", 0)]).await,
        ErrorCode::ProducerFenced
    );
    assert_eq!(t.add_offsets(old, "g").await, ErrorCode::ProducerFenced);
    assert_eq!(t.add_offsets(new, "g").await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(old, "g", &[("t", 0, 5)]).await,
        ErrorCode::ProducerFenced
    );
    for commit in [true, false] {
        let r = t.end_raw(old, commit).await;
        assert_eq!(code(r.error_code), ErrorCode::ProducerFenced);
        assert!(!r.error_message.is_empty());
    }
    // The current producer is unaffected.
    assert_eq!(t.add(new, vec![tp("t", 0)]).await, ErrorCode::None);
    assert_eq!(t.end(new, true).await, (new.0, new.1 + 1));
}

#[tokio::test]
async fn misrouted_ids_get_not_coordinator() {
    let cluster = Cluster::start(2).await;
    let mut c1 = cluster.client(1).await;
    let mut c2 = cluster.client(2).await;
    let id1 = cluster.id_owned_by(1, "txn");
    let id2 = cluster.id_owned_by(2, "txn");
    let mut wrong = Txn::new(c2.clone(), &id1);
    let r = wrong.init_raw(60_000, (-1, -1)).await;
    assert_eq!(code(r.error_code), ErrorCode::NotCoordinator);
    let mut wrong2 = Txn::new(c1.clone(), &id2);
    let r = wrong2.init_raw(60_000, (-1, -1)).await;
    assert_eq!(code(r.error_code), ErrorCode::NotCoordinator);
    assert_eq!(
        wrong2.add((0, 0), vec![tp("t", 0)]).await,
        ErrorCode::NotCoordinator
    );
    assert_eq!(
        wrong2.end_raw((0, 0), true).await.error_code,
        ErrorCode::NotCoordinator as i32
    );
    assert_eq!(
        describe(&mut c1, &id2).await.error_code,
        ErrorCode::NotCoordinator as i32
    );
    // The owners answer, and PIDs from the two coordinators never collide (striding).
    let p1 = Txn::new(c1.clone(), &id1).init().await;
    let p2 = Txn::new(c2.clone(), &id2).init().await;
    assert_ne!(p1.0, p2.0);
    assert_ne!(p1.0 % 2, p2.0 % 2, "coordinator index picks the residue");
    // Groups route the same way.
    let g2 = cluster.id_owned_by(2, "group");
    assert_eq!(
        offset_fetch(&mut c1, &g2, vec![]).await.0,
        ErrorCode::NotCoordinator
    );
    assert_eq!(offset_fetch(&mut c2, &g2, vec![]).await.0, ErrorCode::None);
    // Idempotent producers: any coordinator allocates, all distinct.
    let mut pids = std::collections::BTreeSet::new();
    for mut c in [c1.clone(), c2.clone(), c1.clone(), c2.clone()] {
        let r = c
            .init_producer_id(proto::InitProducerIdRequest {
                transactional_id: None,
                transaction_timeout_ms: 0,
                expected_producer_id: -1,
                expected_producer_epoch: -1,
                transaction_version: 2,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.error_code), ErrorCode::None);
        assert_eq!(r.producer_epoch, 0);
        assert!(pids.insert(r.producer_id));
    }
    assert!(!pids.contains(&p1.0) && !pids.contains(&p2.0));
}

#[tokio::test]
async fn commit_writes_markers_with_the_new_epoch_and_offsets_become_visible() {
    let cluster = Cluster::start(2).await;
    let id = cluster.id_owned_by(1, "txn-commit");
    // A group owned by the other coordinator: the group marker crosses gRPC.
    let group = cluster.id_owned_by(2, "group");
    let mut gc = cluster.client(2).await;
    let mut t = Txn::new(cluster.client(1).await, &id).with_group_client(gc.clone());
    let pe = t.init().await;
    assert_eq!(
        t.add(pe, vec![tp("t", 0), tp("t", 1), tp("t", 2)]).await,
        ErrorCode::None
    );
    assert_eq!(t.add_offsets(pe, &group).await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(pe, &group, &[("t", 0, 42), ("t", 1, 7)])
            .await,
        ErrorCode::None
    );
    let d = t.describe().await;
    assert_eq!(d.state, TxnState::Ongoing as i32);
    assert_eq!(d.partitions.len(), 3);
    assert_eq!(d.groups, vec![group.clone()]);
    assert!(d.transaction_start_ms > 0);
    // Not visible before the commit.
    let (c, offsets) = offset_fetch(&mut gc, &group, vec![tp("t", 0)]).await;
    assert_eq!((c, offsets), (ErrorCode::None, vec![("t".into(), 0, -1)]));

    let new = t.end(pe, true).await;
    assert_eq!(new, (pe.0, pe.1 + 1));
    let done = t.wait_state(TxnState::CompleteCommit).await;
    assert!(done.partitions.is_empty());
    // Leader 101 got partitions 0 and 2 in one request, 102 got partition 1, all at the new epoch.
    let m101: Vec<_> = cluster.leaders[0].markers();
    let m102: Vec<_> = cluster.leaders[1].markers();
    assert_eq!(m101.len(), 1);
    assert_eq!(m101[0].partitions.len(), 2);
    assert_eq!(m102[0].partitions, vec![tp("t", 1)]);
    for m in m101.iter().chain(&m102) {
        assert_eq!((m.producer_id, m.producer_epoch), new);
        assert_eq!(m.result, proto::TxnResult::Commit as i32);
        assert_eq!(m.coordinator_id, 1);
        assert_eq!(m.coordinator_generation, 1);
    }
    let (_, offsets) = offset_fetch(&mut gc, &group, vec![]).await;
    assert_eq!(offsets, vec![("t".into(), 0, 42), ("t".into(), 1, 7)]);
    // EndTxn retry after completion: same answer, nothing changes.
    assert_eq!(t.end(pe, true).await, new);
    assert_eq!(
        code(t.end_raw(pe, false).await.error_code),
        ErrorCode::InvalidTxnState
    );
}

#[tokio::test]
async fn abort_drops_pending_offsets() {
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-abort");
    let mut c = cluster.client(1).await;
    let pe = t.init().await;
    assert_eq!(t.add_offsets(pe, "g").await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(pe, "g", &[("t", 0, 9)]).await,
        ErrorCode::None
    );
    let pe = t.end(pe, false).await;
    t.wait_state(TxnState::CompleteAbort).await;
    assert_eq!(
        offset_fetch(&mut c, "g", vec![tp("t", 0)]).await.1,
        vec![("t".into(), 0, -1)]
    );
    // The next transaction's commit is what becomes visible.
    assert_eq!(t.add_offsets(pe, "g").await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(pe, "g", &[("t", 0, 11)]).await,
        ErrorCode::None
    );
    t.end(pe, true).await;
    t.wait_state(TxnState::CompleteCommit).await;
    assert_eq!(
        offset_fetch(&mut c, "g", vec![tp("t", 0)]).await.1,
        vec![("t".into(), 0, 11)]
    );
}

#[tokio::test]
async fn init_fences_an_open_transaction_and_aborts_it_with_a_higher_epoch() {
    let cluster = Cluster::start(1).await;
    let mut old = Txn::new(cluster.client(1).await, "txn-zombie");
    let pe = old.init().await;
    assert_eq!(
        old.add(pe, vec![tp("t", 0), tp("t", 1)]).await,
        ErrorCode::None
    );
    cluster.leaders[0].set_ack(false);
    let mut new = Txn::new(cluster.client(1).await, "txn-zombie");
    let r = new.init_raw(60_000, (-1, -1)).await;
    assert_eq!(code(r.error_code), ErrorCode::ConcurrentTransactions);
    let d = new.wait_state(TxnState::PrepareAbort).await;
    assert_eq!(d.producer_epoch, pe.1 + 1);
    // The zombie is fenced even while the abort is in flight.
    assert_eq!(
        old.add(pe, vec![tp("t", 2)]).await,
        ErrorCode::ProducerFenced
    );
    assert_eq!(
        code(old.end_raw(pe, true).await.error_code),
        ErrorCode::ProducerFenced
    );
    cluster.leaders[0].set_ack(true);
    let fresh = new.init().await;
    assert_eq!(fresh, (pe.0, pe.1 + 2));
    for m in cluster.leaders[0]
        .markers()
        .iter()
        .chain(&cluster.leaders[1].markers())
    {
        assert_eq!(m.result, proto::TxnResult::Abort as i32);
        assert_eq!(
            m.producer_epoch,
            pe.1 + 1,
            "abort markers carry the fencing epoch"
        );
    }
    let r = old.init_raw(60_000, pe).await;
    assert_eq!(code(r.error_code), ErrorCode::ProducerFenced);
}

#[tokio::test]
async fn timeout_aborts_and_tells_the_late_producer() {
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-slow");
    let pe = t.init_with_timeout(100).await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    let d = t.wait_state(TxnState::CompleteAbort).await;
    assert_eq!((d.producer_epoch, d.last_epoch), (pe.1 + 1, pe.1));
    let m = cluster.leaders[0].markers();
    assert_eq!(m.last().unwrap().result, proto::TxnResult::Abort as i32);
    assert_eq!(m.last().unwrap().producer_epoch, pe.1 + 1);
    assert_eq!(
        t.add(pe, vec![tp("t", 0)]).await,
        ErrorCode::TransactionTimedOut
    );
    assert_eq!(
        code(t.end_raw(pe, true).await.error_code),
        ErrorCode::TransactionTimedOut
    );
    // Abortable: its abort is answered with the bumped pair and it carries on.
    let next = t.end(pe, false).await;
    assert_eq!(next, (pe.0, pe.1 + 1));
    assert_eq!(t.add(next, vec![tp("t", 1)]).await, ErrorCode::None);
}

#[tokio::test]
async fn verify_transaction_over_grpc() {
    let cluster = Cluster::start(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-verify");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    let c = cluster.client(1).await;
    let topology = cluster.topology.clone();
    let verify = |pe: (i64, i32), p: i32| {
        let mut c = c.clone();
        let topology = topology.clone();
        async move {
            let mut request = proto::VerifyTransactionRequest {
                transactional_id: "txn-verify".into(),
                producer_id: pe.0,
                producer_epoch: pe.1,
                partition: Some(tp("t", p)),
                auth: None,
            };
            // As leader 101 would send it.
            testkit::auth::sign(&topology, 101, &mut request);
            let r = c.verify_transaction(request).await.unwrap().into_inner();
            code(r.error_code)
        }
    };
    assert_eq!(verify(pe, 0).await, ErrorCode::None);
    assert_eq!(verify(pe, 1).await, ErrorCode::InvalidTxnState);
    assert_eq!(
        verify((pe.0, pe.1 + 1), 0).await,
        ErrorCode::InvalidProducerEpoch
    );
    assert_eq!(
        verify((pe.0 + 1, pe.1), 0).await,
        ErrorCode::InvalidProducerIdMapping
    );
    assert_eq!(verify((pe.0, -1), 0).await, ErrorCode::InvalidRequest);
}

/// Builds `state` for a fresh id on coordinator 1, restarts the coordinator, and checks the
/// description is identical and that the protocol carries on from there.
async fn restart_in_state(state: TxnState) {
    let mut cluster = Cluster::start(1).await;
    let id = format!("txn-restart-{state:?}");
    let mut t = Txn::new(cluster.client(1).await, &id);
    let mut pe = t.init().await;
    let mut retry = None;
    match state {
        TxnState::Empty => {}
        TxnState::Ongoing => {
            assert_eq!(
                t.add(pe, vec![tp("t", 0), tp("u", 0)]).await,
                ErrorCode::None
            );
            assert_eq!(t.add_offsets(pe, "g").await, ErrorCode::None);
            assert_eq!(
                t.commit_offsets(pe, "g", &[("t", 0, 3)]).await,
                ErrorCode::None
            );
        }
        TxnState::PrepareCommit | TxnState::PrepareAbort => {
            cluster.leaders[0].set_ack(false);
            assert_eq!(
                t.add(pe, vec![tp("t", 0), tp("t", 1)]).await,
                ErrorCode::None
            );
            assert_eq!(t.add_offsets(pe, "g").await, ErrorCode::None);
            assert_eq!(
                t.commit_offsets(pe, "g", &[("t", 0, 3)]).await,
                ErrorCode::None
            );
            let commit = state == TxnState::PrepareCommit;
            retry = Some((pe, commit));
            pe = t.end(pe, commit).await;
            // Leader 101 refuses until told; wait until it has seen (and refused) a marker.
            let leader = cluster.leaders[0].clone();
            eventually("a refused marker", || {
                let leader = leader.clone();
                async move { (!leader.markers().is_empty()).then_some(()) }
            })
            .await;
        }
        TxnState::CompleteCommit | TxnState::CompleteAbort => {
            assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
            let commit = state == TxnState::CompleteCommit;
            retry = Some((pe, commit));
            pe = t.end(pe, commit).await;
            t.wait_state(state).await;
        }
    }
    let before = stable(t.describe().await);
    assert_eq!(before.state, state as i32);
    cluster.restart(1).await;
    let mut t = Txn::new(cluster.client(1).await, &id);
    let after = stable(t.describe().await);
    assert_eq!(after, before, "state identical after restart in {state:?}");

    // A retry reaching the restarted coordinator is answered as before.
    if let Some((old, commit)) = retry {
        let r = t.end_raw(old, commit).await;
        let expect = if state == TxnState::PrepareCommit || state == TxnState::PrepareAbort {
            ErrorCode::ConcurrentTransactions
        } else {
            ErrorCode::None
        };
        assert_eq!(code(r.error_code), expect, "{}", r.error_message);
    }
    match state {
        TxnState::PrepareCommit | TxnState::PrepareAbort => {
            // The restarted coordinator re-sends the markers with its new generation; once the
            // leader acknowledges, the decision (never the other one) completes.
            let leader = cluster.leaders[0].clone();
            eventually("marker from the new generation", || {
                let leader = leader.clone();
                async move {
                    leader
                        .markers()
                        .iter()
                        .any(|m| m.coordinator_generation == 2)
                        .then_some(())
                }
            })
            .await;
            assert_eq!(
                t.describe().await.state,
                state as i32,
                "not completed without acks"
            );
            cluster.leaders[0].set_ack(true);
            let complete = if state == TxnState::PrepareCommit {
                TxnState::CompleteCommit
            } else {
                TxnState::CompleteAbort
            };
            t.wait_state(complete).await;
            let expected_result = if state == TxnState::PrepareCommit {
                proto::TxnResult::Commit
            } else {
                proto::TxnResult::Abort
            } as i32;
            for m in cluster.leaders[0].markers() {
                assert_eq!(m.result, expected_result);
                assert_eq!((m.producer_id, m.producer_epoch), pe);
            }
            let mut c = cluster.client(1).await;
            let visible = offset_fetch(&mut c, "g", vec![tp("t", 0)]).await.1[0].2;
            assert_eq!(
                visible,
                if state == TxnState::PrepareCommit {
                    3
                } else {
                    -1
                }
            );
            // And the retry of the EndTxn now gets the bumped pair.
            let (old, commit) = retry.unwrap();
            assert_eq!(t.end(old, commit).await, pe);
        }
        TxnState::Ongoing => {
            // The transaction carries on after the restart and its offsets commit.
            assert_eq!(t.add(pe, vec![tp("t", 1)]).await, ErrorCode::None);
            let next = t.end(pe, true).await;
            assert_eq!(next, (pe.0, pe.1 + 1));
            t.wait_state(TxnState::CompleteCommit).await;
            let mut c = cluster.client(1).await;
            assert_eq!(offset_fetch(&mut c, "g", vec![tp("t", 0)]).await.1[0].2, 3);
        }
        _ => {
            // The next epoch continues from the stored one, never repeating a PID or epoch.
            assert_eq!(t.init().await, (pe.0, pe.1 + 1));
        }
    }
    // PIDs allocated after the restart never repeat one from before.
    let mut fresh = Txn::new(cluster.client(1).await, &format!("{id}-fresh"));
    assert!(fresh.init().await.0 > pe.0);
}

#[tokio::test]
async fn restart_in_empty() {
    restart_in_state(TxnState::Empty).await;
}

#[tokio::test]
async fn restart_in_ongoing() {
    restart_in_state(TxnState::Ongoing).await;
}

#[tokio::test]
async fn restart_between_prepare_commit_and_complete_commit() {
    restart_in_state(TxnState::PrepareCommit).await;
}

#[tokio::test]
async fn restart_between_prepare_abort_and_complete_abort() {
    restart_in_state(TxnState::PrepareAbort).await;
}

#[tokio::test]
async fn restart_in_complete_commit() {
    restart_in_state(TxnState::CompleteCommit).await;
}

#[tokio::test]
async fn restart_in_complete_abort() {
    restart_in_state(TxnState::CompleteAbort).await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_code_and_stores_nothing() {
    let cluster = Cluster::start(1).await;
    let mut c = cluster.client(1).await;
    let long_id = "x".repeat(100 * 1024);
    // InitProducerId shapes.
    /// (transactional id, timeout, expected (PID, epoch), wanted code)
    type Case = (Option<String>, i32, (i64, i32), ErrorCode);
    let cases: Vec<Case> = vec![
        (
            Some(String::new()),
            60_000,
            (-1, -1),
            ErrorCode::InvalidRequest,
        ),
        (
            Some(long_id.clone()),
            60_000,
            (-1, -1),
            ErrorCode::InvalidRequest,
        ),
        (
            Some("bad-timeout".into()),
            0,
            (-1, -1),
            ErrorCode::InvalidTransactionTimeout,
        ),
        (
            Some("bad-timeout".into()),
            -5,
            (-1, -1),
            ErrorCode::InvalidTransactionTimeout,
        ),
        (
            Some("bad-timeout".into()),
            900_001,
            (-1, -1),
            ErrorCode::InvalidTransactionTimeout,
        ),
        (
            Some("bad-expected".into()),
            60_000,
            (5, -3),
            ErrorCode::InvalidRequest,
        ),
        (
            Some("bad-expected".into()),
            60_000,
            (-7, 0),
            ErrorCode::InvalidRequest,
        ),
        (
            Some("bad-expected".into()),
            60_000,
            (5, 40_000),
            ErrorCode::InvalidRequest,
        ),
    ];
    for (id, timeout, expected, want) in cases {
        let r = c
            .init_producer_id(proto::InitProducerIdRequest {
                transactional_id: id.clone(),
                transaction_timeout_ms: timeout,
                expected_producer_id: expected.0,
                expected_producer_epoch: expected.1,
                transaction_version: 2,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            code(r.error_code),
            want,
            "{:?} {timeout}",
            id.map(|i| i.len())
        );
        assert!(!r.error_message.is_empty());
        assert_eq!((r.producer_id, r.producer_epoch), (-1, -1));
    }
    // Nothing stored for any of them.
    for id in ["", &long_id, "bad-timeout", "bad-expected"] {
        let d = describe(&mut c, id).await;
        assert_ne!(code(d.error_code), ErrorCode::None, "{} stored", id.len());
    }
    let list = c
        .list_transactions(proto::ListTransactionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.transactions.is_empty());

    // Now a real id, and bad requests against it.
    let mut t = Txn::new(c.clone(), "txn-good");
    let pe = t.init().await;
    assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
    let before = stable(t.describe().await);
    assert_eq!(
        t.add((pe.0, -1), vec![tp("t", 1)]).await,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        t.add((pe.0, 32_768), vec![tp("t", 1)]).await,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        t.add((-1, pe.1), vec![tp("t", 1)]).await,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        t.add((pe.0 + 1000, pe.1), vec![tp("t", 1)]).await,
        ErrorCode::InvalidProducerIdMapping
    );
    assert_eq!(
        t.add(pe, vec![tp("t", 1), tp("nope", 0)]).await,
        ErrorCode::UnknownTopicOrPartition
    );
    assert_eq!(
        t.add(pe, vec![tp("t", 3)]).await,
        ErrorCode::UnknownTopicOrPartition
    );
    assert_eq!(
        t.add(pe, vec![tp("t", -1)]).await,
        ErrorCode::UnknownTopicOrPartition
    );
    assert_eq!(t.add(pe, vec![tp("", 0)]).await, ErrorCode::InvalidRequest);
    assert_eq!(
        t.add(pe, vec![tp("t", 1); 100_000]).await,
        ErrorCode::InvalidRequest
    );
    assert_eq!(t.add_offsets(pe, "").await, ErrorCode::InvalidRequest);
    assert_eq!(t.add_offsets(pe, &long_id).await, ErrorCode::InvalidRequest);
    assert_eq!(
        t.add_offsets((pe.0, -2), "g").await,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        t.commit_offsets(pe, "g", &[("t", 0, 1)]).await,
        ErrorCode::InvalidTxnState
    );
    assert_eq!(
        t.commit_offsets(pe, "g", &[("t", 0, -5)]).await,
        ErrorCode::InvalidRequest
    );
    let r = c
        .end_txn(proto::EndTxnRequest {
            transactional_id: "txn-good".into(),
            producer_id: pe.0,
            producer_epoch: pe.1,
            result: 9,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::InvalidRequest);
    assert_eq!(
        code(t.end_raw((pe.0, -1), true).await.error_code),
        ErrorCode::InvalidRequest
    );
    // Unknown PIDs and unknown ids.
    assert_eq!(
        code(t.end_raw((pe.0 + 1000, pe.1), true).await.error_code),
        ErrorCode::InvalidProducerIdMapping
    );
    let mut unknown = Txn::new(c.clone(), "txn-never-initialised");
    assert_eq!(
        unknown.add((1, 0), vec![tp("t", 0)]).await,
        ErrorCode::InvalidProducerIdMapping
    );
    assert_eq!(
        unknown.add_offsets((1, 0), "g").await,
        ErrorCode::InvalidProducerIdMapping
    );
    assert_eq!(
        code(unknown.end_raw((1, 0), false).await.error_code),
        ErrorCode::InvalidProducerIdMapping
    );
    assert_eq!(
        code(unknown.describe().await.error_code),
        ErrorCode::InvalidProducerIdMapping
    );
    // OffsetFetch and Describe limits.
    assert_eq!(
        offset_fetch(&mut c, "", vec![]).await.0,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        offset_fetch(&mut c, "g", vec![tp("t", 0); 100_000]).await.0,
        ErrorCode::InvalidRequest
    );
    let r = c
        .describe_transactions(proto::DescribeTransactionsRequest {
            transactional_ids: vec!["txn-good".into(); 100_000],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.transactions.len(), 1);
    assert_eq!(
        code(r.transactions[0].error_code),
        ErrorCode::InvalidRequest
    );
    let r = c
        .list_transactions(proto::ListTransactionsRequest {
            state_filters: vec![42],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::InvalidRequest);

    assert_eq!(
        stable(t.describe().await),
        before,
        "bad input changed nothing"
    );
    let list = c
        .list_transactions(proto::ListTransactionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.transactions.len(), 1);
}

#[tokio::test]
async fn list_transactions_filters_by_state() {
    let cluster = Cluster::start(1).await;
    let c = cluster.client(1).await;
    let mut a = Txn::new(c.clone(), "list-a");
    let mut b = Txn::new(c.clone(), "list-b");
    let pa = a.init().await;
    b.init().await;
    assert_eq!(a.add(pa, vec![tp("t", 0)]).await, ErrorCode::None);
    let mut c = c;
    let r = c
        .list_transactions(proto::ListTransactionsRequest {
            state_filters: vec![TxnState::Ongoing as i32],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.coordinator_id, 1);
    let ids: Vec<_> = r
        .transactions
        .iter()
        .map(|t| t.transactional_id.as_str())
        .collect();
    assert_eq!(ids, vec!["list-a"]);
    let r = c
        .list_transactions(proto::ListTransactionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.transactions.len(), 2);
    let d = a.describe().await;
    assert!(d.age_ms >= 0 && d.transaction_start_ms > 0);
}

#[tokio::test]
async fn serve_refuses_a_node_that_is_not_a_coordinator() {
    let cluster = Cluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = coordinator::CoordinatorConfig::new(101, dir.path(), cluster.topology.clone());
    let err = coordinator::serve(config, listener, async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a coordinator"), "{err}");
}

#[tokio::test]
async fn epoch_exhaustion_over_grpc_with_retries_across_a_restart() {
    let mut cluster = Cluster::start(1).await;
    // Seed an id one bump away from exhaustion, as if it had lived for 32,765 transactions.
    cluster.stop(1).await;
    let dir = cluster.coordinators[0].dir.clone();
    {
        let storage = coordinator::storage::SledStorage::open(&dir).unwrap();
        let mut meta = coordinator::core::TxnMetadata::new("txn-old", 999_999, 60_000, 0);
        meta.producer_epoch = 32_765;
        coordinator::storage::Storage::put_txn(&storage, &meta).unwrap();
    }
    cluster.restart(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-old");
    let old = (999_999, 32_765);
    let r = t.init_raw(60_000, old).await;
    assert_eq!(code(r.error_code), ErrorCode::None);
    let at_max = (r.producer_id, r.producer_epoch);
    assert_eq!(at_max, (999_999, 32_766));
    // A transaction ending at 32766: markers at (old PID, 32767), the client gets (new PID, 0).
    assert_eq!(t.add(at_max, vec![tp("t", 0)]).await, ErrorCode::None);
    cluster.leaders[0].set_ack(false);
    let rotated = t.end(at_max, true).await;
    assert_ne!(rotated.0, 999_999);
    assert_eq!(rotated.1, 0);
    let d = t.wait_state(TxnState::PrepareCommit).await;
    assert_eq!(
        (d.producer_id, d.producer_epoch, d.next_producer_id),
        (999_999, 32_767, rotated.0)
    );
    // Restart in the middle: the rotation and the commit survive, the retry is recognised.
    cluster.restart(1).await;
    let mut t = Txn::new(cluster.client(1).await, "txn-old");
    assert_eq!(
        code(t.end_raw(at_max, true).await.error_code),
        ErrorCode::ConcurrentTransactions
    );
    cluster.leaders[0].set_ack(true);
    let d = t.wait_state(TxnState::CompleteCommit).await;
    assert_eq!(
        (d.producer_id, d.producer_epoch, d.previous_producer_id),
        (rotated.0, 0, 999_999)
    );
    for m in cluster.leaders[0].markers() {
        assert_eq!((m.producer_id, m.producer_epoch), (999_999, 32_767));
        assert_eq!(m.result, proto::TxnResult::Commit as i32);
    }
    assert_eq!(
        t.end(at_max, true).await,
        rotated,
        "retry after rotation gets the new pair"
    );
    let r = t.init_raw(60_000, at_max).await;
    assert_eq!((r.producer_id, r.producer_epoch), rotated);
    assert_eq!(
        t.add(at_max, vec![tp("t", 0)]).await,
        ErrorCode::ProducerFenced
    );
    assert_eq!(t.add(rotated, vec![tp("t", 0)]).await, ErrorCode::None);
}

/// transactional.id.expiration.ms: an id idle past the expiration with no transaction open is
/// removed, durably (gone after a restart too); the next instance gets a NEW PID at epoch 0,
/// and the old instance's (PID, epoch) is fenced everywhere. An id with a transaction open is
/// never removed, however long it has been idle.
#[tokio::test]
async fn an_idle_transactional_id_expires_and_its_old_instance_stays_fenced() {
    let mut cluster = Cluster::start_with(1, |c| {
        c.transactional_id_expiration = Duration::from_millis(600);
    })
    .await;
    let client = cluster.client(1).await;
    let mut idle = Txn::new(client.clone(), "txn-idle");
    let old = idle.init().await;
    let mut open = Txn::new(client.clone(), "txn-open");
    let open_pe = open.init_with_timeout(60_000).await;
    assert_eq!(open.add(open_pe, vec![tp("t", 0)]).await, ErrorCode::None);

    let gone = testkit::poll::eventually_within(Duration::from_secs(10), "expired", || {
        let mut client = client.clone();
        async move {
            let d = describe(&mut client, "txn-idle").await;
            (code(d.error_code) == ErrorCode::InvalidProducerIdMapping).then_some(d)
        }
    })
    .await;
    assert_eq!(gone.producer_id, -1);
    // The open transaction is kept, and so is its instance.
    let d = open.describe().await;
    assert_eq!(
        (d.state, d.producer_id),
        (TxnState::Ongoing as i32, open_pe.0)
    );

    // Gone on disk too.
    cluster.restart(1).await;
    let client = cluster.client(1).await;
    let d = describe(&mut client.clone(), "txn-idle").await;
    assert_eq!(code(d.error_code), ErrorCode::InvalidProducerIdMapping);

    // The old instance cannot write; a new one gets a new PID, and the old pair stays fenced.
    let mut idle = Txn::new(client.clone(), "txn-idle");
    assert_ne!(idle.add(old, vec![tp("t", 1)]).await, ErrorCode::None);
    let new = idle.init().await;
    assert!(new.0 != old.0 && new.1 == 0, "{new:?} after {old:?}");
    assert_ne!(idle.add(old, vec![tp("t", 1)]).await, ErrorCode::None);
    assert_eq!(idle.add(new, vec![tp("t", 1)]).await, ErrorCode::None);
    let mut open = Txn::new(client.clone(), "txn-open");
    assert_eq!(open.add(open_pe, vec![tp("t", 2)]).await, ErrorCode::None);
}

/// KIP-447 over gRPC: a TxnOffsetCommit sent to the group's coordinator (node 2; the
/// transaction is node 1's) leaves its partitions pending there until the transaction's group
/// marker is applied. Meanwhile a stable OffsetFetch answers UNSTABLE_OFFSET_COMMIT (for any
/// partition of the group when it names none) and a plain one the older offset. A commit the
/// transaction refuses leaves nothing pending. A node that does not coordinate the group takes a
/// commit only handed on by the group's coordinator, else NOT_COORDINATOR.
#[tokio::test]
async fn offsets_sent_to_the_groups_coordinator_are_pending_until_the_marker() {
    let cluster = Cluster::start(2).await;
    let id = cluster.id_owned_by(1, "txn-447");
    let group = cluster.id_owned_by(2, "group-447");
    let mut gc = cluster.client(2).await;
    let mut t = Txn::new(cluster.client(1).await, &id).with_group_client(gc.clone());
    let mut via_group = Txn::new(gc.clone(), &id);
    t.init().await;
    let pe = t.init().await;
    assert_eq!(pe.1, 1);
    assert_eq!(t.add_offsets(pe, &group).await, ErrorCode::None);
    let stable = |gc: &Client, parts: Vec<proto::TopicPartition>| {
        let (mut gc, group) = (gc.clone(), group.clone());
        async move { offset_fetch_as(&mut gc, &group, parts, true).await }
    };

    // Refused by the transaction's coordinator (an older epoch): nothing stays pending.
    assert_eq!(
        via_group
            .commit_offsets((pe.0, 0), &group, &[("t", 0, 5)])
            .await,
        ErrorCode::ProducerFenced
    );
    assert_eq!(
        stable(&gc, vec![tp("t", 0)]).await,
        (ErrorCode::None, vec![("t".into(), 0, -1)])
    );

    assert_eq!(
        via_group.commit_offsets(pe, &group, &[("t", 0, 42)]).await,
        ErrorCode::None
    );
    assert_eq!(t.describe().await.groups, vec![group.clone()]);
    assert_eq!(
        stable(&gc, vec![tp("t", 0)]).await.0,
        ErrorCode::UnstableOffsetCommit
    );
    assert_eq!(
        stable(&gc, vec![]).await.0,
        ErrorCode::UnstableOffsetCommit,
        "all of the group's partitions"
    );
    assert_eq!(
        stable(&gc, vec![tp("t", 1)]).await,
        (ErrorCode::None, vec![("t".into(), 1, -1)]),
        "another partition is stable"
    );
    assert_eq!(
        offset_fetch(&mut gc, &group, vec![tp("t", 0)]).await,
        (ErrorCode::None, vec![("t".into(), 0, -1)]),
        "without require_stable: the older offset"
    );

    let next = t.end(pe, true).await;
    t.wait_state(TxnState::CompleteCommit).await;
    assert_eq!(
        stable(&gc, vec![tp("t", 0)]).await,
        (ErrorCode::None, vec![("t".into(), 0, 42)])
    );

    // Straight to the transaction's coordinator (node 1 does not coordinate the group):
    // NOT_COORDINATOR, since the group's coordinator would never know it is pending; the
    // transaction does not hold it. Handed on signed by a node other than the group's
    // coordinator: refused as well.
    assert_eq!(t.add_offsets(next, &group).await, ErrorCode::None);
    let mut direct = Txn::new(cluster.client(1).await, &id);
    assert_eq!(
        direct.commit_offsets(next, &group, &[("t", 0, 50)]).await,
        ErrorCode::NotCoordinator
    );
    let mut forged = proto::TxnOffsetCommitRequest {
        transactional_id: id.clone(),
        producer_id: next.0,
        producer_epoch: next.1,
        group_id: group.clone(),
        offsets: vec![proto::PartitionOffset {
            topic: "t".into(),
            partition: 0,
            offset: 51,
        }],
        auth: None,
    };
    testkit::auth::sign(&cluster.topology, 1, &mut forged);
    let r = direct
        .client
        .txn_offset_commit(forged)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.error_code), ErrorCode::ClusterAuthorizationFailed);
    let ended = t.end(next, true).await;
    t.wait_state(TxnState::CompleteCommit).await;
    assert_eq!(
        stable(&gc, vec![tp("t", 0)]).await,
        (ErrorCode::None, vec![("t".into(), 0, 42)]),
        "neither commit was part of the transaction"
    );
    // The same commit through the group's coordinator: pending, then applied.
    assert_eq!(t.add_offsets(ended, &group).await, ErrorCode::None);
    assert_eq!(
        t.commit_offsets(ended, &group, &[("t", 0, 50)]).await,
        ErrorCode::None
    );
    assert_eq!(
        stable(&gc, vec![tp("t", 0)]).await.0,
        ErrorCode::UnstableOffsetCommit
    );
    t.end(ended, true).await;
    t.wait_state(TxnState::CompleteCommit).await;
    assert_eq!(
        stable(&gc, vec![tp("t", 0)]).await,
        (ErrorCode::None, vec![("t".into(), 0, 50)])
    );

    // A node that coordinates neither the group nor the transaction: NOT_COORDINATOR.
    let other = cluster.id_owned_by(2, "txn-other");
    let mut o = Txn::new(gc.clone(), &other);
    let ope = o.init().await;
    assert_eq!(o.add_offsets(ope, &group).await, ErrorCode::None);
    let mut wrong_node = Txn::new(cluster.client(1).await, &other);
    assert_eq!(
        wrong_node
            .commit_offsets(ope, &group, &[("t", 0, 60)])
            .await,
        ErrorCode::NotCoordinator
    );
    assert_eq!(
        stable(&gc, vec![tp("t", 0)]).await,
        (ErrorCode::None, vec![("t".into(), 0, 50)])
    );
}

/// When the transaction's coordinator does not answer a forwarded TxnOffsetCommit, the
/// outcome is unknown (it may hold the offsets), so the group's coordinator keeps them pending
/// until the transaction's marker for the group, here its abort after a restart.
#[tokio::test]
async fn offsets_whose_forwarding_got_no_answer_stay_pending_until_the_marker() {
    let mut cluster = Cluster::start(2).await;
    let id = cluster.id_owned_by(1, "txn-unknown");
    let group = cluster.id_owned_by(2, "group-unknown");
    let mut gc = cluster.client(2).await;
    let mut t = Txn::new(cluster.client(1).await, &id).with_group_client(gc.clone());
    let pe = t.init().await;
    assert_eq!(t.add_offsets(pe, &group).await, ErrorCode::None);
    cluster.stop(1).await;
    let mut via_group = Txn::new(gc.clone(), &id);
    assert_eq!(
        via_group.commit_offsets(pe, &group, &[("t", 0, 7)]).await,
        ErrorCode::CoordinatorNotAvailable
    );
    assert_eq!(
        offset_fetch_as(&mut gc, &group, vec![tp("t", 0)], true)
            .await
            .0,
        ErrorCode::UnstableOffsetCommit,
        "kept pending: the outcome is unknown"
    );
    cluster.restart(1).await;
    let mut t = Txn::new(cluster.client(1).await, &id);
    t.end(pe, false).await;
    t.wait_state(TxnState::CompleteAbort).await;
    assert_eq!(
        offset_fetch_as(&mut gc, &group, vec![tp("t", 0)], true).await,
        (ErrorCode::None, vec![("t".into(), 0, -1)])
    );
}
