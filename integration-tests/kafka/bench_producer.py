"""confluent-kafka producer throughput against mini-broker: 1 KiB records, idempotent
(acks=all), batching on (linger.ms=5, or $BENCH_LINGER_MS), round-robin over the 3 partitions of TOPIC, for SECONDS;
the time includes the final flush, so every counted record was acknowledged.

usage: bench_producer.py BOOTSTRAP TOPIC SECONDS"""
import os
import sys
import time

from confluent_kafka import Producer

from common import bootstrap, check, report

servers = bootstrap()
topic, seconds = sys.argv[2], float(sys.argv[3])
errors = []
producer = Producer({
    "bootstrap.servers": servers,
    "enable.idempotence": True,
    "linger.ms": int(os.environ.get("BENCH_LINGER_MS", "5")),
    "batch.size": 1000000,
})
value = b"x" * 1024
sent = 0
start = time.time()
while time.time() - start < seconds:
    try:
        producer.produce(topic, value=value, partition=sent % 3,
                         on_delivery=lambda err, _: err and errors.append(err))
        sent += 1
    except BufferError:
        producer.poll(0.005)
    if sent % 1000 == 0:
        producer.poll(0)
producer.flush(60)
elapsed = time.time() - start
check(not errors, "delivery errors: %s" % errors[:3])
report(records=sent, seconds=round(elapsed, 3), records_per_sec=round(sent / elapsed, 1),
       mib_per_sec=round(sent / elapsed / 1024, 2))
