"""Hand records to the Kafka producer and wait for their delivery reports, on the event loop.

``LoopPoller`` polls the batching producer from the event loop itself, so under load a report resolves its
request's future directly — no lock, no cross-thread wake-up, no GIL hand-off per report (that hand-off was the
largest single cost per event at saturation in the profile, docs/receiver.md). The producer that sends at once,
used while the worker is lightly loaded, has a poll thread that hands each report to the loop as it comes.
Under load many requests wait for Kafka at once while librdkafka batches their records. The answer is decided by
the delivery report alone — a record is "accepted" only after the broker acknowledged it (acks=all).

``Linger`` picks the producer per request: librdkafka's ``linger.ms`` is fixed per producer, and a record
produced into an idle producer would still wait it out, so a worker has two — one that sends each record at once
(``linger.ms`` 0) while the worker is lightly loaded, and one that batches (``KE_LINGER_MS``) while it is busy,
where batching saves CPU on both sides and costs little latency beside the queueing it prevents.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
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
    """Serves the producers' callbacks on the event loop's thread (the ASGI receiver).

    While records await their reports the loop polls ``producers`` every ``busy_interval`` (so a report waits at
    most that long to be seen); otherwise every ``idle_interval``, for librdkafka's error and log callbacks.

    Each of ``threaded`` is polled by a thread of its own instead, blocked in ``poll`` until a report comes, which
    it hands to the loop at once (``AsyncPending.on_delivery``): for the producer that sends at once, whose
    reports come a fraction of a millisecond after the produce, where the next tick (libuv's timers have
    millisecond resolution) would add up to ``busy_interval``. It is used while the worker is lightly loaded, so
    the hand-off's wake-up per report does not compete with batching.
    """

    def __init__(self, producers: Sequence[Producer], loop: asyncio.AbstractEventLoop,
                 busy_interval: float = 0.001, idle_interval: float = 0.1, *,
                 threaded: Sequence[Producer] = ()) -> None:
        self.producers, self.loop = tuple(producers), loop
        self.threaded = tuple(threaded)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stops: dict[int, threading.Event] = {}  # per threaded producer (by id): its thread's own stop
        self.busy_interval, self.idle_interval = busy_interval, idle_interval
        self.outstanding = 0  # records produced whose report has not been served yet
        self.threaded_outstanding = 0  # the same for the threaded producers (their reports reach the loop later)
        self.thread_id = threading.get_ident()
        self._busy = False
        self._handle: asyncio.TimerHandle | None = None
        # Requests waiting for reports, oldest first, with their give-up times. One timeout for all, so the order
        # of arrival is the order of deadlines: the tick expires from the left, no timer per request.
        self._waiting: deque[tuple[float, AsyncPending]] = deque()

    def start(self) -> None:
        self.thread_id = threading.get_ident()
        self._handle = self.loop.call_later(self.idle_interval, self._tick)
        for producer in self.threaded:
            self._start_thread(producer)

    def _start_thread(self, producer: Producer) -> None:
        stop = self._stops[id(producer)] = threading.Event()
        thread = threading.Thread(target=self._serve, args=(producer, stop), name="producer-poll", daemon=True)
        thread.start()
        self._threads = [*(t for t in self._threads if t.is_alive()), thread]

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=1.0)
        self._threads.clear()

    def add(self, polled: Producer, threaded: Producer | None = None) -> None:
        """Another Kafka connection's producers (``receiver.connections``): ``polled`` by the tick, ``threaded``
        by a poll thread of its own, as the first connection's."""
        self.producers = (*self.producers, polled)
        if threaded is not None:
            self.threaded = (*self.threaded, threaded)
            if self._handle is not None:  # already serving: its thread starts now, else start() starts it
                self._start_thread(threaded)

    def remove(self, producers: Sequence[Producer]) -> None:
        """Stop polling ``producers`` (a connection no target names any more). Whoever closes them serves their
        last reports (``KafkaSender.close`` flushes, and the reports reach the loop from that thread)."""
        self.producers = tuple(p for p in self.producers if p not in producers)
        self.threaded = tuple(p for p in self.threaded if p not in producers)
        for producer in producers:
            stop = self._stops.pop(id(producer), None)
            if stop is not None:
                stop.set()  # its thread ends within one poll timeout; not joined on the loop

    def _serve(self, producer: Producer, stop: threading.Event) -> None:
        while not (self._stopping.is_set() or stop.is_set()):
            try:
                producer.poll(0.1)  # returns at the first report, or after 0.1 s to see _stopping
            except Exception:
                log.exception("producer poll failed")

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
        for producer in self.producers:
            try:
                producer.poll(0)
            except Exception:  # a callback bug must not stop delivery reports for everyone else
                log.exception("producer poll failed")
        # Busy only while polled records await their reports; a request waiting on a threaded producer is
        # woken by its thread, and needs the tick only to give up at its deadline.
        self._busy = self.outstanding > 0
        delay = self.busy_interval if self._busy else self.idle_interval
        waiting = self._waiting
        if waiting:
            now = self.loop.time()
            while waiting and (waiting[0][0] <= now or waiting[0][1].future.done()):
                waiting.popleft()[1].expire()
            if waiting and not self._busy:
                delay = min(delay, max(self.busy_interval, waiting[0][0] - now))
        self._handle = self.loop.call_later(delay, self._tick)


class AsyncPending:
    """Delivery state of one request's records, resolved on the event loop (see ``LoopPoller``)."""

    __slots__ = ("error", "future", "polled", "poller", "remaining")

    def __init__(self, count: int, poller: LoopPoller, polled: bool = True) -> None:
        self.remaining = count
        self.error: Any = None  # the first failed report's KafkaError
        self.poller = poller
        self.polled = polled  # the records went to a producer the loop's tick polls (counted in outstanding)
        self.future: asyncio.Future[None] = poller.loop.create_future()
        if count == 0:
            self.future.set_result(None)

    def on_delivery(self, err: Any, _msg: Any) -> None:
        if threading.get_ident() != self.poller.thread_id:
            # A threaded producer's poll thread, or the shutdown flush: the state belongs to the loop.
            self.poller.loop.call_soon_threadsafe(self.on_delivery, err, _msg)
            return
        if self.polled:
            self.poller.outstanding -= 1
        else:
            self.poller.threaded_outstanding -= 1
        if err is not None and self.error is None:
            self.error = err
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
            return _report_error(self.error)
        return DELIVERED


class Linger:
    """Which producer takes the next request: the immediate one below ``batch_above`` requests/s, else the
    batching one — and the batching one too while more than ``batch_above`` × ``BACKLOG_SECONDS`` records are
    waiting for their reports, whatever the rate.

    The rate is counted per window of ``window`` seconds (loop time) and decided at its end; the way back needs
    the rate below three quarters of ``batch_above``, so a rate near the threshold does not flip every window.
    The backlog rule is for a worker that cannot reach ``batch_above`` sending at once (a slower host): saturated
    on the immediate producer, where each record goes alone and each report is handed over by the poll thread,
    it spends more CPU per event than batching, so its rate stays below the threshold and the rate rule alone
    never switches it. Records waiting for reports is what saturation looks like at any rate: by Little's law,
    more than ``batch_above`` × 10 ms of them means answers slower than ``linger.ms`` would make them.
    A request's records all go to one producer, so a batch keeps its order; requests in flight at the same time
    have no order between them anyway, and a client that waits for its 202 before sending again finds its
    earlier event written before the next one is produced, whichever producer takes it.
    """

    __slots__ = ("backlog_above", "batch_above", "batching", "count", "started", "window")

    #: how long the records waiting for reports would take at the threshold rate, past which the worker batches
    BACKLOG_SECONDS = 0.01

    def __init__(self, batch_above: float, window: float = 0.1) -> None:
        self.batch_above, self.window = batch_above, window
        self.backlog_above = batch_above * self.BACKLOG_SECONDS
        self.batching = False
        self.count = 0
        self.started = 0.0

    def batch(self, now: float, waiting: int = 0) -> bool:
        """Count one request at ``now``; True when it should go to the batching producer. ``waiting``: the
        worker's records produced and not yet reported."""
        self.count += 1
        elapsed = now - self.started
        if elapsed >= self.window:
            rate = self.count / elapsed
            self.batching = (rate > (0.75 * self.batch_above if self.batching else self.batch_above)
                             or waiting > self.backlog_above)
            self.count, self.started = 0, now
        return self.batching


class KafkaSender:
    """Produces a request's records for the event loop's ``LoopPoller`` to collect the reports of.

    ``producer`` batches (``linger.ms`` > 0). With ``immediate`` and a ``linger``, requests go to ``immediate``
    (``linger.ms`` 0) while the rate is below the linger's threshold (``Linger``).
    """

    def __init__(self, producer: Producer, timeout: float, *, immediate: Producer | None = None,
                 linger: Linger | None = None) -> None:
        self.producer = producer
        self.immediate = immediate if linger is not None else None
        self.linger = linger
        self.producers: tuple[Producer, ...] = (producer,) if self.immediate is None else (producer, self.immediate)
        self.timeout = timeout
        self.closing = False

    def _pick(self, poller: LoopPoller) -> Producer:
        if self.immediate is None or self.linger is None or self.linger.batch(
                poller.loop.time(), poller.outstanding + poller.threaded_outstanding):
            return self.producer
        return self.immediate

    def submit_async(self, topic: str, records: Sequence[KafkaRecord], poller: LoopPoller) -> AsyncPending | Result:
        """Produce every record, in order; a Result when the request failed before any report could come."""
        if self.closing:
            return Result(Outcome.CLOSED, "receiver is shutting down")
        producer = self._pick(poller)
        polled = producer not in poller.threaded  # the poller, not the sender, knows what its tick polls
        pending = AsyncPending(len(records), poller, polled)
        if len(records) == 1:  # one event, as nearly every request: no loop, no tuple to unpack
            try:
                record = records[0]
                producer.produce(topic, record.value, record.key, headers=record.headers,
                                 on_delivery=pending.on_delivery)
            except Exception as exc:
                return _produce_error(exc)
            if polled:
                poller.outstanding += 1
                poller.kick()
            else:
                poller.threaded_outstanding += 1
            return pending
        produced = 0
        failed: Result | None = None
        for record in records:  # stop at the first failure
            try:
                producer.produce(topic, record.value, record.key, headers=record.headers,
                                 on_delivery=pending.on_delivery)
            except Exception as exc:
                failed = _produce_error(exc)
                break
            produced += 1
        # Reports are served on this thread, later: none can have counted down yet.
        if polled and produced:
            poller.outstanding += produced
            poller.kick()
        elif produced:
            poller.threaded_outstanding += produced
        return failed or pending

    def close(self, timeout: float) -> int:
        """Accept nothing new and flush what is produced (the ASGI lifespan shutdown runs this once every
        request has its answer). Returns the number of records still undelivered."""
        self.closing = True
        deadline = time.monotonic() + timeout
        left = sum(producer.flush(max(0.0, deadline - time.monotonic())) for producer in self.producers)
        if left:
            log.error("records not delivered at shutdown", extra={"records": left})
        return left


#: The error code's name for a record too large — from librdkafka's own check before sending (produce() raises)
#: or from the broker, whose topic may accept less (``max.message.bytes``) than the producer (a delivery report).
_TOO_LARGE = "MSG_SIZE_TOO_LARGE"


def _too_large() -> Result:
    return Result(Outcome.TOO_LARGE, "event is larger than the topic accepts")


def _report_error(err: Any) -> Result:
    """A failed delivery report: too large is the sender's to fix (413); anything else is worth a retry."""
    name = getattr(err, "name", None)
    if callable(name) and name() == _TOO_LARGE:
        return _too_large()
    return Result(Outcome.FAILED, str(err))


def _produce_error(exc: Exception) -> Result:
    """BufferError: librdkafka's queue is full; KafkaException: classified by its error code's name."""
    if isinstance(exc, BufferError):
        return Result(Outcome.QUEUE_FULL, "producer queue is full")
    code = ""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "name"):
        code = str(args[0].name())
    if code == _TOO_LARGE:
        return _too_large()
    return Result(Outcome.FAILED, f"produce failed: {code or type(exc).__name__}")
