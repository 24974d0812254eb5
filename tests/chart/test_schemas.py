"""Every render validates against the Kubernetes 1.34 schemas and the KafkaChannel CRD."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from .render import (
    KUSTOMIZE,
    SCENARIOS,
    helm,
    kustomize,
    of_kind,
    one,
    scenario,
    validate,
)

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
