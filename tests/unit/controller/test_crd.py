"""The KafkaChannel CRD the controller installs (controller/crds/): served versions, schema, defaults."""

from __future__ import annotations

from importlib import resources as importlib_resources
from typing import Any

import pytest
import yaml


def _crd() -> dict[str, Any]:
    text = importlib_resources.files("kafka_eventing.controller").joinpath("crds/kafkachannels.yaml").read_text()
    return dict(yaml.safe_load(text))


def test_crd_serves_v1beta1_storage_and_v1_with_one_schema() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == "kafkachannels.messaging.knative.dev"
    assert crd["metadata"]["labels"]["messaging.knative.dev/subscribable"] == "true"
    assert crd["metadata"]["labels"]["duck.knative.dev/addressable"] == "true"
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["kc"]
    assert set(names["categories"]) == {"all", "knative", "messaging", "channel"}
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert versions["v1beta1"]["storage"] and not versions["v1"]["storage"]
    assert versions["v1"]["schema"] == versions["v1beta1"]["schema"]
    for v in versions.values():
        assert v["served"] and v["subresources"] == {"status": {}}
        assert [c["name"] for c in v["additionalPrinterColumns"]] == ["Ready", "Reason", "URL", "Age"]
    spec = versions["v1beta1"]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["numPartitions"]["default"] == 1 and spec["numPartitions"]["minimum"] == 1
    assert spec["replicationFactor"]["default"] == 1 and spec["replicationFactor"]["minimum"] == 1
    assert spec["retentionDuration"]["default"] == "PT168H"
    sub = spec["subscribers"]["items"]["properties"]
    assert {"uid", "generation", "subscriberUri", "replyUri", "delivery", "deliveryOrder", "rateLimit"} <= set(sub)


@pytest.mark.parametrize(("value", "ok"), [("PT168H", True), ("P7D", True), ("PT1.5S", True), ("P1DT2H30M", True),
                                           ("168h", False), ("P1Y", False), ("7 days", False)])
def test_crd_retention_pattern(value: str, ok: bool) -> None:
    import re

    spec = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert bool(re.match(spec["retentionDuration"]["pattern"], value)) is ok
