"""KIP-848 with librdkafka: two consumers with group.protocol=consumer share `input` through the
coordinator's assignment, hand partitions over as they join and leave, and together read every
record exactly once with their commits (each commits what it read before it gives a partition
up, in its revocation callback).

1. 300 records go to `input` (100 per partition).
2. Consumer A joins alone and gets all three partitions; it reads some records and commits.
3. Consumer B joins: A revokes what the coordinator moves to B, B gets it; their assignments
   are disjoint and cover the topic.
   The AdminClient describes the group as it is (ConsumerGroupDescribe).
4. Both read on until 300 records are read between them; then A closes (leaves the group) and
   B ends up with all three partitions.

usage: kip848_confluent.py BOOTSTRAP GROUP"""
import sys
import time

from confluent_kafka import Consumer, ConsumerGroupType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from common import bootstrap, check, fail, report

servers = bootstrap()
group = sys.argv[2]
TOPIC, PARTITIONS, PER_PARTITION = "input", 3, 100

producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})
for p in range(PARTITIONS):
    for i in range(PER_PARTITION):
        producer.produce(TOPIC, key=b"k", value=("%d-%d" % (p, i)).encode(), partition=p)
check(producer.flush(30) == 0, "records not delivered")

seen = {}  # (partition, offset) -> reader
duplicates = []
assignments = {"a": set(), "b": set()}
handovers = {"a": 0, "b": 0}


def consumer(name):
    c = Consumer({
        "bootstrap.servers": servers,
        "group.id": group,
        "group.protocol": "consumer",
        "client.id": name,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 50,
    })

    def on_assign(c, partitions):
        assignments[name] |= {p.partition for p in partitions}

    def on_revoke(c, partitions):
        # Commit what was read before the partitions go to another member.
        handovers[name] += len(partitions)
        owned = [p for p in partitions if p.partition in assignments[name]]
        if owned:
            try:
                c.commit(asynchronous=False)
            except Exception as e:  # nothing read yet: no offsets to commit
                if "NO_OFFSET" not in str(e):
                    raise
        assignments[name] -= {p.partition for p in partitions}

    c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    return c


def poll(name, c, timeout=0.2):
    m = c.poll(timeout)
    if m is None:
        return 0
    if m.error():
        fail("%s: %s" % (name, m.error()))
    key = (m.partition(), m.offset())
    if key in seen:
        duplicates.append((name, key, seen[key]))
    seen[key] = name
    return 1


def wait_until(condition, consumers, what, limit=60.0):
    deadline = time.time() + limit
    while not condition():
        if time.time() > deadline:
            fail("timed out waiting for %s: assignments %s, read %d" % (what, assignments, len(seen)))
        for name, c in consumers:
            poll(name, c, 0.05)


a = consumer("a")
wait_until(lambda: len(assignments["a"]) == PARTITIONS, [("a", a)], "A to get every partition")
wait_until(lambda: len(seen) >= 30, [("a", a)], "A to read")
a.commit(asynchronous=False)
read_by_a_alone = len(seen)

b = consumer("b")
both = [("a", a), ("b", b)]
wait_until(lambda: assignments["b"] and len(assignments["a"]) + len(assignments["b"]) == PARTITIONS,
           both, "the partitions to be shared")
shared = {"a": sorted(assignments["a"]), "b": sorted(assignments["b"])}
check(not (assignments["a"] & assignments["b"]), "a partition assigned twice: %s" % assignments)

# What an operator sees (librdkafka's AdminClient asks ConsumerGroupDescribe first).
admin = AdminClient({"bootstrap.servers": servers})
described = admin.describe_consumer_groups([group])[group].result(30)
members = {m.client_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
           for m in described.members}

def listed(group_type):
    groups = admin.list_consumer_groups(types={group_type}).result(30).valid
    return sorted(g.group_id for g in groups)


description = {
    "type": str(described.type),
    "members": members,
    "assignor": described.partition_assignor,
    # ListGroups v5's types filter.
    "listed_as_consumer": group in listed(ConsumerGroupType.CONSUMER),
    "listed_as_classic": group in listed(ConsumerGroupType.CLASSIC),
}

wait_until(lambda: len(seen) >= PARTITIONS * PER_PARTITION, both, "every record to be read")
a.commit(asynchronous=False)
b.commit(asynchronous=False)
a.close()
wait_until(lambda: len(assignments["b"]) == PARTITIONS, [("b", b)], "B to get every partition")
b_final = sorted(assignments["b"])
committed = b.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30)
b.close()

report(read_by_a_alone=read_by_a_alone, shared=shared, read=len(seen),
       duplicates=len(duplicates), b_final=b_final,
       committed=sorted(tp.offset for tp in committed), a_handed_over=handovers["a"],
       description=description)
