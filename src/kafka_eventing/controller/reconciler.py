"""Reconcile one KafkaChannel: topic, Services, dispatcher, status — level-based and idempotent.

Reads come from the controller's caches; writes go to the API and are made only when the desired object's
hash differs from the one recorded on the live object. The status is patched with a JSON merge patch holding
only the fields the controller owns, so ``status.subscribers`` (written by the dispatchers) is never touched.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.conditions import Condition
from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP, AdminPool, ResolvedConnection, resolve
from kafka_eventing.controller.destinations import Unresolved, resolve_destination
from kafka_eventing.controller.topics import TopicError, TopicSpec, ensure_topic
from kafka_eventing.core.channels import ANNOTATION_EXTERNAL_TOPIC, GROUP, PLURAL
from kafka_eventing.core.delivery import DeliverySpecError, parse_duration
from kafka_eventing.core.informer import Store
from kafka_eventing.core.kafka_config import KafkaConfigError
from kafka_eventing.core.settings import Settings

log = logging.getLogger(__name__)

VERSION = "v1beta1"
FINALIZER = "kafkachannels.messaging.knative.dev/finalizer"
MERGE_PATCH = "application/merge-patch+json"
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
#: How long an answer to "does the API server serve keda.sh/v1alpha1?" is reused.
KEDA_DISCOVERY_TTL = 30.0


@dataclass
class Stores:
    channels: Store
    deployments: Store  # dispatcher Deployments and the receiver Deployment, system namespace
    services: Store  # dispatcher Services (system namespace) and channel Services (all namespaces)
    config_maps: Store
    secrets: Store


@dataclass(frozen=True)
class Result:
    """``error``: requeue with backoff; ``requeue_after``: look again later even without an event."""

    error: str | None = None
    requeue_after: float | None = None


class _CustomObjects:
    """``get``/``create``/``patch``/``delete`` of one custom resource straight from the API (no cache: KEDA's CRDs
    may be absent, and an informer on a missing type would only log errors), shaped for ``Reconciler.apply``."""

    def __init__(self, api: client.CustomObjectsApi, group: str, version: str, plural: str) -> None:
        self.api, self.group, self.version, self.plural = api, group, version, plural

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return dict(self.api.get_namespaced_custom_object(self.group, self.version, namespace, self.plural,
                                                              name, _request_timeout=(5, 15)))
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise

    def create(self, namespace: str, body: Mapping[str, Any], **kwargs: Any) -> Any:
        return self.api.create_namespaced_custom_object(self.group, self.version, namespace, self.plural, body,
                                                        **kwargs)

    def patch(self, name: str, namespace: str, body: Mapping[str, Any], **kwargs: Any) -> Any:
        return self.api.patch_namespaced_custom_object(self.group, self.version, namespace, self.plural, name,
                                                       body, **kwargs)

    def delete(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self.api.delete_namespaced_custom_object(self.group, self.version, namespace, self.plural, name,
                                                        **kwargs)


def _api_error(exc: ApiException) -> str:
    """``<status> <the API server's message>`` — the message says which quota or admission rule refused."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{exc.status} {message or exc.reason}"


class Reconciler:
    def __init__(
        self,
        api_client: client.ApiClient,
        settings: Settings,
        stores: Stores,
        *,
        admins: AdminPool | None = None,
        config_map: str = DEFAULT_CONFIG_MAP,
        may_write: Callable[[], bool] = lambda: True,
        topic_recheck_seconds: float = 60.0,
        keda_discovery_seconds: float = KEDA_DISCOVERY_TTL,
    ) -> None:
        self.settings = settings
        self.stores = stores
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.admins = admins or AdminPool()
        self.config_map = config_map
        self.may_write = may_write
        self.topic_recheck_seconds = topic_recheck_seconds
        # channel → (what was verified, when): events about a channel's Deployment or Services need no Kafka
        # round trip; a spec or connection change, an error, or the recheck interval brings one.
        self._verified: dict[tuple[str, str], tuple[tuple[Any, ...], float]] = {}
        self.topic_ops: dict[str, int] = {}
        self.scaled_objects = _CustomObjects(self.custom, keda.GROUP, keda.VERSION, keda.SCALED_OBJECTS)
        self.trigger_auths = _CustomObjects(self.custom, keda.GROUP, keda.VERSION, keda.TRIGGER_AUTHENTICATIONS)
        self._keda_served: tuple[bool, float] | None = None
        self.keda_discovery_seconds = keda_discovery_seconds

    # -- entry --------------------------------------------------------------------------------------
    def reconcile(self, namespace: str, name: str) -> Result:
        obj = self.stores.channels.get(namespace, name)
        if obj is None:
            return Result()  # deleted; the finalizer cleaned up before the object went away
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
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

        partitions = int(spec.get("numPartitions") or 1)
        connection: ResolvedConnection | None = None
        try:
            connection = resolve(self.settings, self.stores.config_maps, self.stores.secrets, self.config_map)
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
            status["address"] = {"url": url}
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

        receiver = self.stores.deployments.get(self.settings.system_namespace, self.settings.receiver_deployment_name)
        ok, why = res.deployment_available(receiver)
        conditions.append(Condition.true(cond.RECEIVER_DEPLOYMENT_READY) if ok else Condition.false(
            cond.RECEIVER_DEPLOYMENT_READY, "ReceiverDeploymentUnavailable",
            f"receiver Deployment {self.settings.system_namespace}/{self.settings.receiver_deployment_name}: {why}"))

        dls = self._dead_letter_sink(ref, spec)
        if dls is not None:
            dls_cond, dls_uri = dls
            conditions.append(dls_cond)
            status["deadLetterSinkUri"] = dls_uri
        else:
            status["deadLetterSinkUri"] = None

        conditions.append(cond.ready_condition(conditions))
        self.patch_status(obj, status, conditions)
        if write_errors and result.error is None:
            # A refused API write (quota, admission, a transient 5xx) is retried with backoff like Kafka errors.
            return Result(error="; ".join(write_errors))
        return result

    def _topic(self, obj: Mapping[str, Any], connection: ResolvedConnection) -> tuple[Condition, Result]:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        external = (meta.get("annotations") or {}).get(ANNOTATION_EXTERNAL_TOPIC)
        topic = self._topic_name(meta)
        manage = self.settings.topic_management == "admin" and not external
        try:
            retention = parse_duration(str(spec.get("retentionDuration") or "PT168H"), "retentionDuration")
        except DeliverySpecError as exc:
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
            outcome = ensure_topic(self.admins.get(connection), want, manage=manage)
        except TopicError as exc:
            log.warning("topic not ready", extra={"topic": topic, "reason": exc.reason, "error": exc.message})
            self.topic_ops["error"] = self.topic_ops.get("error", 0) + 1
            if not exc.retriable:
                # A shrink or a bad replication factor needs a spec change; that change brings an event.
                return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), Result()
            # Provider failures (Kafka down, quota) are retried with the queue's exponential backoff.
            return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), Result(error=exc.message)
        for op, happened in (("create", outcome.created), ("partitions", outcome.partitions_added),
                             ("retention", outcome.retention_changed)):
            if happened:
                self.topic_ops[op] = self.topic_ops.get(op, 0) + 1
        self._verified[key] = (fingerprint, time.monotonic())
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
            self._apply_service(desired)
        except ApiException as exc:
            errors.append(f"channel Service: {_api_error(exc)}")
            return Condition.false(cond.CHANNEL_SERVICE_READY, "ChannelServiceFailed",
                                   f"Service {ref.namespace}/{name}: {_api_error(exc)}"), None
        return Condition.true(cond.CHANNEL_SERVICE_READY), res.channel_url(ref.namespace, ref.name)

    def _dispatcher(self, ref: res.ChannelRef, obj: Mapping[str, Any], connection: ResolvedConnection,
                    partitions: int, errors: list[str]) -> list[Condition]:
        config = res.DispatcherConfig(replicas=self.settings.dispatcher_replicas, checksum=connection.checksum,
                                      secret_name=connection.secret_name,
                                      bootstrap_servers=connection.bootstrap_servers,
                                      resources=connection.dispatcher_resources)
        out: list[Condition] = []
        name = res.dispatcher_name(ref.namespace, ref.name)
        cached = self.stores.deployments.get(self.settings.system_namespace, name)
        autoscaler, keda_scaled = self._autoscaler(ref, obj, connection, partitions, deployment=cached,
                                                  errors=errors)
        if autoscaler is not None:
            out.append(autoscaler)
        deployment = res.dispatcher_deployment(ref, self.settings, config, partitions, keda_scaled=keda_scaled)
        try:
            live = self._apply_deployment(deployment)
            ok, why = res.deployment_available(live)
            if not ok and keda_scaled and live is not None and (live.get("spec") or {}).get("replicas") == 0:
                # KEDA scales an idle dispatcher to zero when minReplicas is 0: that is not an outage.
                ok, why = True, ""
            out.append(Condition.true(cond.DISPATCHER_DEPLOYMENT_READY) if ok else Condition.false(
                cond.DISPATCHER_DEPLOYMENT_READY, "DispatcherDeploymentUnavailable",
                f"Deployment {deployment['metadata']['namespace']}/{deployment['metadata']['name']}: {why}"))
        except ApiException as exc:
            errors.append(f"dispatcher Deployment: {_api_error(exc)}")
            out.append(Condition.false(cond.DISPATCHER_DEPLOYMENT_READY, "DispatcherDeploymentFailed",
                                       _api_error(exc)))
        service = res.dispatcher_service(ref, self.settings)
        try:
            self._apply_service(service)
            out.append(Condition.true(cond.DISPATCHER_SERVICE_READY))
        except ApiException as exc:
            errors.append(f"dispatcher Service: {_api_error(exc)}")
            out.append(Condition.false(cond.DISPATCHER_SERVICE_READY, "DispatcherServiceFailed",
                                       _api_error(exc)))
        return out

    # -- KEDA -------------------------------------------------------------------------------------------
    def _autoscaler(self, ref: res.ChannelRef, obj: Mapping[str, Any], connection: ResolvedConnection,
                    partitions: int, *, deployment: Mapping[str, Any] | None,
                    errors: list[str]) -> tuple[Condition | None, bool]:
        """Stamp or remove the dispatcher's ScaledObject: (condition or None, whether KEDA owns replicas)."""
        was_keda = _scaler(deployment) == res.SCALER_KEDA
        subscribers = keda.subscriber_uids(obj.get("spec") or {})
        kind = cond.DISPATCHER_AUTOSCALER_READY
        if not connection.keda.enabled or not subscribers:
            # Nothing to scale on: the controller owns replicas again (and keeps an idle dispatcher at its
            # count instead of letting KEDA hold it at zero). Only a Deployment marked as KEDA-scaled
            # leads to API calls, so the default (KEDA off) costs nothing.
            if was_keda:
                try:
                    self._delete_keda(ref)
                except ApiException as exc:
                    errors.append(f"KEDA ScaledObject removal: {_api_error(exc)}")
                    # Until it is gone KEDA still scales: setting replicas now would fight it.
                    return Condition.false(kind, "KEDAScaledObjectFailed", _api_error(exc)), True
            if not connection.keda.enabled:
                return None, False
            return Condition.true(kind, "NoSubscribers",
                                  "no subscribers, no consumer lag to scale on: the controller sets replicas"), False
        try:
            auth = keda.keda_auth(connection)
        except keda.KedaAuthError as exc:
            return Condition.false(kind, "KEDAAuthUnsupported", str(exc)), was_keda
        try:
            served = self._keda_is_served()
        except ApiException as exc:
            errors.append(f"KEDA discovery: {_api_error(exc)}")
            return Condition.false(kind, "KEDADiscoveryFailed", _api_error(exc)), was_keda
        if not served:
            return Condition.false(kind, "KEDANotInstalled",
                                   f"the API server does not serve {keda.GROUP}/{keda.VERSION} ScaledObjects: "
                                   "install KEDA; the controller sets replicas meanwhile"), False
        so = keda.scaled_object(ref, self.settings, connection, auth, topic=self._topic_name(obj["metadata"]),
                                subscribers=subscribers, num_partitions=partitions)
        try:
            if auth.needs_trigger_authentication:
                ta = keda.trigger_authentication(ref, self.settings, auth)
                self.apply(self.trigger_auths, self.trigger_auths.create, self.trigger_auths.patch, ta)
            self.apply(self.scaled_objects, self.scaled_objects.create, self.scaled_objects.patch, so)
            if not auth.needs_trigger_authentication and was_keda:
                self._delete_quietly(self.trigger_auths, so["metadata"]["name"])
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                self._keda_served = None  # the CRDs went away since discovery: ask again next time
            errors.append(f"KEDA ScaledObject: {_api_error(exc)}")
            return Condition.false(kind, "KEDAScaledObjectFailed", _api_error(exc)), was_keda
        spec = so["spec"]
        return Condition.true(kind, "KEDAScaledObjectReady",
                              f"ScaledObject {so['metadata']['namespace']}/{so['metadata']['name']}: "
                              f"{spec['minReplicaCount']}-{spec['maxReplicaCount']} replicas on the lag of "
                              f"{len(spec['triggers'])} consumer group(s)"), True

    def _keda_is_served(self) -> bool:
        now = time.monotonic()
        if self._keda_served is not None and now - self._keda_served[1] < self.keda_discovery_seconds:
            return self._keda_served[0]
        try:
            found = self.custom.get_api_resources(keda.GROUP, keda.VERSION, _request_timeout=(5, 15))
            names = {r.name for r in found.resources or ()}
            served = {keda.SCALED_OBJECTS, keda.TRIGGER_AUTHENTICATIONS} <= names
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
            served = False
        self._keda_served = (served, now)
        return served

    def _delete_keda(self, ref: res.ChannelRef) -> None:
        name = res.dispatcher_name(ref.namespace, ref.name)
        # The ScaledObject first: KEDA then stops scaling before its credentials go.
        for api in (self.scaled_objects, self.trigger_auths):
            self._delete_quietly(api, name)

    def _delete_quietly(self, api: _CustomObjects, name: str) -> None:
        """Delete; already gone (or KEDA's CRDs gone) counts as deleted."""
        if not self.may_write():
            raise LostLeadership
        try:
            api.delete(name, self.settings.system_namespace, _request_timeout=(5, 30))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise

    def _dead_letter_sink(self, ref: res.ChannelRef, spec: Mapping[str, Any]) -> tuple[Condition, str | None] | None:
        sink = ((spec.get("delivery") or {}).get("deadLetterSink")) or None
        if not sink:
            return None
        try:
            uri = resolve_destination(self.core, self.custom, sink, ref.namespace, "dead-letter sink")
        except Unresolved as exc:
            reason = "DeadLetterSinkNotAddressable" if exc.reason == "DestinationNotAddressable" \
                else "DeadLetterSinkUnresolved"
            return Condition.false(cond.DEAD_LETTER_SINK_RESOLVED, reason, str(exc)), None
        return Condition.true(cond.DEAD_LETTER_SINK_RESOLVED), uri

    # -- writes -------------------------------------------------------------------------------------
    def apply(self, store: Any, create: Any, patch: Any,
               desired: dict[str, Any]) -> tuple[Mapping[str, Any] | None, bool]:
        """Create or merge-patch ``desired``: (the cached live object or None, whether anything was written)."""
        ns, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        live = store.get(ns, name)
        if live is not None and not res.needs_update(live, desired):
            return live, False
        if not self.may_write():
            raise LostLeadership
        if live is None:
            try:
                create(ns, desired, _request_timeout=(5, 30), _preload_content=False)
                return None, True
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:
                    raise
                # Created by an earlier attempt whose event has not reached the cache yet: update it.
        body = {"metadata": {k: desired["metadata"][k] for k in ("labels", "annotations")}, "spec": desired["spec"]}
        patch(name, ns, body, _content_type=MERGE_PATCH, _request_timeout=(5, 30), _preload_content=False)
        return live, True

    def _apply_service(self, desired: dict[str, Any]) -> Mapping[str, Any]:
        live, written = self.apply(self.stores.services, self.core.create_namespaced_service,
                                    self.core.patch_namespaced_service, desired)
        return desired if written or live is None else live

    def _apply_deployment(self, desired: dict[str, Any]) -> Mapping[str, Any] | None:
        """The live Deployment as cached (with its status), or None when it was created just now.

        After an update the cached object is returned: the old ReplicaSet keeps serving during the rollout,
        so a rotated Secret does not flip the channel to not-Ready.
        """
        live, _ = self.apply(self.stores.deployments, self.apps.create_namespaced_deployment,
                              self.apps.patch_namespaced_deployment, desired)
        return live

    def _add_finalizer(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.set_finalizers(obj, [*(obj["metadata"].get("finalizers") or ()), FINALIZER])

    def set_finalizers(self, obj: Mapping[str, Any], finalizers: list[str],
                       api: tuple[str, str, str] = (GROUP, VERSION, PLURAL)) -> Mapping[str, Any]:
        """``api``: (group, version, plural) of ``obj``."""
        if not self.may_write():
            raise LostLeadership
        meta = obj["metadata"]
        # resourceVersion makes this a compare-and-swap: a concurrent change to the list gives a 409, not a loss.
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return dict(self.custom.patch_namespaced_custom_object(
            *api[:2], meta["namespace"], api[2], meta["name"], patch,
            _content_type=MERGE_PATCH, _request_timeout=(5, 30)))

    def patch_status(self, obj: Mapping[str, Any], status: dict[str, Any], conditions: list[Condition],
                     api: tuple[str, str, str] = (GROUP, VERSION, PLURAL)) -> None:
        """Merge-patch the fields the controller owns, only when something changed."""
        meta = obj["metadata"]
        old: Mapping[str, Any] = obj.get("status") or {}
        status = {**status, "conditions": cond.merge(old.get("conditions"), conditions)}
        if all(old.get(k) == v for k, v in status.items()):
            return  # nothing changed (None matches an absent field)
        if not self.may_write():
            raise LostLeadership
        self.custom.patch_namespaced_custom_object_status(
            *api[:2], meta["namespace"], api[2], meta["name"], {"status": status},
            _content_type=MERGE_PATCH, _request_timeout=(5, 30))

    # -- deletion -----------------------------------------------------------------------------------
    def _finalize(self, obj: Mapping[str, Any]) -> Result:
        meta = obj["metadata"]
        self._verified.pop((meta["namespace"], meta["name"]), None)
        if FINALIZER not in (meta.get("finalizers") or ()):
            return Result()
        namespace, name = meta["namespace"], meta["name"]
        dispatcher = res.dispatcher_name(namespace, name)
        system = self.settings.system_namespace
        if _scaler(self.stores.deployments.get(system, dispatcher)) == res.SCALER_KEDA:
            self._delete_keda(res.ChannelRef(namespace, name))
        # The channel Service is also garbage-collected through its ownerReference; deleting it here keeps
        # deletion complete on clusters without the garbage collector.
        doomed = ((self.apps.delete_namespaced_deployment, dispatcher, system),
                  (self.core.delete_namespaced_service, dispatcher, system),
                  (self.core.delete_namespaced_service, res.channel_service_name(name), namespace))
        for delete, victim, where in doomed:
            if not self.may_write():
                raise LostLeadership
            try:
                delete(victim, where, propagation_policy="Background", _request_timeout=(5, 30))
            except ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
        external = (meta.get("annotations") or {}).get(ANNOTATION_EXTERNAL_TOPIC)
        if self.settings.topic_management == "admin" and not external and self.settings.delete_topics:
            topic = self.settings.topic_for(namespace, name)
            try:
                connection = resolve(self.settings, self.stores.config_maps, self.stores.secrets, self.config_map)
                self.admins.get(connection).delete(topic)  # an absent topic counts as deleted
                self.topic_ops["delete"] = self.topic_ops.get("delete", 0) + 1
            except (TopicError, KafkaConfigError) as exc:
                return Result(error=f"deleting topic {topic}: {exc}")
        try:
            self.set_finalizers(obj, [f for f in meta.get("finalizers") or () if f != FINALIZER])
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
        log.info("KafkaChannel finalized", extra={"namespace": namespace, "channel": name})
        return Result()


def _scaler(deployment: Mapping[str, Any] | None) -> str | None:
    value = (((deployment or {}).get("metadata") or {}).get("annotations") or {}).get(res.ANNOTATION_SCALER)
    return None if value is None else str(value)


class LostLeadership(RuntimeError):
    """Raised before a write once this replica no longer holds the lease."""
