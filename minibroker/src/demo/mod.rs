//! `minibroker demo`: the seed's story, told and then checked.
//!
//! 1. Instance A of transactional id `demo-app` calls InitProducerId: a new PID at epoch 0.
//! 2. A commits a few transactions across the three partitions of `input` (each EndTxn bumps the
//!    epoch: transaction version 2).
//! 3. A opens a transaction, writes to two partitions and stalls (a simulated GC pause).
//! 4. Instance B starts with the same id: same PID, a higher epoch; the coordinator aborts A's
//!    open transaction.
//! 5. B opens its transaction and writes to every partition.
//! 6. A wakes up. Every request it makes is rejected, and the demo prints each answer: Produce at
//!    a leader it wrote to, Produce at a leader it never wrote to, AddPartitionsToTxn and EndTxn
//!    at the coordinator; A's own library then reports it is fenced, for good.
//! 7. B commits; the demo waits until the COMMIT markers are written (CompleteCommit, and the
//!    last stable offset caught up with the high watermark on every partition).
//! 8. A read_committed consumer reads `input` from the beginning and the checker verifies that
//!    every committed record is there exactly once, in order, and nothing of A's aborted
//!    transaction or of its zombie writes is visible. Verdict; non-zero exit on any failure.
//!
//! With `unsafe_skip_epoch_check` leaders (a hidden flag), step 6's Produce is appended, and the
//! checker must catch it: that is how we know the checker can fail.

use std::time::Duration;

use producer_client::{Admin, TopicPartition};
use serde::Serialize;

use crate::embedded::{EmbeddedCluster, EmbeddedOptions};

mod tale;
pub mod timeline;

use tale::story_and_check;

/// Demo settings.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Transactions A commits before it stalls.
    pub committed_transactions: usize,
    /// Records per partition per transaction.
    pub records_per_partition: usize,
    /// DANGER: run the leaders with the epoch check switched off.
    pub unsafe_skip_epoch_check: bool,
    /// Print the story (the summary is returned either way).
    pub verbose: bool,
    /// Print the story on stderr instead of stdout (`--json`: stdout holds only JSON).
    pub story_on_stderr: bool,
    /// Write the timeline of what happened here, as an SVG sequence diagram.
    pub timeline: Option<std::path::PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            committed_transactions: 3,
            records_per_partition: 2,
            unsafe_skip_epoch_check: false,
            verbose: true,
            story_on_stderr: false,
            timeline: None,
        }
    }
}

/// One rejected (or, if fencing is broken, accepted) zombie request.
#[derive(Clone, Debug, Serialize)]
pub struct ZombieRequest {
    /// Which request, to which service.
    pub request: String,
    /// The error code the service answered with, or `"ACCEPTED"`.
    pub outcome: String,
    /// Whether the request was rejected, as it must be.
    pub rejected: bool,
}

/// A named check and whether it held.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// Details when it did not.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// Record counts the checker found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecordCounts {
    /// Records of committed transactions.
    pub committed: usize,
    /// Records a read_committed consumer saw.
    pub visible: usize,
    /// Committed records seen more than once (extra copies).
    pub duplicated: usize,
    /// Committed records not seen.
    pub missing: usize,
    /// Records of A's aborted transaction, or of its zombie writes, that were visible.
    pub aborted_visible: usize,
    /// Records in the log that read_committed correctly hid (aborted).
    pub hidden: usize,
}

/// What the demo found; `passed` is the verdict.
#[derive(Clone, Debug, Serialize)]
pub struct DemoSummary {
    /// The verdict.
    pub passed: bool,
    /// The transactional id both instances used.
    pub transactional_id: String,
    /// A's PID.
    pub a_pid: i64,
    /// A's epochs, in order (InitProducerId, then after each commit).
    pub a_epochs: Vec<i16>,
    /// B's PID.
    pub b_pid: i64,
    /// B's epoch after InitProducerId.
    pub b_epoch: i16,
    /// B's (PID, epoch) after its commit.
    pub b_after_commit: (i64, i16),
    /// The zombie's requests and what each got.
    pub fenced_errors: Vec<ZombieRequest>,
    /// Record counts.
    pub records: RecordCounts,
    /// Every check.
    pub checks: Vec<Check>,
    /// Whether the leaders ran without the epoch check.
    pub unsafe_skip_epoch_check: bool,
}

const TOPIC: &str = "input";
const TXN_ID: &str = "demo-app";

struct Story {
    verbose: bool,
    on_stderr: bool,
    step: usize,
}

impl Story {
    fn line(&self, text: std::fmt::Arguments<'_>) {
        if !self.verbose {
            return;
        }
        if self.on_stderr {
            eprintln!("{text}");
        } else {
            crate::out::write_line(text);
        }
    }

    fn step(&mut self, text: impl AsRef<str>) {
        self.step += 1;
        self.line(format_args!("\n[{}] {}", self.step, text.as_ref()));
    }

    fn say(&self, text: impl AsRef<str>) {
        self.line(format_args!("    {}", text.as_ref()));
    }
}

/// Starts an embedded cluster, runs the story, checks it, and stops the cluster (its temporary
/// directory is removed).
pub async fn run(options: DemoOptions) -> anyhow::Result<DemoSummary> {
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        unsafe_skip_epoch_check: options.unsafe_skip_epoch_check,
        ..EmbeddedOptions::default()
    })
    .await?;
    let result = run_on(&cluster, &options).await;
    let _ = cluster.shutdown().await;
    result
}

/// Runs the story on a cluster the caller started (and stops): e.g. a test that scrapes the
/// nodes' metrics afterwards. `options.unsafe_skip_epoch_check` only labels the summary here;
/// the cluster's leaders decide.
pub async fn run_on(
    cluster: &EmbeddedCluster,
    options: &DemoOptions,
) -> anyhow::Result<DemoSummary> {
    let mut story = Story {
        verbose: options.verbose,
        on_stderr: options.story_on_stderr,
        step: 0,
    };
    story.line(format_args!("mini-broker fencing demo"));
    {
        story.line(format_args!(
            "  embedded cluster: coordinators {}, leaders {} (data in {})",
            cluster
                .coordinator_ids()
                .iter()
                .map(|id| format!("{id}@{}", cluster.address(*id).unwrap()))
                .collect::<Vec<_>>()
                .join(" "),
            cluster
                .leader_ids()
                .iter()
                .map(|id| format!("{id}@{}", cluster.address(*id).unwrap()))
                .collect::<Vec<_>>()
                .join(" "),
            cluster.dir().display()
        ));
        story.line(format_args!(
            "  transactional id {TXN_ID:?} is owned by coordinator {}",
            cluster.coordinator_for(TXN_ID)
        ));
        if options.unsafe_skip_epoch_check {
            story.line(format_args!("  DANGER: the partition leaders run WITHOUT the epoch check (broken fencing on purpose)"));
        }
    }
    let (summary, timeline) = story_and_check(cluster, options, &mut story).await?;
    if let Some(path) = &options.timeline {
        std::fs::write(path, timeline.to_svg())
            .map_err(|e| anyhow::anyhow!("cannot write the timeline to {}: {e}", path.display()))?;
        story.line(format_args!(
            "\ntimeline of the story written to {}",
            path.display()
        ));
    }
    Ok(summary)
}

/// Waits (bounded) until the demo's transactional id is CompleteCommit and no transaction is
/// open on `partitions` (LSO == high watermark).
async fn wait_settled(
    cluster: &EmbeddedCluster,
    partitions: &[TopicPartition],
) -> Result<(), String> {
    let admin = Admin::new(cluster.client_config()).map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let complete = admin
            .describe_transaction(TXN_ID)
            .await
            .map(|d| d.state == proto::TxnState::CompleteCommit as i32)
            .unwrap_or(false);
        let stable = match admin.end_offsets(TOPIC).await {
            Ok(ends) => partitions
                .iter()
                .all(|tp| ends.get(&tp.partition).is_some_and(|(hw, lso)| hw == lso)),
            Err(_) => false,
        };
        if complete && stable {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "after 20 s: transaction complete {complete}, partitions stable {stable}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
