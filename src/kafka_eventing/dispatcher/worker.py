"""What one subscriber does with the records of its partitions, whoever feeds them: pace them (its rate limit, its
in-flight and byte budgets, its order), deliver each through the shared ``Deliverer`` (retries, replies, dead
letters), and track what may be committed.

Written once for both feeds: a KafkaChannel's subscription reads with its own consumer
(``subscription.SubscriptionConsumer``); a Broker's Trigger is offered records of the shared read
(``lane.TriggerLane``). Each adapter says how big a queued item is, where its offset is, whether the subscriber wants
it at delivery time, how it is sent, and what happens when a commit position moves or a delivery ends.

Everything here runs on the dispatcher's event loop (no locks).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Generic, TypeVar

from confluent_kafka import TopicPartition

from kafka_eventing.core.channels import Subscriber
from kafka_eventing.dispatcher.delivery import AttemptCount, Deliverer, Outcome
from kafka_eventing.dispatcher.flow import FlowControl, bucket_for
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.ordered import OrderedScheduler
from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.rebalance import attempts_from, commit_point
from kafka_eventing.dispatcher.scheduler import MAX_OUTSTANDING, Scheduler
from kafka_eventing.dispatcher.unordered import UnorderedScheduler

log = logging.getLogger(__name__)

Item = TypeVar("Item")


def scheduler_for(subscriber: Subscriber, max_in_flight: int, max_outstanding: int = MAX_OUTSTANDING) -> Scheduler:
    kind = OrderedScheduler if subscriber.ordered else UnorderedScheduler
    return kind(max_in_flight, max_outstanding)


class PartitionWorker(Generic[Item]):
    """One subscriber's partitions on this replica: their queues (of ``Item``), deliveries and commit marks."""

    def __init__(
        self,
        topic: str,
        subscriber: Subscriber,
        labels: Labels,
        *,
        group_id: str,
        deliverer: Deliverer,
        metrics: Metrics,
        max_in_flight: int,
        queue_bytes: int,
        max_outstanding: int = MAX_OUTSTANDING,
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self.labels = labels
        self.max_in_flight = max(1, max_in_flight)
        self._max_outstanding = max_outstanding
        self._subscriber = subscriber
        self.scheduler = scheduler_for(subscriber, self.max_in_flight, max_outstanding)
        self.flow = FlowControl(queue_bytes)
        self._bucket = bucket_for(subscriber.rate_limit)
        self._rate_timer: asyncio.TimerHandle | None = None
        self._deliverer = deliverer
        self._metrics = metrics
        self.parts: dict[int, Partition] = {}
        self.in_flight = 0
        self.stopping = False
        # Read when scraped instead of two updates per event; a replacement of the same subscriber takes the gauge
        # over.
        metrics.in_flight.labels(*labels).set_function(lambda: self.in_flight)
        self._outcomes = {o: metrics.outcomes.labels(*labels, o.value) for o in Outcome}
        self._filtered = metrics.filtered.labels(*labels)

    # -- what an adapter says -----------------------------------------------------------------------
    def _size(self, item: Item) -> int:
        raise NotImplementedError

    def _offset(self, item: Item) -> int:
        raise NotImplementedError

    async def _send(self, item: Item, count: AttemptCount) -> Outcome:
        """Deliver, reply or dead-letter the event (``Deliverer.handle``)."""
        raise NotImplementedError

    def _wants(self, item: Item) -> bool:
        """Whether the subscriber wants the event (a rejected one is done without a delivery)."""
        return True

    def _may_start(self) -> bool:
        return True

    def _started(self, size: int) -> None:
        """``size`` bytes left the queues for a delivery."""

    def _moved(self, part: Partition, position: int) -> None:
        """``part``'s commit position moved to ``position``."""

    def _delivered(self, part: Partition) -> None:
        """A delivery of ``part`` ended and was counted."""

    def _updated(self, subscriber: Subscriber) -> None:
        """The subscriber changed (before the next pump)."""

    def _forget(self, number: int) -> None:
        """Partition ``number`` is being released."""

    # -- the subscriber -----------------------------------------------------------------------------
    @property
    def subscriber(self) -> Subscriber:
        return self._subscriber

    @property
    def ordered(self) -> bool:
        return self.scheduler.ordered

    def update(self, subscriber: Subscriber) -> None:
        """A changed delivery spec, URI, order or rate limit applies to the next event started, without a
        restart."""
        self._subscriber = subscriber
        if subscriber.ordered != self.scheduler.ordered:
            self.scheduler = scheduler_for(subscriber, self.max_in_flight, self._max_outstanding)
        self._bucket = bucket_for(subscriber.rate_limit, self._bucket)
        self.flow.resize(self.parts.values(), self.scheduler)
        self._updated(subscriber)
        self.pump()

    # -- partitions ---------------------------------------------------------------------------------
    def _new_partition(self, number: int, start: int, metadata: str | None) -> Partition:
        """Own ``number`` from offset ``start``, with the attempts another owner recorded in the commit's
        ``metadata`` for offsets from there on (see ``rebalance.commit_point``)."""
        child = self._metrics.consumed.labels(self.group_id, str(number), self.topic)
        part = self.parts[number] = Partition(number, child, TopicPartition(self.topic, number))
        part.attempts = {o: AttemptCount(n) for o, n in attempts_from(metadata).items() if o >= start}
        return part

    def _release(self, numbers: list[int]) -> list[TopicPartition]:
        """Forget the partitions (their deliveries cancelled); the marks that may be committed for them."""
        done = []
        for number in numbers:
            self._forget(number)
            part = self.parts.pop(number, None)
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

    # -- delivery -----------------------------------------------------------------------------------
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
        if self.stopping or not self._may_start():
            return
        self.scheduler.pump(self.parts.values(), self.in_flight, self._rate_ok, self._start)

    def _start(self, part: Partition, item: Any) -> None:
        size = self._size(item)
        part.queued_bytes -= size
        self._started(size)
        part.in_flight += 1
        self.in_flight += 1
        task = asyncio.get_running_loop().create_task(self._deliver(part, item))
        part.tasks.add(task)
        task.add_done_callback(part.tasks.discard)

    async def _deliver(self, part: Partition, item: Item) -> None:
        offset = self._offset(item)
        if self._wants(item):
            count = part.attempts.get(offset)
            if count is None:
                count = part.attempts[offset] = AttemptCount()
            self._outcomes[await self._handle(item, count)].inc()
            part.attempts.pop(offset, None)
        else:
            self._filtered.inc()
        if self.parts.get(part.number) is not part:
            return  # released meanwhile; the new owner redelivers from the committed offset
        part.in_flight -= 1
        self.in_flight -= 1
        position = part.tracker.done(offset)
        if position is not None:
            self._moved(part, position)
        self.pump()
        self._delivered(part)

    async def _handle(self, item: Item, count: AttemptCount) -> Outcome:
        """Deliver, reply or dead-letter the event: returns only once its offset may be committed."""
        failures = 0
        while True:
            try:
                return await self._send(item, count)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug, not a delivery failure: never commit past it; try again after a pause.
                failures += 1
                log.exception("dispatching failed unexpectedly, will retry", extra=self.labels.as_dict())
                await asyncio.sleep(min(30.0, 0.1 * 2**failures))

    async def _finish(self, grace: float) -> list[TopicPartition]:
        """Let the in-flight deliveries finish (bounded by ``grace``), cancel the rest; the marks to commit."""
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
