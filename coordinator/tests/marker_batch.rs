//! Markers of several transactions for one leader travel in one WriteTxnMarkersBatch; a leader
//! without that RPC gets one WriteTxnMarkers per transaction.

mod common;

use common::*;
use proto::{ErrorCode, TxnState};

const IDS: usize = 8;

/// Ends `IDS` transactions on partition t-0 (leader 101) while the leader's marker requests are
/// held, then lets them through and waits until every transaction completed.
async fn end_many_while_the_leader_is_held(cluster: &Cluster) {
    let leader = cluster.leaders[0].clone();
    let held = leader.gate.clone().write_owned().await;
    let mut txns = Vec::new();
    for i in 0..IDS {
        let mut t = Txn::new(cluster.client(1).await, &format!("batch-{i}"));
        let pe = t.init().await;
        assert_eq!(t.add(pe, vec![tp("t", 0)]).await, ErrorCode::None);
        t.end(pe, true).await;
        txns.push(t);
    }
    for t in &mut txns {
        t.wait_state(TxnState::PrepareCommit).await;
    }
    drop(held);
    for t in &mut txns {
        t.wait_state(TxnState::CompleteCommit).await;
    }
    // Each transaction's marker reached the leader exactly once (every one was acknowledged).
    let mut pids: Vec<i64> = leader.markers().iter().map(|m| m.producer_id).collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), IDS);
    assert_eq!(leader.markers().len(), IDS);
}

#[tokio::test]
async fn markers_queued_for_one_leader_share_a_request() {
    let cluster = Cluster::start(1).await;
    end_many_while_the_leader_is_held(&cluster).await;
    let batches = cluster.leaders[0].batches.lock().unwrap().clone();
    // The first request was in flight (held) while the others queued behind it.
    assert!(
        batches.iter().any(|&n| n > 1),
        "no batch of more than one transaction: {batches:?}"
    );
}

#[tokio::test]
async fn a_leader_without_batches_gets_one_request_per_transaction() {
    let cluster = Cluster::start(1).await;
    *cluster.leaders[0].batches_supported.lock().unwrap() = false;
    end_many_while_the_leader_is_held(&cluster).await;
    assert!(cluster.leaders[0].batches.lock().unwrap().is_empty());
}
