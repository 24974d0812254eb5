"""Restricted security contexts, least-privilege RBAC, labels and image references in every render."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from .render import (
    CHART,
    NAMESPACE,
    OPTIONAL_APIS,
    RELEASE,
    REPROCESS_ON,
    SCENARIOS,
    helm,
    of_kind,
    one,
    pod_spec,
    pod_specs,
    scenario,
)


@pytest.mark.parametrize("name", SCENARIOS)
def test_pods_run_as_the_images_uid(name: str) -> None:
    # Pod Security and RBAC rules over every render: test_pod_security_and_rbac.py.
    specs = pod_specs(scenario(name))
    assert {n for n, _ in specs} >= {"kafka-eventing-receiver", "kafka-eventing-controller"}
    for pod, spec in specs:
        # Numeric, so the kubelet can verify non-root: the spark image runs as Spark's UID 185, the others as 65532.
        uid = 185 if "kafka-eventing-spark:" in spec["containers"][0]["image"] else 65532
        assert spec["securityContext"]["runAsUser"] == uid, pod
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"].get("runAsUser", uid) == uid, (pod, c["name"])


@pytest.mark.parametrize("name", SCENARIOS)
def test_rbac_bindings_stay_inside_the_render(name: str) -> None:
    docs = scenario(name)
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
    # Secrets: read here, and written only here — the dispatchers' copies of what sources and Broker configs name
    # in their own namespaces (controller/resources.py secret_copy_name).
    assert {v for _, r, v in local if r == "secrets"} == {"get", "list", "watch", "create", "update", "delete"}
    assert not {v for _, r, v in controller if r == "secrets"}
    # KEDA objects even with KEDA off (this preset): disabling it must let the controller delete them.
    assert one(docs, "ConfigMap", "config-kafka")["data"]["dispatcher.keda.enabled"] == "false"
    assert {("keda.sh", r, v) for r in ("scaledobjects", "triggerauthentications")
            for v in ("get", "create", "patch", "delete")} == {k for k in local if k[0] == "keda.sh"}
    assert rules_of(docs, "ClusterRole", "kafka-eventing-receiver") == {
        (g, r, v) for g, r in (("messaging.knative.dev", "kafkachannels"), ("eventing.knative.dev", "brokers"),
                               ("eventing.knative.dev", "kafkasinks"))
        for v in ("get", "list", "watch")}
    # The connection Secret a Broker or KafkaSink names: read by name, in the release namespace only.
    assert rules_of(docs, "Role", "kafka-eventing-receiver") == {("", "secrets", "get")}
    # KafkaSinks: the controller reads them and writes their status, nothing else (no finalizer).
    assert {(r, v) for g, r, v in controller if "kafkasinks" in r} == {
        ("kafkasinks", v) for v in ("get", "list", "watch")} | {
        ("kafkasinks/status", v) for v in ("get", "update", "patch")}
    dispatcher = rules_of(docs, "ClusterRole", "kafka-eventing-dispatcher")
    assert ("messaging.knative.dev", "kafkachannels/status", "patch") in dispatcher
    assert ("messaging.knative.dev", "kafkachannels", "update") not in dispatcher
    # Brokers: the controller owns their status and finalizer and reads Trigger/Broker config; a Broker's
    # dispatcher reads its Broker and Triggers and patches Trigger status (its ConsumerGroupReady condition).
    for sub in ("brokers/status", "brokers/finalizers", "triggers/status"):
        assert ("eventing.knative.dev", sub, "patch") in controller
    assert {("eventing.knative.dev", r, "watch") for r in ("brokers", "triggers")} <= controller
    # A Broker's ConfigMap in any namespace: read and watched by name, never written.
    assert {v for g, r, v in controller if r == "configmaps"} == {"get", "list", "watch"}
    assert {(r, v) for g, r, v in dispatcher if g == "eventing.knative.dev"} == {
        (r, v) for r in ("brokers", "triggers") for v in ("get", "list", "watch")} | {
        ("triggers/status", v) for v in ("get", "patch")}
    # KafkaSources: the controller owns their status and finalizer; their dispatcher only reads them.
    for sub in ("kafkasources/status", "kafkasources/finalizers"):
        assert ("sources.knative.dev", sub, "patch") in controller
    assert ("sources.knative.dev", "kafkasources", "watch") in controller
    assert {(r, v) for g, r, v in dispatcher if g == "sources.knative.dev"} == {
        ("kafkasources", v) for v in ("get", "list", "watch")}
    # Cluster-wide Secret reads only when asked for, and then only read verbs.
    wide = rules_of(helm(sets=("controller.rbac.clusterWideSecretRead=true",)), "ClusterRole",
                    "kafka-eventing-controller")
    assert {v for g, r, v in wide if r == "secrets"} == {"get", "list", "watch"}
    assert not {r for _, r, _ in rules_of(docs, "ClusterRole", "kafka-eventing-controller")} & {"secrets"}
    wide = rules_of(helm(sets=("receiver.rbac.clusterWideSecretRead=true",)), "ClusterRole", "kafka-eventing-receiver")
    assert {v for g, r, v in wide if r == "secrets"} == {"get"}


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
