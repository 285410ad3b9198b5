//! The `Groups` gRPC service: the consumer groups this coordinator holds, read-only, as
//! `minibroker groups` shows them (Kafka's `kafka-consumer-groups.sh --list / --describe`).
//! A thin shell over the Kafka face ([`KafkaCoordinator::group_listings`],
//! [`KafkaCoordinator::group_description`]), which holds the groups of both protocols; a
//! coordinator without a Kafka listener holds none, and shows the groups known by their
//! committed offsets.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::error::code_of;
use crate::kafka::KafkaCoordinator;

/// The `Groups` service of one coordinator.
pub(crate) struct GroupService {
    face: Arc<KafkaCoordinator>,
    node_id: i32,
}

impl GroupService {
    /// The service over `face`, on node `node_id`.
    pub(crate) fn new(face: Arc<KafkaCoordinator>, node_id: i32) -> Self {
        Self { face, node_id }
    }
}

#[tonic::async_trait]
impl proto::groups_server::Groups for GroupService {
    async fn list_groups(
        &self,
        _: Request<proto::ListGroupsRequest>,
    ) -> Result<Response<proto::ListGroupsResponse>, Status> {
        let result = self.face.group_listings().await;
        let (error_code, error_message) = code_of(&result);
        Ok(Response::new(proto::ListGroupsResponse {
            error_code,
            error_message,
            coordinator_id: self.node_id,
            groups: result.unwrap_or_default(),
        }))
    }

    async fn describe_group(
        &self,
        request: Request<proto::DescribeGroupRequest>,
    ) -> Result<Response<proto::DescribeGroupResponse>, Status> {
        let group_id = request.into_inner().group_id;
        let result = if group_id.is_empty() || group_id.len() > cluster::MAX_ID_LEN {
            Err(crate::Error::Protocol(
                crate::core::TxnError::InvalidRequest(format!(
                    "a group id is 1 to {} bytes",
                    cluster::MAX_ID_LEN
                )),
            ))
        } else {
            self.face.group_description(&group_id).await
        };
        let (error_code, error_message) = code_of(&result);
        let mut response = result.unwrap_or_else(|_| proto::DescribeGroupResponse {
            group_id,
            ..Default::default()
        });
        response.error_code = error_code;
        response.error_message = error_message;
        response.coordinator_id = self.node_id;
        Ok(Response::new(response))
    }
}
