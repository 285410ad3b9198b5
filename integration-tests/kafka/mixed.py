"""confluent-kafka side of the mixed test: reads the record the gRPC client wrote (argument 3,
expected on partition 0 of the topic) with read_committed, then writes one record with a key,
a value and a timestamp for the gRPC consumer to find."""
import sys
from confluent_kafka import Producer

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic, expected = sys.argv[2], sys.argv[3].encode()

seen = consume_all(servers, topic, [0], "read_committed", expect=1)
values = [r[2] for r in seen[0]]
check(expected in values, "the gRPC client's record %r is not in %r" % (expected, values))
grpc_offset = seen[0][values.index(expected)][0]

producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
delivered = []
producer.produce(topic, key=b"kafka-key", value=b"from-kafka", partition=0,
                 timestamp=1700000000123, on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
producer.flush(30)
check(len(delivered) == 1 and delivered[0][0] is None, "delivery failed: %r" % delivered)
report(grpc_offset=grpc_offset, kafka_offset=delivered[0][1])
