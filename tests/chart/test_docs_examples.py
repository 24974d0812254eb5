"""The manifests of docs/getting-started.md (docs/examples/*.yaml, included in the page by `make generate`): each
parses and validates against the schema of its kind — the CRDs of this repository, Knative Eventing's Subscription
CRD from the tool cache (`make setup`), the Kubernetes 1.34 schemas for the rest. tests/e2e/test_kind.py applies
them on kind."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from .render import BIN, CRDS, ROOT, k8s_validator

EXAMPLES = ROOT / "docs" / "examples"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def knative_subscription_crd() -> Path:
    found = sorted((BIN.parent / "knative").glob("*/resources/subscription.yaml"))
    if not found:
        pytest.fail(f"no Knative Eventing CRDs under {BIN.parent / 'knative'}: run `make setup`")
    return found[-1]


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    out = {}
    for path in [*sorted(CRDS.glob("*.yaml")), knative_subscription_crd()]:
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(
                version["schema"]["openAPIV3Schema"])
    return out


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def test_there_are_examples() -> None:
    assert set(FILES) >= {"event-display.yaml", "channel.yaml", "channel-subscribers.yaml", "broker.yaml",
                          "sink-and-source.yaml"}


@pytest.mark.parametrize("name", FILES)
def test_each_example_validates_against_its_schema(name: str) -> None:
    docs = documents(EXAMPLES / name)
    assert docs
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        validator = crd_validators().get(key) or k8s_validator(*key)
        validator.validate(doc)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "demo", f"{name}: {doc['kind']} outside the demo namespace"


@pytest.mark.parametrize("name", FILES)
def test_each_example_is_on_the_getting_started_page(name: str) -> None:
    """`make generate` writes each marked example into the page (and `make verify` fails on a stale copy); an
    example nobody marked would be one the page never shows."""
    assert f"<!--example {name}-->" in GETTING_STARTED.read_text()


def test_a_broken_example_fails() -> None:
    """The check has teeth: a KafkaChannel with a string for its partition count is refused."""
    (channel,) = documents(EXAMPLES / "channel-subscribers.yaml")
    channel["spec"]["numPartitions"] = "three"
    with pytest.raises(jsonschema.ValidationError):
        crd_validators()[("messaging.knative.dev/v1beta1", "KafkaChannel")].validate(channel)
