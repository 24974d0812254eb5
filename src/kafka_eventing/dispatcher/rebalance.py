"""Rebalance handling of one subscription's consumer: where assigned partitions start, what revoke commits.

* assign: committed offsets always win. A partition without one gets the initial position if the group is
  brand new (no committed offset on any partition of the topic), else the earliest offset (a partition added
  to the topic later); the start is pinned and committed before the group is reported as joined.
* revoke: the partitions are released (in-flight deliveries cancelled) and the marks of what is finished are
  committed synchronously, so the new owner starts right after them.
* lost: released without a commit — another member may own them already, and committing now could move its
  offsets backwards.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition

log = logging.getLogger(__name__)

#: Tries at pinning and committing a new group's start offsets before falling back.
PIN_ATTEMPTS = 3


class Owner(Protocol):
    """The coordinator side of a rebalance."""

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """Start tracking the partitions (their start positions are already set)."""

    def release(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Forget the partitions, cancel their deliveries, return the finished marks that may be committed."""

    def group_joined(self, topic_exists: bool) -> None:
        """The group has been joined (an assignment arrived); False: the topic does not exist."""


class Rebalancer:
    """The rebalance callbacks given to ``Consumer.subscribe``."""

    def __init__(self, topic: str, initial: str, owner: Owner, labels: dict[str, str]) -> None:
        self.topic = topic
        self.initial = initial
        self.owner = owner
        self.labels = labels

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._position(consumer, partitions)
        self.owner.assigned(partitions)
        log.info("partitions assigned", extra={**self.labels, "partitions": [tp.partition for tp in partitions]})
        # An empty assignment counts as joined too: more members than partitions.
        self.owner.group_joined(bool(partitions) or self._topic_exists(consumer))

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        done = self.owner.release(partitions)
        log.info("partitions revoked", extra={**self.labels, "partitions": [tp.partition for tp in partitions]})
        if done:
            try:
                consumer.commit(offsets=done, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed", extra={**self.labels, "error": str(exc)})

    def on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.owner.release(partitions)
        log.warning("partitions lost", extra={**self.labels, "partitions": [tp.partition for tp in partitions]})

    def _topic_exists(self, consumer: Any) -> bool:
        try:
            metadata = consumer.list_topics(self.topic, timeout=5)
        except KafkaException:
            return True  # unknown: do not report a problem we could not see
        found = metadata.topics.get(self.topic)
        return found is not None and found.error is None and bool(found.partitions)

    def _position(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Pin where a partition without a committed offset starts and commit it, before reporting the join.

        Left to ``auto.offset.reset``, "latest" is resolved lazily after the assignment: events produced in
        between — or while the dispatcher is down before its first commit — would be skipped. Committed
        offsets always win; only partitions without one get the initial position.
        """
        if not partitions:
            return
        # The group coordinator may still be loading right after a join (or the broker busy): a few tries
        # before falling back, since the fallback can skip events produced before the first commit.
        positions: list[TopicPartition] | None = None
        start: list[TopicPartition] = []
        for attempt in range(PIN_ATTEMPTS):
            try:
                positions, start = self._start_positions(consumer, partitions)
                break
            except KafkaException as exc:
                if attempt == PIN_ATTEMPTS - 1:
                    log.warning("could not pin start offsets; falling back to auto.offset.reset",
                                extra={**self.labels, "error": str(exc)})
                    return
                time.sleep(0.5)
        assert positions is not None
        try:
            consumer.incremental_assign(positions)
        except KafkaException:
            consumer.assign(positions)  # an eager assignment strategy configured through KE_KAFKA_EXTRA
        for attempt in range(PIN_ATTEMPTS if start else 0):
            try:
                consumer.commit(offsets=start, asynchronous=False)
                break
            except KafkaException as exc:
                if attempt == PIN_ATTEMPTS - 1:
                    log.warning("commit of start offsets failed", extra={**self.labels, "error": str(exc)})
                else:
                    time.sleep(0.5)

    def _start_positions(self, consumer: Any,
                         partitions: list[TopicPartition]) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Committed offsets, and the start for partitions that have none (to be committed).

        Only a brand-new group starts at the initial position. A partition without a committed offset in a
        group that has committed others was added to the topic (numPartitions grown) after the group started:
        it starts at the earliest offset, since the receiver may have written to it — and answered 202 — before
        this member learnt of it.
        """
        positions = consumer.committed(partitions, timeout=10)
        missing = [tp for tp in positions if tp.offset < 0]
        if not missing:
            return positions, []
        initial = self.initial
        if initial != "earliest" and self._group_has_commits(consumer, positions):
            initial = "earliest"
        start: list[TopicPartition] = []
        for tp in missing:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            tp.offset = high if initial == "latest" else low
            start.append(TopicPartition(tp.topic, tp.partition, tp.offset))
        return positions, start

    def _group_has_commits(self, consumer: Any, assigned: list[TopicPartition]) -> bool:
        """Whether the group has committed an offset for any partition of the topic (then it is not new)."""
        if any(tp.offset >= 0 for tp in assigned):
            return True
        mine = {tp.partition for tp in assigned}
        topic = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        others = [TopicPartition(self.topic, p) for p in (topic.partitions if topic else {}) if p not in mine]
        return bool(others) and any(tp.offset >= 0 for tp in consumer.committed(others, timeout=10))
