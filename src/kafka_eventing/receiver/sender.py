"""Hand records to the Kafka producer and wait for their delivery reports.

One background thread serves the producer's callbacks (``poll``), so a request thread only produces and then
waits on its own event: many requests wait for Kafka at once while librdkafka batches their records. The answer
is decided by the delivery report alone — a record is "accepted" only after the broker acknowledged it (acks=all).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_eventing.core.binding import KafkaRecord

log = logging.getLogger(__name__)


class Producer(Protocol):
    """The part of ``confluent_kafka.Producer`` the receiver uses (tests pass a fake)."""

    def produce(self, topic: str, value: bytes | None = ..., key: bytes | None = ..., *,
                headers: Any = ..., on_delivery: Callable[[Any, Any], None] | None = ...) -> None: ...
    def poll(self, timeout: float = ...) -> int: ...
    def flush(self, timeout: float = ...) -> int: ...
    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    FAILED = "failed"  # the broker or librdkafka reported an error for at least one record
    TIMEOUT = "timeout"  # no report in time: the record may still land, so the client must retry (503)
    QUEUE_FULL = "queue_full"  # BufferError: librdkafka's local queue is full
    TOO_LARGE = "too_large"  # bigger than message.max.bytes
    CLOSED = "closed"  # shutting down: accept nothing new


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.DELIVERED


class Pending:
    """Delivery state of one request's records (one event, or every event of a batch)."""

    __slots__ = ("_callbacks", "_done", "_lock", "error", "remaining")

    def __init__(self, count: int) -> None:
        self.remaining = count
        self.error: str | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        if count == 0:
            self._done.set()

    def on_delivery(self, err: Any, _msg: Any) -> None:
        with self._lock:
            if err is not None and self.error is None:
                self.error = str(err)
            self.remaining -= 1
            if self.remaining > 0:
                return
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (in the poll thread) once every report is in — the hook an async server needs."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def result(self) -> Result:
        if not self._done.is_set():
            return Result(Outcome.TIMEOUT, "no delivery report in time")
        if self.error is not None:
            return Result(Outcome.FAILED, self.error)
        return Result(Outcome.DELIVERED)


class KafkaSender:
    """Owns the poll thread; ``send`` produces a request's records and blocks until all are reported."""

    def __init__(self, producer: Producer, timeout: float, poll_interval: float = 0.1) -> None:
        self.producer = producer
        self.timeout = timeout
        self.poll_interval = poll_interval
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll_loop, name="kafka-poll", daemon=True)
            self._thread.start()

    def _poll_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self.producer.poll(self.poll_interval)
            except Exception:  # a callback bug must not stop delivery reports for everyone else
                log.exception("producer poll failed")

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def submit(self, topic: str, records: Sequence[KafkaRecord]) -> Pending | Result:
        """Produce every record; a Result when the request failed before any report could come."""
        if self._closing.is_set():
            return Result(Outcome.CLOSED, "receiver is shutting down")
        pending = Pending(len(records))
        for record in records:
            try:
                self.producer.produce(topic, record.value, record.key, headers=record.headers,
                                      on_delivery=pending.on_delivery)
            except BufferError:
                return Result(Outcome.QUEUE_FULL, "producer queue is full")
            except Exception as exc:  # KafkaException from confluent_kafka: classify by its error code name
                return _produce_error(exc)
        return pending

    @contextlib.contextmanager
    def tracked(self) -> Iterator[None]:
        """Count a request as in flight, so close() waits for its answer before flushing."""
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    def send(self, topic: str, records: Sequence[KafkaRecord]) -> Result:
        with self.tracked():
            pending = self.submit(topic, records)
            if isinstance(pending, Result):
                return pending
            pending.wait(self.timeout)
            return pending.result()

    def close(self, timeout: float) -> int:
        """Accept nothing new, let in-flight requests get their reports, flush, stop polling.

        Returns the number of records still undelivered (their requests got no 202).
        """
        self._closing.set()
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        left = self.producer.flush(max(0.0, deadline - time.monotonic()))
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(self.poll_interval + 1.0)
        if left:
            log.error("records not delivered at shutdown", extra={"records": left})
        return left


def _produce_error(exc: Exception) -> Result:
    code = ""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "name"):
        code = str(args[0].name())
    if code == "MSG_SIZE_TOO_LARGE":
        return Result(Outcome.TOO_LARGE, "event is larger than the topic accepts")
    return Result(Outcome.FAILED, f"produce failed: {code or type(exc).__name__}")
