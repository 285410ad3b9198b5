//! A chaos producer worker: one instance of a transactional id, in its own process so the
//! nemesis can SIGSTOP and SIGKILL it. It runs transactions of unique values until its stdin
//! closes, aborting some on purpose, and prints every step as a [`WorkerEvent`] JSON line on
//! stdout (flushed before the request it announces is sent, so the history survives a SIGKILL).
//!
//! A fatal error (PRODUCER_FENCED: a newer instance took over) ends the worker, as it ends a real
//! exactly-once application; an abortable one aborts the transaction and carries on.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use producer_client::{ClientConfig, TransactionalProducer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::history::{now_us, SendOk, WorkerEvent};

/// What one worker does.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Any node's address.
    pub bootstrap: Vec<String>,
    /// The transactional id.
    pub transactional_id: String,
    /// This instance's name (prefix of every value).
    pub instance: String,
    /// Topic to write.
    pub topic: String,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Records per transaction.
    pub records_per_txn: u64,
    /// Chance (0..=1) that a transaction is aborted on purpose.
    pub abort_ratio: f64,
    /// Transaction timeout asked for at InitProducerId.
    pub transaction_timeout_ms: i32,
    /// Random seed (partition choice, aborts).
    pub seed: u64,
}

fn emit(event: &WorkerEvent) {
    let mut out = std::io::stdout().lock();
    // A closed stdout means the driver is gone: nothing left to report to.
    let _ = serde_json::to_writer(&mut out, event);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Runs the worker until stdin closes or the instance is fenced.
pub async fn run(options: WorkerOptions) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            stop.store(true, Ordering::SeqCst);
        });
    }
    let config = ClientConfig::new(options.bootstrap.clone())
        .with_transactional_id(&options.transactional_id)
        .with_transaction_timeout_ms(options.transaction_timeout_ms)
        .with_request_timeout(Duration::from_secs(3))
        .with_retry_backoff(Duration::from_millis(10), Duration::from_millis(200))
        .with_max_retries(60);
    let mut producer = TransactionalProducer::connect(config).await?;
    if let Err(e) = producer.init_transactions().await {
        emit(&WorkerEvent::InitFailed {
            at_us: now_us(),
            error: e.to_string(),
        });
        return Ok(());
    }
    emit(&WorkerEvent::InitOk {
        at_us: now_us(),
        pid: producer.producer_id(),
        epoch: i32::from(producer.epoch()),
    });
    let mut rng = StdRng::seed_from_u64(options.seed);
    let mut txn = 0u64;
    let reason = loop {
        if stop.load(Ordering::SeqCst) {
            break "asked to stop".to_string();
        }
        match one_transaction(&mut producer, &options, txn, &mut rng).await {
            Ok(()) => {}
            Err(reason) => break reason,
        }
        txn += 1;
    };
    emit(&WorkerEvent::Exit { reason });
    Ok(())
}

/// One transaction; `Err` ends the worker with the reason.
async fn one_transaction(
    producer: &mut TransactionalProducer,
    options: &WorkerOptions,
    txn: u64,
    rng: &mut StdRng,
) -> Result<(), String> {
    producer.begin_transaction().map_err(|e| e.to_string())?;
    emit(&WorkerEvent::Begin { txn });
    let mut failed = false;
    // Round the partitions from a random start: every transaction spans them all.
    let partitions = options.partitions.max(1);
    let start = rng.gen_range(0..partitions);
    for n in 0..options.records_per_txn {
        let value = format!("{}/{txn}/{n}", options.instance);
        let partition = (start + (n % partitions as u64) as i32) % partitions;
        let sent_us = now_us();
        let result = producer
            .send_and_wait(&options.topic, partition, value.clone().into_bytes())
            .await;
        let at_us = now_us();
        match result {
            Ok(meta) => emit(&WorkerEvent::Send {
                txn,
                value,
                sent_us,
                at_us,
                ok: Some(SendOk {
                    partition: meta.partition.partition,
                    offset: meta.offset,
                }),
                error: None,
                fatal: false,
            }),
            Err(e) => {
                emit(&WorkerEvent::Send {
                    txn,
                    value,
                    sent_us,
                    at_us,
                    ok: None,
                    error: Some(e.to_string()),
                    fatal: e.is_fatal(),
                });
                if e.is_fatal() {
                    return Err(format!("fenced: {e}"));
                }
                failed = true;
                break;
            }
        }
    }
    let commit = !failed && !rng.gen_bool(options.abort_ratio.clamp(0.0, 1.0));
    if end(producer, txn, commit).await? || !commit {
        return Ok(());
    }
    // The commit failed without being fatal: its outcome is unknown to us. Abort what the
    // client still holds open (a no-op if the coordinator already completed it) and go on.
    end(producer, txn, false).await.map(|_| ())
}

/// EndTxn; `Ok(true)` on success, `Ok(false)` on a non-fatal failure, `Err` when the instance
/// must stop.
async fn end(producer: &mut TransactionalProducer, txn: u64, commit: bool) -> Result<bool, String> {
    if !commit && !producer.in_transaction() {
        return Ok(true);
    }
    let sent_us = now_us();
    emit(&WorkerEvent::EndStart {
        txn,
        commit,
        sent_us,
    });
    let result = if commit {
        producer.commit_transaction().await
    } else {
        producer.abort_transaction().await
    };
    let at_us = now_us();
    match result {
        Ok(()) => {
            emit(&WorkerEvent::End {
                txn,
                commit,
                sent_us,
                at_us,
                error: None,
                fatal: false,
            });
            Ok(true)
        }
        Err(e) => {
            emit(&WorkerEvent::End {
                txn,
                commit,
                sent_us,
                at_us,
                error: Some(e.to_string()),
                fatal: e.is_fatal(),
            });
            if e.is_fatal() {
                Err(format!("fenced: {e}"))
            } else if commit {
                Ok(false)
            } else {
                Err(format!("abort failed: {e}"))
            }
        }
    }
}
