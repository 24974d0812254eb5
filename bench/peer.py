"""Knative's own Kafka data plane ("the peer"), started locally so the benchmarks can measure it beside ours.

The peer is eventing-kafka-broker's Java/Vert.x ``receiver-loom`` and ``dispatcher-loom`` (what Knative ships as the
kafka-broker-receiver/-dispatcher images), built by ``hack/peer/build.sh`` into ``$KE_CACHE/peer/`` (see
``hack/peer/README.md``). Each process reads a data-plane contract (JSON form of ``proto/contract.proto``) that this
module writes the way Knative's control plane would for one Broker ``<namespace>/<name>`` on one topic, with at most
one Trigger (no filter) for the dispatcher, and the properties files of the ConfigMap of the same release
(``config-kafka-broker-{producer,consumer,webclient,httpserver}.properties``) with only these changes: the HTTP server
binds 127.0.0.1, and the dispatcher's ``max.poll.records`` / ``auto.offset.reset`` are the caller's.

Everything is on 127.0.0.1: the ingress binds 127.0.0.1, metrics and tracing are off (empty config-observability,
so no metrics server), no TLS secret (so no HTTPS server), and the Kubernetes client that both processes build (for
EventTypes, unused without eventtype-auto-create) is pointed at a closed loopback port with kubeconfig and service
account discovery off, so its informer only gets "connection refused".

JVM: Temurin 25 (``PEER_JAVA_HOME``), ``-Xmx`` = ``heap`` (1g by default; the Knative Deployments set no heap, the
dispatcher's JAVA_TOOL_OPTIONS asks for 70% of the container limit), plus the flags Knative's images/Deployments
use: ``--enable-preview`` (jib jvmFlags of the loom modules) and ``-XX:+CrashOnOutOfMemoryError``.
Logs are the production kafka-config-logging (JSON lines, async, INFO) to
``<workdir>/peer-*/{receiver,dispatcher}.log``.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from kafka_eventing.localstack import _proc
from kafka_eventing.localstack.tools import cache_dir

PEER_JAVA_HOME = Path(os.environ.get("PEER_JAVA_HOME", "/usr/lib/jvm/temurin-25-jdk-amd64"))
DEFAULT_HEAP = "1g"
RECEIVER_LOG = "receiver.log"
DISPATCHER_LOG = "dispatcher.log"
_CONFIG_FILES = ("producer", "consumer", "webclient", "httpserver")


# -- what is built -------------------------------------------------------------------------------------------
def peer_dir() -> Path:
    """``$KE_CACHE/peer``: receiver.jar, dispatcher.jar, config/, BUILD_INFO (written by hack/peer/build.sh)."""
    return cache_dir() / "peer"


def java_bin() -> Path:
    return PEER_JAVA_HOME / "bin" / "java"


def peer_available() -> str | None:
    """None when the peer can run here, else why not."""
    d = peer_dir()
    missing = [p.name for p in (d / "receiver.jar", d / "dispatcher.jar", d / "BUILD_INFO") if not p.is_file()]
    missing += [f"config/config-kafka-broker-{n}.properties" for n in _CONFIG_FILES
                if not (d / "config" / f"config-kafka-broker-{n}.properties").is_file()]
    if missing:
        return f"peer not built ({', '.join(missing)} missing in {d}): run hack/peer/build.sh"
    if not java_bin().is_file():
        return f"no Java 21+ at {PEER_JAVA_HOME} (set PEER_JAVA_HOME)"
    return None


def build_info() -> dict[str, str]:
    """BUILD_INFO as a dict: source, ref, commit, java, build_seconds, ... (empty if not built)."""
    path = peer_dir() / "BUILD_INFO"
    if not path.is_file():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


# -- the contract --------------------------------------------------------------------------------------------
def _uid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "peer/" + "/".join(parts)))


def egress(subscriber_url: str, *, group: str, ordered: bool, namespace: str = "bench",
           trigger: str = "peer-trigger") -> dict[str, object]:
    """One Trigger without filter, as the control plane writes it (replies go back to the Broker's topic)."""
    uid = _uid(namespace, "trigger", trigger)
    return {
        "consumerGroup": group,
        "destination": subscriber_url,
        "uid": uid,
        "deliveryOrder": "ORDERED" if ordered else "UNORDERED",
        "replyToOriginalTopic": {},
        "reference": {"uuid": uid, "namespace": namespace, "name": trigger, "kind": "Trigger",
                      "groupVersion": "eventing.knative.dev/v1"},
    }


def source_contract(bootstrap: str, topics: list[str], subscriber_url: str, *, group: str, ordered: bool,
                    namespace: str = "bench", name: str = "source") -> dict[str, object]:
    """The contract Knative's control plane writes for one KafkaSource: no ingress, the source as the resource's and
    the egress's reference (the dispatcher names plain records' ``source`` after it), its consumer group."""
    uid = _uid(namespace, "kafkasource", name)
    reference = {"uuid": uid, "namespace": namespace, "name": name, "kind": "KafkaSource",
                 "groupVersion": "sources.knative.dev/v1"}
    return {"generation": "1", "resources": [{
        "uid": uid, "topics": topics, "bootstrapServers": bootstrap, "absentAuth": {}, "reference": reference,
        "egresses": [{"consumerGroup": group, "destination": subscriber_url, "uid": uid,
                      "deliveryOrder": "ORDERED" if ordered else "UNORDERED", "reference": reference}],
    }]}


#: What config-kafka-source-data-plane's consumer properties add to the Broker's: records that are not CloudEvents
#: are converted (InvalidCloudEventInterceptor), named after KafkaSources.
SOURCE_CONSUMER = {"cloudevent.invalid.transformer.enabled": "true", "cloudevent.invalid.kind.plural": "kafkasources",
                   "isolation.level": "read_committed"}


def broker_contract(bootstrap: str, topic: str, *, namespace: str = "bench", name: str = "events",
                    egresses: list[dict[str, object]] | None = None, generation: int = 1) -> dict[str, object]:
    """The contract for one Broker: ingress path ``/namespace/name`` -> ``topic``, plus ``egresses``."""
    uid = _uid(namespace, "broker", name)
    return {
        "generation": str(generation),
        "resources": [{
            "uid": uid,
            "topics": [topic],
            "bootstrapServers": bootstrap,
            "ingress": {"path": f"/{namespace}/{name}"},
            "egresses": egresses or [],
            "absentAuth": {},
            "reference": {"uuid": uid, "namespace": namespace, "name": name, "kind": "Broker",
                          "groupVersion": "eventing.knative.dev/v1"},
        }],
    }


# -- process plumbing ----------------------------------------------------------------------------------------
def _write_config(d: Path, overrides: Mapping[str, Mapping[str, str]]) -> dict[str, Path]:
    """Copy the release's properties files into ``d``; ``overrides[name]`` lines are appended (the last one wins)."""
    src = peer_dir() / "config"
    paths: dict[str, Path] = {}
    for name in _CONFIG_FILES:
        text = (src / f"config-kafka-broker-{name}.properties").read_text()
        extra = "".join(f"{k}={v}\n" for k, v in overrides.get(name, {}).items())
        path = d / f"config-kafka-broker-{name}.properties"
        path.write_text(text.rstrip("\n") + "\n" + ("# bench/peer.py overrides\n" + extra if extra else ""))
        paths[name] = path
    (d / "observability").mkdir(exist_ok=True)  # empty: metrics-protocol and tracing-protocol "none"
    (d / "features").mkdir(exist_ok=True)  # empty: no OIDC, no eventtype auto-create
    return paths


def _logging_config(d: Path) -> Path:
    built = peer_dir() / "config" / "logging.xml"
    path = d / "logging.xml"
    path.write_text(built.read_text() if built.is_file() else (
        '<configuration><appender name="c" class="ch.qos.logback.core.ConsoleAppender">'
        '<encoder class="net.logstash.logback.encoder.LogstashEncoder"/></appender>'
        '<root level="INFO"><appender-ref ref="c"/></root></configuration>\n'))
    return path


def _launch(jar: str, d: Path, log_name: str, env: dict[str, str], *, heap: str,
            extra_env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
    reason = peer_available()
    if reason:
        raise RuntimeError(reason)
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ")}
    base.update({
        "CONFIG_OBSERVABILITY_PATH": str(d / "observability"),
        "CONFIG_FEATURES_PATH": str(d / "features"),
        "METRICS_PUBLISH_QUANTILES": "false",
        "METRICS_JVM_ENABLED": "false",
        "HTTP2_DISABLE": "true",
        "WAIT_STARTUP_SECONDS": "8",
    })
    base.update(env)
    base.update(extra_env or {})
    k8s_port = _proc.free_port()  # nothing listens there: the EventType informer only gets "connection refused"
    cmd = [
        str(java_bin()), f"-Xmx{heap}", "-XX:+CrashOnOutOfMemoryError", "--enable-preview",
        f"-Dlogback.configurationFile={_logging_config(d)}",
        f"-Dvertx.cacheDirBase={d / 'vertx-cache'}",
        f"-Djava.io.tmpdir={d}",
        f"-Dkubernetes.master=http://127.0.0.1:{k8s_port}",
        "-Dkubernetes.auth.tryKubeConfig=false",
        "-Dkubernetes.auth.tryServiceAccount=false",
        f"-Dkubernetes.namespace={env.get('SERVICE_NAMESPACE', 'bench')}",
        "-jar", str(peer_dir() / jar),
    ]
    log = (d / log_name).open("ab")
    try:
        return subprocess.Popen(cmd, cwd=d, env=base, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()


def _fail(proc: subprocess.Popen[bytes], log: Path, what: str) -> RuntimeError:
    stop(proc)
    return RuntimeError(f"{what}\n{_proc.tail(log)}")


def _http_status(port: int, path: str, headers: Mapping[str, str] | None = None) -> int:
    """Status of a GET to 127.0.0.1:port on a new connection (0 if it fails)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path, headers=dict(headers or {}))
        resp = conn.getresponse()
        resp.read()
        return int(resp.status)
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


# -- receiver ------------------------------------------------------------------------------------------------
def start_peer_receiver(bootstrap: str, topic: str, port: int, workdir: Path, *, namespace: str = "bench",
                        name: str = "events", heap: str = DEFAULT_HEAP, timeout: float = 90.0,
                        extra_env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start the peer's receiver on ``127.0.0.1:port`` for the Broker ``/namespace/name`` -> ``topic``.

    Returns once the ingress path answers the control plane's probe (``K-Network-Probe: probe`` -> 200) on every
    event loop, i.e. a POST of a CloudEvent there is accepted; its log is ``workdir/peer-receiver/receiver.log``.
    """
    d = workdir / "peer-receiver"
    d.mkdir(parents=True, exist_ok=True)
    contract = d / "contract.json"
    contract.write_text(json.dumps(broker_contract(bootstrap, topic, namespace=namespace, name=name), indent=2))
    cfg = _write_config(d, {"httpserver": {"host": "127.0.0.1"}})
    env = {
        "SERVICE_NAME": "kafka-broker-receiver",
        "SERVICE_NAMESPACE": namespace,
        "INSTANCE_ID": "peer-receiver",
        "INGRESS_PORT": str(port),
        "INGRESS_TLS_PORT": str(_proc.free_port()),  # unused: no TLS secret, so no HTTPS server is started
        "PRODUCER_CONFIG_FILE_PATH": str(cfg["producer"]),
        "HTTPSERVER_CONFIG_FILE_PATH": str(cfg["httpserver"]),
        "DATA_PLANE_CONFIG_FILE_PATH": str(contract),
        "LIVENESS_PROBE_PATH": "/healthz",
        "READINESS_PROBE_PATH": "/readyz",
    }
    proc = _launch("receiver.jar", d, RECEIVER_LOG, env, heap=heap, extra_env=extra_env)
    log = d / RECEIVER_LOG
    probe = {"K-Network-Probe": "probe", "K-Network-Hash": "peer"}
    # One verticle (own HTTP server handler, own copy of the contract) per core: new connections go round-robin,
    # so several probes in a row on fresh connections must all see the path.
    needed, ok = 2 * (os.cpu_count() or 1) + 1, 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _fail(proc, log, f"peer receiver exited with {proc.returncode}")
        if _http_status(port, "/readyz") == 200 and _http_status(port, f"/{namespace}/{name}", probe) == 200:
            ok += 1
            if ok >= needed:
                return proc
            continue
        ok = 0
        time.sleep(0.2)
    raise _fail(proc, log, f"peer receiver not ready on 127.0.0.1:{port}/{namespace}/{name} in {timeout}s")


# -- dispatcher ----------------------------------------------------------------------------------------------
def _group_assigned(bootstrap: str, group: str, topic: str) -> bool:
    """True when ``group`` is Stable and its members own every partition of ``topic``."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        partitions = len(admin.list_topics(topic, timeout=5).topics[topic].partitions)
        desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
    except Exception:
        return False
    if desc.state != ConsumerGroupState.STABLE:
        return False
    owned = {tp.partition for m in desc.members for tp in m.assignment.topic_partitions if tp.topic == topic}
    return len(owned) == partitions > 0


def start_peer_dispatcher(bootstrap: str, topic: str, subscriber_url: str, workdir: Path, *, ordered: bool,
                          max_poll_records: int = 50, group: str = "bench-peer", namespace: str = "bench",
                          name: str = "events", initial_offset: Literal["earliest", "latest"] = "earliest",
                          heap: str = DEFAULT_HEAP, timeout: float = 90.0,
                          extra_env: Mapping[str, str] | None = None,
                          egresses: list[dict[str, object]] | None = None,
                          source: bool = False) -> subprocess.Popen[bytes]:
    """Start the peer's dispatcher: one Trigger (no filter) of the Broker on ``topic`` delivering to ``subscriber_url``
    (or the given ``egresses``, each a Trigger with its own consumer group; ``group`` is then the first one's).

    ``ordered`` picks the Trigger's delivery order (kafka.eventing.knative.dev/delivery.order: ordered|unordered).
    ``initial_offset`` is the consumer's ``auto.offset.reset`` for a group without committed offsets: "earliest"
    (default) drains what is already in the topic, as our benchmarks' backlogs need; Knative's control plane instead
    commits the latest offsets before a Trigger is Ready, which "latest" approximates. Returns once the consumer group
    is Stable and owns every partition of ``topic``; the log is ``workdir/peer-dispatcher-<group>/dispatcher.log``.
    """
    d = workdir / f"peer-dispatcher-{group}"
    d.mkdir(parents=True, exist_ok=True)
    contract = d / "contract.json"
    egs = egresses or [egress(subscriber_url, group=group, ordered=ordered, namespace=namespace)]
    contract.write_text(json.dumps(
        source_contract(bootstrap, [topic], subscriber_url, group=group, ordered=ordered, namespace=namespace)
        if source else broker_contract(bootstrap, topic, namespace=namespace, name=name, egresses=egs), indent=2))
    cfg = _write_config(d, {
        "httpserver": {"host": "127.0.0.1"},
        "consumer": {**(SOURCE_CONSUMER if source else {}), "max.poll.records": str(max_poll_records),
                     "auto.offset.reset": initial_offset},
    })
    env = {
        "SERVICE_NAME": "kafka-source-dispatcher" if source else "kafka-broker-dispatcher",
        "SERVICE_NAMESPACE": namespace,
        "INSTANCE_ID": f"peer-dispatcher-{group}",
        "PRODUCER_CONFIG_FILE_PATH": str(cfg["producer"]),
        "CONSUMER_CONFIG_FILE_PATH": str(cfg["consumer"]),
        "WEBCLIENT_CONFIG_FILE_PATH": str(cfg["webclient"]),
        "DATA_PLANE_CONFIG_FILE_PATH": str(contract),
        "EGRESSES_INITIAL_CAPACITY": "20",
    }
    proc = _launch("dispatcher.jar", d, DISPATCHER_LOG, env, heap=heap, extra_env=extra_env)
    log = d / DISPATCHER_LOG
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _fail(proc, log, f"peer dispatcher exited with {proc.returncode}")
        if "Verticle deployed" in log.read_text(errors="replace") and _group_assigned(bootstrap, group, topic):
            return proc
        time.sleep(0.5)
    raise _fail(proc, log, f"peer dispatcher's group {group} not assigned {topic} in {timeout}s")


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 20.0) -> None:
    """SIGTERM (the data plane's shutdown hook closes Vert.x, consumers and producers), SIGKILL after ``timeout``."""
    _proc.terminate(proc, timeout=timeout)
