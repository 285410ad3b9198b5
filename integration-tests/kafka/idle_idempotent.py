"""An idempotent confluent-kafka producer that goes idle (argument 4: seconds) long enough for
the leader to forget its producer state, then writes on: argument 3 records before the pause
and as many after, to partition 0 of the topic (argument 2). Reports the delivery errors, the
records read back (read_uncommitted) and whether each value is there once, in order."""
import sys
import time
from confluent_kafka import Producer

from common import bootstrap, check, consume_all, report

servers = bootstrap()
topic, count, idle_s = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

errors = []
fatal = []


def on_error(err):
    if err.fatal():
        fatal.append(str(err))


producer = Producer({
    "bootstrap.servers": servers,
    "enable.idempotence": True,
    "linger.ms": 1,
    "error_cb": on_error,
})


def send(values):
    for v in values:
        producer.produce(topic, value=v, partition=0,
                         on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
    remaining = producer.flush(30)
    check(remaining == 0, "%d records still undelivered after 30 s" % remaining)


before = [b"idle-%03d" % i for i in range(count)]
after = [b"idle-%03d" % i for i in range(count, 2 * count)]
send(before)
time.sleep(idle_s)
send(after)
seen = consume_all(servers, topic, [0], "read_uncommitted", expect=2 * count)
values = [r[2] for r in seen[0] if r[2] is not None and r[2].startswith(b"idle-")]
report(errors=errors, fatal=fatal, read=len(values), once_in_order=values == before + after)
