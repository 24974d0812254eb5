"""core.redaction is the one list of secret names: the Kafka config repr, the JSON log formatter and the Spark
jobs' Kafka options all hide the same names and keep the same others."""

from __future__ import annotations

import json
import logging

import pytest

from kafka_eventing.core.logging import JsonFormatter
from kafka_eventing.core.redaction import REDACTED, is_secret, redact
from kafka_eventing.reprocess.kafka_options import SparkKafkaOptions

SECRET = ["sasl.password", "ssl.key.pem", "ssl.key.password", "sasl.oauthbearer.client.secret", "oauth_cb",
          "kafka.sasl.jaas.config", "kafka.ssl.keystore.key", "kafka.ssl.key.password", "token", "password"]
PLAIN = ["bootstrap.servers", "sasl.username", "security.protocol", "key", "partition_key", "event_id", "topic"]


@pytest.mark.parametrize("name", SECRET)
def test_secret_names(name: str) -> None:
    assert is_secret(name) and is_secret(name.upper())


@pytest.mark.parametrize("name", PLAIN)
def test_plain_names(name: str) -> None:
    assert not is_secret(name)


def test_every_writer_uses_the_one_list() -> None:
    values = {name: "VALUE" for name in SECRET + PLAIN}
    expected = {name: REDACTED if name in SECRET else "VALUE" for name in values}
    assert redact(values) == expected
    assert SparkKafkaOptions(values).redacted() == expected
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "m", None, None)
    for name, value in values.items():
        setattr(record, name, value)
    logged = json.loads(JsonFormatter().format(record))
    assert {name: logged[name] for name in values} == expected
