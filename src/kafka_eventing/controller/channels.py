"""The KafkaChannel kind: topic, channel Service, dispatcher Deployment and Service, status — level-based and
idempotent, on the shared machinery of ``controller/reconciler.py``.

Reads come from the controller's caches; writes go to the API and are made only when the desired object's hash
differs from the one recorded on the live object. The status is patched with a JSON merge patch holding only the
fields the controller owns, so ``status.subscribers`` (written by the dispatchers) is never touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from kubernetes.client.rest import ApiException
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import HTTP_NOT_FOUND, api_error
from kafka_eventing.controller.autoscaler import keda_scaled
from kafka_eventing.controller.connection import ResolvedConnection
from kafka_eventing.controller.dependencies import dead_letter_sink_waits, watch_dependencies
from kafka_eventing.controller.host import Host, Kind, enqueue_object, on_policies, readiness
from kafka_eventing.controller.identities import IdentityError
from kafka_eventing.controller.reconciler import (
    STOP_RECHECK_SECONDS,
    TOPIC_NOT_FOUND,
    Reconciler,
    Result,
    TopicWait,
    dead_letter_status,
)
from kafka_eventing.controller.topics import TopicError, TopicSpec, ensure_topic
from kafka_eventing.core.channels import (
    ANNOTATION_EXTERNAL_TOPIC,
    GROUP,
    KIND,
    PLURAL,
    ChannelSpecError,
    channel_from_resource,
    default_audience,
)
from kafka_eventing.core.conditions import Condition
from kafka_eventing.core.durations import DurationError, parse_duration
from kafka_eventing.core.informer import Store
from kafka_eventing.core.kafka_config import KafkaConfigError
from kafka_eventing.core.settings import TopicManagement

log = logging.getLogger(__name__)

VERSION = "v1beta1"
CHANNEL_API = (GROUP, VERSION, PLURAL)
FINALIZER = "kafkachannels.messaging.knative.dev/finalizer"


class ChannelReconciler:
    def __init__(self, base: Reconciler, channels: Store, *, topic_recheck_seconds: float = 60.0) -> None:
        self.base, self.settings, self.channels = base, base.settings, channels
        self.topic_recheck_seconds = topic_recheck_seconds
        # channel → (what was verified, when): events about a channel's Deployment or Services need no Kafka
        # round trip; a spec or connection change, an error, or the recheck interval brings one.
        self._verified: dict[tuple[str, str], tuple[tuple[Any, ...], float]] = {}
        self.topic_ops: dict[str, int] = {}
        #: channels whose external topic does not exist yet: looked for again within seconds
        self.topic_wait = TopicWait()

    # -- entry --------------------------------------------------------------------------------------
    def reconcile(self, namespace: str, name: str) -> Result:
        obj = self.channels.get(namespace, name)
        if obj is None:
            self.topic_wait.forget(namespace, name)
            return Result()  # deleted; the finalizer cleaned up before the object went away
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            self.topic_wait.forget(namespace, name)
            return self._finalize(obj)
        if FINALIZER not in (meta.get("finalizers") or ()):
            obj = self._add_finalizer(obj)
        return self._reconcile_live(obj)

    # -- live channel -------------------------------------------------------------------------------
    def _reconcile_live(self, obj: Mapping[str, Any]) -> Result:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        ref = res.ChannelRef(meta["namespace"], meta["name"], str(meta.get("uid") or ""))
        conditions: list[Condition] = []
        status: dict[str, Any] = {"observedGeneration": meta.get("generation")}
        result = Result()
        write_errors: list[str] = []

        try:
            channel_from_resource(obj, self.settings)
            conditions.append(Condition.true(cond.CONFIG_PARSED))
        except ChannelSpecError as exc:
            conditions.append(Condition.false(cond.CONFIG_PARSED, "InvalidChannelSpec", str(exc)))

        partitions = int(spec.get("numPartitions") or 1)
        connection: ResolvedConnection | None = None
        try:
            connection = self.base.default_connection()
        except KafkaConfigError as exc:
            conditions.append(Condition.false(cond.TOPIC_READY, "KafkaConfigInvalid", str(exc)))
            result = Result(error=str(exc))
        if connection is not None:
            topic_cond, topic_result = self._topic(obj, connection)
            conditions.append(topic_cond)
            result = topic_result

        # Channel Service and address.
        svc_cond, url = self._channel_service(ref, write_errors)
        conditions.append(svc_cond)
        if url:
            status["address"] = res.address(self.settings, url)
            if self.settings.auth_issuer:
                # Ingress auth is on: senders ask for tokens of this audience (Knative's format).
                status["address"]["audience"] = default_audience(ref.namespace, ref.name)
            conditions.append(Condition.true(cond.ADDRESSABLE))
        else:
            status["address"] = None
            conditions.append(Condition.false(cond.ADDRESSABLE, "ChannelServiceNotReady", svc_cond.message))

        # Dispatcher Deployment + Service (the Deployment needs the connection's Secret name and checksum).
        if connection is not None:
            conditions.extend(self._dispatcher(ref, obj, connection, partitions, write_errors))
        else:
            conditions.append(Condition.unknown(cond.DISPATCHER_DEPLOYMENT_READY, "KafkaConfigInvalid",
                                                "waiting for a usable Kafka connection config"))
            conditions.append(Condition.unknown(cond.DISPATCHER_SERVICE_READY, "KafkaConfigInvalid",
                                                "waiting for a usable Kafka connection config"))

        system, receiver_name = self.settings.system_namespace, self.settings.receiver_deployment_name
        receiver = self.base.stores.deployments.get(system, receiver_name)
        ok, why = res.deployment_available(receiver)
        conditions.append(Condition.true(cond.RECEIVER_DEPLOYMENT_READY) if ok else Condition.false(
            cond.RECEIVER_DEPLOYMENT_READY, "ReceiverDeploymentUnavailable",
            f"receiver Deployment {system}/{receiver_name}: {why}"))

        dls = self.base.dead_letter_sink(ref.namespace, spec)
        if dls is not None:
            conditions.append(dls[0])
        status.update(dead_letter_status(dls[1] if dls else None))

        # The Subscriptions' OIDC accounts (Knative's Subscription controller names them here) may be sent as.
        accounts = [str(a["serviceAccountName"]) for sub in spec.get("subscribers") or ()
                    if (a := sub.get("auth") or {}).get("serviceAccountName")]
        try:
            self.base.identities.grant(ref.namespace, accounts)
        except IdentityError as exc:
            write_errors.append(str(exc))
        conditions.append(cond.ready_condition(conditions))
        self.base.event_policies(GROUP, KIND, obj, status, conditions)  # informational: not part of Ready
        self.base.patch_status(obj, status, conditions, CHANNEL_API)
        if write_errors and result.error is None:
            # A refused API write (quota, admission, a transient 5xx) is retried with backoff like Kafka errors.
            return Result(error="; ".join(write_errors))
        return result

    def _topic(self, obj: Mapping[str, Any], connection: ResolvedConnection) -> tuple[Condition, Result]:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        external = (meta.get("annotations") or {}).get(ANNOTATION_EXTERNAL_TOPIC)
        topic = self._topic_name(meta)
        manage = self.settings.topic_management is TopicManagement.ADMIN and not external
        try:
            retention = parse_duration(str(spec.get("retentionDuration") or "PT168H"), "retentionDuration")
        except DurationError as exc:
            return Condition.false(cond.TOPIC_READY, "InvalidRetention", str(exc)), Result()
        retention_ms = int(retention / timedelta(milliseconds=1))
        if retention_ms <= 0:
            return Condition.false(cond.TOPIC_READY, "InvalidRetention",
                                   "retentionDuration must be longer than zero"), Result()
        want = TopicSpec(topic, int(spec.get("numPartitions") or 1), int(spec.get("replicationFactor") or 1),
                         retention_ms)
        key = (meta["namespace"], meta["name"])
        fingerprint = (want, manage, connection.checksum)
        mode = "managed" if manage else "external"
        ok = Condition.true(cond.TOPIC_READY, "TopicReady", f"topic {topic} ({mode})")
        seen = self._verified.get(key)
        if seen and seen[0] == fingerprint and time.monotonic() - seen[1] < self.topic_recheck_seconds:
            return ok, Result()
        self._verified.pop(key, None)
        try:
            outcome = ensure_topic(self.base.admins.get(connection), want, manage=manage)
        except TopicError as exc:
            log.warning("topic not ready", extra={"topic": topic, "reason": exc.reason, "error": exc.message})
            self.topic_ops["error"] = self.topic_ops.get("error", 0) + 1
            if not exc.retriable:
                # A shrink or a bad replication factor needs a spec change; that change brings an event.
                return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), Result()
            if exc.reason == TOPIC_NOT_FOUND:
                # An external topic someone else creates: Ready within seconds of its creation.
                return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), self.topic_wait.retry(*key)
            # Provider failures (Kafka down, quota) are retried with the queue's exponential backoff.
            return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), Result(error=exc.message)
        for op, happened in (("create", outcome.created), ("partitions", outcome.partitions_added),
                             ("retention", outcome.retention_changed)):
            if happened:
                self.topic_ops[op] = self.topic_ops.get(op, 0) + 1
        self._verified[key] = (fingerprint, time.monotonic())
        self.topic_wait.found(*key)
        return ok, Result()

    def _topic_name(self, meta: Mapping[str, Any]) -> str:
        external = (meta.get("annotations") or {}).get(ANNOTATION_EXTERNAL_TOPIC)
        return str(external or self.settings.topic_for(meta["namespace"], meta["name"]))

    def _channel_service(self, ref: res.ChannelRef, errors: list[str]) -> tuple[Condition, str | None]:
        name = res.channel_service_name(ref.name)
        if not res.is_dns1035(name):
            return Condition.false(cond.CHANNEL_SERVICE_READY, "InvalidChannelName",
                                   f"Service name {name!r} is not a valid DNS-1035 label (≤63 of a-z, 0-9, -)"), None
        desired = res.channel_service(ref, self.settings)
        try:
            self.base._apply_service(desired)
        except ApiException as exc:
            errors.append(f"channel Service: {api_error(exc)}")
            return Condition.false(cond.CHANNEL_SERVICE_READY, "ChannelServiceFailed",
                                   f"Service {ref.namespace}/{name}: {api_error(exc)}"), None
        return Condition.true(cond.CHANNEL_SERVICE_READY), res.channel_url(ref.namespace, ref.name)

    def _dispatcher(self, ref: res.ChannelRef, obj: Mapping[str, Any], connection: ResolvedConnection,
                    partitions: int, errors: list[str]) -> list[Condition]:
        config = res.DispatcherConfig(replicas=self.settings.dispatcher_replicas, checksum=connection.checksum,
                                      secret_name=connection.secret_name,
                                      bootstrap_servers=connection.bootstrap_servers,
                                      resources=connection.dispatcher_resources,
                                      pod=connection.dispatcher_pod)
        out: list[Condition] = []
        name = res.dispatcher_name(ref.namespace, ref.name)
        cached = self.base.stores.deployments.get(self.settings.system_namespace, name)
        autoscaler, keda_owned = self.base.autoscaler.reconcile(
            ref, obj, connection, partitions, topic=self._topic_name(obj["metadata"]), deployment=cached, errors=errors)
        if autoscaler is not None:
            out.append(autoscaler)
        deployment = res.dispatcher_deployment(ref, self.settings, config, partitions, keda_scaled=keda_owned)
        try:
            live = self.base._apply_deployment(deployment)
            ok, why = res.deployment_available(live)
            if not ok and keda_owned and live is not None and (live.get("spec") or {}).get("replicas") == 0:
                # KEDA scales an idle dispatcher to zero when minReplicas is 0: that is not an outage.
                ok, why = True, ""
            out.append(Condition.true(cond.DISPATCHER_DEPLOYMENT_READY) if ok else Condition.false(
                cond.DISPATCHER_DEPLOYMENT_READY, "DispatcherDeploymentUnavailable",
                f"Deployment {deployment['metadata']['namespace']}/{deployment['metadata']['name']}: {why}"))
        except ApiException as exc:
            errors.append(f"dispatcher Deployment: {api_error(exc)}")
            out.append(Condition.false(cond.DISPATCHER_DEPLOYMENT_READY, "DispatcherDeploymentFailed",
                                       api_error(exc)))
        service = res.dispatcher_service(ref, self.settings)
        try:
            self.base._apply_service(service)
            out.append(Condition.true(cond.DISPATCHER_SERVICE_READY))
        except ApiException as exc:
            errors.append(f"dispatcher Service: {api_error(exc)}")
            out.append(Condition.false(cond.DISPATCHER_SERVICE_READY, "DispatcherServiceFailed",
                                       api_error(exc)))
        return out


    def _add_finalizer(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.base.set_finalizers(obj, [*(obj["metadata"].get("finalizers") or ()), FINALIZER], CHANNEL_API)


    # -- deletion -----------------------------------------------------------------------------------
    def _finalize(self, obj: Mapping[str, Any]) -> Result:
        meta = obj["metadata"]
        self._verified.pop((meta["namespace"], meta["name"]), None)
        if FINALIZER not in (meta.get("finalizers") or ()):
            return Result()
        namespace, name = meta["namespace"], meta["name"]
        dispatcher = res.dispatcher_name(namespace, name)
        system = self.settings.system_namespace
        if keda_scaled(self.base.stores.deployments.get(system, dispatcher)):
            self.base.autoscaler.delete(res.ChannelRef(namespace, name))
        # The channel Service is also garbage-collected through its ownerReference; deleting it here keeps
        # deletion complete on clusters without the garbage collector.
        if self.base.stop_deployment(dispatcher, ((dispatcher, system), (res.channel_service_name(name), namespace))):
            # Its removal is a Deployment event naming this channel (ANNOTATION_CHANNEL): that enqueues it at once.
            log.info("KafkaChannel finalizing: waiting for its dispatcher to stop",
                     extra={"namespace": namespace, "channel": name, "deployment": f"{system}/{dispatcher}"})
            return Result(requeue_after=STOP_RECHECK_SECONDS)
        # Each subscriber's consumer group (its committed offsets) goes with the channel, whoever manages the topic:
        # left behind, it would be an orphan that lag alerts and `offsets show` keep reporting. The dispatcher is
        # gone by now, so the groups have no members.
        uids = {s.get("uid") for part in ("spec", "status") for s in (obj.get(part) or {}).get("subscribers") or ()}
        groups = sorted(self.settings.consumer_group_for(namespace, name, uid) for uid in uids if uid)
        if groups:
            try:
                connection = self.base.default_connection()
                for group in groups:
                    self.base.writer.check()
                    self.base.admins.get(connection).delete_group(group)  # an unknown group counts as deleted
            except (TopicError, KafkaConfigError) as exc:
                return Result(error=f"deleting the consumer groups of {namespace}/{name}: {exc}")
        external = (meta.get("annotations") or {}).get(ANNOTATION_EXTERNAL_TOPIC)
        if self.settings.topic_management is TopicManagement.ADMIN and not external and self.settings.delete_topics:
            topic = self.settings.topic_for(namespace, name)
            try:
                connection = self.base.default_connection()
                self.base.admins.get(connection).delete(topic)  # an absent topic counts as deleted
                self.topic_ops["delete"] = self.topic_ops.get("delete", 0) + 1
            except (TopicError, KafkaConfigError) as exc:
                return Result(error=f"deleting topic {topic}: {exc}")
        try:
            self.base.set_finalizers(obj, [f for f in meta.get("finalizers") or () if f != FINALIZER], CHANNEL_API)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
        log.info("KafkaChannel finalized", extra={"namespace": namespace, "channel": name})
        return Result()


class ChannelReadiness(Collector):
    """``kafkachannel_ready``: 1 per KafkaChannel whose Ready condition is True, else 0 (with its reason);
    ``kafkachannel_channels``: how many there are.

    Read at scrape time from the informer's cache (the statuses the leader writes come back through the watch),
    so every replica reports the same and nothing is updated per reconcile.
    """

    def __init__(self, channels: Store) -> None:
        self.channels = channels

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("kafkachannel_ready", "1 while the KafkaChannel's Ready condition is True.",
                                   labels=("namespace", "name", "reason"))
        items = self.channels.items()
        for obj in items:
            namespace, name, reason, value = readiness(obj)
            family.add_metric((namespace, name, reason), value)
        yield family
        yield GaugeMetricFamily("kafkachannel_channels", "KafkaChannels in the cache", value=len(items))


def setup(host: Host) -> None:
    """Cache every KafkaChannel; its dispatcher objects (``ANNOTATION_CHANNEL``) and the shared receiver's
    Deployment are part of its status."""
    channels = host.informer(KIND, host.base.custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                             plural=PLURAL)
    reconciler = ChannelReconciler(host.base, channels, topic_recheck_seconds=host.options.topic_recheck_seconds)
    host.reconciles(KIND, reconciler.reconcile)
    host.on(KIND, enqueue_object(host, KIND))
    host.owns(res.ANNOTATION_CHANNEL, KIND)
    watch_dependencies(host, KIND, dead_letter_sink_waits)  # a dead-letter sink that does not exist yet
    on_policies(host, KIND, channels)
    host.registry.register(ChannelReadiness(channels))


KIND_CHANNEL = Kind(KIND, "channels", GROUP, VERSION, frozenset({PLURAL}), setup, always=True)
