"""kafka-python's KafkaAdminClient lists and describes consumer groups (ListGroups,
DescribeGroups): one consumer with client.id "kp-client" joins a group and gets the topic's
partitions; list_groups must show the group Stable, describe_groups its member with its client
id, host and assignment."""
import sys
import time
import uuid

from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient

from common import bootstrap, check, report

servers = bootstrap().split(",")
topic = sys.argv[2] if len(sys.argv) > 2 else "input"
group = "kp-described-%s" % uuid.uuid4().hex[:8]

consumer = KafkaConsumer(bootstrap_servers=servers, group_id=group, client_id="kp-client",
                         enable_auto_commit=False, session_timeout_ms=6000,
                         heartbeat_interval_ms=500)
consumer.subscribe([topic])
deadline = time.time() + 30
while time.time() < deadline and not consumer.assignment():
    consumer.poll(timeout_ms=200)
check(consumer.assignment(), "the consumer got partitions")

admin = KafkaAdminClient(bootstrap_servers=servers)
listed = [g for g in admin.list_groups() if g["group_id"] == group]
check(len(listed) == 1, "the group is listed once")
check(listed[0]["group_state"] == "Stable", "listed %s" % listed[0])
described = admin.describe_groups([group])[group]
check(described["group_state"] == "Stable", "described %s" % described)
members = described["members"]
check(len(members) == 1, "one member: %s" % members)
member = members[0]
check(member["client_id"] == "kp-client", "client id %r" % member["client_id"])
check(member["member_id"].startswith("kp-client-"), "member id %r" % member["member_id"])
check(member["client_host"].endswith("127.0.0.1"), "host %r" % member["client_host"])
owned = sorted(p for t in member["member_assignment"]["assigned_partitions"]
               for p in t["partitions"])
report(listed=len(listed), members=len(members), owned=owned,
       protocol=described["protocol_data"])
consumer.close()
admin.close()
