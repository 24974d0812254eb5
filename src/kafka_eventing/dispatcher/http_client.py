"""The dispatcher's HTTP/1.1 client for plain ``http://`` destinations: one POST per event on pooled keep-alive
connections, an ``asyncio.Protocol`` with httptools' (llhttp) response parser.

Why not aiohttp for these: the profile of a 50,000-event drain (docs/dispatcher.md, issue #21) spent about 40 %
of the dispatcher's CPU inside ``ClientSession.post`` — request/response objects, payload registry, timer
contexts, the connector's bookkeeping, several coroutines and a task per request — for a request whose whole
shape is known in advance. This client builds the request head as one string, writes head and body in one
``write``, and parses the answer in C; per request it creates one future and one timer.

What it keeps from the aiohttp path (``core.http_delivery.HttpSender``), so that ``Attempt`` means the same:

* the total per-attempt timeout (connect, send and answer together); a timed-out or cancelled request closes
  its connection;
* the body limits (``MAX_REPLY_BYTES`` for a 2xx, the first ``ERROR_BODY_BYTES`` of an error) and
  ``oversized``; a connection whose answer was cut short is closed, not reused;
* the case-insensitive, read-only response headers (``multidict``, as aiohttp's);
* the request headers the aiohttp path sends: ``Host``, ``Content-Length``, and no ``Content-Type`` when the
  event has none (a binary-mode event without ``datacontenttype`` must not gain one in transit); a header with a
  control character is refused (``ValueError``, as aiohttp's header-injection check) and the attempt fails
  without a request;
* no connection limit (each subscription's in-flight budget is its limit); idle connections are closed after
  ``KEEPALIVE_SECONDS`` (aiohttp's 15 s).

One thing it does that aiohttp does not: a request on a reused connection that the server closes before any byte
of an answer (it had closed the idle connection, and its FIN was not read yet) is sent once more on a new
connection, within the same timeout, instead of failing the attempt. At worst the subscriber sees the event
twice (at-least-once allows it); the attempt counts once.

Anything else — ``https://``, credentials in the URL, another scheme — goes through the aiohttp session.
``Accept-Encoding`` is not sent, so answers come uncompressed; a compressed one (gzip/deflate) is inflated.
"""

from __future__ import annotations

import asyncio
import re
import socket
import zlib
from collections import deque
from collections.abc import Mapping

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from kafka_eventing.core.http_delivery import (
    DEFAULT_ATTEMPT_TIMEOUT,
    ERROR_BODY_BYTES,
    MAX_REPLY_BYTES,
    Attempt,
    HttpSender,
)
from kafka_eventing.core.tls import TlsVersion

#: An idle connection older than this is closed instead of reused (aiohttp's keepalive_timeout).
KEEPALIVE_SECONDS = 15.0
#: Parsed destinations kept (subscriber, reply and dead-letter URIs: a handful per subscription).
MAX_TARGETS = 1024
#: aiohttp's header-injection check: a header name or value with one of these is never sent.
FORBIDDEN_IN_HEADERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_FORBIDDEN = FORBIDDEN_IN_HEADERS
_USER_AGENT = "kafka-eventing-dispatcher"


class ServerDisconnectedError(ConnectionError):
    """The server closed the connection before the answer was complete."""


class _Target:
    """One destination URL: where to connect, the request's first lines, and its idle connections."""

    __slots__ = ("host", "idle", "port", "prefix")

    def __init__(self, host: str, port: int, prefix: str) -> None:
        self.host = host
        self.port = port
        self.prefix = prefix
        self.idle: deque[_Connection] = deque()


def _target(url: str) -> _Target | None:
    try:
        u = URL(url)
    except (ValueError, TypeError):
        return None
    if u.scheme != "http" or not u.raw_host or u.raw_user is not None or u.port is None:
        return None
    host = u.raw_host
    authority = f"[{host}]" if ":" in host else host
    if u.explicit_port is not None and u.explicit_port != 80:
        authority += f":{u.explicit_port}"
    path = u.raw_path_qs or "/"
    prefix = f"POST {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: {_USER_AGENT}\r\n"
    if _FORBIDDEN.search(prefix.replace("\r\n", "\t")):
        return None
    return _Target(u.host or host, u.port, prefix)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request at a time (no pipelining)."""

    def __init__(self, target: _Target, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Attempt] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.idle_since = 0.0
        #: Any byte of an answer received since the last request was sent.
        self.answered = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = MAX_REPLY_BYTES
        self.length: int | None = None
        self.framed = False  # the body's end is known from Content-Length or chunking (not the connection's)
        self.encoding = b""
        self.headers_done = False

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self.answered = True
        if self.waiter is None:
            self.close()  # nothing was asked: a server that talks out of turn is not reused
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ValueError(f"bad HTTP response: {exc}"))

    def eof_received(self) -> bool | None:
        self.closed = True  # the server is done with it: no new request goes on it (an answer under way ends below)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is None:
            return
        if self.headers_done and not self.framed and self.status >= 200:
            self._finish(False)  # the body ran until the server closed the connection
        else:
            self._fail(ServerDisconnectedError("Server disconnected"))

    # -- httptools callbacks ------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self.status = status
        if status < 200:
            return  # an informational answer (103): the real one follows
        self.headers_done = True
        # Only a 2xx may carry a reply worth reading in full; error bodies are kept for knativeerrordata.
        self.limit = MAX_REPLY_BYTES if status < 300 else ERROR_BODY_BYTES
        for name, value in self.raw_headers:
            lower = name.lower()
            if lower == b"content-length":
                self.framed = True
                try:
                    self.length = int(value)
                except ValueError:
                    self.length = None
            elif lower == b"transfer-encoding":
                self.framed = self.framed or b"chunked" in value.lower()
            elif lower == b"content-encoding":
                self.encoding = value.strip().lower()
        if status in (204, 304):
            self.framed = True
        if self.length is not None and self.length > self.limit and self.limit > ERROR_BODY_BYTES:
            self._finish(True)  # a reply too large to forward: nothing of it is read

    def on_body(self, body: bytes) -> None:
        if self.waiter is None:
            return
        self.size += len(body)
        if self.size <= self.limit:
            self.chunks.append(body)
            if self.size == self.limit and self.length is not None and self.length > self.limit:
                self._finish(True)  # the first ERROR_BODY_BYTES of a longer error body
        else:
            self.chunks.append(body[: max(0, self.limit - (self.size - len(body)))])
            self._finish(True)

    def on_message_complete(self) -> None:
        if self.status < 200:
            self._reset()
            return
        if self.waiter is not None:
            self._finish(False, keep=self.parser.should_keep_alive())

    # -- requests -----------------------------------------------------------------------------------
    def send(self, data: bytes, timeout: float) -> asyncio.Future[Attempt]:
        self.answered = False
        transport = self.transport
        if transport is None or transport.is_closing():
            self.closed = True
            raise ServerDisconnectedError("Server disconnected")
        try:
            transport.write(data)
        except RuntimeError as exc:  # uvloop: the handle was closed under the transport
            self.close()
            raise ServerDisconnectedError(str(exc)) from exc
        waiter = self.waiter = self.loop.create_future()
        self.timer = self.loop.call_later(timeout, self._timed_out)
        return waiter

    def _timed_out(self) -> None:
        self.timer = None
        self._fail(TimeoutError())

    def _finish(self, oversized: bool, *, keep: bool = False) -> None:
        waiter = self.waiter
        self.waiter = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        body = b"".join(self.chunks) if self.chunks else b""
        if oversized and self.limit > ERROR_BODY_BYTES:
            body = b""  # a reply is forwarded whole or not at all
        elif body and self.encoding in (b"gzip", b"deflate", b"x-gzip"):
            try:
                body = _inflate(body, self.encoding)
            except zlib.error:
                pass
        headers = CIMultiDictProxy(CIMultiDict(
            (n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
            for n, v in self.raw_headers))
        attempt = Attempt(self.status, body, headers, oversized=oversized)
        self._reset()
        if oversized or not keep or self.closed:
            self.close()
        else:
            self.idle_since = self.loop.time()
            self.target.idle.append(self)
        if waiter is not None and not waiter.done():
            waiter.set_result(attempt)

    def _fail(self, exc: BaseException) -> None:
        waiter = self.waiter
        self.waiter = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def abort(self) -> None:
        """The request was given up (cancelled): its answer is not waited for, the connection not reused."""
        self.waiter = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _inflate(body: bytes, encoding: bytes) -> bytes:
    if encoding == b"deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:
            return zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate, as some servers send it
    return zlib.decompress(body, 16 + zlib.MAX_WBITS)


class PooledSender(HttpSender):
    """``HttpSender`` whose plain-HTTP POSTs go through this module's client; the rest through aiohttp."""

    def __init__(self, session: aiohttp.ClientSession, tls_minimum: TlsVersion = TlsVersion.TLS_1_3) -> None:
        super().__init__(session, tls_minimum)
        self._targets: dict[str, _Target | None] = {}

    async def post(self, url: str, headers: Mapping[str, str], body: bytes, timeout: float | None, *,
                   ca_certs: str | None = None) -> Attempt:
        target = self._targets.get(url)
        if target is None:
            if url in self._targets:
                return await super().post(url, headers, body, timeout, ca_certs=ca_certs)
            if len(self._targets) >= MAX_TARGETS:
                self._evict()
            target = self._targets[url] = _target(url)
            if target is None:
                return await super().post(url, headers, body, timeout, ca_certs=ca_certs)
        seconds = timeout or DEFAULT_ATTEMPT_TIMEOUT
        try:
            data = _request(target.prefix, headers, body)
        except ValueError as exc:
            return Attempt(None, error=f"{type(exc).__name__}: {exc}")
        loop = asyncio.get_running_loop()
        conn = _checkout(target, loop.time())
        reused = conn is not None
        deadline = loop.time() + seconds
        while True:
            try:
                if conn is None:
                    conn = await _connect(target, loop, seconds)
                    seconds = max(0.0, deadline - loop.time())
                return await conn.send(data, seconds)
            except ServerDisconnectedError as exc:
                if reused and conn is not None and not conn.answered:
                    # A kept-alive connection the server had closed while it sat idle (its FIN not read yet):
                    # not an answer of the subscriber's. Once more on a new connection, within the same timeout.
                    conn, reused = None, False
                    seconds = max(0.0, deadline - loop.time())
                    continue
                return Attempt(None, error=f"{type(exc).__name__}: {exc}")
            except (OSError, TimeoutError, ValueError) as exc:
                return Attempt(None, error=f"{type(exc).__name__}: {exc}")
            except BaseException:
                if conn is not None:  # cancelled half-way (a revoke, shutdown): the connection cannot be reused
                    conn.abort()
                raise

    def _evict(self) -> None:
        for url, target in list(self._targets.items()):
            if target is not None:
                for conn in target.idle:
                    conn.close()
            del self._targets[url]

    def close(self) -> None:
        """Close every idle connection (the in-flight ones close as their requests end or are cancelled)."""
        self._evict()


def _request(prefix: str, headers: Mapping[str, str], body: bytes) -> bytes:
    if _FORBIDDEN.search("\t".join(headers)) or _FORBIDDEN.search("\t".join(headers.values())):
        raise ValueError("Forbidden control character detected in headers. Potential header injection attack.")
    lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
    return f"{prefix}{lines}Content-Length: {len(body)}\r\n\r\n".encode() + body


def _checkout(target: _Target, now: float) -> _Connection | None:
    idle = target.idle
    while idle:
        conn = idle.pop()  # the most recently used: warm, and the old ones age out at the other end
        if conn.closed:
            continue
        if now - conn.idle_since > KEEPALIVE_SECONDS:
            conn.close()
            continue
        # The oldest idle connection, if stale, goes too: under a steady load the bottom of the stack is
        # never popped.
        if idle and (idle[0].closed or now - idle[0].idle_since > KEEPALIVE_SECONDS):
            idle.popleft().close()
        return conn
    return None


async def _connect(target: _Target, loop: asyncio.AbstractEventLoop, timeout: float) -> _Connection:
    _transport, conn = await asyncio.wait_for(
        loop.create_connection(lambda: _Connection(target, loop), target.host, target.port), timeout)
    return conn

