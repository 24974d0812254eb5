"""Reconcile Kafka-class Brokers and their Triggers — level-based and idempotent, like the channel reconciler.

Broker: config (``spec.config`` → a ConfigMap, else the cluster default ``kafka-broker-config`` in the system
namespace, else built-in defaults on the controller's own connection) → topic ``knative-broker-<ns>-<name>`` (or
an existing external topic, only checked) → one dispatcher Deployment + headless Service (the channel's, under
another name) → status: ConfigParsed, TopicReady, DataPlaneAvailable, Addressable, Ready and
``status.address.url`` = ``http://<receiver>/<namespace>/<broker>``. A finalizer deletes the dispatcher, waits
until its Deployment (pods and all) is gone, then deletes the topic (never an external one).

Trigger: BrokerReady, SubscriberResolved (``status.subscriberUri``), SubscriptionReady (its filters compile and
its delivery parses), DependencyReady (``knative.dev/dependency``), DeadLetterSinkResolved when a sink is set,
and Ready — from those and ConsumerGroupReady, which only the Broker's dispatcher writes (its group joined); the
controller keeps that one as stored and writes the status only at the resourceVersion it read, so neither side
overwrites the other. Triggers whose Broker exists with another class belong to another implementation and are
left alone.

ConfigMaps named by a Broker live in any namespace: each is watched by name (``core.informer.NamedWatches``), and
its Secret lives in the system namespace, whose Secrets are watched; a change to either reconciles the Brokers
that name it at once. The reconcile itself reads both from the API.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafka_eventing.broker.filters import FilterError, TriggerFilters
from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import api_error
from kafka_eventing.controller.connection import (
    KEY_BOOTSTRAP,
    KEY_SECRET_NAME,
    AdminPool,
    ResolvedConnection,
    connection_annotations,
)
from kafka_eventing.controller.dependencies import (
    Ref,
    annotated_ref,
    dead_letter_sink_waits,
    ref_of,
    waiting_for,
    watch_dependencies,
)
from kafka_eventing.controller.destinations import HTTP_FORBIDDEN, Unresolved, not_readable, resolve_address
from kafka_eventing.controller.host import (
    RESYNC,
    SECRET,
    Host,
    Kind,
    enqueue_object,
    namespace_of,
    on_policies,
    on_status_secret,
    readiness,
)
from kafka_eventing.controller.identities import OIDC_IDENTITY_CREATED, IdentityError
from kafka_eventing.controller.namespaced import (
    DATA_PLANE_NAMESPACED,
    LABEL_DATA_PLANE,
    NAMESPACED_DEPLOYMENT,
    NAMESPACED_DISABLED,
    NAMESPACED_RECEIVER,
    NAMESPACED_SELECTOR,
    NamespacedDataPlane,
    NamespacedProblem,
    broker_owner,
)
from kafka_eventing.controller.reconciler import (
    DEAD_LETTER_FIELDS,
    STOP_RECHECK_SECONDS,
    TOPIC_NOT_FOUND,
    Reconciler,
    Result,
    SecretProblem,
    TopicWait,
    dead_letter_status,
)
from kafka_eventing.controller.topics import TopicError, TopicSpec, ensure_topic
from kafka_eventing.core import brokers as kb
from kafka_eventing.core.conditions import Condition, find, from_dict
from kafka_eventing.core.delivery import DeliverySpec, DeliverySpecError, rate_limit_annotation
from kafka_eventing.core.informer import NamedWatches, Store, obj_key
from kafka_eventing.core.kafka_config import ConnectionRef, KafkaConfigError, connection_from_secret
from kafka_eventing.core.settings import Settings

log = logging.getLogger(__name__)

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
#: queue keys and event names
BROKER, TRIGGER = "Broker", "Trigger"
BROKER_API = (kb.GROUP, kb.VERSION, kb.BROKERS)
TRIGGER_API = (kb.GROUP, kb.VERSION, kb.TRIGGERS)
TRIGGER_API_VERSION = f"{kb.GROUP}/{kb.VERSION}"
BROKER_FINALIZER = "kafka.eventing.knative.dev/broker"
#: A deleted Trigger's consumer group (and its offsets) goes too: a new Trigger of the same name starts at latest.
TRIGGER_FINALIZER = "kafka.eventing.knative.dev/trigger"
#: Names the Broker ("<namespace>/<name>") a dispatcher Deployment or Service belongs to.
ANNOTATION_BROKER = "kafka.eventing.knative.dev/broker"
BROKER_DISPATCHER_SUFFIX = "-kb-dispatcher"
RETENTION_MS = 7 * 24 * 3600 * 1000
DEFAULT_PARTITIONS = 10
DEFAULT_REPLICATION = 1

# Broker conditions
CONFIG_PARSED = "ConfigParsed"
DATA_PLANE_AVAILABLE = "DataPlaneAvailable"
BROKER_DEPENDENTS = (CONFIG_PARSED, cond.TOPIC_READY, DATA_PLANE_AVAILABLE, cond.ADDRESSABLE)
# Trigger conditions: the controller writes the first four, OIDCIdentityCreated and Ready; the dispatcher writes
# ConsumerGroupReady.
BROKER_READY = kb.BROKER_READY
SUBSCRIBER_RESOLVED = kb.SUBSCRIBER_RESOLVED
SUBSCRIPTION_READY = kb.SUBSCRIPTION_READY
DEPENDENCY_READY = kb.DEPENDENCY_READY
TRIGGER_DEPENDENTS = (BROKER_READY, SUBSCRIBER_RESOLVED, SUBSCRIPTION_READY, DEPENDENCY_READY,
                      OIDC_IDENTITY_CREATED, kb.CONSUMER_GROUP_READY)


@dataclass(frozen=True)
class BrokerConfig:
    partitions: int
    replication_factor: int
    connection: ResolvedConnection
    source: str  # which ConfigMap (or "defaults"), for messages
    #: the Secret's data when the config names one outside the system namespace: copied there for the dispatcher
    #: (``connection.secret_name`` is the copy's name)
    secret_copy: Mapping[str, bytes] | None = None


class BrokerConfigError(Exception):
    def __init__(self, reason: str, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry = retry


@dataclass
class BrokerStores:
    brokers: Store
    triggers: Store


def config_map_of(broker: Mapping[str, Any], system_namespace: str, default_name: str) -> tuple[str, str]:
    """(namespace, name) of the ConfigMap a Broker's config comes from: ``spec.config`` (in the Broker's namespace
    unless it names one), else the cluster default in the system namespace."""
    meta, ref = broker.get("metadata") or {}, (broker.get("spec") or {}).get("config") or {}
    if ref.get("name"):
        return str(ref.get("namespace") or meta.get("namespace") or ""), str(ref["name"])
    return system_namespace, default_name


def broker_dispatcher_name(namespace: str, name: str) -> str:
    return res.dispatcher_name(namespace, name, suffix=BROKER_DISPATCHER_SUFFIX)


def broker_url(settings: Settings, namespace: str, name: str, *, namespaced: bool = False) -> str:
    """The Broker's ingress: the shared receiver's Service, or for a KafkaNamespaced Broker its own namespace's
    ``kafka-broker-ingress`` (upstream's address)."""
    host = (kb.namespaced_ingress_host(namespace) if namespaced
            else f"{settings.receiver_service}.{settings.system_namespace}.svc.cluster.local")
    return kb.ingress_url(host, namespace, name)


class BrokerReconciler:
    """Shares the channel ``Reconciler``'s API clients, caches, leadership check and write helpers."""

    def __init__(self, base: Reconciler, brokers: BrokerStores, *, recheck_seconds: float = 60.0,
                 broker_config_map: str = kb.DEFAULT_BROKER_CONFIG, kafka_timeout: float = 10.0,
                 namespaced_deployments: Store | None = None) -> None:
        self.base = base
        #: KafkaNamespaced Brokers' data planes (``controller/namespaced.py``)
        self.namespaced = NamespacedDataPlane(base, brokers.brokers, namespaced_deployments,
                                              recheck_seconds=recheck_seconds)
        self.settings = base.settings
        self.stores = base.stores
        self.brokers = brokers
        self.core, self.apps, self.custom = base.core, base.apps, base.custom
        self.broker_config_map = broker_config_map
        self._admins_by_connection: dict[str, AdminPool] = {}
        self.kafka_timeout = kafka_timeout
        self.recheck_seconds = recheck_seconds
        self.filters = TriggerFilters()
        #: Brokers whose external topic does not exist yet: looked for again within seconds
        self.topic_wait = TopicWait()

    # -- Broker -----------------------------------------------------------------------------------------
    def reconcile_broker(self, namespace: str, name: str) -> Result:
        obj = self.brokers.brokers.get(namespace, name)
        if obj is None:
            self.topic_wait.forget(namespace, name)
            return Result()
        meta = obj.get("metadata") or {}
        ours = kb.is_kafka_broker(obj)
        if meta.get("deletionTimestamp") or not ours:
            self.topic_wait.forget(namespace, name)
            # A Broker whose class changed away from Kafka is cleaned up like a deleted one.
            return self._finalize_broker(obj) if BROKER_FINALIZER in (meta.get("finalizers") or ()) else Result()
        if BROKER_FINALIZER not in (meta.get("finalizers") or ()):
            obj = self.base.set_finalizers(obj, [*(meta.get("finalizers") or ()), BROKER_FINALIZER], BROKER_API)
        return self._reconcile_broker(obj)

    def _reconcile_broker(self, obj: Mapping[str, Any]) -> Result:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        namespace, name = meta["namespace"], meta["name"]
        ref = res.ChannelRef(namespace, name, str(meta.get("uid") or ""))
        conditions: list[Condition] = []
        status: dict[str, Any] = {"observedGeneration": meta.get("generation")}
        result = Result()
        errors: list[str] = []
        config: BrokerConfig | None = None
        try:
            config = self.broker_config(obj)
            conditions.append(Condition.true(CONFIG_PARSED, "ConfigParsed", f"config from {config.source}"))
        except BrokerConfigError as exc:
            conditions.append(Condition.false(CONFIG_PARSED, exc.reason, str(exc)))
            if exc.retry:
                result = Result(requeue_after=self.recheck_seconds)
        if config is None:
            waiting = "waiting for a usable Broker config"
            conditions += [Condition.unknown(cond.TOPIC_READY, "ConfigNotParsed", waiting),
                           Condition.unknown(DATA_PLANE_AVAILABLE, "ConfigNotParsed", waiting)]
        else:
            topic_cond, result = self._topic(obj, config)
            conditions.append(topic_cond)
            if kb.is_namespaced_broker(obj):
                conditions.append(self._namespaced_data_plane(obj, ref, config, errors))
            else:
                conditions.append(self._data_plane(ref, config, errors))
        if config is not None and all(c.is_true for c in conditions):
            url = broker_url(self.settings, namespace, name, namespaced=kb.is_namespaced_broker(obj))
            status["address"] = res.address(self.settings, url)
            if self.settings.auth_issuer:
                # Ingress auth is on: senders ask for tokens of this audience (Knative's format).
                status["address"]["audience"] = kb.broker_audience(namespace, name)
            conditions.append(Condition.true(cond.ADDRESSABLE))
        else:
            status["address"] = None
            conditions.append(Condition.false(cond.ADDRESSABLE, "NotReady",
                                              "the address is published once the topic and data plane are ready"))
        sink = self.base.dead_letter_sink(namespace, spec)
        status.update(dead_letter_status(sink[1] if sink else None))
        if sink is not None:
            conditions.append(sink[0])
            if not sink[0].is_true:
                result = Result(requeue_after=self.recheck_seconds)
        if config is not None and (annotations := connection_annotations(obj.get("status"), config.connection.ref)):
            status["annotations"] = annotations
        conditions.append(cond.ready_condition(conditions, BROKER_DEPENDENTS))
        self.base.event_policies(kb.GROUP, "Broker", obj, status, conditions)
        self.base.patch_status(obj, status, conditions, BROKER_API)
        if errors and result.error is None:
            return Result(error="; ".join(errors))
        return result

    def broker_config(self, broker: Mapping[str, Any]) -> BrokerConfig:
        """Raises ``BrokerConfigError`` naming the object and key to fix."""
        spec = broker.get("spec") or {}
        ref = spec.get("config")
        if ref:
            kind, api_version = ref.get("kind") or "ConfigMap", ref.get("apiVersion") or "v1"
            if kind != "ConfigMap" or api_version != "v1":
                raise BrokerConfigError("UnsupportedConfig",
                                        f"spec.config must reference a v1 ConfigMap, not {api_version} {kind}")
            if not ref.get("name"):
                raise BrokerConfigError("InvalidConfig", "spec.config.name is required")
        cm_ns, cm_name = config_map_of(broker, self.settings.system_namespace, self.broker_config_map)
        if ref:
            data = self._read_config_map(cm_ns, cm_name)
            if data is None:
                raise BrokerConfigError("ConfigMapNotFound",
                                        f"ConfigMap {cm_ns}/{cm_name} named by spec.config does not exist",
                                        retry=True)
        else:
            data = self._read_config_map(cm_ns, cm_name)
        where = f"ConfigMap {cm_ns}/{cm_name}" if data is not None else "built-in defaults"
        data = data or {}
        partitions = _positive_int(data, kb.KEY_PARTITIONS, DEFAULT_PARTITIONS, where)
        replication = _positive_int(data, kb.KEY_REPLICATION, DEFAULT_REPLICATION, where)
        meta = broker.get("metadata") or {}
        copy = res.secret_copy_name(broker_dispatcher_name(str(meta.get("namespace")), str(meta.get("name"))))
        try:
            connection, secret = self._connection(data, cm_ns, where, copy)
        except KafkaConfigError as exc:
            raise BrokerConfigError("KafkaConfigInvalid", str(exc), retry=True) from None
        outside = connection.secret_name == copy
        return BrokerConfig(partitions, replication, connection, where, secret if outside else None)

    def _connection(self, data: Mapping[str, str], namespace: str, where: str,
                    copy: str) -> tuple[ResolvedConnection, dict[str, bytes]]:
        """The connection a config names, and its Secret's data. A Secret outside the system namespace (in the
        config's, as upstream) is read by name and served to the data plane as its copy ``copy``."""
        default = self.base.default_connection()
        servers = (data.get(KEY_BOOTSTRAP) or "").strip()
        secret_name = (data.get(KEY_SECRET_NAME) or "").strip()
        if not servers and not secret_name:
            return default, {}  # the controller's own connection (config-kafka)
        secret: dict[str, bytes] = {}
        system = self.settings.system_namespace
        if secret_name:
            try:
                secret = self.base.read_secret(namespace, secret_name, where)
            except SecretProblem as exc:
                raise BrokerConfigError(exc.reason, str(exc), retry=True) from None
            if namespace != system:
                secret_name = copy  # what the dispatcher mounts and the receiver reads, in the system namespace
        servers = servers or default.bootstrap_servers
        connection = connection_from_secret(secret, provider=self.settings.kafka_provider, bootstrap_servers=servers,
                                            extra=self.settings.kafka_extra_config())
        checksum = hashlib.sha256(json.dumps(
            {"servers": servers, "secret": {k: v.hex() for k, v in sorted(secret.items())}, "name": secret_name,
             "provider": self.settings.kafka_provider, "extra": self.settings.kafka_extra},
            sort_keys=True).encode()).hexdigest()[:16]
        resolved = ResolvedConnection(connection=connection, secret_name=secret_name or None,
                                      bootstrap_servers=servers, checksum=checksum,
                                      dispatcher_resources=default.dispatcher_resources,
                                      secret_keys=frozenset(secret),
                                      ref=ConnectionRef(str(connection.config["bootstrap.servers"]),
                                                        system if secret_name else "", secret_name, checksum))
        return resolved, secret

    def _read_config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            found = self.core.read_namespaced_config_map(name, namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise
        return dict(found.data or {})

    def _admin(self, connection: ResolvedConnection) -> Any:
        pool = self._admins_by_connection.get(connection.checksum)
        if pool is None:
            if len(self._admins_by_connection) > 32:
                self._admins_by_connection.clear()
            pool = self._admins_by_connection[connection.checksum] = AdminPool(timeout=self.kafka_timeout)
        return pool.get(connection)

    def _topic(self, obj: Mapping[str, Any], config: BrokerConfig) -> tuple[Condition, Result]:
        external = ((obj["metadata"].get("annotations") or {}).get(kb.ANNOTATION_EXTERNAL_TOPIC))
        topic = kb.topic_of(obj)
        manage = self.settings.topic_management == "admin" and not external
        want = TopicSpec(topic, config.partitions, config.replication_factor, RETENTION_MS)
        key = obj_key(obj)
        try:
            ensure_topic(self._admin(config.connection), want, manage=manage)
        except TopicError as exc:
            log.warning("broker topic not ready", extra={"topic": topic, "reason": exc.reason, "error": exc.message})
            # Not retriable (a shrink, a bad replication factor) needs a config change; the resync rechecks. An
            # external topic someone else creates is looked for again within seconds.
            retry = (self.topic_wait.retry(*key) if exc.reason == TOPIC_NOT_FOUND else
                     Result(error=exc.message) if exc.retriable else Result(requeue_after=self.recheck_seconds))
            return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), retry
        self.topic_wait.found(*key)
        mode = "managed" if manage else "external"
        return Condition.true(cond.TOPIC_READY, "TopicReady", f"topic {topic} ({mode})"), Result()

    def _data_plane(self, ref: res.ChannelRef, config: BrokerConfig, errors: list[str]) -> Condition:
        owner = res.Owner(broker_dispatcher_name(ref.namespace, ref.name), ANNOTATION_BROKER,
                          (("KE_CHANNEL_NAME", ""), ("KE_CHANNEL_NAMESPACE", ""),
                           ("KE_BROKER_NAMESPACE", ref.namespace), ("KE_BROKER_NAME", ref.name)))
        dconfig = res.DispatcherConfig(replicas=self.settings.dispatcher_replicas,
                                       checksum=config.connection.checksum,
                                       secret_name=config.connection.secret_name,
                                       bootstrap_servers=config.connection.bootstrap_servers,
                                       resources=config.connection.dispatcher_resources)
        deployment = res.dispatcher_deployment(ref, self.settings, dconfig, config.partitions, owner=owner)
        try:
            if config.secret_copy is not None:
                self.base.write_secret_copy(res.secret_copy_name(owner.name), config.secret_copy)
            live = self.base._apply_deployment(deployment)
            self.base._apply_service(res.dispatcher_service(ref, self.settings, owner))
        except ApiException as exc:
            errors.append(f"Broker dispatcher: {api_error(exc)}")
            return Condition.false(DATA_PLANE_AVAILABLE, "DispatcherFailed", api_error(exc))
        try:
            # The Broker was KafkaNamespaced: its dispatcher in its own namespace goes (and that namespace's receiver
            # if no KafkaNamespaced Broker is left there).
            self._stop_namespaced_dispatcher(ref.namespace, owner.name)
            self.namespaced.retire(ref.namespace)
        except ApiException as exc:
            errors.append(f"the Broker's namespaced dispatcher: {api_error(exc)}")
        system = self.settings.system_namespace
        receiver = self.stores.deployments.get(system, self.settings.receiver_deployment_name)
        ok, why = res.deployment_available(receiver)
        if not ok:
            return Condition.false(DATA_PLANE_AVAILABLE, "ReceiverUnavailable",
                                   f"receiver Deployment {system}/{self.settings.receiver_deployment_name}: {why}")
        ok, why = res.deployment_available(live)
        if not ok:
            return Condition.false(DATA_PLANE_AVAILABLE, "DispatcherUnavailable",
                                   f"dispatcher Deployment {system}/{owner.name}: {why}")
        return Condition.true(DATA_PLANE_AVAILABLE)

    def _namespaced_data_plane(self, obj: Mapping[str, Any], ref: res.ChannelRef, config: BrokerConfig,
                               errors: list[str]) -> Condition:
        """A KafkaNamespaced Broker's data plane: its namespace's receiver and Service, and its own dispatcher,
        all in its namespace (``controller/namespaced.py``)."""
        plane = self.namespaced
        if not plane.enabled or plane.deployments is None:
            return Condition.false(DATA_PLANE_AVAILABLE, "NamespacedBrokersDisabled", NAMESPACED_DISABLED)
        namespace, system = ref.namespace, self.settings.system_namespace
        secret = config.connection.secret_name
        if secret and config.connection.ref is not None:
            return Condition.false(
                DATA_PLANE_AVAILABLE, "NamespacedConnectionUnsupported",
                f"{config.source} names a connection Secret of its own ({secret}): a KafkaNamespaced Broker's data "
                "plane uses the installation's connection (config-kafka's Secret) for now; drop auth.secret.ref.name "
                "from the config or use the Kafka class")
        try:
            plane.apply(namespace, secret)  # the installation's Secret: copied beside the receiver's
        except NamespacedProblem as exc:
            return Condition.false(DATA_PLANE_AVAILABLE, exc.reason, str(exc))
        except ApiException as exc:
            errors.append(f"namespaced data plane of {namespace}: {api_error(exc)}")
            return Condition.false(DATA_PLANE_AVAILABLE, "NamespacedDataPlaneFailed", api_error(exc))
        name = broker_dispatcher_name(namespace, ref.name)
        owner = res.Owner(name, ANNOTATION_BROKER,
                          (("KE_CHANNEL_NAME", ""), ("KE_CHANNEL_NAMESPACE", ""),
                           ("KE_BROKER_NAMESPACE", namespace), ("KE_BROKER_NAME", ref.name)),
                          namespace=namespace, labels=((LABEL_DATA_PLANE, DATA_PLANE_NAMESPACED),),
                          owner_references=({**broker_owner(obj), "controller": True},))
        dconfig = res.DispatcherConfig(replicas=self.settings.dispatcher_replicas,
                                       checksum=config.connection.checksum, secret_name=secret,
                                       bootstrap_servers=config.connection.bootstrap_servers,
                                       resources=config.connection.dispatcher_resources)
        deployment = res.dispatcher_deployment(ref, self.settings, dconfig, config.partitions, owner=owner)
        try:
            live, _ = self.base.writer.apply(plane.deployments, self.apps.create_namespaced_deployment,
                                             self.apps.patch_namespaced_deployment, deployment)
            self.base._apply_service(res.dispatcher_service(ref, self.settings, owner))
            if self.stores.deployments.get(system, name) is not None:
                # The Broker was of the Kafka class: its dispatcher in the system namespace goes.
                self.base.stop_deployment(name, ((name, system),))
        except ApiException as exc:
            errors.append(f"Broker dispatcher: {api_error(exc)}")
            return Condition.false(DATA_PLANE_AVAILABLE, "DispatcherFailed", api_error(exc))
        ok, why = res.deployment_available(plane.receiver(namespace))
        if not ok:
            return Condition.false(DATA_PLANE_AVAILABLE, "ReceiverUnavailable",
                                   f"receiver Deployment {namespace}/{NAMESPACED_RECEIVER}: {why}")
        ok, why = res.deployment_available(live)
        if not ok:
            return Condition.false(DATA_PLANE_AVAILABLE, "DispatcherUnavailable",
                                   f"dispatcher Deployment {namespace}/{name}: {why}")
        return Condition.true(DATA_PLANE_AVAILABLE)

    def _stop_namespaced_dispatcher(self, namespace: str, name: str, *, always: bool = False) -> bool:
        """Delete a Broker's dispatcher in its own namespace (``always``, or when the cache holds one: a Kafka-class
        Broker that was KafkaNamespaced); True while it still exists. Nothing while the class is not enabled: the
        controller may then not delete Deployments outside the system namespace."""
        plane = self.namespaced
        if plane.deployments is None or not (always or plane.deployments.get(namespace, name) is not None):
            return False
        return self.base.stop_deployment(name, ((name, namespace),), namespace=namespace)

    def _finalize_broker(self, obj: Mapping[str, Any]) -> Result:
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        system = self.settings.system_namespace
        dispatcher = broker_dispatcher_name(namespace, name)
        stopping = self._stop_namespaced_dispatcher(namespace, dispatcher, always=kb.is_namespaced_broker(obj))
        if self.base.stop_deployment(dispatcher, ((dispatcher, system),)) or stopping:
            # Its removal is a Deployment event naming this Broker (ANNOTATION_BROKER): that enqueues it at once.
            log.info("Broker finalizing: waiting for its dispatcher to stop",
                     extra={"namespace": namespace, "broker": name, "deployment": f"{system}/{dispatcher}"})
            return Result(requeue_after=STOP_RECHECK_SECONDS)
        try:
            self.base.delete_secret_copy(res.secret_copy_name(dispatcher))
        except ApiException as exc:
            return Result(error=f"deleting the dispatcher's Secret copy: {api_error(exc)}")
        external = (meta.get("annotations") or {}).get(kb.ANNOTATION_EXTERNAL_TOPIC)
        if self.settings.topic_management == "admin" and not external and self.settings.delete_topics:
            topic = kb.broker_topic(namespace, name)
            try:
                connection = self.broker_config(obj).connection
            except BrokerConfigError:
                # The config is gone or broken: the topic lives where the controller's own connection points.
                connection = self.base.default_connection()
            try:
                self._admin(connection).delete(topic)
            except TopicError as exc:
                return Result(error=f"deleting topic {topic}: {exc}")
        finalizers = [f for f in meta.get("finalizers") or () if f != BROKER_FINALIZER]
        try:
            self.base.set_finalizers(obj, finalizers, BROKER_API)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
        log.info("Broker finalized", extra={"namespace": namespace, "broker": name})
        return Result()

    # -- Trigger ----------------------------------------------------------------------------------------
    def reconcile_trigger(self, namespace: str, name: str) -> Result:
        obj = self.brokers.triggers.get(namespace, name)
        if obj is None:
            self.filters.forget((namespace, name))
            return Result()
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        broker_name = kb.trigger_broker(obj)
        broker = self.brokers.brokers.get(namespace, broker_name) if broker_name else None
        if foreign := kb.foreign_broker(obj):
            # Another namespace's Broker: another implementation's Trigger unless that Broker is a Kafka one (or
            # missing); ours is refused with a condition (_broker_ready).
            broker = self.brokers.brokers.get(*foreign.split("/", 1))
        finalizers = list(meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            return self._finalize_trigger(obj, broker) if TRIGGER_FINALIZER in finalizers else Result()
        if broker is not None and not kb.is_kafka_broker(broker):
            return Result()  # another Broker class's Trigger
        if TRIGGER_FINALIZER not in finalizers:
            obj = self.base.set_finalizers(obj, [*finalizers, TRIGGER_FINALIZER], TRIGGER_API)
        conditions: list[Condition] = []
        status: dict[str, Any] = {"observedGeneration": meta.get("generation")}
        result = Result()
        recheck = Result(requeue_after=self.recheck_seconds)
        conditions.append(self._broker_ready(namespace, broker_name, broker, obj))
        identity = self.base.identities.ensure(TRIGGER_API_VERSION, "Trigger", obj, status)
        conditions.append(identity)
        if not identity.is_true:
            result = recheck
        try:
            subscriber = resolve_address(self.core, self.custom, spec.get("subscriber") or {}, namespace,
                                         "subscriber")
            status.update(subscriberUri=subscriber.url, subscriberAudience=subscriber.audience,
                          subscriberCACerts=subscriber.ca_certs)
            conditions.append(Condition.true(SUBSCRIBER_RESOLVED))
        except Unresolved as exc:
            status.update(subscriberUri=None, subscriberAudience=None, subscriberCACerts=None)
            conditions.append(Condition.false(SUBSCRIBER_RESOLVED, exc.reason, str(exc)))
            result = recheck
        conditions.append(self._subscription(namespace, name, spec, meta.get("annotations") or {}, broker))
        dependency = self._dependency(namespace, meta)
        conditions.append(dependency)
        if not dependency.is_true:
            result = recheck
        sink = self.base.dead_letter_sink(namespace, spec)
        status.update(dead_letter_status(sink[1] if sink else None))
        if sink is not None:
            conditions.append(sink[0])
            if not sink[0].is_true:
                result = recheck
        elif broker is not None and (broker.get("status") or {}).get("deadLetterSinkUri"):
            # The Broker's sink is every Trigger's default (upstream: Trigger delivery, else Broker delivery).
            status.update({k: broker["status"].get(k) for k in DEAD_LETTER_FIELDS})
        if not conditions[0].is_true:
            result = recheck
        conditions.append(cond.ready_condition([*conditions, self._consumer_group(obj)], TRIGGER_DEPENDENTS))
        try:
            self.base.patch_status(obj, status, conditions, TRIGGER_API, foreign=(kb.CONSUMER_GROUP_READY,))
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise
            # The dispatcher wrote since this copy was cached: not a failure, the newer object's watch event (or
            # this requeue) reconciles again with its ConsumerGroupReady.
            log.debug("trigger status changed meanwhile, reconciling again", extra={"trigger": f"{namespace}/{name}"})
            return Result(requeue_after=1.0)
        return result

    @staticmethod
    def _consumer_group(obj: Mapping[str, Any]) -> Condition:
        """The dispatcher's ConsumerGroupReady as stored, for Ready only (the controller never writes it)."""
        stored = find((obj.get("status") or {}).get("conditions"), kb.CONSUMER_GROUP_READY)
        if stored is not None:
            return from_dict(stored)
        meta = obj.get("metadata") or {}
        return Condition.unknown(kb.CONSUMER_GROUP_READY, "ConsumerGroupNotReported",
                                 f"the Broker's dispatcher has not reported consumer group "
                                 f"{kb.trigger_group(str(meta.get('namespace')), str(meta.get('name')))} yet")

    def _finalize_trigger(self, obj: Mapping[str, Any], broker: Mapping[str, Any] | None) -> Result:
        meta = obj["metadata"]
        group = kb.trigger_group(meta["namespace"], meta["name"])
        connection: ResolvedConnection | None = None
        if broker is not None:
            try:
                connection = self.broker_config(broker).connection
            except BrokerConfigError:
                connection = None
        if connection is None:
            connection = self.base.default_connection()
        try:
            # Members still in the group (the dispatcher retiring its consumer) make this retry with backoff.
            self._admin(connection).delete_group(group)
        except TopicError as exc:
            return Result(error=str(exc))
        self.filters.forget((meta["namespace"], meta["name"]))
        try:
            self.base.identities.forget(TRIGGER_API_VERSION, "Trigger", obj)
        except IdentityError as exc:
            return Result(error=str(exc))
        try:
            self.base.set_finalizers(obj, [f for f in meta.get("finalizers") or () if f != TRIGGER_FINALIZER],
                                     TRIGGER_API)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
        return Result()

    def _broker_ready(self, namespace: str, name: str, broker: Mapping[str, Any] | None,
                      trigger: Mapping[str, Any] | None = None) -> Condition:
        if trigger is not None and (foreign := kb.foreign_broker(trigger)):
            return Condition.false(BROKER_READY, "CrossNamespaceBrokerRef",
                                   f"spec.brokerRef names Broker {foreign} of another namespace: cross-namespace "
                                   "Triggers are not supported; create the Trigger in the Broker's namespace")
        if not name:
            return Condition.false(BROKER_READY, "BrokerNotSet", "spec.broker names no Broker")
        if broker is None:
            return Condition.false(BROKER_READY, "BrokerDoesNotExist", f"Broker {namespace}/{name} does not exist")
        for c in (broker.get("status") or {}).get("conditions") or ():
            if c.get("type") == cond.READY:
                if c.get("status") == "True":
                    return Condition.true(BROKER_READY)
                return Condition(BROKER_READY, str(c.get("status") or "Unknown"),
                                 str(c.get("reason") or "BrokerNotReady"),
                                 f"Broker {namespace}/{name}: {c.get('message') or 'not ready'}")
        return Condition.unknown(BROKER_READY, "BrokerNotReconciled", f"Broker {namespace}/{name} has no status yet")

    def _subscription(self, namespace: str, name: str, spec: Mapping[str, Any], annotations: Mapping[str, Any],
                      broker: Mapping[str, Any] | None) -> Condition:
        try:
            self.filters.get((namespace, name), spec)
        except FilterError as exc:
            return Condition.false(SUBSCRIPTION_READY, exc.reason, str(exc))
        for where, delivery in (("spec.delivery", spec.get("delivery")),
                                ("Broker spec.delivery", ((broker or {}).get("spec") or {}).get("delivery"))):
            try:
                DeliverySpec.from_dict(delivery)
            except DeliverySpecError as exc:
                return Condition.false(SUBSCRIPTION_READY, "InvalidDelivery", f"{where}: {exc}")
        try:
            rate_limit_annotation(annotations)
        except DeliverySpecError as exc:
            return Condition.false(SUBSCRIPTION_READY, "InvalidRateLimit", str(exc))
        return Condition.true(SUBSCRIPTION_READY, "SubscriptionReady",
                              f"consumer group {kb.trigger_group(namespace, name)}")

    def _dependency(self, namespace: str, meta: Mapping[str, Any]) -> Condition:
        raw = (meta.get("annotations") or {}).get(kb.ANNOTATION_DEPENDENCY)
        if not raw:
            return Condition.true(DEPENDENCY_READY)
        try:
            ref = json.loads(raw)
            kind, name, api_version = ref["kind"], ref["name"], ref["apiVersion"]
        except (ValueError, KeyError, TypeError):
            return Condition.false(DEPENDENCY_READY, "InvalidDependency",
                                   f"annotation {kb.ANNOTATION_DEPENDENCY} must be a JSON object reference with "
                                   "kind, name and apiVersion")
        group, _, version = str(api_version).rpartition("/")
        try:
            obj = self.custom.get_namespaced_custom_object(group, version, ref.get("namespace") or namespace,
                                                           f"{str(kind).lower()}s", name, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status == HTTP_FORBIDDEN:
                return Condition.false(DEPENDENCY_READY, "DependencyForbidden",
                                       f"{kind} {name} cannot be read: {not_readable(str(kind), str(api_version))}")
            why = "does not exist" if exc.status == HTTP_NOT_FOUND else f"cannot be read ({exc.status})"
            return Condition.false(DEPENDENCY_READY, "DependencyDoesNotExist", f"{kind} {name} {why}")
        for c in (obj.get("status") or {}).get("conditions") or ():
            if c.get("type") == cond.READY and c.get("status") == "True":
                return Condition.true(DEPENDENCY_READY)
        return Condition.false(DEPENDENCY_READY, "DependencyNotReady", f"{kind} {name} is not Ready")


def _positive_int(data: Mapping[str, str], key: str, default: int, where: str) -> int:
    raw = (data.get(key) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BrokerConfigError("InvalidConfig", f"{where} key {key} is not an integer: {raw!r}") from None
    if value < 1:
        raise BrokerConfigError("InvalidConfig", f"{where} key {key} must be at least 1, not {value}")
    return value


class BrokerReadiness(Collector):
    """``kafka_broker_ready`` per Kafka-class Broker and ``kafka_trigger_ready`` per Trigger of one (or of a
    Broker not in the cache, which this controller reconciles too), read at scrape time like ``ChannelReadiness``.

    Brokers and Triggers of other classes are left out: another implementation reports them.
    """

    def __init__(self, brokers: Store, triggers: Store) -> None:
        self.brokers, self.triggers = brokers, triggers

    def collect(self) -> Iterable[Metric]:
        brokers = GaugeMetricFamily("kafka_broker_ready", "1 while the Kafka Broker's Ready condition is True.",
                                    labels=("namespace", "name", "reason"))
        triggers = GaugeMetricFamily("kafka_trigger_ready", "1 while the Trigger's Ready condition is True.",
                                     labels=("namespace", "name", "broker", "reason"))
        for obj in self.brokers.items():
            if kb.is_kafka_broker(obj):
                namespace, name, reason, value = readiness(obj)
                brokers.add_metric((namespace, name, reason), value)
        for obj in self.triggers.items():
            namespace, name, reason, value = readiness(obj)
            broker_name = kb.trigger_broker(obj)
            broker = self.brokers.get(namespace, broker_name) if broker_name else None
            if broker is None or kb.is_kafka_broker(broker):
                triggers.add_metric((namespace, name, broker_name, reason), value)
        yield brokers
        yield triggers


def setup(host: Host) -> None:
    """Cache Brokers and Triggers. A Broker's dispatcher objects (``ANNOTATION_BROKER``), the ConfigMap it names
    (watched by name, any namespace), the Secret that ConfigMap names or its status carries, and the EventPolicies of
    its namespace are part of its status; a Broker's readiness and delivery are part of its Triggers'."""
    custom = host.base.custom
    brokers = host.informer(BROKER, custom.list_cluster_custom_object, group=kb.GROUP, version=kb.VERSION,
                            plural=kb.BROKERS)
    triggers = host.informer(TRIGGER, custom.list_cluster_custom_object, group=kb.GROUP, version=kb.VERSION,
                             plural=kb.TRIGGERS)
    opts, system = host.options, host.settings.system_namespace
    namespaced: Store | None = None
    if host.settings.namespaced_brokers:
        # KafkaNamespaced data planes' Deployments in every namespace (only theirs: a label selector).
        namespaced = host.informer(NAMESPACED_DEPLOYMENT, host.base.apps.list_deployment_for_all_namespaces,
                                   label_selector=NAMESPACED_SELECTOR)
    reconciler = BrokerReconciler(host.base, BrokerStores(brokers, triggers),
                                  recheck_seconds=opts.topic_recheck_seconds,
                                  broker_config_map=opts.broker_config_map, kafka_timeout=opts.kafka_timeout,
                                  namespaced_deployments=namespaced)
    host.reconciles(BROKER, reconciler.reconcile_broker)
    host.reconciles(TRIGGER, reconciler.reconcile_trigger)
    host.owns(ANNOTATION_BROKER, BROKER)
    host.registry.register(BrokerReadiness(brokers, triggers))

    def config_map(broker: Mapping[str, Any]) -> tuple[str, str]:
        return config_map_of(broker, system, opts.broker_config_map)

    def on_broker(event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        host.enqueue(BROKER, namespace, name)
        if event not in ("CONFIG", RESYNC):
            # Watch the ConfigMaps the Brokers name now: a Broker waiting for its config sees it at once.
            config_maps.want({config_map(b) for b in brokers.items() if kb.is_kafka_broker(b)})
        for trigger in triggers.items():
            tmeta = trigger.get("metadata") or {}
            if tmeta.get("namespace") == namespace and kb.trigger_broker(trigger) == name:
                host.enqueue(TRIGGER, namespace, str(tmeta.get("name")))

    def on_config_map(event: str, obj: Mapping[str, Any]) -> None:
        """A Broker's ConfigMap (or the Secret it names) changed: reconcile the Brokers that name it."""
        key = obj_key(obj)
        for broker in brokers.items():
            if config_map(broker) == key:
                on_broker("CONFIG", broker)

    def on_secret(event: str, secret: Mapping[str, Any]) -> None:
        name = (secret.get("metadata") or {}).get("name")
        for key in config_maps.watched():  # the Secrets Broker configs name live in the system namespace too
            found = config_maps.get(*key) or {}
            if ((found.get("data") or {}).get(KEY_SECRET_NAME) or "").strip() == name:
                on_config_map(event, found)

    #: the ConfigMaps Brokers name (any namespace), each watched by name while a Broker names it
    config_maps = NamedWatches("broker-configmaps", host.base.core.list_namespaced_config_map, on_config_map,
                               watch_timeout_seconds=opts.watch_timeout_seconds)
    host.stops(config_maps.stop)
    def on_namespaced(event: str, obj: Mapping[str, Any]) -> None:
        """A Broker's own dispatcher enqueues it; its namespace's receiver every KafkaNamespaced Broker there."""
        meta = obj.get("metadata") or {}
        owner = str((meta.get("annotations") or {}).get(ANNOTATION_BROKER) or "")
        if "/" in owner:
            host.enqueue(BROKER, *owner.split("/", 1))
            return
        namespace = str(meta.get("namespace"))
        if event == "DELETED":
            reconciler.namespaced.forget(namespace)
        for broker in brokers.items():
            if (broker.get("metadata") or {}).get("namespace") == namespace and kb.is_namespaced_broker(broker):
                enqueue_object(host, BROKER)(event, broker)

    host.on(NAMESPACED_DEPLOYMENT, on_namespaced)
    host.on(BROKER, on_broker)
    host.on(TRIGGER, enqueue_object(host, TRIGGER))
    host.on(SECRET, on_secret)

    def trigger_waits(trigger: Mapping[str, Any]) -> set[Ref]:
        namespace, spec = namespace_of(trigger), trigger.get("spec") or {}
        dependency = ((trigger.get("metadata") or {}).get("annotations") or {}).get(kb.ANNOTATION_DEPENDENCY)
        return (waiting_for(trigger, SUBSCRIBER_RESOLVED, ref_of(spec.get("subscriber"), namespace))
                | waiting_for(trigger, DEPENDENCY_READY, annotated_ref(dependency, namespace))
                | dead_letter_sink_waits(trigger))

    # The subscribers, dead-letter sinks and dependencies a Trigger (or a Broker's sink) waits for, watched by name.
    watch_dependencies(host, BROKER, dead_letter_sink_waits)
    watch_dependencies(host, TRIGGER, trigger_waits)
    on_status_secret(host, BROKER, brokers)
    on_policies(host, BROKER, brokers)


KIND_BROKER = Kind(BROKER, "brokers", kb.GROUP, kb.VERSION, frozenset({kb.BROKERS, kb.TRIGGERS}), setup)
