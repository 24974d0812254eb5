"""Typed settings read once from environment variables — the one place that reads the environment.

Every role builds its parts from a ``Settings`` object; tests construct one directly (``Settings(...)``) or
through ``Settings.from_env({...})`` with a plain dict, so nothing monkey-patches ``os.environ``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from kafka_eventing.core.eventpolicies import DefaultMode
from kafka_eventing.core.kafka_config import PROVIDERS
from kafka_eventing.core.tls import TlsVersion

PREFIX = "KE_"
OTEL_PREFIX = "OTEL_"
KUBECONFIG = "KUBECONFIG"


class SettingsError(ValueError):
    """An environment variable holds a value that cannot be used; the message names it."""


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use true/false)")


class ChannelSourceKind(enum.StrEnum):
    FILE = "file"  # KafkaChannels from ``channels_file`` (standalone mode)
    KUBE = "kube"  # KafkaChannels watched on the API server


class TopicManagement(enum.StrEnum):
    ADMIN = "admin"  # the controller creates, grows and deletes topics
    EXTERNAL = "external"  # topics exist already; the controller only checks them


class LogFormat(enum.StrEnum):
    JSON = "json"
    CONSOLE = "console"


class InitialOffset(enum.StrEnum):
    """Where a new subscription starts when its group has no committed offset."""

    LATEST = "latest"
    EARLIEST = "earliest"


@dataclass(frozen=True)
class Settings:
    """All knobs of every role. Field ``foo_bar`` is read from ``KE_FOO_BAR``."""

    # -- where things are ---------------------------------------------------------------------------
    #: the namespace of the installation: the receiver, the dispatcher Deployments, config-kafka, the connection
    #: Secret, the leader-election Lease.
    system_namespace: str = "knative-eventing"
    #: where the receiver and dispatcher read KafkaChannels (and Brokers/Triggers): ``kube`` (watched on the API
    #: server, as installed) or ``file`` (``KE_CHANNELS_FILE``, standalone).
    channel_source: ChannelSourceKind = ChannelSourceKind.FILE
    #: YAML file of KafkaChannel (and Broker/Trigger) documents, for ``KE_CHANNEL_SOURCE=file``.
    channels_file: Path | None = None
    #: kubeconfig file of the API server to use (outside a cluster); unset, the standard ``KUBECONFIG`` is read,
    #: and without either a role uses its pod's service account.
    kubeconfig: Path | None = None

    # -- Kafka connection ---------------------------------------------------------------------------
    #: Kafka bootstrap servers, ``host:port[,host:port...]`` (a mounted Secret's ``bootstrap.servers`` wins).
    bootstrap_servers: str = "127.0.0.1:9092"
    #: directory holding the connection Secret's keys as files (a mounted Secret) — optional.
    kafka_secret_dir: Path | None = None
    #: provider preset: a name in ``core/providers.yaml`` (checked on construction).
    kafka_provider: str = "apache"
    #: extra librdkafka properties, "k1=v1,k2=v2" — for tuning without a new release.
    kafka_extra: str = ""

    # -- naming templates ---------------------------------------------------------------------------
    #: a KafkaChannel's topic, from ``{namespace}`` and ``{name}``.
    topic_template: str = "{namespace}.{name}"
    #: a Subscription's consumer group, from ``{namespace}``, ``{channel}`` and the subscriber's ``{uid}``.
    consumer_group_template: str = "kafka.{namespace}.{channel}.{uid}"

    # -- receiver -----------------------------------------------------------------------------------
    #: largest event accepted (bytes of the request body); larger is answered 413.
    max_event_bytes: int = 1024 * 1024
    #: how long a request waits for Kafka's acknowledgement before it is answered 503 (the record is then not
    #: written: librdkafka gives up on it at the same time).
    produce_timeout_seconds: float = 10.0
    #: the ``Retry-After`` of a 503 (Kafka unavailable, producer queue full, channel not ready).
    retry_after_seconds: int = 5
    #: a request must arrive whole (head and body) within this many seconds of its first byte, and a new
    #: connection must start one as quickly; slower clients are cut off so they cannot hold connections forever.
    request_timeout_seconds: float = 30.0
    #: the producer's ``compression.type`` (none, gzip, snappy, lz4, zstd).
    compression_type: str = "none"
    #: linger.ms of the producer that batches, used while a worker takes over ``batch_above_rate`` requests/s.
    linger_ms: float = 5.0
    #: requests/s per receiver worker above which records are batched; below it a second producer sends each
    #: record at once (linger.ms 0), so a lightly loaded receiver answers in about one broker round trip. A worker
    #: also batches while more records wait for their reports than 10 ms of this rate (saturated below it).
    #: 0: always batch (one producer).
    batch_above_rate: float = 4000.0
    #: Kafka clusters (servers + Secret) other than its own that one receiver worker writes to at most: each
    #: holds two producers and a poll thread. Past it, targets on yet another cluster get a 503.
    max_kafka_connections: int = 16
    #: ingress authentication, off while empty: the OIDC issuer whose JWTs (Kubernetes service-account tokens
    #: or any OIDC provider's) a POST must carry as ``Authorization: Bearer``, for the channel's audience. Set, it
    #: also makes the controller publish ``status.address.audience`` and Broker dispatchers send tokens on replies.
    auth_issuer: str = ""
    #: CA bundle trusted for the issuer's discovery document and JWKS (in-cluster: the service-account ca.crt).
    auth_ca_file: Path | None = None
    #: bearer token presented to the issuer when fetching them (in-cluster: the service-account token), re-read
    #: at each fetch so a rotated token is used.
    auth_token_file: Path | None = None
    #: how long signing keys are kept before the JWKS is fetched again (a new key id fetches at once).
    auth_keys_ttl_seconds: float = 300.0
    #: with authentication on, who may send where no EventPolicy applies (Knative's
    #: ``default-authorization-mode``): allow-all (any valid token), allow-same-namespace (ServiceAccounts of the
    #: target's namespace; Knative's default) or deny-all. EventPolicies are read when the API serves their CRD.
    auth_default_mode: DefaultMode = DefaultMode.ALLOW_SAME_NAMESPACE
    #: the controller writes EventPolicies' status (``status.from``, Ready): only where no other controller does —
    #: the chart sets it when it installs the EventPolicy CRD (``crds.eventPolicies``), i.e. without Knative
    #: Eventing, whose controller writes that status itself. The targets' ``status.policies`` are written always.
    event_policy_status: bool = False
    #: the lowest TLS version the dispatcher accepts from an ``https://`` subscriber, reply or dead-letter sink
    #: (1.2 or 1.3; Knative 1.22's minimum is 1.3). Each is verified with the system's CAs and its ``CACerts``.
    tls_min_version: TlsVersion = TlsVersion.TLS_1_3
    #: the receiver serves HTTPS with this certificate (PEM chain) and ``tls_key_file`` while both are set, plain
    #: HTTP otherwise; ``tls_min_version`` is the lowest version it accepts.
    tls_cert_file: Path | None = None
    #: the private key (PEM) of ``tls_cert_file``.
    tls_key_file: Path | None = None
    #: how often the receiver looks for a rotated certificate and key (a Secret update) and loads them for new
    #: connections, without a restart.
    tls_reload_seconds: float = 10.0
    #: set on the receiver of a KafkaNamespaced data plane (the controller sets it on the receiver Deployment it
    #: runs in each namespace with KafkaNamespaced Brokers): it serves only the KafkaNamespaced Brokers of this
    #: namespace, and no channel or KafkaSink. Empty: the shared receiver, which serves every namespace's channels,
    #: KafkaSinks and Kafka-class Brokers, and no KafkaNamespaced Broker.
    receiver_namespace: str = ""
    #: the receiver serves HTTPS and this CA bundle (PEM) verifies its certificate: the controller then publishes
    #: every address as ``https://`` with this bundle as its ``CACerts`` (and Broker dispatchers send replies so).
    ingress_ca_file: Path | None = None

    # -- dispatcher ---------------------------------------------------------------------------------
    #: the KafkaChannel a channel's dispatcher serves (one Deployment per channel; the controller sets it).
    channel_name: str = ""
    #: the namespace of ``KE_CHANNEL_NAME``.
    channel_namespace: str = ""
    #: set instead of the channel's for a Broker's dispatcher (one Deployment per Broker; its Triggers are
    #: its subscribers).
    broker_name: str = ""
    #: the namespace of ``KE_BROKER_NAME``.
    broker_namespace: str = ""
    #: set instead of the channel's for a KafkaSource's dispatcher (one Deployment per KafkaSource).
    source_name: str = ""
    #: the namespace of ``KE_SOURCE_NAME``.
    source_namespace: str = ""
    #: events delivered at once per unordered subscription (an ordered one delivers one per partition).
    max_in_flight: int = 64
    #: longest wait a subscriber's ``Retry-After`` may ask for before the next attempt.
    retry_after_max_seconds: float = 600.0
    #: local fetch budget per subscription; 1024 keeps 15 subscriptions under 128 MiB RSS (bench-dispatcher).
    queued_max_messages_kbytes: int = 1024
    #: where a new consumer group starts (``latest`` or ``earliest``); committed offsets always win.
    dispatcher_initial_offset: InitialOffset = InitialOffset.LATEST

    # -- controller ---------------------------------------------------------------------------------
    #: ``admin``: the controller creates, grows and deletes topics; ``external``: topics exist already and are
    #: only checked.
    topic_management: TopicManagement = TopicManagement.ADMIN
    #: with ``admin`` topic management, delete a KafkaChannel's or Broker's topic when it is deleted.
    delete_topics: bool = True
    #: image of the dispatcher Deployments the controller creates.
    dispatcher_image: str = "kafka-eventing-dispatcher:dev"
    #: replicas of each dispatcher Deployment (members of every subscription's consumer group).
    dispatcher_replicas: int = 1
    #: the receiver's Service in the system namespace: what channel Services point to and Broker addresses name.
    receiver_service: str = "kafka-channel-receiver"
    #: the sink ingress Service (on the receiver pods): a KafkaSink's address, and the Host the receiver tells
    #: a sink's requests by.
    sink_service: str = "kafka-sink-ingress"
    #: the shared receiver Deployment whose availability is a channel's ReceiverDeploymentReady and a Broker's
    #: DataPlaneAvailable; empty: the Deployment named ``KE_RECEIVER_SERVICE``.
    receiver_deployment: str = ""

    #: the KafkaNamespaced broker class is served while this and ``KE_NAMESPACED_DISPATCHER_ROLE`` are set (the chart
    #: sets both with ``broker.namespaced.enabled``): the ClusterRole the controller binds, in each namespace with
    #: KafkaNamespaced Brokers, to that namespace's receiver ServiceAccount (the chart's receiver ClusterRole).
    namespaced_receiver_role: str = ""
    #: the ClusterRole bound there to that namespace's dispatcher ServiceAccount (the chart's dispatcher one).
    namespaced_dispatcher_role: str = ""

    # -- observability ------------------------------------------------------------------------------
    #: DEBUG, INFO, WARNING, ERROR.
    log_level: str = "INFO"
    #: ``json`` (one object per line) or ``console``.
    log_format: LogFormat = LogFormat.JSON
    #: port of ``/metrics`` (and the dispatcher's and controller's ``/healthz``, ``/readyz``).
    metrics_port: int = 9090
    #: OTLP/HTTP endpoint for traces (``http://collector:4318``); empty = tracing off, unless the standard
    #: ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` is set (core/tracing.py).
    tracing_endpoint: str = ""
    #: share of new traces sampled (0..1); a sender's sampled ``traceparent`` is always followed.
    tracing_sample_ratio: float = 1.0

    #: the standard ``OTEL_*`` variables, for the OpenTelemetry setup (read here with the rest of the environment)
    otel: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Enumerations are checked however the object is made (from_env, Settings(...), dataclasses.replace):
        # an unknown value fails here, naming the variable and the choices, never later as a silent default.
        for name, hint in _ENUM_FIELDS.items():
            value = getattr(self, name)
            if not isinstance(value, hint):
                object.__setattr__(self, name, _choice(f"{PREFIX}{name.upper()}", hint, value))
        if self.kafka_provider not in PROVIDERS:
            raise SettingsError(f"KE_KAFKA_PROVIDER={self.kafka_provider!r} is not one of {', '.join(PROVIDERS)}")
        if not 0.0 <= self.tracing_sample_ratio <= 1.0:
            raise SettingsError(f"KE_TRACING_SAMPLE_RATIO={self.tracing_sample_ratio} is not within 0..1")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``KE_*`` variables; unknown ``KE_*`` names are an error (typos fail loudly)."""
        env = os.environ if environ is None else environ
        hints = get_type_hints(cls)
        known = {f.name for f in fields(cls) if f.name != "otel"}
        values: dict[str, Any] = {}
        otel: dict[str, str] = {}
        for key, raw in env.items():
            if key.startswith(OTEL_PREFIX):
                otel[key] = raw
                continue
            if not key.startswith(PREFIX):
                continue
            name = key[len(PREFIX):].lower()
            if name not in known:
                if name in TOOLING_VARS:
                    continue
                raise SettingsError(f"unknown setting {key}; known: {', '.join(sorted(known))}")
            values[name] = _coerce(key, hints[name], raw)
        if values.get("kubeconfig") is None and env.get(KUBECONFIG):
            values["kubeconfig"] = Path(env[KUBECONFIG])  # what kubectl and helm read: a path or a ":" list
        return cls(**values, otel=otel)

    def kafka_extra_config(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in self.kafka_extra.split(","))):
            k, sep, v = item.partition("=")
            if not sep:
                raise SettingsError(f"KE_KAFKA_EXTRA item {item!r} is not key=value")
            out[k.strip()] = v.strip()
        return out

    @property
    def tracing_traces_endpoint(self) -> str:
        """``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (a full URL, used as given)."""
        return self.otel.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")

    @property
    def tracing_base_endpoint(self) -> str:
        """``KE_TRACING_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``: a base URL for the OTLP paths."""
        return self.tracing_endpoint or self.otel.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")

    @property
    def tracing_sampler_from_env(self) -> bool:
        return bool(self.otel.get("OTEL_TRACES_SAMPLER"))

    @property
    def tracing_service_name_from_env(self) -> bool:
        return bool(self.otel.get("OTEL_SERVICE_NAME")) or "service.name=" in self.otel.get(
            "OTEL_RESOURCE_ATTRIBUTES", "")

    @property
    def namespaced_brokers(self) -> bool:
        """Whether the controller serves the KafkaNamespaced broker class (the chart value enables it)."""
        return bool(self.namespaced_receiver_role and self.namespaced_dispatcher_role)

    @property
    def receiver_deployment_name(self) -> str:
        return self.receiver_deployment or self.receiver_service

    def topic_for(self, namespace: str, name: str) -> str:
        return self.topic_template.format(namespace=namespace, name=name)

    def consumer_group_for(self, namespace: str, channel: str, subscriber_uid: str) -> str:
        """The consumer group of one subscription (the dispatcher consumes in it; KEDA reads its lag)."""
        return self.consumer_group_template.format(namespace=namespace, channel=channel, uid=subscriber_uid)


#: KE_ variables that belong to the tooling (make, the local stack, hack/images.sh), not to a running role: a role
#: accepts them in its environment and ignores them.
TOOLING_VARS: dict[str, str] = {
    "cache": "the tool cache of `make setup` (Kafka jars, Spark connector, Go-built tools): default `<repo>/.cache`",
    "image_cache": "per-user cache of the images fixed by their inputs (Debian OS bases, the role bases' dependency "
                   "stages, the kind node image, the e2e tiers' role and Spark archives; hack/image-cache.sh, "
                   "hack/cluster-images.sh), shared by every clone: default "
                   "`${XDG_CACHE_HOME:-~/.cache}/kafka-eventing/images`; `off` uses none",
    "make_start": "when the outermost make started (epoch seconds; the Makefile sets it): each target's time line "
                  "(hack/make/bash) also says how long since",
    "make_times": "a file each make target appends its name, seconds, exit code and seconds since make started to "
                  "(`.ci/run` sets `.cache/logs/times.tsv`; hack/testing-doc.py reads it)",
    "save_images": "hack/images.sh: `docker save` every role image built into this file (`make cluster-images`)",
    "keep_dockerd": "hack/images.sh: `1` leaves the private Docker engine it started running",
}


def _choice(key: str, kind: type[enum.StrEnum], raw: object) -> enum.StrEnum:
    try:
        return kind(str(raw).strip().lower())
    except ValueError:
        raise SettingsError(f"{key}={raw!r} is not one of {', '.join(kind)}") from None


_ENUM_FIELDS: dict[str, type[enum.StrEnum]] = {
    f.name: hint for f in fields(Settings)
    if isinstance(hint := get_type_hints(Settings)[f.name], type) and issubclass(hint, enum.StrEnum)
}


def _coerce(key: str, hint: Any, raw: str) -> Any:
    text = str(hint)
    if isinstance(hint, type) and issubclass(hint, enum.StrEnum):
        return _choice(key, hint, raw)
    try:
        if hint is bool:
            return _parse_bool(key, raw)
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
        if "Path" in text:
            return Path(raw) if raw else None
    except ValueError as exc:
        raise SettingsError(f"{key}={raw!r}: {exc}") from None
    return raw
