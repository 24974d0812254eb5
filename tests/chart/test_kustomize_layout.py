"""Kustomize layout (thin overlays, replacements), `make manifests`, the Argo CD ApplicationSets."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .render import (
    KUSTOMIZE,
    PRESETS,
    ROOT,
    SETTINGS_ENV,
    kustomize,
    of_kind,
    one,
    parse,
    scenario,
)


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
