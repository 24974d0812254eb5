"""The receiver's uvicorn worker: uvicorn's httptools protocol with a deadline for slow clients.

uvicorn bounds idle keep-alive connections only after a response, and the first byte of the next request cancels
that timer; a client that connects and sends nothing, or dribbles a header or a body byte by byte, holds its
connection (and, for a body, the request's coroutine) forever. Here every request must arrive whole within
``KE_REQUEST_TIMEOUT_SECONDS`` of its first byte, and a new connection must begin one as quickly; one sweep a
second per worker cuts off whoever is late (408 when no answer has begun). The cost per request is one loop
clock read when its first byte arrives: no timer per request.

The parser (llhttp) has no limit of its own on a request's head either, and uvicorn keeps every header it
parses: a head that spans reads and grows past ``MAX_HEAD_BYTES`` (URL and headers) is refused with 431. The
count costs one comparison per read. Bodies are bounded by the app while they stream (413).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from pathlib import Path
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.workers import UvicornWorker

from kafka_eventing.core.settings import Settings

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 1.0
#: Request line and headers together; CloudEvents put attributes in headers, and 64 KiB is ample for them (nginx
#: allows 4 × 8 KiB by default, h11 16 KiB).
MAX_HEAD_BYTES = 64 * 1024


def _closing_answer(status: bytes, error: str) -> bytes:
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


_TIMED_OUT = _closing_answer(b"408 Request Timeout", "request not sent in time")
_HEAD_TOO_LARGE = _closing_answer(b"431 Request Header Fields Too Large", "request line and headers too large")


class DeadlineHttpProtocol(HttpToolsProtocol):
    """httptools' HTTP/1.1 protocol, with requests that must arrive in time (see the module doc)."""

    request_timeout: ClassVar[float] = Settings.request_timeout_seconds
    _sweeping: ClassVar[set[asyncio.AbstractEventLoop]] = set()

    #: loop time of the first byte of the request being received; None while none is (idle, or answering).
    started: float | None = None
    #: the bytes read since the current request's head began, while it is not complete
    in_head: bool = True
    head_bytes: int = 0

    def data_received(self, data: bytes) -> None:
        if self.in_head:
            self.head_bytes += len(data)
            if self.started is None:  # the first bytes of a request: its clock starts
                self.started = self.loop.time()
        super().data_received(data)
        if self.in_head:
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # the head is complete: the body is the app's
                self.in_head, self.head_bytes = False, 0
            elif self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.started = self.loop.time()  # a new connection must begin a request in time
        if self.loop not in self._sweeping:
            self._sweeping.add(self.loop)
            self.loop.call_later(SWEEP_INTERVAL, _sweep, self.loop, self.connections)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.started = None
        self.in_head = True  # what comes next on this connection is the next request's head

    def cut_off(self) -> None:
        """Too late: answer 408 unless an answer has begun, and close."""
        self.started = None
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        # The head of the current request is complete once its cycle exists (it carries this request's scope).
        head_done = cycle is not None and cycle.scope is self.scope
        if not head_done or not cycle.response_started:
            transport.write(_TIMED_OUT)
        transport.close()


def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
    now = loop.time()
    for conn in list(connections):
        started = getattr(conn, "started", None)
        if started is not None and now - started > conn.request_timeout:
            conn.cut_off()
    loop.call_later(SWEEP_INTERVAL, _sweep, loop, connections)


class CertificateReloader:
    """Loads a rotated certificate and key into the serving SSL context: new handshakes get the new certificate,
    open connections keep theirs (nothing is dropped). Checked every ``interval`` seconds by the files' mtime,
    size and inode (a Secret volume swaps a symlink); a pair that does not load (caught mid-rotation) is tried
    again at the next check, and the old one served meanwhile."""

    def __init__(self, context: ssl.SSLContext, cert: Path, key: Path, interval: float) -> None:
        self.context, self.cert, self.key, self.interval = context, cert, key, interval
        self._stamp = self.stamp()

    def stamp(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert, self.key):
            try:
                st = path.stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append((-1, -1, -1))
        return tuple(out)

    def check(self) -> bool:
        """True when a new pair was loaded."""
        stamp = self.stamp()
        if stamp == self._stamp:
            return False
        try:
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("rotated TLS certificate not loaded yet, serving the previous one", extra={"error": str(exc)})
            return False
        self._stamp = stamp
        log.info("TLS certificate reloaded", extra={"cert": str(self.cert)})
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()


class ReceiverWorker(UvicornWorker):
    """What gunicorn runs (``-k kafka_eventing.receiver.server.ReceiverWorker``): uvicorn with the protocol above,
    and — with ``KE_TLS_CERT_FILE`` — HTTPS at ``KE_TLS_MIN_VERSION`` or above, its certificate reloaded on
    rotation (``CertificateReloader``)."""

    CONFIG_KWARGS = {"loop": "auto", "http": DeadlineHttpProtocol}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = Settings.from_env()
        DeadlineHttpProtocol.request_timeout = self.settings.request_timeout_seconds

    async def _serve(self) -> None:
        settings, reload = self.settings, None
        if self.cfg.is_ssl:
            self.config.app = self.wsgi  # what super()._serve() sets; load() wraps the app it finds
            self.config.load()  # makes the SSL context the server will use
            context = self.config.ssl
            assert context is not None
            context.minimum_version = settings.tls_min_version.ssl_version
            cert, key = self.cfg.ssl_options["certfile"], self.cfg.ssl_options.get("keyfile") or ""
            reloader = CertificateReloader(context, Path(cert), Path(key or cert), settings.tls_reload_seconds)
            reload = asyncio.get_running_loop().create_task(reloader.run())
        try:
            await super()._serve()
        finally:
            if reload is not None:
                reload.cancel()
