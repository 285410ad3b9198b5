//! One Kafka-protocol request over a fresh connection, for tests that speak Kafka's protocol to
//! a node directly (no client library in between).

use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` (API `key`, `version`) to `address` and returns the decoded response;
/// panics on any I/O or codec error (a test helper).
pub async fn call(
    address: std::net::SocketAddr,
    key: ApiKey,
    version: i16,
    request: RequestKind,
) -> ResponseKind {
    let mut header = RequestHeader::default();
    header.request_api_key = key as i16;
    header.request_api_version = version;
    header.correlation_id = 42;
    header.client_id = Some(StrBytes::from_static_str("test"));
    let mut body = bytes::BytesMut::new();
    header
        .encode(&mut body, key.request_header_version(version))
        .unwrap();
    request.encode(&mut body, version).unwrap();
    let mut s = TcpStream::connect(address).await.unwrap();
    s.write_all(&(body.len() as i32).to_be_bytes())
        .await
        .unwrap();
    s.write_all(&body).await.unwrap();
    let len = s.read_i32().await.unwrap();
    let mut frame = vec![0u8; len as usize];
    s.read_exact(&mut frame).await.unwrap();
    let mut frame = bytes::Bytes::from(frame);
    let header = ResponseHeader::decode(&mut frame, key.response_header_version(version)).unwrap();
    assert_eq!(header.correlation_id, 42);
    ResponseKind::decode(key, &mut frame, version).unwrap()
}

fn str_bytes(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A Kafka-protocol transactional producer (transaction version 1, as a Kafka client) that
/// commits offsets of `group` for input-0, speaking to the coordinators directly.
pub struct OffsetTxn {
    /// The transactional id.
    pub txn: &'static str,
    /// The consumer group whose offsets it commits.
    pub group: &'static str,
    /// The transaction's coordinator (Kafka listener).
    pub txn_coordinator: std::net::SocketAddr,
    /// The group's coordinator (Kafka listener).
    pub group_coordinator: std::net::SocketAddr,
    /// The (PID, epoch) InitProducerId gave.
    pub producer: (i64, i16),
}

impl OffsetTxn {
    /// InitProducerId for `txn` at `txn_coordinator`; `group` is coordinated by
    /// `group_coordinator`.
    pub async fn init(
        txn_coordinator: std::net::SocketAddr,
        group_coordinator: std::net::SocketAddr,
        txn: &'static str,
        group: &'static str,
    ) -> Self {
        use kafka_protocol::messages::*;
        let mut init = InitProducerIdRequest::default();
        init.transactional_id = Some(TransactionalId(str_bytes(txn)));
        init.transaction_timeout_ms = 60_000;
        let ResponseKind::InitProducerId(init) = call(
            txn_coordinator,
            ApiKey::InitProducerId,
            4,
            RequestKind::InitProducerId(init),
        )
        .await
        else {
            panic!("InitProducerId response")
        };
        assert_eq!(init.error_code, 0);
        Self {
            txn,
            group,
            txn_coordinator,
            group_coordinator,
            producer: (init.producer_id.0, init.producer_epoch),
        }
    }

    /// AddOffsetsToTxn for the group.
    pub async fn add_offsets(&self) {
        use kafka_protocol::messages::*;
        let mut add = AddOffsetsToTxnRequest::default();
        add.transactional_id = TransactionalId(str_bytes(self.txn));
        add.producer_id = ProducerId(self.producer.0);
        add.producer_epoch = self.producer.1;
        add.group_id = GroupId(str_bytes(self.group));
        let ResponseKind::AddOffsetsToTxn(added) = call(
            self.txn_coordinator,
            ApiKey::AddOffsetsToTxn,
            3,
            RequestKind::AddOffsetsToTxn(add),
        )
        .await
        else {
            panic!("AddOffsetsToTxn response")
        };
        assert_eq!(added.error_code, 0);
    }

    /// TxnOffsetCommit of `offset` for input-0 as `member` of `generation` (`-1` and an empty
    /// member: a group without members); the partition's error code.
    pub async fn commit_offset(&self, member: &str, generation: i32, offset: i64) -> i16 {
        use kafka_protocol::messages::*;
        let mut c = TxnOffsetCommitRequest::default();
        c.transactional_id = TransactionalId(str_bytes(self.txn));
        c.group_id = GroupId(str_bytes(self.group));
        c.producer_id = ProducerId(self.producer.0);
        c.producer_epoch = self.producer.1;
        c.generation_id = generation;
        c.member_id = str_bytes(member);
        let mut t = txn_offset_commit_request::TxnOffsetCommitRequestTopic::default();
        t.name = TopicName(str_bytes("input"));
        let mut p = txn_offset_commit_request::TxnOffsetCommitRequestPartition::default();
        p.partition_index = 0;
        p.committed_offset = offset;
        t.partitions = vec![p];
        c.topics = vec![t];
        let ResponseKind::TxnOffsetCommit(r) = call(
            self.group_coordinator,
            ApiKey::TxnOffsetCommit,
            3,
            RequestKind::TxnOffsetCommit(c),
        )
        .await
        else {
            panic!("TxnOffsetCommit response")
        };
        r.topics[0].partitions[0].error_code
    }

    /// EndTxn, expected to succeed.
    pub async fn end(&self, commit: bool) {
        assert!(self.try_end(commit).await, "EndTxn refused");
    }

    /// EndTxn; whether it was accepted.
    pub async fn try_end(&self, commit: bool) -> bool {
        use kafka_protocol::messages::*;
        let mut end = EndTxnRequest::default();
        end.transactional_id = TransactionalId(str_bytes(self.txn));
        end.producer_id = ProducerId(self.producer.0);
        end.producer_epoch = self.producer.1;
        end.committed = commit;
        let ResponseKind::EndTxn(ended) = call(
            self.txn_coordinator,
            ApiKey::EndTxn,
            3,
            RequestKind::EndTxn(end),
        )
        .await
        else {
            panic!("EndTxn response")
        };
        ended.error_code == 0
    }
}

/// OffsetFetch v7 of input-0 in `group`: the response's error code, and the partition's
/// (error code, committed offset).
pub async fn offset_fetch_v7(
    group_coordinator: std::net::SocketAddr,
    group: &str,
    require_stable: bool,
) -> (i16, (i16, i64)) {
    use kafka_protocol::messages::*;
    let mut f = OffsetFetchRequest::default();
    f.group_id = GroupId(str_bytes(group));
    let mut t = offset_fetch_request::OffsetFetchRequestTopic::default();
    t.name = TopicName(str_bytes("input"));
    t.partition_indexes = vec![0];
    f.topics = Some(vec![t]);
    f.require_stable = require_stable;
    let ResponseKind::OffsetFetch(r) = call(
        group_coordinator,
        ApiKey::OffsetFetch,
        7,
        RequestKind::OffsetFetch(f),
    )
    .await
    else {
        panic!("OffsetFetch response")
    };
    let partition = r
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .map_or((-1, -1), |p| (p.error_code, p.committed_offset));
    (r.error_code, partition)
}

/// A JoinGroup request of a consumer (protocol type `consumer`, one `range` protocol, 30 s
/// session and rebalance timeouts) for `group`, as `member` (empty: a new member).
pub fn join_group(group: &str, member: &str) -> RequestKind {
    use kafka_protocol::messages::*;
    let mut j = JoinGroupRequest::default();
    j.group_id = GroupId(str_bytes(group));
    j.session_timeout_ms = 30_000;
    j.rebalance_timeout_ms = 30_000;
    j.member_id = str_bytes(member);
    j.protocol_type = str_bytes("consumer");
    let mut p = join_group_request::JoinGroupRequestProtocol::default();
    p.name = str_bytes("range");
    j.protocols = vec![p];
    RequestKind::JoinGroup(j)
}

/// The SyncGroup of `member` at `generation` in `group` for a group of one: as its leader it
/// assigns itself (empty assignment bytes), which makes the group Stable.
pub fn sync_group_alone(group: &str, member: &str, generation: i32) -> RequestKind {
    use kafka_protocol::messages::*;
    let mut r = SyncGroupRequest::default();
    r.group_id = GroupId(str_bytes(group));
    r.member_id = str_bytes(member);
    r.generation_id = generation;
    let mut a = sync_group_request::SyncGroupRequestAssignment::default();
    a.member_id = str_bytes(member);
    r.assignments = vec![a];
    RequestKind::SyncGroup(r)
}

/// DeleteGroups of `groups` over the Kafka face: each group's error code.
pub async fn delete_groups(kafka: std::net::SocketAddr, groups: &[&str]) -> Vec<i16> {
    use kafka_protocol::messages::{
        ApiKey, DeleteGroupsRequest, GroupId, RequestKind, ResponseKind,
    };
    let mut r = DeleteGroupsRequest::default();
    r.groups_names = groups.iter().map(|g| GroupId(str_bytes(g))).collect();
    let ResponseKind::DeleteGroups(d) =
        call(kafka, ApiKey::DeleteGroups, 2, RequestKind::DeleteGroups(r)).await
    else {
        panic!("DeleteGroups response")
    };
    d.results.iter().map(|g| g.error_code).collect()
}

/// OffsetDelete of `partitions` of `group` over the Kafka face: the group's error code and
/// each partition's.
pub async fn offset_delete(
    kafka: std::net::SocketAddr,
    group: &str,
    partitions: &[(&str, i32)],
) -> (i16, Vec<i16>) {
    use kafka_protocol::messages::offset_delete_request::{
        OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
    };
    use kafka_protocol::messages::{
        ApiKey, GroupId, OffsetDeleteRequest, RequestKind, ResponseKind, TopicName,
    };
    let mut r = OffsetDeleteRequest::default();
    r.group_id = GroupId(str_bytes(group));
    r.topics = partitions
        .iter()
        .map(|(topic, partition)| {
            let mut t = OffsetDeleteRequestTopic::default();
            t.name = TopicName(str_bytes(topic));
            let mut p = OffsetDeleteRequestPartition::default();
            p.partition_index = *partition;
            t.partitions = vec![p];
            t
        })
        .collect();
    let ResponseKind::OffsetDelete(d) =
        call(kafka, ApiKey::OffsetDelete, 0, RequestKind::OffsetDelete(r)).await
    else {
        panic!("OffsetDelete response")
    };
    let codes = d
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect();
    (d.error_code, codes)
}

/// ListGroups over the Kafka face: (group, state) of each.
pub async fn list_groups(kafka: std::net::SocketAddr) -> Vec<(String, String)> {
    use kafka_protocol::messages::{ApiKey, ListGroupsRequest, RequestKind, ResponseKind};
    let ResponseKind::ListGroups(l) = call(
        kafka,
        ApiKey::ListGroups,
        4,
        RequestKind::ListGroups(ListGroupsRequest::default()),
    )
    .await
    else {
        panic!("ListGroups response")
    };
    assert_eq!(l.error_code, 0);
    l.groups
        .iter()
        .map(|g| (g.group_id.0.to_string(), g.group_state.to_string()))
        .collect()
}

/// A plain OffsetCommit (v8, no member: as an admin client resets offsets) of `offsets` for
/// `group`: each partition's error code.
pub async fn offset_commit(
    coordinator: std::net::SocketAddr,
    group: &str,
    offsets: &[(&str, i32, i64)],
) -> Vec<i16> {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        ApiKey, GroupId, OffsetCommitRequest, RequestKind, ResponseKind, TopicName,
    };
    let mut r = OffsetCommitRequest::default();
    r.group_id = GroupId(str_bytes(group));
    r.generation_id_or_member_epoch = -1;
    r.topics = offsets
        .iter()
        .map(|(topic, partition, offset)| {
            let mut t = OffsetCommitRequestTopic::default();
            t.name = TopicName(str_bytes(topic));
            let mut p = OffsetCommitRequestPartition::default();
            p.partition_index = *partition;
            p.committed_offset = *offset;
            t.partitions = vec![p];
            t
        })
        .collect();
    let ResponseKind::OffsetCommit(c) = call(
        coordinator,
        ApiKey::OffsetCommit,
        8,
        RequestKind::OffsetCommit(r),
    )
    .await
    else {
        panic!("OffsetCommit response")
    };
    c.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect()
}

/// An OffsetCommit (API `version`) of `offset` for input-0 of `group`, as `member` at
/// `generation` (a classic generation, or a KIP-848 member epoch): the partition's error code.
pub async fn member_commit(
    coordinator: std::net::SocketAddr,
    version: i16,
    group: &str,
    member: &str,
    generation: i32,
    offset: i64,
) -> i16 {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{GroupId, OffsetCommitRequest, TopicName};
    let mut r = OffsetCommitRequest::default();
    r.group_id = GroupId(str_bytes(group));
    r.member_id = str_bytes(member);
    r.generation_id_or_member_epoch = generation;
    let mut t = OffsetCommitRequestTopic::default();
    t.name = TopicName(str_bytes("input"));
    let mut p = OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = offset;
    t.partitions = vec![p];
    r.topics = vec![t];
    let ResponseKind::OffsetCommit(c) = call(
        coordinator,
        ApiKey::OffsetCommit,
        version,
        RequestKind::OffsetCommit(r),
    )
    .await
    else {
        panic!("OffsetCommit response")
    };
    c.topics[0].partitions[0].error_code
}

/// OffsetFetch v7 of every committed offset of `group`: (topic, partition, offset), in order.
pub async fn committed_offsets(
    coordinator: std::net::SocketAddr,
    group: &str,
) -> Vec<(String, i32, i64)> {
    use kafka_protocol::messages::*;
    let mut f = OffsetFetchRequest::default();
    f.group_id = GroupId(str_bytes(group));
    f.topics = None;
    let ResponseKind::OffsetFetch(r) = call(
        coordinator,
        ApiKey::OffsetFetch,
        7,
        RequestKind::OffsetFetch(f),
    )
    .await
    else {
        panic!("OffsetFetch response")
    };
    assert_eq!(r.error_code, 0);
    let mut out: Vec<(String, i32, i64)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.0.to_string(), p.partition_index, p.committed_offset))
        })
        .collect();
    out.sort();
    out
}
