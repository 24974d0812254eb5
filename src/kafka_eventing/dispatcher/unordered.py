"""Unordered delivery: up to ``max_in_flight`` events per subscription, handed out round robin over partitions.

The partitions feed one in-flight budget, so they share the byte budget too. No partition is paused for
holding more than its share: a pause drops librdkafka's prefetched records of the partition, and a resumed
partition is fetched again only after the fetch under way returns (up to fetch.wait.max.ms), from the start of
the record batch — with a producer's large batches, pausing at a share delivered ~500 records per pause/resume
cycle, ~1,000 events/s, once only one partition had records left (docs/dispatcher.md). The intake is bounded by
flow control's room; pausing stays as the valve for a subscriber that takes nothing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection

from kafka_eventing.dispatcher.partition import QUEUE_RECORDS, Partition
from kafka_eventing.dispatcher.scheduler import Admit, Scheduler, Start


class UnorderedScheduler(Scheduler):
    ordered = False
    shares_budget = True

    def __init__(self, max_in_flight: int) -> None:
        super().__init__(max_in_flight)
        self._rotation: deque[Partition] = deque()

    def assigned(self, parts: Collection[Partition]) -> None:
        self._rotation = deque(parts)

    def pump(self, parts: Collection[Partition], in_flight: int, admit: Admit, start: Start) -> None:
        # Round robin that goes on across calls (each finished event frees one slot, and the next partition in
        # turn gets it): one busy partition never takes the whole budget while the others sit paused, full.
        rotation = self._rotation
        free = self.max_in_flight - in_flight
        skipped = 0
        while free > 0 and skipped < len(rotation):
            part = rotation[0]
            rotation.rotate(-1)
            if not part.queue:
                skipped += 1
                continue
            skipped = 0
            if not admit():
                return
            start(part, part.queue.popleft())
            free -= 1

    def record_cap(self, partitions: int) -> int:
        return max(QUEUE_RECORDS, math.ceil(4 * self.max_in_flight / partitions))

    def byte_cap(self, share: int) -> int:
        # The cap only spreads the intake over the partitions (no partition is paused for it).
        return max(32 * 1024, 2 * share)

    def must_pause(self, part: Partition, queued: int, budget: int, byte_cap: int) -> bool:
        """Every partition, once together they hold twice the budget."""
        return queued >= 2 * budget

    def may_resume(self, part: Partition, queued: int, budget: int, byte_cap: int) -> bool:
        return queued <= budget
