"""Fixtures of the reliability suite, and the report: with ``RELIABILITY_REPORT=path`` (set by ``make chaos``) the
session writes every scenario's numbers, its result and the machine it ran on as a Markdown table to that path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from rig import Rig, Row

from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode
from scripts import load_script

REPO = Path(__file__).resolve().parents[2]
ROWS: list[tuple[str, Row]] = []  # (test node id, row), in the order the scenarios ran
OUTCOMES: dict[str, tuple[bool, str]] = {}  # node id → (passed, first line of the failure)
_LOADED = time.monotonic()  # the suite's wall time counts from here (before the broker starts)
PACKAGES = ("kafka-eventing", "confluent-kafka", "gunicorn", "uvicorn", "falcon", "aiohttp", "httpx", "cloudevents")


@pytest.fixture
def rig(kafka_running: KafkaNode, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Rig]]:
    """Build the scenario's Rig (``rig(partitions=...)``); everything it started is stopped afterwards."""
    made: list[Rig] = []
    nodeid = request.node.nodeid

    def make(**kw: object) -> Rig:
        built = Rig(kafka_running, tmp_path, lambda row: ROWS.append((nodeid, row)), **kw)  # type: ignore[arg-type]
        made.append(built)
        return built

    try:
        yield make
    finally:
        for built in made:
            built.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield
    if report.when == "call" or report.failed:
        reason = ""
        if report.failed:
            text = str(report.longrepr)
            errors = [line[2:].strip() for line in text.splitlines() if line.startswith("E ")]
            reason = errors[0] if errors else text.strip().splitlines()[-1]
        if item.nodeid not in OUTCOMES or report.failed:
            OUTCOMES[item.nodeid] = (report.passed, reason[:300])
    return report


def _bench_common() -> ModuleType:
    """bench/_common.py, the one place that describes the machine a measurement ran on."""
    return load_script("bench/_common.py", "bench_common")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[tuple[str, Row]], outcomes: dict[str, tuple[bool, str]], facts: dict[str, object],
           command: str, seconds: float) -> str:
    lines = [
        "# Reliability: the ledger-checked fault suite",
        "",
        f"Written by `{command}` (tests/reliability/). Each scenario runs the real parts as processes on "
        "127.0.0.1 — gunicorn with uvicorn workers as the receiver, `python -m kafka_eventing.dispatcher` per "
        "dispatcher replica, one KRaft Kafka node — and injects its fault under load. The senders keep a ledger "
        "of every event id and the answers it got (an event answered 503 or not at all is sent again with the "
        "same id, as a client would); the subscribers record every id they acknowledge. The checker compares "
        "the two.",
        "",
        "- **sent**: distinct ids sent; **202**: ids the receiver accepted; **delivered**: accepted ids the "
        "subscription acknowledged at least once; **duplicates**: acknowledgements beyond the first; **lost**: "
        "accepted, never delivered nor dead-lettered; **w/o 202**: delivered though never accepted; "
        "**dead-lettered**: ids its dead-letter sink took.",
        "- Pass: lost = 0 and w/o 202 = 0 for every subscription, plus the scenario's own checks (notes); the soak "
        "also needs duplicates ≤ 0.1 % of deliveries. The Broker soak (10 partitions, 5 Triggers, one subscriber "
        "answering in 3–4 s) further needs every Trigger's consumer group committed to the end of the topic (lag "
        "0) and the dispatcher's RSS flat: sampled every 5 s, the mean of the last minute at most 10 % above the "
        "mean of the first minute after 2 minutes of warm-up.",
        "- The life of an install is proven on pods, not here: Knative's own upgrade prober (wathola sender, "
        "receiver and fetcher pods) through a KafkaChannel and a Broker across `helm install` of the previous chart "
        "version, `helm upgrade` to this one, a values change that rolls every pod and `helm rollback` (pass: state "
        "success, no step missing, duplicates reported) by `make test-kind` on kind (tests/e2e/test_kind.py, "
        "tests/e2e/_life.py); the controller's leader plus one dispatcher pod killed every 20 s while channels and "
        "Triggers are created and deleted (pass: lost = 0 by the ledger, everything Ready afterwards, no "
        "dispatcher Deployment, topic or consumer group left once the namespace is gone) by `make test-cluster` on "
        "this machine's real pods (tests/e2e/test_cluster_life.py).",
        "- Not proven: a CRD storage-version move under the prober, because no CRD of this chart can move without a "
        "version upstream does not have. KafkaChannel is stored as `messaging.knative.dev/v1beta1`, Knative's only "
        "version of it (this CRD also serves `v1`, same schema). Stored as `v1`, every user's KafkaChannel would sit "
        "in etcd at a version Knative's own CRD does not define, and once `v1` is in `status.storedVersions` the API "
        "server refuses a CRD without it: there would be no way back to upstream's CRD. KafkaSource is stored as "
        "`sources.knative.dev/v1` with `v1beta1` served, as upstream, and has been since the CRD was added, so no "
        "KafkaSource is stored at `v1beta1`. Every other CRD has one version. What the upgrade prober does cross is "
        "a CRD schema change. Chart 0.8.0 → 0.9.0 adds `status.policies` to the KafkaChannel schema; the CRDs are "
        "Helm templates (keep policy), so `helm upgrade` applies the change and `helm rollback` reverts it while "
        "wathola's events flow through a KafkaChannel (tests/integration/test_chart_install.py checks that the API "
        "server's KafkaChannel schema is the previous chart's before the upgrade and this chart's after). A "
        "read-and-write of every stored object (what kube-storage-version-migrator does) is not run: with no version "
        "move and no field removed it would change nothing in etcd (the API server skips an update whose stored "
        "bytes are unchanged), so it would prove nothing.",
        "",
        "| scenario | subscription | sent | 202 | delivered | duplicates | lost | w/o 202 | dead-lettered | s "
        "| result | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for nodeid, row in rows:
        passed, reason = outcomes.get(nodeid, (False, "no outcome"))
        t = row.tally
        result = "pass" if passed else f"FAIL: {reason}"
        lines.append(
            f"| {row.scenario} | {row.subscription} | {t.sent} | {t.accepted} | {t.delivered} | {t.duplicates} "
            f"| {t.lost} | {t.unaccepted_delivered} | {t.dead_lettered} | {row.seconds:.0f} | {_cell(result)} "
            f"| {_cell('; '.join(row.notes))} |")
    recorded = {nodeid for nodeid, _row in rows}
    unrecorded = [(n, o) for n, o in outcomes.items() if n not in recorded]
    if unrecorded:
        lines += ["", "Scenarios that ended before their verdict (no numbers):", ""]
        lines += [f"- `{n}`: {'pass' if ok else 'FAIL: ' + _cell(reason)}" for n, (ok, reason) in unrecorded]
    lines += ["", f"Suite wall time: {seconds:.0f} s.", "", "## Machine and versions", "", "```"]
    lines += [f"{k}: {v}" for k, v in facts.items()]
    lines += ["```", ""]
    return "\n".join(lines)


FACTS: dict[str, object] = {}


def pytest_configure(config: pytest.Config) -> None:
    # The machine as the suite starts (its load average, the date): what the scenarios ran on.
    if os.environ.get("RELIABILITY_REPORT"):
        FACTS.update(_bench_common().machine_facts(PACKAGES, kafka=KAFKA_VERSION))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("RELIABILITY_REPORT")
    if not target or not (ROWS or OUTCOMES):
        return
    facts = FACTS or _bench_common().machine_facts(PACKAGES, kafka=KAFKA_VERSION)
    seconds = time.monotonic() - _LOADED
    command = os.environ.get("RELIABILITY_COMMAND", "make chaos")
    path = Path(target)
    path.write_text(render(ROWS, OUTCOMES, facts, command, seconds))
    print(f"\nreliability report written to {path}")
