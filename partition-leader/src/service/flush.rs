//! Group commit at the leader: writes of any partitions are appended to the engine one at a time
//! (each under its partition's write lock, which is then released), and wait here for ONE flush
//! that covers them all. May touch: storage (`flush` only), the flush metrics.
//!
//! Every append takes a ticket ([`GroupFlush::appended`]); a flush round reads the last ticket
//! BEFORE it calls [`Storage::flush`], so the round makes every write up to that ticket durable
//! (sled's flush persists everything applied before it started). A waiter is released when a
//! round covering its ticket completes. At most one round runs at a time; the writes that arrive
//! during a round are covered by the next one, so under load each flush carries many writes, and
//! a lone writer pays one flush as before.
//!
//! Rounds run on blocking threads: the writer that finds no round running flushes on its own
//! blocking thread right after its append ([`GroupFlush::lead`]); waiters that find one running
//! ask for another, which the running thread or a new blocking task performs.
//!
//! A failed round fails the waiters it covered that were waiting when it ran (their writes are
//! not acknowledged; the engine may still persist them later, as in Kafka). Nothing retries a
//! failed round by itself: the next waiter starts a new one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cluster::metrics::Metrics;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::storage::Storage;

/// What the rounds have done so far.
#[derive(Clone, Debug, Default)]
struct Rounds {
    /// Completed rounds.
    completed: u64,
    /// Every ticket up to this one is durable.
    durable: u64,
    /// The last failed round: its number, the last ticket it covered, the error.
    failure: Option<(u64, u64, String)>,
}

/// The leader's group commit (see the module docs).
pub(crate) struct GroupFlush {
    storage: Arc<dyn Storage>,
    metrics: Metrics,
    /// Tickets handed out (the last append's ticket).
    tickets: AtomicU64,
    /// Records appended since the last round began (for the group-commit size metric).
    records: AtomicU64,
    /// A round is running or about to.
    running: AtomicBool,
    /// A waiter asked for a round since the last round began.
    requested: AtomicBool,
    rounds: watch::Sender<Rounds>,
}

impl GroupFlush {
    pub(crate) fn new(storage: Arc<dyn Storage>, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            storage,
            metrics,
            tickets: AtomicU64::new(0),
            records: AtomicU64::new(0),
            running: AtomicBool::new(false),
            requested: AtomicBool::new(false),
            rounds: watch::Sender::new(Rounds::default()),
        })
    }

    /// Counts a write the engine now holds (call after [`Storage::append`] returned); returns its
    /// ticket for [`GroupFlush::durable`].
    pub(crate) fn appended(&self, records: usize) -> u64 {
        self.records.fetch_add(records as u64, Ordering::SeqCst);
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The last ticket handed out: waiting for it covers everything appended so far (a
    /// duplicate or a repeated marker is answered only once what it repeats is durable).
    pub(crate) fn latest(&self) -> u64 {
        self.tickets.load(Ordering::SeqCst)
    }

    /// Waits until a flush covered `ticket`; the error if the round that covered it failed.
    pub(crate) async fn durable(self: &Arc<Self>, ticket: u64) -> Result<()> {
        let mut rounds = self.rounds.subscribe();
        let seen = {
            let now = rounds.borrow_and_update();
            if now.durable >= ticket {
                return Ok(());
            }
            now.completed
        };
        self.start();
        let outcome = rounds
            .wait_for(|r| {
                r.durable >= ticket
                    || r.failure
                        .as_ref()
                        .is_some_and(|(round, last, _)| *round > seen && *last >= ticket)
            })
            .await
            .map_err(|_| Error::Internal("the flush rounds stopped".into()))?
            .clone();
        if outcome.durable >= ticket {
            return Ok(());
        }
        let message = outcome.failure.map(|(_, _, e)| e).unwrap_or_default();
        Err(Error::Storage(format!("flush failed: {message}")))
    }

    /// Asks for a round, and starts one on the blocking pool unless one is running (it then
    /// runs another round for this request before it stops).
    fn start(self: &Arc<Self>) {
        self.requested.store(true, Ordering::SeqCst);
        if !self.running.swap(true, Ordering::SeqCst) {
            self.hand_on();
        }
    }

    /// Called by a writer on its blocking thread right after its append: if no round is running,
    /// runs ONE round here (a lone writer pays one flush and no extra thread hop), then hands
    /// further rounds to the blocking pool.
    pub(crate) fn lead(self: &Arc<Self>) {
        if !self.running.swap(true, Ordering::SeqCst) {
            self.run_rounds(1);
        }
    }

    /// Continues the rounds on a blocking thread of the runtime (in place without a runtime).
    fn hand_on(self: &Arc<Self>) {
        let this = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || this.run_rounds(usize::MAX));
            }
            Err(_) => this.run_rounds(usize::MAX),
        }
    }

    /// Runs rounds on this thread (the caller holds `running`) while tickets are uncovered, at
    /// most `limit`; then releases `running`, handing on if a waiter asked meanwhile (it may have
    /// seen `running` still set and started nothing). After a failure, rounds run again only for
    /// waiters that asked since.
    fn run_rounds(self: &Arc<Self>, limit: usize) {
        let mut done = 0;
        loop {
            self.requested.store(false, Ordering::SeqCst);
            let target = self.tickets.load(Ordering::SeqCst);
            let durable = self.rounds.borrow().durable;
            let mut flushed = true;
            if target > durable {
                flushed = self.round(target, durable);
                done += 1;
                if flushed && done < limit {
                    continue;
                }
            }
            self.running.store(false, Ordering::SeqCst);
            let asked = self.requested.load(Ordering::SeqCst);
            if !asked || self.running.swap(true, Ordering::SeqCst) {
                return;
            }
            if !flushed || done >= limit {
                self.hand_on();
                return;
            }
        }
    }

    /// One flush covering every ticket up to `target`; whether it succeeded.
    fn round(&self, target: u64, durable: u64) -> bool {
        let records = self.records.swap(0, Ordering::SeqCst);
        let started = Instant::now();
        let flushed = self.storage.flush();
        self.metrics.flushed("leader", started.elapsed());
        debug!(
            writes = target - durable,
            records,
            failed = flushed.is_err(),
            "group commit flushed"
        );
        self.rounds.send_modify(|r| {
            r.completed += 1;
            match &flushed {
                Ok(()) => r.durable = r.durable.max(target),
                Err(e) => r.failure = Some((r.completed, target, e.to_string())),
            }
        });
        match flushed {
            Ok(()) => {
                if records > 0 {
                    self.metrics.group_commit(records as usize);
                }
                true
            }
            Err(e) => {
                warn!("flush failed: {e}");
                false
            }
        }
    }
}
