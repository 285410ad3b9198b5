"""kafka-python group consumer: subscribes to `input` in group GROUP (read_committed), commits
its positions after every poll (synchronously), and prints "consumed N" (distinct values seen
so far) after each commit, until the file STOP exists. A commit refused because the group
rebalanced (or started over) is left to the next poll, as a Kafka application does. Reports the
distinct values seen, and when (seconds since the epoch) partitions were revoked from it.

usage: group_consumer_kafka_python.py BOOTSTRAP GROUP STOP_FILE"""
import os
import sys

import time

from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import KafkaError

from common import bootstrap, report

servers = bootstrap().split(",")
group, stop_file = sys.argv[2], sys.argv[3]

consumer = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False,
                         isolation_level="read_committed", auto_offset_reset="earliest",
                         session_timeout_ms=6000, heartbeat_interval_ms=500)
revoked_at = []


class Listener(ConsumerRebalanceListener):
    def on_partitions_revoked(self, revoked):
        if revoked:
            revoked_at.append(time.time())

    def on_partitions_assigned(self, assigned):
        pass


consumer.subscribe(["input"], listener=Listener())
seen = set()
refused = 0
while not os.path.exists(stop_file):
    polled = consumer.poll(timeout_ms=200)
    records = [r for batch in polled.values() for r in batch]
    seen.update(r.value.decode() for r in records)
    try:
        consumer.commit()
    except KafkaError as e:
        refused += 1
        print("commit refused: %r" % e, file=sys.stderr, flush=True)
        continue
    if records:
        print("consumed %d" % len(seen), flush=True)
revoked_before_close = list(revoked_at)
consumer.close()
report(seen=sorted(seen), refused=refused, revoked_at=revoked_before_close)
