//! Cluster credentials for tests: one test secret, and signing a marker the way the owning
//! coordinator would ([`cluster::auth`]).

use cluster::auth::{self, ClusterSecret, Credentials};
use cluster::Topology;
use proto::WriteTxnMarkersRequest;

/// The secret every test node is configured with.
pub const TEST_SECRET: &str = "minibroker-test-cluster-secret";

/// [`TEST_SECRET`] as a [`ClusterSecret`].
pub fn secret() -> ClusterSecret {
    ClusterSecret::new(TEST_SECRET).expect("the test secret is long enough")
}

/// A transactional id owned by coordinator `coordinator` under `topology`.
pub fn id_owned_by(topology: &Topology, coordinator: i32) -> String {
    (0..100_000)
        .map(|n| format!("txn-{n}"))
        .find(|id| topology.coordinator_for(id).id == coordinator)
        .unwrap_or_else(|| panic!("coordinator {coordinator} owns no id: is it in the topology?"))
}

/// Signs any internal request as node `node_id` under `topology` with [`TEST_SECRET`].
pub fn sign<R: auth::InternalRequest>(topology: &Topology, node_id: i32, request: &mut R) {
    let credentials = Credentials {
        secret: secret(),
        node_id,
        fingerprint: topology.fingerprint(),
    };
    auth::sign(&credentials, request, cluster::node::now_ms());
}

/// Signs `request` as its `coordinator_id` under `topology` with [`TEST_SECRET`], naming a
/// transactional id that coordinator owns when the request names none.
pub fn sign_marker(topology: &Topology, request: &mut WriteTxnMarkersRequest) {
    if request.transactional_id.is_empty() {
        request.transactional_id = id_owned_by(topology, request.coordinator_id);
    }
    let node_id = request.coordinator_id;
    sign(topology, node_id, request);
}
