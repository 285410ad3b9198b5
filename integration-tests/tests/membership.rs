//! Trust no caller (PROTOCOL.md section 12): the internal APIs refuse whoever is not the cluster
//! member allowed to send them, and nodes that run different topologies do not both serve an id.
//!
//! The four forged-marker cases: an ABORT marker from "coordinator 999" at a huge generation; a
//! forged COMMIT for one partition of a transaction its producer then aborts; a group offset
//! marker from "coordinator 999"; a marker for a PID the leader never saw. Each is refused
//! (CLUSTER_AUTHORIZATION_FAILED), stores nothing, and the real transaction is unaffected. Then a
//! marker signed with the real secret by the coordinator that does NOT own the id, and one
//! signed under another topology; then the 3-vs-2 coordinator restart.

use std::collections::BTreeSet;
use std::time::Duration;

use cluster::auth::{self, ClusterSecret, Credentials, InternalRequest};
use cluster::{Node, Topology};
use integration_tests::*;
use minibroker::EmbeddedCluster;
use producer_client::{Admin, Consumer, Isolation, TopicPartition};
use proto::partition_leader_client::PartitionLeaderClient;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::ErrorCode;

const TOPIC: &str = "input";

fn code(c: i32) -> ErrorCode {
    ErrorCode::from_wire(c)
}

async fn leader_client(
    cluster: &EmbeddedCluster,
    partition: i32,
) -> PartitionLeaderClient<tonic::transport::Channel> {
    let leader = cluster
        .topology()
        .leader_for(TOPIC, partition)
        .unwrap()
        .clone();
    PartitionLeaderClient::connect(format!("http://{}", leader.address))
        .await
        .unwrap()
}

async fn coordinator_client(
    address: &str,
) -> TransactionCoordinatorClient<tonic::transport::Channel> {
    TransactionCoordinatorClient::connect(format!("http://{address}"))
        .await
        .unwrap()
}

fn marker(
    pid: i64,
    epoch: i32,
    commit: bool,
    coordinator_id: i32,
    generation: i64,
    partition: i32,
    transactional_id: &str,
) -> proto::WriteTxnMarkersRequest {
    proto::WriteTxnMarkersRequest {
        producer_id: pid,
        producer_epoch: epoch,
        result: if commit {
            proto::TxnResult::Commit
        } else {
            proto::TxnResult::Abort
        } as i32,
        coordinator_id,
        coordinator_generation: generation,
        partitions: vec![proto::TopicPartition {
            topic: TOPIC.into(),
            partition,
        }],
        transactional_id: transactional_id.into(),
        auth: None,
        transaction_version: 2,
        transaction_number: 0,
    }
}

fn sign<R: InternalRequest>(secret: &ClusterSecret, node: i32, topology: &Topology, r: &mut R) {
    let credentials = Credentials {
        secret: secret.clone(),
        node_id: node,
        fingerprint: topology.fingerprint(),
    };
    auth::sign(&credentials, r, cluster::node::now_ms());
}

async fn send_marker(
    cluster: &EmbeddedCluster,
    partition: i32,
    request: proto::WriteTxnMarkersRequest,
) -> ErrorCode {
    let r = leader_client(cluster, partition)
        .await
        .write_txn_markers(request)
        .await
        .unwrap()
        .into_inner();
    code(r.results[0].error_code)
}

/// Producer state of every PID on `TOPIC`-`partition`, as (pid, epoch, open txn start).
async fn producer_state(cluster: &EmbeddedCluster, partition: i32) -> BTreeSet<(i64, i32, i64)> {
    Admin::new(config(cluster))
        .unwrap()
        .describe_producers(TOPIC, partition)
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.producer_id, p.producer_epoch, p.current_txn_start_offset))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_markers_are_refused_store_nothing_and_leave_the_real_transaction_alone() {
    let cluster = cluster().await;
    let topology = cluster.topology();
    let id = "txn-forgery";
    let owner = cluster.coordinator_for(id);
    let other = *cluster
        .coordinator_ids()
        .iter()
        .find(|c| **c != owner)
        .unwrap();
    let mut p = producer(&cluster, id).await;
    let (pid, epoch) = (p.producer_id(), i32::from(p.epoch()));
    p.begin_transaction().unwrap();
    p.send_and_wait(TOPIC, 0, "real-0").await.unwrap();
    p.send_and_wait(TOPIC, 1, "real-1").await.unwrap();
    let before = (
        producer_state(&cluster, 0).await,
        producer_state(&cluster, 1).await,
    );

    // 1. ABORT from "coordinator 999" at generation 10^12, unsigned and with a wrong secret.
    let forged = marker(pid, epoch + 1, false, 999, 1_000_000_000_000, 0, id);
    assert_eq!(
        send_marker(&cluster, 0, forged.clone()).await,
        ErrorCode::ClusterAuthorizationFailed
    );
    let mut wrong = forged.clone();
    sign(&ClusterSecret::generate(), 999, &topology, &mut wrong);
    assert_eq!(
        send_marker(&cluster, 0, wrong).await,
        ErrorCode::ClusterAuthorizationFailed
    );
    // 2. A forged COMMIT for one partition of the open transaction: unsigned from 999, and
    //    signed with the real secret by the member that does not own the id.
    let commit = marker(pid, epoch + 1, true, 999, 0, 0, id);
    assert_eq!(
        send_marker(&cluster, 0, commit).await,
        ErrorCode::ClusterAuthorizationFailed
    );
    let mut member = marker(pid, epoch + 1, true, other, 1_000, 0, id);
    sign(cluster.cluster_secret(), other, &topology, &mut member);
    assert_eq!(
        send_marker(&cluster, 0, member).await,
        ErrorCode::ClusterAuthorizationFailed
    );
    // Signed by the owner, but under another topology: INCONSISTENT_CLUSTER_ID.
    let mut elsewhere = Topology::clone(&topology);
    elsewhere.transaction_state_partitions += 1;
    let mut foreign = marker(pid, epoch + 1, true, owner, 1_000, 0, id);
    sign(cluster.cluster_secret(), owner, &elsewhere, &mut foreign);
    assert_eq!(
        send_marker(&cluster, 0, foreign).await,
        ErrorCode::InconsistentClusterId
    );
    // 4. A marker for a PID the leader never saw, from 999: refused, no state created.
    assert_eq!(
        send_marker(&cluster, 2, marker(424_242, 3, true, 999, 0, 2, id)).await,
        ErrorCode::ClusterAuthorizationFailed
    );
    assert!(producer_state(&cluster, 2)
        .await
        .iter()
        .all(|(p, _, _)| *p != 424_242));
    assert_eq!(
        (
            producer_state(&cluster, 0).await,
            producer_state(&cluster, 1).await
        ),
        before,
        "nothing stored by any forged marker"
    );

    // The producer aborts: nothing of its transaction is visible on either partition.
    p.abort_transaction().await.unwrap();
    let visible = values(&cluster, TOPIC, Isolation::ReadCommitted).await;
    assert!(
        !visible.iter().any(|v| v.starts_with("real-")),
        "{visible:?}"
    );
    // And it carries on: its next transaction commits (the real markers are not refused).
    p.begin_transaction().unwrap();
    p.send_and_wait(TOPIC, 0, "next-0").await.unwrap();
    p.commit_transaction().await.unwrap();
    let visible = values(&cluster, TOPIC, Isolation::ReadCommitted).await;
    assert_eq!(visible, vec!["next-0".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_group_offset_markers_are_refused() {
    let cluster = cluster().await;
    let topology = cluster.topology();
    let group = "group-forgery";
    let group_coordinator = topology.coordinator_for(group).clone();
    let tp = TopicPartition::new(TOPIC, 0);
    let mut consumer = Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    let committed = consumer
        .committed_offsets(group, std::slice::from_ref(&tp))
        .await
        .unwrap();

    let txid = "txn-group-forgery";
    let owner = cluster.coordinator_for(txid);
    let other = *cluster
        .coordinator_ids()
        .iter()
        .find(|c| **c != owner)
        .unwrap();
    let request = |coordinator_id: i32| proto::WriteGroupOffsetMarkerRequest {
        group_id: group.into(),
        producer_id: 77,
        producer_epoch: 1,
        result: proto::TxnResult::Commit as i32,
        offsets: vec![proto::PartitionOffset {
            topic: TOPIC.into(),
            partition: 0,
            offset: 12_345,
        }],
        coordinator_id,
        coordinator_generation: 1,
        transactional_id: txid.into(),
        auth: None,
        transaction_version: 2,
        transaction_number: 1,
    };
    let mut client = coordinator_client(&group_coordinator.address).await;
    // From "coordinator 999", unsigned; and from the member that does not own the id.
    let mut member = request(other);
    sign(cluster.cluster_secret(), other, &topology, &mut member);
    for r in [request(999), member] {
        let reply = client
            .write_group_offset_marker(r)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            code(reply.error_code),
            ErrorCode::ClusterAuthorizationFailed,
            "{}",
            reply.error_message
        );
    }
    assert_eq!(
        consumer
            .committed_offsets(group, std::slice::from_ref(&tp))
            .await
            .unwrap(),
        committed,
        "the group's offsets did not move"
    );
    // The real owner, signed, is accepted (the rule is membership, not a closed door).
    let mut real = request(owner);
    sign(cluster.cluster_secret(), owner, &topology, &mut real);
    let reply = client
        .write_group_offset_marker(real)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        code(reply.error_code),
        ErrorCode::None,
        "{}",
        reply.error_message
    );
    let now = consumer
        .committed_offsets(group, std::slice::from_ref(&tp))
        .await
        .unwrap();
    assert_eq!(now.get(&tp), Some(&12_345));
}

/// A marker captured on the wire and sent again is refused, though its signature is the
/// owner's: with transaction version 1 (the epoch stays across a producer's transactions), the
/// replay of one transaction's group COMMIT after the next one committed would put the group's
/// offsets back, and a leader would take a replayed marker for the open transaction's. A marker
/// signed afresh (a retry) is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_marker_is_refused_and_changes_nothing() {
    let mut cluster = cluster().await;
    let topology = cluster.topology();
    let group = "group-replay";
    let group_coordinator = topology.coordinator_for(group).clone();
    let txid = "txn-replay";
    let owner = cluster.coordinator_for(txid);
    let tp = TopicPartition::new(TOPIC, 0);
    let request = |offset: i64| {
        let mut r = proto::WriteGroupOffsetMarkerRequest {
            group_id: group.into(),
            producer_id: 88,
            producer_epoch: 1,
            result: proto::TxnResult::Commit as i32,
            offsets: vec![proto::PartitionOffset {
                topic: TOPIC.into(),
                partition: 0,
                offset,
            }],
            coordinator_id: owner,
            coordinator_generation: 1,
            transactional_id: txid.into(),
            auth: None,
            transaction_version: 1,
            // Not numbered: each marker at the epoch is a new transaction, so only the replay
            // guard tells a replay apart.
            transaction_number: 0,
        };
        sign(cluster.cluster_secret(), owner, &topology, &mut r);
        r
    };
    let client = coordinator_client(&group_coordinator.address).await;
    let send = |r: proto::WriteGroupOffsetMarkerRequest| {
        let mut client = client.clone();
        async move {
            let reply = client
                .write_group_offset_marker(r)
                .await
                .unwrap()
                .into_inner();
            code(reply.error_code)
        }
    };
    let first = request(100);
    assert_eq!(send(first.clone()).await, ErrorCode::None);
    // The producer's next transaction, at the same epoch (version 1), commits 200.
    assert_eq!(send(request(200)).await, ErrorCode::None);
    assert_eq!(
        send(first.clone()).await,
        ErrorCode::ClusterAuthorizationFailed
    );
    let mut consumer = Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    let offsets = consumer
        .committed_offsets(group, std::slice::from_ref(&tp))
        .await
        .unwrap();
    assert_eq!(offsets.get(&tp), Some(&200), "the replay moved nothing");

    // The group's coordinator restarts: its memory of what it accepted is gone, and what was
    // signed before it started is refused all the same.
    cluster.kill(group_coordinator.id).await.unwrap();
    cluster.restart(group_coordinator.id).await.unwrap();
    let mut consumer = Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    let committed = consumer
        .committed_offsets(group, std::slice::from_ref(&tp))
        .await
        .unwrap();
    assert_eq!(committed.get(&tp), Some(&200));
    let client = coordinator_client(&group_coordinator.address).await;
    let reply = client
        .clone()
        .write_group_offset_marker(first)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        code(reply.error_code),
        ErrorCode::CoordinatorLoadInProgress,
        "refused (retriable: a real sender signs its next attempt afresh): {}",
        reply.error_message
    );
    let offsets = consumer
        .committed_offsets(group, std::slice::from_ref(&tp))
        .await
        .unwrap();
    assert_eq!(
        offsets.get(&tp),
        Some(&200),
        "the replay after a restart moved nothing"
    );

    // The same at a leader: a marker for a PID without a transaction, accepted once.
    let mut marker = marker(515_151, 2, true, owner, 1, 0, txid);
    marker.transaction_version = 1;
    sign(cluster.cluster_secret(), owner, &topology, &mut marker);
    assert_eq!(
        send_marker(&cluster, 0, marker.clone()).await,
        ErrorCode::None
    );
    assert_eq!(
        send_marker(&cluster, 0, marker.clone()).await,
        ErrorCode::ClusterAuthorizationFailed
    );
    // Signed again (as a retry is): a new signature, accepted.
    sign(cluster.cluster_secret(), owner, &topology, &mut marker);
    assert_eq!(
        send_marker(&cluster, 0, marker.clone()).await,
        ErrorCode::None
    );
    // The leader restarts: the marker it accepted before is still refused.
    let leader = topology.leader_for(TOPIC, 0).unwrap().id;
    cluster.kill(leader).await.unwrap();
    cluster.restart(leader).await.unwrap();
    assert_eq!(
        send_marker(&cluster, 0, marker.clone()).await,
        ErrorCode::CoordinatorLoadInProgress
    );
    sign(cluster.cluster_secret(), owner, &topology, &mut marker);
    assert_eq!(send_marker(&cluster, 0, marker).await, ErrorCode::None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_transaction_is_refused_from_outside_the_cluster() {
    let cluster = cluster().await;
    let id = "txn-verify-outside";
    let owner = cluster.coordinator_for(id);
    let address = cluster.address(owner).unwrap().to_string();
    let reply = coordinator_client(&address)
        .await
        .verify_transaction(proto::VerifyTransactionRequest {
            transactional_id: id.into(),
            producer_id: 1,
            producer_epoch: 0,
            partition: Some(proto::TopicPartition {
                topic: TOPIC.into(),
                partition: 0,
            }),
            auth: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        code(reply.error_code),
        ErrorCode::ClusterAuthorizationFailed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinators_with_different_topologies_never_both_own_an_id() {
    let mut cluster = cluster().await;
    let topology = cluster.topology();
    // Coordinator 1 comes back with a topology of three coordinators (the third never started)
    // while coordinator 2 keeps two.
    let mut three = Topology::clone(&topology);
    three.coordinators.push(Node {
        id: 3,
        address: "127.0.0.1:1".into(),
        kafka_address: None,
    });
    three.validate().unwrap();
    cluster.kill(1).await.unwrap();
    cluster.restart_with_topology(1, three).await.unwrap();

    let addresses: Vec<String> = [1, 2]
        .iter()
        .map(|id| cluster.address(*id).unwrap().to_string())
        .collect();
    let mut clients = Vec::new();
    for a in &addresses {
        clients.push(coordinator_client(a).await);
    }
    // Give both their peer check (200 ms in the embedded cluster): then neither serves "txn-probe".
    let probe = |mut c: TransactionCoordinatorClient<tonic::transport::Channel>| async move {
        let r = c
            .init_producer_id(proto::InitProducerIdRequest {
                transactional_id: Some("txn-probe".into()),
                transaction_timeout_ms: 60_000,
                expected_producer_id: -1,
                expected_producer_epoch: -1,
                transaction_version: 2,
            })
            .await
            .unwrap()
            .into_inner();
        (code(r.error_code), r.error_message)
    };
    testkit::poll::wait_until(
        Duration::from_secs(10),
        "both coordinators see the conflict",
        || {
            let clients = clients.clone();
            async move {
                for c in clients {
                    let (code, _) = probe(c).await;
                    if code != ErrorCode::CoordinatorNotAvailable
                        && code != ErrorCode::NotCoordinator
                    {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    let mut refusals = String::new();
    for c in clients.clone() {
        let (code, message) = probe(c).await;
        if code == ErrorCode::CoordinatorNotAvailable {
            refusals = message;
        }
    }
    assert!(refusals.contains("topology"), "{refusals}");

    let mut doubly_owned = Vec::new();
    for n in 0..400 {
        let id = format!("txn-owner-{n}");
        let mut owners = 0;
        for c in clients.iter_mut() {
            let r = c
                .init_producer_id(proto::InitProducerIdRequest {
                    transactional_id: Some(id.clone()),
                    transaction_timeout_ms: 60_000,
                    expected_producer_id: -1,
                    expected_producer_epoch: -1,
                    transaction_version: 2,
                })
                .await
                .unwrap()
                .into_inner();
            if code(r.error_code) == ErrorCode::None {
                owners += 1;
            }
        }
        if owners > 1 {
            doubly_owned.push(id);
        }
    }
    assert!(doubly_owned.is_empty(), "owned twice: {doubly_owned:?}");
}
