"""The one falcon resource every CloudEvent request meets (``ChannelResource``: POST to a channel, a Broker or a
KafkaSink, OPTIONS, the answer once Kafka holds the records) and the request class it is served with; the app
around them is ``receiver.app``, what a request means is ``receiver.ingress``."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import falcon
import falcon.asgi

from kafka_eventing.core.channels import ChannelKey
from kafka_eventing.receiver.connections import Connections, ConnectionUnavailable
from kafka_eventing.receiver.ingress import (
    Answer,
    BodyTooLarge,
    Ingress,
)
from kafka_eventing.receiver.metrics import LoopTally
from kafka_eventing.receiver.sender import AsyncPending, LoopPoller

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


#: falcon's own, called directly by the subclass: a call less per request than through super().
_REQUEST_INIT = falcon.asgi.Request.__init__


class Request(falcon.asgi.Request):
    """falcon's request, keeping what its body comes in: the ASGI events, which the receiver reads itself rather than
    through falcon's stream. A small body is whole in the first event, which falcon has already received, so it
    needs no stream at all; and falcon's stream ends at a disconnect as at the body's end, where a body cut short
    must never become a Kafka record."""

    __slots__ = ("first_event", "receive")

    def __init__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                 first_event: dict[str, Any] | None = None, options: falcon.request.RequestOptions | None = None,
                 ) -> None:
        _REQUEST_INIT(self, scope, receive, first_event, options)  # type: ignore[arg-type]
        self.first_event, self.receive = first_event, receive


class ChannelResource:
    """POST an event (or batch) to a channel; OPTIONS for the CloudEvents webhook handshake."""

    #: whether an EventPolicy's filters may be waiting in ``req.context`` (set by create_app when authentication
    #: is on): without it a request does not look for them.
    event_checks = False

    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress
        self._poller: LoopPoller | None = None
        #: the senders by Kafka connection (``receiver.connections``); ``create_app`` gives it its factory.
        self.connections = Connections(ingress.sender)

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
            senders = self.connections.senders.values()
            poller = self._poller = LoopPoller([s.producer for s in senders], loop,
                                               threaded=[s.immediate for s in senders if s.immediate is not None])
            poller.start()
            self.connections.poller = poller
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

    async def on_post(self, req: Request, resp: falcon.asgi.Response,
                      namespace: str | None = None, name: str | None = None) -> None:
        poller = self.poller()  # first: it also sets the loop's tally that the answer is counted in
        key = self.ingress.key(req, namespace, name)
        self.ingress.respond(resp, await self._handle(req, key, poller, namespace is not None), key)

    async def _handle(self, req: Request, key: ChannelKey | None, poller: LoopPoller,
                      by_path: bool) -> Answer:
        # One coroutine for the whole request: the body read and the wait are inlined, because each awaited
        # helper coroutine cost ~0.2 µs per request (profile of a uvicorn worker under bench/receiver.py's
        # saturation load, docs/receiver.md).
        ingress = self.ingress
        # A KafkaSink's address differs from a Broker's by its Host alone: read only while sinks are served.
        channel = ingress.lookup(key, by_path, by_path and ingress.sinks is not None and ingress.to_sink(req))
        if isinstance(channel, Answer):
            return channel
        length = req.content_length
        if length is not None and length > ingress.max_body:
            return ingress.too_large()
        first = req.first_event
        if first is not None and not first.get("more_body", False):
            body = first.get("body", b"")  # the whole body came in the first event, as every small one does
            if len(body) > ingress.max_body:  # a chunked body: it had no Content-Length to be refused by
                return ingress.too_large()
        else:
            try:
                body = await self._read_body(req)
            except BodyTooLarge:
                return ingress.too_large()
            if body is None:  # the client left before its body's end: a part of an event
                return ingress.client_gone()
        records = ingress.decode(channel, req, body)
        if isinstance(records, Answer):
            return records
        if self.event_checks:
            check = getattr(req.context, "event_check", None)  # an EventPolicy's filters (receiver.auth)
            if check is not None and not check(records):
                return Answer(falcon.HTTP_403, {"error": "the event does not pass the filters of the "
                                                         "EventPolicies that allow its sender"})
        # The target's Kafka cluster: the receiver's own for nearly every request, with no lookup at all. Taken
        # here, with no await before the produce, so a connection closed meanwhile is never written to.
        connection = channel.connection
        sender = ingress.sender if connection is None else self.connections.senders.get(connection)
        if sender is None:
            try:
                sender = await self.connections.connect(connection, poller)  # type: ignore[arg-type]
            except ConnectionUnavailable as exc:
                return ingress.unavailable(str(exc))
        started = time.perf_counter()
        # uvicorn runs the lifespan shutdown (sender.close) only once every request task has finished (no
        # graceful-shutdown timeout is set), so nothing is in flight when the producer is flushed.
        pending = sender.submit_async(channel.topic, records, poller)
        if isinstance(pending, AsyncPending):
            # Suspend until every delivery report is in, or the timeout: one future, no timer, no extra task.
            poller.expire_at(pending, poller.loop.time() + sender.timeout)
            await pending.future
            result = pending.result()
        else:
            result = pending
        return ingress.finish(result, channel, len(records), started)

    async def _read_body(self, req: Request) -> bytes | None:
        """The body from the request's ASGI events, read no further than the first event past the limit (a chunked
        body has no length to be refused by beforehand); None when the client disconnected before the body's end."""
        limit = self.ingress.max_body
        event = req.first_event or await req.receive()
        parts: list[bytes] = []
        size = 0
        while True:
            if event["type"] == "http.disconnect":
                return None
            chunk = event.get("body", b"")
            if chunk:
                parts.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge
            if not event.get("more_body", False):
                return b"".join(parts)
            event = await req.receive()
