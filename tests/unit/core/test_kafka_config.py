from __future__ import annotations

import pytest

from kafka_eventing.core.kafka_config import (
    KafkaConfigError,
    connection_from_secret,
    connection_from_settings,
)
from kafka_eventing.core.redaction import redact
from kafka_eventing.core.settings import Settings

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_plaintext_default() -> None:
    conn = connection_from_secret({}, bootstrap_servers="k:9092")
    assert conn.config == {"bootstrap.servers": "k:9092", "security.protocol": "PLAINTEXT",
                           "socket.nagle.disable": True}
    p = conn.producer_config()
    assert p["acks"] == "all" and p["enable.idempotence"] is True


def test_nagle_is_off_unless_the_config_turns_it_on() -> None:
    conn = connection_from_secret({}, bootstrap_servers="k:9092", extra={"socket.nagle.disable": "false"})
    assert conn.config["socket.nagle.disable"] == "false"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_newest_format_sasl_ssl(mechanism: str) -> None:
    data = {"protocol": "SASL_SSL", "sasl.mechanism": mechanism, "user": "u", "password": "p", "ca.crt": CA}
    cfg = connection_from_secret(data, bootstrap_servers="k:9093").config
    assert cfg["security.protocol"] == "SASL_SSL"
    assert cfg["sasl.mechanism"] == mechanism
    assert (cfg["sasl.username"], cfg["sasl.password"]) == ("u", "p")
    assert cfg["ssl.ca.pem"] == CA


def test_bytes_values_from_secret_api() -> None:
    data = {"protocol": b"SASL_PLAINTEXT", "sasl.mechanism": b"SCRAM-SHA-512", "user": b"u", "password": b"p\n"}
    cfg = connection_from_secret(data, bootstrap_servers="k:9092").config
    assert cfg["security.protocol"] == "SASL_PLAINTEXT"
    assert cfg["sasl.password"] == "p"
    assert "ssl.ca.pem" not in cfg and "ssl.ca.location" not in cfg


def test_sasl_plain_with_public_ca_needs_no_ca_file() -> None:
    # The upstream bug: PLAIN over TLS with a public CA failed because a CA file was required.
    cfg = connection_from_secret(
        {"protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "user": "key", "password": "secret",
         "bootstrap.servers": "pkc.example:9092"}
    ).config
    assert "ssl.ca.pem" not in cfg
    assert cfg["ssl.ca.location"]


def test_mutual_tls() -> None:
    cfg = connection_from_secret(
        {"protocol": "SSL", "ca.crt": CA, "user.crt": "CERT", "user.key": "KEY"}, bootstrap_servers="k:9093"
    ).config
    assert cfg["ssl.certificate.pem"] == "CERT" and cfg["ssl.key.pem"] == "KEY"
    with pytest.raises(KafkaConfigError, match=r"user\.crt.*user\.key"):
        connection_from_secret({"protocol": "SSL", "user.crt": "CERT"}, bootstrap_servers="k:9093")


def test_distributed_channel_format() -> None:
    data = {"brokers": "b1:9093,b2:9093", "username": "u", "password": "p", "sasltype": "SCRAM-SHA-512"}
    cfg = connection_from_secret(data).config
    assert cfg["bootstrap.servers"] == "b1:9093,b2:9093"
    assert cfg["security.protocol"] == "SASL_SSL"
    assert cfg["sasl.mechanism"] == "SCRAM-SHA-512"
    assert cfg["sasl.username"] == "u"


def test_event_hubs_preset() -> None:
    conn = connection_from_secret(
        {"password": "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=x", "namespace": "ns"},
        provider="azure-event-hubs",
    )
    cfg = conn.config
    assert cfg["bootstrap.servers"] == "ns.servicebus.windows.net:9093"
    assert cfg["sasl.username"] == "$ConnectionString"
    assert cfg["sasl.mechanism"] == "PLAIN" and cfg["security.protocol"] == "SASL_SSL"
    producer = conn.producer_config()
    assert producer["enable.idempotence"] is False
    assert producer["max.in.flight.requests.per.connection"] == 1


def test_confluent_cloud_and_msk_presets() -> None:
    cc = connection_from_secret({"user": "k", "password": "s"}, provider="confluent-cloud", bootstrap_servers="x:9092")
    assert cc.config["sasl.mechanism"] == "PLAIN" and cc.idempotence
    msk = connection_from_secret({"user": "u", "password": "p"}, provider="aws-msk", bootstrap_servers="x:9096")
    assert msk.config["sasl.mechanism"] == "SCRAM-SHA-512"


def test_msk_iam_uses_token_callback() -> None:
    conn = connection_from_secret({"aws.region": "eu-west-1"}, provider="aws-msk-iam", bootstrap_servers="x:9098")
    cfg = conn.producer_config()
    assert cfg["sasl.mechanism"] == "OAUTHBEARER"
    assert callable(cfg["oauth_cb"])
    assert "sasl.password" not in cfg
    with pytest.raises(KafkaConfigError, match="region"):
        connection_from_secret({}, provider="aws-msk-iam", bootstrap_servers="x:9098", environ={})


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"protocol": "SASL_SSL", "user": "u"}, "needs `user`"),
        ({"protocol": "TLS"}, "protocol"),
        ({"protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI", "user": "u", "password": "p"}, "sasl.mechanism"),
    ],
)
def test_errors_name_the_problem(data: dict[str, str], match: str) -> None:
    with pytest.raises(KafkaConfigError, match=match):
        connection_from_secret(data, bootstrap_servers="k:9092")


def test_no_bootstrap_servers() -> None:
    with pytest.raises(KafkaConfigError, match="bootstrap"):
        connection_from_secret({})


def test_secrets_never_in_repr_or_redacted_config() -> None:
    conn = connection_from_secret(
        {"protocol": "SASL_SSL", "user": "u", "password": "hunter2-secret", "user.crt": "C", "user.key": "PRIVATE"},
        bootstrap_servers="k:9093",
    )
    assert "hunter2-secret" not in repr(conn)
    assert "PRIVATE" not in repr(conn)
    assert "hunter2-secret" not in str(redact(conn.config))


def test_from_settings_reads_mounted_secret(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "protocol").write_text("SASL_PLAINTEXT")
    (tmp_path / "sasl.mechanism").write_text("SCRAM-SHA-256")
    (tmp_path / "user").write_text("u")
    (tmp_path / "password").write_text("p")
    (tmp_path / "..data").mkdir()  # what kubelet's atomic writer leaves beside the keys
    settings = Settings(bootstrap_servers="k:9092", kafka_secret_dir=tmp_path, kafka_extra="linger.ms=7")
    cfg = connection_from_settings(settings).config
    assert cfg["sasl.mechanism"] == "SCRAM-SHA-256"
    assert cfg["linger.ms"] == "7"
