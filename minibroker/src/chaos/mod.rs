//! `minibroker chaos`: a Jepsen-style run, so anyone can watch exactly-once hold under faults.
//!
//! One run:
//! 1. starts a cluster of **child processes** (`minibroker node ...`, 2 coordinators and 3
//!    leaders on loopback, sled in a temporary directory) so faults are real signals;
//! 2. starts N producer workers (`minibroker chaos-worker`, one process per instance of a
//!    transactional id) writing transactions of unique values, some aborted on purpose, and a
//!    read_committed poller recording what it sees and the watermarks;
//! 3. runs the **nemesis** for `--duration`: SIGKILL + restart of a coordinator or leader, the
//!    owning coordinator SIGKILLed right as a producer sends EndTxn(COMMIT), SIGSTOP/SIGCONT of a
//!    node or of a producer (long enough for its transaction to time out), a producer crashed and
//!    restarted, and a **zombie**: a producer SIGSTOPped mid-transaction, a new instance of its
//!    transactional id started, and the old one resumed once the new one is initialised; with
//!    `--power-cuts`, a **power cut** of a node too (its data disk's media copied right after
//!    freezing it, without what sat in the device's volatile cache, or, in half the cuts, with
//!    a random part of that cache written back first; the node started again on that copy), or
//!    of every node at once (an outage of the whole cluster);
//! 4. heals everything, stops the producers, waits for quiescence (no open transaction, every LSO
//!    at its high watermark), reads everything back in both isolation levels and hands the history
//!    to the [`checker`], which shares no code with what it checks.
//!
//! Every event goes to `history.jsonl` in the run's directory (kept with `--keep`).
//! Modules: [`history`] (the event format), [`checker`] (the rules), [`procs`] (child processes
//! and signals), [`worker`] (the producer process), [`nemesis`] (the faults).
//!
//! CAVEATS: one machine, loopback only: no network partitions (SIGSTOP stands in for them); the
//! zombie check compares wall-clock times of processes on this machine.

pub mod checker;
pub mod cli;
pub mod history;
pub mod nemesis;
pub mod procs;
pub mod worker;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use cluster::{Node, Topic, TopicPartition, Topology};
use producer_client::{Admin, ClientConfig, Consumer, Isolation};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use checker::Verdict;
use history::{now_us, Entry, FinalRead, ReadRecord, WorkerEvent};
use procs::{NodeSettings, Nodes};

/// The topic the producers write.
pub const TOPIC: &str = "chaos";

/// What a chaos run does.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    /// The `minibroker` executable (node and worker processes are started from it).
    pub exe: PathBuf,
    /// Random seed of the nemesis and the workers.
    pub seed: u64,
    /// How long the nemesis runs.
    pub duration: Duration,
    /// Concurrent transactional ids.
    pub producers: usize,
    /// Partitions of the topic.
    pub partitions: usize,
    /// Records per transaction.
    pub records_per_txn: u64,
    /// Chance that a transaction is aborted on purpose.
    pub abort_ratio: f64,
    /// Transaction timeout of the producers.
    pub transaction_timeout_ms: i32,
    /// Mean pause between faults.
    pub fault_interval: Duration,
    /// Keep the run's directory (history, logs, data) here instead of a temporary one.
    pub keep: Option<PathBuf>,
    /// DANGER: leaders skip the epoch check (the checker must report zombie writes).
    pub unsafe_skip_epoch_check: bool,
    /// Cut the power of nodes too (`power-cut`): every node's data on an ext4 disk of its own
    /// whose device has a volatile write cache ([`cluster::power_cut`]; needs root).
    pub power_cuts: bool,
    /// The producers: `None`, our client library over gRPC (`minibroker chaos-worker`); `Some`,
    /// a real Kafka client over the nodes' Kafka listeners, transaction version 1, as an
    /// unchanged Kafka application.
    pub kafka_client: Option<KafkaClient>,
}

/// A real Kafka client running the chaos producers.
#[derive(Clone, Debug)]
pub struct KafkaClient {
    /// `librdkafka` (confluent-kafka) or `kafka-python`: the worker's `--library`.
    pub library: &'static str,
    /// The Python interpreter that imports it.
    pub python: PathBuf,
}

/// The Kafka-client worker, written into the run's directory when the producers are a Kafka
/// client.
const KAFKA_WORKER: &str = include_str!("kafka_worker.py");

impl ChaosOptions {
    /// Defaults for `exe`.
    pub fn new(exe: PathBuf) -> Self {
        Self {
            exe,
            seed: 1,
            duration: Duration::from_secs(20),
            producers: 4,
            partitions: 3,
            records_per_txn: 4,
            abort_ratio: 0.2,
            transaction_timeout_ms: 2000,
            fault_interval: Duration::from_millis(700),
            keep: None,
            unsafe_skip_epoch_check: false,
            power_cuts: false,
            kafka_client: None,
        }
    }
}

/// One run's outcome.
#[derive(Debug, Serialize)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// Wall time of the run, seconds.
    pub seconds: f64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Power faults (cuts and outages) after which the devices had written back part of their
    /// caches ([`cluster::power_cut::PowerCutDisk::cut_after_partial_writeback`]).
    pub partial_writebacks: usize,
    /// What the checker found.
    pub verdict: Verdict,
    /// Where the history is (when kept).
    pub history: Option<PathBuf>,
}

/// A running producer instance.
pub(crate) struct Worker {
    pub(crate) txid: String,
    pub(crate) instance: String,
    pub(crate) child: Child,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) init: Option<oneshot::Receiver<bool>>,
    /// Records acknowledged in the open transaction (0 once EndTxn is sent).
    pub(crate) mid_txn: watch::Receiver<u64>,
}

/// Starts producer instances and forwards their events to the history.
pub(crate) struct WorkerFactory {
    options: ChaosOptions,
    /// The nodes the workers bootstrap from: gRPC addresses, or Kafka listeners for a Kafka
    /// client.
    bootstrap: Vec<String>,
    /// The Kafka-client worker script, when the producers are a Kafka client.
    script: Option<PathBuf>,
    history: mpsc::UnboundedSender<Entry>,
    /// Transactional ids whose EndTxn(COMMIT) was just sent (for kill-after-commit).
    commits: mpsc::UnboundedSender<String>,
    started: usize,
}

impl WorkerFactory {
    /// Starts instance number `generation` of transactional id `txid`.
    pub(crate) fn start(&mut self, txid: &str, generation: usize) -> anyhow::Result<Worker> {
        let instance = format!("{txid}#{generation}");
        self.started += 1;
        let seed = self.options.seed ^ (self.started as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut command = match (&self.options.kafka_client, &self.script) {
            (Some(client), Some(script)) => {
                let mut command = Command::new(&client.python);
                command.arg(script).arg("--library").arg(client.library);
                command
            }
            _ => {
                let mut command = Command::new(&self.options.exe);
                command.arg("chaos-worker");
                command
            }
        };
        let mut child = command
            .arg("--nodes")
            .arg(self.bootstrap.join(","))
            .arg("--transactional-id")
            .arg(txid)
            .arg("--instance")
            .arg(&instance)
            .arg("--topic")
            .arg(TOPIC)
            .arg("--partitions")
            .arg(self.options.partitions.to_string())
            .arg("--records-per-txn")
            .arg(self.options.records_per_txn.to_string())
            .arg("--abort-ratio")
            .arg(self.options.abort_ratio.to_string())
            .arg("--transaction-timeout-ms")
            .arg(self.options.transaction_timeout_ms.to_string())
            .arg("--seed")
            .arg(seed.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting a chaos worker")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("worker stdout")?;
        let (init_tx, init_rx) = oneshot::channel();
        let (mid_tx, mid_rx) = watch::channel(0u64);
        let history = self.history.clone();
        let commits = self.commits.clone();
        let (t, i) = (txid.to_string(), instance.clone());
        tokio::spawn(async move {
            let mut init = Some(init_tx);
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(event) = serde_json::from_str::<WorkerEvent>(&line) else {
                    continue;
                };
                match &event {
                    WorkerEvent::InitOk { .. } => {
                        if let Some(tx) = init.take() {
                            let _ = tx.send(true);
                        }
                    }
                    WorkerEvent::InitFailed { .. } => {
                        if let Some(tx) = init.take() {
                            let _ = tx.send(false);
                        }
                    }
                    WorkerEvent::Send { ok: Some(_), .. } => {
                        mid_tx.send_modify(|n| *n += 1);
                    }
                    WorkerEvent::EndStart { commit, .. } => {
                        let _ = mid_tx.send(0);
                        if *commit {
                            let _ = commits.send(t.clone());
                        }
                    }
                    _ => {}
                }
                let _ = history.send(Entry::Worker {
                    txid: t.clone(),
                    instance: i.clone(),
                    event,
                });
            }
        });
        Ok(Worker {
            txid: txid.to_string(),
            instance,
            child,
            stdin,
            init: Some(init_rx),
            mid_txn: mid_rx,
        })
    }
}

/// Runs one chaos run and checks it.
pub async fn run(options: ChaosOptions) -> anyhow::Result<RunReport> {
    let started = Instant::now();
    let temp = tempfile::Builder::new()
        .prefix("minibroker-chaos-")
        .tempdir()?;
    let dir = match &options.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => temp.path().to_path_buf(),
    };

    let topology = topology(&options).await?;
    let topology_path = dir.join("topology.toml");
    std::fs::write(&topology_path, topology.to_toml())?;
    let secret = cluster::auth::ClusterSecret::generate();
    std::fs::write(dir.join("cluster.secret"), secret.expose())?;
    let bootstrap: Vec<String> = topology
        .coordinators
        .iter()
        .chain(&topology.leaders)
        .map(|n| n.address.clone())
        .collect();
    let mut nodes = Nodes::new(
        NodeSettings {
            exe: options.exe.clone(),
            topology_path,
            dir: dir.clone(),
            timeout_scan_ms: 100,
            unsafe_skip_epoch_check: options.unsafe_skip_epoch_check,
            power_cuts: options.power_cuts,
        },
        &topology,
    );
    for id in nodes.ids() {
        nodes.start(id)?;
    }
    let outcome = run_on(&options, &topology, &mut nodes, bootstrap, &dir).await;
    nodes.stop_all(Duration::from_secs(5)).await;
    let (history, read) = outcome?;

    let verdict = checker::check(&history, &read);
    let mut faults = BTreeMap::new();
    let mut partial_writebacks = 0;
    for entry in &history {
        if let Entry::Fault { what, .. } = entry {
            let kind = what.split_whitespace().next().unwrap_or("?").to_string();
            *faults.entry(kind).or_default() += 1;
            partial_writebacks += usize::from(what.contains(nemesis::PARTIAL_WRITEBACK));
        }
    }
    Ok(RunReport {
        seed: options.seed,
        seconds: started.elapsed().as_secs_f64(),
        faults,
        partial_writebacks,
        verdict,
        history: options.keep.as_ref().map(|d| d.join("history.jsonl")),
    })
}

/// Loopback addresses for every node (ports reserved by binding port 0; a Kafka listener too
/// when the producers are a Kafka client), the `chaos` topic.
async fn topology(options: &ChaosOptions) -> anyhow::Result<Topology> {
    let kafka = options.kafka_client.is_some();
    let mut addresses = Vec::new();
    for _ in 0..if kafka { 10 } else { 5 } {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addresses.push(l.local_addr()?.to_string());
    }
    let node = |id, k: usize| Node {
        id,
        address: addresses[k].clone(),
        kafka_address: kafka.then(|| addresses[k + 5].clone()),
    };
    let topology = Topology {
        transaction_state_partitions: 8,
        coordinators: vec![node(1, 0), node(2, 1)],
        leaders: vec![node(101, 2), node(102, 3), node(103, 4)],
        topics: vec![Topic {
            name: TOPIC.to_string(),
            leaders: (0..options.partitions)
                .map(|p| 101 + (p % 3) as i32)
                .collect(),
        }],
    };
    topology.validate()?;
    Ok(topology)
}

/// The run proper, on started nodes: workers, poller, nemesis, heal, quiescence, read-back.
async fn run_on(
    options: &ChaosOptions,
    topology: &Topology,
    nodes: &mut Nodes,
    bootstrap: Vec<String>,
    dir: &std::path::Path,
) -> anyhow::Result<(Vec<Entry>, FinalRead)> {
    nodes.wait_ready(Duration::from_secs(30)).await?;
    let (history_tx, mut history_rx) = mpsc::unbounded_channel::<Entry>();
    let history_path = dir.join("history.jsonl");
    let writer = tokio::spawn(async move {
        let mut file = std::io::BufWriter::new(std::fs::File::create(history_path)?);
        let mut all = Vec::new();
        while let Some(entry) = history_rx.recv().await {
            serde_json::to_writer(&mut file, &entry)?;
            file.write_all(b"\n")?;
            all.push(entry);
        }
        file.flush()?;
        anyhow::Ok(all)
    });

    let client = ClientConfig::new(bootstrap.clone())
        .with_request_timeout(Duration::from_secs(3))
        .with_retry_backoff(Duration::from_millis(10), Duration::from_millis(200))
        .with_max_retries(100);
    let (stop_tx, stop_rx) = watch::channel(false);
    let poller = tokio::spawn(poll_committed(
        client.clone(),
        options.partitions,
        history_tx.clone(),
        stop_rx,
    ));

    let (commits_tx, commits_rx) = mpsc::unbounded_channel();
    let (bootstrap, script) = match options.kafka_client {
        Some(_) => {
            let script = dir.join("kafka_worker.py");
            std::fs::write(&script, KAFKA_WORKER)?;
            let kafka = topology
                .coordinators
                .iter()
                .chain(&topology.leaders)
                .filter_map(|n| n.kafka_address.clone())
                .collect();
            (kafka, Some(script))
        }
        None => (bootstrap, None),
    };
    let mut factory = WorkerFactory {
        options: options.clone(),
        bootstrap,
        script,
        history: history_tx.clone(),
        commits: commits_tx,
        started: 0,
    };
    let mut nemesis = nemesis::Nemesis::new(options, Arc::new(topology.clone()), commits_rx);
    let mut workers = Vec::new();
    for k in 0..options.producers {
        workers.push(factory.start(&format!("chaos-{k}"), 0)?);
    }
    let mut zombies = nemesis
        .run(nodes, &mut factory, &mut workers, &history_tx)
        .await?;

    // Heal, then let every producer finish its transaction and stop.
    nodes.heal()?;
    for w in workers.iter().chain(zombies.iter()) {
        procs::signal(&w.child, nix::sys::signal::Signal::SIGCONT);
    }
    nodes.wait_ready(Duration::from_secs(30)).await?;
    workers.append(&mut zombies);
    for w in &mut workers {
        w.stdin = None;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for w in &mut workers {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, w.child.wait()).await.is_err() {
            let _ = w.child.start_kill();
            let _ = w.child.wait().await;
            let _ = history_tx.send(Entry::Fault {
                at_us: now_us(),
                what: format!("straggler {} killed at the end", w.instance),
            });
        }
    }
    drop(workers);

    let read = quiesce_and_read(client, options, &history_tx).await;
    let _ = stop_tx.send(true);
    poller.await??;
    drop(history_tx);
    drop(factory);
    let history = writer.await??;
    Ok((history, read?))
}

/// The read_committed poller: every poll of every partition becomes an `Observed` entry.
async fn poll_committed(
    config: ClientConfig,
    partitions: usize,
    history: mpsc::UnboundedSender<Entry>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut consumer = Consumer::new(config, Isolation::ReadCommitted)?;
    let tps: Vec<TopicPartition> = (0..partitions as i32)
        .map(|p| TopicPartition::new(TOPIC, p))
        .collect();
    consumer.assign(tps.clone());
    loop {
        let polled = tokio::select! {
            _ = stop.changed() => break,
            polled = consumer.poll(Duration::from_millis(200)) => polled,
        };
        let records = match polled {
            Ok(records) => records,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let mut by_partition: BTreeMap<i32, Vec<(i64, String)>> = BTreeMap::new();
        for r in records {
            by_partition
                .entry(r.partition.partition)
                .or_default()
                .push((r.offset, String::from_utf8_lossy(&r.value).into_owned()));
        }
        for tp in &tps {
            if let Some(w) = consumer.watermarks(tp) {
                let _ = history.send(Entry::Observed {
                    at_us: now_us(),
                    partition: tp.partition,
                    high_watermark: w.high_watermark,
                    last_stable_offset: w.last_stable_offset,
                    records: by_partition.remove(&tp.partition).unwrap_or_default(),
                });
            }
        }
        consumer.clear_watermarks();
    }
    Ok(())
}

/// Waits until no transaction is open and every LSO reached its high watermark (or the
/// deadline passes: what is left is reported as hanging), then reads everything back.
async fn quiesce_and_read(
    config: ClientConfig,
    options: &ChaosOptions,
    history: &mpsc::UnboundedSender<Entry>,
) -> anyhow::Result<FinalRead> {
    use proto::TxnState;
    let admin = Admin::new(config.clone())?;
    let wait = Duration::from_millis(options.transaction_timeout_ms.max(0) as u64)
        + Duration::from_secs(20);
    let deadline = Instant::now() + wait;
    let mut read = FinalRead::default();
    loop {
        let open = admin
            .list_transactions(&[
                TxnState::Ongoing,
                TxnState::PrepareCommit,
                TxnState::PrepareAbort,
            ])
            .await;
        let ends = admin.end_offsets(TOPIC).await;
        if let (Ok(open), Ok(ends)) = (open, ends) {
            read.open_transactions = open.into_iter().map(|(_, t)| t.transactional_id).collect();
            read.held_partitions = ends
                .into_iter()
                .filter(|(_, (hw, lso))| lso < hw)
                .map(|(p, (hw, lso))| (p, hw, lso))
                .collect();
            if read.open_transactions.is_empty() && read.held_partitions.is_empty() {
                break;
            }
        }
        if Instant::now() >= deadline {
            let _ = history.send(Entry::Fault {
                at_us: now_us(),
                what: format!("quiescence not reached within {wait:?}"),
            });
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for isolation in [Isolation::ReadCommitted, Isolation::ReadUncommitted] {
        let mut consumer = Consumer::new(config.clone(), isolation)?;
        consumer.assign((0..options.partitions as i32).map(|p| TopicPartition::new(TOPIC, p)));
        let records = consumer.read_to_end(Duration::from_secs(60)).await?;
        let mut out: Vec<ReadRecord> = records
            .into_iter()
            .map(|r| ReadRecord {
                partition: r.partition.partition,
                offset: r.offset,
                value: String::from_utf8_lossy(&r.value).into_owned(),
            })
            .collect();
        out.sort_by_key(|r| (r.partition, r.offset));
        match isolation {
            Isolation::ReadCommitted => read.committed = out,
            Isolation::ReadUncommitted => read.uncommitted = out,
        }
    }
    Ok(read)
}
