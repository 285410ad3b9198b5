//! The Kafka listener: one tokio task per connection, framing, header decode, response encode.
//!
//! A frame is a big-endian i32 length and that many bytes. The length is checked against
//! [`ServerConfig::max_frame_bytes`] before anything is allocated for it; the bytes must then
//! arrive within [`ServerConfig::frame_timeout`] (a slow or stalled sender loses its connection,
//! nothing else); an idle connection is closed after [`ServerConfig::idle_timeout`] (Kafka's
//! `connections.max.idle.ms`). Requests are handled one at a time per connection, so responses
//! go out in request order; a client that pipelines simply has its next requests wait in the
//! socket buffer (Kafka mutes a connection while one of its requests is in flight).
//!
//! A request that does not decode, or names an API or version outside the node's table, closes
//! the connection without reaching the handler, so nothing is stored from it. ApiVersions at an
//! unsupported version is answered (version 0, UNSUPPORTED_VERSION, the table) as Kafka does.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use cluster::{NodeId, Topology};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::apis::{ApiRange, ApiTable};
use crate::{metadata, Error, Result};

/// The smallest request: api key, version, correlation id.
const MIN_FRAME: usize = 8;

/// One decoded request, as a [`Handler`] receives it.
#[derive(Debug)]
pub struct Request {
    /// The request header (client id, correlation id).
    pub header: RequestHeader,
    /// The API.
    pub api_key: ApiKey,
    /// The version the client used.
    pub version: i16,
    /// The decoded body.
    pub body: RequestKind,
    /// The client's address (DescribeGroups shows it as the member's host).
    pub peer: Option<std::net::SocketAddr>,
}

/// What a node answers on its Kafka face beyond ApiVersions, Metadata, FindCoordinator and
/// DescribeConfigs.
pub trait Handler: Send + Sync + 'static {
    /// The APIs and versions this node answers itself ([`crate::apis::LEADER_APIS`] or
    /// [`crate::apis::COORDINATOR_APIS`]); the rest of the cluster's table is refused as a
    /// Kafka broker of the other role would ([`crate::refuse`]).
    fn apis(&self) -> Vec<ApiRange>;

    /// This node's role's settings, as DescribeConfigs shows them for its BROKER resource
    /// ([`crate::configs`]; every node adds what all nodes have).
    fn broker_configs(&self) -> Vec<crate::configs::ConfigEntry> {
        Vec::new()
    }

    /// Answers one request (only ever called for an API and version from [`Handler::apis`]).
    /// `Ok(None)` sends no response (Produce with acks=0); `Err` closes the connection.
    fn handle(
        &self,
        request: Request,
    ) -> impl std::future::Future<Output = Result<Option<ResponseKind>>> + Send;
}

/// Limits of the Kafka listener.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// This node's id (Metadata's controller id).
    pub node_id: NodeId,
    /// The cluster.
    pub topology: Arc<Topology>,
    /// Largest frame accepted (Kafka's `socket.request.max.bytes`, default 100 MiB; 64 MiB here).
    pub max_frame_bytes: usize,
    /// Longest wait for the rest of a frame once its length was read.
    pub frame_timeout: Duration,
    /// Longest a connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// Where answered requests are counted ([`crate::observe`]), next to the gRPC face's.
    pub metrics: Option<cluster::metrics::Metrics>,
}

impl ServerConfig {
    /// The defaults: 64 MiB frames, 30 s to send a frame, 10 min idle.
    pub fn new(node_id: NodeId, topology: Arc<Topology>) -> Self {
        Self {
            node_id,
            topology,
            max_frame_bytes: 64 * 1024 * 1024,
            frame_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(600),
            metrics: None,
        }
    }
}

struct Shared<H> {
    config: ServerConfig,
    /// What the cluster serves: advertised, and checked before decoding.
    table: ApiTable,
    /// What this node's handler serves; the rest is refused as the other role.
    served: ApiTable,
    handler: Arc<H>,
}

/// Accepts Kafka connections on an already bound `listener` until `shutdown` resolves; each
/// connection runs in its own task. Connections still open at shutdown are dropped.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    config: ServerConfig,
    handler: Arc<H>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    let shared = Arc::new(Shared {
        config,
        table: ApiTable::cluster(),
        served: ApiTable::new(&handler.apis()),
        handler,
    });
    let address = listener.local_addr()?;
    info!(node_id = shared.config.node_id, %address, "kafka listener serving");
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!("kafka accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                connections.spawn(async move {
                    match connection(stream, peer, &shared).await {
                        Ok(()) => debug!(%peer, "kafka connection closed"),
                        Err(e) => info!(%peer, "kafka connection dropped: {e}"),
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
    Ok(())
}

/// Reads one frame: `Ok(None)` at a clean end of stream between frames.
async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    config: &ServerConfig,
) -> Result<Option<Bytes>> {
    let mut len = [0u8; 4];
    let first = tokio::time::timeout(config.idle_timeout, reader.read(&mut len[..1]))
        .await
        .map_err(|_| Error::Timeout("idle connection"))??;
    if first == 0 {
        return Ok(None);
    }
    let body = async {
        reader.read_exact(&mut len[1..]).await?;
        let size = i32::from_be_bytes(len);
        if size < 0 {
            return Err(Error::Malformed(format!("negative frame length {size}")));
        }
        let size = size as usize;
        if size > config.max_frame_bytes {
            return Err(Error::FrameTooLarge {
                size: size as i64,
                limit: config.max_frame_bytes,
            });
        }
        if size < MIN_FRAME {
            return Err(Error::Malformed(format!(
                "frame of {size} bytes has no header"
            )));
        }
        let mut frame = BytesMut::zeroed(size);
        reader.read_exact(&mut frame).await?;
        Ok(frame.freeze())
    };
    let frame = tokio::time::timeout(config.frame_timeout, body)
        .await
        .map_err(|_| Error::Timeout("frame not sent in time"))??;
    Ok(Some(frame))
}

async fn connection<H: Handler>(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    shared: &Shared<H>,
) -> Result<()> {
    let (reader, writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    let mut writer = BufWriter::new(writer);
    while let Some(frame) = read_frame(&mut reader, &shared.config).await? {
        let Some((version, correlation_id, response)) = answer(shared, frame, peer).await? else {
            continue;
        };
        let bytes = encode_response(version, correlation_id, &response)?;
        writer.write_all(&bytes).await?;
        writer.flush().await?;
    }
    Ok(())
}

/// Decodes and answers one frame: `None` when no response is due.
async fn answer<H: Handler>(
    shared: &Shared<H>,
    mut frame: Bytes,
    peer: std::net::SocketAddr,
) -> Result<Option<(ResponseVersion, i32, ResponseKind)>> {
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let unsupported = || Error::Unsupported {
        key: raw_key,
        version,
    };
    let api_key = ApiKey::try_from(raw_key).map_err(|()| unsupported())?;
    if !shared.table.supports(api_key, version) {
        if api_key == ApiKey::ApiVersions {
            // KIP-511: answer at version 0 with the table so the client can pick a version.
            let response = shared
                .table
                .api_versions(Some(ResponseError::UnsupportedVersion));
            return Ok(Some((
                ResponseVersion::new(api_key, 0),
                correlation_id,
                ResponseKind::ApiVersions(response),
            )));
        }
        return Err(unsupported());
    }
    let header = RequestHeader::decode(&mut frame, api_key.request_header_version(version))
        .map_err(|e| Error::Decode(format!("header: {e}")))?;
    let body = RequestKind::decode(api_key, &mut frame, version)
        .map_err(|e| Error::Decode(format!("{api_key:?} v{version}: {e}")))?;
    if frame.has_remaining() {
        debug!(api = ?api_key, version, trailing = frame.remaining(), "trailing bytes ignored");
    }
    let config = &shared.config;
    let caller = config
        .metrics
        .as_ref()
        .map(|_| crate::observe::caller(&body));
    let response = match body {
        RequestKind::ApiVersions(_) => {
            Some(ResponseKind::ApiVersions(shared.table.api_versions(None)))
        }
        RequestKind::Metadata(request) => Some(ResponseKind::Metadata(metadata::metadata(
            &config.topology,
            config.node_id,
            &request,
            version,
        ))),
        RequestKind::FindCoordinator(request) => Some(ResponseKind::FindCoordinator(
            metadata::find_coordinator(&config.topology, &request, version),
        )),
        RequestKind::DescribeConfigs(request) => Some(ResponseKind::DescribeConfigs(
            crate::configs::describe_configs(
                &config.topology,
                config.node_id,
                &shared.handler.broker_configs(),
                &request,
                version,
            ),
        )),
        RequestKind::DescribeCluster(request) => Some(ResponseKind::DescribeCluster(
            metadata::describe_cluster(&config.topology, config.node_id, &request),
        )),
        RequestKind::CreateTopics(request) => Some(ResponseKind::CreateTopics(
            crate::topics::create_topics(&config.topology, &request),
        )),
        RequestKind::CreatePartitions(request) => Some(ResponseKind::CreatePartitions(
            crate::topics::create_partitions(&config.topology, &request),
        )),
        RequestKind::DeleteTopics(request) => Some(ResponseKind::DeleteTopics(
            crate::topics::delete_topics(&config.topology, &request, version),
        )),
        body if !shared.served.supports(api_key, version) => {
            debug!(api = ?api_key, version, correlation_id, "kafka request for the other role");
            crate::refuse::not_served_here(&body, version)
        }
        body => {
            debug!(api = ?api_key, version, correlation_id, "kafka request");
            shared
                .handler
                .handle(Request {
                    header,
                    api_key,
                    version,
                    body,
                    peer: Some(peer),
                })
                .await?
        }
    };
    if let (Some(metrics), Some((transactional_id, producer_id)), Some(response)) =
        (&config.metrics, &caller, &response)
    {
        let request = format!("{api_key:?}");
        for code in crate::observe::error_codes(response) {
            let error = crate::observe::error_name(code);
            metrics.request_named(&request, &error, transactional_id, *producer_id);
        }
    }
    Ok(response.map(|r| (ResponseVersion::new(api_key, version), correlation_id, r)))
}

/// The version a response is encoded at, and its header version.
#[derive(Clone, Copy, Debug)]
struct ResponseVersion {
    version: i16,
    header_version: i16,
}

impl ResponseVersion {
    fn new(key: ApiKey, version: i16) -> Self {
        Self {
            version,
            header_version: key.response_header_version(version),
        }
    }
}

/// A length-prefixed response frame.
fn encode_response(
    version: ResponseVersion,
    correlation_id: i32,
    response: &ResponseKind,
) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    header
        .encode(&mut buf, version.header_version)
        .map_err(|e| Error::Encode(format!("header: {e}")))?;
    response
        .encode(&mut buf, version.version)
        .map_err(|e| Error::Encode(e.to_string()))?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A node that serves nothing of its own.
    struct Nothing;

    impl Handler for Nothing {
        fn apis(&self) -> Vec<ApiRange> {
            Vec::new()
        }

        async fn handle(&self, _: Request) -> Result<Option<ResponseKind>> {
            Err(Error::Close("nothing here".into()))
        }
    }

    fn topology() -> Arc<Topology> {
        Arc::new(
            Topology::parse(
                "transaction_state_partitions = 1\n[[coordinators]]\nid = 1\naddress = \"127.0.0.1:1\"",
            )
            .unwrap(),
        )
    }

    async fn start(
        config: impl FnOnce(&mut ServerConfig),
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut c = ServerConfig::new(1, topology());
        config(&mut c);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, c, Arc::new(Nothing), async move {
            let _ = stopped.await;
        }));
        (address, stop)
    }

    fn api_versions(correlation_id: i32) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&18i16.to_be_bytes());
        body.extend_from_slice(&0i16.to_be_bytes());
        body.extend_from_slice(&correlation_id.to_be_bytes());
        body.extend_from_slice(&(-1i16).to_be_bytes());
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend(body);
        frame
    }

    async fn closed(s: &mut TcpStream) -> bool {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn a_slow_sender_loses_its_connection_and_others_are_served() {
        let (address, _stop) = start(|c| c.frame_timeout = Duration::from_millis(200)).await;
        let mut slow = TcpStream::connect(address).await.unwrap();
        slow.write_all(&100i32.to_be_bytes()).await.unwrap();
        slow.write_all(&[0u8; 5]).await.unwrap();
        let mut other = TcpStream::connect(address).await.unwrap();
        other.write_all(&api_versions(7)).await.unwrap();
        let len = other.read_i32().await.unwrap();
        let correlation = other.read_i32().await.unwrap();
        assert!(len > 4);
        assert_eq!(correlation, 7);
        assert!(
            closed(&mut slow).await,
            "the stalled frame costs its connection"
        );
    }

    #[tokio::test]
    async fn frames_over_the_limit_and_an_api_of_no_role_close_the_connection() {
        let (address, _stop) = start(|c| c.max_frame_bytes = 1024).await;
        let mut s = TcpStream::connect(address).await.unwrap();
        s.write_all(&1025i32.to_be_bytes()).await.unwrap();
        assert!(closed(&mut s).await);
        // A frame within the limit is fine.
        let mut s = TcpStream::connect(address).await.unwrap();
        s.write_all(&api_versions(1)).await.unwrap();
        assert!(s.read_i32().await.unwrap() > 0);
        // An API in the table that no handler answers (this node serves nothing): closed.
        let mut s = TcpStream::connect(address).await.unwrap();
        let mut frame = api_versions(2);
        frame[4..6].copy_from_slice(&(ApiKey::CreateTopics as i16).to_be_bytes());
        s.write_all(&frame).await.unwrap();
        assert!(closed(&mut s).await);
    }
}
