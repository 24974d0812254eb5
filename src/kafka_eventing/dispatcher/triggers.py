"""A Broker and its Triggers as the dispatcher's ``ChannelSource``: the Broker is the "channel" (its topic), each
Trigger a subscriber — served by ``broker_dispatcher.BrokerDispatcher``: one shared read, each Trigger a lane with
its own consumer group's offsets, ordered or unordered, retries, dead letters, live updates.

What a Trigger adds is carried by its ``Subscriber``: uid = the Trigger's name (its consumer group is
``knative-trigger-<namespace>-<name>``), the compiled filter (``event_filter``, compiled once per filter change),
replies to the Broker's own address with a hop TTL (``hop_ttl``), delivery merged field by field from the Trigger's
and the Broker's as upstream does (``core.delivery.trigger_delivery``), and its identity
(``status.auth.serviceAccountName``, in its namespace): the tokens of its deliveries, replies and dead letters are
that account's, never the dispatcher's. A Trigger's group joins only once the
controller reports its Broker, subscriber (``status.subscriberUri``) and dependency ready (``dispatch_hold``) and
its filter compiles; until then it is a ``held`` subscriber, which the dispatcher reports (ConsumerGroupReady=False)
and does not consume for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kafka_eventing.broker.filters import FilterError, RecordFilter, TriggerFilters
from kafka_eventing.core import brokers as kb
from kafka_eventing.core.channel_source import FileChannelSource, Snapshot, SnapshotCache, documents
from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.core.conditions import gates_hold
from kafka_eventing.core.delivery import DeliverySpec, DeliverySpecError, rate_limit_annotation, trigger_delivery
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import identity_of

log = logging.getLogger(__name__)


def dispatch_hold(trigger: Mapping[str, Any]) -> str:
    """Why the controller's conditions do not let this Trigger be consumed yet ("" when they do).

    Each of ``DISPATCH_GATES`` must be True: a Trigger whose Broker, subscriber or dependency is not ready gets
    nothing until it is. Ready itself is not waited for, since it includes the dispatcher's own ConsumerGroupReady.
    """
    return gates_hold((trigger.get("status") or {}).get("conditions"), kb.DISPATCH_GATES)


def trigger_subscriber(trigger: Mapping[str, Any], broker: Mapping[str, Any], filters: TriggerFilters,
                       reply_uri: str | None, *, standalone: bool = False,
                       reply_audience: str | None = None, reply_ca_certs: str | None = None) -> Subscriber:
    """The Subscriber of a Trigger; ``held`` says why it may not be consumed yet (a controller condition not True,
    no subscriber URI, a filter or delivery that does not parse), so that the dispatcher reports it.

    ``standalone`` (a YAML file, no controller to resolve refs or report conditions): ``spec.subscriber.uri`` is
    the URI and there are no conditions to wait for. ``reply_audience`` set (the Broker's ingress checks tokens):
    the Trigger is held until the controller has given it an identity, since its replies need that identity's
    token."""
    meta, spec = trigger.get("metadata") or {}, trigger.get("spec") or {}
    status = trigger.get("status") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    generation = int(meta.get("generation") or 0)
    uri = status.get("subscriberUri") or ((spec.get("subscriber") or {}).get("uri") if standalone else None)
    hold = "" if standalone else dispatch_hold(trigger)
    if not hold and not uri:
        hold = "no subscriber URI resolved yet"
    try:
        compiled = filters.get((namespace, name), spec)
    except FilterError as exc:
        hold = hold or f"invalid filter: {exc}"  # the controller reports it too (SubscriptionReady=False)
    delivery_spec = trigger_delivery(spec.get("delivery"), (broker.get("spec") or {}).get("delivery"))
    try:
        # A dead-letter sink ref without a namespace is in the Trigger's (Knative's rule), never "default".
        delivery = DeliverySpec.from_dict(delivery_spec, status.get("deadLetterSinkUri"), namespace,
                                          dead_letter_audience=status.get("deadLetterSinkAudience"),
                                          dead_letter_ca_certs=status.get("deadLetterSinkCACerts"))
    except DeliverySpecError as exc:
        hold = hold or f"invalid delivery: {exc}"
    try:
        rate_limit = rate_limit_annotation(meta.get("annotations"))
    except DeliverySpecError as exc:
        hold = hold or str(exc)  # the controller reports it too (SubscriptionReady=False, InvalidRateLimit)
    identity = identity_of(namespace, status.get("auth"))
    if not hold and not standalone and reply_audience and identity is None:
        hold = "no OIDC identity yet (status.auth.serviceAccountName): its replies need its own token"
    if hold:
        return Subscriber(uid=name, subscriber_uri=str(uri or ""), generation=generation, held=hold)
    order = str((meta.get("annotations") or {}).get(kb.ANNOTATION_DELIVERY_ORDER) or "unordered").lower()
    return Subscriber(uid=name, subscriber_uri=str(uri), generation=generation,
                      reply_uri=reply_uri, delivery=delivery, ordered=order == "ordered", rate_limit=rate_limit,
                      event_filter=RecordFilter(compiled), hop_ttl=True,
                      subscriber_audience=status.get("subscriberAudience")
                      or (spec.get("subscriber") or {}).get("audience") or None,
                      reply_audience=reply_audience, reply_ca_certs=reply_ca_certs, identity=identity,
                      subscriber_ca_certs=status.get("subscriberCACerts")
                      or (spec.get("subscriber") or {}).get("CACerts") or None)


def broker_channel(broker: Mapping[str, Any], triggers: list[Mapping[str, Any]], filters: TriggerFilters,
                   reply_uri: str | None = None, *, standalone: bool = False,
                   authenticated: bool = False) -> Channel | None:
    """``authenticated``: the ingress checks tokens, so replies carry one for the Broker's audience."""
    base = kb.broker_ingress(broker, reconciled=not standalone)
    if base is None:
        return None
    name = base.name
    address = (broker.get("status") or {}).get("address") or {}
    reply = reply_uri or address.get("url")
    # Replies go into the Broker's ingress: over HTTPS, verified with the CA it publishes.
    reply_ca = address.get("CACerts") if str(reply or "").startswith("https://") else None
    subscribers = []
    for trigger in sorted(triggers, key=lambda t: str((t.get("metadata") or {}).get("name"))):
        if kb.trigger_broker(trigger) != name or (trigger.get("metadata") or {}).get("deletionTimestamp"):
            continue
        subscribers.append(trigger_subscriber(trigger, broker, filters, reply, standalone=standalone,
                                              reply_audience=base.token_audience if authenticated else None,
                                              reply_ca_certs=reply_ca))
    return Channel(namespace=base.namespace, name=name, topic=base.topic, ready=base.ready, reason=base.reason,
                   ordered=False, generation=base.generation, uid=base.uid, subscribers=tuple(subscribers))


class KubeTriggerSource(SnapshotCache):
    """One Broker (by name) and the Triggers of its namespace, watched; a snapshot of at most one entry."""

    def __init__(self, api_client: Any, namespace: str, name: str, *, reply_uri: str | None = None,
                 watch_timeout_seconds: int = 240, authenticated: bool = False) -> None:
        super().__init__()
        from kubernetes import client

        from kafka_eventing.core.informer import Informer

        api = client.CustomObjectsApi(api_client)
        self.namespace, self.name, self.reply_uri = namespace, name, reply_uri
        self.authenticated = authenticated
        self.filters = TriggerFilters()
        self._rebuilding = threading.Lock()
        common: dict[str, Any] = {"group": kb.GROUP, "version": kb.VERSION, "namespace": namespace,
                  "watch_timeout_seconds": watch_timeout_seconds}
        self.brokers = Informer("broker", api.list_namespaced_custom_object, self._changed,
                                on_list=self._rebuild, plural=kb.BROKERS, field_selector=f"metadata.name={name}",
                                **common)
        self.triggers = Informer("triggers", api.list_namespaced_custom_object, self._changed,
                                 on_list=self._rebuild, plural=kb.TRIGGERS, **common)

    def start(self) -> None:
        self.brokers.start()
        self.triggers.start()

    def stop(self) -> None:
        self.brokers.stop()
        self.triggers.stop()

    def _changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._rebuild()

    def _rebuild(self) -> None:
        with self._rebuilding:  # two informer threads call in
            self._rebuild_locked()

    def _rebuild_locked(self) -> None:
        if not (self.brokers.synced() and self.triggers.synced()):
            return
        broker = self.brokers.get(self.namespace, self.name)
        snapshot: Snapshot = {}
        if broker is not None:
            channel = broker_channel(broker, self.triggers.items(), self.filters, self.reply_uri,
                                     authenticated=self.authenticated)
            if channel is not None:
                snapshot[channel.key] = channel
        self._publish(snapshot)


class FileTriggerSource(FileChannelSource):
    """One Broker and its Triggers from a YAML file (standalone mode, as ``kafka-eventing run --broker`` writes)."""

    def __init__(self, path: Path, settings: Settings, namespace: str, name: str,
                 poll_interval: float = 1.0, *, authenticated: bool = False) -> None:
        super().__init__(path, settings, poll_interval)
        self.namespace, self.name = namespace, name
        self.authenticated = authenticated
        self.filters = TriggerFilters()

    def _load(self) -> Snapshot:
        docs = documents(self.path)
        broker = next((d for d in docs if d.get("kind") == "Broker"
                       and (d.get("metadata") or {}).get("name") == self.name
                       and ((d.get("metadata") or {}).get("namespace") or "default") == self.namespace), None)
        triggers = [d for d in docs if d.get("kind") == "Trigger"
                    and ((d.get("metadata") or {}).get("namespace") or "default") == self.namespace]
        channel = None if broker is None else broker_channel(broker, triggers, self.filters, standalone=True,
                                                             authenticated=self.authenticated)
        return {} if channel is None else {channel.key: channel}
