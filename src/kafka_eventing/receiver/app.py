"""The ingress of KafkaChannels, Kafka Brokers and KafkaSinks as a falcon ASGI app: HTTP CloudEvents in, Kafka
records out — on the Kafka cluster each target names (``receiver.connections``) — 202 only once Kafka has them.

gunicorn runs it on uvicorn workers (the worker model was chosen by measurement, docs/receiver.md): a request
waiting for its delivery report is a suspended coroutine, and the producer is polled from the event loop itself
(``LoopPoller``), so a report resolves its future with no thread hand-off. What a request means — routing,
parsing, limits, answers — is ``receiver.ingress``.

``create_app`` builds the app from injected parts (tests use fakes); ``get_app()`` reads the environment and is
what gunicorn runs: ``gunicorn -c python:kafka_eventing.receiver.gunicorn_conf
-k kafka_eventing.receiver.server.ReceiverWorker 'kafka_eventing.receiver.app:get_app()'``
(``python -m kafka_eventing.receiver`` does exactly that).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import falcon
import falcon.asgi

from kafka_eventing.core.channel_source import ChannelSource, PolicySource
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.auth import AuthMiddleware, PolicyCheck, TokenVerifier
from kafka_eventing.receiver.connections import Connections
from kafka_eventing.receiver.ingress import (
    DEFAULT_MESSAGE_MAX_BYTES,
    TALLY,
    Ingress,
    JsonErrors,
)
from kafka_eventing.receiver.metrics import exposition
from kafka_eventing.receiver.resource import ChannelResource, Request
from kafka_eventing.receiver.sender import KafkaSender, Linger, Producer

if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.trace import Tracer

    from kafka_eventing.core.kafka_config import ConnectionRef, KafkaConnection
    from kafka_eventing.core.tracing import Tracing

AsgiApp = falcon.asgi.App[Request, falcon.asgi.Response]


class HealthResource:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok"}


class ReadyResource:
    """Can this pod answer? Kafka is deliberately not asked: a broker blip would take every receiver pod out of
    the Service at once, and clients would get connection errors instead of a 503 + Retry-After per request."""

    def __init__(self, channels: ChannelSource, sender: KafkaSender, brokers: ChannelSource | None = None,
                 sinks: ChannelSource | None = None, policies: PolicySource | None = None) -> None:
        self.channels, self.sender, self.brokers, self.sinks = channels, sender, brokers, sinks
        self.policies = policies

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        checks = {"channels": self.channels.synced(), "accepting": not self.sender.closing}
        if self.brokers is not None:
            checks["brokers"] = self.brokers.synced()
        if self.sinks is not None:
            checks["sinks"] = self.sinks.synced()
        if self.policies is not None:  # before they are read, the default mode would decide for every target
            checks["eventpolicies"] = self.policies.synced()
        resp.status = falcon.HTTP_200 if all(checks.values()) else falcon.HTTP_503
        resp.media = checks


class MetricsResource:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data, resp.content_type = exposition()


class _Shutdown:
    """ASGI lifespan shutdown (after uvicorn drained its connections): flush and stop."""

    def __init__(self, resource: ChannelResource) -> None:
        self.resource = resource

    async def process_shutdown(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        self.resource.close_tally()  # on the loop's thread: the last answers' counts
        connections = self.resource.connections
        await asyncio.to_thread(connections.close, connections.close_timeout)
        await asyncio.to_thread(shutdown)


def create_app(
    producer: Producer,
    channels: ChannelSource,
    settings: Settings,
    *,
    sender: KafkaSender | None = None,
    message_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
    verifier: TokenVerifier | None = None,
    policies: PolicyCheck | None = None,
    tracer: Tracer | None = None,
    brokers: ChannelSource | None = None,
    connect: Callable[[ConnectionRef], KafkaSender] | None = None,
    sinks: ChannelSource | None = None,
) -> AsgiApp:
    """The receiver app. ``producer`` and ``channels`` must already be started by the caller (or by get_app).

    ``brokers``: Kafka-class Brokers, served on ``/<namespace>/<name>`` (None: channels only).
    ``sinks``: KafkaSinks, served on ``/<namespace>/<name>`` of the sink ingress Service (Host
    ``KE_SINK_SERVICE``; None: no sinks).
    ``connect``: makes the sender of a Kafka connection a target names (``receiver.connections``; None: only the
    receiver's own cluster is written to, and a target naming another gets a 503).

    No poll thread: the event loop polls the producer (``ChannelResource.poller``). With a ``tracer``, the
    traced resource and ingress (``receiver.tracing``) serve the channels; without, the plain ones.
    """
    sender = sender or KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    max_body = min(settings.max_event_bytes, message_max_bytes)
    resource: ChannelResource
    if tracer is None:
        resource = ChannelResource(Ingress(sender, channels, settings, max_body, brokers=brokers, sinks=sinks))
    else:
        from kafka_eventing.receiver.tracing import TracedChannelResource, TracedIngress

        resource = TracedChannelResource(
            TracedIngress(sender, channels, settings, max_body, brokers=brokers, sinks=sinks), tracer)
    resource.connections = Connections(
        sender, connect, limit=settings.max_kafka_connections, retry=settings.retry_after_seconds,
        close_timeout=settings.produce_timeout_seconds + 2.0)
    targets = [source for source in (brokers, sinks) if source is not None]
    for source in targets:  # a connection no target names any more is closed
        source.subscribe(lambda _snapshot: resource.connections.retain(
            c.connection for t in targets for c in t.snapshot().values() if c.connection is not None))
    middleware: list[object] = [_Shutdown(resource)]
    if verifier is not None:  # only then: without authentication a request meets no middleware at all
        middleware.append(AuthMiddleware(verifier, resource.ingress, resource, policies))
        resource.event_checks = True
    app: AsgiApp = falcon.asgi.App(middleware=middleware, request_type=Request)  # type: ignore[arg-type]
    app.req_options.strip_url_path_trailing_slash = True
    app.add_error_handler(falcon.HTTPError, JsonErrors())  # falcon's own errors
    app.add_error_handler(Exception, JsonErrors())  # any other: the same JSON shape
    app.add_route("/", resource)
    app.add_route("/{namespace}/{name}", resource)
    app.add_route("/healthz", HealthResource())
    app.add_route("/readyz", ReadyResource(channels, sender, brokers, sinks,
                                           policies.source if policies is not None else None))
    app.add_route("/metrics", MetricsResource())
    return app


# -- what gunicorn runs ---------------------------------------------------------------------------------


@dataclass
class Runtime:
    """The parts built in this worker process, so the shutdown can stop them in order."""

    settings: Settings
    producer: Producer
    channels: ChannelSource
    sender: KafkaSender
    message_max_bytes: int
    tracing: Tracing | None = None
    brokers: ChannelSource | None = None
    api_client: Any = None
    sinks: ChannelSource | None = None
    policies: PolicySource | None = None

    def close(self) -> None:
        self.sender.close(timeout=self.settings.produce_timeout_seconds + 2.0)
        self.channels.stop()
        if self.tracing is not None:
            self.tracing.shutdown()
        if self.brokers is not None:
            self.brokers.stop()
        if self.sinks is not None:
            self.sinks.stop()
        if self.policies is not None:
            self.policies.stop()


_runtime: Runtime | None = None


def producer_config(settings: Settings, linger_ms: float | None = None,
                    connection: KafkaConnection | None = None) -> dict[str, Any]:
    """The receiver's producer: ``linger_ms`` (default ``KE_LINGER_MS``) is 0 for the one that sends at once;
    ``connection`` (default: the receiver's own, from the settings) is the Kafka cluster it writes to."""
    from kafka_eventing.core.kafka_config import connection_from_settings

    connection = connection or connection_from_settings(settings)
    return connection.producer_config(**{
        "compression.type": settings.compression_type,
        "linger.ms": settings.linger_ms if linger_ms is None else linger_ms,
        # librdkafka gives up on a record when the HTTP answer does: a 503 then means "not written".
        "message.timeout.ms": max(1, int(settings.produce_timeout_seconds * 1000)),
        "logger": logging.getLogger("librdkafka"),
    })


def build_runtime() -> Runtime:
    """Settings from the environment; producer, channel source and sender created (and started) here.

    Called from get_app(), i.e. in each gunicorn worker after fork (the config never preloads the app), so
    librdkafka's threads belong to the process that uses them.
    """
    global _runtime  # noqa: PLW0603 - one runtime per worker process, for the shutdown hooks
    from confluent_kafka import Producer as KafkaProducer

    from kafka_eventing.core import logging as ke_logging
    from kafka_eventing.core import tracing
    from kafka_eventing.core.channel_source import (
        broker_source,
        channel_source_from_settings,
        policy_source,
        sink_source,
    )
    from kafka_eventing.core.kube import api_client as kube_api_client

    settings = Settings.from_env()
    ke_logging.configure(settings.log_level, settings.log_format)
    config = producer_config(settings)
    api = kube_api_client(settings.kubeconfig) if settings.channel_source == "kube" else None
    channels = channel_source_from_settings(settings, api)
    channels.start()
    brokers, sinks = broker_source(settings, api), sink_source(settings, api)
    policies = policy_source(settings, api)
    for source in (brokers, sinks, policies):
        if source is not None:
            source.start()
    sender = new_sender(settings, KafkaProducer(config))
    _runtime = Runtime(settings, sender.producer, channels, sender,
                       int(config.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES)),
                       tracing.setup(settings, "kafka-eventing-receiver"), brokers, api, sinks, policies)
    return _runtime


def new_sender(settings: Settings, producer: Producer, connection: KafkaConnection | None = None) -> KafkaSender:
    """A sender on one Kafka connection: ``producer`` batches; with ``KE_BATCH_ABOVE_RATE`` a second producer
    on the same connection sends at once while the worker is lightly loaded."""
    from confluent_kafka import Producer as KafkaProducer

    immediate, linger = None, None
    if settings.batch_above_rate > 0:
        immediate = KafkaProducer(producer_config(settings, linger_ms=0, connection=connection))
        linger = Linger(settings.batch_above_rate)
    return KafkaSender(producer, timeout=settings.produce_timeout_seconds, immediate=immediate, linger=linger)


def connection_sender(settings: Settings, api_client: Any) -> Callable[[ConnectionRef], KafkaSender]:
    """What makes the sender of a connection a target names: its Secret read from the API server by name (no
    cache, no watch: the target's status carries the Secret's checksum, so a rotation is a new connection)."""

    def make(ref: ConnectionRef) -> KafkaSender:
        from confluent_kafka import Producer as KafkaProducer

        from kafka_eventing.core.kafka_config import connection_from_secret

        data = read_secret(api_client, ref.secret_namespace, ref.secret_name) if ref.secret_name else {}
        connection = connection_from_secret(data, provider=settings.kafka_provider,
                                            bootstrap_servers=ref.bootstrap_servers,
                                            extra=settings.kafka_extra_config())
        return new_sender(settings, KafkaProducer(producer_config(settings, connection=connection)), connection)

    return make


def read_secret(api_client: Any, namespace: str, name: str) -> dict[str, bytes]:
    """A connection Secret's data; the error says what to fix, never what the Secret holds."""
    import base64

    if api_client is None:
        raise RuntimeError(f"Secret {namespace}/{name} cannot be read: the receiver runs from a file, not the API")
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        found = client.CoreV1Api(api_client).read_namespaced_secret(name, namespace, _request_timeout=(5, 15))
    except ApiException as exc:
        if exc.status == 404:
            raise RuntimeError(f"Secret {namespace}/{name} does not exist") from None
        if exc.status == 403:
            raise RuntimeError(f"the receiver may not read Secret {namespace}/{name} (RBAC: get secrets in "
                               f"{namespace})") from None
        raise RuntimeError(f"Secret {namespace}/{name} could not be read (HTTP {exc.status})") from None
    return {k: base64.b64decode(v) for k, v in (found.data or {}).items()}


def get_app() -> AsgiApp:
    """Build the receiver from the environment: what gunicorn runs."""
    parts = build_runtime()
    return create_app(parts.producer, parts.channels, parts.settings, sender=parts.sender,
                      message_max_bytes=parts.message_max_bytes, verifier=TokenVerifier.from_settings(parts.settings),
                      policies=PolicyCheck.from_settings(parts.settings, parts.policies),
                      tracer=parts.tracing.tracer if parts.tracing is not None else None, brokers=parts.brokers,
                      connect=connection_sender(parts.settings, parts.api_client), sinks=parts.sinks)


def shutdown() -> None:
    """ASGI lifespan shutdown / gunicorn ``worker_exit``: flush what is produced, stop watching channels."""
    global _runtime
    runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.close()
    TALLY.flush()  # the last answers' metrics, before the worker's files are all that is left
