"""The CRD copies in the chart and the Kustomize base equal the controller's files; the chart's CRD toggles."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .render import (
    CANONICAL_CRD,
    CHART,
    CRDS,
    KUSTOMIZE,
    helm,
    of_kind,
)


@pytest.mark.parametrize("copies", [CHART / "files" / "crds", KUSTOMIZE / "base" / "crds"], ids=["chart", "kustomize"])
def test_crd_copies_equal_the_canonical_files(copies: Path) -> None:
    canonical = sorted(CRDS.glob("*.yaml"))
    assert CANONICAL_CRD in canonical, "the controller's canonical CRD is missing"
    assert sorted(p.name for p in copies.glob("*.yaml") if p.name != "kustomization.yaml") == [
        p.name for p in canonical], "run `make generate`"
    for crd in canonical:
        assert (copies / crd.name).read_bytes() == crd.read_bytes(), "run `make generate`"


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
