"""Dispatcher benchmark (`make bench-dispatcher`): Kafka's headroom, the HTTP ceiling, the dispatcher, RSS.

Measured in one run on one local Kafka node, against the same subscriber process:

1. raw confluent-kafka consumer rate over the backlog (Kafka's headroom);
2. a bare aiohttp client posting the same events with the same concurrency, no Kafka (the real ceiling), and
   the same with the dispatcher's own HTTP client (``bare_http_pooled``: the floor of its HTTP cost);
3. the dispatcher (``python -m kafka_eventing.dispatcher``) to that instant subscriber, unordered and ordered;
4. the dispatcher to a subscriber answering after a fixed 10 ms, unordered and ordered;
5. RSS of one dispatcher process with 15 subscriptions × 4 partitions × 10 KB events under growing backlogs;
6. the peer, Knative's Java dispatcher (``bench/peer.py``, built by ``make peer``; left out, and said so, when it is
   not built), on the same backlog and subscriber: its default ``max.poll.records`` (50) and 500, unordered and
   ordered, and unordered to the 10 ms subscriber.

Rates are taken at the subscriber (first to last request), so startup is excluded the same way everywhere.
The subscriber is a minimal asyncio HTTP/1.1 server in its own process (``--serve``), so it is not the
bottleneck being measured. Its 10 ms answers are timed by a thread (``time.sleep``-precise, not the event
loop's millisecond-rounded timers) and it records each answer's service time (request complete → answer
written), so the 10 ms ideal is the configured 10 ms. CPU µs/event is process CPU over the delivery window
(dispatcher: its process from the first to the last event at the subscriber; bare client: the posting phase),
which stays comparable when the machine is busy and rates are not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peer
import yaml
from _common import (
    ROOT,
    cpu_seconds,
    machine_facts,
    median,
    new_figure,
    percentile,
    rss_bytes,
    save_png,
    write_json,
)

from kafka_eventing.core.binding import CloudEvent, event_to_http, event_to_kafka
from kafka_eventing.localstack._proc import free_port, terminate
from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode

NAME = "dispatcher"
DISPATCHER_ENV: dict[str, str] = {}
NS = "bench"


# -- the subscriber process -----------------------------------------------------------------------------
class _Delayed:
    """Answers due later, written at their deadline by a thread: ``time.sleep`` is precise to tens of µs.

    The event loop's own timers are not: epoll waits in whole milliseconds, rounded up, so a ``call_later(0.010)``
    answered after 10.5-11.5 ms, and the "10 ms" subscriber was slower than 10 ms by itself.

    The thread writes the answer to the socket itself: a hop to the loop's thread (``call_soon_threadsafe``)
    cost a wake-up of the loop on top, ~0.1-0.2 ms on this VM, and made "10 ms" 10.2 ms at the median.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, Any]] = []
        self.cond = threading.Condition()
        self.seq = 0
        threading.Thread(target=self._run, daemon=True, name="sink-delays").start()

    def at(self, deadline: float, callback: Any) -> None:
        with self.cond:
            self.seq += 1
            heapq.heappush(self.heap, (deadline, self.seq, callback))
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.heap:
                    self.cond.wait()
                deadline, _, callback = self.heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self.cond.wait(wait)  # a futex wait with a ns timeout; re-check (a sooner one may have come)
                    continue
                heapq.heappop(self.heap)
            callback()


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class _Sink(asyncio.Protocol):
    """HTTP/1.1 keep-alive, no pipelining needed (clients wait for each answer); ``/slow<ms>/...`` answers late."""

    stats: dict[str, list[float]] = {}
    #: Per path: seconds from the request's last byte to the answer's write (the subscriber's service time).
    service: dict[str, list[float]] = {}
    #: Per ``/e2e...`` path: (event id, ms from its ``ce-benchsent`` stamp to its arrival here).
    arrivals: dict[str, list[tuple[str, float]]] = {}
    #: Per path: the ``ce-id`` s seen and how many arrived again (exactly-once is checked by id, not by count).
    ids: dict[str, set[bytes]] = {}
    duplicates: dict[str, int] = {}
    delayed: _Delayed | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # asyncio sets it already; explicit, since a delayed ACK would cost up to 40 ms
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            at = head.lower().find(b"\r\ncontent-length:")
            if at >= 0:
                length = int(head[at + 17:].split(b"\r\n", 1)[0])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length:]
            method, path = head.split(b" ", 2)[:2]
            self._answer(method.decode(), path.decode(), head)

    def _answer(self, method: str, path: str, head: bytes) -> None:
        if method == "GET":
            if path.startswith("/arrivals/"):
                payload: Any = self.arrivals.get(path[len("/arrivals"):], [])
            elif path.startswith("/ids/"):
                key = path[len("/ids"):]
                payload = {"unique": len(self.ids.get(key, ())), "duplicates": self.duplicates.get(key, 0)}
            elif path.startswith("/service/"):
                times = self.service.get(path[len("/service"):], [])
                payload = {"count": len(times), "median_ms": median(times) * 1e3,
                                "p99_ms": percentile(times, 99) * 1e3}
            else:
                payload = self.stats
            body = json.dumps(payload).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
            return
        now = time.monotonic()
        if path.startswith("/e2e"):
            self._arrived(path, head)
        at = head.find(b"\r\nce-id:")
        if at < 0:
            at = head.lower().find(b"\r\nce-id:")
        event_id = head[at + 8:].split(b"\r\n", 1)[0].strip() if at >= 0 else b""
        seen = self.ids.setdefault(path, set())
        if event_id in seen:
            self.duplicates[path] = self.duplicates.get(path, 0) + 1
        else:
            seen.add(event_id)
        entry = self.stats.get(path)
        if entry is None:
            self.stats[path] = [1, now, now]
        else:
            entry[0] += 1
            entry[2] = now
        if path.startswith("/slow"):
            delay = int(path[5:].split("/", 1)[0]) / 1000
            if self.delayed is None:
                _Sink.delayed = _Delayed(asyncio.get_running_loop())
            assert self.delayed is not None
            self.delayed.at(now + delay, lambda: self._reply_now(path, now))
        else:
            self._reply(path, now)

    def _arrived(self, path: str, head: bytes) -> None:
        """Record the event's id and its latency from the ``ce-benchsent`` stamp (``time.monotonic_ns()``,
        one clock for every process on the machine)."""
        now = time.monotonic_ns()
        fields = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        sent = int(fields.get(b"ce-benchsent", b"0"))
        self.arrivals.setdefault(path, []).append((fields.get(b"ce-id", b"").decode(), (now - sent) / 1e6))

    def _reply(self, path: str, received: float) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(_OK)
        self._served(path, received)

    def _served(self, path: str, received: float) -> None:
        self.service.setdefault(path, []).append(time.monotonic() - received)

    def _reply_now(self, path: str, received: float) -> None:
        """On the timer thread: write the answer to the socket at once, not after a hop to the loop's thread.

        Safe without the loop: a client waits for this answer before it sends on this connection again, so
        nothing else writes to the socket meanwhile. Whatever the kernel does not take at once (never, for 38
        bytes on an idle connection) goes through the loop after all.
        """
        sock = self.transport.get_extra_info("socket")
        try:
            sent = os.write(sock.fileno(), _OK) if sock is not None else 0
        except OSError:
            sent = 0
        if sent == len(_OK):
            self._served(path, received)
        elif sent == 0 and self.delayed is not None:
            self.delayed.loop.call_soon_threadsafe(self._reply, path, received)
        elif self.delayed is not None:  # half an answer written: this connection cannot be saved
            self.delayed.loop.call_soon_threadsafe(self.transport.close)


def serve(port: int) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Sink, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


class SinkProcess:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port)], start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self.stats()
                return
            time.sleep(0.1)
        raise RuntimeError("subscriber process did not start")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stats(self) -> dict[str, list[float]]:
        with urllib.request.urlopen(self.url("/"), timeout=5) as resp:  # noqa: S310 - 127.0.0.1 only
            data: dict[str, list[float]] = json.loads(resp.read())
            return data

    def ids(self, path: str) -> dict[str, int]:
        """Distinct event ids that reached ``path``, and how many arrived again."""
        with urllib.request.urlopen(self.url("/ids" + path), timeout=10) as resp:  # noqa: S310 - 127.0.0.1 only
            data: dict[str, int] = json.loads(resp.read())
            return data

    def service(self, path: str) -> dict[str, float]:
        """The subscriber's own service time for ``path``: median and p99 in ms."""
        with urllib.request.urlopen(self.url("/service" + path), timeout=5) as resp:  # noqa: S310 - 127.0.0.1
            data: dict[str, float] = json.loads(resp.read())
            return data

    def arrivals(self, path: str) -> list[tuple[str, float]]:
        """Each event that reached an ``/e2e...`` path: its id and latency in ms, in order of arrival."""
        with urllib.request.urlopen(self.url("/arrivals" + path), timeout=10) as resp:  # noqa: S310 - 127.0.0.1
            return [(i, ms) for i, ms in json.loads(resp.read())]

    def wait_for(self, path: str, count: int, timeout: float) -> int:
        """Wait until ``path`` got at least ``count`` requests; returns the count seen then."""
        deadline = time.monotonic() + timeout
        while True:
            seen = int(self.stats().get(path, [0])[0])
            if seen >= count:
                return seen
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seen} of {count} requests on {path}")
            time.sleep(0.1)

    def wait(self, paths: list[str], count: int, timeout: float) -> dict[str, float]:
        """Wait until every path got ``count`` requests; return each path's rate (events/s)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if all(stats.get(p, [0])[0] >= count for p in paths):
                return {p: (stats[p][0] - 1) / max(1e-9, stats[p][2] - stats[p][1]) for p in paths}
            if time.monotonic() > deadline:
                raise TimeoutError(f"subscriber got {[stats.get(p, [0])[0] for p in paths]} of {count}")
            time.sleep(0.1)

    def stop(self) -> None:
        terminate(self.proc, timeout=10)  # type: ignore[arg-type]


# -- events -------------------------------------------------------------------------------------------------
def make_event(i: int, size: int) -> CloudEvent:
    data = json.dumps({"i": i, "pad": "x" * max(0, size - 30)}).encode()
    return CloudEvent({"id": f"bench-{i}", "source": "/bench", "type": "bench.event", "specversion": "1.0",
                       "datacontenttype": "application/json"}, data)


def create_topic(node: KafkaNode, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient(node.client_config())
    for fut in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
        fut.result(timeout=30)


def produce(node: KafkaNode, topic: str, start: int, count: int, size: int, *, partitions: int = 4) -> float:
    """Produce events ``start..start+count`` round-robin over partitions; returns seconds taken."""
    from confluent_kafka import Producer

    producer = Producer({**node.client_config(), "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.kbytes": 256 * 1024})
    began = time.monotonic()
    template = event_to_kafka(make_event(0, size))
    for i in range(start, start + count):
        headers = [(k, f"bench-{i}".encode()) if k == "ce_id" else (k, v) for k, v in template.headers]
        while True:
            try:
                producer.produce(topic, template.value, None, partition=i % partitions, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(300)
    return time.monotonic() - began


# -- measurements -------------------------------------------------------------------------------------------
def raw_consumer_rate(node: KafkaNode, topic: str, count: int) -> float:
    from confluent_kafka import Consumer

    consumer = Consumer({**node.client_config(), "group.id": f"raw-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got, first, last = 0, 0.0, 0.0
    deadline = time.monotonic() + 120
    try:
        while got < count and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                if msg.error() is None:
                    got += 1
                    last = time.monotonic()
                    first = first or last
    finally:
        consumer.close()
    return (got - 1) / max(1e-9, last - first)


async def _bare(url: str, count: int, concurrency: int, size: int, *, pooled: bool = False) -> dict[str, float]:
    """POST ``count`` events with ``concurrency`` workers; CPU µs/event and RTT of the posting phase only.

    ``pooled``: through the dispatcher's own HTTP client (``dispatcher.http_client.PooledSender``) instead of
    aiohttp's — the floor of the dispatcher's HTTP cost, where aiohttp's is the floor of a generic client.
    """
    import aiohttp

    from kafka_eventing.dispatcher.http_client import PooledSender

    requests = []
    for i in range(count):
        headers, body = event_to_http(make_event(i, size))
        headers["Prefer"] = "reply"
        requests.append((headers, body))
    it = iter(requests)
    rtts: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        sender = PooledSender(session)

        async def worker() -> None:
            for headers, body in it:
                began = time.monotonic()
                if pooled:
                    await sender.post(url, headers, body, 60)
                else:
                    async with session.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                rtts.append(time.monotonic() - began)

        cpu0 = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu = time.process_time() - cpu0
        sender.close()
    return {"cpu_us_per_event": cpu / count * 1e6, "rtt_median_ms": median(rtts) * 1e3,
            "rtt_p99_ms": percentile(rtts, 99) * 1e3}


def bare_http_rate(sink: SinkProcess, count: int, concurrency: int, size: int, delay_ms: int = 0, *,
                   loop: str = "asyncio") -> dict[str, float]:
    """The bare client on asyncio's default loop (the reference), or on uvloop (the loop the dispatcher uses);
    ``loop="pooled"``: the dispatcher's own HTTP client, on uvloop."""
    path = (f"/slow{delay_ms}" if delay_ms else "") + f"/bare-{uuid.uuid4().hex[:8]}"
    factory = None
    if loop in ("uvloop", "pooled"):
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        out = runner.run(_bare(sink.url(path), count, concurrency, size, pooled=loop == "pooled"))
    out["rate"] = sink.wait([path], count, 30)[path]
    if delay_ms:
        out.update({f"service_{k}": v for k, v in sink.service(path).items() if k != "count"})
    return out


class DispatcherRun:
    """One dispatcher process for a fresh channel over ``topic`` with the given subscribers."""

    def __init__(self, node: KafkaNode, workdir: Path, topic: str, subscribers: list[tuple[str, str]], *,
                 ordered: bool, max_in_flight: int, partitions: int) -> None:
        self.name = f"c{uuid.uuid4().hex[:8]}"
        self.channels = channels = workdir / f"{self.name}.yaml"
        channels.write_text(yaml.safe_dump({
            "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
            "metadata": {"name": self.name, "namespace": NS, "annotations": {
                "kafka.eventing.knative.dev/external.topic": topic,
                "kafka.eventing.knative.dev/delivery.order": "ordered" if ordered else "unordered"}},
            "spec": {"numPartitions": partitions,
                     "subscribers": [{"uid": uid, "subscriberUri": uri} for uid, uri in subscribers]}}))
        self.log = workdir / f"{self.name}.log"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("KE_")},
               "KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels), "KE_CHANNEL_NAMESPACE": NS,
               "KE_CHANNEL_NAME": self.name, "KE_BOOTSTRAP_SERVERS": node.bootstrap_servers,
               "KE_KAFKA_EXTRA": "auto.offset.reset=earliest", "KE_MAX_IN_FLIGHT": str(max_in_flight),
               "KE_METRICS_PORT": str(free_port()), "KE_LOG_LEVEL": "WARNING", **DISPATCHER_ENV}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.cpu_start = 0.0

    def rss(self) -> int:
        return rss_bytes([self.proc.pid])

    def cpu(self) -> float:
        return cpu_seconds([self.proc.pid])

    def stop(self) -> None:
        terminate(self.proc, timeout=30)  # type: ignore[arg-type]


class PeerRun:
    """Knative's Java dispatcher for one Trigger-like egress over ``topic`` (a fresh consumer group)."""

    def __init__(self, node: KafkaNode, workdir: Path, topic: str, subscribers: list[tuple[str, str]], *,
                 ordered: bool, max_poll_records: int, **_ignored: Any) -> None:
        (_, url), = subscribers
        self.proc = peer.start_peer_dispatcher(node.bootstrap_servers, topic, url, workdir, ordered=ordered,
                                               max_poll_records=max_poll_records,
                                               group=f"bench-peer-{uuid.uuid4().hex[:8]}")

    def rss(self) -> int:
        return rss_bytes([self.proc.pid])

    def cpu(self) -> float:
        return cpu_seconds([self.proc.pid])

    def stop(self) -> None:
        peer.stop(self.proc)


@contextlib.contextmanager
def dispatcher(*args: Any, plane: type[DispatcherRun] | type[PeerRun] = DispatcherRun,
               **kwargs: Any) -> Iterator[DispatcherRun | PeerRun]:
    run = plane(*args, **kwargs)
    try:
        yield run
    finally:
        run.stop()


def dispatcher_rate(node: KafkaNode, workdir: Path, sink: SinkProcess, topic: str, count: int, *, ordered: bool,
                    max_in_flight: int, partitions: int, delay_ms: int = 0,
                    peer_max_poll_records: int | None = None) -> dict[str, Any]:
    """Ours, or with ``peer_max_poll_records`` the Java peer at that ``max.poll.records``."""
    path = (f"/slow{delay_ms}" if delay_ms else "") + f"/disp-{uuid.uuid4().hex[:8]}"
    plane: dict[str, Any] = ({"plane": DispatcherRun} if peer_max_poll_records is None else
                             {"plane": PeerRun, "max_poll_records": peer_max_poll_records})
    with dispatcher(node, workdir, topic, [("s1", sink.url(path))], ordered=ordered, max_in_flight=max_in_flight,
                    partitions=partitions, **plane) as run:
        # A whole drain of ``count`` events first, unmeasured, then the next ``count`` measured (steady state):
        # interpreter start, imports, the group join and the peer's JIT compilation are not per-event costs, and a
        # warm-up shorter than a whole drain left the peer's JIT inside the measurement. The whole run (both
        # drains, process start included) is reported beside it.
        cpu_start = run.cpu()
        sink.wait_for(path, 1, 120)
        seen0 = sink.wait_for(path, count, 300)
        began, cpu0 = time.monotonic(), run.cpu()
        whole = sink.wait([path], 2 * count, float(os.environ.get("BENCH_WAIT", "300")))[path]
        cpu_end = run.cpu()
        # The backlog may hold more than ``2 * count``: the events delivered by the last arrival seen.
        seen, _, last = sink.stats()[path]  # last: the subscriber's time of that arrival (one monotonic clock)
        done = int(seen) - seen0
        ids = sink.ids(path)
        out = {"rate": done / max(1e-9, last - began), "rate_whole_run": whole,
               "cpu_us_per_event": (cpu_end - cpu0) / max(1, done) * 1e6,
               "cpu_us_per_event_whole_run": (cpu_end - cpu_start) / max(1, int(seen)) * 1e6,
               "rss_mib": run.rss() / 2**20,
               "events": 2 * count, "unique_ids": ids["unique"], "duplicates": ids["duplicates"],
               # every delivered event distinct, none missing up to ``2 * count`` (the backlog may hold more)
               "exactly_once": ids["duplicates"] == 0 and ids["unique"] >= 2 * count,
               "load_average": [round(x, 2) for x in os.getloadavg()]}
        if delay_ms:
            out.update({f"service_{k}": v for k, v in sink.service(path).items() if k != "count"})
        return out


def rss_under_backlog(node: KafkaNode, workdir: Path, sink: SinkProcess, topic: str, *, subscriptions: int,
                      partitions: int, seconds: float) -> dict[str, Any]:
    subs = [(f"s{i}", sink.url(f"/rss-{uuid.uuid4().hex[:6]}-{i}")) for i in range(subscriptions)]
    samples: list[tuple[float, float]] = []
    with dispatcher(node, workdir, topic, subs, ordered=True, max_in_flight=64, partitions=partitions) as run:
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            samples.append((time.monotonic() - began, run.rss() / 2**20))
            time.sleep(0.5)
        stats = sink.stats()
        delivered = sum(stats.get(uri.split(str(sink.port), 1)[1], [0])[0] for _, uri in subs)
    rss = [r for _, r in samples if r > 0]
    return {"samples": samples, "peak_mib": max(rss), "median_mib": median(rss[len(rss) // 2:]),
            "delivered_during_sampling": delivered}


# -- main ---------------------------------------------------------------------------------------------------
#: the peer's runs: key → (ordered, max.poll.records, subscriber delay ms, events or None for the rate runs' count)
PEER_RUNS: dict[str, tuple[bool, int, int, int | None]] = {
    "peer_unordered": (False, 50, 0, None),
    "peer_unordered_500": (False, 500, 0, None),
    "peer_ordered": (True, 50, 0, None),
    "peer_ordered_500": (True, 500, 0, None),
}


def peer_count(count: int | None, ordered: bool, polls: int, args: argparse.Namespace) -> int:
    """Events for a peer run: the same backlog as our run of the same order (``--count``, ``--ordered-count``);
    its ordered consumer polls every 200 ms, so at most ``polls`` × 5 events/s, which ``--ordered-count`` keeps
    affordable for both."""
    if count is not None:
        return count
    return int(args.ordered_count if ordered else args.count)


def ordered_against_peer(node: KafkaNode, workdir: Path, sink: SinkProcess, topic: str, *, args: argparse.Namespace,
                         partitions: int) -> dict[str, Any]:
    """Ours ordered and the peer ordered at ``max.poll.records`` 500 on the same backlog, ``--repeats`` rounds,
    the order alternated: rate and CPU per event over the measured drain and the whole run, medians."""
    produce(node, topic, 0, 2 * args.ordered_count, args.size)
    runs: dict[str, list[dict[str, Any]]] = {"dispatcher_ordered": [], "peer_ordered_500": []}
    for rep in range(args.repeats):
        for key in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            out = dispatcher_rate(node, workdir, sink, topic, args.ordered_count, ordered=True,
                                  max_in_flight=args.in_flight, partitions=partitions,
                                  peer_max_poll_records=500 if key.startswith("peer") else None)
            runs[key].append(out)
            print(f"  {key}: {out['rate']:.0f}/s, {out['cpu_us_per_event']:.0f} CPU µs/event "
                  f"(whole run {out['cpu_us_per_event_whole_run']:.0f}), exactly once {out['exactly_once']}, "
                  f"load {out['load_average'][0]}", flush=True)
    fields = ("rate", "cpu_us_per_event", "rate_whole_run", "cpu_us_per_event_whole_run", "rss_mib")
    med = {k: {f: median([r[f] for r in v]) for f in fields} for k, v in runs.items()}
    ours, theirs = med["dispatcher_ordered"], med["peer_ordered_500"]
    result = {"runs": runs, "medians": med,
              "exactly_once": all(r["exactly_once"] for v in runs.values() for r in v),
              "vs_peer_500": {f: ours[f] / theirs[f] for f in fields}}
    print(json.dumps(result["vs_peer_500"], indent=2), flush=True)
    return result


def plot_ordered(result: dict[str, Any], name: str) -> None:
    fig, axes = new_figure(ncols=2, width=4.5)
    sides = list(result["runs"])
    for ax, (field, title) in zip(axes[0], (("cpu_us_per_event", "CPU µs per event"), ("rate", "events/s")),
                                  strict=True):
        width = 0.4
        for j, (key, label) in enumerate(((field, "measured drain"), (f"{field}_whole_run" if field != "rate"
                                                                        else "rate_whole_run", "whole run"))):
            xs = [i + j * width for i in range(len(sides))]
            ax.bar(xs, [result["medians"][s][key] for s in sides], width, label=label,
                   color=["#4878a8", "#9ab8d8"][j])
            for x, side in zip(xs, sides, strict=True):
                vals = [r[key] for r in result["runs"][side]]
                ax.scatter([x] * len(vals), vals, color="black", s=8, zorder=3)
        ax.set_xticks([i + width / 2 for i in range(len(sides))], ["ours, ordered", "Java peer, ordered (500)"])
        ax.set_title(f"ordered drain, {result['settings']['ordered_count']:,} events: {title}\n"
                     "(medians; dots: runs)", fontsize=9)
        ax.legend(fontsize=7)
    save_png(fig, name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=40000,
                        help="events for the instant-subscriber runs (8000 took under a second for the bare client)")
    parser.add_argument("--ordered-count", type=int, default=10000,
                        help="events for the ordered instant-subscriber runs, ours and the peer's alike")
    parser.add_argument("--skip-rss", action="store_true", help="skip the RSS-under-backlog runs")
    parser.add_argument("--size", type=int, default=512, help="event data bytes for the rate runs")
    parser.add_argument("--in-flight", type=int, default=64, help="max in flight (unordered) and bare concurrency")
    parser.add_argument("--slow-in-flight", type=int, default=4,
                        help="max in flight for the 10 ms subscriber (= partitions: both ideals are 400/s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backlogs", default="20000,250000,1000000", help="10 KB-event backlogs for the RSS runs")
    parser.add_argument("--rss-seconds", type=float, default=40.0)
    parser.add_argument("--dispatcher-env", action="append", default=[], metavar="K=V",
                        help="extra environment for the dispatcher processes (e.g. KE_QUEUED_MAX_MESSAGES_KBYTES=1024)")
    parser.add_argument("--rss-only", action="store_true", help="skip the rate runs (for tuning memory)")
    parser.add_argument("--ordered-only", action="store_true",
                        help="only ours ordered against the peer ordered (max.poll.records 500), --ordered-count "
                             "events each, alternated; writes docs/benchmarks/dispatcher-ordered.json")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    DISPATCHER_ENV.update(item.split("=", 1) for item in args.dispatcher_env)

    workdir = ROOT / ".cache" / "bench-dispatcher"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    partitions = 4
    facts = machine_facts(["confluent-kafka", "aiohttp", "uvloop", "tenacity", "cloudevents"],
                          kafka=KAFKA_VERSION,
                          event_bytes=args.size, partitions=partitions)
    peer_missing = peer.peer_available()
    if peer_missing:
        print(f"Java peer not measured: {peer_missing}", flush=True)
    else:
        facts["peer"] = peer.build_info()
    result: dict[str, Any] = {"machine": facts, "settings": vars(args), "peer_missing": peer_missing}
    node = KafkaNode(workdir / "kafka", heap="1g")
    node.start()
    sink = SinkProcess()
    try:
        topic = "bench.rates"
        create_topic(node, topic, partitions)
        if args.ordered_only:
            if peer_missing:
                raise SystemExit(f"--ordered-only: {peer_missing}")
            result.update(ordered_against_peer(node, workdir, sink, topic, args=args, partitions=partitions))
            result["machine"]["load_average_at_end"] = list(os.getloadavg())
            write_json(f"{NAME}-ordered", result)
            plot_ordered(result, f"{NAME}-ordered")
            return 0
        if args.rss_only:
            args.count, args.repeats = 0, 0
        slow_count = max(args.slow_in_flight * 100 * 5, 2000)
        # Every dispatcher run drains its ``count`` twice over (a warm-up drain, then the measured one).
        total = 2 * max(args.count, args.ordered_count, slow_count)
        produce(node, topic, 0, total if args.count else 0, args.size)
        print(f"produced {total} events of {args.size} B into {topic} ({partitions} partitions)", flush=True)

        runs: dict[str, list[float]] = {k: [] for k in (
            "raw_consumer", "bare_http", "bare_http_uvloop", "bare_http_pooled", "bare_http_10ms",
            "dispatcher_unordered", "dispatcher_ordered", "dispatcher_unordered_10ms", "dispatcher_ordered_10ms",
            *(PEER_RUNS if peer_missing is None else ()))}
        details: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
        for rep in range(args.repeats):
            runs["raw_consumer"].append(raw_consumer_rate(node, topic, args.count))
            for key, out in (
                    ("bare_http", bare_http_rate(sink, args.count, args.in_flight, args.size)),
                    ("bare_http_uvloop", bare_http_rate(sink, args.count, args.in_flight, args.size,
                                                        loop="uvloop")),
                    ("bare_http_pooled", bare_http_rate(sink, args.count, args.in_flight, args.size,
                                                        loop="pooled")),
                    ("bare_http_10ms", bare_http_rate(sink, slow_count, args.slow_in_flight, args.size, 10))):
                runs[key].append(out["rate"])
                details[key].append(out)
            # Ours and the peer's dispatcher runs, each on a fresh process and consumer group, ours first on even
            # rounds and the peer first on odd ones: neither always runs on the colder (or quieter) machine.
            jobs: list[tuple[str, dict[str, Any]]] = [
                (key, {"count": count, "ordered": ordered, "max_in_flight": inflight, "delay_ms": delay})
                for key, ordered, inflight, delay, count in (
                    ("dispatcher_unordered", False, args.in_flight, 0, args.count),
                    ("dispatcher_ordered", True, args.in_flight, 0, args.ordered_count),
                    ("dispatcher_unordered_10ms", False, args.slow_in_flight, 10, slow_count),
                    ("dispatcher_ordered_10ms", True, args.slow_in_flight, 10, 2000))]
            jobs += [(key, {"count": peer_count(count, ordered, polls, args), "ordered": ordered,
                            "max_in_flight": args.in_flight, "delay_ms": delay, "peer_max_poll_records": polls})
                     for key, (ordered, polls, delay, count) in (PEER_RUNS if peer_missing is None else {}).items()]
            for key, job in (jobs if rep % 2 == 0 else jobs[::-1]):
                out = dispatcher_rate(node, workdir, sink, topic, job.pop("count"), partitions=partitions, **job)
                if not out["exactly_once"]:
                    print(f"  {key}: NOT exactly once: {out['unique_ids']} ids of {out['events']}, "
                          f"{out['duplicates']} duplicates", flush=True)
                runs[key].append(out["rate"])
                details[key].append(out)
            print(f"repeat {rep + 1}: " + ", ".join(f"{k}={v[-1]:.0f}/s" for k, v in runs.items()), flush=True)
            print("  CPU µs/event: " + ", ".join(f"{k}={v[-1]['cpu_us_per_event']:.0f}" for k, v in details.items()
                                                 if v and "cpu_us_per_event" in v[-1]), flush=True)

        med = {k: median(v) if v else float("nan") for k, v in runs.items()}
        ideal_unordered = args.slow_in_flight / 0.010
        ideal_ordered = partitions / 0.010
        result["rates"] = {k: {"runs": v, "median": med[k]} for k, v in runs.items()}

        def med_of(key: str, field: str) -> float:
            return median([d[field] for d in details[key] if field in d])

        cpu_med = {k: med_of(k, "cpu_us_per_event") for k, v in details.items() if v and "cpu_us_per_event" in v[0]}
        # Process CPU per event over the delivery window; comparable on a busy machine where rates are not.
        result["cpu_us_per_event_median"] = cpu_med
        result["cpu_us_per_event_runs"] = {k: [d["cpu_us_per_event"] for d in details[k]] for k in cpu_med}
        whole_med = {k: med_of(k, "cpu_us_per_event_whole_run") for k, v in details.items()
                     if v and "cpu_us_per_event_whole_run" in v[0]}
        rate_whole_med = {k: med_of(k, "rate_whole_run") for k in whole_med}
        result["whole_run_medians"] = {"cpu_us_per_event": whole_med, "rate": rate_whole_med}
        nan = float("nan")
        result["efficiency"] = {  # dispatcher CPU per event ÷ the bare client's (1.0 = no overhead at all)
            "dispatcher_unordered_cpu_vs_bare_http":
                cpu_med.get("dispatcher_unordered", nan) / cpu_med.get("bare_http", nan),
            "dispatcher_unordered_cpu_vs_bare_http_uvloop":
                cpu_med.get("dispatcher_unordered", nan) / cpu_med.get("bare_http_uvloop", nan),
            "dispatcher_unordered_cpu_vs_bare_http_pooled":
                cpu_med.get("dispatcher_unordered", nan) / cpu_med.get("bare_http_pooled", nan),
            "dispatcher_ordered_cpu_vs_bare_http":
                cpu_med.get("dispatcher_ordered", nan) / cpu_med.get("bare_http", nan),
        }
        if peer_missing is None:  # ours over the peer's: the dispatcher's targets are set in these ratios
            rss_med = {k: med_of(k, "rss_mib") for k in ("dispatcher_unordered", "peer_unordered_500")}
            result["vs_peer"] = {
                "unordered_rate_vs_peer_500": med["dispatcher_unordered"] / med["peer_unordered_500"],
                "unordered_rate_vs_peer_default": med["dispatcher_unordered"] / med["peer_unordered"],
                "unordered_cpu_vs_peer_500": cpu_med["dispatcher_unordered"] / cpu_med["peer_unordered_500"],
                "unordered_cpu_vs_peer_default": cpu_med["dispatcher_unordered"] / cpu_med["peer_unordered"],
                "ordered_rate_vs_peer_500": med["dispatcher_ordered"] / med["peer_ordered_500"],
                "ordered_cpu_vs_peer_500": cpu_med["dispatcher_ordered"] / cpu_med["peer_ordered_500"],
                "ordered_cpu_vs_peer_default": cpu_med["dispatcher_ordered"] / cpu_med["peer_ordered"],
                "unordered_rate_vs_peer_500_whole_run":
                    rate_whole_med["dispatcher_unordered"] / rate_whole_med["peer_unordered_500"],
                "unordered_cpu_vs_peer_500_whole_run":
                    whole_med["dispatcher_unordered"] / whole_med["peer_unordered_500"],
                "ordered_rate_vs_peer_500_whole_run":
                    rate_whole_med["dispatcher_ordered"] / rate_whole_med["peer_ordered_500"],
                "ordered_cpu_vs_peer_500_whole_run": whole_med["dispatcher_ordered"] / whole_med["peer_ordered_500"],
                "rss_draining_vs_peer_500": rss_med["dispatcher_unordered"] / rss_med["peer_unordered_500"],
                "rss_draining_mib": rss_med,
            }
        # The 10 ms subscriber: its own service time (request complete → answer) and what the bare client saw.
        result["slow_subscriber"] = {
            "configured_ms": 10.0,
            **{f"{k}_service_{f}": med_of(k, f"service_{f}") for k in (
                "bare_http_10ms", "dispatcher_unordered_10ms", "dispatcher_ordered_10ms") for f in ("median_ms",
                                                                                                 "p99_ms")},
            "bare_http_10ms_rtt_median_ms": med_of("bare_http_10ms", "rtt_median_ms"),
            "bare_http_10ms_rtt_p99_ms": med_of("bare_http_10ms", "rtt_p99_ms"),
            "bare_http_rtt_median_ms": med_of("bare_http", "rtt_median_ms"),
        }
        result["ratios"] = {
            "unordered_vs_bare_http": med["dispatcher_unordered"] / med["bare_http"],
            "ordered_vs_bare_http": med["dispatcher_ordered"] / med["bare_http"],
            "unordered_vs_bare_http_uvloop": med["dispatcher_unordered"] / med["bare_http_uvloop"],
            "raw_consumer_vs_dispatcher_unordered": med["raw_consumer"] / med["dispatcher_unordered"],
            "unordered_10ms_vs_ideal": med["dispatcher_unordered_10ms"] / ideal_unordered,
            "bare_http_10ms_vs_ideal": med["bare_http_10ms"] / ideal_unordered,
            "ordered_10ms_vs_ideal": med["dispatcher_ordered_10ms"] / ideal_ordered,
            "unordered_10ms_vs_bare_http_10ms": med["dispatcher_unordered_10ms"] / med["bare_http_10ms"],
        }
        result["ideal_10ms"] = {"unordered": ideal_unordered, "ordered": ideal_ordered,
                                "from": "configured 10 ms × in-flight (unordered) or partitions (ordered)"}

        # RSS: 15 subscriptions × 4 partitions × 10 KB events, backlog growing between runs.
        rss_topic = "bench.rss"
        create_topic(node, rss_topic, partitions)
        produced, rss_runs = 0, []
        for backlog in (int(b) for b in ("" if args.skip_rss else args.backlogs).split(",") if b):
            took = produce(node, rss_topic, produced, backlog - produced, 10 * 1024)
            print(f"backlog {backlog} × 10 KB produced (+{backlog - produced} in {took:.0f}s)", flush=True)
            produced = backlog
            out = rss_under_backlog(node, workdir, sink, rss_topic, subscriptions=15, partitions=partitions,
                                    seconds=args.rss_seconds)
            out["backlog_events"] = backlog
            out["backlog_gib"] = backlog * 10 * 1024 / 2**30
            out["produce_seconds"] = took
            rss_runs.append(out)
            print(f"backlog {backlog}: RSS peak {out['peak_mib']:.0f} MiB, "
                  f"median {out['median_mib']:.0f} MiB", flush=True)
        result["rss"] = rss_runs
        result["targets"] = {
            "unordered_vs_bare_http >= 0.60": result["ratios"]["unordered_vs_bare_http"] >= 0.60,
            "unordered_10ms_vs_ideal >= 0.90": result["ratios"]["unordered_10ms_vs_ideal"] >= 0.90,
            "ordered_10ms_vs_ideal >= 0.90": result["ratios"]["ordered_10ms_vs_ideal"] >= 0.90,
            "rss_peak <= 128 MiB": all(r["peak_mib"] <= 128 for r in rss_runs) if rss_runs else None,
        }
        result["exactly_once"] = {k: all(d.get("exactly_once", True) for d in v) for k, v in details.items()}
        result["machine"]["load_average_at_end"] = list(os.getloadavg())
    finally:
        sink.stop()
        node.stop()
        shutil.rmtree(workdir / "kafka", ignore_errors=True)  # the backlog can be many GiB
    write_json(NAME, result)
    plot(result)
    print(json.dumps({k: result[k] for k in ("ratios", "targets")}, indent=2))
    print(json.dumps({k: result[k] for k in ("ratios", "targets", "vs_peer") if k in result}, indent=2))
    return 0


def _label(name: str) -> str:
    return (name.replace("dispatcher_", "disp.\n").replace("bare_http_", "bare\n").replace("raw_", "raw\n")
            .replace("_10ms", "\n10 ms"))


def plot(result: dict[str, Any]) -> None:
    fig, axes = new_figure(ncols=3, width=6.5)
    rates = result["rates"]
    names = list(rates)
    ax = axes[0][0]
    ax.bar(range(len(names)), [rates[n]["median"] for n in names], color="#4878a8")
    for i, n in enumerate(names):
        ax.scatter([i] * len(rates[n]["runs"]), rates[n]["runs"], color="black", s=8, zorder=3)
    ax.axhline(result["ideal_10ms"]["unordered"], color="#c44", ls=":", lw=1, label="10 ms ideal, unordered")
    ax.axhline(result["ideal_10ms"]["ordered"], color="#c84", ls=":", lw=1, label="10 ms ideal, ordered")
    ax.set_xticks(range(len(names)), [_label(n) for n in names], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("events/s (median of runs, dots = runs)")
    ax.set_title("Throughput, same run, same subscriber")
    ax.legend(fontsize=7)
    ax = axes[0][2]
    cpu = result.get("cpu_us_per_event_median", {})
    cpu_names = list(cpu)
    ax.bar(range(len(cpu_names)), [cpu[n] for n in cpu_names], color="#6a9f58")
    for i, n in enumerate(cpu_names):
        runs = result["cpu_us_per_event_runs"][n]
        ax.scatter([i] * len(runs), runs, color="black", s=8, zorder=3)
    ax.set_xticks(range(len(cpu_names)), [_label(n) for n in cpu_names], fontsize=7)
    ax.set_ylabel("process CPU µs per event (median, dots = runs)")
    ax.set_title("CPU per event: dispatcher vs bare aiohttp client")
    ax = axes[0][1]
    for run in result["rss"]:  # none with --skip-rss
        xs, ys = zip(*run["samples"], strict=True)
        ax.plot(xs, ys, label=f"backlog {run['backlog_events']:,} × 10 KB ({run['backlog_gib']:.1f} GiB)")
    ax.axhline(128, color="#c44", ls="--", lw=1, label="128 MiB target")
    ax.set_xlabel("seconds since dispatcher start")
    ax.set_ylabel("dispatcher RSS (MiB)")
    ax.set_title("RSS, 15 subscriptions × 4 partitions")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    save_png(fig, NAME)


if __name__ == "__main__":
    sys.exit(main())
