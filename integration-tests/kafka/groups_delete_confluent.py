"""librdkafka's AdminClient deletes consumer groups (DeleteGroups) and resets offsets
(alter_consumer_group_offsets, list_consumer_group_offsets: OffsetCommit and OffsetFetch from
outside the group), as an operator does with kafka-consumer-groups. A consumer of "input"
commits input-0 = 5; while it is a member the group cannot be deleted (NON_EMPTY_GROUP) and its
offsets cannot be altered from outside (UNKNOWN_MEMBER_ID). Once it has closed, the offsets are
reset to 2 and read back, a new consumer of the group starts from 2, and after it has closed
too the group is deleted: no longer listed, described Dead, its offsets gone, and a group that
never existed is GROUP_ID_NOT_FOUND."""
import time
import uuid

from confluent_kafka import (Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException,
                             TopicPartition)
from confluent_kafka.admin import AdminClient

from common import bootstrap, check, group_member_config, report

servers = bootstrap()
group = "ck-deleted-%s" % uuid.uuid4().hex[:8]
admin = AdminClient({"bootstrap.servers": servers})


def member(name):
    c = Consumer(group_member_config(servers, group, name))
    c.subscribe(["input"])
    deadline = time.time() + 30
    while time.time() < deadline and not c.assignment():
        c.poll(0.2)
    check(c.assignment(), "%s got partitions" % name)
    return c


def error_of(future):
    try:
        future.result()
        return None
    except KafkaException as e:
        return e.args[0].code()


def listed():
    return [g.group_id for g in admin.list_consumer_groups().result().valid]


def offsets():
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition("input", 0)])]
    result = admin.list_consumer_group_offsets(request)[group].result()
    return result.topic_partitions[0].offset


first = member("first")
first.commit(offsets=[TopicPartition("input", 0, 5)], asynchronous=False)
check(offsets() == 5, "committed 5")
busy = error_of(admin.delete_consumer_groups([group])[group])
check(busy == KafkaError.NON_EMPTY_GROUP, "deleting a group with a member: %s" % busy)
reset = [ConsumerGroupTopicPartitions(group, [TopicPartition("input", 0, 2)])]
altered = admin.alter_consumer_group_offsets(reset)[group]
try:
    result = altered.result()
    alter_while_member = result.topic_partitions[0].error
    alter_while_member = alter_while_member.code() if alter_while_member else None
except KafkaException as e:
    alter_while_member = e.args[0].code()
check(alter_while_member == KafkaError.UNKNOWN_MEMBER_ID,
      "altering offsets of a group with a member: %s" % alter_while_member)
first.close()

result = admin.alter_consumer_group_offsets(reset)[group].result()
check(result.topic_partitions[0].error is None, "reset: %s" % result.topic_partitions)
check(offsets() == 2, "reset to 2")
second = member("second")
positions = [tp.offset for tp in second.committed([TopicPartition("input", 0)], timeout=10)]
check(positions == [2], "the next member starts from the reset offset: %s" % positions)
second.close()

check(group in listed(), "the empty group is listed")
check(error_of(admin.delete_consumer_groups([group])[group]) is None, "deleted")
listed_after = group in listed()
described = admin.describe_consumer_groups([group])[group].result()
unknown = "ck-never-%s" % uuid.uuid4().hex[:8]
not_found = error_of(admin.delete_consumer_groups([unknown])[unknown])
check(not_found == KafkaError.GROUP_ID_NOT_FOUND, "an unknown group: %s" % not_found)
report(listed_after=listed_after, state=str(described.state), offset_after=offsets())
