from __future__ import annotations

from pathlib import Path

import pytest

from kafka_eventing.core.settings import (
    ChannelSourceKind,
    InitialOffset,
    LogFormat,
    Settings,
    SettingsError,
    TopicManagement,
)


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


@pytest.mark.parametrize(("name", "raw", "choices"), [
    ("KE_CHANNEL_SOURCE", "etcd", "file, kube"),
    ("KE_TOPIC_MANAGEMENT", "externl", "admin, external"),  # once silently meant "external"
    ("KE_LOG_FORMAT", "text", "json, console"),
    ("KE_DISPATCHER_INITIAL_OFFSET", "beginning", "latest, earliest"),
    ("KE_KAFKA_PROVIDER", "kafka",
     "apache, strimzi, redpanda, confluent-cloud, azure-event-hubs, aws-msk, aws-msk-iam"),
])
def test_enumerations_are_checked_with_the_choices(name: str, raw: str, choices: str) -> None:
    with pytest.raises(SettingsError, match=f"^{name}='{raw}' is not one of {choices}$"):
        Settings.from_env({name: raw})
    field = name.removeprefix("KE_").lower()
    with pytest.raises(SettingsError, match=f"^{name}="):
        Settings(**{field: raw})  # constructed directly: the same check


def test_enumerations_parse_to_their_members() -> None:
    s = Settings.from_env({"KE_CHANNEL_SOURCE": "kube", "KE_TOPIC_MANAGEMENT": "External",
                           "KE_LOG_FORMAT": "console", "KE_DISPATCHER_INITIAL_OFFSET": "earliest",
                           "KE_KAFKA_PROVIDER": "azure-event-hubs"})
    assert (s.channel_source, s.topic_management, s.log_format, s.dispatcher_initial_offset, s.kafka_provider) == (
        ChannelSourceKind.KUBE, TopicManagement.EXTERNAL, LogFormat.CONSOLE, InitialOffset.EARLIEST,
        "azure-event-hubs")
    assert Settings(topic_management="external").topic_management is TopicManagement.EXTERNAL  # type: ignore[arg-type]


def test_no_unused_extra_field() -> None:
    with pytest.raises(SettingsError, match="unknown setting KE_EXTRA"):
        Settings.from_env({"KE_EXTRA": "a=1"})


def test_topic_template() -> None:
    s = Settings(topic_template="knative-messaging-kafka.{namespace}.{name}")
    assert s.topic_for("ns", "ch") == "knative-messaging-kafka.ns.ch"


def test_kafka_extra() -> None:
    assert Settings(kafka_extra="a=1, b = 2").kafka_extra_config() == {"a": "1", "b": "2"}
    with pytest.raises(SettingsError):
        Settings(kafka_extra="novalue").kafka_extra_config()


def test_every_ke_variable_the_project_names_is_a_setting_or_a_tooling_variable() -> None:
    """docs/settings.md (generated from Settings and TOOLING_VARS) then documents every one of them."""
    import re
    from dataclasses import fields

    from kafka_eventing.core.settings import PREFIX, TOOLING_VARS

    root = Path(__file__).resolve().parents[3]
    known = {f"{PREFIX}{f.name.upper()}" for f in fields(Settings) if f.name != "otel"}
    known |= {f"{PREFIX}{name.upper()}" for name in TOOLING_VARS} | {"KE_FOO_BAR"}  # the docstring's example
    sources = [root / "Makefile", *(root / "src").rglob("*.py"), *(root / "hack").rglob("*.sh"),
               *(root / "hack").glob("*.py"), *(root / "charts").rglob("*.yaml"), *(root / "kustomize").rglob("*"),
               *(root / "images").rglob("Dockerfile")]
    named = {m for path in sources if path.is_file() for m in re.findall(r"\bKE_[A-Z][A-Z0-9_]*\b", path.read_text())}
    assert named, "the scan found nothing: it would check nothing"
    assert named - known == set()
    documented = (root / "docs" / "settings.md").read_text()
    assert all(f"`{name}`" in documented for name in known - {"KE_FOO_BAR"})
