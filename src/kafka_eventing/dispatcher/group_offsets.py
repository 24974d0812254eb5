"""Committed offsets of consumer groups nobody is subscribed in: a Broker's Triggers' groups.

The Broker's dispatcher reads the topic once (one group for the partition assignment) and keeps each Trigger's
progress in the Trigger's own group, ``knative-trigger-<ns>-<name>``, so lag tools, alerts and KEDA see every
Trigger as before. Those groups have no members: their offsets are written with the admin API's
OffsetCommit (``alter_consumer_group_offsets``, generation -1), which the group coordinator accepts for a group
that is empty, and read with OffsetFetch. One admin client serves every Trigger (a consumer per Trigger would
cost its own librdkafka threads and connections). The admin API takes one group per request.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, Protocol

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

#: Seconds an admin request may take (lookup of the group coordinator included).
REQUEST_TIMEOUT = 10.0


class GroupOffsets(Protocol):
    def committed(self, group: str, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The committed offsets (negative: none), with their metadata."""

    def has_commits(self, group: str, topic: str) -> bool:
        """Whether the group has committed an offset for any partition of ``topic``."""

    def commit(self, group: str, offsets: list[TopicPartition]) -> concurrent.futures.Future[Any]:
        """Start a commit; the future fails with ``KafkaException``."""

    def delete(self, group: str) -> None:
        """Delete the group and its offsets (absent already: fine)."""


class AdminGroupOffsets:
    """``GroupOffsets`` through one ``AdminClient``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.admin = AdminClient(config)

    def committed(self, group: str, partitions: list[TopicPartition]) -> list[TopicPartition]:
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(tp.topic, tp.partition)
                                                        for tp in partitions])]
        result = self.admin.list_consumer_group_offsets(request, request_timeout=REQUEST_TIMEOUT)[group]
        found = {tp.partition: tp for tp in result.result(REQUEST_TIMEOUT).topic_partitions or []}
        out = []
        for tp in partitions:
            got = found.get(tp.partition)
            if got is not None and got.error is not None:
                raise KafkaException(got.error)
            if got is None:
                out.append(TopicPartition(tp.topic, tp.partition, -1001))
            elif got.metadata:
                out.append(TopicPartition(tp.topic, tp.partition, got.offset, got.metadata))
            else:
                out.append(TopicPartition(tp.topic, tp.partition, got.offset))
        return out

    def has_commits(self, group: str, topic: str) -> bool:
        request = [ConsumerGroupTopicPartitions(group)]
        result = self.admin.list_consumer_group_offsets(request, request_timeout=REQUEST_TIMEOUT)[group]
        return any(tp.topic == topic and tp.offset >= 0
                   for tp in result.result(REQUEST_TIMEOUT).topic_partitions or [])

    def commit(self, group: str, offsets: list[TopicPartition]) -> concurrent.futures.Future[Any]:
        request = [ConsumerGroupTopicPartitions(group, offsets)]
        future: concurrent.futures.Future[Any] = self.admin.alter_consumer_group_offsets(
            request, request_timeout=REQUEST_TIMEOUT)[group]
        return future

    def delete(self, group: str) -> None:
        future = self.admin.delete_consumer_groups([group], request_timeout=REQUEST_TIMEOUT)[group]
        try:
            future.result(REQUEST_TIMEOUT)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return
            raise
