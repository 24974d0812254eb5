"""The connection Secret, resolved by core (``connection_from_secret``), as Spark's ``kafka.*`` source/sink options.

Spark's Kafka connector runs the Java client, so librdkafka keys are translated: SASL credentials become a
``sasl.jaas.config`` line, an inline CA becomes a PEM truststore (``ssl.truststore.type=PEM``), a client
certificate a PEM keystore, and AWS MSK IAM the ``aws-msk-iam-auth`` login module (the jar must be on the
classpath; this path is configuration only and has not been run against a real MSK cluster).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kafka_eventing.core.kafka_config import KafkaConfigError, KafkaConnection
from kafka_eventing.core.redaction import redact

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_MSK_IAM = {
    "sasl.mechanism": "AWS_MSK_IAM",
    "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
    "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
}
# Keys core resolves that the Java client either names differently (handled above) or does not have.
_HANDLED = {
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
    "ssl.ca.pem", "ssl.ca.location", "ssl.certificate.pem", "ssl.key.pem",
}
_LIBRDKAFKA_ONLY = {
    "socket.keepalive.enable", "log_level", "enable.ssl.certificate.verification", "statistics.interval.ms",
    "queued.max.messages.kbytes", "linger.ms", "compression.type", "api.version.request",
    "socket.nagle.disable",  # the Java client always sets TCP_NODELAY
}


class SparkKafkaOptions(Mapping[str, str]):
    """``kafka.*`` options for ``spark.read/readStream/write.format("kafka")``; its repr hides secrets."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = dict(options)

    def __getitem__(self, key: str) -> str:
        return self._options[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def redacted(self) -> dict[str, str]:
        return redact(self._options)

    def __repr__(self) -> str:
        return f"SparkKafkaOptions({self.redacted()!r})"

    __str__ = __repr__


def _jaas_quote(value: str) -> str:
    # JAAS option values are double-quoted strings with backslash escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pkcs8(key_pem: str) -> str:
    """Java's PEM keystore reads only unencrypted PKCS#8 keys; Secrets often hold PKCS#1 / SEC1 ones."""
    if "-----BEGIN PRIVATE KEY-----" in key_pem:
        return key_pem
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def spark_kafka_options(connection: KafkaConnection) -> SparkKafkaOptions:
    """Translate a resolved connection into Spark's Kafka options (every key prefixed ``kafka.``)."""
    cfg: dict[str, Any] = connection.config
    java: dict[str, str] = {
        "bootstrap.servers": str(cfg["bootstrap.servers"]),
        "security.protocol": str(cfg.get("security.protocol", "PLAINTEXT")),
    }
    protocol = java["security.protocol"]
    if protocol.startswith("SASL"):
        mechanism = str(cfg.get("sasl.mechanism", "PLAIN"))
        if mechanism == "OAUTHBEARER":
            if connection.provider != "aws-msk-iam":
                raise KafkaConfigError("OAUTHBEARER is supported for AWS MSK IAM only (provider aws-msk-iam)")
            java.update(_MSK_IAM)
        else:
            module = _LOGIN_MODULES.get(mechanism)
            if module is None:
                raise KafkaConfigError(f"sasl.mechanism {mechanism!r} has no Java login module here")
            java["sasl.mechanism"] = mechanism
            java["sasl.jaas.config"] = (
                f"{module} required username={_jaas_quote(str(cfg['sasl.username']))} "
                f"password={_jaas_quote(str(cfg['sasl.password']))};"
            )
    if protocol.endswith("SSL"):
        if cfg.get("ssl.ca.pem"):
            java["ssl.truststore.type"] = "PEM"
            java["ssl.truststore.certificates"] = str(cfg["ssl.ca.pem"])
        # With no CA in the Secret the JVM's default truststore holds the public CAs (as certifi does for
        # librdkafka), so nothing is set.
        if cfg.get("ssl.certificate.pem") and cfg.get("ssl.key.pem"):
            java["ssl.keystore.type"] = "PEM"
            java["ssl.keystore.certificate.chain"] = str(cfg["ssl.certificate.pem"])
            java["ssl.keystore.key"] = _pkcs8(str(cfg["ssl.key.pem"]))
    for key, value in cfg.items():
        if key in _HANDLED or key in _LIBRDKAFKA_ONLY or key in java:
            continue
        java[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return SparkKafkaOptions({f"kafka.{k}": v for k, v in java.items()})
