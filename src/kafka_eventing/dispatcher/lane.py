"""One Trigger of a Broker's fan-out: what it holds per partition, which events it starts, what it may commit.

The Broker's dispatcher reads each record once (``fanout.SharedReader``) and offers it to every Trigger's lane.
A lane runs the Trigger's compiled filter on the record's attributes, decoded once for all lanes (``Record``): a
record the filter rejects moves the lane's offset mark without being queued; a match joins the lane's
per-partition queue, from which the Trigger's scheduler (ordered or unordered, the channel dispatcher's) starts
deliveries through the shared ``Deliverer`` (retries, dead letters, replies): the pacing and delivery are
``worker.PartitionWorker``'s, as for a channel's subscription. Each lane has its own in-flight budget, byte budget,
offset trackers and rate limit, so its progress is its own; only its intake is shared.

A partition of a lane is either *attached* (fed by the shared reader) or *behind* (fed by the lane's own catch-up
consumer, from the lane's own position): see ``fanout.py`` and ``catchup.py`` for when a lane falls behind and rejoins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import Message, TopicPartition

from kafka_eventing.broker.filters import RecordFilter, record_attributes
from kafka_eventing.core.binding import BindingError
from kafka_eventing.core.channels import Subscriber
from kafka_eventing.core.transcode import kafka_to_http
from kafka_eventing.dispatcher.delivery import AttemptCount, Deliverer, Outcome
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.scheduler import MAX_OUTSTANDING
from kafka_eventing.dispatcher.worker import PartitionWorker

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


class TriggerLane(PartitionWorker[Record]):
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
        super().__init__(topic, subscriber, Labels(namespace, broker, subscriber.uid), group_id=group_id,
                         deliverer=deliverer, metrics=metrics, max_in_flight=max_in_flight, queue_bytes=queue_bytes,
                         max_outstanding=max_outstanding)
        self._match = matcher(subscriber)
        #: Called when room frees up (a reader waiting on this lane's budget may take more now).
        self.wake = wake
        self.clock = clock
        #: Partitions fed by this lane's own catch-up consumer instead of the shared reader.
        self.behind: set[int] = set()
        #: Since when this lane has held the shared reader back (None: it does not).
        self.blocked_since: float | None = None
        #: Partitions whose commit position moved since the last commit.
        self.moved: set[int] = set()

    # -- the worker's adapter ---------------------------------------------------------------------
    def _size(self, item: Record) -> int:
        return item.size

    def _offset(self, item: Record) -> int:
        return item.offset

    async def _send(self, item: Record, count: AttemptCount) -> Outcome:
        message = item.message
        return await self._deliverer.handle(cast(_Headers, message.headers()), message.value(), self._subscriber,
                                            self.labels, count, record=message, decoded=item.http)

    def _moved(self, part: Partition, position: int) -> None:
        self.moved.add(part.number)

    def _delivered(self, part: Partition) -> None:
        self.wake()

    def _updated(self, subscriber: Subscriber) -> None:
        """A changed filter applies from the next record offered."""
        self._match = matcher(subscriber)

    def _forget(self, number: int) -> None:
        self.behind.discard(number)
        self.moved.discard(number)

    # -- partitions -------------------------------------------------------------------------------
    def add_partition(self, number: int, start: int, metadata: str | None = None, *, behind: bool = False) -> None:
        """Own ``number`` from ``start`` (this Trigger's committed position); ``behind``: fed by catch-up."""
        self._new_partition(number, start, metadata).tracker.start_at(start)
        if behind:
            self.behind.add(number)
        else:
            self.behind.discard(number)
        self.flow.resize(self.parts.values(), self.scheduler)

    def release(self, numbers: list[int]) -> list[TopicPartition]:
        """Forget the partitions (their deliveries cancelled); the marks that may be committed for them."""
        return self._release(numbers)

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
        return await self._finish(grace)

    def stats(self) -> dict[str, Any]:
        partitions = {p.number: {"queued": len(p.queue), "in_flight": p.in_flight, "behind": p.number in self.behind,
                                 "outstanding": p.tracker.outstanding, "committable": p.tracker.commit_position}
                      for p in self.parts.values()}
        return {"group": self.group_id, "ordered": self.ordered, "in_flight": self.in_flight,
                "behind": bool(self.behind), "partitions": partitions}
