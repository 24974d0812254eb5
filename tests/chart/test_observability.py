"""What the chart ships for operators, checked against the code that exports the metrics, with promtool.

- each role's scrape passes ``promtool check metrics`` (Prometheus naming: units, ``_total`` counters);
- the Grafana dashboards are valid JSON and query only metrics some role exports;
- the PrometheusRule passes ``promtool check rules`` and its unit tests (tests/prometheus/alerts_test.yaml), and
  queries only exported metrics.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from kafka_eventing.controller.brokers import BrokerReadiness
from kafka_eventing.controller.channels import ChannelReadiness
from kafka_eventing.controller.controller import Metrics as ControllerMetrics
from kafka_eventing.dispatcher.metrics import Metrics as DispatcherMetrics
from kafka_eventing.receiver import ingress
from promtool import assert_promtool_passes, check_metrics

from .render import CHART, ROOT, helm, of_kind, run, tool

DASHBOARDS = sorted((CHART / "files" / "dashboards").glob("*.json"))
RULE_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yaml"


def _touch(metrics: Iterable[Any]) -> None:
    """One sample for every metric (a labelled one needs a child before it shows in a scrape)."""
    for metric in metrics:
        if not isinstance(metric, MetricWrapperBase):
            continue
        names = metric._labelnames
        child = metric.labels(*["x"] * len(names)) if names else metric
        if isinstance(metric, Counter):
            child.inc()
        elif isinstance(metric, Gauge):
            child.set(1)
        elif isinstance(metric, Histogram):
            child.observe(0.1)


class _Objects:
    """A cache holding one Ready and one not-Ready resource (Kafka-class, of Broker ``default/ok``)."""

    def items(self) -> list[dict[str, Any]]:
        kafka = {"eventing.knative.dev/broker.class": "Kafka"}
        return [{"metadata": {"namespace": "default", "name": "ok", "annotations": kafka}, "spec": {"broker": "ok"},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                {"metadata": {"namespace": "default", "name": "bad", "annotations": kafka}, "spec": {"broker": "ok"},
                 "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "TopicNotReady"}]}}]

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((o for o in self.items() if o["metadata"]["name"] == name), None)


def scrapes() -> dict[str, str]:
    """Each role's /metrics text, every metric it defines with a sample."""
    receiver = CollectorRegistry()
    _touch(vars(ingress).values())
    for metric in (m for m in vars(ingress).values() if isinstance(m, MetricWrapperBase)):
        receiver.register(metric)
    # The dispatcher serves the default registry, which carries prometheus_client's process collector.
    dispatcher = CollectorRegistry()
    ProcessCollector(registry=dispatcher)
    _touch(vars(DispatcherMetrics(dispatcher)).values())
    controller = CollectorRegistry()
    _touch(vars(ControllerMetrics(controller)).values())
    controller.register(ChannelReadiness(_Objects()))  # type: ignore[arg-type]
    controller.register(BrokerReadiness(_Objects(), _Objects()))  # type: ignore[arg-type]
    return {role: generate_latest(r).decode() for role, r in
            (("receiver", receiver), ("dispatcher", dispatcher), ("controller", controller))}


def exported_names() -> set[str]:
    names = set()
    for text in scrapes().values():
        for family in text_string_to_metric_families(text):
            names.update(sample.name for sample in family.samples)
    return names


#: PromQL words that are not metric names.
_PROMQL = {"sum", "min", "max", "avg", "count", "by", "without", "on", "ignoring", "group_left", "group_right",
           "and", "or", "unless", "bool", "rate", "irate", "increase", "delta", "deriv", "histogram_quantile",
           "label_values", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values(metric, label)``) reads."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    expr = re.sub(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,[^)]*\)", r"\1", expr)
    return {n for n in re.findall(r"\b([a-zA-Z_:][\w:]*)\b(?!\s*\()", expr) if n not in _PROMQL}


def test_metric_names_helper_finds_only_metrics() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, subscriber) (rate(a_bucket{x=~"$v"}[5m])))') == {
        "a_bucket"}
    assert metric_names("max by (pod) (b and on (namespace, pod) c) / sum(d) > 0.1") == {"b", "c", "d"}
    assert metric_names("label_values(e_total, channel)") == {"e_total"}


@pytest.mark.parametrize("role", ["receiver", "dispatcher", "controller"])
def test_every_role_scrape_passes_promtool_check_metrics(role: str) -> None:
    # Every metric a role defines; the real processes' scrapes are checked in tests/integration.
    assert_promtool_passes(scrapes()[role], f"the {role}'s metrics")


def test_promtool_check_metrics_can_fail() -> None:
    bad = "# HELP requests_count x\n# TYPE requests_count counter\nrequests_count 1\n"
    assert check_metrics(bad).returncode != 0


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield f"variable {var['name']}", var["definition"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboards_are_valid_and_query_only_exported_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert graphs and all(p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in graphs)
    exported = exported_names()
    for title, expr in _targets(dashboard):
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= exported, (title, sorted(names - exported))
    # What the issue asks the dashboards to show.
    queried = {n for _, e in _targets(dashboard) for n in metric_names(e)}
    assert {"kafka_receiver_events_total", "kafka_receiver_produce_latency_seconds_bucket",
            "eventing_kafka_consumer_lag", "eventing_kafka_dispatch_outcomes_total",
            "eventing_kafka_dispatch_latency_seconds_bucket", "eventing_kafka_dispatch_retries_total",
            "eventing_kafka_dead_lettered_total", "process_resident_memory_bytes",
            # Brokers and Triggers: readiness, and their series picked out of the shared ones by it.
            "kafka_broker_ready", "kafka_trigger_ready", "eventing_kafka_filtered_out_total"} <= queried


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_queries_parse(path: Path, tmp_path: Path) -> None:
    """Every panel query is valid PromQL: promtool parses them as recording rules (Grafana's variables filled in)."""
    dashboard = json.loads(path.read_text())
    exprs = [re.sub(r"\$\{?(namespace|channel)\}?", ".*", e).replace("$__rate_interval", "5m")
             for title, e in _targets(dashboard) if not title.startswith("variable ")]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"panel:query{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(rules))
    checked = run([tool("promtool"), "check", "rules", str(tmp_path / "queries.yaml")], ok=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "bad", "rules": [{"record": "panel:bad", "expr": "sum by (x (y)"}]}]}))
    assert run([tool("promtool"), "check", "rules", str(tmp_path / "bad.yaml")], ok=False).returncode != 0


def test_dashboard_configmaps_carry_the_sidecar_label() -> None:
    docs = helm(sets=("metrics.grafanaDashboards.enabled=true",))
    maps = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert [sorted(m["data"]) for m in maps] == [[p.name] for p in DASHBOARDS]
    for m in maps:
        (text,) = m["data"].values()
        json.loads(text)


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    """The chart's alert rules as a Prometheus rule file, beside a copy of the promtool unit tests."""
    (rule,) = of_kind(helm(sets=("metrics.prometheusRule.enabled=true",), apis=("monitoring.coreos.com/v1",)),
                      "PrometheusRule")
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    return tmp_path


def test_alert_rules_pass_promtool_check_and_unit_tests(rules: Path) -> None:
    checked = run([tool("promtool"), "check", "rules", str(rules / "alerts.yaml")], ok=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = run([tool("promtool"), "test", "rules", str(rules / RULE_TESTS.name)], ok=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tested_alerts = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
                     for t in case["alert_rule_test"]}
    spec = yaml.safe_load((rules / "alerts.yaml").read_text())
    alerts = [r for g in spec["groups"] for r in g["rules"]]
    assert {a["alert"] for a in alerts} == tested_alerts  # every alert has a unit test
    exported = exported_names()
    operations = (ROOT / "docs" / "operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip("# ").lower()).replace(" ", "-")
               for h in operations.splitlines() if h.startswith("#")}
    for alert in alerts:
        assert metric_names(alert["expr"]) <= exported, alert["alert"]
        assert alert["annotations"]["runbook_url"].endswith(f"docs/operations.md#{alert['alert'].lower()}")
        assert alert["alert"].lower() in anchors, f"no runbook section for {alert['alert']} in docs/operations.md"


def test_promtool_rule_tests_can_fail(rules: Path) -> None:
    text = (rules / RULE_TESTS.name).read_text().replace("severity: critical", "severity: page")
    (rules / RULE_TESTS.name).write_text(text)
    assert run([tool("promtool"), "test", "rules", str(rules / RULE_TESTS.name)], ok=False).returncode != 0
