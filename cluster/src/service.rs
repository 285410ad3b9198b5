//! The `Cluster` gRPC service every node serves: FindCoordinator and Metadata, answered from the
//! static [`Topology`] alone (no state, no I/O).

use std::sync::Arc;

use proto::cluster_server::Cluster;
use proto::{
    CoordinatorKeyType, ErrorCode, FindCoordinatorRequest, FindCoordinatorResponse,
    MetadataRequest, MetadataResponse, NodeEndpoint, PartitionMetadata, TopicMetadata,
};
use tonic::{Request, Response, Status};

use crate::topology::{Node, Topology};
use crate::MAX_ID_LEN;

/// Serves [`Cluster`] from a topology.
#[derive(Clone, Debug)]
pub struct ClusterService {
    topology: Arc<Topology>,
    fingerprint: String,
}

impl ClusterService {
    /// A service over `topology`.
    pub fn new(topology: Arc<Topology>) -> Self {
        let fingerprint = topology.fingerprint();
        Self {
            topology,
            fingerprint,
        }
    }

    /// Wraps the service for `tonic::transport::Server::add_service`.
    pub fn into_server(self) -> proto::cluster_server::ClusterServer<Self> {
        proto::cluster_server::ClusterServer::new(self)
    }
}

fn endpoint(node: &Node) -> NodeEndpoint {
    NodeEndpoint {
        node_id: node.id,
        address: node.address.clone(),
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn find_coordinator(
        &self,
        request: Request<FindCoordinatorRequest>,
    ) -> Result<Response<FindCoordinatorResponse>, Status> {
        let request = request.into_inner();
        // Both key types route the same way; the enum only documents intent.
        let _ = CoordinatorKeyType::try_from(request.key_type);
        if request.key.is_empty() || request.key.len() > MAX_ID_LEN {
            return Ok(Response::new(FindCoordinatorResponse {
                error_code: ErrorCode::InvalidRequest as i32,
                error_message: format!("key must be 1..={MAX_ID_LEN} bytes"),
                ..Default::default()
            }));
        }
        let partition = self.topology.state_partition(&request.key);
        let node = self.topology.coordinator_for_partition(partition);
        Ok(Response::new(FindCoordinatorResponse {
            error_code: ErrorCode::None as i32,
            error_message: String::new(),
            node_id: node.id,
            address: node.address.clone(),
            state_partition: partition,
        }))
    }

    async fn metadata(
        &self,
        request: Request<MetadataRequest>,
    ) -> Result<Response<MetadataResponse>, Status> {
        let request = request.into_inner();
        let t = &self.topology;
        let describe = |name: &str| match t.topic(name) {
            None => TopicMetadata {
                error_code: ErrorCode::UnknownTopicOrPartition as i32,
                name: name.to_string(),
                partitions: vec![],
            },
            Some(topic) => TopicMetadata {
                error_code: ErrorCode::None as i32,
                name: topic.name.clone(),
                partitions: topic
                    .leaders
                    .iter()
                    .enumerate()
                    .map(|(p, leader)| PartitionMetadata {
                        partition: p as i32,
                        leader_id: *leader,
                        leader_address: t
                            .leader(*leader)
                            .map(|n| n.address.clone())
                            .unwrap_or_default(),
                    })
                    .collect(),
            },
        };
        let topics = if request.topics.is_empty() {
            t.topics.iter().map(|topic| describe(&topic.name)).collect()
        } else {
            request.topics.iter().map(|name| describe(name)).collect()
        };
        Ok(Response::new(MetadataResponse {
            coordinators: t.coordinators.iter().map(endpoint).collect(),
            leaders: t.leaders.iter().map(endpoint).collect(),
            topics,
            transaction_state_partitions: t.transaction_state_partitions,
            topology_fingerprint: self.fingerprint.clone(),
        }))
    }
}
