"""The same receiver as an ASGI app (falcon.asgi), for uvicorn workers under gunicorn.

Kept beside the WSGI app because the worker model was chosen by measurement (docs/receiver.md): here a request
waiting for its delivery report is a suspended coroutine, and the producer is polled from the event loop itself
(``LoopPoller``), so a report resolves its future with no thread hand-off. Routing, parsing, limits and answers
are the WSGI app's own (``Ingress``).

Run: ``gunicorn -c python:kafka_eventing.receiver.gunicorn_conf -k uvicorn.workers.UvicornWorker
'kafka_eventing.receiver.asgi:get_app()'``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import falcon
import falcon.asgi

from kafka_eventing.core.channel_source import ChannelSource
from kafka_eventing.core.channels import ChannelKey
from kafka_eventing.core.metrics import exposition
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver import app as wsgi
from kafka_eventing.receiver.app import READ_CHUNK, Ingress, KafkaProbe, _Answer, _BodyTooLarge
from kafka_eventing.receiver.sender import AsyncPending, KafkaSender, LoopPoller, Producer

AsgiApp = falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response]


class AsyncChannelResource:
    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress
        self._poller: LoopPoller | None = None

    def poller(self) -> LoopPoller:
        # Made on the first request, on the loop that serves requests (a test client may bring a new loop).
        # The running poller's loop is recognised without asyncio.get_running_loop(): on Python 3.11 that costs
        # a getpid() system call per request (a fork check), ~4 % of a worker's CPU in the profile.
        poller = self._poller
        if poller is not None and poller.thread_id == threading.get_ident() and poller.loop.is_running():
            return poller
        loop = asyncio.get_running_loop()
        if poller is None or poller.loop is not loop:
            if poller is not None:
                poller.stop()
            poller = self._poller = LoopPoller(self.ingress.sender.producer, loop)
            poller.start()
        return poller

    async def on_options(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                         namespace: str | None = None, name: str | None = None) -> None:
        self.ingress.options(req, resp)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      namespace: str | None = None, name: str | None = None) -> None:
        key = self.ingress.key(req, namespace, name)
        self.ingress.respond(resp, await self._handle(req, key), key)

    async def _handle(self, req: falcon.asgi.Request, key: ChannelKey | None) -> _Answer:
        ingress = self.ingress
        channel = ingress.lookup(key)
        if isinstance(channel, _Answer):
            return channel
        try:
            body = await self._read_body(req)
        except _BodyTooLarge:
            return ingress.too_large()
        records = ingress.decode(channel, req, body)
        if isinstance(records, _Answer):
            return records
        started = time.perf_counter()
        with ingress.sender.tracked():
            pending = ingress.sender.submit_async(channel.topic, records, self.poller())
            if isinstance(pending, AsyncPending):
                await _wait(pending, ingress.sender.timeout)
                result = pending.result()
            else:
                result = pending
        return ingress.finish(result, channel, len(records), started)

    async def _read_body(self, req: falcon.asgi.Request) -> bytes:
        limit = self.ingress.max_body
        length = req.content_length
        if length is not None:
            if length > limit:
                raise _BodyTooLarge
            # The stream is bounded by Content-Length (the server enforces it): one read, no chunk loop.
            return await req.stream.read()
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = await req.stream.read(min(READ_CHUNK, limit + 1 - size))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge


async def _wait(pending: AsyncPending, timeout: float) -> None:
    """Suspend until every delivery report is in, or ``timeout``: one future, no timer, no extra task."""
    poller = pending.poller
    poller.expire_at(pending, poller.loop.time() + timeout)
    await pending.future


class AsyncHealth:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok"}


class AsyncReady:
    def __init__(self, channels: ChannelSource, kafka_ready: Callable[[], bool], sender: KafkaSender) -> None:
        self.channels, self.kafka_ready, self.sender = channels, kafka_ready, sender

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        kafka = await asyncio.to_thread(self.kafka_ready)  # a metadata request may block for its timeout
        checks = {"channels": self.channels.synced(), "kafka": kafka, "accepting": not self.sender.closing}
        resp.status = falcon.HTTP_200 if all(checks.values()) else falcon.HTTP_503
        resp.media = checks


class AsyncMetrics:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data, resp.content_type = exposition()


class _Shutdown:
    """ASGI lifespan shutdown (after uvicorn drained its connections): flush and stop."""

    async def process_shutdown(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        await asyncio.to_thread(wsgi.shutdown)


def create_app(
    producer: Producer,
    channels: ChannelSource,
    settings: Settings,
    *,
    sender: KafkaSender | None = None,
    kafka_ready: Callable[[], bool] | None = None,
    message_max_bytes: int = wsgi.DEFAULT_MESSAGE_MAX_BYTES,
) -> AsgiApp:
    # No poll thread: the event loop polls (AsyncChannelResource.poller).
    sender = sender or KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    wsgi.TALLY.start()
    app: AsgiApp = falcon.asgi.App(middleware=[_Shutdown()])  # type: ignore[arg-type]
    app.req_options.strip_url_path_trailing_slash = True
    resource = AsyncChannelResource(Ingress(sender, channels, settings,
                                            min(settings.max_event_bytes, message_max_bytes)))
    app.add_route("/", resource)
    app.add_route("/{namespace}/{name}", resource)
    app.add_route("/healthz", AsyncHealth())
    app.add_route("/readyz", AsyncReady(channels, kafka_ready or KafkaProbe(producer), sender))
    app.add_route("/metrics", AsyncMetrics())
    return app


def get_app() -> AsgiApp:
    """Like the WSGI get_app(): settings from the environment, producer created in this worker."""
    parts = wsgi.build_runtime()
    return create_app(parts.producer, parts.channels, parts.settings, sender=parts.sender,
                      message_max_bytes=parts.message_max_bytes)
