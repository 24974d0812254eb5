"""Flow control of one subscription: how many records to take from librdkafka, which partitions to pause,
and the events-per-second limit.

Python takes from librdkafka only as many records as the local queues have room for, so it never holds more
than the byte budget (``queue_bytes``); the per-partition rules that differ between ordered and unordered
delivery come from the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from confluent_kafka import KafkaException

from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.scheduler import Scheduler

log = logging.getLogger(__name__)

#: Per-partition local queue in bytes when no budget is given (see FlowControl.queue_bytes).
DEFAULT_QUEUE_BYTES = 256 * 1024
#: Most records taken from librdkafka in one poll.
CONSUME_BATCH = 500


class TokenBucket:
    """Events-per-second limit with a burst of one second's worth (at least one event)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.clock = clock
        self.stamp = clock()

    def take(self) -> float:
        """Take a token: 0.0 if granted, else the seconds until one is available."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def bucket_for(rate: float | None, current: TokenBucket | None = None) -> TokenBucket | None:
    """The bucket for ``rate`` events per second (None: unlimited). An unchanged rate keeps ``current``, so a
    change to anything else (URI, retries, filter) does not refill the burst."""
    if not rate:
        return None
    if current is not None and current.rate == rate:
        return current
    return TokenBucket(rate)


class FlowControl:
    """The byte budget of one subscription's local queues (all partitions together)."""

    def __init__(self, queue_bytes: int) -> None:
        #: Bytes of record values this subscription may hold in its local queues (all partitions together).
        self.queue_bytes = queue_bytes
        #: Bytes one open partition may hold (set by ``resize``).
        self.byte_cap = DEFAULT_QUEUE_BYTES
        self._avg_size = 1024.0  # running mean of record sizes, to turn free bytes into a record count

    def taken(self, size: int) -> None:
        """A record of ``size`` bytes entered a local queue."""
        self._avg_size += (size - self._avg_size) * 0.05

    @staticmethod
    def queued(parts: Collection[Partition]) -> int:
        return sum(p.queued_bytes for p in parts)

    def resize(self, parts: Collection[Partition], scheduler: Scheduler) -> None:
        """Local queue length per partition: enough to hide the poll interval, small enough for flat RSS."""
        count = max(1, len(parts))
        cap = scheduler.record_cap(count)
        self.byte_cap = scheduler.byte_cap(self.queue_bytes // count)
        for part in parts:
            part.cap = cap
        scheduler.assigned(parts)

    def room(self, parts: Collection[Partition], scheduler: Scheduler) -> tuple[int, bool]:
        """How many records to take now: the free local queue space, so Python never holds more than the budget.

        Ordered, each partition has its own share of the byte budget; unordered, the partitions share it: while
        it is full, records wait in librdkafka's own (bounded) prefetch instead of being dropped by a pause. At
        least one: polling must go on for rebalance callbacks and ``max.poll.interval.ms``; the flag says the
        budget is full.
        """
        records = 0
        queued = 0
        open_free = 0
        for p in parts:
            queued += p.queued_bytes
            if not p.paused:
                records += max(0, p.cap - len(p.queue))
                open_free += max(0, self.byte_cap - p.queued_bytes)
        free_bytes = min(open_free, max(0, self.queue_bytes - queued)) if scheduler.shares_budget else open_free
        free = min(records, int(free_bytes / max(1.0, self._avg_size)))
        return max(1, min(CONSUME_BATCH, free)), free < 1

    def may_resume(self, part: Partition, parts: Collection[Partition], scheduler: Scheduler) -> bool:
        return scheduler.may_resume(part, self.queued(parts), self.queue_bytes, self.byte_cap)

    def apply(self, consumer: Any, parts: Collection[Partition], scheduler: Scheduler,
              labels: dict[str, str]) -> None:
        """Pause the partitions the scheduler's rules say are full; resume those with room again."""
        pause, resume = [], []
        queued = self.queued(parts)
        for part in parts:
            if not part.paused and scheduler.must_pause(part, queued, self.queue_bytes, self.byte_cap):
                part.paused = True
                pause.append(part.tp)
            elif part.paused and scheduler.may_resume(part, queued, self.queue_bytes, self.byte_cap):
                part.paused = False
                resume.append(part.tp)
        try:
            if pause:
                consumer.pause(pause)
            if resume:
                consumer.resume(resume)
        except KafkaException as exc:
            log.warning("pause/resume failed", extra={**labels, "error": str(exc)})

    def hungry(self, consumer: Any, parts: Collection[Partition]) -> bool:
        """The local queues run low while an open partition has records at the broker past the last one seen.

        That is a fetch under way (or a refetch after a resume: pausing dropped the partition's prefetched
        records), not an idle topic, so records are polled for every millisecond instead of after the idle
        back-off. Uses the watermarks librdkafka cached from its last fetch responses (no request).
        """
        if self.queued(parts) > self.queue_bytes // 2:
            return False  # plenty left to deliver: the normal back-off notices new records in time
        for part in parts:
            last = part.tracker.last
            if part.paused or last < 0:
                continue
            try:
                _low, high = consumer.get_watermark_offsets(part.tp, cached=True)
            except KafkaException:
                continue
            if high > last + 1:
                return True
        return False


class WakeableSleep:
    """A sleep that ``wake()`` ends early (cheaper than ``wait_for`` on an Event); one sleeper at a time, on the
    loop's thread."""

    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, self.wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
