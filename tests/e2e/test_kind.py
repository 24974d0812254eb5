"""The chart on kind, as its users run it (`make test-kind`, part of `make e2e`): never skipped. The one tier for the
chart's channel, Broker and KafkaSink/KafkaSource scenario with `helm test`, Knative's upgrade prober and the Spark
executor pods; the real-pod tier (tests/e2e/test_cluster*.py) keeps only what kind cannot show (leader kills, a
crashed cluster supervisor, the Kustomize overlay, auth and TLS on a bare kubelet).

Everything runs on the kind engine (``kafka_eventing.localstack.kind``): a private dockerd in a network namespace
with no route out, started here and stopped at the end; kind, kubectl, helm and ct run inside that namespace. The
node image is ``make kind-image``'s (hack/kind/node-image.sh: Debian packages and Go modules, no registry), the role
images and the curl image of ``helm test`` are the archive ``make cluster-images`` saves, the Kafka image is built
from the Kafka jars ``make setup`` fetched (hack/kind/kafka-image.sh), Knative's wathola prober is one image archive
of the binaries ``make setup`` built (tests/e2e/_life.py), the Spark image is ``make cluster-spark-image``'s archive;
all go in with ``kind load``.

Scenario (one kind cluster, static bridge CNI, cluster DNS and kube-proxy Services):
a single-node KRaft Kafka in the cluster with a PLAINTEXT listener (Service ``kafka``, the chart's ci default) and a
SASL_SSL + SCRAM-SHA-512 one (Service ``my-cluster-kafka-bootstrap``, the Strimzi preset's address) → the previous
chart version (from git) installed with ``helm install`` and the Strimzi provider preset (``values-strimzi.yaml``,
its connection Secret made here) → ``helm upgrade`` to this chart → every pod Ready → a KafkaChannel with two
subscriber Deployments reached by Service name → events POSTed by an in-cluster sender reach both → ``helm test`` →
the dispatcher scaled to the partition count and back by ``helm upgrade`` of ``dispatcher.replicas``, delivery at
each size → a receiver pod and the dispatcher pod deleted mid-load, every 202-accepted event still delivered to both
(ledger) → channel deleted: dispatcher and topic gone → a Kafka Broker with two Triggers of different filters,
fan-out by filter → a KafkaSink written through the receiver pods' sink ingress Service (its status address) and a
KafkaSource (2 dispatcher pods) reading its topic into a subscriber Deployment: events arrive with their type and
data as sent, plain records converted as upstream converts them, a source pod deleted mid-load (ledger) →
``helm uninstall`` leaves none of the release's objects. Then Knative's upgrade prober across a second install's life
(tests/e2e/_life.py): wathola senders posting a numbered step every 10 ms to the KafkaChannel's and the Broker's
addresses (Service names), a wathola receiver behind each, through ``helm install`` of the previous chart version
with the Strimzi preset → ``helm upgrade`` → a values change rolling every pod → ``helm rollback``;
wathola-fetcher's report must say success, nothing missing (duplicates printed), and the uninstall leave nothing.
Then ``ct install`` (install, ``helm test``, uninstall) of the chart with every ci values file this cluster can
serve. Then the reprocess jobs on Spark executor pods (tests/e2e/_spark_pods.py): the chart's archive and replay
with ``reprocess.cluster`` on, the driver reaching the API server by the ``kubernetes`` Service's name, equal to
local mode; an executor pod killed mid-archive and one killed mid-replay (the folder the jobs write is a host folder
mounted into the node at the same path, so the test reads the archive and the journals). ``kind delete cluster``;
the engine stopped; the test itself checks that the host keeps its sysctls and has no new mount, process, cgroup,
network interface or network namespace, also after a failure (tests/e2e/test_kind_crash.py: after a crashed engine
too).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import _life as life
from e2e import _spark_pods as spark_pods
from e2e._host import assert_host_unchanged, hold_netns, host_state
from e2e._life import RELEASE, previous_chart, release
from e2e._scenario import (
    APP_NS,
    AUDIT,
    BROKER,
    CREATED,
    KAFKA_SINK,
    KAFKA_SOURCE,
    PART_OF,
    RESTRICTED_CONTAINER,
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
    get,
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
from kafka_eventing.localstack import kind as engine_mod
from kafka_eventing.localstack.tls import CertificateAuthority
from kafka_eventing.localstack.tools import tool_path

pytestmark = [pytest.mark.kind, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = life.CHART
KAFKA_NS = "kafka"
SCRAM_USER = "kafka-eventing"
PARTITIONS = 3
#: `make cluster-spark-image`'s archive: the reprocess jobs' image, loaded with the role images.
SPARK_IMAGE = kc.workdir() / "spark" / "kafka-eventing-spark.tar"

# An in-cluster sender (the receiver image's Python): POSTs ``count`` binary CloudEvents, retrying each until the
# receiver answers 202 (the event is in Kafka) or the deadline passes; prints one JSON line per accepted id.
SEND = """
import json, sys, time, urllib.error, urllib.request
url, prefix, count, pace, event_type = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
deadline = time.monotonic() + float(sys.argv[6])
for n in range(count):
    event_id = f"{prefix}-{n}"
    while True:
        req = urllib.request.Request(url, data=json.dumps({"n": n}).encode(), method="POST", headers={
            "ce-specversion": "1.0", "ce-id": event_id, "ce-source": "e2e/kind", "ce-type": event_type,
            "content-type": "application/json"})
        try:
            code = urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as err:
            code = err.code
        except OSError:
            code = 0
        if code == 202:
            print(json.dumps({"accepted": event_id}), flush=True)
            break
        if time.monotonic() > deadline:
            print(json.dumps({"gave_up": event_id, "code": code}), flush=True)
            sys.exit(1)
        time.sleep(0.5)
    time.sleep(pace)
"""
TOPICS = """
import json, sys
from confluent_kafka.admin import AdminClient
print(json.dumps(sorted(AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=20).topics)))
"""


# ---------------------------------------------------------------------------------------------- the host


@pytest.fixture(scope="module")
def engine() -> Iterator[dict[str, Any]]:
    # An engine a crashed or manual run left is stopped first: the host is compared with itself without one.
    engine_mod.down()
    before = host_state()
    state: dict[str, Any] = {}
    held = None
    try:
        state = engine_mod.up(ttl=3600)
        held = hold_netns(state)
        yield state
    except engine_mod.EngineError as exc:
        pytest.fail(f"the kind engine did not start: {exc}")
    finally:
        # After a failing run as after a passing one (and after an engine that failed to start).
        engine_mod.down()
        try:
            assert_host_unchanged(before, state.get("netns_inode"))
        finally:
            if held is not None:
                os.close(held)


# ---------------------------------------------------------------------------------------------- the cluster


@dataclass
class Kind:
    name: str
    state: dict[str, Any]
    kubeconfig: Path
    images: dict[str, str]
    shared: Path  # a host folder the node has at the same path (the Spark jobs' hostPath volume)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.state["docker_host"], "KUBECONFIG": str(self.kubeconfig),
                "PATH": f"{tool_path('kind').parent}:{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}

    def run(self, args: list[str], *, stdin: str | None = None, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*kc.netns_command(int(self.state["pid"])), *args], input=stdin, env=self.env,
                             capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT)
        if check and out.returncode != 0:
            raise AssertionError(f"`{' '.join(args[:8])} ...` failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run([str(tool_path("kubectl")), *args], stdin=stdin, check=check, timeout=timeout)

    def helm(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return self.run([str(tool_path("helm")), *args], timeout=timeout)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """Print how long a step took (``pytest -s``): where a run's minutes go."""
    t0 = time.monotonic()
    yield
    print(f"[kind] {what}: {time.monotonic() - t0:.0f}s", flush=True)


def _script(name: str, engine_state: dict[str, Any]) -> str:
    proc = subprocess.run([str(ROOT / "hack" / "kind" / name)], env={**os.environ,
                          "DOCKER_HOST": engine_state["docker_host"]}, capture_output=True, text=True,
                          timeout=2400, check=False)
    assert proc.returncode == 0, f"hack/kind/{name} failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def kind(engine: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    archives = kc.image_archives()
    assert archives, f"no image archive in {kc.workdir() / 'images'}: run `make cluster-images`"
    images = role_images(kc.archive_refs(archives))
    assert SPARK_IMAGE.exists(), f"{SPARK_IMAGE} missing: run `make cluster-spark-image`"
    (images["spark"],) = kc.archive_refs([SPARK_IMAGE])
    with phase("node image (hash check)"):
        node_image = _script("node-image.sh", engine)
    with phase("Kafka image"):
        images["kafka"] = _script("kafka-image.sh", engine)
    work = tmp_path_factory.mktemp("kind")
    shared = tmp_path_factory.mktemp("kind-shared")
    cluster = Kind(f"ke-{uuid.uuid4().hex[:6]}", engine, work / "kubeconfig", images, shared)
    config = {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4",
              # The node image's static bridge CNI stands in for kindnetd; the API server port stays on the
              # namespace's loopback.
              "networking": {"disableDefaultCNI": True, "apiServerAddress": "127.0.0.1"},
              # The Spark jobs' output and run folders, which the test reads: at the same path in the node.
              "nodes": [{"role": "control-plane",
                         "extraMounts": [{"hostPath": str(shared), "containerPath": str(shared)}]}]}
    (work / "kind.yaml").write_text(yaml.safe_dump(config))
    t0 = time.monotonic()
    try:
        cluster.run([str(tool_path("kind")), "create", "cluster", "--name", cluster.name, "--image", node_image,
                     "--kubeconfig", str(cluster.kubeconfig), "--config", str(work / "kind.yaml"), "--wait", "300s"],
                    timeout=900)
        print(f"[kind] cluster {cluster.name} up in {time.monotonic() - t0:.0f}s", flush=True)
        # Knative's prober goes in as the role images do: an image archive, loaded with kind load.
        life.wathola_archive(work / "wathola.tar")
        kind_load = [str(tool_path("kind")), "load"]
        loads = [[*kind_load, "image-archive", str(archive), "--name", cluster.name]
                 for archive in [*archives, work / "wathola.tar", SPARK_IMAGE]]
        loads.append([*kind_load, "docker-image", images["kafka"], "--name", cluster.name])
        # Side by side: each is a copy into the node and a containerd import, mostly waiting on the disk.
        with phase("kind load"), ThreadPoolExecutor(len(loads)) as pool:
            list(pool.map(cluster.run, loads))
        yield cluster
    finally:
        if os.environ.get("KE_E2E_KEEP_CLUSTER") != "1":
            cluster.run([str(tool_path("kind")), "delete", "cluster", "--name", cluster.name], check=False,
                        timeout=300)


# ---------------------------------------------------------------------------------------------- Kafka


@pytest.fixture(scope="module")
def kafka(kind: Kind) -> dict[str, str]:
    """Kafka in the cluster for every test of the module; the connection Secret's data for the Strimzi preset."""
    with phase("Kafka in the cluster"):
        return _kafka(kind)


def _connection_secret(cl: Kind, connection: dict[str, str]) -> None:
    """The Strimzi preset's connection Secret (``kafka.existingSecret``): the user's, made before the install."""
    cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}},
             {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kafka-connection", "namespace": SYSTEM_NS},
              "stringData": connection})


def _kafka(cl: Kind) -> dict[str, str]:
    """Kafka in the cluster: PLAINTEXT on Service ``kafka`` (9092), SASL_SSL with SCRAM-SHA-512 on Service
    ``my-cluster-kafka-bootstrap`` (9093, and PLAINTEXT on its 9092 as Strimzi's plain listener); returns the
    connection Secret's data for the Strimzi preset."""
    tls_host = f"my-cluster-kafka-bootstrap.{KAFKA_NS}.svc"
    ca = CertificateAuthority()
    server = ca.issue("kafka", (tls_host, f"{tls_host}.cluster.local"))
    password = uuid.uuid4().hex
    props = {
        "process.roles": "broker,controller", "node.id": "1", "controller.quorum.voters": "1@127.0.0.1:9094",
        "listeners": "PLAINTEXT://:9092,SASL_SSL://:9093,CONTROLLER://127.0.0.1:9094",
        "advertised.listeners": f"PLAINTEXT://kafka.{KAFKA_NS}.svc:9092,SASL_SSL://{tls_host}:9093",
        "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": "/etc/kafka/tls/server.pem",
        "log.dirs": "/var/lib/kafka", "num.partitions": "1", "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4", "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1", "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
    }
    labels = {"app": "kafka"}
    cl.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KAFKA_NS}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kafka", "namespace": KAFKA_NS},
         "data": {"server.properties": "".join(f"{k}={v}\n" for k, v in props.items())}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kafka", "namespace": KAFKA_NS},
         "stringData": {"server.pem": (server.key_pem + server.cert_pem + ca.cert_pem).decode(),
                        "password": password}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "kafka", "namespace": KAFKA_NS},
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "securityContext": {**RESTRICTED_POD, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
                      "containers": [{
                          "name": "kafka", "image": cl.images["kafka"], "imagePullPolicy": "Never",
                          "env": [{"name": "KAFKA_SCRAM_USER", "value": SCRAM_USER},
                                  {"name": "KAFKA_SCRAM_PASSWORD", "valueFrom": {"secretKeyRef": {
                                      "name": "kafka", "key": "password"}}}],
                          "ports": [{"containerPort": 9092}, {"containerPort": 9093}],
                          "readinessProbe": {"tcpSocket": {"port": 9093}, "periodSeconds": 2},
                          "securityContext": RESTRICTED_CONTAINER,
                          "resources": {"limits": {"memory": "1Gi"}},
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/kafka/server.properties",
                                            "subPath": "server.properties"},
                                           {"name": "tls", "mountPath": "/etc/kafka/tls"},
                                           {"name": "data", "mountPath": "/var/lib/kafka"},
                                           {"name": "tmp", "mountPath": "/tmp"}]}],
                      "volumes": [{"name": "config", "configMap": {"name": "kafka"}},
                                  {"name": "tls", "secret": {"secretName": "kafka",
                                                             "items": [{"key": "server.pem", "path": "server.pem"}]}},
                                  {"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]}}}},
        *[{"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": KAFKA_NS},
           "spec": {"selector": labels, "ports": [{"name": f"kafka-{port}", "port": port} for port in ports]}}
          # kafka: the ci default; kafka-bootstrap: the chart's; my-cluster-kafka-bootstrap: the Strimzi preset's
          # (9093) and Strimzi's plain listener (9092), which docs/examples' KafkaSource reads.
          for name, ports in (("kafka", (9092,)), ("kafka-bootstrap", (9092,)),
                              ("my-cluster-kafka-bootstrap", (9093, 9092)))],
    )
    cl.kubectl("rollout", "status", "deployment/kafka", "-n", KAFKA_NS, "--timeout=600s", timeout=660)
    return {"protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "user": SCRAM_USER, "password": password,
            "ca.crt": ca.cert_pem.decode()}


def _topics(cl: Kind) -> list[str]:
    out = cl.kubectl("exec", "-n", APP_NS, "deployment/sink-a", "--", "python", "-c", TOPICS,
                     f"kafka.{KAFKA_NS}.svc:9092", timeout=120)
    topics: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return topics


# ---------------------------------------------------------------------------------------------- the chart


def _chart_args(cl: Kind, chart: Path) -> list[str]:
    """The Strimzi preset of ``chart`` with the loaded images; Kafka at the preset's own address."""
    return ["-f", str(chart / "values-strimzi.yaml"), "--set", "image.registry=docker.io/library",
            "--set-string", f"image.tag={cl.images['receiver'].rsplit(':', 1)[1]}", "--set", "image.pullPolicy=Never",
            "--set", f"tests.image={cl.images['curl']}", "--set", "crds.brokers=true", "--set", "crds.sinks=true",
            "--set", "crds.sources=true", "--set", "receiver.workers=1", "--set", "logFormat=console"]


def _chart_objects(cl: Kind) -> list[str]:
    """Every object of every listable kind, in every namespace and cluster-wide, that carries the chart's labels,
    but the CRDs it keeps on purpose (``crds.keep``, ``helm.sh/resource-policy: keep``): after an uninstall, what
    the release left behind."""
    kinds = cl.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    items = get(cl, ",".join(k for k in kinds if not k.startswith("events")), "-A", "-l", PART_OF)["items"]
    return [f"{i['kind']}/{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items
            if not (i["kind"] == "CustomResourceDefinition"
                    and i["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep")]


# ---------------------------------------------------------------------------------------------- events


def _sinks(cl: Kind) -> None:
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}}]
    for name in ("sink-a", "sink-b"):
        labels = {"app": name}
        docs += [
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": APP_NS},
             "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                 "metadata": {"labels": labels},
                 # The sink does not handle SIGTERM: without a short grace period each pod would hold the
                 # namespace's deletion for the default 30 s.
                 "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                          "terminationGracePeriodSeconds": 1,
                          "containers": [sink_container(cl.images["receiver"], "Never")]}}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": APP_NS},
             "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
        ]
    cl.apply(*docs)
    for name in ("sink-a", "sink-b"):
        cl.kubectl("rollout", "status", f"deployment/{name}", "-n", APP_NS, "--timeout=300s", timeout=360)


def _sink_uri(name: str) -> str:
    return f"http://{name}.{APP_NS}.svc.cluster.local/"


def _start_sender(cl: Kind, url: str, count: int, pace: float = 0.0, event_type: str = "dev.kafka-eventing.e2e",
                  deadline: float = 600) -> tuple[str, str]:
    """A Job POSTing ``count`` events to ``url``; returns (job name, id prefix)."""
    name = f"send-{uuid.uuid4().hex[:8]}"
    cl.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": APP_NS},
              "spec": {"backoffLimit": 0, "activeDeadlineSeconds": int(deadline) + 120, "template": {"spec": {
                  "restartPolicy": "Never", "securityContext": RESTRICTED_POD,
                  "automountServiceAccountToken": False, "containers": [{
                      "name": "send", "image": cl.images["receiver"], "imagePullPolicy": "Never",
                      "command": ["python", "-c", SEND, url, name, str(count), str(pace), event_type,
                                  str(deadline)],
                      "securityContext": RESTRICTED_CONTAINER}]}}}})
    return name, name


def _accepted(cl: Kind, job: str, timeout: float = 900) -> list[str]:
    """Wait for the sender Job to end; the ids the receiver answered 202 for."""
    def done() -> bool:
        status = get(cl, "job", job, "-n", APP_NS).get("status", {})
        return bool(status.get("succeeded") or status.get("failed"))

    wait(f"sender {job} done", done, timeout=timeout, interval=2)
    logs = cl.kubectl("logs", f"job/{job}", "-n", APP_NS).stdout
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    gave_up = [line for line in lines if "gave_up" in line]
    assert not gave_up, f"the receiver never accepted {gave_up}"
    return [line["accepted"] for line in lines if "accepted" in line]


def _send(cl: Kind, url: str, count: int, event_type: str = "dev.kafka-eventing.e2e") -> list[str]:
    job, prefix = _start_sender(cl, url, count, event_type=event_type)
    accepted = _accepted(cl, job)
    assert accepted == [f"{prefix}-{n}" for n in range(count)], accepted
    return accepted


def _delivered(cl: Kind, ids: list[str], sinks: tuple[str, ...] = ("sink-a", "sink-b"),
               timeout: float = 300) -> None:
    want = set(ids)
    try:
        wait(f"{len(want)} events at {', '.join(sinks)}",
             lambda: all(want <= sink_ids(cl, f"deployment/{s}") for s in sinks), timeout=timeout, interval=2)
    except AssertionError as exc:
        missing = {s: len(want - sink_ids(cl, f"deployment/{s}")) for s in sinks}
        raise AssertionError(f"{exc}: missing {missing} of {len(want)}") from None


CHANNEL_URL = f"http://orders-kn-channel.{APP_NS}.svc.cluster.local/"


def _channel_scenario(cl: Kind) -> None:
    cl.apply(kafka_channel("orders", {"sub-a": _sink_uri("sink-a"), "sub-b": _sink_uri("sink-b")}, PARTITIONS))
    cl.kubectl("wait", "--for=condition=Ready", "kafkachannel/orders", "-n", APP_NS, "--timeout=600s", timeout=660)

    def subscribers_ready() -> bool:
        subs = get(cl, "kafkachannel", "orders", "-n", APP_NS).get("status", {}).get("subscribers") or []
        return {s.get("uid") for s in subs if s.get("ready") == "True"} == {"sub-a", "sub-b"}

    wait("status.subscribers ready", subscribers_ready)
    wait("dispatcher pod ready", lambda: dispatcher_ready(cl, 1), timeout=600, interval=2)
    _delivered(cl, _send(cl, CHANNEL_URL, 20))

    out = cl.helm("test", RELEASE, "-n", SYSTEM_NS, "--timeout=10m")
    assert "Phase:          Succeeded" in out.stdout, out.stdout

    # The dispatcher up to the partition count and back by `helm upgrade` of dispatcher.replicas (a new settings
    # checksum rolls the controller, which rescales); delivery goes on at each size.
    for replicas in (PARTITIONS, 1):
        cl.helm("upgrade", RELEASE, str(CHART), "-n", SYSTEM_NS, "--reuse-values", "--set",
                f"dispatcher.replicas={replicas}", "--wait", "--timeout=10m")
        wait(f"dispatcher at {replicas} ready replicas", lambda r=replicas: dispatcher_ready(cl, r), timeout=600,
             interval=2)
        _delivered(cl, _send(cl, CHANNEL_URL, 10))
    pods_ready(cl, SYSTEM_NS)  # the scaled-down dispatcher pods gone: the one deleted below is the live one

    # Mid-load: a receiver pod and the dispatcher pod are deleted; whatever got a 202 must arrive at both.
    job, _ = _start_sender(cl, CHANNEL_URL, 300, pace=0.02)
    wait("sender started", lambda: cl.kubectl("logs", f"job/{job}", "-n", APP_NS, check=False).stdout.count(
        "accepted") >= 20, timeout=300, interval=1)
    receiver = get(cl, "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=receiver")["items"][0]
    cl.kubectl("delete", "pod", "-n", SYSTEM_NS, receiver["metadata"]["name"], "--wait=false")
    time.sleep(1)
    dispatcher = get(cl, "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=kafka-channel-dispatcher")
    cl.kubectl("delete", "pod", "-n", SYSTEM_NS, dispatcher["items"][0]["metadata"]["name"], "--wait=false")
    accepted = _accepted(cl, job)
    assert len(accepted) == 300, f"only {len(accepted)} of 300 events were accepted"
    _delivered(cl, accepted, timeout=600)
    pods_ready(cl, SYSTEM_NS)

    cl.kubectl("delete", "kafkachannel", "orders", "-n", APP_NS, "--timeout=300s", timeout=360)
    wait("dispatcher Deployment gone", lambda: not dispatchers(cl))
    wait("topic gone", lambda: f"{APP_NS}.orders" not in _topics(cl), interval=2)


def _broker_scenario(cl: Kind) -> None:
    """The Broker's two Triggers: sink-a takes order.created only (``filter``), sink-b every order event
    (``filters``, prefix); an audit event matches neither."""
    cl.apply(*broker_with_triggers(_sink_uri("sink-a"), _sink_uri("sink-b")))
    broker_ready(cl)
    assert kb.broker_topic(APP_NS, BROKER) in _topics(cl)
    url = get(cl, "broker", BROKER, "-n", APP_NS)["status"]["address"]["url"]

    # A Trigger's consumer group starts at the latest offset once it has joined: warm up until both sinks see one.
    warm: list[str] = []

    def joined() -> bool:
        warm.extend(_send(cl, url, 1, CREATED))
        return bool(set(warm) & sink_ids(cl, "deployment/sink-a") & sink_ids(cl, "deployment/sink-b"))

    wait("both Triggers' consumer groups joined", joined, timeout=600, interval=1)
    batches = {t: _send(cl, url, 10, t) for t in (AUDIT, SHIPPED, CREATED)}  # matches last
    want_a, want_b = set(batches[CREATED]), set(batches[CREATED]) | set(batches[SHIPPED])
    wait("fan-out by filter", lambda: want_a <= sink_ids(cl, "deployment/sink-a")
         and want_b <= sink_ids(cl, "deployment/sink-b"), timeout=300, interval=2)
    assert not (set(batches[SHIPPED]) | set(batches[AUDIT])) & sink_ids(cl, "deployment/sink-a")
    assert not set(batches[AUDIT]) & sink_ids(cl, "deployment/sink-b")

    cl.kubectl("delete", "broker", BROKER, "-n", APP_NS, "--timeout=300s", timeout=360)
    wait("Broker dispatcher gone", lambda: not broker_dispatcher(cl))
    wait("Broker topic gone", lambda: kb.broker_topic(APP_NS, BROKER) not in _topics(cl), interval=2)


SINK_URL = f"http://{SINK_HOST}/{APP_NS}/{KAFKA_SINK}"
# Run in sink-a's pod (the receiver image): records that are not CloudEvents, written to partition 0 of a topic.
PRODUCE_PLAIN = """
import sys
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1]})
for n, value in enumerate(sys.argv[3:]):
    producer.produce(sys.argv[2], key=f"k{n}".encode(), value=value.encode(), partition=0)
assert producer.flush(30) == 0, "records not acknowledged"
"""


def _source_scenario(cl: Kind) -> None:
    """A KafkaSink written through the receiver pods' sink ingress Service (its address in its status), and a
    KafkaSource (2 dispatcher pods) reading its topic into sink-a: events arrive as sent, plain records converted; a
    source pod deleted mid-load loses nothing (ledger); deleting the source removes its dispatcher."""
    bootstrap = f"kafka.{KAFKA_NS}.svc:9092"
    cl.apply(kafka_sink(bootstrap))
    cl.kubectl("wait", "--for=condition=Ready", f"kafkasink/{KAFKA_SINK}", "-n", APP_NS, "--timeout=600s",
               timeout=660)
    cl.apply(kafka_source(bootstrap, _sink_uri("sink-a")))  # its topic exists now
    cl.kubectl("wait", "--for=condition=Ready", f"kafkasource/{KAFKA_SOURCE}", "-n", APP_NS, "--timeout=600s",
               timeout=660)
    sink = get(cl, "kafkasink", KAFKA_SINK, "-n", APP_NS)
    assert sink["status"]["address"]["url"] == SINK_URL, sink["status"]
    source = get(cl, "kafkasource", KAFKA_SOURCE, "-n", APP_NS)
    assert source["status"]["sinkUri"] == _sink_uri("sink-a") and source["status"]["consumers"] == 2, source["status"]
    wait("source dispatcher pods ready", lambda: [d for d in source_dispatcher(cl)
                                                  if d["status"].get("readyReplicas") == 2], timeout=600, interval=2)

    # Written through the receiver pods, read by the source's pods: every id, with its type and data as sent.
    first = _send(cl, SINK_URL, 20, "com.example.sink")
    _delivered(cl, first, sinks=("sink-a",))
    got = {e["id"]: e for e in sink_events(cl, "deployment/sink-a")}
    assert {got[i]["type"] for i in first} == {"com.example.sink"}
    assert [json.loads(got[i]["data"]) for i in first] == [{"n": n} for n in range(len(first))]

    # Records that are not CloudEvents arrive converted, as upstream converts them.
    plain = [f"plain-{n}-{uuid.uuid4()}" for n in range(5)]
    cl.kubectl("exec", "-n", APP_NS, "deployment/sink-a", "--", "python", "-c", PRODUCE_PLAIN, bootstrap, SINK_TOPIC,
               *plain, timeout=120)
    wait("plain records at sink-a", lambda: set(plain) <= {e["data"] for e in sink_events(cl, "deployment/sink-a")},
         timeout=300, interval=2)
    converted = [e for e in sink_events(cl, "deployment/sink-a") if e["data"] in plain]
    assert {e["type"] for e in converted} == {ksrc.EVENT_TYPE}, converted
    assert all(e["id"].startswith("partition:0/offset:") for e in converted), converted

    job, _ = _start_sender(cl, SINK_URL, 200, pace=0.02)
    wait("sink sender started", lambda: cl.kubectl("logs", f"job/{job}", "-n", APP_NS, check=False).stdout.count(
        "accepted") >= 20, timeout=300, interval=1)
    name = source_dispatcher(cl)[0]["metadata"]["name"]
    pod = get(cl, "pods", "-n", SYSTEM_NS, "-l", f"kafka.eventing.knative.dev/dispatcher={name}")["items"][0]
    cl.kubectl("delete", "pod", "-n", SYSTEM_NS, pod["metadata"]["name"], "--wait=false")
    accepted = _accepted(cl, job)
    assert len(accepted) == 200, f"only {len(accepted)} of 200 events were accepted by the KafkaSink"
    _delivered(cl, accepted, sinks=("sink-a",), timeout=600)

    cl.kubectl("delete", "kafkasource", KAFKA_SOURCE, "-n", APP_NS, "--timeout=300s", timeout=360)
    wait("source dispatcher gone", lambda: not source_dispatcher(cl))
    cl.kubectl("delete", "kafkasink", KAFKA_SINK, "-n", APP_NS, "--timeout=300s", timeout=360)


def test_chart_on_kind(kind: Kind, kafka: dict[str, str], tmp_path: Path) -> None:
    _connection_secret(kind, kafka)

    previous, previous_version = previous_chart(tmp_path / "previous")
    current_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert previous_version != current_version
    with phase(f"helm install {previous_version}"):
        kind.helm("install", RELEASE, str(previous), "-n", SYSTEM_NS, *_chart_args(kind, previous),
                  "--wait", "--timeout=10m")
    assert release(kind)["chart"] == f"kafka-eventing-{previous_version}"
    with phase(f"helm upgrade to {current_version}"):
        kind.helm("upgrade", RELEASE, str(CHART), "-n", SYSTEM_NS, *_chart_args(kind, CHART), "--wait",
                  "--timeout=10m")
    now = release(kind)
    assert (now["chart"], now["revision"], now["status"]) == (
        f"kafka-eventing-{current_version}", "2", "deployed")
    pods_ready(kind, SYSTEM_NS)

    with phase("subscriber Deployments"):
        _sinks(kind)
    try:
        with phase("channel scenario (helm test, pods deleted mid-load)"):
            _channel_scenario(kind)
        with phase("Broker scenario"):
            _broker_scenario(kind)
        with phase("KafkaSink and KafkaSource scenario (a source pod deleted mid-load)"):
            _source_scenario(kind)
    finally:
        with phase("app namespace deleted"):
            kind.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--timeout=300s", check=False,
                         timeout=360)

    assert_release_objects(kind, RELEASE)
    with phase("helm uninstall"):
        kind.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout=5m")
        # The connection Secret is the user's, not the release's: it goes first, then nothing may be left.
        kind.kubectl("delete", "secret", "kafka-connection", "-n", SYSTEM_NS)
        assert_uninstalled(kind, RELEASE, "helm")
    assert _chart_objects(kind) == [], "helm uninstall left objects of the chart"


# ---------------------------------------------------------------------------------------------- the prober

PROBER_CLIENT = "prober-client"
# A wathola receiver's /report, read from inside the cluster.
GET = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
"""


def _prober_tier(cl: Kind) -> life.Tier:
    """Knative's prober on kind: its senders post to the channel's and the Broker's addresses, Services resolved by
    cluster DNS and routed by kube-proxy, as users' senders do; the test's own requests (warm-up events, the
    receivers' reports) go from a client pod in the app namespace (``kubectl exec``), so that nothing is sent from
    outside the cluster to a pod's address."""

    def exec_python(script: str, *args: str) -> str:
        return cl.kubectl("exec", "-n", APP_NS, PROBER_CLIENT, "--", "python", "-c", script, *args,
                          timeout=120).stdout

    def send(url: str, event_id: str, event_type: str) -> list[str]:
        # SEND names the events <prefix>-<n>: the one event here is <event_id>-0.
        out = exec_python(SEND, url, event_id, "1", "0", event_type, "60")
        return [line["accepted"] for line in map(json.loads, out.splitlines()) if "accepted" in line]

    def report(receiver_ip: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(exec_python(GET, f"http://{receiver_ip}:{life.WATHOLA_PORT}/report"))
        return found

    return life.Tier(cl, lambda chart: _chart_args(cl, chart), send, report)


def _leave_no_release(kind: Kind) -> None:
    """After the prober, passed or failed: the app namespace and the release gone, so that a failure is reported by
    its own test and not again by the next one's (a release left running reconciles the next test's resources).
    The namespace goes first, while the controller can still finalize what is in it; whatever a failed run left with
    a finalizer no controller will remove is stripped of it after the uninstall."""
    kind.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--wait=false", timeout=120)
    gone = kind.kubectl("wait", "--for=delete", f"namespace/{APP_NS}", "--timeout=300s", check=False, timeout=360)
    kind.run([str(tool_path("helm")), "uninstall", RELEASE, "-n", SYSTEM_NS, "--ignore-not-found", "--wait",
              "--timeout=5m"], timeout=400)
    if gone.returncode == 0 or "not found" in gone.stderr.lower():
        return
    kinds = "kafkachannels,brokers,triggers,subscriptions,kafkasources,kafkasinks"
    for item in json.loads(kind.kubectl("get", kinds, "-n", APP_NS, "-o", "json", check=False).stdout
                           or '{"items": []}')["items"]:
        kind.kubectl("patch", f"{item['kind'].lower()}.{item['apiVersion'].split('/')[0]}", item["metadata"]["name"],
                     "-n", APP_NS, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
    kind.kubectl("wait", "--for=delete", f"namespace/{APP_NS}", "--timeout=300s", timeout=360)


def test_prober_across_upgrade_values_roll_and_rollback(kind: Kind, kafka: dict[str, str], tmp_path: Path) -> None:
    """Knative's upgrade prober through a KafkaChannel and a Broker across the install's life (tests/e2e/_life.py):
    the Strimzi preset of the previous chart version, `helm upgrade`, a values change rolling every pod, `helm
    rollback`; nothing missing."""
    _connection_secret(kind, kafka)
    kind.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}},
               {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": PROBER_CLIENT, "namespace": APP_NS},
                "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                         "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "client", "image": kind.images["receiver"],
                                         "imagePullPolicy": "Never", "securityContext": RESTRICTED_CONTAINER,
                                         "command": ["python", "-c", "import time; time.sleep(86400)"]}]}})
    kind.kubectl("wait", "--for=condition=Ready", f"pod/{PROBER_CLIENT}", "-n", APP_NS, "--timeout=300s",
                 timeout=360)
    try:
        with phase("prober across install, upgrade, values roll, rollback"):
            life.upgrade_values_roll_and_rollback(_prober_tier(kind), tmp_path)
    finally:
        _leave_no_release(kind)
    kind.kubectl("delete", "secret", "kafka-connection", "-n", SYSTEM_NS)
    assert_uninstalled(kind, RELEASE, "helm")


# ci values files this cluster can serve: the chart's default PLAINTEXT Kafka address. The others name the real-pod
# tier's node address (cluster), a cloud service (event-hubs), a placeholder CA (strimzi-sasl-scram) or run the
# reprocess Jobs on the spark image, which `make cluster-images` does not build (all-optins).
CT_VALUES = ("default-values.yaml",)


def test_ct_install(kind: Kind, kafka: dict[str, str], tmp_path: Path) -> None:
    """chart-testing as its users run it: ``ct install`` (install, ``helm test``, uninstall, each in a namespace of
    its own) with every ci values file in CT_VALUES (Kafka at the chart's default PLAINTEXT address)."""
    chart = tmp_path / "charts" / CHART.name
    shutil.copytree(CHART, chart)
    for values in (chart / "ci").glob("*-values.yaml"):
        if values.name not in CT_VALUES:
            values.unlink()
    before = set(_chart_objects(kind))  # empty after test_chart_on_kind's uninstall; compared, not assumed
    with phase("ct install"):
        out = kind.run([str(tool_path("ct")), "install", "--config", "ct.yaml", "--charts", str(chart),
                        "--helm-extra-set-args", " ".join([
                            "--set=image.registry=docker.io/library",
                            f"--set-string=image.tag={kind.images['receiver'].rsplit(':', 1)[1]}",
                            "--set=image.pullPolicy=Never", f"--set=tests.image={kind.images['curl']}"])],
                       timeout=2400, check=False)
    assert out.returncode == 0, f"ct install failed:\n{out.stdout[-8000:]}\n{out.stderr[-4000:]}"
    for used in CT_VALUES:
        assert used in out.stdout, f"ct install did not use {used}:\n{out.stdout[-3000:]}"
    # ct uninstalls each release and deletes the namespace it made for it: nothing of the chart may be left.
    assert set(_chart_objects(kind)) - before == set(), "ct install left objects of the chart"
    left = [ns for ns in get(kind, "namespaces")["items"] if ns["metadata"]["name"].startswith(CHART.name)]
    assert left == [], f"ct install left namespaces {[ns['metadata']['name'] for ns in left]}"


# ---------------------------------------------------------------------------------------------- Spark executor pods


@pytest.fixture
def spark_tier(kind: Kind, kafka: dict[str, str]) -> spark_pods.Tier:
    """The reprocess jobs on kind (tests/e2e/_spark_pods.py): the chart's default master (the ``kubernetes`` Service
    by cluster DNS, as in a real install), Kafka and the sink pod by Service name."""
    return spark_pods.Tier(kind, kind.images["spark"], kind.images["receiver"], f"kafka.{KAFKA_NS}.svc:9092",
                           kind.shared)


def test_spark_archive_and_replay_on_executor_pods_match_local_mode(spark_tier: spark_pods.Tier, spark: Any) -> None:
    with phase("Spark: archive and replay on executor pods and in local mode"):
        spark_pods.archive_and_replay_match_local_mode(spark_tier, spark)


def test_spark_a_killed_executor_pod_is_replaced_and_the_archive_is_still_exact(
    spark_tier: spark_pods.Tier, spark: Any,
) -> None:
    with phase("Spark: an executor pod killed mid-archive"):
        spark_pods.killed_executor_mid_archive(spark_tier, spark)


def test_spark_an_executor_pod_killed_mid_replay_loses_nothing_and_its_resends_are_in_the_manifest(
    spark_tier: spark_pods.Tier,
) -> None:
    with phase("Spark: an executor pod killed mid-replay"):
        spark_pods.killed_executor_mid_replay(spark_tier)


# ---------------------------------------------------------------------------------------------- getting started

EXAMPLES = ROOT / "docs" / "examples"
DEMO_NS = "demo"
DISPLAY = "deployment/event-display"
CONTROLLER_MADE = "app.kubernetes.io/managed-by=kafka-channel-controller"


def _example(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _curl(cl: Kind, url: str, event_type: str) -> str:
    """docs/getting-started.md's `send`: one event POSTed from a pod in the demo namespace; its id (after a 202)."""
    event_id = f"gs-{uuid.uuid4().hex[:8]}"
    out = cl.kubectl("run", f"send-{uuid.uuid4().hex[:6]}", "-n", DEMO_NS, "--rm", "-i", "--restart=Never",
                     f"--image={cl.images['curl']}", "--image-pull-policy=Never", "--command", "--",
                     "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}\n", "-X", "POST", url,
                     "-H", "ce-specversion: 1.0", "-H", f"ce-id: {event_id}", "-H", "ce-source: getting-started",
                     "-H", f"ce-type: {event_type}", "-H", "content-type: application/json", "-d", '{"order": 1}',
                     timeout=300)
    assert "202" in out.stdout, out.stdout + out.stderr
    return event_id


def _displayed(cl: Kind, event_id: str) -> None:
    wait(f"{event_id} at event-display", lambda: event_id in sink_ids(cl, DISPLAY, DEMO_NS), timeout=300, interval=2)


def _demo_topics(cl: Kind) -> list[str]:
    out = cl.kubectl("exec", "-n", DEMO_NS, DISPLAY, "--", "python", "-c", TOPICS, f"kafka.{KAFKA_NS}.svc:9092",
                     timeout=120)
    topics: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return topics


def test_getting_started_manifests_and_uninstall(kind: Kind, kafka: dict[str, str]) -> None:
    """docs/getting-started.md on kind: the install with the Strimzi preset and the crds.* it gives, then every
    manifest of docs/examples/ as it is — but event-display's container (no registry here: the receiver image's
    logging subscriber) and channel.yaml's Subscription (no Knative Eventing core here: channel-subscribers.yaml,
    which the page gives for that case; channel.yaml is validated by tests/chart) — an event through each, and the
    page's uninstall, after which nothing of the chart, the controller or the examples is left, CRDs included.
    Objects of the chart that other tests of this cluster hold meanwhile (the Spark tier's reprocess objects, until
    its module fixture ends) are there before and are not this install's."""
    chart_before = set(_chart_objects(kind))
    _connection_secret(kind, kafka)
    with phase("helm install as getting-started.md"):
        kind.helm("install", RELEASE, str(CHART), "-n", SYSTEM_NS, *_chart_args(kind, CHART), "--wait",
                  "--timeout=10m")
        pods_ready(kind, SYSTEM_NS)
        out = kind.helm("test", RELEASE, "-n", SYSTEM_NS, "--timeout=10m")
        assert "Phase:          Succeeded" in out.stdout, out.stdout
    try:
        with phase("event-display"):
            display = _example("event-display.yaml")
            (deployment,) = [d for d in display if d["kind"] == "Deployment"]
            deployment["spec"]["template"]["spec"]["containers"] = [
                {**sink_container(kind.images["receiver"], "Never"), "name": "event-display"}]
            kind.apply(*display)
            kind.kubectl("rollout", "status", DISPLAY, "-n", DEMO_NS, "--timeout=300s", timeout=360)
        with phase("KafkaChannel"):
            kind.apply(*_example("channel-subscribers.yaml"))
            kind.kubectl("wait", "--for=jsonpath={.status.subscribers[0].ready}=True", "kafkachannel/orders",
                         "-n", DEMO_NS, "--timeout=300s", timeout=360)
            _displayed(kind, _curl(kind, f"http://orders-kn-channel.{DEMO_NS}.svc.cluster.local/",
                                   "com.example.order.created"))
        with phase("Broker and Trigger"):
            kind.apply(*_example("broker.yaml"))
            kind.kubectl("wait", "--for=condition=Ready", "broker/default", "-n", DEMO_NS, "--timeout=300s",
                         timeout=360)
            kind.kubectl("wait", "--for=condition=ConsumerGroupReady", "trigger/orders-created", "-n", DEMO_NS,
                         "--timeout=300s", timeout=360)
            url = get(kind, "broker", "default", "-n", DEMO_NS)["status"]["address"]["url"]
            shipped = _curl(kind, url, "com.example.order.shipped")
            _displayed(kind, _curl(kind, url, "com.example.order.created"))
            assert shipped not in sink_ids(kind, DISPLAY, DEMO_NS), "the Trigger's filter let another type through"
        with phase("KafkaSink and KafkaSource"):
            kind.apply(*_example("sink-and-source.yaml"))
            kind.kubectl("wait", "--for=condition=Ready", "kafkasink/shipments", "kafkasource/shipments", "-n",
                         DEMO_NS, "--timeout=300s", timeout=360)
            url = get(kind, "kafkasink", "shipments", "-n", DEMO_NS)["status"]["address"]["url"]
            _displayed(kind, _curl(kind, url, "com.example.shipment.sent"))
        before = _demo_topics(kind)
        assert {f"{DEMO_NS}.orders", kb.broker_topic(DEMO_NS, "default"), f"{DEMO_NS}.shipments"} <= set(before)

        with phase("uninstall, as getting-started.md: resources, what the controller made, topics"):
            for name in ("sink-and-source.yaml", "broker.yaml", "channel-subscribers.yaml"):
                kind.kubectl("delete", "-f", str(EXAMPLES / name), "--timeout=300s", timeout=360)
            left = get(kind, "deploy,svc,secret", "-A", "-l", CONTROLLER_MADE)["items"]
            assert not left, [f"{i['kind']}/{i['metadata']['namespace']}/{i['metadata']['name']}" for i in left]
            after = set(_demo_topics(kind))
            assert not {f"{DEMO_NS}.orders", kb.broker_topic(DEMO_NS, "default")} & after, after
            assert f"{DEMO_NS}.shipments" in after, "a KafkaSink's topic is never deleted"
    finally:
        kind.kubectl("delete", "namespace", DEMO_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)

    with phase("uninstall, as getting-started.md: the release, its CRDs, the namespace"):
        kind.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout=5m")
        instance = f"app.kubernetes.io/instance={RELEASE}"
        assert get(kind, "crd", "-l", instance)["items"], "helm uninstall kept no CRD (crds.keep)"
        kind.kubectl("delete", "crd", "-l", instance, "--timeout=300s", timeout=360)
        kind.kubectl("delete", "namespace", SYSTEM_NS, "--timeout=300s", timeout=360)
    assert not get(kind, "crd", "-l", instance)["items"]
    left = set(_chart_objects(kind)) - chart_before
    assert left == set(), f"the uninstall left objects of the chart: {sorted(left)}"
