"""The data plane of KafkaNamespaced Brokers (upstream's ``KafkaNamespaced`` class): in each namespace with such
Brokers, a receiver and each Broker's dispatcher run there, on that namespace's own ServiceAccounts, so one
namespace's traffic uses its own pods' memory and CPU and never another's.

Per namespace, shared by its KafkaNamespaced Brokers and owned by every one of them (``ownerReferences``: the
garbage collector removes them with the last): the ServiceAccounts ``kafka-broker-receiver`` and
``kafka-channel-dispatcher``, RoleBindings of those to the chart's receiver and dispatcher ClusterRoles
(``KE_NAMESPACED_RECEIVER_ROLE``, ``KE_NAMESPACED_DISPATCHER_ROLE``: the rights the shared data plane holds, here
only in this namespace), copies of the ConfigMaps and Secrets the system receiver's pods read, the receiver
Deployment ``kafka-broker-receiver`` (the system receiver's pod template, scoped with ``KE_RECEIVER_NAMESPACE``)
and its Service ``kafka-broker-ingress``. Per Broker: its dispatcher Deployment and Service, owned by that Broker
and deleted by its finalizer (``controller/brokers.py``).

The shared objects are read by name before each write (no cache: RBAC would have to let the controller list them
everywhere) and written only when their desired content changed — Secret copies excepted, which are written and
never read (the controller reads no Secret outside the system namespace); a namespace whose objects were applied
with the same content within ``recheck_seconds`` is not read again. The Deployments are cached (a label-selected
informer over every namespace, made only while the class is enabled), so their availability enqueues the Brokers at
once.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import HTTP_CONFLICT, HTTP_NOT_FOUND
from kafka_eventing.controller.reconciler import Reconciler
from kafka_eventing.core import brokers as kb
from kafka_eventing.core.informer import Store

#: the receiver's Deployment and ServiceAccount, and the RoleBinding of that account, in each namespace
NAMESPACED_RECEIVER = "kafka-broker-receiver"
#: the RoleBinding of the dispatchers' ServiceAccount (``res.DISPATCHER_SERVICE_ACCOUNT``) in each namespace
DISPATCHER_BINDING = "kafka-broker-dispatcher"
#: on every object of a namespaced data plane (the Deployment informer selects by it)
LABEL_DATA_PLANE = "kafka.eventing.knative.dev/data-plane"
DATA_PLANE_NAMESPACED = "namespaced"
NAMESPACED_SELECTOR = f"{LABEL_DATA_PLANE}={DATA_PLANE_NAMESPACED}"
#: the event name of the namespaced Deployments' cache
NAMESPACED_DEPLOYMENT = "NamespacedDeployment"
#: what to set when the class is not enabled (the chart value, and the controller settings it sets)
NAMESPACED_DISABLED = ("the KafkaNamespaced broker class is not enabled: set the chart value "
                       "broker.namespaced.enabled=true (controller settings KE_NAMESPACED_RECEIVER_ROLE and "
                       "KE_NAMESPACED_DISPATCHER_ROLE)")
PORTS = {"http": 80, "https": 443}


class NamespacedProblem(Exception):
    """The namespace's data plane cannot be made; ``reason`` is the condition's, the message says what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def broker_owner(broker: Mapping[str, Any]) -> dict[str, Any]:
    meta = broker.get("metadata") or {}
    return {"apiVersion": f"{kb.GROUP}/{kb.VERSION}", "kind": "Broker", "name": str(meta.get("name")),
            "uid": str(meta.get("uid"))}


def data_plane_labels(component: str) -> dict[str, str]:
    return {**res.labels(component), LABEL_DATA_PLANE: DATA_PLANE_NAMESPACED}


def referenced(template: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(ConfigMaps, Secrets) a pod template reads: volumes (projected too), ``envFrom`` and ``env`` references, and
    its image pull Secrets."""
    spec = template.get("spec") or {}
    config_maps: set[str] = set()
    secrets: set[str] = {s["name"] for s in spec.get("imagePullSecrets") or () if s.get("name")}
    for volume in spec.get("volumes") or ():
        if (cm := volume.get("configMap")) and cm.get("name"):
            config_maps.add(cm["name"])
        if (secret := volume.get("secret")) and secret.get("secretName"):
            secrets.add(secret["secretName"])
        for source in (volume.get("projected") or {}).get("sources") or ():
            if (cm := source.get("configMap")) and cm.get("name"):
                config_maps.add(cm["name"])
            if (secret := source.get("secret")) and secret.get("name"):
                secrets.add(secret["name"])
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        for source in container.get("envFrom") or ():
            if (ref := source.get("configMapRef")) and ref.get("name"):
                config_maps.add(ref["name"])
            if (ref := source.get("secretRef")) and ref.get("name"):
                secrets.add(ref["name"])
        for env in container.get("env") or ():
            value_from = env.get("valueFrom") or {}
            if (ref := value_from.get("configMapKeyRef")) and ref.get("name"):
                config_maps.add(ref["name"])
            if (ref := value_from.get("secretKeyRef")) and ref.get("name"):
                secrets.add(ref["name"])
    return config_maps, secrets


def receiver_deployment(system_receiver: Mapping[str, Any], namespace: str,
                        owners: list[dict[str, Any]]) -> dict[str, Any]:
    """The namespace's receiver: the system receiver's pod template on this namespace's ServiceAccount, serving only
    the KafkaNamespaced Brokers here (``KE_RECEIVER_NAMESPACE``)."""
    source = system_receiver.get("spec") or {}
    template = copy.deepcopy(dict(source.get("template") or {}))
    pod_labels = {**data_plane_labels("receiver"), res.LABEL_NAME: NAMESPACED_RECEIVER}
    template["metadata"] = {"labels": pod_labels,
                            "annotations": dict((template.get("metadata") or {}).get("annotations") or {})}
    pod = template.setdefault("spec", {})
    pod["serviceAccountName"] = NAMESPACED_RECEIVER
    pod.pop("serviceAccount", None)
    for container in pod.get("containers") or ():
        env = [e for e in container.get("env") or () if e.get("name") != "KE_RECEIVER_NAMESPACE"]
        container["env"] = [*env, {"name": "KE_RECEIVER_NAMESPACE", "value": namespace}]
    selector = {res.LABEL_NAME: NAMESPACED_RECEIVER, LABEL_DATA_PLANE: DATA_PLANE_NAMESPACED}
    spec = {"replicas": int(source.get("replicas") or 1), "selector": {"matchLabels": selector},
            "template": template}
    metadata = {"name": NAMESPACED_RECEIVER, "namespace": namespace, "labels": pod_labels, "ownerReferences": owners}
    return res.stamp({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec},
                     {"spec": spec, "owners": owners})


def ingress_service(system_receiver: Mapping[str, Any], namespace: str,
                    owners: list[dict[str, Any]]) -> dict[str, Any]:
    """``kafka-broker-ingress``: port 80 (443 with TLS) onto the receiver container's named port."""
    containers = ((system_receiver.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or ()
    names = [p.get("name") for c in containers for p in c.get("ports") or () if p.get("name") in PORTS]
    ports = [{"name": n, "port": PORTS[n], "targetPort": n, "protocol": "TCP"} for n in names] or [
        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    selector = {res.LABEL_NAME: NAMESPACED_RECEIVER, LABEL_DATA_PLANE: DATA_PLANE_NAMESPACED}
    spec = {"type": "ClusterIP", "selector": selector, "ports": ports}
    metadata = {"name": kb.NAMESPACED_INGRESS_SERVICE, "namespace": namespace,
                "labels": data_plane_labels("receiver"), "ownerReferences": owners}
    return res.stamp({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec},
                     {"spec": spec, "owners": owners})


class NamespacedDataPlane:
    """Applies one namespace's shared data plane and its Brokers' dispatchers (see the module doc)."""

    def __init__(self, base: Reconciler, brokers: Store, deployments: Store | None, *,
                 recheck_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.base, self.settings, self.brokers, self.deployments = base, base.settings, brokers, deployments
        self.core = base.core
        self.rbac = base.rbac
        self.recheck_seconds, self.clock = recheck_seconds, clock
        self._applied: dict[str, tuple[str, float]] = {}
        self._secrets: dict[tuple[str, str], str] = {}  # (namespace, name) → the content hash last written
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.namespaced_brokers and self.deployments is not None

    def owners(self, namespace: str) -> list[dict[str, Any]]:
        """Every KafkaNamespaced Broker of ``namespace`` not being deleted, in a stable order."""
        found = [b for b in self.brokers.items()
                 if (b.get("metadata") or {}).get("namespace") == namespace and kb.is_namespaced_broker(b)
                 and not (b.get("metadata") or {}).get("deletionTimestamp")]
        return sorted((broker_owner(b) for b in found), key=lambda o: (o["name"], o["uid"]))

    def system_receiver(self) -> Mapping[str, Any]:
        system, name = self.settings.system_namespace, self.settings.receiver_deployment_name
        found = self.base.stores.deployments.get(system, name)
        if found is None:
            raise NamespacedProblem("ReceiverTemplateMissing",
                                    f"the system receiver Deployment {system}/{name}, whose pod template every "
                                    "namespaced receiver runs, does not exist")
        return found

    # -- the namespace's shared objects ---------------------------------------------------------------
    def apply(self, namespace: str, connection_secret: str | None = None) -> None:
        """Make the namespace's shared data plane, with copies of the Secrets the receiver's pods read and of
        ``connection_secret`` (the installation's connection Secret, which the dispatchers mount). Raises
        ``NamespacedProblem`` or ``ApiException``."""
        owners = self.owners(namespace)
        if not owners:
            return
        receiver = self.system_receiver()
        template = (receiver.get("spec") or {}).get("template") or {}
        config_maps, secrets = referenced(template)
        if connection_secret:
            secrets.add(connection_secret)
        system = self.settings.system_namespace
        # What the objects are made of, as far as the caches know it: unchanged within recheck_seconds, nothing is
        # read or written (a ConfigMap's change reaches the copies at the latest then).
        inputs = res.spec_hash({"owners": owners, "receiver": {"replicas": (receiver.get("spec") or {}).get("replicas"),
                                                               "template": template},
                                "secrets": {n: (self.base.stores.secrets.get(system, n) or {}).get("data")
                                            for n in sorted(secrets)},
                                "roles": [self.settings.namespaced_receiver_role,
                                          self.settings.namespaced_dispatcher_role]})
        with self._lock(namespace):
            last = self._applied.get(namespace)
            if last is None or last[0] != inputs or self.clock() - last[1] > self.recheck_seconds:
                desired = [*self._accounts(namespace, owners),
                           *self._copies(namespace, owners, config_maps, secrets)]
                settled = all([self._ensure(obj) for obj in desired])
                assert self.deployments is not None
                self.base.writer.apply(self.deployments, self.base.apps.create_namespaced_deployment,
                                       self.base.apps.patch_namespaced_deployment,
                                       receiver_deployment(receiver, namespace, owners))
                self.base._apply_service(ingress_service(receiver, namespace, owners))
                if settled:
                    self._applied[namespace] = (inputs, self.clock())

    def retire(self, namespace: str) -> None:
        """A namespace left without KafkaNamespaced Brokers while a Broker that owned its data plane lives on (its
        class changed to Kafka): its receiver and ingress Service go now — the garbage collector would wait for that
        Broker's deletion. The accounts, bindings and copies stay until then (they run nothing)."""
        if self.deployments is None or self.receiver(namespace) is None or self.owners(namespace):
            return  # the owners last: a scan of the Brokers, made only where a receiver runs
        self.base.stop_deployment(NAMESPACED_RECEIVER, ((kb.NAMESPACED_INGRESS_SERVICE, namespace),),
                                  namespace=namespace)
        self.forget(namespace)

    def forget(self, namespace: str) -> None:
        """Apply again at the next reconcile, Secret copies included (an object of the namespace went)."""
        self._applied.pop(namespace, None)
        for key in [k for k in list(self._secrets) if k[0] == namespace]:  # a snapshot: workers write meanwhile
            self._secrets.pop(key, None)

    def receiver(self, namespace: str) -> Mapping[str, Any] | None:
        assert self.deployments is not None
        return self.deployments.get(namespace, NAMESPACED_RECEIVER)

    def _lock(self, namespace: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(namespace, threading.Lock())

    def _accounts(self, namespace: str, owners: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for account, binding, role, component in (
                (NAMESPACED_RECEIVER, NAMESPACED_RECEIVER, self.settings.namespaced_receiver_role, "receiver"),
                (res.DISPATCHER_SERVICE_ACCOUNT, DISPATCHER_BINDING, self.settings.namespaced_dispatcher_role,
                 "dispatcher")):
            meta = {"namespace": namespace, "labels": data_plane_labels(component), "ownerReferences": owners}
            out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, **meta}})
            out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": {"name": binding, **meta},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})
        return out

    def _copies(self, namespace: str, owners: list[dict[str, Any]], config_maps: set[str],
                secrets: set[str]) -> list[dict[str, Any]]:
        """The system namespace's ConfigMaps and Secrets the receiver's pods read, under the same names."""
        system = self.settings.system_namespace
        meta = {"namespace": namespace, "labels": data_plane_labels("receiver"), "ownerReferences": owners}
        out: list[dict[str, Any]] = []
        for name in sorted(config_maps):
            try:
                found = self.core.read_namespaced_config_map(name, system, _request_timeout=(5, 15))
            except ApiException as exc:
                if exc.status == HTTP_NOT_FOUND:
                    raise NamespacedProblem("ConfigMapMissing", f"ConfigMap {system}/{name}, which the receiver "
                                            "reads, does not exist") from None
                raise
            out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta},
                        "data": dict(found.data or {})})
        for name in sorted(secrets):
            secret = self.base.stores.secrets.get(system, name)
            if secret is None:
                raise NamespacedProblem("SecretMissing", f"Secret {system}/{name}, which the receiver or the "
                                        "dispatchers mount, does not exist")
            out.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, **meta},
                        "type": secret.get("type") or "Opaque", "data": dict(secret.get("data") or {})})
        return out

    def _ensure(self, desired: dict[str, Any]) -> bool:
        """Create, or replace when its content (hash-stamped) differs; read by name first. False: made meanwhile
        by another worker, to be compared again at the next apply."""
        kind, meta = desired["kind"], desired["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        content = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
        desired = res.stamp(copy.deepcopy(desired), content)
        if kind == "Secret":
            self._write_secret(desired)
            return True
        read, create, replace = {
            "ServiceAccount": (self.core.read_namespaced_service_account, self.core.create_namespaced_service_account,
                               self.core.replace_namespaced_service_account),
            "RoleBinding": (self.rbac.read_namespaced_role_binding, self.rbac.create_namespaced_role_binding,
                            self.rbac.replace_namespaced_role_binding),
            "ConfigMap": (self.core.read_namespaced_config_map, self.core.create_namespaced_config_map,
                          self.core.replace_namespaced_config_map),
        }[kind]
        try:
            live = json.loads(read(name, namespace, _request_timeout=(5, 15), _preload_content=False).data)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
            live = None
        if live is None:
            self.base.writer.check()
            try:
                create(namespace, desired, _request_timeout=(5, 30))
                return True
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:
                    raise
                return False
        have = ((live.get("metadata") or {}).get("annotations") or {}).get(res.ANNOTATION_SPEC_HASH)
        if have == desired["metadata"]["annotations"][res.ANNOTATION_SPEC_HASH]:
            return True
        self.base.writer.check()
        desired["metadata"]["resourceVersion"] = (live.get("metadata") or {}).get("resourceVersion")
        if kind == "ServiceAccount":  # the token controller's and image-pull entries stay
            for field in ("secrets", "imagePullSecrets"):
                if live.get(field):
                    desired[field] = live[field]
        replace(name, namespace, desired, _request_timeout=(5, 30))
        return True

    def _write_secret(self, desired: dict[str, Any]) -> None:
        """A Secret copy is written, never read: the controller may not read Secrets outside the system namespace.
        Created, or replaced (unconditionally) when its content differs from what this controller last wrote there
        (so once after a restart, then on a change of the system namespace's Secret)."""
        meta = desired["metadata"]
        key = (meta["namespace"], meta["name"])
        digest = meta["annotations"][res.ANNOTATION_SPEC_HASH]
        if self._secrets.get(key) == digest:
            return
        self.base.writer.check()
        try:
            self.core.create_namespaced_secret(meta["namespace"], desired, _request_timeout=(5, 30))
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise
            self.core.replace_namespaced_secret(meta["name"], meta["namespace"], desired, _request_timeout=(5, 30))
        self._secrets[key] = digest
