"""Ordered delivery: per partition one event in flight, in offset order; each partition has its own budget."""

from __future__ import annotations

from collections.abc import Collection

from kafka_eventing.dispatcher.partition import QUEUE_RECORDS, Partition
from kafka_eventing.dispatcher.scheduler import Admit, Scheduler, Start


class OrderedScheduler(Scheduler):
    ordered = True
    # A partition's events wait for nothing but its own, so a full partition is paused rather than let it hold
    # records that another, idle one needs (librdkafka hands records over in fetch order).
    shares_budget = False

    def pump(self, parts: Collection[Partition], in_flight: int, admit: Admit, start: Start) -> None:
        for part in parts:
            if part.in_flight == 0 and part.queue:
                if not admit():
                    return
                start(part, part.queue.popleft())

    def record_cap(self, partitions: int) -> int:
        return QUEUE_RECORDS

    def byte_cap(self, share: int) -> int:
        return max(32 * 1024, share)

    def must_pause(self, part: Partition, queued: int, budget: int, byte_cap: int) -> bool:
        """A partition over its share (records or bytes)."""
        return len(part.queue) >= part.cap or part.queued_bytes >= byte_cap

    def may_resume(self, part: Partition, queued: int, budget: int, byte_cap: int) -> bool:
        return len(part.queue) <= part.cap // 2 and part.queued_bytes <= byte_cap // 2
