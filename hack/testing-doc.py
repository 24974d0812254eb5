#!/usr/bin/env python3
"""Write docs/testing.md's tier table from a real run: its make targets' wall times and its tests' JUnit reports.

    KE_MAKE_TIMES=.cache/logs/times.tsv .ci/run            # or any make command: every target appends its time
    .venv/bin/python hack/testing-doc.py --run warm --times .cache/logs/times.tsv --command ".ci/run, fresh clone"

``--run warm|cold`` names the column the run fills (warm: the tools, caches and images were there; cold: a new
machine); the other column keeps its latest run. The runs live in docs/testing.json, the table between the markers
of docs/testing.md; the rest of that page is prose kept by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "testing.json"
DOC = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- tier table: hack/testing-doc.py -->", "<!-- end of tier table -->"

#: (target, what it is, the real parts it starts), in the order `.ci/run` meets them.
TIERS: list[tuple[str, str, str]] = [
    ("setup", "`make setup`: venv (uv), Kafka jars, Go tools of the host tiers, CRDs", "—"),
    ("verify", "generated files current", "helm, helm-docs"),
    ("lint", "ruff, mypy, import layers, yamllint", "—"),
    ("test-unit", "unit tests (fakes allowed)", "—"),
    ("test-cesql", "CloudEvents SQL conformance suite", "—"),
    ("test-integration", "integration on the real parts",
     "Kafka (KRaft), etcd + kube-apiserver (+ controller-manager), Knative's controller, Spark, gunicorn, "
     "the OpenTelemetry Collector, the CloudEvents conformance tool"),
    ("test-reliability", "the short ledger-checked fault suite", "Kafka, receiver and dispatcher processes"),
    ("lint-charts", "helm lint, ct lint, helm-docs drift, kustomize, render assertions", "helm, ct, kustomize"),
    ("test", "**`make test`** in all", ""),
    ("setup-e2e", "`make setup-e2e`: node packages, kubelet, kubeadm, kube-proxy, CoreDNS, kind, wathola", "—"),
    ("cluster-images", "role images archive (input-hash cache)", "private dockerd"),
    ("cluster-spark-image", "Spark image archive (input-hash cache)", "private dockerd"),
    ("kind-image", "kind node image (input-hash cache)", "kind's dockerd"),
    ("test-cluster", "real pods: overlay, auth + TLS, leader kills, a killed supervisor",
     "containerd, kubelet, control plane, Kafka in a network namespace with no route out"),
    ("test-kind", "kind: chart install/upgrade/test/uninstall, channel, Broker, Source, prober, Spark pods, ct",
     "kind's dockerd in a network namespace, a kind cluster, Kafka in it"),
    ("e2e", "**`make e2e`** in all", ""),
]


def _times(path: Path) -> dict[str, dict[str, int]]:
    """Each target's line of the run where it did its work: the longest that passed, else the failed one (a target
    that is a prerequisite of several makes appears again, as a no-op)."""
    found: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines():
        target, secs, rc, *since = line.split("\t")
        entry = {"seconds": int(secs), "rc": int(rc), "since_start": int(since[0]) if since and since[0] else 0}
        old = found.get(target)
        if old is None or (entry["rc"] == 0, entry["seconds"]) > (old["rc"] == 0, old["seconds"]):
            found[target] = entry
    return found


def _tests(junit_dir: Path, target: str) -> dict[str, int] | None:
    report = junit_dir / f"{target}.xml"
    if not report.exists():
        return None
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in ET.parse(report).getroot().iter("testsuite"):  # noqa: S314 (our own pytest run's report)
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    return counts


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) // 2**20
    return f"{os.cpu_count()} × {cpu}, {mem} GiB, Python {platform.python_version()}"


def record(run: str, times: Path, junit: Path, command: str, clone: Path) -> None:
    data: dict[str, Any] = json.loads(DATA.read_text()) if DATA.exists() else {}
    sha = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         check=False).stdout.strip()
    data[run] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": sha, "command": command, "machine": _machine(),
        "targets": _times(times),
        "tests": {t: c for t, *_ in TIERS if (c := _tests(junit, t)) is not None},
    }
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _seconds(run: dict[str, Any] | None, target: str) -> str:
    if not run or target not in run["targets"]:
        return "—"
    entry = run["targets"][target]
    # An aggregate's own recipe only prints; its time is its make's whole run.
    secs = entry["since_start"] if target in ("test", "e2e") else entry["seconds"]
    failed = "" if entry["rc"] == 0 else " (failed)"
    return f"{secs:,} s ({secs / 60:.1f} min){failed}" if secs >= 60 else f"{secs} s{failed}"


def render() -> None:
    data: dict[str, Any] = json.loads(DATA.read_text())
    warm, cold = data.get("warm"), data.get("cold")
    rows = ["| tier | what | tests | warm | cold | real parts it starts |", "|---|---|---|---|---|---|"]
    for target, what, parts in TIERS:
        counts = next((r["tests"][target] for r in (warm, cold) if r and target in r.get("tests", {})), None)
        tests = "—"
        if counts:
            bad = counts["failures"] + counts["errors"]
            tests = f"{counts['tests'] - counts['skipped'] - bad:,} passed" + (f", {bad} failed" if bad else "") + (
                f", {counts['skipped']} skipped" if counts["skipped"] else "")
        rows.append(f"| `{target}` | {what} | {tests} | {_seconds(warm, target)} | {_seconds(cold, target)} | "
                    f"{parts} |")
    notes = [f"- **{name}**: {r['command']}; recorded {r['date']}, at {r['commit']}; {r['machine']}."
             for name, r in (("warm", warm), ("cold", cold)) if r]
    table = "\n".join([BEGIN, *rows, "", *notes, END])
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + table + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", choices=("warm", "cold"), help="record a run into this column first")
    parser.add_argument("--times", type=Path, help="the run's KE_MAKE_TIMES file")
    parser.add_argument("--junit", type=Path, default=ROOT / ".cache" / "logs" / "junit")
    parser.add_argument("--command", default=".ci/run", help="what was run, as the table's note says it")
    parser.add_argument("--clone", type=Path, default=ROOT, help="the checkout the run ran in (its commit is noted)")
    args = parser.parse_args()
    if args.run:
        if not args.times:
            parser.error("--run needs --times")
        record(args.run, args.times, args.junit, args.command, args.clone)
    render()


if __name__ == "__main__":
    main()
