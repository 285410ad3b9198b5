"""KIP-848 static membership with librdkafka (group.protocol=consumer, group.instance.id).

Part 1, a restart without a rebalance:
1. A (instance "a") and B (instance "b") join GROUP and share `input`.
2. A closes: librdkafka leaves with member epoch -2 (a static member's temporary leave). A stays
   in the group with its partitions; B is never given them (the group description still shows
   A's instance holding them).
3. A new process for instance "a" (A2, a new member id) joins: it gets exactly A's partitions,
   and B is never revoked anything through all of this.

Part 2, a zombie static member (GROUP-zombie; the test's coordinator has a 5 s session timeout):
1. A child process Z (instance "z") joins alone, gets every partition, reads and commits.
2. Z is SIGSTOPped (a GC pause) past its session: the coordinator removes it.
3. Z2, a new process for instance "z", joins and gets every partition, reads on and commits.
4. Z is resumed and goes on where it was: its commit is refused (its member id is no longer in
   the group; librdkafka may learn that from a heartbeat first and refuse it itself), and its
   close, a leave naming instance "z", which Z2 holds now, is answered FENCED_INSTANCE_ID (or,
   had it rejoined first, that rejoin UNRELEASED_INSTANCE_ID): Z2 keeps every partition, is
   never revoked anything, and the group's offsets stay Z2's.

usage: kip848_static_confluent.py BOOTSTRAP GROUP
       kip848_static_confluent.py BOOTSTRAP GROUP zombie   (the child process Z)"""
import json
import os
import signal
import subprocess
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from common import bootstrap, check, fail, report

servers = bootstrap()
group = sys.argv[2]
TOPIC, PARTITIONS, PER_PARTITION = "input", 3, 100


def consumer(name, instance, group_id, events):
    """A static KIP-848 consumer; `events` collects its assignment changes and errors."""
    events.setdefault("assigned", set())
    events.setdefault("revoked", 0)
    events.setdefault("errors", [])
    c = Consumer({
        "bootstrap.servers": servers,
        "group.id": group_id,
        "group.protocol": "consumer",
        "group.instance.id": instance,
        "client.id": name,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 50,
        "error_cb": lambda e: events["errors"].append("%s: %s" % (e.name(), e.str())),
    })

    def on_assign(c, partitions):
        events["assigned"] |= {p.partition for p in partitions}

    def on_revoke(c, partitions):
        events["revoked"] += len(partitions)
        events["assigned"] -= {p.partition for p in partitions}

    c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    return c


def wait_until(condition, consumers, what, limit=60.0):
    deadline = time.time() + limit
    while not condition():
        if time.time() > deadline:
            fail("timed out waiting for %s" % what)
        for c in consumers:
            m = c.poll(0.05)
            if m is not None and m.error():
                fail("%s: %s" % (what, m.error()))


def zombie():
    """The child process Z: joins, reads, commits, says READY; after its pause, tries to go on
    and reports what the coordinator answered."""
    events = {}
    z = consumer("z", "z", group, events)
    read = 0
    deadline = time.time() + 60
    while len(events["assigned"]) < PARTITIONS or read < 30:
        if time.time() > deadline:
            fail("Z never got its partitions")
        m = z.poll(0.05)
        if m is not None and not m.error():
            read += 1
    z.commit(asynchronous=False)
    committed_to = read + 10
    while read < committed_to:  # reads on past its commit: these it will try to commit later
        if time.time() > deadline:
            fail("Z stopped reading")
        m = z.poll(0.05)
        if m is not None and not m.error():
            read += 1
    print("READY", flush=True)
    # Paused here by the parent (SIGSTOP), then resumed (SIGCONT) after STOPPED is read. It
    # goes on where it was: commits what it read, and closes (a leave naming instance "z").
    sys.stdin.readline()
    commit = "accepted"
    try:
        z.commit(asynchronous=False)
    except KafkaException as e:
        commit = "%s: %s" % (e.args[0].name(), e.args[0].str())
    z.close()
    print(json.dumps({"commit": commit}), flush=True)


if len(sys.argv) > 3 and sys.argv[3] == "zombie":
    zombie()
    sys.exit(0)

producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})
for p in range(PARTITIONS):
    for i in range(PER_PARTITION):
        producer.produce(TOPIC, key=b"k", value=("%d-%d" % (p, i)).encode(), partition=p)
check(producer.flush(30) == 0, "records not delivered")

# Part 1.
ea, eb = {}, {}
a = consumer("a", "a", group, ea)
b = consumer("b", "b", group, eb)
wait_until(lambda: ea["assigned"] and eb["assigned"]
           and len(ea["assigned"]) + len(eb["assigned"]) == PARTITIONS,
           [a, b], "A and B to share the partitions")
check(not (ea["assigned"] & eb["assigned"]), "a partition assigned twice")
a_parts, b_parts = sorted(ea["assigned"]), sorted(eb["assigned"])
b_revoked = eb["revoked"]
a.close()  # a temporary leave (-2): A stays a member, with its partitions

admin = AdminClient({"bootstrap.servers": servers})
deadline = time.time() + 1.5
while time.time() < deadline:  # B heartbeats on; nothing moves to it
    b.poll(0.1)
away = {}
for m in admin.describe_consumer_groups([group])[group].result(30).members:
    away[m.group_instance_id] = sorted(tp.partition for tp in m.assignment.topic_partitions)

e2 = {}
a2 = consumer("a2", "a", group, e2)
wait_until(lambda: e2["assigned"], [a2, b], "A2 to get A's partitions")
deadline = time.time() + 2
while time.time() < deadline:
    a2.poll(0.05)
    b.poll(0.05)
a2_parts, b_after = sorted(e2["assigned"]), sorted(eb["assigned"])
b_revoked = eb["revoked"] - b_revoked
a2.close()
b.close()

# Part 2.
zgroup = group + "-zombie"
child = subprocess.Popen([sys.executable, __file__, servers, zgroup, "zombie"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
check(child.stdout.readline().strip() == "READY", "Z did not start")
os.kill(child.pid, signal.SIGSTOP)
time.sleep(7)  # past the coordinator's session timeout (5 s in the test)
ez = {}
z2 = consumer("z2", "z", zgroup, ez)
read = 0
deadline = time.time() + 60
while len(ez["assigned"]) < PARTITIONS or read < 60:
    if time.time() > deadline:
        fail("Z2 never got the partitions: %s" % ez)
    m = z2.poll(0.05)
    if m is not None and not m.error():
        read += 1
z2.commit(asynchronous=False)
z2_committed = [tp.offset for tp in z2.committed(
    [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30)]
child.stdin.write("STOPPED\n")
child.stdin.flush()
os.kill(child.pid, signal.SIGCONT)
deadline = time.time() + 30
while child.poll() is None and time.time() < deadline:
    z2.poll(0.1)  # Z2 stays a live member meanwhile
outcome = json.loads(child.stdout.readline() or "{}")
child.wait(10)
deadline = time.time() + 2
while time.time() < deadline:  # Z2 heartbeats on after Z's leave
    z2.poll(0.1)
after = [tp.offset for tp in z2.committed(
    [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30)]
z2_still, z2_revoked = sorted(ez["assigned"]), ez["revoked"]
z2.close()

report(a=a_parts, b=b_parts, away=away, a2=a2_parts, b_after=b_after,
       b_revoked=b_revoked, a2_errors=e2["errors"],
       zombie=outcome, z2=z2_still, z2_revoked=z2_revoked, z2_committed=z2_committed, committed_after=after)
