//! The producer pipeline end to end: batching with 5 requests in flight across a leader restart,
//! flush, commit flushing, backpressure on `buffer.memory`, fencing resolving pending deliveries,
//! and the memory a producer holds while a leader is down.

use std::time::{Duration, Instant};

use integration_tests::{cluster, cluster_with, config, producer, read_topic, wait_settled};
use producer_client::{DeliveryFuture, Error, IdempotentProducer, Isolation};

/// Resident set size of this process, bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_restart_mid_stream_with_five_in_flight_loses_and_duplicates_nothing() {
    let mut cluster = cluster().await;
    let mut p = IdempotentProducer::connect(
        config(&cluster)
            .with_linger(Duration::from_millis(1))
            .with_batch_size(10 * 48) // ~10 records per batch: many batches in flight
            .with_max_in_flight(5)
            .with_delivery_timeout(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    let total = 3000;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sender = tokio::spawn(async move {
        let mut deliveries: Vec<DeliveryFuture> = Vec::new();
        let mut tx = Some(tx);
        for i in 0..total {
            deliveries.push(p.send("input", 0, format!("v{i:05}")).await.unwrap());
            if i == total / 3 {
                let _ = tx.take().unwrap().send(());
            }
            if i % 100 == 0 {
                tokio::task::yield_now().await;
            }
        }
        p.flush().await.unwrap();
        let mut offsets = Vec::new();
        for d in deliveries {
            offsets.push(d.await.expect("every record is delivered").offset);
        }
        (p, offsets)
    });
    // A third of the way in, with requests in flight, the leader dies and comes back.
    rx.await.unwrap();
    cluster.kill(leader).await.unwrap();
    cluster.restart(leader).await.unwrap();
    let (p, offsets) = sender.await.unwrap();
    assert!(
        offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "offsets follow send order without gaps"
    );
    let expected: Vec<String> = (0..total).map(|i| format!("v{i:05}")).collect();
    let by_partition = read_topic(&cluster, "input", Isolation::ReadUncommitted).await;
    assert_eq!(by_partition[&0].len(), total, "nothing lost, nothing twice");
    assert_eq!(by_partition[&0], expected, "in send order");
    assert_eq!(offsets[0], 0);
    assert_eq!(p.epoch(), 0, "no epoch bump was needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_sends_lingering_batches_at_once() {
    let cluster = cluster().await;
    let mut p = IdempotentProducer::connect(config(&cluster).with_linger(Duration::from_secs(30)))
        .await
        .unwrap();
    let mut deliveries = Vec::new();
    for i in 0..6 {
        deliveries.push(p.send("input", i % 3, format!("f{i}")).await.unwrap());
    }
    let start = Instant::now();
    p.flush().await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "flush did not wait for linger.ms"
    );
    for (i, d) in deliveries.into_iter().enumerate() {
        let m = tokio::time::timeout(Duration::ZERO, d)
            .await
            .expect("resolved by the flush")
            .unwrap();
        assert_eq!(m.partition.partition, i as i32 % 3);
        assert_eq!(m.offset, i as i64 / 3);
    }
}

/// Requests the leaders answered, by RPC name, summed over every leader of the cluster.
fn leader_requests(cluster: &minibroker::embedded::EmbeddedCluster, request: &str) -> f64 {
    cluster
        .topology()
        .leaders
        .iter()
        .filter_map(|l| cluster.metrics(l.id))
        .filter_map(|m| {
            cluster::metrics::sample(
                &m.render(),
                "kafka_network_requestmetrics_errors_total",
                &[("request", request)],
            )
        })
        .sum()
}

/// Batches for several partitions of one leader travel in one Produce request: six lingering
/// records on three partitions, flushed at once, make three batches and one request per leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_for_one_leader_share_a_request() {
    let cluster = cluster().await;
    let leaders: std::collections::BTreeSet<_> = (0..3)
        .map(|p| cluster.topology().leader_for("input", p).unwrap().id)
        .collect();
    let mut p = IdempotentProducer::connect(config(&cluster).with_linger(Duration::from_secs(30)))
        .await
        .unwrap();
    let (requests, batches) = (
        leader_requests(&cluster, "ProducePartitions"),
        leader_requests(&cluster, "Produce"),
    );
    let mut deliveries = Vec::new();
    for i in 0..6 {
        deliveries.push(p.send("input", i % 3, format!("r{i}")).await.unwrap());
    }
    p.flush().await.unwrap();
    for d in deliveries {
        d.await.unwrap();
    }
    assert_eq!(leader_requests(&cluster, "Produce") - batches, 3.0);
    assert_eq!(
        leader_requests(&cluster, "ProducePartitions") - requests,
        leaders.len() as f64,
        "one request per leader ({leaders:?})"
    );
    let read = read_topic(&cluster, "input", Isolation::ReadUncommitted).await;
    assert_eq!(read.values().map(Vec::len).sum::<usize>(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_flushes_first() {
    let cluster = cluster().await;
    let mut p = producer_client::TransactionalProducer::connect(
        config(&cluster)
            .with_transactional_id("lingering")
            .with_linger(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    p.init_transactions().await.unwrap();
    p.begin_transaction().unwrap();
    let mut deliveries = Vec::new();
    for i in 0..5 {
        deliveries.push(p.send("output", i % 2, format!("c{i}")).await.unwrap());
    }
    p.commit_transaction().await.unwrap();
    for d in deliveries {
        tokio::time::timeout(Duration::ZERO, d)
            .await
            .expect("resolved before the commit returned")
            .unwrap();
    }
    let mut seen = integration_tests::values(&cluster, "output", Isolation::ReadCommitted).await;
    seen.sort();
    assert_eq!(seen, vec!["c0", "c1", "c2", "c3", "c4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_resolves_every_pending_delivery_with_the_error() {
    let cluster = cluster().await;
    let id = "fenced-pipeline";
    let mut a = producer_client::TransactionalProducer::connect(
        config(&cluster)
            .with_transactional_id(id)
            .with_linger(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    a.init_transactions().await.unwrap();
    a.begin_transaction().unwrap();
    a.send_and_wait("input", 0, "a-0").await.unwrap();
    a.send_and_wait("input", 1, "a-1").await.unwrap();
    // A newer instance fences A and aborts its transaction (markers bump the leaders' epoch).
    let _b = producer(&cluster, id).await;
    wait_settled(&cluster, "input").await;
    let pending: Vec<DeliveryFuture> = vec![
        a.send("input", 0, "zombie-0").await.unwrap(),
        a.send("input", 0, "zombie-1").await.unwrap(),
        a.send("input", 1, "zombie-2").await.unwrap(),
    ];
    let e = a.flush().await.unwrap_err();
    assert!(matches!(e, Error::InvalidProducerEpoch(_)), "{e:?}");
    for d in pending {
        let e = tokio::time::timeout(Duration::ZERO, d)
            .await
            .expect("resolved")
            .unwrap_err();
        assert!(matches!(e, Error::InvalidProducerEpoch(_)), "{e:?}");
    }
    // The transaction cannot commit; the abort reveals the fence.
    assert!(a.commit_transaction().await.is_err());
    let e = a.abort_transaction().await.unwrap_err();
    assert!(e.is_fatal(), "{e:?}");
    let all = read_topic(&cluster, "input", Isolation::ReadUncommitted).await;
    assert!(
        all.values().flatten().all(|v| !v.starts_with("zombie")),
        "{all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_blocks_send_then_fails_after_max_block() {
    let mut cluster = cluster().await;
    let buffer = 64 * 1024;
    let mut p = IdempotentProducer::connect(
        config(&cluster)
            .with_linger(Duration::from_millis(1))
            .with_batch_size(8 * 1024)
            .with_buffer_memory(buffer)
            .with_max_block(Duration::from_millis(300))
            .with_delivery_timeout(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    cluster.kill(leader).await.unwrap();
    let value = vec![b'm'; 1000];
    let mut accepted = Vec::new();
    let error = loop {
        let start = Instant::now();
        match p.send("input", 0, value.clone()).await {
            Ok(d) => accepted.push(d),
            Err(e) => {
                let waited = start.elapsed();
                assert!(waited >= Duration::from_millis(300), "{waited:?}");
                assert!(waited < Duration::from_secs(5), "{waited:?}");
                break e;
            }
        }
        assert!(accepted.len() < 1000, "send never blocked");
    };
    assert!(matches!(error, Error::Timeout(_)), "{error:?}");
    assert!(
        accepted.len() * 1000 <= buffer,
        "{} records held in a {buffer}-byte buffer",
        accepted.len()
    );
    assert!(
        accepted.len() * 1032 > buffer - 2 * 1032,
        "the buffer filled up"
    );
    // The leader returns: everything accepted is delivered, in order, and room comes back.
    cluster.restart(leader).await.unwrap();
    p.flush().await.unwrap();
    let n = accepted.len();
    let mut offsets = Vec::new();
    for d in accepted {
        offsets.push(d.await.unwrap().offset);
    }
    assert_eq!(offsets, (0..n as i64).collect::<Vec<_>>());
    p.send_and_wait("input", 0, "after").await.unwrap();
}

/// The producer's memory while a leader is down for 10 s under full load stays within
/// `buffer.memory` plus a fixed overhead. Measured as this process's resident set (which also
/// holds the embedded cluster): its growth over the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_buffer_memory_while_a_leader_is_down() {
    let mut cluster = cluster().await;
    let buffer = 16 * 1024 * 1024;
    let mut p = IdempotentProducer::connect(
        config(&cluster)
            .with_batch_size(128 * 1024)
            .with_buffer_memory(buffer)
            .with_max_block(Duration::from_millis(50))
            .with_delivery_timeout(Duration::from_secs(120)),
    )
    .await
    .unwrap();
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let load = tokio::spawn(async move {
        let value = vec![b'r'; 1024];
        let mut pending = std::collections::VecDeque::new();
        let (mut sent, mut blocked, mut delivered) = (0u64, 0u64, 0u64);
        let mut i = 0i32;
        while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
            match p.send("input", i % 3, value.clone()).await {
                Ok(d) => {
                    pending.push_back(d);
                    sent += 1;
                }
                Err(Error::Timeout(_)) => blocked += 1,
                Err(e) => panic!("{e:?}"),
            }
            i += 1;
            // Deliveries to the live partitions are checked as they complete.
            while pending.len() > 100_000 {
                pending.pop_front().unwrap().await.unwrap();
                delivered += 1;
            }
        }
        p.flush().await.unwrap();
        for d in pending {
            d.await.unwrap();
            delivered += 1;
        }
        (sent, blocked, delivered)
    });
    // Warm up under load, then take the leader of input-0 away for 10 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss();
    cluster.kill(leader).await.unwrap();
    let down = Instant::now();
    let mut peak = before;
    while down.elapsed() < Duration::from_secs(10) {
        peak = peak.max(rss());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.restart(leader).await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (sent, blocked, delivered) = load.await.unwrap();
    let growth = peak.saturating_sub(before);
    println!(
        "leader down 10 s under full load: RSS {before} -> peak {peak} bytes, growth {growth} = {:.2}x buffer.memory ({buffer}); {sent} records sent, {blocked} sends blocked out, {delivered} delivered",
        growth as f64 / buffer as f64
    );
    assert_eq!(sent, delivered, "every record accepted is delivered");
    assert!(
        blocked > 0,
        "the buffer filled up while the leader was down"
    );
    assert!(
        growth < buffer as u64 + 64 * 1024 * 1024,
        "growth {growth} exceeds buffer.memory {buffer} + 64 MiB"
    );
}

/// A leader forgets an idle producer's state (producer.id.expiration.ms): the idempotent
/// producer's next batches are refused with UNKNOWN_PRODUCER_ID, go again under a new producer
/// id, and every record is in the log once, in send order; the application sees no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_producer_whose_state_expired_goes_on_without_an_error() {
    let cluster = cluster_with(minibroker::EmbeddedOptions {
        producer_id_expiration: (Duration::from_millis(400), Duration::from_millis(50)),
        ..Default::default()
    })
    .await;
    let mut p = IdempotentProducer::connect(
        config(&cluster)
            .with_linger(Duration::from_millis(1))
            .with_batch_size(3 * 48)
            .with_max_in_flight(5),
    )
    .await
    .unwrap();
    let first_pid = p.producer_id();
    let mut deliveries = Vec::new();
    for i in 0..6 {
        deliveries.push(p.send("input", 0, format!("e{i:02}")).await.unwrap());
    }
    p.flush().await.unwrap();
    // Idle past the expiration: the leader forgets the PID.
    let leader = cluster.topology().leader_for("input", 0).unwrap().id;
    let address = cluster.address(leader).unwrap();
    let client =
        proto::partition_leader_client::PartitionLeaderClient::connect(format!("http://{address}"))
            .await
            .unwrap();
    testkit::eventually("the producer's state expired at the leader", || {
        let mut client = client.clone();
        async move {
            let r = client
                .describe_producers(proto::DescribeProducersRequest {
                    topic: "input".into(),
                    partition: 0,
                })
                .await
                .ok()?
                .into_inner();
            r.producers.is_empty().then_some(())
        }
    })
    .await;
    for i in 6..30 {
        deliveries.push(p.send("input", 0, format!("e{i:02}")).await.unwrap());
    }
    p.flush().await.unwrap();
    let mut offsets = Vec::new();
    for d in deliveries {
        offsets.push(d.await.expect("no record fails").offset);
    }
    assert_eq!(offsets, (0..30).collect::<Vec<i64>>());
    assert_ne!(
        p.producer_id(),
        first_pid,
        "a new producer id after the expiry"
    );
    let expected: Vec<String> = (0..30).map(|i| format!("e{i:02}")).collect();
    let by_partition = read_topic(&cluster, "input", Isolation::ReadUncommitted).await;
    assert_eq!(by_partition[&0], expected, "once each, in send order");
}
