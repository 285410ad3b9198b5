//! Mutated Kafka requests against every node of a running cluster: no input, however forged,
//! may panic a node, abort the process, or stop it serving the next client.
//!
//! How: a valid request of every API and version that the node's role serves (built with the
//! kafka-protocol schemas, filled with a live transactional id, its PID and epoch, a group, the
//! cluster's topics and a record batch, so that a mutation reaches the handlers and not only the
//! header decoder) is encoded, then mutated with a seeded generator: bit flips, bytes and
//! 16/32-bit words set to boundary values (0, -1, MIN, MAX, a huge length), cuts, inserted and
//! repeated runs. Each frame goes to a coordinator or a partition leader over its Kafka
//! listener; the node answers, or closes the connection, or keeps the request waiting (a
//! JoinGroup, a long poll), which the sender stops waiting for after a short while and goes on
//! on a new connection. Several senders run at once, so that requests also race each other.
//!
//! Checked: no panic anywhere in the process (a panic hook counts them: a panic in a node's
//! task would otherwise only cost a connection, unseen), the process is alive (an allocation
//! abort ends the test binary), every node still answers ApiVersions, no producer id's epoch goes
//! down within a partition's log (no zombie write got through), what the leaders stored
//! reads to its end and reads the same after every node restarted (recovery parses it), and
//! the cluster still runs a transaction that a read_committed reader sees exactly once.
//!
//! Size: `MINIBROKER_FUZZ_FRAMES` frames (default 10,000: a few seconds in a debug build),
//! seeded by `MINIBROKER_FUZZ_SEED` (default fixed, so a failure reproduces; the seed is
//! printed). A longer run: `MINIBROKER_FUZZ_FRAMES=200000 MINIBROKER_FUZZ_SEED=$RANDOM cargo
//! test --release -p integration-tests --test kafka_fuzz -- --nocapture`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use integration_tests::*;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kafka_wire::apis::{ApiRange, COMMON_APIS, COORDINATOR_APIS, LEADER_APIS};
use minibroker::{EmbeddedCluster, EmbeddedOptions};
use producer_client::Isolation;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TXN: &str = "fuzz-txn";
const GROUP: &str = "fuzz-group";
const TOPIC: &str = "input";

/// How long a sender waits for an answer before it gives up on the connection (a request
/// that legitimately waits: a JoinGroup for its rebalance, a Fetch's long poll).
const ANSWER_WAIT: Duration = Duration::from_millis(300);

/// Panics seen anywhere in the process since the hook was installed, with their messages.
static PANICS: AtomicU64 = AtomicU64::new(0);
static PANIC_MESSAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn count_panics() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut messages) = PANIC_MESSAGES.lock() {
                messages.push(info.to_string());
            }
            previous(info);
        }));
    });
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const BYTES: &[u8] = &[0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff];
const WORDS: &[i32] = &[
    0,
    -1,
    1,
    i32::MAX,
    i32::MIN,
    0x7fff,
    -0x8000,
    0xffff,
    1 << 20,
    1 << 28,
];

/// One to four mutations of `frame` (a request without its length prefix). The API key and
/// version (the first four bytes) are kept nine times in ten, so that most frames reach the
/// decoder and handler of an API the node serves.
fn mutate(rng: &mut Rng, frame: &[u8]) -> Vec<u8> {
    let mut out = frame.to_vec();
    let keep = if rng.below(10) == 0 { 0 } else { 4 };
    for _ in 0..=rng.below(4) {
        if out.len() <= keep {
            out.extend_from_slice(&frame[out.len()..]);
        }
        let at = keep + rng.below(out.len() - keep);
        match rng.below(7) {
            0 => out[at] ^= 1 << rng.below(8),
            1 => out[at] = *rng.pick(BYTES),
            2 => {
                let word = *rng.pick(WORDS) as i16;
                for (i, b) in word.to_be_bytes().into_iter().enumerate() {
                    if let Some(slot) = out.get_mut(at + i) {
                        *slot = b;
                    }
                }
            }
            3 => {
                let word = *rng.pick(WORDS);
                for (i, b) in word.to_be_bytes().into_iter().enumerate() {
                    if let Some(slot) = out.get_mut(at + i) {
                        *slot = b;
                    }
                }
            }
            4 => out.truncate(at.max(keep)),
            5 => {
                let n = 1 + rng.below(16);
                let noise: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                out.splice(at..at, noise);
            }
            _ => {
                let end = (at + 1 + rng.below(32)).min(out.len());
                let run = out[at..end].to_vec();
                out.splice(at..at, run);
            }
        }
    }
    out
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A record batch of two records: transactional and idempotent when `producer` is given.
fn batch(producer: Option<(i64, i16)>, transactional: bool) -> Bytes {
    let (producer_id, producer_epoch) = producer.unwrap_or((-1, -1));
    let records: Vec<Record> = (0..2)
        .map(|i| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch,
            timestamp_type: TimestampType::Creation,
            offset: i,
            // Without a producer the base sequence is -1; offset - sequence stays the same
            // for every record either way, so that the encoder makes one batch of them.
            sequence: if producer.is_some() {
                i as i32
            } else {
                i as i32 - 1
            },
            timestamp: 1_700_000_000_000 + i,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from(format!("fuzz-{i}"))),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, &records, &options).expect("batch encodes");
    buf.freeze()
}

/// The valid requests the seeds are made of: one per API, filled for the live `producer`.
fn requests(producer: (i64, i16)) -> Vec<(ApiKey, RequestKind)> {
    let (pid, epoch) = producer;
    let txn = || TransactionalId(s(TXN));
    let group = || GroupId(s(GROUP));
    let topic = || TopicName(s(TOPIC));
    let mut out = Vec::new();

    let mut r = ApiVersionsRequest::default();
    r.client_software_name = s("fuzz");
    r.client_software_version = s("1.0");
    out.push((ApiKey::ApiVersions, RequestKind::ApiVersions(r)));
    let mut t = metadata_request::MetadataRequestTopic::default();
    t.name = Some(topic());
    let mut r = MetadataRequest::default();
    r.topics = Some(vec![t]);
    out.push((ApiKey::Metadata, RequestKind::Metadata(r)));
    // A group (version 0 on), a transactional id (1 on) and the batched form (4).
    let mut r = FindCoordinatorRequest::default();
    r.key = s(GROUP);
    out.push((ApiKey::FindCoordinator, RequestKind::FindCoordinator(r)));
    let mut r = FindCoordinatorRequest::default();
    r.key = s(TXN);
    r.key_type = 1;
    out.push((ApiKey::FindCoordinator, RequestKind::FindCoordinator(r)));
    let mut r = FindCoordinatorRequest::default();
    r.key_type = 1;
    r.coordinator_keys = vec![s(TXN), s(GROUP)];
    out.push((ApiKey::FindCoordinator, RequestKind::FindCoordinator(r)));

    // A topic, brokers (a node's own id, another, a name that is no id) with a key filter, and
    // synonyms asked for; documentation too (version 3 on).
    let mut r = DescribeConfigsRequest::default();
    r.resources = [(2, "input"), (4, "1"), (4, "101"), (4, "x"), (8, "1")]
        .into_iter()
        .map(|(kind, name)| {
            let mut resource = describe_configs_request::DescribeConfigsResource::default();
            resource.resource_type = kind;
            resource.resource_name = s(name);
            resource.configuration_keys = (kind == 4).then(|| vec![s("broker.id")]);
            resource
        })
        .collect();
    r.include_synonyms = true;
    out.push((
        ApiKey::DescribeConfigs,
        RequestKind::DescribeConfigs(r.clone()),
    ));
    r.include_documentation = true;
    out.push((ApiKey::DescribeConfigs, RequestKind::DescribeConfigs(r)));

    // The controller's APIs: the cluster; creating a topic that exists, a new one, an invalid
    // name, a repeated one; growing a topic; deleting by name and by id.
    out.push((
        ApiKey::DescribeCluster,
        RequestKind::DescribeCluster(DescribeClusterRequest::default()),
    ));
    let mut r = CreateTopicsRequest::default();
    r.topics = ["input", "fresh", "bad name", "twice", "twice"]
        .into_iter()
        .map(|name| {
            let mut t = create_topics_request::CreatableTopic::default();
            t.name = TopicName(s(name));
            t.num_partitions = 3;
            t.replication_factor = 1;
            t
        })
        .collect();
    out.push((ApiKey::CreateTopics, RequestKind::CreateTopics(r)));
    let mut r = CreatePartitionsRequest::default();
    let mut grow = create_partitions_request::CreatePartitionsTopic::default();
    grow.name = TopicName(s("input"));
    grow.count = 6;
    r.topics = vec![grow];
    out.push((ApiKey::CreatePartitions, RequestKind::CreatePartitions(r)));
    let mut r = DeleteTopicsRequest::default();
    r.topic_names = vec![TopicName(s("input"))];
    out.push((ApiKey::DeleteTopics, RequestKind::DeleteTopics(r)));
    let mut r = DeleteTopicsRequest::default();
    let mut by_id = delete_topics_request::DeleteTopicState::default();
    by_id.topic_id = uuid::Uuid::from_bytes(cluster::topic_id("input"));
    r.topics = vec![by_id];
    out.push((ApiKey::DeleteTopics, RequestKind::DeleteTopics(r)));

    // Deleting records of another topic than the one the fuzz checks: up to an offset, up to the
    // high watermark (-1), and past it.
    let mut r = DeleteRecordsRequest::default();
    let mut t = delete_records_request::DeleteRecordsTopic::default();
    t.name = TopicName(s("output"));
    t.partitions = [(1, 0), (2, -1), (2, 1 << 40)]
        .into_iter()
        .map(|(partition, offset)| {
            let mut p = delete_records_request::DeleteRecordsPartition::default();
            p.partition_index = partition;
            p.offset = offset;
            p
        })
        .collect();
    r.topics = vec![t];
    r.timeout_ms = 1_000;
    out.push((ApiKey::DeleteRecords, RequestKind::DeleteRecords(r)));

    // A new instance, the same instance recovering (KIP-360, version 3 on), and an idempotent
    // producer (no transactional id).
    let mut r = InitProducerIdRequest::default();
    r.transactional_id = Some(txn());
    r.transaction_timeout_ms = 60_000;
    out.push((
        ApiKey::InitProducerId,
        RequestKind::InitProducerId(r.clone()),
    ));
    r.producer_id = ProducerId(pid);
    r.producer_epoch = epoch;
    out.push((ApiKey::InitProducerId, RequestKind::InitProducerId(r)));
    let mut r = InitProducerIdRequest::default();
    r.transaction_timeout_ms = 60_000;
    out.push((ApiKey::InitProducerId, RequestKind::InitProducerId(r)));
    let mut t = add_partitions_to_txn_request::AddPartitionsToTxnTopic::default();
    t.name = topic();
    t.partitions = vec![0, 1, 2];
    let mut r = AddPartitionsToTxnRequest::default();
    r.v3_and_below_transactional_id = txn();
    r.v3_and_below_producer_id = ProducerId(pid);
    r.v3_and_below_producer_epoch = epoch;
    r.v3_and_below_topics = vec![t];
    out.push((
        ApiKey::AddPartitionsToTxn,
        RequestKind::AddPartitionsToTxn(r),
    ));
    let mut r = AddOffsetsToTxnRequest::default();
    r.transactional_id = txn();
    r.producer_id = ProducerId(pid);
    r.producer_epoch = epoch;
    r.group_id = group();
    out.push((ApiKey::AddOffsetsToTxn, RequestKind::AddOffsetsToTxn(r)));
    let mut p = txn_offset_commit_request::TxnOffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = 5;
    p.committed_metadata = Some(s("m"));
    let mut t = txn_offset_commit_request::TxnOffsetCommitRequestTopic::default();
    t.name = topic();
    t.partitions = vec![p];
    let mut r = TxnOffsetCommitRequest::default();
    r.transactional_id = txn();
    r.group_id = group();
    r.producer_id = ProducerId(pid);
    r.producer_epoch = epoch;
    r.topics = vec![t];
    out.push((ApiKey::TxnOffsetCommit, RequestKind::TxnOffsetCommit(r)));
    let mut r = EndTxnRequest::default();
    r.transactional_id = txn();
    r.producer_id = ProducerId(pid);
    r.producer_epoch = epoch;
    r.committed = true;
    out.push((ApiKey::EndTxn, RequestKind::EndTxn(r)));
    let mut t = offset_fetch_request::OffsetFetchRequestTopic::default();
    t.name = topic();
    t.partition_indexes = vec![0, 1];
    // Plain, and waiting for pending transactional offsets (require_stable, version 7).
    let mut r = OffsetFetchRequest::default();
    r.group_id = group();
    r.topics = Some(vec![t]);
    out.push((ApiKey::OffsetFetch, RequestKind::OffsetFetch(r.clone())));
    r.require_stable = true;
    out.push((ApiKey::OffsetFetch, RequestKind::OffsetFetch(r)));
    // Batched (v8+): the live group's partitions, all of a KIP-848 group's as a member (v9).
    let mut topics = offset_fetch_request::OffsetFetchRequestTopics::default();
    topics.name = topic();
    topics.partition_indexes = vec![0, 1];
    let mut live = offset_fetch_request::OffsetFetchRequestGroup::default();
    live.group_id = group();
    live.topics = Some(vec![topics]);
    let mut kip848 = offset_fetch_request::OffsetFetchRequestGroup::default();
    kip848.group_id = GroupId(s("kip848-fuzz"));
    kip848.member_id = Some(s("fuzz-member"));
    kip848.member_epoch = 1;
    kip848.topics = None;
    let mut r = OffsetFetchRequest::default();
    r.groups = vec![live, kip848];
    r.require_stable = true;
    out.push((ApiKey::OffsetFetch, RequestKind::OffsetFetch(r)));
    let mut r = ListTransactionsRequest::default();
    r.producer_id_filters = vec![ProducerId(pid)];
    out.push((ApiKey::ListTransactions, RequestKind::ListTransactions(r)));
    let mut r = DescribeTransactionsRequest::default();
    r.transactional_ids = vec![txn()];
    out.push((
        ApiKey::DescribeTransactions,
        RequestKind::DescribeTransactions(r),
    ));
    let mut p = offset_commit_request::OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = 3;
    let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = topic();
    t.partitions = vec![p];
    let mut r = OffsetCommitRequest::default();
    r.group_id = group();
    r.generation_id_or_member_epoch = -1;
    r.retention_time_ms = -1;
    r.topics = vec![t];
    out.push((ApiKey::OffsetCommit, RequestKind::OffsetCommit(r)));
    let mut p = join_group_request::JoinGroupRequestProtocol::default();
    p.name = s("range");
    p.metadata = Bytes::from_static(&[0, 1, 0, 0, 0, 1, 0, 5, b'i', b'n', b'p', b'u', b't']);
    let mut r = JoinGroupRequest::default();
    r.group_id = group();
    r.session_timeout_ms = 6_000;
    r.rebalance_timeout_ms = 6_000;
    r.protocol_type = s("consumer");
    r.protocols = vec![p];
    out.push((ApiKey::JoinGroup, RequestKind::JoinGroup(r)));
    let mut a = sync_group_request::SyncGroupRequestAssignment::default();
    a.member_id = s("member-1");
    a.assignment = Bytes::from_static(&[0, 1, 0, 0, 0, 0]);
    let mut r = SyncGroupRequest::default();
    r.group_id = group();
    r.generation_id = 1;
    r.member_id = s("member-1");
    r.assignments = vec![a];
    out.push((ApiKey::SyncGroup, RequestKind::SyncGroup(r)));
    let mut r = HeartbeatRequest::default();
    r.group_id = group();
    r.generation_id = 1;
    r.member_id = s("member-1");
    out.push((ApiKey::Heartbeat, RequestKind::Heartbeat(r)));
    // One member (versions 0-2) and a list of them (3 on).
    let mut r = LeaveGroupRequest::default();
    r.group_id = group();
    r.member_id = s("member-1");
    out.push((ApiKey::LeaveGroup, RequestKind::LeaveGroup(r)));
    let mut m = leave_group_request::MemberIdentity::default();
    m.member_id = s("member-1");
    let mut r = LeaveGroupRequest::default();
    r.group_id = group();
    r.members = vec![m.clone(), m];
    out.push((ApiKey::LeaveGroup, RequestKind::LeaveGroup(r)));
    // Every group, and (v4 on) the Stable ones only.
    out.push((
        ApiKey::ListGroups,
        RequestKind::ListGroups(Default::default()),
    ));
    let mut r = ListGroupsRequest::default();
    r.states_filter = vec![s("Stable")];
    out.push((ApiKey::ListGroups, RequestKind::ListGroups(r)));
    // A live group and an unknown one; asking for authorized operations from v3 on.
    let mut r = DescribeGroupsRequest::default();
    r.groups = vec![group(), GroupId(s("no-such-group"))];
    out.push((
        ApiKey::DescribeGroups,
        RequestKind::DescribeGroups(r.clone()),
    ));
    r.include_authorized_operations = true;
    out.push((ApiKey::DescribeGroups, RequestKind::DescribeGroups(r)));
    // Deleting the live group (it has members: refused) and an unknown one; deleting the
    // live group's offset of a partition it consumes and of one that does not exist.
    let mut r = DeleteGroupsRequest::default();
    r.groups_names = vec![group(), GroupId(s("no-such-group"))];
    out.push((ApiKey::DeleteGroups, RequestKind::DeleteGroups(r)));
    let mut r = OffsetDeleteRequest::default();
    r.group_id = group();
    let mut t = offset_delete_request::OffsetDeleteRequestTopic::default();
    t.name = TopicName(s("input"));
    t.partitions = [0, 99]
        .into_iter()
        .map(|i| {
            let mut p = offset_delete_request::OffsetDeleteRequestPartition::default();
            p.partition_index = i;
            p
        })
        .collect();
    r.topics = vec![t];
    out.push((ApiKey::OffsetDelete, RequestKind::OffsetDelete(r)));
    // KIP-848: a join subscribing by name and by regex, and a member's heartbeat owning
    // partitions named by topic id.
    let mut r = ConsumerGroupHeartbeatRequest::default();
    r.group_id = GroupId(s("kip848-fuzz"));
    r.member_id = s("fuzz-member");
    r.rebalance_timeout_ms = 30_000;
    r.subscribed_topic_names = Some(vec![topic()]);
    r.subscribed_topic_regex = Some(s("out.*"));
    r.server_assignor = Some(s("range"));
    r.topic_partitions = Some(vec![]);
    out.push((
        ApiKey::ConsumerGroupHeartbeat,
        RequestKind::ConsumerGroupHeartbeat(r.clone()),
    ));
    let mut owned = consumer_group_heartbeat_request::TopicPartitions::default();
    owned.topic_id = uuid::Uuid::from_bytes(cluster::topic_id("input"));
    owned.partitions = vec![0, 1, 2];
    r.member_epoch = 1;
    r.rebalance_timeout_ms = -1;
    r.subscribed_topic_names = None;
    r.subscribed_topic_regex = None;
    r.server_assignor = None;
    r.topic_partitions = Some(vec![owned]);
    out.push((
        ApiKey::ConsumerGroupHeartbeat,
        RequestKind::ConsumerGroupHeartbeat(r),
    ));
    // Describing it, a classic group and an unknown one.
    let mut r = ConsumerGroupDescribeRequest::default();
    r.group_ids = vec![
        GroupId(s("kip848-fuzz")),
        group(),
        GroupId(s("no-such-group")),
    ];
    r.include_authorized_operations = true;
    out.push((
        ApiKey::ConsumerGroupDescribe,
        RequestKind::ConsumerGroupDescribe(r),
    ));

    for (producer, transactional) in [(Some(producer), true), (None, false)] {
        let mut p = produce_request::PartitionProduceData::default();
        p.index = 0;
        p.records = Some(batch(producer, transactional));
        let mut t = produce_request::TopicProduceData::default();
        t.name = topic();
        t.partition_data = vec![p];
        let mut r = ProduceRequest::default();
        r.transactional_id = transactional.then(txn);
        r.acks = -1;
        r.timeout_ms = 5_000;
        r.topic_data = vec![t];
        out.push((ApiKey::Produce, RequestKind::Produce(r)));
    }
    let mut p = fetch_request::FetchPartition::default();
    p.partition = 0;
    p.fetch_offset = 0;
    p.partition_max_bytes = 1 << 20;
    let mut t = fetch_request::FetchTopic::default();
    t.topic = topic();
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.max_wait_ms = 50;
    r.min_bytes = 1;
    r.max_bytes = 1 << 20;
    r.isolation_level = 1;
    r.topics = vec![t];
    out.push((ApiKey::Fetch, RequestKind::Fetch(r)));
    let mut p = list_offsets_request::ListOffsetsPartition::default();
    p.partition_index = 0;
    p.timestamp = -1;
    let mut t = list_offsets_request::ListOffsetsTopic::default();
    t.name = topic();
    t.partitions = vec![p];
    // read_uncommitted (every version) and read_committed (2 on).
    for isolation_level in [0, 1] {
        let mut r = ListOffsetsRequest::default();
        r.replica_id = BrokerId(-1);
        r.isolation_level = isolation_level;
        r.topics = vec![t.clone()];
        out.push((ApiKey::ListOffsets, RequestKind::ListOffsets(r)));
    }
    let mut t = describe_producers_request::TopicRequest::default();
    t.name = topic();
    t.partition_indexes = vec![0, 1, 2];
    let mut r = DescribeProducersRequest::default();
    r.topics = vec![t];
    out.push((ApiKey::DescribeProducers, RequestKind::DescribeProducers(r)));
    out
}

/// `request` encoded at `version` (header included, no length prefix), if that version can
/// carry it.
fn encoded(key: ApiKey, version: i16, request: &RequestKind) -> Option<Vec<u8>> {
    let mut header = RequestHeader::default();
    header.request_api_key = key as i16;
    header.request_api_version = version;
    header.correlation_id = i32::from(version) + 1;
    header.client_id = Some(s("fuzz"));
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, key.request_header_version(version))
        .ok()?;
    request.encode(&mut buf, version).ok()?;
    Some(buf.to_vec())
}

/// The seed frames for a node serving `apis` (and the APIs every node serves): at least one
/// for every version of every API.
fn seeds(apis: &[ApiRange], producer: (i64, i16)) -> Vec<Vec<u8>> {
    let requests = requests(producer);
    let (mut out, mut missing) = (Vec::new(), Vec::new());
    for range in COMMON_APIS.iter().chain(apis) {
        for version in range.min..=range.max {
            let before = out.len();
            for (_, request) in requests.iter().filter(|(key, _)| *key == range.key) {
                out.extend(encoded(range.key, version, request));
            }
            if out.len() == before {
                missing.push(format!("{:?} v{version}", range.key));
            }
        }
    }
    assert!(missing.is_empty(), "no seed encodes for {missing:?}");
    out
}

/// Where a v2 record batch keeps the fields a forged batch changes: (offset, width in bytes).
const BATCH_FIELDS: &[(usize, usize)] = &[
    (0, 8),  // base offset
    (8, 4),  // batch length
    (12, 4), // partition leader epoch
    (16, 1), // magic
    (21, 2), // attributes (compression, transactional, control)
    (23, 4), // last offset delta
    (27, 8), // base timestamp
    (35, 8), // max timestamp
    (43, 8), // producer id
    (51, 2), // producer epoch
    (53, 4), // base sequence
    (57, 4), // record count
];

/// A Produce of a forged record batch with a valid CRC: one to three of its header fields (or
/// a byte of its records) set to boundary values, so that the leader's own checks (epoch,
/// sequence, transactional bit, offsets, counts) see it, not only the CRC check. Transactional
/// or not, for the live producer or another one, at any Produce version the leader serves.
fn forged_produce(rng: &mut Rng, live: (i64, i16)) -> Vec<u8> {
    let transactional = rng.below(2) == 0;
    let producer = match rng.below(3) {
        0 => None,
        1 => Some(live),
        _ => Some((live.0, live.1.wrapping_add(rng.below(3) as i16 - 1))),
    };
    let mut bytes = batch(producer, transactional).to_vec();
    for _ in 0..=rng.below(3) {
        if rng.below(5) == 0 {
            let at = 61 + rng.below(bytes.len() - 61);
            bytes[at] = rng.next() as u8;
            continue;
        }
        let (at, width) = *rng.pick(BATCH_FIELDS);
        let value = i64::from(*rng.pick(WORDS));
        let value = if rng.below(4) == 0 {
            rng.next() as i64
        } else {
            value
        };
        bytes[at..at + width].copy_from_slice(&value.to_be_bytes()[8 - width..]);
    }
    let crc = crc32c::crc32c(&bytes[21..]);
    bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    let mut p = produce_request::PartitionProduceData::default();
    p.index = rng.below(3) as i32;
    p.records = Some(Bytes::from(bytes));
    let mut t = produce_request::TopicProduceData::default();
    t.name = TopicName(s(TOPIC));
    t.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.transactional_id = transactional.then(|| TransactionalId(s(TXN)));
    r.acks = -1;
    r.timeout_ms = 5_000;
    r.topic_data = vec![t];
    let range = LEADER_APIS
        .iter()
        .find(|r| r.key == ApiKey::Produce)
        .expect("leaders serve Produce");
    let version = range.min + rng.below((range.max - range.min + 1) as usize) as i16;
    encoded(ApiKey::Produce, version, &RequestKind::Produce(r)).expect("Produce encodes")
}

/// A node under fuzz: its Kafka address, the seeds of its role, and whether it is a partition
/// leader (forged batches go there too).
type Target = (SocketAddr, Arc<Vec<Vec<u8>>>, bool);

/// What became of one frame.
#[derive(Clone, Copy)]
enum Outcome {
    /// The node answered it.
    Answered = 0,
    /// The node closed the connection (a request it could not decode, or refused).
    Closed = 1,
    /// No answer within [`ANSWER_WAIT`] (a request that waits), or no connection.
    Waited = 2,
}

/// Sends `frame` on `conn` (a new connection if there is none) and waits a little for an
/// answer. The connection is kept only if the node answered.
async fn send(conn: &mut Option<TcpStream>, address: SocketAddr, frame: &[u8]) -> Outcome {
    if conn.is_none() {
        *conn = TcpStream::connect(address).await.ok();
    }
    let Some(stream) = conn.as_mut() else {
        return Outcome::Waited;
    };
    let mut message = (frame.len() as i32).to_be_bytes().to_vec();
    message.extend_from_slice(frame);
    let answered = async {
        stream.write_all(&message).await?;
        let len = stream.read_i32().await?;
        let mut body = vec![0u8; usize::try_from(len).unwrap_or(0)];
        stream.read_exact(&mut body).await?;
        std::io::Result::Ok(())
    };
    let outcome = match tokio::time::timeout(ANSWER_WAIT, answered).await {
        Ok(Ok(())) => return Outcome::Answered,
        Ok(Err(_)) => Outcome::Closed,
        Err(_) => Outcome::Waited,
    };
    *conn = None;
    outcome
}

/// ApiVersions v0 still answered with no error.
async fn answers_api_versions(address: SocketAddr) -> bool {
    let mut frame = Vec::new();
    frame.extend_from_slice(&18i16.to_be_bytes());
    frame.extend_from_slice(&0i16.to_be_bytes());
    frame.extend_from_slice(&7i32.to_be_bytes());
    frame.extend_from_slice(&(-1i16).to_be_bytes());
    let mut message = (frame.len() as i32).to_be_bytes().to_vec();
    message.extend_from_slice(&frame);
    let check = async {
        let mut s = TcpStream::connect(address).await?;
        s.write_all(&message).await?;
        let len = s.read_i32().await?;
        let mut body = vec![0u8; usize::try_from(len).unwrap_or(0)];
        s.read_exact(&mut body).await?;
        std::io::Result::Ok(
            body.len() >= 6 && body[0..4] == 7i32.to_be_bytes() && body[4..6] == [0, 0],
        )
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(10), check).await,
        Ok(Ok(true))
    )
}

/// Sends `frames` mutated or forged frames (seeded by `seed`) to every node of `cluster`, from
/// eight senders at once; returns how many were answered, closed the connection, or waited.
async fn fuzz(cluster: &EmbeddedCluster, frames: u64, seed: u64) -> [u64; 3] {
    // A live transactional id, so that mutated requests carry a PID and epoch the coordinator
    // and the leaders know.
    let address = |key| {
        cluster
            .kafka_address(cluster.coordinator_for(key))
            .expect("coordinators have a Kafka listener")
    };
    let live = testkit::kafka::OffsetTxn::init(address(TXN), address(GROUP), TXN, GROUP)
        .await
        .producer;

    let mut targets: Vec<Target> = Vec::new();
    let coordinator_seeds = Arc::new(seeds(COORDINATOR_APIS, live));
    let leader_seeds = Arc::new(seeds(LEADER_APIS, live));
    for id in cluster.coordinator_ids() {
        let address = cluster.kafka_address(id).expect("Kafka listener");
        targets.push((address, coordinator_seeds.clone(), false));
    }
    for id in cluster.leader_ids() {
        let address = cluster.kafka_address(id).expect("Kafka listener");
        targets.push((address, leader_seeds.clone(), true));
    }

    let started = Instant::now();
    let targets = Arc::new(targets);
    let senders = 8u64;
    let mut tasks = tokio::task::JoinSet::new();
    for sender in 0..senders {
        let targets = targets.clone();
        let mut rng = Rng(seed ^ sender.wrapping_mul(0xA24B_AED4_963E_E407));
        let count = frames / senders + u64::from(sender < frames % senders);
        tasks.spawn(async move {
            let mut conns: Vec<Option<TcpStream>> = targets.iter().map(|_| None).collect();
            let mut outcomes = [0u64; 3];
            for _ in 0..count {
                let node = rng.below(targets.len());
                let (address, seeds, leader) = &targets[node];
                let frame = if *leader && rng.below(3) == 0 {
                    forged_produce(&mut rng, live)
                } else {
                    let seed = rng.below(seeds.len());
                    mutate(&mut rng, &seeds[seed])
                };
                outcomes[send(&mut conns[node], *address, &frame).await as usize] += 1;
            }
            outcomes
        });
    }
    let mut outcomes = [0u64; 3];
    while let Some(result) = tasks.join_next().await {
        for (total, n) in outcomes.iter_mut().zip(result.expect("a sender panicked")) {
            *total += n;
        }
    }
    println!(
        "{frames} frames ({} coordinator seeds, {} leader seeds, {} nodes) in {:.1} s: \
         {} answered, {} closed the connection, {} waited",
        coordinator_seeds.len(),
        leader_seeds.len(),
        targets.len(),
        started.elapsed().as_secs_f64(),
        outcomes[0],
        outcomes[1],
        outcomes[2]
    );
    for (address, _, _) in targets.iter() {
        assert!(
            answers_api_versions(*address).await,
            "{address} stopped answering ApiVersions"
        );
    }
    outcomes
}

/// The first place where a producer id's epoch goes down within a partition of [`TOPIC`]: a
/// write from a fenced instance that got through.
async fn epoch_going_down(cluster: &EmbeddedCluster) -> Option<String> {
    let mut consumer = producer_client::Consumer::new(config(cluster), Isolation::ReadUncommitted)
        .expect("consumer");
    consumer.assign_topics(&[TOPIC]).await.expect("assign");
    let records = consumer
        .read_to_end(Duration::from_secs(20))
        .await
        .expect("read to end");
    let mut last: HashMap<(i32, i64), (i64, i32)> = HashMap::new();
    for r in records.iter().filter(|r| r.producer_id >= 0) {
        let key = (r.partition.partition, r.producer_id);
        if let Some((offset, epoch)) = last.get(&key) {
            if r.producer_epoch < *epoch {
                return Some(format!(
                    "{TOPIC}-{} offset {}: PID {} wrote at epoch {} after epoch {epoch} at offset {offset}",
                    r.partition.partition, r.offset, r.producer_id, r.producer_epoch
                ));
            }
        }
        last.insert(key, (r.offset, r.producer_epoch));
    }
    None
}

fn panics() -> (u64, Vec<String>) {
    let messages = PANIC_MESSAGES.lock().map(|m| m.clone()).unwrap_or_default();
    (PANICS.load(Ordering::SeqCst), messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutated_kafka_requests_never_panic_a_node_nor_stop_it_serving() {
    count_panics();
    let frames = env_u64("MINIBROKER_FUZZ_FRAMES", 10_000);
    let seed = env_u64("MINIBROKER_FUZZ_SEED", 0x6d69_6e69_6272_6f6b);
    println!(
        "kafka fuzz: {frames} frames, seed {seed} (MINIBROKER_FUZZ_FRAMES, MINIBROKER_FUZZ_SEED)"
    );
    let mut cluster = cluster().await;
    let outcomes = fuzz(&cluster, frames, seed).await;
    assert!(
        outcomes[0] > frames / 10,
        "too few frames reached a handler: {outcomes:?}"
    );
    let (count, messages) = panics();
    assert_eq!(
        count, 0,
        "nodes panicked on mutated requests: {messages:#?}"
    );

    // No zombie write got through: in every partition, the batches of one producer id carry
    // epochs that never go down, whatever the fuzz forged.
    if let Some(zombie) = epoch_going_down(&cluster).await {
        panic!("{zombie}");
    }

    // What the fuzz stored is a log like any other: it reads to its end, and every node
    // restarts on it (recovery parses every batch it kept) and serves the same records.
    let stored = read_topic_now(&cluster, TOPIC, Isolation::ReadUncommitted).await;
    println!(
        "{} records stored on {TOPIC} by the fuzz",
        stored.values().map(Vec::len).sum::<usize>()
    );
    let nodes: Vec<_> = cluster
        .coordinator_ids()
        .into_iter()
        .chain(cluster.leader_ids())
        .collect();
    for id in nodes {
        cluster.bounce(id).await.expect("the node restarts");
    }
    cluster
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("every node serves after a restart");
    assert_eq!(
        read_topic_now(&cluster, TOPIC, Isolation::ReadUncommitted).await,
        stored,
        "the log read differently after a restart"
    );

    // And the cluster still does its job: a transaction, committed, read once.
    let mut p = producer(&cluster, "after-fuzz").await;
    p.begin_transaction().expect("begin");
    p.send_and_wait("output", 0, "after-fuzz")
        .await
        .expect("send");
    p.commit_transaction().await.expect("commit");
    let read = read_topic(&cluster, "output", Isolation::ReadCommitted).await;
    let seen: usize = read
        .values()
        .map(|v| v.iter().filter(|r| r.as_str() == "after-fuzz").count())
        .sum();
    assert_eq!(seen, 1, "{read:?}");
    let (count, messages) = panics();
    assert_eq!(count, 0, "{messages:#?}");
    cluster.shutdown().await.unwrap();
}

/// The control: against leaders that skip the epoch check on purpose, the same fuzz gets a
/// fenced epoch's write into the log and the check above sees it, so a broken fence cannot
/// pass the fuzz silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fuzz_catches_leaders_that_skip_the_epoch_check() {
    count_panics();
    let cluster = cluster_with(EmbeddedOptions {
        unsafe_skip_epoch_check: true,
        ..EmbeddedOptions::default()
    })
    .await;
    let mut caught = None;
    for round in 0..5 {
        fuzz(&cluster, 10_000, 0x5eed + round).await;
        caught = epoch_going_down(&cluster).await;
        if caught.is_some() {
            break;
        }
    }
    let caught = caught.expect("a zombie write got through unnoticed");
    println!("caught, as it must be: {caught}");
    cluster.shutdown().await.unwrap();
}
