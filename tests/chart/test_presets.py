"""Provider presets (generated from core/providers.yaml): settings the roles accept, the Secret keys each
needs, their wiring, idempotence, the base's images."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from kafka_eventing.core.kafka_config import KafkaConfigError, connection_from_secret
from kafka_eventing.core.settings import Settings

from .render import (
    CHART,
    KUSTOMIZE,
    NAMESPACE,
    PRESETS,
    SCENARIOS,
    SETTINGS_ENV,
    container_env,
    helm,
    kustomize,
    merged_values,
    of_kind,
    one,
    preset_sets,
    scenario,
)


@pytest.mark.parametrize("name", SCENARIOS)
def test_env_is_what_settings_accept(name: str) -> None:
    docs = scenario(name)
    for deployment in ("kafka-eventing-receiver", "kafka-eventing-controller"):
        env = container_env(docs, deployment)
        unknown = {k for k in env if k.startswith("KE_")} - SETTINGS_ENV
        assert not unknown, f"{deployment}: Settings.from_env rejects {unknown}"
        assert env["KE_SYSTEM_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        literal = {k: v for k, v in env.items() if isinstance(v, str)}
        settings = Settings.from_env({**literal, "KE_SYSTEM_NAMESPACE": NAMESPACE})
        assert settings.channel_source == "kube"
        assert settings.receiver_service == one(docs, "Service", "kafka-channel-receiver")["metadata"]["name"]
        settings.kafka_extra_config()  # parses
        spec = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        secret_name = one(docs, "ConfigMap", "config-kafka")["data"]["auth.secret.ref.name"]
        if deployment == "kafka-eventing-receiver" and secret_name:
            # The receiver reads the Secret the controller is told about, as files.
            assert settings.kafka_secret_dir is not None
            assert volumes[mounts[str(settings.kafka_secret_dir)]]["secret"]["secretName"] == secret_name
        else:
            # The controller reads the Secret through the API (informer), never from a mount.
            assert settings.kafka_secret_dir is None and "kafka-secret" not in volumes
        assert (deployment == "kafka-eventing-controller") == ("POD_NAME" in env)  # leader-election identity
        # /tmp (gunicorn heartbeats, the metrics dir) must be writable on a read-only root filesystem.
        assert "emptyDir" in volumes[mounts["/tmp"]]
        if "PROMETHEUS_MULTIPROC_DIR" in env:
            assert env["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/")


FAKE_VALUES = {"user": "u", "password": "p", "aws.region": "eu-west-1", "bootstrap.servers": "b:9093",
               "ca.crt": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
               "user.crt": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
               "user.key": "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n"}


def preset_connection(name: str, keys: Iterable[str]) -> dict[str, Any]:
    values = merged_values(name)
    conn = values["kafka"]["connection"]
    filled = {**FAKE_VALUES, "protocol": conn["protocol"], "sasl.mechanism": conn["saslMechanism"]}
    settings = Settings.from_env(dict(one(scenario(name), "ConfigMap", "kafka-eventing-config")["data"]))
    resolved = connection_from_secret({k: filled[k] for k in keys}, provider=settings.kafka_provider,
                                      bootstrap_servers=settings.bootstrap_servers,
                                      extra=settings.kafka_extra_config())
    return {**resolved.config, "idempotence": resolved.idempotence}


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_secret_keys_are_needed_and_sufficient(name: str) -> None:
    values = merged_values(name)
    kafka = values["kafka"]
    keys = kafka["connection"]["requiredSecretKeys"]
    assert keys, f"{name} lists no Secret keys"
    config = preset_connection(name, keys)
    # Sufficient: the listed keys give the protocol and mechanism the preset declares, and the idempotence of
    # the provider (Event Hubs has no idempotent producer).
    assert config["security.protocol"] == kafka["connection"]["protocol"]
    assert config.get("sasl.mechanism", "") == kafka["connection"]["saslMechanism"]
    assert config["idempotence"] is (kafka["provider"] != "azure-event-hubs")
    if kafka["provider"] == "azure-event-hubs":
        assert config["sasl.username"] == "$ConnectionString"
    # Needed: without any one of them the connection fails or comes out different.
    for key in keys:
        try:
            without = preset_connection(name, [k for k in keys if k != key])
        except KafkaConfigError:
            continue
        assert without != config, f"{name}: Secret key {key!r} is listed but changes nothing"


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_wiring(name: str) -> None:
    values = merged_values(name)
    docs = scenario(name)
    config = one(docs, "ConfigMap", "kafka-eventing-config")["data"]
    assert config["KE_KAFKA_PROVIDER"] == values["kafka"]["provider"]
    assert config["KE_TOPIC_MANAGEMENT"] == values["kafka"]["topicManagement"]
    set_address = [s.partition("=")[2].replace("\\,", ",") for s in preset_sets(name)
                   if s.startswith("kafka.bootstrapServers=")]
    assert config["KE_BOOTSTRAP_SERVERS"] == (values["kafka"]["bootstrapServers"] or set_address[0])
    assert "enable.idempotence" not in config["KE_KAFKA_EXTRA"], "the provider preset decides idempotence"
    assert not of_kind(docs, "Secret"), "presets reference an existing Secret, never create one"
    volumes = one(docs, "Deployment", "kafka-eventing-receiver")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "kafka-secret", "secret": {"secretName": "kafka-connection"}} in volumes
    assert one(docs, "ConfigMap", "config-kafka")["data"]["auth.secret.ref.name"] == "kafka-connection"
    if values["kafka"]["provider"] == "azure-event-hubs":
        assert config["KE_TOPIC_MANAGEMENT"] == "external"
    if values["kafka"]["connection"]["saslMechanism"] == "OAUTHBEARER":
        for sa in of_kind(docs, "ServiceAccount"):
            assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")


@pytest.mark.parametrize(("sets", "idempotent"), [
    (("kafka.provider=azure-event-hubs",), False),  # the preset: Event Hubs has no idempotent producer
    (("kafka.provider=strimzi",), True),
    (("kafka.provider=azure-event-hubs", "kafka.idempotence=true"), True),  # an explicit choice wins
    (("kafka.provider=strimzi", "kafka.idempotence=false"), False),
])
def test_idempotence_follows_the_provider_unless_set(sets: tuple[str, ...], idempotent: bool) -> None:
    """``--set kafka.provider=azure-event-hubs`` alone must not give an idempotent producer: the chart writes
    ``enable.idempotence`` only when the user sets ``kafka.idempotence`` (extra settings beat the preset)."""
    config = one(helm(sets=sets), "ConfigMap", "kafka-eventing-config")["data"]
    assert ("enable.idempotence" in config["KE_KAFKA_EXTRA"]) is ("kafka.idempotence=" in " ".join(sets))
    settings = Settings.from_env(dict(config))
    resolved = connection_from_secret({"password": "p", "user": "u", "protocol": "SASL_SSL"},
                                      provider=settings.kafka_provider, bootstrap_servers=settings.bootstrap_servers,
                                      extra=settings.kafka_extra_config())
    assert resolved.idempotence is idempotent
    assert resolved.producer_config()["enable.idempotence"] is idempotent


def test_kustomize_images_are_the_charts_set_once_at_its_app_version() -> None:
    """The base is rendered from the chart, so the role images are the chart's (image.registry + appVersion): no
    kustomization repeats them."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for path in KUSTOMIZE.rglob("kustomization.yaml"):
        assert "images" not in (yaml.safe_load(path.read_text()) or {}), path
    for overlay in PRESETS.values():
        docs = kustomize(overlay)
        images = {c["image"] for d in of_kind(docs, "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}
        (config,) = (d for d in of_kind(docs, "ConfigMap") if "KE_DISPATCHER_IMAGE" in (d.get("data") or {}))
        images.add(config["data"]["KE_DISPATCHER_IMAGE"])
        assert images == {f"ghcr.io/kafka-eventing/kafka-eventing-{role}:{version}"
                          for role in ("receiver", "controller", "dispatcher")}, images
