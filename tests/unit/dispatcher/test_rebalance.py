"""rebalance.Rebalancer with a fake consumer: start positions, commits on revoke and not on lost."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kafka_eventing.dispatcher.rebalance import Rebalancer


class FakeConsumer:
    def __init__(self, committed: dict[int, int], watermarks: dict[int, tuple[int, int]]) -> None:
        self.offsets = committed
        self.watermarks = watermarks
        self.assigned: list[TopicPartition] = []
        self.commits: list[list[tuple[int, int]]] = []

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.offsets.get(tp.partition, -1001)) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.watermarks[tp.partition]

    def list_topics(self, topic: str, timeout: float) -> Any:
        parts = {p: object() for p in self.watermarks}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=parts, error=None)})

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned.extend(tps)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append([(tp.partition, tp.offset) for tp in offsets])


class Owner:
    def __init__(self, done: list[TopicPartition] | None = None) -> None:
        self.parts: set[int] = set()
        self.done = done or []
        self.joined: list[bool] = []

    def assigned(self, partitions: list[TopicPartition]) -> None:
        self.parts |= {tp.partition for tp in partitions}

    def release(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        self.parts -= {tp.partition for tp in partitions}
        return self.done

    def group_joined(self, topic_exists: bool) -> None:
        self.joined.append(topic_exists)


def _assign(initial: str, committed: dict[int, int], assign: list[int]) -> FakeConsumer:
    consumer = FakeConsumer(committed, {0: (0, 10), 1: (2, 20), 2: (5, 30), 3: (0, 7)})
    owner = Owner()
    Rebalancer("t", initial, owner, {}).on_assign(consumer, [TopicPartition("t", p) for p in assign])
    assert owner.parts == set(assign) and owner.joined == [True]
    return consumer


@pytest.mark.parametrize("initial", ["latest", "earliest"])
def test_committed_offsets_win(initial: str) -> None:
    consumer = _assign(initial, {0: 4, 1: 6}, [0, 1])
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 4), (1, 6)]
    assert consumer.commits == []


def test_brand_new_group_pins_the_initial_position() -> None:
    assert _assign("latest", {}, [0, 1]).commits == [[(0, 10), (1, 20)]]
    assert _assign("earliest", {}, [0, 1]).commits == [[(0, 0), (1, 2)]]


def test_partition_added_to_an_existing_group_starts_at_earliest() -> None:
    # The group committed partitions 0-2 (another member owns them): partition 3 was added later.
    consumer = _assign("latest", {0: 4, 1: 6, 2: 9}, [3])
    assert consumer.commits == [[(3, 0)]]
    consumer = _assign("latest", {0: 4}, [0, 3])
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 4), (3, 0)]


def test_revoke_commits_what_is_done_and_lost_does_not() -> None:
    consumer = FakeConsumer({}, {})
    owner = Owner(done=[TopicPartition("t", 0, 42)])
    rebalancer = Rebalancer("t", "latest", owner, {})
    rebalancer.on_revoke(consumer, [TopicPartition("t", 0)])
    assert consumer.commits == [[(0, 42)]]
    rebalancer.on_lost(consumer, [TopicPartition("t", 0)])
    assert consumer.commits == [[(0, 42)]]
