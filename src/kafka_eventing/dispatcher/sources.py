"""A KafkaSource as the dispatcher's ``ChannelSource``: the source is the "channel", each of its topics a
subscriber — so the channel dispatcher runs a KafkaSource unchanged: ordered or unordered, retries, dead letters,
live updates, all topics' members in the source's one consumer group (``spec.consumerGroup``).

What a source adds is carried by its ``Subscriber``s: uid = the topic, ``topic`` and ``group`` set, the sink
(``status.sinkUri``, resolved by the controller like a Trigger's subscriber) as the subscriber URI with its audience
and CA certificates (``sinkAudience``, ``sinkCACerts``) and the source's identity (``status.auth``), no reply,
``convert`` (a record that is not a CloudEvent becomes one, as upstream converts it: core/kafkasources.py) and
``extensions`` (``ceOverrides.extensions``). The source's topics are consumed only once the controller reports
its sink resolved and the group's initial offsets committed (``kafkasources.DISPATCH_GATES``); until then they are
``held`` subscribers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Message

from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core.channel_source import FileChannelSource, Snapshot, SnapshotCache, documents
from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.core.conditions import gates_hold
from kafka_eventing.core.delivery import DeliverySpec, DeliverySpecError
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import identity_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordConverter:
    """``Subscriber.convert`` of one source (a value, so that an unchanged source compares equal)."""

    namespace: str
    name: str
    key_type: str

    def __call__(self, record: Message) -> ks.PlainEvent:
        return ks.convert_record(self.namespace, self.name, record, self.key_type)


def dispatch_hold(source: Mapping[str, Any]) -> str:
    """Why the controller's conditions do not let the source be consumed yet ("" when they do)."""
    return gates_hold((source.get("status") or {}).get("conditions"), ks.DISPATCH_GATES)


def source_channel(obj: Mapping[str, Any], *, standalone: bool = False) -> Channel:
    """The Channel of a KafkaSource. ``standalone`` (a YAML file, no controller): ``spec.sink.uri`` is the sink
    and there are no conditions to wait for. A spec that cannot be used is a channel that is not ready."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    generation, uid = int(meta.get("generation") or 0), str(meta.get("uid") or "")
    try:
        spec = ks.parse_source(obj)
    except ks.SourceSpecError as exc:  # the controller reports it too, as a condition
        return Channel(namespace=namespace, name=name, topic="", ready=False, reason=str(exc),
                       generation=generation, uid=uid)
    status = obj.get("status") or {}
    uri = status.get("sinkUri") or ((spec.sink.get("uri") or "") if standalone else "")
    hold = "" if standalone else dispatch_hold(obj)
    if not hold and not uri:
        hold = "no sink URI resolved yet"
    delivery = DeliverySpec()
    try:
        delivery = DeliverySpec.from_dict(spec.delivery, status.get("deadLetterSinkUri"), namespace)
    except DeliverySpecError as exc:
        hold = hold or f"invalid delivery: {exc}"
    convert = RecordConverter(namespace, name, spec.key_type)
    subscribers = tuple(
        Subscriber(uid=topic, subscriber_uri=str(uri), generation=generation, delivery=delivery,
                   ordered=spec.ordered, topic=topic, group=spec.consumer_group, convert=convert,
                   extensions=spec.extensions, rate_limit=spec.rate_limit, held=hold,
                   subscriber_audience=status.get("sinkAudience") or None,
                   subscriber_ca_certs=status.get("sinkCACerts") or None,
                   identity=identity_of(namespace, status.get("auth")))
        for topic in spec.topics)
    return Channel(namespace=namespace, name=name, topic=spec.topics[0], ordered=spec.ordered,
                   generation=generation, uid=uid, subscribers=subscribers)


class KubeSourceSource(SnapshotCache):
    """One KafkaSource (by name), watched; a snapshot of at most one entry."""

    def __init__(self, api_client: Any, namespace: str, name: str, *, watch_timeout_seconds: int = 240) -> None:
        super().__init__()
        from kubernetes import client

        from kafka_eventing.core.informer import Informer

        api = client.CustomObjectsApi(api_client)
        self.namespace, self.name = namespace, name
        self._rebuilding = threading.Lock()
        self.sources = Informer("kafkasource", api.list_namespaced_custom_object, self._changed,
                                on_list=self._rebuild, group=ks.GROUP, version=ks.VERSION, namespace=namespace,
                                plural=ks.PLURAL, field_selector=f"metadata.name={name}",
                                watch_timeout_seconds=watch_timeout_seconds)

    def start(self) -> None:
        self.sources.start()

    def stop(self) -> None:
        self.sources.stop()

    def _changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._rebuild()

    def _rebuild(self) -> None:
        with self._rebuilding:
            if not self.sources.synced():
                return
            obj = self.sources.get(self.namespace, self.name)
            snapshot: Snapshot = {}
            if obj is not None and not (obj.get("metadata") or {}).get("deletionTimestamp"):
                channel = source_channel(obj)
                snapshot[channel.key] = channel
            self._publish(snapshot)


class FileSourceSource(FileChannelSource):
    """One KafkaSource from a YAML file (standalone mode, as ``kafka-eventing run --source`` writes)."""

    def __init__(self, path: Path, settings: Settings, namespace: str, name: str,
                 poll_interval: float = 1.0) -> None:
        super().__init__(path, settings, poll_interval)
        self.namespace, self.name = namespace, name

    def _load(self) -> Snapshot:
        for doc in documents(self.path):
            meta = doc.get("metadata") or {}
            if (doc.get("kind") == ks.KIND and meta.get("name") == self.name
                    and (meta.get("namespace") or "default") == self.namespace):
                channel = source_channel(doc, standalone=True)
                return {channel.key: channel}
        return {}
