"""confluent-kafka's AdminClient lists and describes consumer groups (ListGroups, DescribeGroups).

Two consumers join one group: "alpha" with group.instance.id "i-alpha" (static) and "beta"
(dynamic). Once both have their partitions, list_consumer_groups (every broker, merged) must show
the group Stable, also with a states filter, and describe_consumer_groups must show both members
with their client ids, host, instance id and assignments (together: every partition of the topic,
each once), the assignor and the coordinator. A group nobody joined is described as Dead."""
import sys
import time
import uuid
from confluent_kafka import Consumer, ConsumerGroupState
from confluent_kafka.admin import AdminClient

from common import bootstrap, check, group_member_config, report

servers = bootstrap()
topic = sys.argv[2] if len(sys.argv) > 2 else "input"
partitions = int(sys.argv[3]) if len(sys.argv) > 3 else 3
group = "described-%s" % uuid.uuid4().hex[:8]


def consumer(name, instance):
    c = Consumer(group_member_config(servers, group, name, instance))
    assigned = []
    c.subscribe([topic], on_assign=lambda _c, parts: assigned.append(len(parts)))
    return c, assigned


alpha, alpha_assigned = consumer("alpha", "i-alpha")
beta, beta_assigned = consumer("beta", None)
deadline = time.time() + 30
while time.time() < deadline and not (alpha_assigned and beta_assigned
                                      and alpha_assigned[-1] + beta_assigned[-1] == partitions):
    alpha.poll(0.05)
    beta.poll(0.05)
check(alpha_assigned and beta_assigned, "both consumers got partitions")

admin = AdminClient({"bootstrap.servers": servers})
listed = admin.list_consumer_groups(request_timeout=10).result()
check(not listed.errors, "list errors: %s" % listed.errors)
ours = [g for g in listed.valid if g.group_id == group]
check(len(ours) == 1, "the group is listed once: %s" % [g.group_id for g in listed.valid])
check(ours[0].state == ConsumerGroupState.STABLE, "listed state %s" % ours[0].state)
stable_only = admin.list_consumer_groups(
    request_timeout=10, states={ConsumerGroupState.STABLE}).result()
empty_only = admin.list_consumer_groups(
    request_timeout=10, states={ConsumerGroupState.EMPTY}).result()
check(any(g.group_id == group for g in stable_only.valid), "listed with the Stable filter")
check(all(g.group_id != group for g in empty_only.valid), "not listed with the Empty filter")

unknown = "nobody-%s" % uuid.uuid4().hex[:8]
futures = admin.describe_consumer_groups([group, unknown], request_timeout=10)
described = futures[group].result()
check(described.state == ConsumerGroupState.STABLE, "described state %s" % described.state)
members = {m.client_id: m for m in described.members}
check(sorted(members) == ["alpha", "beta"], "members %s" % sorted(members))
check(members["alpha"].group_instance_id == "i-alpha",
      "alpha's instance id %r" % members["alpha"].group_instance_id)
check(not members["beta"].group_instance_id, "beta is dynamic")
check(all(m.host.endswith("127.0.0.1") for m in described.members),
      "hosts %s" % [m.host for m in described.members])
owned = sorted(tp.partition for m in described.members for tp in m.assignment.topic_partitions)
check(owned == list(range(partitions)), "assignments cover the topic once: %s" % owned)
check(described.partition_assignor in ("range", "roundrobin"),
      "assignor %r" % described.partition_assignor)
gone = futures[unknown].result()
check(gone.state == ConsumerGroupState.DEAD, "an unknown group is Dead: %s" % gone.state)

report(listed=len(ours), members=len(described.members), owned=owned,
       coordinator=described.coordinator.id, assignor=described.partition_assignor)
alpha.close()
beta.close()
