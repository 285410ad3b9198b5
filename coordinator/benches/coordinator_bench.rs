//! Coordinator benchmark: InitProducerId and a full Init/AddPartitions/EndTxn cycle against a
//! real coordinator (gRPC on 127.0.0.1, sled in a temp dir), next to the two costs that bound
//! them, measured in the same run: a no-op gRPC round trip (Cluster.FindCoordinator, answered
//! from the topology) and a bare sled insert + flush.
//!
//! Run: `cargo bench -p coordinator --bench coordinator_bench` (release profile), optionally
//! followed by `-- --iterations N --seconds S --concurrency C --rounds R`; `-- --only-cycle
//! --seconds S` runs only the gRPC Init/Add/End cycle (e.g. under a profiler), and
//! `--memory-storage` puts the coordinator on an in-memory store (no disk: what everything but
//! the storage costs; the sled-only rows then still measure sled).
//!
//! Reported: p50/p99 latency with one client (sequential requests; the sled, no-op and
//! InitProducerId samples interleaved, one of each in turn; the client runs on a thread and a
//! runtime of its own, as a client on another machine would, so that it never waits for an
//! async worker that the coordinator holds in a flush), and throughput with C
//! (default 64) concurrent transactional ids for S seconds, plus ratios to the baselines. The
//! no-op gRPC baseline and the Init/Add/End cycle run in R (default 3) alternating slices of
//! S/R seconds each, so that both see the same share of a machine busy with other work; the
//! process CPU time per request of both is printed too, as context (it does not depend on how
//! busy the machine is).
//!
//! Markers need a partition leader: the bench serves a minimal in-process gRPC `PartitionLeader`
//! stub that acknowledges every marker at once, alone or in a WriteTxnMarkersBatch (no log, no
//! disk; TCP_NODELAY like the real leader), so the cycle measures the
//! coordinator's own cost (3 durable writes + the Complete* write) plus one marker round trip
//! (shared: the stub counts how many transactions each marker request carried, printed as
//! context).
//! A cycle's InitProducerId that lands before the previous EndTxn's markers completed waits in
//! the coordinator for them (up to `max_prepare_wait`); one that still gets
//! CONCURRENT_TRANSACTIONS is retried at once. Retries are counted and reported per cycle.
//!
//! The figures the issue tracks (issue 10), printed last under "targets":
//! InitProducerId p50 / (no-op gRPC p50 + sled insert+flush p50), coordinator requests/s at C
//! ids (each cycle is three requests: Init, Add, End) / no-op gRPC requests/s at C in flight,
//! and CONCURRENT_TRANSACTIONS retries per cycle.
//!
//! The same no-op and cycle also run over Kafka's protocol (the coordinator's Kafka listener,
//! as librdkafka or the Java client use it: ApiVersions as the no-op; InitProducerId v4,
//! AddPartitionsToTxn v3 and EndTxn v3, transaction version 1), one connection per id, in the
//! same alternating slices, as context for the gRPC figures.
//!
//! CAVEATS: one machine, client and server share the cores (and, for the throughput figures,
//! the async runtime); sled's flush cost depends heavily on
//! the disk (tmpfs vs. a real fsync), so read the ratios more than the absolute numbers.

/// The allocator of the binaries (see their `main.rs`), so the bench measures what they run.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, RequestHeader, RequestKind, ResponseHeader, ResponseKind,
};
use proto::cluster_client::ClusterClient;
use proto::partition_leader_server::{PartitionLeader, PartitionLeaderServer};
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Acknowledges every marker immediately; counts the requests and the transactions in them.
struct AckingLeader;

/// WriteTxnMarkers(Batch) requests the leader stub received, and the transactions they carried.
static MARKER_REQUESTS: AtomicU64 = AtomicU64::new(0);
static MARKER_TXNS: AtomicU64 = AtomicU64::new(0);

/// Every partition of one transaction's markers acknowledged.
fn ack(request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    let results = request
        .partitions
        .into_iter()
        .map(|tp| MarkerPartitionResult {
            partition: Some(tp),
            error_code: ErrorCode::None as i32,
            error_message: String::new(),
        })
        .collect();
    WriteTxnMarkersResponse { results }
}

#[tonic::async_trait]
impl PartitionLeader for AckingLeader {
    async fn produce(
        &self,
        _: Request<ProduceRequest>,
    ) -> Result<Response<ProduceResponse>, Status> {
        Err(Status::unimplemented("bench stub"))
    }
    async fn produce_partitions(
        &self,
        _: Request<proto::ProducePartitionsRequest>,
    ) -> Result<Response<proto::ProducePartitionsResponse>, Status> {
        Err(Status::unimplemented("bench stub"))
    }
    async fn fetch(&self, _: Request<FetchRequest>) -> Result<Response<FetchResponse>, Status> {
        Err(Status::unimplemented("bench stub"))
    }
    async fn write_txn_markers(
        &self,
        request: Request<WriteTxnMarkersRequest>,
    ) -> Result<Response<WriteTxnMarkersResponse>, Status> {
        MARKER_REQUESTS.fetch_add(1, Ordering::Relaxed);
        MARKER_TXNS.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(ack(request.into_inner())))
    }

    async fn write_txn_markers_batch(
        &self,
        request: Request<WriteTxnMarkersBatchRequest>,
    ) -> Result<Response<WriteTxnMarkersBatchResponse>, Status> {
        let markers = request.into_inner().markers;
        MARKER_REQUESTS.fetch_add(1, Ordering::Relaxed);
        MARKER_TXNS.fetch_add(markers.len() as u64, Ordering::Relaxed);
        let responses = markers.into_iter().map(ack).collect();
        Ok(Response::new(WriteTxnMarkersBatchResponse { responses }))
    }

    async fn describe_producers(
        &self,
        _: Request<DescribeProducersRequest>,
    ) -> Result<Response<DescribeProducersResponse>, Status> {
        Err(Status::unimplemented("bench stub"))
    }
}

struct Args {
    iterations: usize,
    seconds: u64,
    concurrency: usize,
    rounds: u32,
    /// Only the gRPC Init/Add/End cycle at `concurrency` ids for `seconds` (to profile it).
    only_cycle: bool,
    /// The coordinator on [`coordinator::storage::MemoryStorage`]: no disk at all, so the
    /// figures show what everything but the storage costs (an experiment, not a durable node).
    memory_storage: bool,
}

fn args() -> Args {
    let mut a = Args {
        iterations: 1000,
        seconds: 3,
        concurrency: 64,
        rounds: 3,
        only_cycle: false,
        memory_storage: false,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let value = argv.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (argv[i].as_str(), value) {
            ("--iterations", Some(v)) => a.iterations = v as usize,
            ("--seconds", Some(v)) => a.seconds = v,
            ("--concurrency", Some(v)) => a.concurrency = v as usize,
            ("--rounds", Some(v)) => a.rounds = (v as u32).max(1),
            ("--only-cycle", _) => {
                a.only_cycle = true;
                i += 1;
                continue;
            }
            ("--memory-storage", _) => {
                a.memory_storage = true;
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

#[derive(Clone, Copy)]
struct Latency {
    p50: Duration,
    p99: Duration,
}

fn percentiles(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Latency {
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn report(name: &str, l: Latency) {
    println!(
        "{name:<44} p50 {:>9.1} us   p99 {:>9.1} us",
        us(l.p50),
        us(l.p99)
    );
}

type Coord = TransactionCoordinatorClient<Channel>;

async fn init(c: &mut Coord, id: &str, retries: &AtomicU64) -> (i64, i32) {
    loop {
        let r = c
            .init_producer_id(InitProducerIdRequest {
                transactional_id: Some(id.to_string()),
                transaction_timeout_ms: 60_000,
                expected_producer_id: -1,
                expected_producer_epoch: -1,
                transaction_version: 2,
            })
            .await
            .expect("rpc")
            .into_inner();
        match ErrorCode::from_wire(r.error_code) {
            ErrorCode::None => return (r.producer_id, r.producer_epoch),
            ErrorCode::ConcurrentTransactions => {
                retries.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            other => panic!("init: {other:?} {}", r.error_message),
        }
    }
}

async fn cycle(c: &mut Coord, id: &str, partition: i32, retries: &AtomicU64) {
    let (pid, epoch) = init(c, id, retries).await;
    let r = c
        .add_partitions_to_txn(AddPartitionsToTxnRequest {
            transactional_id: id.to_string(),
            producer_id: pid,
            producer_epoch: epoch,
            partitions: vec![TopicPartition {
                topic: "bench".into(),
                partition,
            }],
        })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(r.error_code, 0, "add: {}", r.error_message);
    let r = c
        .end_txn(EndTxnRequest {
            transactional_id: id.to_string(),
            producer_id: pid,
            producer_epoch: epoch,
            result: TxnResult::Commit as i32,
        })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(r.error_code, 0, "end: {}", r.error_message);
}

/// One Kafka-protocol connection, one request at a time.
struct KafkaConn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl KafkaConn {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    async fn call(&mut self, key: ApiKey, version: i16, request: RequestKind) -> ResponseKind {
        use kafka_protocol::protocol::{Decodable, Encodable};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut header = RequestHeader::default();
        header.request_api_key = key as i16;
        header.request_api_version = version;
        header.correlation_id = 1;
        let mut body = bytes::BytesMut::from(&[0u8; 4][..]);
        header
            .encode(&mut body, key.request_header_version(version))
            .expect("encode");
        request.encode(&mut body, version).expect("encode");
        let len = (body.len() - 4) as i32;
        body[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&body).await.expect("write");
        let len = self.stream.read_i32().await.expect("read") as usize;
        self.buf.resize(len, 0);
        self.stream.read_exact(&mut self.buf).await.expect("read");
        let mut frame = bytes::Bytes::copy_from_slice(&self.buf);
        ResponseHeader::decode(&mut frame, key.response_header_version(version)).expect("header");
        ResponseKind::decode(key, &mut frame, version).expect("response")
    }
}

fn kafka_str(s: &str) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.to_string())
}

/// Init (v4) + AddPartitionsToTxn (v3) + EndTxn(COMMIT, v3) over Kafka's protocol.
async fn kafka_cycle(c: &mut KafkaConn, id: &str, partition: i32, retries: &AtomicU64) {
    use kafka_protocol::messages::*;
    let (pid, epoch) = loop {
        let mut init = InitProducerIdRequest::default();
        init.transactional_id = Some(TransactionalId(kafka_str(id)));
        init.transaction_timeout_ms = 60_000;
        let ResponseKind::InitProducerId(r) = c
            .call(ApiKey::InitProducerId, 4, RequestKind::InitProducerId(init))
            .await
        else {
            panic!("InitProducerId response")
        };
        match r.error_code {
            0 => break (r.producer_id, r.producer_epoch),
            51 => {
                // CONCURRENT_TRANSACTIONS
                retries.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            other => panic!("kafka init: {other}"),
        }
    };
    let mut add = AddPartitionsToTxnRequest::default();
    add.v3_and_below_transactional_id = TransactionalId(kafka_str(id));
    add.v3_and_below_producer_id = pid;
    add.v3_and_below_producer_epoch = epoch;
    let mut topic = add_partitions_to_txn_request::AddPartitionsToTxnTopic::default();
    topic.name = TopicName(kafka_str("bench"));
    topic.partitions = vec![partition];
    add.v3_and_below_topics = vec![topic];
    let ResponseKind::AddPartitionsToTxn(r) = c
        .call(
            ApiKey::AddPartitionsToTxn,
            3,
            RequestKind::AddPartitionsToTxn(add),
        )
        .await
    else {
        panic!("AddPartitionsToTxn response")
    };
    let codes: Vec<i16> = r
        .results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| {
            t.results_by_partition
                .iter()
                .map(|p| p.partition_error_code)
        })
        .collect();
    assert!(codes.iter().all(|c| *c == 0), "kafka add: {codes:?}");
    let mut end = EndTxnRequest::default();
    end.transactional_id = TransactionalId(kafka_str(id));
    end.producer_id = pid;
    end.producer_epoch = epoch;
    end.committed = true;
    let ResponseKind::EndTxn(r) = c.call(ApiKey::EndTxn, 3, RequestKind::EndTxn(end)).await else {
        panic!("EndTxn response")
    };
    assert_eq!(r.error_code, 0, "kafka end");
}

/// What one throughput measurement counted: operations, wall time and the CPU time the whole
/// process (client, server, sled) used meanwhile.
#[derive(Clone, Copy, Default)]
struct Tally {
    ops: u64,
    wall: Duration,
    cpu: Option<Duration>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.ops += other.ops;
        self.wall += other.wall;
        self.cpu = self.cpu.zip(other.cpu).map(|(a, b)| a + b);
    }

    fn empty() -> Self {
        Self {
            cpu: Some(Duration::ZERO),
            ..Self::default()
        }
    }

    fn per_second(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64()
    }

    /// CPU microseconds per operation (`None` where /proc is missing).
    fn cpu_us_per_op(&self) -> Option<f64> {
        self.cpu.map(|c| us(c) / (self.ops.max(1) as f64))
    }
}

/// User + system CPU time of this process (every thread) so far, from /proc/self/stat (Linux,
/// 100 ticks per second); `None` elsewhere.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14 and 15 of proc(5) (utime, stime); the list starts at field 3.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Runs `op(task, i)` in `concurrency` tasks for `duration`; what it counted.
async fn throughput<F, Fut>(concurrency: usize, duration: Duration, op: F) -> Tally
where
    F: Fn(usize, u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let start = Instant::now();
    let cpu_start = process_cpu();
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let op = op.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while Instant::now() < deadline {
                op(task, i).await;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    Tally {
        ops: done.load(Ordering::Relaxed),
        wall: start.elapsed(),
        cpu: process_cpu()
            .zip(cpu_start)
            .map(|(end, start)| end.saturating_sub(start)),
    }
}

/// The throughput figures' channels to the coordinator: a few, so HTTP/2 is not the bottleneck.
fn channels(endpoint: &str) -> anyhow::Result<Arc<Vec<Channel>>> {
    let channels = (0..8)
        .map(|_| Channel::from_shared(endpoint.to_string()).map(|e| e.connect_lazy()))
        .collect::<Result<_, _>>()?;
    Ok(Arc::new(channels))
}

/// The gRPC Init/Add/End cycle with `concurrency` ids (one per task) for `duration`.
async fn cycles(
    concurrency: usize,
    duration: Duration,
    channels: Arc<Vec<Channel>>,
    retries: Arc<AtomicU64>,
) -> Tally {
    throughput(concurrency, duration, move |task, i| {
        let mut c = Coord::new(channels[task % channels.len()].clone());
        let r = retries.clone();
        async move {
            cycle(&mut c, &format!("bench-cycle-{task}"), (i % 4) as i32, &r).await;
        }
    })
    .await
}

/// The latency figures, each a p50 and p99 (see [`latencies`]).
struct Latencies {
    sled_lat: Latency,
    rpc_lat: Latency,
    init_lat: Latency,
    hot_rpc_lat: Latency,
    cycle_lat: Latency,
}

/// Measures the latency figures with one client over its own connection to `endpoint`, one
/// request at a time, and prints them.
async fn latencies(
    endpoint: &str,
    iterations: usize,
    db: &sled::Db,
    tree: &sled::Tree,
    probe: &std::path::Path,
) -> anyhow::Result<Latencies> {
    // The three latencies of the target (bare sled insert + flush, a no-op gRPC round trip,
    // InitProducerId on an existing id, i.e. an epoch bump: one durable write) are sampled
    // INTERLEAVED, one of each per iteration in a rotating order, so that a machine whose load
    // changes from second to second weighs on all three alike.
    let value = vec![7u8; 200];
    let channel = Channel::from_shared(endpoint.to_string())?
        .connect()
        .await?;
    let mut coord = Coord::new(channel.clone());
    let mut cluster = ClusterClient::new(channel);
    let retries = AtomicU64::new(0);
    // Every write changes the value: sled skips writing a value identical to the stored one.
    let fresh_value = |i: u64| {
        let mut v = value.clone();
        v[..8].copy_from_slice(&i.to_be_bytes());
        v
    };
    init(&mut coord, "bench-init", &retries).await;
    let mut sled_samples = Vec::with_capacity(iterations);
    let mut rpc_samples = Vec::with_capacity(iterations);
    let mut init_samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        for k in 0..3 {
            let t = Instant::now();
            match (i + k) % 3 {
                0 => {
                    tree.insert(format!("key-{}", i % 64), fresh_value(i as u64))?;
                    db.flush()?;
                    sled_samples.push(t.elapsed());
                }
                1 => {
                    cluster
                        .find_coordinator(FindCoordinatorRequest {
                            key: "bench".into(),
                            key_type: 0,
                        })
                        .await?;
                    rpc_samples.push(t.elapsed());
                }
                _ => {
                    init(&mut coord, "bench-init", &retries).await;
                    init_samples.push(t.elapsed());
                }
            }
        }
    }
    let sled_lat = percentiles(sled_samples);
    report("sled insert + flush (bare)", sled_lat);
    let rpc_lat = percentiles(rpc_samples);
    report("gRPC no-op (Cluster.FindCoordinator)", rpc_lat);
    let init_lat = percentiles(init_samples);
    report("InitProducerId (existing id: bump)", init_lat);

    // For context: the no-op round trip back to back (threads kept hot, no disk wait between
    // calls): cheaper than interleaved with disk writes, as InitProducerId's own call is.
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        cluster
            .find_coordinator(FindCoordinatorRequest {
                key: "bench".into(),
                key_type: 0,
            })
            .await?;
        samples.push(t.elapsed());
    }
    let hot_rpc_lat = percentiles(samples);
    report("(context) gRPC no-op back to back", hot_rpc_lat);

    // For context: what a real fsync costs on this disk (sled's flush uses sync_file_range).
    let mut file = std::fs::File::create(probe)?;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        std::io::Write::write_all(&mut file, &value)?;
        file.sync_data()?;
        samples.push(t.elapsed());
    }
    report("(context) file write + fdatasync", percentiles(samples));

    // Full cycle: Init + AddPartitions + EndTxn(COMMIT).
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let t = Instant::now();
        cycle(&mut coord, "bench-cycle", (i % 4) as i32, &retries).await;
        samples.push(t.elapsed());
    }
    let cycle_lat = percentiles(samples);
    report("Init + AddPartitions + EndTxn cycle", cycle_lat);

    Ok(Latencies {
        sled_lat,
        rpc_lat,
        init_lat,
        hot_rpc_lat,
        cycle_lat,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args();
    let dir = tempfile::tempdir()?;

    // The leader stub and the coordinator.
    let leader_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let leader_addr = leader_listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PartitionLeaderServer::new(AckingLeader))
            // TCP_NODELAY, as the real leader's listener: without it a response whose frames
            // are written separately waits for Nagle + delayed ACK (~40 ms).
            .serve_with_incoming(cluster::node::incoming(leader_listener)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let topology = cluster::Topology::parse(&format!(
        "transaction_state_partitions = 16\n\
         [[coordinators]]\nid = 1\naddress = \"{addr}\"\n\
         [[leaders]]\nid = 101\naddress = \"{leader_addr}\"\n\
         [[topics]]\nname = \"bench\"\nleaders = [101, 101, 101, 101]\n"
    ))?;
    let mut config =
        coordinator::CoordinatorConfig::new(1, dir.path().join("coordinator"), Arc::new(topology));
    config.cluster_secret = Some(testkit::auth::secret());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let kafka_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let kafka_addr = kafka_listener.local_addr()?;
    let server = if a.memory_storage {
        tokio::spawn(coordinator::serve_with_storage(
            config,
            Arc::new(coordinator::storage::MemoryStorage::new()),
            listener,
            Some(kafka_listener),
            async move {
                let _ = stop_rx.await;
            },
        ))
    } else {
        tokio::spawn(coordinator::serve_with_kafka(
            config,
            listener,
            Some(kafka_listener),
            async move {
                let _ = stop_rx.await;
            },
        ))
    };

    let endpoint = format!("http://{addr}");
    let channel = loop {
        match Channel::from_shared(endpoint.clone())?.connect().await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let mut coord = Coord::new(channel.clone());
    let retries = Arc::new(AtomicU64::new(0));
    // Wait until loaded.
    loop {
        let r = coord
            .list_transactions(ListTransactionsRequest::default())
            .await?
            .into_inner();
        if r.error_code == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }

    println!(
        "coordinator bench: {} iterations per latency figure, {} s and {} concurrent ids per throughput figure",
        a.iterations, a.seconds, a.concurrency
    );
    println!(
        "(markers acknowledged by an in-process gRPC leader stub; sled in {})\n",
        dir.path().display()
    );

    if a.only_cycle {
        let channels = channels(&endpoint)?;
        let tally = cycles(
            a.concurrency,
            Duration::from_secs(a.seconds),
            channels,
            retries.clone(),
        )
        .await;
        println!(
            "Init+Add+End cycle, {} ids: {:.0} cycles/s, {:.1} us of process CPU per request",
            a.concurrency,
            tally.per_second(),
            tally.cpu_us_per_op().unwrap_or(f64::NAN) / 3.0
        );
        let _ = stop_tx.send(());
        server.await??;
        return Ok(());
    }

    let db = sled::open(dir.path().join("bare-sled"))?;
    let tree = db.open_tree("bench")?;
    let value = vec![7u8; 200];
    // The latencies are measured by a client on a thread and runtime of its own, as a client
    // on another machine would be: it never shares (or waits for) the coordinator's async
    // workers, which an InitProducerId's flush holds for its duration.
    let Latencies {
        sled_lat,
        rpc_lat,
        init_lat,
        hot_rpc_lat,
        cycle_lat,
    } = {
        let (endpoint, iterations) = (endpoint.clone(), a.iterations);
        let (db, tree, probe) = (db.clone(), tree.clone(), dir.path().join("fsync-probe"));
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(latencies(&endpoint, iterations, &db, &tree, &probe))
        })
        .join()
        .expect("the latency client panicked")?
    };

    println!();
    // Throughput with `concurrency` ids; a few channels so HTTP/2 is not the bottleneck.
    let channels = channels(&endpoint)?;

    let sled_tput = {
        let done = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(a.seconds);
        let start = Instant::now();
        let mut threads = Vec::new();
        for task in 0..a.concurrency {
            let (db, tree, done, value) = (db.clone(), tree.clone(), done.clone(), value.clone());
            threads.push(std::thread::spawn(move || {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let mut v = value.clone();
                    v[..8].copy_from_slice(&i.to_be_bytes());
                    i += 1;
                    tree.insert(format!("key-{task}"), v).expect("insert");
                    db.flush().expect("flush");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in threads {
            t.join().expect("thread");
        }
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    };

    let ch = channels.clone();
    let r = retries.clone();
    let init_tput = throughput(
        a.concurrency,
        Duration::from_secs(a.seconds),
        move |task, _| {
            let mut c = Coord::new(ch[task % ch.len()].clone());
            let r = r.clone();
            async move {
                init(&mut c, &format!("bench-init-{task}"), &r).await;
            }
        },
    )
    .await
    .per_second();

    // The no-op baseline and the cycle run in alternating slices (`rounds` of each), so both
    // see the same share of a machine that other work keeps busy.
    let before_retries = retries.load(Ordering::Relaxed);
    let (mut marker_requests, mut marker_txns) = (0u64, 0u64);
    let slice = Duration::from_secs(a.seconds) / a.rounds;
    let (mut rpc, mut cycle_tally) = (Tally::empty(), Tally::empty());
    // A coordinator request refused at decode (InitProducerId with an empty id:
    // INVALID_REQUEST, nothing looked up or stored): the gRPC service's shell alone.
    let mut refused = Tally::empty();
    // The same over Kafka's protocol: one connection per id.
    let mut conns = Vec::with_capacity(a.concurrency);
    for _ in 0..a.concurrency {
        conns.push(tokio::sync::Mutex::new(
            KafkaConn::connect(kafka_addr).await,
        ));
    }
    let conns = Arc::new(conns);
    let kafka_retries = Arc::new(AtomicU64::new(0));
    let (mut kafka_rpc, mut kafka_cycles) = (Tally::empty(), Tally::empty());
    for _ in 0..a.rounds {
        let ch = channels.clone();
        rpc.add(
            throughput(a.concurrency, slice, move |task, _| {
                let mut c = ClusterClient::new(ch[task % ch.len()].clone());
                async move {
                    c.find_coordinator(FindCoordinatorRequest {
                        key: "bench".into(),
                        key_type: 0,
                    })
                    .await
                    .expect("rpc");
                }
            })
            .await,
        );
        let ch = channels.clone();
        refused.add(
            throughput(a.concurrency, slice, move |task, _| {
                let mut c = Coord::new(ch[task % ch.len()].clone());
                async move {
                    let r = c
                        .init_producer_id(InitProducerIdRequest {
                            transactional_id: Some(String::new()),
                            transaction_timeout_ms: 60_000,
                            expected_producer_id: -1,
                            expected_producer_epoch: -1,
                            transaction_version: 2,
                        })
                        .await
                        .expect("rpc")
                        .into_inner();
                    assert_eq!(
                        ErrorCode::from_wire(r.error_code),
                        ErrorCode::InvalidRequest,
                        "an empty id is refused at decode"
                    );
                }
            })
            .await,
        );
        let markers_before = (
            MARKER_REQUESTS.load(Ordering::Relaxed),
            MARKER_TXNS.load(Ordering::Relaxed),
        );
        cycle_tally.add(cycles(a.concurrency, slice, channels.clone(), retries.clone()).await);
        // Markers of the slice's last cycles may still be in flight: a few at most.
        marker_requests += MARKER_REQUESTS.load(Ordering::Relaxed) - markers_before.0;
        marker_txns += MARKER_TXNS.load(Ordering::Relaxed) - markers_before.1;
        let c = conns.clone();
        kafka_rpc.add(
            throughput(a.concurrency, slice, move |task, _| {
                let c = c.clone();
                async move {
                    let mut conn = c[task].lock().await;
                    let request = RequestKind::ApiVersions(ApiVersionsRequest::default());
                    conn.call(ApiKey::ApiVersions, 2, request).await;
                }
            })
            .await,
        );
        let (c, r) = (conns.clone(), kafka_retries.clone());
        kafka_cycles.add(
            throughput(a.concurrency, slice, move |task, i| {
                let (c, r) = (c.clone(), r.clone());
                async move {
                    let mut conn = c[task].lock().await;
                    let id = format!("bench-kafka-{task}");
                    kafka_cycle(&mut conn, &id, (i % 4) as i32, &r).await;
                }
            })
            .await,
        );
    }
    let cycle_retries = retries.load(Ordering::Relaxed) - before_retries;
    let (rpc_tput, cycle_tput) = (rpc.per_second(), cycle_tally.per_second());

    println!(
        "{:<44} {:>10.0} ops/s",
        format!("gRPC no-op, {} concurrent", a.concurrency),
        rpc_tput
    );
    println!(
        "{:<44} {:>10.0} ops/s",
        format!("InitProducerId refused at decode, {}", a.concurrency),
        refused.per_second()
    );
    println!(
        "{:<44} {:>10.0} ops/s",
        format!("sled insert + flush, {} threads", a.concurrency),
        sled_tput
    );
    println!(
        "{:<44} {:>10.0} ops/s",
        format!("InitProducerId, {} ids", a.concurrency),
        init_tput
    );
    println!(
        "{:<44} {:>10.0} cycles/s ({} CONCURRENT_TRANSACTIONS retries)",
        format!("Init+Add+End cycle, {} ids", a.concurrency),
        cycle_tput,
        cycle_retries
    );
    println!(
        "{:<44} {:>10.2} transactions per request ({} requests)",
        "  (context) markers to the leader stub",
        marker_txns as f64 / marker_requests.max(1) as f64,
        marker_requests
    );

    let (kafka_rpc_tput, kafka_cycle_tput) = (kafka_rpc.per_second(), kafka_cycles.per_second());
    println!(
        "{:<44} {:>10.0} ops/s",
        format!("Kafka protocol no-op (ApiVersions), {}", a.concurrency),
        kafka_rpc_tput
    );
    println!(
        "{:<44} {:>10.0} cycles/s ({} CONCURRENT_TRANSACTIONS retries)",
        format!("Kafka protocol Init+Add+End, {} ids", a.concurrency),
        kafka_cycle_tput,
        kafka_retries.load(Ordering::Relaxed)
    );

    println!("\nratios (p50 latency):");
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "  InitProducerId / gRPC no-op   = {:>6.2}x   InitProducerId / sled flush   = {:>6.2}x",
        ratio(init_lat.p50, rpc_lat.p50),
        ratio(init_lat.p50, sled_lat.p50)
    );
    println!(
        "  cycle          / gRPC no-op   = {:>6.2}x   cycle          / sled flush   = {:>6.2}x",
        ratio(cycle_lat.p50, rpc_lat.p50),
        ratio(cycle_lat.p50, sled_lat.p50)
    );
    println!("ratios (throughput):");
    let cycle_requests = 3.0 * cycle_tput;
    println!(
        "  InitProducerId / gRPC no-op   = {:>6.3}    InitProducerId / sled flush   = {:>6.3}",
        init_tput / rpc_tput,
        init_tput / sled_tput
    );
    println!(
        "  cycle          / gRPC no-op   = {:>6.3}    cycle          / sled flush   = {:>6.3}",
        cycle_tput / rpc_tput,
        cycle_tput / sled_tput
    );

    let cycle_count = cycle_tally.ops as f64;
    println!("targets (issue 10):");
    println!(
        "  InitProducerId p50 / (gRPC no-op p50 + sled flush p50) = {:>6.2}x   (target <= 1.2)",
        ratio(init_lat.p50, rpc_lat.p50 + sled_lat.p50)
    );
    println!(
        "  (context) the same with the back-to-back no-op p50       = {:>6.2}x",
        ratio(init_lat.p50, hot_rpc_lat.p50 + sled_lat.p50)
    );
    println!(
        "  coordinator requests/s at {} ids / gRPC no-op at {}  = {:>6.3}    (target >= 0.7; {:.0} req/s)",
        a.concurrency,
        a.concurrency,
        cycle_requests / rpc_tput,
        cycle_requests
    );
    if let (Some(rpc_cpu), Some(cycle_cpu)) = (rpc.cpu_us_per_op(), cycle_tally.cpu_us_per_op()) {
        println!(
            "  (context) process CPU per coordinator request / per no-op = {:>6.2}x   ({:.1} us vs {:.1} us)",
            cycle_cpu / 3.0 / rpc_cpu,
            cycle_cpu / 3.0,
            rpc_cpu
        );
    }
    if let (Some(rpc_cpu), Some(refused_cpu)) = (rpc.cpu_us_per_op(), refused.cpu_us_per_op()) {
        println!(
            "  (context) a request refused at decode / no-op: {:.3} x the requests/s, {:.2}x the CPU ({:.1} us)",
            refused.per_second() / rpc_tput,
            refused_cpu / rpc_cpu,
            refused_cpu
        );
    }
    println!(
        "  (context) the same cycle over Kafka's protocol: {:.0} req/s = {:.3} x the gRPC no-op, {:.3} x a Kafka no-op",
        3.0 * kafka_cycle_tput,
        3.0 * kafka_cycle_tput / rpc_tput,
        3.0 * kafka_cycle_tput / kafka_rpc_tput
    );
    println!(
        "  CONCURRENT_TRANSACTIONS retries per cycle               = {:>6.3}    (target < 0.1; {} in {:.0} cycles)",
        cycle_retries as f64 / cycle_count.max(1.0),
        cycle_retries,
        cycle_count
    );

    drop(db);
    let _ = stop_tx.send(());
    server.await??;
    Ok(())
}
