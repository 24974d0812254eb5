"""The dispatcher's unit tests' fakes and object factories: a recording sender, Broker and Trigger objects, a
channel source, group offsets and a consumer."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition

from kafka_eventing.broker.filters import TriggerFilters
from kafka_eventing.core import brokers as kb
from kafka_eventing.core.channels import Channel, ChannelKey
from kafka_eventing.core.http_delivery import Attempt
from kafka_eventing.dispatcher.triggers import broker_channel


class FakeSender:
    def __init__(self, script: dict[str, list[Attempt]]) -> None:
        self.script = script
        self.calls: list[tuple[str, dict[str, str], bytes]] = []
        self.ca_certs: dict[str, str | None] = {}  # the CACerts each destination was sent with

    async def post(self, url: str, headers: Mapping[str, str], body: bytes, timeout: float | None, *,
                   ca_certs: str | None = None) -> Attempt:
        self.calls.append((url, dict(headers), body))
        self.ca_certs[url] = ca_certs
        answers = self.script[url]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def to(self, url: str) -> list[tuple[str, dict[str, str], bytes]]:
        return [c for c in self.calls if c[0] == url]




def broker(**status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "b", "generation": 1,
                         "annotations": {kb.ANNOTATION_BROKER_CLASS: "Kafka"}},
            "spec": {"delivery": {"retry": 7}},
            "status": {"conditions": [{"type": "TopicReady", "status": "True"}],
                       "address": {"url": "http://receiver/ns/b"}, **status}}


def trigger(name: str, broker_name: str = "b", uri: str | None = "http://sub/", **spec: Any) -> dict[str, Any]:
    """A Trigger as the controller leaves it: every dispatch gate True, the subscriber resolved unless ``uri=None``."""
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "generation": 3, "annotations": {}}
    if spec.pop("ordered", False):
        meta["annotations"][kb.ANNOTATION_DELIVERY_ORDER] = "ordered"
    gates = [{"type": kind, "status": "True"} for kind in kb.DISPATCH_GATES]
    if uri is None:
        gates[1] = {"type": kb.SUBSCRIBER_RESOLVED, "status": "False", "reason": "DestinationNotFound"}
    status: dict[str, Any] = {"conditions": gates}
    if uri:
        status["subscriberUri"] = uri
    return {"metadata": meta, "spec": {"broker": broker_name, **spec}, "status": status}




def with_condition(obj: dict[str, Any], kind: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    conditions = [c for c in obj["status"]["conditions"] if c["type"] != kind]
    obj["status"]["conditions"] = [*conditions, {"type": kind, "status": status, "reason": reason, "message": message}]
    return obj




class Source:
    """A ChannelSource whose snapshot the test sets."""

    def __init__(self) -> None:
        self.channels: dict[ChannelKey, Channel] = {}
        self.callbacks: list[Callable[[dict[ChannelKey, Channel]], None]] = []

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def synced(self) -> bool:
        return True

    def get(self, key: ChannelKey) -> Channel | None:
        return self.channels.get(key)

    def snapshot(self) -> dict[ChannelKey, Channel]:
        return dict(self.channels)

    def subscribe(self, callback: Callable[[dict[ChannelKey, Channel]], None]) -> None:
        self.callbacks.append(callback)

    def publish(self, triggers: list[dict[str, Any]]) -> None:
        channel = broker_channel(broker(), triggers, TriggerFilters(), "http://receiver/ns/b")
        assert channel is not None
        self.channels = {channel.key: channel}
        for callback in self.callbacks:
            callback(self.snapshot())




class FakeOffsets:
    """``GroupOffsets`` in memory."""

    def __init__(self, committed: dict[str, dict[int, int]] | None = None) -> None:
        self.groups: dict[str, dict[int, int]] = committed or {}
        self.commits: list[tuple[str, list[tuple[int, int]]]] = []
        self.deleted: list[str] = []

    def committed(self, group: str, partitions: list[TopicPartition]) -> list[TopicPartition]:
        found = self.groups.get(group, {})
        return [TopicPartition(tp.topic, tp.partition, found.get(tp.partition, -1001)) for tp in partitions]

    def has_commits(self, group: str, topic: str) -> bool:
        return bool(self.groups.get(group))

    def commit(self, group: str, offsets: list[TopicPartition]) -> concurrent.futures.Future[Any]:
        self.commits.append((group, [(tp.partition, tp.offset) for tp in offsets]))
        self.groups.setdefault(group, {}).update({tp.partition: tp.offset for tp in offsets})
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        done.set_result(None)
        return done

    def delete(self, group: str) -> None:
        self.deleted.append(group)
        self.groups.pop(group, None)




class FakeConsumer:
    def __init__(self, committed: dict[int, int], watermarks: dict[int, tuple[int, int]]) -> None:
        self.offsets = committed
        self.watermarks = watermarks
        self.assigned: list[TopicPartition] = []
        self.commits: list[list[tuple[int, int]]] = []
        self.stored: list[list[tuple[int, int, str | None]]] = []
        self.metadata: dict[int, str] = {}

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.offsets.get(tp.partition, -1001),
                               self.metadata.get(tp.partition, "")) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.watermarks[tp.partition]

    def list_topics(self, topic: str, timeout: float) -> Any:
        parts = {p: object() for p in self.watermarks}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=parts, error=None)})

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned.extend(tps)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append([(tp.partition, tp.offset) for tp in offsets])

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        self.stored.append([(tp.partition, tp.offset, tp.metadata) for tp in offsets])
