"""Helpers shared by the Kafka client scripts the integration tests run against mini-broker.

Every script takes the bootstrap list as its first argument, prints one JSON object with what it
saw on its last line of stdout, and exits non-zero when a check fails (with the reason on stderr).
"""
import json
import sys
import time


def bootstrap():
    if len(sys.argv) < 2:
        sys.exit("usage: %s BOOTSTRAP [args...]" % sys.argv[0])
    return sys.argv[1]


def report(**fields):
    print(json.dumps(fields), flush=True)


def fail(message):
    print("FAILED: " + message, file=sys.stderr, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def group_member_config(bootstrap_servers, group, name, instance=None):
    """confluent-kafka consumer settings of a group member named `name` (its client.id), static
    when `instance` is its group.instance.id: manual commits, a 10 s session and fast
    heartbeats, so rebalances are seen quickly."""
    config = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group,
        "client.id": name,
        "enable.auto.commit": False,
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 200,
    }
    if instance:
        config["group.instance.id"] = instance
    return config


def consume_all(bootstrap_servers, topic, partitions, isolation, deadline_s=30.0, expect=None):
    """Reads every partition from the beginning to its end with confluent-kafka (assign, no
    group offsets); returns {partition: [(offset, key, value, headers, timestamp)]}."""
    from confluent_kafka import Consumer, TopicPartition, KafkaError

    consumer = Consumer({
        "bootstrap.servers": bootstrap_servers,
        "group.id": "reader-%d" % int(time.time() * 1000),
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 50,
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen = {p: [] for p in partitions}
    at_eof = set()
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                at_eof.add(msg.partition())
                total = sum(len(v) for v in seen.values())
                if at_eof == set(partitions) and (expect is None or total >= expect):
                    break
                continue
            fail("consumer error: %s" % msg.error())
        at_eof.discard(msg.partition())
        seen[msg.partition()].append(
            (msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]))
    consumer.close()
    return seen
