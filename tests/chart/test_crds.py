"""The CRD copies in the chart and the Kustomize base equal the controller's files and `make generate` writes them;
the chart's CRD toggles."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scripts import load_script

from .render import (
    CANONICAL_CRD,
    CHART,
    CRDS,
    KUSTOMIZE,
    helm,
    of_kind,
    one,
)

BROKER_CRD_FILES = ("brokers.yaml", "triggers.yaml")  # Knative's own types: opt-in copies
SINK_CRD_FILES = ("kafkasinks.yaml",)  # upstream eventing-kafka-broker's type: an opt-in copy of its own
SOURCE_CRD = "kafkasources.yaml"  # upstream eventing-kafka-broker's type: opt-in too
#: Opt-in CRDs by file: the Kustomize component holding each (hack/generate.py OPTIONAL_CRDS).
OPTIONAL_CRDS = {**dict.fromkeys(BROKER_CRD_FILES, "broker-crds"), "kafkasinks.yaml": "sink-crds",
                 SOURCE_CRD: "source-crds", "resetoffsets.yaml": "resetoffset-crd",
                 "eventpolicies.yaml": "eventpolicy-crd"}


@pytest.mark.parametrize(("copies", "optional"), [
    (CHART / "files" / "crds", True), (KUSTOMIZE / "base" / "crds", False),
], ids=["chart", "kustomize"])
def test_crd_copies_equal_the_canonical_files(copies: Path, optional: bool) -> None:
    canonical = sorted(p for p in CRDS.glob("*.yaml") if optional or p.name not in OPTIONAL_CRDS)
    assert CANONICAL_CRD in canonical, "the controller's canonical CRD is missing"
    assert sorted(p.name for p in copies.glob("*.yaml") if p.name != "kustomization.yaml") == [
        p.name for p in canonical], "run `make generate`"
    for crd in canonical:
        assert (copies / crd.name).read_bytes() == crd.read_bytes(), "run `make generate`"
    for name, component in OPTIONAL_CRDS.items():
        assert (KUSTOMIZE / "components" / component / name).read_bytes() == (CRDS / name).read_bytes(), \
            "run `make generate`"


def test_resetoffset_crd_is_opt_in() -> None:
    with_resets = of_kind(helm(sets=("crds.resetOffsets=true",)), "CustomResourceDefinition")
    assert {c["spec"]["names"]["kind"] for c in with_resets} == {"KafkaChannel", "ResetOffset"}
    (crd,) = (c for c in with_resets if c["spec"]["names"]["kind"] == "ResetOffset")
    assert crd["spec"] == yaml.safe_load((CRDS / "resetoffsets.yaml").read_text())["spec"]
    component = yaml.safe_load((KUSTOMIZE / "components" / "resetoffset-crd" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and component["resources"] == ["resetoffsets.yaml"]


def test_eventpolicy_crd_is_opt_in_and_knatives_schema() -> None:
    with_policies = of_kind(helm(sets=("crds.eventPolicies=true",)), "CustomResourceDefinition")
    assert {c["spec"]["names"]["kind"] for c in with_policies} == {"KafkaChannel", "EventPolicy"}
    (crd,) = (c for c in with_policies if c["spec"]["names"]["kind"] == "EventPolicy")
    assert crd["spec"] == yaml.safe_load((CRDS / "eventpolicies.yaml").read_text())["spec"]
    assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [("v1alpha1", True, True)]
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert set(props["spec"]["properties"]) == {"to", "from", "filters"}
    assert "from" in props["status"]["properties"]
    component = yaml.safe_load((KUSTOMIZE / "components" / "eventpolicy-crd" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and component["resources"] == ["eventpolicies.yaml"]


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
    with_sources = of_kind(helm(sets=("crds.sources=true",)), "CustomResourceDefinition")
    assert {c["spec"]["names"]["kind"] for c in with_sources} == {"KafkaChannel", "KafkaSource"}
    (source,) = (c for c in with_sources if c["spec"]["group"] == "sources.knative.dev")
    assert source["spec"] == yaml.safe_load((CRDS / SOURCE_CRD).read_text())["spec"]
    assert [v["name"] for v in source["spec"]["versions"]] == ["v1", "v1beta1"]
    for version in source["spec"]["versions"]:
        assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.consumers",
                                                    "statusReplicasPath": ".status.consumers",
                                                    "labelSelectorPath": ".status.selector"}
        assert version["schema"] == source["spec"]["versions"][0]["schema"]  # v1beta1: the same schema
    config = one(helm(sets=("broker.defaultTopicPartitions=6",)), "ConfigMap", "kafka-broker-config")
    assert config["data"] == {"default.topic.partitions": "6", "default.topic.replication.factor": "1"}


def test_the_sink_crd_is_opt_in_on_its_own() -> None:
    with_sinks = of_kind(helm(sets=("crds.sinks=true",)), "CustomResourceDefinition")
    assert {c["spec"]["names"]["kind"] for c in with_sinks} == {"KafkaChannel", "KafkaSink"}
    (sink,) = (c for c in with_sinks if c["spec"]["names"]["kind"] == "KafkaSink")
    assert sink["spec"] == yaml.safe_load((CRDS / "kafkasinks.yaml").read_text())["spec"]
    with_brokers = of_kind(helm(sets=("crds.brokers=true",)), "CustomResourceDefinition")
    assert "KafkaSink" not in {c["spec"]["names"]["kind"] for c in with_brokers}
    assert not of_kind(helm(sets=("crds.sinks=true", "crds.install=false")), "CustomResourceDefinition")


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


def test_make_generate_writes_the_crd_copies_and_removes_stale_ones(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    generate = load_script("hack/generate.py", "generate")
    sources, chart, kustomize = tmp_path / "crds", tmp_path / "chart", tmp_path / "kustomize"
    for name, value in (("ROOT", tmp_path), ("CRDS", sources), ("CHART", chart), ("KUSTOMIZE", kustomize)):
        monkeypatch.setattr(generate, name, value)
    sources.mkdir()
    for name in ("kafkachannels.yaml", *BROKER_CRD_FILES, *SINK_CRD_FILES, SOURCE_CRD):
        (sources / name).write_bytes((CRDS / name).read_bytes())
    stale_chart, stale_base = chart / "files" / "crds" / "gone.yaml", kustomize / "base" / "crds" / "gone.yaml"
    for stale in (stale_chart, stale_base):
        stale.parent.mkdir(parents=True)
        stale.write_text("kind: CustomResourceDefinition\n")
    (chart / "files" / "crds" / "kafkachannels.yaml").write_text("# edited by hand\n")

    generate.crds()

    def names(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.glob("*.yaml"))

    assert names(chart / "files" / "crds") == ["brokers.yaml", "kafkachannels.yaml", "kafkasinks.yaml",
                                               "kafkasources.yaml", "triggers.yaml"]
    assert names(kustomize / "base" / "crds") == ["kafkachannels.yaml", "kustomization.yaml"]
    assert names(kustomize / "components" / "broker-crds") == ["brokers.yaml", "kustomization.yaml", "triggers.yaml"]
    assert names(kustomize / "components" / "sink-crds") == ["kafkasinks.yaml", "kustomization.yaml"]
    assert names(kustomize / "components" / "source-crds") == ["kafkasources.yaml", "kustomization.yaml"]
    for copy in (chart / "files" / "crds", kustomize / "base" / "crds", kustomize / "components" / "broker-crds",
                 kustomize / "components" / "sink-crds", kustomize / "components" / "source-crds"):
        for crd in copy.glob("*.yaml"):
            if crd.name != "kustomization.yaml":
                assert crd.read_bytes() == (sources / crd.name).read_bytes()
    base = yaml.safe_load((kustomize / "base" / "crds" / "kustomization.yaml").read_text())
    assert base["resources"] == ["kafkachannels.yaml"]
