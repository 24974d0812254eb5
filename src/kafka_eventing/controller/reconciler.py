"""Reconcile one KafkaChannel: topic, Services, dispatcher, status — level-based and idempotent.

Reads come from the controller's caches; writes go to the API and are made only when the desired object's
hash differs from the one recorded on the live object. The status is patched with a JSON merge patch holding
only the fields the controller owns, so ``status.subscribers`` (written by the dispatchers) is never touched.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import (
    HTTP_CONFLICT,
    HTTP_NOT_FOUND,
    MERGE_PATCH,
    Writer,
    api_error,
)
from kafka_eventing.controller.autoscaler import KEDA_DISCOVERY_TTL, KedaAutoscaler, keda_scaled
from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP, AdminPool, ResolvedConnection, resolve
from kafka_eventing.controller.destinations import HTTP_FORBIDDEN, Address, Unresolved, resolve_address
from kafka_eventing.controller.identities import Identities, IdentityError
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
from kafka_eventing.core.conditions import Condition, merge
from kafka_eventing.core.durations import DurationError, parse_duration
from kafka_eventing.core.informer import Store
from kafka_eventing.core.kafka_config import KafkaConfigError
from kafka_eventing.core.settings import Settings, TopicManagement

log = logging.getLogger(__name__)

#: how often a data-plane owner being deleted re-checks that its dispatcher is gone, should the deletion event be
#: missed
STOP_RECHECK_SECONDS = 2.0

VERSION = "v1beta1"
FINALIZER = "kafkachannels.messaging.knative.dev/finalizer"


@dataclass
class Stores:
    channels: Store
    deployments: Store  # dispatcher Deployments and the receiver Deployment, system namespace
    services: Store  # dispatcher Services (system namespace) and channel Services (all namespaces)
    config_maps: Store
    secrets: Store
    #: EventPolicies (every namespace) while the API server serves their CRD; None: it does not.
    policies: Store | None = None


@dataclass(frozen=True)
class Result:
    """``error``: requeue with backoff; ``requeue_after``: look again later even without an event."""

    error: str | None = None
    requeue_after: float | None = None


#: Knative's status fields of a resolved dead-letter sink (what the dispatchers read).
DEAD_LETTER_FIELDS = ("deadLetterSinkUri", "deadLetterSinkAudience", "deadLetterSinkCACerts")


def dead_letter_status(address: Address | None) -> dict[str, Any]:
    """``DEAD_LETTER_FIELDS`` of a resolved dead-letter sink (None: all cleared)."""
    return dict(zip(DEAD_LETTER_FIELDS, (address.url, address.audience, address.ca_certs) if address
                    else (None, None, None), strict=True))


class SecretProblem(Exception):
    """A Secret a resource names cannot be read; ``reason`` is the condition's, the message names what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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
        self.identities = Identities(api_client, settings)  # senders' OIDC ServiceAccounts (Triggers, KafkaSources)
        self.admins = admins or AdminPool()
        self.config_map = config_map
        self.may_write = may_write
        self.topic_recheck_seconds = topic_recheck_seconds
        # channel → (what was verified, when): events about a channel's Deployment or Services need no Kafka
        # round trip; a spec or connection change, an error, or the recheck interval brings one.
        self._verified: dict[tuple[str, str], tuple[tuple[Any, ...], float]] = {}
        self.topic_ops: dict[str, int] = {}
        self.writer = Writer(may_write)
        self.autoscaler = KedaAutoscaler(self.custom, settings, self.writer, self._topic_name,
                                         discovery_seconds=keda_discovery_seconds)

    def event_policies(self, group: str, kind: str, obj: Mapping[str, Any], status: dict[str, Any],
                       conditions: list[Condition]) -> None:
        """A target's ``status.policies`` and ``EventPoliciesReady`` (``controller.eventpolicies``), added to what
        its reconciler writes — with authentication on only: off, no policy is enforced and neither is written."""
        from kafka_eventing.controller.eventpolicies import target_status
        from kafka_eventing.core.eventpolicies import Target

        if not self.settings.auth_issuer:
            status["policies"] = None
            return
        meta = obj.get("metadata") or {}
        target = Target(group, kind, str(meta.get("namespace")), str(meta.get("name")),
                        tuple(sorted((meta.get("labels") or {}).items())))
        refs, condition = target_status(self.stores.policies, self.settings, target)
        status["policies"] = refs or None
        conditions.append(condition)

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

        try:
            channel_from_resource(obj, self.settings)
            conditions.append(Condition.true(cond.CONFIG_PARSED))
        except ChannelSpecError as exc:
            conditions.append(Condition.false(cond.CONFIG_PARSED, "InvalidChannelSpec", str(exc)))

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

        receiver = self.stores.deployments.get(self.settings.system_namespace, self.settings.receiver_deployment_name)
        ok, why = res.deployment_available(receiver)
        conditions.append(Condition.true(cond.RECEIVER_DEPLOYMENT_READY) if ok else Condition.false(
            cond.RECEIVER_DEPLOYMENT_READY, "ReceiverDeploymentUnavailable",
            f"receiver Deployment {self.settings.system_namespace}/{self.settings.receiver_deployment_name}: {why}"))

        dls = self.dead_letter_sink(ref.namespace, spec)
        if dls is not None:
            conditions.append(dls[0])
        status.update(dead_letter_status(dls[1] if dls else None))

        # The Subscriptions' OIDC accounts (Knative's Subscription controller names them here) may be sent as.
        accounts = [str(a["serviceAccountName"]) for sub in spec.get("subscribers") or ()
                    if (a := sub.get("auth") or {}).get("serviceAccountName")]
        try:
            self.identities.grant(ref.namespace, accounts)
        except IdentityError as exc:
            write_errors.append(str(exc))
        conditions.append(cond.ready_condition(conditions))
        self.event_policies(GROUP, KIND, obj, status, conditions)  # informational: not part of Ready
        self.patch_status(obj, status, conditions)
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
        cached = self.stores.deployments.get(self.settings.system_namespace, name)
        autoscaler, keda_owned = self.autoscaler.reconcile(ref, obj, connection, partitions, deployment=cached,
                                                            errors=errors)
        if autoscaler is not None:
            out.append(autoscaler)
        deployment = res.dispatcher_deployment(ref, self.settings, config, partitions, keda_scaled=keda_owned)
        try:
            live = self._apply_deployment(deployment)
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
            self._apply_service(service)
            out.append(Condition.true(cond.DISPATCHER_SERVICE_READY))
        except ApiException as exc:
            errors.append(f"dispatcher Service: {api_error(exc)}")
            out.append(Condition.false(cond.DISPATCHER_SERVICE_READY, "DispatcherServiceFailed",
                                       api_error(exc)))
        return out

    def dead_letter_sink(self, namespace: str, spec: Mapping[str, Any]) -> tuple[Condition, Address | None] | None:
        """``spec.delivery.deadLetterSink`` resolved (the condition and the address), None when there is none."""
        sink = ((spec.get("delivery") or {}).get("deadLetterSink")) or None
        if not sink:
            return None
        try:
            uri = resolve_address(self.core, self.custom, sink, namespace, "dead-letter sink")
        except Unresolved as exc:
            reason = {"DestinationNotAddressable": "DeadLetterSinkNotAddressable",
                      "DestinationForbidden": "DeadLetterSinkForbidden"}.get(exc.reason, "DeadLetterSinkUnresolved")
            return Condition.false(cond.DEAD_LETTER_SINK_RESOLVED, reason, str(exc)), None
        return Condition.true(cond.DEAD_LETTER_SINK_RESOLVED), uri

    # -- writes -------------------------------------------------------------------------------------
    def _apply_service(self, desired: dict[str, Any]) -> Mapping[str, Any]:
        live, written = self.writer.apply(self.stores.services, self.core.create_namespaced_service,
                                    self.core.patch_namespaced_service, desired)
        return desired if written or live is None else live

    def read_secret(self, namespace: str, name: str, named_by: str,
                    readers: tuple[str, ...] = ("controller",)) -> dict[str, bytes]:
        """The data of a Secret a resource names in its own namespace, read by name: the chart lets ``readers``
        read Secrets only where ``<reader>.rbac.secretNamespaces`` lists (``SecretProblem`` says which to set)."""
        try:
            found = self.core.read_namespaced_secret(name, namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                raise SecretProblem("SecretNotFound",
                                    f"Secret {namespace}/{name} named by {named_by} does not exist") from None
            if exc.status == HTTP_FORBIDDEN:
                lists = " and ".join(f"{r}.rbac.secretNamespaces" for r in readers)
                wide = " and ".join(f"{r}.rbac.clusterWideSecretRead" for r in readers)
                raise SecretProblem("SecretNotReadable",
                                    f"the controller may not read Secret {namespace}/{name}: list {namespace} in the "
                                    f"chart value {lists} (or set {wide})") from None
            raise SecretProblem("SecretNotReadable",
                                f"Secret {namespace}/{name}: HTTP {exc.status} {exc.reason}") from None
        return {k: base64.b64decode(v) for k, v in (found.data or {}).items()}

    def write_secret_copy(self, name: str, data: Mapping[str, bytes]) -> None:
        """A Secret of the system namespace holding ``data``: the copy of keys a resource names in its own namespace,
        for the dispatcher that runs here (a pod mounts Secrets of its own namespace only). Written only when its
        content differs from the cached copy; the only Secrets the controller writes."""
        system = self.settings.system_namespace
        wanted = {k: base64.b64encode(v).decode() for k, v in data.items()}
        body = {"metadata": {"name": name, "namespace": system, "labels": res.labels("dispatcher")},
                "type": "Opaque", "data": wanted}
        found = self.stores.secrets.get(system, name)
        if found is None:
            try:
                self.core.create_namespaced_secret(system, body, _request_timeout=(5, 15))
                return
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:  # made since the cache last heard: replaced below
                    raise
        elif (found.get("data") or {}) == wanted:
            return
        self.core.replace_namespaced_secret(name, system, body, _request_timeout=(5, 15))

    def delete_secret_copy(self, name: str) -> None:
        """Delete the copy if the cache holds one: a resource that never needed a copy makes no call (and needs no
        delete right — an install rolled back to a chart without it still finalizes)."""
        if self.stores.secrets.get(self.settings.system_namespace, name) is None:
            return
        try:
            self.core.delete_namespaced_secret(name, self.settings.system_namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise

    def _apply_deployment(self, desired: dict[str, Any]) -> Mapping[str, Any] | None:
        """The live Deployment as cached (with its status), or None when it was created just now.

        After an update the cached object is returned: the old ReplicaSet keeps serving during the rollout,
        so a rotated Secret does not flip the channel to not-Ready.
        """
        live, _ = self.writer.apply(self.stores.deployments, self.apps.create_namespaced_deployment,
                              self.apps.patch_namespaced_deployment, desired)
        return live

    def _add_finalizer(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.set_finalizers(obj, [*(obj["metadata"].get("finalizers") or ()), FINALIZER])

    def stop_deployment(self, name: str, services: Sequence[tuple[str, str]] = ()) -> bool:
        """Deletes the data-plane Deployment ``name`` (system namespace) and the ``services`` (name, namespace).

        True while the Deployment still exists. The data plane stops before its topic or consumer group goes: a
        dispatcher still consuming a deleted topic fills its log with UNKNOWN_TOPIC_OR_PART, and a group with
        members cannot be deleted. Foreground deletion keeps the Deployment until its ReplicaSets and Pods are gone
        (the garbage collector), so "not found" means none of its pods runs.
        """
        stopping = True
        doomed = ((self.apps.delete_namespaced_deployment, name, self.settings.system_namespace, "Foreground"),
                  *((self.core.delete_namespaced_service, svc, where, "Background") for svc, where in services))
        for delete, victim, where, policy in doomed:
            self.writer.check()
            try:
                delete(victim, where, propagation_policy=policy, _request_timeout=(5, 30))
            except ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                if policy == "Foreground":
                    stopping = False
        return stopping

    def set_finalizers(self, obj: Mapping[str, Any], finalizers: list[str],
                       api: tuple[str, str, str] = (GROUP, VERSION, PLURAL)) -> Mapping[str, Any]:
        """``api``: (group, version, plural) of ``obj`` — the Broker reconciler writes through these too."""
        self.writer.check()
        meta = obj["metadata"]
        # resourceVersion makes this a compare-and-swap: a concurrent change to the list gives a 409, not a loss.
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return dict(self.custom.patch_namespaced_custom_object(
            *api[:2], meta["namespace"], api[2], meta["name"], patch,
            _content_type=MERGE_PATCH, _request_timeout=(5, 30)))

    def patch_status(self, obj: Mapping[str, Any], status: dict[str, Any], conditions: list[Condition],
                     api: tuple[str, str, str] = (GROUP, VERSION, PLURAL), *, foreign: Sequence[str] = ()) -> None:
        """Merge-patch the status fields the controller owns, only when something changed.

        ``foreign``: condition types another writer owns (a Trigger's dispatcher). A merge-patch replaces the whole
        conditions list, so they are carried over as read, and the patch is made conditional on the read
        ``resourceVersion``: a write of theirs that this controller has not seen yet fails the patch (409, the
        key is retried on the newer object) instead of being overwritten.
        """
        meta = obj["metadata"]
        old: Mapping[str, Any] = obj.get("status") or {}
        kept = [dict(c) for c in old.get("conditions") or () if isinstance(c, Mapping) and c.get("type") in foreign]
        merged = sorted([*merge(old.get("conditions"), conditions), *kept], key=lambda c: str(c["type"]))
        status = {**status, "conditions": merged}
        if all(old.get(k) == v for k, v in status.items()):
            return  # nothing changed (None matches an absent field)
        self.writer.check()
        body: dict[str, Any] = {"status": status}
        if foreign:
            body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        self.custom.patch_namespaced_custom_object_status(
            *api[:2], meta["namespace"], api[2], meta["name"], body,
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
        if keda_scaled(self.stores.deployments.get(system, dispatcher)):
            self.autoscaler.delete(res.ChannelRef(namespace, name))
        # The channel Service is also garbage-collected through its ownerReference; deleting it here keeps
        # deletion complete on clusters without the garbage collector.
        if self.stop_deployment(dispatcher, ((dispatcher, system), (res.channel_service_name(name), namespace))):
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
                connection = resolve(self.settings, self.stores.config_maps, self.stores.secrets, self.config_map)
                for group in groups:
                    self.writer.check()
                    self.admins.get(connection).delete_group(group)  # an unknown group counts as deleted
            except (TopicError, KafkaConfigError) as exc:
                return Result(error=f"deleting the consumer groups of {namespace}/{name}: {exc}")
        external = (meta.get("annotations") or {}).get(ANNOTATION_EXTERNAL_TOPIC)
        if self.settings.topic_management is TopicManagement.ADMIN and not external and self.settings.delete_topics:
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
