//! The nemesis: faults drawn from a seeded random generator, one after another, for the run's
//! duration. Each fault is logged to the history before it is injected.
//!
//! | fault | what it does |
//! |---|---|
//! | `kill-node` | SIGKILL a coordinator or leader, restart it 0.2-1 s later (same port, same data) |
//! | `kill-after-commit` | SIGKILL the coordinator owning a transactional id right as its producer sends EndTxn(COMMIT); restart 0.3 s later |
//! | `pause-node` | SIGSTOP a node for 0.3-1.5 s |
//! | `pause-producer` | SIGSTOP a producer for 0.3-3 s (past its transaction timeout at times) |
//! | `crash-producer` | SIGKILL a producer and start a new instance of its transactional id |
//! | `zombie` | SIGSTOP a producer, start a new instance, resume the old one once the new one is initialised: the old one must be fenced |
//! | `power-cut` | with `--power-cuts`: SIGSTOP a coordinator or leader, keep only what its disk's media hold (in half the cuts a random half of the device's cache written back first), SIGKILL it, restart it 0.2-1 s later on that disk |
//! | `power-outage` | with `--power-cuts`, one power fault in three: the same for every node at one moment (the whole cluster loses power), all restarted 0.2-1 s later |
//!
//! The first fault of every run is a `zombie`, so that every run, however short, checks fencing;
//! with power cuts, the second is a `power-cut` of a coordinator (its epochs are what a lost
//! write would undo) and the third a `power-outage`.

use std::sync::Arc;
use std::time::Duration;

use cluster::Topology;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::history::{now_us, Entry};
use super::procs::{signal, Nodes};
use super::{ChaosOptions, Worker, WorkerFactory};

/// How a power fault's log line says that the devices wrote back part of their caches first.
pub(crate) const PARTIAL_WRITEBACK: &str = ", part of the cache written back";

/// The fault injector.
pub struct Nemesis {
    rng: StdRng,
    duration: Duration,
    interval: Duration,
    topology: Arc<Topology>,
    commits: mpsc::UnboundedReceiver<String>,
    generations: std::collections::HashMap<String, usize>,
    partitions: u64,
    power_cuts: bool,
}

impl Nemesis {
    pub(crate) fn new(
        options: &ChaosOptions,
        topology: Arc<Topology>,
        commits: mpsc::UnboundedReceiver<String>,
    ) -> Self {
        Self {
            rng: StdRng::seed_from_u64(options.seed),
            duration: options.duration,
            interval: options.fault_interval,
            topology,
            commits,
            generations: Default::default(),
            partitions: options.partitions as u64,
            power_cuts: options.power_cuts,
        }
    }

    /// Injects faults until the duration is over. Returns the zombie instances (fenced or not)
    /// still to be reaped.
    pub(crate) async fn run(
        &mut self,
        nodes: &mut Nodes,
        factory: &mut WorkerFactory,
        workers: &mut [Worker],
        history: &mpsc::UnboundedSender<Entry>,
    ) -> anyhow::Result<Vec<Worker>> {
        let end = Instant::now() + self.duration;
        let mut zombies = Vec::new();
        let mut first = true;
        // With power cuts, the second and third faults are a power cut of a coordinator and
        // an outage of the whole cluster, so that every run, however short, has both.
        let mut power_due = if self.power_cuts { 2 } else { 0 };
        let mut cuts = 0usize;
        // Let the producers initialise and start their first transactions.
        tokio::time::sleep(Duration::from_millis(500)).await;
        while Instant::now() < end {
            let log = |what: String| {
                let _ = history.send(Entry::Fault {
                    at_us: now_us(),
                    what,
                });
            };
            let kinds = if self.power_cuts { 7 } else { 6 };
            let choice = if first {
                5
            } else if power_due > 0 {
                power_due -= 1;
                6
            } else {
                self.rng.gen_range(0..kinds)
            };
            first = false;
            match choice {
                0 => {
                    let id = self.pick_node(nodes);
                    log(format!("kill-node {id}"));
                    nodes.kill(id).await;
                    self.sleep_ms(200, 1000).await;
                    nodes.start(id)?;
                }
                1 => {
                    while self.commits.try_recv().is_ok() {}
                    let wait = tokio::time::timeout(Duration::from_secs(3), self.commits.recv());
                    if let Ok(Some(txid)) = wait.await {
                        let id = self.topology.coordinator_for(&txid).id;
                        log(format!("kill-after-commit {id} ({txid})"));
                        nodes.kill(id).await;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        nodes.start(id)?;
                    }
                }
                2 => {
                    let id = self.pick_node(nodes);
                    log(format!("pause-node {id}"));
                    nodes.pause(id, true);
                    self.sleep_ms(300, 1500).await;
                    nodes.pause(id, false);
                }
                3 => {
                    let k = self.rng.gen_range(0..workers.len());
                    log(format!("pause-producer {}", workers[k].instance));
                    signal(&workers[k].child, Signal::SIGSTOP);
                    self.sleep_ms(300, 3000).await;
                    signal(&workers[k].child, Signal::SIGCONT);
                }
                4 => {
                    let k = self.rng.gen_range(0..workers.len());
                    log(format!("crash-producer {}", workers[k].instance));
                    let _ = workers[k].child.start_kill();
                    let _ = workers[k].child.wait().await;
                    let next = self.replacement(factory, &workers[k].txid)?;
                    workers[k] = next;
                }
                6 => {
                    cuts += 1;
                    let outage = match cuts {
                        1 => false,
                        2 => true,
                        _ => self.rng.gen_range(0..3) == 0,
                    };
                    // Half the cuts find part of the devices' caches written back (what was
                    // never flushed, in no order), the others none of it.
                    let writeback = self.rng.gen_bool(0.5).then(|| self.rng.gen::<u64>());
                    let cache = if writeback.is_some() {
                        PARTIAL_WRITEBACK
                    } else {
                        ""
                    };
                    if outage {
                        log(format!("power-outage (every node{cache})"));
                        let ids = nodes.ids();
                        nodes.power_cut(&ids, writeback).await?;
                        self.sleep_ms(200, 1000).await;
                        for id in ids {
                            nodes.start(id)?;
                        }
                    } else {
                        // The first cut hits a coordinator: its epochs are what a lost write
                        // would undo (a fenced instance valid again).
                        let id = if cuts == 1 {
                            self.pick_coordinator(nodes)
                        } else {
                            self.pick_node(nodes)
                        };
                        log(format!("power-cut {id}{cache}"));
                        nodes.power_cut(&[id], writeback).await?;
                        self.sleep_ms(200, 1000).await;
                        nodes.start(id)?;
                    }
                }
                _ => {
                    let k = self.rng.gen_range(0..workers.len());
                    // Freeze it inside a transaction that already wrote to every partition
                    // (the worker goes round the partitions), as a GC pause would: its next
                    // write needs no AddPartitionsToTxn and goes straight to a leader.
                    let mut mid = workers[k].mid_txn.clone();
                    let partitions = self.partitions;
                    let wrote_all = mid.wait_for(|n| *n >= partitions);
                    let _ = tokio::time::timeout(Duration::from_secs(2), wrote_all).await;
                    signal(&workers[k].child, Signal::SIGSTOP);
                    log(format!("zombie {}", workers[k].instance));
                    let mut next = self.replacement(factory, &workers[k].txid)?;
                    if let Some(init) = next.init.take() {
                        let _ = tokio::time::timeout(Duration::from_secs(20), init).await;
                    }
                    let old = std::mem::replace(&mut workers[k], next);
                    signal(&old.child, Signal::SIGCONT);
                    zombies.push(old);
                }
            }
            let mean = self.interval.as_millis() as u64;
            self.sleep_ms(mean / 2, mean * 3 / 2 + 1).await;
        }
        Ok(zombies)
    }

    fn pick_node(&mut self, nodes: &Nodes) -> cluster::NodeId {
        let ids = nodes.ids();
        // Coordinators and leaders alike; a node already down is picked again later.
        let mut id = ids[self.rng.gen_range(0..ids.len())];
        for _ in 0..ids.len() {
            if nodes.is_up(id) {
                break;
            }
            id = ids[self.rng.gen_range(0..ids.len())];
        }
        id
    }

    /// A coordinator that is up (any coordinator if none is).
    fn pick_coordinator(&mut self, nodes: &Nodes) -> cluster::NodeId {
        let up: Vec<_> = self
            .topology
            .coordinators
            .iter()
            .map(|c| c.id)
            .filter(|id| nodes.is_up(*id))
            .collect();
        if up.is_empty() {
            return self.pick_node(nodes);
        }
        up[self.rng.gen_range(0..up.len())]
    }

    fn replacement(&mut self, factory: &mut WorkerFactory, txid: &str) -> anyhow::Result<Worker> {
        let generation = self.generations.entry(txid.to_string()).or_insert(0);
        *generation += 1;
        factory.start(txid, *generation)
    }

    async fn sleep_ms(&mut self, low: u64, high: u64) {
        let ms = self.rng.gen_range(low..high.max(low + 1));
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
