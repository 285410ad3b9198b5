//! The story of [`super`], one method per numbered step of its module docs, on a [`Tale`] that
//! carries what the steps share: the client settings, the partitions, the values written (and
//! whether read_committed may show them) and the checker's verdicts. May touch: the embedded
//! cluster (through clients only), the story's output.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use producer_client::{
    ClientConfig, Consumer, ConsumerRecord, Error, Isolation, RawRequests, TopicPartition,
    TransactionalProducer,
};

use super::timeline::{Kind, Timeline};
use super::{
    wait_settled, Check, DemoOptions, DemoSummary, RecordCounts, Story, ZombieRequest, TOPIC,
    TXN_ID,
};
use crate::embedded::EmbeddedCluster;

/// The story's state as it is told: the client settings, the partitions, the checker's verdicts
/// so far, and every value written with whether read_committed may show it. Each method is one
/// numbered step of the module docs.
struct Tale<'a> {
    cluster: &'a EmbeddedCluster,
    options: &'a DemoOptions,
    story: &'a mut Story,
    config: ClientConfig,
    partitions: Vec<TopicPartition>,
    checks: Vec<Check>,
    /// Values of committed transactions, with their partition, in the order written.
    committed: Vec<(TopicPartition, String)>,
    /// Values of A's aborted transaction and of its zombie writes.
    must_not_see: Vec<String>,
    /// The picture of what happened (`--timeline`).
    timeline: Timeline,
    /// The coordinator's lane name.
    coordinator: String,
    /// Each partition's leader's lane name, by partition.
    leaders: Vec<String>,
}

/// Tells the story (steps 1 to 7), then checks it (step 8) and gives the verdict; the timeline
/// of what happened beside it.
pub(super) async fn story_and_check(
    cluster: &EmbeddedCluster,
    options: &DemoOptions,
    story: &mut Story,
) -> anyhow::Result<(DemoSummary, Timeline)> {
    let topology = cluster.topology();
    let coordinator = format!("coordinator {}", cluster.coordinator_for(TXN_ID));
    let leaders: Vec<String> = (0..3)
        .map(|p| {
            topology
                .leader_for(TOPIC, p)
                .map_or_else(|| "leader ?".to_string(), |n| format!("leader {}", n.id))
        })
        .collect();
    let mut timeline = Timeline::new();
    for lane in ["instance A", "instance B", coordinator.as_str()] {
        timeline.lane(lane);
    }
    let mut sorted = leaders.clone();
    sorted.sort();
    for lane in &sorted {
        timeline.lane(lane);
    }
    let mut tale = Tale {
        cluster,
        options,
        story,
        config: cluster
            .client_config()
            .with_transactional_id(TXN_ID)
            .with_request_timeout(Duration::from_secs(5)),
        partitions: (0..3).map(|p| TopicPartition::new(TOPIC, p)).collect(),
        checks: Vec::new(),
        committed: Vec::new(),
        must_not_see: Vec::new(),
        timeline,
        coordinator,
        leaders,
    };
    let mut a = tale.a_starts().await?;
    let a_pid = a.producer_id();
    let mut a_epochs = vec![a.epoch()];
    tale.a_commits(&mut a, &mut a_epochs).await?;
    let zombie = tale.a_stalls(&mut a).await?;
    let mut b = tale.b_starts(a_pid, zombie.1).await?;
    let (b_pid, b_epoch) = (b.producer_id(), b.epoch());
    let b_values = tale.b_writes(&mut b).await?;
    let fenced = tale.a_wakes_up(&mut a, zombie).await?;
    let b_after_commit = tale.b_commits(&mut b, b_values).await?;
    let records = tale.verify().await?;
    let passed = tale.verdict();
    let timeline = std::mem::take(&mut tale.timeline);
    let summary = DemoSummary {
        passed,
        transactional_id: TXN_ID.to_string(),
        a_pid,
        a_epochs,
        b_pid,
        b_epoch,
        b_after_commit,
        fenced_errors: fenced,
        records,
        checks: tale.checks,
        unsafe_skip_epoch_check: options.unsafe_skip_epoch_check,
    };
    Ok((summary, timeline))
}

const A: &str = "instance A";
const B: &str = "instance B";

impl Tale<'_> {
    /// Draws `who`'s Produce to each of `partitions` at `epoch`.
    fn draw_produce(&mut self, who: &str, partitions: &[TopicPartition], epoch: i16) {
        for tp in partitions {
            let leader = self.leaders[tp.partition as usize].clone();
            let label = format!("Produce {tp} (epoch {epoch}) -> ok");
            self.timeline.arrow(who, &leader, label, Kind::Request);
        }
    }

    /// Draws the markers of a transaction ended at `epoch` on `partitions`.
    fn draw_markers(&mut self, partitions: &[TopicPartition], label: &str, kind: Kind) {
        let coordinator = self.coordinator.clone();
        for tp in partitions {
            let leader = self.leaders[tp.partition as usize].clone();
            self.timeline
                .arrow(&coordinator, &leader, format!("{label} {tp}"), kind);
        }
    }

    /// Records one of the checker's verdicts (`detail` is kept only for a failure).
    fn check(&mut self, name: &str, ok: bool, detail: String) {
        self.checks.push(Check {
            name: name.to_string(),
            ok,
            detail: if ok { String::new() } else { detail },
        });
    }

    /// Step 1: A initialises.
    async fn a_starts(&mut self) -> anyhow::Result<TransactionalProducer> {
        self.story
            .step("Instance A starts: FindCoordinator, then InitProducerId(\"demo-app\")");
        let mut a = TransactionalProducer::connect(self.config.clone()).await?;
        a.init_transactions().await?;
        let coordinator = self.coordinator.clone();
        self.timeline
            .arrow(A, &coordinator, "InitProducerId(demo-app)", Kind::Request);
        self.timeline.arrow(
            &coordinator,
            A,
            format!("PID {}, epoch {}", a.producer_id(), a.epoch()),
            Kind::Reply,
        );
        self.story.say(format!(
            "A got PID {} at epoch {}",
            a.producer_id(),
            a.epoch()
        ));
        self.check(
            "a new transactional id starts at epoch 0",
            a.epoch() == 0,
            format!("epoch {}", a.epoch()),
        );
        Ok(a)
    }

    /// Step 2: A commits some transactions.
    async fn a_commits(
        &mut self,
        a: &mut TransactionalProducer,
        a_epochs: &mut Vec<i16>,
    ) -> anyhow::Result<()> {
        let options = self.options;
        self.story.step(format!(
            "A commits {} transactions, {} records to each partition of {TOPIC:?} in each",
            options.committed_transactions, options.records_per_partition
        ));
        for t in 0..options.committed_transactions {
            a.begin_transaction()?;
            let mut values = Vec::new();
            for tp in &self.partitions {
                for r in 0..options.records_per_partition {
                    let value = format!("A-txn{t}-{tp}-r{r}");
                    a.send_and_wait(TOPIC, tp.partition, value.clone()).await?;
                    values.push((tp.clone(), value));
                }
            }
            let before = a.epoch();
            a.commit_transaction().await?;
            self.committed.extend(values);
            a_epochs.push(a.epoch());
            let coordinator = self.coordinator.clone();
            let partitions = self.partitions.clone();
            self.timeline.arrow(
                A,
                &coordinator,
                format!("AddPartitionsToTxn x3 (epoch {before})"),
                Kind::Request,
            );
            self.draw_produce(A, &partitions, before);
            self.timeline.arrow(
                A,
                &coordinator,
                format!("EndTxn(COMMIT, epoch {before})"),
                Kind::Request,
            );
            self.timeline.arrow(
                &coordinator,
                A,
                format!("OK, epoch {}", a.epoch()),
                Kind::Reply,
            );
            self.draw_markers(
                &partitions,
                &format!("COMMIT (epoch {})", a.epoch()),
                Kind::Marker,
            );
            self.story.say(format!(
                "txn {t}: AddPartitionsToTxn x3, Produce x{}, EndTxn(COMMIT) -> committed; epoch {before} -> {}",
                3 * options.records_per_partition,
                a.epoch()
            ));
        }
        Ok(())
    }

    /// Step 3: A opens a transaction and stalls; returns the (PID, epoch) it holds.
    async fn a_stalls(&mut self, a: &mut TransactionalProducer) -> anyhow::Result<(i64, i16)> {
        self.story.step(
            "A opens a transaction, writes to input-0 and input-1 ... and stalls (a long GC pause)",
        );
        a.begin_transaction()?;
        for tp in &self.partitions[..2] {
            let value = format!("A-open-{tp}");
            a.send_and_wait(TOPIC, tp.partition, value.clone()).await?;
            self.must_not_see.push(value);
        }
        let (zombie_pid, zombie_epoch) = (a.producer_id(), a.epoch());
        let coordinator = self.coordinator.clone();
        self.timeline.arrow(
            A,
            &coordinator,
            format!("AddPartitionsToTxn x2 (epoch {zombie_epoch})"),
            Kind::Request,
        );
        let open = self.partitions[..2].to_vec();
        self.draw_produce(A, &open, zombie_epoch);
        self.timeline
            .note(A, format!("GC pause: A still holds epoch {zombie_epoch}"));
        self.story.say(format!(
            "A holds (PID {zombie_pid}, epoch {zombie_epoch}); its transaction is Ongoing on input-0, input-1"
        ));
        Ok((zombie_pid, zombie_epoch))
    }

    /// Step 4: B starts with the same id.
    async fn b_starts(
        &mut self,
        a_pid: i64,
        zombie_epoch: i16,
    ) -> anyhow::Result<TransactionalProducer> {
        self.story
            .step("Instance B starts with the same transactional id: InitProducerId(\"demo-app\")");
        let mut b = TransactionalProducer::connect(self.config.clone()).await?;
        b.init_transactions().await?;
        let (b_pid, b_epoch) = (b.producer_id(), b.epoch());
        let coordinator = self.coordinator.clone();
        let fence_epoch = zombie_epoch.saturating_add(1);
        self.timeline
            .arrow(B, &coordinator, "InitProducerId(demo-app)", Kind::Request);
        self.timeline.note(
            &coordinator,
            format!("A's transaction is Ongoing: bump to epoch {fence_epoch}, PrepareAbort"),
        );
        let open = self.partitions[..2].to_vec();
        self.draw_markers(
            &open,
            &format!("ABORT (epoch {fence_epoch}) fences A on"),
            Kind::Fence,
        );
        self.timeline.arrow(
            &coordinator,
            B,
            format!("PID {b_pid}, epoch {b_epoch} (CompleteAbort, bumped again)"),
            Kind::Reply,
        );
        self.story.say(format!(
            "B got PID {b_pid} at epoch {b_epoch}: the same PID, a higher epoch"
        ));
        self.story
            .say("the coordinator aborted A's open transaction (ABORT markers with the new epoch)");
        if b_pid == a_pid && b_epoch == zombie_epoch.saturating_add(2) {
            self.story.say(format!(
                "why +2: epoch {fence_epoch} was spent fencing A (its open transaction was aborted with markers at {fence_epoch}, so no request at {zombie_epoch} is accepted any more); B's InitProducerId, retried once that abort completed, bumped once more to {b_epoch}"
            ));
        }
        self.check(
            "the second instance gets the same PID",
            b_pid == a_pid,
            format!("A {a_pid}, B {b_pid}"),
        );
        self.check(
            "the second instance gets a higher epoch",
            b_epoch > zombie_epoch,
            format!("A {zombie_epoch}, B {b_epoch}"),
        );
        Ok(b)
    }

    /// Step 5: B opens its transaction; returns what it wrote (committed in step 7).
    async fn b_writes(
        &mut self,
        b: &mut TransactionalProducer,
    ) -> anyhow::Result<Vec<(TopicPartition, String)>> {
        self.story
            .step("B opens a transaction and writes to every partition of input");
        b.begin_transaction()?;
        let coordinator = self.coordinator.clone();
        let partitions = self.partitions.clone();
        self.timeline.arrow(
            B,
            &coordinator,
            format!("AddPartitionsToTxn x3 (epoch {})", b.epoch()),
            Kind::Request,
        );
        self.draw_produce(B, &partitions, b.epoch());
        let mut b_values = Vec::new();
        for tp in &self.partitions {
            for r in 0..self.options.records_per_partition {
                let value = format!("B-{tp}-r{r}");
                b.send_and_wait(TOPIC, tp.partition, value.clone()).await?;
                b_values.push((tp.clone(), value));
            }
        }
        Ok(b_values)
    }

    /// Step 6: A wakes up: its requests (each must be rejected), then its own library's reaction.
    async fn a_wakes_up(
        &mut self,
        a: &mut TransactionalProducer,
        zombie: (i64, i16),
    ) -> anyhow::Result<Vec<ZombieRequest>> {
        self.story.step(format!(
            "A wakes up and carries on with (PID {}, epoch {})",
            zombie.0, zombie.1
        ));
        let fenced = self.zombie_requests(a, zombie).await?;
        let all_rejected = fenced.iter().all(|z| z.rejected);
        self.check(
            "every request of the fenced instance is rejected",
            all_rejected,
            fenced
                .iter()
                .filter(|z| !z.rejected)
                .map(|z| z.request.clone())
                .collect::<Vec<_>>()
                .join("; "),
        );
        self.zombie_aborts(a).await;
        Ok(fenced)
    }

    /// Step 6's requests, at a leader A wrote to, a leader it never wrote to, and the
    /// coordinator; each answer is told and returned.
    async fn zombie_requests(
        &mut self,
        a: &mut TransactionalProducer,
        (zombie_pid, zombie_epoch): (i64, i16),
    ) -> anyhow::Result<Vec<ZombieRequest>> {
        let raw = RawRequests::new(self.config.clone())?;
        let mut fenced = Vec::new();
        // Produce at a leader A wrote to, next sequence: through A's own client.
        let value = "A-zombie-input-0".to_string();
        self.must_not_see.push(value.clone());
        let r = a.send_and_wait(TOPIC, 0, value).await.map(|_| ());
        let (l0, l2, c) = (
            self.leaders[0].clone(),
            self.leaders[2].clone(),
            self.coordinator.clone(),
        );
        self.draw_zombie(&l0, &format!("Produce input-0 (epoch {zombie_epoch})"), &r);
        fenced.push(self.zombie_answer("Produce input-0 at its leader (A's own client)", r));
        // Produce at a partition A never wrote to.
        let value = "A-zombie-input-2".to_string();
        self.must_not_see.push(value.clone());
        let r = raw
            .produce(
                &self.partitions[2],
                Some(TXN_ID),
                zombie_pid,
                zombie_epoch,
                0,
                vec![value.into_bytes()],
            )
            .await
            .map(|_| ());
        self.draw_zombie(&l2, &format!("Produce input-2 (epoch {zombie_epoch})"), &r);
        fenced.push(self.zombie_answer("Produce input-2 at its leader (never written by A)", r));
        let r = raw
            .add_partitions(TXN_ID, zombie_pid, zombie_epoch, &self.partitions[2..])
            .await;
        self.draw_zombie(
            &c,
            &format!("AddPartitionsToTxn(input-2) (epoch {zombie_epoch})"),
            &r,
        );
        fenced.push(self.zombie_answer("AddPartitionsToTxn(input-2) at the coordinator", r));
        let r = raw
            .end_txn(TXN_ID, zombie_pid, zombie_epoch, true)
            .await
            .map(|_| ());
        self.draw_zombie(&c, &format!("EndTxn(COMMIT, epoch {zombie_epoch})"), &r);
        fenced.push(self.zombie_answer("EndTxn(COMMIT) at the coordinator", r));
        Ok(fenced)
    }

    /// Draws one zombie request to `to` and its answer.
    fn draw_zombie(&mut self, to: &str, request: &str, result: &Result<(), Error>) {
        self.timeline.arrow(A, to, request, Kind::Request);
        match result {
            Ok(()) => self
                .timeline
                .arrow(to, A, "ACCEPTED (fencing is broken!)", Kind::Reply),
            Err(e) => self.timeline.arrow(to, A, e.code_name(), Kind::Rejected),
        }
    }

    /// Tells one zombie request's answer.
    fn zombie_answer(&self, request: &str, result: Result<(), Error>) -> ZombieRequest {
        let (outcome, rejected) = match &result {
            Ok(()) => ("ACCEPTED".to_string(), false),
            Err(e) => (e.code_name().to_string(), true),
        };
        self.story.say(format!(
            "{request:<58} -> {}",
            if rejected {
                format!("rejected: {outcome}")
            } else {
                "ACCEPTED (fencing is broken!)".into()
            }
        ));
        ZombieRequest {
            request: request.to_string(),
            outcome,
            rejected,
        }
    }

    /// A's application reacts as it should: abort. That is fenced too, fatal, and sticky.
    async fn zombie_aborts(&mut self, a: &mut TransactionalProducer) {
        let zombie_epoch = a.epoch();
        let abort = a.abort_transaction().await;
        let abort_fatal = matches!(&abort, Err(e) if e.is_fatal());
        let coordinator = self.coordinator.clone();
        self.draw_zombie(
            &coordinator,
            &format!("EndTxn(ABORT, epoch {zombie_epoch})"),
            &abort,
        );
        self.story.say(format!(
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
        self.story.say(format!(
            "A's producer is now unusable: begin_transaction -> {}",
            match &sticky {
                Ok(()) => "accepted".to_string(),
                Err(e) => e.code_name().to_string(),
            }
        ));
        self.check(
            "the fenced producer's library reports PRODUCER_FENCED, fatal and sticky",
            abort_fatal && matches!(&sticky, Err(e) if e.is_fatal()),
            format!("abort: {abort:?}, begin: {sticky:?}"),
        );
    }

    /// Step 7: B commits; waits until the markers are written. Returns B's (PID, epoch) after.
    async fn b_commits(
        &mut self,
        b: &mut TransactionalProducer,
        b_values: Vec<(TopicPartition, String)>,
    ) -> anyhow::Result<(i64, i16)> {
        self.story.step("B commits");
        let before = b.epoch();
        b.commit_transaction().await?;
        self.committed.extend(b_values);
        let b_after_commit = (b.producer_id(), b.epoch());
        let coordinator = self.coordinator.clone();
        let partitions = self.partitions.clone();
        self.timeline.arrow(
            B,
            &coordinator,
            format!("EndTxn(COMMIT, epoch {before})"),
            Kind::Request,
        );
        self.timeline.arrow(
            &coordinator,
            B,
            format!("OK, epoch {}", b.epoch()),
            Kind::Reply,
        );
        self.draw_markers(
            &partitions,
            &format!("COMMIT (epoch {})", b.epoch()),
            Kind::Marker,
        );
        self.story.say(format!(
            "EndTxn(COMMIT) answered once PrepareCommit was durable; B now holds (PID {}, epoch {})",
            b_after_commit.0, b_after_commit.1
        ));
        // The COMMIT markers reach the leaders a moment after EndTxn answers (as in Kafka): wait
        // for CompleteCommit and for every partition to settle (LSO == high watermark).
        let settled = wait_settled(self.cluster, &self.partitions).await;
        self.story.say(match &settled {
            Ok(()) => {
                "COMMIT markers written to every partition: the transaction is CompleteCommit"
                    .to_string()
            }
            Err(e) => format!("the commit did not complete: {e}"),
        });
        self.check(
            "B's commit completes (markers written everywhere)",
            settled.is_ok(),
            settled.err().unwrap_or_default(),
        );
        Ok(b_after_commit)
    }

    /// Step 8: Reads every partition from the beginning, read_committed and read_uncommitted, and
    /// checks what read_committed saw against what was written.
    async fn verify(&mut self) -> anyhow::Result<RecordCounts> {
        self.story.step(
            "Checking with a read_committed consumer (from the beginning of every partition)",
        );
        let mut consumer = Consumer::new(self.cluster.client_config(), Isolation::ReadCommitted)?;
        consumer.assign(self.partitions.clone());
        let seen = consumer.read_to_end(Duration::from_secs(20)).await?;
        let mut raw_consumer =
            Consumer::new(self.cluster.client_config(), Isolation::ReadUncommitted)?;
        raw_consumer.assign(self.partitions.clone());
        let all = raw_consumer.read_to_end(Duration::from_secs(20)).await?;
        let all_values: Vec<String> = all
            .iter()
            .map(|r| String::from_utf8_lossy(&r.value).to_string())
            .collect();
        let read = Read::of(&seen);
        let records = self.count(&read, all_values.len());
        let in_order = self.in_order(&read);
        self.story.say(format!(
            "committed {} records; read_committed saw {} ({} duplicated, {} missing, {} of A's aborted/zombie records); {} aborted records in the log were hidden",
            records.committed, records.visible, records.duplicated, records.missing, records.aborted_visible, records.hidden
        ));
        self.record_checks(&records, &read, in_order, &all_values);
        Ok(records)
    }

    /// How many committed records read_committed missed or duplicated, and how many of A's
    /// records it showed; `log_len` records were in the log (read_uncommitted).
    fn count(&self, read: &Read, log_len: usize) -> RecordCounts {
        let mut records = RecordCounts {
            committed: self.committed.len(),
            visible: read.len,
            ..RecordCounts::default()
        };
        for (_, v) in &self.committed {
            match read.counts.get(v).copied().unwrap_or(0) {
                0 => records.missing += 1,
                1 => {}
                n => records.duplicated += n - 1,
            }
        }
        records.aborted_visible = self
            .must_not_see
            .iter()
            .map(|v| read.counts.get(v).copied().unwrap_or(0))
            .sum();
        records.hidden = log_len.saturating_sub(read.len);
        records
    }

    /// Whether every partition shows its committed values in the order they were written.
    fn in_order(&self, read: &Read) -> bool {
        self.partitions.iter().all(|tp| {
            let expected: Vec<&String> = self
                .committed
                .iter()
                .filter(|(p, _)| p == tp)
                .map(|(_, v)| v)
                .collect();
            let got: Vec<&String> = read
                .per_partition
                .get(tp)
                .map(|v| {
                    v.iter()
                        .filter(|v| !self.must_not_see.contains(v))
                        .collect()
                })
                .unwrap_or_default();
            expected == got
        })
    }

    /// Step 8's verdicts.
    fn record_checks(
        &mut self,
        records: &RecordCounts,
        read: &Read,
        in_order: bool,
        all_values: &[String],
    ) {
        self.check(
            "every committed record is visible exactly once",
            records.missing == 0 && records.duplicated == 0,
            format!(
                "{} missing, {} duplicated",
                records.missing, records.duplicated
            ),
        );
        let visible: Vec<&String> = self
            .must_not_see
            .iter()
            .filter(|v| read.counts.contains_key(*v))
            .collect();
        self.check(
            "nothing of A's aborted transaction or zombie writes is visible",
            records.aborted_visible == 0,
            format!("{} visible: {:?}", records.aborted_visible, visible),
        );
        self.check(
            "committed records are read in the order they were written",
            in_order,
            "order differs".into(),
        );
        self.check(
            "A's aborted records are in the log (read_uncommitted) but hidden from read_committed",
            all_values.iter().any(|v| v.starts_with("A-open-")),
            "A's open-transaction records were not found even with read_uncommitted".into(),
        );
    }

    /// The verdict, and every check with its outcome.
    fn verdict(&mut self) -> bool {
        let passed = self.checks.iter().all(|c| c.ok);
        self.story
            .step(format!("Verdict: {}", if passed { "PASS" } else { "FAIL" }));
        let failed = self.checks.iter().filter(|c| !c.ok).count();
        self.timeline.note(
            B,
            format!(
                "read_committed check: {} ({} of {} checks held)",
                if passed { "PASS" } else { "FAIL" },
                self.checks.len() - failed,
                self.checks.len()
            ),
        );
        for c in &self.checks {
            self.story.say(format!(
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
        passed
    }
}

/// What a read_committed read saw: how often each value, each partition's values in order.
struct Read {
    len: usize,
    counts: HashMap<String, usize>,
    per_partition: BTreeMap<TopicPartition, Vec<String>>,
}

impl Read {
    fn of(seen: &[ConsumerRecord]) -> Self {
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut per_partition: BTreeMap<TopicPartition, Vec<String>> = BTreeMap::new();
        for r in seen {
            let v = String::from_utf8_lossy(&r.value).to_string();
            *counts.entry(v.clone()).or_default() += 1;
            per_partition
                .entry(r.partition.clone())
                .or_default()
                .push(v);
        }
        Self {
            len: seen.len(),
            counts,
            per_partition,
        }
    }
}
