"""DescribeConfigs with librdkafka's and kafka-python's admin clients: a topic's configuration
(what every topic shares here: no retention), and a coordinator's and a leader's own settings,
each broker's resource answered by that broker; every entry is read-only. An unknown topic is
UNKNOWN_TOPIC_OR_PARTITION.

Topic ids (Metadata v10+): librdkafka's describe_topics (by name) sees a non-zero id for the topic,
the same on a second call; kafka-python describes the topic by name and then by that id (Metadata
v12 with a null name, as librdkafka's KIP-848 consumer asks) and gets the topic back; an unknown
id is UNKNOWN_TOPIC_ID. The ids are reported as hex for the test to compare with the derived one."""
import sys
import uuid

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kafka.admin import ConfigResource as KpResource, ConfigResourceType, KafkaAdminClient

from common import bootstrap, check, report

servers = bootstrap()
coordinator, leader = sys.argv[2], sys.argv[3]
admin = AdminClient({"bootstrap.servers": servers})
described = {}
# librdkafka takes one BROKER resource per call (it sends it to that broker).
for resource in [ConfigResource(ResourceType.TOPIC, "input"),
                 ConfigResource(ResourceType.BROKER, coordinator),
                 ConfigResource(ResourceType.BROKER, leader)]:
    for asked, future in admin.describe_configs([resource]).items():
        entries = future.result()
        check(all(e.is_read_only for e in entries.values()), "read-only: %s" % asked)
        described[asked.name] = {name: e.value for name, e in entries.items()}
try:
    unknown = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "no-such-topic")])
    list(unknown.values())[0].result()
    unknown_error = None
except KafkaException as e:
    unknown_error = e.args[0].code()
check(unknown_error == KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown topic: %s" % unknown_error)



def uuid_hex(topic_id):
    """librdkafka's Uuid as 32 hex digits (its halves are signed 64-bit integers)."""
    mask = (1 << 64) - 1
    return "%016x%016x" % (topic_id.get_most_significant_bits() & mask,
                           topic_id.get_least_significant_bits() & mask)


ids = [uuid_hex(admin.describe_topics(TopicCollection(["input"]))["input"].result().topic_id)
       for _ in range(2)]
check(ids[0] != "0" * 32, "librdkafka sees a topic id: %s" % ids)
check(ids[0] == ids[1], "the same topic id twice: %s" % ids)

kp = KafkaAdminClient(bootstrap_servers=servers.split(","))
(by_name,) = kp.describe_topics(["input"])
kp_id = uuid.UUID(str(by_name["topic_id"]))
check(by_name["error_code"] == 0 and kp_id.hex == ids[0],
      "kafka-python sees librdkafka's id: %s %s" % (by_name, ids))
(by_id,) = kp.describe_topics([kp_id])
check(by_id["error_code"] == 0 and by_id["name"] == "input" and len(by_id["partitions"]) > 0,
      "kafka-python by id: %s" % by_id)
(unknown_id,) = kp.describe_topics([uuid.UUID(int=7)])
check(unknown_id["error_code"] == 100 and unknown_id["name"] is None,
      "unknown id is UNKNOWN_TOPIC_ID: %s" % unknown_id)
# "all": kafka-python shows only dynamically changed configs by default (there are none).
answer = kp.describe_configs([KpResource(ConfigResourceType.TOPIC, "input")], config_filter="all")
if isinstance(answer, list):  # kafka-python 2.x: the raw responses
    kp_topic = {c[0]: c[1] for r in answer for res in r.resources for c in res[4]}
else:
    kp_topic = {k: (v["value"] if isinstance(v, dict) else v)
                for k, v in answer["topic"]["input"].items()}
kp.close()

report(topic=described["input"], coordinator=described[coordinator],
       leader=described[leader], kafka_python_topic=kp_topic, topic_id=ids[0],
       kafka_python_topic_id=kp_id.hex)
