"""Rendering for the chart tests: the real `helm` and `kustomize` binaries of the tool cache (`make setup`),
cached per scenario, and helpers to pick objects out of a render."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils
import pytest
import yaml
from referencing import Registry, Resource

from kafka_eventing.core.kafka_config import load_providers
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import TOKEN_ROLE

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
NO_OFFLINE_SCHEMA = {"ServiceMonitor", "PrometheusRule"}


SETTINGS_ENV = {"KE_" + f.name.upper() for f in dataclasses.fields(Settings)}


#: Helm preset → the Kustomize overlay that must install the same objects (both generated from providers.yaml).
PRESETS = {f"values-{name}.yaml": name for name in load_providers()["presets"]}


CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))


SCENARIOS = [f"ci/{n}" for n in CI_VALUES] + list(PRESETS)


#: Every render users can install: each Helm scenario and Kustomize overlay ("helm:<file>", "kustomize:<dir>").
RENDERS = [f"helm:{n}" for n in SCENARIOS] + [f"kustomize:{p.name}" for p in sorted(
    (KUSTOMIZE / "overlays").iterdir())]


def tool(name: str) -> str:
    path = BIN / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make setup` (hack/setup/go-tools.sh builds it)")
    return str(path)


def run(args: list[str], *, ok: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False, input=stdin)
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


def preset_sets(name: str) -> tuple[str, ...]:
    """What a preset's header says to add to its `helm install` (`--set 'path=value'` lines): the preset leaves
    empty what every cluster has its own of (bootstrap address, IAM role), and the install fails without it."""
    if not name.startswith("values-"):
        return ()
    return tuple(re.findall(r"^#\s+--set(?:-string)? '([^']+)'", (CHART / name).read_text(), re.MULTILINE))


def scenario(name: str) -> tuple[dict[str, Any], ...]:
    # Scenarios render with the optional APIs served, so capability-guarded objects are checked too; a preset with
    # the `--set`s its header gives.
    return helm(name, sets=preset_sets(name), apis=OPTIONAL_APIS)


def render(name: str) -> tuple[dict[str, Any], ...]:
    """One of ``RENDERS``."""
    source, _, what = name.partition(":")
    return scenario(what) if source == "helm" else kustomize(what)


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
    if doc["kind"] == "PrometheusRule":
        # The rules themselves are checked and unit-tested by promtool (tests/prometheus).
        rules = [r for group in doc["spec"]["groups"] for r in group["rules"]]
        assert rules and all(r["expr"] and r["annotations"]["runbook_url"] for r in rules), doc["metadata"]["name"]
        return
    if doc["kind"] in NO_OFFLINE_SCHEMA:
        spec = doc["spec"]
        assert spec["selector"]["matchLabels"] and spec["endpoints"], doc["metadata"]["name"]
        return
    k8s_validator(*key).validate(doc)


def helm_error(*files: str, sets: tuple[str, ...] = ()) -> str:
    """The error of a `helm template` that must fail (it fails the test when the render succeeds)."""
    args = [tool("helm"), "template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", K8S_VERSION]
    for f in files:
        args += ["-f", str(CHART / f)]
    for s in sets:
        args += ["--set", s]
    proc = run(args, ok=False)
    assert proc.returncode != 0, f"{' '.join(args)} rendered, expected a failure"
    return proc.stderr


def notes(*files: str, sets: tuple[str, ...] = (), apis: tuple[str, ...] = ()) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` leaves NOTES.txt out, so a copy of the chart renders it
    as a named template into a ConfigMap-like document."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / CHART.name
        shutil.copytree(CHART, chart)
        body = (CHART / "templates" / "NOTES.txt").read_text()
        (chart / "templates" / "zz-notes-under-test.yaml").write_text(
            '{{- define "notes-under-test" }}' + body + '{{- end }}\n'
            'notes: {{ include "notes-under-test" . | toJson }}\n')
        args = [tool("helm"), "template", RELEASE, str(chart), "-n", NAMESPACE, "--kube-version", K8S_VERSION,
                "--show-only", "templates/zz-notes-under-test.yaml"]
        for f in files:
            args += ["-f", str(CHART / f)]
        for s in sets:
            args += ["--set", s]
        for a in apis:
            args += ["--api-versions", a]
        text: str = yaml.safe_load(run(args).stdout)["notes"]
        return text


READ_VERBS = {"get", "list", "watch"}


#: Verbs that hand out more than the role holds: never granted.
ESCALATING_VERBS = {"escalate", "bind", "impersonate"}


#: Volume types the restricted profile allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the Pod Security Standard "restricted" (v1.34), plus a writable root fs."""
    out: list[str] = []
    psc = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"):
        if spec.get(flag) is (flag != "hostUsers"):
            out.append(f"{flag}={spec.get(flag)}")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser=0")
    for sysctl in psc.get("sysctls", []):
        out.append(f"sysctl {sysctl.get('name')}")
    containers = spec.get("containers", []) + spec.get("initContainers", []) + spec.get("ephemeralContainers", [])
    assert spec.get("containers"), "a pod without containers"
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]

        def effective(key: str, sc: dict[str, Any] = sc) -> Any:
            return sc[key] if key in sc else psc.get(key)

        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if effective("runAsNonRoot") is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        if effective("runAsUser") == 0:
            out.append(f"{name}: runAsUser=0")
        if (effective("seccompProfile") or {}).get("type") != "RuntimeDefault":
            out.append(f"{name}: seccompProfile is not RuntimeDefault")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount {sc['procMount']}")
        if (effective("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{name}: AppArmor unconfined")
        if (effective("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{name}: hostProcess")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(f"{name}: root filesystem writable")
    return out


def rbac_problems(docs: Iterable[dict[str, Any]]) -> list[str]:
    """Wildcards, escalation verbs, aggregated roles, and Secret access beyond reading in the release namespace."""
    docs = list(docs)
    out: list[str] = []
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    #: the ClusterRoles the controller binds in KafkaNamespaced Brokers' namespaces (broker.namespaced.enabled)
    data_plane = {name for kind, _, name in roles if kind == "ClusterRole" and name.endswith(("-receiver",
                                                                                               "-dispatcher"))}
    for (kind, ns, name), role in roles.items():
        if role.get("aggregationRule"):
            out.append(f"{kind}/{name}: aggregationRule (grants whatever other roles match)")
        for rule in role.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                if any("*" in item for item in rule.get(field, [])):
                    out.append(f"{kind}/{name}: wildcard in {field}: {rule}")
            # escalate/bind only on the one Role that lists the senders' OIDC accounts (controller/identities.py).
            # bind also on the chart's data-plane ClusterRoles, by name, for the KafkaNamespaced data planes.
            binds_data_plane = (rule.get("verbs") == ["bind"] and rule.get("resources") == ["clusterroles"]
                                and set(rule.get("resourceNames") or ["*"]) <= data_plane)
            if set(rule.get("verbs", [])) & ESCALATING_VERBS and not binds_data_plane and (
                    rule.get("resources") != ["roles"] or rule.get("resourceNames") != [TOKEN_ROLE]):
                out.append(f"{kind}/{name}: escalating verbs {rule['verbs']}")
            secrets = "" in rule.get("apiGroups", []) and "secrets" in rule.get("resources", [])
            # The one writer: the controller, of its copies of KafkaSources' net keys, in the release namespace.
            copies = kind == "Role" and ns == NAMESPACE and name.endswith("-controller")
            # ... and, everywhere, of the receiver's Secrets for KafkaNamespaced data planes: created, or updated by
            # name, never read.
            namespaced_copies = kind == "ClusterRole" and name.endswith("-controller") and (
                rule["verbs"] == ["create"] or (rule["verbs"] == ["update"] and rule.get("resourceNames")))
            if secrets and set(rule["verbs"]) - READ_VERBS and not (copies or namespaced_copies):
                out.append(f"{kind}/{name}: writes Secrets: {rule['verbs']}")
            # Minting tokens is acting as that ServiceAccount: only named accounts, in one namespace.
            if "" in rule.get("apiGroups", []) and "serviceaccounts/token" in rule.get("resources", []) and (
                    kind == "ClusterRole" or not rule.get("resourceNames")):
                out.append(f"{kind}/{name}: serviceaccounts/token for unnamed accounts or in every namespace")
    # Where each role's Secret rules apply: a ClusterRoleBinding makes them cluster-wide.
    for binding in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
        ref = binding["roleRef"]
        ns = "" if ref["kind"] == "ClusterRole" else binding["metadata"].get("namespace", "")
        role = roles.get((ref["kind"], ns, ref["name"]))
        reads_secrets = role is not None and any(
            "" in r.get("apiGroups", []) and "secrets" in r.get("resources", []) and set(r["verbs"]) & READ_VERBS
            for r in role.get("rules", []))
        if not reads_secrets:
            continue
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        if where != NAMESPACE:
            out.append(f"{binding['kind']}/{binding['metadata']['name']}: Secrets readable in "
                       f"{where or 'every namespace'}")
    return out
