"""KafkaChannel as the data plane sees it, read from the API server's objects or from a YAML file.

Standalone mode uses a YAML file holding the very same KafkaChannel documents one would ``kubectl apply``
(multi-document or a ``kind: List``), so the two sources share one parser.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from kafka_eventing.core.binding import ContentMode
from kafka_eventing.core.delivery import (
    DeliverySpec,
    DeliverySpecError,
    parse_rate_limit,
    rate_limit_annotation,
)
from kafka_eventing.core.kafka_config import ConnectionRef
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import Identity, identity_of

GROUP = "messaging.knative.dev"
KIND = "KafkaChannel"
PLURAL = "kafkachannels"
ANNOTATION_ORDER = "kafka.eventing.knative.dev/delivery.order"
ANNOTATION_CONTENT_MODE = "kafka.eventing.knative.dev/content.mode"
ANNOTATION_EXTERNAL_TOPIC = "kafka.eventing.knative.dev/external.topic"
CHANNEL_HOST_SUFFIX = "-kn-channel"

ChannelKey = tuple[str, str]  # (namespace, name)


class ChannelSpecError(ValueError):
    """A channel document cannot be used; the message names the channel and the field."""


@dataclass(frozen=True)
class Subscriber:
    uid: str
    subscriber_uri: str
    generation: int = 0
    reply_uri: str | None = None
    delivery: DeliverySpec = field(default_factory=DeliverySpec)
    ordered: bool = True
    rate_limit: float | None = None  # events per second; None = unlimited
    #: A Broker Trigger's compiled filter over the Kafka record (None: every event); a rejected record is
    #: committed without delivery.
    event_filter: Callable[[Any], bool] | None = None
    #: Broker delivery: events carry a hop TTL (``knativebrokerttl``); one at 0 is dropped, a reply gets one less.
    hop_ttl: bool = False
    #: Why this subscriber must not be consumed yet ("" when it may): a Trigger that the controller does not
    #: report ready for dispatch, or whose filter or delivery is invalid. Reported, never joined.
    held: str = ""
    #: A KafkaSource's: the topic this subscriber reads ("" = the channel's) and its consumer group ("" = derived).
    topic: str = ""
    group: str = ""
    #: A KafkaSource's: turns a record that is not a CloudEvent into one (``kafkasources.PlainEvent``) instead of
    #: dropping it; called with the consumed record.
    convert: Callable[[Any], Any] | None = None
    #: ``ceOverrides.extensions``: set on every event delivered (and dead-lettered).
    extensions: tuple[tuple[str, str], ...] = ()
    #: Audiences a token is sent for (``subscriberAudience``, ``replyAudience``); None: no token.
    subscriber_audience: str | None = None
    reply_audience: str | None = None
    #: Whose tokens those are, for the subscriber, the reply and the dead-letter sink alike: the sending resource's
    #: OIDC ServiceAccount (a Trigger's or KafkaSource's ``status.auth``, a Subscription's ``auth`` in the channel's
    #: ``spec.subscribers``); None: no token is sent.
    identity: Identity | None = None
    #: PEM CA certificates trusted for an ``https://`` subscriber / reply (``subscriberCACerts``,
    #: ``replyCACerts``) besides the system's; None: the system's only.
    subscriber_ca_certs: str | None = None
    reply_ca_certs: str | None = None


@dataclass(frozen=True)
class Channel:
    namespace: str
    name: str
    topic: str
    ready: bool = True
    reason: str = ""
    content_mode: ContentMode = ContentMode.BINARY
    ordered: bool = True
    num_partitions: int = 1
    generation: int = 0
    uid: str = ""
    subscribers: tuple[Subscriber, ...] = ()
    #: the audience a token must name to send to this channel; empty: ``default_audience``.
    audience: str = ""
    #: the Kafka cluster its events go to when it is not the receiver's own (a Broker's or KafkaSink's config).
    connection: ConnectionRef | None = None
    #: its labels, sorted: what an EventPolicy's ``to[].selector`` matches.
    labels: tuple[tuple[str, str], ...] = ()
    #: a record's key falls back to the event's ``subject`` without a ``partitionkey`` (channels and Brokers); a
    #: KafkaSink's records are keyed by ``partitionkey`` only, as upstream's — on a compacted topic a subject key would
    #: collapse distinct events into one.
    subject_key: bool = True

    @property
    def token_audience(self) -> str:
        return self.audience or default_audience(self.namespace, self.name)

    @property
    def key(self) -> ChannelKey:
        return (self.namespace, self.name)

    @property
    def host(self) -> str:
        return f"{self.name}{CHANNEL_HOST_SUFFIX}.{self.namespace}.svc.cluster.local"


def knative_audience(group: str, kind: str, namespace: str, name: str) -> str:
    """Knative's audience of an addressable: ``<group>/<kind>/<namespace>/<name>``, lower-cased — what upstream
    publishes in ``status.address.audience`` when OIDC authentication is on."""
    return f"{group}/{kind}/{namespace}/{name}".lower()


def labels_of(meta: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items()))


def default_audience(namespace: str, name: str) -> str:
    """A KafkaChannel's audience (``knative_audience``)."""
    return knative_audience(GROUP, KIND, namespace, name)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _ordered(value: str | None, where: str, default: bool = True) -> bool:
    if value is None or value == "":
        return default
    low = value.lower()
    if low not in ("ordered", "unordered"):
        raise ChannelSpecError(f"{where}: delivery order {value!r} must be 'ordered' or 'unordered'")
    return low == "ordered"


def channel_from_resource(obj: Mapping[str, Any], settings: Settings, *, reconciled: bool = False) -> Channel:
    """Build a Channel from a KafkaChannel object (dict as returned by the API or read from YAML).

    ``reconciled``: readiness must come from the controller's status (objects from the API server). Until the
    controller reports TopicReady the topic may not exist — or a broker that auto-creates topics would make one
    with its own defaults — so such a channel is known but not ready (503). A standalone YAML has no controller:
    without status it is ready."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not name:
        raise ChannelSpecError("KafkaChannel without metadata.name")
    where = f"KafkaChannel {namespace}/{name}"
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec: Mapping[str, Any] = obj.get("spec") or {}
    status: Mapping[str, Any] = obj.get("status") or {}

    topic = annotations.get(ANNOTATION_EXTERNAL_TOPIC) or settings.topic_for(namespace, name)
    mode_raw = annotations.get(ANNOTATION_CONTENT_MODE, ContentMode.BINARY.value)
    try:
        mode = ContentMode(mode_raw.lower())
    except ValueError:
        raise ChannelSpecError(f"{where}: content mode {mode_raw!r} must be binary or structured") from None
    ordered = _ordered(annotations.get(ANNOTATION_ORDER), where)

    # Readiness for the data plane: the topic must exist.
    ready, reason = True, ""
    if status.get("conditions") or reconciled:
        cond = _condition(status, "TopicReady") or _condition(status, "Ready")
        ready = cond is not None and str(cond.get("status")) == "True"
        if cond is None:
            reason = "not reconciled yet: the controller has not reported TopicReady"
        elif not ready:
            reason = cond.get("message") or cond.get("reason") or "topic not ready"

    try:
        channel_delivery = DeliverySpec.from_dict(spec.get("delivery"), status.get("deadLetterSinkUri"), namespace,
                                                  status.get("deadLetterSinkAudience"),
                                                  dead_letter_ca_certs=status.get("deadLetterSinkCACerts"))
        rate = rate_limit_annotation(annotations)  # every subscriber's, unless its own rateLimit says otherwise
        subscribers = tuple(
            _subscriber(sub, channel_delivery, ordered, where, namespace, rate_limit=rate)
            for sub in spec.get("subscribers") or ()
        )
    except DeliverySpecError as exc:
        raise ChannelSpecError(f"{where}: {exc}") from None
    partitions = spec.get("numPartitions", 1)
    return Channel(
        namespace=namespace, name=name, topic=topic, ready=ready, reason=reason, content_mode=mode,
        ordered=ordered, num_partitions=int(partitions), generation=int(meta.get("generation") or 0),
        uid=str(meta.get("uid") or ""), subscribers=subscribers,
        # What the channel publishes as its address's audience is what senders ask tokens for.
        audience=str((status.get("address") or {}).get("audience") or ""), labels=labels_of(meta),
    )


def _subscriber(sub: Mapping[str, Any], default: DeliverySpec, ordered: bool, where: str,
                namespace: str, *, rate_limit: float | None = None) -> Subscriber:
    uid, uri = sub.get("uid"), sub.get("subscriberUri")
    if not uid or not uri:
        raise ChannelSpecError(f"{where}: every subscriber needs uid and subscriberUri")
    delivery = DeliverySpec.from_dict(sub["delivery"], namespace=namespace) if sub.get("delivery") else default
    if delivery.dead_letter_uri is None and not delivery.dead_letter_problem:
        # No sink of its own: the channel's (or its problem).
        delivery = replace(delivery, dead_letter_uri=default.dead_letter_uri,
                           dead_letter_problem=default.dead_letter_problem,
                           dead_letter_audience=default.dead_letter_audience,
                           dead_letter_ca_certs=default.dead_letter_ca_certs)
    rate = parse_rate_limit(sub.get("rateLimit"), f"subscriber {uid} rateLimit")
    return Subscriber(
        uid=str(uid), subscriber_uri=str(uri), generation=int(sub.get("generation") or 0),
        reply_uri=sub.get("replyUri"), delivery=delivery,
        ordered=_ordered(sub.get("deliveryOrder"), f"{where} subscriber {uid}", ordered),
        rate_limit=rate if rate is not None else rate_limit,
        subscriber_audience=sub.get("subscriberAudience") or None, reply_audience=sub.get("replyAudience") or None,
        subscriber_ca_certs=sub.get("subscriberCACerts") or None, reply_ca_certs=sub.get("replyCACerts") or None,
        # A Subscription is in its channel's namespace; Knative's Subscription controller writes its account here.
        identity=identity_of(namespace, sub.get("auth")),
    )


def parse_documents(docs: Iterable[Any], settings: Settings) -> dict[ChannelKey, Channel]:
    out: dict[ChannelKey, Channel] = {}
    for doc in docs:
        if not doc:
            continue
        items = doc.get("items", []) if doc.get("kind") == "List" else [doc]
        for item in items:
            if item.get("kind") != KIND:
                continue
            channel = channel_from_resource(item, settings)
            out[channel.key] = channel
    return out


def load_channels_file(path: Path, settings: Settings) -> dict[ChannelKey, Channel]:
    """All KafkaChannels in a YAML file (multi-document or List)."""
    try:
        with path.open() as fh:
            return parse_documents(yaml.safe_load_all(fh), settings)
    except yaml.YAMLError as exc:
        raise ChannelSpecError(f"{path}: not valid YAML: {exc}") from None


def channel_key_from_host(host: str) -> ChannelKey | None:
    """``<name>-kn-channel.<namespace>.svc[.cluster.local][:port]`` → (namespace, name)."""
    hostname = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    parts = hostname.lower().split(".")
    if len(parts) < 2 or not parts[0].endswith(CHANNEL_HOST_SUFFIX):
        return None
    rest = parts[2:]
    if rest and rest[0] != "svc":  # svc, svc.cluster.local or any other cluster domain
        return None
    name = parts[0][: -len(CHANNEL_HOST_SUFFIX)]
    if not name or not parts[1]:
        return None
    return (parts[1], name)
