"""Rebalance handling of one subscription's consumer: where assigned partitions start, what revoke commits.

* assign: committed offsets always win. A partition without one gets the initial position if the group is
  brand new (no committed offset on any partition of the topic), else the earliest offset (a partition added
  to the topic later); the start is pinned and committed before the group is reported as joined.
* revoke: the partitions are released (in-flight deliveries cancelled) and the marks of what is finished are
  stored and committed synchronously, so the new owner starts right after them (stored too, because librdkafka
  commits the stored offsets of revoked partitions again after the callback). The commit's metadata carries the
  attempts already made for the events started and not finished; the new owner (this process or another)
  counts on from there, so retries are not reset by a rebalance.
* lost: released without a commit — another member may own them already, and committing now could move its
  offsets backwards.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition

from kafka_eventing.dispatcher.partition import Partition

log = logging.getLogger(__name__)

#: Tries at pinning and committing a new group's start offsets before falling back.
PIN_ATTEMPTS = 3
#: Commit metadata prefix of the attempt counts (brokers keep up to offset.metadata.max.bytes, 4 KiB by default).
ATTEMPTS_PREFIX = "ke.attempts="
#: Most attempt counts carried in one commit (the oldest offsets: the next ones redelivered).
MAX_CARRIED = 32


def retry_metadata(attempts: dict[int, int]) -> str:
    """Commit metadata holding ``{offset: attempts made}``."""
    if not attempts:
        return ""
    carried = sorted(attempts.items())[:MAX_CARRIED]
    return ATTEMPTS_PREFIX + json.dumps(carried, separators=(",", ":"))


def attempts_from(metadata: str | None) -> dict[int, int]:
    """The attempt counts of ``retry_metadata``; {} for anything else (another client's metadata)."""
    if not metadata or not metadata.startswith(ATTEMPTS_PREFIX):
        return {}
    try:
        return {int(offset): int(made) for offset, made in json.loads(metadata[len(ATTEMPTS_PREFIX):])}
    except (ValueError, TypeError):
        return {}


def commit_point(topic: str, part: Partition) -> TopicPartition | None:
    """What a revoke or shutdown commits for ``part``: the mark, with the attempts of the unfinished events.

    With attempts to carry and nothing finished yet, the mark is the oldest unfinished offset — where the
    partition started, so committing it moves nothing.
    """
    position = part.tracker.commit_position
    made = {offset: count.made for offset, count in part.attempts.items() if count.made}
    if position is None and made:
        position = part.tracker.first
    if position is None:
        return None
    carried = retry_metadata({offset: n for offset, n in made.items() if offset >= position})
    return TopicPartition(topic, part.number, position, carried)


class Owner(Protocol):
    """The coordinator side of a rebalance."""

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """Start tracking the partitions (their start positions are already set; ``metadata`` as committed)."""

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
        self.owner.assigned(self._position(consumer, partitions))
        log.info("partitions assigned", extra={**self.labels, "partitions": [tp.partition for tp in partitions]})
        # An empty assignment counts as joined too: more members than partitions.
        self.owner.group_joined(bool(partitions) or self._topic_exists(consumer))

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        done = self.owner.release(partitions)
        log.info("partitions revoked", extra={**self.labels, "partitions": [tp.partition for tp in partitions]})
        if done:
            try:
                # Once this callback returns, librdkafka commits the revoked partitions' *stored* offsets itself
                # (auto-commit on unassign, also in close()), with the stored metadata: without this store that
                # later commit replaces the one below with the last mark ``_store_done`` handed over — no
                # attempt counts, possibly an older offset — and the new owner starts the count at zero.
                consumer.store_offsets(offsets=done)
            except KafkaException as exc:
                log.warning("store on revoke failed", extra={**self.labels, "error": str(exc)})
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

    def _position(self, consumer: Any, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Pin where a partition without a committed offset starts and commit it, before reporting the join.

        Left to ``auto.offset.reset``, "latest" is resolved lazily after the assignment: events produced in
        between — or while the dispatcher is down before its first commit — would be skipped. Committed
        offsets always win; only partitions without one get the initial position.
        """
        if not partitions:
            return partitions
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
                    return partitions
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
        return positions

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
