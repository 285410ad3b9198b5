//! `healthcheck [ADDR]`: the Docker healthcheck of the mini-broker image.
//!
//! The image is `FROM scratch` (no shell, no curl), so the check has to be a binary of its own.
//! It asks the node at `ADDR` (default `127.0.0.1:9092`, or `HEALTHCHECK_ADDR`) for
//! `Cluster.Metadata`, which every node serves next to its own service, and exits 0 when the node
//! answers within the deadline (`HEALTHCHECK_TIMEOUT_MS`, default 2000), 1 otherwise with one line
//! on stderr. A coordinator that is still loading `__transaction_state` already answers Metadata:
//! it is healthy, and clients retry its COORDINATOR_LOAD_IN_PROGRESS.
//!
//! CAVEATS: it only proves that the gRPC server is up; it does not check sled or the other nodes.

use std::process::ExitCode;
use std::time::Duration;

use proto::cluster_client::ClusterClient;
use proto::MetadataRequest;

fn main() -> ExitCode {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("HEALTHCHECK_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
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
    match runtime.block_on(async { tokio::time::timeout(timeout, check(&addr)).await }) {
        Ok(Ok(summary)) => {
            println!("healthy: {addr} {summary}");
            ExitCode::SUCCESS
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

/// One Metadata round trip; a short description of the answer.
async fn check(addr: &str) -> Result<String, Box<dyn std::error::Error>> {
    let mut client = ClusterClient::connect(format!("http://{addr}")).await?;
    let metadata = client
        .metadata(MetadataRequest { topics: vec![] })
        .await?
        .into_inner();
    Ok(format!(
        "answers Metadata ({} coordinators, {} leaders, {} topics)",
        metadata.coordinators.len(),
        metadata.leaders.len(),
        metadata.topics.len()
    ))
}
