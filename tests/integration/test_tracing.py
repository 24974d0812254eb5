"""Traces end to end on the real processes: a gunicorn receiver and a dispatcher process on the real broker export
their spans over OTLP/HTTP to a receiver in this test (loopback), which decodes the protobuf export requests.

One event, sent with the sender's ``traceparent``, must give one trace: sender → ingress (SERVER) → produce
(PRODUCER) → process (CONSUMER) → delivery attempt (CLIENT), whose context the subscriber receives.
"""

from __future__ import annotations

import gzip
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
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from kafka_eventing.localstack import _proc
from kafka_eventing.localstack._proc import terminate
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
NS = "default"


@dataclass
class Exported:
    service: str
    span: Span

    def attr(self, key: str) -> Any:
        for kv in self.span.attributes:
            if kv.key == key:
                value = kv.value
                return getattr(value, value.WhichOneof("value"))
        return None


@dataclass
class HttpSink:
    """A threaded HTTP server on 127.0.0.1: OTLP/HTTP traces at /v1/traces, anything else is a subscriber (202)."""

    port: int = field(default_factory=_proc.free_port)
    spans: list[Exported] = field(default_factory=list)
    deliveries: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self) -> Iterator[HttpSink]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/traces":
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    request = ExportTraceServiceRequest.FromString(body)
                    with sink.lock:
                        for resource in request.resource_spans:
                            service = next((kv.value.string_value for kv in resource.resource.attributes
                                            if kv.key == "service.name"), "")
                            sink.spans.extend(Exported(service, s) for scope in resource.scope_spans
                                              for s in scope.spans)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with sink.lock:
                    sink.deliveries.append({k.lower(): v for k, v in self.headers.items()})
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

    def named(self, kind: int) -> list[Exported]:
        with self.lock:
            return [s for s in self.spans if s.span.kind == kind]


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    yield from HttpSink().serve()



def test_one_event_is_one_trace_from_sender_to_subscriber(kafka_running: KafkaNode, topic: str, sink: HttpSink,
                                                          tmp_path: Path) -> None:
    channels = tmp_path / "channels.yaml"
    channels.write_text(yaml.safe_dump({
        "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
        "metadata": {"name": "traced", "namespace": NS,
                     "annotations": {"kafka.eventing.knative.dev/external.topic": topic}},
        "spec": {"numPartitions": 3, "subscribers": [
            {"uid": "sub-1", "generation": 1, "subscriberUri": f"http://127.0.0.1:{sink.port}/subscriber"}]},
    }))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KE_", "OTEL_")) or k == "KE_CACHE"}
    common = {
        "KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels),
        "KE_BOOTSTRAP_SERVERS": kafka_running.bootstrap_servers, "KE_LOG_FORMAT": "console",
        "KE_TRACING_ENDPOINT": f"http://127.0.0.1:{sink.port}",
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

        delivered = wait_for(lambda: sink.deliveries, 60, "event delivered to the subscriber")
        wanted = {Span.SPAN_KIND_SERVER, Span.SPAN_KIND_PRODUCER, Span.SPAN_KIND_CONSUMER, Span.SPAN_KIND_CLIENT}
        wait_for(lambda: wanted <= {s.span.kind for s in sink.spans}, 60, "all four spans exported")
    finally:
        for proc in procs:
            terminate(proc)
        logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}

    def one(kind: int) -> Exported:
        found = sink.named(kind)
        assert len(found) == 1, (kind, found, logs)
        return found[0]

    server, producer = one(Span.SPAN_KIND_SERVER), one(Span.SPAN_KIND_PRODUCER)
    consumer, client = one(Span.SPAN_KIND_CONSUMER), one(Span.SPAN_KIND_CLIENT)
    # One trace, the sender's.
    assert {s.span.trace_id.hex() for s in (server, producer, consumer, client)} == {sender_trace}
    # The parent links: sender → ingress → produce → process → delivery attempt.
    assert server.span.parent_span_id.hex() == sender_span
    assert producer.span.parent_span_id == server.span.span_id
    assert consumer.span.parent_span_id == producer.span.span_id
    assert client.span.parent_span_id == consumer.span.span_id
    # Which process made which span.
    assert server.service == producer.service == "kafka-eventing-receiver"
    assert consumer.service == client.service == "kafka-eventing-dispatcher"
    # The subscriber continues the delivery attempt's span.
    assert delivered[0]["traceparent"] == f"00-{sender_trace}-{client.span.span_id.hex()}-01"
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
    assert client.attr("url.full") == f"http://127.0.0.1:{sink.port}/subscriber"
