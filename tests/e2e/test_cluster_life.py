"""Nothing lost across an install's life, witnessed by Knative's own upgrade prober (`make test-cluster`).

Knative's wathola sender, receiver and fetcher (``knative.dev/eventing/test/test_images/wathola-*`` at the Knative
version `make setup` pins, built static by hack/setup/go-tools.sh) run as pods on the real-pod cluster: two
pipelines, sender → KafkaChannel → receiver and sender → Kafka Broker → Trigger → receiver, each sender posting
numbered step events one after another every 10 ms, through the whole of:

1. `helm install` of the previous released chart version (from git history),
2. `helm upgrade` to this tree's chart,
3. a values change that rolls every pod of the release (``logFormat``),
4. `helm rollback` to the first revision.

Then the senders are stopped (SIGTERM: each sends its "finished" event with the count it sent) and the fetcher reads
each receiver's report. Pass, as upstream's prober: state ``success`` (every step received), nothing missing,
unexpected or unavailable for longer than the prober's limit; duplicates are counted and reported. The cluster has no
Service routing, so the senders reach the receiver pods through ``run_service`` (tests/e2e/_netns_clients.py), a
relay standing in for kube-proxy: a rolled receiver pod closes its connections and the sender reconnects to another,
as with a Service.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import _netns_clients as clients
from e2e._scenario import (
    APP_NS,
    BROKER,
    DISPATCHER_SELECTOR,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    SYSTEM_NS,
    broker_with_triggers,
    dispatchers,
    get,
    kafka_channel,
    pods_ready,
    wait,
)
from e2e.test_cluster import CHART, Cluster, _image_roles
from kafka_eventing.core import brokers as kb
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.tools import tool_path

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
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


def _wathola_archive(path: Path) -> None:
    files = {}
    for tool in WATHOLA_TOOLS:
        binary = tool_path(tool)
        if not binary.exists():
            pytest.fail(f"{binary} missing: run `make setup` (hack/setup/go-tools.sh {tool})")
        files[tool] = (binary.read_bytes(), 0o755)
    kc.write_docker_archive(path, WATHOLA_IMAGE, files, ["/wathola-receiver"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    images = _image_roles()
    # The cluster imports every archive of its images folder at start: the prober's goes there for this start only.
    archive = kc.workdir() / "images" / "wathola.tar"
    _wathola_archive(archive)
    try:
        state = kc.up(ttl=3600)
    except kc.ClusterError as exc:
        kc.down()
        pytest.fail(f"the cluster did not start: {exc}")
    finally:
        archive.unlink(missing_ok=True)
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(1, initializer=clients.init, initargs=(int(state["pid"]),))
    try:
        yield Cluster(state, images, pool)
    finally:
        pool.terminate()
        pool.join()
        kc.down()
        assert kc.leftovers() == [], "cluster-down left things behind"


def _previous_chart(dest: Path) -> tuple[Path, str]:
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


def _wathola_pod(name: str, tool: str, config: str, *, restart: str = "Always",
                 host_aliases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
                     **({"hostAliases": host_aliases} if host_aliases else {}),
                     "containers": [container],
                     "volumes": [{"name": "config", "configMap": {"name": config}}]}}


def _receivers(cl: Cluster) -> dict[str, str]:
    """A wathola receiver per pipeline (debug logging: every event it gets is logged, the warm-up ones included)."""
    # 3 minutes after the finished event for the last steps to arrive (upstream's default is 1 minute, on an idle
    # machine); unavailable periods over the prober's 1-minute limit fail it, as upstream.
    cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}},
             _config("receiver", "logLevel = 'debug'\n[receiver.teardown]\nduration = 180000000000\n"),
             *(_wathola_pod(f"receiver-{p}", "wathola-receiver", "receiver") for p in PIPELINES))
    for p in PIPELINES:
        cl.kubectl("wait", "--for=condition=Ready", f"pod/receiver-{p}", "-n", APP_NS, "--timeout=300s", timeout=360)
    return {p: str(cl.get("pod", f"receiver-{p}", "-n", APP_NS)["status"]["podIP"]) for p in PIPELINES}


def _targets(cl: Cluster, receivers: dict[str, str]) -> None:
    sink = {p: f"http://{ip}:{WATHOLA_PORT}/" for p, ip in receivers.items()}
    api = f"{kb.GROUP}/{kb.VERSION}"
    cl.apply(
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
    cl.kubectl("wait", "--for=condition=Ready", f"kafkachannel/{CHANNEL}", f"broker/{BROKER}", "trigger/prober",
               "-n", APP_NS, "--timeout=600s", timeout=660)


def _warm_up(cl: Cluster) -> None:
    """Until each subscription's consumer has joined, events pass it by (it starts at the latest offset): a warm-up
    event of a type the prober ignores is sent down each pipeline until its receiver logs one."""
    receiver_host = f"kafka-eventing-receiver.{SYSTEM_NS}.svc.cluster.local"
    routes = {"channel": (CHANNEL_HOST, "/"), "broker": (receiver_host, f"/{APP_NS}/{BROKER}")}
    for pipeline, (host, path) in routes.items():
        sent: list[str] = []

        def arrived(host: str = host, path: str = path, pipeline: str = pipeline, sent: list[str] = sent) -> bool:
            sent.append(f"warm-{pipeline}-{len(sent)}")
            cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS, host, sent[-1:], 0.0, 60.0, path, WARM_TYPE)
            logs = cl.kubectl("logs", f"receiver-{pipeline}", "-n", APP_NS, check=False).stdout
            return any(event_id in logs for event_id in sent)

        wait(f"the {pipeline} subscription's consumer joined", arrived, timeout=300, interval=2)


def _senders(cl: Cluster, service_port: int) -> None:
    service = f"{kc.NODE_IP}:{service_port}"
    cl.apply(_config("sender-channel", f"[sender]\naddress = 'http://{CHANNEL_HOST}:{service_port}/'\n"
                                       "interval = 10000000\n"),
             _config("sender-broker", f"[sender]\naddress = 'http://{service}/{APP_NS}/{BROKER}'\n"
                                      "interval = 10000000\n"),
             # No cluster DNS: the channel's host name points at the relay, whose port the address names.
             _wathola_pod("sender-channel", "wathola-sender", "sender-channel",
                          host_aliases=[{"ip": kc.NODE_IP, "hostnames": [CHANNEL_HOST]}]),
             _wathola_pod("sender-broker", "wathola-sender", "sender-broker"))


def _report(cl: Cluster, receiver_ip: str) -> dict[str, Any]:
    report: dict[str, Any] = cl.in_netns(clients.get_json, f"http://{receiver_ip}:{WATHOLA_PORT}/report")
    return report


def _progress(cl: Cluster, receivers: dict[str, str], after: str) -> dict[str, int]:
    """Wait until each pipeline's receiver has PROGRESS more steps than now; return the counts it reached."""
    start = {p: int(_report(cl, ip)["eventsSent"]) for p, ip in receivers.items()}
    for p, ip in receivers.items():
        wait(f"{p} steps flowing after {after} (from {start[p]})",
             lambda ip=ip, p=p: int(_report(cl, ip)["eventsSent"]) >= start[p] + PROGRESS, timeout=600, interval=2)
    return {p: int(_report(cl, ip)["eventsSent"]) for p, ip in receivers.items()}


def _fetch(cl: Cluster, pipeline: str, receiver_ip: str) -> dict[str, Any]:
    """The verdict as upstream reads it: wathola-fetcher's report of the receiver, from the fetcher pod's output."""
    name = f"fetcher-{pipeline}"
    cl.apply(_config(name, f"[forwarder]\ntarget = 'http://{receiver_ip}:{WATHOLA_PORT}/'\n"),
             _wathola_pod(name, "wathola-fetcher", name, restart="Never"))
    wait(f"{name} done", lambda: get(cl, "pod", name, "-n", APP_NS)["status"].get("phase") in ("Succeeded", "Failed"),
         timeout=300, interval=2)
    out = cl.kubectl("logs", name, "-n", APP_NS).stdout
    execution: dict[str, Any] = json.loads(out[out.index("{"):])
    assert execution.get("report"), f"{name} got no report: {execution.get('logs')}"
    report: dict[str, Any] = execution["report"]
    return report


# ---------------------------------------------------------------------------------------------- the life


def _helm(cl: Cluster, *args: str) -> None:
    cl.helm(*args, "-n", SYSTEM_NS, "--wait", "--timeout=10m")


def _chart_args(cl: Cluster, chart: Path) -> list[str]:
    return ["-f", str(chart / "ci" / "cluster-values.yaml"),
            "--set-string", f"image.tag={cl.images['receiver'].rsplit(':', 1)[1]}",
            "--set", f"kafka.bootstrapServers={cl.state['bootstrap_servers']}",
            "--set", f"tests.image={cl.images['curl']}", "--set", "crds.brokers=true"]


def _release(cl: Cluster) -> dict[str, Any]:
    releases = json.loads(cl.helm("list", "-n", SYSTEM_NS, "-o", "json").stdout)
    release: dict[str, Any] = next(r for r in releases if r["name"] == RELEASE)
    return release


def _release_pods(cl: Cluster) -> set[str]:
    """The names of the release's own pods (receiver, controller; not the dispatchers the controller makes)."""
    pods = get(cl, "pods", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def test_upgrade_values_roll_and_rollback_lose_nothing(cluster: Cluster, tmp_path: Path) -> None:
    cl = cluster
    previous, previous_version = _previous_chart(tmp_path / "previous")
    current_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert previous_version != current_version

    _helm(cl, "install", RELEASE, str(previous), "--create-namespace", *_chart_args(cl, previous))
    assert _release(cl)["chart"] == f"kafka-eventing-{previous_version}"
    pods_ready(cl, SYSTEM_NS)

    receivers = _receivers(cl)
    _targets(cl, receivers)
    _warm_up(cl)
    port = free_port()
    relay = multiprocessing.get_context("spawn").Process(
        target=clients.run_service, args=(cl.pid, kc.NODE_IP, port, cl.kubectl_cmd, SYSTEM_NS, 3000), daemon=True)
    relay.start()
    steps: list[tuple[str, dict[str, int]]] = []
    try:
        _senders(cl, port)
        steps.append(("install", _progress(cl, receivers, f"helm install of {previous_version}")))

        _helm(cl, "upgrade", RELEASE, str(CHART), *_chart_args(cl, CHART))
        release = _release(cl)
        assert (release["chart"], release["revision"]) == (f"kafka-eventing-{current_version}", "2"), release
        pods_ready(cl, SYSTEM_NS)
        steps.append(("upgrade", _progress(cl, receivers, f"helm upgrade to {current_version}")))

        rolled_from = _release_pods(cl)
        _helm(cl, "upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "logFormat=json")
        pods_ready(cl, SYSTEM_NS)
        kept = rolled_from & _release_pods(cl)
        assert rolled_from and not kept, f"the values change did not roll every pod of the release: {sorted(kept)}"
        steps.append(("values roll", _progress(cl, receivers, "a values change rolling every pod")))

        _helm(cl, "rollback", RELEASE, "1")
        release = _release(cl)
        assert (release["chart"], release["revision"]) == (f"kafka-eventing-{previous_version}", "4"), release
        pods_ready(cl, SYSTEM_NS)
        steps.append(("rollback", _progress(cl, receivers, f"helm rollback to {previous_version}")))

        # SIGTERM: each sender sends its "finished" event with the count of steps it got a 2xx for.
        cl.kubectl("delete", "pod", "sender-channel", "sender-broker", "-n", APP_NS, "--timeout=120s", timeout=180)
        for p, ip in receivers.items():
            wait(f"the {p} receiver's verdict", lambda ip=ip: _report(cl, ip)["state"] != "active",
                 timeout=300, interval=3)
        reports = {p: _fetch(cl, p, ip) for p, ip in receivers.items()}
    finally:
        relay.terminate()
        relay.join(10)

    summary = {p: {"state": r["state"], "steps": r["eventsSent"], "requests": r["totalRequests"],
                   "duplicated": len(r["thrown"]["duplicated"]), "missing": len(r["thrown"]["missing"])}
               for p, r in reports.items()}
    print(f"prober across the life {[s for s, _ in steps]}: {json.dumps(summary)}")  # the duplicates, reported
    for p, r in reports.items():
        thrown = r["thrown"]
        assert r["state"] == "success" and not thrown["missing"] and not thrown["unexpected"], (
            f"{p}: {r['state']}, missing {thrown['missing'][:20]}, unexpected {thrown['unexpected']}")
        assert not thrown.get("Unavailable"), f"{p}: sender unavailable too long: {thrown['Unavailable']}"
        assert r["eventsSent"] >= steps[-1][1][p], (p, r["eventsSent"], steps)

    cl.kubectl("delete", "namespace", APP_NS, "--timeout=300s", timeout=360)
    _helm(cl, "uninstall", RELEASE)


# ---------------------------------------------------------------------------------------------- leader chaos

CHAOS_PERIOD = 20.0  # upstream's chaos pod kills leaders about every 20 s during its e2e runs
CHAOS_ROUNDS = 5
LEASE = "kafka-channel-controller"


def _kill(cl: Cluster, pod: str) -> None:
    # No grace: the process gets SIGKILL, as in a node or OOM kill; a leader releases nothing, its lease expires.
    cl.kubectl("delete", "pod", pod, "-n", SYSTEM_NS, "--grace-period=0", "--force", "--wait=false", check=False)


def _leader(cl: Cluster) -> str:
    """The controller pod holding the lease (its identity is the pod's name, or that name and a suffix), or ""
    while none does."""
    out = cl.kubectl("get", "lease", LEASE, "-n", SYSTEM_NS, "-o", "json", check=False)
    if out.returncode != 0:
        return ""
    holder: str = json.loads(out.stdout)["spec"].get("holderIdentity") or ""
    pods = get(cl, "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=controller")["items"]
    return next((p["metadata"]["name"] for p in pods
                 if holder and (holder == p["metadata"]["name"] or holder.startswith(p["metadata"]["name"] + "-"))),
                "")


def _chaos(cl: Cluster, stop: threading.Event, killed: dict[str, list[str]]) -> None:
    while not stop.wait(CHAOS_PERIOD):
        leader = _leader(cl)
        if leader:
            _kill(cl, leader)
            killed["leaders"].append(leader)
        pods = [p["metadata"]["name"] for p in get(cl, "pods", "-n", SYSTEM_NS, "-l", DISPATCHER_SELECTOR)["items"]
                if not p["metadata"].get("deletionTimestamp")]
        if pods:
            pod = pods[len(killed["dispatchers"]) % len(pods)]  # the channel's and the Broker's in turn
            _kill(cl, pod)
            killed["dispatchers"].append(pod)


def _churn(index: int, sink: str) -> list[dict[str, Any]]:
    """A KafkaChannel and a Trigger made (and the round before's deleted) while leaders die: reconciles mid-kill."""
    api = f"{kb.GROUP}/{kb.VERSION}"
    return [kafka_channel(f"churn-{index}", {"churn": sink}, 1),
            {"apiVersion": api, "kind": "Trigger", "metadata": {"name": f"churn-{index}", "namespace": APP_NS},
             "spec": {"broker": BROKER, "filter": {"attributes": {"type": f"churn-{index}"}},
                      "subscriber": {"uri": sink}}}]


def _ledger(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line] if path.exists() else []


def test_leader_and_dispatcher_kills_every_20s_lose_nothing(cluster: Cluster, tmp_path: Path) -> None:
    cl = cluster
    _helm(cl, "install", RELEASE, str(CHART), "--create-namespace", *_chart_args(cl, CHART),
          "--set", "controller.replicas=2")
    pods_ready(cl, SYSTEM_NS)
    wait("a controller holds the lease", lambda: _leader(cl), timeout=120)

    ledger = tmp_path / "ledger.jsonl"
    port = free_port()
    sink_url = f"http://{kc.NODE_IP}:{port}/"
    sink = multiprocessing.get_context("spawn").Process(
        target=clients.run_sink, args=(cl.pid, kc.NODE_IP, port, str(ledger), 3000), daemon=True)
    sink.start()
    receiver_host = f"kafka-eventing-receiver.{SYSTEM_NS}.svc.cluster.local"
    routes = {"channel": (f"orders-kn-channel.{APP_NS}.svc.cluster.local", "/"),
              "broker": (receiver_host, f"/{APP_NS}/{BROKER}")}
    stop = threading.Event()
    killed: dict[str, list[str]] = {"leaders": [], "dispatchers": []}
    chaos = threading.Thread(target=_chaos, args=(cl, stop, killed), daemon=True)
    try:
        cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}},
                 kafka_channel("orders", {"ledger": sink_url}, 3),
                 *[d for d in broker_with_triggers(sink_url, sink_url) if d["kind"] != "Trigger"],
                 {"apiVersion": f"{kb.GROUP}/{kb.VERSION}", "kind": "Trigger",
                  "metadata": {"name": "all", "namespace": APP_NS},
                  "spec": {"broker": BROKER, "subscriber": {"uri": sink_url}}})
        cl.kubectl("wait", "--for=condition=Ready", "kafkachannel/orders", f"broker/{BROKER}", "trigger/all",
                   "-n", APP_NS, "--timeout=600s", timeout=660)
        for name, (host, path) in routes.items():  # each subscription's consumer joined: an event gets through
            warm: list[str] = []

            def through(host: str = host, path: str = path, name: str = name, warm: list[str] = warm) -> bool:
                warm.append(f"warm-{name}-{len(warm)}")
                cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS, host, warm[-1:], 0.0, 60.0, path)
                return bool(set(warm) & set(_ledger(ledger)))

            wait(f"the {name} subscription's consumer joined", through, timeout=300, interval=2)

        chaos.start()
        accepted: list[str] = []
        started = time.monotonic()
        churned = -1
        batch = 0
        while (elapsed := time.monotonic() - started) < CHAOS_PERIOD * CHAOS_ROUNDS:
            if int(elapsed // CHAOS_PERIOD) > churned:  # one new channel and Trigger per period, the last deleted
                churned += 1
                cl.apply(*_churn(churned, sink_url))
                if churned:
                    cl.kubectl("delete", "kafkachannel,trigger", f"churn-{churned - 1}", "-n", APP_NS, "--wait=false")
            for name, (host, path) in routes.items():
                ids = [f"{name}-{batch}-{n}" for n in range(40)]
                accepted += cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS, host, ids, 0.02, 300.0, path)
            batch += 1
        stop.set()
        chaos.join(60)
        assert len(killed["leaders"]) >= CHAOS_ROUNDS - 1 and len(set(killed["leaders"])) > 1, killed

        # Every accepted event delivered (lost = 0); duplicates counted.
        def delivered() -> bool:
            return set(accepted) <= set(_ledger(ledger))

        try:
            wait("every accepted event delivered after the kills", delivered, timeout=600, interval=3)
        except AssertionError:
            missing = set(accepted) - set(_ledger(ledger))
            raise AssertionError(f"lost {len(missing)} of {len(accepted)}: {sorted(missing)[:20]}") from None
        got = [i for i in _ledger(ledger) if i in set(accepted)]
        print(f"leader chaos: killed {json.dumps(killed)}, {len(accepted)} accepted, lost 0, "
              f"{len(got) - len(set(got))} duplicates")

        # The deleted ones finalized (their finalizers ran under some leader); the rest converge to Ready.
        def names(kind: str) -> set[str]:
            return {i["metadata"]["name"] for i in get(cl, kind, "-n", APP_NS)["items"]}

        left = {"orders", f"churn-{churned}"}
        wait("deleted churn resources finalized", lambda: names("kafkachannels") == left
             and names("triggers") == {"all", f"churn-{churned}"}, timeout=600, interval=3)
        pods_ready(cl, SYSTEM_NS)
        cl.kubectl("wait", "--for=condition=Ready", "kafkachannel", "--all", "-n", APP_NS, "--timeout=600s",
                   timeout=660)
        cl.kubectl("wait", "--for=condition=Ready", "broker", "--all", "-n", APP_NS, "--timeout=600s", timeout=660)
        cl.kubectl("wait", "--for=condition=Ready", "trigger", "--all", "-n", APP_NS, "--timeout=600s", timeout=660)
        # What the deleted churn resources had is gone already; what is left goes with the namespace.
        cl.kubectl("delete", "namespace", APP_NS, "--timeout=600s", timeout=660)
    finally:
        stop.set()
        sink.terminate()
        sink.join(10)
        cl.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)

    # No orphans: dispatcher Deployments, topics or consumer groups of the namespace's channels, Broker, Triggers.
    wait("no dispatcher Deployment left", lambda: not dispatchers(cl), timeout=300, interval=2)
    bootstrap = cl.state["bootstrap_servers"]
    ours = (f"{APP_NS}.", f"-{APP_NS}-", f".{APP_NS}.")
    wait("no topic left", lambda: not [t for t in cl.in_netns(clients.topics, bootstrap) if t.startswith(ours[0])
                                       or ours[1] in t], timeout=300, interval=3)
    wait("no consumer group left", lambda: not [g for g in cl.in_netns(clients.consumer_groups, bootstrap)
                                                if any(o in g for o in ours)], timeout=300, interval=3)
    _helm(cl, "uninstall", RELEASE)
