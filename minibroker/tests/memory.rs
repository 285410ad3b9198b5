//! A producer's memory while a leader is down, measured on the producer ALONE: the nodes run as
//! child processes (as in `minibroker chaos`), `minibroker produce --idempotent` runs as another
//! at full speed round robin over three partitions, and the leader of one of them is stopped
//! (SIGSTOP) for 10 s. While it is down the records for its partition fill the producer's
//! buffer and `send` blocks: the producer's resident memory must stay within its resident memory
//! at start plus `buffer.memory` plus a fixed overhead ([`FIXED_OVERHEAD`]). A producer that
//! kept accepting records for the stopped partition would grow by over 100 MiB in those 10 s; one
//! that kept every completed delivery queued behind the stopped partition's (as `produce` once
//! did) grew by ~1.5x `buffer.memory` over the bound. The growth over the full-speed peak is
//! printed too: it is about one `buffer.memory` (the buffer is not full at full speed), so it is
//! not what is checked.

use std::time::{Duration, Instant};

use minibroker::chaos::procs::{NodeSettings, Nodes};
use testkit::process::free_address;

const BUFFER_MEMORY: u64 = 16 * 1024 * 1024;
/// What the producer holds beyond its buffer, whatever `buffer.memory` is: the runtime's
/// thread arenas, up to five requests in flight per leader (`batch.size` each), one delivery
/// handle per buffered record. Measured 5-7 MiB on the project's machines.
const FIXED_OVERHEAD: u64 = 12 * 1024 * 1024;
/// VmRSS of `pid` in bytes (0 once it is gone).
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The largest RSS of `pid` sampled every 20 ms for `period`.
async fn peak_rss(pid: u32, period: Duration) -> u64 {
    let end = Instant::now() + period;
    let mut peak = 0;
    while Instant::now() < end {
        peak = peak.max(rss(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_holds_at_most_buffer_memory_while_a_leader_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, l1, l2, l3) = (
        free_address(),
        free_address(),
        free_address(),
        free_address(),
    );
    let topology = cluster::Topology::parse(&format!(
        "transaction_state_partitions = 4\n\
         [[coordinators]]\nid = 1\naddress = \"{c1}\"\n\
         [[leaders]]\nid = 101\naddress = \"{l1}\"\n\
         [[leaders]]\nid = 102\naddress = \"{l2}\"\n\
         [[leaders]]\nid = 103\naddress = \"{l3}\"\n\
         [[topics]]\nname = \"input\"\nleaders = [101, 102, 103]\n"
    ))
    .unwrap();
    let topology_path = dir.path().join("topology.toml");
    std::fs::write(&topology_path, topology.to_toml()).unwrap();
    std::fs::write(
        dir.path().join("cluster.secret"),
        cluster::auth::ClusterSecret::generate().expose(),
    )
    .unwrap();
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_minibroker"));
    let mut nodes = Nodes::new(
        NodeSettings {
            exe: exe.clone(),
            topology_path: topology_path.clone(),
            dir: dir.path().to_path_buf(),
            timeout_scan_ms: 100,
            unsafe_skip_epoch_check: false,
            power_cuts: false,
        },
        &topology,
    );
    for id in nodes.ids() {
        nodes.start(id).unwrap();
    }
    nodes.wait_ready(Duration::from_secs(30)).await.unwrap();

    let mut producer = tokio::process::Command::new(&exe)
        .args(["produce", "--idempotent", "--size", "1024"])
        .args(["--records", "100000000"])
        .arg("--topology")
        .arg(&topology_path)
        .args([
            "--producer-property",
            &format!("buffer.memory={BUFFER_MEMORY}"),
        ])
        .args(["--producer-property", "delivery.timeout.ms=120000"])
        .args(["--producer-property", "max.block.ms=120000"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = producer.id().unwrap();
    // Its first 100 ms (starting, connecting), then full speed for a while.
    let before = peak_rss(pid, Duration::from_millis(100)).await;
    let steady = peak_rss(pid, Duration::from_secs(3)).await;
    assert!(
        producer.try_wait().unwrap().is_none(),
        "the producer exited early"
    );
    nodes.pause(102, true);
    let down = peak_rss(pid, Duration::from_secs(10)).await;
    nodes.pause(102, false);
    let after = peak_rss(pid, Duration::from_secs(2)).await;
    let alive = producer.try_wait().unwrap().is_none();
    let _ = producer.start_kill();
    let _ = producer.wait().await;
    nodes.stop_all(Duration::from_secs(5)).await;

    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "producer RSS: {:.1} MiB in its first 100 ms, {:.1} MiB peak at full speed, {:.1} MiB peak \
         with leader 102 stopped 10 s, {:.1} MiB after; while down {:+.1} MiB over the full-speed \
         peak; over the start {:.1} MiB = {:.2}x buffer.memory ({:.0} MiB)",
        mib(before),
        mib(steady),
        mib(down),
        mib(after),
        mib(down) - mib(steady),
        mib(down.saturating_sub(before)),
        down.saturating_sub(before) as f64 / BUFFER_MEMORY as f64,
        mib(BUFFER_MEMORY)
    );
    assert!(alive, "the producer failed while the leader was down");
    assert!(
        down.saturating_sub(before) <= BUFFER_MEMORY + FIXED_OVERHEAD,
        "the producer grew by {:.1} MiB over its start while a leader was down \
         (buffer.memory {:.0} MiB + fixed {:.0} MiB)",
        mib(down.saturating_sub(before)),
        mib(BUFFER_MEMORY),
        mib(FIXED_OVERHEAD)
    );
}
