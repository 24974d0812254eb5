"""What the receiver does with a request, apart from serving HTTP: find the channel, decode the body into Kafka
records, turn the delivery outcome into an answer, count it.

Routing is by the ``Host`` header (``<name>-kn-channel.<namespace>.svc...``, what a channel's address resolves
to) or by path (``/<namespace>/<name>``, so a person can ``curl localhost:8080/default/orders``). The path form is
also a Kafka Broker's address (``http://<receiver>/<namespace>/<broker>``): when a Broker and a KafkaChannel share
a namespace and name, the path reaches the Broker — its only address — and the channel stays reachable by its
own address, the Host form. KafkaSinks have the path form too, on an address of their own: the sink ingress
Service (``KE_SINK_SERVICE``, on the same pods), which a request names in its ``Host`` (``core.sinks``), so a
sink never collides with a Broker or channel of the same name. The falcon app around it is ``receiver.app``.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import falcon
import falcon.asgi
from prometheus_client import Counter, Histogram

from kafka_eventing.core.binding import (
    TRACE_HEADERS,
    BindingError,
    KafkaRecord,
    event_to_kafka,
    events_from_http_batch,
    is_batch,
)
from kafka_eventing.core.channel_source import ChannelSource
from kafka_eventing.core.channels import Channel, ChannelKey, channel_key_from_host
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.sinks import is_sink_host
from kafka_eventing.core.transcode import raw_http_to_kafka, text_headers
from kafka_eventing.receiver.metrics import Tally
from kafka_eventing.receiver.sender import DELIVERED, KafkaSender, Outcome, Result

log = logging.getLogger(__name__)

#: librdkafka's default ``message.max.bytes``; the body limit never exceeds what the producer will send.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
#: Distinct Host values whose sink-or-not answer is remembered: a Service is reached by a handful of names; past
#: this many (a client making Hosts up) each is worked out per request again.
_SINK_HOSTS_MAX = 1024

EVENTS = Counter("kafka_receiver_events_total", "Requests answered, by channel and HTTP status.",
                 ["channel", "code"])
BYTES_IN = Counter("kafka_receiver_bytes_in_total", "Event bytes received (request bodies), by channel.",
                   ["channel"])
PRODUCE_LATENCY = Histogram(
    "kafka_receiver_produce_latency_seconds", "From produce() to the last delivery report of a request.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
# The per-request metrics go through a buffer: written straight to the multiprocess files, the three
# per-request metrics cost ~25 µs/event (profile of a gunicorn worker under bench/receiver.py's load). The app
# replaces this default with a LoopTally on its event loop (receiver.app); this one serves code off the loop.
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
class Answer:
    status: str
    body: dict[str, Any] | None = None
    retry_after: int | None = None


_ACCEPTED = Answer(falcon.HTTP_202)  # never mutated: one for every accepted request
_CLIENT_CLOSED = "499 Client Closed Request"


class BodyTooLarge(Exception):
    pass


def _media_json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _cannot_write(exc: Exception) -> Answer:
    # Attributes the SDK accepted but cannot write as Kafka headers: the sender's to fix.
    return Answer(falcon.HTTP_400, {"error": f"event cannot be written to Kafka: {exc}"})


class Routes(NamedTuple):
    """What each form of address leads to, one dict per form, so that finding a request's target is one dictionary
    access: a ready target, or the 503 answer of one that is not ready. The sources are read only when they change.
    """

    #: ``<name>-kn-channel.<namespace>.svc...``: KafkaChannels
    host: dict[ChannelKey, Channel | Answer]
    #: ``/<namespace>/<name>``: a Broker of that name, else the KafkaChannel
    path: dict[ChannelKey, Channel | Answer]
    #: ``/<namespace>/<name>`` on the sink ingress Service: KafkaSinks
    sink: dict[ChannelKey, Channel | Answer]


class Ingress:
    """What a POST does, apart from reading the body and waiting for Kafka."""

    def __init__(self, sender: KafkaSender, channels: ChannelSource, settings: Settings, max_body: int,
                 tally: Tally = TALLY, *, brokers: ChannelSource | None = None,
                 sinks: ChannelSource | None = None) -> None:
        self.sender, self.channels, self.settings, self.max_body = sender, channels, settings, max_body
        self.tally = tally
        self.brokers = brokers
        self.sinks = sinks
        self.sink_service = settings.sink_service.lower()
        self._sink_hosts: dict[str, bool] = {}
        self._routes_lock = threading.Lock()
        self.routes = Routes({}, {}, {})
        # Subscribed before the first build: a set published in between is then built again, never missed.
        for source in (channels, brokers, sinks):
            if source is not None:
                source.subscribe(self._sources_changed)
        self._sources_changed(None)

    def _sources_changed(self, _snapshot: object) -> None:
        # Sources publish on their own threads: under the lock, the last build reads every source's newest set.
        # The new tables replace the old as one object, so a request sees either, never a mix.
        with self._routes_lock:
            self.routes = self._build_routes()

    def _build_routes(self) -> Routes:
        """Each form of address's table, from ``target()`` (which decides what an address leads to) for every key
        the sources hold."""

        def table(keys: Iterable[ChannelKey], by_path: bool, sink: bool) -> dict[ChannelKey, Channel | Answer]:
            out: dict[ChannelKey, Channel | Answer] = {}
            for key in keys:
                target, kind = self.target(key, by_path, sink)
                if target is not None:
                    out[key] = target if target.ready else self.unavailable(
                        f"{kind} {key[0]}/{key[1]} is not ready: {target.reason or 'unknown'}")
            return out

        channels = self.channels.snapshot().keys()
        brokers = self.brokers.snapshot().keys() if self.brokers is not None else set()
        sinks = self.sinks.snapshot().keys() if self.sinks is not None else set()
        return Routes(table(channels, False, False), table(channels | brokers, True, False), table(sinks, True, True))

    @staticmethod
    def key(req: falcon.asgi.Request, namespace: str | None, name: str | None) -> ChannelKey | None:
        if namespace and name:
            return (namespace, name)
        return channel_key_from_host(req.get_header("Host") or "")

    def unavailable(self, message: str) -> Answer:
        return Answer(falcon.HTTP_503, {"error": message}, self.settings.retry_after_seconds)

    def too_large(self) -> Answer:
        return Answer(falcon.HTTP_413, {"error": f"event larger than {self.max_body} bytes"})

    @staticmethod
    def client_gone() -> Answer:
        # Nobody reads it; it is counted (nginx's code for a client that closed its request).
        return Answer(_CLIENT_CLOSED, {"error": "the client closed the connection before its body was complete"})

    def to_sink(self, req: falcon.asgi.Request) -> bool:
        """Whether a ``/<namespace>/<name>`` request is addressed to the sink ingress Service (its Host); asked
        only while KafkaSinks are served."""
        host = req.get_header("Host") or ""
        sink = self._sink_hosts.get(host)
        if sink is None:
            sink = is_sink_host(host, self.sink_service)
            if len(self._sink_hosts) < _SINK_HOSTS_MAX:
                self._sink_hosts[host] = sink
        return sink

    def target(self, key: ChannelKey, by_path: bool = False, sink: bool = False) -> tuple[Channel | None, str]:
        """The KafkaSink, Broker or channel a request goes to, and which kind it is; ``by_path``: the key came
        from ``/<namespace>/<name>``, where a Broker of that name comes first; ``sink``: and the request was
        addressed to the sink ingress Service, where only KafkaSinks are."""
        if sink:
            return (self.sinks.get(key) if self.sinks is not None else None), "KafkaSink"
        broker = self.brokers.get(key) if by_path and self.brokers is not None else None
        return (broker, "broker") if broker is not None else (self.channels.get(key), "channel")

    def lookup(self, key: ChannelKey | None, by_path: bool = False, sink: bool = False) -> Channel | Answer:
        """``by_path``: the key came from ``/<namespace>/<name>``, where a Broker of that name comes first;
        ``sink``: on the sink ingress Service's address, where only KafkaSinks are."""
        if key is None:
            return Answer(falcon.HTTP_404, {"error": "no channel: use Host <name>-kn-channel.<namespace>.svc "
                                            "or path /<namespace>/<name>"})
        routes = self.routes
        found = (routes.sink if sink else routes.path if by_path else routes.host).get(key)
        if found is None:
            what = "KafkaSink" if sink else "channel or broker" if by_path and self.brokers is not None else "channel"
            return Answer(falcon.HTTP_404, {"error": f"{what} {key[0]}/{key[1]} not found"})
        return found

    def decode(self, channel: Channel, req: falcon.asgi.Request, body: bytes) -> list[KafkaRecord] | Answer:
        """Body + headers → the Kafka records of one event or of a whole batch (all valid, or a 400)."""
        self.tally.inc(_bytes_in(channel.namespace, channel.name), len(body))
        try:
            if not is_batch(req.content_type):
                # One event: straight from HTTP to Kafka (trace context included), through the SDK whenever the
                # fast path is not certain; from the header bytes the server read, no str dict per request.
                return [raw_http_to_kafka(req.scope["headers"], body, channel.content_mode,
                                          headers=lambda: text_headers(req.headers),
                                          subject_key=channel.subject_key)]
            events = events_from_http_batch(body)
        except BindingError as exc:
            return Answer(falcon.HTTP_400, exc.as_dict())
        except (ValueError, TypeError) as exc:
            return _cannot_write(exc)
        trace = {name: value for name in TRACE_HEADERS if (value := req.get_header(name))}
        try:
            return [event_to_kafka(e, channel.content_mode, trace=trace, subject_key=channel.subject_key)
                    for e in events]
        except (BindingError, ValueError, TypeError) as exc:
            return _cannot_write(exc)

    def finish(self, result: Result, channel: Channel, count: int, started: float) -> Answer:
        self.tally.observe(PRODUCE_LATENCY, time.perf_counter() - started)
        if result is DELIVERED or result.ok:  # the shared result first: no property call for the common answer
            return _ACCEPTED
        if result.outcome is Outcome.TOO_LARGE:
            return Answer(falcon.HTTP_413, {"error": result.detail})
        # Never log event data; the channel and the librdkafka reason are enough to act on.
        log.warning("events not accepted", extra={
            "channel": f"{channel.namespace}/{channel.name}", "events": count,
            "outcome": result.outcome.value, "reason": result.detail})
        return self.unavailable(f"Kafka did not accept the event ({result.outcome.value}): {result.detail}")

    def respond(self, resp: falcon.asgi.Response, answer: Answer, key: ChannelKey | None) -> None:
        resp.status = answer.status
        if answer.body is not None:
            resp.data = _media_json(answer.body)
            resp.content_type = falcon.MEDIA_JSON
        if answer.retry_after is not None:
            resp.set_header("Retry-After", str(answer.retry_after))
        # Counted promptly: within the LoopTally's few milliseconds.
        self.tally.count(_events(key, answer.status))

    @staticmethod
    def options(req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        # CloudEvents HTTP webhook abuse protection: allow the origin that asks, at any rate.
        origin = req.get_header("WebHook-Request-Origin")
        resp.status = falcon.HTTP_200
        resp.set_header("Allow", "POST, OPTIONS")
        if origin:
            resp.set_header("WebHook-Allowed-Origin", origin)
        if req.get_header("WebHook-Request-Rate"):
            resp.set_header("WebHook-Allowed-Rate", "*")


class JsonErrors:
    """Falcon's own errors (405, 404 for other paths, bad headers) as JSON like ours; any other exception is logged
    and answered as falcon would, with a 500, in the same JSON."""

    async def __call__(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: Exception,
                       params: dict[str, Any], **_kwargs: Any) -> None:
        if not isinstance(ex, falcon.HTTPError):
            log.error("request failed", exc_info=ex)
            ex = falcon.HTTPInternalServerError()
        resp.status = ex.status
        resp.data = _media_json({"error": ex.title + (f": {ex.description}" if ex.description else "")})
        resp.content_type = falcon.MEDIA_JSON
        if ex.headers:
            resp.set_headers(ex.headers)
