//! [`Admin`]: the operator's view (ListTransactions, DescribeTransactions, DescribeProducers,
//! Metadata), and [`RawRequests`]: single protocol requests with explicit (PID, epoch), for tools
//! and tests that must show what a *zombie* gets back from each service.
//!
//! Raw requests still retry retriable errors (so a moved coordinator is not mistaken for an
//! answer), but never interpret or remember anything.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cluster::TopicPartition;
use proto::{
    AddPartitionsToTxnRequest, CoordinatorKeyType, DescribeProducersRequest,
    DescribeTransactionsRequest, EndTxnRequest, InitProducerIdRequest, ListTransactionsRequest,
    ProducerStateDescription, TransactionDescription, TransactionListing, TxnResult, TxnState,
};

use crate::config::ClientConfig;
use crate::error::{Error, Result, WireError};
use crate::net::{ClusterMetadata, Connections};
use crate::produce::{self, RecordMetadata};
use crate::transactional::coordinator_rpc;

/// Administrative requests.
#[derive(Clone, Debug)]
pub struct Admin {
    conn: Connections,
}

impl Admin {
    /// An admin client.
    pub fn new(config: ClientConfig) -> Result<Self> {
        Ok(Self {
            conn: Connections::new(config)?,
        })
    }

    /// The cluster metadata (fresh).
    pub async fn metadata(&self) -> Result<Arc<ClusterMetadata>> {
        self.conn.refresh_metadata().await
    }

    /// ListTransactions on every coordinator; each listing with the coordinator's id.
    pub async fn list_transactions(
        &self,
        states: &[TxnState],
    ) -> Result<Vec<(i32, TransactionListing)>> {
        let metadata = self.conn.metadata().await?;
        let mut out = Vec::new();
        for node in &metadata.coordinators {
            let mut client = self.conn.coordinator(&node.address)?;
            let request = ListTransactionsRequest {
                state_filters: states.iter().map(|s| *s as i32).collect(),
            };
            let response = self
                .conn
                .rpc(
                    &node.address,
                    Duration::ZERO,
                    client.list_transactions(request),
                )
                .await?
                .checked()?;
            out.extend(
                response
                    .transactions
                    .into_iter()
                    .map(|t| (response.coordinator_id, t)),
            );
        }
        out.sort_by(|a, b| a.1.transactional_id.cmp(&b.1.transactional_id));
        Ok(out)
    }

    /// ListGroups on every coordinator: each group with its coordinator's id, by group id.
    pub async fn list_groups(&self) -> Result<Vec<(i32, proto::GroupListing)>> {
        let metadata = self.conn.metadata().await?;
        let mut out = Vec::new();
        for node in &metadata.coordinators {
            let mut client = self.conn.groups(&node.address)?;
            let response = self
                .conn
                .rpc(
                    &node.address,
                    Duration::ZERO,
                    client.list_groups(proto::ListGroupsRequest {}),
                )
                .await?
                .checked()?;
            let id = response.coordinator_id;
            out.extend(response.groups.into_iter().map(|g| (id, g)));
        }
        out.sort_by(|a, b| a.1.group_id.cmp(&b.1.group_id));
        Ok(out)
    }

    /// DescribeGroup at the group's coordinator (retried while the coordinator is loading or
    /// moved); GROUP_ID_NOT_FOUND for a group it knows nothing of.
    pub async fn describe_group(&self, group_id: &str) -> Result<proto::DescribeGroupResponse> {
        let mut backoff = self.conn.backoff();
        loop {
            let attempt = async {
                let coordinator = self
                    .conn
                    .find_coordinator(group_id, CoordinatorKeyType::Group)
                    .await?;
                let mut client = self.conn.groups(&coordinator.address)?;
                let request = proto::DescribeGroupRequest {
                    group_id: group_id.to_string(),
                };
                self.conn
                    .rpc(
                        &coordinator.address,
                        Duration::ZERO,
                        client.describe_group(request),
                    )
                    .await?
                    .checked()
            };
            match attempt.await {
                Err(e) if e.is_retriable() => {
                    if !backoff.wait().await {
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
    }

    /// DescribeTransactions for one id, at its coordinator (retried while the coordinator is
    /// loading or moved).
    pub async fn describe_transaction(
        &self,
        transactional_id: &str,
    ) -> Result<TransactionDescription> {
        let mut backoff = self.conn.backoff();
        loop {
            match self.describe_once(transactional_id).await {
                Err(e) if e.is_retriable() => {
                    if !backoff.wait().await {
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
    }

    async fn describe_once(&self, transactional_id: &str) -> Result<TransactionDescription> {
        let coordinator = self
            .conn
            .find_coordinator(transactional_id, CoordinatorKeyType::Transaction)
            .await?;
        let mut client = self.conn.coordinator(&coordinator.address)?;
        let request = DescribeTransactionsRequest {
            transactional_ids: vec![transactional_id.to_string()],
        };
        let response = self
            .conn
            .rpc(
                &coordinator.address,
                Duration::ZERO,
                client.describe_transactions(request),
            )
            .await?;
        let description =
            response
                .transactions
                .into_iter()
                .next()
                .ok_or_else(|| Error::Server {
                    code: proto::ErrorCode::UnknownServerError,
                    message: "DescribeTransactions returned no description".into(),
                })?;
        Error::check(description.error_code, &description.error_message)?;
        Ok(description)
    }

    /// DescribeProducers for one partition, at its leader.
    pub async fn describe_producers(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ProducerStateDescription>> {
        let leader = self.conn.leader_for(topic, partition).await?;
        let mut client = self.conn.leader(&leader.address)?;
        let request = DescribeProducersRequest {
            topic: topic.to_string(),
            partition,
        };
        let response = self
            .conn
            .rpc(
                &leader.address,
                Duration::ZERO,
                client.describe_producers(request),
            )
            .await?
            .checked()?;
        Ok(response.producers)
    }

    /// High watermark and LSO of every partition of `topic` (a Fetch of 0 bytes at offset 0).
    pub async fn end_offsets(&self, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>> {
        let count = self.conn.partition_count(topic).await?;
        let mut out = BTreeMap::new();
        for partition in 0..count {
            let leader = self.conn.leader_for(topic, partition).await?;
            let mut client = self.conn.leader(&leader.address)?;
            let request = proto::FetchRequest {
                topic: topic.to_string(),
                partition,
                offset: 0,
                max_bytes: 1,
                isolation_level: proto::IsolationLevel::ReadUncommitted as i32,
                max_wait_ms: 0,
            };
            let r = self
                .conn
                .rpc(&leader.address, Duration::ZERO, client.fetch(request))
                .await?
                .checked()?;
            out.insert(partition, (r.high_watermark, r.last_stable_offset));
        }
        Ok(out)
    }
}

/// Single protocol requests with an explicit (PID, epoch): what a zombie instance would send.
#[derive(Clone, Debug)]
pub struct RawRequests {
    conn: Connections,
}

impl RawRequests {
    /// Raw requests over `config`'s cluster.
    pub fn new(config: ClientConfig) -> Result<Self> {
        Ok(Self {
            conn: Connections::new(config)?,
        })
    }

    /// InitProducerId at the id's coordinator; returns (PID, epoch).
    pub async fn init_producer_id(
        &self,
        transactional_id: &str,
        transaction_timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<(i64, i16)> {
        let (expected_producer_id, expected_producer_epoch) =
            expected.map_or((-1, -1), |(p, e)| (p, i32::from(e)));
        let request = InitProducerIdRequest {
            transactional_id: Some(transactional_id.to_string()),
            transaction_timeout_ms,
            expected_producer_id,
            expected_producer_epoch,
            // Transaction version 2: every transaction ends with an epoch bump.
            transaction_version: 2,
        };
        let r = coordinator_rpc(
            &self.conn,
            &mut None,
            transactional_id,
            CoordinatorKeyType::Transaction,
            request,
            |mut c, r| async move { c.init_producer_id(r).await },
        )
        .await?;
        Ok((r.producer_id, r.producer_epoch as i16))
    }

    /// AddPartitionsToTxn with the given (PID, epoch).
    pub async fn add_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[TopicPartition],
    ) -> Result<()> {
        let request = AddPartitionsToTxnRequest {
            transactional_id: transactional_id.to_string(),
            producer_id,
            producer_epoch: i32::from(epoch),
            partitions: partitions.iter().cloned().map(Into::into).collect(),
        };
        coordinator_rpc(
            &self.conn,
            &mut None,
            transactional_id,
            CoordinatorKeyType::Transaction,
            request,
            |mut c, r| async move { c.add_partitions_to_txn(r).await },
        )
        .await?;
        Ok(())
    }

    /// EndTxn with the given (PID, epoch); returns the (PID, epoch) the coordinator answered.
    pub async fn end_txn(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> Result<(i64, i16)> {
        let request = EndTxnRequest {
            transactional_id: transactional_id.to_string(),
            producer_id,
            producer_epoch: i32::from(epoch),
            result: if commit {
                TxnResult::Commit
            } else {
                TxnResult::Abort
            } as i32,
        };
        let r = coordinator_rpc(
            &self.conn,
            &mut None,
            transactional_id,
            CoordinatorKeyType::Transaction,
            request,
            |mut c, r| async move { c.end_txn(r).await },
        )
        .await?;
        Ok((r.producer_id, r.producer_epoch as i16))
    }

    /// WriteTxnMarkers(ABORT) for `producer_id` on `tp` alone, at the partition's leader, signed
    /// with `credentials` (a cluster member's) at `coordinator_generation`: an operator's tool for
    /// a transaction that holds a partition's LSO while no coordinator knows it (Kafka's
    /// `kafka-transactions.sh abort --topic --partition`). The leader fences it like any marker.
    pub async fn write_abort_marker(
        &self,
        tp: &TopicPartition,
        producer_id: i64,
        epoch: i16,
        coordinator_generation: i64,
        transactional_id: &str,
        credentials: &cluster::auth::Credentials,
    ) -> Result<()> {
        let leader = self.conn.leader_for(&tp.topic, tp.partition).await?;
        let mut client = self.conn.leader(&leader.address)?;
        let mut request = proto::WriteTxnMarkersRequest {
            producer_id,
            producer_epoch: i32::from(epoch),
            result: TxnResult::Abort as i32,
            coordinator_id: credentials.node_id,
            coordinator_generation,
            partitions: vec![tp.clone().into()],
            transactional_id: transactional_id.to_string(),
            auth: None,
            transaction_version: 2,
            transaction_number: 0,
        };
        cluster::auth::sign(credentials, &mut request, cluster::node::now_ms());
        let response = self
            .conn
            .rpc(
                &leader.address,
                Duration::ZERO,
                client.write_txn_markers(request),
            )
            .await?;
        for result in response.results {
            Error::check(result.error_code, &result.error_message)?;
        }
        Ok(())
    }

    /// Produce of one batch to `tp` with exactly the fields given.
    #[allow(clippy::too_many_arguments)]
    pub async fn produce(
        &self,
        tp: &TopicPartition,
        transactional_id: Option<&str>,
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
        values: Vec<Vec<u8>>,
    ) -> Result<RecordMetadata> {
        let batch = produce::batch(
            (producer_id, epoch),
            base_sequence,
            transactional_id,
            produce::records(&[], values),
        );
        produce::produce(&self.conn, tp, batch).await
    }
}
