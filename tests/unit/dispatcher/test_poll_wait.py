"""The poll loop (here a Broker's shared read), with a fake consumer: once its partitions are open and nothing
arrives, it waits inside ``consume`` for the first record (whose arrival ends the wait) instead of sleeping past it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher.factory import create_dispatcher
from kafka_eventing.dispatcher.status import MemoryStatusWriter

from .fakes import FakeConsumer, FakeOffsets, Source, trigger


class QuietConsumer(FakeConsumer):
    """One partition, assigned at the first consume; nothing ever arrives. Records each consume's arguments."""

    def __init__(self) -> None:
        super().__init__({0: 0}, {0: (0, 0)})
        self.callbacks: dict[str, Any] = {}
        self.topic = ""
        self.calls: list[tuple[int, float]] = []

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.topic, self.callbacks = topics[0], callbacks

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if not self.calls:
            self.callbacks["on_assign"](self, [TopicPartition(self.topic, 0)])
        self.calls.append((num_messages, timeout))
        time.sleep(timeout)  # as librdkafka does when no record comes
        return []

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        return self.watermarks[tp.partition]

    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def close(self) -> None: ...


def test_an_idle_open_subscription_waits_for_its_first_record_inside_consume() -> None:
    consumers: list[QuietConsumer] = []

    def factory(_config: dict[str, Any]) -> QuietConsumer:
        consumers.append(QuietConsumer())
        return consumers[-1]

    async def scenario() -> None:
        source = Source()
        source.publish([trigger("now")])
        settings = Settings(bootstrap_servers="127.0.0.1:1", broker_namespace="ns", broker_name="b")
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                       status_writer=MemoryStatusWriter(), consumer_factory=factory,
                                       registry=CollectorRegistry(), port=-1, group_offsets=FakeOffsets())
        task = asyncio.create_task(dispatcher.run())
        await dispatcher.wait_started()
        await asyncio.sleep(0.4)
        dispatcher.stop()
        await task

    asyncio.run(scenario())
    (consumer,) = consumers
    waits = [timeout for num, timeout in consumer.calls if timeout > 0]
    assert waits, consumer.calls
    assert all(num == 1 for num, timeout in consumer.calls if timeout > 0)  # one record ends the wait
    assert max(waits) <= 0.05  # never longer than the idle back-off: rebalances and stops are still seen
    # The idle back-off grows while nothing comes: most of the 0.4 s is spent waiting inside consume.
    assert sum(waits) > 0.2, consumer.calls
