"""The controller's APIs with both admin clients, as an application that creates its topics at
start ("create if missing") calls them: CreateTopics, CreatePartitions, DeleteTopics and
DescribeCluster. Topics are fixed by the topology, so creating `input` (which exists) must say
TOPIC_ALREADY_EXISTS, creating a new topic POLICY_VIOLATION with the reason, growing `input`
POLICY_VIOLATION, deleting it TOPIC_DELETION_DISABLED; and `input` must still be there, with
its records readable, afterwards.

usage: topics_admin.py BOOTSTRAP"""
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from common import bootstrap, check, consume_all, report

servers = bootstrap()
admin = AdminClient({"bootstrap.servers": servers})


def outcome(future):
    """The error name and message a future ends with, or ("NONE", "")."""
    try:
        future.result(30)
        return ("NONE", "")
    except Exception as e:  # confluent_kafka.KafkaException
        error = e.args[0]
        return (error.name(), error.str())


producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
producer.produce("input", value=b"before", partition=0)
check(producer.flush(30) == 0, "record not delivered")

created = admin.create_topics([NewTopic("input", 3, 1), NewTopic("orders-new", 6, 1),
                               NewTopic("bad name!", 1, 1)])
validated = admin.create_topics([NewTopic("orders-new", 6, 1)], validate_only=True)
grown = admin.create_partitions([NewPartitions("input", 6)])
grown_same = admin.create_partitions([NewPartitions("input", 3)])
deleted = admin.delete_topics(["input"])
cluster = admin.describe_cluster().result(30)

confluent = {
    "create": {t: outcome(f) for t, f in created.items()},
    "validate_only": outcome(validated["orders-new"]),
    "grow": outcome(grown["input"]),
    "grow_same": outcome(grown_same["input"]),
    "delete": outcome(deleted["input"]),
    "cluster_id": cluster.cluster_id,
    "controller": cluster.controller.id if cluster.controller else None,
    "brokers": sorted(n.id for n in cluster.nodes),
}

# kafka-python's KafkaAdminClient raises a Kafka error class per topic.
from kafka.admin import KafkaAdminClient, NewTopic as KpNewTopic  # noqa: E402

kp = KafkaAdminClient(bootstrap_servers=servers.split(","), request_timeout_ms=30000)


def kp_outcome(call):
    try:
        call()
        return "NONE"
    except Exception as e:  # kafka.errors.*
        return type(e).__name__


kafka_python = {
    "create_existing": kp_outcome(
        lambda: kp.create_topics([KpNewTopic("input", 3, 1)])),
    "create_new": kp_outcome(
        lambda: kp.create_topics([KpNewTopic("orders-new", 6, 1)])),
    "delete": kp_outcome(lambda: kp.delete_topics(["input"])),
}
kp.close()

# Nothing changed: `input` is there with its record.
after = admin.list_topics(timeout=30).topics
records = consume_all(servers, "input", range(3), "read_committed")
report(confluent=confluent, kafka_python=kafka_python,
       input_partitions=len(after["input"].partitions),
       orders_new_exists="orders-new" in after,
       input_records=sum(len(v) for v in records.values()))
