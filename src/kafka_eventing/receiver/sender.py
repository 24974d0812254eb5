"""Hand records to the Kafka producer and wait for their delivery reports, on the event loop.

``LoopPoller`` polls the producer from the event loop itself, so a report resolves its request's future
directly — no lock, no cross-thread wake-up, no GIL hand-off per report (that hand-off was the largest single
cost per event in the profile, docs/receiver.md). Many requests wait for Kafka at once while librdkafka batches
their records, and the answer is decided by the delivery report alone — a record is "accepted" only after the
broker acknowledged it (acks=all).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
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


#: The common answer, made once (a frozen dataclass costs ~0.5 µs to build, per request).
DELIVERED = Result(Outcome.DELIVERED)


class LoopPoller:
    """Serves the producer's callbacks on the event loop's thread (the ASGI receiver).

    While records await their reports the loop polls every ``busy_interval`` (so a report waits at most that
    long to be seen); otherwise every ``idle_interval``, for librdkafka's error and log callbacks.
    """

    def __init__(self, producer: Producer, loop: asyncio.AbstractEventLoop,
                 busy_interval: float = 0.001, idle_interval: float = 0.1) -> None:
        self.producer, self.loop = producer, loop
        self.busy_interval, self.idle_interval = busy_interval, idle_interval
        self.outstanding = 0  # records produced whose report has not been served yet
        self.thread_id = threading.get_ident()
        self._busy = False
        self._handle: asyncio.TimerHandle | None = None
        # Requests waiting for reports, oldest first, with their give-up times. One timeout for all, so the order
        # of arrival is the order of deadlines: the tick expires from the left, no timer per request.
        self._waiting: deque[tuple[float, AsyncPending]] = deque()

    def start(self) -> None:
        self.thread_id = threading.get_ident()
        self._handle = self.loop.call_later(self.idle_interval, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def kick(self) -> None:
        """Records were just produced: poll soon."""
        if not self._busy:
            self._busy = True
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self.loop.call_later(self.busy_interval, self._tick)

    def expire_at(self, pending: AsyncPending, deadline: float) -> None:
        """Wake ``pending`` at ``deadline`` (loop time) if its reports are not all in by then."""
        self._waiting.append((deadline, pending))

    def _tick(self) -> None:
        try:
            self.producer.poll(0)
        except Exception:  # a callback bug must not stop delivery reports for everyone else
            log.exception("producer poll failed")
        waiting = self._waiting
        if waiting:
            now = self.loop.time()
            while waiting and (waiting[0][0] <= now or waiting[0][1].future.done()):
                waiting.popleft()[1].expire()
        self._busy = self.outstanding > 0 or bool(waiting)
        self._handle = self.loop.call_later(self.busy_interval if self._busy else self.idle_interval, self._tick)


class AsyncPending:
    """Delivery state of one request's records, resolved on the event loop (see ``LoopPoller``)."""

    __slots__ = ("error", "future", "poller", "remaining")

    def __init__(self, count: int, poller: LoopPoller) -> None:
        self.remaining = count
        self.error: str | None = None
        self.poller = poller
        self.future: asyncio.Future[None] = poller.loop.create_future()
        if count == 0:
            self.future.set_result(None)

    def on_delivery(self, err: Any, _msg: Any) -> None:
        if threading.get_ident() != self.poller.thread_id:
            # Only the shutdown flush serves reports from another thread.
            self.poller.loop.call_soon_threadsafe(self.on_delivery, err, _msg)
            return
        self.poller.outstanding -= 1
        if err is not None and self.error is None:
            self.error = str(err)
        self.remaining -= 1
        if self.remaining <= 0:
            self.expire()

    def expire(self) -> None:
        """Wake the request: every report is in, or it waited long enough (``remaining`` tells which)."""
        if not self.future.done():
            self.future.set_result(None)

    def result(self) -> Result:
        if self.remaining > 0:
            return Result(Outcome.TIMEOUT, "no delivery report in time")
        if self.error is not None:
            return Result(Outcome.FAILED, self.error)
        return DELIVERED


class KafkaSender:
    """Produces a request's records for the event loop's ``LoopPoller`` to collect the reports of."""

    def __init__(self, producer: Producer, timeout: float) -> None:
        self.producer = producer
        self.timeout = timeout
        self.closing = False

    def submit_async(self, topic: str, records: Sequence[KafkaRecord], poller: LoopPoller) -> AsyncPending | Result:
        """Produce every record, in order; a Result when the request failed before any report could come."""
        if self.closing:
            return Result(Outcome.CLOSED, "receiver is shutting down")
        pending = AsyncPending(len(records), poller)
        if len(records) == 1:  # one event, as nearly every request: no loop, no tuple to unpack
            try:
                record = records[0]
                self.producer.produce(topic, record.value, record.key, headers=record.headers,
                                      on_delivery=pending.on_delivery)
            except Exception as exc:
                return _produce_error(exc)
            poller.outstanding += 1
            poller.kick()
            return pending
        produced = 0
        failed: Result | None = None
        for record in records:  # stop at the first failure
            try:
                self.producer.produce(topic, record.value, record.key, headers=record.headers,
                                      on_delivery=pending.on_delivery)
            except Exception as exc:
                failed = _produce_error(exc)
                break
            produced += 1
        # Reports are served on this thread, later: none can have counted down yet.
        poller.outstanding += produced
        if produced:
            poller.kick()
        return failed or pending

    def close(self, timeout: float) -> int:
        """Accept nothing new and flush what is produced (the ASGI lifespan shutdown runs this once every
        request has its answer). Returns the number of records still undelivered."""
        self.closing = True
        left = self.producer.flush(timeout)
        if left:
            log.error("records not delivered at shutdown", extra={"records": left})
        return left


def _produce_error(exc: Exception) -> Result:
    """BufferError: librdkafka's queue is full; KafkaException: classified by its error code's name."""
    if isinstance(exc, BufferError):
        return Result(Outcome.QUEUE_FULL, "producer queue is full")
    code = ""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "name"):
        code = str(args[0].name())
    if code == "MSG_SIZE_TOO_LARGE":
        return Result(Outcome.TOO_LARGE, "event is larger than the topic accepts")
    return Result(Outcome.FAILED, f"produce failed: {code or type(exc).__name__}")
