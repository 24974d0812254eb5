"""Desired Kubernetes objects for one KafkaChannel — pure functions of the channel, settings and connection.

Every object carries a hash of its desired spec in an annotation, so the reconciler updates an object only
when what it wants changed (server-side defaults never cause a write loop).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka_eventing.core import tokens
from kafka_eventing.core.channels import CHANNEL_HOST_SUFFIX
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tls import read_ca_file

MANAGED_BY = "kafka-channel-controller"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_DISPATCHER = "kafka.eventing.knative.dev/dispatcher"
#: "<namespace>/<name>" of the channel an object belongs to (annotations have no 63-character limit).
ANNOTATION_CHANNEL = "kafka.eventing.knative.dev/channel"
ANNOTATION_SPEC_HASH = "kafka.eventing.knative.dev/spec-hash"
#: On the dispatcher's pod template: changes when the connection Secret or config ConfigMap changes.
ANNOTATION_CONFIG_CHECKSUM = "kafka.eventing.knative.dev/config-checksum"
#: On the dispatcher Deployment: who sets its replicas, "controller" or "keda" (then a ScaledObject exists).
ANNOTATION_SCALER = "kafka.eventing.knative.dev/scaler"
SCALER_CONTROLLER = "controller"
SCALER_KEDA = "keda"
DISPATCHER_APP = "kafka-channel-dispatcher"
#: Created by the chart/manifests in the system namespace (RBAC: watch its channel, patch status.subscribers).
DISPATCHER_SERVICE_ACCOUNT = tokens.DISPATCHER_SERVICE_ACCOUNT
SECRET_MOUNT = "/etc/kafka-secret"  # noqa: S105 - a path
DNS1035_MAX = 63
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def short_hash(*parts: str, length: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def spec_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def is_dns1035(name: str) -> bool:
    return len(name) <= DNS1035_MAX and bool(_DNS1035.match(name))


def channel_service_name(name: str) -> str:
    return f"{name}{CHANNEL_HOST_SUFFIX}"


def address(settings: Settings, url: str) -> dict[str, Any]:
    """A ``status.address`` for an ingress URL: ``https://`` with the receiver's CA as ``CACerts`` while the
    receiver serves HTTPS (``KE_INGRESS_CA_FILE``), else as given."""
    if settings.ingress_ca_file is None:
        return {"url": url}
    return {"url": "https://" + url.removeprefix("http://"), "CACerts": read_ca_file(settings.ingress_ca_file)}


def channel_url(namespace: str, name: str) -> str:
    return f"http://{channel_service_name(name)}.{namespace}.svc.cluster.local"


def dispatcher_name(namespace: str, name: str, suffix: str = "-dispatcher") -> str:
    """``<name>-<namespace><suffix>``; a hash replaces the tail when that is too long or not DNS-1035."""
    plain = f"{name}-{namespace}{suffix}"
    if is_dns1035(plain):
        return plain
    digest = short_hash(namespace, name)
    room = DNS1035_MAX - len(suffix) - len(digest) - 1
    head = re.sub(r"[^a-z0-9-]", "-", f"{name}-{namespace}".lower())[:room].strip("-")
    if not head or not head[0].isalpha():
        head = ("kc-" + head)[:room].rstrip("-")
    return f"{head}-{digest}{suffix}"


def labels(component: str, dispatcher: str | None = None) -> dict[str, str]:
    out = {LABEL_PART_OF: "kafka-eventing", LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: component}
    if dispatcher:
        out[LABEL_NAME] = DISPATCHER_APP
        out[LABEL_DISPATCHER] = dispatcher
    return out


def stamp(obj: dict[str, Any], desired_part: Mapping[str, Any]) -> dict[str, Any]:
    """Record the hash of ``desired_part`` on ``obj`` (see ``needs_update``)."""
    obj["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(desired_part)
    return obj


@dataclass(frozen=True)
class ChannelRef:
    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def channel_service(ref: ChannelRef, settings: Settings) -> dict[str, Any]:
    """ExternalName Service ``<name>-kn-channel`` in the channel's namespace → the shared receiver."""
    spec = {
        "type": "ExternalName",
        "externalName": f"{settings.receiver_service}.{settings.system_namespace}.svc.cluster.local",
        "sessionAffinity": "None",
    }
    metadata: dict[str, Any] = {
        "name": channel_service_name(ref.name),
        "namespace": ref.namespace,
        "labels": {**labels("channel"), "messaging.knative.dev/role": "kafka-channel"},
        "annotations": {ANNOTATION_CHANNEL: ref.key},
    }
    if ref.uid:
        # Same namespace as the channel, so Kubernetes' garbage collector may own it too.
        metadata["ownerReferences"] = [{
            "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel", "name": ref.name,
            "uid": ref.uid, "controller": True, "blockOwnerDeletion": True,
        }]
    return stamp({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}, spec)


def secret_copy_name(dispatcher: str) -> str:
    """The system namespace's copy of the Secret keys a resource names in its own namespace (a KafkaSource's
    ``spec.net``, a Broker config's ``auth.secret.ref.name``), which its dispatcher mounts: a pod mounts Secrets of
    its own namespace only."""
    return f"{dispatcher}-secret"


@dataclass(frozen=True)
class DispatcherConfig:
    """What the dispatcher needs besides the channel: the connection and how to run it."""

    replicas: int
    checksum: str  # over the connection Secret's and config ConfigMap's data
    secret_name: str | None = None
    bootstrap_servers: str = ""
    resources: Mapping[str, Any] | None = None  # from config-kafka `dispatcher.resources`
    #: From config-kafka `dispatcher.*` (connection.DISPATCHER_POD_KEYS): imagePullSecrets, imagePullPolicy,
    #: nodeSelector, tolerations, podSecurityContext, securityContext; each replaces the default below.
    pod: Mapping[str, Any] | None = None


def dispatcher_env(ref: ChannelRef, settings: Settings, config: DispatcherConfig) -> list[dict[str, Any]]:
    env = {
        "KE_CHANNEL_SOURCE": "kube",
        "KE_CHANNEL_NAMESPACE": ref.namespace,
        "KE_CHANNEL_NAME": ref.name,
        "KE_SYSTEM_NAMESPACE": settings.system_namespace,
        "KE_KAFKA_PROVIDER": str(settings.kafka_provider),
        "KE_TOPIC_TEMPLATE": settings.topic_template,
        "KE_CONSUMER_GROUP_TEMPLATE": settings.consumer_group_template,
        "KE_MAX_IN_FLIGHT": str(settings.max_in_flight),
        "KE_RETRY_AFTER_MAX_SECONDS": str(settings.retry_after_max_seconds),
        "KE_QUEUED_MAX_MESSAGES_KBYTES": str(settings.queued_max_messages_kbytes),
        "KE_METRICS_PORT": str(settings.metrics_port),
        "KE_LOG_LEVEL": settings.log_level,
        "KE_LOG_FORMAT": str(settings.log_format),
        "KE_TLS_MIN_VERSION": str(settings.tls_min_version),
    }
    if settings.auth_issuer:
        # Ingress auth is on: a Broker's replies into its own ingress need a token.
        env["KE_AUTH_ISSUER"] = settings.auth_issuer
    if settings.kafka_extra:
        env["KE_KAFKA_EXTRA"] = settings.kafka_extra
    if settings.tracing_endpoint:
        env["KE_TRACING_ENDPOINT"] = settings.tracing_endpoint
        env["KE_TRACING_SAMPLE_RATIO"] = str(settings.tracing_sample_ratio)
    if config.bootstrap_servers:
        env["KE_BOOTSTRAP_SERVERS"] = config.bootstrap_servers
    if config.secret_name:
        env["KE_KAFKA_SECRET_DIR"] = SECRET_MOUNT
    return [{"name": k, "value": v} for k, v in env.items()]


@dataclass(frozen=True)
class Owner:
    """Whose dispatcher a Deployment is: its name, the annotation naming the owner, and env of its own.

    A channel's by default; a Broker's dispatcher is the same Deployment under another name and annotation.
    """

    name: str
    annotation: str = ANNOTATION_CHANNEL
    env: tuple[tuple[str, str], ...] = ()
    #: where the Deployment and Service run: the system namespace unless set (a KafkaNamespaced Broker's own)
    namespace: str = ""
    #: ``metadata.ownerReferences`` of both (an owner in their own namespace: the garbage collector's too)
    owner_references: tuple[Mapping[str, Any], ...] = ()
    #: extra labels of both and of the pods
    labels: tuple[tuple[str, str], ...] = ()


def dispatcher_deployment(ref: ChannelRef, settings: Settings, config: DispatcherConfig,
                          num_partitions: int, *, keda_scaled: bool = False,
                          owner: Owner | None = None) -> dict[str, Any]:
    """With ``keda_scaled`` the spec has no ``replicas``: a merge patch then leaves KEDA's count alone."""
    owner = owner or Owner(dispatcher_name(ref.namespace, ref.name))
    name = owner.name
    pod_labels = {**labels("dispatcher", name), **dict(owner.labels)}
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    if config.secret_name:
        volumes.append({"name": "kafka-secret", "secret": {"secretName": config.secret_name}})
        mounts.append({"name": "kafka-secret", "mountPath": SECRET_MOUNT, "readOnly": True})
    pod = dict(config.pod or {})
    container = {
        "name": "dispatcher",
        "image": settings.dispatcher_image,
        "imagePullPolicy": pod.get("imagePullPolicy", "IfNotPresent"),
        "env": _override(dispatcher_env(ref, settings, config), owner.env),
        "ports": [{"name": "metrics", "containerPort": settings.metrics_port, "protocol": "TCP"}],
        # Liveness only: a dispatcher stuck behind an unreachable Kafka must not be restarted in a loop.
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                          "initialDelaySeconds": 10, "periodSeconds": 10},
        "securityContext": pod.get("securityContext") or {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
    if config.resources:
        container["resources"] = dict(config.resources)
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {LABEL_NAME: DISPATCHER_APP, LABEL_DISPATCHER: name}},
        "template": {
            "metadata": {"labels": pod_labels, "annotations": {ANNOTATION_CONFIG_CHECKSUM: config.checksum,
                                                               owner.annotation: ref.key}},
            "spec": {
                "automountServiceAccountToken": True,  # the dispatcher watches its channel and patches status
                "serviceAccountName": DISPATCHER_SERVICE_ACCOUNT,
                "enableServiceLinks": False,
                "securityContext": pod.get("podSecurityContext") or {
                    "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": volumes,
            },
        },
    }
    for field in ("imagePullSecrets", "nodeSelector", "tolerations"):
        if pod.get(field):
            spec["template"]["spec"][field] = pod[field]
    if not keda_scaled:
        # Consumers beyond the partition count would sit idle in the group.
        spec["replicas"] = max(1, min(settings.dispatcher_replicas, num_partitions))
    metadata: dict[str, Any] = {
        "name": name, "namespace": owner.namespace or settings.system_namespace, "labels": pod_labels,
        "annotations": {owner.annotation: ref.key,
                        ANNOTATION_SCALER: SCALER_KEDA if keda_scaled else SCALER_CONTROLLER}}
    if owner.owner_references:
        metadata["ownerReferences"] = [dict(o) for o in owner.owner_references]
    return stamp({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec}, spec)


def dispatcher_service(ref: ChannelRef, settings: Settings, owner: Owner | None = None) -> dict[str, Any]:
    owner = owner or Owner(dispatcher_name(ref.namespace, ref.name))
    name = owner.name
    spec = {
        # Headless: Prometheus scrapes each pod through the endpoints, and a cluster IP per channel would
        # exhaust a small service range (a /24 holds 254) for nothing.
        "type": "ClusterIP",
        "clusterIP": "None",
        "selector": {LABEL_NAME: DISPATCHER_APP, LABEL_DISPATCHER: name},
        "ports": [{"name": "metrics", "port": settings.metrics_port, "targetPort": "metrics", "protocol": "TCP"}],
    }
    metadata: dict[str, Any] = {"name": name, "namespace": owner.namespace or settings.system_namespace,
                                "labels": {**labels("dispatcher", name), **dict(owner.labels)},
                                "annotations": {owner.annotation: ref.key}}
    if owner.owner_references:
        metadata["ownerReferences"] = [dict(o) for o in owner.owner_references]
    return stamp({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}, spec)


def _override(env: list[dict[str, Any]], extra: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    wanted = dict(extra)
    out = [{"name": e["name"], "value": wanted.pop(e["name"])} if e["name"] in wanted else e for e in env]
    return out + [{"name": k, "value": v} for k, v in wanted.items()]


def needs_update(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    if existing is None:
        return True
    have = ((existing.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
    want = desired["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    return bool(have != want)


def deployment_available(dep: Mapping[str, Any] | None) -> tuple[bool, str]:
    """(available, why not). Available when the Available condition is True and a replica is up."""
    if dep is None:
        return False, "created, no status reported yet"
    status = dep.get("status") or {}
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Available":
            if cond.get("status") == "True" and int(status.get("availableReplicas") or 0) > 0:
                return True, ""
            return False, str(cond.get("message") or cond.get("reason") or "not available")
    return False, f"{int(status.get('availableReplicas') or 0)} replicas available"
