"""Chart values: the dev Secret, the schema, capability-guarded opt-ins, long release names, the helm test."""

from __future__ import annotations

import re

from kafka_eventing.core.settings import Settings

from .render import (
    CHART,
    OPTIONAL_APIS,
    RELEASE,
    container_env,
    helm,
    of_kind,
    one,
    run,
    tool,
)


def test_dev_secret_checks_required_keys() -> None:
    docs = helm("ci/strimzi-sasl-scram-values.yaml")
    (secret,) = of_kind(docs, "Secret")
    assert secret["stringData"]["protocol"] == "SASL_SSL"
    assert secret["stringData"]["sasl.mechanism"] == "SCRAM-SHA-512"
    proc = run([tool("helm"), "template", RELEASE, str(CHART), "-f", str(CHART / "ci/strimzi-sasl-scram-values.yaml"),
                "--set", "kafka.connection.requiredSecretKeys={user,password,user.key}"], ok=False)
    assert proc.returncode != 0 and 'lacks key "user.key"' in proc.stderr


def test_values_schema_rejects_typos() -> None:
    for bad in ("kafka.provder=strimzi", "receiver.replica=3", "kafka.provider=kafka-cloud",
                "kafka.topicManagement=manual"):
        proc = run([tool("helm"), "template", RELEASE, str(CHART), "--set", bad], ok=False)
        assert proc.returncode != 0, bad
        assert "schema" in proc.stderr, proc.stderr


def test_capability_guarded_optins() -> None:
    without = helm("ci/all-optins-values.yaml")
    assert not of_kind(without, "ServiceMonitor")
    # KEDA is not capability-guarded: the controller checks the API itself and reports KEDANotInstalled.
    assert one(without, "ConfigMap", "config-kafka")["data"]["dispatcher.keda.enabled"] == "true"
    with_apis = helm("ci/all-optins-values.yaml", apis=OPTIONAL_APIS)
    assert len(of_kind(with_apis, "ServiceMonitor")) == 3  # receiver, controller, dispatchers
    assert len(of_kind(with_apis, "PrometheusRule")) == 1
    assert not of_kind(without, "PrometheusRule")
    assert one(with_apis, "ConfigMap", "config-kafka")["data"]["dispatcher.keda.enabled"] == "true"
    assert len(of_kind(with_apis, "PodDisruptionBudget")) == 2
    assert len(of_kind(with_apis, "NetworkPolicy")) == 3
    (hpa,) = of_kind(with_apis, "HorizontalPodAutoscaler")
    assert "replicas" not in one(with_apis, "Deployment", "kafka-eventing-receiver")["spec"]  # the HPA owns it
    assert hpa["spec"]["scaleTargetRef"]["name"] == "kafka-eventing-receiver"
    # Off by default.
    kinds = {d["kind"] for d in helm(apis=OPTIONAL_APIS)}
    assert not kinds & {"ServiceMonitor", "PodDisruptionBudget", "NetworkPolicy", "HorizontalPodAutoscaler",
                        "CronJob", "Job", "PrometheusRule"}
    assert not [d for d in helm(apis=OPTIONAL_APIS) if "grafana_dashboard" in d["metadata"].get("labels", {})]


def test_long_release_names_stay_valid() -> None:
    release = "a-long-release-name-at-helms-limit-of-53-characters-x"  # 53, the most Helm allows
    for d in helm(release=release):
        name = d["metadata"]["name"]
        if d["kind"] != "CustomResourceDefinition":
            assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name


def test_helm_test_sends_a_cloudevent_to_the_test_channel() -> None:
    docs = helm()
    (channel,) = of_kind(docs, "KafkaChannel")
    (pod,) = of_kind(docs, "Pod")
    for d in (channel, pod):
        assert d["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert int(channel["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        pod["metadata"]["annotations"]["helm.sh/hook-weight"])
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["CHANNEL_HOST"].startswith(channel["metadata"]["name"] + "-kn-channel.")
    assert env["RECEIVER_URL"].startswith("http://kafka-channel-receiver.")
    script = pod["spec"]["containers"][0]["command"][-1]
    assert "ce-specversion: 1.0" in script and '= 202' in script


def test_receiver_auth_is_off_by_default_and_reaches_settings_when_on() -> None:
    assert not [k for k in container_env(helm(), "kafka-eventing-receiver") if k.startswith("KE_AUTH_")]
    env = container_env(helm(sets=("receiver.auth.enabled=true", "receiver.auth.keysTtlSeconds=60")),
                        "kafka-eventing-receiver")
    auth = {k: v for k, v in env.items() if k.startswith("KE_AUTH_")}
    settings = Settings.from_env(auth)
    assert settings.auth_issuer == "https://kubernetes.default.svc.cluster.local"
    assert str(settings.auth_token_file) == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert str(settings.auth_ca_file) == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    assert settings.auth_keys_ttl_seconds == 60
    assert settings.auth_default_mode.value == "allow-same-namespace"  # Knative's default
    deny = container_env(helm(sets=("receiver.auth.enabled=true", "receiver.auth.defaultMode=deny-all")),
                         "kafka-eventing-receiver")
    assert Settings.from_env(deny).auth_default_mode.value == "deny-all"
    # The controller (status.address.audience) and the dispatchers it starts (tokens for Broker replies) know too.
    on = helm(sets=("receiver.auth.enabled=true",))
    assert container_env(on, "kafka-eventing-controller")["KE_AUTH_ISSUER"] == settings.auth_issuer
    assert "KE_AUTH_ISSUER" not in container_env(helm(), "kafka-eventing-controller")


def test_an_unknown_default_authorization_mode_fails_at_install() -> None:
    from .render import CHART, RELEASE, run, tool

    proc = run([tool("helm"), "template", RELEASE, str(CHART), "--set", "receiver.auth.enabled=true",
                "--set", "receiver.auth.defaultMode=allow-some"], ok=False)
    assert proc.returncode != 0 and "defaultMode" in proc.stderr, proc.stderr


def test_the_tls_minimum_reaches_the_controller_and_so_the_dispatchers() -> None:
    from .render import CHART, RELEASE, run, tool

    assert Settings.from_env(container_env(helm(), "kafka-eventing-controller")).tls_min_version.value == "1.3"
    lowered = container_env(helm(sets=("tls.minVersion=1.2",)), "kafka-eventing-controller")
    assert Settings.from_env(lowered).tls_min_version.value == "1.2"
    proc = run([tool("helm"), "template", RELEASE, str(CHART), "--set", "tls.minVersion=1.1"], ok=False)
    assert proc.returncode != 0 and "minVersion" in proc.stderr, proc.stderr
