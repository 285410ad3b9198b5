//! A full disk at the leader, against the real binary on a small tmpfs: the Produce that does
//! not fit gets a typed error (KAFKA_STORAGE_ERROR) and stores nothing, everything acknowledged
//! before it is served, and once there is room again the producer's retry lands right after the
//! acknowledged records, without a restart; after a SIGKILL and a restart all of it is there
//! and a late retry is a duplicate.
//!
//! Needs to mount a tmpfs (root, as on the project's CI machines); skipped, saying why,
//! where mounting is not allowed.

mod common;

use proto::partition_leader_client::PartitionLeaderClient;
use proto::{ErrorCode, ProduceRequest};
use testkit::requests::{self, code, values};
use testkit::tmpfs::Tmpfs;

use common::{connect_process, spawn_leader_process, write_leader_topology};
use tonic::transport::Channel;

/// Every record of partition 0, in order, with its offset (fetched 1 MiB at a time).
async fn read_all(client: &mut PartitionLeaderClient<Channel>) -> Vec<(i64, String)> {
    let mut log = Vec::new();
    loop {
        let from = log.last().map_or(0, |(offset, _)| offset + 1);
        let r = client
            .fetch(requests::fetch("t", 0, from, false, 1 << 20, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.error_code, 0, "{}", r.error_message);
        if r.records.is_empty() {
            return log;
        }
        let offsets: Vec<i64> = r.records.iter().map(|r| r.offset).collect();
        log.extend(offsets.into_iter().zip(values(&r)));
    }
}

/// The batch of sequence `b`: 16 records of 4 KiB, each value naming its record.
fn batch_values(b: i32) -> Vec<String> {
    (0..16)
        .map(|i| format!("{:<4096}", format!("r{}", b * 16 + i)))
        .collect()
}

async fn produce(client: &mut PartitionLeaderClient<Channel>, b: i32) -> proto::ProduceResponse {
    let values = batch_values(b);
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    client
        .produce(ProduceRequest {
            topic: "t".into(),
            partition: 0,
            batch: Some(requests::batch((1, 0, b * 16), &refs, None, b"", 1)),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_the_write_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let disk = match Tmpfs::mount(&dir.path().join("data"), "6m") {
        Ok(disk) => disk,
        Err(why) => {
            eprintln!("skipped: cannot mount a tmpfs here ({why})");
            return;
        }
    };
    let addr = testkit::process::free_address();
    write_leader_topology(dir.path(), &addr, 1);
    let first_log = dir.path().join("first.log");
    let process = spawn_leader_process(dir.path(), &addr, &first_log);
    let mut client = connect_process(&addr).await;

    // Batches of 64 KiB until the disk refuses one.
    let mut acknowledged = Vec::new();
    let (refused, response) = {
        let mut b = 0;
        loop {
            let r = produce(&mut client, b).await;
            if code(r.error_code) != ErrorCode::None {
                break (b, r);
            }
            assert!(b < 1_000, "6 MiB never filled up");
            for (i, v) in batch_values(b).into_iter().enumerate() {
                acknowledged.push((r.base_offset + i as i64, v));
            }
            b += 1;
        }
    };
    assert!(refused > 0, "nothing fitted");
    assert_eq!(
        code(response.error_code),
        ErrorCode::KafkaStorageError,
        "{}",
        response.error_message
    );
    assert!(
        response.error_message.contains("No space left"),
        "{}",
        response.error_message
    );
    // Nothing of the refused batch is stored; everything acknowledged is served; a retry
    // while the disk is still full is refused the same way and changes nothing.
    assert_eq!(read_all(&mut client).await, acknowledged);
    let again = produce(&mut client, refused).await;
    assert_eq!(code(again.error_code), ErrorCode::KafkaStorageError);
    assert_eq!(read_all(&mut client).await, acknowledged);

    // Room again, same process: the retry lands right after the acknowledged records, and the
    // producer goes on.
    disk.resize("64m");
    let next = acknowledged.len() as i64;
    let r = produce(&mut client, refused).await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!(r.base_offset, next);
    let r = produce(&mut client, refused + 1).await;
    assert_eq!(
        (code(r.error_code), r.base_offset),
        (ErrorCode::None, next + 16)
    );
    let mut expected = acknowledged.clone();
    for b in [refused, refused + 1] {
        let base = expected.len() as i64;
        expected.extend((base..).zip(batch_values(b)));
    }
    assert_eq!(read_all(&mut client).await, expected);

    // SIGKILL and restart: all of it is there, and a late retry of the once-refused batch is
    // a duplicate, answered with its offset, not written twice.
    process.kill();
    let _process = spawn_leader_process(dir.path(), &addr, &dir.path().join("second.log"));
    let mut client = connect_process(&addr).await;
    assert_eq!(read_all(&mut client).await, expected);
    let r = produce(&mut client, refused).await;
    assert_eq!((code(r.error_code), r.base_offset), (ErrorCode::None, next));
    assert_eq!(read_all(&mut client).await, expected);
}
