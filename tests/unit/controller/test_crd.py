"""The KafkaChannel CRD the controller installs (controller/crds/): served versions, schema, defaults."""

from __future__ import annotations

from collections.abc import Iterator
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


# -- the CEL rules of every CRD, against the code that parses the same fields -------------------------------------

CRD_FILES = ("kafkachannels.yaml", "brokers.yaml", "triggers.yaml", "kafkasources.yaml", "kafkasinks.yaml")


def _walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def _fields(name: str) -> dict[str, dict[str, Any]]:
    """Every schema node of every version of the CRD, by ``<version> <path>``."""
    text = importlib_resources.files("kafka_eventing.controller").joinpath(f"crds/{name}").read_text()
    crd = yaml.safe_load(text)
    return {f"{v['name']} {p}": s for v in crd["spec"]["versions"]
            for p, s in _walk(v["schema"]["openAPIV3Schema"], "")}


def _cel(rule: str, value: str) -> bool:
    """The string rules used here (``self.matches('re')``, ``self.endsWith('x')``, ``self != 'x'``, each maybe
    negated, joined by ``&&``) evaluated in Python; RE2 and ``re`` agree on these expressions."""
    import re

    result = True
    for conjunct in rule.split(" && "):
        negate = conjunct.startswith("!")
        term = conjunct.removeprefix("!")
        if m := re.fullmatch(r"self\.matches\('(.+)'\)", term):
            ok = re.search(m.group(1).replace("\\\\", "\\"), value) is not None  # a CEL string escapes its backslashes
        elif m := re.fullmatch(r"self\.endsWith\('(.*)'\)", term):
            ok = value.endswith(m.group(1))
        elif m := re.fullmatch(r"self != '(.*)'", term):
            ok = value != m.group(1)
        else:
            raise AssertionError(f"not a rule this test evaluates: {term}")
        result = result and (ok != negate)
    return result


DURATIONS = ["PT0.2S", "PT1M", "P7D", "P1W", "P1DT2H30M", "PT1.5S", "PT0S", "PT168H", "P1WT1S",
             "P", "PT", "P1DT", "1s", "P1Y", "P1M", "-PT1S", "pt1s", "P1D2H", "PT1H30", " PT1S", "PT1S "]


@pytest.mark.parametrize("value", DURATIONS)
def test_duration_rules_admit_only_what_the_parser_takes(value: str) -> None:
    """Every duration a CRD admits, core/durations.py parses (the rule may be stricter: ``PT`` and ``P1DT``, which
    isodate reads as zero or a day, are refused as upstream's period.Parse refuses them); and ``timeout`` admits no
    zero, as upstream."""
    from kafka_eventing.core.durations import DurationError, parse_duration

    try:
        parsed = parse_duration(value, "f")
    except DurationError:
        parsed = None
    for name in CRD_FILES:
        for where, schema in _fields(name).items():
            field = where.rsplit(".", 1)[-1]
            if field not in ("backoffDelay", "timeout", "retryAfterMax", "retentionDuration"):
                continue
            pattern = schema.get("pattern")
            admitted = all(_cel(r["rule"], value) for r in schema.get("x-kubernetes-validations") or ()) and (
                pattern is None or _cel(f"self.matches('{pattern}')", value))
            assert schema.get("x-kubernetes-validations"), f"{name} {where}: no rule"
            if admitted:
                assert parsed is not None, f"{name} {where} admits {value!r}, which the parser refuses"
                assert field != "timeout" or parsed.total_seconds() > 0, f"{name} {where} admits a zero timeout"
            elif value in ("PT0.2S", "PT1M", "P7D", "P1W", "P1DT2H30M", "PT1.5S", "PT168H", "P1WT1S"):
                raise AssertionError(f"{name} {where} refuses {value!r}")


@pytest.mark.parametrize(("value", "ok"), [("orders", True), ("a.b_c-D9", True), ("t" * 249, True), ("...", True),
                                           (".", False), ("..", False), ("a/b", False), ("a b", False), ("ä", False),
                                           ("", False)])
def test_topic_rule_is_kafkas(value: str, ok: bool) -> None:
    """Kafka's own check (kafka.common.internals.Topic.validate): [a-zA-Z0-9._-], 1..249 chars, not . or .."""
    checked = 0
    for name in ("kafkasources.yaml", "kafkasinks.yaml"):
        for where, schema in _fields(name).items():
            if where.endswith((".topic", ".topics[]")):
                assert schema["maxLength"] == 249
                rule = schema["x-kubernetes-validations"][0]["rule"]
                assert _cel(rule, value) is ok, (name, where, value)
                checked += 1
    assert checked == 3  # KafkaSource v1 and v1beta1, KafkaSink


def test_every_delivery_spec_has_the_same_rules() -> None:
    """The DeliverySpec is written out in each CRD (channel and its subscribers, Broker, Trigger, KafkaSource): its
    fields' rules must not drift apart."""
    seen: dict[str, dict[str, Any]] = {}
    for name in CRD_FILES:
        for where, schema in _fields(name).items():
            field = where.split(".delivery.", 1)[1] if ".delivery." in where else "."
            if "." in field:
                continue
            rules = {k: schema[k] for k in ("enum", "minimum", "maxLength", "x-kubernetes-validations") if k in schema}
            assert rules, f"{name} {where}: no rule"
            assert seen.setdefault(field, rules) == rules, f"{name} {where} differs from another DeliverySpec"
    assert set(seen) >= {"retry", "backoffPolicy", "backoffDelay", "timeout", "retryAfterMax", "deadLetterSink"}
