//! `healthcheck [ADDR]`: the Docker healthcheck of the mini-broker image.
//!
//! The image is `FROM scratch` (no shell, no curl), so the check has to be a binary of its own.
//! It asks the node at `ADDR` (default `127.0.0.1:9092`, or `HEALTHCHECK_ADDR`) the standard
//! gRPC health service (`grpc.health.v1.Health/Check`, service `""`: the node as a whole, or
//! `HEALTHCHECK_SERVICE`), and exits 0 when the node answers SERVING within the deadline
//! (`HEALTHCHECK_TIMEOUT_MS`, default 2000), 1 otherwise with one line on stderr. A coordinator
//! is NOT_SERVING until its `__transaction_state` is loaded, a partition leader while one of its
//! partitions is offline, and both once they start stopping: compose's `service_healthy` then
//! means "ready for clients", not only "the port is open".
//!
//! CAVEATS: it checks one node; it does not check that node's peers.

use std::process::ExitCode;
use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn main() -> ExitCode {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("HEALTHCHECK_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let service = std::env::var("HEALTHCHECK_SERVICE").unwrap_or_default();
    let timeout = Duration::from_millis(
        std::env::var("HEALTHCHECK_TIMEOUT_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2000),
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("unhealthy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The timer must be created inside the runtime.
    match runtime.block_on(async { tokio::time::timeout(timeout, check(&addr, &service)).await }) {
        Ok(Ok(ServingStatus::Serving)) => {
            println!("healthy: {addr} is SERVING");
            ExitCode::SUCCESS
        }
        Ok(Ok(status)) => {
            eprintln!(
                "unhealthy: {addr} is {} (loading its state, a partition offline, or stopping)",
                status.as_str_name()
            );
            ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("unhealthy: {addr}: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!(
                "unhealthy: {addr}: no answer within {} ms",
                timeout.as_millis()
            );
            ExitCode::FAILURE
        }
    }
}

/// One health Check round trip: the status the node reports for `service`.
async fn check(addr: &str, service: &str) -> Result<ServingStatus, Box<dyn std::error::Error>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await?;
    Ok(response.into_inner().status())
}
