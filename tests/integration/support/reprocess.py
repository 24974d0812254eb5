"""The reprocessing jobs' test data: CloudEvents produced to a topic (structured or raw), the recording sink
the jobs send to (fixture ``sink``), and a job's one-line error."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_eventing.core.binding import CloudEvent, ContentMode, event_to_kafka
from kafka_eventing.localstack.kafka import KafkaNode

BASE = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _event(i: int, **extra: Any) -> CloudEvent:
    attrs: dict[str, Any] = {
        "id": f"ev-{i}", "source": "/tests/reprocess", "type": f"com.example.t{i % 2}", "specversion": "1.0",
        "time": BASE + timedelta(days=i % 3, seconds=i), "traceid": f"trace-{i}", **extra,
    }
    if i % 4 == 1:
        attrs["subject"] = f"subject-{i}"
    if i % 2:
        attrs["datacontenttype"] = "application/json"
        return CloudEvent(attrs, {"n": i, "text": "é"})
    return CloudEvent(attrs, bytes([i % 256]) * 17 + b"\x00\xff")


def _produce(
    node: KafkaNode, topic: str, events: list[CloudEvent], *, timestamp_ms: int | None = None,
    structured_every: int = 3, extra_headers: list[tuple[str, bytes]] | None = None,
) -> None:
    producer = Producer(node.client_config())
    for i, ev in enumerate(events):
        mode = ContentMode.STRUCTURED if i % structured_every == 2 else ContentMode.BINARY
        rec = event_to_kafka(ev, mode)
        kwargs: dict[str, Any] = {"timestamp": timestamp_ms} if timestamp_ms is not None else {}
        producer.produce(topic, rec.value, rec.key, headers=rec.headers + (extra_headers or []), **kwargs)
    assert producer.flush(30) == 0


def _produce_raw(node: KafkaNode, topic: str, value: bytes) -> None:
    producer = Producer(node.client_config())
    producer.produce(topic, value, headers=[("content-type", b"text/plain")])
    assert producer.flush(30) == 0


class Sink:
    """A local HTTP target that records every request; ``script[id]`` lists statuses to answer in turn."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.script: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with sink.lock:
                    sink.requests.append((self.path, headers, body))
                    queue = sink.script.get(headers.get("ce-id", ""), [])
                    status = queue.pop(0) if queue else 202
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def ids(self, path: str | None = None) -> list[str]:
        return [h.get("ce-id", "") for p, h, _ in self.requests if path is None or p == path]


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    s.thread.start()
    try:
        yield s
    finally:
        s.server.shutdown()
        s.server.server_close()


def _one_line(stderr: str) -> str:
    """The job's own line (Spark's JVM may log WARN lines of its own before it)."""
    lines = [line for line in stderr.splitlines() if line.startswith("kafka-eventing reprocess")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]
