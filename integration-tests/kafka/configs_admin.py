"""DescribeConfigs with librdkafka's and kafka-python's admin clients: a topic's configuration
(what every topic shares here: no retention), and a coordinator's and a leader's own settings,
each broker's resource answered by that broker; every entry is read-only. An unknown topic is
UNKNOWN_TOPIC_OR_PARTITION."""
import sys

from confluent_kafka import KafkaError, KafkaException
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

kp = KafkaAdminClient(bootstrap_servers=servers.split(","))
# "all": kafka-python shows only dynamically changed configs by default (there are none).
answer = kp.describe_configs([KpResource(ConfigResourceType.TOPIC, "input")], config_filter="all")
if isinstance(answer, list):  # kafka-python 2.x: the raw responses
    kp_topic = {c[0]: c[1] for r in answer for res in r.resources for c in res[4]}
else:
    kp_topic = {k: (v["value"] if isinstance(v, dict) else v)
                for k, v in answer["topic"]["input"].items()}
kp.close()

report(topic=described["input"], coordinator=described[coordinator],
       leader=described[leader], kafka_python_topic=kp_topic)
