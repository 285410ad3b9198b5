"""A chaos producer worker on a real Kafka client, speaking Kafka's protocol to the cluster's Kafka
listeners as an unchanged exactly-once application would: transaction version 1 (InitProducerId,
AddPartitionsToTxn, Produce, EndTxn), the client's own retries, its own fatal and abortable errors.
Two clients: librdkafka (confluent-kafka) and kafka-python.

`minibroker chaos --client librdkafka|kafka-python` writes this file into the run's directory and
starts one process per instance of a transactional id, with the flags of `minibroker
chaos-worker` and `--library`. It prints the same events, one JSON object a line on stdout
(flushed before the request it announces is sent, so the history survives a SIGKILL), and runs
until its stdin closes or it is fenced.

Differences from the Rust worker: neither client tells the application its PID and epoch, so
`init_ok` carries -1 for both; a send hands the record to the client and waits for its delivery,
so `sent_us` is when the client got it (its request goes out at that moment or later, which only
makes the checker's zombie rule stricter for us, never looser).
"""

import argparse
import json
import random
import sys
import threading
import time


def now_us():
    return time.time_ns() // 1000


def emit(event):
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass  # the driver is gone: nothing left to report to


class ClientError(Exception):
    """A client call failed: `fatal` (the instance is done), `retriable` (call it again)."""

    def __init__(self, message, fatal=False, retriable=False):
        super().__init__(message)
        self.fatal = fatal
        self.retriable = retriable


class Stopped(Exception):
    """The instance can go no further (fenced, a fatal error, an abort that failed for good)."""


class Librdkafka:
    """confluent-kafka's Producer."""

    def __init__(self, a, timeout_ms):
        from confluent_kafka import KafkaError, KafkaException, Producer

        self.KafkaError, self.KafkaException = KafkaError, KafkaException
        self.wait_s = timeout_ms / 1000.0
        self.p = Producer(
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

    def error(self, exc):
        err = exc.args[0] if exc.args and isinstance(exc.args[0], self.KafkaError) else None
        if err is None:
            return ClientError(str(exc))
        return ClientError(str(err), err.fatal(), err.retriable())

    def call(self, f, *args):
        try:
            return f(*args)
        except self.KafkaException as e:
            raise self.error(e)

    def init(self):
        self.call(self.p.init_transactions, 30)

    def begin(self):
        self.call(self.p.begin_transaction)

    def send(self, topic, value, partition):
        delivered = {}

        def on_delivery(err, msg):
            delivered["err"], delivered["msg"] = err, msg

        try:
            self.p.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
            self.p.flush(self.wait_s * 2)
        except (self.KafkaException, BufferError) as e:
            raise self.error(e)
        err = delivered.get("err")
        if err is not None:
            raise ClientError(str(err), err.fatal(), err.retriable())
        if "msg" not in delivered:
            raise ClientError("no delivery report in time")
        return delivered["msg"].partition(), delivered["msg"].offset()

    def commit(self):
        self.call(self.p.commit_transaction, self.wait_s * 2)

    def abort(self):
        self.call(self.p.abort_transaction, self.wait_s * 2)


class KafkaPython:
    """kafka-python's KafkaProducer."""

    def __init__(self, a, timeout_ms):
        import kafka.errors
        from kafka import KafkaProducer
        from kafka.producer.transaction_manager import TransactionState

        self.errors, self.TransactionState = kafka.errors, TransactionState
        self.wait_s = timeout_ms / 1000.0
        self.p = KafkaProducer(
            bootstrap_servers=a.nodes.split(","),
            transactional_id=a.transactional_id,
            transaction_timeout_ms=timeout_ms,
            request_timeout_ms=timeout_ms,
            delivery_timeout_ms=timeout_ms * 2,
            max_block_ms=30_000,
            linger_ms=0,
            retry_backoff_ms=10,
            reconnect_backoff_ms=10,
            reconnect_backoff_max_ms=200,
        )

    def error(self, exc):
        manager = self.p._transaction_manager
        fatal = manager is not None and (
            manager._current_state == self.TransactionState.FATAL_ERROR
        )
        # INVALID_PRODUCER_EPOCH on a Produce means a newer instance took over: the Java client
        # calls that fenced (fatal); kafka-python tries an epoch bump that cannot succeed.
        fatal = fatal or isinstance(
            exc, (self.errors.ProducerFencedError, self.errors.InvalidProducerEpochError)
        )
        retriable = isinstance(exc, self.errors.KafkaError) and exc.retriable and not fatal
        return ClientError(f"{type(exc).__name__}: {exc}", fatal, retriable)

    def call(self, f, *args):
        try:
            return f(*args)
        except Exception as e:  # kafka-python raises KafkaError and IllegalStateError alike
            raise self.error(e)

    def init(self):
        self.call(self.p.init_transactions)

    def begin(self):
        self.call(self.p.begin_transaction)

    def send(self, topic, value, partition):
        meta = self.call(lambda: self.p.send(topic, value=value, partition=partition).get(self.wait_s * 3))
        return meta.partition, meta.offset

    def commit(self):
        self.call(self.p.commit_transaction)

    def abort(self):
        self.call(self.p.abort_transaction)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", choices=["librdkafka", "kafka-python"], default="librdkafka")
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
    client = (Librdkafka if a.library == "librdkafka" else KafkaPython)(a, timeout_ms)
    try:
        client.init()
    except ClientError as e:
        emit({"kind": "init_failed", "at_us": now_us(), "error": str(e)})
        return
    emit({"kind": "init_ok", "at_us": now_us(), "pid": -1, "epoch": -1})

    rng = random.Random(a.seed)
    txn = 0
    reason = "asked to stop"
    try:
        while not stop.is_set():
            one_transaction(client, a, txn, rng, stop)
            txn += 1
    except Stopped as e:
        reason = str(e)
    emit({"kind": "exit", "reason": reason})


def one_transaction(client, a, txn, rng, stop):
    try:
        client.begin()
    except ClientError as e:
        raise Stopped(f"fenced: {e}")
    emit({"kind": "begin", "txn": txn})
    failed = False
    partitions = max(a.partitions, 1)
    start = rng.randrange(partitions)
    for n in range(a.records_per_txn):
        value = f"{a.instance}/{txn}/{n}"
        partition = (start + n % partitions) % partitions
        event = {"kind": "send", "txn": txn, "value": value, "sent_us": now_us()}
        try:
            p, offset = client.send(a.topic, value.encode(), partition)
            event.update(at_us=now_us(), ok={"partition": p, "offset": offset}, error=None, fatal=False)
            emit(event)
        except ClientError as e:
            event.update(at_us=now_us(), ok=None, error=str(e), fatal=e.fatal)
            emit(event)
            if e.fatal:
                raise Stopped(f"fenced: {e}")
            failed = True
            break
    commit = not failed and rng.random() >= a.abort_ratio
    if end(client, txn, commit, stop) or not commit:
        return
    # The commit failed without being fatal: its outcome is unknown to us. Abort what the
    # client still holds open and go on.
    end(client, txn, False, stop)


def end(client, txn, commit, stop):
    """EndTxn, retried while the client calls the error retriable; True on success."""
    sent_us = now_us()
    emit({"kind": "end_start", "txn": txn, "commit": commit, "sent_us": sent_us})
    while True:
        error = None
        try:
            client.commit() if commit else client.abort()
        except ClientError as e:
            error = e
            if e.retriable and not stop.is_set():
                continue
        emit(
            {
                "kind": "end",
                "txn": txn,
                "commit": commit,
                "sent_us": sent_us,
                "at_us": now_us(),
                "error": None if error is None else str(error),
                "fatal": bool(error is not None and error.fatal),
            }
        )
        if error is None:
            return True
        if error.fatal:
            raise Stopped(f"fenced: {error}")
        if not commit and not stop.is_set():
            # An abort that failed for good leaves the producer unusable for new
            # transactions: end the instance, as an application would restart it.
            raise Stopped(f"abort failed: {error}")
        return False


if __name__ == "__main__":
    main()
