"""The dispatcher's plain-HTTP client (dispatcher/http_client.py) against a real aiohttp server: each answer
gives the same ``Attempt`` as the aiohttp path (``HttpSender``), and connections are reused only when whole."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_eventing.core.http_delivery import ERROR_BODY_BYTES, MAX_REPLY_BYTES, Attempt, HttpSender
from kafka_eventing.dispatcher import http_client
from kafka_eventing.dispatcher.http_client import PooledSender

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.peers: list[Any] = []
        self.routes: dict[str, Handler] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.raw_path, dict(request.headers), body))
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return await self.routes.get(request.path, _ok)(request)


async def _ok(_request: web.Request) -> web.StreamResponse:
    return web.Response(status=202)


Body = Callable[[Server, str, PooledSender, HttpSender], Awaitable[None]]


def run(body: Body) -> None:
    """``body(server, base_url, pooled_sender, aiohttp_sender)`` on a fresh loop with a real aiohttp server."""

    async def main() -> None:
        srv = Server()
        app = web.Application(client_max_size=16 * 2**20)
        app.router.add_route("*", "/{tail:.*}", srv.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                pooled = PooledSender(session)
                try:
                    await body(srv, f"http://127.0.0.1:{port}", pooled, HttpSender(session))
                finally:
                    pooled.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def same(a: Attempt, b: Attempt) -> None:
    assert (a.status, a.body, a.oversized, a.ok) == (b.status, b.body, b.oversized, b.ok)
    for name in ("Content-Type", "ce-id", "Retry-After"):
        assert a.headers.get(name) == b.headers.get(name)
        assert a.headers.get(name.lower()) == b.headers.get(name)


def test_request_headers_and_body_as_aiohttp_sends_them() -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:
        headers = {"ce-id": "1", "ce-source": "/s%20x", "content-type": "application/json", "Prefer": "reply"}
        for sender in (pooled, plain):
            same(await sender.post(f"{base}/a/b?x=1&y=%2F", headers, b'{"a": 1}', 5), Attempt(202))
        (p1, h1, b1), (p2, h2, b2) = srv.requests
        assert (p1, b1) == (p2, b2)  # the same target (yarl's normalisation of the URL on both) and body
        assert p1.startswith("/a/b?x=1&y=") and b1 == b'{"a": 1}'
        for name in ("Host", "Content-Length", "Content-Type", "ce-id", "ce-source", "Prefer"):
            assert h1[name] == h2[name]
        # No Content-Type: none invented (aiohttp's default would be application/octet-stream).
        for sender in (pooled, plain):
            await sender.post(f"{base}/n", {"ce-id": "2"}, b"x", 5)
        assert "Content-Type" not in srv.requests[2][1] and "Content-Type" not in srv.requests[3][1]
        assert srv.requests[2][1]["Content-Length"] == "1"

    run(body)


def test_connections_are_reused() -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:
        for _ in range(5):
            assert (await pooled.post(f"{base}/x", {}, b"x", 5)).ok
        assert len(set(srv.peers)) == 1
        await asyncio.gather(*(pooled.post(f"{base}/x", {}, b"x", 5) for _ in range(8)))
        assert len(set(srv.peers)) == 8  # no connection limit: eight at once need eight

    run(body)


@pytest.mark.parametrize("case", ["reply", "chunked", "gzip", "error", "long_error", "huge_reply", "huge_chunked",
                                  "retry_after", "no_length"])
def test_answers_give_the_same_attempt(case: str) -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:

        async def handler(request: web.Request) -> web.StreamResponse:
            if case == "reply":
                return web.Response(body=b'{"r": 1}', headers={"ce-id": "r1", "Content-Type": "application/json"})
            if case == "gzip":
                return web.Response(body=gzip.compress(b"zipped" * 100), headers={"Content-Encoding": "gzip"})
            if case == "error":
                return web.Response(status=500, body=b"boom")
            if case == "long_error":
                return web.Response(status=502, body=b"e" * (ERROR_BODY_BYTES * 10))
            if case == "huge_reply":
                return web.Response(body=b"r" * (MAX_REPLY_BYTES + 10))
            if case == "retry_after":
                return web.Response(status=429, headers={"Retry-After": "3"})
            resp = web.StreamResponse(status=200 if case != "no_length" else 503)
            if case == "no_length":
                resp.force_close()
                resp.headers["Connection"] = "close"
            else:
                resp.enable_chunked_encoding()
            await resp.prepare(request)
            size = MAX_REPLY_BYTES + 100 if case == "huge_chunked" else 3000
            for i in range(0, size, 65536):
                await resp.write(b"c" * min(65536, size - i))
            await resp.write_eof()
            return resp

        srv.routes["/case"] = handler
        a = await pooled.post(f"{base}/case", {}, b"", 5)
        b = await plain.post(f"{base}/case", {}, b"", 5)
        if case in ("huge_chunked",):  # aiohttp keeps the first part it read; neither forwards it
            assert (a.status, a.oversized, b.oversized) == (200, True, True)
        elif case == "no_length":  # read until the server closes; aiohttp's error body is its first 1 KiB
            assert (a.status, a.body[:ERROR_BODY_BYTES]) == (b.status, b.body)
        else:
            same(a, b)
        if case == "retry_after":
            assert a.retry_after == 3.0
        # The connection is still usable (or was replaced).
        assert (await pooled.post(f"{base}/after", {}, b"", 5)).status == 202

    run(body)


def test_timeout_closes_the_connection() -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:

        async def hang(_request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(2)
            return web.Response()

        srv.routes["/hang"] = hang
        a = await pooled.post(f"{base}/hang", {}, b"", 0.2)
        assert a.status is None and a.error.startswith("TimeoutError")
        assert (await pooled.post(f"{base}/ok", {}, b"", 5)).status == 202

    run(body)


def test_cancelled_request_does_not_leave_its_connection_in_the_pool() -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:

        async def slow(_request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(0.3)
            return web.Response(body=b"late")

        srv.routes["/slow"] = slow
        task = asyncio.ensure_future(pooled.post(f"{base}/slow", {}, b"", 5))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)
        assert (await pooled.post(f"{base}/ok", {}, b"", 5)).status == 202  # not the late answer of /slow

    run(body)


def test_refused_connection_and_header_injection_are_failed_attempts() -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:
        from kafka_eventing.localstack._proc import free_port

        url = f"http://127.0.0.1:{free_port()}/"
        a = await pooled.post(url, {}, b"", 2)
        assert a.status is None and a.error
        for sender in (pooled, plain):
            bad = await sender.post(f"{base}/x", {"ce-id": "1\r\nX-Injected: yes"}, b"", 2)
            assert bad.status is None and bad.error.startswith("ValueError")
        assert srv.requests == []

    run(body)


def test_server_closing_idle_connection_is_not_reused() -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:

        async def close(_request: web.Request) -> web.StreamResponse:
            resp = web.Response(status=200)
            resp.force_close()
            return resp

        srv.routes["/close"] = close
        assert (await pooled.post(f"{base}/close", {}, b"", 5)).status == 200
        assert (await pooled.post(f"{base}/ok", {}, b"", 5)).status == 202
        assert len(set(srv.peers)) == 2

    run(body)


def test_https_and_credentials_go_through_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(srv: Server, base: str, pooled: PooledSender, plain: HttpSender) -> None:
        seen = []

        async def fallback(self: HttpSender, url: str, *_args: Any, **_kwargs: Any) -> Attempt:
            seen.append(url)
            return Attempt(200)

        monkeypatch.setattr(HttpSender, "post", fallback)
        for url in ("https://example.invalid/x", "http://u:p@example.invalid/x", "ftp://example.invalid/"):
            assert (await pooled.post(url, {}, b"", 1)).status == 200
        assert seen == ["https://example.invalid/x", "http://u:p@example.invalid/x", "ftp://example.invalid/"]

    run(body)


def test_keepalive_matches_aiohttp() -> None:
    assert http_client.KEEPALIVE_SECONDS == 15.0


# -- property: any answer a server may give, framed any way, is the Attempt the aiohttp path makes of it ----------
_REPLY_LIMIT, _ERROR_LIMIT = 2000, 100


def _response(status: int, body: bytes, framing: str, headers: list[tuple[str, str]]) -> bytes:
    reason = {200: "OK", 204: "No Content"}.get(status, "X")
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers)]
    if status == 204:  # no body and no framing (a 204 with Transfer-Encoding is invalid: aiohttp refuses it)
        payload = b""
    elif framing == "length":
        lines.append(f"Content-Length: {len(body)}")
        payload = body
    elif framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
        step = max(1, len(body) // 3)
        payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + step]), body[i:i + step])
                           for i in range(0, len(body), step)) + b"0\r\n\r\n"
    else:
        lines.append("Connection: close")
        payload = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from([200, 201, 202, 204, 400, 404, 408, 429, 500, 503]),
       size=st.sampled_from([0, 1, 99, 100, 101, 1999, 2000, 2001, 5000]),
       framing=st.sampled_from(["length", "chunked", "close"]),
       retry_after=st.none() | st.integers(0, 100).map(str) | st.just("soon"),
       ce=st.booleans())
def test_any_answer_gives_the_attempt_aiohttp_gives(monkeypatch: pytest.MonkeyPatch, status: int, size: int,
                                                    framing: str, retry_after: str | None, ce: bool) -> None:
    from kafka_eventing.core import http_delivery

    for module in (http_delivery, http_client):
        monkeypatch.setattr(module, "MAX_REPLY_BYTES", _REPLY_LIMIT)
        monkeypatch.setattr(module, "ERROR_BODY_BYTES", _ERROR_LIMIT)
    body = bytes(i % 251 for i in range(size)) if status != 204 else b""
    headers = [("Content-Type", "application/octet-stream")]
    if retry_after is not None:
        headers.append(("Retry-After", retry_after))
    if ce:
        headers += [("ce-id", "r"), ("ce-source", "/r"), ("ce-type", "t"), ("ce-specversion", "1.0")]
    answer = _response(status, body, framing, headers)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
                if framing == "close":
                    break
        writer.close()

    async def main() -> tuple[Attempt, Attempt, Attempt]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/e"
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                pooled = PooledSender(session)
                a = await pooled.post(url, {"ce-id": "1"}, b"event", 5)
                again = await pooled.post(url, {"ce-id": "2"}, b"event", 5)  # a reused or a new connection
                b = await HttpSender(session).post(url, {"ce-id": "1"}, b"event", 5)
                pooled.close()
                return a, again, b
        finally:
            server.close()

    a, again, b = asyncio.run(main())
    assert (a.status, a.ok, a.oversized, a.retry_after) == (b.status, b.ok, b.oversized, b.retry_after)
    assert (again.status, again.oversized) == (a.status, a.oversized)
    if a.oversized and a.ok:
        assert a.body == b""  # a reply too large is not forwarded (aiohttp may hold its first part: unused)
    elif a.oversized:
        assert a.body.startswith(b.body) and len(a.body) == _ERROR_LIMIT  # aiohttp: what was buffered, ≤ the limit
    else:
        assert a.body == b.body
    for name in ("content-type", "retry-after", "ce-id", "CE-SOURCE"):
        assert a.headers.get(name) == b.headers.get(name)
    assert {k.lower() for k in a.headers if k.lower().startswith("ce-")} == \
        {k.lower() for k in b.headers if k.lower().startswith("ce-")}


def test_a_kept_alive_connection_the_server_closed_is_replaced_not_failed() -> None:
    """The server closes each connection after its answer without saying so (no ``Connection: close``): the next
    request, sent before the FIN is read, goes once more on a new connection instead of failing the attempt."""
    served: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        served.append(await reader.readexactly(length))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main() -> list[Attempt]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        try:
            async with aiohttp.ClientSession() as session:
                pooled = PooledSender(session)
                out = [await pooled.post(url, {}, b"%d" % i, 5) for i in range(5)]
                await asyncio.sleep(0.05)  # now the FIN has been read: the idle connection is dropped, not tried
                out.append(await pooled.post(url, {}, b"5", 5))
                pooled.close()
                return out
        finally:
            server.close()

    attempts = asyncio.run(main())
    assert [a.status for a in attempts] == [200] * 6
    assert served == [b"0", b"1", b"2", b"3", b"4", b"5"]  # each once: nothing the server answered was sent again
