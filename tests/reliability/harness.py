"""The reliability suite's real parts: a load generator with a ledger, recording subscribers, the receiver and
dispatcher as real processes, and the checker that compares what was accepted with what arrived.

Everything listens on and talks to 127.0.0.1 only; every process and thread started here is stopped by the
``Rig`` that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from aiohttp import web
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.core.brokers import ANNOTATION_BROKER_CLASS
from kafka_eventing.core.channels import ANNOTATION_EXTERNAL_TOPIC, ANNOTATION_ORDER
from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
NS = "rel"
#: Group membership tuned for a test: a killed dispatcher's partitions move after 6 s, not 45 s.
GROUP_TIMING = "session.timeout.ms=6000,heartbeat.interval.ms=500"
LOOPBACK = "127.0.0.1"


def _loopback_only(url: str) -> str:
    host = urlsplit(url).hostname
    if host != LOOPBACK:
        raise ValueError(f"the reliability suite talks to {LOOPBACK} only, not {host!r}")
    return url


# -- the ledger: what the senders were told --------------------------------------------------------------------
@dataclass
class Ledger:
    """Every id a sender tried, with the answers it got; thread-safe (one sender thread per client)."""

    answers: dict[str, list[int | str]] = field(default_factory=dict)
    accepted_at: dict[str, float] = field(default_factory=dict)  # id → monotonic time of its (first) 202
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, event_id: str, outcome: int | str) -> None:
        with self._lock:
            self.answers.setdefault(event_id, []).append(outcome)
            if outcome == 202 and event_id not in self.accepted_at:
                self.accepted_at[event_id] = time.monotonic()

    def sent(self) -> set[str]:
        with self._lock:
            return set(self.answers)

    def accepted(self) -> set[str]:
        with self._lock:
            return set(self.accepted_at)

    def accepted_between(self, start: float, end: float) -> set[str]:
        with self._lock:
            return {i for i, at in self.accepted_at.items() if start <= at < end}


class LoadGenerator:
    """Senders that POST binary CloudEvents to the receiver at a fixed total rate, bounded in count and time.

    Each sender behaves as a careful client: an event answered 503/429/5xx or not answered at all (connection
    refused or reset, timeout) is sent again with the same id, after ``Retry-After`` (capped), until it gets a
    202 or ``retry_window`` seconds pass. So at-least-once from the client to the last subscriber is what is
    measured, and an event the receiver refused for good (4xx) is recorded as such.
    """

    def __init__(self, url: str, ledger: Ledger, *, rate: float, senders: int = 4, duration: float = 20.0,
                 count: int = 100_000, prefix: str = "ev", retry_window: float = 90.0,
                 make_id: Callable[[str, int, int], str] | None = None) -> None:
        self.url = _loopback_only(url)
        self.ledger = ledger
        self.rate, self.senders, self.duration, self.count = rate, senders, duration, count
        self.prefix = prefix
        self.retry_window = retry_window
        self.make_id = make_id or (lambda prefix, sender, seq: f"{prefix}-{sender}-{seq}")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._issued = itertools.count()
        self.started_at = 0.0
        self.abandoned: list[str] = []

    def start(self) -> LoadGenerator:
        self.started_at = time.monotonic()
        for n in range(self.senders):
            thread = threading.Thread(target=self._sender, args=(n,), name=f"sender-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def stop(self) -> None:
        """No new ids; ids under way keep being retried (bounded by ``retry_window``) before the senders end."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.retry_window + 30)
            assert not thread.is_alive(), f"{thread.name} did not finish"

    def wait(self) -> None:
        """Until the duration or the count is used up, then stop."""
        for thread in self._threads:
            thread.join(self.duration + self.retry_window + 30)
        self.stop()

    def wait_accepted(self, count: int, timeout: float = 60.0) -> None:
        wait_for(lambda: len(self.ledger.accepted()) >= count, timeout, f"{count} events answered 202",
                 interval=0.05)

    def _sender(self, n: int) -> None:
        interval = self.senders / self.rate
        headers = {"ce-specversion": "1.0", "ce-source": "/reliability", "ce-type": "reliability.event",
                   "content-type": "application/json"}
        with httpx.Client(timeout=15.0) as client:
            for seq in itertools.count():
                if self._stop.is_set() or next(self._issued) >= self.count:
                    return
                due = self.started_at + seq * interval
                now = time.monotonic()
                if now - self.started_at >= self.duration:
                    return
                if due > now and self._stop.wait(due - now):
                    return
                event_id = self.make_id(self.prefix, n, seq)
                body = json.dumps({"id": event_id, "sender": n, "seq": seq}).encode()
                self._send(client, event_id, {**headers, "ce-id": event_id}, body)

    def _send(self, client: httpx.Client, event_id: str, headers: dict[str, str], body: bytes) -> None:
        first = time.monotonic()
        while True:
            delay = 0.2
            try:
                res = client.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                self.ledger.answer(event_id, type(exc).__name__)
            else:
                self.ledger.answer(event_id, res.status_code)
                if res.status_code < 500 and res.status_code != 429:
                    return  # 202, or a final refusal
                with contextlib.suppress(ValueError):
                    delay = float(res.headers.get("Retry-After", delay))
            if time.monotonic() - first > self.retry_window:
                self.abandoned.append(event_id)
                return
            time.sleep(min(delay, 0.5))


# -- subscribers that record every id ---------------------------------------------------------------------------
Answer = Callable[[str, int], int]  # (event id, attempt number for this id on this path) → status


@dataclass
class Route:
    """How a path answers: ``answer``'s status after ``delay`` s, plus up to ``jitter`` s more (uniform)."""

    answer: Answer = field(default=lambda _id, _attempt: 200)
    delay: float = 0.0
    jitter: float = 0.0


@dataclass
class Receipt:
    event_id: str
    status: int
    at: float


class Recorder:
    """An aiohttp server on 127.0.0.1 in its own thread; every request is recorded per path with the status it got.

    ``stop()`` and ``start()`` again on the same port make the endpoint really go away (connection refused).
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.routes: dict[str, Route] = {}
        self.receipts: dict[str, list[Receipt]] = {}
        self._attempts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def url(self, path: str) -> str:
        return f"http://{LOOPBACK}:{self.port}{path}"

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        event_id = request.headers.get("ce-id", "")
        with self._lock:
            key = (request.path, event_id)
            attempt = self._attempts[key] = self._attempts.get(key, 0) + 1
        route = self.routes.get(request.path, Route())
        status = route.answer(event_id, attempt)
        if route.delay or route.jitter:
            await asyncio.sleep(route.delay + random.uniform(0.0, route.jitter))
        with self._lock:
            self.receipts.setdefault(request.path, []).append(Receipt(event_id, status, time.monotonic()))
        return web.Response(status=status)

    def start(self) -> Recorder:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, LOOPBACK, self.port, reuse_address=True).start()
            ready.set()

        def run() -> None:
            loop.run_until_complete(serve())
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"recorder-{self.port}", daemon=True)
        self._thread.start()
        assert ready.wait(15), "recorder did not start"
        return self

    def stop(self) -> None:
        loop, runner, thread = self._loop, self._runner, self._thread
        if loop is None or runner is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)
        loop.close()
        self._loop = self._runner = self._thread = None

    def at(self, path: str) -> list[Receipt]:
        with self._lock:
            return list(self.receipts.get(path, ()))

    def delivered(self, path: str) -> list[Receipt]:
        """Receipts this subscriber acknowledged (2xx): the event counts as delivered."""
        return [r for r in self.at(path) if 200 <= r.status < 300]

    def attempts(self, path: str, event_id: str) -> int:
        with self._lock:
            return self._attempts.get((path, event_id), 0)


# -- the checker -----------------------------------------------------------------------------------------------
@dataclass
class Tally:
    """One subscription's outcome against the ledger."""

    sent: int
    accepted: int
    delivered: int  # distinct accepted ids acknowledged at least once
    duplicates: int  # acknowledgements beyond the first per id
    lost: int  # accepted, never acknowledged
    unaccepted_delivered: int  # acknowledged, though no sender ever got a 202 for it
    dead_lettered: int = 0
    lost_ids: list[str] = field(default_factory=list)
    unaccepted_ids: list[str] = field(default_factory=list)

    @property
    def duplicate_ratio(self) -> float:
        total = self.delivered + self.duplicates
        return self.duplicates / total if total else 0.0


def check(ledger: Ledger, delivered: list[Receipt], dead_lettered: list[Receipt] | None = None) -> Tally:
    """Compare the ledger with what one subscription acknowledged (and, if given, what its sink took)."""
    accepted = ledger.accepted()
    counts: dict[str, int] = {}
    for receipt in delivered:
        counts[receipt.event_id] = counts.get(receipt.event_id, 0) + 1
    dls = {r.event_id for r in dead_lettered or ()}
    reached = set(counts) | dls
    lost = sorted(accepted - reached)
    unaccepted = sorted(reached - accepted)
    return Tally(sent=len(ledger.sent()), accepted=len(accepted), delivered=len(set(counts) & accepted),
                 duplicates=sum(c - 1 for c in counts.values()), lost=len(lost),
                 unaccepted_delivered=len(unaccepted), dead_lettered=len(dls), lost_ids=lost[:20],
                 unaccepted_ids=unaccepted[:20])


# -- the channel ------------------------------------------------------------------------------------------------
def subscription(uid: str, uri: str, *, ordered: bool = True, delivery: dict[str, Any] | None = None,
                 generation: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {"uid": uid, "generation": generation, "subscriberUri": _loopback_only(uri),
                           "deliveryOrder": "ordered" if ordered else "unordered"}
    if delivery:
        doc["delivery"] = delivery
    return doc


def write_channel(path: Path, name: str, topic: str, partitions: int, subscribers: list[dict[str, Any]]) -> None:
    """The standalone KafkaChannel both the receiver and the dispatchers read (written atomically)."""
    doc = {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
           "metadata": {"name": name, "namespace": NS,
                        "annotations": {ANNOTATION_EXTERNAL_TOPIC: topic, ANNOTATION_ORDER: "ordered"}},
           "spec": {"numPartitions": partitions, "subscribers": subscribers}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)


def trigger(name: str, uri: str, *, ordered: bool = True, delivery: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Broker's Trigger as the standalone file holds it (the subscriber's URI in ``spec.subscriber.uri``)."""
    spec: dict[str, Any] = {"subscriber": {"uri": _loopback_only(uri)}}
    if delivery:
        spec["delivery"] = delivery
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
            "metadata": {"name": name, "namespace": NS, "generation": 1,
                         "annotations": {ANNOTATION_ORDER: "ordered" if ordered else "unordered"}},
            "spec": spec}


def write_broker(path: Path, name: str, topic: str, triggers: list[dict[str, Any]]) -> None:
    """The standalone Broker and its Triggers that the receiver and the dispatchers read (written atomically)."""
    docs: list[dict[str, Any]] = [{
        "apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
        "metadata": {"name": name, "namespace": NS, "annotations": {
            ANNOTATION_BROKER_CLASS: "Kafka", ANNOTATION_EXTERNAL_TOPIC: topic}}, "spec": {}}]
    docs += [{**t, "spec": {**t["spec"], "broker": name}} for t in triggers]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(docs))
    tmp.replace(path)


# -- the real processes -----------------------------------------------------------------------------------------
def _role_env(extra: dict[str, str]) -> dict[str, str]:
    # KE_* of the calling shell would reach the role and change it; only the tool cache passes.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
    env.update({"KE_LOG_FORMAT": "console", "KE_LOG_LEVEL": "INFO", **extra})
    return env


def _children(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it holds no socket any more.
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


class ReceiverProcess:
    """gunicorn with uvicorn workers, as the receiver runs in its pod; restartable on the same port."""

    def __init__(self, kafka: KafkaNode, channels: Path, logdir: Path, *, workers: int = 2,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.channels, self.logdir, self.workers = channels, logdir, workers
        self.env = _role_env({"KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels),
                              "KE_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "KE_PRODUCE_TIMEOUT_SECONDS": "5",
                              **(env or {})})
        self.log = logdir / f"receiver-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> ReceiverProcess:
        self.starts += 1
        metrics = self.logdir / f"prom-{self.port}-{self.starts}"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kafka_eventing.receiver", "--bind", f"{LOOPBACK}:{self.port}",
                 "--workers", str(self.workers), "--graceful-timeout", "15"],
                env={**self.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}, cwd=REPO, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            return httpx.get(self.url + "/readyz", timeout=5).status_code == 200

        wait_for(ready, timeout, "receiver ready", interval=0.1, tolerate=(httpx.HTTPError,))
        wait_for(lambda: len(self.worker_pids()) == self.workers, timeout, "receiver workers up")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no log)"

    @property
    def master(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> set[int]:
        return _children(self.master)

    def kill_worker(self) -> int:
        """SIGKILL one worker; the master starts a replacement."""
        pid = min(self.worker_pids())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: pid not in self.worker_pids() and len(self.worker_pids()) == self.workers, 60,
                 "worker replaced")
        return pid

    def kill_pod(self) -> int:
        """SIGKILL the gunicorn master, then what the container runtime does when PID 1 dies: SIGKILL the rest."""
        assert self.proc is not None
        workers = self.worker_pids()
        os.kill(self.master, signal.SIGKILL)
        code = self.proc.wait(10)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(_alive(p) for p in workers), 30, "the pod's processes gone")
        return code

    def sigterm(self, timeout: float = 60.0) -> int:
        """SIGTERM the master (graceful: in-flight requests are answered) and wait for it to exit."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # a worker orphaned by a killed master


class DispatcherProcess:
    """``python -m kafka_eventing.dispatcher`` for the channel (or the Broker), in its own process group."""

    def __init__(self, kafka: KafkaNode, name: str, channels: Path, logdir: Path,
                 kafka_extra: str = "", *, broker: bool = False, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = logdir / f"dispatcher-{self.port}.log"
        kind = "BROKER" if broker else "CHANNEL"
        env = _role_env({"KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels),
                         f"KE_{kind}_NAMESPACE": NS, f"KE_{kind}_NAME": name,
                         "KE_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                         "KE_KAFKA_EXTRA": ",".join(filter(None, (GROUP_TIMING, kafka_extra))),
                         "KE_METRICS_PORT": str(self.port), **(env or {})})
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", LOOPBACK],
                                         env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def get(self, path: str) -> Any:
        with httpx.Client(timeout=5) as client:
            res = client.get(f"http://{LOOPBACK}:{self.port}{path}")
            return res.json() if res.status_code == 200 else None

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-4000:]
        try:
            return self.get("/readyz") is not None
        except httpx.HTTPError:
            return False

    def partitions(self) -> dict[str, set[int]]:
        """Per subscription uid, the partitions this process owns now."""
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-4000:]
        try:
            subs = (self.get("/status") or {}).get("subscriptions", {})
        except httpx.HTTPError:
            return {}  # not listening yet
        return {uid: {int(p) for p in s["partitions"]} for uid, s in subs.items()}

    def rss_bytes(self) -> int:
        """Resident memory of the dispatcher and its children, from /proc."""
        total = 0
        for pid in {self.proc.pid, *_children(self.proc.pid)}:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.kill()


# -- Kafka helpers ----------------------------------------------------------------------------------------------
def create_topic(kafka: KafkaNode, partitions: int) -> str:
    name = f"rel.{uuid.uuid4().hex[:12]}"
    admin = AdminClient(kafka.client_config())
    for fut in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        fut.result(timeout=30)
    return name


def delete_topic(kafka: KafkaNode, topic: str) -> None:
    admin = AdminClient(kafka.client_config())
    for fut in admin.delete_topics([topic], operation_timeout=10).values():
        with contextlib.suppress(Exception):
            fut.result(timeout=30)


def grow_topic(kafka: KafkaNode, topic: str, partitions: int) -> None:
    admin = AdminClient(kafka.client_config())
    for fut in admin.create_partitions([NewPartitions(topic, partitions)]).values():
        fut.result(timeout=30)


def committed(kafka: KafkaNode, topic: str, group: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({**kafka.client_config(), "group.id": group, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def topic_index(kafka: KafkaNode, topic: str, timeout: float = 60.0) -> dict[str, tuple[int, int]]:
    """Every record in the topic now: event id → (partition, offset) of its first copy."""
    consumer = Consumer({**kafka.client_config(), "group.id": f"index-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        position = dict.fromkeys(partitions, 0)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: dict[str, tuple[int, int]] = {}
        deadline = time.monotonic() + timeout
        while any(position[p] < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"{topic} not read to its end: at {position}, ends {ends}"
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            event_id = event_from_kafka(msg.headers(), msg.value()).get_id()
            out.setdefault(event_id, (msg.partition(), msg.offset()))
            position[msg.partition()] = msg.offset() + 1
        return out
    finally:
        consumer.close()
