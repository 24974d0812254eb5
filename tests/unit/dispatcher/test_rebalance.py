"""rebalance.Rebalancer with a fake consumer: start positions, commits on revoke and not on lost."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from kafka_eventing.dispatcher.delivery import AttemptCount
from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.rebalance import Rebalancer, attempts_from, commit_point, retry_metadata

from .fakes import FakeConsumer


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
    carried = retry_metadata({42: 3})
    owner = Owner(done=[TopicPartition("t", 0, 42, carried)])
    rebalancer = Rebalancer("t", "latest", owner, {})
    rebalancer.on_revoke(consumer, [TopicPartition("t", 0)])
    assert consumer.commits == [[(0, 42)]]
    # Stored as well, metadata included: librdkafka's own commit of the stored offsets on unassign repeats it.
    assert consumer.stored == [[(0, 42, carried)]]
    rebalancer.on_lost(consumer, [TopicPartition("t", 0)])
    assert consumer.commits == [[(0, 42)]] and len(consumer.stored) == 1


def test_revoke_carries_the_attempts_of_unfinished_events_in_the_commit_metadata() -> None:
    part = Partition(0, None, TopicPartition("t", 0))
    for offset in (7, 8, 9):
        part.tracker.add(offset)
    assert commit_point("t", part) is None  # nothing finished, no attempts: nothing to commit
    part.attempts = {7: AttemptCount(3), 9: AttemptCount(1), 8: AttemptCount(0)}
    point = commit_point("t", part)
    assert point is not None and point.offset == 7  # where the partition started: moves nothing
    assert attempts_from(point.metadata) == {7: 3, 9: 1}
    part.tracker.done(7)
    del part.attempts[7]
    point = commit_point("t", part)
    assert point is not None and point.offset == 8 and attempts_from(point.metadata) == {9: 1}
    assert attempts_from("someone else's metadata") == {} and attempts_from(None) == {}
    assert len(retry_metadata({o: 1 for o in range(1000)})) < 1024


def test_assigned_partitions_bring_their_committed_metadata() -> None:
    consumer = FakeConsumer({0: 4}, {0: (0, 10)})
    consumer.metadata = {0: retry_metadata({4: 2})}
    got: list[TopicPartition] = []
    owner = Owner()
    owner.assigned = got.extend  # type: ignore[method-assign]
    Rebalancer("t", "latest", owner, {}).on_assign(consumer, [TopicPartition("t", 0)])
    assert attempts_from(got[0].metadata) == {4: 2}
