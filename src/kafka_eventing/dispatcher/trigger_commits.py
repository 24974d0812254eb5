"""A Broker dispatcher's bookkeeping of its Triggers' progress: each lane's moved marks committed to the Trigger's
own group (``group_offsets``), at most one commit in flight per group, and each Trigger's lag per partition."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from kafka_eventing.dispatcher.group_offsets import GroupOffsets
from kafka_eventing.dispatcher.lane import TriggerLane
from kafka_eventing.dispatcher.metrics import Metrics

log = logging.getLogger(__name__)

#: How often the moved marks are committed (the channel dispatcher's auto.commit.interval.ms).
COMMIT_INTERVAL = 1.0
LAG_INTERVAL = 5.0
COMMIT_TIMEOUT = 10.0


class TriggerCommits:
    def __init__(self, offsets: GroupOffsets, clock: Callable[[], float] = time.monotonic) -> None:
        self.offsets = offsets
        self.clock = clock
        self._pending: dict[str, tuple[concurrent.futures.Future[Any], TriggerLane, list[int]]] = {}
        self._next = 0.0

    def commit_moved(self, lanes: Iterable[TriggerLane]) -> None:
        """Every ``COMMIT_INTERVAL``: each lane's moved marks to its group, at most one commit in flight per
        group (two could land out of order and move the offset back)."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + COMMIT_INTERVAL
        for group, (future, lane, numbers) in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[group]
            if future.exception() is not None:
                log.warning("commit failed, retrying", extra={"group": group, "error": str(future.exception())})
                lane.moved.update(n for n in numbers if n in lane.parts)
        for lane in lanes:
            if lane.group_id in self._pending or not lane.moved:
                continue
            offsets = lane.take_moved()
            if offsets:
                self._pending[lane.group_id] = (self.offsets.commit(lane.group_id, offsets), lane,
                                                [tp.partition for tp in offsets])

    def commit_now(self, group: str, offsets: list[TopicPartition]) -> None:
        """Synchronously, after any commit of the group still in flight (off the loop)."""
        pending = self._pending.get(group)
        if pending is not None:
            concurrent.futures.wait([pending[0]], timeout=COMMIT_TIMEOUT)
        if not offsets:
            return
        try:
            self.offsets.commit(group, offsets).result(COMMIT_TIMEOUT)
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            log.warning("commit failed", extra={"group": group, "error": str(exc)})


class TriggerLag:
    """``consumer lag`` per Trigger group and partition: the topic's high watermark less the group's position."""

    def __init__(self, topic: str, metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.topic, self.metrics, self.clock = topic, metrics, clock
        self._next = 0.0
        self._seen: set[tuple[str, str, str]] = set()

    def report(self, consumer: Any, partitions: Mapping[int, int], lanes: Iterable[TriggerLane]) -> None:
        """Every ``LAG_INTERVAL``, from the reader's cached watermarks of its assigned ``partitions``."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + LAG_INTERVAL
        highs: dict[int, int] = {}
        for number in partitions:
            try:
                highs[number] = consumer.get_watermark_offsets(TopicPartition(self.topic, number), cached=True)[1]
            except KafkaException:
                continue
        for lane in lanes:
            for part in lane.parts.values():
                high, position = highs.get(part.number, -1), part.tracker.commit_position
                if high < 0 or position is None:
                    continue
                key = (lane.group_id, str(part.number), self.topic)
                self._seen.add(key)
                self.metrics.lag.labels(*key).set(max(0, high - position))

    def forget(self, group: str, number: int) -> None:
        """The partition left this replica: its gauge goes (the new owner reports it)."""
        key = (group, str(number), self.topic)
        if key in self._seen:
            self._seen.discard(key)
            self.metrics.lag.remove(*key)
