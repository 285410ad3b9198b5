"""confluent-kafka and static membership (KIP-345): consumer A joins with group.instance.id
"i-1"; consumer B, a new process with the same instance id, replaces it; A, still alive (a
zombie: a stalled process that came back), is fenced (FENCED_INSTANCE_ID, fatal) and cannot
commit offsets, while B owns every partition."""
import sys
import time
import uuid
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from common import bootstrap, check, report

servers = bootstrap()
topic = sys.argv[2] if len(sys.argv) > 2 else "input"
group = "static-%s" % uuid.uuid4().hex[:8]


def consumer(name):
    assigned = []
    c = Consumer({
        "bootstrap.servers": servers,
        "group.id": group,
        "group.instance.id": "i-1",
        "client.id": name,
        "enable.auto.commit": False,
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 200,
    })
    c.subscribe([topic], on_assign=lambda _c, parts: assigned.extend(parts))
    return c, assigned


def poll_until(c, done, seconds, errors):
    deadline = time.time() + seconds
    while time.time() < deadline and not done():
        try:
            msg = c.poll(0.1)
        except KafkaException as e:
            errors.append(e.args[0])
            continue
        if msg is not None and msg.error():
            errors.append(msg.error())


a, a_assigned = consumer("a")
a_errors = []
poll_until(a, lambda: a_assigned, 30, a_errors)
check(a_assigned, "A was never assigned: %s" % a_errors)

b, b_assigned = consumer("b")
b_errors = []
poll_until(b, lambda: b_assigned, 30, b_errors)
check(b_assigned, "B was never assigned: %s" % b_errors)

# A comes back: its heartbeats and its commit name an instance another member holds now.
def is_fatal(e):
    return e.fatal() or e.code() == KafkaError._FATAL


poll_until(a, lambda: any(is_fatal(e) for e in a_errors), 10, a_errors)
try:
    a.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
except KafkaException as e:
    a_errors.append(e.args[0])
fatal = [e for e in a_errors if is_fatal(e)]
check(fatal, "A was not fenced: %s" % a_errors)
names = sorted({e.name() for e in a_errors})
check(any("fenced" in str(e).lower() for e in a_errors), "A's errors do not say fenced: %s" % a_errors)
b.close()
report(a_errors=names, a_fatal=True, b_partitions=len(b_assigned))
