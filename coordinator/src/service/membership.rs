//! Cluster membership on the coordinator (the shell side of [`cluster::auth`]): signing the
//! internal requests this node sends (markers), authenticating the ones it receives
//! (VerifyTransaction from leaders, group markers from transaction coordinators), and the
//! topology agreement with its peers.
//!
//! Agreement: the coordinator asks every other node for its topology fingerprint (Cluster
//! Metadata) at start, before it loads its state, and then every `peer_check_interval`. Until the first check has run the
//! coordinator answers COORDINATOR_LOAD_IN_PROGRESS; while any peer that answers runs another
//! topology it answers COORDINATOR_NOT_AVAILABLE for every id it would own (the error names the
//! peer and both fingerprints), so two coordinators never both serve one id because their files
//! differ. Unreachable peers do not block: a node that is down serves nothing either, and it
//! runs the same check before it serves again. Internal requests carry the fingerprint too, so
//! a leader or group coordinator of another topology refuses them (INCONSISTENT_CLUSTER_ID).
//!
//! CAVEATS: two coordinators started at the same moment with different files, each finding the
//! other not yet listening, can both serve until the next check (`peer_check_interval`); the
//! leaders refuse the markers of the one whose topology they do not share, so what it decides
//! cannot be written.

use std::time::Duration;

use cluster::auth::{self, AuthError, InternalRequest};
use cluster::node::{lock, now_ms};
use cluster::NodeId;
use tracing::{error, info};

use super::Shared;
use crate::Error;

/// What this coordinator knows of its peers' topologies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum PeerView {
    /// Not asked yet.
    Unchecked,
    /// Every peer that answered runs this node's topology.
    Agree,
    /// A peer runs another topology: the sentence says which.
    Conflict(String),
}

impl Shared {
    /// Signs an internal request (unsigned when this node has no secret: every peer refuses it).
    pub(super) fn sign<R: InternalRequest>(&self, request: &mut R) {
        if let Some(credentials) = &self.credentials {
            auth::sign(credentials, request, now_ms());
        }
    }

    /// The authenticated sender of an internal request, or why it is refused. For a request
    /// that changes something (a marker, `once`), a replay of one accepted before is refused
    /// too; a read (VerifyTransaction) changes nothing when replayed and is not remembered.
    pub(super) fn authenticate<R: InternalRequest>(
        &self,
        request: &R,
        once: bool,
    ) -> Result<NodeId, Error> {
        let credentials = self.credentials.as_ref().ok_or(AuthError::NoSecret)?;
        let now = now_ms();
        let sender = auth::verify(&credentials.secret, &credentials.fingerprint, request, now)
            .and_then(|sender| {
                if once {
                    self.replays.admit(request, now)?;
                }
                Ok(sender)
            })
            .inspect_err(
                |e| error!(node_id = self.node_id, error = %e, "internal request refused"),
            )?;
        Ok(sender)
    }

    /// A VerifyTransaction may come from a partition leader only.
    pub(super) fn check_leader(&self, sender: NodeId) -> Result<(), Error> {
        if self.topology.leader(sender).is_none() {
            return Err(AuthError::NotAMember(sender).into());
        }
        Ok(())
    }

    /// A TxnOffsetCommit handed on may come from its group's coordinator only.
    pub(super) fn check_group_coordinator(&self, sender: NodeId, group: &str) -> Result<(), Error> {
        let owner = self.topology.coordinator_for(group).id;
        if sender != owner {
            let refused = AuthError::NotGroupCoordinator {
                sender,
                group: group.to_string(),
                owner,
            };
            error!(node_id = self.node_id, error = %refused, "TxnOffsetCommit refused");
            return Err(refused.into());
        }
        Ok(())
    }

    /// A group marker may come from the coordinator that owns its transactional id only.
    pub(super) fn check_marker_sender(
        &self,
        sender: NodeId,
        claimed: NodeId,
        transactional_id: &str,
    ) -> Result<(), Error> {
        auth::check_marker_sender(&self.topology, sender, claimed, transactional_id)
            .inspect_err(|e| error!(node_id = self.node_id, error = %e, "marker refused"))?;
        Ok(())
    }

    /// LOAD_IN_PROGRESS before the first check, COORDINATOR_NOT_AVAILABLE while a peer
    /// disagrees.
    pub(super) fn check_agreement(&self) -> Result<(), Error> {
        match &*lock(&self.peers) {
            PeerView::Agree => Ok(()),
            PeerView::Unchecked => Err(Error::CoordinatorLoadInProgress),
            PeerView::Conflict(why) => Err(Error::TopologyConflict(why.clone())),
        }
    }

    /// Asks every other node for its fingerprint now and then, until the coordinator stops.
    pub(super) async fn check_peers(&self) {
        loop {
            if self.sleep_or_stop(self.config.peer_check_interval).await {
                return;
            }
            self.refresh_peers().await;
        }
    }

    /// One round of the check: asks every peer and records (and logs a change of) the view.
    pub(super) async fn refresh_peers(&self) {
        let view = self.ask_peers().await;
        let changed = {
            let mut peers = lock(&self.peers);
            let changed = *peers != view;
            *peers = view.clone();
            changed
        };
        if !changed {
            return;
        }
        match &view {
            PeerView::Conflict(why) => error!(node_id = self.node_id, %why,
                "topology disagreement: not serving any transactional id until it is fixed"),
            _ => info!(node_id = self.node_id, fingerprint = %self.fingerprint,
                "every reachable peer runs this topology"),
        }
    }

    async fn ask_peers(&self) -> PeerView {
        let peers = self
            .topology
            .coordinators
            .iter()
            .chain(&self.topology.leaders)
            .filter(|n| n.id != self.node_id);
        for node in peers {
            let Ok(channel) = self.channel(&node.address) else {
                continue;
            };
            let mut client = proto::cluster_client::ClusterClient::new(channel);
            let call = client.metadata(proto::MetadataRequest { topics: vec![] });
            let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(1), call).await else {
                continue; // unreachable: it serves nothing, and checks before it does
            };
            let theirs = reply.into_inner().topology_fingerprint;
            if theirs != self.fingerprint {
                return PeerView::Conflict(format!(
                    "node {} at {} runs topology {theirs}, this coordinator runs {}: fix the topology files so every node reads the same one",
                    node.id, node.address, self.fingerprint
                ));
            }
        }
        PeerView::Agree
    }
}
