//! The `minibroker` binary itself: `demo` exits 0 with a passing JSON summary, the hidden
//! broken-fencing mode exits non-zero, and a command without a cluster fails with one sentence.

use std::process::Command;

fn minibroker() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minibroker"));
    c.env_remove("TOPOLOGY")
        .env_remove("BOOTSTRAP")
        .env("RUST_LOG", "off");
    c
}

fn last_json_line(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().last().expect("output");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

#[test]
fn demo_exits_zero_and_ends_with_a_json_summary() {
    let out = minibroker().args(["demo", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let summary = last_json_line(&out.stdout);
    assert_eq!(summary["passed"], true);
    assert_eq!(summary["records"]["duplicated"], 0);
    assert_eq!(summary["records"]["aborted_visible"], 0);
    // With --json the story is on stderr.
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("Verdict: PASS"));
    assert!(text.contains("PRODUCER_FENCED"));
    assert!(text.contains("INVALID_PRODUCER_EPOCH"));
}

#[test]
fn demo_with_broken_fencing_exits_non_zero() {
    let out = minibroker()
        .args(["demo", "--json", "--unsafe-skip-epoch-check"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let summary = last_json_line(&out.stdout);
    assert_eq!(summary["passed"], false);
    assert!(summary["records"]["aborted_visible"].as_u64().unwrap() > 0);
}

#[test]
fn errors_are_one_sentence_without_a_backtrace() {
    let out = minibroker()
        .args(["transactions", "list"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.starts_with("error: no cluster given"), "{err}");
    let out = minibroker()
        .args(["consume", "--topology", "/nonexistent/topology.toml"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/topology.toml"), "{err}");
}

/// produce, consume, transactions, producers and process against an embedded cluster, through
/// the binary with `--topology` and `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_work_against_a_running_cluster() {
    let cluster = minibroker::EmbeddedCluster::start().await.unwrap();
    let topology = cluster.topology_path().to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let topology = topology.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                let out = minibroker()
                    .arg("--json")
                    .arg("--topology")
                    .arg(&topology)
                    .args(&args)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8(out.stdout).unwrap()
            })
            .await
            .unwrap()
        }
    };

    let out = run(&[
        "produce",
        "--transactional-id",
        "cli-app",
        "--records",
        "30",
        "--per-txn",
        "5",
        "--abort-every",
        "3",
    ])
    .await;
    let summary = last_json_line(out.as_bytes());
    assert_eq!(summary["records_committed"], 20);
    assert_eq!(summary["records_aborted"], 10);
    run(&["produce", "--records", "4", "--value-prefix", "idem"]).await;

    // Markers land a moment after EndTxn answers: wait until no transaction is open.
    let admin = producer_client::Admin::new(cluster.client_config()).unwrap();
    let settle = || async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        for topic in ["input", "output"] {
            while !admin
                .end_offsets(topic)
                .await
                .unwrap()
                .values()
                .all(|(hw, lso)| hw == lso)
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{topic} never settled"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    settle().await;
    let committed = run(&["consume", "--from-beginning"]).await;
    assert_eq!(committed.lines().count(), 24, "{committed}");
    let all = run(&[
        "consume",
        "--from-beginning",
        "--isolation",
        "read-uncommitted",
    ])
    .await;
    assert_eq!(all.lines().count(), 34, "{all}");
    // Kafka's spelling of the isolation levels is accepted too.
    let kafka_spelling = run(&[
        "consume",
        "--from-beginning",
        "--isolation",
        "read_committed",
    ])
    .await;
    let sorted = |text: &str| {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    // Partitions are polled concurrently, so only the set of records is compared.
    assert_eq!(sorted(&kafka_spelling), sorted(&committed));

    let list = run(&["transactions", "list"]).await;
    let list: serde_json::Value = serde_json::from_str(list.trim()).unwrap();
    assert_eq!(list[0]["transactional_id"], "cli-app");
    let d = last_json_line(
        run(&["transactions", "describe", "cli-app"])
            .await
            .as_bytes(),
    );
    assert_eq!(d["producer_epoch"], 6, "{d}");

    let producers = run(&["producers", "input", "0"]).await;
    let producers: serde_json::Value = serde_json::from_str(producers.trim()).unwrap();
    assert_eq!(producers.as_array().unwrap().len(), 2, "{producers}");

    let stats = last_json_line(run(&["process", "--until-idle-ms", "300"]).await.as_bytes());
    assert_eq!(stats["records_committed"], 24, "{stats}");
    settle().await;
    let output = run(&["consume", "--topic", "output", "--from-beginning"]).await;
    assert_eq!(output.lines().count(), 24, "{output}");
    assert!(output.contains("processed(idem-0)"));
    // A second run resumes from the group's committed offsets: nothing left to do.
    let stats = last_json_line(run(&["process", "--until-idle-ms", "300"]).await.as_bytes());
    assert_eq!(stats["records_committed"], 0, "{stats}");
    cluster.shutdown().await.unwrap();
}
