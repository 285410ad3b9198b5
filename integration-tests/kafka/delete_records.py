"""DeleteRecords with librdkafka's and kafka-python's admin clients, as an operator empties a
partition or a test suite resets one. Ten records go to input-0, then:
- librdkafka deletes those before offset 4: the low watermark is 4, a new group member
  starting from the earliest offset reads offsets 4..9, and a consumer placed at offset 1 is
  told OFFSET_OUT_OF_RANGE and resets to 4;
- a deletion past the high watermark is OFFSET_OUT_OF_RANGE;
- kafka-python deletes everything (-1: the high watermark) and ListOffsets(earliest) is 10."""
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import TopicPartition as KpPartition
from kafka.admin import KafkaAdminClient, OffsetSpec

from common import bootstrap, check, report

servers = bootstrap()
producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
for i in range(10):
    producer.produce("input", value=b"v%d" % i, partition=0)
check(producer.flush(10) == 0, "produced")

admin = AdminClient({"bootstrap.servers": servers})
deleted = admin.delete_records([TopicPartition("input", 0, 4)])
low = list(deleted.values())[0].result().low_watermark
check(low == 4, "low watermark %s" % low)


def read(assignment=None, group=None):
    consumer = Consumer({"bootstrap.servers": servers,
                         "group.id": group or "reader-%s" % uuid.uuid4().hex[:8],
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 50})
    if assignment is None:
        consumer.subscribe(["input"])
    else:
        consumer.assign(assignment)
    offsets = []
    deadline = time.time() + 30
    while time.time() < deadline and len(offsets) < 6:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        if msg.partition() == 0:
            offsets.append(msg.offset())
    consumer.close()
    return offsets


from_earliest = read()
check(from_earliest == list(range(4, 10)), "read from the earliest: %s" % from_earliest)
from_deleted = read([TopicPartition("input", 0, 1)])
check(from_deleted == list(range(4, 10)), "reset from a deleted offset: %s" % from_deleted)
try:
    list(admin.delete_records([TopicPartition("input", 0, 11)]).values())[0].result()
    past_end = None
except KafkaException as e:
    past_end = e.args[0].code()
check(past_end == KafkaError.OFFSET_OUT_OF_RANGE, "past the high watermark: %s" % past_end)

kp = KafkaAdminClient(bootstrap_servers=servers.split(","))
tp = KpPartition("input", 0)
everything = kp.delete_records({tp: -1})
kp_low = everything[tp]["low_watermark"] if isinstance(everything[tp], dict) else everything[tp]
earliest = kp.list_partition_offsets({tp: OffsetSpec.EARLIEST})[tp].offset
kp.close()
report(low=low, from_earliest=from_earliest, kafka_python_low=kp_low, earliest=earliest)
