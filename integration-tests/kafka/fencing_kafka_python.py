"""kafka-python fencing: the same story as fencing_confluent.py with kafka-python's own
transactional state machine; its read_committed consumer checks what is visible."""
import sys
import time
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from common import bootstrap, check, report

servers = bootstrap().split(",")
topic = sys.argv[2] if len(sys.argv) > 2 else "output"
run = uuid.uuid4().hex[:8]
txn_id = "kp-fence-%s" % run


def producer():
    return KafkaProducer(bootstrap_servers=servers, transactional_id=txn_id, linger_ms=0)


a = producer()
a.init_transactions()
a.begin_transaction()
for i in range(5):
    a.send(topic, value=("%s-A-%d" % (run, i)).encode(), partition=i % 3)
a.flush(30)

b = producer()
b.init_transactions()

a_error = None
try:
    a.send(topic, value=("%s-A-late" % run).encode(), partition=0).get(timeout=30)
    a.commit_transaction()
except KafkaError as e:
    a_error = e
check(a_error is not None, "zombie A committed after B's init_transactions")

b.begin_transaction()
for i in range(3):
    b.send(topic, value=("%s-B-%d" % (run, i)).encode(), partition=i % 3)
b.commit_transaction()

consumer = KafkaConsumer(bootstrap_servers=servers, isolation_level="read_committed",
                         enable_auto_commit=False, consumer_timeout_ms=3000,
                         auto_offset_reset="earliest")
consumer.assign([TopicPartition(topic, p) for p in range(3)])
values = []
deadline = time.time() + 30
while time.time() < deadline:
    batch = consumer.poll(timeout_ms=500)
    if not batch and sum(1 for v in values if "-B-" in v) >= 3:
        break
    for records in batch.values():
        values += [r.value.decode() for r in records if r.value.startswith(run.encode())]
consumer.close()
check(not any("-A-" in v for v in values), "A's records are visible to read_committed: %s" % values)
check(sorted(v for v in values if "-B-" in v) == ["%s-B-%d" % (run, i) for i in range(3)],
      "B's committed records are missing: %s" % values)
report(a_error=type(a_error).__name__, b_committed=3, a_visible=0)
