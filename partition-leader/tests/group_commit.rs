//! Group commit at the leader, against the real binary: a partition-leader PROCESS killed with
//! SIGKILL right after acknowledging concurrent Produce requests (several producers, several
//! partitions, flushes shared) has every acknowledged record at its acknowledged offset after a
//! restart.

mod common;

use std::collections::BTreeMap;

use common::{connect_process, spawn_leader_process, write_leader_topology};

use proto::{ErrorCode, ProduceRequest};
use testkit::requests::{self, code, values};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_after_group_commits_loses_no_acknowledged_record() {
    const PRODUCERS: i64 = 8;
    const BATCHES: i32 = 25;
    const RECORDS: i32 = 4;
    let dir = tempfile::tempdir().unwrap();
    let addr = testkit::process::free_address();
    write_leader_topology(dir.path(), &addr, 3);
    let first_log = dir.path().join("first.log");
    let process = spawn_leader_process(dir.path(), &addr, &first_log);
    let client = connect_process(&addr).await;

    // Idempotent producers, all at once, each on partition pid % 3; every reply acknowledges
    // that its batch is durable at the offset it names.
    let tasks: Vec<_> = (1..=PRODUCERS)
        .map(|pid| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let partition = (pid % 3) as i32;
                let mut acknowledged = Vec::new();
                for b in 0..BATCHES {
                    let values: Vec<String> = (0..RECORDS)
                        .map(|i| format!("{pid}-{}", b * RECORDS + i))
                        .collect();
                    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
                    let r = client
                        .produce(ProduceRequest {
                            topic: "t".into(),
                            partition,
                            batch: Some(requests::batch(
                                (pid, 0, b * RECORDS),
                                &refs,
                                None,
                                b"",
                                1,
                            )),
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
                    for (i, v) in values.into_iter().enumerate() {
                        acknowledged.push((partition, r.base_offset + i as i64, v));
                    }
                }
                acknowledged
            })
        })
        .collect();
    let mut acknowledged = Vec::new();
    for task in tasks {
        acknowledged.extend(task.await.unwrap());
    }
    // At once: no clean stop, no flush at shutdown.
    process.kill();
    let writes = testkit::logs::numbers(&first_log, "group commit flushed", "writes");
    assert!(
        writes.iter().any(|&n| n > 1),
        "no flush carried more than one write: {writes:?}"
    );
    let flushes = writes.len();
    let total = (PRODUCERS * BATCHES as i64) as usize;
    assert!(flushes < total, "{flushes} flushes for {total} writes");

    let second_log = dir.path().join("second.log");
    let _process = spawn_leader_process(dir.path(), &addr, &second_log);
    let mut client = connect_process(&addr).await;
    let mut logs = BTreeMap::new();
    for partition in 0..3 {
        let r = client
            .fetch(requests::fetch("t", partition, 0, false, 64 << 20, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.error_code, 0, "{}", r.error_message);
        let offsets: Vec<i64> = r.records.iter().map(|r| r.offset).collect();
        logs.insert(
            partition,
            offsets
                .into_iter()
                .zip(values(&r))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    for (partition, offset, value) in &acknowledged {
        assert_eq!(
            logs[partition].get(offset),
            Some(value),
            "acknowledged record {value} at {partition}/{offset} after the restart"
        );
    }
    assert_eq!(
        logs.values().map(BTreeMap::len).sum::<usize>(),
        acknowledged.len()
    );
}
