"""Security of what users install, over every render (each chart ``ci/`` scenario and provider preset, and each
Kustomize overlay) and over the dispatcher Deployment the controller creates at run time:

- RBAC: no wildcards, no escalation verbs, no aggregation; Secrets readable only inside the release namespace;
- Pod Security "restricted" (the Kubernetes profile, container settings overriding the pod's) on every pod,
  plus a read-only root filesystem.

Renders come from the real ``helm`` / ``kustomize`` binaries (tests/chart/render.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from kafka_eventing.controller.resources import ChannelRef, DispatcherConfig, dispatcher_deployment
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import TOKEN_ROLE

from .render import (
    ESCALATING_VERBS,
    NAMESPACE,
    RENDERS,
    container_env,
    helm,
    of_kind,
    rbac_problems,
    render,
    restricted_violations,
)

POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}


def pods(docs: Iterable[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind/name, pod spec) of every object that makes pods."""
    for d in docs:
        if d["kind"] not in POD_KINDS:
            continue
        spec = d["spec"]
        if d["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        yield f"{d['kind']}/{d['metadata']['name']}", (spec if d["kind"] == "Pod" else spec["template"]["spec"])


@pytest.mark.parametrize("name", RENDERS)
def test_every_pod_is_restricted(name: str) -> None:
    docs = render(name)
    found = dict(pods(docs))
    # The receiver and the controller are in every render; a render that made no pods would check nothing.
    assert {"Deployment/kafka-eventing-receiver", "Deployment/kafka-eventing-controller"} <= set(found), set(found)
    problems = {pod: v for pod, spec in found.items() if (v := restricted_violations(spec))}
    assert not problems, problems


@pytest.mark.parametrize("secret", [None, "kafka-auth"])
def test_the_controllers_dispatcher_pods_are_restricted(secret: str | None) -> None:
    """The dispatcher Deployments are no render: the controller makes them, one per channel."""
    deployment = dispatcher_deployment(ChannelRef("shop", "orders", "uid-1"), Settings(),
                                       DispatcherConfig(replicas=1, checksum="c", secret_name=secret), 3)
    [(_, spec)] = list(pods([deployment]))
    assert restricted_violations(spec) == []


def test_the_checks_catch_violations() -> None:
    """Each rule can fail: a compliant spec with one thing broken at a time."""
    base = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {
                "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]}}}],
            "volumes": [{"name": "tmp", "emptyDir": {}}]}
    assert restricted_violations(base) == []
    broken: list[tuple[str, dict[str, Any]]] = [
        ("hostNetwork", {"hostNetwork": True}),
        ("volume", {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}),
        ("runAsNonRoot", {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}),
        ("seccompProfile", {"securityContext": {"runAsNonRoot": True}}),
    ]
    container_broken = [
        ("allowPrivilegeEscalation", {"allowPrivilegeEscalation": True}),
        ("root filesystem", {"readOnlyRootFilesystem": False}),
        ("drop ALL", {"capabilities": {"drop": ["NET_RAW"]}}),
        ("adds", {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}),
        ("privileged", {"privileged": True}),
        ("runAsUser=0", {"runAsUser": 0}),
        ("runAsNonRoot", {"runAsNonRoot": False}),
        ("seccompProfile", {"seccompProfile": {"type": "Unconfined"}}),
    ]
    for word, change in broken:
        assert any(word in v for v in restricted_violations({**base, **change})), word
    for word, change in container_broken:
        container = {**base["containers"][0], "securityContext": {**base["containers"][0]["securityContext"],
                                                                   **change}}
        assert any(word in v for v in restricted_violations({**base, "containers": [container]})), word


@pytest.mark.parametrize("name", RENDERS)
def test_rbac_has_no_wildcards_and_no_cluster_wide_secret_read(name: str) -> None:
    docs = render(name)
    assert of_kind(docs, "ClusterRole") and of_kind(docs, "Role"), "a render without RBAC would check nothing"
    assert rbac_problems(docs) == []


def test_the_namespaced_broker_class_binds_and_writes_only_what_the_checks_allow() -> None:
    """broker.namespaced.enabled: bind on the chart's data-plane ClusterRoles by name, Secret copies created or
    updated by name and never read (tests/chart/test_namespaced_brokers.py checks each rule)."""
    for sets in (("broker.namespaced.enabled=true",),
                 ("broker.namespaced.enabled=true", "kafka.existingSecret=k", "receiver.tls.enabled=true")):
        assert rbac_problems(helm(sets=sets)) == []


def test_rbac_checks_catch_violations() -> None:
    secrets = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}

    def role(kind: str, *rules: dict[str, Any], ns: str = NAMESPACE) -> dict[str, Any]:
        meta = {"name": "r"} if kind == "ClusterRole" else {"name": "r", "namespace": ns}
        return {"kind": kind, "metadata": meta, "rules": list(rules)}

    def binding(kind: str, ref_kind: str, ns: str = NAMESPACE) -> dict[str, Any]:
        meta = {"name": "b"} if kind == "ClusterRoleBinding" else {"name": "b", "namespace": ns}
        return {"kind": kind, "metadata": meta, "roleRef": {"kind": ref_kind, "name": "r"}}

    assert rbac_problems([role("Role", secrets), binding("RoleBinding", "Role")]) == []
    assert rbac_problems([role("ClusterRole", secrets), binding("RoleBinding", "ClusterRole")]) == []
    cases = [
        [role("ClusterRole", secrets), binding("ClusterRoleBinding", "ClusterRole")],
        [role("ClusterRole", secrets), binding("RoleBinding", "ClusterRole", ns="other")],
        [role("Role", {**secrets, "verbs": ["update"]})],
        [role("Role", {**secrets, "verbs": ["*"]})],
        [role("ClusterRole", {"apiGroups": ["apps"], "resources": ["*"], "verbs": ["get"]})],
        [role("ClusterRole", {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                              "verbs": ["bind"]})],
        [role("ClusterRole", {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                              "resourceNames": [TOKEN_ROLE], "verbs": ["escalate"]})],
        [role("ClusterRole", {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                              "resourceNames": ["admin"], "verbs": ["escalate", "bind"]})],
        [{**role("ClusterRole"), "aggregationRule": {"clusterRoleSelectors": [{}]}}],
        [role("Role", {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]})],
        [role("ClusterRole", {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"],
                              "resourceNames": ["kafka-channel-dispatcher"]})],
        # bind on a ClusterRole that is not the data plane's; Secret writes of the controller beyond its copies
        [{**role("ClusterRole"), "metadata": {"name": "x-receiver"}},
         role("ClusterRole", {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                              "resourceNames": ["x-receiver", "cluster-admin"], "verbs": ["bind"]})],
        [{**role("ClusterRole", {**secrets, "verbs": ["update"]}), "metadata": {"name": "x-controller"}}],
        [{**role("ClusterRole", {**secrets, "verbs": ["create", "delete"]}), "metadata": {"name": "x-controller"}}],
    ]
    for docs in cases:
        assert rbac_problems(docs), docs


@pytest.mark.parametrize("value", ["controller.rbac.clusterWideSecretRead", "receiver.rbac.clusterWideSecretRead"])
def test_the_opt_in_cluster_wide_secret_read_is_what_the_check_flags(value: str) -> None:
    """The chart's ways to read Secrets everywhere (off in every scenario) are seen by the check on a render."""
    problems = rbac_problems(helm(sets=(f"{value}=true",)))
    assert any("every namespace" in p for p in problems), problems


@pytest.mark.parametrize("component", ["controller", "receiver"])
def test_secret_namespaces_grant_get_there_and_nothing_else(component: str) -> None:
    """``<component>.rbac.secretNamespaces``: Secret `get` in exactly the listed namespaces (the check sees each)."""
    docs = helm(sets=(f"{component}.rbac.secretNamespaces={{team-a,team-b}}",))
    problems = rbac_problems(docs)
    assert sorted(p for p in problems if "readable" in p) == [
        f"RoleBinding/kafka-eventing-{component}-secrets: Secrets readable in team-a",
        f"RoleBinding/kafka-eventing-{component}-secrets: Secrets readable in team-b"], problems
    roles = [d for d in of_kind(docs, "Role") if d["metadata"]["name"].endswith(f"{component}-secrets")]
    assert {r["metadata"]["namespace"]: r["rules"] for r in roles} == {
        ns: [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}] for ns in ("team-a", "team-b")}
    assert not [b for b in of_kind(helm(), "RoleBinding") if b["metadata"]["name"].endswith("-secrets")]


def _read_rules(docs: Iterable[dict[str, Any]]) -> dict[str, set[str]]:
    """The controller ClusterRole's read-only rules: API group → resources."""
    (role,) = [d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"].endswith("-controller")]
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if rule["verbs"] == ["get", "list", "watch"] and rule["apiGroups"] != [""]:
            (group,) = rule["apiGroups"]
            out.setdefault(group, set()).update(rule["resources"])
    return out


def test_the_controller_reads_knative_addressables_and_sources_and_only_what_readable_kinds_lists() -> None:
    """controller.rbac.readableKinds becomes one read-only rule per API group, nothing broader."""
    rules = _read_rules(helm())
    assert {"pingsources", "apiserversources", "containersources", "sinkbindings", "kafkasources"} <= rules[
        "sources.knative.dev"]
    assert {"sequences", "parallels"} <= rules["flows.knative.dev"]
    assert {"jobsinks"} <= rules["sinks.knative.dev"]
    assert {"kafkasinks", "brokers"} <= rules["eventing.knative.dev"]
    assert {"services"} <= rules["serving.knative.dev"]
    assert {"channels", "inmemorychannels", "kafkachannels"} <= rules["messaging.knative.dev"]
    added = _read_rules(helm(sets=("controller.rbac.readableKinds.example\\.com={widgets,gadgets}",
                                   "controller.rbac.readableKinds.flows\\.knative\\.dev=null")))
    assert added["example.com"] == {"widgets", "gadgets"}
    assert "flows.knative.dev" not in added
    assert added["sources.knative.dev"] == rules["sources.knative.dev"]  # a new group keeps the defaults


def test_readable_kinds_refuses_wildcards() -> None:
    from .render import CHART, RELEASE, run, tool

    for bad in ("controller.rbac.readableKinds.example\\.com={*}", "controller.rbac.readableKinds.*={widgets}",
                "controller.rbac.readableKinds.example\\.com={widgets/status}"):
        proc = run([tool("helm"), "template", RELEASE, str(CHART), "--set", bad], ok=False)
        assert proc.returncode != 0 and "schema" in proc.stderr, (bad, proc.stderr)


def test_no_role_of_the_chart_mints_tokens_and_the_controller_may_grant_only_the_oidc_token_role() -> None:
    """The dispatchers' token rights are the per-namespace Roles the controller writes (named accounts only); the
    chart itself grants no serviceaccounts/token, and escalate/bind only on that Role's name."""
    docs = helm()
    roles = of_kind(docs, "Role") + of_kind(docs, "ClusterRole")
    assert [r for d in roles for r in d.get("rules", []) if "serviceaccounts/token" in r.get("resources", [])] == []
    escalating = [(d["metadata"]["name"], r) for d in roles for r in d.get("rules", [])
                  if set(r["verbs"]) & ESCALATING_VERBS]
    assert [(n.rsplit("-", 1)[-1], r) for n, r in escalating] == [("controller", {
        "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "resourceNames": [TOKEN_ROLE],
        "verbs": ["escalate", "bind"]})]


def test_the_receiver_reads_event_policies_only_with_auth_on() -> None:
    def policy_rules(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        roles = of_kind(docs, "Role") + of_kind(docs, "ClusterRole")
        return [(d["metadata"]["name"], r) for d in roles for r in d.get("rules", [])
                if "eventpolicies" in r.get("resources", []) and d["metadata"]["name"].endswith("receiver")]

    assert policy_rules(helm()) == []
    (rule,) = policy_rules(helm(sets=("receiver.auth.enabled=true",)))
    assert rule[1] == {"apiGroups": ["eventing.knative.dev"], "resources": ["eventpolicies"],
                       "verbs": ["get", "list", "watch"]}


def test_the_controller_writes_event_policy_status_only_for_the_charts_own_crd() -> None:
    def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"].endswith("controller")
                for r in d.get("rules", []) if any(x.startswith("eventpolicies") for x in r.get("resources", []))]

    read = {"apiGroups": ["eventing.knative.dev"], "resources": ["eventpolicies"], "verbs": ["get", "list", "watch"]}
    assert rules(helm()) == [read]
    assert rules(helm(sets=("crds.eventPolicies=true",))) == [read, {
        "apiGroups": ["eventing.knative.dev"], "resources": ["eventpolicies/status"], "verbs": ["get", "patch"]}]
    assert "KE_EVENT_POLICY_STATUS" not in container_env(helm(), "kafka-eventing-controller")
    env = container_env(helm(sets=("crds.eventPolicies=true",)), "kafka-eventing-controller")
    assert Settings.from_env({"KE_EVENT_POLICY_STATUS": env["KE_EVENT_POLICY_STATUS"]}).event_policy_status
