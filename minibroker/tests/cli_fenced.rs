//! `minibroker produce` as a zombie: a transactional producer process is fenced by a newer
//! instance while it is running. It must say it was fenced in one sentence, report it in its
//! JSON summary, and exit non-zero (the compose demo relies on this).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use producer_client::{Admin, TransactionalProducer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_produce_process_says_so_and_exits_non_zero() {
    let cluster = minibroker::EmbeddedCluster::start().await.unwrap();
    let id = "cli-zombie";
    let mut zombie = Command::new(env!("CARGO_BIN_EXE_minibroker"))
        .env_remove("BOOTSTRAP")
        .env("RUST_LOG", "off")
        .args(["produce", "--json", "--transactional-id", id])
        .args(["--records", "10000000", "--per-txn", "50"])
        .arg("--topology")
        .arg(cluster.topology_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // Wait until the process has committed at least one transaction (epoch > 0): it is running.
    let admin = Admin::new(cluster.client_config()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(d) = admin.describe_transaction(id).await {
            if d.producer_epoch > 0 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the producer never got going");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await; // poll interval, not synchronisation
    }

    // A newer instance takes over the transactional id.
    let mut newer =
        TransactionalProducer::connect(cluster.client_config().with_transactional_id(id))
            .await
            .unwrap();
    newer.init_transactions().await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = zombie.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            zombie.kill().unwrap();
            panic!("the fenced producer did not stop");
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // poll interval
    };
    let out = zombie.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{stdout}\n{stderr}");
    let err_lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(err_lines.len(), 1, "{stderr}");
    assert!(
        err_lines[0].contains(&format!("{id} was fenced by a newer instance")),
        "{stderr}"
    );
    assert!(
        !err_lines[0].contains("epoch: invalid producer epoch")
            && !err_lines[0].contains("fenced: producer fenced"),
        "the error's name is said twice: {stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a JSON summary")).unwrap();
    assert_eq!(summary["fenced"], true, "{stdout}");
    assert_eq!(summary["error"], "PRODUCER_FENCED", "{stdout}");
    assert!(
        summary["records_committed"].as_u64().unwrap() >= 50,
        "{stdout}"
    );
    cluster.shutdown().await.unwrap();
}
