//! Operating mini-broker as a user would: the `minibroker` binary's behaviour around the happy
//! path (JSON-only stdout, closed pipes, an unreachable cluster, signals during a transaction,
//! stdin input), the transaction tools (`find-hanging`, `abort`), the timeline picture, and the
//! nodes' metrics after the fencing story.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use minibroker::{EmbeddedCluster, EmbeddedOptions};
use producer_client::{
    Admin, ClientConfig, Consumer, Isolation, TopicPartition, TransactionalProducer,
};
use testkit::poll::{eventually_within, wait_until};

fn minibroker() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minibroker"));
    c.env_remove("TOPOLOGY")
        .env_remove("BOOTSTRAP")
        .env_remove("MINIBROKER_TIMEOUT")
        .env("RUST_LOG", "off");
    c
}

/// Runs the binary off the async threads (the cluster under test runs on them).
async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_string()
}

#[test]
fn demo_json_is_one_document_on_stdout_and_the_story_is_on_stderr() {
    let out = minibroker().args(["demo", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}",
            text(&out.stdout)
        )
    });
    assert_eq!(summary["passed"], true);
    let story = text(&out.stderr);
    assert!(story.contains("Verdict: PASS"), "{story}");
    assert!(story.contains("why +2"), "{story}");
    // The same with the tool a user pipes it to, where there is one.
    if Command::new("python3").arg("--version").output().is_ok() {
        let piped = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "set -o pipefail; RUST_LOG=off {} demo --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[\"passed\"]'",
                env!("CARGO_BIN_EXE_minibroker")
            ))
            .env_remove("TOPOLOGY")
            .env_remove("BOOTSTRAP")
            .status()
            .unwrap();
        assert!(piped.success());
    }
}

#[test]
fn demo_into_a_closed_pipe_ends_quietly() {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; RUST_LOG=off {} demo | head -1",
            env!("CARGO_BIN_EXE_minibroker")
        ))
        .env_remove("TOPOLOGY")
        .env_remove("BOOTSTRAP")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert_eq!(text(&out.stdout).trim(), "mini-broker fencing demo");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

#[test]
fn demo_and_dev_refuse_a_cluster_they_would_not_use() {
    for command in ["demo", "dev"] {
        let out = minibroker()
            .args([command, "--bootstrap", "127.0.0.1:9"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("starts its own in-process cluster and does not use --bootstrap"),
            "{err}"
        );
    }
}

#[test]
fn an_unreachable_cluster_is_answered_in_under_three_seconds() {
    // A port nobody listens on: bound, then released.
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let started = Instant::now();
    let out = minibroker()
        .args(["transactions", "list", "--bootstrap", &address])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(!out.status.success());
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let err = text(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&address), "{err}");
    assert!(err.contains("minibroker dev"), "{err}");
    assert!(err.contains("docker-compose up"), "{err}");

    // --json: the error is JSON on stdout too.
    let out = minibroker()
        .args([
            "consume",
            "--json",
            "--timeout",
            "0.5",
            "--bootstrap",
            &address,
        ])
        .output()
        .unwrap();
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["error"], "CLUSTER_UNREACHABLE");
    assert!(error["message"].as_str().unwrap().contains(&address));
}

#[test]
fn demo_draws_the_fencing_timeline_as_svg() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fencing.svg");
    let out = minibroker()
        .args(["demo", "--timeline"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let svg = std::fs::read_to_string(&path).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the timeline parses as XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let groups = |class: &str| -> Vec<String> {
        doc.descendants()
            .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some(class))
            .map(|g| {
                g.descendants()
                    .filter(|n| n.is_text())
                    .filter_map(|n| n.text())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    let lanes = groups("lane");
    for lane in [
        "instance A",
        "instance B",
        "leader 101",
        "leader 102",
        "leader 103",
    ] {
        assert!(lanes.iter().any(|l| l == lane), "{lanes:?}");
    }
    let rejected = groups("rejected");
    assert_eq!(
        rejected
            .iter()
            .filter(|r| *r == "INVALID_PRODUCER_EPOCH")
            .count(),
        2,
        "{rejected:?}"
    );
    assert_eq!(
        rejected.iter().filter(|r| *r == "PRODUCER_FENCED").count(),
        3,
        "{rejected:?}"
    );
    let fences = groups("fence");
    assert_eq!(fences.len(), 2, "{fences:?}");
    assert!(
        fences.iter().all(|f| f.contains("ABORT (epoch 4)")),
        "{fences:?}"
    );
    assert!(!groups("marker").is_empty());
}

/// The fencing story on a cluster whose nodes serve their metrics; a scrape afterwards finds
/// the fenced requests counted by transactional id and PID, and the epoch bumps by cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_fencing_of_the_demo() {
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        metrics_endpoints: true,
        ..EmbeddedOptions::default()
    })
    .await
    .unwrap();
    let summary = minibroker::demo::run_on(
        &cluster,
        &minibroker::demo::DemoOptions {
            verbose: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(summary.passed);
    let coordinator = cluster.coordinator_for("demo-app");
    let scrape = |id| {
        let address = cluster.metrics_address(id).unwrap().to_string();
        async move { cluster::metrics::scrape(&address).await.unwrap() }
    };
    let text = scrape(coordinator).await;
    let sample = |text: &str, name, labels: &[(&str, &str)]| {
        cluster::metrics::sample(text, name, labels).unwrap_or(0.0)
    };
    let pid = summary.a_pid.to_string();
    // AddPartitionsToTxn, EndTxn(COMMIT) and A's EndTxn(ABORT).
    assert_eq!(
        sample(
            &text,
            "minibroker_fenced_requests_total",
            &[
                ("error", "PRODUCER_FENCED"),
                ("transactional_id", "demo-app"),
                ("producer_id", &pid)
            ]
        ),
        3.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "minibroker_producer_epoch_bumps_total",
            &[("cause", "new_instance")]
        ) >= 1.0
    );
    assert!(
        sample(
            &text,
            "minibroker_producer_epoch_bumps_total",
            &[("cause", "end_txn")]
        ) >= 4.0
    );
    assert!(
        sample(
            &text,
            "minibroker_transaction_duration_seconds_count",
            &[("result", "commit")]
        ) >= 4.0
    );
    assert!(
        sample(
            &text,
            "kafka_network_requestmetrics_errors_total",
            &[("request", "InitProducerId"), ("error", "NONE")]
        ) >= 2.0
    );
    // The zombie's Produce at input-0's and input-2's leaders.
    let mut invalid_epoch = 0.0;
    for id in cluster.leader_ids() {
        let text = scrape(id).await;
        invalid_epoch += sample(
            &text,
            "minibroker_fenced_requests_total",
            &[("error", "INVALID_PRODUCER_EPOCH"), ("producer_id", &pid)],
        );
        assert_eq!(
            sample(
                &text,
                "kafka_cluster_partition_laststableoffsetlag",
                &[("topic", "input")]
            ),
            0.0,
            "every transaction ended: {text}"
        );
    }
    assert!(invalid_epoch >= 2.0, "{invalid_epoch}");
    cluster.shutdown().await.unwrap();
}

/// Whether read_committed readers of `tp` are held back (LSO below the high watermark).
async fn lso_held(admin: &Admin, tp: &TopicPartition) -> bool {
    let ends = admin.end_offsets(&tp.topic).await.unwrap();
    let (hw, lso) = ends[&tp.partition];
    lso < hw
}

/// A transactional producer that opened a transaction on `tp` and wrote one record.
async fn open_transaction(
    config: ClientConfig,
    id: &str,
    timeout_ms: i32,
    tp: &TopicPartition,
) -> TransactionalProducer {
    let mut p = TransactionalProducer::connect(
        config
            .with_transactional_id(id)
            .with_transaction_timeout_ms(timeout_ms),
    )
    .await
    .unwrap();
    p.init_transactions().await.unwrap();
    p.begin_transaction().unwrap();
    p.send_and_wait(&tp.topic, tp.partition, format!("{id}-open"))
        .await
        .unwrap();
    p
}

/// Commits one record to `tp` with a fresh transactional id, then reads `tp` read_committed:
/// the record must be visible at once (within `within`), i.e. nothing holds the LSO back.
async fn later_commit_is_visible(config: ClientConfig, tp: &TopicPartition, within: Duration) {
    let mut p = TransactionalProducer::connect(config.clone().with_transactional_id("later"))
        .await
        .unwrap();
    p.init_transactions().await.unwrap();
    p.begin_transaction().unwrap();
    let value = format!("later-{}", rand_suffix());
    p.send_and_wait(&tp.topic, tp.partition, value.clone())
        .await
        .unwrap();
    p.commit_transaction().await.unwrap();
    let mut consumer = Consumer::new(config, Isolation::ReadCommitted).unwrap();
    consumer.assign([tp.clone()]);
    // Each poll is a long poll of at most 100 ms: waiting on the data, not sleeping.
    let deadline = Instant::now() + within;
    loop {
        let records = consumer.poll(Duration::from_millis(100)).await.unwrap();
        if records.iter().any(|r| r.value == value.as_bytes()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "a commit on {tp} was not visible to read_committed within {within:?}"
        );
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// SIGINT and SIGTERM during a transactional produce: the command aborts its open transaction
/// and exits 130 / 143 with its summary; a read_committed reader then sees a later commit at
/// once instead of after the 60 s transaction timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_during_a_transactional_produce_aborts_its_transaction() {
    let cluster = EmbeddedCluster::start().await.unwrap();
    let admin = Admin::new(cluster.client_config()).unwrap();
    for (signal, code, partition) in [
        (nix::sys::signal::Signal::SIGINT, 130, 0),
        (nix::sys::signal::Signal::SIGTERM, 143, 1),
    ] {
        let id = format!("interrupted-{partition}");
        let tp = TopicPartition::new("input", partition);
        let child = minibroker()
            .args(["produce", "--json", "--transactional-id", &id])
            .args([
                "--records",
                "100000",
                "--per-txn",
                "100000",
                "--throughput",
                "200",
            ])
            .args(["--partition", &partition.to_string()])
            .arg("--topology")
            .arg(cluster.topology_path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Mid-transaction: open at the coordinator, and holding the partition's LSO.
        wait_until(Duration::from_secs(20), "the transaction is open", || {
            let (admin, id, tp) = (&admin, &id, &tp);
            async move {
                admin
                    .describe_transaction(id)
                    .await
                    .is_ok_and(|d| d.state == proto::TxnState::Ongoing as i32)
                    && lso_held(admin, tp).await
            }
        })
        .await;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(
            stderr.contains("the open transaction was aborted"),
            "{stderr}"
        );
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["stopped_by"], signal.as_str());
        // The abort's markers follow its EndTxn by a moment (as in Kafka).
        wait_until(Duration::from_secs(5), "the LSO is released", || {
            let (admin, tp) = (&admin, &tp);
            async move { !lso_held(admin, tp).await }
        })
        .await;
        later_commit_is_visible(cluster.client_config(), &tp, Duration::from_secs(5)).await;
    }
    cluster.shutdown().await.unwrap();
}

/// `find-hanging` finds both kinds of hanging transaction and `abort` ends each: one open past
/// its timeout at a coordinator whose timeout scan does not run, and one that holds a
/// partition's LSO after its coordinator lost its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_hanging_and_abort_free_a_held_lso() {
    let mut cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        // The coordinators never abort timed-out transactions themselves here.
        timeout_scan_interval: Duration::from_secs(3600),
        ..EmbeddedOptions::default()
    })
    .await
    .unwrap();
    let topology = cluster.topology_path().to_path_buf();
    let tool = |args: &[&str]| {
        let mut c = minibroker();
        c.args(args).arg("--json").arg("--topology").arg(&topology);
        c
    };
    let admin = Admin::new(cluster.client_config()).unwrap();

    // 1. Open past its timeout (200 ms), nobody aborts it.
    let stuck = TopicPartition::new("input", 1);
    let zombie = open_transaction(cluster.client_config(), "stuck-app", 200, &stuck).await;
    assert!(lso_held(&admin, &stuck).await);
    let hanging = eventually_within(Duration::from_secs(10), "find-hanging lists it", || {
        let c = tool(&["transactions", "find-hanging"]);
        async move {
            let out = run(c).await;
            let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            list.as_array()?
                .iter()
                .find(|h| h["transactional_id"] == "stuck-app")
                .cloned()
        }
    })
    .await;
    assert_eq!(hanging["kind"], "open_past_timeout");
    assert_eq!(hanging["partitions"][0], "input-1");
    let out = run(tool(&["transactions", "abort", "stuck-app"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let aborted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(aborted["aborted"], true);
    // `abort ID` returns once the abort is complete (CompleteAbort): the LSO is free.
    assert!(!lso_held(&admin, &stuck).await, "abort ID freed the LSO");
    let mut zombie = zombie;
    let fenced = zombie.commit_transaction().await.unwrap_err();
    assert!(fenced.is_fatal(), "{fenced}");

    // 2. The coordinator of `lost-app` loses its state while its transaction is open.
    let held = TopicPartition::new("input", 0);
    let producer = open_transaction(cluster.client_config(), "lost-app", 60_000, &held).await;
    let pid = producer.producer_id();
    let coordinator = cluster.coordinator_for("lost-app");
    cluster.kill(coordinator).await.unwrap();
    let dir = cluster.data_dir(coordinator).unwrap().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    cluster.restart(coordinator).await.unwrap();
    // Until it has loaded (nothing) and checked its peers it answers LOAD_IN_PROGRESS.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while admin.list_transactions(&[]).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "coordinator never loaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(lso_held(&admin, &held).await);
    let out = run(tool(&["transactions", "find-hanging"])).await;
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hanging = list
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["producer_id"] == pid)
        .unwrap_or_else(|| panic!("PID {pid} not listed: {list}"))
        .clone();
    assert_eq!(hanging["kind"], "lso_held_without_coordinator");
    assert_eq!(hanging["partitions"][0], "input-0");
    let pid_arg = pid.to_string();
    let out = run(tool(&[
        "transactions",
        "abort",
        "--topic",
        "input",
        "--partition",
        "0",
        "--producer-id",
        &pid_arg,
        "--cluster-secret-file",
        &cluster.secret_path().display().to_string(),
        "--topology-file",
        &cluster.topology_path().display().to_string(),
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !lso_held(&admin, &held).await,
        "the ABORT marker freed the LSO"
    );
    later_commit_is_visible(cluster.client_config(), &held, Duration::from_secs(5)).await;
    let out = run(tool(&["transactions", "find-hanging"])).await;
    assert_eq!(text(&out.stdout).trim(), "[]");
    drop(producer);
    cluster.shutdown().await.unwrap();
}

/// `produce --stdin --key-separator :` writes `key:value` lines as keyed records, each to the
/// partition its key hashes to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_reads_keyed_records_from_stdin() {
    let cluster = EmbeddedCluster::start().await.unwrap();
    let mut child = minibroker()
        .args([
            "produce",
            "--stdin",
            "--key-separator",
            ":",
            "--transactional-id",
            "stdin-app",
        ])
        .args(["--topic", "output", "--per-txn", "2"])
        .arg("--topology")
        .arg(cluster.topology_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"alice:1\nbob:2\nalice:3\nno key here\n")
        .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("4 records committed"),
        "{}",
        text(&out.stdout)
    );
    let mut consumer = Consumer::new(cluster.client_config(), Isolation::ReadCommitted).unwrap();
    consumer.assign_topics(&["output"]).await.unwrap();
    let records = consumer.read_to_end(Duration::from_secs(10)).await.unwrap();
    let partitions = 3;
    let mut seen = Vec::new();
    for r in &records {
        let key = text(&r.key);
        if !key.is_empty() {
            assert_eq!(
                r.partition.partition,
                producer_client::partitioner::partition_for_key(key.as_bytes(), partitions),
                "{key}"
            );
        }
        seen.push((key, text(&r.value)));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (String::new(), "no key here".to_string()),
            ("alice".into(), "1".into()),
            ("alice".into(), "3".into()),
            ("bob".into(), "2".into()),
        ]
    );
    cluster.shutdown().await.unwrap();
}

/// `transactions history ID`: every epoch the id went through, with its cause and the instance
/// (client address) that caused it; the coordinator's own timeout abort too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_names_each_epoch_change_with_its_cause_and_instance() {
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        timeout_scan_interval: Duration::from_millis(50),
        ..EmbeddedOptions::default()
    })
    .await
    .unwrap();
    let tp = TopicPartition::new("input", 2);
    let config = cluster.client_config().with_transaction_timeout_ms(60_000);
    // A: a new id, one committed transaction, then an open one.
    let mut a = open_transaction(config.clone(), "story", 60_000, &tp).await;
    a.commit_transaction().await.unwrap();
    a.begin_transaction().unwrap();
    a.send_and_wait("input", 2, "A-open").await.unwrap();
    // B takes over: fences A (and aborts its transaction), then bumps again.
    let mut b = TransactionalProducer::connect(config.clone().with_transactional_id("story"))
        .await
        .unwrap();
    b.init_transactions().await.unwrap();
    // B opens a transaction with a 100 ms timeout and leaves it: the coordinator aborts it.
    drop(b);
    let mut c = TransactionalProducer::connect(
        config
            .clone()
            .with_transactional_id("story")
            .with_transaction_timeout_ms(100),
    )
    .await
    .unwrap();
    c.init_transactions().await.unwrap();
    c.begin_transaction().unwrap();
    c.send_and_wait("input", 2, "C-open").await.unwrap();

    let topology = cluster.topology_path().to_path_buf();
    let history = eventually_within(Duration::from_secs(10), "the timeout is recorded", || {
        let mut command = minibroker();
        command
            .args(["transactions", "history", "story", "--json", "--topology"])
            .arg(&topology);
        async move {
            let out = run(command).await;
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let history = doc["history"].as_array()?.clone();
            history
                .last()
                .is_some_and(|c| c["cause"] == "timeout")
                .then_some(history)
        }
    })
    .await;
    let causes: Vec<&str> = history
        .iter()
        .map(|c| c["cause"].as_str().unwrap())
        .collect();
    assert_eq!(
        causes,
        vec![
            "new_producer_id", // A
            "end_txn",         // A's commit
            "new_instance",    // B fences A: A's transaction aborted at the next epoch
            "new_instance",    // B's InitProducerId, retried once the abort completed
            "new_instance",    // C (a third instance) takes over from B
            "timeout",         // the coordinator aborts C's transaction
        ],
        "{history:#?}"
    );
    let epochs: Vec<i64> = history
        .iter()
        .map(|c| c["producer_epoch"].as_i64().unwrap())
        .collect();
    assert_eq!(epochs, vec![0, 1, 2, 3, 4, 5]);
    let instance = |i: usize| history[i]["instance"].as_str().unwrap().to_string();
    assert_eq!(
        instance(0),
        instance(1),
        "A's requests come from one address"
    );
    assert_eq!(
        instance(2),
        instance(3),
        "B's requests come from one address"
    );
    assert_ne!(instance(0), instance(2), "A and B are different instances");
    assert!(instance(0).starts_with("127.0.0.1:"), "{}", instance(0));
    assert_eq!(instance(5), "coordinator");

    // The same history as a picture: the fence of A is drawn, and it parses as SVG.
    let mut command = minibroker();
    command
        .args([
            "transactions",
            "history",
            "story",
            "--svg",
            "-",
            "--topology",
        ])
        .arg(&topology);
    let out = run(command).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let svg = text(&out.stdout);
    let doc = roxmltree::Document::parse(&svg).expect("the history parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let fences = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("fence"))
        .count();
    assert_eq!(fences, 2, "B fences A, C fences B: {svg}");
    cluster.shutdown().await.unwrap();
}

/// `consume` against a partition whose leader is down says so and ends, instead of waiting for
/// ever with nothing printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_names_a_silent_leader_instead_of_hanging() {
    let mut cluster = EmbeddedCluster::start().await.unwrap();
    let leader = cluster
        .topology()
        .leader_for("input", 1)
        .map(|n| n.id)
        .unwrap();
    cluster.kill(leader).await.unwrap();
    let mut command = minibroker();
    command
        .args([
            "consume",
            "--from-beginning",
            "--timeout",
            "0.5",
            "--topology",
        ])
        .arg(cluster.topology_path());
    let started = Instant::now();
    let out = run(command).await;
    let took = started.elapsed();
    assert!(!out.status.success());
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let err = text(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("input-1 (leader {leader} at")),
        "{err}"
    );
    cluster.shutdown().await.unwrap();
}

/// `groups list` and `groups describe` show a classic group as its coordinator holds it: a
/// consumer (a raw JoinGroup/SyncGroup over Kafka's protocol) holds input-0 and input-1 at
/// generation 1; the group's committed offset of input-0 is 2 of its 5 records, so its lag
/// to the LSO is 3; input-1 has no committed offset. An unknown group is GROUP_ID_NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_list_and_describe_show_members_offsets_and_lag() {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as Assigned;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        group_initial_rebalance_delay: Duration::ZERO,
        ..EmbeddedOptions::default()
    })
    .await
    .unwrap();
    let topology = cluster.topology_path().to_path_buf();
    let tool = |args: &[&str]| {
        let mut c = minibroker();
        c.args(args).arg("--topology").arg(&topology);
        c
    };
    let mut producer = producer_client::IdempotentProducer::connect(cluster.client_config())
        .await
        .unwrap();
    let values: Vec<Vec<u8>> = (0..5).map(|i| format!("r{i}").into_bytes()).collect();
    producer
        .send_batch("input", producer_client::Target::Partition(0), values)
        .await
        .unwrap();

    let group = "cli-group";
    let coordinator = cluster
        .kafka_address(cluster.coordinator_for(group))
        .unwrap();
    // An admin's commit while the group has no members, then a consumer joins.
    assert_eq!(
        testkit::kafka::offset_commit(coordinator, group, &[("input", 0, 2)]).await,
        [0]
    );
    let ResponseKind::JoinGroup(joined) = testkit::kafka::call(
        coordinator,
        ApiKey::JoinGroup,
        3,
        testkit::kafka::join_group(group, ""),
    )
    .await
    else {
        panic!("JoinGroup response")
    };
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    let member = joined.member_id.to_string();
    let mut assignment = ConsumerProtocolAssignment::default();
    let mut assigned = Assigned::default();
    assigned.topic = TopicName(StrBytes::from_static_str("input"));
    assigned.partitions = vec![0, 1];
    assignment.assigned_partitions = vec![assigned];
    let mut bytes = bytes::BytesMut::from(&0i16.to_be_bytes()[..]);
    assignment.encode(&mut bytes, 0).unwrap();
    let RequestKind::SyncGroup(mut sync) = testkit::kafka::sync_group_alone(group, &member, 1)
    else {
        unreachable!()
    };
    sync.assignments[0].assignment = bytes.freeze();
    let ResponseKind::SyncGroup(synced) = testkit::kafka::call(
        coordinator,
        ApiKey::SyncGroup,
        3,
        RequestKind::SyncGroup(sync),
    )
    .await
    else {
        panic!("SyncGroup response")
    };
    assert_eq!(synced.error_code, 0);

    let json_of = |out: &Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
    };
    let listed = json_of(&run(tool(&["groups", "list", "--json"])).await);
    let listed: Vec<&serde_json::Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["group_id"] == group)
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            &listed[0]["type"],
            &listed[0]["state"],
            &listed[0]["members"]
        ),
        (&"classic".into(), &"Stable".into(), &1.into())
    );

    let d = json_of(&run(tool(&["groups", "describe", group, "--json"])).await);
    assert_eq!(
        (&d["type"], &d["state"], &d["epoch"]),
        (&"classic".into(), &"Stable".into(), &1.into())
    );
    assert_eq!(d["protocol"], "range");
    assert_eq!(d["members"][0]["member_id"], member.as_str());
    assert_eq!(
        d["members"][0]["assigned"],
        serde_json::json!(["input-0", "input-1"])
    );
    let partitions = d["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 2, "{d}");
    let p0 = &partitions[0];
    assert_eq!(
        (
            &p0["partition"],
            &p0["committed"],
            &p0["last_stable_offset"],
            &p0["high_watermark"],
            &p0["lag"]
        ),
        (&0.into(), &2.into(), &5.into(), &5.into(), &3.into())
    );
    assert_eq!(p0["owner"], member.as_str());
    let p1 = &partitions[1];
    assert_eq!(
        (&p1["partition"], &p1["committed"], &p1["lag"]),
        (
            &1.into(),
            &serde_json::Value::Null,
            &serde_json::Value::Null
        )
    );

    // The table says the same.
    let out = run(tool(&["groups", "describe", group])).await;
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        table.contains("classic") && table.contains("Stable") && table.contains("LAG"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("input ") && l.contains(" 0 "))
        .unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..6], ["input", "0", "2", "5", "5", "3"], "{table}");

    let missing = run(tool(&["groups", "describe", "no-such-group"])).await;
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("GROUP_ID_NOT_FOUND"),
        "{}",
        text(&missing.stderr)
    );
    cluster.shutdown().await.unwrap();
}
