"""kafka-python's KafkaAdminClient deletes a consumer group's committed offsets (OffsetDelete)
and the group itself (DeleteGroups), by Kafka's rules. A consumer of "input" commits offsets of
input-0 and output-0 (a topic it does not read). While it is a member:
- OffsetDelete keeps input-0 (GROUP_SUBSCRIBED_TO_TOPIC) and deletes output-0;
- DeleteGroups is NON_EMPTY_GROUP.
Once it has left, input-0's offset can be deleted too. alter_group_offsets then commits offsets
into the empty group; the group is listed (Empty, known by its offsets only), DeleteGroups
deletes it, it is no longer listed, its offsets read as none, and deleting it again is
GROUP_ID_NOT_FOUND."""
import time
import uuid

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import GroupSubscribedToTopicError, NoError
from kafka.structs import OffsetAndMetadata

from common import bootstrap, check, report

servers = bootstrap().split(",")
group = "kp-deleted-%s" % uuid.uuid4().hex[:8]
input0, output0 = TopicPartition("input", 0), TopicPartition("output", 0)


def deleted(groups):
    """delete_groups, with each group's error by name (kafka-python 3 answers a dict of names)."""
    answer = admin.delete_groups(groups)
    items = answer.items() if isinstance(answer, dict) else answer
    return {g: e if isinstance(e, str) else e.__name__ for g, e in items}


consumer = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False,
                         session_timeout_ms=6000, heartbeat_interval_ms=500)
consumer.subscribe(["input"])
deadline = time.time() + 30
while time.time() < deadline and not consumer.assignment():
    consumer.poll(timeout_ms=200)
check(consumer.assignment(), "the consumer got partitions")
consumer.commit({input0: OffsetAndMetadata(5, "", -1), output0: OffsetAndMetadata(7, "", -1)})
check(consumer.committed(output0) == 7, "output-0 committed")

admin = KafkaAdminClient(bootstrap_servers=servers)
while_member = admin.delete_group_offsets(group, [input0, output0])
check(while_member[input0] is GroupSubscribedToTopicError, "input-0: %s" % while_member)
check(while_member[output0] is NoError, "output-0: %s" % while_member)
check(consumer.committed(input0) == 5, "input-0 kept")
check(consumer.committed(output0) is None, "output-0 deleted")
refused = deleted([group])
check(refused[group] == "NonEmptyGroupError", "deleting a group with a member: %s" % refused)
consumer.close()

after_leaving = admin.delete_group_offsets(group, [input0])
check(after_leaving[input0] is NoError, "input-0 after the member left: %s" % after_leaving)

altered = admin.alter_group_offsets(group, {input0: OffsetAndMetadata(9, "", -1)})
check(altered[input0] is NoError, "alter_group_offsets: %s" % altered)
listed = [g for g in admin.list_groups() if g["group_id"] == group]
check(len(listed) == 1 and listed[0]["group_state"] == "Empty", "listed %s" % listed)
emptied = deleted([group])
check(emptied[group] in ("OK", "NoError"), "deleting the empty group: %s" % emptied)
listed_after = [g for g in admin.list_groups() if g["group_id"] == group]
offsets_after = admin.list_group_offsets({group: [input0]})[group]
again = deleted([group])
check(again[group] == "GroupIdNotFoundError", "deleting it again: %s" % again)
report(kept=5, listed_after=len(listed_after),
       offset_after=offsets_after[input0].offset if input0 in offsets_after else None)
admin.close()
