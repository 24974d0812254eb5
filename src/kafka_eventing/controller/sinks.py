"""Reconcile KafkaSinks — level-based and idempotent, on the channel ``Reconciler``'s clients, caches and writer.

A KafkaSink has no data plane of its own: the shared receiver writes what is POSTed to it. The controller checks
its connection (``spec.bootstrapServers`` and ``spec.auth.secret.ref.name``, a Secret in the sink's namespace,
either connection format), makes sure its topic is there, and publishes the address:

- ConfigParsed: the spec and the connection Secret make a usable Kafka config (SecretNotFound,
  SecretNotReadable, InvalidSecret, InvalidSpec otherwise);
- TopicReady: ``TopicCreated`` when ``numPartitions`` and ``replicationFactor`` are both set and the topic did
  not exist, ``TopicExists`` when it did (an existing topic is never altered), ``TopicNotFound`` when it does not
  exist and the spec does not ask for it to be created, or the Admin API's reason (KafkaUnreachable,
  TopicNotAuthorized, InvalidReplicationFactor, ...);
- DataPlaneAvailable: the shared receiver Deployment is available;
- Addressable and ``status.address.url`` = ``http://<sink ingress Service>/<namespace>/<name>``; Ready.

The connection, when it is not the controller's own, goes on ``status.annotations`` (``ConnectionRef``) for the
receiver, with the Secret's checksum: a rotated Secret reaches the receiver's producer at the next reconcile (the
periodic resync; Secrets outside the system namespace are not watched). Deleting a KafkaSink never deletes its
topic: others read it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import AdminPool, ResolvedConnection, connection_annotations
from kafka_eventing.controller.host import Host, Kind, enqueue_object, on_policies, on_status_secret
from kafka_eventing.controller.reconciler import TOPIC_NOT_FOUND, Reconciler, Result, SecretProblem, TopicWait
from kafka_eventing.controller.topics import TopicError, TopicNotFound, TopicSpec
from kafka_eventing.core import sinks as ks
from kafka_eventing.core.conditions import Condition, find, from_dict
from kafka_eventing.core.informer import Store
from kafka_eventing.core.kafka_config import ConnectionRef, KafkaConfigError, connection_from_secret

log = logging.getLogger(__name__)

SINK_API = (ks.GROUP, ks.VERSION, ks.PLURAL)
HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404

CONFIG_PARSED = "ConfigParsed"
DATA_PLANE_AVAILABLE = "DataPlaneAvailable"
SINK_DEPENDENTS = (CONFIG_PARSED, cond.TOPIC_READY, DATA_PLANE_AVAILABLE, cond.ADDRESSABLE)


class SinkConfigError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SinkConfig:
    topic: str
    #: both set: the topic is created when missing; else it must exist
    partitions: int | None
    replication_factor: int | None
    connection: ResolvedConnection


def sink_url(service: str, system_namespace: str, namespace: str, name: str) -> str:
    return ks.ingress_url(service, system_namespace, namespace, name)


class SinkReconciler:
    """Shares the channel ``Reconciler``'s API clients, caches, leadership check and status writer."""

    def __init__(self, base: Reconciler, sinks: Store, *, recheck_seconds: float = 60.0,
                 kafka_timeout: float = 10.0) -> None:
        self.base, self.settings, self.sinks = base, base.settings, sinks
        self.core = base.core
        self.recheck_seconds, self.kafka_timeout = recheck_seconds, kafka_timeout
        self._admins: dict[str, AdminPool] = {}
        #: sinks whose topic does not exist yet (and is not theirs to create): looked for again within seconds
        self.topic_wait = TopicWait()

    def reconcile_sink(self, namespace: str, name: str) -> Result:
        obj = self.sinks.get(namespace, name)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            self.topic_wait.forget(namespace, name)
            return Result()  # nothing of its own to clean up: the topic stays, the receiver forgets it
        meta = obj["metadata"]
        conditions: list[Condition] = []
        status: dict[str, Any] = {"observedGeneration": meta.get("generation")}
        result = Result()
        config: SinkConfig | None = None
        try:
            config = self.sink_config(obj)
            servers = config.connection.bootstrap_servers
            conditions.append(Condition.true(CONFIG_PARSED, "ConfigParsed", f"Kafka at {servers}"))
        except SinkConfigError as exc:
            conditions.append(Condition.false(CONFIG_PARSED, exc.reason, str(exc)))
            result = Result(requeue_after=self.recheck_seconds)
        if config is None:
            conditions.append(Condition.unknown(cond.TOPIC_READY, "ConfigNotParsed",
                                                "waiting for a usable KafkaSink spec and Secret"))
        else:
            topic_condition, topic_result = self._topic(config, obj.get("status"))
            conditions.append(topic_condition)
            result = topic_result if topic_result.error or topic_result.requeue_after else result
            if topic_condition.reason == TOPIC_NOT_FOUND:
                result = self.topic_wait.retry(namespace, name)  # Ready within seconds of the topic's creation
            elif topic_condition.is_true:
                self.topic_wait.found(namespace, name)
            if annotations := connection_annotations(obj.get("status"), config.connection.ref):
                status["annotations"] = annotations
        conditions.append(self._data_plane())
        if all(c.is_true for c in conditions):
            url = sink_url(self.settings.sink_service, self.settings.system_namespace, namespace, name)
            status["address"] = res.address(self.settings, url)
            if self.settings.auth_issuer:
                # Ingress auth is on: senders ask for tokens of this audience (Knative's format).
                status["address"]["audience"] = ks.sink_audience(namespace, name)
            conditions.append(Condition.true(cond.ADDRESSABLE))
        else:
            status["address"] = None
            conditions.append(Condition.false(cond.ADDRESSABLE, "NotReady",
                                              "the address is published once the topic and receiver are ready"))
        conditions.append(cond.ready_condition(conditions, SINK_DEPENDENTS))
        self.base.event_policies(ks.GROUP, ks.KIND, obj, status, conditions)
        self.base.patch_status(obj, status, conditions, SINK_API)
        return result

    def sink_config(self, obj: Mapping[str, Any]) -> SinkConfig:
        """Raises ``SinkConfigError`` naming the field or object to fix."""
        meta, spec = obj["metadata"], obj.get("spec") or {}
        namespace = str(meta["namespace"])
        topic = str(spec.get("topic") or "").strip()
        if not topic:
            raise SinkConfigError("InvalidSpec", "spec.topic is required")
        try:
            ks.content_mode(spec)
        except ValueError:
            raise SinkConfigError("InvalidSpec", f"spec.contentMode {spec.get('contentMode')!r} must be one of "
                                  f"{', '.join(ks.CONTENT_MODES)}") from None
        partitions, replication = spec.get("numPartitions"), spec.get("replicationFactor")
        for field, value in (("numPartitions", partitions), ("replicationFactor", replication)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise SinkConfigError("InvalidSpec", f"spec.{field} must be a positive integer, not {value!r}")
        return SinkConfig(topic, partitions, replication, self._connection(namespace, spec))

    def _connection(self, namespace: str, spec: Mapping[str, Any]) -> ResolvedConnection:
        servers = ",".join(str(s).strip() for s in spec.get("bootstrapServers") or () if str(s).strip())
        secret_name = str((((spec.get("auth") or {}).get("secret") or {}).get("ref") or {}).get("name") or "")
        if not servers and not secret_name:
            try:  # the controller's own connection (config-kafka): the receiver's too
                return self.base.default_connection()
            except KafkaConfigError as exc:
                raise SinkConfigError("KafkaConfigInvalid", f"the controller's own connection: {exc}") from None
        secret: dict[str, bytes] = {}
        if secret_name:
            try:
                # The receiver reads it too, to write the sink's events.
                secret = self.base.read_secret(namespace, secret_name, "spec.auth.secret.ref.name",
                                               ("controller", "receiver"))
            except SecretProblem as exc:
                raise SinkConfigError(exc.reason, str(exc)) from None
        if not servers and not (secret.get("bootstrap.servers") or secret.get("brokers")):
            servers = self.base.default_connection().bootstrap_servers
        try:
            connection = connection_from_secret(secret, provider=self.settings.kafka_provider,
                                                bootstrap_servers=servers, extra=self.settings.kafka_extra_config())
        except KafkaConfigError as exc:
            where = f"Secret {namespace}/{secret_name}" if secret_name else "spec.bootstrapServers"
            raise SinkConfigError("InvalidSecret" if secret_name else "InvalidSpec", f"{where}: {exc}") from None
        effective = str(connection.config["bootstrap.servers"])
        checksum = hashlib.sha256(json.dumps(
            {"servers": effective, "secret": {k: v.hex() for k, v in sorted(secret.items())}, "name": secret_name,
             "provider": self.settings.kafka_provider, "extra": self.settings.kafka_extra},
            sort_keys=True).encode()).hexdigest()[:16]
        return ResolvedConnection(connection=connection, secret_name=secret_name or None,
                                  bootstrap_servers=effective, checksum=checksum, secret_keys=frozenset(secret),
                                  ref=ConnectionRef(effective, namespace if secret_name else "", secret_name,
                                                    checksum))

    def _admin(self, connection: ResolvedConnection) -> Any:
        pool = self._admins.get(connection.checksum)
        if pool is None:
            if len(self._admins) > 32:  # a bound on the clients kept for sinks on distinct clusters
                self._admins.clear()
            pool = self._admins[connection.checksum] = AdminPool(timeout=self.kafka_timeout)
        return pool.get(connection)

    def _topic(self, config: SinkConfig, status: Mapping[str, Any] | None) -> tuple[Condition, Result]:
        topic = config.topic
        create = config.partitions is not None and config.replication_factor is not None
        recheck = Result(requeue_after=self.recheck_seconds)
        admin = self._admin(config.connection)
        try:
            state = admin.describe(topic)
        except TopicNotFound:
            if not create:
                given = ("numPartitions" if config.partitions is not None else
                         "replicationFactor" if config.replication_factor is not None else "")
                hint = f" (spec.{given} alone does not create it)" if given else ""
                return Condition.false(cond.TOPIC_READY, "TopicNotFound", (
                    f"topic {topic!r} does not exist on Kafka at {config.connection.bootstrap_servers}{hint}: create "
                    "it, or set spec.numPartitions and spec.replicationFactor for the controller to")), recheck
            try:
                admin.create(TopicSpec(topic, int(config.partitions or 1), int(config.replication_factor or 1),
                                       None))
            except TopicError as exc:
                return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), recheck
            log.info("KafkaSink topic created", extra={"topic": topic, "partitions": config.partitions})
            return Condition.true(cond.TOPIC_READY, "TopicCreated", (
                f"topic {topic} created with {config.partitions} partitions, replication factor "
                f"{config.replication_factor}")), Result()
        except TopicError as exc:
            return Condition.false(cond.TOPIC_READY, exc.reason, exc.message), recheck
        stored = find((status or {}).get("conditions"), cond.TOPIC_READY) or {}
        if create and stored.get("reason") == "TopicCreated" and stored.get("status") == "True":
            return from_dict(stored), Result()  # created by an earlier reconcile: it still says so
        return Condition.true(cond.TOPIC_READY, "TopicExists",
                              f"topic {topic} exists ({state.partitions} partitions)"), Result()

    def _data_plane(self) -> Condition:
        system, receiver = self.settings.system_namespace, self.settings.receiver_deployment_name
        ok, why = res.deployment_available(self.base.stores.deployments.get(system, receiver))
        if not ok:
            return Condition.false(DATA_PLANE_AVAILABLE, "ReceiverUnavailable",
                                   f"receiver Deployment {system}/{receiver}: {why}")
        return Condition.true(DATA_PLANE_AVAILABLE)


def setup(host: Host) -> None:
    """Cache KafkaSinks; the Secret its status names and the EventPolicies of its namespace are part of its
    status."""
    sinks = host.informer(ks.KIND, host.base.custom.list_cluster_custom_object, group=ks.GROUP, version=ks.VERSION,
                          plural=ks.PLURAL)
    opts = host.options
    reconciler = SinkReconciler(host.base, sinks, recheck_seconds=opts.topic_recheck_seconds,
                                kafka_timeout=opts.kafka_timeout)
    host.reconciles(ks.KIND, reconciler.reconcile_sink)
    host.on(ks.KIND, enqueue_object(host, ks.KIND))
    on_status_secret(host, ks.KIND, sinks)
    on_policies(host, ks.KIND, sinks)


KIND_SINK = Kind(ks.KIND, "sinks", ks.GROUP, ks.VERSION, frozenset({ks.PLURAL}), setup)
