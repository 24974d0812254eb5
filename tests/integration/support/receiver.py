"""The receiver as its own gunicorn process on loopback (``Receiver``, fixture ``start_receiver``), its channels
file, requests in binary mode, reading what it wrote to a topic, and its worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from kafka_eventing.localstack import _proc
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

REPO = Path(__file__).resolve().parents[3]


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

    def start(channels: str, *, env: dict[str, str] | None = None, bootstrap: str = "") -> Receiver:
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
                [sys.executable, "-m", "kafka_eventing.receiver",
                 "--bind", f"127.0.0.1:{port}", "--workers", "2", "--graceful-timeout", "15"],
                env=full_env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        receiver = Receiver(f"http://127.0.0.1:{port}", proc, channels_file, log)
        started.append(receiver)
        try:
            # Generous: on a loaded host (CI runs two such test sessions beside image builds) two gunicorn workers
            # importing the roles and syncing with Kafka and the API server have taken over a minute.
            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"the receiver exited with {proc.returncode}")
                return httpx.get(receiver.url + "/readyz", timeout=5).status_code == 200

            wait_until(ready, 180, "readiness")
            # One worker answers as soon as it is up; tests that watch the workers need both forked.
            wait_until(lambda: len(worker_pids(proc.pid)) == 2, 60, "both workers")
        except AssertionError as exc:
            raise AssertionError(f"receiver not ready ({exc}):\n{log.read_text()[-4000:]}") from None
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


def _reader(kafka: KafkaNode) -> Consumer:
    """A throwaway consumer (its own group, no commits) that starts at the beginning of what it reads."""
    return Consumer({**kafka.client_config(), "group.id": f"t-{uuid.uuid4().hex[:8]}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})


def read_topic(kafka: KafkaNode, topic: str, count: int, timeout: float = 30.0) -> list[Any]:
    consumer = _reader(kafka)
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


def read_all(kafka: KafkaNode, topic: str, timeout: float = 30.0) -> list[Any]:
    """Every record in ``topic`` now: each partition read from its start to the high watermark of the moment."""
    consumer = _reader(kafka)
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions}
        position = {p: low for p, (low, _high) in marks.items()}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while any(position[p] < high for p, (_low, high) in marks.items()):
            assert time.monotonic() < deadline, f"topic {topic} not read to its end: at {position}, ends {marks}"
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
                position[msg.partition()] = msg.offset() + 1
        return out
    finally:
        consumer.close()


def worker_pids(master: int) -> set[int]:
    return {int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split()}
