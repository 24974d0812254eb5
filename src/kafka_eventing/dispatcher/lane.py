"""One Trigger of a Broker's fan-out: what it holds per partition, which events it starts, what it may commit.

The Broker's dispatcher reads each record once (``fanout.SharedReader``) and offers it to every Trigger's lane.
A lane runs the Trigger's compiled filter on the record's attributes, decoded once for all lanes (``Record``): a
record the filter rejects moves the lane's offset mark without being queued; a match joins the lane's
per-partition queue, from which the Trigger's scheduler (ordered or unordered, the channel dispatcher's) starts
deliveries through the shared ``Deliverer`` (retries, dead letters, replies). Each lane has its own in-flight
budget, byte budget, offset trackers and rate limit, so its progress is its own; only its intake is shared.

A partition of a lane is either *attached* (fed by the shared reader) or *behind* (fed by the lane's own catch-up
consumer, from the lane's own position): see ``fanout.py`` for when a lane falls behind and rejoins.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import Message, TopicPartition

from kafka_eventing.broker.filters import RecordFilter, record_attributes
from kafka_eventing.core.binding import BindingError
from kafka_eventing.core.channels import Subscriber
from kafka_eventing.core.transcode import kafka_to_http
from kafka_eventing.dispatcher.delivery import AttemptCount, Deliverer, Outcome
from kafka_eventing.dispatcher.flow import FlowControl, bucket_for
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.rebalance import attempts_from, commit_point
from kafka_eventing.dispatcher.scheduler import MAX_OUTSTANDING
from kafka_eventing.dispatcher.subscription import scheduler_for

log = logging.getLogger(__name__)

_Headers = list[tuple[str, bytes | str | None]] | None


class Record:
    """A record as the fan-out hands it to every lane: its attributes (for filters) and its HTTP head and body
    (for deliveries) decoded at most once, and only if some lane needs them."""

    __slots__ = ("_attributes", "_error", "_http", "message", "offset", "partition", "size")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.partition = cast(int, message.partition())
        self.offset = cast(int, message.offset())
        self.size = len(message.value() or b"")
        self._attributes: dict[str, object] | None = None
        self._http: tuple[dict[str, str], bytes] | None = None
        self._error: BindingError | None = None

    def attributes(self) -> dict[str, object]:
        if self._attributes is None:
            self._attributes = record_attributes(cast(_Headers, self.message.headers()), self.message.value())
        return self._attributes

    def http(self) -> tuple[dict[str, str], bytes]:
        """``kafka_to_http`` of the record, once; its ``BindingError`` is raised again for every lane."""
        if self._http is None:
            if self._error is not None:
                raise self._error
            try:
                self._http = kafka_to_http(cast(_Headers, self.message.headers()), self.message.value(), trace=True)
            except BindingError as exc:
                self._error = exc
                raise
        return self._http


def matcher(subscriber: Subscriber) -> Callable[[Record], bool] | None:
    """The subscriber's filter over a ``Record`` (None: every event); a compiled Trigger filter reads the
    record's shared attributes instead of decoding them again."""
    flt = subscriber.event_filter
    if flt is None:
        return None
    if isinstance(flt, RecordFilter):
        matches = flt.compiled.matches
        return lambda record: matches(record.attributes())
    return lambda record: flt(record.message)


class TriggerLane:
    """One Trigger's share of the fan-out on this replica."""

    def __init__(
        self,
        topic: str,
        namespace: str,
        broker: str,
        subscriber: Subscriber,
        *,
        group_id: str,
        deliverer: Deliverer,
        metrics: Metrics,
        max_in_flight: int,
        queue_bytes: int,
        max_outstanding: int = MAX_OUTSTANDING,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self.labels = Labels(namespace, broker, subscriber.uid)
        self.max_in_flight = max(1, max_in_flight)
        self._max_outstanding = max_outstanding
        self._subscriber = subscriber
        self._match = matcher(subscriber)
        self.scheduler = scheduler_for(subscriber, self.max_in_flight, max_outstanding)
        self.flow = FlowControl(queue_bytes)
        self._bucket = bucket_for(subscriber.rate_limit)
        self._rate_timer: asyncio.TimerHandle | None = None
        self._deliverer = deliverer
        self._metrics = metrics
        #: Called when room frees up (a reader waiting on this lane's budget may take more now).
        self.wake = wake
        self.clock = clock
        self.parts: dict[int, Partition] = {}
        #: Partitions fed by this lane's own catch-up consumer instead of the shared reader.
        self.behind: set[int] = set()
        self.in_flight = 0
        self.stopping = False
        #: Since when this lane has held the shared reader back (None: it does not).
        self.blocked_since: float | None = None
        #: Partitions whose commit position moved since the last commit.
        self.moved: set[int] = set()
        self._outcomes = {o: metrics.outcomes.labels(*self.labels, o.value) for o in Outcome}
        self._filtered = metrics.filtered.labels(*self.labels)
        metrics.in_flight.labels(*self.labels).set_function(lambda: self.in_flight)

    # -- the Trigger ------------------------------------------------------------------------------
    @property
    def subscriber(self) -> Subscriber:
        return self._subscriber

    @property
    def ordered(self) -> bool:
        return self.scheduler.ordered

    def update(self, subscriber: Subscriber) -> None:
        """A changed filter applies from the next record offered; delivery, URI, order and rate limit from the
        next event started."""
        self._subscriber = subscriber
        self._match = matcher(subscriber)
        if subscriber.ordered != self.scheduler.ordered:
            self.scheduler = scheduler_for(subscriber, self.max_in_flight, self._max_outstanding)
        self._bucket = bucket_for(subscriber.rate_limit, self._bucket)
        self.flow.resize(self.parts.values(), self.scheduler)
        self.pump()

    # -- partitions -------------------------------------------------------------------------------
    def add_partition(self, number: int, start: int, metadata: str | None = None, *, behind: bool = False) -> None:
        """Own ``number`` from ``start`` (this Trigger's committed position); ``behind``: fed by catch-up."""
        child = self._metrics.consumed.labels(self.group_id, str(number), self.topic)
        part = self.parts[number] = Partition(number, child, TopicPartition(self.topic, number))
        part.tracker.start_at(start)
        part.attempts = {o: AttemptCount(n) for o, n in attempts_from(metadata).items() if o >= start}
        if behind:
            self.behind.add(number)
        else:
            self.behind.discard(number)
        self.flow.resize(self.parts.values(), self.scheduler)

    def release(self, numbers: list[int]) -> list[TopicPartition]:
        """Forget the partitions (their deliveries cancelled); the marks that may be committed for them."""
        done = []
        for number in numbers:
            part = self.parts.pop(number, None)
            self.behind.discard(number)
            self.moved.discard(number)
            if part is None:
                continue
            self.in_flight -= part.in_flight
            for task in list(part.tasks):
                task.cancel()
            point = commit_point(self.topic, part)
            if point is not None:
                done.append(point)
        self.flow.resize(self.parts.values(), self.scheduler)
        return done

    def position(self, number: int) -> int:
        """The next offset this lane wants for the partition."""
        return self.parts[number].tracker.last + 1

    def attached(self) -> list[Partition]:
        return [p for n, p in self.parts.items() if n not in self.behind]

    def behind_parts(self) -> list[Partition]:
        return [self.parts[n] for n in self.behind if n in self.parts]

    # -- intake -----------------------------------------------------------------------------------
    def offer(self, record: Record) -> None:
        """A record of one of this lane's partitions: queued if the filter accepts it, else done at once."""
        part = self.parts.get(record.partition)
        if part is None:
            return  # released between the fetch and now
        part.received += 1
        match = self._match
        if match is not None and not match(record):
            if part.tracker.skip(record.offset) is not None:
                self.moved.add(part.number)
            self._filtered.inc()
            return
        if not part.tracker.add(record.offset):
            return  # below this Trigger's position (another lane started the shared read earlier)
        part.queue.append(cast(Message, record))  # the schedulers only move the items: Records here
        part.queued_bytes += record.size
        self.flow.taken(record.size)

    def count_consumed(self) -> None:
        for part in self.parts.values():
            if part.received:  # one counter update per partition and round, not per record
                part.consumed.inc(part.received)
                part.received = 0

    def room(self, parts: list[Partition]) -> tuple[int, bool]:
        """Records this lane can take into ``parts`` now, and whether its budget is full."""
        return self.flow.room(parts, self.scheduler)

    def wants_paused(self, part: Partition, queued: int) -> bool:
        """Whether ``part`` should stop being fed (by the scheduler's rules), updating its ``paused`` flag;
        ``queued``: the bytes the partitions fed alike (attached, or behind) hold."""
        if not part.paused and self.scheduler.must_pause(part, queued, self.flow.queue_bytes, self.flow.byte_cap):
            part.paused = True
        elif part.paused and self.scheduler.may_resume(part, queued, self.flow.queue_bytes, self.flow.byte_cap):
            part.paused = False
        return part.paused

    # -- delivery ---------------------------------------------------------------------------------
    def _rate_ok(self) -> bool:
        if self._bucket is None:
            return True
        wait = self._bucket.take()
        if wait == 0.0:
            return True
        if self._rate_timer is None:
            self._rate_timer = asyncio.get_running_loop().call_later(wait, self._rate_wakeup)
        return False

    def _rate_wakeup(self) -> None:
        self._rate_timer = None
        self.pump()

    def pump(self) -> None:
        if self.stopping:
            return
        self.scheduler.pump(self.parts.values(), self.in_flight, self._rate_ok, self._start)

    def _start(self, part: Partition, message: Message) -> None:
        record = cast(Record, message)
        part.queued_bytes -= record.size
        part.in_flight += 1
        self.in_flight += 1
        task = asyncio.get_running_loop().create_task(self._deliver(part, record))
        part.tasks.add(task)
        task.add_done_callback(part.tasks.discard)

    async def _deliver(self, part: Partition, record: Record) -> None:
        offset = record.offset
        count = part.attempts.get(offset)
        if count is None:
            count = part.attempts[offset] = AttemptCount()
        self._outcomes[await self._handle(record, count)].inc()
        part.attempts.pop(offset, None)
        if self.parts.get(part.number) is not part:
            return  # released meanwhile; the new owner redelivers from the committed offset
        part.in_flight -= 1
        self.in_flight -= 1
        if part.tracker.done(offset) is not None:
            self.moved.add(part.number)
        self.pump()
        self.wake()

    async def _handle(self, record: Record, count: AttemptCount) -> Outcome:
        """Deliver, reply or dead-letter the event: returns only once its offset may be committed."""
        failures = 0
        message = record.message
        while True:
            try:
                return await self._deliverer.handle(
                    cast(_Headers, message.headers()), message.value(), self._subscriber, self.labels, count,
                    record=message, decoded=record.http)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug, not a delivery failure: never commit past it; try again after a pause.
                failures += 1
                log.exception("dispatching failed unexpectedly, will retry", extra=self.labels.as_dict())
                await asyncio.sleep(min(30.0, 0.1 * 2**failures))

    # -- commits ----------------------------------------------------------------------------------
    def take_moved(self) -> list[TopicPartition]:
        """The commit positions that moved since the last call."""
        out = []
        for number in self.moved:
            part = self.parts.get(number)
            if part is not None and part.tracker.commit_position is not None:
                out.append(TopicPartition(self.topic, number, part.tracker.commit_position))
        self.moved.clear()
        return out

    async def drain(self, grace: float) -> list[TopicPartition]:
        """Stop starting events, let the in-flight ones finish (bounded), then the marks to commit."""
        self.stopping = True
        if self._rate_timer is not None:
            self._rate_timer.cancel()
        tasks = [t for p in self.parts.values() for t in p.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        points = []
        for part in self.parts.values():
            for task in list(part.tasks):
                task.cancel()
            point = commit_point(self.topic, part)
            if point is not None:
                points.append(point)
        return points

    def stats(self) -> dict[str, Any]:
        partitions = {p.number: {"queued": len(p.queue), "in_flight": p.in_flight, "behind": p.number in self.behind,
                                 "outstanding": p.tracker.outstanding, "committable": p.tracker.commit_position}
                      for p in self.parts.values()}
        return {"group": self.group_id, "ordered": self.ordered, "in_flight": self.in_flight,
                "behind": bool(self.behind), "partitions": partitions}
