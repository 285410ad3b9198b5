"""idle_idempotent.py with kafka-python's idempotent producer: argument 3 records to partition 0
of the topic (argument 2), an idle pause (argument 4: seconds) long enough for the leader to
forget the producer's state, then as many records again. Reports the delivery errors, the
records read back (read_uncommitted, with confluent-kafka) and whether each value is there
once, in order."""
import sys
import time

from kafka import KafkaProducer
from kafka.errors import KafkaError

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic, count, idle_s = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

producer = KafkaProducer(bootstrap_servers=servers.split(","), enable_idempotence=True,
                         linger_ms=1, acks="all")
errors = []


def send(values):
    futures = [producer.send(topic, value=v, partition=0) for v in values]
    producer.flush(30)
    for f in futures:
        try:
            f.get(timeout=30)
        except KafkaError as e:
            errors.append(repr(e))


before = [b"idle-%03d" % i for i in range(count)]
after = [b"idle-%03d" % i for i in range(count, 2 * count)]
send(before)
time.sleep(idle_s)
send(after)
producer.close(10)
seen = consume_all(servers, topic, [0], "read_uncommitted", expect=2 * count - len(errors))
values = [r[2] for r in seen[0] if r[2] is not None and r[2].startswith(b"idle-")]
report(errors=errors, read=len(values), once_in_order=values == before + after)
