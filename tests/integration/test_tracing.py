"""Traces end to end on the real processes: a gunicorn receiver and a dispatcher process on the real broker export
their spans over OTLP/HTTP to a real OpenTelemetry Collector on loopback (``otelcol``, built from the collector's Go
modules by ``hack/setup/go-tools.sh`` from ``hack/tools/otelcol``), whose file exporter writes them as OTLP JSON.

One event, sent with the sender's ``traceparent``, must give one trace: sender → ingress (SERVER) → produce
(PRODUCER) → process (CONSUMER) → delivery attempt (CLIENT), whose context the subscriber receives.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from kafka_eventing.localstack import _proc
from kafka_eventing.localstack._proc import tail, terminate
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.tools import ToolNotFoundError, tool_path
from waiting import wait_for

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
NS = "default"


@dataclass(frozen=True)
class Exported:
    """One span as the collector's file exporter wrote it (OTLP JSON: hex ids, ``kind`` as OTLP's number)."""

    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    name: str
    attributes: dict[str, Any]

    def attr(self, key: str) -> Any:
        return self.attributes.get(key)


def _value(value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as Python; ``intValue`` is a decimal string there (64-bit ints in JSON)."""
    if "intValue" in value:
        return int(value["intValue"])
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    return value


def _attributes(attributes: list[dict[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: _value(kv.get("value", {})) for kv in attributes}


@dataclass
class Collector:
    """``otelcol`` on 127.0.0.1: OTLP/HTTP in, one OTLP JSON export request per line out."""

    port: int
    output: Path

    def spans(self) -> list[Exported]:
        if not self.output.exists():
            return []
        found: list[Exported] = []
        # Only whole lines: the exporter may be part-way through writing the last one.
        for line in self.output.read_text().splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            for resource in json.loads(line).get("resourceSpans", []):
                service = _attributes(resource.get("resource", {}).get("attributes", [])).get("service.name", "")
                found.extend(
                    Exported(service, s["traceId"], s["spanId"], s.get("parentSpanId", ""), s.get("kind", 0),
                             s["name"], _attributes(s.get("attributes", [])))
                    for scope in resource.get("scopeSpans", []) for s in scope.get("spans", []))
        return found

    def of_kind(self, kind: int) -> list[Exported]:
        return [s for s in self.spans() if s.kind == kind]


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    try:
        binary = tool_path("otelcol")
    except ToolNotFoundError as exc:
        # A real tier (kafka): under KAFKA_EVENTING_REQUIRE_REAL_TIERS (make test) this skip fails the run.
        pytest.skip(f"the OpenTelemetry Collector the spans go to is not built: {exc}; run `make setup` "
                    "(hack/setup/go-tools.sh builds it into .cache/bin)")
    port, workdir = _proc.free_port(), tmp_path / "otelcol"
    workdir.mkdir()
    spans = workdir / "spans.jsonl"
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"file": {"path": str(spans), "flush_interval": "100ms"}},
        "service": {
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
            # No self-metrics listener (it would take 127.0.0.1:8888, shared by every test run on the machine).
            "telemetry": {"metrics": {"level": "none"}},
        },
    }))
    log = tmp_path / "otelcol.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(binary), "--config", f"file:{config}"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or _proc.port_open(port), 30, "collector listening")
        assert proc.poll() is None, f"otelcol exited {proc.returncode}:\n{tail(log)}"
        yield Collector(port, spans)
    finally:
        terminate(proc)


@dataclass
class Subscriber:
    """A threaded HTTP server on 127.0.0.1 that answers every POST 202 and keeps its headers."""

    port: int = field(default_factory=_proc.free_port)
    deliveries: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self) -> Iterator[Subscriber]:
        subscriber = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with subscriber.lock:
                    subscriber.deliveries.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(10)


@pytest.fixture
def subscriber() -> Iterator[Subscriber]:
    yield from Subscriber().serve()


def test_one_event_is_one_trace_from_sender_to_subscriber(kafka_running: KafkaNode, topic: str, collector: Collector,
                                                          subscriber: Subscriber, tmp_path: Path) -> None:
    channels = tmp_path / "channels.yaml"
    channels.write_text(yaml.safe_dump({
        "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
        "metadata": {"name": "traced", "namespace": NS,
                     "annotations": {"kafka.eventing.knative.dev/external.topic": topic}},
        "spec": {"numPartitions": 3, "subscribers": [
            {"uid": "sub-1", "generation": 1, "subscriberUri": f"http://127.0.0.1:{subscriber.port}/subscriber"}]},
    }))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KE_", "OTEL_")) or k == "KE_CACHE"}
    common = {
        "KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels),
        "KE_BOOTSTRAP_SERVERS": kafka_running.bootstrap_servers, "KE_LOG_FORMAT": "console",
        "KE_TRACING_ENDPOINT": f"http://127.0.0.1:{collector.port}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # export within 0.2 s instead of 5 s
    }
    receiver_port, dispatcher_port = _proc.free_port(), _proc.free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with (tmp_path / "dispatcher.log").open("wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                env={**base, **common, "KE_CHANNEL_NAMESPACE": NS, "KE_CHANNEL_NAME": "traced",
                     "KE_METRICS_PORT": str(dispatcher_port),
                     "KE_KAFKA_EXTRA": "session.timeout.ms=6000,heartbeat.interval.ms=500,auto.offset.reset=earliest"},
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        with (tmp_path / "receiver.log").open("wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "kafka_eventing.receiver", "--bind", f"127.0.0.1:{receiver_port}",
                 "--workers", "1"],
                env={**base, **common, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")},
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

        def up(port: int, path: str = "/readyz") -> bool:
            return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code == 200

        wait_for(lambda: up(receiver_port), 90, "receiver ready", tolerate=(httpx.HTTPError,))
        wait_for(lambda: up(dispatcher_port), 90, "dispatcher ready", tolerate=(httpx.HTTPError,))

        sender_trace, sender_span = secrets.token_hex(16), secrets.token_hex(8)
        resp = httpx.post(f"http://127.0.0.1:{receiver_port}/{NS}/traced", content=b'{"hello": 1}', headers={
            "ce-specversion": "1.0", "ce-id": "traced-1", "ce-source": "/test", "ce-type": "test.traced",
            "content-type": "application/json", "traceparent": f"00-{sender_trace}-{sender_span}-01"}, timeout=20)
        assert resp.status_code == 202, resp.text

        delivered = wait_for(lambda: subscriber.deliveries, 60, "event delivered to the subscriber")
        wanted = {Span.SPAN_KIND_SERVER, Span.SPAN_KIND_PRODUCER, Span.SPAN_KIND_CONSUMER, Span.SPAN_KIND_CLIENT}
        wait_for(lambda: wanted <= {s.kind for s in collector.spans()}, 60, "all four spans written by the collector")
    finally:
        for proc in procs:
            terminate(proc)
        logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}

    def one(kind: int) -> Exported:
        found = collector.of_kind(kind)
        assert len(found) == 1, (kind, found, logs)
        return found[0]

    server, producer = one(Span.SPAN_KIND_SERVER), one(Span.SPAN_KIND_PRODUCER)
    consumer, client = one(Span.SPAN_KIND_CONSUMER), one(Span.SPAN_KIND_CLIENT)
    # One trace, the sender's.
    assert {s.trace_id for s in (server, producer, consumer, client)} == {sender_trace}
    # The parent links: sender → ingress → produce → process → delivery attempt.
    assert server.parent_span_id == sender_span
    assert producer.parent_span_id == server.span_id
    assert consumer.parent_span_id == producer.span_id
    assert client.parent_span_id == consumer.span_id
    # Which process made which span.
    assert server.service == producer.service == "kafka-eventing-receiver"
    assert consumer.service == client.service == "kafka-eventing-dispatcher"
    # The subscriber continues the delivery attempt's span.
    assert delivered[0]["traceparent"] == f"00-{sender_trace}-{client.span_id}-01"
    # Semantic-convention attributes.
    assert server.attr("http.response.status_code") == 202
    for span in (producer, consumer):
        assert span.attr("messaging.system") == "kafka"
        assert span.attr("messaging.destination.name") == topic
        assert span.attr("cloudevents.event_id") == "traced-1"
        assert span.attr("cloudevents.event_type") == "test.traced"
        assert span.attr("cloudevents.event_source") == "/test"
        assert span.attr("kafka_eventing.channel") == f"{NS}/traced"
    assert producer.attr("kafka_eventing.outcome") == "delivered"
    assert consumer.attr("messaging.destination.partition.id") in {"0", "1", "2"}
    assert isinstance(consumer.attr("messaging.kafka.offset"), int)
    assert consumer.attr("kafka_eventing.subscription") == "sub-1"
    assert consumer.attr("kafka_eventing.outcome") == "delivered"
    assert client.attr("kafka_eventing.attempt") == 1
    assert client.attr("http.response.status_code") == 202
    assert client.attr("url.full") == f"http://127.0.0.1:{subscriber.port}/subscriber"
