//! Real Kafka clients against mini-broker's Kafka face (issue "Speak Kafka").
//!
//! Each test starts an [`minibroker::EmbeddedCluster`] (every node has a Kafka listener on
//! loopback) and runs a client against its Kafka bootstrap list: the Python scripts in
//! `integration-tests/kafka/` (confluent-kafka, i.e. librdkafka, and kafka-python), `kcat`, or
//! raw sockets. A script prints one JSON object on its last line and exits non-zero when one of
//! its own checks fails; the test asserts on both.
//!
//! The Python interpreter is `$MINIBROKER_KAFKA_PYTHON`, else `target/kafka-venv/bin/python`
//! (`.ci/run` creates it with the pinned packages). Without it, or without `kcat`, those tests
//! pass with a notice, unless `MINIBROKER_REQUIRE_KAFKA_CLIENTS=1` (CI sets it): then they fail.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use integration_tests::{cluster, cluster_with, config, read_topic, tp};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use producer_client::{IdempotentProducer, Isolation};
use serde_json::Value;
use testkit::kafka::{call as kafka_call, join_group, offset_fetch_v7, OffsetTxn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest a client script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

use testkit::clients::{repo_root, required as require_clients};

/// The Python with confluent-kafka and kafka-python, or `None` (after the notice / failure).
async fn python() -> Option<PathBuf> {
    testkit::clients::python()
}

/// Runs `script` from `integration-tests/kafka/` with the bootstrap list and `args`; returns
/// the JSON it printed last. Fails the test if the script fails or times out.
async fn run_script(python: &Path, script: &str, bootstrap: &str, args: &[&str]) -> Value {
    let dir = repo_root().join("integration-tests/kafka");
    let child = tokio::process::Command::new(python)
        .arg(dir.join(script))
        .arg(bootstrap)
        .args(args)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {SCRIPT_TIMEOUT:?}"))
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("{script}: last line is not JSON ({e}): {stdout}\n{stderr}"))
}

/// Records come back as sent: Kafka's null key and null value (a tombstone) are kept apart from
/// empty ones, and headers that repeat a key are all kept, in order. Records librdkafka
/// produced come back so to librdkafka and kafka-python, and our gRPC consumer sees the same
/// nulls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn null_and_empty_keys_values_and_repeated_headers_reach_consumers_as_sent() {
    let Some(python) = python().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "fidelity.py", &bootstrap, &["input", "1"]).await;
    let sent = serde_json::json!([
        [null, null],
        ["", ""],
        ["k", null],
        [null, "v"],
        ["", null],
        [null, ""]
    ]);
    assert_eq!(report["confluent"], sent, "{report}");
    assert_eq!(report["kafka_python"], sent, "{report}");
    assert_eq!(report["headers"], 3, "{report}");
    integration_tests::wait_settled(&cluster, "input").await;
    let mut ours = producer_client::Consumer::new(config(&cluster), Isolation::ReadCommitted)
        .expect("consumer");
    ours.assign_topics(&["input"]).await.expect("assign");
    let read = ours
        .read_to_end(Duration::from_secs(20))
        .await
        .expect("read to end");
    let nulls: Vec<(bool, bool, &[u8], &[u8])> = read
        .iter()
        .map(|r| (r.null_key, r.null_value, &r.key[..], &r.value[..]))
        .collect();
    assert_eq!(
        nulls,
        [
            (true, true, &b""[..], &b""[..]),
            (false, false, b"", b""),
            (false, true, b"k", b""),
            (true, false, b"", b"v"),
            (false, true, b"", b""),
            (true, false, b"", b""),
        ],
        "our gRPC consumer"
    );
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_transactions_commit_and_abort_across_partitions() {
    let Some(python) = python().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "txn_producer.py", &bootstrap, &["output", "200"]).await;
    assert_eq!(report["transactions"], 200);
    assert_eq!(report["aborted"], 66);
    assert_eq!(report["committed_records"], 402);
    assert_eq!(report["read_committed"], 402);
    assert_eq!(report["read_uncommitted"], 600);
    // Our own read_committed consumer (gRPC) agrees with librdkafka's filtering.
    let ours = read_topic(&cluster, "output", Isolation::ReadCommitted).await;
    assert_eq!(ours.values().map(Vec::len).sum::<usize>(), 402);
    cluster.shutdown().await.unwrap();
}

/// Compressed batches from real clients: librdkafka's gzip and snappy and kafka-python's gzip
/// are inflated (within the leader's bound) and read back once, in order; lz4, not built in,
/// is refused with UNSUPPORTED_COMPRESSION_TYPE and nothing of it is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compressed_batches_from_kafka_clients_are_stored_or_refused_by_codec() {
    let Some(python) = python().await else { return };
    let cluster = cluster_with(minibroker::EmbeddedOptions {
        topics: vec![("compressed".into(), 4)],
        ..Default::default()
    })
    .await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "compressed.py", &bootstrap, &["compressed", "60"]).await;
    for stored in ["librdkafka-gzip", "librdkafka-snappy", "kafka-python-gzip"] {
        assert_eq!(report[stored]["errors"], serde_json::json!([]), "{report}");
        assert_eq!(report[stored]["read"], 60, "{report}");
        assert_eq!(report[stored]["once_in_order"], true, "{report}");
    }
    let lz4 = &report["librdkafka-lz4"];
    assert_eq!(
        lz4["errors"],
        serde_json::json!(["UNSUPPORTED_COMPRESSION_TYPE"]),
        "{report}"
    );
    assert_eq!(lz4["read"], 0, "{report}");
    cluster.shutdown().await.unwrap();
}

/// An idempotent producer of a Kafka client (the script, argument 2: librdkafka or
/// kafka-python) idle long enough for the leader to forget its state
/// (producer.id.expiration.ms), then writing on at its next sequence: the leader takes it, as
/// Kafka's does since KIP-360, with no error, loss or duplicate. (kafka-python does not recover
/// from UNKNOWN_PRODUCER_ID: it failed every record of the second half when this leader
/// demanded sequence 0.)
async fn idempotent_producer_goes_on_after_its_state_expired(script: &str) {
    let Some(python) = python().await else { return };
    let cluster = cluster_with(minibroker::EmbeddedOptions {
        // Each half is written well within it, the pause is well past it.
        producer_id_expiration: (Duration::from_millis(1_500), Duration::from_millis(50)),
        ..Default::default()
    })
    .await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, script, &bootstrap, &["input", "20", "4"]).await;
    assert_eq!(report["errors"], serde_json::json!([]), "{report}");
    if let Some(fatal) = report.get("fatal") {
        assert_eq!(fatal, &serde_json::json!([]), "{report}");
    }
    assert_eq!(report["read"], 40, "{report}");
    assert_eq!(report["once_in_order"], true, "{report}");
    // The leader did forget the state during the pause, and the producer it knows now is the
    // same one, resumed where it stopped (one state ending at sequence 39).
    let expired = metric_sum(&cluster, "minibroker_producer_states_expired_total", &[]);
    assert!(expired >= 1.0, "producer states expired: {expired}");
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    let address = cluster.address(leader).unwrap();
    let mut client =
        proto::partition_leader_client::PartitionLeaderClient::connect(format!("http://{address}"))
            .await
            .unwrap();
    let producers = client
        .describe_producers(proto::DescribeProducersRequest {
            topic: "input".into(),
            partition: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .producers;
    let last: Vec<i32> = producers.iter().map(|p| p.last_sequence).collect();
    assert_eq!(last, vec![39], "producer states at the leader");
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_idempotent_producer_goes_on_after_its_state_expired() {
    idempotent_producer_goes_on_after_its_state_expired("idle_idempotent.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_python_idempotent_producer_goes_on_after_its_state_expired() {
    idempotent_producer_goes_on_after_its_state_expired("idle_idempotent_kafka_python.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_zombie_is_fenced_by_a_new_instance() {
    let Some(python) = python().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "fencing_confluent.py", &bootstrap, &["output"]).await;
    assert_eq!(report["a_error"], "_FENCED", "{report}");
    assert_eq!(report["a_fatal"], true, "{report}");
    assert_eq!(report["a_txn_requires_abort"], false, "{report}");
    assert_eq!(report["b_committed"], 3);
    assert_eq!(report["a_visible"], 0);
    // The Kafka face counts what it answered, as the gRPC face does: the zombie's refusal under
    // its transactional id, and both instances' InitProducerId.
    let txn_id = report["txn_id"].as_str().unwrap();
    let fenced = metric_sum(
        &cluster,
        "minibroker_fenced_requests_total",
        &[("transactional_id", txn_id)],
    );
    assert!(fenced >= 1.0, "fenced requests of {txn_id}: {fenced}");
    let inits = metric_sum(
        &cluster,
        "kafka_network_requestmetrics_errors_total",
        &[("request", "InitProducerId"), ("error", "NONE")],
    );
    assert!(inits >= 2.0, "InitProducerId answered: {inits}");
    cluster.shutdown().await.unwrap();
}

/// PROTOCOL.md section 8 (beyond Kafka): a producer whose transaction the coordinator aborted
/// for its timeout is told so with an abortable error, not librdkafka's fatal "fenced", so the
/// same instance aborts and carries on; nothing of the timed-out transaction is visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_producer_carries_on_after_its_transaction_timed_out() {
    let Some(python) = python().await else { return };
    let cluster = cluster_with(minibroker::EmbeddedOptions {
        timeout_scan_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "timeout_confluent.py", &bootstrap, &["output"]).await;
    assert_eq!(report["fatal"], false, "{report}");
    // Its record sent after the stall was refused by the leader as timed out, not fenced.
    assert_eq!(
        report["delivery_errors"],
        serde_json::json!(["INVALID_PRODUCER_ID_MAPPING"]),
        "{report}"
    );
    assert_eq!(report["txn_requires_abort"], true, "{report}");
    assert_eq!(report["committed_after"], 3, "{report}");
    assert_eq!(report["timed_out_visible"], 0, "{report}");
    cluster.shutdown().await.unwrap();
}

/// A cluster whose groups' first rebalance waits 100 ms instead of Kafka's 3 s (group tests
/// start their members themselves; nothing is gained by waiting for more).
async fn group_cluster() -> minibroker::EmbeddedCluster {
    cluster_with(minibroker::EmbeddedOptions {
        group_initial_rebalance_delay: Duration::from_millis(100),
        ..Default::default()
    })
    .await
}

/// KIP-345 with librdkafka: a new process with the same group.instance.id replaces the static
/// member and takes over exactly its partitions without a rebalance (the group's other,
/// dynamic, member is never revoked), and the old one, still alive, is fenced
/// (FENCED_INSTANCE_ID, fatal for librdkafka) instead of staying a second member of the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_static_member_is_replaced_and_the_old_instance_fenced() {
    let Some(python) = python().await else { return };
    let cluster = group_cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(
        &python,
        "static_member_confluent.py",
        &bootstrap,
        &["input"],
    )
    .await;
    assert_eq!(report["a_fatal"], true, "{report}");
    let (b, c) = (&report["b_partitions"], &report["c_partitions"]);
    assert_eq!(b.as_i64().unwrap() + c.as_i64().unwrap(), 3, "{report}");
    assert_eq!(report["c_revoked_after_replacement"], 0, "{report}");
    assert_eq!(report["b_assignments"], 1, "{report}");
    cluster.shutdown().await.unwrap();
}

/// ListGroups and DescribeGroups with librdkafka's AdminClient: a group of a static and a
/// dynamic consumer is listed Stable (every node asked, leaders answering an empty list) and
/// described with both members, their client ids, host, instance id and assignments; a group
/// nobody joined is Dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_admin_lists_and_describes_consumer_groups() {
    let Some(python) = python().await else { return };
    let cluster = group_cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(
        &python,
        "groups_admin_confluent.py",
        &bootstrap,
        &["input", "3"],
    )
    .await;
    assert_eq!(report["listed"], 1, "{report}");
    assert_eq!(report["members"], 2, "{report}");
    assert_eq!(report["owned"], serde_json::json!([0, 1, 2]), "{report}");
    cluster.shutdown().await.unwrap();
}

/// The same with kafka-python's KafkaAdminClient (list_groups, describe_groups).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_python_admin_lists_and_describes_consumer_groups() {
    let Some(python) = python().await else { return };
    let cluster = group_cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(
        &python,
        "groups_admin_kafka_python.py",
        &bootstrap,
        &["input"],
    )
    .await;
    assert_eq!(report["listed"], 1, "{report}");
    assert_eq!(report["members"], 1, "{report}");
    assert_eq!(report["owned"], serde_json::json!([0, 1, 2]), "{report}");
    assert_eq!(report["protocol"], "range", "{report}");
    cluster.shutdown().await.unwrap();
}

/// DeleteGroups and offset resets with librdkafka's AdminClient, as an operator uses them:
/// a group with a member is NON_EMPTY_GROUP and its offsets cannot be altered from outside;
/// once empty its offsets are reset and the next member starts from them; then the group is
/// deleted (not listed, described Dead, no offsets) and an unknown group is GROUP_ID_NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_admin_resets_offsets_and_deletes_a_consumer_group() {
    let Some(python) = python().await else { return };
    let cluster = group_cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "groups_delete_confluent.py", &bootstrap, &[]).await;
    assert_eq!(report["listed_after"], false, "{report}");
    assert_eq!(report["state"], "ConsumerGroupState.DEAD", "{report}");
    assert_eq!(report["offset_after"], -1001, "no offset: {report}");
    cluster.shutdown().await.unwrap();
}

/// OffsetDelete and DeleteGroups with kafka-python's KafkaAdminClient: a member's subscribed
/// topic keeps its offsets (GROUP_SUBSCRIBED_TO_TOPIC) while another topic's are deleted, a
/// group with a member is NON_EMPTY_GROUP; a group known only by its offsets is listed Empty,
/// deleted, and then GROUP_ID_NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_python_admin_deletes_offsets_and_groups() {
    let Some(python) = python().await else { return };
    let cluster = group_cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "groups_delete_kafka_python.py", &bootstrap, &[]).await;
    assert_eq!(report["listed_after"], 0, "{report}");
    assert_eq!(report["offset_after"], -1, "no offset: {report}");
    cluster.shutdown().await.unwrap();
}

/// DescribeConfigs with librdkafka's and kafka-python's admin clients: a topic's settings
/// (no retention: -1), a coordinator's (its transaction and group settings, as started) and a
/// leader's (its batch limit), each answered by that broker. And topic ids (Metadata v10-12):
/// both clients see the id derived from the topic's name, and kafka-python finds the topic by it.
/// The controller's APIs with librdkafka's and kafka-python's admin clients (topics_admin.py):
/// topics are fixed by the topology, so "create if missing" finds `input` as
/// TOPIC_ALREADY_EXISTS, a new topic is POLICY_VIOLATION with the reason, growing `input` is
/// POLICY_VIOLATION (to its own count INVALID_PARTITIONS), deleting it TOPIC_DELETION_DISABLED;
/// DescribeCluster lists every node; and afterwards `input` is unchanged, its record readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_clients_create_and_delete_topics_against_a_fixed_topology() {
    let Some(python) = python().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "topics_admin.py", &bootstrap, &[]).await;
    let c = &report["confluent"];
    let code = |v: &serde_json::Value| v[0].as_str().unwrap_or_default().to_string();
    assert_eq!(
        code(&c["create"]["input"]),
        "TOPIC_ALREADY_EXISTS",
        "{report}"
    );
    assert_eq!(
        code(&c["create"]["orders-new"]),
        "POLICY_VIOLATION",
        "{report}"
    );
    let why = c["create"]["orders-new"][1].as_str().unwrap();
    assert!(why.contains("topology file"), "{report}");
    assert_eq!(
        code(&c["create"]["bad name!"]),
        "TOPIC_EXCEPTION",
        "{report}"
    );
    assert_eq!(code(&c["validate_only"]), "POLICY_VIOLATION", "{report}");
    assert_eq!(code(&c["grow"]), "POLICY_VIOLATION", "{report}");
    assert_eq!(code(&c["grow_same"]), "INVALID_PARTITIONS", "{report}");
    assert_eq!(code(&c["delete"]), "TOPIC_DELETION_DISABLED", "{report}");
    let nodes: Vec<i64> = cluster
        .coordinator_ids()
        .into_iter()
        .chain(cluster.leader_ids())
        .map(i64::from)
        .collect();
    let mut nodes_sorted = nodes.clone();
    nodes_sorted.sort();
    assert_eq!(c["brokers"], serde_json::json!(nodes_sorted), "{report}");
    assert!(
        nodes.contains(&c["controller"].as_i64().unwrap_or(-1)),
        "{report}"
    );
    let k = &report["kafka_python"];
    assert_eq!(k["create_existing"], "TopicAlreadyExistsError", "{report}");
    assert_eq!(k["create_new"], "PolicyViolationError", "{report}");
    assert_eq!(k["delete"], "TopicDeletionDisabledError", "{report}");
    assert_eq!(report["input_partitions"], 3, "{report}");
    assert_eq!(report["orders_new_exists"], false, "{report}");
    assert_eq!(report["input_records"], 1, "{report}");
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_clients_describe_topic_and_broker_configs() {
    let Some(python) = python().await else { return };
    let cluster = group_cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let coordinator = cluster.topology().coordinators[0].id.to_string();
    let leader = cluster.topology().leaders[0].id.to_string();
    let report = run_script(
        &python,
        "configs_admin.py",
        &bootstrap,
        &[&coordinator, &leader],
    )
    .await;
    assert_eq!(report["topic"]["retention.ms"], "-1", "{report}");
    assert_eq!(report["topic"]["cleanup.policy"], "delete", "{report}");
    assert_eq!(
        report["kafka_python_topic"]["retention.ms"], "-1",
        "{report}"
    );
    let c = &report["coordinator"];
    assert_eq!(c["broker.id"], coordinator.as_str(), "{report}");
    assert_eq!(c["minibroker.role"], "coordinator", "{report}");
    assert_eq!(
        c["group.initial.rebalance.delay.ms"], "100",
        "as started: {report}"
    );
    assert_eq!(c["transaction.max.timeout.ms"], "900000", "{report}");
    let input_id: String = cluster::topic_id("input")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(report["topic_id"], input_id.as_str(), "{report}");
    assert_eq!(
        report["kafka_python_topic_id"],
        input_id.as_str(),
        "{report}"
    );
    let l = &report["leader"];
    assert_eq!(l["minibroker.role"], "leader", "{report}");
    assert!(
        l["message.max.bytes"]
            .as_str()
            .is_some_and(|v| v.parse::<u64>().is_ok()),
        "{report}"
    );
    cluster.shutdown().await.unwrap();
}

/// DeleteRecords with librdkafka's and kafka-python's admin clients: the low watermark moves,
/// consumers from the earliest offset (or from a deleted one, after OFFSET_OUT_OF_RANGE) start
/// there, a deletion past the high watermark is refused. The log start is durable: after the
/// leader restarts, ListOffsets(earliest) still answers it, and our gRPC consumer, reading from
/// 0, starts there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_clients_delete_records_and_readers_start_after_them() {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::*;
    let Some(python) = python().await else { return };
    let mut cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "delete_records.py", &bootstrap, &[]).await;
    assert_eq!(report["low"], 4, "{report}");
    assert_eq!(report["kafka_python_low"], 10, "{report}");
    assert_eq!(report["earliest"], 10, "{report}");

    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    cluster.kill(leader).await.unwrap();
    cluster.restart(leader).await.unwrap();
    let address = cluster.kafka_address(leader).unwrap();
    let earliest = testkit::poll::eventually_within(
        Duration::from_secs(20),
        "the leader is back",
        || async move {
            let mut t = ListOffsetsTopic::default();
            t.name = TopicName(kafka_wire::str_bytes("input"));
            let mut p = ListOffsetsPartition::default();
            p.partition_index = 0;
            p.timestamp = -2;
            t.partitions = vec![p];
            let mut r = ListOffsetsRequest::default();
            r.replica_id = BrokerId(-1);
            r.topics = vec![t];
            let ResponseKind::ListOffsets(answer) =
                kafka_call(address, ApiKey::ListOffsets, 7, RequestKind::ListOffsets(r)).await
            else {
                return None;
            };
            let p = &answer.topics[0].partitions[0];
            (p.error_code == 0).then_some(p.offset)
        },
    )
    .await;
    assert_eq!(earliest, 10, "the log start survived the restart");
    let ours = read_topic(&cluster, "input", Isolation::ReadUncommitted).await;
    assert!(ours.get(&0).is_none_or(Vec::is_empty), "{ours:?}");
    cluster.shutdown().await.unwrap();
}

/// KIP-345 over the raw protocol: a static member replaced while its JoinGroup is parked gets
/// FENCED_INSTANCE_ID there, not UNKNOWN_MEMBER_ID (which would make it rejoin as new and
/// replace its replacement in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_static_member_replaced_while_its_join_is_parked_is_fenced() {
    use kafka_protocol::messages::*;
    let cluster = group_cluster().await;
    let group = "static-parked";
    let coordinator = cluster
        .kafka_address(cluster.coordinator_for(group))
        .unwrap();
    let join = |member: &str, instance: Option<&str>| {
        let RequestKind::JoinGroup(mut j) = join_group(group, member) else {
            unreachable!()
        };
        j.group_instance_id = instance.map(str_bytes);
        async move {
            let ResponseKind::JoinGroup(r) =
                kafka_call(coordinator, ApiKey::JoinGroup, 5, RequestKind::JoinGroup(j)).await
            else {
                panic!("JoinGroup response")
            };
            (r.error_code, r.member_id.to_string(), r.generation_id)
        }
    };
    let sync = |member: String, generation: i32, assign: Vec<String>| async move {
        let mut r = SyncGroupRequest::default();
        r.group_id = GroupId(str_bytes(group));
        r.member_id = str_bytes(&member);
        r.generation_id = generation;
        r.assignments = assign
            .iter()
            .map(|m| {
                let mut a = sync_group_request::SyncGroupRequestAssignment::default();
                a.member_id = str_bytes(m);
                a
            })
            .collect();
        let ResponseKind::SyncGroup(r) =
            kafka_call(coordinator, ApiKey::SyncGroup, 3, RequestKind::SyncGroup(r)).await
        else {
            panic!("SyncGroup response")
        };
        r.error_code
    };
    // A (static, "i-1") and C (dynamic) form a generation and sync: the group is Stable.
    let (code, a, _) = join("", Some("i-1")).await;
    assert_eq!(code, 0, "a static member gets its id at once");
    let (code, c, _) = join("", None).await;
    assert_eq!(code, 79, "MEMBER_ID_REQUIRED");
    // C's JoinGroup starts a round, then A rejoins it.
    let c_join = tokio::spawn(join(&c, None));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let a_join = join(&a, Some("i-1")).await;
    let c_join = c_join.await.unwrap();
    assert_eq!((a_join.0, c_join.0), (0, 0));
    assert_eq!(a_join.2, c_join.2);
    let generation = a_join.2;
    let both = vec![a.clone(), c.clone()];
    let (sa, sc) = tokio::join!(
        sync(a.clone(), generation, both.clone()),
        sync(c.clone(), generation, both)
    );
    assert_eq!((sa, sc), (0, 0));
    // A rejoins and waits for C, which does not come.
    let parked = tokio::spawn(join(&a, Some("i-1")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!parked.is_finished(), "A's JoinGroup waits for C");
    // B, a new process with A's instance id, replaces A.
    let b = tokio::spawn(join("", Some("i-1")));
    let (code, _, _) = parked.await.unwrap();
    assert_eq!(
        code, 82,
        "FENCED_INSTANCE_ID for the replaced member's parked JoinGroup"
    );
    // C rejoins; the round completes with B and C.
    let (c_again, b) = tokio::join!(join(&c, None), b);
    let b = b.unwrap();
    assert_eq!((b.0, c_again.0), (0, 0));
    assert!(b.2 > generation);
    assert_ne!(b.1, a);
    cluster.shutdown().await.unwrap();
}

/// KIP-345 over the raw protocol: a static member that misses a round (a consumer restarting,
/// or busy past the rebalance timeout) keeps its place in the new generation, as in Kafka: the
/// new leader assigns it partitions, and when it comes back it rejoins without another round
/// and finds its assignment waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_static_member_late_for_a_round_keeps_its_place() {
    use kafka_protocol::messages::*;
    let cluster = group_cluster().await;
    let group = "static-late";
    let coordinator = cluster
        .kafka_address(cluster.coordinator_for(group))
        .unwrap();
    // Rebalance timeout 2 s, session 30 s: a static member may miss a round and stay.
    let join = |member: &str, instance: Option<&str>| {
        let RequestKind::JoinGroup(mut j) = join_group(group, member) else {
            unreachable!()
        };
        j.group_instance_id = instance.map(str_bytes);
        j.rebalance_timeout_ms = 2_000;
        async move {
            let ResponseKind::JoinGroup(r) =
                kafka_call(coordinator, ApiKey::JoinGroup, 5, RequestKind::JoinGroup(j)).await
            else {
                panic!("JoinGroup response")
            };
            r
        }
    };
    let sync = |member: String, generation: i32, assign: Vec<(String, &'static str)>| async move {
        let mut r = SyncGroupRequest::default();
        r.group_id = GroupId(str_bytes(group));
        r.member_id = str_bytes(&member);
        r.generation_id = generation;
        r.assignments = assign
            .into_iter()
            .map(|(m, part)| {
                let mut a = sync_group_request::SyncGroupRequestAssignment::default();
                a.member_id = str_bytes(&m);
                a.assignment = bytes::Bytes::from_static(part.as_bytes());
                a
            })
            .collect();
        let ResponseKind::SyncGroup(r) =
            kafka_call(coordinator, ApiKey::SyncGroup, 3, RequestKind::SyncGroup(r)).await
        else {
            panic!("SyncGroup response")
        };
        (r.error_code, r.assignment.to_vec())
    };
    // A (static "i-1") alone: generation 1, Stable.
    let first = join("", Some("i-1")).await;
    assert_eq!(first.error_code, 0);
    let a = first.member_id.to_string();
    let generation = first.generation_id;
    assert_eq!(
        sync(a.clone(), generation, vec![(a.clone(), "all")])
            .await
            .0,
        0
    );
    // C (dynamic) joins; A does not rejoin within the 2 s round.
    let c = join("", None).await.member_id.to_string();
    let started = std::time::Instant::now();
    let rc = join(&c, None).await;
    assert_eq!(rc.error_code, 0);
    assert!(
        started.elapsed() >= Duration::from_millis(1_500),
        "waited for A"
    );
    assert_eq!(rc.generation_id, generation + 1);
    assert_eq!(rc.leader.as_str(), c, "A did not rejoin: C leads");
    let listed: Vec<String> = rc.members.iter().map(|m| m.member_id.to_string()).collect();
    assert!(listed.contains(&a), "A kept its place: {listed:?}");
    let assignment = vec![(a.clone(), "pa"), (c.clone(), "pc")];
    assert_eq!(
        sync(c.clone(), rc.generation_id, assignment).await,
        (0, b"pc".to_vec())
    );
    // A comes back: answered at once with the current generation, its assignment waiting.
    let started = std::time::Instant::now();
    let back = join(&a, Some("i-1")).await;
    assert_eq!(back.error_code, 0);
    assert_eq!(
        back.generation_id, rc.generation_id,
        "no round for A's return"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(
        sync(a.clone(), back.generation_id, vec![]).await,
        (0, b"pa".to_vec())
    );
    cluster.shutdown().await.unwrap();
}

/// The sum of a metric's samples over every node of the cluster.
fn metric_sum(cluster: &minibroker::EmbeddedCluster, name: &str, labels: &[(&str, &str)]) -> f64 {
    cluster
        .coordinator_ids()
        .into_iter()
        .chain(cluster.leader_ids())
        .filter_map(|id| cluster.metrics(id))
        .filter_map(|m| cluster::metrics::sample(&m.render(), name, labels))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_python_zombie_is_fenced_by_a_new_instance() {
    let Some(python) = python().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(&python, "fencing_kafka_python.py", &bootstrap, &["output"]).await;
    let error = report["a_error"].as_str().unwrap_or_default();
    assert!(
        ["InvalidProducerEpochError", "ProducerFencedError"].contains(&error),
        "{report}"
    );
    assert_eq!(report["b_committed"], 3);
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_and_kafka_clients_read_each_others_records() {
    let Some(python) = python().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let mut grpc = IdempotentProducer::connect(config(&cluster)).await.unwrap();
    let target = producer_client::Target::PartitionWithKey(0, b"grpc-key".to_vec());
    let written = grpc
        .send_and_wait("input", target, "from-grpc")
        .await
        .unwrap();
    let report = run_script(&python, "mixed.py", &bootstrap, &["input", "from-grpc"]).await;
    assert_eq!(report["grpc_offset"], written.offset, "{report}");
    let kafka_offset = report["kafka_offset"].as_i64().unwrap();
    let mut consumer =
        producer_client::Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    consumer.assign([tp("input", 0)]);
    let records = consumer.read_to_end(Duration::from_secs(20)).await.unwrap();
    let theirs = records
        .iter()
        .find(|r| r.offset == kafka_offset)
        .expect("the Kafka client's record");
    assert_eq!(theirs.value, b"from-kafka");
    assert_eq!(theirs.key, b"kafka-key");
    assert_eq!(theirs.timestamp_ms, 1_700_000_000_123);
    cluster.shutdown().await.unwrap();
}

/// `kcat` if installed (else the notice, or a failure under MINIBROKER_REQUIRE_KAFKA_CLIENTS=1).
async fn kcat() -> Option<&'static str> {
    let ok = tokio::process::Command::new("kcat")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success());
    if ok {
        return Some("kcat");
    }
    assert!(
        !require_clients(),
        "MINIBROKER_REQUIRE_KAFKA_CLIENTS=1: kcat is not installed"
    );
    eprintln!("SKIPPED: kcat is not installed (apt-get install -y kcat)");
    None
}

async fn run_kcat(kcat: &str, args: &[&str], input: &[u8]) -> String {
    let mut child = tokio::process::Command::new(kcat)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kcat starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .expect("kcat finishes")
        .unwrap();
    assert!(
        output.status.success(),
        "kcat {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kcat_produces_and_consumes_read_committed() {
    let Some(kcat) = kcat().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let lines = b"a:one\nb:two\nc:three\n";
    run_kcat(
        kcat,
        &["-b", &bootstrap, "-P", "-t", "input", "-p", "1", "-K:"],
        lines,
    )
    .await;
    let out = run_kcat(
        kcat,
        &[
            "-b",
            &bootstrap,
            "-C",
            "-t",
            "input",
            "-p",
            "1",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-X",
            "isolation.level=read_committed",
            "-f",
            "%o %k %s\\n",
        ],
        b"",
    )
    .await;
    assert_eq!(out, "0 a one\n1 b two\n2 c three\n");
    // The gRPC consumer sees the same records.
    let ours = read_topic(&cluster, "input", Isolation::ReadCommitted).await;
    assert_eq!(ours[&1], vec!["one", "two", "three"]);
    cluster.shutdown().await.unwrap();
}

// ---- bad input on the Kafka port: raw sockets ------------------------------------------------

/// An ApiVersions v0 request frame with `correlation_id` (api key 18, version `version`).
fn api_versions_frame(version: i16, correlation_id: i32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes());
    body.extend_from_slice(&version.to_be_bytes());
    body.extend_from_slice(&correlation_id.to_be_bytes());
    body.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Reads one response frame: (correlation id, error code of an ApiVersions v0 body).
async fn read_api_versions(stream: &mut TcpStream) -> (i32, i16) {
    let len = stream.read_i32().await.expect("a response");
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await.unwrap();
    let correlation = i32::from_be_bytes(body[0..4].try_into().unwrap());
    let error = i16::from_be_bytes(body[4..6].try_into().unwrap());
    (correlation, error)
}

/// Whether the server closed `stream` (EOF or reset) within a few seconds.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// One record batch (v2) of one record with `value`, as a client encodes it.
fn record_batch(
    value: Vec<u8>,
    compression: kafka_protocol::records::Compression,
) -> bytes::BytesMut {
    plain_batch(vec![(1_700_000_000_000, value)], compression)
}

/// One record batch (v2) of a plain producer (no PID): a record per (timestamp, value).
fn plain_batch(
    records: Vec<(i64, Vec<u8>)>,
    compression: kafka_protocol::records::Compression,
) -> bytes::BytesMut {
    let records: Vec<_> = records
        .into_iter()
        .enumerate()
        .map(|(i, (timestamp, value))| kafka_protocol::records::Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset: i as i64,
            // Base sequence -1; offset - sequence the same for every record, or the encoder
            // makes a batch of each.
            sequence: i as i32 - 1,
            timestamp,
            key: None,
            value: Some(bytes::Bytes::from(value)),
            headers: Default::default(),
        })
        .collect();
    let mut buf = bytes::BytesMut::new();
    let options = kafka_protocol::records::RecordEncodeOptions {
        version: 2,
        compression,
    };
    kafka_protocol::records::RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
    buf
}

/// A Produce (acks=-1) of `batch` to one partition.
fn produce_request(
    topic: &str,
    partition: i32,
    batch: bytes::BytesMut,
) -> kafka_protocol::messages::ProduceRequest {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    let mut data = PartitionProduceData::default();
    data.index = partition;
    data.records = Some(batch.freeze());
    let mut topic_data = TopicProduceData::default();
    topic_data.name = kafka_protocol::messages::TopicName(str_bytes(topic));
    topic_data.partition_data = vec![data];
    let mut request = kafka_protocol::messages::ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 5_000;
    request.topic_data = vec![topic_data];
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_costs_one_connection_and_the_node_serves_the_next_client() {
    use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
    use kafka_protocol::records::Compression;
    let cluster = cluster().await;
    let leader = cluster.leader_ids()[0];
    let address = cluster.kafka_address(leader).unwrap();

    // An oversized frame: refused from its length alone (2 GiB is never allocated).
    let mut s = TcpStream::connect(address).await.unwrap();
    s.write_all(&i32::MAX.to_be_bytes()).await.unwrap();
    assert!(closed(&mut s).await, "oversized frame");

    // Garbage: a plausible length, then noise that is no request.
    let mut s = TcpStream::connect(address).await.unwrap();
    let mut garbage = 64i32.to_be_bytes().to_vec();
    garbage.extend((0..64u8).map(|i| i.wrapping_mul(37)));
    s.write_all(&garbage).await.unwrap();
    assert!(closed(&mut s).await, "garbage");

    // A Produce whose body is cut short (the frame is complete, the message is not).
    let mut s = TcpStream::connect(address).await.unwrap();
    let mut truncated = Vec::new();
    truncated.extend_from_slice(&0i16.to_be_bytes()); // Produce
    truncated.extend_from_slice(&7i16.to_be_bytes());
    truncated.extend_from_slice(&1i32.to_be_bytes());
    truncated.extend_from_slice(&(-1i16).to_be_bytes());
    truncated.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
    truncated.extend_from_slice(&(-1i16).to_be_bytes()); // acks
    let mut frame = (truncated.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&truncated);
    s.write_all(&frame).await.unwrap();
    assert!(closed(&mut s).await, "truncated request");

    // A frame that stops half-way, then the peer goes away.
    let mut s = TcpStream::connect(address).await.unwrap();
    s.write_all(&100i32.to_be_bytes()).await.unwrap();
    s.write_all(&[0u8; 10]).await.unwrap();
    drop(s);

    // A forged array length inside a small request (would be a 2^31-element allocation).
    let mut s = TcpStream::connect(address).await.unwrap();
    let mut forged = Vec::new();
    forged.extend_from_slice(&3i16.to_be_bytes()); // Metadata v1
    forged.extend_from_slice(&1i16.to_be_bytes());
    forged.extend_from_slice(&2i32.to_be_bytes());
    forged.extend_from_slice(&(-1i16).to_be_bytes());
    forged.extend_from_slice(&i32::MAX.to_be_bytes()); // topics: 2^31 - 1 of them
    let mut frame = (forged.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&forged);
    s.write_all(&frame).await.unwrap();
    assert!(closed(&mut s).await, "forged array length");

    // A Produce whose record batch is forged (a valid CRC over a record count of 2^31 - 1, and
    // a gzip bomb): CORRUPT_MESSAGE and MESSAGE_TOO_LARGE, on a connection that stays open.
    let partition = (0..3)
        .find(|p| cluster.topology().leader_for("input", *p).map(|l| l.id) == Some(leader))
        .expect("the leader leads a partition of input");
    let forged_count = {
        let mut batch = record_batch(b"v".to_vec(), Compression::None);
        batch[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        batch
    };
    let bomb = record_batch(vec![0u8; 8 << 20], Compression::Gzip);
    assert!(bomb.len() < 64 << 10);
    for (batch, code) in [(forged_count, 2), (bomb, 10)] {
        let response = kafka_call(
            address,
            ApiKey::Produce,
            7,
            RequestKind::Produce(produce_request("input", partition, batch)),
        )
        .await;
        let ResponseKind::Produce(response) = response else {
            panic!("not a Produce response")
        };
        let answer = &response.responses[0].partition_responses[0];
        assert_eq!(answer.error_code, code, "{:?}", answer.error_message);
    }

    // An unknown API key: closed without a response.
    let mut s = TcpStream::connect(address).await.unwrap();
    let mut unknown = api_versions_frame(0, 3);
    unknown[4..6].copy_from_slice(&999i16.to_be_bytes());
    s.write_all(&unknown).await.unwrap();
    assert!(closed(&mut s).await, "unknown api key");

    // ApiVersions at a version the node does not speak: UNSUPPORTED_VERSION (35), as Kafka does.
    let mut s = TcpStream::connect(address).await.unwrap();
    s.write_all(&api_versions_frame(99, 4)).await.unwrap();
    assert_eq!(read_api_versions(&mut s).await, (4, 35));

    // The node is up: a new client is served, and pipelined requests come back in order.
    let mut s = TcpStream::connect(address).await.unwrap();
    let mut two = api_versions_frame(0, 10);
    two.extend(api_versions_frame(0, 11));
    s.write_all(&two).await.unwrap();
    assert_eq!(read_api_versions(&mut s).await, (10, 0));
    assert_eq!(read_api_versions(&mut s).await, (11, 0));
    // And the gRPC face still works, with nothing stored by the bad requests.
    let ours = read_topic(&cluster, "input", Isolation::ReadUncommitted).await;
    assert!(ours.values().all(Vec::is_empty), "{ours:?}");
    cluster.shutdown().await.unwrap();
}

/// ListOffsets by time over the Kafka protocol: a timestamp finds the first record at or after
/// it, and max-timestamp (-3, KIP-734, version 7) the first record with the largest timestamp,
/// which need not be the last one written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_finds_records_by_time_and_the_largest_timestamp() {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{
        ApiKey, BrokerId, ListOffsetsRequest, RequestKind, ResponseKind, TopicName,
    };
    let cluster = cluster().await;
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    let address = cluster.kafka_address(leader).unwrap();
    let base = 1_700_000_000_000i64;
    let batch = plain_batch(
        [0i64, 50, 10]
            .iter()
            .enumerate()
            .map(|(i, delta)| (base + delta, format!("r{i}").into_bytes()))
            .collect(),
        kafka_protocol::records::Compression::None,
    );
    let ResponseKind::Produce(produced) = kafka_call(
        address,
        ApiKey::Produce,
        7,
        RequestKind::Produce(produce_request("input", 0, batch)),
    )
    .await
    else {
        panic!("not a Produce response")
    };
    let answer = &produced.responses[0].partition_responses[0];
    assert_eq!(answer.error_code, 0, "{:?}", answer.error_message);

    let list = |timestamp| async move {
        let mut p = ListOffsetsPartition::default();
        p.partition_index = 0;
        p.timestamp = timestamp;
        let mut t = ListOffsetsTopic::default();
        t.name = TopicName(str_bytes("input"));
        t.partitions = vec![p];
        let mut r = ListOffsetsRequest::default();
        r.replica_id = BrokerId(-1);
        r.topics = vec![t];
        let ResponseKind::ListOffsets(r) =
            kafka_call(address, ApiKey::ListOffsets, 7, RequestKind::ListOffsets(r)).await
        else {
            panic!("not a ListOffsets response")
        };
        let p = &r.topics[0].partitions[0];
        (p.error_code, p.offset, p.timestamp)
    };
    assert_eq!(list(-3).await, (0, 1, base + 50), "max timestamp");
    assert_eq!(
        list(base + 20).await,
        (0, 1, base + 50),
        "first at or after"
    );
    assert_eq!(list(base + 51).await, (0, -1, -1), "none");
    assert_eq!(list(-1).await.1, 3, "latest");
    assert_eq!(list(-4).await.0, 42, "INVALID_REQUEST");
    cluster.shutdown().await.unwrap();
}

// ---- consume-transform-produce with a consumer group --------------------------------------

/// Longest a processor may go without reporting a commit, or the output topic without growing,
/// before the test calls the run stuck. Generous next to what a healthy run needs (a rebalance
/// waits at most for a dead member's 6 s session), so a slow machine passes and a stuck group
/// still fails well before [`SCRIPT_TIMEOUT`].
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `processor.py`, its "committed N" lines readable.
struct Processor {
    name: &'static str,
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// The last count it reported.
    committed: u64,
}

async fn start_processor(
    python: &Path,
    bootstrap: &str,
    txn_id: &'static str,
    protocol: GroupProtocol,
    stop: &Path,
) -> Processor {
    start_static_processor(python, bootstrap, txn_id, protocol, None, stop).await
}

/// [`start_processor`], a static member with `instance` as its `group.instance.id` if given.
async fn start_static_processor(
    python: &Path,
    bootstrap: &str,
    txn_id: &'static str,
    protocol: GroupProtocol,
    instance: Option<&str>,
    stop: &Path,
) -> Processor {
    let protocol = match protocol {
        GroupProtocol::Classic => "classic",
        GroupProtocol::Consumer => "consumer",
    };
    let env: Vec<(&str, &str)> = instance
        .map(|i| ("GROUP_INSTANCE_ID", i))
        .into_iter()
        .collect();
    start_script_with(
        python,
        "processor.py",
        &[bootstrap, "ctp", txn_id, protocol],
        &env,
        txn_id,
        stop,
    )
    .await
}

/// Which consumer group protocol the processors use.
#[derive(Clone, Copy, Debug)]
enum GroupProtocol {
    /// JoinGroup/SyncGroup; the leader member assigns.
    Classic,
    /// KIP-848's ConsumerGroupHeartbeat; the coordinator assigns.
    Consumer,
}

/// Starts `script` with `args` and the stop file, its "<word> N" progress lines readable.
async fn start_script(
    python: &Path,
    script: &str,
    args: &[&str],
    name: &'static str,
    stop: &Path,
) -> Processor {
    start_script_with(python, script, args, &[], name, stop).await
}

/// [`start_script`] with `env` added to its environment.
async fn start_script_with(
    python: &Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
    name: &'static str,
    stop: &Path,
) -> Processor {
    let dir = repo_root().join("integration-tests/kafka");
    let mut child = tokio::process::Command::new(python)
        .arg(dir.join(script))
        .args(args)
        .envs(env.iter().copied())
        .arg(stop)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let stdout = child.stdout.take().unwrap();
    Processor {
        name,
        child,
        lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
        committed: 0,
    }
}

impl Processor {
    /// Waits until the processor reports at least `records` committed. Progress-based: fails
    /// when it reports no new commit for [`STALL_TIMEOUT`] (or exits), not after one long wait.
    async fn committed_at_least(&mut self, records: u64) {
        while self.committed < records {
            let line = tokio::time::timeout(STALL_TIMEOUT, self.lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{} reported no commit for {STALL_TIMEOUT:?} (at {} of {records} records)",
                        self.name, self.committed
                    )
                })
                .unwrap();
            let Some(line) = line else {
                panic!(
                    "{} exited after committing {} of {records} records",
                    self.name, self.committed
                );
            };
            if let Some(n) = line
                .split_once(' ')
                .filter(|(word, _)| matches!(*word, "committed" | "consumed"))
                .and_then(|(_, n)| n.parse::<u64>().ok())
            {
                self.committed = n;
            }
        }
    }

    /// Waits for a clean exit after the stop file appeared; returns what it printed last.
    async fn finish(mut self) -> Value {
        let mut last = String::new();
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                last = line;
            }
            self.child.wait().await.unwrap()
        };
        let status = tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the processor stops");
        assert!(status.success(), "processor failed: {status}");
        serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last}"))
    }
}

/// Writes the input topic while the processors run: `PER_ROUND` records to each of its 3
/// partitions every `ROUND_EVERY`, until stopped; returns what it wrote, per partition.
///
/// Why the input is not written all up front: with the whole input already there, whichever
/// processor gets the group first (alone, all 3 partitions) can process every record of a
/// partition before the first rebalance hands that partition to the other processor, which
/// then holds only exhausted partitions and never commits anything. That happened (debug logs:
/// processor-a assigned `input [2]` at committed offset 400, the end, and idle for good).
/// Input that keeps arriving gives every member of the group work for as long as it holds a
/// partition, whatever the order in which the processors joined.
struct Feeder {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<[Vec<String>; 3]>,
}

impl Feeder {
    const PER_ROUND: usize = 5;
    const ROUND_EVERY: Duration = Duration::from_millis(100);

    async fn start(cluster: &minibroker::EmbeddedCluster) -> Self {
        let mut input = IdempotentProducer::connect(config(cluster)).await.unwrap();
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut written: [Vec<String>; 3] = Default::default();
            let mut rounds = tokio::time::interval(Self::ROUND_EVERY);
            while !*stopped.borrow_and_update() {
                for (p, values) in written.iter_mut().enumerate() {
                    let batch: Vec<String> = (values.len()..values.len() + Self::PER_ROUND)
                        .map(|i| format!("in-{p}-{i}"))
                        .collect();
                    input
                        .send_batch(
                            "input",
                            producer_client::Target::Partition(p as i32),
                            batch.iter().map(|v| v.clone().into_bytes()).collect(),
                        )
                        .await
                        .unwrap();
                    values.extend(batch);
                }
                tokio::select! {
                    _ = rounds.tick() => {}
                    _ = stopped.changed() => {}
                }
            }
            written
        });
        Self { stop, task }
    }

    /// Stops writing; returns every value written, per partition.
    async fn stop(self) -> [Vec<String>; 3] {
        self.stop.send(true).unwrap();
        self.task.await.unwrap()
    }
}

/// Exactly once: every expected value is in `output` (read_committed) once, and nothing else.
async fn assert_output_exactly_once(
    cluster: &minibroker::EmbeddedCluster,
    expected: &std::collections::BTreeSet<String>,
    context: &str,
) {
    let out = read_topic(cluster, "output", Isolation::ReadCommitted).await;
    let values: Vec<&String> = out.values().flatten().collect();
    assert_eq!(
        values.len(),
        expected.len(),
        "duplicates or losses ({context})"
    );
    let got: std::collections::BTreeSet<String> = values.into_iter().cloned().collect();
    assert_eq!(&got, expected, "{context}");
}

/// What [`consume_transform_produce_through`] does to the running processors.
enum CtpFault {
    /// Kill processor A (no LeaveGroup, maybe an open transaction) and start its replacement.
    KillProcessor,
    /// Kill the group's coordinator (in-process: every task of the node stops at once) and
    /// restart it: transactions may be open; the group's stored membership is restored.
    RestartGroupCoordinator,
    /// Kill the leader of `output` partition 0 and restart it: produce requests and markers
    /// to it fail meanwhile, transactions are open.
    RestartOutputLeader,
    /// Pause processor A (SIGSTOP, most likely inside a transaction) past its session, so that
    /// its partitions go to B, then let it go on (SIGCONT): a zombie that still believes it
    /// owns them. Only the group's fence (generation, or KIP-848 member epoch, on its
    /// TxnOffsetCommit) stops its transaction from committing output that B also produces.
    PauseProcessor,
    /// Both processors static members (`group.instance.id`): stop A cleanly (its close is a
    /// temporary leave) and start its next process with the same instance id, a rolling
    /// restart: A's partitions wait for it, nothing is revoked from B.
    RollingRestartStatic,
}

/// Sends `signal` (e.g. "STOP", "CONT") to a child process.
fn signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Two librdkafka consume-transform-produce processors in group `ctp` while input keeps
/// arriving, through `fault`: in the end every input record's output is there exactly once
/// (read_committed) and the group's committed offsets are the end of the input.
async fn consume_transform_produce_through(fault: CtpFault, protocol: GroupProtocol) {
    let Some(python) = python().await else { return };
    let mut cluster = match protocol {
        GroupProtocol::Classic => cluster().await,
        // A killed member's partitions are free after its 6 s session, as with the classic
        // processors' session.timeout.ms.
        // A static member away keeps its partitions for its session: long enough here for
        // its next process to start.
        GroupProtocol::Consumer => {
            let session = match fault {
                CtpFault::RollingRestartStatic => Duration::from_secs(30),
                _ => Duration::from_secs(6),
            };
            cluster_with(minibroker::EmbeddedOptions {
                group_consumer_heartbeat_interval: Duration::from_millis(500),
                group_consumer_session_timeout: session,
                ..Default::default()
            })
            .await
        }
    };
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let feeder = Feeder::start(&cluster).await;
    let dir = tempfile_dir();
    let stop = dir.join("stop");
    let stop_a = dir.join("stop-a");
    let rolling = matches!(fault, CtpFault::RollingRestartStatic);
    let (instance_a, instance_b) = if rolling {
        (Some("a"), Some("b"))
    } else {
        (None, None)
    };
    let a_stop = if rolling { &stop_a } else { &stop };
    let mut a = start_static_processor(
        &python,
        &bootstrap,
        "processor-a",
        protocol,
        instance_a,
        a_stop,
    )
    .await;
    let mut b = start_static_processor(
        &python,
        &bootstrap,
        "processor-b",
        protocol,
        instance_b,
        &stop,
    )
    .await;
    a.committed_at_least(100).await;
    // From when (seconds since the epoch) which processors (indices into `processors`) must
    // not be revoked anything: B from A's stop on in a rolling restart of static members;
    // both from the coordinator's restart on (the group is restored, nobody rebalances).
    let mut calm_since: Option<(f64, Vec<usize>)> = None;
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let processors = match fault {
        CtpFault::KillProcessor => {
            // The input is still flowing, so the replacement has work once the group gives it
            // partitions.
            a.child.start_kill().unwrap();
            a.child.wait().await.unwrap();
            let mut a2 = start_processor(&python, &bootstrap, "processor-a", protocol, &stop).await;
            a2.committed_at_least(1).await;
            vec![b, a2]
        }
        CtpFault::RestartGroupCoordinator => {
            b.committed_at_least(1).await;
            let node = cluster.coordinator_for("ctp");
            let txn_nodes = [
                cluster.coordinator_for("processor-a"),
                cluster.coordinator_for("processor-b"),
            ];
            eprintln!("restarting node {node}, the group's coordinator (the processors' transactions are on {txn_nodes:?})");
            calm_since = Some((now(), vec![0, 1]));
            cluster.kill(node).await.unwrap();
            cluster.restart(node).await.unwrap();
            // Both go on committing once they rejoined the restarted coordinator's group.
            let (after_a, after_b) = (a.committed + 1, b.committed + 1);
            a.committed_at_least(after_a).await;
            b.committed_at_least(after_b).await;
            vec![a, b]
        }
        CtpFault::PauseProcessor => {
            b.committed_at_least(1).await;
            signal(&a.child, "STOP");
            // Past A's 6 s session: B takes A's partitions and processes them.
            let b_before = b.committed;
            tokio::time::sleep(Duration::from_secs(9)).await;
            b.committed_at_least(b_before + 1).await;
            signal(&a.child, "CONT");
            // A finds itself fenced, aborts what it had open, rejoins and goes on.
            let (after_a, after_b) = (a.committed + 1, b.committed + 1);
            a.committed_at_least(after_a).await;
            b.committed_at_least(after_b).await;
            vec![a, b]
        }
        CtpFault::RollingRestartStatic => {
            // Both hold partitions and commit; from A's stop on, B must lose nothing.
            b.committed_at_least(1).await;
            // processors = [b, a2]: B loses nothing from A's stop on.
            calm_since = Some((now(), vec![0]));
            std::fs::write(&stop_a, b"stop").unwrap();
            let a_report = a.finish().await;
            eprintln!("processor-a stopped: {a_report}");
            let mut a2 = start_static_processor(
                &python,
                &bootstrap,
                "processor-a",
                protocol,
                instance_a,
                &stop,
            )
            .await;
            a2.committed_at_least(1).await;
            let after_b = b.committed + 1;
            b.committed_at_least(after_b).await;
            vec![b, a2]
        }
        CtpFault::RestartOutputLeader => {
            b.committed_at_least(1).await;
            let node = cluster.topology().leader_for("output", 0).unwrap().id;
            cluster.kill(node).await.unwrap();
            cluster.restart(node).await.unwrap();
            let (after_a, after_b) = (a.committed + 1, b.committed + 1);
            a.committed_at_least(after_a).await;
            b.committed_at_least(after_b).await;
            vec![a, b]
        }
    };
    let written = feeder.stop().await;
    let expected: std::collections::BTreeSet<String> = written
        .iter()
        .flatten()
        .map(|v| format!("out-{v}"))
        .collect();

    let total = expected.len() as u64;
    testkit::poll::wait_for_progress(STALL_TIMEOUT, "every input record processed", total, || {
        let cluster = &cluster;
        async move {
            let out =
                integration_tests::read_topic_now(cluster, "output", Isolation::ReadCommitted)
                    .await;
            out.values().map(Vec::len).sum::<usize>() as u64
        }
    })
    .await;
    // Revocations from here on are the processors' own stops (a classic member's LeaveGroup
    // makes the other rebalance).
    let stopping_at = now();
    std::fs::write(&stop, b"stop").unwrap();
    let mut reports = Vec::new();
    for p in processors {
        reports.push(p.finish().await);
    }
    if let Some((since, calm)) = calm_since {
        for i in calm {
            let late: Vec<f64> = reports[i]["revoked_at"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_f64)
                .filter(|t| (since..stopping_at).contains(t))
                .collect();
            assert!(
                late.is_empty(),
                "processor {i} was revoked partitions at {late:?}, after {since} (the fault) \
                 and before {stopping_at} (the stop): {reports:?}"
            );
        }
    }

    assert_output_exactly_once(&cluster, &expected, &format!("{reports:?}")).await;
    // The group's committed offsets are the end of the input.
    let mut consumer =
        producer_client::Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    let committed = consumer.committed_offsets("ctp", &[]).await.unwrap();
    for (p, values) in written.iter().enumerate() {
        assert_eq!(
            committed.get(&tp("input", p as i32)),
            Some(&(values.len() as i64)),
            "{committed:?}"
        );
    }
    cluster.shutdown().await.unwrap();
}

/// The same with KIP-848 consumers (`group.protocol=consumer`): the killed processor's
/// partitions go to the other once its session expires, its replacement joins, and the member
/// epochs keep every commit to the member that owns the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_with_a_kip848_group_survives_a_killed_processor()
{
    consume_transform_produce_through(CtpFault::KillProcessor, GroupProtocol::Consumer).await;
}

/// A rolling restart of static KIP-848 processors (`group.instance.id`): A stops cleanly (a
/// temporary leave, member epoch -2), its next process takes A's partitions under a new member
/// id, B is never revoked anything, and the output is exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_with_static_kip848_members_restarts_without_rebalance(
) {
    consume_transform_produce_through(CtpFault::RollingRestartStatic, GroupProtocol::Consumer)
        .await;
}

/// A paused KIP-848 processor (a zombie: its partitions moved to the other while it slept)
/// wakes up with a transaction open: its member epoch is no longer the group's, so its offsets
/// are refused, it aborts, and nothing is processed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_with_a_kip848_group_fences_a_paused_processor() {
    consume_transform_produce_through(CtpFault::PauseProcessor, GroupProtocol::Consumer).await;
}

/// The same zombie with the classic protocol: its generation fences it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_with_a_group_fences_a_paused_processor() {
    consume_transform_produce_through(CtpFault::PauseProcessor, GroupProtocol::Classic).await;
}

/// KIP-848 consumers through a restart of the group's coordinator: the restarted coordinator
/// restores the group's stored membership, and the processors go on exactly once, neither
/// revoked anything from the restart on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_with_a_kip848_group_survives_a_coordinator_restart(
) {
    consume_transform_produce_through(CtpFault::RestartGroupCoordinator, GroupProtocol::Consumer)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_with_a_group_survives_a_killed_processor() {
    consume_transform_produce_through(CtpFault::KillProcessor, GroupProtocol::Classic).await;
}

/// The same through a restart of the group's coordinator (in the embedded topology also
/// processor-b's transaction coordinator, so a transaction is open there too): the restarted
/// coordinator restores the group's stored generation, librdkafka's consumers go on in it
/// without a rebalance (neither is revoked anything from the restart on), and nothing is lost
/// or duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_survives_a_restart_of_the_groups_coordinator() {
    consume_transform_produce_through(CtpFault::RestartGroupCoordinator, GroupProtocol::Classic)
        .await;
}

/// The same through a restart of a partition leader the processors write to.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consume_transform_produce_survives_a_restart_of_an_output_leader() {
    consume_transform_produce_through(CtpFault::RestartOutputLeader, GroupProtocol::Classic).await;
}

/// A fresh directory under the system temp dir (removed by the OS; tests never share one).
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "minibroker-kafka-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Benchmark (ignored by default; run with
/// `cargo test --release -p integration-tests --test kafka_clients -- --ignored --nocapture bench`):
/// confluent-kafka's producer (1 KiB records, idempotent, linger.ms=5) against the Kafka face,
/// next to our own gRPC idempotent producer (1 KiB records, 100-record batches, one request in
/// flight, round-robin over the partitions) in the same run, against the same cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark"]
async fn bench_confluent_kafka_producer_vs_grpc_produce() {
    let Some(python) = python().await else { return };
    let seconds: u64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");

    let mut grpc = IdempotentProducer::connect(config(&cluster)).await.unwrap();
    let value = vec![b'x'; 1024];
    let start = std::time::Instant::now();
    let mut sent = 0usize;
    while start.elapsed() < Duration::from_secs(seconds) {
        let batch = vec![value.clone(); 100];
        let target = producer_client::Target::Partition((sent / 100 % 3) as i32);
        grpc.send_batch("input", target, batch).await.unwrap();
        sent += 100;
    }
    let grpc_rate = sent as f64 / start.elapsed().as_secs_f64();

    let report = run_script(
        &python,
        "bench_producer.py",
        &bootstrap,
        &["output", &seconds.to_string()],
    )
    .await;
    let kafka_rate = report["records_per_sec"].as_f64().unwrap();
    println!(
        "BENCH gRPC produce: {grpc_rate:.0} records/s ({:.1} MiB/s); confluent-kafka: \
         {kafka_rate:.0} records/s ({:.1} MiB/s); ratio kafka/gRPC = {:.2}",
        grpc_rate / 1024.0,
        kafka_rate / 1024.0,
        kafka_rate / grpc_rate
    );
    cluster.shutdown().await.unwrap();
}

// ---- admin APIs over the raw Kafka protocol ---------------------------------------------------

/// One request/response over a fresh Kafka connection, encoded and decoded with `kafka-protocol`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_and_producers_are_described_over_the_kafka_protocol() {
    use kafka_protocol::messages::*;
    let cluster = cluster().await;
    let mut producer = integration_tests::producer(&cluster, "admin-txn").await;
    producer.begin_transaction().unwrap();
    producer
        .send_and_wait("output", producer_client::Target::Partition(0), "open")
        .await
        .unwrap();
    let pid = producer.producer_id();
    let any = cluster.kafka_address(cluster.leader_ids()[0]).unwrap();

    // FindCoordinator (TRANSACTION) from a leader names the owning coordinator's Kafka address.
    let mut find = FindCoordinatorRequest::default();
    find.key = kafka_wire::str_bytes("admin-txn");
    find.key_type = 1;
    let ResponseKind::FindCoordinator(found) = kafka_call(
        any,
        ApiKey::FindCoordinator,
        3,
        RequestKind::FindCoordinator(find),
    )
    .await
    else {
        panic!("FindCoordinator response")
    };
    assert_eq!(found.error_code, 0);
    assert_eq!(found.node_id.0, cluster.coordinator_for("admin-txn"));
    let coordinator = cluster.kafka_address(found.node_id.0).unwrap();
    assert_eq!(found.port, i32::from(coordinator.port()));

    let mut describe = DescribeTransactionsRequest::default();
    describe.transactional_ids = vec![TransactionalId(kafka_wire::str_bytes("admin-txn"))];
    let ResponseKind::DescribeTransactions(described) = kafka_call(
        coordinator,
        ApiKey::DescribeTransactions,
        0,
        RequestKind::DescribeTransactions(describe),
    )
    .await
    else {
        panic!("DescribeTransactions response")
    };
    let state = &described.transaction_states[0];
    assert_eq!(state.error_code, 0);
    assert_eq!(state.transaction_state.as_str(), "Ongoing");
    assert_eq!(state.producer_id.0, pid);
    assert_eq!(state.topics[0].topic.0.as_str(), "output");
    assert_eq!(state.topics[0].partitions, vec![0]);

    let ResponseKind::ListTransactions(listed) = kafka_call(
        coordinator,
        ApiKey::ListTransactions,
        1,
        RequestKind::ListTransactions(ListTransactionsRequest::default()),
    )
    .await
    else {
        panic!("ListTransactions response")
    };
    assert!(listed
        .transaction_states
        .iter()
        .any(|t| t.transactional_id.0.as_str() == "admin-txn"
            && t.transaction_state.as_str() == "Ongoing"));

    // DescribeProducers at the partition's leader: the open transaction starts at offset 0.
    let leader = cluster.topology().leader_for("output", 0).unwrap().id;
    let mut producers = DescribeProducersRequest::default();
    let mut topic = describe_producers_request::TopicRequest::default();
    topic.name = TopicName(kafka_wire::str_bytes("output"));
    topic.partition_indexes = vec![0];
    producers.topics = vec![topic];
    let ResponseKind::DescribeProducers(described) = kafka_call(
        cluster.kafka_address(leader).unwrap(),
        ApiKey::DescribeProducers,
        0,
        RequestKind::DescribeProducers(producers),
    )
    .await
    else {
        panic!("DescribeProducers response")
    };
    let partition = &described.topics[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    let active = &partition.active_producers[0];
    assert_eq!(active.producer_id.0, pid);
    assert_eq!(active.current_txn_start_offset, 0);

    // A leader is not a coordinator: NOT_COORDINATOR (16), as a Kafka broker would say.
    let mut add = AddOffsetsToTxnRequest::default();
    add.transactional_id = TransactionalId(kafka_wire::str_bytes("admin-txn"));
    add.group_id = GroupId(kafka_wire::str_bytes("g"));
    let ResponseKind::AddOffsetsToTxn(refused) = kafka_call(
        cluster.kafka_address(leader).unwrap(),
        ApiKey::AddOffsetsToTxn,
        3,
        RequestKind::AddOffsetsToTxn(add),
    )
    .await
    else {
        panic!("AddOffsetsToTxn response")
    };
    assert_eq!(refused.error_code, 16);
    producer.abort_transaction().await.unwrap();
    cluster.shutdown().await.unwrap();
}

/// A [`OffsetTxn`] for `txn` committing offsets of `group`, at their coordinators.
async fn offset_txn(
    cluster: &minibroker::EmbeddedCluster,
    txn: &'static str,
    group: &'static str,
) -> OffsetTxn {
    let txn_coordinator = cluster.kafka_address(cluster.coordinator_for(txn)).unwrap();
    let group_coordinator = cluster
        .kafka_address(cluster.coordinator_for(group))
        .unwrap();
    OffsetTxn::init(txn_coordinator, group_coordinator, txn, group).await
}

fn str_bytes(v: &str) -> kafka_protocol::protocol::StrBytes {
    kafka_wire::str_bytes(v)
}

/// A fenced instance on a request version from before KIP-588 is told INVALID_PRODUCER_EPOCH
/// (the code it knows), from v2 of EndTxn and AddOffsetsToTxn PRODUCER_FENCED, as Kafka answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_producer_gets_the_fenced_code_its_request_version_knows() {
    use kafka_protocol::messages::*;
    let cluster = cluster().await;
    let txn = "fenced-versions";
    let coordinator = cluster.kafka_address(cluster.coordinator_for(txn)).unwrap();
    let zombie = OffsetTxn::init(coordinator, coordinator, txn, "fenced-versions-group").await;
    let live = OffsetTxn::init(coordinator, coordinator, txn, "fenced-versions-group").await;
    assert_eq!(live.producer.1, zombie.producer.1 + 1);
    let end = |version: i16| async move {
        let mut end = EndTxnRequest::default();
        end.transactional_id = TransactionalId(str_bytes(txn));
        end.producer_id = ProducerId(zombie.producer.0);
        end.producer_epoch = zombie.producer.1;
        end.committed = true;
        let ResponseKind::EndTxn(r) = kafka_call(
            coordinator,
            ApiKey::EndTxn,
            version,
            RequestKind::EndTxn(end),
        )
        .await
        else {
            panic!("EndTxn response")
        };
        r.error_code
    };
    let add_offsets = |version: i16| async move {
        let mut add = AddOffsetsToTxnRequest::default();
        add.transactional_id = TransactionalId(str_bytes(txn));
        add.producer_id = ProducerId(zombie.producer.0);
        add.producer_epoch = zombie.producer.1;
        add.group_id = GroupId(str_bytes("fenced-versions-group"));
        let ResponseKind::AddOffsetsToTxn(r) = kafka_call(
            coordinator,
            ApiKey::AddOffsetsToTxn,
            version,
            RequestKind::AddOffsetsToTxn(add),
        )
        .await
        else {
            panic!("AddOffsetsToTxn response")
        };
        r.error_code
    };
    for version in [0, 1] {
        assert_eq!(end(version).await, 47, "EndTxn v{version}");
        assert_eq!(add_offsets(version).await, 47, "AddOffsetsToTxn v{version}");
    }
    for version in [2, 3] {
        assert_eq!(end(version).await, 90, "EndTxn v{version}");
        assert_eq!(add_offsets(version).await, 90, "AddOffsetsToTxn v{version}");
    }
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_txn_offset_commit_from_an_older_generation_is_fenced_by_the_group() {
    use kafka_protocol::messages::*;
    let cluster = cluster().await;
    let (txn, group) = ("kip447-txn", "kip447-group");
    let t = offset_txn(&cluster, txn, group).await;
    let group_coordinator = t.group_coordinator;
    t.add_offsets().await;

    // A member joins (v5: MEMBER_ID_REQUIRED first) and syncs: generation 1, Stable.
    let join = |member: &str| join_group(group, member);
    let ResponseKind::JoinGroup(first) =
        kafka_call(group_coordinator, ApiKey::JoinGroup, 5, join("")).await
    else {
        panic!("JoinGroup response")
    };
    assert_eq!(first.error_code, 79, "MEMBER_ID_REQUIRED");
    let member = first.member_id.to_string();
    let ResponseKind::JoinGroup(joined) =
        kafka_call(group_coordinator, ApiKey::JoinGroup, 5, join(&member)).await
    else {
        panic!("JoinGroup response")
    };
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    assert_eq!(joined.leader.as_str(), member);
    let ResponseKind::SyncGroup(synced) = kafka_call(
        group_coordinator,
        ApiKey::SyncGroup,
        3,
        testkit::kafka::sync_group_alone(group, &member, 1),
    )
    .await
    else {
        panic!("SyncGroup response")
    };
    assert_eq!(synced.error_code, 0, "the leader assigned: Stable");

    // The current generation commits (at the group's coordinator, forwarded if need be).
    assert_eq!(t.commit_offset(&member, 1, 5).await, 0);
    // The member rejoins: generation 2. A commit still carrying generation 1 is a zombie's.
    let ResponseKind::JoinGroup(rejoined) =
        kafka_call(group_coordinator, ApiKey::JoinGroup, 5, join(&member)).await
    else {
        panic!("JoinGroup response")
    };
    assert_eq!(rejoined.generation_id, 2);
    assert_eq!(
        t.commit_offset(&member, 1, 9).await,
        22,
        "ILLEGAL_GENERATION"
    );
    // A commit that names no member (TxnOffsetCommit before v3, or a client given only the
    // group id) is left to the producer's epoch, as Kafka's coordinator leaves it.
    assert_eq!(t.commit_offset("", -1, 6).await, 0);
    assert_eq!(t.commit_offset(&member, 2, 7).await, 0);

    // Commit: the group's offset is the generation-2 one, never the zombie's.
    t.end(true).await;
    let mut consumer =
        producer_client::Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let committed = consumer.committed_offsets(group, &[]).await.unwrap();
        if committed.get(&tp("input", 0)) == Some(&7) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the group marker never arrived: {committed:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.shutdown().await.unwrap();
}

/// KIP-447 across a restart of the group's coordinator: what is pending is durable, so the
/// restarted coordinator still answers UNSTABLE_OFFSET_COMMIT until the transaction's marker
/// arrives. Forgetting it there would hand a consumer taking the partition over the offset
/// from before a transaction that may still commit: the input processed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pending_transactional_offsets_survive_a_restart_of_the_groups_coordinator() {
    let mut cluster = cluster().await;
    let (txn, group) = ("kip447-restart-txn", "kip447-restart-group");
    let t = offset_txn(&cluster, txn, group).await;
    t.add_offsets().await;
    assert_eq!(t.commit_offset("", -1, 5).await, 0);
    assert_eq!(
        offset_fetch_v7(t.group_coordinator, group, true).await,
        (0, (88, -1))
    );

    let node = cluster.coordinator_for(group);
    cluster.kill(node).await.unwrap();
    cluster.restart(node).await.unwrap();
    // Once it answers (loaded), still UNSTABLE_OFFSET_COMMIT: the pending commit was kept.
    let partition = testkit::poll::eventually_within(
        Duration::from_secs(20),
        "the restarted coordinator answers OffsetFetch",
        || async {
            let (code, partition) = offset_fetch_v7(t.group_coordinator, group, true).await;
            (code == 0 && partition.0 != 14 && partition.0 != 15).then_some(partition)
        },
    )
    .await;
    assert_eq!(
        partition,
        (88, -1),
        "UNSTABLE_OFFSET_COMMIT after the restart"
    );

    // The transaction commits; its marker makes the offset stable, and nothing stays pending.
    testkit::poll::eventually_within(Duration::from_secs(20), "EndTxn", || async {
        t.try_end(true).await.then_some(())
    })
    .await;
    let stable =
        testkit::poll::eventually_within(Duration::from_secs(20), "stable offsets", || async {
            let (code, (partition_code, offset)) =
                offset_fetch_v7(t.group_coordinator, group, true).await;
            (code == 0 && partition_code == 0).then_some(offset)
        })
        .await;
    assert_eq!(stable, 5);
    // And after one more restart, nothing is pending any more.
    cluster.kill(node).await.unwrap();
    cluster.restart(node).await.unwrap();
    let after = testkit::poll::eventually_within(Duration::from_secs(20), "loaded", || async {
        let (code, partition) = offset_fetch_v7(t.group_coordinator, group, true).await;
        (code == 0 && partition.0 != 14 && partition.0 != 15).then_some(partition)
    })
    .await;
    assert_eq!(after, (0, 5));
    cluster.shutdown().await.unwrap();
}

/// KIP-447: between a transaction's TxnOffsetCommit and its marker reaching the group, an
/// OffsetFetch that requires stable offsets (a read_committed consumer taking a partition over
/// in a rebalance) gets UNSTABLE_OFFSET_COMMIT and retries; reading the older offset there
/// would make it process the transaction's input a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stable_offset_fetch_waits_for_the_pending_transactional_offsets() {
    let cluster = cluster().await;
    let (txn, group) = ("kip447-stable-txn", "kip447-stable-group");
    let t = offset_txn(&cluster, txn, group).await;
    let group_coordinator = t.group_coordinator;
    // One transaction that commits offset `offset` for input-0 (no member id and no
    // generation: a group without members accepts it).
    let transaction = |offset: i64| {
        let t = &t;
        async move {
            t.add_offsets().await;
            assert_eq!(t.commit_offset("", -1, offset).await, 0);
        }
    };
    let end = |commit: bool| {
        let t = &t;
        async move { t.end(commit).await }
    };
    let fetch = |require_stable: bool| async move {
        let (code, partition) = offset_fetch_v7(group_coordinator, group, require_stable).await;
        assert_eq!(code, 0);
        partition
    };
    let stable_offset = || async move {
        testkit::poll::eventually_within(Duration::from_secs(20), "stable offsets", || async {
            let (code, offset) = fetch(true).await;
            (code == 0).then_some(offset)
        })
        .await
    };

    transaction(5).await;
    assert_eq!(fetch(true).await, (88, -1), "UNSTABLE_OFFSET_COMMIT");
    assert_eq!(
        fetch(false).await,
        (0, -1),
        "without require_stable: the last committed"
    );
    end(true).await;
    assert_eq!(
        stable_offset().await,
        5,
        "the marker made it stable and visible"
    );

    // An aborted transaction's offset is pending too, and then dropped.
    transaction(9).await;
    assert_eq!(fetch(true).await, (88, -1));
    end(false).await;
    assert_eq!(stable_offset().await, 5);
    cluster.shutdown().await.unwrap();
}

/// group.initial.rebalance.delay.ms (3 s by default, as Kafka's): two consumers joining a new
/// group a second apart both land in its first generation, and the first waits out the delay
/// rather than getting a generation of its own that the second would end at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_joining_a_new_group_together_share_its_first_rebalance() {
    use kafka_protocol::messages::*;
    let cluster = cluster().await;
    let group = "initial-delay-group";
    let coordinator = cluster
        .kafka_address(cluster.coordinator_for(group))
        .unwrap();
    let join = || join_group(group, "");
    let started = std::time::Instant::now();
    // v3: a new member gets its id in the answer (no MEMBER_ID_REQUIRED round trip).
    let first = tokio::spawn(kafka_call(coordinator, ApiKey::JoinGroup, 3, join()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = kafka_call(coordinator, ApiKey::JoinGroup, 3, join()).await;
    let first = first.await.unwrap();
    let waited = started.elapsed();
    let (ResponseKind::JoinGroup(first), ResponseKind::JoinGroup(second)) = (first, second) else {
        panic!("JoinGroup responses expected");
    };
    assert_eq!((first.error_code, second.error_code), (0, 0));
    assert_eq!(
        (first.generation_id, second.generation_id),
        (1, 1),
        "one rebalance for both"
    );
    let leader = if first.member_id == first.leader {
        &first
    } else {
        &second
    };
    assert_eq!(leader.members.len(), 2, "the leader sees both members");
    assert!(
        waited >= Duration::from_secs(3),
        "the round completed after {waited:?}, within the initial delay"
    );
    cluster.shutdown().await.unwrap();
}

/// A consumer that was the last member of its group, removed before the group's coordinator
/// restarted (here by its LeaveGroup; a session that ran out is the same), and is still alive
/// (a zombie: paused, cut off), commits with the member id and generation it had. The group
/// was Empty, so nothing of it was stored: the restarted coordinator's group starts over at
/// generation 1 and hands a new consumer the same generation; its member id must differ, or
/// the zombie's commit would pass the group's check and overwrite the live member's offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_member_from_before_a_coordinator_restart_is_fenced() {
    use kafka_protocol::messages::*;
    let mut cluster = cluster().await;
    let group = "restart-zombie-group";
    let node = cluster.coordinator_for(group);
    let coordinator = cluster.kafka_address(node).unwrap();
    let s = str_bytes;
    // v3: a new member gets its id in the answer.
    let join = || async move {
        testkit::poll::eventually_within(Duration::from_secs(20), "JoinGroup", || async {
            let ResponseKind::JoinGroup(r) =
                kafka_call(coordinator, ApiKey::JoinGroup, 3, join_group(group, "")).await
            else {
                panic!("JoinGroup response")
            };
            // Until the restarted coordinator has loaded: COORDINATOR_LOAD_IN_PROGRESS.
            (r.error_code == 0).then(|| (r.member_id.to_string(), r.generation_id))
        })
        .await
    };
    // The leader's SyncGroup: the group is Stable, so plain commits are taken (while it waits
    // for the assignment they are REBALANCE_IN_PROGRESS, as in Kafka).
    let sync = |member: String, generation: i32| async move {
        let mut r = SyncGroupRequest::default();
        r.group_id = GroupId(s(group));
        r.member_id = s(&member);
        r.generation_id = generation;
        let mut a = sync_group_request::SyncGroupRequestAssignment::default();
        a.member_id = s(&member);
        r.assignments = vec![a];
        let ResponseKind::SyncGroup(r) =
            kafka_call(coordinator, ApiKey::SyncGroup, 3, RequestKind::SyncGroup(r)).await
        else {
            panic!("SyncGroup response")
        };
        assert_eq!(r.error_code, 0, "SyncGroup");
    };
    let commit = |member: String, generation: i32, offset: i64| async move {
        testkit::kafka::member_commit(coordinator, 8, group, &member, generation, offset).await
    };

    let (zombie, zombie_generation) = join().await;
    assert_eq!(zombie_generation, 1);
    assert_eq!(
        commit(zombie.clone(), 1, 5).await,
        27,
        "REBALANCE_IN_PROGRESS"
    );
    sync(zombie.clone(), 1).await;
    assert_eq!(commit(zombie.clone(), 1, 5).await, 0);
    let mut leave = LeaveGroupRequest::default();
    leave.group_id = GroupId(s(group));
    leave.member_id = s(&zombie);
    let ResponseKind::LeaveGroup(left) = kafka_call(
        coordinator,
        ApiKey::LeaveGroup,
        1,
        RequestKind::LeaveGroup(leave),
    )
    .await
    else {
        panic!("LeaveGroup response")
    };
    assert_eq!(left.error_code, 0);

    cluster.kill(node).await.unwrap();
    cluster.restart(node).await.unwrap();
    let (live, live_generation) = join().await;
    assert_eq!(live_generation, 1, "the group started over");
    assert_ne!(live, zombie, "a new life hands out its own member ids");
    sync(live.clone(), 1).await;
    assert_eq!(commit(live.clone(), 1, 7).await, 0);
    assert_eq!(
        commit(zombie.clone(), 1, 9).await,
        25,
        "UNKNOWN_MEMBER_ID for the zombie's commit"
    );
    assert_eq!(
        offset_fetch_v7(coordinator, group, false).await,
        (0, (0, 7)),
        "the live member's offset, never the zombie's"
    );
    cluster.shutdown().await.unwrap();
}

/// Kills `node` (every task of it stops at once) and starts it again.
async fn restart_node(cluster: &mut minibroker::EmbeddedCluster, node: cluster::NodeId) {
    cluster.kill(node).await.unwrap();
    cluster.restart(node).await.unwrap();
}

/// A classic group's membership is stored, as Kafka stores its GroupMetadata: after its
/// coordinator restarts (killed: every task of the node stops at once), the group goes on at
/// the generation it had, without a rebalance. A (dynamic, the leader) and B (static) are
/// Stable at generation 1; after the restart the group is described Stable with both members
/// and their assignments before anyone heartbeats, both heartbeat at generation 1, B's
/// SyncGroup gets its assignment again, and commits at generation 1 are taken, while an older
/// generation is ILLEGAL_GENERATION and an unknown member UNKNOWN_MEMBER_ID. B's next process
/// replaces it in place (KIP-345, no rebalance); that replacement is stored before its
/// JoinGroup is answered, so after a second restart the old B is still FENCED_INSTANCE_ID.
/// Once both members left, the group's record is gone: after a third restart A is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn classic_membership_survives_a_coordinator_restart() {
    use kafka_protocol::messages::*;
    const ILLEGAL_GENERATION: i16 = 22;
    const UNKNOWN_MEMBER_ID: i16 = 25;
    const FENCED_INSTANCE_ID: i16 = 82;
    let mut cluster = cluster().await;
    let group = "classic-restart";
    let node = cluster.coordinator_for(group);
    let s = str_bytes;
    let addr = |cluster: &minibroker::EmbeddedCluster| cluster.kafka_address(node).unwrap();
    // JoinGroup v5 as a new member: dynamic (v5 would first hand out an id: v3 here), or
    // static under `instance` (its id at once).
    let join = |coordinator, instance: Option<&'static str>| async move {
        let RequestKind::JoinGroup(mut j) = join_group(group, "") else {
            unreachable!()
        };
        j.group_instance_id = instance.map(s);
        let version = if instance.is_some() { 5 } else { 3 };
        let ResponseKind::JoinGroup(r) = kafka_call(
            coordinator,
            ApiKey::JoinGroup,
            version,
            RequestKind::JoinGroup(j),
        )
        .await
        else {
            panic!("JoinGroup response")
        };
        assert_eq!(r.error_code, 0, "JoinGroup");
        r
    };
    let sync = |coordinator,
                member: String,
                instance: Option<&'static str>,
                assignments: Vec<(String, &'static [u8])>| async move {
        let mut r = SyncGroupRequest::default();
        r.group_id = GroupId(s(group));
        r.member_id = s(&member);
        r.generation_id = 1;
        r.group_instance_id = instance.map(s);
        r.assignments = assignments
            .into_iter()
            .map(|(id, bytes)| {
                let mut a = sync_group_request::SyncGroupRequestAssignment::default();
                a.member_id = s(&id);
                a.assignment = bytes::Bytes::from_static(bytes);
                a
            })
            .collect();
        let ResponseKind::SyncGroup(r) =
            kafka_call(coordinator, ApiKey::SyncGroup, 3, RequestKind::SyncGroup(r)).await
        else {
            panic!("SyncGroup response")
        };
        (r.error_code, r.assignment.to_vec())
    };
    let heartbeat = |coordinator, member: String, instance: Option<&'static str>, generation| async move {
        let mut h = HeartbeatRequest::default();
        h.group_id = GroupId(s(group));
        h.member_id = s(&member);
        h.generation_id = generation;
        h.group_instance_id = instance.map(s);
        let ResponseKind::Heartbeat(r) =
            kafka_call(coordinator, ApiKey::Heartbeat, 3, RequestKind::Heartbeat(h)).await
        else {
            panic!("Heartbeat response")
        };
        r.error_code
    };
    let commit = |coordinator, member: String, generation: i32, offset: i64| async move {
        testkit::kafka::member_commit(coordinator, 8, group, &member, generation, offset).await
    };
    // Described once the restarted coordinator serves: (state, [(member id, assignment)]).
    let describe = |coordinator| async move {
        testkit::poll::eventually_within(Duration::from_secs(30), "the group described", || async {
            let mut r = DescribeGroupsRequest::default();
            r.groups = vec![GroupId(s(group))];
            let ResponseKind::DescribeGroups(d) = kafka_call(
                coordinator,
                ApiKey::DescribeGroups,
                5,
                RequestKind::DescribeGroups(r),
            )
            .await
            else {
                panic!("DescribeGroups response")
            };
            let g = d.groups.into_iter().next()?;
            (g.error_code == 0).then(|| {
                let mut members: Vec<(String, Vec<u8>)> = g
                    .members
                    .iter()
                    .map(|m| (m.member_id.to_string(), m.member_assignment.to_vec()))
                    .collect();
                members.sort();
                (g.group_state.to_string(), members)
            })
        })
        .await
    };

    let coordinator = addr(&cluster);
    let a_joins = tokio::spawn(join(coordinator, None));
    let b = join(coordinator, Some("b-instance")).await;
    let a = a_joins.await.unwrap();
    assert_eq!(
        (a.generation_id, b.generation_id),
        (1, 1),
        "one round for both"
    );
    let (a_id, b_id) = (a.member_id.to_string(), b.member_id.to_string());
    let leader = a.leader.to_string();
    let (leader_instance, follower, follower_instance) = if leader == a_id {
        (None, b_id.clone(), Some("b-instance"))
    } else {
        (Some("b-instance"), a_id.clone(), None)
    };
    let assignments = vec![(a_id.clone(), &b"pa"[..]), (b_id.clone(), &b"pb"[..])];
    let (code, _) = sync(coordinator, leader.clone(), leader_instance, assignments).await;
    assert_eq!(code, 0);
    let (code, _) = sync(coordinator, follower.clone(), follower_instance, vec![]).await;
    assert_eq!(code, 0);
    assert_eq!(commit(coordinator, a_id.clone(), 1, 5).await, 0);

    restart_node(&mut cluster, node).await;
    let coordinator = addr(&cluster);
    let mut expected = vec![
        (a_id.clone(), b"pa".to_vec()),
        (b_id.clone(), b"pb".to_vec()),
    ];
    expected.sort();
    assert_eq!(
        describe(coordinator).await,
        ("Stable".to_string(), expected),
        "restored before anyone heartbeats"
    );
    assert_eq!(heartbeat(coordinator, a_id.clone(), None, 1).await, 0);
    assert_eq!(
        heartbeat(coordinator, b_id.clone(), Some("b-instance"), 1).await,
        0
    );
    assert_eq!(
        sync(coordinator, b_id.clone(), Some("b-instance"), vec![]).await,
        (0, b"pb".to_vec())
    );
    assert_eq!(commit(coordinator, b_id.clone(), 1, 7).await, 0);
    assert_eq!(
        commit(coordinator, a_id.clone(), 0, 9).await,
        ILLEGAL_GENERATION
    );
    assert_eq!(
        commit(coordinator, "a-zombie".into(), 1, 9).await,
        UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        offset_fetch_v7(coordinator, group, false).await,
        (0, (0, 7)),
        "the members' commits, never the refused ones"
    );

    // B's next process takes its place: no round, the same generation.
    let b2 = join(coordinator, Some("b-instance")).await;
    assert_eq!(b2.generation_id, 1, "replaced in place, no rebalance");
    let b2_id = b2.member_id.to_string();
    assert_ne!(b2_id, b_id);
    restart_node(&mut cluster, node).await;
    let coordinator = addr(&cluster);
    let mut expected = vec![
        (a_id.clone(), b"pa".to_vec()),
        (b2_id.clone(), b"pb".to_vec()),
    ];
    expected.sort();
    assert_eq!(
        describe(coordinator).await,
        ("Stable".to_string(), expected)
    );
    assert_eq!(
        heartbeat(coordinator, b_id.clone(), Some("b-instance"), 1).await,
        FENCED_INSTANCE_ID,
        "the replaced instance stays fenced across the restart"
    );
    assert_eq!(
        heartbeat(coordinator, b2_id.clone(), Some("b-instance"), 1).await,
        0
    );
    assert_eq!(heartbeat(coordinator, a_id.clone(), None, 1).await, 0);

    // Both leave: the group is Empty and its record goes before the answer.
    let mut leave = LeaveGroupRequest::default();
    leave.group_id = GroupId(s(group));
    leave.members = [(a_id.clone(), None), (b2_id.clone(), Some("b-instance"))]
        .into_iter()
        .map(|(id, instance)| {
            let mut m = leave_group_request::MemberIdentity::default();
            m.member_id = s(&id);
            m.group_instance_id = instance.map(s);
            m
        })
        .collect();
    let ResponseKind::LeaveGroup(left) = kafka_call(
        coordinator,
        ApiKey::LeaveGroup,
        3,
        RequestKind::LeaveGroup(leave),
    )
    .await
    else {
        panic!("LeaveGroup response")
    };
    assert_eq!(left.error_code, 0);
    assert!(left.members.iter().all(|m| m.error_code == 0), "{left:?}");
    restart_node(&mut cluster, node).await;
    let coordinator = addr(&cluster);
    let (_, members) = describe(coordinator).await;
    assert!(members.is_empty(), "{members:?}");
    assert_eq!(
        heartbeat(coordinator, a_id.clone(), None, 1).await,
        UNKNOWN_MEMBER_ID
    );
    cluster.shutdown().await.unwrap();
}

/// kafka-python's consume-transform-produce: a group consumer and a transactional producer
/// that commits the consumer's positions with send_offsets_to_transaction (KIP-447 group
/// metadata). Every input record comes out once, read_committed, and the group's committed
/// offsets are the end of the input, as kafka-python itself reads them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_python_consume_transform_produce_with_a_group() {
    let Some(python) = python().await else { return };
    let cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let mut input = IdempotentProducer::connect(config(&cluster)).await.unwrap();
    let mut expected = std::collections::BTreeSet::new();
    for p in 0..3 {
        let values: Vec<String> = (0..20).map(|i| format!("kp-{p}-{i}")).collect();
        expected.extend(values.iter().map(|v| format!("out-{v}")));
        input
            .send_batch(
                "input",
                producer_client::Target::Partition(p),
                values.iter().map(|v| v.clone().into_bytes()).collect(),
            )
            .await
            .unwrap();
    }
    let report = run_script(
        &python,
        "processor_kafka_python.py",
        &bootstrap,
        &["kp-ctp", "kp-ctp-txn", "60"],
    )
    .await;
    assert_eq!(report["processed"], 60, "{report}");
    assert_eq!(
        report["committed"],
        serde_json::json!({"0": 20, "1": 20, "2": 20}),
        "{report}"
    );
    assert_output_exactly_once(&cluster, &expected, &report.to_string()).await;
    cluster.shutdown().await.unwrap();
}

/// kafka-python's group consumer through a restart of its group's coordinator: the restarted
/// coordinator restores the group's stored generation, so the consumer goes on in it without a
/// rebalance (nothing is revoked from it from the restart on; a commit that fails while the
/// coordinator is down is left to the next poll), and in the end it has seen every record and
/// committed the end of the input.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_python_group_consumer_survives_a_restart_of_its_coordinator() {
    let Some(python) = python().await else { return };
    let mut cluster = cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let group = "kp-group";
    let feeder = Feeder::start(&cluster).await;
    let dir = tempfile_dir();
    let stop = dir.join("stop");
    let mut consumer = start_script(
        &python,
        "group_consumer_kafka_python.py",
        &[&bootstrap, group],
        "kafka-python consumer",
        &stop,
    )
    .await;
    consumer.committed_at_least(50).await;
    let node = cluster.coordinator_for(group);
    let restarted_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    cluster.kill(node).await.unwrap();
    cluster.restart(node).await.unwrap();
    let after = consumer.committed + 50;
    consumer.committed_at_least(after).await;
    let written = feeder.stop().await;
    let total: usize = written.iter().map(Vec::len).sum();
    consumer.committed_at_least(total as u64).await;
    // Its last commit covers the end of every partition.
    let mut reader =
        producer_client::Consumer::new(config(&cluster), Isolation::ReadCommitted).unwrap();
    let deadline = std::time::Instant::now() + STALL_TIMEOUT;
    loop {
        let committed = reader
            .committed_offsets(group, &[])
            .await
            .unwrap_or_default();
        let at_end = written
            .iter()
            .enumerate()
            .all(|(p, v)| committed.get(&tp("input", p as i32)) == Some(&(v.len() as i64)));
        if at_end {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the end of the input never committed: {committed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&stop, b"stop").unwrap();
    let report = consumer.finish().await;
    let seen: std::collections::BTreeSet<&str> = report["seen"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let expected: std::collections::BTreeSet<&str> =
        written.iter().flatten().map(String::as_str).collect();
    assert_eq!(seen, expected, "every record seen ({})", report["refused"]);
    let late: Vec<f64> = report["revoked_at"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .filter(|t| *t >= restarted_at)
        .collect();
    assert!(
        late.is_empty(),
        "partitions revoked at {late:?}, after the restart at {restarted_at}: no rebalance was due"
    );
    cluster.shutdown().await.unwrap();
}

/// `group.max.size` and `group.consumer.max.size` (1 here): a second member's JoinGroup, and
/// a second member's ConsumerGroupHeartbeat join, are GROUP_MAX_SIZE_REACHED over Kafka's
/// protocol; the member already in each group is not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_groups_answer_group_max_size_reached() {
    const GROUP_MAX_SIZE_REACHED: i16 = 81;
    let cluster = cluster_with(minibroker::EmbeddedOptions {
        group_max_sizes: (1, 1),
        group_initial_rebalance_delay: Duration::ZERO,
        ..Default::default()
    })
    .await;
    let classic = "max-size-classic";
    let coordinator = cluster
        .kafka_address(cluster.coordinator_for(classic))
        .unwrap();
    let join = || async {
        let ResponseKind::JoinGroup(r) =
            kafka_call(coordinator, ApiKey::JoinGroup, 3, join_group(classic, "")).await
        else {
            panic!("JoinGroup response")
        };
        r
    };
    let first = join().await;
    assert_eq!((first.error_code, first.generation_id), (0, 1));
    assert_eq!(join().await.error_code, GROUP_MAX_SIZE_REACHED);

    let kip848 = "max-size-kip848";
    let coordinator = cluster
        .kafka_address(cluster.coordinator_for(kip848))
        .unwrap();
    let (code, epoch, _) = kip848_heartbeat(coordinator, kip848, "a", 0, Some(&[])).await;
    assert_eq!((code, epoch), (0, 1));
    let (code, _, _) = kip848_heartbeat(coordinator, kip848, "b", 0, Some(&[])).await;
    assert_eq!(code, GROUP_MAX_SIZE_REACHED);
    let (code, epoch, _) = kip848_heartbeat(coordinator, kip848, "a", 1, None).await;
    assert_eq!((code, epoch), (0, 1), "the member in the group goes on");
    cluster.shutdown().await.unwrap();
}

/// A cluster whose KIP-848 groups heartbeat every 200 ms instead of Kafka's 5 s.
async fn kip848_cluster() -> minibroker::EmbeddedCluster {
    cluster_with(minibroker::EmbeddedOptions {
        group_consumer_heartbeat_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await
}

/// One ConsumerGroupHeartbeat v1 of `member` at `epoch` owning `owned` partitions of `input`
/// (`None`: unchanged); a join (epoch 0) subscribes to `input`. Returns (error code, epoch,
/// assigned partitions of `input` if the reply carried an assignment).
async fn kip848_heartbeat(
    coordinator: std::net::SocketAddr,
    group: &str,
    member: &str,
    epoch: i32,
    owned: Option<&[i32]>,
) -> (i16, i32, Option<Vec<i32>>) {
    use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
    use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, GroupId, TopicName};
    let input = uuid::Uuid::from_bytes(cluster::topic_id("input"));
    let mut r = ConsumerGroupHeartbeatRequest::default();
    r.group_id = GroupId(str_bytes(group));
    r.member_id = str_bytes(member);
    r.member_epoch = epoch;
    r.rebalance_timeout_ms = if epoch == 0 { 30_000 } else { -1 };
    if epoch == 0 {
        r.subscribed_topic_names = Some(vec![TopicName(str_bytes("input"))]);
    }
    r.topic_partitions = owned.map(|partitions| {
        let mut t = TopicPartitions::default();
        t.topic_id = input;
        t.partitions = partitions.to_vec();
        vec![t]
    });
    let ResponseKind::ConsumerGroupHeartbeat(reply) = kafka_call(
        coordinator,
        ApiKey::ConsumerGroupHeartbeat,
        1,
        RequestKind::ConsumerGroupHeartbeat(r),
    )
    .await
    else {
        panic!("ConsumerGroupHeartbeat response")
    };
    let assigned = reply.assignment.map(|a| {
        a.topic_partitions
            .iter()
            .filter(|t| t.topic_id == input)
            .flat_map(|t| t.partitions.clone())
            .collect()
    });
    (reply.error_code, reply.member_epoch, assigned)
}

/// An OffsetCommit v9 of `member` at `epoch` for input-0; its error code.
async fn kip848_commit(
    coordinator: std::net::SocketAddr,
    group: &str,
    member: &str,
    epoch: i32,
    version: i16,
) -> i16 {
    testkit::kafka::member_commit(coordinator, version, group, member, epoch, 7).await
}

/// An OffsetFetch v9 of `group` (all its offsets) as `member` at `epoch`: (the group's error
/// code, its offsets of `input`).
async fn kip848_fetch(
    coordinator: std::net::SocketAddr,
    group: &str,
    member: Option<&str>,
    epoch: i32,
) -> (i16, Vec<(i32, i64)>) {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
    use kafka_protocol::messages::{GroupId, OffsetFetchRequest};
    let mut g = OffsetFetchRequestGroup::default();
    g.group_id = GroupId(str_bytes(group));
    g.member_id = member.map(str_bytes);
    g.member_epoch = epoch;
    g.topics = None;
    let mut r = OffsetFetchRequest::default();
    r.groups = vec![g];
    r.require_stable = true;
    let ResponseKind::OffsetFetch(f) = kafka_call(
        coordinator,
        ApiKey::OffsetFetch,
        9,
        RequestKind::OffsetFetch(r),
    )
    .await
    else {
        panic!("OffsetFetch response")
    };
    let g = &f.groups[0];
    let offsets = g
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == "input")
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition_index, p.committed_offset))
        })
        .collect();
    (g.error_code, offsets)
}

/// KIP-848 membership is stored: after its coordinator restarts (killed: every task of the
/// node stops at once), a group goes on where it was. A and B share `input` at epoch 2; after
/// the restart each heartbeats at epoch 2 and is answered at epoch 2 with the partitions it
/// had (no rejoin, no rebalance), commits at its epoch are taken, and the fence still holds: a
/// stale epoch's commit is STALE_MEMBER_EPOCH, an epoch ahead FENCED_MEMBER_EPOCH, an unknown
/// member UNKNOWN_MEMBER_ID; a new member joins at the next group epoch, not at 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kip848_membership_survives_a_coordinator_restart() {
    const FENCED_MEMBER_EPOCH: i16 = 110;
    const STALE_MEMBER_EPOCH: i16 = 113;
    const UNKNOWN_MEMBER_ID: i16 = 25;
    let mut cluster = kip848_cluster().await;
    let group = "kip848-restart";
    let node = cluster.coordinator_for(group);
    let coordinator = cluster.kafka_address(node).unwrap();
    let (code, epoch, _) = kip848_heartbeat(coordinator, group, "a", 0, Some(&[])).await;
    assert_eq!((code, epoch), (0, 1));
    let (code, epoch, _) = kip848_heartbeat(coordinator, group, "b", 0, Some(&[])).await;
    assert_eq!((code, epoch), (0, 2));
    let (_, _, kept) = kip848_heartbeat(coordinator, group, "a", 1, Some(&[0, 1, 2])).await;
    let kept = kept.unwrap();
    let (code, epoch, _) = kip848_heartbeat(coordinator, group, "a", 1, Some(&kept)).await;
    assert_eq!((code, epoch), (0, 2));
    let (_, _, b_got) = kip848_heartbeat(coordinator, group, "b", 2, Some(&[])).await;
    let b_got = b_got.unwrap();
    assert_eq!(b_got.len() + kept.len(), 3);
    assert_eq!(kip848_commit(coordinator, group, "a", 2, 9).await, 0);

    cluster.kill(node).await.unwrap();
    cluster.restart(node).await.unwrap();
    let coordinator = cluster.kafka_address(node).unwrap();
    // Restored at start, before any member heartbeats: described with both members at epoch 2.
    let described =
        testkit::poll::eventually_within(Duration::from_secs(30), "the group restored", || async {
            let mut r = kafka_protocol::messages::ConsumerGroupDescribeRequest::default();
            r.group_ids = vec![kafka_protocol::messages::GroupId(str_bytes(group))];
            let ResponseKind::ConsumerGroupDescribe(d) = kafka_call(
                coordinator,
                ApiKey::ConsumerGroupDescribe,
                1,
                RequestKind::ConsumerGroupDescribe(r),
            )
            .await
            else {
                panic!("ConsumerGroupDescribe response")
            };
            let g = d.groups.into_iter().next()?;
            (g.error_code == 0).then_some(g)
        })
        .await;
    let mut epochs: Vec<(String, i32)> = described
        .members
        .iter()
        .map(|m| (m.member_id.to_string(), m.member_epoch))
        .collect();
    epochs.sort();
    assert_eq!(epochs, [("a".to_string(), 2), ("b".to_string(), 2)]);
    assert_eq!(described.group_epoch, 2);
    let a_after = testkit::poll::eventually_within(
        Duration::from_secs(30),
        "the restarted coordinator answers",
        || async {
            let r = kip848_heartbeat(coordinator, group, "a", 2, Some(&kept)).await;
            (r.0 != 14).then_some(r)
        },
    )
    .await;
    assert_eq!(a_after, (0, 2, Some(kept.clone())), "A goes on at epoch 2");
    let b_after = kip848_heartbeat(coordinator, group, "b", 2, Some(&b_got)).await;
    assert_eq!(b_after, (0, 2, Some(b_got.clone())), "B goes on at epoch 2");
    assert_eq!(kip848_commit(coordinator, group, "b", 2, 9).await, 0);
    // The fence holds across the restart.
    assert_eq!(
        kip848_commit(coordinator, group, "a", 1, 9).await,
        STALE_MEMBER_EPOCH
    );
    assert_eq!(
        kip848_heartbeat(coordinator, group, "a", 3, None).await.0,
        FENCED_MEMBER_EPOCH
    );
    assert_eq!(
        kip848_heartbeat(coordinator, group, "zombie", 2, None)
            .await
            .0,
        UNKNOWN_MEMBER_ID
    );
    let (code, epoch, _) = kip848_heartbeat(coordinator, group, "c", 0, Some(&[])).await;
    assert_eq!(
        (code, epoch),
        (0, 3),
        "the group epoch goes on from the stored one"
    );
    cluster.shutdown().await.unwrap();
}

/// KIP-848's member epochs fence a zombie consumer, over Kafka's protocol against a real
/// coordinator: A joins alone (epoch 1, all three partitions); B joins; A must revoke before B
/// gets anything, then both are at epoch 2 with disjoint halves. A's commit at epoch 1 is then
/// STALE_MEMBER_EPOCH, a heartbeat ahead of its epoch FENCED_MEMBER_EPOCH, an unknown member's
/// UNKNOWN_MEMBER_ID, a member's commit below v9 UNSUPPORTED_VERSION; a classic JoinGroup
/// to the group is INCONSISTENT_GROUP_PROTOCOL and DescribeGroups GROUP_ID_NOT_FOUND; an
/// OffsetFetch v9 naming A at a stale epoch is STALE_MEMBER_EPOCH. Nothing refused is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kip848_member_epochs_fence_zombie_consumers() {
    const FENCED_MEMBER_EPOCH: i16 = 110;
    const STALE_MEMBER_EPOCH: i16 = 113;
    const UNKNOWN_MEMBER_ID: i16 = 25;
    const UNSUPPORTED_VERSION: i16 = 35;
    const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    const GROUP_ID_NOT_FOUND: i16 = 69;
    let cluster = kip848_cluster().await;
    let group = "kip848-fencing";
    let coordinator = cluster
        .kafka_address(cluster.coordinator_for(group))
        .unwrap();
    let (code, epoch, a_all) = kip848_heartbeat(coordinator, group, "a", 0, Some(&[])).await;
    assert_eq!((code, epoch), (0, 1));
    assert_eq!(a_all, Some(vec![0, 1, 2]));
    assert_eq!(kip848_commit(coordinator, group, "a", 1, 9).await, 0);

    let (code, epoch, b_first) = kip848_heartbeat(coordinator, group, "b", 0, Some(&[])).await;
    assert_eq!((code, epoch), (0, 2));
    assert_eq!(b_first, Some(vec![]), "A still holds everything");
    // A is told what to keep, at its old epoch.
    let (code, epoch, kept) = kip848_heartbeat(coordinator, group, "a", 1, Some(&[0, 1, 2])).await;
    assert_eq!((code, epoch), (0, 1));
    let kept = kept.unwrap();
    assert!(!kept.is_empty() && kept.len() < 3, "{kept:?}");
    // A acknowledges: epoch 2; B gets the rest.
    let (code, epoch, _) = kip848_heartbeat(coordinator, group, "a", 1, Some(&kept)).await;
    assert_eq!((code, epoch), (0, 2));
    let (code, epoch, b_got) = kip848_heartbeat(coordinator, group, "b", 2, Some(&[])).await;
    assert_eq!((code, epoch), (0, 2));
    let b_got = b_got.unwrap();
    assert_eq!(b_got.len() + kept.len(), 3);
    assert!(
        b_got.iter().all(|p| !kept.contains(p)),
        "{b_got:?} {kept:?}"
    );
    // `minibroker groups describe` shows the same (the coordinators' Groups service).
    let described = producer_client::Admin::new(config(&cluster))
        .unwrap()
        .describe_group(group)
        .await
        .unwrap();
    assert_eq!(
        (described.group_type.as_str(), described.state.as_str()),
        ("consumer", "Stable")
    );
    assert_eq!(
        (described.epoch, described.protocol.as_str()),
        (2, "uniform")
    );
    let mut members: Vec<(String, i32, Vec<i32>)> = described
        .members
        .iter()
        .map(|m| {
            let assigned = m.assigned.iter().map(|p| p.partition).collect();
            (m.member_id.clone(), m.member_epoch, assigned)
        })
        .collect();
    members.sort();
    let sorted = |v: &[i32]| {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    assert_eq!(
        members,
        [
            ("a".to_string(), 2, sorted(&kept)),
            ("b".to_string(), 2, sorted(&b_got))
        ]
    );

    // The zombie's view: epoch 1 commits are stale, an epoch ahead is fenced.
    assert_eq!(
        kip848_commit(coordinator, group, "a", 1, 9).await,
        STALE_MEMBER_EPOCH
    );
    assert_eq!(
        kip848_heartbeat(coordinator, group, "a", 3, None).await.0,
        FENCED_MEMBER_EPOCH
    );
    assert_eq!(
        kip848_heartbeat(coordinator, group, "zombie", 2, None)
            .await
            .0,
        UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        kip848_commit(coordinator, group, "zombie", 2, 9).await,
        UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        kip848_commit(coordinator, group, "a", 2, 8).await,
        UNSUPPORTED_VERSION
    );
    let ResponseKind::JoinGroup(join) =
        kafka_call(coordinator, ApiKey::JoinGroup, 5, join_group(group, "")).await
    else {
        panic!("JoinGroup response")
    };
    assert_eq!(join.error_code, INCONSISTENT_GROUP_PROTOCOL);
    // DescribeGroups leaves it to ConsumerGroupDescribe, as Kafka does.
    let mut describe = kafka_protocol::messages::DescribeGroupsRequest::default();
    describe.groups = vec![kafka_protocol::messages::GroupId(str_bytes(group))];
    let ResponseKind::DescribeGroups(described) = kafka_call(
        coordinator,
        ApiKey::DescribeGroups,
        5,
        RequestKind::DescribeGroups(describe),
    )
    .await
    else {
        panic!("DescribeGroups response")
    };
    assert_eq!(described.groups[0].error_code, GROUP_ID_NOT_FOUND);
    // Only the accepted commit (offset 7 at epoch 1) was stored; A's current epoch commits.
    assert_eq!(
        testkit::kafka::committed_offsets(coordinator, group).await,
        vec![("input".to_string(), 0, 7)]
    );
    assert_eq!(kip848_commit(coordinator, group, "a", 2, 9).await, 0);
    // OffsetFetch v9 naming the member: only at its current epoch; an admin tool (no member)
    // always.
    assert_eq!(
        kip848_fetch(coordinator, group, Some("a"), 2).await,
        (0, vec![(0, 7)])
    );
    assert_eq!(
        kip848_fetch(coordinator, group, Some("a"), 1).await.0,
        STALE_MEMBER_EPOCH
    );
    assert_eq!(
        kip848_fetch(coordinator, group, Some("zombie"), 2).await.0,
        UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        kip848_fetch(coordinator, group, None, -1).await,
        (0, vec![(0, 7)])
    );
    // Leaving frees A's partitions for B.
    assert_eq!(
        kip848_heartbeat(coordinator, group, "a", -1, None).await.0,
        0
    );
    let (code, epoch, b_all) = kip848_heartbeat(coordinator, group, "b", 2, Some(&b_got)).await;
    assert_eq!((code, epoch), (0, 3));
    assert_eq!(b_all, Some(vec![0, 1, 2]));
    cluster.shutdown().await.unwrap();
}

/// KIP-848 with librdkafka (`group.protocol=consumer`): two consumers share `input` through the
/// coordinator's assignment, hand partitions over as B joins and A leaves, and read every
/// record exactly once with their commits (kip848_confluent.py says how).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_consumer_protocol_shares_and_hands_over_partitions() {
    let Some(python) = python().await else { return };
    let cluster = kip848_cluster().await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(
        &python,
        "kip848_confluent.py",
        &bootstrap,
        &["kip848-group"],
    )
    .await;
    assert_eq!(report["read"], 300, "{report}");
    assert_eq!(report["duplicates"], 0, "{report}");
    assert_eq!(report["b_final"], serde_json::json!([0, 1, 2]), "{report}");
    assert_eq!(
        report["committed"],
        serde_json::json!([100, 100, 100]),
        "{report}"
    );
    let a = report["shared"]["a"].as_array().unwrap().len();
    let b = report["shared"]["b"].as_array().unwrap().len();
    assert!(a > 0 && b > 0 && a + b == 3, "{report}");
    // ConsumerGroupDescribe showed the group as the consumers saw it.
    let description = &report["description"];
    assert_eq!(
        description["type"], "ConsumerGroupType.CONSUMER",
        "{report}"
    );
    assert_eq!(description["assignor"], "uniform", "{report}");
    assert_eq!(description["listed_as_consumer"], true, "{report}");
    assert_eq!(description["listed_as_classic"], false, "{report}");
    assert_eq!(
        description["members"]["a"], report["shared"]["a"],
        "{report}"
    );
    assert_eq!(
        description["members"]["b"], report["shared"]["b"],
        "{report}"
    );
    cluster.shutdown().await.unwrap();
}

/// KIP-848 static membership with librdkafka (`group.instance.id`), kip848_static_confluent.py:
/// a static consumer that closes (a temporary leave, member epoch -2) keeps its partitions for
/// its next process, which takes exactly them under a new member id while the other member is
/// never revoked anything; and a static consumer paused past its session (a zombie) whose
/// instance id a new process took has its commit refused when it wakes, and its leave (naming
/// the instance id: FENCED_INSTANCE_ID) or rejoin takes nothing from the new process: the
/// group's offsets stay as the new process committed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confluent_kafka_static_members_restart_without_rebalance_and_zombies_are_fenced() {
    let Some(python) = python().await else { return };
    let cluster = cluster_with(minibroker::EmbeddedOptions {
        group_consumer_heartbeat_interval: Duration::from_millis(200),
        group_consumer_session_timeout: Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let bootstrap = cluster.kafka_bootstrap().join(",");
    let report = run_script(
        &python,
        "kip848_static_confluent.py",
        &bootstrap,
        &["kip848-static"],
    )
    .await;
    // A restart without a rebalance.
    let (a, b) = (&report["a"], &report["b"]);
    assert_eq!(
        a.as_array().unwrap().len() + b.as_array().unwrap().len(),
        3,
        "{report}"
    );
    assert_eq!(
        report["away"]["a"], *a,
        "A's partitions kept while away: {report}"
    );
    assert_eq!(report["away"]["b"], *b, "{report}");
    assert_eq!(report["a2"], *a, "A2 took exactly A's partitions: {report}");
    assert_eq!(report["b_after"], *b, "{report}");
    assert_eq!(
        report["b_revoked"], 0,
        "B was never revoked anything: {report}"
    );
    assert_eq!(report["a2_errors"], serde_json::json!([]), "{report}");
    // The zombie: its commit refused (by the coordinator, or by librdkafka itself once a
    // heartbeat told it it is no member any more), and every attempt to act as instance "z"
    // refused by the coordinator: its leave (FENCED_INSTANCE_ID), or a rejoin
    // (UNRELEASED_INSTANCE_ID), as the Kafka face's counters show. Z2 loses nothing.
    let commit = report["zombie"]["commit"].as_str().unwrap();
    assert!(
        commit.contains("UNKNOWN_MEMBER_ID") || commit.contains("_ASSIGNMENT_LOST"),
        "{report}"
    );
    assert_eq!(report["z2_revoked"], 0, "{report}");
    let refused = |error| {
        metric_sum(
            &cluster,
            "kafka_network_requestmetrics_errors_total",
            &[("request", "ConsumerGroupHeartbeat"), ("error", error)],
        )
    };
    let (fenced, unreleased) = (
        refused("FENCED_INSTANCE_ID"),
        refused("UNRELEASED_INSTANCE_ID"),
    );
    assert!(
        fenced + unreleased >= 1.0,
        "FENCED_INSTANCE_ID {fenced}, UNRELEASED_INSTANCE_ID {unreleased}: {report}"
    );
    eprintln!("zombie refused: FENCED_INSTANCE_ID {fenced}, UNRELEASED_INSTANCE_ID {unreleased}");
    assert_eq!(report["z2"], serde_json::json!([0, 1, 2]), "{report}");
    assert_eq!(
        report["committed_after"], report["z2_committed"],
        "{report}"
    );
    cluster.shutdown().await.unwrap();
}
