//! Durable before acknowledged, through a power cut: a coordinator process keeps its
//! `__transaction_state` on an ext4 disk (its device with a volatile write cache,
//! `cluster::power_cut`) while transactional ids run Init/AddPartitions/EndTxn cycles; the power
//! goes right after its latest acknowledgements (the process frozen, the disk's media copied as
//! they stand), the machine boots again on that copy, and every id is there with at least the last epoch it was answered.
//!
//! An epoch that went back would undo a fencing: the instance that the lost InitProducerId
//! fenced could write again. A SIGKILL cannot show this (the page cache survives a process); a
//! power cut keeps only what was flushed to the device's media, with the file system's record of
//! where it is.
//!
//! Needs root (mount, loop devices) and `mkfs.ext4`; skipped, saying why, elsewhere (a failure
//! where `MINIBROKER_REQUIRE_POWER_CUT=1`, as in CI).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use proto::ErrorCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_power_cut_right_after_acknowledgements_loses_no_epoch() {
    power_cut_after_acknowledgements(None).await;
}

/// The same, where the device had written back part of its cache (what was never flushed,
/// in no order) when the power went: the restarted node must make sense of it, and lose no
/// acknowledged epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_power_cut_after_a_partial_writeback_of_the_device_cache_loses_no_epoch() {
    power_cut_after_acknowledgements(Some(0x5eed)).await;
}

/// Drives the node, cuts its power right after acknowledgements (`partial_writeback`: see
/// [`testkit::power::cut_power`]), boots it on what its disk kept and checks every
/// acknowledgement.
async fn power_cut_after_acknowledgements(partial_writeback: Option<u64>) {
    const TASKS: usize = 16;
    let leader = FakeLeader::default();
    let (dir, addr) = killable_setup(&leader).await;
    let Some(mut disk) =
        testkit::power::disk_or_skip(&dir.path().join("disk.img"), &dir.path().join("data"), 256)
    else {
        return;
    };
    let process = spawn_coordinator(dir.path(), &addr, &dir.path().join("first.log"));
    let client = connect(&addr).await;

    // Tasks run cycles until the coordinator stops answering: a quarter of them on one id each
    // (its epoch climbs), the others on a new id every cycle (the state, and its file, grow). Every
    // reply acknowledges a durable transition; the highest (PID, epoch) each id was answered
    // is kept.
    let acknowledged: Arc<Mutex<BTreeMap<String, (i64, i32)>>> = Arc::default();
    let answers = Arc::new(AtomicUsize::new(0));
    let frozen = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let client = client.clone();
            let (acknowledged, answers, frozen) =
                (acknowledged.clone(), answers.clone(), frozen.clone());
            tokio::spawn(async move {
                let within = Duration::from_secs(2);
                let stopped = || assert!(frozen.load(Ordering::SeqCst), "a request timed out");
                for n in 0.. {
                    let id = if i % 4 == 0 {
                        format!("power-{i}")
                    } else {
                        format!("power-{i}-{n}")
                    };
                    let answered = |pe: (i64, i32)| {
                        let mut acknowledged = acknowledged.lock().unwrap();
                        let last = acknowledged.entry(id.clone()).or_insert(pe);
                        *last = (*last).max(pe);
                        answers.fetch_add(1, Ordering::SeqCst);
                    };
                    let mut t = Txn::new(client.clone(), &id);
                    let Ok(pe) = tokio::time::timeout(within, t.init()).await else {
                        return stopped();
                    };
                    answered(pe);
                    let partitions = (0..3).map(|p| tp("t", p)).collect();
                    let Ok(added) = tokio::time::timeout(within, t.add(pe, partitions)).await
                    else {
                        return stopped();
                    };
                    assert_eq!(added, ErrorCode::None);
                    let Ok(ended) = tokio::time::timeout(within, t.end(pe, true)).await else {
                        return stopped();
                    };
                    answered(ended);
                }
            })
        })
        .collect();

    // Long enough for the state's file to grow well past its first segments, and for
    // transitions to be acknowledged right before the cut.
    testkit::poll::wait_until(Duration::from_secs(60), "8000 answers", || {
        std::future::ready(answers.load(Ordering::SeqCst) >= 8000)
    })
    .await;
    frozen.store(true, Ordering::SeqCst);
    let after_cut = dir.path().join("disk-after-cut.img");
    testkit::power::cut_power(&process, &disk, &after_cut, partial_writeback);
    // Replies the process wrote before the freeze still arrive: each is an acknowledgement
    // given before the cut.
    for task in tasks {
        task.await.unwrap();
    }
    process.kill();
    let acknowledged = std::mem::take(&mut *acknowledged.lock().unwrap());

    disk.boot_from(&after_cut).unwrap();
    let _process = spawn_coordinator(dir.path(), &addr, &dir.path().join("second.log"));
    let mut client = connect(&addr).await;
    let mut went_back = Vec::new();
    for (id, (pid, epoch)) in &acknowledged {
        let d = describe(&mut client, id).await;
        if d.error_code != 0 {
            went_back.push(format!(
                "{id}: answered {pid}/{epoch}, after the cut {:?}",
                code(d.error_code)
            ));
        } else if (d.producer_id, d.producer_epoch) < (*pid, *epoch) {
            went_back.push(format!(
                "{id}: answered {pid}/{epoch}, after the cut {}/{}",
                d.producer_id, d.producer_epoch
            ));
        }
    }
    assert!(
        went_back.is_empty(),
        "{} of {} ids lost acknowledged epochs in the power cut: {:?}",
        went_back.len(),
        acknowledged.len(),
        &went_back[..went_back.len().min(5)]
    );
}
