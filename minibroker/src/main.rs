//! `minibroker`: the mini-broker command line. See `minibroker --help`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use minibroker::{bench, demo, process, EmbeddedCluster, EmbeddedOptions};
use producer_client::{
    Admin, ClientConfig, Consumer, IdempotentProducer, Isolation, TopicPartition,
    TransactionalProducer,
};
use serde_json::json;

/// mini-broker: Kafka's producer fencing (InitProducerId, epochs, transactions), runnable.
#[derive(Parser, Debug)]
#[command(name = "minibroker", version, about)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug, Clone)]
struct Target {
    /// Cluster topology file (as written by `minibroker dev`).
    #[arg(long, global = true, env = "TOPOLOGY")]
    topology: Option<std::path::PathBuf>,
    /// Address(es) of any node, comma-separated (instead of --topology).
    #[arg(long, global = true, env = "BOOTSTRAP", value_delimiter = ',')]
    bootstrap: Vec<String>,
}

impl Target {
    fn config(&self) -> anyhow::Result<ClientConfig> {
        if !self.bootstrap.is_empty() {
            return Ok(ClientConfig::new(self.bootstrap.clone()));
        }
        let Some(path) = &self.topology else {
            bail!("no cluster given: pass --topology FILE (or set TOPOLOGY), or --bootstrap ADDR; `minibroker dev` starts a local cluster and prints its topology file");
        };
        let topology = cluster::Topology::load(path)?;
        Ok(ClientConfig::new(
            topology
                .coordinators
                .iter()
                .chain(&topology.leaders)
                .map(|n| n.address.clone()),
        ))
    }

    fn given(&self) -> bool {
        self.topology.is_some() || !self.bootstrap.is_empty()
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the fencing story of the seed on an embedded cluster and verify it.
    Demo {
        /// Transactions instance A commits before it stalls.
        #[arg(long, default_value_t = 3)]
        transactions: usize,
        /// Records per partition per transaction.
        #[arg(long, default_value_t = 2)]
        records: usize,
        /// DANGER: run partition leaders without the epoch check (the checker must fail).
        #[arg(long, hide = true)]
        unsafe_skip_epoch_check: bool,
    },
    /// Run an embedded cluster in the foreground (until ctrl-c) and print its topology.
    Dev {
        /// Keep data here instead of a temporary directory.
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// Listen on fixed ports from here (coordinators first, then leaders).
        #[arg(long)]
        base_port: Option<u16>,
        /// Also copy the topology file to this path.
        #[arg(long)]
        write_topology: Option<std::path::PathBuf>,
        /// Write the Kafka bootstrap list (`host:port,...`, every node's Kafka listener) here.
        #[arg(long)]
        kafka_bootstrap_file: Option<std::path::PathBuf>,
    },
    /// Produce records, transactionally or idempotently.
    Produce(ProduceArgs),
    /// Read records from a topic.
    Consume(ConsumeArgs),
    /// Inspect transactions at the coordinators.
    Transactions {
        #[command(subcommand)]
        command: TransactionsCommand,
    },
    /// Show a partition leader's producer state for TOPIC PARTITION.
    Producers {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// Run the exactly-once consume-transform-produce application.
    Process(ProcessArgs),
    /// Benchmark the transactional producer against the idempotent one.
    Bench(BenchArgs),
}

#[derive(Subcommand, Debug)]
enum TransactionsCommand {
    /// Every transactional id on every coordinator.
    List {
        /// Only these states (e.g. ongoing, prepare-commit).
        #[arg(long = "state", value_enum)]
        states: Vec<StateArg>,
    },
    /// One transactional id in detail.
    Describe {
        /// The transactional id.
        id: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum StateArg {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl From<StateArg> for proto::TxnState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Empty => proto::TxnState::Empty,
            StateArg::Ongoing => proto::TxnState::Ongoing,
            StateArg::PrepareCommit => proto::TxnState::PrepareCommit,
            StateArg::PrepareAbort => proto::TxnState::PrepareAbort,
            StateArg::CompleteCommit => proto::TxnState::CompleteCommit,
            StateArg::CompleteAbort => proto::TxnState::CompleteAbort,
        }
    }
}

#[derive(Args, Debug)]
struct ProduceArgs {
    /// Topic to write.
    #[arg(long, default_value = "input")]
    topic: String,
    /// Transactional id (transactional producer). Without it, --idempotent is implied.
    #[arg(long, conflicts_with = "idempotent")]
    transactional_id: Option<String>,
    /// Use the idempotent (non-transactional) producer.
    #[arg(long)]
    idempotent: bool,
    /// Number of records.
    #[arg(long, default_value_t = 10)]
    records: u64,
    /// Records per transaction.
    #[arg(long, default_value_t = 10)]
    per_txn: u64,
    /// Abort every K-th transaction instead of committing it (0: never).
    #[arg(long, default_value_t = 0)]
    abort_every: u64,
    /// Write every record to this partition (default: round robin).
    #[arg(long)]
    partition: Option<i32>,
    /// Value prefix; values are `<prefix>-<n>`.
    #[arg(long, default_value = "record")]
    value_prefix: String,
    /// Pad values to this many bytes.
    #[arg(long, default_value_t = 0)]
    size: usize,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum IsolationArg {
    /// Kafka's `read_committed` (also accepted with the underscore).
    #[value(alias = "read_committed")]
    ReadCommitted,
    /// Kafka's `read_uncommitted` (also accepted with the underscore).
    #[value(alias = "read_uncommitted")]
    ReadUncommitted,
}

#[derive(Args, Debug)]
struct ConsumeArgs {
    /// Topic to read.
    #[arg(long, default_value = "input")]
    topic: String,
    /// What to see.
    #[arg(long, value_enum, default_value = "read-committed")]
    isolation: IsolationArg,
    /// Start at offset 0 (default: at the current end).
    #[arg(long)]
    from_beginning: bool,
    /// Start at this group's committed offsets.
    #[arg(long, conflicts_with = "from_beginning")]
    group: Option<String>,
    /// Keep waiting for new records (until ctrl-c).
    #[arg(long)]
    follow: bool,
    /// Stop after this many records.
    #[arg(long)]
    max: Option<usize>,
}

#[derive(Args, Debug)]
struct ProcessArgs {
    /// Input topic.
    #[arg(long, default_value = "input")]
    input: String,
    /// Output topic.
    #[arg(long, default_value = "output")]
    output: String,
    /// Consumer group (its offsets are committed in the transactions).
    #[arg(long, default_value = "processor")]
    group: String,
    /// Transactional id.
    #[arg(long, default_value = "processor-1")]
    transactional_id: String,
    /// Largest number of records per transaction.
    #[arg(long, default_value_t = 500)]
    max_per_txn: usize,
    /// Exit once the input was idle this many milliseconds (default: run until ctrl-c).
    #[arg(long)]
    until_idle_ms: Option<u64>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Seconds per phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Record value size in bytes.
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Records per transaction.
    #[arg(long, default_value_t = 100)]
    per_txn: usize,
    /// Records per Produce request.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Commit interval of the paced phase, ms.
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// Topic.
    #[arg(long, default_value = "input")]
    topic: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let json = cli.json;
    match cli.command {
        Command::Demo {
            transactions,
            records,
            unsafe_skip_epoch_check,
        } => {
            let summary = demo::run(demo::DemoOptions {
                committed_transactions: transactions,
                records_per_partition: records,
                unsafe_skip_epoch_check,
                verbose: true,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string(&summary)?);
            }
            Ok(if summary.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Dev {
            data_dir,
            base_port,
            write_topology,
            kafka_bootstrap_file,
        } => {
            dev(
                data_dir,
                base_port,
                write_topology,
                kafka_bootstrap_file,
                json,
            )
            .await
        }
        Command::Produce(args) => produce(cli.target.config()?, args, json).await,
        Command::Consume(args) => consume(cli.target.config()?, args, json).await,
        Command::Transactions { command } => {
            transactions(cli.target.config()?, command, json).await
        }
        Command::Producers { topic, partition } => {
            let admin = Admin::new(cli.target.config()?.with_max_retries(15))?;
            let producers = admin.describe_producers(&topic, partition).await?;
            if json {
                let list: Vec<_> = producers
                    .iter()
                    .map(|p| {
                        json!({"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
                        "last_sequence": p.last_sequence, "last_timestamp_ms": p.last_timestamp_ms,
                        "current_txn_start_offset": p.current_txn_start_offset,
                        "coordinator_generation": p.coordinator_generation})
                    })
                    .collect();
                println!("{}", serde_json::to_string(&list)?);
            } else if producers.is_empty() {
                println!("no producer state on {topic}-{partition}");
            } else {
                println!(
                    "{:>8} {:>6} {:>9} {:>14} {:>11}",
                    "PID", "EPOCH", "LAST SEQ", "TXN START OFF", "COORD GEN"
                );
                for p in producers {
                    println!(
                        "{:>8} {:>6} {:>9} {:>14} {:>11}",
                        p.producer_id,
                        p.producer_epoch,
                        p.last_sequence,
                        if p.current_txn_start_offset < 0 {
                            "-".to_string()
                        } else {
                            p.current_txn_start_offset.to_string()
                        },
                        p.coordinator_generation
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Process(args) => {
            let options = process::ProcessOptions {
                input: args.input,
                output: args.output,
                group: args.group,
                transactional_id: args.transactional_id,
                max_records_per_txn: args.max_per_txn.max(1),
                stop_when_idle: args.until_idle_ms.map(Duration::from_millis),
            };
            let mut last = Instant::now();
            let stats = process::run(cli.target.config()?, options, ctrl_c(), |s| {
                if !json && last.elapsed() >= Duration::from_secs(1) {
                    last = Instant::now();
                    eprintln!(
                        "processed {} records in {} transactions (PID {}, epoch {})",
                        s.records, s.transactions, s.producer_id, s.epoch
                    );
                }
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string(&stats)?);
            } else {
                println!(
                    "processed {} records in {} committed transactions ({} aborted)",
                    stats.records, stats.transactions, stats.aborted
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => {
            let options = bench::BenchOptions {
                topic: args.topic,
                duration: Duration::from_secs(args.seconds.max(1)),
                record_size: args.record_size,
                records_per_txn: args.per_txn.max(1),
                batch: args.batch.max(1),
                commit_interval: Duration::from_millis(args.commit_interval_ms),
            };
            let (config, cluster) = if cli.target.given() {
                (cli.target.config()?, None)
            } else {
                let cluster = EmbeddedCluster::start().await?;
                if !json {
                    eprintln!(
                        "benchmarking against an embedded cluster in {}",
                        cluster.dir().display()
                    );
                }
                (cluster.client_config(), Some(cluster))
            };
            let report = bench::run(config, options, |p| {
                if !json {
                    eprintln!(
                        "{:<24} {:>9.0} records/s  {:>7.2} MiB/s",
                        p.name, p.records_per_sec, p.mib_per_sec
                    );
                }
            })
            .await?;
            if let Some(cluster) = cluster {
                let _ = cluster.shutdown().await;
            }
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!(
                    "{:<24} {:>12} {:>10} {:>8} {:>10} {:>10}",
                    "PHASE", "RECORDS/S", "MIB/S", "TXNS", "COMMIT P50", "COMMIT P99"
                );
                for p in [
                    &report.idempotent,
                    &report.transactional_paced,
                    &report.transactional_saturated,
                ] {
                    println!(
                        "{:<24} {:>12.0} {:>10.2} {:>8} {:>8.1}ms {:>8.1}ms",
                        p.name,
                        p.records_per_sec,
                        p.mib_per_sec,
                        p.transactions,
                        p.commit_p50_ms,
                        p.commit_p99_ms
                    );
                }
                println!(
                    "overhead ratio (idempotent / transactional saturated): {:.2}x",
                    report.overhead_ratio
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn dev(
    data_dir: Option<std::path::PathBuf>,
    base_port: Option<u16>,
    write_topology: Option<std::path::PathBuf>,
    kafka_bootstrap_file: Option<std::path::PathBuf>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let cluster = EmbeddedCluster::start_with(EmbeddedOptions {
        data_dir,
        base_port,
        ..EmbeddedOptions::default()
    })
    .await?;
    let path = match write_topology {
        Some(path) => {
            std::fs::copy(cluster.topology_path(), &path)
                .with_context(|| format!("cannot write the topology to {}", path.display()))?;
            path
        }
        None => cluster.topology_path().to_path_buf(),
    };
    let topology = cluster.topology();
    let kafka_bootstrap = cluster.kafka_bootstrap().join(",");
    if let Some(file) = &kafka_bootstrap_file {
        std::fs::write(file, format!("{kafka_bootstrap}\n")).with_context(|| {
            format!(
                "cannot write the Kafka bootstrap list to {}",
                file.display()
            )
        })?;
    }
    if json {
        println!(
            "{}",
            json!({"topology": path, "data_dir": cluster.dir(), "kafka_bootstrap": kafka_bootstrap,
                "coordinators": topology.coordinators.iter().map(|n| json!({"id": n.id, "address": n.address})).collect::<Vec<_>>(),
                "leaders": topology.leaders.iter().map(|n| json!({"id": n.id, "address": n.address})).collect::<Vec<_>>()})
        );
    } else {
        println!("mini-broker dev cluster is running (ctrl-c to stop)");
        println!("  topology: {}", path.display());
        println!("  data:     {}", cluster.dir().display());
        println!("  kafka:    {kafka_bootstrap}");
        for n in &topology.coordinators {
            println!("  coordinator {:>3}  {}", n.id, n.address);
        }
        for n in &topology.leaders {
            let parts: Vec<String> = topology
                .partitions_led_by(n.id)
                .iter()
                .map(|(t, p)| format!("{t}-{p}"))
                .collect();
            println!(
                "  leader      {:>3}  {}  ({})",
                n.id,
                n.address,
                parts.join(", ")
            );
        }
        println!("\ntry:\n  export TOPOLOGY={}", path.display());
        println!("  minibroker produce --transactional-id app-1 --records 100 --per-txn 10 --abort-every 3");
        println!("  minibroker consume --from-beginning");
        println!("  minibroker transactions list");
        println!("  kcat -b {kafka_bootstrap} -L");
    }
    ctrl_c().await;
    if !json {
        println!("stopping");
    }
    cluster.shutdown().await?;
    Ok(ExitCode::SUCCESS)
}

async fn produce(config: ClientConfig, args: ProduceArgs, json: bool) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(config.clone())?;
    let partitions = admin
        .metadata()
        .await?
        .partition_count(&args.topic)
        .with_context(|| format!("topic {} does not exist", args.topic))?;
    let value = |n: u64| {
        let mut v = format!("{}-{n}", args.value_prefix).into_bytes();
        if v.len() < args.size {
            v.resize(args.size, b'.');
        }
        v
    };
    let partition_of = |n: u64| args.partition.unwrap_or((n % partitions as u64) as i32);
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let mut progress = |done: u64| {
        if !json && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            eprintln!(
                "produced {done}/{} records ({:.0}/s)",
                args.records,
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    };
    let (mut committed, mut aborted, mut txns, mut aborted_txns) = (0u64, 0u64, 0u64, 0u64);
    let (pid, epoch);
    match &args.transactional_id {
        None => {
            let mut producer = IdempotentProducer::connect(config).await?;
            for n in 0..args.records {
                producer
                    .send(&args.topic, partition_of(n), value(n))
                    .await?;
                committed += 1;
                progress(committed);
            }
            (pid, epoch) = (producer.producer_id(), producer.epoch());
        }
        Some(id) => {
            let mut producer =
                TransactionalProducer::connect(config.with_transactional_id(id)).await?;
            producer.init_transactions().await?;
            if !json {
                eprintln!(
                    "initialised {id}: PID {} epoch {}",
                    producer.producer_id(),
                    producer.epoch()
                );
            }
            let per_txn = args.per_txn.max(1);
            let mut n = 0;
            let outcome: Result<(), producer_client::Error> = async {
                while n < args.records {
                    txns += 1;
                    producer.begin_transaction()?;
                    let end = (n + per_txn).min(args.records);
                    for i in n..end {
                        producer
                            .send(&args.topic, partition_of(i), value(i))
                            .await?;
                    }
                    if args.abort_every > 0 && txns % args.abort_every == 0 {
                        producer.abort_transaction().await?;
                        aborted += end - n;
                        aborted_txns += 1;
                    } else {
                        producer.commit_transaction().await?;
                        committed += end - n;
                    }
                    n = end;
                    progress(n);
                }
                Ok(())
            }
            .await;
            if let Err(error) = outcome {
                // What an application does with a failed transaction: abort it. For a zombie
                // (its epoch is older than the current one) the abort is what reveals the
                // fence: the coordinator answers PRODUCER_FENCED.
                let first = error.to_string();
                let error = if error.is_abortable() {
                    match producer.abort_transaction().await {
                        Err(abort_error) if abort_error.is_fatal() => abort_error,
                        _ => error,
                    }
                } else {
                    error
                };
                let fenced = error.is_fatal();
                let (pid, epoch) = (producer.producer_id(), producer.epoch());
                let sentence = match (fenced, first == error.to_string()) {
                    (true, true) => format!(
                        "{id} was fenced by a newer instance (PID {pid} epoch {epoch} is stale): {error}; stopping without committing"
                    ),
                    (true, false) => format!(
                        "{id} was fenced by a newer instance (PID {pid} epoch {epoch} is stale): {first}; the abort that followed got {error}; stopping without committing"
                    ),
                    (false, _) => format!("{id}: the transaction failed and was aborted: {first}"),
                };
                if json {
                    println!(
                        "{}",
                        json!({"topic": args.topic, "transactional": true,
                            "records_committed": committed, "records_aborted": aborted,
                            "transactions": txns, "transactions_aborted": aborted_txns,
                            "producer_id": producer.producer_id(),
                            "producer_epoch": producer.epoch(),
                            "error": error.code_name(), "fenced": fenced,
                            "seconds": started.elapsed().as_secs_f64()})
                    );
                }
                eprintln!("error: {sentence}");
                return Ok(ExitCode::FAILURE);
            }
            (pid, epoch) = (producer.producer_id(), producer.epoch());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            json!({"topic": args.topic, "transactional": args.transactional_id.is_some(),
                "records_committed": committed, "records_aborted": aborted,
                "transactions": txns, "transactions_aborted": aborted_txns,
                "producer_id": pid, "producer_epoch": epoch, "seconds": seconds})
        );
    } else if args.transactional_id.is_some() {
        println!(
            "{committed} records committed, {aborted} aborted, in {txns} transactions ({aborted_txns} aborted); PID {pid} epoch {epoch}; {seconds:.2}s"
        );
    } else {
        println!("{committed} records written idempotently; PID {pid}; {seconds:.2}s");
    }
    Ok(ExitCode::SUCCESS)
}

async fn consume(config: ClientConfig, args: ConsumeArgs, json: bool) -> anyhow::Result<ExitCode> {
    let isolation = match args.isolation {
        IsolationArg::ReadCommitted => Isolation::ReadCommitted,
        IsolationArg::ReadUncommitted => Isolation::ReadUncommitted,
    };
    let admin = Admin::new(config.clone())?;
    let mut consumer = Consumer::new(config, isolation)?;
    consumer.assign_topics(&[&args.topic]).await?;
    if let Some(group) = &args.group {
        consumer.seek_to_committed(group).await?;
    } else if !args.from_beginning {
        for (partition, (hw, lso)) in admin.end_offsets(&args.topic).await? {
            let end = if isolation == Isolation::ReadCommitted {
                lso
            } else {
                hw
            };
            consumer.seek(&TopicPartition::new(&args.topic, partition), end)?;
        }
    }
    let mut count = 0usize;
    let stop = ctrl_c();
    tokio::pin!(stop);
    loop {
        let records = tokio::select! {
            _ = &mut stop => break,
            r = consumer.poll(Duration::from_millis(500)) => r?,
        };
        let empty = records.is_empty();
        for r in records {
            let line = if json {
                format!(
                    "{}",
                    json!({"topic": r.partition.topic, "partition": r.partition.partition,
                        "offset": r.offset, "key": String::from_utf8_lossy(&r.key),
                        "value": String::from_utf8_lossy(&r.value), "producer_id": r.producer_id,
                        "producer_epoch": r.producer_epoch, "transactional": r.is_transactional})
                )
            } else {
                format!(
                    "{}@{:<6} pid={} epoch={} {}{}",
                    r.partition,
                    r.offset,
                    r.producer_id,
                    r.producer_epoch,
                    if r.key.is_empty() {
                        String::new()
                    } else {
                        format!("key={} ", String::from_utf8_lossy(&r.key))
                    },
                    String::from_utf8_lossy(&r.value)
                )
            };
            // A closed stdout (`| head`) ends the command quietly.
            if writeln!(std::io::stdout().lock(), "{line}").is_err() {
                return Ok(ExitCode::SUCCESS);
            }
            count += 1;
            if args.max.is_some_and(|m| count >= m) {
                break;
            }
        }
        if args.max.is_some_and(|m| count >= m) {
            break;
        }
        if empty && !args.follow && consumer.caught_up() {
            break;
        }
    }
    if !json {
        eprintln!("{count} records");
    }
    Ok(ExitCode::SUCCESS)
}

fn state_name(state: i32) -> String {
    proto::TxnState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("TXN_STATE_").to_string())
        .unwrap_or_else(|_| format!("UNKNOWN({state})"))
}

async fn transactions(
    config: ClientConfig,
    command: TransactionsCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(config)?;
    match command {
        TransactionsCommand::List { states } => {
            let states: Vec<proto::TxnState> = states.into_iter().map(Into::into).collect();
            let list = admin.list_transactions(&states).await?;
            if json {
                let list: Vec<_> = list
                    .iter()
                    .map(|(c, t)| {
                        json!({"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                        "state": state_name(t.state), "coordinator_id": c})
                    })
                    .collect();
                println!("{}", serde_json::to_string(&list)?);
            } else if list.is_empty() {
                println!("no transactional ids");
            } else {
                println!(
                    "{:<32} {:>8} {:<16} {:>11}",
                    "TRANSACTIONAL ID", "PID", "STATE", "COORDINATOR"
                );
                for (c, t) in list {
                    println!(
                        "{:<32} {:>8} {:<16} {:>11}",
                        t.transactional_id,
                        t.producer_id,
                        state_name(t.state),
                        c
                    );
                }
            }
        }
        TransactionsCommand::Describe { id } => {
            let d = admin.describe_transaction(&id).await?;
            let partitions: Vec<String> = d
                .partitions
                .iter()
                .map(|p| format!("{}-{}", p.topic, p.partition))
                .collect();
            if json {
                println!(
                    "{}",
                    json!({"transactional_id": d.transactional_id, "producer_id": d.producer_id,
                        "producer_epoch": d.producer_epoch, "last_epoch": d.last_epoch,
                        "previous_producer_id": d.previous_producer_id, "next_producer_id": d.next_producer_id,
                        "state": state_name(d.state), "transaction_timeout_ms": d.transaction_timeout_ms,
                        "partitions": partitions, "groups": d.groups,
                        "transaction_start_ms": d.transaction_start_ms, "last_update_ms": d.last_update_ms,
                        "age_ms": d.age_ms, "coordinator_id": d.coordinator_id})
                );
            } else {
                println!("transactional id   {}", d.transactional_id);
                println!("coordinator        {}", d.coordinator_id);
                println!("producer id        {}", d.producer_id);
                println!(
                    "epoch              {} (last epoch {})",
                    d.producer_epoch, d.last_epoch
                );
                println!(
                    "previous/next PID  {} / {}",
                    d.previous_producer_id, d.next_producer_id
                );
                println!("state              {}", state_name(d.state));
                println!("timeout            {} ms", d.transaction_timeout_ms);
                println!(
                    "partitions         {}",
                    if partitions.is_empty() {
                        "-".into()
                    } else {
                        partitions.join(", ")
                    }
                );
                println!(
                    "groups             {}",
                    if d.groups.is_empty() {
                        "-".into()
                    } else {
                        d.groups.join(", ")
                    }
                );
                println!("open for           {} ms", d.age_ms);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
