"""The shipped images, chart and overlay on a real kubelet: pods that run (`make test-cluster`, part of `make test`).

The cluster (`kafka_eventing.localstack.cluster`: Kafka, control plane, containerd, kubelet) lives in a network
namespace with no route out, which it checks before it starts. Every client here runs inside that namespace too:
kubectl and helm through ``nsenter``, HTTP and Kafka clients in "spawn" processes that join it first
(tests/e2e/_netns_clients.py). The module fails — it never skips — when the cluster cannot start.

Scenario, once with `helm install` of charts/kafka-eventing (ci/cluster-values.yaml) and once with
`kubectl apply -k` of an overlay on kustomize/base:
every pod Running and Ready → a KafkaChannel (3 partitions) with two subscribers, a pod and a process in the
namespace → events sent to the receiver pods reach both through the dispatcher Deployment the controller created →
channel Ready and every status.subscribers entry ready → (helm) `helm test` → dispatcher scaled to the partition
count and back → a receiver pod and a dispatcher pod deleted mid-load, and every accepted event still reaches both
subscribers (ledger) → channel deleted: dispatcher Deployment and topic gone → (helm, with the chart's Broker and
Trigger CRDs) a Kafka Broker with two Triggers of different filters, one per subscriber: Broker Ready, the
controller-made Broker dispatcher Ready, events POSTed to /<namespace>/<broker> fanned out by filter, Broker deleted:
its dispatcher and topic gone → (helm, with the KafkaSink and KafkaSource CRDs) a KafkaSink written through the
receiver pods' sink ingress and a KafkaSource (2 dispatcher pods) reading its topic into the pod subscriber: every
accepted event arrives as sent, plain records arrive converted, a source dispatcher pod deleted mid-load loses
nothing (ledger), deleting the source removes its Deployment → uninstall leaves none of the release's objects,
namespaced (pods, Deployments, Services, ConfigMaps, Secrets, ServiceAccounts, RBAC, PodDisruptionBudgets,
NetworkPolicies) or cluster-scoped (ClusterRoles, ClusterRoleBindings, selected by the release's instance label).

Then, on the same cluster, the chart with ingress auth (deny-all), an EventPolicy and receiver HTTPS from a Secret:
HTTPS probes pass, the channel's address is https:// with the Secret's CA and its audience, an allowed
ServiceAccount's events (real TokenRequest tokens) get 202 over verified TLS and reach the subscriber as sent, a
denied one gets 403 naming the policy, no token 401, and the topic holds only the allowed events.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from e2e import _netns_clients as clients
from e2e._scenario import (
    APP_NS,
    AUDIT,
    BROKER,
    CREATED,
    KAFKA_SINK,
    KAFKA_SOURCE,
    RESTRICTED_POD,
    SHIPPED,
    SINK_HOST,
    SINK_TOPIC,
    SYSTEM_NS,
    assert_release_objects,
    assert_uninstalled,
    broker_dispatcher,
    broker_ready,
    broker_with_triggers,
    dispatcher_ready,
    dispatchers,
    kafka_channel,
    kafka_sink,
    kafka_source,
    pods_ready,
    role_images,
    sink_container,
    sink_events,
    sink_ids,
    source_dispatcher,
    wait,
)
from kafka_eventing.core import brokers as kb
from kafka_eventing.core import kafkasources as ksrc
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.tools import tool_path

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kafka-eventing"
PARTITIONS = 3


@dataclass
class Cluster:
    state: dict[str, Any]
    images: dict[str, str]  # role -> image reference imported into containerd
    pool: Any = field(repr=False)  # multiprocessing pool whose worker lives in the namespace

    @property
    def pid(self) -> int:
        return int(self.state["pid"])

    @property
    def kubectl_cmd(self) -> list[str]:
        return [str(tool_path("kubectl")), f"--kubeconfig={self.state['kubeconfig']}"]

    def run(self, args: list[str], *, stdin: str | None = None, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*kc.netns_command(self.pid), *args], input=stdin, capture_output=True, text=True,
                             timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise AssertionError(f"`{' '.join(args[:6])} ...` failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run([*self.kubectl_cmd, *args], stdin=stdin, check=check, timeout=timeout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return self.run([str(tool_path("helm")), f"--kubeconfig={self.state['kubeconfig']}", *args],
                        timeout=timeout)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def in_netns(self, fn: Callable[..., Any], *args: Any, timeout: float = 600) -> Any:
        return self.pool.apply_async(fn, args).get(timeout)


def _image_roles() -> dict[str, str]:
    try:
        return role_images(kc.archive_refs())
    except AssertionError as exc:
        pytest.fail(f"{exc} (archives: {kc.image_archives()})")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    images = _image_roles()
    try:
        state = kc.up(ttl=3600)
    except kc.ClusterError as exc:
        kc.down()
        pytest.fail(f"the cluster did not start: {exc}")
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(1, initializer=clients.init, initargs=(int(state["pid"]),))
    try:
        yield Cluster(state, images, pool)
    finally:
        pool.terminate()
        pool.join()
        kc.down()
        assert kc.leftovers() == [], "cluster-down left things behind"


# ---------------------------------------------------------------------------------------------- the scenario


@dataclass
class Install:
    """How one variant installs and removes kafka-eventing, and what it can do beyond that."""

    name: str
    instance: str  # the app.kubernetes.io/instance label of every object it installs
    install: Callable[[Cluster], None]
    uninstall: Callable[[Cluster], None]
    set_dispatcher_replicas: Callable[[Cluster, int], None]
    helm_test: Callable[[Cluster, str], None] | None = None
    brokers: bool = False  # installs the Broker and Trigger CRDs: the Broker scenario runs too
    sources: bool = False  # installs the KafkaSink and KafkaSource CRDs: their scenario runs too


def _sink_pod(cl: Cluster) -> str:
    cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}}, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sink", "namespace": APP_NS},
        "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                 "containers": [sink_container(cl.images["receiver"], "Never")]},
    })
    cl.kubectl("wait", "--for=condition=Ready", "pod/sink", "-n", APP_NS, "--timeout=300s", timeout=360)
    return str(cl.get("pod", "sink", "-n", APP_NS)["status"]["podIP"])


def _ledger_ids(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["id"] for line in path.read_text().splitlines() if line}


def _delivered(cl: Cluster, ledger: Path, ids: list[str], timeout: float = 300) -> None:
    want = set(ids)

    def both() -> bool:
        return want <= _ledger_ids(ledger) and want <= sink_ids(cl, "sink")

    try:
        wait("every accepted event at both subscribers", both, timeout=timeout, interval=2)
    except AssertionError as exc:
        missing_loop = want - _ledger_ids(ledger)
        missing_pod = want - sink_ids(cl, "sink")
        raise AssertionError(f"{exc}: {len(missing_loop)} missing at the namespace process, "
                             f"{len(missing_pod)} at the pod (of {len(want)})") from None


def _send(cl: Cluster, ids: list[str], pace: float = 0.0) -> list[str]:
    accepted: list[str] = cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS,
                                      f"orders-kn-channel.{APP_NS}.svc.cluster.local", ids, pace)
    return accepted


# ---------------------------------------------------------------------------------------------- the Broker


def _send_to_broker(cl: Cluster, ids: list[str], event_type: str) -> None:
    host = f"kafka-eventing-receiver.{SYSTEM_NS}.svc.cluster.local"  # the path, not the Host, names the Broker
    accepted = cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS, host, ids, 0.0, 300.0,
                           f"/{APP_NS}/{BROKER}", event_type)
    assert accepted == ids, f"{len(accepted)} of {len(ids)} {event_type} events accepted"


def run_broker_scenario(cl: Cluster, pod_sink: str, ns_sink: str, ledger: Path) -> None:
    """A Kafka Broker whose two Triggers filter differently: the pod takes order.created only (``filter``), the
    namespace process every order event (``filters``, prefix); an audit event matches neither."""
    cl.apply(*broker_with_triggers(pod_sink, ns_sink))
    broker_ready(cl)
    assert kb.broker_topic(APP_NS, BROKER) in cl.in_netns(clients.topics, cl.state["bootstrap_servers"])

    # A Trigger's consumer group starts at the latest offset once it has joined; until then events pass it by.
    # Whatever reached both subscribers after a warm-up event did, the groups had joined for.
    warm: list[str] = []

    def joined() -> bool:
        warm.append(f"warm-{uuid.uuid4()}")
        _send_to_broker(cl, warm[-1:], CREATED)
        time.sleep(1)
        return bool(set(warm) & _ledger_ids(ledger) & sink_ids(cl, "sink"))

    wait("both Triggers' consumer groups joined", joined, timeout=300, interval=1)
    batches = {t: [f"{t.rsplit('.', 1)[-1]}-{uuid.uuid4()}" for _ in range(10)] for t in (CREATED, SHIPPED, AUDIT)}
    for event_type in (AUDIT, SHIPPED, CREATED):  # the matches last: once they are in, the rest was filtered
        _send_to_broker(cl, batches[event_type], event_type)
    want_pod, want_ns = set(batches[CREATED]), set(batches[CREATED]) | set(batches[SHIPPED])
    wait("fan-out by filter", lambda: want_pod <= sink_ids(cl, "sink") and want_ns <= _ledger_ids(ledger),
         timeout=300, interval=2)
    refused = set(batches[SHIPPED]) | set(batches[AUDIT])
    assert not refused & sink_ids(cl, "sink"), "the pod got what its filter refuses"
    assert not set(batches[AUDIT]) & _ledger_ids(ledger), "the namespace process got what its filter refuses"

    # Deleting the Broker removes its dispatcher and its topic (the finalizer's work).
    cl.kubectl("delete", "broker", BROKER, "-n", APP_NS, "--timeout=300s", timeout=360)
    wait("Broker dispatcher gone", lambda: not broker_dispatcher(cl))
    wait("Broker topic gone", lambda: kb.broker_topic(APP_NS, BROKER) not in cl.in_netns(
        clients.topics, cl.state["bootstrap_servers"]))


# ---------------------------------------------------------------------------------------------- sink and source


def _send_to_sink(cl: Cluster, ids: list[str], pace: float = 0.0) -> list[str]:
    accepted: list[str] = cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS, SINK_HOST, ids, pace, 600.0,
                                      f"/{APP_NS}/{KAFKA_SINK}", "com.example.sink")
    return accepted


def run_source_scenario(cl: Cluster, pod_sink: str) -> None:
    """KafkaSink → its topic → KafkaSource dispatcher pods → the pod subscriber, with the ledger check."""
    cl.apply(kafka_sink(cl.state["bootstrap_servers"]))
    cl.kubectl("wait", "--for=condition=Ready", f"kafkasink/{KAFKA_SINK}", "-n", APP_NS, "--timeout=600s",
               timeout=660)
    cl.apply(kafka_source(cl.state["bootstrap_servers"], pod_sink))  # its topic exists now
    cl.kubectl("wait", "--for=condition=Ready", f"kafkasource/{KAFKA_SOURCE}", "-n", APP_NS, "--timeout=600s",
               timeout=660)
    sink = cl.get("kafkasink", KAFKA_SINK, "-n", APP_NS)
    assert sink["status"]["address"]["url"] == f"http://{SINK_HOST}/{APP_NS}/{KAFKA_SINK}", sink["status"]
    source = cl.get("kafkasource", KAFKA_SOURCE, "-n", APP_NS)
    assert source["status"]["sinkUri"] == pod_sink and source["status"]["consumers"] == 2, source["status"]
    wait("source dispatcher pods ready", lambda: [d for d in source_dispatcher(cl)
                                                  if d["status"].get("readyReplicas") == 2], timeout=600, interval=2)

    # Written through the receiver pods (the sink ingress Host), read by the source's pods: every id, as sent.
    first = [f"sink-{uuid.uuid4()}" for _ in range(20)]
    assert _send_to_sink(cl, first) == first
    wait("events written through the KafkaSink at the pod", lambda: set(first) <= sink_ids(cl, "sink"),
         timeout=300, interval=2)
    got = {e["id"]: e for e in sink_events(cl, "sink")}
    assert {got[i]["type"] for i in first} == {"com.example.sink"}
    assert [json.loads(got[i]["data"]) for i in first] == [{"n": n} for n in range(len(first))]

    # Records that are not CloudEvents arrive converted, as upstream converts them.
    plain = [(f"k{n}".encode(), f"plain-{n}-{uuid.uuid4()}".encode()) for n in range(5)]
    cl.in_netns(clients.produce_plain, cl.state["bootstrap_servers"], SINK_TOPIC, plain)
    values = {v.decode() for _, v in plain}
    wait("plain records at the pod", lambda: values <= {e["data"] for e in sink_events(cl, "sink")},
         timeout=300, interval=2)
    converted = [e for e in sink_events(cl, "sink") if e["data"] in values]
    assert {e["type"] for e in converted} == {ksrc.EVENT_TYPE}
    assert all(e["id"].startswith("partition:0/offset:") for e in converted), converted

    # A source dispatcher pod deleted mid-load: whatever the sink accepted still reaches the subscriber.
    load = [f"srcload-{uuid.uuid4()}" for _ in range(200)]
    pending = cl.pool.apply_async(clients.send_events, (cl.kubectl_cmd, SYSTEM_NS, SINK_HOST, load, 0.02, 600,
                                                        f"/{APP_NS}/{KAFKA_SINK}", "com.example.sink"))
    time.sleep(2)
    pod = cl.get("pods", "-n", SYSTEM_NS, "-l",
                 f"kafka.eventing.knative.dev/dispatcher={source_dispatcher(cl)[0]['metadata']['name']}")
    cl.kubectl("delete", "pod", "-n", SYSTEM_NS, pod["items"][0]["metadata"]["name"], "--wait=false")
    accepted = pending.get(900)
    assert len(accepted) == len(load), f"only {len(accepted)} of {len(load)} events accepted by the KafkaSink"
    wait("every accepted event through the source", lambda: set(accepted) <= sink_ids(cl, "sink"),
         timeout=600, interval=2)

    # Deleting the source removes its dispatcher Deployment (then its consumer group).
    cl.kubectl("delete", "kafkasource", KAFKA_SOURCE, "-n", APP_NS, "--timeout=300s", timeout=360)
    wait("source dispatcher gone", lambda: not source_dispatcher(cl))
    cl.kubectl("delete", "kafkasink", KAFKA_SINK, "-n", APP_NS, "--timeout=300s", timeout=360)


def run_scenario(cl: Cluster, variant: Install, tmp_path: Path) -> None:
    variant.install(cl)
    pods_ready(cl, SYSTEM_NS)

    pod_ip = _sink_pod(cl)
    port = free_port()  # a free port in the namespace is free: nothing else listens in it but the cluster
    ledger = tmp_path / f"{variant.name}-ledger.jsonl"
    sink = multiprocessing.get_context("spawn").Process(
        target=clients.run_sink, args=(cl.pid, kc.NODE_IP, port, str(ledger), 1800), daemon=True)
    sink.start()
    try:
        cl.apply(kafka_channel("orders", {"sub-pod": f"http://{pod_ip}:8080/",
                                          "sub-ns": f"http://{kc.NODE_IP}:{port}/"}, PARTITIONS))
        cl.kubectl("wait", "--for=condition=Ready", "kafkachannel/orders", "-n", APP_NS, "--timeout=600s",
                   timeout=660)

        def subscribers_ready() -> bool:
            subs = cl.get("kafkachannel", "orders", "-n", APP_NS).get("status", {}).get("subscribers") or []
            return {s.get("uid") for s in subs if s.get("ready") == "True"} == {"sub-pod", "sub-ns"}

        wait("status.subscribers ready", subscribers_ready)
        deps = dispatchers(cl)
        assert len(deps) == 1, [d["metadata"]["name"] for d in deps]
        assert deps[0]["metadata"]["annotations"]["kafka.eventing.knative.dev/channel"] == f"{APP_NS}/orders"
        wait("dispatcher pod ready", lambda: dispatcher_ready(cl, 1))

        # Events to the receiver pods reach both subscribers through the controller-made dispatcher.
        first = [f"first-{uuid.uuid4()}" for _ in range(20)]
        assert _send(cl, first) == first
        _delivered(cl, ledger, first)

        if variant.helm_test:
            variant.helm_test(cl, cl.in_netns(clients.receiver_ips, cl.kubectl_cmd, SYSTEM_NS)[0])

        # Dispatcher up to the partition count and back; delivery goes on at each size.
        for replicas in (PARTITIONS, 1):
            variant.set_dispatcher_replicas(cl, replicas)
            wait(f"dispatcher at {replicas} ready replicas", lambda r=replicas: dispatcher_ready(cl, r),
                  timeout=600, interval=2)
            batch = [f"scale{replicas}-{uuid.uuid4()}" for _ in range(10)]
            assert _send(cl, batch) == batch
            _delivered(cl, ledger, batch)

        # Mid-load: a receiver pod and the dispatcher pod are deleted; whatever got a 202 must arrive.
        load = [f"load-{uuid.uuid4()}" for _ in range(300)]
        pending = cl.pool.apply_async(clients.send_events, (cl.kubectl_cmd, SYSTEM_NS,
                                                            f"orders-kn-channel.{APP_NS}.svc.cluster.local",
                                                            load, 0.02, 600))
        time.sleep(2)
        receiver = cl.get("pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=receiver")["items"][0]
        dispatcher = cl.get("pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=kafka-channel-dispatcher")
        cl.kubectl("delete", "pod", "-n", SYSTEM_NS, receiver["metadata"]["name"], "--wait=false")
        time.sleep(1)
        cl.kubectl("delete", "pod", "-n", SYSTEM_NS, dispatcher["items"][0]["metadata"]["name"], "--wait=false")
        accepted = pending.get(900)
        assert len(accepted) == len(load), f"only {len(accepted)} of {len(load)} events were accepted"
        _delivered(cl, ledger, accepted, timeout=600)
        pods_ready(cl, SYSTEM_NS)

        # Deleting the channel removes its dispatcher and its topic.
        cl.kubectl("delete", "kafkachannel", "orders", "-n", APP_NS, "--timeout=300s", timeout=360)
        wait("dispatcher Deployment gone", lambda: not dispatchers(cl))
        wait("topic gone", lambda: f"{APP_NS}.orders" not in cl.in_netns(clients.topics,
                                                                           cl.state["bootstrap_servers"]))

        if variant.brokers:
            run_broker_scenario(cl, f"http://{pod_ip}:8080/", f"http://{kc.NODE_IP}:{port}/", ledger)
        if variant.sources:
            run_source_scenario(cl, f"http://{pod_ip}:8080/")
    finally:
        sink.terminate()
        sink.join(10)
        cl.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)

    assert_release_objects(cl, variant.instance)
    variant.uninstall(cl)
    assert_uninstalled(cl, variant.instance, variant.name)
    cl.kubectl("delete", "namespace", SYSTEM_NS, "--ignore-not-found", "--timeout=300s", timeout=360)


# ---------------------------------------------------------------------------------------------- helm


def _helm_install(cl: Cluster) -> None:
    cl.helm("install", "ke", str(CHART), "-n", SYSTEM_NS, "--create-namespace",
            "-f", str(CHART / "ci" / "cluster-values.yaml"),
            "--set-string", f"image.tag={cl.images['receiver'].rsplit(':', 1)[1]}",
            "--set", f"kafka.bootstrapServers={cl.state['bootstrap_servers']}",
            "--set", f"tests.image={cl.images['curl']}", "--set", "crds.brokers=true",
            "--set", "crds.sinks=true", "--set", "crds.sources=true", "--wait", "--timeout=10m")


def _helm_set(cl: Cluster, *values: str) -> None:
    args = [a for v in values for a in ("--set", v)]
    cl.helm("upgrade", "ke", str(CHART), "-n", SYSTEM_NS, "--reuse-values", *args, "--wait", "--timeout=10m")


def _helm_test(cl: Cluster, receiver_ip: str) -> None:
    # No cluster DNS or Service routing here: the test Pod is pointed at a receiver pod.
    _helm_set(cl, f"tests.receiverURL=http://{receiver_ip}:8080/")
    out = cl.helm("test", "ke", "-n", SYSTEM_NS, "--timeout=10m")
    assert "Phase:          Succeeded" in out.stdout, out.stdout


def _helm_uninstall(cl: Cluster) -> None:
    cl.helm("uninstall", "ke", "-n", SYSTEM_NS, "--wait", "--timeout=5m")


HELM = Install("helm", "ke", _helm_install, _helm_uninstall,
               lambda cl, n: _helm_set(cl, f"dispatcher.replicas={n}"), _helm_test, brokers=True,
               sources=True)


def test_chart_on_real_pods(cluster: Cluster, tmp_path: Path) -> None:
    run_scenario(cluster, HELM, tmp_path)


# ---------------------------------------------------------------------------------------------- kustomize


def _write_overlay(cl: Cluster, root: Path, dispatcher_replicas: int = 1) -> Path:
    """An overlay of kustomize/base for this cluster: the imported images, Kafka on the node address."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.env").write_text(f"KE_BOOTSTRAP_SERVERS={cl.state['bootstrap_servers']}\n"
                                     f"KE_DISPATCHER_REPLICAS={dispatcher_replicas}\nKE_LOG_FORMAT=console\n")
    # The base is rendered from the chart, so its image names are the chart's: registry + each role's repository.
    values = yaml.safe_load((ROOT / "charts" / "kafka-eventing" / "values.yaml").read_text())
    images = []
    for role in ("receiver", "controller", "dispatcher"):
        name, tag = cl.images[role].rsplit(":", 1)
        chart_name = f"{values['image']['registry']}/{values[role]['image']['repository']}"
        images.append({"name": chart_name, "newName": name, "newTag": tag})
    # JSON (a YAML subset) quotes every string: a git-hash tag like 295e021 written bare by PyYAML (a string under
    # its YAML 1.1 rules) is a number to kustomize's YAML 1.2 parser, which then refuses the image.
    (root / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": SYSTEM_NS,
        "resources": [os.path.relpath(ROOT / "kustomize" / "base", root)],
        "configMapGenerator": [{"name": "kafka-eventing-config", "behavior": "merge", "envs": ["params.env"]}],
        "images": images,
    }, indent=2))
    return root


def test_overlay_on_real_pods(cluster: Cluster, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"

    def apply(cl: Cluster, dispatcher_replicas: int = 1) -> None:
        _write_overlay(cl, overlay, dispatcher_replicas)
        # Server-side, taking over the CRD the chart's run left (crds.keep).
        cl.kubectl("apply", "-k", str(overlay), "--server-side", "--force-conflicts", timeout=300)

    def uninstall(cl: Cluster) -> None:
        # The CRD stays, as with the chart's crds.keep: deleting it would delete every KafkaChannel.
        rendered = cl.kubectl("kustomize", str(overlay)).stdout
        docs = [d for d in yaml.safe_load_all(rendered)
                if d and d["kind"] not in ("CustomResourceDefinition", "Namespace")]
        cl.kubectl("delete", "-f", "-", "--wait=true", "--timeout=300s", stdin=yaml.safe_dump_all(docs),
                   timeout=360)
        # Earlier generations of the hashed settings ConfigMap (each replicas change made one).
        cl.kubectl("delete", "configmap", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/instance=kafka-eventing")

    # A new KE_DISPATCHER_REPLICAS makes a new hashed ConfigMap, which rolls the controller, which rescales.
    run_scenario(cluster, Install("kustomize", "kafka-eventing", apply, uninstall, apply), tmp_path)


# ---------------------------------------------------------------------------------------------- auth and TLS

# The subscriber of the secure channel: logs every header and the body (base64) of each event, to check them
# against what was sent.
RECORDING_SINK = """
import base64, http.server, json, sys, threading
lock = threading.Lock()
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        line = json.dumps({"id": self.headers.get("ce-id"), "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": base64.b64encode(body).decode()})
        with lock:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", 8080), Sink).serve_forever()
"""
SECURE = "secure"
SECURE_HOST = f"{SECURE}-kn-channel.{APP_NS}.svc.cluster.local"
TLS_SECRET = "receiver-tls"
POLICY = "secure-senders"


def _secure_install(cl: Cluster, ca_pem: str, cert: Any) -> None:
    """The chart with ingress auth (deny-all, the cluster's issuer), its EventPolicy CRD and receiver HTTPS from a
    Secret made here (no cert-manager in this cluster)."""
    cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}}, {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": TLS_SECRET, "namespace": SYSTEM_NS},
        "stringData": {"tls.crt": cert.cert_pem.decode(), "tls.key": cert.key_pem.decode(), "ca.crt": ca_pem}})
    cl.helm("install", "ke", str(CHART), "-n", SYSTEM_NS, "-f", str(CHART / "ci" / "cluster-values.yaml"),
            "--set-string", f"image.tag={cl.images['receiver'].rsplit(':', 1)[1]}",
            "--set", f"kafka.bootstrapServers={cl.state['bootstrap_servers']}",
            "--set", "crds.eventPolicies=true", "--set", "receiver.auth.enabled=true",
            # The cluster's token issuer: the `kubernetes` Service IP, which pods reach (no cluster DNS here).
            "--set", f"receiver.auth.issuer=https://{kc.SERVICE_IP}", "--set", "receiver.auth.defaultMode=deny-all",
            "--set", "receiver.tls.enabled=true", "--set", f"receiver.tls.secretName={TLS_SECRET}",
            "--wait", "--timeout=10m")


def test_auth_policy_and_tls_on_real_pods(cluster: Cluster) -> None:
    """Ingress auth, an EventPolicy and receiver HTTPS on the receiver pods: the controller publishes the https://
    address with the CA and audience; an allowed ServiceAccount's events get 202 over verified TLS and reach the
    subscriber as sent; a denied ServiceAccount gets 403 naming the policy, no token 401, and neither is on the
    topic."""
    from kafka_eventing.core.settings import Settings
    from kafka_eventing.localstack.tls import CertificateAuthority

    cl = cluster
    ca = CertificateAuthority("e2e receiver CA")
    ca_pem = ca.cert_pem.decode()
    cert = ca.issue("kafka-channel-receiver", (
        f"kafka-channel-receiver.{SYSTEM_NS}.svc", f"kafka-channel-receiver.{SYSTEM_NS}.svc.cluster.local",
        f"*.{APP_NS}.svc.cluster.local"))
    _secure_install(cl, ca_pem, cert)
    try:
        pods_ready(cl, SYSTEM_NS)  # the HTTPS probes pass
        receiver = cl.get("deployment", "ke-kafka-eventing-receiver", "-n", SYSTEM_NS)["spec"]["template"]["spec"]
        (port,) = [p["containerPort"] for p in receiver["containers"][0]["ports"] if p["name"] == "https"]

        cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}},
                 *({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": APP_NS}}
                   for n in ("allowed", "denied")),
                 {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sink", "namespace": APP_NS},
                  "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                           "containers": [{**sink_container(cl.images["receiver"], "Never"),
                                           "command": ["python", "-c", RECORDING_SINK]}]}})
        cl.kubectl("wait", "--for=condition=Ready", "pod/sink", "-n", APP_NS, "--timeout=300s", timeout=360)
        sink_ip = cl.get("pod", "sink", "-n", APP_NS)["status"]["podIP"]
        channel_ref = {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel", "name": SECURE}
        cl.apply(kafka_channel(SECURE, {"sub": f"http://{sink_ip}:8080/"}, 1), {
            "apiVersion": "eventing.knative.dev/v1alpha1", "kind": "EventPolicy",
            "metadata": {"name": POLICY, "namespace": APP_NS},
            "spec": {"to": [{"ref": channel_ref}],
                     "from": [{"ref": {"apiVersion": "v1", "kind": "ServiceAccount", "name": "allowed",
                                       "namespace": APP_NS}}]}})
        cl.kubectl("wait", "--for=condition=Ready", f"kafkachannel/{SECURE}", "-n", APP_NS, "--timeout=600s",
                   timeout=660)
        wait("dispatcher pod ready", lambda: dispatcher_ready(cl, 1), timeout=600, interval=2)
        # The subscription's consumer group has joined (it starts at the latest offset): what is sent now arrives.
        wait("status.subscribers ready", lambda: [
            s for s in cl.get("kafkachannel", SECURE, "-n", APP_NS)["status"].get("subscribers") or ()
            if s.get("uid") == "sub" and s.get("ready") == "True"], timeout=300, interval=2)

        # The controller learnt the receiver serves HTTPS: the address is https:// with the Secret's CA.
        address = cl.get("kafkachannel", SECURE, "-n", APP_NS)["status"]["address"]
        assert address["url"] == f"https://{SECURE_HOST}", address
        assert address["CACerts"].strip() == ca_pem.strip()
        audience = address["audience"]
        assert audience == f"messaging.knative.dev/kafkachannel/{APP_NS}/{SECURE}", address
        wait("the channel's status.policies names the policy", lambda: [
            p for p in cl.get("kafkachannel", SECURE, "-n", APP_NS)["status"].get("policies") or ()
            if p.get("name") == POLICY], timeout=120, interval=2)

        def token(account: str) -> str:
            return cl.kubectl("create", "token", account, "-n", APP_NS, f"--audience={audience}",
                              "--duration=10m").stdout.strip()

        allowed, denied = token("allowed"), token("denied")

        def post(ip: str, event_id: str, bearer: str | None, extra: dict[str, str] | None = None,
                 body: bytes = b'{"order": 1}') -> tuple[int, str]:
            headers = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/e2e/secure",
                       "ce-type": "com.example.secure", "content-type": "application/json", **(extra or {})}
            if bearer:
                headers["authorization"] = f"Bearer {bearer}"
            try:
                status_text: tuple[int, str] = cl.in_netns(clients.post_tls, ip, port, SECURE_HOST, "/", headers,
                                                           body, ca_pem)
            except httpx.TransportError as exc:
                # A receiver pod replaced since it was listed (evicted, restarted elsewhere) has no address any more;
                # 0 makes the caller list the pods again, and what the pods were doing is kept for the failure text.
                pods = cl.kubectl("get", "pods", "-n", SYSTEM_NS, "-o", "wide", check=False).stdout
                return 0, f"{exc!r}\n{pods}"
            return status_text

        # Every receiver pod has read the policy once the allowed sender gets through (deny-all before that). The
        # pods are listed afresh each round, so one replaced meanwhile is checked at its new address.
        sent: dict[str, tuple[dict[str, str], bytes]] = {}
        accepted: set[str] = set()
        pending: list[str] = []

        def every_receiver_accepts() -> bool:
            receivers = cl.in_netns(clients.receiver_ips, cl.kubectl_cmd, SYSTEM_NS)
            pending[:] = [] if len(receivers) == 2 else [f"ready receiver pods: {receivers}"]
            for ip in set(receivers) - accepted:
                event_id = f"allowed-{len(sent)}-{uuid.uuid4()}"
                extra = {"ce-subject": "order/1", "ce-time": "2026-11-27T05:00:00.123456789+02:00",
                         "ce-shopregion": "eu-west", "ce-dataschema": "https://example.com/order.json"}
                body = json.dumps({"n": len(sent), "name": "café"}).encode()
                status, text = post(ip, event_id, allowed, extra, body)
                if status == 202:
                    accepted.add(ip)
                    sent[event_id] = (extra, body)
                else:
                    pending.append(f"{ip}: {status} {text[:2000]}")
            return not pending and accepted >= set(receivers)

        try:
            wait("the allowed sender accepted by every receiver pod", every_receiver_accepts, timeout=180, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(pending)) from None

        receivers = cl.in_netns(clients.receiver_ips, cl.kubectl_cmd, SYSTEM_NS)
        refused = []
        for n, ip in enumerate(receivers):
            status, text = post(ip, f"denied-{n}-{uuid.uuid4()}", denied)
            assert status == 403 and POLICY in text, (ip, status, text)
            status, text = post(ip, f"anonymous-{n}-{uuid.uuid4()}", None)
            assert status == 401, (ip, status, text)
            refused.append(n)

        # The allowed events arrive at the subscriber as sent: every attribute, extension and data byte.
        def arrived() -> dict[str, Any]:
            return {e["id"]: e for e in sink_events(cl, "sink") if e["id"] in sent}

        try:
            got = wait("the allowed events at the subscriber", lambda: len(arrived()) == len(sent) and arrived(),
                       timeout=300, interval=2)
        except AssertionError as exc:
            logs = cl.kubectl("logs", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=kafka-channel-dispatcher",
                              "--tail=40", check=False)
            raise AssertionError(f"{exc}\ndispatcher logs:\n{logs.stdout}{logs.stderr}") from None
        for event_id, (extra, body) in sent.items():
            headers = got[event_id]["headers"]
            want = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/e2e/secure",
                    "ce-type": "com.example.secure", **extra}
            assert {k: v for k, v in headers.items() if k.startswith("ce-")} == want, headers
            assert headers["content-type"] == "application/json", headers
            assert "authorization" not in headers  # the sender's token is not passed on
            assert base64.b64decode(got[event_id]["body"]) == body

        # Refused requests wrote nothing: the topic holds exactly the allowed events.
        topic = Settings().topic_for(APP_NS, SECURE)
        on_topic = cl.in_netns(clients.topic_event_ids, cl.state["bootstrap_servers"], topic)
        assert sorted(on_topic) == sorted(sent), on_topic
        assert len(refused) == len(receivers)
    finally:
        cl.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)
        cl.helm("uninstall", "ke", "-n", SYSTEM_NS, "--wait", "--timeout=5m")
        cl.kubectl("delete", "namespace", SYSTEM_NS, "--ignore-not-found", "--timeout=300s", timeout=360)
