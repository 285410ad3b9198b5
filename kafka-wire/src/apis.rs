//! The API/version table, and ApiVersions.
//!
//! Every node advertises the same table, exactly what the cluster implements: the APIs every
//! node answers from the topology ([`COMMON_APIS`]), the partition leaders' ([`LEADER_APIS`]) and
//! the coordinators' ([`COORDINATOR_APIS`]). Kafka clients assume every broker speaks the same
//! APIs (kafka-python keeps the first broker's table for all of them), and a Kafka broker that is
//! not a partition's leader or a key's coordinator answers NOT_LEADER_OR_FOLLOWER or
//! NOT_COORDINATOR: so does a mini-broker node for the other role's APIs ([`crate::refuse`]).
//! A request for an API or version outside the table closes the connection (Kafka's behaviour),
//! except ApiVersions itself, which is answered with UNSUPPORTED_VERSION at version 0 so the
//! client can retry with a version it finds there.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

/// One API and the inclusive range of versions implemented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiRange {
    /// The API.
    pub key: ApiKey,
    /// Lowest version implemented.
    pub min: i16,
    /// Highest version implemented.
    pub max: i16,
}

impl ApiRange {
    /// `key` at versions `min..=max`.
    pub const fn new(key: ApiKey, min: i16, max: i16) -> Self {
        Self { key, min, max }
    }
}

/// Answered by every node from the topology.
///
/// - ApiVersions 0-3 (3 is flexible; 4 only adds a client-side feature).
/// - Metadata 0-12: 10+ carry topic ids (derived from the names: topics are static).
/// - FindCoordinator 0-4: 4 is the batched form (KIP-699).
/// - DescribeConfigs 1-4 (`kafka-protocol` has no v0; Kafka 4 dropped it too).
/// - DescribeCluster 0-1: every node is a broker and its own controller, as in Metadata.
/// - CreateTopics 2-7, CreatePartitions 0-3, DeleteTopics 1-6: answered from the topology,
///   which fixes the topics (`crate::topics`).
pub const COMMON_APIS: &[ApiRange] = &[
    ApiRange::new(ApiKey::ApiVersions, 0, 3),
    ApiRange::new(ApiKey::Metadata, 0, 12),
    ApiRange::new(ApiKey::FindCoordinator, 0, 4),
    ApiRange::new(ApiKey::DescribeConfigs, 1, 4),
    ApiRange::new(ApiKey::DescribeCluster, 0, 1),
    ApiRange::new(ApiKey::CreateTopics, 2, 7),
    ApiRange::new(ApiKey::CreatePartitions, 0, 3),
    ApiRange::new(ApiKey::DeleteTopics, 1, 6),
];

/// Served by the partition leaders (`partition_leader::kafka` says why these versions).
pub const LEADER_APIS: &[ApiRange] = &[
    ApiRange::new(ApiKey::Produce, 3, 9),
    ApiRange::new(ApiKey::Fetch, 4, 11),
    ApiRange::new(ApiKey::ListOffsets, 1, 7),
    ApiRange::new(ApiKey::DescribeProducers, 0, 0),
    ApiRange::new(ApiKey::InitProducerId, 0, 4),
    ApiRange::new(ApiKey::DeleteRecords, 0, 2),
];

/// Served by the coordinators (`coordinator::kafka` says why these versions).
pub const COORDINATOR_APIS: &[ApiRange] = &[
    ApiRange::new(ApiKey::InitProducerId, 0, 4),
    ApiRange::new(ApiKey::AddPartitionsToTxn, 0, 3),
    ApiRange::new(ApiKey::AddOffsetsToTxn, 0, 3),
    ApiRange::new(ApiKey::TxnOffsetCommit, 0, 3),
    ApiRange::new(ApiKey::EndTxn, 0, 4),
    ApiRange::new(ApiKey::OffsetFetch, 1, 9),
    ApiRange::new(ApiKey::ListTransactions, 0, 1),
    ApiRange::new(ApiKey::DescribeTransactions, 0, 0),
    ApiRange::new(ApiKey::OffsetCommit, 2, 9),
    ApiRange::new(ApiKey::JoinGroup, 0, 7),
    ApiRange::new(ApiKey::SyncGroup, 0, 5),
    ApiRange::new(ApiKey::Heartbeat, 0, 4),
    ApiRange::new(ApiKey::LeaveGroup, 0, 4),
    ApiRange::new(ApiKey::ListGroups, 0, 5),
    ApiRange::new(ApiKey::DescribeGroups, 0, 5),
    ApiRange::new(ApiKey::DeleteGroups, 0, 2),
    ApiRange::new(ApiKey::OffsetDelete, 0, 0),
    ApiRange::new(ApiKey::ConsumerGroupHeartbeat, 0, 1),
    ApiRange::new(ApiKey::ConsumerGroupDescribe, 0, 1),
];

/// The APIs one table holds.
#[derive(Clone, Debug)]
pub struct ApiTable {
    apis: Vec<ApiRange>,
}

impl ApiTable {
    /// The cluster's table: [`COMMON_APIS`], [`LEADER_APIS`] and [`COORDINATOR_APIS`].
    pub fn cluster() -> Self {
        let mut node_apis = LEADER_APIS.to_vec();
        for api in COORDINATOR_APIS {
            if node_apis.iter().all(|a| a.key != api.key) {
                node_apis.push(*api);
            }
        }
        Self::new(&node_apis)
    }

    /// [`COMMON_APIS`] plus `node_apis` (a node API that repeats a common one replaces it).
    pub fn new(node_apis: &[ApiRange]) -> Self {
        let mut apis: Vec<ApiRange> = COMMON_APIS
            .iter()
            .filter(|c| node_apis.iter().all(|n| n.key != c.key))
            .copied()
            .collect();
        apis.extend_from_slice(node_apis);
        apis.sort_by_key(|a| a.key as i16);
        Self { apis }
    }

    /// The range for `key`, if served.
    pub fn range(&self, key: ApiKey) -> Option<ApiRange> {
        self.apis.iter().find(|a| a.key == key).copied()
    }

    /// Whether `key` is served at `version`.
    pub fn supports(&self, key: ApiKey, version: i16) -> bool {
        self.range(key)
            .is_some_and(|r| (r.min..=r.max).contains(&version))
    }

    /// Every served API.
    pub fn apis(&self) -> &[ApiRange] {
        &self.apis
    }

    /// The ApiVersions response: the table, with `error` (NONE, or UNSUPPORTED_VERSION).
    pub fn api_versions(&self, error: Option<ResponseError>) -> ApiVersionsResponse {
        let mut response = ApiVersionsResponse::default();
        response.error_code = error.map_or(0, |e| e.code());
        response.api_keys = self
            .apis
            .iter()
            .map(|a| {
                let mut v = ApiVersion::default();
                v.api_key = a.key as i16;
                v.min_version = a.min;
                v.max_version = a.max;
                v
            })
            .collect();
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_common_and_node_apis_within_the_crates_versions() {
        let table = ApiTable::new(&[ApiRange::new(ApiKey::Produce, 3, 9)]);
        assert!(table.supports(ApiKey::Produce, 9));
        assert!(!table.supports(ApiKey::Produce, 10));
        assert!(table.supports(ApiKey::ApiVersions, 0));
        assert!(!table.supports(ApiKey::Fetch, 4));
        for api in table.apis() {
            let valid = api.key.valid_versions();
            assert!(api.min >= valid.min && api.max <= valid.max, "{api:?}");
        }
        let response = table.api_versions(None);
        assert_eq!(response.api_keys.len(), COMMON_APIS.len() + 1);
        assert_eq!(response.error_code, 0);
    }

    #[test]
    fn the_cluster_table_is_the_union_and_roles_agree_on_shared_apis() {
        let table = ApiTable::cluster();
        for api in COMMON_APIS
            .iter()
            .chain(LEADER_APIS)
            .chain(COORDINATOR_APIS)
        {
            assert_eq!(table.range(api.key), Some(*api), "{api:?}");
            let valid = api.key.valid_versions();
            assert!(api.min >= valid.min && api.max <= valid.max, "{api:?}");
        }
        assert_eq!(table.apis().len(), 8 + 6 + 19 - 1);
    }
}
