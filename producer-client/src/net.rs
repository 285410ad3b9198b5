//! Connections and cluster discovery shared by every client type.
//!
//! [`Connections`] keeps one lazily connected tonic channel per node address (a restarted node at
//! the same address is reconnected transparently), caches the topic metadata (partition ->
//! leader address) and answers FindCoordinator from any bootstrap node. Every RPC goes through
//! [`Connections::rpc`] that apply the request deadline and turn a gRPC failure
//! into a retriable [`Error::Transport`].
//!
//! CAVEATS: no TLS, no authentication; metadata is refreshed only when an answer says it is stale.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::cluster_client::ClusterClient;
use proto::partition_leader_client::PartitionLeaderClient;
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::{CoordinatorKeyType, FindCoordinatorRequest, MetadataRequest};
use tonic::transport::{Channel, Endpoint};

use crate::config::{uri, Backoff, ClientConfig};
use crate::error::{Error, Result};

/// A node as FindCoordinator names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddr {
    /// Node id.
    pub node_id: i32,
    /// `host:port`.
    pub address: String,
}

/// The cluster as Metadata describes it.
#[derive(Clone, Debug, Default)]
pub struct ClusterMetadata {
    /// Coordinators.
    pub coordinators: Vec<NodeAddr>,
    /// Partition leaders.
    pub leaders: Vec<NodeAddr>,
    /// Topic -> per-partition leader.
    pub topics: HashMap<String, Vec<NodeAddr>>,
}

impl ClusterMetadata {
    /// The leader of `topic`/`partition`.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<&NodeAddr> {
        self.topics
            .get(topic)?
            .get(usize::try_from(partition).ok()?)
    }

    /// Number of partitions of `topic`.
    pub fn partition_count(&self, topic: &str) -> Option<i32> {
        self.topics.get(topic).map(|p| p.len() as i32)
    }
}

/// Channels per address, cached metadata, the client configuration.
#[derive(Clone, Debug)]
pub struct Connections {
    config: Arc<ClientConfig>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    metadata: Arc<Mutex<Option<Arc<ClusterMetadata>>>>,
}

impl Connections {
    /// Connection state for `config` (nothing is dialled yet).
    pub fn new(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            config: Arc::new(config),
            channels: Arc::default(),
            metadata: Arc::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(&self.config)
    }

    fn channel(&self, address: &str) -> Result<Channel> {
        let mut channels = self.channels.lock().expect("channel cache poisoned");
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let endpoint = cluster::node::grpc_endpoint(
            Endpoint::from_shared(uri(address))
                .map_err(|e| Error::Config(format!("bad address {address:?}: {e}")))?,
        )
        .connect_timeout(self.config.connect_timeout);
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// A Cluster client for `address`.
    pub fn cluster(&self, address: &str) -> Result<ClusterClient<Channel>> {
        Ok(ClusterClient::new(self.channel(address)?))
    }

    /// A TransactionCoordinator client for `address`.
    pub fn coordinator(&self, address: &str) -> Result<TransactionCoordinatorClient<Channel>> {
        Ok(TransactionCoordinatorClient::new(self.channel(address)?))
    }

    /// A Groups client for `address` (a coordinator).
    pub fn groups(&self, address: &str) -> Result<proto::groups_client::GroupsClient<Channel>> {
        Ok(proto::groups_client::GroupsClient::new(
            self.channel(address)?,
        ))
    }

    /// A PartitionLeader client for `address`.
    pub fn leader(&self, address: &str) -> Result<PartitionLeaderClient<Channel>> {
        Ok(PartitionLeaderClient::new(self.channel(address)?))
    }

    /// Runs one RPC against `address` with the request deadline (plus `extra` for long polls);
    /// a gRPC failure or a missed deadline becomes [`Error::Transport`].
    pub async fn rpc<T, F>(&self, address: &str, extra: Duration, call: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.config.request_timeout + extra, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Error::transport(
                address,
                format!("{:?}: {}", status.code(), status.message()),
            )),
            Err(_) => Err(Error::transport(address, "request deadline exceeded")),
        }
    }

    /// FindCoordinator for `key`, asked of the bootstrap nodes in turn (and the known
    /// coordinators), retried with backoff.
    pub async fn find_coordinator(
        &self,
        key: &str,
        key_type: CoordinatorKeyType,
    ) -> Result<NodeAddr> {
        let what = format!("FindCoordinator({key})");
        self.ask_any_node(&what, |address| async move {
            let request = FindCoordinatorRequest {
                key: key.to_string(),
                key_type: key_type as i32,
            };
            let mut client = self.cluster(&address)?;
            let r = self
                .rpc(&address, Duration::ZERO, client.find_coordinator(request))
                .await?;
            Error::check(r.error_code, &r.error_message)?;
            Ok(NodeAddr {
                node_id: r.node_id,
                address: r.address,
            })
        })
        .await
    }

    /// Asks the discovery addresses ([`Connections::discovery_addresses`]) in turn until one
    /// answers. A retriable error moves on to the next address; after a round without an answer
    /// the client backs off and asks them all again. Any other error is returned at once.
    async fn ask_any_node<T, F, Fut>(&self, what: &str, ask: F) -> Result<T>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut backoff = self.backoff();
        loop {
            let mut last = None;
            for address in self.discovery_addresses() {
                match ask(address).await {
                    Ok(answer) => return Ok(answer),
                    Err(e) if e.is_retriable() => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            let err = last.unwrap_or_else(|| Error::Config("no bootstrap address".into()));
            if !backoff.wait().await {
                return Err(err);
            }
            tracing::debug!(%what, error = %err, "no node answered; retrying");
        }
    }

    /// Bootstrap addresses first, then every node the metadata names.
    fn discovery_addresses(&self) -> Vec<String> {
        let mut out = self.config.bootstrap.clone();
        if let Some(m) = self.metadata.lock().expect("metadata poisoned").as_ref() {
            for n in m.coordinators.iter().chain(&m.leaders) {
                if !out.contains(&n.address) {
                    out.push(n.address.clone());
                }
            }
        }
        out
    }

    /// The cached metadata, fetched if there is none yet.
    pub async fn metadata(&self) -> Result<Arc<ClusterMetadata>> {
        if let Some(m) = self.metadata.lock().expect("metadata poisoned").clone() {
            return Ok(m);
        }
        self.refresh_metadata().await
    }

    /// Drops the cached metadata; the next [`Connections::metadata`] fetches it again.
    pub fn invalidate_metadata(&self) {
        *self.metadata.lock().expect("metadata poisoned") = None;
    }

    /// Fetches the metadata from any reachable node, retried with backoff.
    pub async fn refresh_metadata(&self) -> Result<Arc<ClusterMetadata>> {
        self.ask_any_node("Metadata", |address| async move {
            let mut client = self.cluster(&address)?;
            let r = self
                .rpc(
                    &address,
                    Duration::ZERO,
                    client.metadata(MetadataRequest { topics: vec![] }),
                )
                .await?;
            let node = |n: &proto::NodeEndpoint| NodeAddr {
                node_id: n.node_id,
                address: n.address.clone(),
            };
            let metadata = Arc::new(ClusterMetadata {
                coordinators: r.coordinators.iter().map(node).collect(),
                leaders: r.leaders.iter().map(node).collect(),
                topics: r
                    .topics
                    .iter()
                    .filter(|t| t.error_code == 0)
                    .map(|t| {
                        let mut parts = t.partitions.clone();
                        parts.sort_by_key(|p| p.partition);
                        let leaders = parts
                            .iter()
                            .map(|p| NodeAddr {
                                node_id: p.leader_id,
                                address: p.leader_address.clone(),
                            })
                            .collect();
                        (t.name.clone(), leaders)
                    })
                    .collect(),
            });
            *self.metadata.lock().expect("metadata poisoned") = Some(metadata.clone());
            Ok(metadata)
        })
        .await
    }

    /// The leader address of `topic`/`partition`, or UNKNOWN_TOPIC_OR_PARTITION.
    pub async fn leader_for(&self, topic: &str, partition: i32) -> Result<NodeAddr> {
        let metadata = self.metadata().await?;
        metadata
            .leader(topic, partition)
            .cloned()
            .ok_or_else(|| Error::Server {
                code: proto::ErrorCode::UnknownTopicOrPartition,
                message: format!("{topic}-{partition} does not exist"),
            })
    }

    /// The number of partitions of `topic`, or UNKNOWN_TOPIC_OR_PARTITION.
    pub async fn partition_count(&self, topic: &str) -> Result<i32> {
        self.metadata()
            .await?
            .partition_count(topic)
            .ok_or_else(|| Error::Server {
                code: proto::ErrorCode::UnknownTopicOrPartition,
                message: format!("topic {topic} does not exist"),
            })
    }
}
