"""Knative's upgrade prober across an install's life, on kind (tests/e2e/test_kind.py: the one tier that runs it, the
one where users meet the chart).

Knative's wathola sender, receiver and fetcher (``knative.dev/eventing/test/test_images/wathola-*`` at the Knative
version `make setup` pins, built static by hack/setup/go-tools.sh) run as pods from one image (:func:`wathola_archive`;
loaded into the node as the role images are): two pipelines, sender → KafkaChannel → receiver and
sender → Kafka Broker → Trigger → receiver, each sender posting numbered step events one after another every 10 ms to
the channel's or the Broker's ``status.address.url`` (a Service name), through the whole of:

1. `helm install` of the previous released chart version (from git history, :func:`previous_chart`),
2. `helm upgrade` to this tree's chart,
3. a values change that rolls every pod of the release (``logFormat``),
4. `helm rollback` to the first revision.

Then the senders are stopped (SIGTERM: each sends its "finished" event with the count it sent) and the fetcher reads
each receiver's report. Pass, as upstream's prober: state ``success`` (every step received), nothing missing,
unexpected or unavailable for longer than the prober's limit; duplicates are counted and reported.

The chart's values and how a test client reaches a pod are the :class:`Tier` the test passes in. Nothing here imports
pytest.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from e2e._scenario import (
    APP_NS,
    BROKER,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    SYSTEM_NS,
    Kube,
    get,
    pods_ready,
    wait,
)
from kafka_eventing.core import brokers as kb
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack.tools import tool_path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kafka-eventing"
RELEASE = "ke"
WATHOLA_TOOLS = ("wathola-sender", "wathola-receiver", "wathola-fetcher")
WATHOLA_IMAGE = "localhost/kafka-eventing-wathola:prober"
WATHOLA_PORT = 22111  # the receiver's default port (config.DefaultReceiverPort)
CHANNEL = "prober"
CHANNEL_HOST = f"{CHANNEL}-kn-channel.{APP_NS}.svc.cluster.local"
PIPELINES = ("channel", "broker")
WARM_TYPE = "dev.kafka-eventing.prober.warm"  # the wathola receiver ignores types other than its own
# Progress each pipeline must make after each step of the life, so that the prober's load spans all of them.
PROGRESS = 50


class Helm(Kube, Protocol):
    def helm(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]: ...

    def apply(self, *docs: dict[str, Any]) -> None: ...


@dataclass
class Tier:
    """How the test installs the chart and reaches the prober's pods."""

    kube: Helm
    chart_args: Callable[[Path], list[str]]  # helm's values arguments for a chart directory
    send: Callable[[str, str, str], list[str]]  # (address URL, event id, type) → the ids answered 202
    report: Callable[[str], dict[str, Any]]  # a wathola receiver pod's IP → its /report


def wathola_archive(path: Path) -> None:
    """The three wathola binaries as one image (:data:`WATHOLA_IMAGE`), a ``docker save`` archive at ``path``."""
    files = {}
    for tool in WATHOLA_TOOLS:
        binary = tool_path(tool)
        if not binary.exists():
            raise AssertionError(f"{binary} missing: run `make setup` (hack/setup/go-tools.sh {tool})")
        files[tool] = (binary.read_bytes(), 0o755)
    kc.write_docker_archive(path, WATHOLA_IMAGE, files, ["/wathola-receiver"])


def previous_chart(dest: Path) -> tuple[Path, str]:
    """The newest chart version below this tree's in git history (branches merged in any order), as its last commit
    had it: what users upgrade from."""
    rel = CHART.relative_to(ROOT)

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout

    def semver(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split("-", maxsplit=1)[0].split("."))

    current = semver(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])
    newest: dict[str, str] = {}  # version -> its newest commit
    for sha in git("log", "--format=%H", "--", str(rel / "Chart.yaml")).decode().split():
        newest.setdefault(str(yaml.safe_load(git("show", f"{sha}:{rel}/Chart.yaml"))["version"]), sha)
    older = [v for v in newest if semver(v) < current]
    assert older, f"no chart version below {current} in git history (a shallow clone?)"
    version = max(older, key=semver)
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=git("archive", "--format=tar", newest[version], str(rel)),
                   check=True)
    return dest / rel, version


# ---------------------------------------------------------------------------------------------- the prober


def _config(name: str, toml: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": APP_NS},
            "data": {"config.toml": toml}}


def _wathola_pod(name: str, tool: str, config: str, *, restart: str = "Always") -> dict[str, Any]:
    """A pod running one wathola tool; its configuration is read from ``$HOME/.config/wathola/config.toml``."""
    container: dict[str, Any] = {
        "name": "wathola", "image": WATHOLA_IMAGE, "imagePullPolicy": "Never", "command": [f"/{tool}"],
        "env": [{"name": "HOME", "value": "/wathola"}], "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "config", "mountPath": "/wathola/.config/wathola", "readOnly": True}],
        "resources": {"limits": {"memory": "128Mi"}}}
    if tool == "wathola-receiver":
        container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": WATHOLA_PORT}, "periodSeconds": 2}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": APP_NS},
            "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                     "restartPolicy": restart, "terminationGracePeriodSeconds": 60,
                     "containers": [container],
                     "volumes": [{"name": "config", "configMap": {"name": config}}]}}


def _receivers(kube: Helm) -> dict[str, str]:
    """A wathola receiver per pipeline (debug logging: every event it gets is logged, the warm-up ones included)."""
    # 3 minutes after the finished event for the last steps to arrive (upstream's default is 1 minute, on an idle
    # machine; the receiver answers as soon as every step is in); unavailable periods over the prober's 1-minute
    # limit fail it, as upstream.
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}},
               _config("receiver", "logLevel = 'debug'\n[receiver.teardown]\nduration = 180000000000\n"),
               *(_wathola_pod(f"receiver-{p}", "wathola-receiver", "receiver") for p in PIPELINES))
    for p in PIPELINES:
        kube.kubectl("wait", "--for=condition=Ready", f"pod/receiver-{p}", "-n", APP_NS, "--timeout=300s",
                     timeout=360)
    return {p: str(get(kube, "pod", f"receiver-{p}", "-n", APP_NS)["status"]["podIP"]) for p in PIPELINES}


def _targets(kube: Helm, receivers: dict[str, str]) -> None:
    sink = {p: f"http://{ip}:{WATHOLA_PORT}/" for p, ip in receivers.items()}
    api = f"{kb.GROUP}/{kb.VERSION}"
    kube.apply(
        {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
         "metadata": {"name": CHANNEL, "namespace": APP_NS},
         "spec": {"numPartitions": 3, "replicationFactor": 1,
                  "subscribers": [{"uid": "prober", "generation": 1, "subscriberUri": sink["channel"]}]}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "broker-config", "namespace": APP_NS},
         "data": {kb.KEY_PARTITIONS: "3", kb.KEY_REPLICATION: "1"}},
        {"apiVersion": api, "kind": "Broker",
         "metadata": {"name": BROKER, "namespace": APP_NS,
                      "annotations": {kb.ANNOTATION_BROKER_CLASS: kb.BROKER_CLASS}},
         "spec": {"config": {"apiVersion": "v1", "kind": "ConfigMap", "name": "broker-config"}}},
        {"apiVersion": api, "kind": "Trigger", "metadata": {"name": "prober", "namespace": APP_NS},
         "spec": {"broker": BROKER, "subscriber": {"uri": sink["broker"]}}},
    )
    kube.kubectl("wait", "--for=condition=Ready", f"kafkachannel/{CHANNEL}", f"broker/{BROKER}", "trigger/prober",
                 "-n", APP_NS, "--timeout=600s", timeout=660)


def addresses(kube: Helm) -> dict[str, str]:
    """Pipeline → the address the KafkaChannel's and the Broker's status give (``status.address.url``)."""
    return {"channel": get(kube, "kafkachannel", CHANNEL, "-n", APP_NS)["status"]["address"]["url"],
            "broker": get(kube, "broker", BROKER, "-n", APP_NS)["status"]["address"]["url"]}


def _warm_up(tier: Tier) -> None:
    """Until each subscription's consumer has joined, events pass it by (it starts at the latest offset): a warm-up
    event of a type the prober ignores is sent down each pipeline until its receiver logs one."""
    for pipeline, url in addresses(tier.kube).items():
        sent: list[str] = []

        def arrived(url: str = url, pipeline: str = pipeline, sent: list[str] = sent) -> bool:
            sent.extend(tier.send(url, f"warm-{pipeline}-{len(sent)}", WARM_TYPE))
            logs = tier.kube.kubectl("logs", f"receiver-{pipeline}", "-n", APP_NS, check=False).stdout
            return any(event_id in logs for event_id in sent)

        wait(f"the {pipeline} subscription's consumer joined", arrived, timeout=300, interval=2)


def _senders(kube: Helm) -> None:
    """A wathola sender per pipeline, posting to the address the channel's or the Broker's status gives, as users'
    senders do."""
    kube.apply(*(_config(f"sender-{p}", f"[sender]\naddress = '{url}'\ninterval = 10000000\n")
                 for p, url in addresses(kube).items()),
               *(_wathola_pod(f"sender-{p}", "wathola-sender", f"sender-{p}") for p in PIPELINES))


def _progress(tier: Tier, receivers: dict[str, str], after: str) -> dict[str, int]:
    """Wait until each pipeline's receiver has PROGRESS more steps than now; return the counts it reached."""
    def steps(receiver_ip: str) -> int:
        return int(tier.report(receiver_ip)["eventsSent"])

    start = {p: steps(ip) for p, ip in receivers.items()}
    for p, ip in receivers.items():
        def flowing(ip: str = ip, want: int = start[p] + PROGRESS) -> bool:
            return steps(ip) >= want

        wait(f"{p} steps flowing after {after} (from {start[p]})", flowing, timeout=600, interval=2)
    return {p: steps(ip) for p, ip in receivers.items()}


def _fetch(kube: Helm, pipeline: str, receiver_ip: str) -> dict[str, Any]:
    """The verdict as upstream reads it: wathola-fetcher's report of the receiver, from the fetcher pod's output."""
    name = f"fetcher-{pipeline}"
    kube.apply(_config(name, f"[forwarder]\ntarget = 'http://{receiver_ip}:{WATHOLA_PORT}/'\n"),
               _wathola_pod(name, "wathola-fetcher", name, restart="Never"))
    wait(f"{name} done",
         lambda: get(kube, "pod", name, "-n", APP_NS)["status"].get("phase") in ("Succeeded", "Failed"),
         timeout=300, interval=2)
    out = kube.kubectl("logs", name, "-n", APP_NS).stdout
    execution: dict[str, Any] = json.loads(out[out.index("{"):])
    assert execution.get("report"), f"{name} got no report: {execution.get('logs')}"
    report: dict[str, Any] = execution["report"]
    return report


# ---------------------------------------------------------------------------------------------- the life


def helm(kube: Helm, *args: str) -> None:
    kube.helm(*args, "-n", SYSTEM_NS, "--wait", "--timeout=10m")


def release(kube: Helm) -> dict[str, Any]:
    releases = json.loads(kube.helm("list", "-n", SYSTEM_NS, "-o", "json").stdout)
    found: dict[str, Any] = next(r for r in releases if r["name"] == RELEASE)
    return found


def _release_pods(kube: Helm) -> set[str]:
    """The names of the release's own pods (receiver, controller; not the dispatchers the controller makes)."""
    pods = get(kube, "pods", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def upgrade_values_roll_and_rollback(tier: Tier, work: Path) -> dict[str, dict[str, Any]]:
    """The prober across install → upgrade → values roll → rollback (module docstring); asserts its verdict, leaves
    the release uninstalled and the app namespace deleted; returns each pipeline's summary (steps, duplicates)."""
    kube = tier.kube
    previous, previous_version = previous_chart(work / "previous")
    current_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert previous_version != current_version

    helm(kube, "install", RELEASE, str(previous), "--create-namespace", *tier.chart_args(previous))
    assert release(kube)["chart"] == f"kafka-eventing-{previous_version}"
    pods_ready(kube, SYSTEM_NS)

    receivers = _receivers(kube)
    _targets(kube, receivers)
    _warm_up(tier)
    steps: list[tuple[str, dict[str, int]]] = []
    _senders(kube)
    steps.append(("install", _progress(tier, receivers, f"helm install of {previous_version}")))

    helm(kube, "upgrade", RELEASE, str(CHART), *tier.chart_args(CHART))
    now = release(kube)
    assert (now["chart"], now["revision"]) == (f"kafka-eventing-{current_version}", "2"), now
    pods_ready(kube, SYSTEM_NS)
    steps.append(("upgrade", _progress(tier, receivers, f"helm upgrade to {current_version}")))

    rolled_from = _release_pods(kube)
    helm(kube, "upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "logFormat=json")
    pods_ready(kube, SYSTEM_NS)
    kept = rolled_from & _release_pods(kube)
    assert rolled_from and not kept, f"the values change did not roll every pod of the release: {sorted(kept)}"
    steps.append(("values roll", _progress(tier, receivers, "a values change rolling every pod")))

    helm(kube, "rollback", RELEASE, "1")
    now = release(kube)
    assert (now["chart"], now["revision"]) == (f"kafka-eventing-{previous_version}", "4"), now
    pods_ready(kube, SYSTEM_NS)
    steps.append(("rollback", _progress(tier, receivers, f"helm rollback to {previous_version}")))

    # SIGTERM: each sender sends its "finished" event with the count of steps it got a 2xx for.
    kube.kubectl("delete", "pod", *(f"sender-{p}" for p in PIPELINES), "-n", APP_NS, "--timeout=120s",
                 timeout=180)
    for p, ip in receivers.items():
        def decided(ip: str = ip) -> bool:
            return str(tier.report(ip)["state"]) != "active"

        wait(f"the {p} receiver's verdict", decided, timeout=300, interval=3)
    reports = {p: _fetch(kube, p, ip) for p, ip in receivers.items()}

    summary = {p: {"state": r["state"], "steps": r["eventsSent"], "requests": r["totalRequests"],
                   "duplicated": len(r["thrown"]["duplicated"]), "missing": len(r["thrown"]["missing"])}
               for p, r in reports.items()}
    print(f"prober across the life {[s for s, _ in steps]}: {json.dumps(summary)}")  # the duplicates, reported
    for p, r in reports.items():
        thrown = r["thrown"]
        assert r["state"] == "success" and not thrown["missing"] and not thrown["unexpected"], (
            f"{p}: {r['state']}, missing {thrown['missing'][:20]}, unexpected {thrown['unexpected']}")
        # Upstream's JSON tag of this field is misspelt (``jsong``), so its key is the Go field's name.
        assert not thrown.get("Unavailable"), f"{p}: sender unavailable too long: {thrown['Unavailable']}"
        assert r["eventsSent"] >= steps[-1][1][p], (p, r["eventsSent"], steps)

    kube.kubectl("delete", "namespace", APP_NS, "--timeout=300s", timeout=360)
    helm(kube, "uninstall", RELEASE)
    return summary
