"""confluent-kafka consume-transform-produce: a subscribe() consumer in group GROUP reads
`input` (read_committed), and for each polled batch a transaction writes "out-<value>" to
`output` (same partition, same key) and commits the consumer's positions with
send_offsets_to_transaction. Runs until the file STOP exists; prints "committed N" after each
transaction so the test can kill it mid-run. Handles errors as an exactly-once application must
(librdkafka's transactional API): a retriable commit is retried, an abortable one aborts the
transaction and rewinds the consumer to the group's committed offsets, a fatal one ends it.

With GROUP_PROTOCOL `consumer` the consumer uses KIP-848's protocol (the coordinator assigns;
the member epoch fences its commits) instead of the classic one. With GROUP_INSTANCE_ID in the
environment it is a static member (`group.instance.id`): its close is a temporary leave, and the
next process with that instance id takes its partitions without a rebalance. It prints
"revoked N" after each revocation (N partitions revoked so far) and reports the total and the
time of each revocation (before its own close).

usage: processor.py BOOTSTRAP GROUP TRANSACTIONAL_ID [GROUP_PROTOCOL] STOP_FILE"""
import os
import sys
import time

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)

from common import bootstrap, report

servers = bootstrap()
group, txn_id, stop_file = sys.argv[2], sys.argv[3], sys.argv[-1]
protocol = sys.argv[4] if len(sys.argv) > 5 else "classic"

consumer = Consumer({
    "bootstrap.servers": servers,
    "group.id": group,
    "enable.auto.commit": False,
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": 100,
    # KIP-848: the coordinator sets the session and heartbeat timing.
    **({"group.protocol": "consumer"} if protocol == "consumer" else
       {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}),
    **({"debug": os.environ["PROCESSOR_DEBUG"]} if os.environ.get("PROCESSOR_DEBUG") else {}),
    **({"group.instance.id": os.environ["GROUP_INSTANCE_ID"]}
       if os.environ.get("GROUP_INSTANCE_ID") else {}),
})
producer = Producer({
    "bootstrap.servers": servers,
    "transactional.id": txn_id,
    "linger.ms": 5,
})
producer.init_transactions(60)
revoked = 0
revoked_at = []


def on_revoke(_consumer, partitions):
    global revoked
    revoked += len(partitions)
    revoked_at.append(time.time())
    print("revoked %d" % revoked, flush=True)


consumer.subscribe(["input"], on_revoke=on_revoke, on_lost=on_revoke)



def rewind():
    """Back to the group's committed offsets, so an aborted transaction's input is read again."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for tp in consumer.committed(assignment, timeout=60):
        consumer.seek(TopicPartition(tp.topic, tp.partition,
                                     tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


def process(messages, group_metadata):
    producer.begin_transaction()
    for m in messages:
        producer.produce("output", key=m.key(), value=b"out-" + m.value(), partition=m.partition())
    # The next offset to read, per partition this transaction consumed from.
    next_offsets = {}
    for m in messages:
        next_offsets[m.partition()] = max(next_offsets.get(m.partition(), 0), m.offset() + 1)
    positions = [TopicPartition("input", p, o) for p, o in sorted(next_offsets.items())]
    # The group metadata (member id, generation or member epoch) as it was when the records
    # were read: if the group moved on meanwhile (this process was paused, its partitions went
    # to another member, and it rejoined), the coordinator refuses these offsets and the
    # transaction aborts, instead of committing with the metadata of the new membership.
    producer.send_offsets_to_transaction(positions, group_metadata, 60)
    while True:
        try:
            producer.commit_transaction(60)
            return
        except KafkaException as e:
            if not e.args[0].retriable():
                raise


committed = 0
transactions = 0
aborted = 0
while not os.path.exists(stop_file):
    messages = consumer.consume(num_messages=20, timeout=0.2)
    metadata = consumer.consumer_group_metadata()
    messages = [m for m in messages if m.error() is None or
                m.error().code() != KafkaError._PARTITION_EOF]
    for m in messages:
        if m.error():
            if m.error().fatal():
                raise KafkaException(m.error())
            print("consumer error: %s" % m.error(), file=sys.stderr, flush=True)
    messages = [m for m in messages if m.error() is None]
    if not messages:
        continue
    try:
        process(messages, metadata)
    except KafkaException as e:
        if not e.args[0].txn_requires_abort():
            raise
        print("aborting: %s" % e.args[0], file=sys.stderr, flush=True)
        producer.abort_transaction(60)
        aborted += 1
        rewind()
        continue
    committed += len(messages)
    transactions += 1
    print("committed %d" % committed, flush=True)

revoked_before_close, revoked_at_before_close = revoked, list(revoked_at)
consumer.close()
report(committed=committed, transactions=transactions, aborted=aborted,
       revoked=revoked_before_close, revoked_at=revoked_at_before_close)
