"""Reprocessing pieces that need no Spark: Kafka option translation, record decoding, HTTP pacing, CLI parsing."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kafka_eventing.core.binding import CloudEvent, ContentMode, event_to_kafka
from kafka_eventing.core.kafka_config import KafkaConfigError, connection_from_secret
from kafka_eventing.reprocess.cli import EXIT_USAGE, _equals, _spark_conf, build_parser, main, print_summary
from kafka_eventing.reprocess.events import decode_record, event_from_columns, event_row
from kafka_eventing.reprocess.http_sink import RateLimiter, resent_ids, strip_extensions
from kafka_eventing.reprocess.kafka_options import spark_kafka_options

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_plaintext_options() -> None:
    opts = spark_kafka_options(connection_from_secret({"bootstrap.servers": "127.0.0.1:9092"}))
    assert dict(opts) == {"kafka.bootstrap.servers": "127.0.0.1:9092", "kafka.security.protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_options_and_secret_never_printed(mechanism: str) -> None:
    password = 'p"a\\ss-SECRET'
    conn = connection_from_secret({"protocol": "SASL_SSL", "sasl.mechanism": mechanism, "user": "alice",
                                   "password": password, "ca.crt": CA, "bootstrap.servers": "b:9093"})
    opts = spark_kafka_options(conn)
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    assert opts["kafka.sasl.mechanism"] == mechanism
    assert opts["kafka.sasl.jaas.config"] == (
        f'org.apache.kafka.common.security.{module} required username="alice" password="p\\"a\\\\ss-SECRET";'
    )
    assert opts["kafka.ssl.truststore.type"] == "PEM" and opts["kafka.ssl.truststore.certificates"] == CA
    assert "sasl.password" not in " ".join(opts) and "kafka.sasl.username" not in opts
    assert "SECRET" not in repr(opts) and "SECRET" not in str(opts) and "SECRET" not in str(opts.redacted())


def test_public_ca_uses_the_jvm_truststore_and_librdkafka_only_keys_are_dropped() -> None:
    conn = connection_from_secret({"protocol": "SASL_SSL", "user": "$ConnectionString", "password": "x",
                                   "bootstrap.servers": "ns.servicebus.windows.net:9093"},
                                  provider="azure-event-hubs")
    opts = spark_kafka_options(conn)
    assert not any(k.startswith("kafka.ssl.truststore") for k in opts)
    assert "kafka.socket.keepalive.enable" not in opts
    assert opts["kafka.metadata.max.age.ms"] == "180000"


def test_mutual_tls_key_becomes_pkcs8() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pkcs1 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption()).decode()
    conn = connection_from_secret({"protocol": "SSL", "ca.crt": CA, "user.crt": CA, "user.key": pkcs1,
                                   "bootstrap.servers": "b:9093"})
    opts = spark_kafka_options(conn)
    assert opts["kafka.ssl.keystore.type"] == "PEM"
    assert opts["kafka.ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert "BEGIN PRIVATE KEY" not in repr(opts)


def test_msk_iam_uses_the_iam_login_module() -> None:
    conn = connection_from_secret({"bootstrap.servers": "b-1.msk:9098", "aws.region": "eu-west-1"},
                                  provider="aws-msk-iam")
    opts = spark_kafka_options(conn)
    assert opts["kafka.sasl.mechanism"] == "AWS_MSK_IAM"
    assert opts["kafka.sasl.client.callback.handler.class"].endswith("IAMClientCallbackHandler")
    assert "oauth_cb" not in " ".join(opts)


def test_oauthbearer_without_msk_is_refused() -> None:
    with pytest.raises(KafkaConfigError):
        connection_from_secret({"protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "bootstrap.servers": "b"})


def _event(**extra: Any) -> CloudEvent:
    attrs = {"id": "1", "source": "/s", "type": "t", "specversion": "1.0",
             "time": datetime(2024, 2, 3, 4, 5, 6, tzinfo=UTC), "region": "eu", **extra}
    return CloudEvent(attrs, b"\x00\x01payload")


@pytest.mark.parametrize("mode", list(ContentMode))
def test_decode_record_binary_and_structured(mode: ContentMode) -> None:
    rec = event_to_kafka(_event(), mode)
    row = decode_record(rec.key, rec.value, [{"key": k, "value": v} for k, v in rec.headers], None)
    assert row["error"] is None
    assert (row["id"], row["type"], row["extensions"], row["data"]) == ("1", "t", {"region": "eu"}, b"\x00\x01payload")
    assert row["event_date"] == date(2024, 2, 3)


def test_malformed_record_is_a_row_with_error_and_kafka_date() -> None:
    ts = datetime(2025, 1, 2, 23, 0, tzinfo=UTC)
    row = decode_record(None, b"plain text", [], ts)
    assert row["id"] is None and row["data"] == b"plain text"
    assert "not a CloudEvent" in row["error"]
    assert row["event_date"] == date(2025, 1, 2)


def test_columns_round_trip_and_dead_letter_extensions_stripped() -> None:
    event = _event(knativeerrordest="http://x", knativeerrorcode="500")
    row = event_row(event)
    row["extensions"] = list(row["extensions"].items())  # as Arrow hands a map over
    rebuilt = event_from_columns(row)
    assert rebuilt.get_attributes() == event.get_attributes() and rebuilt.get_data() == event.get_data()
    clean = strip_extensions(rebuilt, ("knativeerror*",))
    assert "knativeerrordest" not in clean.get_attributes() and clean.get_extension("region") == "eu"


def test_rate_limiter_spaces_starts() -> None:
    async def run() -> float:
        limiter = RateLimiter(50.0)
        started = time.monotonic()
        for _ in range(6):
            await limiter.acquire()
        return time.monotonic() - started

    assert asyncio.run(run()) >= 5 / 50 * 0.9


def test_cli_parsing_and_summary(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["replay", "--channel", "ns/orders", "--from", "2024-01-01T00:00:00Z",
                                      "--to-url", "http://127.0.0.1:1/", "--where-attr", "type=a=b", "--dry-run"])
    assert (args.job, args.channel, args.dry_run) == ("replay", "ns/orders", True)
    assert _equals(args.where_attr) == {"type": "a=b"}
    with pytest.raises(ValueError):
        _equals(["novalue"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["replay", "--topic", "t"])  # a sink is required
    print_summary({"job": "replay", "counts": {"sent": 3, "failed": 0}})
    out = capsys.readouterr().out
    assert re.search(r"^counts.sent +3$", out, re.M) and re.search(r"^job +replay$", out, re.M)


def test_spark_conf_flags_for_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["stats", "--topic", "t", "--out", "o", "--master", "spark://127.0.0.1:7077",
                                      "--conf", "spark.executor.instances=4", "--conf=spark.a.b=x=y",
                                      "--executor-timeout", "30"])
    assert (args.master, args.executor_timeout) == ("spark://127.0.0.1:7077", 30.0)
    assert _spark_conf(args.conf) == {"spark.executor.instances": "4", "spark.a.b": "x=y"}
    assert build_parser().parse_args(["stats", "--topic", "t", "--out", "o"]).executor_timeout == 300.0
    for bad in ("executor.instances=4", "spark.executor.instances"):
        with pytest.raises(ValueError, match="is not spark.KEY=VALUE"):
            _spark_conf([bad])
    # Refused before anything connects to Kafka or starts a JVM: one line, exit 2.
    assert main(["stats", "--topic", "t", "--out", "o", "--bootstrap-servers", "127.0.0.1:9",
                 "--conf", "executor.instances=4"]) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == (
        "kafka-eventing reprocess stats: --conf 'executor.instances=4' is not spark.KEY=VALUE")


def test_window_parsing() -> None:
    from kafka_eventing.reprocess.sources import parse_offsets, parse_time

    assert parse_time("2024-01-01T00:00:00") == datetime(2024, 1, 1, tzinfo=UTC)
    assert parse_time("2024-01-01T01:00:00+01:00") - datetime(2024, 1, 1, tzinfo=UTC) == timedelta(0)
    with pytest.raises(ValueError):
        parse_offsets("not json")


def test_a_time_that_leaves_datetime_range_in_utc_is_an_error_row_not_a_crash() -> None:
    from kafka_eventing.reprocess.events import decode_record

    headers = [{"key": k, "value": v} for k, v in (
        ("ce_specversion", b"1.0"), ("ce_id", b"1"), ("ce_source", b"/s"), ("ce_type", b"t"),
        ("ce_time", b"0001-01-01T00:00:00+01:00"))]
    row = decode_record(None, b"data", headers, None)
    assert row["error"] and row["type"] is None and row["data"] == b"data"


def test_resent_ids_are_the_events_two_attempts_of_one_task_started(tmp_path: Path) -> None:
    def journal(name: str, *pairs: tuple[str, str], cut: str = "") -> None:
        (tmp_path / name).write_text("".join(json.dumps(list(p)) + "\n" for p in pairs) + cut)

    # Task 0: its first attempt (killed) started a and b, and was cut writing c; the retry sent everything.
    journal("0.0.11.jsonl", ("s", "a"), ("s", "b"), cut='["s", "c"')
    journal("0.1.17.jsonl", ("s", "a"), ("s", "b"), ("s", "c"), ("s", "d"))
    # Task 1 ran once, and holds the same id twice (an event twice in its input): sent twice, but not re-sent.
    journal("1.0.12.jsonl", ("s", "e"), ("s", "e"), ("t", "a"))
    assert resent_ids(tmp_path) == [("s", "a"), ("s", "b")]
    assert resent_ids(tmp_path / "none") == []
