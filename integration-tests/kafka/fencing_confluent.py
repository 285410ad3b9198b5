"""confluent-kafka fencing: producer A begins a transaction and produces; producer B with the same
transactional.id calls init_transactions; A's next produce/commit fails with librdkafka's fatal
fenced error; A's records never reach read_committed readers; B commits."""
import sys
import uuid
from confluent_kafka import KafkaException, Producer

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic = sys.argv[2] if len(sys.argv) > 2 else "output"
run = uuid.uuid4().hex[:8]
txn_id = "fence-%s" % run


def producer():
    return Producer({"bootstrap.servers": servers, "transactional.id": txn_id, "linger.ms": 0})


a = producer()
a.init_transactions(30)
a.begin_transaction()
for i in range(5):
    a.produce(topic, value=("%s-A-%d" % (run, i)).encode(), partition=i % 3)
a.flush(30)

b = producer()
b.init_transactions(60)

# A carries on as if nothing happened: its next produce or its commit must fail, fatally.
a_error = None
try:
    a.produce(topic, value=("%s-A-late" % run).encode(), partition=0)
    a.flush(10)
    a.commit_transaction(30)
except KafkaException as e:
    a_error = e.args[0]
check(a_error is not None, "zombie A committed after B's init_transactions")

b.begin_transaction()
for i in range(3):
    b.produce(topic, value=("%s-B-%d" % (run, i)).encode(), partition=i % 3)
b.commit_transaction(30)

seen = consume_all(servers, topic, [0, 1, 2], "read_committed")
values = [r[2].decode() for records in seen.values() for r in records if r[2].startswith(run.encode())]
check(not any("-A-" in v for v in values), "A's records are visible to read_committed: %s" % values)
check(sorted(v for v in values if "-B-" in v) == ["%s-B-%d" % (run, i) for i in range(3)],
      "B's committed records are missing: %s" % values)
report(a_error=a_error.name(), a_fatal=a_error.fatal(), a_txn_requires_abort=a_error.txn_requires_abort(),
       a_retriable=a_error.retriable(), b_committed=3, a_visible=0, txn_id=txn_id)
