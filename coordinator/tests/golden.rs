//! Golden-script tests of the pure core (toydb style): every `testdata/*.txt` file is a
//! scenario of `> command` lines, each followed by the output the core must produce, in the test
//! kit's one format ([`testkit::golden`]). The runner replays the commands against
//! [`coordinator::core`] for one transactional id and compares the whole transcript with the file. `UPDATE_GOLDEN=1 cargo test -p coordinator --test golden`
//! rewrites the files from the actual output (then review the diff).
//!
//! Commands (producers are named handles that, like a real client, adopt the (PID, epoch) of
//! every successful InitProducerId / EndTxn reply):
//! - `init P [timeout=MS] [expected | expected=PID/EPOCH]`: InitProducerId (expected: P's pair)
//! - `add P TOPIC-PART...`, `add-offsets P GROUP`, `commit-offsets P GROUP TOPIC-PART=OFFSET...`
//! - `end P commit|abort`, `verify P TOPIC-PART`
//! - `as P PID/EPOCH`: make handle P hold an arbitrary pair (a zombie, a retry)
//! - `complete`: every pending marker is acknowledged; `tick MS`: advance the clock, run the
//!   timeout scan; `set-epoch E`: jump the stored epoch (to reach exhaustion); `state`
//!
//! Output: `ok (pid P, epoch E)` or `ok` or the error code, then `  persist: <state>` when
//! something was written and `  markers: ...` when markers were emitted.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use cluster::{ProducerId, TopicPartition, Topology};
use coordinator::core::{self, Outcome, ProducerIdAndEpoch, TxnError, TxnMetadata, TxnResult};
use testkit::golden::{run_script, Runner};

testkit::test_each_path! { in "coordinator/testdata" as golden => run }

fn run(path: &Path) {
    run_script(path, |_| Script::new());
}

const ID: &str = "txn";

struct Script {
    meta: Option<TxnMetadata>,
    producers: BTreeMap<String, ProducerIdAndEpoch>,
    next_pid: ProducerId,
    now: i64,
    topology: Topology,
}

fn topology() -> Topology {
    Topology::parse(
        "transaction_state_partitions = 1\n\
         [[coordinators]]\nid = 1\naddress = \"c:1\"\n\
         [[leaders]]\nid = 101\naddress = \"l1:1\"\n\
         [[leaders]]\nid = 102\naddress = \"l2:1\"\n\
         [[topics]]\nname = \"t\"\nleaders = [101, 102, 101]\n",
    )
    .unwrap()
}

fn parse_tp(s: &str) -> TopicPartition {
    let (topic, partition) = s.rsplit_once('-').expect("TOPIC-PART");
    TopicPartition::new(topic, partition.parse().expect("partition"))
}

fn parse_pair(s: &str) -> ProducerIdAndEpoch {
    let (pid, epoch) = s.split_once('/').expect("PID/EPOCH");
    ProducerIdAndEpoch::new(pid.parse().unwrap(), epoch.parse().unwrap())
}

fn code(e: &TxnError) -> &'static str {
    e.name()
}

fn describe(m: &TxnMetadata) -> String {
    let mut s = format!(
        "{} pid={} epoch={} last_epoch={}",
        m.state, m.producer_id, m.producer_epoch, m.last_epoch
    );
    if m.previous_producer_id != -1 {
        write!(s, " previous_pid={}", m.previous_producer_id).unwrap();
    }
    if m.next_producer_id != -1 {
        write!(s, " next_pid={}", m.next_producer_id).unwrap();
    }
    if !m.partitions.is_empty() {
        let parts: Vec<String> = m.partitions.iter().map(|tp| tp.to_string()).collect();
        write!(s, " partitions=[{}]", parts.join(",")).unwrap();
    }
    for (g, offsets) in &m.groups {
        let o: Vec<String> = offsets.iter().map(|(tp, o)| format!("{tp}={o}")).collect();
        write!(s, " group {g}={{{}}}", o.join(",")).unwrap();
    }
    if m.timed_out {
        s += " timed_out";
    }
    s
}

impl Script {
    fn new() -> Self {
        Self {
            meta: None,
            producers: BTreeMap::new(),
            next_pid: 1000,
            now: 0,
            topology: topology(),
        }
    }

    fn producer(&self, name: &str) -> ProducerIdAndEpoch {
        self.producers
            .get(name)
            .copied()
            .unwrap_or(ProducerIdAndEpoch::new(-1, -1))
    }

    /// Runs `step`, giving it a fresh PID if it asks for one, and records the outcome.
    fn run(
        &mut self,
        out: &mut String,
        adopt: Option<&str>,
        show_pair: bool,
        step: impl Fn(&Self, Option<ProducerId>) -> Outcome,
    ) {
        let mut outcome = step(self, None);
        if outcome.reply == Err(TxnError::NeedProducerId) {
            outcome = step(self, Some(self.next_pid));
            self.next_pid += 1;
        }
        match &outcome.reply {
            Ok(pair) if show_pair => writeln!(out, "ok {pair}").unwrap(),
            Ok(_) => writeln!(out, "ok").unwrap(),
            Err(e) => writeln!(out, "{}", code(e)).unwrap(),
        }
        if let (Ok(pair), Some(name)) = (&outcome.reply, adopt) {
            self.producers.insert(name.to_string(), *pair);
        }
        if let Some(m) = &outcome.persist {
            writeln!(out, "  persist: {}", describe(m)).unwrap();
            self.meta = Some(m.clone());
        }
        if let Some(job) = &outcome.markers {
            let mut line = format!("  markers: {:?} {}", job.result, job.identity);
            for (leader, parts) in job.partitions_by_leader(&self.topology) {
                let parts: Vec<String> = parts.iter().map(|tp| tp.to_string()).collect();
                write!(
                    line,
                    " leader {}=[{}]",
                    leader.unwrap_or(-1),
                    parts.join(",")
                )
                .unwrap();
            }
            for (g, offsets) in &job.groups {
                let o: Vec<String> = offsets.iter().map(|(tp, o)| format!("{tp}={o}")).collect();
                write!(line, " group {g}={{{}}}", o.join(",")).unwrap();
            }
            writeln!(out, "{line}").unwrap();
        }
    }

    fn command(&mut self, line: &str, out: &mut String) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (cmd, args) = words.split_first().expect("a command");
        let now = self.now;
        match *cmd {
            "init" => {
                let name = args[0].to_string();
                let mut timeout = 60_000;
                let mut expected = None;
                for a in &args[1..] {
                    if let Some(t) = a.strip_prefix("timeout=") {
                        timeout = t.parse().unwrap();
                    } else if let Some(p) = a.strip_prefix("expected=") {
                        expected = Some(parse_pair(p));
                    } else if *a == "expected" {
                        expected = Some(self.producer(&name));
                    } else {
                        panic!("init: unknown argument {a}");
                    }
                }
                self.run(out, Some(&name), true, |s, pid| {
                    core::init_producer_id(ID, s.meta.as_ref(), timeout, expected, now, pid)
                });
            }
            "as" => {
                self.producers
                    .insert(args[0].to_string(), parse_pair(args[1]));
                writeln!(out, "ok").unwrap();
            }
            "add" => {
                let caller = self.producer(args[0]);
                let parts: Vec<TopicPartition> = args[1..].iter().map(|a| parse_tp(a)).collect();
                self.run(out, None, false, |s, _| {
                    core::add_partitions(ID, s.meta.as_ref(), caller, &parts, &s.topology, now)
                });
            }
            "add-offsets" => {
                let caller = self.producer(args[0]);
                let group = args[1].to_string();
                self.run(out, None, false, |s, _| {
                    core::add_offsets(ID, s.meta.as_ref(), caller, &group, now)
                });
            }
            "commit-offsets" => {
                let caller = self.producer(args[0]);
                let group = args[1].to_string();
                let offsets: Vec<(TopicPartition, i64)> = args[2..]
                    .iter()
                    .map(|a| {
                        let (tp, o) = a.split_once('=').expect("TOPIC-PART=OFFSET");
                        (parse_tp(tp), o.parse().unwrap())
                    })
                    .collect();
                self.run(out, None, false, |s, _| {
                    core::txn_offset_commit(
                        ID,
                        s.meta.as_ref(),
                        caller,
                        &group,
                        &offsets,
                        &s.topology,
                        now,
                    )
                });
            }
            "end" => {
                let name = args[0].to_string();
                let caller = self.producer(&name);
                let result = match args[1] {
                    "commit" => TxnResult::Commit,
                    "abort" => TxnResult::Abort,
                    other => panic!("end: {other}"),
                };
                self.run(out, Some(&name), true, |s, pid| {
                    core::end_txn(ID, s.meta.as_ref(), caller, result, now, pid)
                });
            }
            "verify" => {
                let caller = self.producer(args[0]);
                let tp = parse_tp(args[1]);
                match core::verify_transaction(ID, self.meta.as_ref(), caller, &tp) {
                    Ok(_) => writeln!(out, "ok").unwrap(),
                    Err(e) => writeln!(out, "{}", code(&e)).unwrap(),
                }
            }
            "complete" => {
                let job = self.meta.as_ref().and_then(|m| m.pending_markers());
                match job {
                    None => writeln!(out, "nothing pending").unwrap(),
                    Some(job) => self.run(out, None, true, |s, _| {
                        core::complete_markers(s.meta.as_ref().unwrap(), &job, now)
                    }),
                }
            }
            "tick" => {
                self.now += args[0].parse::<i64>().unwrap();
                let now = self.now;
                let expired = self
                    .meta
                    .as_ref()
                    .is_some_and(|m| core::is_timed_out(m, now));
                if !expired {
                    writeln!(out, "now={now}: nothing timed out").unwrap();
                } else {
                    write!(out, "now={now}: timed out -> ").unwrap();
                    self.run(out, None, true, |s, pid| {
                        core::expire_timed_out(s.meta.as_ref().unwrap(), now, pid).unwrap()
                    });
                }
            }
            "set-epoch" => {
                let m = self.meta.as_mut().expect("an id");
                m.producer_epoch = args[0].parse().unwrap();
                m.last_epoch = -1;
                writeln!(out, "  stored: {}", describe(m)).unwrap();
            }
            "state" => match &self.meta {
                None => writeln!(out, "unknown").unwrap(),
                Some(m) => writeln!(out, "{}", describe(m)).unwrap(),
            },
            other => panic!("unknown command {other:?}"),
        }
    }
}

impl Runner for Script {
    fn run(&mut self, command: &str) -> String {
        let mut out = String::new();
        self.command(command, &mut out);
        out
    }
}
