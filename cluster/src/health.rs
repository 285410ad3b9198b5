//! The standard gRPC services every node serves next to its own: `grpc.health.v1.Health`
//! (tonic-health) and server reflection `grpc.reflection.v1.ServerReflection`
//! (tonic-reflection), so grpcurl-style tools, load balancers and the compose healthcheck can ask
//! a node whether it serves, and list and call its services without the `.proto` file.
//!
//! Health has one status per service name, plus `""` for the node as a whole. [`NodeHealth`]
//! keeps both in step for the node's own service: a coordinator is NOT_SERVING until its
//! `__transaction_state` is loaded (it answers COORDINATOR_LOAD_IN_PROGRESS meanwhile), a partition
//! leader is NOT_SERVING while one of its partitions is offline after a storage failure, and both
//! turn NOT_SERVING when they start stopping. `Cluster` (answered from the static topology) is
//! SERVING for as long as the server runs.
//!
//! Reflection lists exactly what the node serves: `Cluster`, the node's own service, `Health`
//! and reflection itself (a coordinator does not advertise `PartitionLeader`).
//!
//! CAVEATS: the v1alpha reflection service is not served (grpcurl and current tools speak v1);
//! health says nothing about the node's peers.

use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The gRPC name of the `Cluster` service.
pub const CLUSTER_SERVICE: &str = "minibroker.v1.Cluster";
/// The gRPC name of the coordinator's service.
pub const COORDINATOR_SERVICE: &str = "minibroker.v1.TransactionCoordinator";
/// The gRPC name of the partition leader's service.
pub const LEADER_SERVICE: &str = "minibroker.v1.PartitionLeader";
/// The gRPC name of the standard health service.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
/// The gRPC name of the server reflection service.
pub const REFLECTION_SERVICE: &str = "grpc.reflection.v1.ServerReflection";

/// The health statuses a node publishes: its own service and the node as a whole (`""`).
#[derive(Clone, Debug)]
pub struct NodeHealth {
    reporter: HealthReporter,
    service: &'static str,
}

impl NodeHealth {
    /// Health for a node whose own service is `service` (e.g. [`COORDINATOR_SERVICE`]),
    /// starting NOT_SERVING until [`NodeHealth::set_serving`]; and the `Health` gRPC service
    /// to add to the node's server.
    pub async fn new(
        service: &'static str,
    ) -> (
        Self,
        HealthServer<impl tonic_health::pb::health_server::Health>,
    ) {
        let (reporter, server) = tonic_health::server::health_reporter();
        let health = Self { reporter, service };
        reporter_set(&health.reporter, CLUSTER_SERVICE, true).await;
        health.set_serving(false).await;
        (health, server)
    }

    /// Publishes whether the node serves its own service (and so the node as a whole).
    pub async fn set_serving(&self, serving: bool) {
        reporter_set(&self.reporter, self.service, serving).await;
        reporter_set(&self.reporter, "", serving).await;
    }
}

async fn reporter_set(reporter: &HealthReporter, service: &str, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status(service, status).await;
}

/// The reflection service for a node whose own service is `service`: it lists `Cluster`,
/// `service`, `Health` and reflection itself, and serves their descriptors.
pub fn reflection(
    service: &'static str,
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::Error,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(CLUSTER_SERVICE)
        .with_service_name(service)
        .with_service_name(HEALTH_SERVICE)
        .with_service_name(REFLECTION_SERVICE)
        .build_v1()
}
