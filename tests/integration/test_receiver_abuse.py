"""Abuse of the real server (gunicorn + uvicorn workers, real broker): slow clients dribbling headers and bodies,
header and URL floods, 10 MB chunked bodies, invalid UTF-8 everywhere.

Throughout, a well-behaved client keeps sending events and must keep getting 202s promptly; afterwards no worker
has crashed or been replaced (same pids), nothing was answered 500 or logged as a traceback, and the workers'
memory grew by a bounded amount (RSS before/after).
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import support.receiver as receiver_tests
from support.receiver import Receiver, binary_headers, channels_yaml, read_all, worker_pids

from kafka_eventing.localstack.kafka import KafkaNode

pytestmark = pytest.mark.kafka

start_receiver = receiver_tests.start_receiver  # the real-gunicorn fixture, shared

#: What the abuse may cost the workers in memory, all of them together (buffers it must not keep).
RSS_GROWTH_LIMIT = 64 * 1024 * 1024
REQUEST_TIMEOUT = 3  # KE_REQUEST_TIMEOUT_SECONDS for these runs: slow clients are cut after this


def rss(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_answer(sock: socket.socket) -> tuple[int | None, bytes]:
    """The status code and head of the server's answer (None: it closed without one)."""
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
    sock.close()
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    return int(data[9:12]), data


def raw_request(url: str, request: bytes) -> tuple[int | None, bytes]:
    # No half-close after sending: to uvicorn an EOF means the client has gone, as it would to a proxy.
    sock = connect(url)
    with contextlib.suppress(OSError):  # the server may answer and close before all is sent
        sock.sendall(request)
    return read_answer(sock)


class GoodClient:
    """Sends one event every few milliseconds for as long as it runs; records status and latency of each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[int, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    res = client.post(self.url + "/ns/a", content=b"good", headers=binary_headers(f"good-{i}"))
                    self.answers.append((res.status_code, time.monotonic() - started))
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                i += 1
                self._stop.wait(0.02)

    def __enter__(self) -> GoodClient:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        # Enough answers to judge by, however quick the abuse was.
        deadline = time.monotonic() + 30
        while len(self.answers) + len(self.errors) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(35)

    def check(self) -> None:
        assert not self.errors, self.errors[:5]
        assert len(self.answers) >= 20, self.answers
        statuses = {s for s, _ in self.answers}
        assert statuses == {202}, statuses
        latencies = sorted(t for _, t in self.answers)
        # Served promptly all along: nothing waited behind the abusers (loose bounds for a shared machine).
        assert statistics.median(latencies) < 0.5 and latencies[-1] < 5.0, (statistics.median(latencies),
                                                                            latencies[-5:])


@pytest.fixture
def abused(kafka_running: KafkaNode, topic: str,
           start_receiver: Callable[..., Receiver]) -> Iterator[tuple[Receiver, set[int]]]:
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers,
                              env={"KE_REQUEST_TIMEOUT_SECONDS": str(REQUEST_TIMEOUT)})
    workers = worker_pids(receiver.proc.pid)
    # Warm up both workers (imports, producer connection) before memory is measured.
    for i in range(20):
        assert receiver.post("/ns/a", b"warm", binary_headers(f"warm-{i}")).status_code == 202
    before = rss(workers)
    yield receiver, workers
    assert receiver.proc.poll() is None, "gunicorn died"
    assert worker_pids(receiver.proc.pid) == workers, "a worker crashed or was replaced"
    grown = rss(workers) - before
    print(f"\nworkers' RSS: {before / 2**20:.1f} MiB before, grown by {grown / 2**20:.1f} MiB")
    assert grown < RSS_GROWTH_LIMIT, f"workers grew by {grown / 2**20:.1f} MiB"
    log = receiver.log.read_text()
    assert "Traceback" not in log and '"level": "error"' not in log, log[-3000:]


def dribble(url: str, head: bytes, then: bytes, every: float, limit: float) -> float | None:
    """Send ``head``, then ``then`` one byte every ``every`` s: seconds until the server cut us off (None: never)."""
    sock = connect(url)
    sock.settimeout(every)
    started = time.monotonic()
    try:
        sock.sendall(head)
        for i in range(int(limit / every)):
            sock.sendall(then[i % len(then):i % len(then) + 1])
            try:
                sock.recv(65536)  # an answer (408) or EOF: cut off
            except TimeoutError:
                continue  # nothing yet: keep dribbling
            return time.monotonic() - started
    except OSError:
        return time.monotonic() - started
    finally:
        sock.close()
    return None


def test_slow_clients_are_cut_off_and_others_served(abused: tuple[Receiver, set[int]], kafka_running: KafkaNode,
                                                    topic: str) -> None:
    receiver, _ = abused
    head = b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\n"
    body_head = (b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\nce-specversion: 1.0\r\nce-id: slow\r\nce-source: /s\r\n"
                 b"ce-type: t\r\nContent-Length: 100000\r\n\r\n")
    idle: list[socket.socket] = []
    results: dict[str, list[float | None]] = {"headers": [], "body": []}

    def run(kind: str, first: bytes, then: bytes) -> None:
        results[kind].append(dribble(receiver.url, first, then, every=0.25, limit=4 * REQUEST_TIMEOUT + 10))

    with GoodClient(receiver.url) as good:
        # Connections that send nothing at all, and ones that dribble a header or the body byte by byte.
        idle = [connect(receiver.url) for _ in range(20)]
        threads = [threading.Thread(target=run, args=("headers", head, b"X-Slow: still coming\r\n"))
                   for _ in range(20)]
        threads += [threading.Thread(target=run, args=("body", body_head, b"x")) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        idle_cut = []
        for sock in idle:
            sock.settimeout(4 * REQUEST_TIMEOUT)
            started = time.monotonic()
            with contextlib.suppress(OSError):
                sock.recv(1)
            idle_cut.append(time.monotonic() - started)
            sock.close()
    good.check()
    for kind, cut in results.items():
        assert len(cut) == 20 and all(c is not None and c < 3 * REQUEST_TIMEOUT for c in cut), (kind, cut)
    assert all(c < 3 * REQUEST_TIMEOUT for c in idle_cut), idle_cut
    # A body cut off at the deadline is a part of an event: never written.
    ids = {dict(m.headers()).get("ce_id") for m in read_all(kafka_running, topic)}
    assert b"slow" not in ids


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_client_that_leaves_mid_body_gets_nothing_written(abused: tuple[Receiver, set[int]],
                                                            kafka_running: KafkaNode, topic: str,
                                                            framing: str) -> None:
    receiver, _ = abused
    head = (b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\nce-specversion: 1.0\r\nce-id: %s\r\nce-source: /s\r\n"
            b"ce-type: t\r\n")
    for i in range(10):
        sock = connect(receiver.url)
        if framing == "chunked":
            sock.sendall(head % (b"left-%d" % i) + b"Transfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n")
        else:
            sock.sendall(head % (b"left-%d" % i) + b"Content-Length: 100\r\n\r\n" + b"x" * 50)
        time.sleep(0.05)  # the part is read before the close
        sock.close()
    # A whole event after them, on a new connection: it is written, and by then the others were decided.
    assert receiver.post("/ns/a", b"whole", binary_headers("whole")).status_code == 202
    time.sleep(0.5)
    ids = {dict(m.headers()).get("ce_id") for m in read_all(kafka_running, topic)}
    assert b"whole" in ids
    assert not {i for i in ids if i and i.startswith(b"left-")}, sorted(ids)


def test_header_and_url_floods_are_refused(abused: tuple[Receiver, set[int]]) -> None:
    receiver, _ = abused
    many = b"".join(b"X-F%d: v\r\n" % i for i in range(1000))
    huge_value = b"X-Big: " + b"a" * (1024 * 1024) + b"\r\n"
    with GoodClient(receiver.url) as good:
        for request in (
            b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\n" + many + b"Content-Length: 0\r\n\r\n",
            b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\n" + huge_value + b"Content-Length: 0\r\n\r\n",
            b"POST /" + b"a" * (1024 * 1024) + b" HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n",
        ):
            status, data = raw_request(receiver.url, request)
            assert status in (400, 414, 431), (status, data[:200])
        # 10 MB of headers, streamed in pieces: refused long before the end; memory is checked by the fixture.
        sock = connect(receiver.url)
        sent = 0
        with contextlib.suppress(OSError):
            sock.sendall(b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\n")
            line = b"X-Flood: " + b"f" * 1000 + b"\r\n"
            while sent < 10 * 1024 * 1024:
                sock.sendall(line * 64)
                sent += len(line) * 64
        status, _ = read_answer(sock)
        assert status == 431 and sent < 10 * 1024 * 1024, (status, sent)
    good.check()


def test_ten_megabyte_chunked_bodies_are_413(abused: tuple[Receiver, set[int]], kafka_running: KafkaNode,
                                             topic: str) -> None:
    receiver, _ = abused
    statuses: list[int] = []

    def chunks() -> Iterator[bytes]:
        block = b"c" * 65536
        for _ in range(160):  # 10 MiB
            yield block

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            res = client.post(receiver.url + "/ns/a", content=chunks(), headers=binary_headers("chunked"))
            statuses.append(res.status_code)

    with GoodClient(receiver.url) as good:
        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        declared, _ = raw_request(receiver.url, b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\nce-specversion: 1.0\r\n"
                                                b"ce-id: big\r\nce-source: /s\r\nce-type: t\r\n"
                                                b"Content-Length: 10485760\r\n\r\n" + b"d" * 65536)
    good.check()
    assert statuses == [413] * 4, statuses
    assert declared == 413
    ids = {dict(m.headers()).get("ce_id") for m in read_all(kafka_running, topic)}
    assert b"chunked" not in ids and b"big" not in ids


INVALID_UTF8 = [
    b"POST /ns/\xff\xfe HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\n\r\nx",
    b"POST / HTTP/1.1\r\nHost: \xff-kn-channel.ns.svc\r\nContent-Length: 1\r\n\r\nx",
    b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\nce-specversion: 1.0\r\nce-id: \xff\xfe\r\nce-source: \xc3\x28\r\n"
    b"ce-type: \xed\xa0\x80\r\nContent-Length: 1\r\n\r\nx",
    b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\nce-specversion: \xff\r\nce-id: 1\r\nce-source: /s\r\n"
    b"ce-type: t\r\nContent-Length: 1\r\n\r\nx",
    b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\nce-specversion: 1.0\r\nce-id: 1\r\nce-source: /s\r\nce-type: t\r\n"
    b"content-type: text/plain; charset=\xff\r\nContent-Length: 1\r\n\r\nx",
    b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/cloudevents+json\r\nContent-Length: 60\r\n"
    b'\r\n{"specversion":"1.0","id":"\xff","source":"/s","type":"t"}    ',
    b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/cloudevents+json; charset=utf-8\r\n"
    b"Content-Length: 4\r\n\r\n\xff\xfe\xfd\xfc",
    b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/cloudevents-batch+json\r\n"
    b'Content-Length: 62\r\n\r\n[{"specversion":"1.0","id":"\xc3\x28","source":"/s","type":"t"}] ',
    b"POST /ns/a HTTP/1.1\r\nHost: localhost\r\nX-\xff: 1\r\nContent-Length: 1\r\n\r\nx",
    b"POST /ns/a?\xff=\xfe HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\n\r\nx",
    b"OPTIONS /ns/a HTTP/1.1\r\nHost: localhost\r\nWebHook-Request-Origin: \xff\xfe\r\n\r\n",
]


def test_invalid_utf8_everywhere_is_a_4xx(abused: tuple[Receiver, set[int]], kafka_running: KafkaNode,
                                           topic: str) -> None:
    receiver, _ = abused
    answers = []
    with GoodClient(receiver.url) as good:
        for request in INVALID_UTF8:
            status, data = raw_request(receiver.url, request)
            answers.append(status)
            assert status is not None and status < 500, (request[:80], status, data[:300])
    good.check()
    # Whatever was accepted (a binary event's data may be any bytes) is a readable event in Kafka.
    ids = {dict(m.headers()).get("ce_id") for m in read_all(kafka_running, topic)}
    assert None not in ids, answers
