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

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use producer_client::{
    Admin, Consumer, Error, Isolation, RawRequests, TopicPartition, TransactionalProducer,
};
use serde::Serialize;

use crate::embedded::{EmbeddedCluster, EmbeddedOptions};

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
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            committed_transactions: 3,
            records_per_partition: 2,
            unsafe_skip_epoch_check: false,
            verbose: true,
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
    step: usize,
}

impl Story {
    fn step(&mut self, text: impl AsRef<str>) {
        self.step += 1;
        if self.verbose {
            println!("\n[{}] {}", self.step, text.as_ref());
        }
    }

    fn say(&self, text: impl AsRef<str>) {
        if self.verbose {
            println!("    {}", text.as_ref());
        }
    }
}

/// Starts an embedded cluster, runs the story, and checks it.
pub async fn run(options: DemoOptions) -> anyhow::Result<DemoSummary> {
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        unsafe_skip_epoch_check: options.unsafe_skip_epoch_check,
        ..EmbeddedOptions::default()
    })
    .await?;
    let mut story = Story {
        verbose: options.verbose,
        step: 0,
    };
    if options.verbose {
        println!("mini-broker fencing demo");
        println!(
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
        );
        println!(
            "  transactional id {TXN_ID:?} is owned by coordinator {}",
            cluster.coordinator_for(TXN_ID)
        );
        if options.unsafe_skip_epoch_check {
            println!("  DANGER: the partition leaders run WITHOUT the epoch check (broken fencing on purpose)");
        }
    }
    let result = story_and_check(&cluster, &options, &mut story).await;
    let _ = cluster.shutdown().await;
    result
}

async fn story_and_check(
    cluster: &EmbeddedCluster,
    options: &DemoOptions,
    story: &mut Story,
) -> anyhow::Result<DemoSummary> {
    let config = cluster
        .client_config()
        .with_transactional_id(TXN_ID)
        .with_request_timeout(Duration::from_secs(5));
    let partitions: Vec<TopicPartition> = (0..3).map(|p| TopicPartition::new(TOPIC, p)).collect();
    let mut checks = Vec::new();
    let mut check = |name: &str, ok: bool, detail: String| {
        checks.push(Check {
            name: name.to_string(),
            ok,
            detail: if ok { String::new() } else { detail },
        });
    };
    // Every value written, and whether it belongs to a committed transaction.
    let mut committed: Vec<(TopicPartition, String)> = Vec::new();
    let mut must_not_see: Vec<String> = Vec::new();

    // 1. A initialises.
    story.step("Instance A starts: FindCoordinator, then InitProducerId(\"demo-app\")");
    let mut a = TransactionalProducer::connect(config.clone()).await?;
    a.init_transactions().await?;
    let a_pid = a.producer_id();
    let mut a_epochs = vec![a.epoch()];
    story.say(format!("A got PID {} at epoch {}", a_pid, a.epoch()));
    check(
        "a new transactional id starts at epoch 0",
        a.epoch() == 0,
        format!("epoch {}", a.epoch()),
    );

    // 2. A commits some transactions.
    story.step(format!(
        "A commits {} transactions, {} records to each partition of {TOPIC:?} in each",
        options.committed_transactions, options.records_per_partition
    ));
    for t in 0..options.committed_transactions {
        a.begin_transaction()?;
        let mut values = Vec::new();
        for tp in &partitions {
            for r in 0..options.records_per_partition {
                let value = format!("A-txn{t}-{tp}-r{r}");
                a.send_and_wait(TOPIC, tp.partition, value.clone()).await?;
                values.push((tp.clone(), value));
            }
        }
        let before = a.epoch();
        a.commit_transaction().await?;
        committed.extend(values);
        a_epochs.push(a.epoch());
        story.say(format!(
            "txn {t}: AddPartitionsToTxn x3, Produce x{}, EndTxn(COMMIT) -> committed; epoch {before} -> {}",
            3 * options.records_per_partition,
            a.epoch()
        ));
    }

    // 3. A opens a transaction and stalls.
    story.step(
        "A opens a transaction, writes to input-0 and input-1 ... and stalls (a long GC pause)",
    );
    a.begin_transaction()?;
    for tp in &partitions[..2] {
        let value = format!("A-open-{tp}");
        a.send_and_wait(TOPIC, tp.partition, value.clone()).await?;
        must_not_see.push(value);
    }
    let (zombie_pid, zombie_epoch) = (a.producer_id(), a.epoch());
    story.say(format!(
        "A holds (PID {zombie_pid}, epoch {zombie_epoch}); its transaction is Ongoing on input-0, input-1"
    ));

    // 4. B starts with the same id.
    story.step("Instance B starts with the same transactional id: InitProducerId(\"demo-app\")");
    let mut b = TransactionalProducer::connect(config.clone()).await?;
    b.init_transactions().await?;
    let (b_pid, b_epoch) = (b.producer_id(), b.epoch());
    story.say(format!(
        "B got PID {b_pid} at epoch {b_epoch}: the same PID, a higher epoch"
    ));
    story.say("the coordinator aborted A's open transaction (ABORT markers with the new epoch)");
    check(
        "the second instance gets the same PID",
        b_pid == a_pid,
        format!("A {a_pid}, B {b_pid}"),
    );
    check(
        "the second instance gets a higher epoch",
        b_epoch > zombie_epoch,
        format!("A {zombie_epoch}, B {b_epoch}"),
    );

    // 5. B opens its transaction.
    story.step("B opens a transaction and writes to every partition of input");
    b.begin_transaction()?;
    let mut b_values = Vec::new();
    for tp in &partitions {
        for r in 0..options.records_per_partition {
            let value = format!("B-{tp}-r{r}");
            b.send_and_wait(TOPIC, tp.partition, value.clone()).await?;
            b_values.push((tp.clone(), value));
        }
    }

    // 6. A wakes up.
    story.step(format!(
        "A wakes up and carries on with (PID {zombie_pid}, epoch {zombie_epoch})"
    ));
    let raw = RawRequests::new(config.clone())?;
    let mut fenced = Vec::new();
    let mut record = |request: String, result: Result<(), Error>, story: &Story| {
        let (outcome, rejected) = match &result {
            Ok(()) => ("ACCEPTED".to_string(), false),
            Err(e) => (e.code_name().to_string(), true),
        };
        story.say(format!(
            "{request:<58} -> {}",
            if rejected {
                format!("rejected: {outcome}")
            } else {
                "ACCEPTED (fencing is broken!)".into()
            }
        ));
        fenced.push(ZombieRequest {
            request,
            outcome,
            rejected,
        });
    };
    // Produce at a leader A wrote to, next sequence: through A's own client.
    let value = "A-zombie-input-0".to_string();
    must_not_see.push(value.clone());
    let r = a.send_and_wait(TOPIC, 0, value).await.map(|_| ());
    record(
        "Produce input-0 at its leader (A's own client)".into(),
        r,
        story,
    );
    // Produce at a partition A never wrote to.
    let value = "A-zombie-input-2".to_string();
    must_not_see.push(value.clone());
    let r = raw
        .produce(
            &partitions[2],
            Some(TXN_ID),
            zombie_pid,
            zombie_epoch,
            0,
            vec![value.into_bytes()],
        )
        .await
        .map(|_| ());
    record(
        "Produce input-2 at its leader (never written by A)".into(),
        r,
        story,
    );
    let r = raw
        .add_partitions(TXN_ID, zombie_pid, zombie_epoch, &partitions[2..])
        .await;
    record(
        "AddPartitionsToTxn(input-2) at the coordinator".into(),
        r,
        story,
    );
    let r = raw
        .end_txn(TXN_ID, zombie_pid, zombie_epoch, true)
        .await
        .map(|_| ());
    record("EndTxn(COMMIT) at the coordinator".into(), r, story);
    // A's application reacts as it should: abort. That is fenced too, and fatal.
    let abort = a.abort_transaction().await;
    let abort_fatal = matches!(&abort, Err(e) if e.is_fatal());
    story.say(format!(
        "A's application aborts: {}",
        match &abort {
            Ok(()) => "accepted (fencing is broken!)".to_string(),
            Err(e) => format!(
                "{} ({})",
                e.code_name(),
                if e.is_fatal() { "fatal" } else { "not fatal" }
            ),
        }
    ));
    let sticky = a.begin_transaction();
    story.say(format!(
        "A's producer is now unusable: begin_transaction -> {}",
        match &sticky {
            Ok(()) => "accepted".to_string(),
            Err(e) => e.code_name().to_string(),
        }
    ));
    let all_rejected = fenced.iter().all(|z| z.rejected);
    check(
        "every request of the fenced instance is rejected",
        all_rejected,
        fenced
            .iter()
            .filter(|z| !z.rejected)
            .map(|z| z.request.clone())
            .collect::<Vec<_>>()
            .join("; "),
    );
    check(
        "the fenced producer's library reports PRODUCER_FENCED, fatal and sticky",
        abort_fatal && matches!(&sticky, Err(e) if e.is_fatal()),
        format!("abort: {abort:?}, begin: {sticky:?}"),
    );

    // 7. B commits.
    story.step("B commits");
    b.commit_transaction().await?;
    committed.extend(b_values);
    let b_after_commit = (b.producer_id(), b.epoch());
    story.say(format!(
        "EndTxn(COMMIT) answered once PrepareCommit was durable; B now holds (PID {}, epoch {})",
        b_after_commit.0, b_after_commit.1
    ));
    // The COMMIT markers reach the leaders a moment after EndTxn answers (as in Kafka): wait
    // for CompleteCommit and for every partition to settle (LSO == high watermark).
    let settled = wait_settled(cluster, &partitions).await;
    story.say(match &settled {
        Ok(()) => "COMMIT markers written to every partition: the transaction is CompleteCommit"
            .to_string(),
        Err(e) => format!("the commit did not complete: {e}"),
    });
    check(
        "B's commit completes (markers written everywhere)",
        settled.is_ok(),
        settled.err().unwrap_or_default(),
    );

    // 8. Verify.
    story.step("Checking with a read_committed consumer (from the beginning of every partition)");
    let mut consumer = Consumer::new(cluster.client_config(), Isolation::ReadCommitted)?;
    consumer.assign(partitions.clone());
    let seen = consumer.read_to_end(Duration::from_secs(20)).await?;
    let mut raw_consumer = Consumer::new(cluster.client_config(), Isolation::ReadUncommitted)?;
    raw_consumer.assign(partitions.clone());
    let all = raw_consumer.read_to_end(Duration::from_secs(20)).await?;

    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut per_partition: BTreeMap<TopicPartition, Vec<String>> = BTreeMap::new();
    for r in &seen {
        let v = String::from_utf8_lossy(&r.value).to_string();
        *counts.entry(v.clone()).or_default() += 1;
        per_partition
            .entry(r.partition.clone())
            .or_default()
            .push(v);
    }
    let mut records = RecordCounts {
        committed: committed.len(),
        visible: seen.len(),
        ..RecordCounts::default()
    };
    for (_, v) in &committed {
        match counts.get(v).copied().unwrap_or(0) {
            0 => records.missing += 1,
            1 => {}
            n => records.duplicated += n - 1,
        }
    }
    records.aborted_visible = must_not_see
        .iter()
        .map(|v| counts.get(v).copied().unwrap_or(0))
        .sum();
    let all_values: Vec<String> = all
        .iter()
        .map(|r| String::from_utf8_lossy(&r.value).to_string())
        .collect();
    records.hidden = all_values.len().saturating_sub(seen.len());
    let in_order = partitions.iter().all(|tp| {
        let expected: Vec<&String> = committed
            .iter()
            .filter(|(p, _)| p == tp)
            .map(|(_, v)| v)
            .collect();
        let got: Vec<&String> = per_partition
            .get(tp)
            .map(|v| v.iter().filter(|v| !must_not_see.contains(v)).collect())
            .unwrap_or_default();
        expected == got
    });
    story.say(format!(
        "committed {} records; read_committed saw {} ({} duplicated, {} missing, {} of A's aborted/zombie records); {} aborted records in the log were hidden",
        records.committed, records.visible, records.duplicated, records.missing, records.aborted_visible, records.hidden
    ));
    check(
        "every committed record is visible exactly once",
        records.missing == 0 && records.duplicated == 0,
        format!(
            "{} missing, {} duplicated",
            records.missing, records.duplicated
        ),
    );
    check(
        "nothing of A's aborted transaction or zombie writes is visible",
        records.aborted_visible == 0,
        format!(
            "{} visible: {:?}",
            records.aborted_visible,
            must_not_see
                .iter()
                .filter(|v| counts.contains_key(*v))
                .collect::<Vec<_>>()
        ),
    );
    check(
        "committed records are read in the order they were written",
        in_order,
        "order differs".into(),
    );
    check(
        "A's aborted records are in the log (read_uncommitted) but hidden from read_committed",
        all_values.iter().any(|v| v.starts_with("A-open-")),
        "A's open-transaction records were not found even with read_uncommitted".into(),
    );

    let passed = checks.iter().all(|c| c.ok);
    story.step(format!("Verdict: {}", if passed { "PASS" } else { "FAIL" }));
    for c in &checks {
        story.say(format!(
            "[{}] {}{}",
            if c.ok { "ok" } else { "FAILED" },
            c.name,
            if c.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.detail)
            }
        ));
    }
    Ok(DemoSummary {
        passed,
        transactional_id: TXN_ID.to_string(),
        a_pid,
        a_epochs,
        b_pid,
        b_epoch,
        b_after_commit,
        fenced_errors: fenced,
        records,
        checks,
        unsafe_skip_epoch_check: options.unsafe_skip_epoch_check,
    })
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
