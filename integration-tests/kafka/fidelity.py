"""Records come back as they were sent: librdkafka produces records with null and empty keys and
values (a null value is a tombstone; Kafka tells it from an empty one), the first with headers
that repeat a key and have a null value, in a transaction. librdkafka and kafka-python read them
back read_committed; each must see None where None was sent, b"" where b"" was, and every
header in order."""
import sys
import time
import uuid

from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic, partition = sys.argv[2], int(sys.argv[3])
sent = [(None, None), (b"", b""), (b"k", None), (None, b"v"), (b"", None), (None, b"")]
headers = [("h", b"1"), ("n", None), ("h", b"2")]

producer = Producer({"bootstrap.servers": servers,
                     "transactional.id": "nulls-%s" % uuid.uuid4().hex[:8]})
producer.init_transactions()
producer.begin_transaction()
for i, (key, value) in enumerate(sent):
    producer.produce(topic, key=key, value=value, partition=partition,
                     headers=headers if i == 0 else None)
producer.commit_transaction()

seen = consume_all(servers, topic, [partition], "read_committed", expect=len(sent))[partition]
confluent = [(key, value) for (_, key, value, _, _) in seen]
check(confluent == sent, "librdkafka read %r, sent %r" % (confluent, sent))
check(seen[0][3] == headers, "librdkafka read headers %r, sent %r" % (seen[0][3], headers))

consumer = KafkaConsumer(bootstrap_servers=servers.split(","), group_id=None,
                         isolation_level="read_committed", enable_auto_commit=False)
tp = TopicPartition(topic, partition)
consumer.assign([tp])
consumer.seek_to_beginning(tp)
python, python_headers = [], []
deadline = time.time() + 30
while len(python) < len(sent) and time.time() < deadline:
    for records in consumer.poll(timeout_ms=200).values():
        python.extend((r.key, r.value) for r in records)
        python_headers.extend(list(r.headers) for r in records)
consumer.close()
check(python == sent, "kafka-python read %r, sent %r" % (python, sent))
check(python_headers[0] == headers, "kafka-python read headers %r" % python_headers[0])


def shape(records):
    return [[None if k is None else k.decode(), None if v is None else v.decode()]
            for k, v in records]


report(confluent=shape(confluent), kafka_python=shape(python), headers=len(seen[0][3]))
