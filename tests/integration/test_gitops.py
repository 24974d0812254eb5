"""gitops/argocd/*.yaml against Argo CD's own CRDs on the real kube-apiserver.

The CRDs come from the argoproj/argo-cd Go module (`make setup`: hack/setup/argocd-crds.sh), so the API server
checks the ApplicationSets against upstream's structural schema: kubectl's strict field validation turns a field
Argo CD does not know (a typo, or one upstream renamed or dropped) into an error, and a wrong type fails too.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fixtures.kube import wait_established
from kafka_eventing.localstack.kube import KubeControlPlane
from kafka_eventing.localstack.tools import cache_dir

pytestmark = pytest.mark.kube

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "hack" / "setup" / "argocd-crds.sh"
APPSETS = sorted((ROOT / "gitops" / "argocd").glob("applicationset-*.yaml"))


def _crd_files() -> list[Path]:
    version = re.search(r"^ARGOCD_VERSION=(\S+)$", SETUP.read_text(), re.M)
    assert version, f"no ARGOCD_VERSION in {SETUP}"
    files = sorted((cache_dir() / "argocd" / version.group(1)).glob("*-crd.yaml"))
    if len(files) != 3:
        pytest.fail(f"Argo CD CRDs missing under {cache_dir() / 'argocd'}: run `make setup` "
                    "(hack/setup/argocd-crds.sh)")
    return files


def _kubectl(plane: KubeControlPlane, *args: str, stdin: str | None = None,
             ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(plane.kubectl), f"--kubeconfig={plane.kubeconfig}", *args], input=stdin,
                         capture_output=True, text=True, timeout=120, check=False)
    if ok:
        assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return out


@pytest.fixture(scope="module")
def argocd_crds(kube_control_plane: KubeControlPlane) -> Iterator[KubeControlPlane]:
    files = _crd_files()
    for path in files:
        _kubectl(kube_control_plane, "apply", "--server-side", "-f", str(path))
    api = kube_control_plane.api_client()
    try:
        wait_established(api, [yaml.safe_load(p.read_text())["metadata"]["name"] for p in files])
    finally:
        api.close()
    _kubectl(kube_control_plane, "create", "namespace", "argocd")
    try:
        yield kube_control_plane
    finally:
        _kubectl(kube_control_plane, "delete", "namespace", "argocd", "--wait=false", ok=False)
        for path in files:
            _kubectl(kube_control_plane, "delete", "-f", str(path), "--ignore-not-found", ok=False)


@pytest.mark.parametrize("path", APPSETS, ids=lambda p: p.stem)
def test_applicationset_is_valid_for_argocd(argocd_crds: KubeControlPlane, path: Path) -> None:
    manifest = path.read_text()
    _kubectl(argocd_crds, "apply", "--server-side", "--validate=strict", "-f", "-", stdin=manifest)
    (want,) = [d for d in yaml.safe_load_all(manifest) if d]
    got = json.loads(_kubectl(argocd_crds, "get", "applicationset", want["metadata"]["name"], "-n", "argocd",
                              "-o", "json").stdout)
    # Nothing was pruned: every field we wrote is in the stored object (the schema knows all of them).
    assert _subset(want["spec"], got["spec"])


def test_unknown_field_is_rejected(argocd_crds: KubeControlPlane) -> None:
    """The check can fail: a field Argo CD's schema lacks is an error, not silently dropped."""
    (doc,) = [d for d in yaml.safe_load_all(APPSETS[0].read_text()) if d]
    doc["metadata"]["name"] = "typo"
    doc["spec"]["template"]["spec"]["syncPolicyy"] = {}
    out = _kubectl(argocd_crds, "apply", "--server-side", "--validate=strict", "-f", "-",
                   stdin=yaml.safe_dump(doc), ok=False)
    assert out.returncode != 0
    assert "syncPolicyy" in out.stderr


def _subset(want: object, got: object) -> bool:
    """``want`` is contained in ``got`` (the API server may add defaults, never drop ours)."""
    if isinstance(want, dict) and isinstance(got, dict):
        return all(k in got and _subset(v, got[k]) for k, v in want.items())
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(_subset(a, b) for a, b in zip(want, got, strict=True))
    return want == got
