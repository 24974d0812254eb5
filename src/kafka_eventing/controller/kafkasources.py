"""Reconcile KafkaSources (``sources.knative.dev/v1``) — level-based and idempotent, like the Broker reconciler.

A KafkaSource → its spec parsed (``core.kafkasources``; a field that cannot be honoured is a False condition naming
it) → its sink resolved like a Trigger's subscriber (``status.sinkUri``, ``sinkAudience``, ``sinkCACerts``) and its
dead-letter sink (``status.deadLetterSinkUri``) → with ingress authentication on, its OIDC identity
(``status.auth``, ``controller.identities``) → its connection (``bootstrapServers``, the ``net.sasl``/``net.tls``
Secret keys, in the source's own namespace; copied for the dispatcher into the system namespace) checked against
Kafka: every topic exists and is readable with those credentials (ConnectionEstablished) → partitions of the group
that have no committed offset set to ``initialOffset`` and **committed**, so a restart never replays from the
beginning (InitialOffsetsCommitted) → one dispatcher Deployment (the existing dispatcher, ``KE_SOURCE_NAME``,
``KE_SOURCE_NAMESPACE``) with ``spec.consumers`` replicas, never more than the largest topic has partitions
(Deployed) → Ready; ``status.consumers`` and ``status.selector`` serve the scale subresource.

Annotated for KEDA (``autoscaling.knative.dev/class: keda.autoscaling.knative.dev``, see
``core.kafkasources.AUTOSCALING_FIELDS``), the dispatcher gets a ScaledObject on the group's lag per topic (and a
TriggerAuthentication naming the ``net`` Secret keys) and KEDA owns its replicas between min- and max-scale (max
capped at the partitions; scale to zero with min-scale 0); ``DispatcherAutoscalerReady`` says so, or why not (KEDA
not installed: the controller keeps setting ``spec.consumers``).

The Secrets named by ``net`` are read in the system namespace, as a Broker's ``auth.secret.ref.name`` is: the
dispatcher runs there and mounts the named keys (a projected volume, the protocol beside them from a pod
annotation), and neither the controller nor the dispatcher reads or writes Secrets anywhere else.

Deleting a source (finalizer): the Deployment is deleted first (foreground: it stays until its pods are gone);
the consumer group is deleted once its members have left — a slow or hanging subscriber only delays that by the
dispatcher's shutdown grace, a member that never says goodbye by Kafka's session timeout (retried with backoff).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import api_error
from kafka_eventing.controller.autoscaler import keda_scaled
from kafka_eventing.controller.dependencies import (
    Ref,
    dead_letter_sink_waits,
    ref_of,
    waiting_for,
    watch_dependencies,
)
from kafka_eventing.controller.destinations import Unresolved, resolve_address
from kafka_eventing.controller.host import SECRET, Host, Kind, enqueue_object, namespace_of
from kafka_eventing.controller.identities import OIDC_IDENTITY_CREATED, IdentityError
from kafka_eventing.controller.reconciler import (
    STOP_RECHECK_SECONDS,
    TOPIC_NOT_FOUND,
    Reconciler,
    Result,
    SecretProblem,
    TopicWait,
)
from kafka_eventing.controller.topics import KafkaTopicAdmin, TopicError
from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core.conditions import Condition
from kafka_eventing.core.informer import Store
from kafka_eventing.core.kafka_config import KafkaConfigError, KafkaConnection, connection_from_secret

log = logging.getLogger(__name__)

HTTP_NOT_FOUND = 404
SOURCE_API = (ks.GROUP, ks.VERSION, ks.PLURAL)
SOURCE_API_VERSION = f"{ks.GROUP}/{ks.VERSION}"
#: What Ready waits for: the source's own conditions and its identity.
READY_DEPENDENTS = (*ks.DEPENDENTS, OIDC_IDENTITY_CREATED)
SOURCE_FINALIZER = "kafka.eventing.knative.dev/kafkasource"
#: Names the KafkaSource ("<namespace>/<name>") a dispatcher Deployment or Secret belongs to.
ANNOTATION_SOURCE = "kafka.eventing.knative.dev/kafkasource"
SOURCE_DISPATCHER_SUFFIX = "-ks-dispatcher"
#: Which condition a refused field makes False (the rest are Unknown until it is fixed).
_SPEC_CONDITION = {"InvalidKeyType": ks.KEY_TYPE_CORRECT, "InvalidBootstrapServers": ks.CONNECTION_ESTABLISHED,
                   "InvalidTopics": ks.CONNECTION_ESTABLISHED, "InvalidSecretReference": ks.CONNECTION_ESTABLISHED,
                   "InvalidAutoscaling": cond.DISPATCHER_AUTOSCALER_READY}


#: (file name in the dispatcher's secret directory, the Secret key it comes from)
#: A connection file the dispatcher reads (``KE_KAFKA_SECRET_DIR``) and the source's Secret key it comes from.
Mounted = tuple[str, ks.SecretKeyRef]


class ConnectionProblem(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def source_dispatcher_name(namespace: str, name: str) -> str:
    return res.dispatcher_name(namespace, name, suffix=SOURCE_DISPATCHER_SUFFIX)


def selector(name: str) -> str:
    """``status.selector``: the dispatcher pods' label selector, for the scale subresource (HPA, KEDA)."""
    return f"{res.LABEL_NAME}={res.DISPATCHER_APP},{res.LABEL_DISPATCHER}={name}"


class SourceReconciler:
    """Shares the channel ``Reconciler``'s API clients, caches, leadership check and write helpers."""

    def __init__(self, base: Reconciler, sources: Store, *, recheck_seconds: float = 60.0,
                 kafka_timeout: float = 10.0) -> None:
        self.base = base
        self.settings = base.settings
        self.stores = base.stores
        self.sources = sources
        self.core, self.apps, self.custom = base.core, base.apps, base.custom
        self.recheck_seconds = recheck_seconds
        self.kafka_timeout = kafka_timeout
        self._admins: dict[str, tuple[KafkaTopicAdmin, AdminClient]] = {}
        #: sources whose topic does not exist yet: looked for again within seconds (its creation is no event)
        self.topic_wait = TopicWait()

    # -- reconcile --------------------------------------------------------------------------------------
    def reconcile(self, namespace: str, name: str) -> Result:
        obj = self.sources.get(namespace, name)
        if obj is None:
            self.topic_wait.forget(namespace, name)
            return Result()
        meta = obj.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            self.topic_wait.forget(namespace, name)
            return self._finalize(obj) if SOURCE_FINALIZER in finalizers else Result()
        if SOURCE_FINALIZER not in finalizers:
            obj = self.base.set_finalizers(obj, [*finalizers, SOURCE_FINALIZER], SOURCE_API)
        return self._reconcile(obj)

    def _reconcile(self, obj: Mapping[str, Any]) -> Result:
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        dispatcher = source_dispatcher_name(namespace, name)
        status: dict[str, Any] = {"observedGeneration": meta.get("generation"), "selector": selector(dispatcher)}
        conditions: list[Condition] = []
        recheck = Result(requeue_after=self.recheck_seconds)
        try:
            spec = ks.parse_source(obj)
        except ks.SourceSpecError as exc:
            failed = _SPEC_CONDITION.get(exc.reason, ks.DEPLOYED)
            conditions.append(Condition.false(failed, exc.reason, str(exc)))
            conditions += [Condition.unknown(kind, "SpecInvalid", f"waiting for a valid spec: {exc}")
                           for kind in ks.DEPENDENTS if kind != failed]
            # Ready carries the refusal even when the refused condition is not one Ready depends on.
            conditions.append(cond.ready_condition(conditions, list(dict.fromkeys([*ks.DEPENDENTS, failed]))))
            self.base.patch_status(obj, status, conditions, SOURCE_API)
            return Result()  # a spec change is a watch event
        result = Result()
        conditions.append(Condition.true(ks.KEY_TYPE_CORRECT))
        try:
            sink_address = resolve_address(self.core, self.custom, spec.sink, namespace, "sink")
            status.update(sinkUri=sink_address.url, sinkAudience=sink_address.audience,
                          sinkCACerts=sink_address.ca_certs)
            conditions.append(Condition.true(ks.SINK_PROVIDED))
        except Unresolved as exc:
            status.update(sinkUri=None, sinkAudience=None, sinkCACerts=None)
            conditions.append(Condition.false(ks.SINK_PROVIDED, exc.reason, str(exc)))
            result = recheck
        identity = self.base.identities.ensure(SOURCE_API_VERSION, ks.KIND, obj, status)
        conditions.append(identity)
        if not identity.is_true:
            result = recheck
        sink = self.base.dead_letter_sink(namespace, {"delivery": spec.delivery or {}})
        status["deadLetterSinkUri"] = sink[1].url if sink and sink[1] else None
        if sink is not None:
            conditions.append(sink[0])
            if not sink[0].is_true:
                result = recheck
        data: dict[str, str] = {}
        files: list[Mounted] = []
        partitions = 0
        try:
            data, connection, files = self.connection(spec)
            partitions = self._partitions(spec, connection)
            self.topic_wait.found(namespace, name)
            conditions.append(Condition.true(ks.CONNECTION_ESTABLISHED, "ConnectionEstablished",
                                             f"{len(spec.topics)} topic(s), up to {partitions} partitions"))
        except ConnectionProblem as exc:
            conditions.append(Condition.false(ks.CONNECTION_ESTABLISHED, exc.reason, str(exc)))
            conditions += [Condition.unknown(kind, "ConnectionNotEstablished", "waiting for the connection")
                           for kind in (ks.INITIAL_OFFSETS_COMMITTED, ks.DEPLOYED)]
            conditions.append(cond.ready_condition(conditions, READY_DEPENDENTS))
            status["consumers"] = 0
            self.base.patch_status(obj, status, conditions, SOURCE_API)
            if exc.reason == TOPIC_NOT_FOUND:
                return self.topic_wait.retry(namespace, name)  # Ready within seconds of the topic's creation
            return recheck
        try:
            committed = self._commit_initial_offsets(spec, connection)
            conditions.append(Condition.true(ks.INITIAL_OFFSETS_COMMITTED, "InitialOffsetsCommitted",
                                             f"group {spec.consumer_group}: {committed}"))
        except ConnectionProblem as exc:
            conditions.append(Condition.false(ks.INITIAL_OFFSETS_COMMITTED, exc.reason, str(exc)))
            result = Result(error=str(exc))
        deployed, consumers, errors, scaler = self._data_plane(spec, data, files, partitions)
        if scaler is not None:
            conditions.append(scaler)
        conditions.append(deployed)
        status["consumers"] = consumers
        conditions.append(cond.ready_condition(conditions, READY_DEPENDENTS))
        self.base.patch_status(obj, status, conditions, SOURCE_API)
        if errors:
            return Result(error=errors)
        if not deployed.is_true and result.error is None:
            return recheck
        return result

    # -- connection -------------------------------------------------------------------------------------
    def connection(self, spec: ks.SourceSpec) -> tuple[dict[str, str], KafkaConnection, list[Mounted]]:
        """The connection Secret's data (the project's format) made of the source's references — Secrets of the
        source's own namespace, as upstream — the connection, and which Secret key is which file. Raises
        ``ConnectionProblem`` naming the Secret or key to fix (never a value)."""
        namespace = spec.namespace
        read: dict[str, dict[str, bytes]] = {}
        data = {"bootstrap.servers": ",".join(spec.bootstrap_servers), "protocol": spec.protocol}
        refs: list[tuple[str, ks.SecretKeyRef | None]] = []
        if spec.sasl is not None:
            refs += [("user", spec.sasl.user), ("password", spec.sasl.password),
                     ("sasl.mechanism", spec.sasl.mechanism)]
        if spec.tls is not None:
            refs += [("ca.crt", spec.tls.ca_cert), ("user.crt", spec.tls.cert), ("user.key", spec.tls.key)]
        files: list[Mounted] = []
        for key, ref in refs:
            if ref is None:
                continue
            if ref.name not in read:
                try:
                    read[ref.name] = self.base.read_secret(namespace, ref.name, "spec.net")
                except SecretProblem as exc:
                    raise ConnectionProblem(exc.reason, str(exc)) from None
            value = read[ref.name].get(ref.key)
            if value is None:
                raise ConnectionProblem("SecretKeyNotFound",
                                        f"Secret {namespace}/{ref.name} has no key {ref.key!r} (named by spec.net)")
            data[key] = value.decode(errors="replace")
            files.append((key, ref))
        if "sasl.mechanism" in data:
            mechanism = data["sasl.mechanism"].strip().upper()
            if mechanism not in ks.SASL_MECHANISMS:
                raise ConnectionProblem("InvalidSaslMechanism",
                                        f"spec.net.sasl.type: the Secret's value is not one of "
                                        f"{', '.join(ks.SASL_MECHANISMS)}")
        try:
            connection = connection_from_secret(data, extra=self.settings.kafka_extra_config())
        except KafkaConfigError as exc:
            raise ConnectionProblem("InvalidConnection", str(exc)) from None
        return data, connection, files

    def _admin(self, connection: KafkaConnection) -> tuple[KafkaTopicAdmin, AdminClient]:
        key = hashlib.sha256(json.dumps(connection.config, sort_keys=True, default=str).encode()).hexdigest()
        found = self._admins.get(key)
        if found is None:
            if len(self._admins) > 32:
                self._admins.clear()
            config = connection.admin_config()
            found = self._admins[key] = (KafkaTopicAdmin(config, timeout=self.kafka_timeout), AdminClient(config))
        return found

    def _partitions(self, spec: ks.SourceSpec, connection: KafkaConnection) -> int:
        """The largest partition count of the topics (every one must exist and be readable)."""
        admin, _ = self._admin(connection)
        most = 0
        for topic in spec.topics:
            try:
                most = max(most, admin.describe(topic).partitions)
            except TopicError as exc:
                raise ConnectionProblem(exc.reason, exc.message) from None
        return most

    def _consumer(self, spec: ks.SourceSpec, connection: KafkaConnection) -> Consumer:
        return Consumer(connection.consumer_config(spec.consumer_group, **{"enable.auto.commit": False,
                                                                           "log_level": 3}))

    def _commit_initial_offsets(self, spec: ks.SourceSpec, connection: KafkaConnection) -> str:
        """Commit ``initialOffset`` for every partition of the group that has no committed offset yet.

        Only while the group has no members: once the dispatcher runs, partitions added later are started by
        its own rebalance (at the earliest offset) and a commit from outside the group would be refused."""
        topics, admin = self._admin(connection)
        group = spec.consumer_group
        try:
            described = admin.describe_consumer_groups([group], request_timeout=self.kafka_timeout)[group].result(
                timeout=self.kafka_timeout + 2)
            if described.state not in (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD,
                                       ConsumerGroupState.UNKNOWN) and described.members:
                return f"consumed by {len(described.members)} member(s)"
        except KafkaException as exc:
            raise ConnectionProblem("OffsetsNotCommitted", f"cannot describe group {group!r}: {exc}") from None
        consumer = self._consumer(spec, connection)
        try:
            wanted = []
            for topic in spec.topics:
                count = topics.describe(topic).partitions
                tps = consumer.committed([TopicPartition(topic, p) for p in range(count)],
                                         timeout=self.kafka_timeout)
                for tp in tps:
                    if tp.offset >= 0:
                        continue
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                               timeout=self.kafka_timeout)
                    wanted.append(TopicPartition(topic, tp.partition, low if spec.initial_offset == "earliest"
                                                 else high))
            if wanted:
                consumer.commit(offsets=wanted, asynchronous=False)
                log.info("initial offsets committed", extra={"group": group, "partitions": len(wanted),
                                                             "initial_offset": spec.initial_offset})
            return f"{len(wanted)} partition(s) set to {spec.initial_offset}" if wanted else "already committed"
        except (KafkaException, TopicError) as exc:
            raise ConnectionProblem("OffsetsNotCommitted",
                                    f"cannot commit the initial offsets of group {group!r}: {exc}") from None
        finally:
            consumer.close()

    # -- data plane -------------------------------------------------------------------------------------
    def _data_plane(self, spec: ks.SourceSpec, data: Mapping[str, str], files: list[Mounted],
                    partitions: int) -> tuple[Condition, int, str, Condition | None]:
        """(Deployed, the replicas wanted or KEDA's, API errors or "", DispatcherAutoscalerReady or None)."""
        namespace, name = spec.namespace, spec.name
        dispatcher = source_dispatcher_name(namespace, name)
        system = self.settings.system_namespace
        ref = res.ChannelRef(namespace, name, spec.uid)
        env = [("KE_CHANNEL_NAME", ""), ("KE_CHANNEL_NAMESPACE", ""), ("KE_SOURCE_NAMESPACE", namespace),
               ("KE_SOURCE_NAME", name), ("KE_DISPATCHER_INITIAL_OFFSET", spec.initial_offset)]
        if files:
            env.append(("KE_KAFKA_SECRET_DIR", res.SECRET_MOUNT))
        owner = res.Owner(dispatcher, ANNOTATION_SOURCE, tuple(env))
        errors: list[str] = []
        scaler, keda_owned = self._autoscale(spec, data, partitions, errors)
        # Consumers beyond the largest topic's partition count would sit idle in the group.
        replicas = max(0, min(spec.consumers, partitions))
        # The pods roll when a referenced Secret's value changes.
        checksum = hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode()).hexdigest()[:16]
        config = res.DispatcherConfig(replicas=replicas, checksum=checksum,
                                      bootstrap_servers=data["bootstrap.servers"])
        deployment = res.dispatcher_deployment(ref, self.settings, config, max(1, partitions), owner=owner,
                                               keda_scaled=keda_owned)
        spec_part = deployment["spec"]
        if not keda_owned:
            spec_part["replicas"] = replicas  # with KEDA no replicas: a merge patch leaves KEDA's count alone
        if files:
            _mount_connection(spec_part["template"], spec.protocol, res.secret_copy_name(dispatcher), files)
        res.stamp(deployment, spec_part)
        try:
            if files:
                self.base.write_secret_copy(res.secret_copy_name(dispatcher), {p: data[p].encode() for p, _ in files})
            live = self.base._apply_deployment(deployment)
        except ApiException as exc:
            errors.append(api_error(exc))
            return (Condition.false(ks.DEPLOYED, "DispatcherFailed", api_error(exc)), replicas, "; ".join(errors),
                    scaler)
        if keda_owned:
            replicas = int(((live or {}).get("spec") or {}).get("replicas", 1) or 0)
            if replicas == 0:
                return (Condition.true(ks.DEPLOYED, "ScaledToZero", "KEDA scaled the idle dispatcher to zero"), 0,
                        "; ".join(errors), scaler)
        elif replicas == 0:
            return Condition.true(ks.DEPLOYED, "ScaledToZero", "spec.consumers is 0"), 0, "; ".join(errors), scaler
        ok, why = res.deployment_available(live)
        if not ok:
            return (Condition.false(ks.DEPLOYED, "DeploymentUnavailable",
                                    f"dispatcher Deployment {system}/{dispatcher}: {why}"), replicas,
                    "; ".join(errors), scaler)
        return Condition.true(ks.DEPLOYED), replicas, "; ".join(errors), scaler

    def _autoscale(self, spec: ks.SourceSpec, data: Mapping[str, str], partitions: int,
                   errors: list[str]) -> tuple[Condition | None, bool]:
        """Stamp or remove the dispatcher's KEDA objects: (DispatcherAutoscalerReady or None, whether KEDA owns
        the replicas). Without the annotation only a Deployment marked as KEDA-scaled costs API calls."""
        autoscaler = self.base.autoscaler
        dispatcher = source_dispatcher_name(spec.namespace, spec.name)
        was_keda = keda_scaled(self.stores.deployments.get(self.settings.system_namespace, dispatcher))
        if spec.autoscaling is None:
            if was_keda:
                try:
                    autoscaler.delete_named(dispatcher)
                except ApiException as exc:
                    errors.append(f"KEDA ScaledObject removal: {api_error(exc)}")
                    # Until it is gone KEDA still scales: setting replicas now would fight it.
                    return Condition.false(cond.DISPATCHER_AUTOSCALER_READY, "KEDAScaledObjectFailed",
                                           api_error(exc)), True
            return None, False
        missing = autoscaler.missing(errors)
        if missing is not None:
            return missing, False
        auth = keda.source_auth(spec, data.get("sasl.mechanism"), res.secret_copy_name(dispatcher))
        owner = (ANNOTATION_SOURCE, f"{spec.namespace}/{spec.name}")
        so = keda.source_scaled_object(spec, spec.autoscaling, self.settings, auth, name=dispatcher, owner=owner,
                                       num_partitions=max(1, partitions))
        ta = (keda.source_trigger_authentication(dispatcher, self.settings, owner, auth)
              if auth.needs_trigger_authentication else None)
        return autoscaler.apply(so, ta, was_keda=was_keda, errors=errors)

    # -- deletion ---------------------------------------------------------------------------------------
    def _finalize(self, obj: Mapping[str, Any]) -> Result:
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        dispatcher = source_dispatcher_name(namespace, name)
        if keda_scaled(self.stores.deployments.get(self.settings.system_namespace, dispatcher)):
            # KEDA first: it would otherwise keep scaling what is being deleted.
            self.base.writer.check()
            self.base.autoscaler.delete_named(dispatcher)
        if self.base.stop_deployment(dispatcher):
            # Its pods are still stopping (a slow subscriber's deliveries drain for the shutdown grace): the group
            # keeps members until they are gone. The Deployment's deletion event brings this back.
            return Result(requeue_after=STOP_RECHECK_SECONDS)
        try:
            self.base.delete_secret_copy(res.secret_copy_name(dispatcher))
        except ApiException as exc:
            return Result(error=api_error(exc))
        try:
            spec: ks.SourceSpec | None = ks.parse_source(obj)
        except ks.SourceSpecError:
            spec = None
        if spec is not None:
            try:
                _, connection, _ = self.connection(spec)
                self._admin(connection)[0].delete_group(spec.consumer_group)
            except ConnectionProblem as exc:
                log.warning("consumer group left behind: the connection is unusable",
                            extra={"source": f"{namespace}/{name}", "reason": exc.reason})
            except TopicError as exc:
                # Members still in the group (a pod killed without leaving): retried with backoff until Kafka's
                # session timeout removes them.
                return Result(error=str(exc))
        try:
            self.base.identities.forget(SOURCE_API_VERSION, ks.KIND, obj)
        except IdentityError as exc:
            return Result(error=str(exc))
        try:
            self.base.set_finalizers(obj, [f for f in meta.get("finalizers") or () if f != SOURCE_FINALIZER],
                                     SOURCE_API)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
        log.info("KafkaSource finalized", extra={"namespace": namespace, "source": name})
        return Result()


#: The pod annotation the connection's protocol is projected from (the rest of the connection is Secret keys).
ANNOTATION_PROTOCOL = "kafka.eventing.knative.dev/protocol"


def _mount_connection(template: dict[str, Any], protocol: str, secret: str, files: list[Mounted]) -> None:
    """The connection as the dispatcher reads it (``KE_KAFKA_SECRET_DIR``, one file per key): the copy of the
    referenced Secret keys and the protocol, projected into one read-only volume."""
    template["metadata"]["annotations"][ANNOTATION_PROTOCOL] = protocol
    sources: list[dict[str, Any]] = [
        {"secret": {"name": secret, "items": [{"key": path, "path": path} for path, _ in files]}}]
    sources.append({"downwardAPI": {"items": [
        {"path": "protocol", "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_PROTOCOL}']"}}]}})
    pod = template["spec"]
    pod["volumes"].append({"name": "kafka-secret", "projected": {"sources": sources}})
    pod["containers"][0]["volumeMounts"].append({"name": "kafka-secret", "mountPath": res.SECRET_MOUNT,
                                                 "readOnly": True})


def setup(host: Host) -> None:
    """Cache KafkaSources; a source's dispatcher objects (``ANNOTATION_SOURCE``) and the Secrets its ``net`` names
    (a rotation rolls its dispatcher) are part of it."""
    sources = host.informer(ks.KIND, host.base.custom.list_cluster_custom_object, group=ks.GROUP,
                            version=ks.VERSION, plural=ks.PLURAL)
    opts = host.options
    reconciler = SourceReconciler(host.base, sources, recheck_seconds=opts.topic_recheck_seconds,
                                  kafka_timeout=opts.kafka_timeout)
    enqueue = enqueue_object(host, ks.KIND)

    def on_secret(event: str, secret: Mapping[str, Any]) -> None:
        if event == "RELISTED":
            return
        name = (secret.get("metadata") or {}).get("name")
        for source in sources.items():
            if name in ks.secret_names(source):
                enqueue(event, source)

    host.reconciles(ks.KIND, reconciler.reconcile)
    host.on(ks.KIND, enqueue)
    host.on(SECRET, on_secret)
    host.owns(ANNOTATION_SOURCE, ks.KIND)

    def source_waits(source: Mapping[str, Any]) -> set[Ref]:
        sink = (source.get("spec") or {}).get("sink")
        return (waiting_for(source, ks.SINK_PROVIDED, ref_of(sink, namespace_of(source)))
                | dead_letter_sink_waits(source))

    # The sink and dead-letter sink a source waits for, watched by name while it does.
    watch_dependencies(host, ks.KIND, source_waits)


KIND_SOURCE = Kind(ks.KIND, "sources", ks.GROUP, ks.VERSION, frozenset({ks.PLURAL}), setup)
