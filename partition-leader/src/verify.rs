//! Verification of a transactional batch that would open a transaction on a partition, with the
//! coordinator that owns its transactional id (Kafka's KIP-890 part 1): "is (PID, epoch) current,
//! Ongoing, with this partition added?". Without it, a late or rogue Produce could start a
//! transaction the coordinator knows nothing about and hold the LSO back forever (a "hanging
//! transaction").
//!
//! [`TxnVerifier`] is the seam: the service only sees the trait, so tests plug in a fake.
//! [`GrpcVerifier`] is the real one: `VerifyTransaction` on the coordinator from
//! `topology.coordinator_for(transactional_id)`, with a cache of lazily connected channels and a
//! per-request timeout.
//!
//! Answer mapping: NONE -> verified (with the open transaction's number, which the leader keeps
//! with the transaction it opens: see [`crate::core::Verified`]); PRODUCER_FENCED or INVALID_PRODUCER_EPOCH -> the (PID,
//! epoch) is not current -> INVALID_PRODUCER_EPOCH; every other code (INVALID_TXN_STATE,
//! INVALID_PRODUCER_ID_MAPPING, TRANSACTION_TIMED_OUT, and the retriable NOT_COORDINATOR,
//! COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS) is passed back to the producer as is;
//! a transport failure or timeout is COORDINATOR_NOT_AVAILABLE (retriable).
//!
//! CAVEATS: no caching of positive answers (every transaction start on a partition costs one RPC);
//! channels are never evicted from the cache (the topology is static).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{ProducerEpoch, ProducerId, TopicPartition, Topology};
use proto::transaction_coordinator_client::TransactionCoordinatorClient;
use proto::{ErrorCode, VerifyTransactionRequest};
use tonic::transport::{Channel, Endpoint};

use crate::core::Verified;
use crate::error::{Error, Result};

/// Asks the owning coordinator whether (PID, epoch) may open a transaction on a partition.
#[tonic::async_trait]
pub trait TxnVerifier: Send + Sync + 'static {
    /// `Ok` if the coordinator says the batch may open the transaction here, with what it said
    /// about that transaction.
    async fn verify(
        &self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        partition: &TopicPartition,
    ) -> Result<Verified>;
}

/// Maps a coordinator's VerifyTransaction answer to the leader's result (see the module docs).
pub fn verification_result(code: ErrorCode, message: String) -> Result<()> {
    let message = format!("coordinator: {message}");
    match code {
        ErrorCode::None => Ok(()),
        ErrorCode::ProducerFenced | ErrorCode::InvalidProducerEpoch => {
            Err(Error::InvalidProducerEpoch(message))
        }
        ErrorCode::InvalidTxnState => Err(Error::InvalidTxnState(message)),
        ErrorCode::InvalidProducerIdMapping => Err(Error::InvalidProducerIdMapping(message)),
        ErrorCode::TransactionTimedOut => Err(Error::TransactionTimedOut(message)),
        ErrorCode::NotCoordinator => Err(Error::NotCoordinator(message)),
        ErrorCode::CoordinatorLoadInProgress => Err(Error::CoordinatorLoadInProgress(message)),
        ErrorCode::ConcurrentTransactions => Err(Error::ConcurrentTransactions(message)),
        ErrorCode::CoordinatorNotAvailable => Err(Error::CoordinatorNotAvailable(message)),
        ErrorCode::InvalidRequest => Err(Error::InvalidRequest(message)),
        ErrorCode::UnknownTopicOrPartition => Err(Error::UnknownTopicOrPartition(message)),
        other => Err(Error::Internal(format!(
            "unexpected verification answer {}: {message}",
            other.as_str_name()
        ))),
    }
}

/// The real verifier: gRPC to the owning coordinator.
pub struct GrpcVerifier {
    topology: Arc<Topology>,
    timeout: Duration,
    credentials: Option<cluster::auth::Credentials>,
    clients: Mutex<HashMap<String, TransactionCoordinatorClient<Channel>>>,
}

impl GrpcVerifier {
    /// A verifier over `topology` whose requests time out after `timeout`.
    pub fn new(topology: Arc<Topology>, timeout: Duration) -> Self {
        Self {
            topology,
            timeout,
            credentials: None,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// Signs every VerifyTransaction with `credentials` ([`cluster::auth`]); without them the
    /// requests go unsigned and every coordinator refuses them.
    pub fn with_credentials(mut self, credentials: Option<cluster::auth::Credentials>) -> Self {
        self.credentials = credentials;
        self
    }

    fn client(&self, address: &str) -> Result<TransactionCoordinatorClient<Channel>> {
        let mut clients = cluster::node::lock(&self.clients);
        if let Some(c) = clients.get(address) {
            return Ok(c.clone());
        }
        let uri = if address.contains("://") {
            address.to_string()
        } else {
            format!("http://{address}")
        };
        let channel =
            cluster::node::grpc_endpoint(Endpoint::from_shared(uri).map_err(|e| {
                Error::CoordinatorNotAvailable(format!("bad address {address}: {e}"))
            })?)
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .connect_lazy();
        let client = TransactionCoordinatorClient::new(channel);
        clients.insert(address.to_string(), client.clone());
        Ok(client)
    }
}

#[tonic::async_trait]
impl TxnVerifier for GrpcVerifier {
    async fn verify(
        &self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        partition: &TopicPartition,
    ) -> Result<Verified> {
        let coordinator = self.topology.coordinator_for(transactional_id);
        let mut client = self.client(&coordinator.address)?;
        let mut request = VerifyTransactionRequest {
            transactional_id: transactional_id.to_string(),
            producer_id,
            producer_epoch: producer_epoch as i32,
            partition: Some(partition.clone().into()),
            auth: None,
        };
        if let Some(credentials) = &self.credentials {
            cluster::auth::sign(credentials, &mut request, cluster::node::now_ms());
        }
        let call = client.verify_transaction(request);
        let response = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                return Err(Error::CoordinatorNotAvailable(format!(
                    "coordinator {} at {}: {}",
                    coordinator.id,
                    coordinator.address,
                    status.message()
                )))
            }
            Err(_) => {
                return Err(Error::CoordinatorNotAvailable(format!(
                    "coordinator {} at {} did not answer within {:?}",
                    coordinator.id, coordinator.address, self.timeout
                )))
            }
        };
        verification_result(
            ErrorCode::from_wire(response.error_code),
            response.error_message,
        )
        .map(|()| Verified {
            transaction_number: response.transaction_number,
            ..Verified::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_leader_errors() {
        let cases = [
            (ErrorCode::ProducerFenced, ErrorCode::InvalidProducerEpoch),
            (
                ErrorCode::InvalidProducerEpoch,
                ErrorCode::InvalidProducerEpoch,
            ),
            (ErrorCode::InvalidTxnState, ErrorCode::InvalidTxnState),
            (
                ErrorCode::InvalidProducerIdMapping,
                ErrorCode::InvalidProducerIdMapping,
            ),
            (
                ErrorCode::TransactionTimedOut,
                ErrorCode::TransactionTimedOut,
            ),
            (ErrorCode::NotCoordinator, ErrorCode::NotCoordinator),
            (
                ErrorCode::CoordinatorLoadInProgress,
                ErrorCode::CoordinatorLoadInProgress,
            ),
            (
                ErrorCode::ConcurrentTransactions,
                ErrorCode::ConcurrentTransactions,
            ),
            (ErrorCode::KafkaStorageError, ErrorCode::UnknownServerError),
        ];
        assert!(verification_result(ErrorCode::None, String::new()).is_ok());
        for (answer, expected) in cases {
            let err = verification_result(answer, "m".into()).unwrap_err();
            assert_eq!(err.code(), expected, "{answer:?}");
        }
    }

    #[tokio::test]
    async fn unreachable_coordinator_is_coordinator_not_available() {
        // Bind and drop a listener to get a port nobody listens on.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let topology = Topology::parse(&format!(
            "transaction_state_partitions = 1\n[[coordinators]]\nid = 1\naddress = \"{addr}\"\n"
        ))
        .unwrap();
        let v = GrpcVerifier::new(Arc::new(topology), Duration::from_secs(2));
        let err = v
            .verify("t", 1, 0, &TopicPartition::new("x", 0))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::CoordinatorNotAvailable);
    }
}
