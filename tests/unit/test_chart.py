"""Assertions on what the Helm chart and the Kustomize overlays render (no cluster needed).

Renders come from the real `helm` and `kustomize` binaries in the project's tool cache (`make setup`), so these
tests check the manifests users get: restricted security contexts, least-privilege RBAC, labels, image references,
settings that the roles' ``Settings`` accept, the Secret keys each provider preset needs (resolved with the real
``connection_from_secret``), schema validity against Kubernetes 1.34 and the KafkaChannel CRD, and that Helm and
Kustomize install the same objects for the same provider.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils
import pytest
import yaml
from referencing import Registry, Resource

from kafka_eventing.core.kafka_config import KafkaConfigError, connection_from_secret, load_providers
from kafka_eventing.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kafka-eventing"
KUSTOMIZE = ROOT / "kustomize"
CRDS = ROOT / "src" / "kafka_eventing" / "controller" / "crds"
CANONICAL_CRD = CRDS / "kafkachannels.yaml"
BIN = Path(os.environ.get("KE_CACHE", ROOT / ".cache")) / "bin"
RELEASE = "kafka-eventing"
NAMESPACE = "knative-eventing"
K8S_VERSION = "1.34.0"
SCHEMA_DIR = f"v{K8S_VERSION}-local-strict"  # kubernetes-validate's bundled schemas (no network)
OPTIONAL_APIS = ("monitoring.coreos.com/v1", "keda.sh/v1alpha1")
#: Kinds whose schema is not available offline (Prometheus Operator CRD); checked structurally below instead.
NO_OFFLINE_SCHEMA = {"ServiceMonitor"}
SETTINGS_ENV = {"KE_" + f.name.upper() for f in dataclasses.fields(Settings)}

#: Helm preset → the Kustomize overlay that must install the same objects (both generated from providers.yaml).
PRESETS = {f"values-{name}.yaml": name for name in load_providers()["presets"]}
CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
SCENARIOS = [f"ci/{n}" for n in CI_VALUES] + list(PRESETS)


# ---------------------------------------------------------------------------------------------------------------
# rendering


def tool(name: str) -> str:
    path = BIN / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make setup` (hack/setup/go-tools.sh builds it)")
    return str(path)


def run(args: list[str], *, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if ok and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def parse(text: str) -> tuple[dict[str, Any], ...]:
    return tuple(d for d in yaml.safe_load_all(text) if d)


@functools.cache
def helm(*files: str, sets: tuple[str, ...] = (), apis: tuple[str, ...] = (),
         release: str = RELEASE) -> tuple[dict[str, Any], ...]:
    args = [tool("helm"), "template", release, str(CHART), "-n", NAMESPACE, "--kube-version", K8S_VERSION]
    for f in files:
        args += ["-f", str(CHART / f)]
    for s in sets:
        args += ["--set", s]
    for a in apis:
        args += ["--api-versions", a]
    return parse(run(args).stdout)


@functools.cache
def kustomize(overlay: str) -> tuple[dict[str, Any], ...]:
    return parse(run([tool("kustomize"), "build", str(KUSTOMIZE / "overlays" / overlay)]).stdout)


def scenario(name: str) -> tuple[dict[str, Any], ...]:
    # Scenarios render with the optional APIs served, so capability-guarded objects are checked too.
    return helm(name, apis=OPTIONAL_APIS)


@pytest.fixture(scope="module", autouse=True)
def _prefetch_renders() -> None:
    """Render every scenario and overlay concurrently up front: the binaries' start-up dominates this module."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        jobs = [pool.submit(scenario, n) for n in SCENARIOS]
        jobs += [pool.submit(kustomize, p.name) for p in (KUSTOMIZE / "overlays").iterdir()]
        for job in jobs:
            job.result()


def of_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(docs: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            out.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
        elif d["kind"] == "CronJob":
            out.append((d["metadata"]["name"], d["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
        elif d["kind"] == "Pod":
            out.append((d["metadata"]["name"], d["spec"]))
    return out


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Deployment, Job or CronJob."""
    if doc["kind"] == "CronJob":
        doc = doc["spec"]["jobTemplate"]
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


#: Both reprocessing jobs on, with the smallest valid arguments.
REPROCESS_ON = ("reprocess.archive.enabled=true", "reprocess.archive.args={archive,--topic,t,--output,/out}",
                "reprocess.replay.enabled=true", "reprocess.replay.args={replay,--topic,t,--to-topic,u,--dry-run}")


def values_file(name: str) -> dict[str, Any]:
    data = yaml.safe_load((CHART / name).read_text())
    return data if isinstance(data, dict) else {}


def merged_values(*files: str) -> dict[str, Any]:
    def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    result = values_file("values.yaml")
    for f in files:
        result = merge(result, values_file(f))
    return result


def container_env(docs: Iterable[dict[str, Any]], deployment: str) -> dict[str, Any]:
    """A Deployment's effective env: the ConfigMaps it loads with envFrom, then its own env entries."""
    by_name = {d["metadata"]["name"]: d for d in of_kind(docs, "ConfigMap")}
    (container,) = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        env.update(by_name[source["configMapRef"]["name"]]["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


# ---------------------------------------------------------------------------------------------------------------
# CRD copies


BROKER_CRD_FILES = ("brokers.yaml", "triggers.yaml")  # Knative's own types: opt-in copies


@pytest.mark.parametrize(("copies", "optional"), [
    (CHART / "files" / "crds", True), (KUSTOMIZE / "base" / "crds", False),
], ids=["chart", "kustomize"])
def test_crd_copies_equal_the_canonical_files(copies: Path, optional: bool) -> None:
    canonical = sorted(p for p in CRDS.glob("*.yaml") if optional or p.name not in BROKER_CRD_FILES)
    assert CANONICAL_CRD in canonical, "the controller's canonical CRD is missing"
    assert sorted(p.name for p in copies.glob("*.yaml") if p.name != "kustomization.yaml") == [
        p.name for p in canonical], "run `make generate`"
    for crd in canonical:
        assert (copies / crd.name).read_bytes() == crd.read_bytes(), "run `make generate`"
    component = KUSTOMIZE / "components" / "broker-crds"
    for name in BROKER_CRD_FILES:
        assert (component / name).read_bytes() == (CRDS / name).read_bytes(), "run `make generate`"


def test_broker_crds_are_opt_in() -> None:
    kinds = {c["spec"]["names"]["kind"] for c in of_kind(helm(), "CustomResourceDefinition")}
    assert kinds == {"KafkaChannel"}
    with_brokers = of_kind(helm(sets=("crds.brokers=true",)), "CustomResourceDefinition")
    assert {c["spec"]["names"]["kind"] for c in with_brokers} == {"KafkaChannel", "Broker", "Trigger"}
    for crd in with_brokers:
        if crd["spec"]["group"] == "eventing.knative.dev":
            canonical = yaml.safe_load((CRDS / f"{crd['spec']['names']['plural']}.yaml").read_text())
            assert crd["spec"] == canonical["spec"]
    assert not of_kind(helm(sets=("crds.brokers=true", "crds.install=false")), "CustomResourceDefinition")
    config = one(helm(sets=("broker.defaultTopicPartitions=6",)), "ConfigMap", "kafka-broker-config")
    assert config["data"] == {"default.topic.partitions": "6", "default.topic.replication.factor": "1"}


def test_chart_crd_toggles() -> None:
    canonical = yaml.safe_load(CANONICAL_CRD.read_text())
    (crd,) = of_kind(helm(), "CustomResourceDefinition")
    assert crd["spec"] == canonical["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # Knative discovers channels by these labels: the chart's own labels must not replace them.
    for key, value in canonical["metadata"]["labels"].items():
        assert crd["metadata"]["labels"][key] == value
    (crd,) = of_kind(helm(sets=("crds.keep=false",)), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})
    assert not of_kind(helm(sets=("crds.install=false",)), "CustomResourceDefinition")


# ---------------------------------------------------------------------------------------------------------------
# security, RBAC, labels, images


@pytest.mark.parametrize("name", SCENARIOS)
def test_restricted_pod_security(name: str) -> None:
    specs = pod_specs(scenario(name))
    assert {n for n, _ in specs} >= {"kafka-eventing-receiver", "kafka-eventing-controller"}
    for pod, spec in specs:
        psc = spec["securityContext"]
        # Numeric, so the kubelet can verify non-root: the spark image runs as Spark's UID 185, the others as 65532.
        uid = 185 if "kafka-eventing-spark:" in spec["containers"][0]["image"] else 65532
        assert psc["runAsNonRoot"] is True, pod
        assert psc["runAsUser"] == uid, pod
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, pod
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), pod
        assert all("hostPath" not in v for v in spec.get("volumes", [])), pod
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (pod, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (pod, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]}, (pod, c["name"])
            assert sc["runAsNonRoot"] is True and not sc.get("privileged"), (pod, c["name"])
            assert sc.get("runAsUser", uid) == uid, (pod, c["name"])
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, (pod, c["name"])


def rbac_rules(docs: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(d, r) for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d.get("rules", [])]


@pytest.mark.parametrize("name", SCENARIOS)
def test_rbac_least_privilege(name: str) -> None:
    docs = scenario(name)
    for role, rule in rbac_rules(docs):
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
        if "secrets" in rule["resources"]:
            # Only in the release namespace (where the connection Secret is), read-only.
            assert role["kind"] == "Role" and role["metadata"]["namespace"] == NAMESPACE, rule
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
    # Every binding points at a role of this render and at ServiceAccounts of this render.
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("Role", "ClusterRole")}
    accounts = {d["metadata"]["name"] for d in of_kind(docs, "ServiceAccount")}
    for b in of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding"):
        assert (b["roleRef"]["kind"], b["roleRef"]["name"]) in roles
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and s["name"] in accounts and s["namespace"] == NAMESPACE


def rules_of(docs: Iterable[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str]]:
    out = set()
    for r in one(docs, kind, name)["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    out.add((g, res, v))
    return out


def test_rbac_grants_what_each_role_needs() -> None:
    docs = scenario("values-strimzi.yaml")
    controller = rules_of(docs, "ClusterRole", "kafka-eventing-controller")
    for verb in ("get", "list", "watch", "update", "patch"):
        assert ("messaging.knative.dev", "kafkachannels", verb) in controller
    for sub in ("kafkachannels/status", "kafkachannels/finalizers"):
        assert ("messaging.knative.dev", sub, "update") in controller
    assert {("", "services", v) for v in ("create", "update", "delete")} <= controller
    assert ("", "events", "create") in controller
    local = rules_of(docs, "Role", "kafka-eventing-controller")
    assert {("apps", "deployments", v) for v in ("create", "update", "delete")} <= local
    assert {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")} <= local
    assert {("", r, v) for r in ("secrets", "configmaps") for v in ("get", "list", "watch")} <= local
    assert not {v for _, r, v in local if r == "secrets"} - {"get", "list", "watch"}
    # KEDA objects even with KEDA off (this preset): disabling it must let the controller delete them.
    assert one(docs, "ConfigMap", "config-kafka")["data"]["dispatcher.keda.enabled"] == "false"
    assert {("keda.sh", r, v) for r in ("scaledobjects", "triggerauthentications")
            for v in ("get", "create", "patch", "delete")} == {k for k in local if k[0] == "keda.sh"}
    assert rules_of(docs, "ClusterRole", "kafka-eventing-receiver") == {
        (g, r, v) for g, r in (("messaging.knative.dev", "kafkachannels"), ("eventing.knative.dev", "brokers"))
        for v in ("get", "list", "watch")}
    dispatcher = rules_of(docs, "ClusterRole", "kafka-eventing-dispatcher")
    assert ("messaging.knative.dev", "kafkachannels/status", "patch") in dispatcher
    assert ("messaging.knative.dev", "kafkachannels", "update") not in dispatcher
    # Brokers: the controller owns their status and finalizer and reads Trigger/Broker config; a Broker's
    # dispatcher only reads its Broker and Triggers.
    for sub in ("brokers/status", "brokers/finalizers", "triggers/status"):
        assert ("eventing.knative.dev", sub, "patch") in controller
    assert {("eventing.knative.dev", r, "watch") for r in ("brokers", "triggers")} <= controller
    assert {v for g, r, v in controller if r == "configmaps"} == {"get"}
    assert {(r, v) for g, r, v in dispatcher if g == "eventing.knative.dev"} == {
        (r, v) for r in ("brokers", "triggers") for v in ("get", "list", "watch")}
    # Cluster-wide Secret reads only when asked for, and then only read verbs.
    wide = rules_of(helm(sets=("controller.rbac.clusterWideSecretRead=true",)), "ClusterRole",
                    "kafka-eventing-controller")
    assert {v for g, r, v in wide if r == "secrets"} == {"get", "list", "watch"}
    assert not {r for _, r, _ in rules_of(docs, "ClusterRole", "kafka-eventing-controller")} & {"secrets"}


@pytest.mark.parametrize("name", SCENARIOS)
def test_labels(name: str) -> None:
    docs = scenario(name)
    for d in docs:
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "kafka-eventing", d["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "kafka-eventing"
        assert labels["helm.sh/chart"] == "kafka-eventing-" + yaml.safe_load((CHART / "Chart.yaml").read_text())[
            "version"]
    deployments = of_kind(docs, "Deployment")
    for dep in deployments:
        selector = dep["spec"]["selector"]["matchLabels"]
        assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        assert "app.kubernetes.io/version" not in selector  # selectors are immutable across upgrades
    for svc in of_kind(docs, "Service"):
        matches = [d for d in deployments
                   if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, svc["metadata"]["name"]


def test_common_labels_reach_every_object() -> None:
    docs = helm("ci/all-optins-values.yaml", sets=("commonLabels.team=eventing",), apis=OPTIONAL_APIS)
    assert all(d["metadata"]["labels"]["team"] == "eventing" for d in docs)


def test_image_references() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    docs = helm()
    images = {c["name"]: c["image"] for _, s in pod_specs(docs) for c in s["containers"] if c["name"] != "send-event"}
    assert images == {"receiver": f"ghcr.io/kafka-eventing/kafka-eventing-receiver:{app_version}",
                      "controller": f"ghcr.io/kafka-eventing/kafka-eventing-controller:{app_version}"}
    config = one(docs, "ConfigMap", "kafka-eventing-config")["data"]
    assert config["KE_DISPATCHER_IMAGE"] == f"ghcr.io/kafka-eventing/kafka-eventing-dispatcher:{app_version}"
    docs = helm(sets=("image.tag=abc1234", "image.registry=registry.local:5000/ke"))
    images = {c["image"] for _, s in pod_specs(docs) for c in s["containers"] if c["name"] != "send-event"}
    assert images == {"registry.local:5000/ke/kafka-eventing-receiver:abc1234",
                      "registry.local:5000/ke/kafka-eventing-controller:abc1234"}
    assert all(not i.endswith(":latest") for i in images)
    # The reprocessing jobs' spark image follows the same registry and tag rules.
    for sets, expected in ((REPROCESS_ON, f"ghcr.io/kafka-eventing/kafka-eventing-spark:{app_version}"),
                           ((*REPROCESS_ON, "image.tag=abc1234", "image.registry=registry.local:5000/ke"),
                            "registry.local:5000/ke/kafka-eventing-spark:abc1234")):
        docs = helm(sets=sets)
        assert {c["image"] for k in ("CronJob", "Job") for d in of_kind(docs, k) for c in pod_spec(d)["containers"]} \
            == {expected}


# ---------------------------------------------------------------------------------------------------------------
# settings and connection presets


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
    assert config["KE_BOOTSTRAP_SERVERS"] == values["kafka"]["bootstrapServers"]
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


def test_kustomize_base_sets_the_images_once_at_the_chart_app_version() -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    base = yaml.safe_load((KUSTOMIZE / "base" / "kustomization.yaml").read_text())
    assert {i["name"]: i["newTag"] for i in base["images"]} == {
        f"kafka-eventing-{role}": version for role in ("receiver", "controller", "dispatcher")}
    for overlay in PRESETS.values():
        images = {c["image"] for d in of_kind(kustomize(overlay), "Deployment")
                  for c in d["spec"]["template"]["spec"]["containers"]}
        assert images and all(i.endswith(f":{version}") for i in images), images


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
    assert len(of_kind(with_apis, "ServiceMonitor")) == 2
    assert one(with_apis, "ConfigMap", "config-kafka")["data"]["dispatcher.keda.enabled"] == "true"
    assert len(of_kind(with_apis, "PodDisruptionBudget")) == 2
    assert len(of_kind(with_apis, "NetworkPolicy")) == 3
    (hpa,) = of_kind(with_apis, "HorizontalPodAutoscaler")
    assert "replicas" not in one(with_apis, "Deployment", "kafka-eventing-receiver")["spec"]  # the HPA owns it
    assert hpa["spec"]["scaleTargetRef"]["name"] == "kafka-eventing-receiver"
    # Off by default.
    kinds = {d["kind"] for d in helm(apis=OPTIONAL_APIS)}
    assert not kinds & {"ServiceMonitor", "PodDisruptionBudget", "NetworkPolicy", "HorizontalPodAutoscaler",
                        "CronJob", "Job"}


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


# ---------------------------------------------------------------------------------------------------------------
# receiver shutdown


def test_receiver_grace_period_outlasts_gunicorns_graceful_timeout() -> None:
    from kafka_eventing.receiver import gunicorn_conf

    # gunicorn's graceful timeout with the default produce timeout (the ConfigMap does not override it).
    graceful = int(Settings().produce_timeout_seconds * 2 + 5)
    assert graceful == 25
    assert "KE_PRODUCE_TIMEOUT_SECONDS" not in one(helm(), "ConfigMap", "kafka-eventing-config")["data"]
    if "KE_PRODUCE_TIMEOUT_SECONDS" not in os.environ:
        assert gunicorn_conf.graceful_timeout == graceful
    for docs in [helm(), *(scenario(n) for n in PRESETS)]:
        grace = pod_spec(one(docs, "Deployment", "kafka-eventing-receiver"))["terminationGracePeriodSeconds"]
        assert grace == 30 and grace > graceful
    for overlay in PRESETS.values():
        assert pod_spec(one(kustomize(overlay), "Deployment", "kafka-eventing-receiver"))[
            "terminationGracePeriodSeconds"] == 30
    docs = helm(sets=("receiver.terminationGracePeriodSeconds=45",))
    assert pod_spec(one(docs, "Deployment", "kafka-eventing-receiver"))["terminationGracePeriodSeconds"] == 45
    # A grace period the receiver cannot finish in is refused at install.
    proc = run([tool("helm"), "template", RELEASE, str(CHART), "--set", "receiver.terminationGracePeriodSeconds=20"],
               ok=False)
    assert proc.returncode != 0 and "terminationGracePeriodSeconds" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# reprocessing jobs


def job_env(docs: tuple[dict[str, Any], ...], doc: dict[str, Any]) -> dict[str, Any]:
    by_name = {d["metadata"]["name"]: d for d in of_kind(docs, "ConfigMap")}
    (container,) = pod_spec(doc)["containers"]
    env: dict[str, Any] = {}
    for source in container["envFrom"]:
        env.update(by_name[source["configMapRef"]["name"]]["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


@pytest.mark.parametrize("name", ["ci/all-optins-values.yaml", "ci/strimzi-sasl-scram-values.yaml"])
def test_reprocess_jobs(name: str) -> None:
    from kafka_eventing.reprocess.cli import build_parser

    # all-optins enables the jobs itself (without a connection Secret); strimzi gets them switched on here.
    docs = scenario(name) if "all-optins" in name else helm(name, sets=REPROCESS_ON)
    values = merged_values(name)
    (cron,) = of_kind(docs, "CronJob")
    (job,) = of_kind(docs, "Job")
    assert cron["metadata"]["name"] == "kafka-eventing-archive"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"  # two runs must not share a checkpoint
    assert cron["spec"]["schedule"] == values["reprocess"]["archive"]["schedule"]
    (sa,) = [d for d in of_kind(docs, "ServiceAccount") if d["metadata"]["name"] == "kafka-eventing-reprocess"]
    secret_name = one(docs, "ConfigMap", "config-kafka")["data"]["auth.secret.ref.name"]
    assert bool(secret_name) == ("strimzi" in name)
    for doc, job_name in ((cron, "archive"), (job, "replay")):
        spec = pod_spec(doc)
        (c,) = spec["containers"]
        assert c["image"].endswith("/kafka-eventing-spark:" + yaml.safe_load((CHART / "Chart.yaml").read_text())[
            "appVersion"])
        assert "command" not in c  # the image's entrypoint is `python -m kafka_eventing.reprocess`
        args = build_parser().parse_args(c["args"])  # the real CLI accepts them
        assert args.job == job_name
        assert spec["restartPolicy"] == "Never"
        assert spec["serviceAccountName"] == sa["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsUser"] == 185 and spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = c["securityContext"]
        assert sc["runAsUser"] == 185 and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        # Settings.from_env must accept the env, and read the connection Secret where it is mounted.
        env = job_env(docs, doc)
        assert not {k for k in env if k.startswith("KE_")} - SETTINGS_ENV
        settings = Settings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
        assert settings.bootstrap_servers == values["kafka"]["bootstrapServers"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        if secret_name:
            assert volumes[mounts[str(settings.kafka_secret_dir)]]["secret"]["secretName"] == secret_name
        else:
            assert settings.kafka_secret_dir is None and "kafka-secret" not in volumes
        assert "emptyDir" in volumes[mounts["/tmp"]]  # Spark's scratch space on a read-only root filesystem
    # No Kubernetes API access: nothing binds a role to the jobs' ServiceAccount.
    for b in of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding"):
        assert all(s["name"] != sa["metadata"]["name"] for s in b["subjects"])


def test_reprocess_job_name_follows_its_spec() -> None:
    name = of_kind(helm(sets=REPROCESS_ON), "Job")[0]["metadata"]["name"]
    assert re.fullmatch(r"kafka-eventing-replay-[0-9a-f]{8}", name)
    # Same spec, same Job: an upgrade that changes other settings does not replace (and re-run) it, and the pod
    # template carries no chart-version labels that a chart upgrade would change.
    assert of_kind(helm(sets=(*REPROCESS_ON, "logLevel=DEBUG")), "Job")[0]["metadata"]["name"] == name
    template_labels = of_kind(helm(sets=REPROCESS_ON), "Job")[0]["spec"]["template"]["metadata"]["labels"]
    assert "helm.sh/chart" not in template_labels and "app.kubernetes.io/version" not in template_labels
    # A changed spec is a new Job: the pod template of an existing Job is immutable.
    other = helm(sets=(*REPROCESS_ON, "reprocess.replay.args={replay,--topic,u,--to-topic,u,--dry-run}"))
    assert of_kind(other, "Job")[0]["metadata"]["name"] != name
    other = helm(sets=(*REPROCESS_ON, "image.tag=abc1234"))
    assert of_kind(other, "Job")[0]["metadata"]["name"] != name


@pytest.mark.parametrize(("sets", "message"), [
    (("reprocess.archive.enabled=true",), "reprocess.archive.args is required"),
    (("reprocess.replay.enabled=true",), "reprocess.replay.args is required"),
    (("reprocess.replay.enabled=true", "reprocess.replay.args={archive,--topic,t}"), "schema"),
    (("reprocess.archive.enabled=true", "reprocess.archive.args={replay,--topic,t}"), "schema"),
    (("reprocess.archive.concurrencyPolicy=Allow",), "schema"),
])
def test_reprocess_values_are_checked(sets: tuple[str, ...], message: str) -> None:
    args = [tool("helm"), "template", RELEASE, str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = run(args, ok=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_sparkapplication_example() -> None:
    from kafka_eventing.reprocess.cli import build_parser

    (app,) = parse((CHART / "examples" / "sparkapplication-archive.yaml").read_text())
    assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication")
    spec = app["spec"]
    assert spec["type"] == "Python" and spec["mode"] == "cluster"
    main = spec["mainApplicationFile"].split("/site-packages/", 1)[1]
    assert (ROOT / "src" / main).is_file()
    args = build_parser().parse_args(spec["arguments"])
    assert args.job == "archive" and args.master.startswith("k8s://")
    docs = helm("values-strimzi.yaml")
    config = one(docs, "ConfigMap", "kafka-eventing-config")["metadata"]["name"]
    secret = one(docs, "ConfigMap", "config-kafka")["data"]["auth.secret.ref.name"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for role in ("driver", "executor"):
        pod = spec[role]
        assert pod["envFrom"] == [{"configMapRef": {"name": config}}]
        secret_dir = {e["name"]: e["value"] for e in pod["env"]}["KE_KAFKA_SECRET_DIR"]
        mounts = {m["mountPath"]: m["name"] for m in pod["volumeMounts"]}
        assert volumes[mounts[secret_dir]]["secret"]["secretName"] == secret
        assert "emptyDir" in volumes[mounts["/tmp"]]
        assert pod["podSecurityContext"]["runAsUser"] == 185 and pod["podSecurityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["capabilities"] == {"drop": ["ALL"]}


# ---------------------------------------------------------------------------------------------------------------
# schemas


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    crd = yaml.safe_load(CANONICAL_CRD.read_text())
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    return {(f"{group}/{v['name']}", kind): jsonschema.Draft7Validator(v["schema"]["openAPIV3Schema"])
            for v in crd["spec"]["versions"]}


@functools.cache
def k8s_registry() -> Registry:
    defs = kubernetes_validate.utils.schema_contents(f"kubernetes-json-schema/{SCHEMA_DIR}/_definitions.json",
                                                     K8S_VERSION)
    return Resource.from_contents(defs) @ Registry()


@functools.cache
def k8s_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's bundled strict schemas, with the shared definitions loaded once (its own
    ``validate()`` re-reads them for every object, which made this the slowest part of `make lint-charts`)."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/{SCHEMA_DIR}/{kind.lower()}-{group_version}.json", K8S_VERSION)
    return jsonschema.Draft202012Validator(schema, registry=Resource.from_contents(schema) @ k8s_registry())


def validate(doc: dict[str, Any]) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in crd_validators():
        crd_validators()[key].validate(doc)
        return
    if doc["kind"] in NO_OFFLINE_SCHEMA:
        spec = doc["spec"]
        assert spec["selector"]["matchLabels"] and spec["endpoints"], doc["metadata"]["name"]
        return
    k8s_validator(*key).validate(doc)


RENDERS = [f"helm:{n}" for n in SCENARIOS] + [f"kustomize:{p.name}" for p in sorted(
    (KUSTOMIZE / "overlays").iterdir())]


@pytest.mark.parametrize("render", RENDERS)
def test_renders_validate_against_kubernetes_and_crd_schemas(render: str) -> None:
    source, name = render.split(":", 1)
    docs = scenario(name) if source == "helm" else kustomize(name)
    assert docs
    for d in docs:
        try:
            validate(d)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{render}: {d['kind']}/{d['metadata']['name']}: {str(exc).splitlines()[0]}")


def test_schema_validation_catches_errors() -> None:
    dep = copy.deepcopy(one(helm(), "Deployment", "kafka-eventing-receiver"))
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = {"not": "a string"}
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        validate(dep)
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    dep["spec"]["template"]["spec"]["containers"][0]["bogus"] = 1
    with pytest.raises(jsonschema.ValidationError, match="bogus"):
        validate(dep)
    channel = copy.deepcopy(of_kind(helm(), "KafkaChannel")[0])
    channel["spec"]["numPartitions"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate(channel)


# ---------------------------------------------------------------------------------------------------------------
# Helm and Kustomize install the same thing


def strip_hash(name: str) -> str:
    return re.sub(r"-[a-z0-9]{10}$", "", name)


def comparable(docs: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for d in docs:
        if d["kind"] == "Namespace":  # Helm users get it from --create-namespace
            continue
        name = strip_hash(d["metadata"]["name"]) if d["kind"] == "ConfigMap" else d["metadata"]["name"]
        out[(d["kind"], name, d["metadata"].get("namespace", ""))] = d
    return out


def key_fields(doc: dict[str, Any], docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    kind = doc["kind"]
    if kind == "Deployment":
        spec = doc["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        return {
            "image": c["image"], "command": c["command"], "env": container_env(docs, doc["metadata"]["name"]),
            "ports": c["ports"], "securityContext": c["securityContext"], "podSecurityContext": spec["securityContext"],
            "serviceAccountName": spec["serviceAccountName"],
            "volumes": sorted(spec["volumes"], key=lambda v: v["name"]),
            "mounts": sorted(c["volumeMounts"], key=lambda m: m["name"]),
            "probes": (c.get("livenessProbe"), c.get("readinessProbe")),
            "terminationGracePeriodSeconds": spec.get("terminationGracePeriodSeconds"),
            "selector": doc["spec"]["selector"]["matchLabels"],
        }
    if kind in ("Role", "ClusterRole"):
        return {"rules": sorted(doc["rules"], key=lambda r: json.dumps(r, sort_keys=True))}
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        return {"roleRef": doc["roleRef"], "subjects": doc["subjects"]}
    if kind == "ConfigMap":
        return {"data": doc["data"]}
    if kind == "Service":
        return {"ports": doc["spec"]["ports"], "selector": doc["spec"]["selector"]}
    if kind == "ServiceAccount":
        return {"annotations": doc["metadata"].get("annotations", {})}
    if kind == "CustomResourceDefinition":
        return {"spec": doc["spec"]}
    return {"spec": doc.get("spec")}


@pytest.mark.parametrize(("preset", "overlay"), list(PRESETS.items()))
def test_helm_and_kustomize_render_the_same_objects(preset: str, overlay: str) -> None:
    # Test hooks run only on `helm test`; Kustomize has no equivalent.
    helm_docs = tuple(d for d in scenario(preset) if "helm.sh/hook" not in d["metadata"].get("annotations", {}))
    kust_docs = kustomize(overlay)
    h, k = comparable(helm_docs), comparable(kust_docs)
    assert sorted(h) == sorted(k)
    for key in h:
        assert key_fields(h[key], helm_docs) == key_fields(k[key], kust_docs), key


def test_kustomize_optin_components_match_the_chart_optins(tmp_path: Path) -> None:
    # An overlay of the user's own (outside the repo) adding the opt-in components, as docs/install.md shows.
    rel = os.path.relpath(KUSTOMIZE, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/strimzi"],
        "components": [f"{rel}/components/{c}" for c in ("pdb", "networkpolicy", "servicemonitor")],
    }))
    kust_docs = parse(run([tool("kustomize"), "build", str(tmp_path)]).stdout)
    for d in kust_docs:
        validate(d)
    helm_docs = helm("values-strimzi.yaml", sets=("receiver.pdb.enabled=true", "controller.pdb.enabled=true",
                                                  "networkPolicy.enabled=true", "metrics.serviceMonitor.enabled=true"),
                     apis=OPTIONAL_APIS)
    h, k = comparable(helm_docs), comparable(kust_docs)
    optin = {key for key in h if key[0] in ("PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor")}
    assert len(optin) == 7 and optin <= set(k)
    for key in optin:
        hs, ks = copy.deepcopy(h[key]["spec"]), copy.deepcopy(k[key]["spec"])
        hs.pop("namespaceSelector", None)  # Helm pins the ServiceMonitor to the release namespace explicitly
        assert hs == ks, key


def test_kustomize_keda_merge_matches_the_chart(tmp_path: Path) -> None:
    # The overlay docs/install.md shows for turning KEDA on, against the chart's values for the same.
    rel = os.path.relpath(KUSTOMIZE, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/strimzi"],
        "configMapGenerator": [{"name": "config-kafka", "behavior": "merge",
                                "literals": ["dispatcher.keda.enabled=true", "dispatcher.keda.maxReplicas=8"]}],
    }))
    kust = one(parse(run([tool("kustomize"), "build", str(tmp_path)]).stdout), "ConfigMap", "config-kafka")
    chart = one(helm("values-strimzi.yaml", sets=("dispatcher.keda.enabled=true", "dispatcher.keda.maxReplicas=8")),
                "ConfigMap", "config-kafka")
    assert kust["data"] == chart["data"]
    assert {k: v for k, v in kust["data"].items() if k.startswith("dispatcher.keda.")} == {
        "dispatcher.keda.enabled": "true", "dispatcher.keda.minReplicas": "1", "dispatcher.keda.maxReplicas": "8",
        "dispatcher.keda.lagThreshold": "100", "dispatcher.keda.pollingInterval": "30",
        "dispatcher.keda.cooldownPeriod": "300"}


# ---------------------------------------------------------------------------------------------------------------
# Kustomize layout, manifests, GitOps


@pytest.mark.parametrize("overlay", sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir()))
def test_overlays_are_thin(overlay: str) -> None:
    root = KUSTOMIZE / "overlays" / overlay
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert k["resources"] == ["../../base"]
    assert "vars" not in k and "images" not in k, "images are set once, in the base"
    # The one patch an overlay may carry: the pods' cloud identity on the ServiceAccounts (MSK IAM).
    assert all(p["target"] == {"kind": "ServiceAccount", "name": p["target"]["name"]} for p in k.get("patches") or ())
    (gen,) = k["configMapGenerator"]
    assert gen == {"name": "kafka-eventing-config", "behavior": "merge", "envs": ["params.env"]}
    params = [ln for ln in (root / "params.env").read_text().splitlines() if ln and not ln.startswith("#")]
    assert params and {ln.split("=", 1)[0] for ln in params} <= SETTINGS_ENV
    assert (root / "params.env").read_text().startswith("#")


def test_kustomize_uses_replacements_not_vars() -> None:
    for f in KUSTOMIZE.rglob("kustomization.yaml"):
        assert "vars" not in yaml.safe_load(f.read_text()), f
    assert yaml.safe_load((KUSTOMIZE / "base" / "kustomization.yaml").read_text())["replacements"]
    for c in (KUSTOMIZE / "components").iterdir():
        assert yaml.safe_load((c / "kustomization.yaml").read_text())["kind"] == "Component"


def test_make_manifests_renders_every_overlay(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run([str(ROOT / "hack" / "manifests.sh")], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    for overlay in (KUSTOMIZE / "overlays").iterdir():
        text = (tmp_path / f"install-{overlay.name}.yaml").read_text()
        assert text.startswith("# generated, do not edit")
        assert parse(text) == kustomize(overlay.name)


def expand(template: Any, params: dict[str, str]) -> Any:
    """Argo CD's goTemplate substitution of `{{.key}}`, failing on unknown keys like missingkey=error does."""
    if isinstance(template, dict):
        return {k: expand(v, params) for k, v in template.items()}
    if isinstance(template, list):
        return [expand(v, params) for v in template]
    if isinstance(template, str):
        return re.sub(r"\{\{\s*\.(\w+)\s*\}\}", lambda m: params[m.group(1)], template)
    return template


@pytest.mark.parametrize("variant", ["helm", "kustomize"])
def test_argocd_applicationset_covers_every_provider(variant: str) -> None:
    (appset,) = parse((ROOT / "gitops" / "argocd" / f"applicationset-{variant}.yaml").read_text())
    spec = appset["spec"]
    assert appset["kind"] == "ApplicationSet"
    assert spec["goTemplate"] is True and spec["goTemplateOptions"] == ["missingkey=error"]
    (matrix,) = spec["generators"]
    repos, clusters = (g["list"]["elements"] for g in matrix["matrix"]["generators"])
    assert len(repos) == 1 and {"repoURL", "revision"} == set(repos[0])
    apps = [expand(spec["template"], {**repos[0], **c}) for c in clusters]
    assert len({a["spec"]["destination"]["name"] for a in apps}) == len(apps), "two providers on one cluster"
    assert len({a["metadata"]["name"] for a in apps}) == len(apps)
    if variant == "helm":
        files = {v for a in apps for v in a["spec"]["source"]["helm"]["valueFiles"]}
        assert files == set(PRESETS)
        assert all(a["spec"]["source"]["path"] == "charts/kafka-eventing" for a in apps)
    else:
        paths = {a["spec"]["source"]["path"] for a in apps}
        assert paths == {f"kustomize/overlays/{p.name}" for p in (KUSTOMIZE / "overlays").iterdir()}
    for a in apps:
        source = a["spec"]["source"]
        assert (ROOT / source["path"]).is_dir()
        assert source["repoURL"] == repos[0]["repoURL"] and source["targetRevision"] == repos[0]["revision"]


@pytest.mark.parametrize("render", ["helm", "kustomize"])
def test_controller_watches_the_receiver_by_its_real_names(render: str) -> None:
    # ReceiverDeploymentReady looks the Deployment up by KE_RECEIVER_DEPLOYMENT and channels' ExternalName
    # Services point at KE_RECEIVER_SERVICE: both must name objects the install really creates.
    docs = scenario("ci/default-values.yaml") if render == "helm" else kustomize("strimzi")
    config = next(d for d in of_kind(docs, "ConfigMap") if "KE_RECEIVER_SERVICE" in (d.get("data") or {}))
    deployments = {d["metadata"]["name"] for d in of_kind(docs, "Deployment")}
    services = {d["metadata"]["name"] for d in of_kind(docs, "Service")}
    assert config["data"]["KE_RECEIVER_DEPLOYMENT"] in deployments
    assert config["data"]["KE_RECEIVER_SERVICE"] in services
    receiver = one(docs, "Deployment", config["data"]["KE_RECEIVER_DEPLOYMENT"])
    assert "receiver" in receiver["metadata"]["name"]
