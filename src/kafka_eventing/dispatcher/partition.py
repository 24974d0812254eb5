"""What the dispatcher holds for one assigned partition of a subscription."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message, TopicPartition

from kafka_eventing.dispatcher.delivery import AttemptCount
from kafka_eventing.dispatcher.offsets import OffsetTracker

#: Most records one partition's local queue holds; the byte budget (``queue_bytes``) usually binds first.
QUEUE_RECORDS = 512


@dataclass(eq=False)
class Partition:
    """Local queue, offset tracker and in-flight deliveries of one assigned partition."""

    number: int
    consumed: Any  # the prometheus child counter, looked up once
    tp: TopicPartition
    queue: deque[Message] = field(default_factory=deque)
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    in_flight: int = 0
    paused: bool = False
    cap: int = QUEUE_RECORDS
    queued_bytes: int = 0
    #: Records taken in this poll round, not yet added to ``consumed`` (one update per round).
    received: int = 0
    #: Commit position not yet handed to ``store_offsets`` (stored once per poll round, not per event).
    unstored: int | None = None
    #: Attempts of the events started and not finished, by offset (see ``rebalance.retry_metadata``).
    attempts: dict[int, AttemptCount] = field(default_factory=dict)
