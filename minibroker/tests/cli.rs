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
    let text = String::from_utf8_lossy(&out.stdout);
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
