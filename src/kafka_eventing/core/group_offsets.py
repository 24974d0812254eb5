"""A consumer group's offsets on Kafka, through the admin API: what is committed, where a point in time is, who
is a member, and moving every partition at once. Shared by the dispatcher's reset (``dispatcher/resets.py``) and
``kafka-eventing offsets`` (``core/offsets_cli.py``).

``commit`` moves all partitions of the group in one OffsetCommit request; the group coordinator appends it as one
batch to ``__consumer_offsets``, so a crash leaves the group where it was or where it was asked, never between.
Kafka accepts that request only while the group has no active member (a member's own commits would race it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from kafka_eventing.core.resetoffsets import PartitionMove


class GroupOffsetsError(RuntimeError):
    pass


@dataclass(frozen=True)
class Committed:
    offset: int  # -1: nothing committed for the partition
    metadata: str


@dataclass(frozen=True)
class Watermarks:
    low: int
    high: int


@dataclass(frozen=True)
class Members:
    state: str
    count: int
    clients: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return self.count == 0


class GroupOffsets:
    """Admin reads and the one-request commit; every call bounded by ``timeout`` seconds."""

    def __init__(self, admin_config: Mapping[str, Any], timeout: float = 10.0) -> None:
        self.admin = AdminClient(dict(admin_config))
        self.config = dict(admin_config)
        self.timeout = timeout

    def partitions(self, topic: str) -> list[int]:
        metadata = self.admin.list_topics(topic, timeout=self.timeout).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise GroupOffsetsError(f"topic {topic} does not exist")
        return sorted(metadata.partitions)

    def committed(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, Committed]:
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])]
        futures = self.admin.list_consumer_group_offsets(request, request_timeout=self.timeout)
        result = _only(futures).result(self.timeout)
        out = {}
        for tp in result.topic_partitions or ():
            if tp.error is not None:
                raise GroupOffsetsError(f"committed offset of {topic}/{tp.partition}: {tp.error}")
            out[tp.partition] = Committed(tp.offset if tp.offset >= 0 else -1, tp.metadata or "")
        return out

    def watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, Watermarks]:
        parts = list(partitions)
        low = self._list_offsets(topic, parts, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        high = self._list_offsets(topic, parts, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        return {p: Watermarks(low[p], high[p]) for p in parts}

    def at_time(self, topic: str, partitions: Iterable[int], millis: int) -> dict[int, int]:
        """Per partition the first offset whose timestamp is at or after ``millis``; -1 where there is none."""
        return self._list_offsets(topic, list(partitions), OffsetSpec.for_timestamp(millis))

    def members(self, group: str) -> Members:
        futures = self.admin.describe_consumer_groups([group], request_timeout=self.timeout)
        desc = _only(futures).result(self.timeout)
        state = desc.state
        name = state.name if isinstance(state, ConsumerGroupState) else str(state)
        return Members(name, len(desc.members or ()), tuple(sorted(m.client_id for m in desc.members or ())))

    def commit(self, group: str, offsets: list[TopicPartition]) -> None:
        """Every partition in one request: applied whole or not at all. Refused while the group has members."""
        request = [ConsumerGroupTopicPartitions(group, offsets)]
        futures = self.admin.alter_consumer_group_offsets(request, request_timeout=self.timeout)
        try:
            result = _only(futures).result(self.timeout)
        except KafkaException as exc:
            raise GroupOffsetsError(f"commit refused: {exc.args[0].str() if exc.args else exc}") from None
        errors = [f"{tp.topic}/{tp.partition}: {tp.error}" for tp in result.topic_partitions or () if tp.error]
        if errors:
            raise GroupOffsetsError("commit refused: " + "; ".join(errors))

    def first_timestamp(self, topic: str, partition: int, offset: int) -> int | None:
        """The timestamp (ms) of the record at ``offset``, read without joining any group; None if unreadable."""
        consumer = Consumer({**self.config, "group.id": "kafka-eventing-offsets-peek", "enable.auto.commit": False,
                             "enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(topic, partition, offset)])
            message = consumer.poll(self.timeout)
            if message is None or message.error() is not None:
                return None
            _kind, stamp = message.timestamp()
            return int(stamp) if stamp >= 0 else None
        finally:
            consumer.close()

    def _list_offsets(self, topic: str, partitions: list[int], spec: OffsetSpec) -> dict[int, int]:
        futures = self.admin.list_offsets({TopicPartition(topic, p): spec for p in partitions},
                                          request_timeout=self.timeout)
        return {tp.partition: int(f.result(self.timeout).offset) for tp, f in futures.items()}


def _only(futures: Mapping[Any, Any]) -> Any:
    (future,) = futures.values()
    return future


def plan(offsets: GroupOffsets, topic: str, committed: Mapping[int, Committed], *, earliest: bool = False,
         latest: bool = False, millis: int | None = None) -> list[PartitionMove]:
    """Where each partition goes: the first offset at or after ``millis`` (the high watermark where nothing is
    that recent), or the low/high watermark for earliest/latest. A time older than the oldest record Kafka keeps
    (retention deleted the rest) gives that record's offset, flagged ``before_retention``."""
    parts = sorted(committed)
    marks = offsets.watermarks(topic, parts)
    at = offsets.at_time(topic, parts, millis) if millis is not None else {}
    moves = []
    for p in parts:
        low, high = marks[p].low, marks[p].high
        before = False
        if earliest:
            new = low
        elif latest or millis is None:
            new = high
        else:
            new = at[p] if at[p] >= 0 else high
            if new == low and low > 0:
                # Retention (or deleteRecords) removed what came before: was the time older than what is kept?
                stamp = offsets.first_timestamp(topic, p, low) if low < high else None
                before = stamp is not None and stamp > millis
        moves.append(PartitionMove(topic, p, committed[p].offset, max(low, min(new, high)), before))
    return moves
