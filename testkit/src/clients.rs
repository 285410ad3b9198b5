//! Real Kafka clients for the tests that run them: the Python that imports confluent-kafka
//! (librdkafka) and kafka-python. `MINIBROKER_KAFKA_PYTHON` names it (`.ci/run` sets it to
//! `target/kafka-venv/bin/python`, which it creates); without it, that venv is tried. Where the
//! clients are missing, a test skips with a notice, or fails under
//! `MINIBROKER_REQUIRE_KAFKA_CLIENTS=1` (as in CI), so a CI machine without them cannot pass by
//! skipping.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether missing clients fail the test (`MINIBROKER_REQUIRE_KAFKA_CLIENTS=1`).
pub fn required() -> bool {
    matches!(
        std::env::var("MINIBROKER_REQUIRE_KAFKA_CLIENTS").as_deref(),
        Ok("1") | Ok("true") | Ok("yes")
    )
}

/// The workspace's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The Python with confluent-kafka and kafka-python, or `None` after the notice (a failure
/// under [`required`]).
pub fn python() -> Option<PathBuf> {
    let python = std::env::var_os("MINIBROKER_KAFKA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/kafka-venv/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import confluent_kafka, kafka"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(python);
    }
    let message = format!(
        "{} cannot import confluent_kafka and kafka (set MINIBROKER_KAFKA_PYTHON, or run .ci/run \
         once to create target/kafka-venv)",
        python.display()
    );
    assert!(!required(), "MINIBROKER_REQUIRE_KAFKA_CLIENTS=1: {message}");
    eprintln!("SKIPPED: {message}");
    None
}
