"""Whole system on a kind cluster: the chart installed from charts/kafka-eventing, one event through a KafkaChannel.

For Docker hosts with registry access (kind pulls ``kindest/node``; the cluster pulls ``apache/kafka``). Steps:
a kind cluster; the role images from hack/images.sh loaded into it; a single-node KRaft Kafka (the Apache image,
no Strimzi); ``helm install`` of the chart; a KafkaChannel whose subscriber is a small HTTP sink; one CloudEvent
POSTed to the channel address; the sink must log it; ``helm uninstall`` leaves none of the release's objects. Every
pod runs the restricted security context. The subscriber pod, the KafkaChannel and the checks are those of
tests/e2e/test_cluster.py (tests/e2e/_scenario.py).

Knobs: ``KE_KIND_NODE_IMAGE`` (default: a local ``kindest/node`` image, else ``docker pull`` of DEFAULT_NODE_IMAGE),
``KE_KAFKA_IMAGE``, ``KE_E2E_KEEP_CLUSTER=1`` to leave the cluster up for debugging.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from e2e._engine import CACHE, ROOT, Engine, build_role_images, docker_engine, git_sha
from e2e._scenario import (
    APP_NS,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    SYSTEM_NS,
    assert_release_objects,
    assert_uninstalled,
    kafka_channel,
    pods_ready,
    sink_container,
    sink_events,
    wait,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

DEFAULT_NODE_IMAGE = "kindest/node:v1.34.0"
KAFKA_IMAGE = os.environ.get("KE_KAFKA_IMAGE", "apache/kafka:3.9.1")
KAFKA_NS = "kafka"
RELEASE = "kafka-eventing"

# The sender: POST one binary-mode CloudEvent to the channel address until the receiver answers 202 (the event is
# in Kafka); 404/503 while the channel is not ready yet are retried up to the Job's deadline.
SEND = """
import sys, time, urllib.error, urllib.request
url, event_id = sys.argv[1], sys.argv[2]
while True:
    req = urllib.request.Request(url, data=b'{"hello": "kind"}', method="POST", headers={
        "ce-specversion": "1.0", "ce-id": event_id, "ce-source": "e2e/kind", "ce-type": "dev.kafka-eventing.e2e",
        "content-type": "application/json"})
    try:
        code = urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as err:
        code = err.code
    except OSError as err:
        code = str(err)
    print("receiver answered", code, flush=True)
    if code == 202:
        sys.exit(0)
    time.sleep(2)
"""


@dataclass(frozen=True)
class Tools:
    kind: str
    helm: str
    kubectl: str


@dataclass(frozen=True)
class Cluster:
    name: str
    kubeconfig: Path
    tools: Tools
    env: dict[str, str]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run([self.tools.kubectl, "--kubeconfig", str(self.kubeconfig), *args],
                    self.env, stdin=stdin, timeout=timeout, check=check)

    def apply(self, *docs: dict[str, object]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


def _run(cmd: list[str], env: dict[str, str], stdin: str | None = None, timeout: float = 300,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc


def _find_tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in [CACHE / "bin" / name] if p.is_file() and os.access(p, os.X_OK)), None)


def _node_image(engine: Engine) -> str:
    """The kind node image, present in the engine; skips (with the reason) when it is neither local nor pullable."""
    wanted = os.environ.get("KE_KIND_NODE_IMAGE")
    if wanted and engine.has_image(wanted):
        return wanted
    if not wanted:
        local = engine.docker("image", "ls", "kindest/node", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        local = [ref for ref in local if not ref.endswith(":<none>")]
        if local:
            return sorted(local)[-1]
    ref = wanted or DEFAULT_NODE_IMAGE
    pull = engine.docker("pull", ref, timeout=900, check=False)
    if pull.returncode != 0:
        why = (pull.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"no kindest/node image available locally, and `docker pull {ref}` failed "
                    f"(kind needs a node image from a registry): {why}")
    return ref


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with docker_engine() as eng:
        yield eng


@pytest.fixture(scope="module")
def cluster(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    node_image = _node_image(engine)
    found = {name: _find_tool(name) for name in ("kind", "helm", "kubectl")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(f"not on PATH or in {CACHE / 'bin'}: {', '.join(missing)} (make setup installs them)")
    tools = Tools(**{name: str(path) for name, path in found.items()})
    name = f"ke-e2e-{uuid.uuid4().hex[:6]}"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    env = {**engine.env, "KUBECONFIG": str(kubeconfig)}
    _run([tools.kind, "create", "cluster", "--name", name, "--image", node_image, "--kubeconfig", str(kubeconfig),
          "--wait", "180s"], env, timeout=600)
    try:
        yield Cluster(name, kubeconfig, tools, env)
    finally:
        if os.environ.get("KE_E2E_KEEP_CLUSTER") != "1":
            _run([tools.kind, "delete", "cluster", "--name", name], env, timeout=300, check=False)


def _kafka_manifests() -> list[dict[str, object]]:
    """One combined broker+controller KRaft node (the Apache image's documented env settings), no Strimzi."""
    labels = {"app": "kafka"}
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://kafka.{KAFKA_NS}.svc.cluster.local:9092",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KAFKA_NS}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "kafka", "namespace": KAFKA_NS},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"containers": [{
                 "name": "kafka", "image": KAFKA_IMAGE, "imagePullPolicy": "IfNotPresent",
                 "ports": [{"containerPort": 9092}],
                 "env": [{"name": k, "value": v} for k, v in env.items()],
                 "readinessProbe": {"tcpSocket": {"port": 9092}, "periodSeconds": 2},
             }]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kafka", "namespace": KAFKA_NS},
         "spec": {"selector": labels, "ports": [{"name": "kafka", "port": 9092}]}},
    ]


def _sink_manifests(image: str) -> list[dict[str, object]]:
    labels = {"app": "sink"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sink", "namespace": APP_NS},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"securityContext": RESTRICTED_POD,
                      "containers": [sink_container(image, "IfNotPresent")]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sink", "namespace": APP_NS},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
    ]


def _channel(uid: str) -> dict[str, object]:
    return kafka_channel("demo", {uid: f"http://sink.{APP_NS}.svc.cluster.local/"}, 1,
                         delivery={"retry": 5, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"})


def _send_job(image: str, event_id: str) -> dict[str, object]:
    url = f"http://demo-kn-channel.{APP_NS}.svc.cluster.local/"
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "send", "namespace": APP_NS},
        "spec": {"backoffLimit": 0, "activeDeadlineSeconds": 240, "template": {"spec": {
            "restartPolicy": "Never", "securityContext": RESTRICTED_POD, "containers": [{
                "name": "send", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-c", SEND, url, event_id], "securityContext": RESTRICTED_CONTAINER}]}}},
    }


def _debug(cluster: Cluster) -> str:
    out = []
    for ns in (SYSTEM_NS, APP_NS):
        out.append(cluster.kubectl("get", "all,kafkachannels", "-n", ns, "-o", "wide", check=False).stdout)
    out.append(cluster.kubectl("get", "kafkachannel", "demo", "-n", APP_NS, "-o", "yaml", check=False).stdout)
    out.append(cluster.kubectl("logs", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=controller",
                               "--tail", "50", check=False).stdout)
    return "\n".join(out)


def test_event_sent_to_a_kafkachannel_reaches_its_subscriber(engine: Engine, cluster: Cluster) -> None:
    tag = f"e2e-{git_sha()}"
    images = build_role_images(engine, tag)
    for image in images.values():
        _run([cluster.tools.kind, "load", "docker-image", "--name", cluster.name, image], cluster.env, timeout=600)

    cluster.apply(*_kafka_manifests())
    cluster.kubectl("rollout", "status", "deployment/kafka", "-n", KAFKA_NS, "--timeout=300s", timeout=330)

    # Registry-less image names: with image.registry "" the chart renders kafka-eventing-<role>:<tag>, which is
    # exactly what `kind load` put into the node's containerd.
    values = {
        "image": {"registry": "", "tag": tag, "pullPolicy": "IfNotPresent"},
        "kafka": {"provider": "apache", "bootstrapServers": f"kafka.{KAFKA_NS}.svc.cluster.local:9092"},
        "receiver": {"replicas": 1, "workers": 1},
    }
    helm = [cluster.tools.helm, "--kubeconfig", str(cluster.kubeconfig), "--namespace", SYSTEM_NS]
    _run([*helm, "install", RELEASE, str(ROOT / "charts" / "kafka-eventing"), "--create-namespace",
          "--values", "-", "--wait", "--timeout", "5m"], cluster.env, stdin=json.dumps(values), timeout=360)
    pods_ready(cluster, SYSTEM_NS)

    cluster.apply(*_sink_manifests(images["receiver"]))
    cluster.kubectl("rollout", "status", "deployment/sink", "-n", APP_NS, "--timeout=180s", timeout=200)
    cluster.apply(_channel(str(uuid.uuid4())))
    ready = cluster.kubectl("wait", "--for=condition=Ready", "kafkachannel/demo", "-n", APP_NS,
                            "--timeout=240s", timeout=260, check=False)
    assert ready.returncode == 0, f"KafkaChannel never became Ready:\n{ready.stderr}\n{_debug(cluster)}"

    event_id = f"e2e-{uuid.uuid4()}"
    cluster.apply(_send_job(images["receiver"], event_id))
    sent = cluster.kubectl("wait", "--for=condition=complete", "job/send", "-n", APP_NS, "--timeout=260s",
                           timeout=280, check=False)
    send_log = cluster.kubectl("logs", "job/send", "-n", APP_NS, check=False).stdout
    assert sent.returncode == 0, f"the receiver never answered 202:\n{send_log}\n{_debug(cluster)}"

    # Delivery is asynchronous (dispatcher consumer → sink): poll the sink's log up to a deadline.
    def matching() -> list[dict[str, str]]:
        return [event for event in sink_events(cluster, "deployment/sink") if event["id"] == event_id]

    try:
        delivered = wait(f"event {event_id} at the sink", matching, timeout=180, interval=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{_debug(cluster)}") from None
    assert delivered[0]["type"] == "dev.kafka-eventing.e2e"
    assert json.loads(delivered[0]["data"]) == {"hello": "kind"}

    cluster.kubectl("delete", "namespace", APP_NS, "--timeout=300s", timeout=360)
    assert_release_objects(cluster, RELEASE)
    _run([*helm, "uninstall", RELEASE, "--wait", "--timeout", "5m"], cluster.env, timeout=360)
    assert_uninstalled(cluster, RELEASE, "helm")
