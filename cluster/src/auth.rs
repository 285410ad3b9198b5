//! Cluster membership: only nodes that hold the cluster secret may call the internal APIs
//! (WriteTxnMarkers, VerifyTransaction, WriteGroupOffsetMarker, and TxnOffsetCommit as a group's
//! coordinator hands it on), and only nodes that run the same topology are believed.
//!
//! Every internal request carries a [`proto::ClusterAuth`]: the sender's node id, a timestamp,
//! the fingerprint of the sender's topology, and an HMAC-SHA256 under the cluster secret over
//! (the RPC's name, those three fields, the request encoded without its `auth` field). The
//! receiver recomputes it ([`verify`]): a missing or wrong MAC is CLUSTER_AUTHORIZATION_FAILED,
//! a timestamp further than [`MAX_CLOCK_SKEW_MS`] from the receiver's clock too (it bounds
//! replays), a different fingerprint is INCONSISTENT_CLUSTER_ID (two topologies would mean two
//! owners of one id). The sender is then known to be a member, so a receiver can compare its
//! claims (the `coordinator_id` of a marker) with the topology.
//!
//! Why a MAC and not mutual TLS: clients and nodes share one plaintext gRPC port per node (as a
//! Kafka PLAINTEXT listener); mTLS would need a second, internal listener on every node and
//! certificates handed to every container. A MAC authenticates the caller and the integrity of
//! each internal request with one secret and no change to the transport.
//!
//! Replays: every signature carries a random nonce (so no two requests share a MAC, even two
//! identical ones in the same millisecond) and every receiver of markers remembers the MACs it
//! accepted while their timestamps are within the window ([`ReplayGuard`]): a marker seen before
//! is CLUSTER_AUTHORIZATION_FAILED. This matters for transaction version 1, whose epoch stays the
//! same across a producer's transactions: a captured COMMIT marker of one transaction, replayed
//! while the next one is open, would otherwise close it at a leader or put the group's offsets
//! back. A sender that retries signs again (fresh timestamp and nonce), so a retry is never a
//! replay. The memory starts empty when a receiver starts, so a receiver also refuses what was
//! signed before it started ([`ReplayGuard::starting_at`]), with a retriable code: a request
//! captured before a restart cannot be replayed to the new process, and a sender whose request
//! was in flight across the restart sends it again, signed afresh.
//!
//! CAVEATS: no confidentiality (requests travel in clear, as on a PLAINTEXT listener); every
//! member holds the same secret, so a member is trusted not to impersonate another member; a
//! sender whose clock is behind the receiver's sees its markers refused for that long after the
//! receiver started (it retries them, signed afresh); replies are not authenticated (forging one needs a man in the
//! middle, which a MAC on requests does not stop).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::{NodeId, Topology};

/// How far (ms) a request's timestamp may be from the receiver's clock.
pub const MAX_CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

/// Shortest secret accepted (bytes).
pub const MIN_SECRET_LEN: usize = 16;

/// The shared secret of a cluster. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Vec<u8>);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

/// Why a secret could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read cluster secret file {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// No secret given at all.
    #[error("no cluster secret: pass --cluster-secret-file FILE (env CLUSTER_SECRET_FILE) or set CLUSTER_SECRET; every node of a cluster needs the same one (e.g. `head -c 32 /dev/urandom | base64 > cluster.secret`)")]
    Missing,
    /// Too short to be a secret.
    #[error("cluster secret is {0} bytes; at least {MIN_SECRET_LEN} are needed (e.g. `head -c 32 /dev/urandom | base64`)")]
    TooShort(usize),
}

impl ClusterSecret {
    /// A secret from text (surrounding whitespace is ignored).
    pub fn new(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        if text.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort(text.len()));
        }
        Ok(Self(text.as_bytes().to_vec()))
    }

    /// A secret read from a file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, SecretError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(&text)
    }

    /// The secret a node was started with: the file if given, else the text, else
    /// [`SecretError::Missing`] (a node without a secret would refuse every peer).
    pub fn from_sources(file: Option<&Path>, text: Option<&str>) -> Result<Self, SecretError> {
        match (file, text) {
            (Some(path), _) => Self::load(path),
            (None, Some(text)) => Self::new(text),
            (None, None) => Err(SecretError::Missing),
        }
    }

    /// A fresh random secret (64 hex characters), e.g. for an embedded cluster.
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self(text.into_bytes())
    }

    /// The secret as text, to hand to a node (a file, an environment variable).
    pub fn expose(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl Topology {
    /// A short fingerprint of this topology (hex of the first 8 bytes of SHA-256 over its
    /// canonical TOML): two nodes agree on routing exactly when their fingerprints are equal.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(self.to_toml().as_bytes());
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// An internal request that carries a [`proto::ClusterAuth`].
pub trait InternalRequest: prost::Message + Clone {
    /// The RPC's name (part of what is signed, so a MAC cannot be moved to another RPC).
    const METHOD: &'static str;
    /// The auth field.
    fn auth(&self) -> Option<&proto::ClusterAuth>;
    /// Sets the auth field.
    fn set_auth(&mut self, auth: Option<proto::ClusterAuth>);
}

macro_rules! internal_request {
    ($ty:ty, $method:literal) => {
        impl InternalRequest for $ty {
            const METHOD: &'static str = $method;
            fn auth(&self) -> Option<&proto::ClusterAuth> {
                self.auth.as_ref()
            }
            fn set_auth(&mut self, auth: Option<proto::ClusterAuth>) {
                self.auth = auth;
            }
        }
    };
}

internal_request!(proto::WriteTxnMarkersRequest, "WriteTxnMarkers");
internal_request!(proto::VerifyTransactionRequest, "VerifyTransaction");
internal_request!(
    proto::WriteGroupOffsetMarkerRequest,
    "WriteGroupOffsetMarker"
);
internal_request!(proto::TxnOffsetCommitRequest, "TxnOffsetCommit");

/// What a node signs its internal requests with.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// The cluster secret.
    pub secret: ClusterSecret,
    /// This node's id.
    pub node_id: NodeId,
    /// This node's topology fingerprint.
    pub fingerprint: String,
}

/// Why an internal request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No auth field: not sent by a cluster member.
    #[error("internal API called without cluster credentials")]
    Missing,
    /// The MAC does not verify: wrong secret, or the request was altered.
    #[error("cluster credentials of node {0} do not verify")]
    BadMac(NodeId),
    /// The timestamp is outside the window.
    #[error("cluster credentials of node {node} are {skew_ms} ms away from this node's clock")]
    Stale {
        /// Claimed sender.
        node: NodeId,
        /// Distance from our clock.
        skew_ms: i64,
    },
    /// This node has no cluster secret: its internal APIs are closed.
    #[error("this node has no cluster secret configured; its internal APIs are closed")]
    NoSecret,
    /// A request this node accepted before (same MAC), sent again.
    #[error("a request of node {0} already received: a replay")]
    Replayed(NodeId),
    /// Signed before this node started: this process cannot know whether it accepted it
    /// before (the sender signs a retry afresh).
    #[error("a request of node {node} signed at {timestamp_ms}, before this node started at {started_ms}: sign it again")]
    SignedBeforeStart {
        /// Claimed sender.
        node: NodeId,
        /// The request's timestamp.
        timestamp_ms: i64,
        /// When this node started.
        started_ms: i64,
    },
    /// The sender is not a node of the kind that may send this request.
    #[error("node {0} is not a member that may send this request")]
    NotAMember(NodeId),
    /// A marker from a coordinator that does not own the transactional id.
    #[error("node {sender} sent a marker for {transactional_id:?} (claiming coordinator {claimed}), whose owner is coordinator {owner}")]
    NotOwner {
        /// The authenticated sender.
        sender: NodeId,
        /// The `coordinator_id` the request claims.
        claimed: NodeId,
        /// The transactional id.
        transactional_id: String,
        /// Its owner under this node's topology.
        owner: NodeId,
    },
    /// A TxnOffsetCommit handed on by a node that does not coordinate its group.
    #[error("node {sender} handed on a TxnOffsetCommit for group {group:?}, whose coordinator is {owner}")]
    NotGroupCoordinator {
        /// The authenticated sender.
        sender: NodeId,
        /// The group.
        group: String,
        /// The group's coordinator under this node's topology.
        owner: NodeId,
    },
    /// The sender runs another topology.
    #[error("node {node} runs topology {theirs}, this node runs {ours}")]
    TopologyMismatch {
        /// Claimed sender.
        node: NodeId,
        /// Our fingerprint.
        ours: String,
        /// Theirs.
        theirs: String,
    },
}

impl AuthError {
    /// The wire code. A request signed before the receiver started is COORDINATOR_LOAD_IN_PROGRESS,
    /// retriable for every sender: a marker writer, and a client whose TxnOffsetCommit the
    /// group's coordinator handed on (its next attempt is signed afresh).
    pub fn code(&self) -> proto::ErrorCode {
        match self {
            AuthError::TopologyMismatch { .. } => proto::ErrorCode::InconsistentClusterId,
            AuthError::SignedBeforeStart { .. } => proto::ErrorCode::CoordinatorLoadInProgress,
            _ => proto::ErrorCode::ClusterAuthorizationFailed,
        }
    }
}

fn mac(
    secret: &ClusterSecret,
    method: &str,
    auth: &proto::ClusterAuth,
    fingerprint: &str,
    body: &[u8],
) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&secret.0).expect("HMAC takes any key");
    m.update(method.as_bytes());
    m.update(&[0]);
    m.update(&auth.node_id.to_be_bytes());
    m.update(&auth.timestamp_ms.to_be_bytes());
    m.update(&auth.nonce.to_be_bytes());
    m.update(fingerprint.as_bytes());
    m.update(&[0]);
    m.update(body);
    m
}

fn body_without_auth<R: InternalRequest>(request: &R) -> Vec<u8> {
    let mut bare = request.clone();
    bare.set_auth(None);
    bare.encode_to_vec()
}

/// Signs `request` as `credentials.node_id` at `now_ms`.
pub fn sign<R: InternalRequest>(credentials: &Credentials, request: &mut R, now_ms: i64) {
    let body = body_without_auth(request);
    let mut auth = proto::ClusterAuth {
        node_id: credentials.node_id,
        timestamp_ms: now_ms,
        topology_fingerprint: credentials.fingerprint.clone(),
        mac: Vec::new(),
        nonce: rand::random(),
    };
    auth.mac = mac(
        &credentials.secret,
        R::METHOD,
        &auth,
        &credentials.fingerprint,
        &body,
    )
    .finalize()
    .into_bytes()
    .to_vec();
    request.set_auth(Some(auth));
}

/// Checks that a marker (WriteTxnMarkers, WriteGroupOffsetMarker) authenticated as sent by
/// `sender` may be sent by it: `sender` is the `coordinator_id` the request claims and the
/// coordinator that owns `transactional_id` under `topology`.
pub fn check_marker_sender(
    topology: &Topology,
    sender: NodeId,
    claimed: NodeId,
    transactional_id: &str,
) -> Result<(), AuthError> {
    if topology.coordinator(sender).is_none() {
        return Err(AuthError::NotAMember(sender));
    }
    let owner = topology.coordinator_for(transactional_id).id;
    if transactional_id.is_empty() || sender != claimed || sender != owner {
        return Err(AuthError::NotOwner {
            sender,
            claimed,
            transactional_id: transactional_id.to_string(),
            owner,
        });
    }
    Ok(())
}

/// Verifies `request`'s credentials at `now_ms` against our secret and topology fingerprint;
/// returns the authenticated sender.
pub fn verify<R: InternalRequest>(
    secret: &ClusterSecret,
    fingerprint: &str,
    request: &R,
    now_ms: i64,
) -> Result<NodeId, AuthError> {
    let auth = request.auth().ok_or(AuthError::Missing)?;
    let body = body_without_auth(request);
    mac(secret, R::METHOD, auth, &auth.topology_fingerprint, &body)
        .verify_slice(&auth.mac)
        .map_err(|_| AuthError::BadMac(auth.node_id))?;
    let skew_ms = now_ms.saturating_sub(auth.timestamp_ms);
    if skew_ms.saturating_abs() > MAX_CLOCK_SKEW_MS {
        return Err(AuthError::Stale {
            node: auth.node_id,
            skew_ms,
        });
    }
    if auth.topology_fingerprint != fingerprint {
        return Err(AuthError::TopologyMismatch {
            node: auth.node_id,
            ours: fingerprint.to_string(),
            theirs: auth.topology_fingerprint.clone(),
        });
    }
    Ok(auth.node_id)
}

/// The MACs of the internal requests a node accepted, kept while a replay of them would still
/// pass the timestamp check ([`MAX_CLOCK_SKEW_MS`]): a request seen before is refused.
///
/// Memory: one entry (32 bytes of MAC and a timestamp, ~50 bytes with the map's overhead) per
/// request accepted within [`MAX_CLOCK_SKEW_MS`], and at most twice as many between sweeps
/// (entries past the window are dropped whenever the map has doubled since the last sweep, so
/// the cost per request stays constant): 1,000 markers a second keep ~30 MB at most. Only
/// requests that change something need it (markers); a replayed read changes nothing.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    seen: Mutex<Seen>,
    /// Requests signed before this are refused ([`ReplayGuard::starting_at`]).
    started_ms: i64,
}

#[derive(Debug, Default)]
struct Seen {
    /// MAC -> the request's timestamp.
    macs: HashMap<[u8; 32], i64>,
    /// Sweep when the map reaches this size.
    sweep_at: usize,
}

impl ReplayGuard {
    /// The guard of a process started at `started_ms`: what was signed before that may have
    /// been accepted by an earlier process on this node, whose memory is gone, so it is
    /// [`AuthError::SignedBeforeStart`]. (`default()` refuses nothing by its time.)
    pub fn starting_at(started_ms: i64) -> Self {
        Self {
            seen: Mutex::default(),
            started_ms,
        }
    }

    /// Admits a request whose credentials [`verify`] accepted at `now_ms`, once: the same MAC
    /// again is [`AuthError::Replayed`], one signed before this guard started
    /// [`AuthError::SignedBeforeStart`].
    pub fn admit<R: InternalRequest>(&self, request: &R, now_ms: i64) -> Result<(), AuthError> {
        let auth = request.auth().ok_or(AuthError::Missing)?;
        if auth.timestamp_ms < self.started_ms {
            return Err(AuthError::SignedBeforeStart {
                node: auth.node_id,
                timestamp_ms: auth.timestamp_ms,
                started_ms: self.started_ms,
            });
        }
        let mac: [u8; 32] = auth
            .mac
            .as_slice()
            .try_into()
            .map_err(|_| AuthError::BadMac(auth.node_id))?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.macs.len() >= seen.sweep_at {
            // A timestamp older than this no longer passes `verify`: its replay is refused
            // as stale anyway.
            seen.macs
                .retain(|_, at| now_ms.saturating_sub(*at) <= MAX_CLOCK_SKEW_MS);
            seen.sweep_at = (seen.macs.len() * 2).max(1024);
        }
        if seen.macs.insert(mac, auth.timestamp_ms).is_some() {
            return Err(AuthError::Replayed(auth.node_id));
        }
        Ok(())
    }

    /// How many MACs are remembered.
    pub fn len(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .macs
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(secret: &str, node_id: NodeId) -> Credentials {
        Credentials {
            secret: ClusterSecret::new(secret).unwrap(),
            node_id,
            fingerprint: "f00d".into(),
        }
    }

    fn marker() -> proto::WriteTxnMarkersRequest {
        proto::WriteTxnMarkersRequest {
            producer_id: 7,
            producer_epoch: 3,
            coordinator_id: 1,
            coordinator_generation: 2,
            ..Default::default()
        }
    }

    const SECRET: &str = "0123456789abcdef0123";

    #[test]
    fn a_request_is_admitted_once_and_a_fresh_signature_of_the_same_body_again() {
        let guard = ReplayGuard::default();
        let mut r = marker();
        sign(&creds(SECRET, 1), &mut r, 1_000);
        assert_eq!(guard.admit(&r, 1_000), Ok(()));
        assert_eq!(guard.admit(&r, 1_001), Err(AuthError::Replayed(1)));
        // The same body signed again in the same millisecond (a retry): another nonce, another
        // MAC, admitted.
        let mut again = marker();
        sign(&creds(SECRET, 1), &mut again, 1_000);
        assert_ne!(again.auth, r.auth);
        assert_eq!(guard.admit(&again, 1_000), Ok(()));
        // The nonce is under the MAC: changing it breaks the signature.
        let secret = ClusterSecret::new(SECRET).unwrap();
        let mut altered = again.clone();
        altered.auth.as_mut().unwrap().nonce ^= 1;
        assert_eq!(
            verify(&secret, "f00d", &altered, 1_000),
            Err(AuthError::BadMac(1))
        );
        assert!(matches!(
            guard.admit(&marker(), 1_000),
            Err(AuthError::Missing)
        ));
    }

    #[test]
    fn what_was_signed_before_the_receiver_started_is_refused_and_signed_again_passes() {
        // Accepted by the node's previous process, whose memory is gone.
        let mut r = marker();
        sign(&creds(SECRET, 1), &mut r, 1_000);
        let restarted = ReplayGuard::starting_at(1_500);
        assert_eq!(
            restarted.admit(&r, 1_600),
            Err(AuthError::SignedBeforeStart {
                node: 1,
                timestamp_ms: 1_000,
                started_ms: 1_500
            })
        );
        assert!(restarted.is_empty(), "nothing remembered for it");
        // Retriable: a legitimate request in flight across the restart is sent again.
        assert_eq!(
            restarted.admit(&r, 1_600).unwrap_err().code(),
            proto::ErrorCode::CoordinatorLoadInProgress
        );
        // The sender's retry is signed afresh.
        let mut retry = marker();
        sign(&creds(SECRET, 1), &mut retry, 1_600);
        assert_eq!(restarted.admit(&retry, 1_600), Ok(()));
        assert_eq!(restarted.admit(&retry, 1_601), Err(AuthError::Replayed(1)));
    }

    #[test]
    fn the_replay_memory_forgets_what_the_clock_check_refuses_anyway() {
        let guard = ReplayGuard::default();
        for i in 0..1_024 {
            let mut r = marker();
            sign(&creds(SECRET, 1), &mut r, i);
            guard.admit(&r, i).unwrap();
        }
        assert_eq!(guard.len(), 1_024);
        // Past the window: the next admission sweeps every entry a replay of which `verify`
        // refuses as stale.
        let later = 1_024 + MAX_CLOCK_SKEW_MS + 1;
        let mut r = marker();
        sign(&creds(SECRET, 1), &mut r, later);
        guard.admit(&r, later).unwrap();
        assert_eq!(guard.len(), 1);
    }

    #[test]
    fn a_signed_request_verifies_and_names_its_sender() {
        let mut r = marker();
        sign(&creds(SECRET, 1), &mut r, 1_000);
        let secret = ClusterSecret::new(SECRET).unwrap();
        assert_eq!(verify(&secret, "f00d", &r, 2_000), Ok(1));
    }

    #[test]
    fn missing_wrong_altered_stale_and_foreign_credentials_are_refused() {
        let secret = ClusterSecret::new(SECRET).unwrap();
        assert_eq!(
            verify(&secret, "f00d", &marker(), 0),
            Err(AuthError::Missing)
        );

        let mut r = marker();
        sign(&creds("another secret of 20b", 1), &mut r, 0);
        assert_eq!(verify(&secret, "f00d", &r, 0), Err(AuthError::BadMac(1)));

        let mut r = marker();
        sign(&creds(SECRET, 1), &mut r, 0);
        r.coordinator_generation = 1_000_000_000_000;
        assert_eq!(verify(&secret, "f00d", &r, 0), Err(AuthError::BadMac(1)));
        let mut r2 = marker();
        sign(&creds(SECRET, 1), &mut r2, 0);
        r2.auth.as_mut().unwrap().node_id = 2;
        assert_eq!(verify(&secret, "f00d", &r2, 0), Err(AuthError::BadMac(2)));

        let mut r = marker();
        sign(&creds(SECRET, 1), &mut r, 0);
        assert!(matches!(
            verify(&secret, "f00d", &r, MAX_CLOCK_SKEW_MS + 1),
            Err(AuthError::Stale { node: 1, .. })
        ));

        let e = verify(&secret, "beef", &r, 0).unwrap_err();
        assert!(matches!(e, AuthError::TopologyMismatch { node: 1, .. }));
        assert_eq!(e.code(), proto::ErrorCode::InconsistentClusterId);
    }

    #[test]
    fn a_mac_cannot_be_moved_to_another_rpc() {
        let secret = ClusterSecret::new(SECRET).unwrap();
        let mut r = marker();
        sign(&creds(SECRET, 1), &mut r, 0);
        let moved = proto::WriteGroupOffsetMarkerRequest {
            producer_id: 7,
            producer_epoch: 3,
            coordinator_id: 1,
            coordinator_generation: 2,
            auth: r.auth.clone(),
            ..Default::default()
        };
        assert_eq!(
            verify(&secret, "f00d", &moved, 0),
            Err(AuthError::BadMac(1))
        );
    }

    #[test]
    fn only_the_owning_coordinator_may_send_a_marker() {
        let topology = Topology::parse(
            "transaction_state_partitions = 4\n\
             [[coordinators]]\nid = 1\naddress = \"a:1\"\n\
             [[coordinators]]\nid = 2\naddress = \"a:2\"\n\
             [[leaders]]\nid = 101\naddress = \"a:3\"\n",
        )
        .unwrap();
        let id = "txn-a";
        let owner = topology.coordinator_for(id).id;
        let other = if owner == 1 { 2 } else { 1 };
        assert_eq!(check_marker_sender(&topology, owner, owner, id), Ok(()));
        assert!(matches!(
            check_marker_sender(&topology, other, other, id),
            Err(AuthError::NotOwner { .. })
        ));
        assert!(matches!(
            check_marker_sender(&topology, owner, 999, id),
            Err(AuthError::NotOwner { claimed: 999, .. })
        ));
        assert_eq!(
            check_marker_sender(&topology, 101, 101, id),
            Err(AuthError::NotAMember(101))
        );
        assert!(check_marker_sender(&topology, owner, owner, "").is_err());
    }

    #[test]
    fn short_secrets_are_refused_and_debug_hides_the_secret() {
        assert!(matches!(
            ClusterSecret::new(" short "),
            Err(SecretError::TooShort(5))
        ));
        let s = ClusterSecret::generate();
        assert_eq!(s.expose().len(), 64);
        assert!(!format!("{s:?}").contains(s.expose()));
    }
}
