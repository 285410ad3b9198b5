"""Compressed batches from Kafka clients: confluent-kafka (librdkafka) with gzip, snappy and lz4,
and kafka-python with gzip, each writing argument 3 records to its own partition of the topic
(argument 2), then reading everything back (read_uncommitted). Reports, per codec, the delivery
errors and whether each value came back once, in order; lz4 is not built into the broker, so its
records must fail with UNSUPPORTED_COMPRESSION_TYPE and none may be stored."""
import sys

from confluent_kafka import Producer
from kafka import KafkaProducer

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic, count = sys.argv[2], int(sys.argv[3])
codecs = [("librdkafka", "gzip", 0), ("librdkafka", "snappy", 1), ("librdkafka", "lz4", 2),
          ("kafka-python", "gzip", 3)]
sent, errors = {}, {}
for client, codec, partition in codecs:
    name = "%s-%s" % (client, codec)
    # Compressible values, several batches per producer.
    values = [(b"%s-%04d-" % (name.encode(), i)) + b"x" * 300 for i in range(count)]
    sent[name], errors[name] = values, []
    if client == "librdkafka":
        producer = Producer({"bootstrap.servers": servers, "enable.idempotence": codec != "lz4",
                             "compression.type": codec, "linger.ms": 5, "batch.size": 16384,
                             "message.send.max.retries": 0 if codec == "lz4" else 10})
        for v in values:
            producer.produce(topic, value=v, partition=partition,
                             on_delivery=lambda err, msg, n=name: errors[n].append(
                                 err.name()) if err else None)
        check(producer.flush(30) == 0, "%s: records still undelivered after 30 s" % name)
    else:
        producer = KafkaProducer(bootstrap_servers=servers.split(","), compression_type=codec,
                                 linger_ms=5, batch_size=16384)
        futures = [producer.send(topic, value=v, partition=partition) for v in values]
        for f in futures:
            try:
                f.get(timeout=30)
            except Exception as e:  # noqa: BLE001 - reported, checked by the test
                errors[name].append(type(e).__name__)
        producer.close()
seen = consume_all(servers, topic, [p for _, _, p in codecs], "read_uncommitted",
                   expect=count * 3)
result = {}
for client, codec, partition in codecs:
    name = "%s-%s" % (client, codec)
    values = [r[2] for r in seen[partition] if r[2] is not None]
    result[name] = {"errors": sorted(set(errors[name])), "read": len(values),
                    "once_in_order": values == sent[name]}
report(**result)
