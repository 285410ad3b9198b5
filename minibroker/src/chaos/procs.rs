//! Child processes the nemesis can hurt: the cluster's nodes (each `minibroker node ...` in its
//! own process, on a fixed loopback port and data directory so a restart comes back as the same
//! node) and the producer workers (`minibroker chaos-worker ...`).
//!
//! SIGKILL is `Child::start_kill`; SIGSTOP / SIGCONT go through `nix` by pid.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cluster::power_cut::PowerCutDisk;
use cluster::{NodeId, Topology};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Transaction (and group) coordinator.
    Coordinator,
    /// Partition leader.
    Leader,
}

impl Role {
    /// The `minibroker node` argument.
    pub fn arg(self) -> &'static str {
        match self {
            Role::Coordinator => "coordinator",
            Role::Leader => "leader",
        }
    }
}

/// Sends `signal` to a running child; a child that already exited is not an error.
pub fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), signal);
    }
}

struct NodeProc {
    role: Role,
    address: String,
    /// Kafka's protocol too, when the topology gives the node a `kafka_address`.
    kafka_address: Option<String>,
    data_dir: PathBuf,
    /// The disk `data_dir` is mounted from, with [`NodeSettings::power_cuts`].
    disk: Option<PowerCutDisk>,
    child: Option<Child>,
    paused: bool,
}

/// How every node process is started.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    /// The `minibroker` executable.
    pub exe: PathBuf,
    /// The topology file every node reads.
    pub topology_path: PathBuf,
    /// Where logs and data directories go.
    pub dir: PathBuf,
    /// Coordinators' timeout scan interval.
    pub timeout_scan_ms: u64,
    /// DANGER: leaders skip the epoch check (the sabotage run).
    pub unsafe_skip_epoch_check: bool,
    /// Every node's data directory on a disk whose power can be cut ([`Nodes::power_cut`]).
    pub power_cuts: bool,
}

/// The cluster's node processes.
pub struct Nodes {
    settings: NodeSettings,
    nodes: BTreeMap<NodeId, NodeProc>,
}

impl Nodes {
    /// Describes the nodes of `topology` (nothing is started yet).
    pub fn new(settings: NodeSettings, topology: &Topology) -> Self {
        let mut nodes = BTreeMap::new();
        for (role, list) in [
            (Role::Coordinator, &topology.coordinators),
            (Role::Leader, &topology.leaders),
        ] {
            for node in list {
                nodes.insert(
                    node.id,
                    NodeProc {
                        role,
                        address: node.address.clone(),
                        kafka_address: node.kafka_address.clone(),
                        data_dir: settings.dir.join(format!("node-{}", node.id)),
                        disk: None,
                        child: None,
                        paused: false,
                    },
                );
            }
        }
        Self { settings, nodes }
    }

    /// Every node id.
    pub fn ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// A node's role.
    pub fn role(&self, id: NodeId) -> Option<Role> {
        self.nodes.get(&id).map(|n| n.role)
    }

    /// Whether the node's process is running (not killed).
    pub fn is_up(&self, id: NodeId) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.child.is_some())
    }

    /// Starts node `id` (again, after a kill) on its address and data directory.
    pub fn start(&mut self, id: NodeId) -> anyhow::Result<()> {
        let settings = self.settings.clone();
        let node = self.nodes.get_mut(&id).context("unknown node")?;
        if node.child.is_some() {
            return Ok(());
        }
        if settings.power_cuts && node.disk.is_none() {
            // Sparse: the image takes only what the node writes.
            let image = settings.dir.join(format!("node-{id}.img"));
            let disk = PowerCutDisk::create(&image, &node.data_dir, 512)
                .map_err(|why| anyhow::anyhow!("a disk whose power can be cut: {why}"))?;
            node.disk = Some(disk);
        }
        std::fs::create_dir_all(&node.data_dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(settings.dir.join(format!("node-{id}.log")))?;
        let mut command = Command::new(&settings.exe);
        command
            .arg("node")
            .arg(node.role.arg())
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&node.address)
            .arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--topology-file")
            .arg(&settings.topology_path)
            .arg("--cluster-secret-file")
            .arg(settings.dir.join("cluster.secret"))
            .arg("--timeout-scan-interval-ms")
            .arg(settings.timeout_scan_ms.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        if let Some(kafka) = &node.kafka_address {
            command.arg("--kafka-listen").arg(kafka);
        }
        if settings.unsafe_skip_epoch_check && node.role == Role::Leader {
            command.arg("--unsafe-skip-epoch-check");
        }
        node.child = Some(command.spawn().context("starting a node process")?);
        node.paused = false;
        Ok(())
    }

    /// SIGKILL, and waits for the process to be gone.
    pub async fn kill(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.get_mut(&id) {
            if let Some(mut child) = node.child.take() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            node.paused = false;
        }
    }

    /// A power cut of nodes `ids` at one moment (one node's, or every node's: an outage of the
    /// whole cluster): freezes each (SIGSTOP), then keeps only what each one's disk holds
    /// ([`PowerCutDisk::cut`]), kills them and boots their disks from what was kept; start them
    /// again with [`Nodes::start`]. A node that is down or has no disk is left as it is.
    ///
    /// With `writeback` (a seed), each device first wrote back part of its cache
    /// ([`PowerCutDisk::cut_after_partial_writeback`]; the seed and the node id pick the pieces).
    pub async fn power_cut(
        &mut self,
        ids: &[NodeId],
        writeback: Option<u64>,
    ) -> anyhow::Result<()> {
        let cut: Vec<NodeId> = ids
            .iter()
            .copied()
            .filter(|id| {
                self.nodes
                    .get(id)
                    .is_some_and(|n| n.child.is_some() && n.disk.is_some())
            })
            .collect();
        // Every process frozen first, so that no node goes on after another lost power.
        for id in &cut {
            if let Some(child) = self.nodes.get(id).and_then(|n| n.child.as_ref()) {
                signal(child, Signal::SIGSTOP);
            }
        }
        // At once, and blocking this task: the kernel's journal commits every few seconds,
        // and one meanwhile would save what only the page cache holds.
        let mut kept = Vec::new();
        for id in &cut {
            let after_cut = self.settings.dir.join(format!("node-{id}.img.cut"));
            if let Some(disk) = self.nodes.get(id).and_then(|n| n.disk.as_ref()) {
                let copied = match writeback {
                    None => disk.cut(&after_cut),
                    Some(seed) => disk.cut_after_partial_writeback(
                        &after_cut,
                        seed ^ u64::from(id.unsigned_abs()),
                        0.5,
                    ),
                };
                kept.push((*id, after_cut.clone(), copied));
            }
        }
        for (id, after_cut, copied) in kept {
            self.kill(id).await;
            copied.map_err(|why| anyhow::anyhow!("cutting node {id}'s power: {why}"))?;
            if let Some(disk) = self.nodes.get_mut(&id).and_then(|n| n.disk.as_mut()) {
                disk.boot_from(&after_cut)
                    .map_err(|why| anyhow::anyhow!("booting node {id}'s disk again: {why}"))?;
            }
        }
        Ok(())
    }

    /// SIGSTOP (`pause` true) or SIGCONT.
    pub fn pause(&mut self, id: NodeId, pause: bool) {
        if let Some(node) = self.nodes.get_mut(&id) {
            if let Some(child) = &node.child {
                signal(
                    child,
                    if pause {
                        Signal::SIGSTOP
                    } else {
                        Signal::SIGCONT
                    },
                );
                node.paused = pause;
            }
        }
    }

    /// Resumes every paused node and starts every killed one.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        for id in self.ids() {
            self.pause(id, false);
            self.start(id)?;
        }
        Ok(())
    }

    /// Waits until every running node answers Metadata, or fails after `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        for (id, node) in &self.nodes {
            if node.child.is_none() {
                continue;
            }
            loop {
                if answers(&node.address).await {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!(
                        "node {id} did not answer at {} within {timeout:?} (log: {})",
                        node.address,
                        self.settings.dir.join(format!("node-{id}.log")).display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// SIGTERM to every node, then SIGKILL whatever is left after `grace`.
    pub async fn stop_all(&mut self, grace: Duration) {
        for node in self.nodes.values_mut() {
            let Some(mut child) = node.child.take() else {
                continue;
            };
            signal(&child, Signal::SIGCONT);
            signal(&child, Signal::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }

    /// The directory of logs and data.
    pub fn dir(&self) -> &Path {
        &self.settings.dir
    }
}

async fn answers(address: &str) -> bool {
    let connect = proto::cluster_client::ClusterClient::connect(format!("http://{address}"));
    match tokio::time::timeout(Duration::from_millis(500), connect).await {
        Ok(Ok(mut client)) => {
            let call = client.metadata(proto::MetadataRequest { topics: vec![] });
            matches!(
                tokio::time::timeout(Duration::from_millis(500), call).await,
                Ok(Ok(_))
            )
        }
        _ => false,
    }
}
