//! WriteTxnMarkers on one partition in the shell: under the write lock the core plans the marker
//! (`PartitionState::plan_marker`), the plan is logged and made durable. May touch: the
//! partition's write lock and state, storage (through `persist`). Before any of it, the request
//! is authenticated ([`cluster::auth`]): only the coordinator owning the transactional id, with
//! the cluster secret and this node's topology, may send markers.

use cluster::auth::{self, AuthError};
use proto::{TopicPartition, WriteTxnMarkersRequest};
use tracing::{debug, info, warn};

use super::{now_ms, LeaderService};
use crate::core::{LogEntry, Marker};
use crate::error::Result;

impl LeaderService {
    /// The request's cluster credentials ([`cluster::auth`]): signed with the cluster secret,
    /// under this node's topology, by the coordinator that owns its transactional id, and not
    /// seen before (a replay).
    pub(super) fn authenticate_marker(&self, request: &WriteTxnMarkersRequest) -> Result<()> {
        let credentials = self.inner.credentials.as_ref().ok_or(AuthError::NoSecret)?;
        let now = now_ms();
        let checked = auth::verify(&credentials.secret, &credentials.fingerprint, request, now)
            .and_then(|sender| self.inner.replays.admit(request, now).map(|()| sender))
            .and_then(|sender| {
                auth::check_marker_sender(
                    &self.inner.topology,
                    sender,
                    request.coordinator_id,
                    &request.transactional_id,
                )
            });
        if let Err(e) = &checked {
            warn!(node_id = self.inner.node_id, error = %e, "WriteTxnMarkers refused");
        }
        Ok(checked?)
    }

    pub(super) async fn write_marker(&self, tp: &TopicPartition, marker: Marker) -> Result<()> {
        let part = self.partition(&tp.topic, tp.partition)?;
        let guard = part.write_lock.clone().lock_owned().await;
        part.check_online()?;
        let plan = part.state().plan_marker(&marker, now_ms())?;
        let entries: Vec<LogEntry> = plan
            .control
            .clone()
            .map(LogEntry::Control)
            .into_iter()
            .collect();
        if let Some(control) = &plan.control {
            debug!(partition = %part.tp, pid = marker.producer_id, epoch = control.producer_epoch,
                   commit = control.commit, offset = plan.base_offset,
                   aborted = ?plan.aborted, "transaction marker written");
        } else if plan.is_noop() {
            debug!(partition = %part.tp, pid = marker.producer_id, "repeated marker");
        } else {
            info!(partition = %part.tp, pid = marker.producer_id, epoch = marker.producer_epoch,
                  "marker without an open transaction: epoch recorded");
        }
        self.persist(guard, part, plan, entries).await
    }

    /// WriteTxnMarkersBatch: the markers of several transactions from one coordinator, each
    /// handled exactly as its own WriteTxnMarkers would be (the same authentication and fencing,
    /// the same writes; transactions in parallel), answered in request order. Only the round
    /// trip is shared.
    pub(super) async fn write_txn_markers_batch_of(
        &self,
        batch: proto::WriteTxnMarkersBatchRequest,
    ) -> std::result::Result<proto::WriteTxnMarkersBatchResponse, tonic::Status> {
        use proto::partition_leader_server::PartitionLeader;
        debug!(transactions = batch.markers.len(), "WriteTxnMarkersBatch");
        let replies = futures::future::join_all(
            batch
                .markers
                .into_iter()
                .map(|markers| self.write_txn_markers(tonic::Request::new(markers))),
        )
        .await;
        let responses = replies
            .into_iter()
            .map(|reply| reply.map(tonic::Response::into_inner))
            .collect::<std::result::Result<_, tonic::Status>>()?;
        Ok(proto::WriteTxnMarkersBatchResponse { responses })
    }
}
