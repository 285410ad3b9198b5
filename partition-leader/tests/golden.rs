//! Golden scripts for the pure core (toydb's way): each `testdata/*.txt` file is a scenario of
//! `> command` lines, each followed by the output the core must produce, in the test kit's one
//! format ([`testkit::golden`]); `#` starts a comment line. `UPDATE_GOLDEN=1 cargo test -p
//! partition-leader --test golden` rewrites the files from the actual output. Commands:
//! - `produce pid=P epoch=E seq=S n=N [txn] [unverified]`: a Produce batch (`txn` marks it
//!   transactional; verification with the coordinator succeeds unless `unverified`, which stops
//!   at the verification step). Output `ok offset=O [verified]`, `duplicate offset=O`,
//!   `needs-verification`, or the error code.
//! - `marker pid=P epoch=E commit|abort [gen=G]`: output `ok control=O [aborted=F..L]`,
//!   `ok epoch-recorded`, `ok noop`, or the error code.
//! - `offsets`: `hw=H lso=L`.
//! - `producer pid=P`: `epoch=E last_seq=S txn=F|none gen=G window=N` or `none`.
//! - `read committed|uncommitted`: the offsets a fetch from 0 returns.
//!
//! A script with the comment line `# config: unsafe_skip_epoch_check` runs with fencing off.

use std::collections::HashMap;
use std::path::Path;

use partition_leader::core::{
    data_entries, validate_batch, Limits, LogEntry, Marker, PartitionState, ProduceBatch,
    ProduceDecision, Record, Verified,
};
use testkit::golden::{run_script, Runner};

testkit::test_each_path! { in "partition-leader/testdata" as golden => run }

fn run(path: &Path) {
    run_script(path, Leader::new);
}

fn args(words: &[&str]) -> (HashMap<String, i64>, Vec<String>) {
    let mut kv = HashMap::new();
    let mut flags = Vec::new();
    for w in words {
        match w.split_once('=') {
            Some((k, v)) => {
                kv.insert(k.to_string(), v.parse().expect("numeric argument"));
            }
            None => flags.push(w.to_string()),
        }
    }
    (kv, flags)
}

/// A partition's core and the log it would have written.
struct Leader {
    state: PartitionState,
    log: Vec<LogEntry>,
}

impl Leader {
    /// A fresh partition; a script with `# config: unsafe_skip_epoch_check` turns fencing off.
    fn new(script: &str) -> Self {
        let skip = script
            .lines()
            .any(|l| l.trim() == "# config: unsafe_skip_epoch_check");
        Self {
            state: PartitionState::new(skip),
            log: Vec::new(),
        }
    }
}

impl Runner for Leader {
    fn run(&mut self, command: &str) -> String {
        let words: Vec<&str> = command.split_whitespace().collect();
        let (kv, flags) = args(&words[1..]);
        let get = |k: &str| *kv.get(k).unwrap_or_else(|| panic!("missing {k}="));
        let code = |e: partition_leader::Error| e.code().as_str_name().to_string();
        match words[0] {
            "produce" => {
                let txn = flags.iter().any(|f| f == "txn");
                let batch = ProduceBatch {
                    producer_id: get("pid"),
                    producer_epoch: get("epoch") as i32,
                    base_sequence: get("seq") as i32,
                    is_transactional: txn,
                    transactional_id: if txn { "t".into() } else { String::new() },
                    records: (0..get("n"))
                        .map(|_| Record {
                            key: vec![],
                            null_key: false,
                            value: vec![1],
                            null_value: false,
                            timestamp_ms: 0,
                            headers: Vec::new(),
                        })
                        .collect(),
                };
                let limits = Limits {
                    max_batch_bytes: 1 << 20,
                    max_record_bytes: 1 << 20,
                };
                let header = match validate_batch(&limits, &batch) {
                    Ok(h) => h,
                    Err(e) => return code(e),
                };
                let mut verified = None;
                loop {
                    match self.state.check_produce(&header, verified, 0) {
                        Err(e) => return code(e),
                        Ok(ProduceDecision::Duplicate { base_offset }) => {
                            return format!("duplicate offset={base_offset}")
                        }
                        Ok(ProduceDecision::NeedsVerification) => {
                            if flags.iter().any(|f| f == "unverified") {
                                return "needs-verification".into();
                            }
                            verified = Some(Verified::default());
                        }
                        Ok(ProduceDecision::Append(plan)) => {
                            self.state.apply(&plan);
                            self.state.publish(self.state.watermarks());
                            self.log
                                .extend(data_entries(&header, batch.records.clone(), 0));
                            return format!(
                                "ok offset={}{}",
                                plan.base_offset,
                                if verified.is_some() { " verified" } else { "" }
                            );
                        }
                    }
                }
            }
            "marker" => {
                let marker = Marker {
                    producer_id: get("pid"),
                    producer_epoch: get("epoch") as i32,
                    commit: flags.iter().any(|f| f == "commit"),
                    coordinator_id: 1,
                    coordinator_generation: kv.get("gen").copied().unwrap_or(0),
                    transaction_version: if flags.iter().any(|f| f == "v1") {
                        1
                    } else {
                        2
                    },
                    transaction_number: kv.get("txn").copied().unwrap_or(0) as u64,
                };
                match self.state.plan_marker(&marker, 0) {
                    Err(e) => code(e),
                    Ok(plan) => {
                        self.state.apply(&plan);
                        self.state.publish(self.state.watermarks());
                        match (&plan.control, plan.aborted) {
                            (Some(c), aborted) => {
                                self.log.push(LogEntry::Control(c.clone()));
                                match aborted {
                                    Some(a) => format!(
                                        "ok control={} aborted={}..{}",
                                        plan.base_offset, a.first_offset, a.last_offset
                                    ),
                                    None => format!("ok control={}", plan.base_offset),
                                }
                            }
                            (None, _) if plan.is_noop() => "ok noop".into(),
                            (None, _) => "ok epoch-recorded".into(),
                        }
                    }
                }
            }
            "offsets" => format!(
                "hw={} lso={}",
                self.state.high_watermark(),
                self.state.last_stable_offset()
            ),
            "producer" => match self.state.producer(get("pid")) {
                None => "none".into(),
                Some(p) => format!(
                    "epoch={} last_seq={} txn={} gen={} window={}",
                    p.epoch,
                    p.last_sequence().unwrap_or(-1),
                    p.txn_first_offset
                        .map(|o| o.to_string())
                        .unwrap_or_else(|| "none".into()),
                    p.coordinator_generation,
                    p.batches.len()
                ),
            },
            "read" => {
                let committed = flags.iter().any(|f| f == "committed");
                let view = self.state.fetch_view(0, committed).unwrap();
                let offsets: Vec<String> = self
                    .log
                    .iter()
                    .enumerate()
                    .filter(|(o, e)| view.is_visible(*o as i64, e))
                    .map(|(o, _)| o.to_string())
                    .collect();
                format!("[{}]", offsets.join(" "))
            }
            other => panic!("unknown command {other}"),
        }
    }
}
