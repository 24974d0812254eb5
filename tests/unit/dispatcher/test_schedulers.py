"""ordered.OrderedScheduler and unordered.UnorderedScheduler: which queued event starts next."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from kafka_eventing.dispatcher.ordered import OrderedScheduler
from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.scheduler import Scheduler
from kafka_eventing.dispatcher.unordered import UnorderedScheduler


def _parts(queued: dict[int, int]) -> list[Partition]:
    parts = []
    for number, count in queued.items():
        part = Partition(number, None, TopicPartition("t", number))
        part.queue.extend(f"{number}-{i}" for i in range(count))
        parts.append(part)
    return parts


def _pump(scheduler: Scheduler, parts: list[Partition], in_flight: int = 0, tokens: int = 1000) -> list[Any]:
    started: list[Any] = []
    budget = [tokens]

    def admit() -> bool:
        budget[0] -= 1
        return budget[0] >= 0

    def start(part: Partition, message: Any) -> None:
        part.in_flight += 1
        started.append(message)

    scheduler.assigned(parts)
    scheduler.pump(parts, in_flight, admit, start)
    return started


def test_ordered_starts_one_per_idle_partition() -> None:
    parts = _parts({0: 3, 1: 2, 2: 0})
    parts[1].in_flight = 1
    assert _pump(OrderedScheduler(64), parts) == ["0-0"]
    assert list(parts[0].queue) == ["0-1", "0-2"]


def test_unordered_round_robin_up_to_the_budget() -> None:
    parts = _parts({0: 5, 1: 5, 2: 1})
    assert _pump(UnorderedScheduler(6), parts, in_flight=1) == ["0-0", "1-0", "2-0", "0-1", "1-1"]


def test_rate_limit_stops_the_pump() -> None:
    assert _pump(UnorderedScheduler(64), _parts({0: 5}), tokens=2) == ["0-0", "0-1"]
    assert _pump(OrderedScheduler(64), _parts({0: 5, 1: 5}), tokens=1) == ["0-0"]
