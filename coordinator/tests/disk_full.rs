//! A full disk at the coordinator, against the real binary on a small tmpfs: the transition
//! that does not fit is refused with KAFKA_STORAGE_ERROR, every acknowledged one survives, and
//! the node says so: sled fails every write after an I/O error until the process restarts, so
//! the health check turns NOT_SERVING (reads of what is in memory still answer). After a
//! SIGKILL and a restart with room again, all of it is there and it serves as before.
//!
//! A KIP-447 pending offset (a Kafka client's TxnOffsetCommit, recorded durably at the group's
//! coordinator before the transaction carries it) that cannot be written is refused and not
//! left pending in memory.
//!
//! Needs to mount a tmpfs (root, as on the project's CI machines); skipped, saying why,
//! where mounting is not allowed.

mod common;

use common::*;
use proto::ErrorCode;
use testkit::tmpfs::Tmpfs;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_the_transition_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = small_disk(dir.path(), "2m") else {
        return;
    };
    let addr = testkit::process::free_address();
    std::fs::write(
        dir.path().join("topology.toml"),
        format!(
            "transaction_state_partitions = 8\n\
             [[coordinators]]\nid = 1\naddress = \"{addr}\"\n\
             [[leaders]]\nid = 101\naddress = \"127.0.0.1:1\"\n\
             [[topics]]\nname = \"t\"\nleaders = [101]\n"
        ),
    )
    .unwrap();
    let process = spawn_coordinator(dir.path(), &addr, &dir.path().join("first.log"));
    let client = connect(&addr).await;
    let health = || testkit::standard::health(&addr, "");
    assert_eq!(health().await, Ok(ServingStatus::Serving));

    // New transactional ids (long names, so the disk fills quickly) until one is refused.
    let id = |i: usize| format!("{i:0>250}");
    let mut acknowledged = Vec::new();
    let refused = loop {
        let i = acknowledged.len();
        assert!(i < 50_000, "2 MiB never filled up");
        let r = Txn::new(client.clone(), &id(i))
            .init_raw(60_000, (-1, -1))
            .await;
        if code(r.error_code) != ErrorCode::None {
            assert_eq!(
                code(r.error_code),
                ErrorCode::KafkaStorageError,
                "{}",
                r.error_message
            );
            assert!(
                r.error_message.contains("No space left"),
                "{}",
                r.error_message
            );
            break i;
        }
        acknowledged.push((id(i), r.producer_id, r.producer_epoch));
    };
    assert!(refused > 0, "nothing fitted");
    // The node says it cannot serve; what it holds is still readable.
    testkit::poll::eventually_within(
        std::time::Duration::from_secs(10),
        "NOT_SERVING after the failed write",
        || async { (health().await == Ok(ServingStatus::NotServing)).then_some(()) },
    )
    .await;
    let (first, pid, epoch) = &acknowledged[0];
    let d = Txn::new(client.clone(), first).describe().await;
    assert_eq!((d.producer_id, d.producer_epoch), (*pid, *epoch));

    // Room again; SIGKILL (no clean stop) and a restart.
    disk.resize("64m");
    process.kill();
    let _process = spawn_coordinator(dir.path(), &addr, &dir.path().join("second.log"));
    let client = connect(&addr).await;
    assert_eq!(health().await, Ok(ServingStatus::Serving));
    for (id, pid, epoch) in &acknowledged {
        let d = Txn::new(client.clone(), id).describe().await;
        assert_eq!(
            (d.producer_id, d.producer_epoch),
            (*pid, *epoch),
            "acknowledged {id} after the restart"
        );
    }
    // And it takes new work: the refused id's retry, and an epoch bump of an old one.
    let r = Txn::new(client.clone(), &id(refused))
        .init_raw(60_000, (-1, -1))
        .await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    let r = Txn::new(client.clone(), first)
        .init_raw(60_000, (-1, -1))
        .await;
    assert_eq!(code(r.error_code), ErrorCode::None, "{}", r.error_message);
    assert_eq!((r.producer_id, r.producer_epoch), (*pid, *epoch + 1));
}

/// Mounts a tmpfs of `size` at `dir/data`; `None` (the test is skipped, saying why) where
/// mounting is not allowed.
fn small_disk(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(&dir.join("data"), size) {
        Ok(disk) => Some(disk),
        Err(why) => {
            eprintln!("skipped: cannot mount a tmpfs here ({why})");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_offset_that_cannot_be_written_is_refused_and_not_left_pending() {
    use testkit::kafka::{offset_fetch_v7, OffsetTxn};
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = small_disk(dir.path(), "2m") else {
        return;
    };
    let (addr, kafka) = (
        testkit::process::free_address(),
        testkit::process::free_address(),
    );
    std::fs::write(
        dir.path().join("topology.toml"),
        format!(
            "transaction_state_partitions = 8\n\
             [[coordinators]]\nid = 1\naddress = \"{addr}\"\nkafka_address = \"{kafka}\"\n\
             [[leaders]]\nid = 101\naddress = \"127.0.0.1:1\"\n\
             [[topics]]\nname = \"input\"\nleaders = [101]\n"
        ),
    )
    .unwrap();
    let extra = ["--kafka-listen", kafka.as_str()];
    let log = dir.path().join("first.log");
    let process = spawn_coordinator_with_args(dir.path(), &addr, &log, &extra);
    let client = connect(&addr).await;
    let kafka: std::net::SocketAddr = kafka.parse().unwrap();
    let group = "pending-group";
    let t = OffsetTxn::init(kafka, kafka, "pending-txn", group).await;
    t.add_offsets().await;

    // Fill the disk with transactional ids until sled refuses one (after that it refuses every
    // write until restart).
    let id = |i: usize| format!("{i:0>250}");
    for i in 0.. {
        assert!(i < 50_000, "2 MiB never filled up");
        let r = Txn::new(client.clone(), &id(i))
            .init_raw(60_000, (-1, -1))
            .await;
        if code(r.error_code) != ErrorCode::None {
            break;
        }
    }
    // The group's coordinator cannot record the commit as pending: refused with NOT_COORDINATOR
    // (what Kafka's coordinators answer for a failed write of their log: retriable, the same
    // request again), and nothing stays pending in memory: a stable OffsetFetch answers at once
    // (it would get UNSTABLE_OFFSET_COMMIT, 88, until a marker that never comes).
    assert_eq!(t.commit_offset("", -1, 5).await, 16, "NOT_COORDINATOR");
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, -1)));

    // Nor on disk: after room, a SIGKILL and a restart, still nothing pending.
    disk.resize("64m");
    process.kill();
    let log = dir.path().join("second.log");
    let _process = spawn_coordinator_with_args(dir.path(), &addr, &log, &extra);
    connect(&addr).await;
    assert_eq!(offset_fetch_v7(kafka, group, true).await, (0, (0, -1)));
}
