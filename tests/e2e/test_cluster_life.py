"""Leader chaos on the real-pod cluster (`make test-cluster`): the controller's lease holder and one dispatcher pod
killed every 20 s while events flow and resources churn; the ledger, readiness and no orphans checked afterwards.
The cluster is the tier's one, shared with test_cluster.py (tests/e2e/conftest.py). Knative's upgrade prober across
an install's life (tests/e2e/_life.py) runs on kind, where users meet the chart (test_kind.py's
test_prober_across_upgrade_values_roll_and_rollback).
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from e2e import _netns_clients as clients
from e2e._life import CHART, RELEASE, helm
from e2e._pod_cluster import Cluster
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
from kafka_eventing.core import brokers as kb
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack._proc import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]


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
    helm(cl, "install", RELEASE, str(CHART), "--create-namespace", "-f", str(CHART / "ci" / "cluster-values.yaml"),
         "--set-string", f"image.tag={cl.images['receiver'].rsplit(':', 1)[1]}",
         "--set", f"kafka.bootstrapServers={cl.state['bootstrap_servers']}", "--set", "crds.brokers=true",
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
    cl.kubectl("delete", "namespace", SYSTEM_NS, "--timeout=300s", timeout=360)  # the lease goes with it
