"""confluent-kafka and a transaction the coordinator aborted because it outlived
transaction.timeout.ms: the commit fails with an abortable error (not librdkafka's fatal
"fenced"), the application aborts, and the same producer instance commits its next transaction.
Nothing of the timed-out transaction reaches read_committed readers."""
import sys
import time
import uuid
from confluent_kafka import KafkaException, Producer

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic = sys.argv[2] if len(sys.argv) > 2 else "output"
run = uuid.uuid4().hex[:8]

p = Producer({
    "bootstrap.servers": servers,
    "transactional.id": "timeout-%s" % run,
    "transaction.timeout.ms": 2000,
    "linger.ms": 0,
})
p.init_transactions(30)
p.begin_transaction()
for i in range(3):
    p.produce(topic, value=("%s-late-%d" % (run, i)).encode(), partition=i % 3)
p.flush(30)
# A stall well past the timeout: the coordinator's scan aborts the transaction meanwhile.
time.sleep(5)

# Back, the producer writes on to a partition already in its transaction: that leader has the
# abort's marker at the bumped epoch and must not call it fenced either.
delivery_errors = []
p.produce(topic, value=("%s-late-after" % run).encode(), partition=0,
          on_delivery=lambda err, _msg: err and delivery_errors.append(err))
p.flush(30)

error = None
try:
    p.commit_transaction(30)
except KafkaException as e:
    error = e.args[0]
check(error is not None, "a transaction that outlived its timeout was committed")
check(not error.fatal(), "the timed-out producer was told it is fenced: %s" % error)
check(error.txn_requires_abort(), "the error does not ask for an abort: %s" % error)
p.abort_transaction(30)

p.begin_transaction()
for i in range(3):
    p.produce(topic, value=("%s-next-%d" % (run, i)).encode(), partition=i % 3)
p.commit_transaction(30)

seen = consume_all(servers, topic, [0, 1, 2], "read_committed")
values = sorted(r[2].decode() for records in seen.values() for r in records
                if r[2].startswith(run.encode()))
check(values == ["%s-next-%d" % (run, i) for i in range(3)],
      "read_committed saw %s" % values)
report(error=error.name(), fatal=error.fatal(), txn_requires_abort=error.txn_requires_abort(),
       delivery_errors=sorted({e.name() for e in delivery_errors}), committed_after=3,
       timed_out_visible=0)
