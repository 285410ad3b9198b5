//! Clients of the standard gRPC services every node serves (health and reflection), for tests:
//! what a grpcurl user or a load balancer would ask.

use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

async fn channel(address: &str) -> Result<tonic::transport::Channel, String> {
    tonic::transport::Channel::from_shared(format!("http://{address}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// `grpc.health.v1.Health/Check` for `service` (`""`: the node) at `address`: the status, or
/// the gRPC error as text (NOT_FOUND for an unknown service).
pub async fn health(address: &str, service: &str) -> Result<ServingStatus, String> {
    let mut client = HealthClient::new(channel(address).await?);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .map_err(|e| format!("{:?}: {}", e.code(), e.message()))?;
    Ok(response.into_inner().status())
}

/// The services reflection lists at `address`, sorted.
pub async fn reflected_services(address: &str) -> Result<Vec<String>, String> {
    let mut client = ServerReflectionClient::new(channel(address).await?);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let first = stream
        .next()
        .await
        .ok_or("reflection answered nothing")?
        .map_err(|e| e.to_string())?;
    match first.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            names.sort();
            Ok(names)
        }
        other => Err(format!("unexpected reflection answer {other:?}")),
    }
}

/// Whether reflection at `address` can describe `symbol` (a service or message name) from its
/// file descriptors, as grpcurl's `describe` does.
pub async fn reflection_knows(address: &str, symbol: &str) -> Result<bool, String> {
    let mut client = ServerReflectionClient::new(channel(address).await?);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(symbol.to_string())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let first = stream
        .next()
        .await
        .ok_or("reflection answered nothing")?
        .map_err(|e| e.to_string())?;
    Ok(matches!(
        first.message_response,
        Some(MessageResponse::FileDescriptorResponse(f)) if !f.file_descriptor_proto.is_empty()
    ))
}
