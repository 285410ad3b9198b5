//! Produce throughput of the partition leader next to a bare sled append + flush, measured in
//! the same run on the same disk: `cargo bench -p partition-leader --bench produce`.
//!
//! Records are 1 KiB values (8-byte keys); batches of 1 and of 100 records; one producer with one
//! request in flight (as an idempotent producer with max-in-flight 1), so each request pays one
//! flush. Rows:
//! - `bare sled`: a `sled::Batch` of the records under big-endian offset keys + `flush`;
//! - `bare sled, one value`: the same bytes as ONE sled value per batch + `flush` (how the
//!   engine lays a batch out since it stores runs of records, see `storage::RUN_BYTES`): the
//!   tighter baseline, printed beside the issue's;
//! - `engine write (log file)`: the leader's storage engine alone (`SledStorage::write`: one
//!   frame appended to the partition's log file, fdatasync, the sled checkpoint of the index,
//!   producer state and high watermark);
//! - `in-process`: `LeaderService::produce` called directly over that engine (the core checks,
//!   the append, the group flush), no network;
//! - `gRPC`: the same over loopback gRPC against `partition_leader::serve`, with the real
//!   coordinator for transactional verification (once per transaction per partition);
//! - `gRPC transport (rejected)`: the same requests to a partition the leader does not have,
//!   answered with an error before any check or storage: what gRPC alone costs (context);
//! - `gRPC 8 producers`: eight idempotent producers at once (one connection and one request in
//!   flight each) on the topic's three partitions, batches of 100: what the leader's group
//!   commit (many writes, one flush) makes of concurrent load. Its ratio is to the SAME
//!   single-stream bare sled row, which cannot share flushes.
//!
//! Idempotent = PID with sequences; transactional = the same inside one open transaction (the
//! EndTxn/marker cost is not part of the Produce path and is not measured here).
//!
//! fsync latency on a shared disk drifts a lot over seconds, so the rows are not run one after
//! the other: every row runs in [`ROUNDS`] short slices, round-robin, and its rate is its total
//! records over its total time. Environment: `BENCH_SECS` (per row, default 3); `BENCH_ONLY`
//! (run only the rows whose name contains it, plus the baselines; e.g. for `perf record`).

/// The allocator of the binaries (see their `main.rs`), so the bench measures what they run.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{ProducerEpoch, ProducerId, TopicPartition, Topology};
use partition_leader::core::{BatchMetadata, DataRecord, LogEntry, ProducerState};
use partition_leader::service::LeaderService;
use partition_leader::storage::{SledStorage, Storage, Write};
use partition_leader::verify::TxnVerifier;
use partition_leader::LeaderConfig;
use proto::partition_leader_client::PartitionLeaderClient;
use proto::partition_leader_server::PartitionLeader;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::{ProduceRequest, ProduceResponse, RecordBatch};
use tokio::sync::watch;
use tonic::transport::Channel;

const RECORD: usize = 1024;

const ROUNDS: u32 = 6;

fn bench_secs() -> Duration {
    let secs = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

fn records(n: usize, seq: i64) -> Vec<proto::Record> {
    (0..n)
        .map(|i| proto::Record {
            key: (seq + i as i64).to_be_bytes().to_vec(),
            null_key: false,
            value: vec![b'x'; RECORD],
            null_value: false,
            timestamp_ms: 1,
            headers: Vec::new(),
        })
        .collect()
}

struct AlwaysYes;

#[tonic::async_trait]
impl TxnVerifier for AlwaysYes {
    async fn verify(
        &self,
        _: &str,
        _: ProducerId,
        _: ProducerEpoch,
        _: &TopicPartition,
    ) -> Result<partition_leader::core::Verified, partition_leader::Error> {
        Ok(partition_leader::core::Verified::default())
    }
}

fn topology(coordinator: &str, leader: &str) -> Arc<Topology> {
    Arc::new(
        Topology::parse(&format!(
            "transaction_state_partitions = 1\n[[coordinators]]\nid = 1\naddress = \"{coordinator}\"\n\
             [[leaders]]\nid = 101\naddress = \"{leader}\"\n[[topics]]\nname = \"bench\"\nleaders = [101, 101, 101]\n"
        ))
        .unwrap(),
    )
}

fn check(r: &ProduceResponse) {
    assert_eq!(r.error_code, 0, "{}", r.error_message);
}

/// One producer's identity and next sequence.
struct Producer {
    partition: i32,
    pid: i64,
    epoch: i32,
    txn_id: Option<String>,
    seq: i64,
}

impl Producer {
    fn next(&mut self, batch: usize) -> ProduceRequest {
        let request = ProduceRequest {
            topic: "bench".into(),
            partition: self.partition,
            batch: Some(RecordBatch {
                producer_id: self.pid,
                producer_epoch: self.epoch,
                base_sequence: self.seq as i32,
                is_transactional: self.txn_id.is_some(),
                transactional_id: self.txn_id.clone().unwrap_or_default(),
                records: records(batch, self.seq),
            }),
        };
        self.seq += batch as i64;
        request
    }
}

enum Target {
    BareSled {
        db: sled::Db,
        tree: sled::Tree,
        offset: i64,
    },
    /// The same bytes as one value per batch.
    BareSledRun {
        db: sled::Db,
        tree: sled::Tree,
        offset: i64,
    },
    /// The storage engine alone: `SledStorage::write` (log file append, fdatasync, checkpoint).
    Engine(Arc<SledStorage>, i64),
    InProcess(LeaderService, Producer),
    Grpc(PartitionLeaderClient<Channel>, Producer),
    /// The same requests to an unknown partition: rejected before any check or storage, so
    /// this is the gRPC transport's own cost (encode, HTTP/2, decode, answer).
    GrpcRejected(PartitionLeaderClient<Channel>, Producer),
    /// Several producers at once, each with its own connection.
    GrpcMany(Vec<(PartitionLeaderClient<Channel>, Producer)>),
    /// Several producers at once, in-process (no network).
    InProcessMany(Vec<(LeaderService, Producer)>),
}

struct Row {
    name: String,
    batch: usize,
    target: Target,
    records: u64,
    elapsed: Duration,
}

impl Row {
    fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }
    fn mb_per_sec(&self) -> f64 {
        self.records_per_sec() * RECORD as f64 / (1024.0 * 1024.0)
    }

    /// Produces for about `slice`, adding to the row's totals.
    async fn run(&mut self, slice: Duration) {
        let start = Instant::now();
        let batch = self.batch;
        let mut n = 0u64;
        while start.elapsed() < slice {
            match &mut self.target {
                Target::BareSled { db, tree, offset } => {
                    let value = vec![b'x'; RECORD + 40];
                    let mut b = sled::Batch::default();
                    for _ in 0..batch {
                        b.insert(&offset.to_be_bytes(), value.as_slice());
                        *offset += 1;
                    }
                    tokio::task::block_in_place(|| {
                        tree.apply_batch(b).unwrap();
                        db.flush().unwrap();
                    });
                }
                Target::BareSledRun { db, tree, offset } => {
                    let value = vec![b'x'; (RECORD + 40) * batch];
                    tokio::task::block_in_place(|| {
                        tree.insert(offset.to_be_bytes(), value).unwrap();
                        db.flush().unwrap();
                    });
                    *offset += batch as i64;
                }
                Target::Engine(storage, offset) => {
                    let entries = (0..batch)
                        .map(|_| {
                            LogEntry::Data(DataRecord {
                                producer_id: 1,
                                producer_epoch: 0,
                                is_transactional: false,
                                key: offset.to_be_bytes().to_vec(),
                                null_key: false,
                                value: vec![b'x'; RECORD],
                                null_value: false,
                                timestamp_ms: 1,
                                headers: Vec::new(),
                            })
                        })
                        .collect();
                    let state = ProducerState {
                        epoch: 0,
                        batches: [BatchMetadata {
                            first_seq: *offset as i32,
                            last_seq: (*offset + batch as i64 - 1) as i32,
                            base_offset: *offset,
                        }]
                        .into(),
                        txn_first_offset: None,
                        txn_number: None,
                        ended_number: None,
                        coordinator_generation: -1,
                        last_update_ms: 1,
                    };
                    let write = Write {
                        base_offset: *offset,
                        entries,
                        producer: Some((1, state)),
                        aborted: None,
                        high_watermark: *offset + batch as i64,
                    };
                    *offset += batch as i64;
                    let tp = TopicPartition::new(format!("engine-{batch}"), 0);
                    tokio::task::block_in_place(|| storage.write(&tp, &write).unwrap());
                }
                Target::InProcess(service, producer) => {
                    let request = tonic::Request::new(producer.next(batch));
                    if std::env::var("SPAWNED").is_ok() {
                        let s = service.clone();
                        check(
                            &tokio::spawn(async move { s.produce(request).await })
                                .await
                                .unwrap()
                                .unwrap()
                                .into_inner(),
                        );
                    } else {
                        check(&service.produce(request).await.unwrap().into_inner());
                    }
                }
                Target::Grpc(client, producer) => {
                    let request = producer.next(batch);
                    check(&client.produce(request).await.unwrap().into_inner());
                }
                Target::GrpcRejected(client, producer) => {
                    let mut request = producer.next(batch);
                    request.topic = "no-such-topic".into();
                    let r = client.produce(request).await.unwrap().into_inner();
                    assert_ne!(r.error_code, 0);
                }
                Target::InProcessMany(producers) => {
                    let tasks: Vec<_> = producers
                        .drain(..)
                        .map(|(service, mut producer)| {
                            tokio::spawn(async move {
                                let mut sent = 0u64;
                                while start.elapsed() < slice {
                                    let request = tonic::Request::new(producer.next(batch));
                                    check(&service.produce(request).await.unwrap().into_inner());
                                    sent += batch as u64;
                                }
                                (service, producer, sent)
                            })
                        })
                        .collect();
                    for task in tasks {
                        let (service, producer, sent) = task.await.unwrap();
                        producers.push((service, producer));
                        n += sent;
                    }
                    continue;
                }
                Target::GrpcMany(producers) => {
                    let tasks: Vec<_> = producers
                        .drain(..)
                        .map(|(mut client, mut producer)| {
                            tokio::spawn(async move {
                                let mut sent = 0u64;
                                while start.elapsed() < slice {
                                    let request = producer.next(batch);
                                    check(&client.produce(request).await.unwrap().into_inner());
                                    sent += batch as u64;
                                }
                                (client, producer, sent)
                            })
                        })
                        .collect();
                    for task in tasks {
                        let (client, producer, sent) = task.await.unwrap();
                        producers.push((client, producer));
                        n += sent;
                    }
                    continue;
                }
            }
            n += batch as u64;
        }
        self.records += n;
        self.elapsed += start.elapsed();
    }
}

async fn transactional_producer(
    c: &mut TransactionCoordinatorClient<Channel>,
    txn_id: &str,
) -> Producer {
    let init = loop {
        let r = c
            .init_producer_id(proto::InitProducerIdRequest {
                transactional_id: Some(txn_id.into()),
                transaction_timeout_ms: 900_000,
                expected_producer_id: -1,
                expected_producer_epoch: -1,
                transaction_version: 2,
            })
            .await
            .unwrap()
            .into_inner();
        if r.error_code == 0 {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let r = c
        .add_partitions_to_txn(proto::AddPartitionsToTxnRequest {
            transactional_id: txn_id.into(),
            producer_id: init.producer_id,
            producer_epoch: init.producer_epoch,
            partitions: vec![proto::TopicPartition {
                topic: "bench".into(),
                partition: 0,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.error_code, 0, "{}", r.error_message);
    Producer {
        partition: 0,
        pid: init.producer_id,
        epoch: init.producer_epoch,
        txn_id: Some(txn_id.into()),
        seq: 0,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().unwrap()).collect();

    // Bare sled.
    let db = sled::open(dirs[0].path()).unwrap();
    // The leader's storage engine alone.
    let engine = Arc::new(SledStorage::open(dirs[4].path()).unwrap());
    // In-process leader (verification always succeeds).
    let in_process = {
        let config = LeaderConfig::new(101, dirs[1].path(), topology("127.0.0.1:1", "127.0.0.1:2"));
        let storage = Arc::new(SledStorage::open(dirs[1].path()).unwrap());
        let (stop, stop_rx) = watch::channel(false);
        std::mem::forget(stop);
        LeaderService::open(&config, storage, Arc::new(AlwaysYes), stop_rx).unwrap()
    };
    // Real coordinator + leader over loopback gRPC.
    let cl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ll = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (caddr, laddr) = (cl.local_addr().unwrap(), ll.local_addr().unwrap());
    let grpc_topology = topology(&caddr.to_string(), &laddr.to_string());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (mut rx1, mut rx2) = (stop_rx.clone(), stop_rx);
    let mut coordinator_config =
        coordinator::CoordinatorConfig::new(1, dirs[2].path(), grpc_topology.clone());
    coordinator_config.cluster_secret = Some(testkit::auth::secret());
    let mut leader_config = LeaderConfig::new(101, dirs[3].path(), grpc_topology);
    leader_config.cluster_secret = Some(testkit::auth::secret());
    let coordinator = tokio::spawn(coordinator::serve(coordinator_config, cl, async move {
        let _ = rx1.changed().await;
    }));
    let leader = tokio::spawn(partition_leader::serve(leader_config, ll, async move {
        let _ = rx2.changed().await;
    }));
    let endpoint = |a: std::net::SocketAddr| {
        cluster::node::grpc_endpoint(
            tonic::transport::Endpoint::from_shared(format!("http://{a}")).unwrap(),
        )
        .connect_lazy()
    };
    let client = PartitionLeaderClient::new(endpoint(laddr));
    let mut tc = TransactionCoordinatorClient::new(endpoint(caddr));

    let mut rows = Vec::new();
    for batch in [1usize, 100] {
        let b = batch as i64;
        let row = |name: &str, target| Row {
            name: name.into(),
            batch,
            target,
            records: 0,
            elapsed: Duration::ZERO,
        };
        let tree = db.open_tree(format!("records/{batch}/bench")).unwrap();
        rows.push(row(
            "bare sled append+flush",
            Target::BareSled {
                db: db.clone(),
                tree,
                offset: 0,
            },
        ));
        rows.push(row(
            "bare sled, one value",
            Target::BareSledRun {
                db: db.clone(),
                tree: db.open_tree(format!("runs/{batch}/bench")).unwrap(),
                offset: 0,
            },
        ));
        rows.push(row(
            "engine write (log file)",
            Target::Engine(engine.clone(), 0),
        ));
        let idempotent = |pid| Producer {
            partition: 0,
            pid,
            epoch: 0,
            txn_id: None,
            seq: 0,
        };
        rows.push(row(
            "in-process idempotent",
            Target::InProcess(in_process.clone(), idempotent(1000 + b)),
        ));
        let mut txn = idempotent(2000 + b);
        txn.txn_id = Some(format!("in-process-{batch}"));
        rows.push(row(
            "in-process transactional",
            Target::InProcess(in_process.clone(), txn),
        ));
        rows.push(row(
            "gRPC idempotent",
            Target::Grpc(client.clone(), idempotent(3000 + b)),
        ));
        let txn = transactional_producer(&mut tc, &format!("grpc-{batch}")).await;
        rows.push(row("gRPC transactional", Target::Grpc(client.clone(), txn)));
        rows.push(row(
            "gRPC transport (rejected)",
            Target::GrpcRejected(client.clone(), idempotent(5000 + b)),
        ));
        if batch == 100 {
            let many = (0..8)
                .map(|i| {
                    let mut producer = idempotent(4000 + i);
                    producer.partition = (i % 3) as i32;
                    (PartitionLeaderClient::new(endpoint(laddr)), producer)
                })
                .collect();
            rows.push(row("gRPC 8 producers", Target::GrpcMany(many)));
            let many = (0..8)
                .map(|i| {
                    let mut producer = idempotent(6000 + i);
                    producer.partition = (i % 3) as i32;
                    (in_process.clone(), producer)
                })
                .collect();
            rows.push(row("in-process 8 producers", Target::InProcessMany(many)));
        }
    }
    // `BENCH_ONLY=<text>`: only the rows whose name contains it (and the bare baselines).
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        rows.retain(|r| r.name.contains(&only) || r.name.starts_with("bare sled"));
    }
    // Warm-up (connections, verification, tree creation), not counted.
    for row in &mut rows {
        row.run(Duration::from_millis(50)).await;
        row.records = 0;
        row.elapsed = Duration::ZERO;
    }
    let slice = bench_secs() / ROUNDS;
    for _ in 0..ROUNDS {
        for row in &mut rows {
            row.run(slice).await;
        }
    }

    println!(
        "{:<28} {:>6} {:>11} {:>9} {:>9}",
        "produce path (1 KiB records)", "batch", "records/s", "MB/s", "vs sled"
    );
    for row in &rows {
        let base = rows
            .iter()
            .find(|r| r.batch == row.batch && matches!(r.target, Target::BareSled { .. }))
            .unwrap()
            .records_per_sec();
        println!(
            "{:<28} {:>6} {:>11.0} {:>9.2} {:>8.2}x",
            row.name,
            row.batch,
            row.records_per_sec(),
            row.mb_per_sec(),
            row.records_per_sec() / base
        );
    }
    let rate = |name: &str| {
        rows.iter()
            .find(|r| r.batch == 100 && r.name == name)
            .map_or(0.0, Row::records_per_sec)
    };
    let bare = rate("bare sled append+flush");
    let run = rate("bare sled, one value");
    println!("\ntargets (issue 10), batches of 100, ratios to bare sled append+flush (and to the");
    println!("same bytes as one sled value per batch, the tighter baseline):");
    println!(
        "  gRPC idempotent, one request in flight:       {:.2}x (target >= 0.9x); {:.2}x one value",
        rate("gRPC idempotent") / bare,
        rate("gRPC idempotent") / run
    );
    println!(
        "  gRPC 8 producers, 3 partitions (group commit): {:.2}x (target >= 2x); {:.2}x one value",
        rate("gRPC 8 producers") / bare,
        rate("gRPC 8 producers") / run
    );
    drop(rows);
    drop(client);
    let _ = stop_tx.send(true);
    leader.await.unwrap().unwrap();
    let _ = coordinator.await;
}
