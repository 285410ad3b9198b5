//! The marker writer room (PROTOCOL.md section 7): sends everything a decided transaction's
//! [`MarkerJob`] owes (WriteTxnMarkers per leader, WriteGroupOffsetMarker per group) until each
//! destination acknowledged, then persists Complete* through the `state` room.
//!
//! The core decides, this room only delivers (raft-rs's Ready/advance): what a reply means is
//! [`core::marker_reply`]; [`Shared::deliver`] is the one deliver-with-backoff loop, and the two
//! kinds of destination differ only in how one round is sent.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use cluster::node::{lock, now_ms};
use cluster::{NodeId, TopicPartition};
use futures::future::{BoxFuture, FutureExt};
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::ErrorCode;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, error, warn};

use super::state::Write;
use super::{wire, Backoff, Shared};
use crate::core::{self, GroupMarker, MarkerJob, MarkerReply, PendingOffsets};
use crate::error::code_of;

/// Per-RPC deadline for markers sent to other nodes.
const MARKER_RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// How one marker destination ended.
#[derive(Debug, PartialEq, Eq)]
enum Delivery {
    Acknowledged,
    /// Shutdown or a permanent error: the transaction must not be completed by this task.
    Stopped,
}

/// One round's answers: per item, the destination's code and message, or why there was no
/// answer (retried). Items without an answer are sent again.
type Answers<K> = Vec<(K, Result<(ErrorCode, String), String>)>;

impl Shared {
    pub(super) fn spawn_markers(self: &Arc<Self>, job: MarkerJob) {
        let shared = self.clone();
        self.spawn(async move { shared.write_markers(job).await });
    }

    pub(super) fn channel(&self, address: &str) -> Result<Channel, String> {
        let mut channels = lock(&self.channels);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let channel = cluster::node::grpc_endpoint(
            Endpoint::from_shared(format!("http://{address}"))
                .map_err(|e| format!("bad address {address:?}: {e}"))?,
        )
        .connect_timeout(Duration::from_secs(1))
        .timeout(MARKER_RPC_TIMEOUT)
        .connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// Sends every marker of `job` until acknowledged, then completes the transaction.
    async fn write_markers(self: Arc<Self>, job: MarkerJob) {
        let leaders = job
            .partitions_by_leader(&self.topology)
            .into_iter()
            .map(|(leader, partitions)| self.markers_to_leader(&job, leader, partitions));
        let groups = job
            .groups_by_coordinator(&self.topology)
            .into_iter()
            .map(|(node, groups)| self.group_markers_to(&job, node, groups));
        let (leaders, groups) = futures::future::join(
            futures::future::join_all(leaders),
            futures::future::join_all(groups),
        )
        .await;
        if leaders
            .iter()
            .chain(&groups)
            .any(|d| *d != Delivery::Acknowledged)
        {
            return;
        }
        self.complete(&job).await;
    }

    /// Every marker is written: record Complete* (queued in the group commit, not waited for:
    /// it only records what is durable already, see `commit`), retrying a refused write until
    /// stopped.
    async fn complete(self: &Arc<Self>, job: &MarkerJob) {
        let slot = self.slot(&job.transactional_id, false);
        let mut backoff = Backoff::new(self.config.marker_retry_backoff);
        loop {
            let mut stored = slot.meta.lock().await;
            let Some(meta) = stored.as_ref() else { return };
            let outcome = core::complete_markers(meta, job, now_ms());
            match self.apply_as(&mut stored, outcome, Write::Queued).await {
                Ok(_) => {
                    // Requests waiting out the Prepare* state (see `state`) run again now.
                    slot.settled.notify_waiters();
                    return;
                }
                Err(e) => {
                    error!(txn_id = %job.transactional_id, error = %e, "persisting completion failed; retrying")
                }
            }
            drop(stored);
            if backoff.wait(self).await {
                return;
            }
        }
    }

    /// The one deliver-with-backoff loop: sends `items` to `destination` with `send` (one
    /// round: every item still owed), asks the core what each answer means, and repeats with
    /// exponential backoff until every item is acknowledged, a reply says stop, or the
    /// coordinator stops.
    async fn deliver<'f, K: Ord + Clone + Display>(
        &self,
        job: &MarkerJob,
        destination: &str,
        items: impl IntoIterator<Item = K>,
        mut send: impl FnMut(Vec<K>) -> BoxFuture<'f, Answers<K>>,
    ) -> Delivery {
        let txn_id = &job.transactional_id;
        let mut remaining: BTreeSet<K> = items.into_iter().collect();
        let mut backoff = Backoff::new(self.config.marker_retry_backoff);
        loop {
            if self.stopping() {
                return Delivery::Stopped;
            }
            for (item, answer) in send(remaining.iter().cloned().collect()).await {
                let (code, message) = match answer {
                    Ok(answer) => answer,
                    Err(e) => {
                        debug!(%txn_id, destination, %item, error = %e, "marker request failed; retrying");
                        continue;
                    }
                };
                match core::marker_reply(job.result, code) {
                    MarkerReply::Acknowledged => {
                        if code != ErrorCode::None {
                            warn!(%txn_id, destination, %item, ?code, %message,
                                  "destination holds a newer epoch; abort marker counted as written");
                        }
                        remaining.remove(&item);
                    }
                    MarkerReply::Retry => {
                        debug!(%txn_id, destination, %item, ?code, %message, "marker not acknowledged; retrying")
                    }
                    MarkerReply::Stop => {
                        error!(%txn_id, destination, %item, ?code, %message,
                               pid = job.identity.producer_id, epoch = job.identity.epoch,
                               generation = self.generation(), result = ?job.result,
                               "marker refused for good (a newer incarnation of this coordinator, \
                                or a commit refused for a newer epoch); leaving the transaction prepared");
                        return Delivery::Stopped;
                    }
                }
            }
            if remaining.is_empty() {
                return Delivery::Acknowledged;
            }
            if backoff.wait(self).await {
                return Delivery::Stopped;
            }
        }
    }

    /// WriteTxnMarkers to one leader, for its partitions of the transaction.
    async fn markers_to_leader(
        self: &Arc<Self>,
        job: &MarkerJob,
        leader: Option<NodeId>,
        partitions: Vec<TopicPartition>,
    ) -> Delivery {
        let Some(address) = leader
            .and_then(|id| self.topology.leader(id))
            .map(|n| n.address.clone())
        else {
            error!(txn_id = %job.transactional_id, ?partitions, "no leader in the topology for these partitions");
            return match core::marker_unroutable(job.result) {
                MarkerReply::Acknowledged => Delivery::Acknowledged,
                MarkerReply::Retry | MarkerReply::Stop => Delivery::Stopped,
            };
        };
        let destination = format!("leader at {address}");
        self.deliver(job, &destination, partitions, |partitions| {
            self.send_to_leader(job, &address, partitions).boxed()
        })
        .await
    }

    /// One WriteTxnMarkers round (through the leader's queue: batched with other
    /// transactions' markers for the same leader, see `leader_queue`).
    async fn send_to_leader(
        self: &Arc<Self>,
        job: &MarkerJob,
        address: &str,
        partitions: Vec<TopicPartition>,
    ) -> Answers<TopicPartition> {
        let mut request = proto::WriteTxnMarkersRequest {
            producer_id: job.identity.producer_id,
            producer_epoch: i32::from(job.identity.epoch),
            result: wire::result(job.result) as i32,
            coordinator_id: self.node_id,
            coordinator_generation: self.generation(),
            partitions: partitions.iter().cloned().map(Into::into).collect(),
            transactional_id: job.transactional_id.clone(),
            auth: None,
            transaction_version: job.transaction_version.to_wire(),
            transaction_number: job.transaction_number,
        };
        self.sign(&mut request);
        let reply = self.write_txn_markers_queued(address, request).await;
        match reply {
            Err(e) => partitions
                .into_iter()
                .map(|tp| (tp, Err(e.clone())))
                .collect(),
            Ok(reply) => reply
                .results
                .into_iter()
                .filter_map(|r| {
                    let tp = TopicPartition::from(r.partition?);
                    Some((
                        tp,
                        Ok((ErrorCode::from_wire(r.error_code), r.error_message)),
                    ))
                })
                .collect(),
        }
    }

    /// WriteGroupOffsetMarker for each group of the transaction that `node` coordinates.
    async fn group_markers_to(
        &self,
        job: &MarkerJob,
        node: NodeId,
        groups: Vec<(String, PendingOffsets)>,
    ) -> Delivery {
        let offsets: BTreeMap<String, PendingOffsets> = groups.into_iter().collect();
        let destination = format!("group coordinator {node}");
        self.deliver(job, &destination, offsets.keys().cloned(), |groups| {
            self.send_group_markers(job, node, groups, &offsets).boxed()
        })
        .await
    }

    /// One round of group markers to coordinator `node` (this node: applied locally).
    async fn send_group_markers(
        &self,
        job: &MarkerJob,
        node: NodeId,
        groups: Vec<String>,
        offsets: &BTreeMap<String, PendingOffsets>,
    ) -> Answers<String> {
        let mut answers = Vec::with_capacity(groups.len());
        for group in groups {
            let marker = GroupMarker {
                group_id: group.clone(),
                producer_id: job.identity.producer_id,
                epoch: job.identity.epoch,
                result: job.result,
                offsets: offsets.get(&group).cloned().unwrap_or_default(),
                coordinator_id: self.node_id,
                coordinator_generation: self.generation(),
                transaction_version: job.transaction_version,
                transaction_number: job.transaction_number,
            };
            let answer = if node == self.node_id {
                let (code, message) = code_of(&self.write_group_marker(marker).await);
                Ok((ErrorCode::from_wire(code), message))
            } else {
                self.write_group_marker_remote(node, &job.transactional_id, marker)
                    .await
            };
            // A reply that stops the writer ends the round: the rest are not sent.
            let stop = matches!(&answer, Ok((code, _)) if core::marker_reply(job.result, *code) == MarkerReply::Stop);
            answers.push((group, answer));
            if stop {
                break;
            }
        }
        answers
    }

    /// Sends one group marker to coordinator `node`: its reply code and message, or a
    /// transport error (retried).
    async fn write_group_marker_remote(
        &self,
        node: NodeId,
        transactional_id: &str,
        marker: GroupMarker,
    ) -> Result<(ErrorCode, String), String> {
        let address = self
            .topology
            .coordinator(node)
            .map(|n| n.address.clone())
            .ok_or_else(|| format!("coordinator {node} is not in the topology"))?;
        let mut request = wire::group_marker_request(marker, transactional_id);
        self.sign(&mut request);
        let reply = TransactionCoordinatorClient::new(self.channel(&address)?)
            .write_group_offset_marker(request)
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        Ok((ErrorCode::from_wire(reply.error_code), reply.error_message))
    }
}
