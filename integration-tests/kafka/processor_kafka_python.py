"""kafka-python consume-transform-produce, one pass: a subscribe() consumer in group GROUP reads
`input` (read_committed) until it has seen COUNT records; for each polled batch a transaction
writes "out-<value>" to `output` (same partition, same key) and commits the consumer's
positions with send_offsets_to_transaction (KIP-447 group metadata). Then the group's committed
offsets are read back.

usage: processor_kafka_python.py BOOTSTRAP GROUP TRANSACTIONAL_ID COUNT"""
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from common import bootstrap, check, report

servers = bootstrap().split(",")
group, txn_id, count = sys.argv[2], sys.argv[3], int(sys.argv[4])

consumer = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False,
                         isolation_level="read_committed", auto_offset_reset="earliest",
                         session_timeout_ms=6000, heartbeat_interval_ms=500)
producer = KafkaProducer(bootstrap_servers=servers, transactional_id=txn_id, linger_ms=5)
producer.init_transactions()
consumer.subscribe(["input"])

processed = 0
transactions = 0
deadline = time.time() + 90
while processed < count:
    check(time.time() < deadline, "processed only %d of %d records" % (processed, count))
    polled = consumer.poll(timeout_ms=200, max_records=20)
    records = [r for batch in polled.values() for r in batch]
    if not records:
        continue
    producer.begin_transaction()
    for r in records:
        producer.send("output", key=r.key, value=b"out-" + r.value, partition=r.partition)
    positions = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        positions[tp] = max(positions.get(tp, 0), r.offset + 1)
    producer.send_offsets_to_transaction(
        {tp: OffsetAndMetadata(o, "", -1) for tp, o in positions.items()},
        consumer.group_metadata())
    producer.commit_transaction()
    processed += len(records)
    transactions += 1

committed = {tp.partition: consumer.committed(tp) for tp in
             [TopicPartition("input", p) for p in range(3)]}
consumer.close()
producer.close()
report(processed=processed, transactions=transactions,
       committed={str(p): o for p, o in committed.items()})
