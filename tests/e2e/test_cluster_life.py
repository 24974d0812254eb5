"""Nothing lost across an install's life on the real-pod cluster (`make test-cluster`).

1. Knative's upgrade prober (wathola sender, receiver and fetcher pods) through a KafkaChannel and a Broker + Trigger
   across `helm install` of the previous chart version, `helm upgrade` to this one, a values change that rolls every
   pod and `helm rollback`: the scenario of tests/e2e/_life.py, which test_kind.py runs on kind too. The wathola
   binaries are one image archive the cluster imports at start. The cluster has no Service routing, so the senders
   reach the receiver pods through ``run_service`` (tests/e2e/_netns_clients.py), a relay standing in for
   kube-proxy: a rolled receiver pod closes its connections and the sender reconnects to another, as with a Service.
2. Leader chaos: the controller's lease holder and one dispatcher pod killed every 20 s while events flow and
   resources churn; the ledger, readiness and no orphans checked afterwards.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from e2e import _life as life
from e2e import _netns_clients as clients
from e2e._life import RELEASE, helm
from e2e._scenario import (
    APP_NS,
    BROKER,
    DISPATCHER_SELECTOR,
    SYSTEM_NS,
    broker_with_triggers,
    dispatchers,
    get,
    kafka_channel,
    pods_ready,
    wait,
)
from e2e.test_cluster import Cluster, _image_roles
from kafka_eventing.core import brokers as kb
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack._proc import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    images = _image_roles()
    # The cluster imports every archive of its images folder at start: the prober's goes there for this start only.
    archive = kc.workdir() / "images" / "wathola.tar"
    try:
        life.wathola_archive(archive)
    except AssertionError as exc:
        pytest.fail(str(exc))
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


def _chart_args(cl: Cluster, chart: Path) -> list[str]:
    return ["-f", str(chart / "ci" / "cluster-values.yaml"),
            "--set-string", f"image.tag={cl.images['receiver'].rsplit(':', 1)[1]}",
            "--set", f"kafka.bootstrapServers={cl.state['bootstrap_servers']}",
            "--set", f"tests.image={cl.images['curl']}", "--set", "crds.brokers=true"]


def _tier(cl: Cluster) -> life.Tier:
    """The prober's clients run in the cluster's namespace (the pool); the senders post to a relay on the node
    address, the channel's host name pointing there by a host alias (no cluster DNS)."""

    def send(url: str, event_id: str, event_type: str) -> list[str]:
        # To a receiver pod, the address's host as the Host header (it names the channel) and its path (the Broker).
        address = urlsplit(url)
        ids: list[str] = cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS, address.netloc, [event_id],
                                     0.0, 60.0, address.path or "/", event_type)
        return ids

    def report(receiver_ip: str) -> dict[str, Any]:
        found: dict[str, Any] = cl.in_netns(clients.get_json, f"http://{receiver_ip}:{life.WATHOLA_PORT}/report")
        return found

    @contextmanager
    def senders() -> Iterator[dict[str, life.Sender]]:
        port = free_port()
        relay = multiprocessing.get_context("spawn").Process(
            target=clients.run_service, args=(cl.pid, kc.NODE_IP, port, cl.kubectl_cmd, SYSTEM_NS, 3000),
            daemon=True)
        relay.start()
        try:
            yield {"channel": life.Sender(f"http://{life.CHANNEL_HOST}:{port}/", ((kc.NODE_IP, life.CHANNEL_HOST),)),
                   "broker": life.Sender(f"http://{kc.NODE_IP}:{port}/{APP_NS}/{BROKER}")}
        finally:
            relay.terminate()
            relay.join(10)

    return life.Tier(cl, lambda chart: _chart_args(cl, chart), send, report, senders)


def test_upgrade_values_roll_and_rollback_lose_nothing(cluster: Cluster, tmp_path: Path) -> None:
    life.upgrade_values_roll_and_rollback(_tier(cluster), tmp_path)


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
    helm(cl, "install", RELEASE, str(life.CHART), "--create-namespace", *_chart_args(cl, life.CHART),
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
    helm(cl, "uninstall", RELEASE)
