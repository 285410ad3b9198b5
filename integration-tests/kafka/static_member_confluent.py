"""confluent-kafka and static membership (KIP-345).

Consumer A joins with group.instance.id "i-1", consumer C without one (a dynamic member); the
group settles with the topic's partitions split between them. Consumer B, a new process with
A's instance id, replaces A while A is silent (a stalled process): B takes over exactly A's
partitions without a rebalance, so C is never revoked and keeps its partitions throughout.
A, back from its stall (a zombie), is fenced (FENCED_INSTANCE_ID, fatal) and cannot commit
offsets."""
import sys
import time
import uuid
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from common import bootstrap, check, group_member_config, report

servers = bootstrap()
topic = sys.argv[2] if len(sys.argv) > 2 else "input"
group = "static-%s" % uuid.uuid4().hex[:8]


class Member:
    def __init__(self, name, instance):
        self.assigned = []
        self.revoked = []
        self.errors = []
        self.consumer = Consumer(group_member_config(servers, group, name, instance))
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _c, parts: self.assigned.append(sorted(p.partition for p in parts)),
            on_revoke=lambda _c, parts: self.revoked.append(sorted(p.partition for p in parts)),
        )

    def poll(self):
        try:
            msg = self.consumer.poll(0.05)
        except KafkaException as e:
            self.errors.append(e.args[0])
            return
        if msg is not None and msg.error():
            self.errors.append(msg.error())

    def owns(self):
        return self.assigned[-1] if self.assigned else []


def poll_until(members, done, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and not done():
        for m in members:
            m.poll()


a = Member("a", "i-1")
c = Member("c", None)
poll_until([a, c], lambda: a.owns() and c.owns() and len(a.owns()) + len(c.owns()) == 3, 30)
check(a.owns() and c.owns(), "A and C were not both assigned: %s %s / %s %s"
      % (a.assigned, a.errors, c.assigned, c.errors))
a_partitions, c_partitions = a.owns(), c.owns()
c_revocations = len(c.revoked)

# A stalls (not polled from here on); B, a new instance of i-1, replaces it.
b = Member("b", "i-1")
poll_until([b, c], lambda: b.owns(), 30)
check(b.owns() == a_partitions, "B got %s, not A's %s (errors %s)" % (b.assigned, a_partitions, b.errors))
# C goes on for a while, well past several heartbeats: no rebalance reaches it.
poll_until([b, c], lambda: False, 2)
check(len(c.revoked) == c_revocations and c.owns() == c_partitions,
      "C was revoked or reassigned: %s / %s" % (c.revoked, c.assigned))
check(len(b.assigned) == 1, "B was assigned more than once: %s" % b.assigned)


# A comes back: its heartbeats and its commit name an instance another member holds now.
def is_fatal(e):
    return e.fatal() or e.code() == KafkaError._FATAL


poll_until([a, b, c], lambda: any(is_fatal(e) for e in a.errors), 10)
try:
    a.consumer.commit(offsets=[TopicPartition(topic, a_partitions[0], 1)], asynchronous=False)
except KafkaException as e:
    a.errors.append(e.args[0])
fatal = [e for e in a.errors if is_fatal(e)]
check(fatal, "A was not fenced: %s" % a.errors)
check(any("fenced" in str(e).lower() for e in a.errors), "A's errors do not say fenced: %s" % a.errors)
check(c.owns() == c_partitions and b.owns() == a_partitions, "the survivors' partitions moved")
c_revoked_after_replacement = len(c.revoked) - c_revocations
b.consumer.close()
c.consumer.close()
report(a_errors=sorted({e.name() for e in a.errors}), a_fatal=True,
       b_partitions=len(b.owns()), c_partitions=len(c_partitions),
       c_revoked_after_replacement=c_revoked_after_replacement,
       b_assignments=len(b.assigned))
