"""confluent-kafka: a transactional producer runs N transactions over 3 partitions, committing
most and aborting every third; then read_committed must see every committed record exactly once,
in order, and no aborted one, and read_uncommitted must see all of them."""
import sys
import uuid
from confluent_kafka import Producer

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic = sys.argv[2] if len(sys.argv) > 2 else "output"
transactions = int(sys.argv[3]) if len(sys.argv) > 3 else 200
partitions = [0, 1, 2]
run = uuid.uuid4().hex[:8]

producer = Producer({
    "bootstrap.servers": servers,
    "transactional.id": "txn-producer-%s" % run,
    "linger.ms": 5,
})
producer.init_transactions(30)
committed, aborted = {p: [] for p in partitions}, 0
for t in range(transactions):
    producer.begin_transaction()
    batch = []
    for i in range(3):
        p = (t + i) % 3
        value = ("%s-t%d-r%d" % (run, t, i)).encode()
        producer.produce(topic, value=value, key=b"k%d" % t, partition=p)
        batch.append((p, value))
    if t % 3 == 2:
        # Make sure the aborted records reached the log (abort would purge unsent ones).
        producer.flush(30)
        producer.abort_transaction(30)
        aborted += 1
    else:
        producer.commit_transaction(30)
        for p, value in batch:
            committed[p].append(value)

expected_total = sum(len(v) for v in committed.values())
def mine(seen):
    return {p: [r for r in records if r[2].startswith(run.encode())] for p, records in seen.items()}


rc = mine(consume_all(servers, topic, partitions, "read_committed", expect=expected_total))
for p in partitions:
    got = [r[2] for r in rc[p]]
    check(got == committed[p], "read_committed partition %d: %d records, expected %d (first difference at %s)" % (
        p, len(got), len(committed[p]),
        next((i for i, (a, b) in enumerate(zip(got, committed[p])) if a != b), min(len(got), len(committed[p])))))
ru = mine(consume_all(servers, topic, partitions, "read_uncommitted", expect=transactions * 3))
uncommitted_total = sum(len(v) for v in ru.values())
check(uncommitted_total == transactions * 3,
      "read_uncommitted saw %d records, expected %d" % (uncommitted_total, transactions * 3))
report(transactions=transactions, aborted=aborted, committed_records=expected_total,
       read_committed=sum(len(v) for v in rc.values()), read_uncommitted=uncommitted_total)
