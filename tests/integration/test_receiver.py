"""The receiver as it runs: a real gunicorn subprocess in front of the real broker.

Events are read back from the topic and compared attribute by attribute; the broker is stopped and started
under the receiver; channels come and go through the channels file; SIGTERM loses no accepted event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer

from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.localstack import _proc
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]


def channels_yaml(*channels: tuple[str, str, str, str]) -> str:
    """(namespace, name, topic, content mode) → KafkaChannel documents."""
    docs = []
    for namespace, name, topic, mode in channels:
        docs.append(
            "apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\n"
            f"metadata:\n  name: {name}\n  namespace: {namespace}\n  annotations:\n"
            f"    kafka.eventing.knative.dev/external.topic: {topic}\n"
            f"    kafka.eventing.knative.dev/content.mode: {mode}\n"
        )
    return "---\n".join(docs)


@dataclass
class Receiver:
    url: str
    proc: subprocess.Popen[bytes]
    channels_file: Path
    log: Path

    def post(self, path: str, body: bytes, headers: dict[str, str], timeout: float = 20.0) -> httpx.Response:
        return httpx.post(self.url + path, content=body, headers=headers, timeout=timeout)

    def write_channels(self, text: str) -> None:
        tmp = self.channels_file.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.channels_file)


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    # A receiver that is (re)starting refuses connections: that is "not yet".
    wait_for(cond, timeout, what, interval=0.1, tolerate=(httpx.HTTPError,))


@pytest.fixture
def start_receiver(tmp_path: Path) -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(channels: str, *, env: dict[str, str] | None = None, bootstrap: str = "",
              model: str = "uvicorn") -> Receiver:
        port = _proc.free_port()
        channels_file = tmp_path / f"channels-{len(started)}.yaml"
        channels_file.write_text(channels)
        metrics_dir = tmp_path / f"prom-{len(started)}"
        log = tmp_path / f"receiver-{len(started)}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
        full_env.update({
            "KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels_file), "KE_BOOTSTRAP_SERVERS": bootstrap,
            "KE_PRODUCE_TIMEOUT_SECONDS": "5", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            **(env or {}),
        })
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kafka_eventing.receiver", "--worker-model", model,
                 "--bind", f"127.0.0.1:{port}", "--workers", "2", "--graceful-timeout", "15"],
                env=full_env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        receiver = Receiver(f"http://127.0.0.1:{port}", proc, channels_file, log)
        started.append(receiver)
        try:
            wait_until(lambda: httpx.get(receiver.url + "/readyz", timeout=5).status_code == 200, 60, "readiness")
        except AssertionError:
            raise AssertionError(f"receiver not ready:\n{log.read_text()[-4000:]}") from None
        return receiver

    yield start
    for receiver in started:
        if receiver.proc.poll() is None:
            receiver.proc.send_signal(signal.SIGTERM)
            try:
                receiver.proc.wait(30)
            except subprocess.TimeoutExpired:
                receiver.proc.kill()
                receiver.proc.wait(5)


def read_topic(kafka: KafkaNode, topic: str, count: int, timeout: float = 30.0) -> list[Any]:
    consumer = Consumer({**kafka.client_config(), "group.id": f"t-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out


def binary_headers(event_id: str, **extra: str) -> dict[str, str]:
    return {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/itest", "ce-type": "itest.event",
            "content-type": "application/octet-stream", **extra}


def test_binary_structured_and_batch_round_trip(kafka_running: KafkaNode, topic: str,
                                                start_receiver: Callable[..., Receiver]) -> None:
    structured_topic = topic  # same topic, two channels writing it in the two content modes
    receiver = start_receiver(channels_yaml(("ns", "bin", topic, "binary"), ("ns", "str", structured_topic,
                                                                                  "structured")),
                              bootstrap=kafka_running.bootstrap_servers)
    data = bytes(range(256)) * 4  # not UTF-8, not JSON: must arrive byte for byte
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    res = receiver.post("/", data, {**binary_headers("b-1", **{"ce-partitionkey": "k1", "ce-ext": "v"}),
                                    "Host": "bin-kn-channel.ns.svc.cluster.local", "traceparent": trace})
    assert res.status_code == 202, res.text
    structured = {"specversion": "1.0", "id": "s-1", "source": "/itest", "type": "itest.event",
                  "subject": "subj", "datacontenttype": "application/json", "data": {"a": [1, 2]}}
    res = receiver.post("/ns/str", json.dumps(structured).encode(),
                        {"content-type": "application/cloudevents+json"})
    assert res.status_code == 202, res.text
    batch = [{"specversion": "1.0", "id": f"batch-{i}", "source": "/itest", "type": "itest.batch",
              "data": f"item {i}"} for i in range(3)]
    res = receiver.post("/ns/bin", json.dumps(batch).encode(),
                        {"content-type": "application/cloudevents-batch+json"})
    assert res.status_code == 202, res.text

    messages = {event_from_kafka(m.headers(), m.value()).get_id(): m for m in read_topic(kafka_running, topic, 5)}
    assert set(messages) == {"b-1", "s-1", "batch-0", "batch-1", "batch-2"}

    msg = messages["b-1"]
    event = event_from_kafka(msg.headers(), msg.value())
    assert msg.key() == b"k1"
    assert msg.value() == data
    attrs = event.get_attributes()
    assert attrs["source"] == "/itest"
    assert attrs["type"] == "itest.event"
    assert attrs["ext"] == "v"
    assert attrs["datacontenttype"] == "application/octet-stream"
    assert event.get_data() == data
    assert dict(msg.headers())["traceparent"] == trace.encode()

    msg = messages["s-1"]
    assert dict(msg.headers())["content-type"].startswith(b"application/cloudevents+json")
    assert msg.key() == b"subj"
    event = event_from_kafka(msg.headers(), msg.value())
    for name in ("specversion", "source", "type", "subject", "datacontenttype"):
        assert event.get_attributes()[name] == structured[name]
    data = event.get_data()  # structured JSON data comes back as the JSON value
    assert (json.loads(data) if isinstance(data, bytes) else data) == structured["data"]

    for i in range(3):
        event = event_from_kafka(messages[f"batch-{i}"].headers(), messages[f"batch-{i}"].value())
        assert event.get_type() == "itest.batch"
        # No datacontenttype: the data is JSON (a JSON string here), and binary mode says so.
        assert json.loads(event.get_data()) == f"item {i}"
        assert dict(messages[f"batch-{i}"].headers())["content-type"] == b"application/json"

    # Each worker buffers its counts for a few milliseconds (LoopTally), and either worker may serve the scrape.
    counted = 'kafka_receiver_events_total{channel="ns/bin",code="202"} 2.0'
    wait_for(lambda: counted in httpx.get(receiver.url + "/metrics", timeout=5).text, 2.0,
             "both binary events counted")


def test_sasl_ssl_listener_from_secret_files(kafka_running: KafkaNode, topic: str, tmp_path: Path,
                                             start_receiver: Callable[..., Receiver]) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    for key, value in kafka_running.connection_secret(sasl_ssl=True).items():
        (secret / key).write_text(value)
    receiver = start_receiver(channels_yaml(("ns", "tls", topic, "binary")),
                              env={"KE_KAFKA_SECRET_DIR": str(secret)})
    res = receiver.post("/ns/tls", b"over tls", binary_headers("tls-1"))
    assert res.status_code == 202, res.text
    [msg] = read_topic(kafka_running, topic, 1)
    assert msg.value() == b"over tls"
    log_text = receiver.log.read_text()
    assert kafka_running.scram_user.password not in log_text


def test_channels_added_and_removed_at_runtime(kafka_running: KafkaNode, topic: str,
                                               start_receiver: Callable[..., Receiver]) -> None:
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers)
    assert receiver.post("/ns/b", b"x", binary_headers("1")).status_code == 404
    receiver.write_channels(channels_yaml(("ns", "a", topic, "binary"), ("ns", "b", topic, "binary")))
    wait_until(lambda: receiver.post("/ns/b", b"x", binary_headers("2")).status_code == 202, 10, "channel b")
    receiver.write_channels(channels_yaml(("ns", "b", topic, "binary")))
    wait_until(lambda: receiver.post("/ns/a", b"x", binary_headers("3")).status_code == 404, 10, "a removed")
    assert receiver.post("/ns/b", b"x", binary_headers("4")).status_code == 202


@pytest.mark.parametrize("model", ["uvicorn", "gthread"])
def test_sigterm_loses_no_accepted_event(kafka_running: KafkaNode, topic: str,
                                         start_receiver: Callable[..., Receiver], model: str) -> None:
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers,
                              model=model)
    accepted: list[str] = []
    stop = threading.Event()

    def load(n: int) -> None:
        with httpx.Client(timeout=20) as client:
            i = 0
            while not stop.is_set():
                event_id = f"{n}-{i}"
                try:
                    res = client.post(receiver.url + "/ns/a", content=b"e", headers=binary_headers(event_id))
                except httpx.HTTPError:
                    continue
                if res.status_code == 202:
                    accepted.append(event_id)
                i += 1

    threads = [threading.Thread(target=load, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(accepted) >= 50, 20, "some accepted events")
    receiver.proc.send_signal(signal.SIGTERM)
    assert receiver.proc.wait(30) == 0
    stop.set()
    for t in threads:
        t.join(25)
    in_topic = {event_from_kafka(m.headers(), m.value()).get_id()
                for m in read_topic(kafka_running, topic, len(accepted), timeout=20)}
    assert set(accepted) <= in_topic


def test_broker_down_503_then_back_202(kafka_running: KafkaNode, topic: str,
                                       start_receiver: Callable[..., Receiver]) -> None:
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers,
                              env={"KE_PRODUCE_TIMEOUT_SECONDS": "2"})
    assert receiver.post("/ns/a", b"before", binary_headers("before")).status_code == 202
    kafka_running.stop()
    try:
        started = time.monotonic()
        res = receiver.post("/ns/a", b"down", binary_headers("down"))
        assert res.status_code == 503, res.text
        assert res.headers["Retry-After"]
        assert time.monotonic() - started < 5
        wait_until(lambda: httpx.get(receiver.url + "/readyz", timeout=10).status_code == 503, 15, "not ready")
    finally:
        kafka_running.start()
    wait_until(lambda: receiver.post("/ns/a", b"after", binary_headers("after")).status_code == 202, 60,
               "202 after the broker came back")
    ids = {event_from_kafka(m.headers(), m.value()).get_id() for m in read_topic(kafka_running, topic, 2)}
    assert {"before", "after"} <= ids
