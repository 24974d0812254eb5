"""A dispatcher run in-process (``InProcess``) and a recording HTTP subscriber (``Subscriber``, fixture ``http``)
with scripted answers per path; producing records and reading a group's committed offsets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.channel_source import FileChannelSource
from kafka_eventing.dispatcher import Dispatcher
from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

NS = "default"


KAFKA_EXTRA = "session.timeout.ms=6000,heartbeat.interval.ms=500"


# -- a real HTTP subscriber -------------------------------------------------------------------------
@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


Behaviour = Callable[[Received, int], "tuple[int, dict[str, str], bytes, float]"]


@dataclass
class Subscriber:
    """aiohttp server on its own thread; behaviours[path](request, attempt) → (status, headers, body, delay); a delay
    of ``math.inf`` holds the answer until the server stops."""

    port: int = field(default_factory=free_port)
    received: list[Received] = field(default_factory=list)
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    attempts: dict[tuple[str, str], int] = field(default_factory=dict)
    active: int = 0
    max_active: int = 0
    _stopping: asyncio.Event | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[Received]:
        return [r for r in list(self.received) if r.path == path]

    def ids(self, path: str) -> list[str]:
        return [r.headers.get("ce-id", "") for r in self.at(path)]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        rec = Received(request.path, dict(request.headers), body, time.monotonic())
        self.received.append(rec)
        key = (request.path, rec.headers.get("ce-id", ""))
        attempt = self.attempts[key] = self.attempts.get(key, 0) + 1
        behaviour = self.behaviours.get(request.path, lambda _r, _a: (200, {}, b"", 0.0))
        status, headers, out, delay = behaviour(rec, attempt)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if delay == math.inf and self._stopping:
                await self._stopping.wait()
            elif delay:
                await asyncio.sleep(delay)
        finally:
            self.active -= 1
        return web.Response(status=status, headers=headers, body=out)

    @contextlib.contextmanager
    def running(self) -> Iterator[Subscriber]:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        runner_box: list[web.AppRunner] = []

        async def start() -> None:
            self._stopping = asyncio.Event()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            runner_box.append(runner)
            ready.set()

        thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()),
                                  daemon=True)
        thread.start()
        assert ready.wait(10)
        try:
            yield self
        finally:
            if self._stopping:
                loop.call_soon_threadsafe(self._stopping.set)
            asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


@pytest.fixture
def http() -> Iterator[Subscriber]:
    with Subscriber().running() as sub:
        yield sub


def produce(kafka: KafkaNode, topic: str, count: int, *, partitions: int = 3, prefix: str = "e",
            data: bytes | None = None) -> list[str]:
    producer = Producer({**kafka.client_config(), "linger.ms": 5})
    ids = []
    for i in range(count):
        part = i % partitions
        event = CloudEvent({"id": f"{prefix}-{i}", "source": "/test", "type": "test.event", "specversion": "1.0",
                            "datacontenttype": "application/json", "seq": str(i // partitions)},
                           data if data is not None else json.dumps({"i": i, "p": part}).encode())
        rec = event_to_kafka(event)
        producer.produce(topic, rec.value, rec.key, partition=part, headers=rec.headers)
        ids.append(f"{prefix}-{i}")
        producer.poll(0)
    assert producer.flush(30) == 0
    return ids


def committed(kafka: KafkaNode, topic: str, group: str, partitions: int = 3) -> list[int]:
    consumer = Consumer({**kafka.client_config(), "group.id": group, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in tps]
    finally:
        consumer.close()


class InProcess:
    """A Dispatcher on its own loop in a thread; stopped by the fixture that made it."""

    def __init__(self, dispatcher: Dispatcher, source: FileChannelSource) -> None:
        self.dispatcher = dispatcher
        self.source = source
        self.thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)

    def start(self) -> InProcess:
        self.thread.start()
        wait_for(lambda: self.dispatcher.bound_port is not None and self.dispatcher._started.is_set(), 20,
                 "dispatcher start")
        return self

    def stop(self) -> None:
        self.dispatcher.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.dispatcher.bound_port}{path}", timeout=5) as resp:
            return json.loads(resp.read()) if path != "/metrics" else resp.read().decode()

    def ready(self) -> bool:
        try:
            self.get("/readyz")
            return True
        except OSError:
            return False

    def subscriber_status(self) -> dict[str, dict[str, Any]]:
        return {s["uid"]: s for s in self.get("/status")["status"]["subscribers"]}
