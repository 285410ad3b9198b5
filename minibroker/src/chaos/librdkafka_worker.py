"""A chaos producer worker on librdkafka (confluent-kafka), speaking Kafka's protocol to the
cluster's Kafka listeners as an unchanged exactly-once application would: transaction version 1
(InitProducerId, AddPartitionsToTxn, Produce, EndTxn), librdkafka's own retries, its own fatal and
abortable errors.

`minibroker chaos --client librdkafka` writes this file into the run's directory and starts one
process per instance of a transactional id, with the flags of `minibroker chaos-worker`. It
prints the same events, one JSON object a line on stdout (flushed before the request it announces
is sent, so the history survives a SIGKILL), and runs until its stdin closes or it is fenced.

Differences from the Rust worker: librdkafka does not tell the application its PID and epoch, so
`init_ok` carries -1 for both; a send is produce() then flush(), so `sent_us` is when the record
was handed to librdkafka (its request goes out at that moment or later, which only makes the
checker's zombie rule stricter for us, never looser).
"""

import argparse
import json
import random
import sys
import threading
import time

from confluent_kafka import KafkaError, KafkaException, Producer


def now_us():
    return time.time_ns() // 1000


def emit(event):
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass  # the driver is gone: nothing left to report to


class Stopped(Exception):
    """The instance can go no further (fenced, a fatal error, an abort that failed for good)."""


def error_of(exc):
    """The KafkaError a confluent-kafka exception carries (or a stand-in)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return KafkaError(KafkaError._FAIL, str(exc))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--records-per-txn", type=int, required=True)
    parser.add_argument("--abort-ratio", type=float, required=True)
    parser.add_argument("--transaction-timeout-ms", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    a = parser.parse_args()

    stop = threading.Event()

    def watch_stdin():
        try:
            sys.stdin.read()
        finally:
            stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    timeout_ms = max(a.transaction_timeout_ms, 1000)
    producer = Producer(
        {
            "bootstrap.servers": a.nodes,
            "transactional.id": a.transactional_id,
            "transaction.timeout.ms": timeout_ms,
            "message.timeout.ms": timeout_ms,
            "socket.timeout.ms": timeout_ms,
            "linger.ms": 0,
            "retry.backoff.ms": 10,
            "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 200,
        }
    )
    try:
        producer.init_transactions(30)
    except KafkaException as e:
        emit({"kind": "init_failed", "at_us": now_us(), "error": str(error_of(e))})
        return
    emit({"kind": "init_ok", "at_us": now_us(), "pid": -1, "epoch": -1})

    rng = random.Random(a.seed)
    wait_s = timeout_ms / 1000.0
    txn = 0
    reason = "asked to stop"
    try:
        while not stop.is_set():
            one_transaction(producer, a, txn, rng, wait_s, stop)
            txn += 1
    except Stopped as e:
        reason = str(e)
    emit({"kind": "exit", "reason": reason})


def send(producer, a, txn, value, partition, wait_s):
    """Produces one record and waits for its delivery; returns the KafkaError or None."""
    sent_us = now_us()
    delivered = {}

    def on_delivery(err, msg):
        delivered["err"] = err
        delivered["msg"] = msg

    try:
        producer.produce(a.topic, value=value.encode(), partition=partition, on_delivery=on_delivery)
        producer.flush(wait_s * 2)
    except (KafkaException, BufferError) as e:
        delivered.setdefault("err", error_of(e))
    err = delivered.get("err")
    if "msg" not in delivered and err is None:
        err = KafkaError(KafkaError._MSG_TIMED_OUT, "no delivery report in time")
    event = {
        "kind": "send",
        "txn": txn,
        "value": value,
        "sent_us": sent_us,
        "at_us": now_us(),
        "ok": None,
        "error": None,
        "fatal": False,
    }
    if err is None:
        msg = delivered["msg"]
        event["ok"] = {"partition": msg.partition(), "offset": msg.offset()}
    else:
        event["error"] = str(err)
        event["fatal"] = err.fatal()
    emit(event)
    return err


def one_transaction(producer, a, txn, rng, wait_s, stop):
    try:
        producer.begin_transaction()
    except KafkaException as e:
        raise Stopped(f"fenced: {error_of(e)}")
    emit({"kind": "begin", "txn": txn})
    failed = False
    partitions = max(a.partitions, 1)
    start = rng.randrange(partitions)
    for n in range(a.records_per_txn):
        value = f"{a.instance}/{txn}/{n}"
        partition = (start + n % partitions) % partitions
        err = send(producer, a, txn, value, partition, wait_s)
        if err is not None:
            if err.fatal():
                raise Stopped(f"fenced: {err}")
            failed = True
            break
    commit = not failed and rng.random() >= a.abort_ratio
    if end(producer, txn, commit, wait_s, stop) or not commit:
        return
    # The commit failed without being fatal: its outcome is unknown to us. Abort what
    # librdkafka still holds open and go on.
    end(producer, txn, False, wait_s, stop)


def end(producer, txn, commit, wait_s, stop):
    """EndTxn, retried while librdkafka calls the error retriable; True on success."""
    sent_us = now_us()
    emit({"kind": "end_start", "txn": txn, "commit": commit, "sent_us": sent_us})
    while True:
        try:
            if commit:
                producer.commit_transaction(wait_s * 2)
            else:
                producer.abort_transaction(wait_s * 2)
            error = None
        except KafkaException as e:
            error = error_of(e)
            if error.retriable() and not stop.is_set():
                continue
        emit(
            {
                "kind": "end",
                "txn": txn,
                "commit": commit,
                "sent_us": sent_us,
                "at_us": now_us(),
                "error": None if error is None else str(error),
                "fatal": bool(error is not None and error.fatal()),
            }
        )
        if error is None:
            return True
        if error.fatal():
            raise Stopped(f"fenced: {error}")
        if not commit and not stop.is_set():
            # An abort that failed for good leaves the producer unusable for new
            # transactions: end the instance, as an application would restart it.
            raise Stopped(f"abort failed: {error}")
        return False


if __name__ == "__main__":
    main()
