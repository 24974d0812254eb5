"""flow: the rate limit, and pausing/resuming by the ordered and unordered rules."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from kafka_eventing.dispatcher.flow import FlowControl, TokenBucket, bucket_for
from kafka_eventing.dispatcher.ordered import OrderedScheduler
from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.scheduler import Scheduler
from kafka_eventing.dispatcher.unordered import UnorderedScheduler


def test_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, clock=lambda: now[0])
    assert bucket.take() == 0.0 and bucket.take() == 0.0
    assert bucket.take() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.take() == 0.0


def test_a_spec_change_that_keeps_the_rate_keeps_the_drained_bucket() -> None:
    bucket = TokenBucket(2.0, clock=lambda: 0.0)
    bucket.take(), bucket.take()
    kept = bucket_for(2.0, bucket)
    assert kept is bucket and kept.take() == pytest.approx(0.5)  # no fresh burst
    changed = bucket_for(5.0, bucket)
    assert changed is not None and changed is not bucket and changed.rate == 5.0
    assert bucket_for(None, bucket) is None and bucket_for(0.0) is None


class _PausingConsumer:
    def __init__(self) -> None:
        self.paused: set[int] = set()
        self.calls: list[tuple[str, list[int]]] = []

    def pause(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("pause", [tp.partition for tp in tps]))
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("resume", [tp.partition for tp in tps]))
        self.paused -= {tp.partition for tp in tps}


Parts = dict[int, Partition]


def _flow_with(ordered: bool, queued: dict[int, int]) -> tuple[FlowControl, Scheduler, Parts, _PausingConsumer]:
    scheduler: Scheduler = OrderedScheduler(64) if ordered else UnorderedScheduler(64)
    flow = FlowControl(256 * 1024)
    parts = {number: Partition(number, None, TopicPartition("t", number)) for number in queued}
    flow.resize(parts.values(), scheduler)
    for number, size in queued.items():
        parts[number].queued_bytes = size
    return flow, scheduler, parts, _PausingConsumer()


def test_unordered_never_pauses_a_partition_for_its_share() -> None:
    # One partition holding the whole budget while the others are empty (the end of a backlog) is not paused:
    # a pause drops librdkafka's prefetched batch and stalled delivery at ~1,000 events/s (docs/dispatcher.md).
    flow, scheduler, parts, fake = _flow_with(False, {0: 250 * 1024, 1: 0, 2: 0, 3: 0})
    flow.apply(fake, parts.values(), scheduler, {})
    assert fake.calls == []


def test_unordered_pauses_at_twice_the_budget_and_resumes_within_it() -> None:
    flow, scheduler, parts, fake = _flow_with(False, {0: 400 * 1024, 1: 120 * 1024, 2: 0, 3: 0})
    flow.apply(fake, parts.values(), scheduler, {})
    assert fake.paused == {0, 1, 2, 3}  # a subscriber that takes nothing: the valve
    parts[0].queued_bytes = 200 * 1024
    flow.apply(fake, parts.values(), scheduler, {})
    assert fake.paused == {0, 1, 2, 3}  # 320 KB: still over the 256 KB budget
    parts[1].queued_bytes = 0
    flow.apply(fake, parts.values(), scheduler, {})
    assert fake.paused == set()


def test_ordered_pauses_a_partition_over_its_share() -> None:
    flow, scheduler, parts, fake = _flow_with(True, {0: 70 * 1024, 1: 0, 2: 0, 3: 0})  # share: 64 KB each
    flow.apply(fake, parts.values(), scheduler, {})
    assert fake.paused == {0}
    parts[0].queued_bytes = 40 * 1024
    flow.apply(fake, parts.values(), scheduler, {})
    assert fake.paused == {0}  # resumed only at half its share
    parts[0].queued_bytes = 30 * 1024
    flow.apply(fake, parts.values(), scheduler, {})
    assert fake.paused == set()


def test_room_is_the_free_budget_and_at_least_one() -> None:
    flow, scheduler, parts, _fake = _flow_with(False, {0: 0, 1: 0})
    room, full = flow.room(parts.values(), scheduler)
    assert room == 256 and not full  # 256 KiB free at the assumed 1 KiB per record
    parts[0].queued_bytes = 256 * 1024
    assert flow.room(parts.values(), scheduler) == (1, True)  # polling goes on for rebalance callbacks
