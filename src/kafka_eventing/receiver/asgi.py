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
from typing import Any

import falcon
import falcon.asgi

from kafka_eventing.core.channel_source import ChannelSource
from kafka_eventing.core.channels import ChannelKey
from kafka_eventing.core.metrics import LoopTally, exposition
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver import app as wsgi
from kafka_eventing.receiver.app import READ_CHUNK, Ingress, _Answer, _BodyTooLarge, _JsonErrors, readiness
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
            self.close_tally()
            poller = self._poller = LoopPoller(self.ingress.sender.producer, loop)
            poller.start()
            # The request metrics are updated on this loop's thread only: buffered without a lock.
            self.ingress.tally = LoopTally(loop)
        return poller

    def close_tally(self) -> None:
        tally = self.ingress.tally
        if isinstance(tally, LoopTally):
            tally.close()

    async def on_options(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                         namespace: str | None = None, name: str | None = None) -> None:
        self.ingress.options(req, resp)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      namespace: str | None = None, name: str | None = None) -> None:
        poller = self.poller()  # first: it also sets the loop's tally that the answer is counted in
        key = self.ingress.key(req, namespace, name)
        self.ingress.respond(resp, await self._handle(req, key, poller), key)

    async def _handle(self, req: falcon.asgi.Request, key: ChannelKey | None, poller: LoopPoller) -> _Answer:
        # One coroutine for the whole request: the body read and the wait are inlined, because each awaited
        # helper coroutine cost ~0.2 µs per request (session 6 profile, docs/receiver.md).
        ingress = self.ingress
        channel = ingress.lookup(key)
        if isinstance(channel, _Answer):
            return channel
        length = req.content_length
        if length is None:
            try:
                body = await self._read_chunked(req)
            except _BodyTooLarge:
                return ingress.too_large()
        elif length > ingress.max_body:
            return ingress.too_large()
        else:
            # The stream is bounded by Content-Length (the server enforces it): one read, no chunk loop.
            body = await req.stream.read()
        records = ingress.decode(channel, req, body)
        if isinstance(records, _Answer):
            return records
        started = time.perf_counter()
        # Not counted in sender.tracked(), unlike WSGI: uvicorn runs the lifespan shutdown (sender.close) only
        # once every request task has finished (no graceful-shutdown timeout is set), so nothing is in flight.
        sender = ingress.sender
        pending = sender.submit_async(channel.topic, records, poller)
        if isinstance(pending, AsyncPending):
            # Suspend until every delivery report is in, or the timeout: one future, no timer, no extra task.
            poller.expire_at(pending, poller.loop.time() + sender.timeout)
            await pending.future
            result = pending.result()
        else:
            result = pending
        return ingress.finish(result, channel, len(records), started)

    async def _read_chunked(self, req: falcon.asgi.Request) -> bytes:
        """A body without Content-Length, never buffering more than the limit + 1 byte."""
        limit = self.ingress.max_body
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


class AsyncHealth:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok"}


class AsyncReady:
    def __init__(self, channels: ChannelSource, sender: KafkaSender) -> None:
        self.channels, self.sender = channels, sender

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.status, resp.media = readiness(self.channels, self.sender)


class AsyncMetrics:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data, resp.content_type = exposition()


class _AsyncJsonErrors(_JsonErrors):
    """The WSGI app's JSON errors for falcon's own (other paths, 405, bad headers): ASGI wants a coroutine."""

    async def __call__(self, req: Any, resp: Any, ex: falcon.HTTPError,  # type: ignore[override]
                       params: dict[str, Any], **_kwargs: Any) -> None:
        super().__call__(req, resp, ex, params)


class _Shutdown:
    """ASGI lifespan shutdown (after uvicorn drained its connections): flush and stop."""

    def __init__(self, resource: AsyncChannelResource) -> None:
        self.resource = resource

    async def process_shutdown(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        self.resource.close_tally()  # on the loop's thread: the last answers' counts
        await asyncio.to_thread(wsgi.shutdown)


def create_app(
    producer: Producer,
    channels: ChannelSource,
    settings: Settings,
    *,
    sender: KafkaSender | None = None,
    message_max_bytes: int = wsgi.DEFAULT_MESSAGE_MAX_BYTES,
) -> AsgiApp:
    # No poll thread: the event loop polls (AsyncChannelResource.poller).
    sender = sender or KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    resource = AsyncChannelResource(Ingress(sender, channels, settings,
                                            min(settings.max_event_bytes, message_max_bytes)))
    app: AsgiApp = falcon.asgi.App(middleware=[_Shutdown(resource)])  # type: ignore[arg-type]
    app.req_options.strip_url_path_trailing_slash = True
    app.add_error_handler(falcon.HTTPError, _AsyncJsonErrors())
    app.add_route("/", resource)
    app.add_route("/{namespace}/{name}", resource)
    app.add_route("/healthz", AsyncHealth())
    app.add_route("/readyz", AsyncReady(channels, sender))
    app.add_route("/metrics", AsyncMetrics())
    return app


def get_app() -> AsgiApp:
    """Like the WSGI get_app(): settings from the environment, producer created in this worker."""
    parts = wsgi.build_runtime()
    return create_app(parts.producer, parts.channels, parts.settings, sender=parts.sender,
                      message_max_bytes=parts.message_max_bytes)
