"""The Kafka connection the controller uses, from the config ConfigMap and the connection Secret.

The ConfigMap (``config-kafka`` in the system namespace, optional) may hold ``bootstrap.servers`` and
``auth.secret.ref.name``. Without a named Secret, the Secret labelled ``eventing-kafka.knative.dev/kafka-secret:
"true"`` in the system namespace is used (the distributed KafkaChannel's convention). Both are read from the
controller's caches, i.e. through the API, never from a mounted file, so a rotated Secret takes effect at once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka_eventing.controller.topics import KafkaTopicAdmin, TopicAdmin
from kafka_eventing.core.informer import Store
from kafka_eventing.core.kafka_config import (
    STATUS_BOOTSTRAP,
    STATUS_CHECKSUM,
    STATUS_SECRET,
    ConnectionRef,
    KafkaConfigError,
    KafkaConnection,
    connection_from_secret,
)
from kafka_eventing.core.settings import Settings

DEFAULT_CONFIG_MAP = "config-kafka"
SECRET_LABEL = "eventing-kafka.knative.dev/kafka-secret"  # noqa: S105 - a label name
KEY_BOOTSTRAP = "bootstrap.servers"
KEY_SECRET_NAME = "auth.secret.ref.name"  # noqa: S105 - a key name
KEY_DISPATCHER_RESOURCES = "dispatcher.resources"
KEDA_PREFIX = "dispatcher.keda."
#: The dispatcher pods' settings the chart writes to config-kafka (JSON each, like dispatcher.resources), so that
#: the Deployments the controller makes run like the chart's own pods: key -> (pod spec field, JSON type).
DISPATCHER_POD_KEYS: dict[str, tuple[str, type]] = {
    "dispatcher.imagePullSecrets": ("imagePullSecrets", list),
    "dispatcher.imagePullPolicy": ("imagePullPolicy", str),
    "dispatcher.nodeSelector": ("nodeSelector", dict),
    "dispatcher.tolerations": ("tolerations", list),
    "dispatcher.podSecurityContext": ("podSecurityContext", dict),
    "dispatcher.securityContext": ("securityContext", dict),
}


@dataclass(frozen=True)
class KedaConfig:
    """``dispatcher.keda.*`` of config-kafka: scale each dispatcher on its consumer groups' lag."""

    enabled: bool = False
    min_replicas: int = 1
    max_replicas: int = 4
    lag_threshold: int = 100
    polling_interval: int = 30  # seconds; KEDA's default
    cooldown_period: int = 300  # seconds; KEDA's default


def _keda_config(cm_data: Mapping[str, str], where: str) -> KedaConfig:
    raw = {k[len(KEDA_PREFIX):]: v.strip() for k, v in cm_data.items() if k.startswith(KEDA_PREFIX)}
    enabled = raw.pop("enabled", "false").lower()
    if enabled not in ("true", "false"):
        raise KafkaConfigError(f"{where} key {KEDA_PREFIX}enabled must be true or false, not {enabled!r}")
    fields = {"minReplicas": ("min_replicas", 0), "maxReplicas": ("max_replicas", 1),
              "lagThreshold": ("lag_threshold", 1), "pollingInterval": ("polling_interval", 1),
              "cooldownPeriod": ("cooldown_period", 0)}
    values: dict[str, Any] = {"enabled": enabled == "true"}
    for key, text in raw.items():
        if key not in fields:
            raise KafkaConfigError(f"{where} key {KEDA_PREFIX}{key} is unknown; known: {', '.join(fields)}")
        attr, least = fields[key]
        try:
            values[attr] = int(text)
        except ValueError:
            raise KafkaConfigError(f"{where} key {KEDA_PREFIX}{key} is not an integer: {text!r}") from None
        if values[attr] < least:
            raise KafkaConfigError(f"{where} key {KEDA_PREFIX}{key} must be at least {least}")
    return KedaConfig(**values)


@dataclass(frozen=True)
class ResolvedConnection:
    connection: KafkaConnection
    secret_name: str | None
    bootstrap_servers: str
    checksum: str
    dispatcher_resources: Mapping[str, Any] | None = None
    #: DISPATCHER_POD_KEYS present and non-empty, by pod spec field.
    dispatcher_pod: Mapping[str, Any] | None = None
    keda: KedaConfig = KedaConfig()
    #: Keys present in the connection Secret: KEDA's TriggerAuthentication references them by name.
    secret_keys: frozenset[str] = frozenset()
    #: ``aws.region`` of the Secret (MSK IAM); not secret, KEDA wants it in the trigger metadata.
    aws_region: str | None = None
    #: set when a resource names its own connection (not config-kafka's): the receiver writes its events there.
    ref: ConnectionRef | None = None


def _dispatcher_resources(cm_data: Mapping[str, str], where: str) -> Mapping[str, Any] | None:
    """``dispatcher.resources``: the container resources (JSON, as the chart writes it) for every dispatcher."""
    raw = (cm_data.get(KEY_DISPATCHER_RESOURCES) or "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise KafkaConfigError(f"{where} key {KEY_DISPATCHER_RESOURCES} is not JSON: {exc}") from None
    if not isinstance(value, dict) or not set(value) <= {"limits", "requests", "claims"}:
        raise KafkaConfigError(f"{where} key {KEY_DISPATCHER_RESOURCES} must be an object with limits/requests")
    return value or None


def _dispatcher_pod(cm_data: Mapping[str, str], where: str) -> Mapping[str, Any] | None:
    out: dict[str, Any] = {}
    for key, (field, kind) in DISPATCHER_POD_KEYS.items():
        raw = (cm_data.get(key) or "").strip()
        if not raw:
            continue
        try:
            value = raw if kind is str else json.loads(raw)
        except ValueError as exc:
            raise KafkaConfigError(f"{where} key {key} is not JSON: {exc}") from None
        if not isinstance(value, kind):
            raise KafkaConfigError(f"{where} key {key} must be a JSON {kind.__name__}, not {raw!r}")
        if key == "dispatcher.imagePullPolicy" and value not in ("Always", "IfNotPresent", "Never"):
            raise KafkaConfigError(f"{where} key {key} must be Always, IfNotPresent or Never, not {raw!r}")
        if isinstance(value, list) and key == "dispatcher.imagePullSecrets":
            # The chart's imagePullSecrets are names; a pod spec wants {name: ...}.
            value = [v if isinstance(v, dict) else {"name": str(v)} for v in value]
        if value:
            out[field] = value
    return out or None


def _secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    data.update({k: str(v).encode() for k, v in (secret.get("stringData") or {}).items()})
    return data


def resolve(settings: Settings, config_maps: Store, secrets: Store, config_map: str = DEFAULT_CONFIG_MAP,
            environ: Mapping[str, str] | None = None) -> ResolvedConnection:
    """Raises ``KafkaConfigError`` with a message naming the object to fix."""
    ns = settings.system_namespace
    cm = config_maps.get(ns, config_map)
    cm_data: Mapping[str, str] = (cm or {}).get("data") or {}
    servers = (cm_data.get(KEY_BOOTSTRAP) or "").strip() or settings.bootstrap_servers
    secret_name = (cm_data.get(KEY_SECRET_NAME) or "").strip() or None
    secret: Mapping[str, Any] | None = None
    if secret_name:
        secret = secrets.get(ns, secret_name)
        if secret is None:
            raise KafkaConfigError(f"Secret {ns}/{secret_name} named by ConfigMap {ns}/{config_map} does not exist")
    else:
        labelled = sorted(
            (s for s in secrets.items()
             if ((s.get("metadata") or {}).get("labels") or {}).get(SECRET_LABEL) == "true"
             and (s.get("metadata") or {}).get("namespace") == ns),
            key=lambda s: str(s["metadata"]["name"]))
        if labelled:
            secret = labelled[0]
            secret_name = str(secret["metadata"]["name"])
    data = _secret_data(secret) if secret else {}
    connection = connection_from_secret(data, provider=settings.kafka_provider, bootstrap_servers=servers,
                                        extra=settings.kafka_extra_config(), environ=environ)
    digest = hashlib.sha256(json.dumps(
        {"cm": dict(cm_data), "secret": {k: v.hex() for k, v in sorted(data.items())}, "name": secret_name,
         "provider": settings.kafka_provider, "servers": servers, "extra": settings.kafka_extra},
        sort_keys=True).encode()).hexdigest()[:16]
    where = f"ConfigMap {ns}/{config_map}"
    region = data.get("aws.region")
    return ResolvedConnection(connection=connection, secret_name=secret_name, bootstrap_servers=servers,
                              checksum=digest, dispatcher_resources=_dispatcher_resources(cm_data, where),
                              dispatcher_pod=_dispatcher_pod(cm_data, where),
                              keda=_keda_config(cm_data, where), secret_keys=frozenset(data),
                              aws_region=region.decode().strip() or None if region else None)


def connection_annotations(status: Mapping[str, Any] | None, ref: ConnectionRef | None) -> dict[str, Any] | None:
    """The ``status.annotations`` merge-patch that tells the receiver which cluster a target's events go to, or
    None when the stored ones already say so (patch_status compares whole fields: other annotations stay)."""
    old = (status or {}).get("annotations") or {}
    want: dict[str, Any] = dict.fromkeys((STATUS_BOOTSTRAP, STATUS_SECRET, STATUS_CHECKSUM))
    if ref is not None:
        want.update(ref.annotations())
    if all(old.get(k) == v for k, v in want.items()):
        return None
    return want


class AdminPool:
    """One TopicAdmin per distinct connection; a changed Secret or ConfigMap gets a fresh client."""

    def __init__(self, factory: Callable[[KafkaConnection], TopicAdmin] | None = None,
                 timeout: float = 10.0) -> None:
        self._factory = factory or (lambda conn: KafkaTopicAdmin(conn.admin_config(), timeout=timeout))
        self._lock = threading.Lock()
        self._current: tuple[str, TopicAdmin] | None = None

    def get(self, resolved: ResolvedConnection) -> TopicAdmin:
        with self._lock:
            if self._current is None or self._current[0] != resolved.checksum:
                self._current = (resolved.checksum, self._factory(resolved.connection))
            return self._current[1]
