"""The KafkaChannel ingress: HTTP CloudEvents in, Kafka records out, 202 only once Kafka has them.

Routing is by the ``Host`` header (``<name>-kn-channel.<namespace>.svc...``, what a channel's address resolves
to) or by path (``/<namespace>/<name>``, so a person can ``curl localhost:8080/default/orders``).

``create_app`` builds the app from injected parts (tests use fakes); ``get_app()`` reads the environment and is
what gunicorn runs: ``gunicorn -c python:kafka_eventing.receiver.gunicorn_conf
'kafka_eventing.receiver.app:get_app()'`` (``python -m kafka_eventing.receiver`` does exactly that).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
from prometheus_client import Counter, Histogram

from kafka_eventing.core.binding import (
    TRACE_HEADERS,
    BindingError,
    KafkaRecord,
    event_to_kafka,
    events_from_http_batch,
    http_to_kafka,
    is_batch,
    raw_http_to_kafka,
)
from kafka_eventing.core.channel_source import ChannelSource
from kafka_eventing.core.channels import Channel, ChannelKey, channel_key_from_host
from kafka_eventing.core.metrics import MetricsResource, Tally
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.sender import DELIVERED, KafkaSender, Outcome, Producer, Result

log = logging.getLogger(__name__)

#: librdkafka's default ``message.max.bytes``; the body limit never exceeds what the producer will send.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
READ_CHUNK = 64 * 1024

EVENTS = Counter("kafka_receiver_events_total", "Requests answered, by channel and HTTP status.",
                 ["channel", "code"])
BYTES_IN = Counter("kafka_receiver_bytes_in_total", "Event bytes received (request bodies), by channel.",
                   ["channel"])
PRODUCE_LATENCY = Histogram(
    "kafka_receiver_produce_latency_seconds", "From produce() to the last delivery report of a request.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
# The per-request metrics go through a buffer: written straight to the multiprocess files, the three per-request
# metrics cost ~25 µs/event (WSGI, session 2). Here, for the WSGI app, the answer count is written through
# (Tally.count); the ASGI app buffers all three on its loop (LoopTally, asgi.py).
TALLY = Tally()


@functools.lru_cache(maxsize=4096)
def _events(key: ChannelKey | None, status: str) -> Any:
    # labels() validates and locks on every call; a child per (channel, answer) is looked up once, by the key
    # the request already has (no label string built per request). Only known channels are counted by name
    # (a 404 counts under ""), so the cache is bounded by the channels that exist.
    label = f"{key[0]}/{key[1]}" if key and status != falcon.HTTP_404 else ""
    return EVENTS.labels(label, status[:3])


@functools.lru_cache(maxsize=4096)
def _bytes_in(namespace: str, name: str) -> Any:
    return BYTES_IN.labels(f"{namespace}/{name}")


@dataclass
class _Answer:
    status: str
    body: dict[str, Any] | None = None
    retry_after: int | None = None


_ACCEPTED = _Answer(falcon.HTTP_202)  # never mutated: one for every accepted request


class _BodyTooLarge(Exception):
    pass


def _media_json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _cannot_write(exc: Exception) -> _Answer:
    # Attributes the SDK accepted but cannot write as Kafka headers: the sender's to fix.
    return _Answer(falcon.HTTP_400, {"error": f"event cannot be written to Kafka: {exc}"})


class Ingress:
    """What a POST does, apart from reading the body and waiting: shared by the WSGI and ASGI apps."""

    def __init__(self, sender: KafkaSender, channels: ChannelSource, settings: Settings, max_body: int,
                 tally: Tally = TALLY) -> None:
        self.sender, self.channels, self.settings, self.max_body = sender, channels, settings, max_body
        self.tally = tally

    @staticmethod
    def key(req: falcon.Request | falcon.asgi.Request, namespace: str | None,
            name: str | None) -> ChannelKey | None:
        if namespace and name:
            return (namespace, name)
        return channel_key_from_host(req.get_header("Host") or "")

    def unavailable(self, message: str) -> _Answer:
        return _Answer(falcon.HTTP_503, {"error": message}, self.settings.retry_after_seconds)

    def too_large(self) -> _Answer:
        return _Answer(falcon.HTTP_413, {"error": f"event larger than {self.max_body} bytes"})

    def lookup(self, key: ChannelKey | None) -> Channel | _Answer:
        if key is None:
            return _Answer(falcon.HTTP_404, {"error": "no channel: use Host <name>-kn-channel.<namespace>.svc "
                                             "or path /<namespace>/<name>"})
        channel = self.channels.get(key)
        if channel is None:
            return _Answer(falcon.HTTP_404, {"error": f"channel {key[0]}/{key[1]} not found"})
        if not channel.ready:
            return self.unavailable(f"channel {key[0]}/{key[1]} is not ready: {channel.reason or 'unknown'}")
        return channel

    def decode(self, channel: Channel, req: falcon.Request | falcon.asgi.Request,
               body: bytes) -> list[KafkaRecord] | _Answer:
        """Body + headers → the Kafka records of one event or of a whole batch (all valid, or a 400)."""
        self.tally.inc(_bytes_in(channel.namespace, channel.name), len(body))
        try:
            if not is_batch(req.content_type):
                # One event: straight from HTTP to Kafka (trace context included), through the SDK whenever the
                # fast path is not certain. ASGI: from the header bytes the server read, no str dict per request.
                if isinstance(req, falcon.asgi.Request):
                    return [raw_http_to_kafka(req.scope["headers"], body, channel.content_mode,
                                              headers=lambda: req.headers)]
                return [http_to_kafka(req.headers, body, channel.content_mode)]
            events = events_from_http_batch(body)
        except BindingError as exc:
            return _Answer(falcon.HTTP_400, exc.as_dict())
        except (ValueError, TypeError) as exc:
            return _cannot_write(exc)
        trace = {name: value for name in TRACE_HEADERS if (value := req.get_header(name))}
        try:
            return [event_to_kafka(e, channel.content_mode, trace=trace) for e in events]
        except (BindingError, ValueError, TypeError) as exc:
            return _cannot_write(exc)

    def finish(self, result: Result, channel: Channel, count: int, started: float) -> _Answer:
        self.tally.observe(PRODUCE_LATENCY, time.perf_counter() - started)
        if result is DELIVERED or result.ok:  # the shared result first: no property call for the common answer
            return _ACCEPTED
        if result.outcome is Outcome.TOO_LARGE:
            return _Answer(falcon.HTTP_413, {"error": result.detail})
        # Never log event data; the channel and the librdkafka reason are enough to act on.
        log.warning("events not accepted", extra={
            "channel": f"{channel.namespace}/{channel.name}", "events": count,
            "outcome": result.outcome.value, "reason": result.detail})
        return self.unavailable(f"Kafka did not accept the event ({result.outcome.value}): {result.detail}")

    def respond(self, resp: falcon.Response | falcon.asgi.Response, answer: _Answer, key: ChannelKey | None) -> None:
        resp.status = answer.status
        if answer.body is not None:
            resp.data = _media_json(answer.body)
            resp.content_type = falcon.MEDIA_JSON
        if answer.retry_after is not None:
            resp.set_header("Retry-After", str(answer.retry_after))
        # Counted promptly (Tally.count): written through, or within the LoopTally's few milliseconds.
        self.tally.count(_events(key, answer.status))

    @staticmethod
    def options(req: falcon.Request | falcon.asgi.Request, resp: falcon.Response | falcon.asgi.Response) -> None:
        # CloudEvents HTTP webhook abuse protection: allow the origin that asks, at any rate.
        origin = req.get_header("WebHook-Request-Origin")
        resp.status = falcon.HTTP_200
        resp.set_header("Allow", "POST, OPTIONS")
        if origin:
            resp.set_header("WebHook-Allowed-Origin", origin)
        if req.get_header("WebHook-Request-Rate"):
            resp.set_header("WebHook-Allowed-Rate", "*")


class ChannelResource:
    """POST an event (or batch) to a channel; OPTIONS for the CloudEvents webhook handshake (WSGI)."""

    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress

    def on_options(self, req: falcon.Request, resp: falcon.Response,
                   namespace: str | None = None, name: str | None = None) -> None:
        self.ingress.options(req, resp)

    def on_post(self, req: falcon.Request, resp: falcon.Response,
                namespace: str | None = None, name: str | None = None) -> None:
        key = self.ingress.key(req, namespace, name)
        self.ingress.respond(resp, self._handle(req, key), key)

    def _handle(self, req: falcon.Request, key: ChannelKey | None) -> _Answer:
        ingress = self.ingress
        channel = ingress.lookup(key)
        if isinstance(channel, _Answer):
            return channel
        try:
            body = self._read_body(req)
        except _BodyTooLarge:
            return ingress.too_large()
        records = ingress.decode(channel, req, body)
        if isinstance(records, _Answer):
            return records
        started = time.perf_counter()
        result = ingress.sender.send(channel.topic, records)
        return ingress.finish(result, channel, len(records), started)

    def _read_body(self, req: falcon.Request) -> bytes:
        """The body, never buffering more than the limit + 1 byte."""
        limit = self.ingress.max_body
        length = req.content_length
        if length is not None:
            if length > limit:
                raise _BodyTooLarge
            return req.bounded_stream.read(length) if length else b""
        if "chunked" not in (req.get_header("Transfer-Encoding") or "").lower():
            return b""
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = req.stream.read(min(READ_CHUNK, limit + 1 - size))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge


class HealthResource:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"status": "ok"}


def readiness(channels: ChannelSource, sender: KafkaSender) -> tuple[str, dict[str, bool]]:
    """Can this pod answer? Kafka is deliberately not asked: a broker blip would take every receiver pod out of
    the Service at once, and clients would get connection errors instead of a 503 + Retry-After per request."""
    checks = {"channels": channels.synced(), "accepting": not sender.closing}
    return (falcon.HTTP_200 if all(checks.values()) else falcon.HTTP_503), checks


class ReadyResource:
    def __init__(self, channels: ChannelSource, sender: KafkaSender) -> None:
        self.channels, self.sender = channels, sender

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.status, resp.media = readiness(self.channels, self.sender)


class _JsonErrors:
    """Falcon's own errors (405, 404 for other paths, bad headers) as JSON like ours."""

    def __call__(self, req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError,
                 params: dict[str, Any]) -> None:
        resp.status = ex.status
        resp.data = _media_json({"error": ex.title + (f": {ex.description}" if ex.description else "")})
        resp.content_type = falcon.MEDIA_JSON
        if ex.headers:
            resp.set_headers(ex.headers)


def create_app(
    producer: Producer,
    channels: ChannelSource,
    settings: Settings,
    *,
    sender: KafkaSender | None = None,
    message_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
) -> falcon.App[falcon.Request, falcon.Response]:
    """The receiver app. ``producer`` and ``channels`` must already be started by the caller (or by get_app)."""
    sender = sender or KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    sender.start()
    TALLY.start()
    app: falcon.App[falcon.Request, falcon.Response] = falcon.App()
    app.req_options.strip_url_path_trailing_slash = True
    app.add_error_handler(falcon.HTTPError, _JsonErrors())
    resource = ChannelResource(Ingress(sender, channels, settings, min(settings.max_event_bytes, message_max_bytes)))
    app.add_route("/", resource)
    app.add_route("/{namespace}/{name}", resource)
    app.add_route("/healthz", HealthResource())
    app.add_route("/readyz", ReadyResource(channels, sender))
    app.add_route("/metrics", MetricsResource())
    return app


# -- what gunicorn runs ---------------------------------------------------------------------------------


@dataclass
class Runtime:
    """The parts built in this worker process, so worker_exit can stop them in order."""

    settings: Settings
    producer: Producer
    channels: ChannelSource
    sender: KafkaSender
    message_max_bytes: int

    def close(self) -> None:
        # In-flight requests may each wait a whole produce timeout; then the flush gets what is left.
        self.sender.close(timeout=self.settings.produce_timeout_seconds + 2.0)
        self.channels.stop()


_runtime: Runtime | None = None


def producer_config(settings: Settings) -> dict[str, Any]:
    from kafka_eventing.core.kafka_config import connection_from_settings

    connection = connection_from_settings(settings)
    return connection.producer_config(**{
        "compression.type": settings.compression_type,
        "linger.ms": settings.linger_ms,
        # librdkafka gives up on a record when the HTTP answer does: a 503 then means "not written".
        "message.timeout.ms": max(1, int(settings.produce_timeout_seconds * 1000)),
        "logger": logging.getLogger("librdkafka"),
    })


def build_runtime() -> Runtime:
    """Settings from the environment; producer, channel source and sender created (and started) here.

    Called from get_app(), i.e. in each gunicorn worker after fork (the config never preloads the app), so
    librdkafka's threads belong to the process that uses them.
    """
    global _runtime  # noqa: PLW0603 - one runtime per worker process, for the gunicorn hooks
    from confluent_kafka import Producer as KafkaProducer

    from kafka_eventing.core import logging as ke_logging
    from kafka_eventing.core.channel_source import channel_source_from_settings

    settings = Settings.from_env()
    ke_logging.configure(settings.log_level, settings.log_format)
    config = producer_config(settings)
    producer = KafkaProducer(config)
    channels = channel_source_from_settings(settings)
    channels.start()
    sender = KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    _runtime = Runtime(settings, producer, channels, sender,
                       int(config.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES)))
    return _runtime


def get_app() -> falcon.App[falcon.Request, falcon.Response]:
    """Build the receiver from the environment: what gunicorn runs."""
    parts = build_runtime()
    return create_app(parts.producer, parts.channels, parts.settings, sender=parts.sender,
                      message_max_bytes=parts.message_max_bytes)


def shutdown() -> None:
    """gunicorn ``worker_exit`` / ASGI lifespan shutdown: finish in-flight produces, flush, stop watching."""
    global _runtime
    runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.close()
    TALLY.flush()  # the last answers' metrics, before the worker's files are all that is left
