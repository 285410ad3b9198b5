//! The per-leader marker queue: the WriteTxnMarkers of different transactions bound for the
//! same partition leader travel in one WriteTxnMarkersBatch request.
//!
//! How: the marker writer (`markers`) hands each round's request for a leader to
//! [`Shared::write_txn_markers_queued`] and waits for its answer. One task per leader address
//! sends: it takes the first queued request, drains everything else already queued (up to
//! [`MAX_MARKER_BATCH`]), sends one WriteTxnMarkersBatch (a lone request goes as a plain
//! WriteTxnMarkers), and hands each transaction its own response. While one request is in
//! flight the next ones queue, so a batch grows with the load and nothing waits for a timer.
//! The meaning of each answer, retries and backoff stay in `markers`, per transaction.
//!
//! Compatibility: a leader that predates WriteTxnMarkersBatch answers UNIMPLEMENTED; the queue
//! then remembers that and sends that leader one WriteTxnMarkers per transaction (in parallel),
//! as before.
//!
//! Sending one request is one small function each ([`Shared::send_write_txn_markers`],
//! [`Shared::send_write_txn_markers_batch`]), the place where a request gets signed.
//!
//! CAVEATS: one request in flight per leader (a batch per round trip, Kafka's one in-flight
//! marker request per broker); a leader that hangs holds its queue for the RPC deadline; the
//! queue task of a leader lives until the coordinator stops.

use std::sync::Arc;

use cluster::node::lock;
use proto::partition_leader_client::PartitionLeaderClient;
use proto::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::Shared;

/// Most transactions one WriteTxnMarkersBatch carries.
pub(super) const MAX_MARKER_BATCH: usize = 256;

/// One transaction's request and the round waiting for its answer.
pub(super) struct Queued {
    request: WriteTxnMarkersRequest,
    answer: oneshot::Sender<Result<WriteTxnMarkersResponse, String>>,
}

/// The sending side of a leader's queue.
pub(super) type LeaderQueue = mpsc::UnboundedSender<Queued>;

impl Shared {
    /// Sends `request` to the leader at `address` in the next batch; its response, or why
    /// there is none (retried by the caller).
    pub(super) async fn write_txn_markers_queued(
        self: &Arc<Self>,
        address: &str,
        request: WriteTxnMarkersRequest,
    ) -> Result<WriteTxnMarkersResponse, String> {
        let (answer, answered) = oneshot::channel();
        self.leader_queue(address)
            .send(Queued { request, answer })
            .map_err(|_| "the marker queue stopped".to_string())?;
        answered
            .await
            .map_err(|_| "the marker queue stopped before answering".to_string())?
    }

    /// The queue of `address`, started on first use.
    fn leader_queue(self: &Arc<Self>, address: &str) -> LeaderQueue {
        let (queue, receiver) = {
            let mut queues = lock(&self.leader_queues);
            if let Some(queue) = queues.get(address).filter(|q| !q.is_closed()) {
                return queue.clone();
            }
            let (queue, receiver) = mpsc::unbounded_channel();
            queues.insert(address.to_string(), queue.clone());
            (queue, receiver)
        };
        let shared = self.clone();
        let address = address.to_string();
        self.spawn(async move { shared.send_queued(address, receiver).await });
        queue
    }

    /// The queue's task: one request (a batch, or a lone WriteTxnMarkers) at a time, until the
    /// coordinator stops. Requests left in the queue then get no answer (their rounds end).
    async fn send_queued(
        self: Arc<Self>,
        address: String,
        mut queue: mpsc::UnboundedReceiver<Queued>,
    ) {
        let mut stop = self.stop.subscribe();
        let mut batches = true;
        loop {
            let first = tokio::select! {
                queued = queue.recv() => match queued {
                    Some(queued) => queued,
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            };
            let mut queued = vec![first];
            while queued.len() < MAX_MARKER_BATCH {
                match queue.try_recv() {
                    Ok(next) => queued.push(next),
                    Err(_) => break,
                }
            }
            let (requests, answers): (Vec<_>, Vec<_>) =
                queued.into_iter().map(|q| (q.request, q.answer)).unzip();
            let responses = if batches && requests.len() > 1 {
                match self
                    .send_write_txn_markers_batch(&address, requests.clone())
                    .await
                {
                    Err(status) if status.code() == tonic::Code::Unimplemented => {
                        warn!(leader = %address, "leader has no WriteTxnMarkersBatch; sending one transaction per request");
                        batches = false;
                        self.send_each(&address, requests).await
                    }
                    Err(status) => vec![Err(status.to_string()); answers.len()],
                    Ok(responses) if responses.len() != answers.len() => {
                        let e = format!(
                            "leader answered {} of {} transactions' markers",
                            responses.len(),
                            answers.len()
                        );
                        vec![Err(e); answers.len()]
                    }
                    Ok(responses) => responses.into_iter().map(Ok).collect(),
                }
            } else {
                self.send_each(&address, requests).await
            };
            debug!(leader = %address, transactions = answers.len(), "marker requests answered");
            for (answer, response) in answers.into_iter().zip(responses) {
                // A round that went away (the coordinator is stopping) needs no answer.
                let _ = answer.send(response);
            }
        }
    }

    /// One WriteTxnMarkers per request, in parallel.
    async fn send_each(
        &self,
        address: &str,
        requests: Vec<WriteTxnMarkersRequest>,
    ) -> Vec<Result<WriteTxnMarkersResponse, String>> {
        futures::future::join_all(
            requests
                .into_iter()
                .map(|request| self.send_write_txn_markers(address, request)),
        )
        .await
    }

    /// Sends one WriteTxnMarkers request.
    async fn send_write_txn_markers(
        &self,
        address: &str,
        request: WriteTxnMarkersRequest,
    ) -> Result<WriteTxnMarkersResponse, String> {
        PartitionLeaderClient::new(self.channel(address)?)
            .write_txn_markers(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| s.to_string())
    }

    /// Sends one WriteTxnMarkersBatch request; its responses in request order.
    async fn send_write_txn_markers_batch(
        &self,
        address: &str,
        markers: Vec<WriteTxnMarkersRequest>,
    ) -> Result<Vec<WriteTxnMarkersResponse>, tonic::Status> {
        let channel = self.channel(address).map_err(tonic::Status::unavailable)?;
        PartitionLeaderClient::new(channel)
            .write_txn_markers_batch(proto::WriteTxnMarkersBatchRequest { markers })
            .await
            .map(|r| r.into_inner().responses)
    }
}
