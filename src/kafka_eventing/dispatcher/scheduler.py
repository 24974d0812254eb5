"""Which queued event starts next, and how much each partition may hold: one interface, two behaviours.

``OrderedScheduler`` (ordered.py) and ``UnorderedScheduler`` (unordered.py) are the two policies, as
eventing-kafka-broker splits its ordered and unordered consumer verticles. Flow control (flow.py) asks the
scheduler for the rules that differ; the coordinator (subscription.py) asks it to start events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection

from confluent_kafka import Message

from kafka_eventing.dispatcher.partition import Partition

#: Starts one event of a partition (the coordinator's delivery task).
Start = Callable[[Partition, Message], None]
#: The rate limit: True if an event may start now (else a wake-up is scheduled).
Admit = Callable[[], bool]


class Scheduler(ABC):
    ordered: bool

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max(1, max_in_flight)

    @abstractmethod
    def pump(self, parts: Collection[Partition], in_flight: int, admit: Admit, start: Start) -> None:
        """Start as many queued events as the policy, the in-flight budget and the rate limit allow."""

    def assigned(self, parts: Collection[Partition]) -> None:  # noqa: B027 - an optional hook
        """The set of partitions changed."""

    # -- flow-control rules -------------------------------------------------------------------------
    #: Whether the partitions share one byte budget (True) or each has its own share of it (False).
    shares_budget: bool

    @abstractmethod
    def record_cap(self, partitions: int) -> int:
        """Most records one partition's local queue holds."""

    @abstractmethod
    def byte_cap(self, share: int) -> int:
        """Bytes one open partition may hold, given its share of the budget."""

    @abstractmethod
    def must_pause(self, part: Partition, queued: int, budget: int, byte_cap: int) -> bool:
        """``queued``: the bytes all partitions hold; ``budget``: the subscription's byte budget."""

    @abstractmethod
    def may_resume(self, part: Partition, queued: int, budget: int, byte_cap: int) -> bool: ...
