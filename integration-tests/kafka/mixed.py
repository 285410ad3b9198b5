"""confluent-kafka side of the mixed test: reads the record the gRPC client wrote (argument 3,
expected on partition 0 of the topic) with read_committed, then writes one record with a key,
a value, headers and a timestamp for the gRPC consumer to find, and reads it back to check that
all of it round-trips."""
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
headers = [("trace", b"t-1"), ("empty", b""), ("null", None)]
producer.produce(topic, key=b"kafka-key", value=b"from-kafka", partition=0, headers=headers,
                 timestamp=1700000000123, on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
producer.flush(30)
check(len(delivered) == 1 and delivered[0][0] is None, "delivery failed: %r" % delivered)
kafka_offset = delivered[0][1]

seen = consume_all(servers, topic, [0], "read_committed", expect=kafka_offset + 1)
mine = [r for r in seen[0] if r[0] == kafka_offset]
check(len(mine) == 1, "record at %d not read back: %r" % (kafka_offset, seen[0]))
offset, key, value, got_headers, timestamp = mine[0]
check((key, value, timestamp) == (b"kafka-key", b"from-kafka", 1700000000123),
      "read back %r" % (mine[0],))
check(got_headers == headers, "headers read back as %r, sent %r" % (got_headers, headers))
report(grpc_offset=grpc_offset, kafka_offset=kafka_offset, headers=len(got_headers))
