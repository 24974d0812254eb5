"""Kafka connection config: a connection Secret's data (+ provider preset) → confluent-kafka config.

Two Secret formats are accepted, as users of the Knative implementations have both:

* newest: ``protocol``, ``sasl.mechanism``, ``ca.crt``, ``user.crt``, ``user.key``, ``user``, ``password``
  (optionally ``bootstrap.servers``);
* distributed KafkaChannel: ``brokers``, ``username``, ``password``, ``sasltype``, ``namespace`` (Event Hubs).

Certificates are handed to librdkafka inline (``ssl.*.pem``), so nothing secret is written to disk. With no
``ca.crt`` the public CA bundle is used — SASL PLAIN against a public-CA endpoint needs no CA file.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from kafka_eventing.core.redaction import REDACTED, redact


def load_providers() -> dict[str, Any]:
    """``providers.yaml``: client defaults per provider (``providers``) and the install presets (``presets``)."""
    import yaml

    data: dict[str, Any] = yaml.safe_load(files("kafka_eventing.core").joinpath("providers.yaml").read_text())
    return data


if TYPE_CHECKING:
    from botocore.credentials import CredentialProvider

    from kafka_eventing.core.settings import Settings

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

#: Provider presets (``providers.yaml``, the one home of provider facts): defaults a Secret may override.
#: Differences between providers are configuration, not code paths (MSK IAM's token callback aside).
PROVIDERS: dict[str, dict[str, Any]] = load_providers()["providers"]


class KafkaConfigError(ValueError):
    """The connection Secret or preset cannot make a working config; the message says what to change."""


class KafkaConnectionError(RuntimeError):
    """Kafka could not be reached or refused the credentials (message never contains a secret)."""


def _text(data: Mapping[str, str | bytes], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    text = text.strip() if key not in ("ca.crt", "user.crt", "user.key") else text
    return text or None


@dataclass(frozen=True)
class KafkaConnection:
    """A resolved connection. ``config`` is the librdkafka base config shared by all clients."""

    config: dict[str, Any]
    idempotence: bool = True
    provider: str = "apache"
    _oauth_cb: Callable[[str], tuple[str, float]] | None = field(default=None, repr=False)

    def __repr__(self) -> str:  # never print credentials, even by accident in a traceback
        return f"KafkaConnection(provider={self.provider!r}, config={redact(self.config)!r})"

    def _base(self) -> dict[str, Any]:
        cfg = dict(self.config)
        if self._oauth_cb is not None:
            cfg["oauth_cb"] = self._oauth_cb
        return cfg

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        cfg = self._base()
        cfg.update({"acks": "all", "enable.idempotence": self.idempotence})
        if not self.idempotence:
            # Without idempotence, retries may reorder unless one request is in flight per connection.
            cfg["max.in.flight.requests.per.connection"] = 1
        cfg.update(overrides)
        return cfg

    def consumer_config(self, group_id: str, **overrides: Any) -> dict[str, Any]:
        cfg = self._base()
        cfg.update({
            "group.id": group_id,
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,  # offsets are stored only after delivery or dead-lettering
            "partition.assignment.strategy": "cooperative-sticky",
        })
        cfg.update(overrides)
        return cfg

    def admin_config(self, **overrides: Any) -> dict[str, Any]:
        cfg = self._base()
        cfg.update(overrides)
        return cfg


def _msk_iam_token_cb(region: str, credentials: CredentialProvider | None = None) -> Callable[[str], tuple[str, float]]:
    """OAUTHBEARER token callback for AWS MSK IAM (the one real provider code path).

    AWS's signer pre-signs a SigV4 ``kafka-cluster:Connect`` request to ``kafka.<region>.amazonaws.com`` for 15
    minutes and gives its expiry in milliseconds; librdkafka wants seconds since the epoch and calls again at 80 % of
    the lifetime. Each call signs anew with the credentials of that moment, as IRSA's web-identity credentials rotate.
    ``credentials`` replaces botocore's default chain (environment, web identity, profile, instance role).
    """

    def cb(_config: str) -> tuple[str, float]:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

        if credentials is None:
            token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
        else:
            token, expiry_ms = MSKAuthTokenProvider.generate_auth_token_from_credentials_provider(region, credentials)
        return token, expiry_ms / 1000

    return cb


def _public_ca_location() -> str:
    try:
        import certifi

        return str(certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with the kubernetes client
        return "probe"


def connection_from_secret(
    data: Mapping[str, str | bytes],
    *,
    provider: str = "apache",
    bootstrap_servers: str | None = None,
    extra: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> KafkaConnection:
    """Resolve a connection from a Secret's data (either format) on top of a provider preset.

    ``environ`` (the process's when None) gives MSK IAM its region when the Secret has no ``aws.region``.
    """
    if provider not in PROVIDERS:
        raise KafkaConfigError(f"unknown Kafka provider {provider!r}; one of {', '.join(PROVIDERS)}")
    preset = PROVIDERS[provider]

    legacy = "brokers" in data or "sasltype" in data or "username" in data
    user = _text(data, "user") or _text(data, "username") or preset.get("user")
    password = _text(data, "password")
    mechanism = (_text(data, "sasl.mechanism") or _text(data, "sasltype") or preset.get("sasl.mechanism"))
    protocol = _text(data, "protocol")
    if protocol is None:
        if preset.get("protocol"):
            protocol = preset["protocol"]
        elif legacy and _text(data, "username"):
            protocol = "SASL_SSL"  # the distributed channel always used TLS with SASL
        else:
            protocol = "PLAINTEXT"
    protocol = protocol.upper()
    if protocol not in PROTOCOLS:
        raise KafkaConfigError(f"protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")

    servers = _text(data, "bootstrap.servers") or _text(data, "brokers") or bootstrap_servers
    namespace = _text(data, "namespace")
    if not servers and namespace and provider == "azure-event-hubs":
        servers = f"{namespace}.servicebus.windows.net:9093"
    if not servers:
        raise KafkaConfigError("no bootstrap servers: set `bootstrap.servers` (or `brokers`) in the Secret or config")

    # TCP_NODELAY, as Kafka's Java client always sets: with Nagle's algorithm on (librdkafka's default) a small
    # request sent while an earlier one is unanswered waits for the broker's answer to go out, which raised the
    # receiver's p99 at 1,000 events/s 2-3x (docs/receiver.md). A preset or KE_KAFKA_EXTRA may turn it back on.
    cfg: dict[str, Any] = {"bootstrap.servers": servers, "security.protocol": protocol,
                           "socket.nagle.disable": True}
    oauth_cb = None
    if protocol.startswith("SASL"):
        mechanism = (mechanism or "PLAIN").upper()
        if mechanism not in MECHANISMS:
            raise KafkaConfigError(f"sasl.mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)}")
        cfg["sasl.mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            if not preset.get("msk_iam"):
                raise KafkaConfigError("OAUTHBEARER is supported for AWS MSK IAM only (provider aws-msk-iam)")
            # The Secret's key, else the pod's environment (EKS's IRSA webhook sets both variables).
            env = os.environ if environ is None else environ
            region = _text(data, "aws.region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
            if not region:
                raise KafkaConfigError(
                    "AWS MSK IAM needs a region: Secret key `aws.region`, or AWS_REGION / AWS_DEFAULT_REGION")
            oauth_cb = _msk_iam_token_cb(region)
        else:
            if not user or not password:
                raise KafkaConfigError(
                    f"{protocol} with {mechanism} needs `user` (or `username`) and `password` in the Secret"
                )
            cfg["sasl.username"] = user
            cfg["sasl.password"] = password
    if protocol.endswith("SSL"):
        ca = _text(data, "ca.crt")
        if ca:
            cfg["ssl.ca.pem"] = ca
        else:
            cfg["ssl.ca.location"] = _public_ca_location()
        cert, key = _text(data, "user.crt"), _text(data, "user.key")
        if bool(cert) != bool(key):
            raise KafkaConfigError("mutual TLS needs both `user.crt` and `user.key` in the Secret")
        if cert and key:
            cfg["ssl.certificate.pem"] = cert
            cfg["ssl.key.pem"] = key
    cfg.update(preset.get("librdkafka", {}))
    cfg.update(extra or {})
    idempotence = bool(preset.get("idempotence", True))
    if "enable.idempotence" in cfg:
        idempotence = str(cfg.pop("enable.idempotence")).lower() == "true"
    return KafkaConnection(config=cfg, idempotence=idempotence, provider=provider, _oauth_cb=oauth_cb)


def check_connection(connection: KafkaConnection, timeout: float = 10.0) -> None:
    """Fail fast with a clear message when Kafka is unreachable or refuses the credentials.

    librdkafka reports authentication failures through ``error_cb`` long before a metadata request times
    out, so the first such error ends the wait.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    fatal: list[str] = []
    seen = threading.Event()

    def on_error(err: KafkaError) -> None:
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                          KafkaError._SSL) or "auth" in err.str().lower():
            fatal.append(_scrub(err.str(), connection))
            seen.set()

    admin = AdminClient(connection.admin_config(error_cb=on_error, log_level=0))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not seen.is_set():
        try:
            admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            return
        except Exception:
            admin.poll(0)
    servers = connection.config.get("bootstrap.servers")
    if fatal:
        raise KafkaConnectionError(f"Kafka at {servers} refused the connection: {fatal[0]}")
    raise KafkaConnectionError(f"Kafka at {servers} did not answer within {timeout:.0f}s")


def _scrub(text: str, connection: KafkaConnection) -> str:
    for key in ("sasl.password", "ssl.key.pem"):
        secret = connection.config.get(key)
        if secret:
            text = text.replace(str(secret), REDACTED)
    return text


def connection_from_settings(settings: Settings, environ: Mapping[str, str] | None = None) -> KafkaConnection:
    """The connection a role uses: the mounted Secret (if any) over the settings' bootstrap servers."""
    data: dict[str, str | bytes] = {}
    if settings.kafka_secret_dir is not None and settings.kafka_secret_dir.is_dir():
        for item in settings.kafka_secret_dir.iterdir():
            # Mounted Secrets hold "..data" symlinks and hidden dirs; only plain keys count.
            if item.is_file() and not item.name.startswith("."):
                data[item.name] = item.read_bytes()
    return connection_from_secret(
        data,
        provider=settings.kafka_provider,
        bootstrap_servers=settings.bootstrap_servers,
        extra=settings.kafka_extra_config(),
        environ=environ,
    )


# -- the connection a data-plane target names ---------------------------------------------------------------
#: ``status.annotations`` keys the controller writes on a Broker or KafkaSink whose Kafka connection is not the
#: receiver's own, so the receiver writes its events to the cluster it names (without reading the config itself).
STATUS_BOOTSTRAP = "kafka.eventing.knative.dev/bootstrap.servers"
STATUS_SECRET = "kafka.eventing.knative.dev/auth.secret"  # noqa: S105 - a key name: "<namespace>/<name>"
#: a digest of the Secret's data (and the servers): a rotated Secret is a new connection.
STATUS_CHECKSUM = "kafka.eventing.knative.dev/connection.checksum"


@dataclass(frozen=True)
class ConnectionRef:
    """A Kafka connection as a target names it: the servers and the Secret (by name, never its data).

    Hashable, so the receiver keeps one producer per distinct value; ``checksum`` changes when the Secret's data
    does, so a rotated Secret gets a new producer and the old one is closed once no target names it.
    """

    bootstrap_servers: str
    secret_namespace: str = ""
    secret_name: str = ""
    checksum: str = ""

    @property
    def secret(self) -> str:
        return f"{self.secret_namespace}/{self.secret_name}" if self.secret_name else ""

    def annotations(self) -> dict[str, str]:
        out = {STATUS_BOOTSTRAP: self.bootstrap_servers, STATUS_CHECKSUM: self.checksum}
        if self.secret_name:
            out[STATUS_SECRET] = self.secret
        return out


def connection_ref(status: Mapping[str, Any] | None) -> ConnectionRef | None:
    """The connection a target's ``status.annotations`` names; None: the receiver's own."""
    annotations = (status or {}).get("annotations") or {}
    servers = str(annotations.get(STATUS_BOOTSTRAP) or "").strip()
    if not servers:
        return None
    secret = str(annotations.get(STATUS_SECRET) or "")
    namespace, _, name = secret.partition("/")
    return ConnectionRef(servers, namespace if name else "", name, str(annotations.get(STATUS_CHECKSUM) or ""))
