from __future__ import annotations

from pathlib import Path

import pytest

from kafka_eventing.core.settings import Settings, SettingsError


def test_defaults_and_env() -> None:
    s = Settings.from_env({"KE_MAX_EVENT_BYTES": "2048", "KE_DELETE_TOPICS": "false",
                           "KE_CHANNELS_FILE": "/x.yaml", "KE_PRODUCE_TIMEOUT_SECONDS": "2.5", "HOME": "/root"})
    assert s.max_event_bytes == 2048
    assert s.delete_topics is False
    assert s.channels_file == Path("/x.yaml")
    assert s.produce_timeout_seconds == 2.5
    assert Settings.from_env({}).topic_template == "{namespace}.{name}"


def test_typos_fail_loudly() -> None:
    with pytest.raises(SettingsError, match="KE_MAX_EVENT_BYTE"):
        Settings.from_env({"KE_MAX_EVENT_BYTE": "1"})
    with pytest.raises(SettingsError, match="KE_DELETE_TOPICS"):
        Settings.from_env({"KE_DELETE_TOPICS": "maybe"})
    with pytest.raises(SettingsError, match="KE_MAX_EVENT_BYTES"):
        Settings.from_env({"KE_MAX_EVENT_BYTES": "lots"})


def test_topic_template() -> None:
    s = Settings(topic_template="knative-messaging-kafka.{namespace}.{name}")
    assert s.topic_for("ns", "ch") == "knative-messaging-kafka.ns.ch"


def test_kafka_extra() -> None:
    assert Settings(kafka_extra="a=1, b = 2").kafka_extra_config() == {"a": "1", "b": "2"}
    with pytest.raises(SettingsError):
        Settings(kafka_extra="novalue").kafka_extra_config()
