//! `minibroker demo` as a test: the story passes on a correct cluster, and its checker catches
//! broken fencing (leaders that skip the epoch check).

use minibroker::demo::{self, DemoOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_passes() {
    integration_tests::init_tracing();
    let summary = demo::run(DemoOptions {
        verbose: false,
        ..DemoOptions::default()
    })
    .await
    .unwrap();
    assert!(summary.passed, "{summary:#?}");
    assert_eq!(summary.a_epochs[0], 0);
    assert_eq!(summary.a_pid, summary.b_pid);
    assert!(summary.b_epoch > *summary.a_epochs.last().unwrap());
    assert_eq!(summary.fenced_errors.len(), 4);
    assert!(summary.fenced_errors.iter().all(|z| z.rejected));
    let r = &summary.records;
    assert_eq!((r.duplicated, r.missing, r.aborted_visible), (0, 0, 0));
    assert_eq!(r.visible, r.committed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_fails_when_leaders_skip_the_epoch_check() {
    integration_tests::init_tracing();
    let summary = demo::run(DemoOptions {
        verbose: false,
        unsafe_skip_epoch_check: true,
        ..DemoOptions::default()
    })
    .await
    .unwrap();
    assert!(
        !summary.passed,
        "the checker must catch broken fencing: {summary:#?}"
    );
    assert!(summary.records.aborted_visible > 0);
    assert!(summary.fenced_errors.iter().any(|z| !z.rejected));
    let failed: Vec<&str> = summary
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        failed.contains(&"nothing of A's aborted transaction or zombie writes is visible"),
        "{failed:?}"
    );
}
