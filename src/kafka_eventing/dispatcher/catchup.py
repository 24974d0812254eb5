"""A Trigger's own reader while it is behind the Broker's shared read (``fanout.SharedReader``): when it falls
behind, and how its partitions rejoin the shared read."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any, Protocol, cast

from confluent_kafka import KafkaException, TopicPartition

from kafka_eventing.dispatcher.flow import WakeableSleep
from kafka_eventing.dispatcher.lane import Record, TriggerLane
from kafka_eventing.dispatcher.subscription import MAX_IDLE_POLL, ConsumerFactory

log = logging.getLogger(__name__)


class Rejoins(Protocol):
    def rejoin(self, lane: TriggerLane, number: int) -> bool:
        """Whether the lane's partition is back in the shared read (then it is no longer behind)."""
        ...


class CatchUp:
    """A lane's own reader while it is behind: a consumer *assigned* the lane's behind partitions at the lane's
    positions (no group membership, nothing committed by it: the shared reader commits the lane's marks), fed
    into the same lane within the lane's own budget, until each partition rejoins the shared read."""

    def __init__(self, lane: TriggerLane, reader: Rejoins, config: dict[str, Any],
                 factory: ConsumerFactory) -> None:
        self.lane = lane
        self.reader = reader
        self.config = {**config, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        self.factory = factory
        self.done = asyncio.Event()
        self._stopping = False
        self._alarm = WakeableSleep()
        self._assigned: set[int] = set()

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    def wake(self) -> None:
        self._alarm.wake()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        lane, topic = self.lane, self.lane.topic
        poller = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"catchup-{lane.subscriber.uid}"[:40])
        consumer = self.factory(self.config)
        try:
            while not self._stopping:
                for number in sorted(lane.behind):
                    if self.reader.rejoin(lane, number):
                        lane.parts[number].paused = False
                want = {n for n in lane.behind if n in lane.parts}
                add = [TopicPartition(topic, n, lane.position(n)) for n in want - self._assigned]
                drop = [TopicPartition(topic, n) for n in self._assigned - want]
                if add or drop:
                    await loop.run_in_executor(poller, self._reassign, consumer, add, drop)
                    self._assigned = want
                if not want:
                    return
                parts = lane.behind_parts()
                room, full = lane.room(parts)
                queued = lane.flow.queued(parts)
                pause = [p for p in parts if lane.wants_paused(p, queued)]
                if full or len(pause) == len(parts):
                    await self._sleep(MAX_IDLE_POLL)
                    continue
                await loop.run_in_executor(poller, self._pause, consumer, pause, parts)
                messages = await loop.run_in_executor(poller, consumer.consume, room, MAX_IDLE_POLL)
                for message in messages:
                    if message.error() is not None:
                        continue
                    number = cast(int, message.partition())
                    if number in lane.behind:
                        lane.offer(Record(message))
                lane.count_consumed()
                lane.pump()
        finally:
            try:
                await asyncio.shield(loop.run_in_executor(poller, consumer.close))
            except (KafkaException, RuntimeError) as exc:
                log.warning("catch-up consumer close failed", extra={"subscriber": lane.subscriber.uid,
                                                                      "error": str(exc)})
            poller.shutdown(wait=False)
            self.done.set()

    @staticmethod
    def _reassign(consumer: Any, add: list[TopicPartition], drop: list[TopicPartition]) -> None:
        if drop:
            consumer.incremental_unassign(drop)
        if add:
            consumer.incremental_assign(add)

    @staticmethod
    def _pause(consumer: Any, pause: list[Any], parts: list[Any]) -> None:
        paused = {p.number for p in pause}
        if paused:
            consumer.pause([p.tp for p in pause])
        resume = [p.tp for p in parts if p.number not in paused]
        if resume:
            consumer.resume(resume)

    async def _sleep(self, seconds: float) -> None:
        await self._alarm.sleep(seconds)
