"""Reconcile ResetOffsets (``core/resetoffsets.py``): resolve ``spec.ref`` to the consumer group, its topic and the
dispatcher that owns the group, validate, and hand the reset over by writing ``status.target`` with
``Accepted=True``; the dispatcher carries it out (``dispatcher/resets.py``) and reports Resetting and Done.

A ref is a Subscription of a KafkaChannel (its subscription's group), a Trigger of a Kafka Broker (the Trigger's
group) or a KafkaSource (``spec.consumerGroup``, over all its topics, carried out by the source's dispatcher).
Refused, with ``Accepted=False`` and nothing moved: a ref that does not exist (RefNotFound), a KafkaSource whose
spec cannot be used (InvalidRef), a kind that is not
supported (UnsupportedRef; a Subscription whose channel is not a KafkaChannel too), a Trigger of a Broker of
another class (NotKafkaBroker), a time that is not RFC 3339, ``earliest`` or ``latest`` (InvalidTime), and a
second reset of a group while one is pending (ResetInProgress). Refusals are final for the generation; an edit of
the spec is looked at again. Each generation is accepted once and never again once done.

Every kind of ref resolves in ``resolve_ref``: a new kind is one more branch returning a ``Target``.
Refs are read straight from the API (a ResetOffset is rare; no cache of Subscriptions is worth keeping).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller.api import MERGE_PATCH, CustomObjects, LostLeadership
from kafka_eventing.controller.host import Host, Kind, enqueue_object
from kafka_eventing.controller.reconciler import Result
from kafka_eventing.core import brokers as kb
from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core.channels import GROUP as CHANNEL_GROUP
from kafka_eventing.core.channels import PLURAL as CHANNEL_PLURAL
from kafka_eventing.core.channels import ChannelSpecError, channel_from_resource
from kafka_eventing.core.conditions import Condition, merge
from kafka_eventing.core.informer import Store
from kafka_eventing.core.settings import Settings

log = logging.getLogger(__name__)

CHANNEL_VERSION = "v1beta1"
Reader = Callable[[str, str, str, str, str], Mapping[str, Any] | None]


class ResetOffsetReconciler:
    def __init__(self, api_client: client.ApiClient, settings: Settings, resets: Store,
                 may_write: Callable[[], bool], *, read: Reader | None = None) -> None:
        self.settings = settings
        self.resets = resets
        self.may_write = may_write
        custom = client.CustomObjectsApi(api_client)
        self.api = CustomObjects(custom, ro.GROUP, ro.VERSION, ro.PLURAL)
        self._custom = custom
        self._read = read or self._get

    def _get(self, group: str, version: str, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return CustomObjects(self._custom, group, version, plural).get(namespace, name)

    def reconcile(self, namespace: str, name: str) -> Result:
        obj = self.resets.get(namespace, name)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        generation = ro.generation_of(obj)
        status = obj.get("status") or {}
        if ro.is_finished(obj) or (int(status.get("observedGeneration") or 0) == generation
                                   and ro.pending_target(obj) is not None):
            return Result()  # done, refused, or the dispatcher's turn: never accepted twice
        try:
            spec = ro.parse_spec(obj)
            target = self.resolve_ref(namespace, spec.ref)
        except ro.SpecError as exc:
            self._write(obj, Condition.false(ro.ACCEPTED, exc.reason, str(exc)), None)
            return Result()
        busy = self._pending_for(target.group, namespace, name)
        if busy:
            self._write(obj, Condition.false(
                ro.ACCEPTED, ro.REASON_IN_PROGRESS,
                f"ResetOffset {busy} is resetting consumer group {target.group}; try again once it is done"), None)
            return Result()
        self._write(obj, Condition.true(ro.ACCEPTED, ro.REASON_ACCEPTED,
                                        f"{spec.ref} resolves to consumer group {target.group} on "
                                        f"{', '.join(target.topics)}"), target)
        return Result()

    # -- refs ---------------------------------------------------------------------------------------
    def resolve_ref(self, namespace: str, ref: ro.Ref) -> ro.Target:
        """(consumer group, topics, owning dispatcher) of the ref, or ``SpecError`` with the reason."""
        if ref.api == ro.SUBSCRIPTION:
            return self._subscription(namespace, ref)
        if ref.api == ro.TRIGGER:
            return self._trigger(namespace, ref)
        if ref.api == ro.KAFKA_SOURCE:
            return self._kafka_source(namespace, ref)
        raise ro.SpecError(ro.REASON_UNSUPPORTED_REF,
                           f"spec.ref {ref.group}/{ref.version} {ref.kind} is not supported: name a "
                           "messaging.knative.dev/v1 Subscription of a KafkaChannel, an eventing.knative.dev/v1 "
                           "Trigger of a Kafka Broker or a sources.knative.dev/v1 KafkaSource")

    def _subscription(self, namespace: str, ref: ro.Ref) -> ro.Target:
        group, version, plural = ro.SUBSCRIPTION_API
        sub = self._read_ref(group, ref.version or version, plural, namespace, ref)
        channel_ref = (sub.get("spec") or {}).get("channel") or {}
        if channel_ref.get("kind") != ro.KAFKA_CHANNEL_KIND:
            raise ro.SpecError(ro.REASON_UNSUPPORTED_REF,
                               f"Subscription {ref.name} subscribes to a {channel_ref.get('kind') or 'channel'}, "
                               "not a KafkaChannel")
        channel_name = str(channel_ref.get("name") or "")
        channel = self._read(CHANNEL_GROUP, CHANNEL_VERSION, CHANNEL_PLURAL, namespace, channel_name)
        if channel is None:
            raise ro.SpecError(ro.REASON_REF_NOT_FOUND,
                               f"KafkaChannel {namespace}/{channel_name} of Subscription {ref.name} does not exist")
        try:
            topic = channel_from_resource(channel, self.settings).topic
        except ChannelSpecError as exc:
            raise ro.SpecError(ro.REASON_REF_NOT_FOUND, f"KafkaChannel {channel_name}: {exc}") from None
        uid = str((sub.get("metadata") or {}).get("uid") or "")
        return ro.Target(self.settings.consumer_group_for(namespace, channel_name, uid), (topic,),
                         ro.KAFKA_CHANNEL_KIND, namespace, channel_name)

    def _trigger(self, namespace: str, ref: ro.Ref) -> ro.Target:
        trigger = self._read_ref(kb.GROUP, kb.VERSION, kb.TRIGGERS, namespace, ref)
        broker_name = kb.trigger_broker(trigger)
        broker = self._read(kb.GROUP, kb.VERSION, kb.BROKERS, namespace, broker_name) if broker_name else None
        if broker is None:
            raise ro.SpecError(ro.REASON_REF_NOT_FOUND,
                               f"Broker {namespace}/{broker_name} of Trigger {ref.name} does not exist")
        if not kb.is_kafka_broker(broker):
            cls = ((broker.get("metadata") or {}).get("annotations") or {}).get(kb.ANNOTATION_BROKER_CLASS)
            raise ro.SpecError(ro.REASON_NOT_KAFKA,
                               f"Trigger {ref.name} belongs to Broker {broker_name} of class {cls or '(none)'}, not "
                               f"{kb.BROKER_CLASS}: its consumer group is not this project's")
        return ro.Target(kb.trigger_group(namespace, ref.name), (kb.topic_of(broker),), "Broker", namespace,
                         broker_name)

    def _kafka_source(self, namespace: str, ref: ro.Ref) -> ro.Target:
        """A KafkaSource's one consumer group (``spec.consumerGroup``) over all its topics, carried out by the
        source's own dispatcher."""
        source = self._read_ref(ks.GROUP, ref.version if ref.version in ks.VERSIONS else ks.VERSION, ks.PLURAL,
                                namespace, ref)
        try:
            spec = ks.parse_source(source)
        except ks.SourceSpecError as exc:
            raise ro.SpecError(ro.REASON_INVALID_REF, f"KafkaSource {ref.name} cannot be reset: {exc}") from None
        return ro.Target(spec.consumer_group, spec.topics, ro.KAFKA_SOURCE_KIND, namespace, ref.name)

    def _read_ref(self, group: str, version: str, plural: str, namespace: str, ref: ro.Ref) -> Mapping[str, Any]:
        try:
            found = self._read(group, version, plural, namespace, ref.name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            found = None  # the type itself is not served
        if found is None:
            raise ro.SpecError(ro.REASON_REF_NOT_FOUND, f"{ref.kind} {namespace}/{ref.name} does not exist")
        return found

    def _pending_for(self, group: str, namespace: str, name: str) -> str | None:
        for other in self.resets.items():
            meta = other.get("metadata") or {}
            if meta.get("namespace") != namespace or meta.get("name") == name:
                continue
            target = ro.pending_target(other)
            if target is not None and target.group == group:
                return str(meta.get("name"))
        return None

    # -- status -------------------------------------------------------------------------------------
    def _write(self, obj: Mapping[str, Any], accepted: Condition, target: ro.Target | None) -> None:
        if not self.may_write():
            raise LostLeadership
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        new_generation = int(status.get("observedGeneration") or 0) != ro.generation_of(obj)
        # A new generation starts afresh: the last one's Resetting/Done/partitions are not this one's.
        previous = [c for c in status.get("conditions") or () if c.get("type") == ro.ACCEPTED or not new_generation]
        conditions = [accepted]
        if accepted.is_true:
            waiting = f"waiting for the dispatcher of {target.dispatcher_kind} {target.dispatcher_name}" \
                if target else ""
            conditions += [Condition.unknown(ro.RESETTING, ro.REASON_WAITING, waiting),
                           Condition.unknown(ro.DONE, ro.REASON_WAITING, waiting)]
        else:
            conditions += [Condition.false(ro.DONE, accepted.reason, accepted.message)]
        body: dict[str, Any] = {
            "observedGeneration": ro.generation_of(obj),
            "conditions": merge(previous, conditions),
            "target": target.to_status() if target is not None else None,
            "partitions": None,
            "executor": None,
        }
        log.info("resetoffset", extra={"resetoffset": f"{meta.get('namespace')}/{meta.get('name')}",
                                       "accepted": accepted.status, "reason": accepted.reason})
        self.api.api.patch_namespaced_custom_object_status(
            ro.GROUP, ro.VERSION, str(meta.get("namespace")), ro.PLURAL, str(meta.get("name")),
            {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": body},
            _content_type=MERGE_PATCH, _request_timeout=(5, 30))


def setup(host: Host) -> None:
    """Cache ResetOffsets (an optional CRD)."""
    resets = host.informer(ro.KIND, host.base.custom.list_cluster_custom_object, group=ro.GROUP, version=ro.VERSION,
                           plural=ro.PLURAL)
    reconciler = ResetOffsetReconciler(host.api_client, host.settings, resets, host.is_leader)
    host.reconciles(ro.KIND, reconciler.reconcile)
    host.on(ro.KIND, enqueue_object(host, ro.KIND))


KIND_RESET_OFFSET = Kind(ro.KIND, "resetoffsets", ro.GROUP, ro.VERSION, frozenset({ro.PLURAL}), setup)
