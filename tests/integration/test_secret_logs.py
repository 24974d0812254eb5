"""No role ever logs the Kafka password: receiver, dispatcher and controller run against the broker's SASL_SSL
(SCRAM) listener at every log level — DEBUG with librdkafka's own debug contexts on (``debug=all`` through
``KE_KAFKA_EXTRA``) included — do real work (produce, consume and deliver, create a topic), and their whole output
is searched for the password as written, base64-encoded (how a Secret travels through the API) and
percent-encoded.
"""

from __future__ import annotations

import base64
import http.server
import os
import subprocess
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_eventing.localstack._proc import free_port, terminate
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
#: librdkafka's own debug output, for the DEBUG runs: every context it has.
LIBRDKAFKA_DEBUG = "debug=all"


def forms(secret: str) -> list[str]:
    """The password as a log line could carry it."""
    return [secret, base64.b64encode(secret.encode()).decode(), urllib.parse.quote(secret, safe="")]


def assert_not_in_logs(secret: str, *logs: Path) -> None:
    for log in logs:
        text = log.read_text(errors="replace")
        for form in forms(secret):
            assert form not in text, f"{log.name} holds the password ({form[:3]}…)"


class Sink(http.server.ThreadingHTTPServer):
    """A subscriber on loopback that records the ce-id of every event delivered to it."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.ids.append(self.headers.get("ce-id", ""))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"


@pytest.fixture
def sink() -> Iterator[Sink]:
    server = Sink()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def processes() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", *args], env={**full_env, **env}, cwd=REPO,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        terminate(proc)



def secret_dir(kafka: KafkaNode, path: Path) -> Path:
    path.mkdir()
    for key, value in kafka.connection_secret(sasl_ssl=True).items():
        (path / key).write_text(value)
    return path


def level_env(level: str) -> dict[str, str]:
    env = {"KE_LOG_LEVEL": level, "KE_LOG_FORMAT": "json"}
    if level == "DEBUG":
        env["KE_KAFKA_EXTRA"] = LIBRDKAFKA_DEBUG
    return env


@pytest.mark.parametrize("level", LEVELS)
def test_receiver_and_dispatcher_never_log_the_password(
        kafka_running: KafkaNode, tmp_path: Path, sink: Sink, level: str,
        processes: Callable[..., subprocess.Popen[bytes]]) -> None:
    password = kafka_running.scram_user.password
    topic = f"test.secret.{uuid.uuid4().hex[:10]}"
    admin = AdminClient(kafka_running.client_config())
    for fut in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        fut.result(timeout=30)
    channels = tmp_path / "channels.yaml"
    channels.write_text(
        "apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\n"
        "metadata:\n  name: logs\n  namespace: ns\n  uid: u-1\n  annotations:\n"
        f"    kafka.eventing.knative.dev/external.topic: {topic}\n"
        f"spec:\n  subscribers:\n    - uid: s-1\n      subscriberUri: {sink.url}\n")
    common = {"KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels),
              "KE_KAFKA_SECRET_DIR": str(secret_dir(kafka_running, tmp_path / "secret")), **level_env(level)}

    port, dispatcher_port = free_port(), free_port()
    receiver_log, dispatcher_log = tmp_path / "receiver.log", tmp_path / "dispatcher.log"
    receiver = processes(["kafka_eventing.receiver", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
                         {**common, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}, receiver_log)
    dispatcher = processes(["kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                           {**common, "KE_CHANNEL_NAMESPACE": "ns", "KE_CHANNEL_NAME": "logs",
                            "KE_METRICS_PORT": str(dispatcher_port), "KE_DISPATCHER_INITIAL_OFFSET": "earliest"},
                           dispatcher_log)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(url + "/readyz", timeout=5).status_code == 200, 60, "receiver ready",
             interval=0.2, tolerate=(httpx.HTTPError,))
    headers = {"ce-specversion": "1.0", "ce-id": f"logs-{level}", "ce-source": "/t", "ce-type": "t"}
    res = httpx.post(url + "/ns/logs", content=b"payload", headers=headers, timeout=30)
    assert res.status_code == 202, res.text  # produced over SASL_SSL: the credentials were used
    wait_for(lambda: f"logs-{level}" in sink.ids, 60, "event delivered by the dispatcher (consumed over SASL_SSL)")
    terminate(receiver)
    terminate(dispatcher)
    assert receiver.returncode == 0 and dispatcher.returncode == 0, (receiver_log.read_text()[-2000:],
                                                                    dispatcher_log.read_text()[-2000:])
    if level == "DEBUG":
        # The DEBUG run really logged at DEBUG, librdkafka's SASL handshake included: the search covered it.
        assert '"level": "debug"' in receiver_log.read_text()
        for log in (receiver_log, dispatcher_log):
            assert "scram" in log.read_text().lower(), log.name
    assert_not_in_logs(password, receiver_log, dispatcher_log)


@pytest.mark.kube
@pytest.mark.parametrize("level", LEVELS)
def test_controller_never_logs_the_password(kafka_running: KafkaNode, kube_control_plane: Any, kube_namespace: str,
                                            tmp_path: Path, level: str,
                                            processes: Callable[..., subprocess.Popen[bytes]]) -> None:
    """The controller reads the connection Secret through the API (base64 in every response) and creates the
    channel's topic with it."""
    from kubernetes import client

    from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP, KEY_BOOTSTRAP, KEY_SECRET_NAME
    from kafka_eventing.controller.crd import install_crd
    from kafka_eventing.core.channel_source import VERSION
    from kafka_eventing.core.channels import GROUP, KIND, PLURAL

    password = kafka_running.scram_user.password
    secret = kafka_running.connection_secret(sasl_ssl=True)
    api = kube_control_plane.api_client()
    try:
        install_crd(api)
        core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
        ns = kube_namespace
        core.create_namespaced_secret(ns, {"metadata": {"name": "kafka-auth"}, "stringData": secret})
        core.create_namespaced_config_map(ns, {"metadata": {"name": DEFAULT_CONFIG_MAP}, "data": {
            KEY_BOOTSTRAP: secret["bootstrap.servers"], KEY_SECRET_NAME: "kafka-auth"}})
        log = tmp_path / "controller.log"
        controller = processes(["kafka_eventing.controller", "--health-port", str(free_port()),
                                "--health-address", "127.0.0.1", "--kafka-timeout", "10"],
                               {"KE_KUBECONFIG": str(kube_control_plane.kubeconfig), "KE_SYSTEM_NAMESPACE": ns,
                                **level_env(level)}, log)
        name = f"logs-{level.lower()}"
        objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name, "namespace": ns},
            "spec": {"numPartitions": 1}})

        def topic_ready() -> bool:
            obj = objects.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            return any(c["type"] == "TopicReady" and c["status"] == "True"
                       for c in (obj.get("status") or {}).get("conditions") or ())

        # The topic was made with the Secret's credentials over SASL_SSL.
        wait_for(topic_ready, 90, "TopicReady", interval=0.5)
        terminate(controller)
        if level == "DEBUG":
            assert '"level": "debug"' in log.read_text()
        assert_not_in_logs(password, log)
    finally:
        api.close()
