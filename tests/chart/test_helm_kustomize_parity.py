"""Helm and Kustomize install the same objects for the same provider and opt-ins."""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .render import (
    KUSTOMIZE,
    OPTIONAL_APIS,
    PRESETS,
    container_env,
    helm,
    kustomize,
    one,
    parse,
    run,
    scenario,
    tool,
    validate,
)


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
        "components": [f"{rel}/components/{c}"
                       for c in ("pdb", "networkpolicy", "servicemonitor", "prometheusrule", "grafana-dashboards")],
    }))
    kust_docs = parse(run([tool("kustomize"), "build", str(tmp_path)]).stdout)
    for d in kust_docs:
        validate(d)
    helm_docs = helm("values-strimzi.yaml", sets=("receiver.pdb.enabled=true", "controller.pdb.enabled=true",
                                                  "networkPolicy.enabled=true", "metrics.serviceMonitor.enabled=true",
                                                  "metrics.prometheusRule.enabled=true",
                                                  "metrics.grafanaDashboards.enabled=true"),
                     apis=OPTIONAL_APIS)
    h, k = comparable(helm_docs), comparable(kust_docs)
    optin = {key for key in h if key[0] in ("PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "PrometheusRule")
             or (key[0] == "ConfigMap" and "dashboard" in key[1])}
    assert len(optin) == 10 and optin <= set(k)
    for key in optin:
        part = "data" if key[0] == "ConfigMap" else "spec"
        hs, ks = copy.deepcopy(h[key][part]), copy.deepcopy(k[key][part])
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
