//! A node binary as a child process, for tests that kill it for real (SIGKILL, no clean stop).

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A free loopback address for a child process to bind (released here, bound again by the child).
pub fn free_address() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// A node child process, killed with SIGKILL when dropped.
pub struct Node(pub Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Node {
    /// Starts `binary` (a `CARGO_BIN_EXE_*` path) as node `node_id` listening on `addr`, with
    /// its data in `dir/data`, the topology `dir/topology.toml`, the test cluster secret, and its
    /// log (at debug for `log_target`) in the file `log`.
    pub fn spawn(
        binary: &str,
        node_id: u32,
        addr: &str,
        dir: &Path,
        log_target: &str,
        log: &Path,
    ) -> Self {
        Self::spawn_with_args(binary, node_id, addr, dir, log_target, log, &[])
    }

    /// [`Node::spawn`] with `extra` arguments after the usual ones (e.g. `--kafka-listen`).
    pub fn spawn_with_args(
        binary: &str,
        node_id: u32,
        addr: &str,
        dir: &Path,
        log_target: &str,
        log: &Path,
        extra: &[&str],
    ) -> Self {
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(binary)
            .args(["--node-id", &node_id.to_string(), "--listen", addr])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--topology")
            .arg(dir.join("topology.toml"))
            .args(extra)
            .env("RUST_LOG", format!("{log_target}=debug"))
            .env("CLUSTER_SECRET", crate::auth::TEST_SECRET)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Self(child)
    }

    /// SIGSTOP: the process does nothing more, its writes stay where they are (for a power cut,
    /// [`crate::power::PowerCutDisk::cut`]). Drop or [`Node::kill`] it after.
    pub fn freeze(&self) {
        let status = Command::new("kill")
            .args(["-STOP", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -STOP {}", self.0.id());
    }

    /// SIGKILL, at once: no clean stop, no flush at shutdown.
    pub fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}
