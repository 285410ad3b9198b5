//! What the Kafka face's request counting ([`kafka_wire::observe`] and the node's metrics) costs
//! per request, next to the work every request costs anyway, measured in the same run: decoding
//! the request and encoding the response.
//!
//! Run: `cargo bench -p kafka-wire --bench observe` (optionally `-- ITERATIONS`).
//!
//! Three requests: ApiVersions (no caller; one error code), InitProducerId (a transactional id
//! to read; one code) and a Produce of one record batch to three partitions (the producer id
//! read from the batch header; three codes). For each, in alternating rounds: the baseline
//! (decode the request from its bytes, encode the response) and the counting (who asked, every
//! error code, one counter increment per code).
//!
//! CAVEATS: in-process, one thread, warm caches: the counting's share of a real request is
//! smaller still (the network and the handler come on top of the baseline).

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, InitProducerIdRequest, InitProducerIdResponse,
    ProduceRequest, ProduceResponse, RequestKind, ResponseKind, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

struct Case {
    name: &'static str,
    key: ApiKey,
    version: i16,
    request: Bytes,
    response: ResponseKind,
}

fn encode(request: &RequestKind, version: i16) -> Bytes {
    let mut buf = BytesMut::new();
    request.encode(&mut buf, version).expect("encode");
    buf.freeze()
}

/// A v2 record batch header with producer id 4242 and nothing after it (all the counting
/// reads).
fn batch() -> Bytes {
    let mut b = vec![0u8; 61];
    b[16] = 2;
    b[43..51].copy_from_slice(&4242i64.to_be_bytes());
    Bytes::from(b)
}

fn cases() -> Vec<Case> {
    let s = |v: &str| StrBytes::from_string(v.to_string());
    let mut init = InitProducerIdRequest::default();
    init.transactional_id = Some(TransactionalId(s("orders-processor-7")));
    init.transaction_timeout_ms = 60_000;
    let mut produce = ProduceRequest::default();
    produce.transactional_id = Some(TransactionalId(s("orders-processor-7")));
    produce.acks = -1;
    let mut topic = TopicProduceData::default();
    topic.name = TopicName(s("output"));
    topic.partition_data = (0..3)
        .map(|p| {
            let mut d = PartitionProduceData::default();
            d.index = p;
            d.records = Some(batch());
            d
        })
        .collect();
    produce.topic_data = vec![topic];
    let mut produced = ProduceResponse::default();
    let mut t = TopicProduceResponse::default();
    t.name = TopicName(s("output"));
    t.partition_responses = (0..3)
        .map(|p| {
            let mut r = PartitionProduceResponse::default();
            r.index = p;
            r
        })
        .collect();
    produced.responses = vec![t];
    vec![
        Case {
            name: "ApiVersions",
            key: ApiKey::ApiVersions,
            version: 2,
            request: encode(&RequestKind::ApiVersions(ApiVersionsRequest::default()), 2),
            response: ResponseKind::ApiVersions(ApiVersionsResponse::default()),
        },
        Case {
            name: "InitProducerId",
            key: ApiKey::InitProducerId,
            version: 4,
            request: encode(&RequestKind::InitProducerId(init), 4),
            response: ResponseKind::InitProducerId(InitProducerIdResponse::default()),
        },
        Case {
            name: "Produce (3 partitions)",
            key: ApiKey::Produce,
            version: 8,
            request: encode(&RequestKind::Produce(produce), 8),
            response: ResponseKind::Produce(produced),
        },
    ]
}

/// What every request costs anyway: decode it, encode its response.
fn baseline(case: &Case) {
    let mut bytes = case.request.clone();
    let request = RequestKind::decode(case.key, &mut bytes, case.version).expect("decode");
    black_box(&request);
    let mut out = BytesMut::new();
    case.response
        .encode(&mut out, case.version)
        .expect("encode");
    black_box(out);
}

/// What the server adds with metrics on (as `kafka-wire/src/server.rs` does it).
fn counting(case: &Case, request: &RequestKind, metrics: &cluster::metrics::Metrics) {
    let (transactional_id, producer_id) = kafka_wire::observe::caller(request);
    let name = format!("{:?}", case.key);
    for code in kafka_wire::observe::error_codes(&case.response) {
        let error = kafka_wire::observe::error_name(code);
        metrics.request_named(&name, &error, &transactional_id, producer_id);
    }
}

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let metrics = cluster::metrics::Metrics::new();
    println!("Kafka-face request counting vs decode+encode, {iterations} iterations x 5 rounds\n");
    println!(
        "{:<24} {:>14} {:>14} {:>8}",
        "request", "decode+encode", "counting", "ratio"
    );
    for case in cases() {
        let mut decoded = case.request.clone();
        let request = RequestKind::decode(case.key, &mut decoded, case.version).expect("decode");
        let (mut base, mut count) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..iterations {
                baseline(&case);
            }
            base += t.elapsed();
            let t = Instant::now();
            for _ in 0..iterations {
                counting(&case, &request, &metrics);
            }
            count += t.elapsed();
        }
        let per = |d: Duration| d.as_secs_f64() * 1e9 / f64::from(iterations * 5);
        println!(
            "{:<24} {:>11.0} ns {:>11.0} ns {:>7.2}x",
            case.name,
            per(base),
            per(count),
            per(count) / per(base)
        );
    }
}
