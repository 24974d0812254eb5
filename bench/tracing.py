"""What tracing costs per event on the two hot paths, off and on, side by side in one run.

- receiver: one binary-mode CloudEvent POST through the real ASGI app (``create_app``), called in-process with a
  minimal ASGI request, against a producer that reports delivery at the next poll (no Kafka: the cost measured is
  the app's own, where tracing adds its spans);
- dispatcher: ``Deliverer.handle`` of one consumed record, against an HTTP sender that answers 202 at once.

Variants, interleaved round by round so that machine noise hits all of them alike:
``off`` (no endpoint: the untraced classes), ``on`` (every trace sampled, spans batched to an exporter that
drops them — the SDK's work without the network), ``unsampled`` (tracing on, sample ratio 0, the sender's
``traceparent`` not sampled: only context propagation). Reported: the median over rounds of µs per event, and
each variant's ratio to ``off``.

    .venv/bin/python bench/tracing.py [--events 2000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_facts, median, new_figure, save_png, write_json

from kafka_eventing.core import tracing
from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.channels import Channel, ChannelKey, Subscriber
from kafka_eventing.core.delivery import DeliverySpec
from kafka_eventing.core.http_delivery import Attempt, HttpSender
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher.delivery import Deliverer
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.receiver.app import create_app

VARIANTS = ("off", "on", "unsampled")
CONCURRENCY = 50
#: The sender's trace context per variant: "unsampled" gets a not-sampled one (flags 00) and samples nothing new.
TRACEPARENT = {v: f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{'00' if v == 'unsampled' else '01'}"
               for v in ("off", "on", "unsampled")}


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def tracer_for(variant: str) -> tracing.Tracing | None:
    if variant == "off":
        return None
    settings = Settings(tracing_sample_ratio=1.0 if variant == "on" else 0.0)
    return tracing.setup(settings, f"bench-{variant}", exporter=DropExporter())


# -- receiver -----------------------------------------------------------------------------------------------
class InstantProducer:
    """Reports every record delivered at the next poll."""

    def __init__(self) -> None:
        self.reports: list[Callable[[Any, Any], None]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *, headers: Any = None,
                on_delivery: Callable[[Any, Any], None] | None = None, **_: Any) -> None:
        if on_delivery is not None:
            self.reports.append(on_delivery)

    def poll(self, timeout: float = -1) -> int:
        reports, self.reports = self.reports, []
        for callback in reports:
            callback(None, None)
        return len(reports)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return object()


class OneChannel:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def synced(self) -> bool:
        return True

    def get(self, key: ChannelKey) -> Channel | None:
        return self.channel if key == self.channel.key else None

    def snapshot(self) -> dict[ChannelKey, Channel]:
        return {self.channel.key: self.channel}

    def subscribe(self, callback: Callable[[dict[ChannelKey, Channel]], None]) -> None: ...


HEADERS = [(b"host", b"receiver"), (b"content-type", b"application/json"), (b"content-length", b"11"),
           (b"ce-specversion", b"1.0"), (b"ce-id", b"e-1"), (b"ce-source", b"/bench"), (b"ce-type", b"bench.event")]
BODY = b'{"hello":1}'


async def receiver_round(app: Any, events: int, variant: str) -> float:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/default/bench", "raw_path": b"/default/bench", "query_string": b"", "root_path": "",
             "headers": [*HEADERS, (b"traceparent", TRACEPARENT[variant].encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080)}
    message = {"type": "http.request", "body": BODY, "more_body": False}
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return message

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            status.append(msg["status"])

    # Concurrent requests, as a worker serves them: the wait for the delivery reports overlaps, so the time per
    # event is the app's CPU work rather than the poll interval.
    started = time.perf_counter()
    for _ in range(events // CONCURRENCY):
        await asyncio.gather(*(app(scope, receive, send) for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    events = events // CONCURRENCY * CONCURRENCY
    assert set(status) == {202}, set(status)
    return elapsed / events * 1e6


# -- dispatcher ---------------------------------------------------------------------------------------------
class InstantSender(HttpSender):
    def __init__(self) -> None:
        self.session = None  # type: ignore[assignment]
        self._timeouts = {}

    async def post(self, url: str, headers: Any, body: bytes, timeout: float | None) -> Attempt:
        return Attempt(202)


class Record:
    """The parts of a consumed message the deliverer reads."""

    def __init__(self, headers: list[tuple[str, bytes]], value: bytes) -> None:
        self._headers, self._value = headers, value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "default.bench"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 42


def deliverer_for(traces: tracing.Tracing | None) -> Deliverer:
    from prometheus_client import CollectorRegistry

    metrics = Metrics(CollectorRegistry())
    if traces is None:
        return Deliverer(InstantSender(), metrics, 600.0)
    from kafka_eventing.dispatcher.tracing import TracedDeliverer

    return TracedDeliverer(InstantSender(), metrics, 600.0, tracer=traces.tracer)


async def dispatcher_round(deliverer: Deliverer, events: int, variant: str) -> float:
    event = CloudEvent({"id": "e-1", "source": "/bench", "type": "bench.event", "specversion": "1.0",
                        "datacontenttype": "application/json"}, BODY)
    rec = event_to_kafka(event, trace={"traceparent": TRACEPARENT[variant]})
    record = Record(rec.headers, rec.value)
    subscriber = Subscriber(uid="sub", subscriber_uri="http://127.0.0.1:1/", delivery=DeliverySpec())
    labels = Labels("default", "bench", "sub")
    started = time.perf_counter()
    for _ in range(events):
        await deliverer.handle(record.headers(), record.value(), subscriber, labels, record=record)  # type: ignore[arg-type]
    return (time.perf_counter() - started) / events * 1e6


async def run(events: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    traces = {v: tracer_for(v) for v in VARIANTS}
    channel = Channel(namespace="default", name="bench", topic="default.bench")
    apps = {}
    for v in VARIANTS:
        producer = InstantProducer()
        t = traces[v]
        apps[v] = create_app(producer, OneChannel(channel), Settings(), tracer=t.tracer if t else None)  # type: ignore[arg-type]
    deliverers = {v: deliverer_for(traces[v]) for v in VARIANTS}
    samples: dict[str, dict[str, list[float]]] = {"receiver": {v: [] for v in VARIANTS},
                                                  "dispatcher": {v: [] for v in VARIANTS}}
    for v in VARIANTS:  # warm-up: caches, lazily built parts
        await receiver_round(apps[v], events // 4, v)
        await dispatcher_round(deliverers[v], events // 4, v)
    for _ in range(rounds):
        for v in VARIANTS:
            samples["receiver"][v].append(await receiver_round(apps[v], events, v))
            samples["dispatcher"][v].append(await dispatcher_round(deliverers[v], events, v))
    for t in traces.values():
        if t is not None:
            t.shutdown()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2000, help="events per round and variant")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        samples = runner.run(run(args.events, args.rounds))
    result: dict[str, Any] = {
        "what": "µs per event on the hot path, tracing off / on (all sampled, spans exported to a dropping "
                "exporter) / on but unsampled; medians over rounds, interleaved",
        "command": f"bench/tracing.py --events {args.events} --rounds {args.rounds}",
        "machine": machine_facts(["opentelemetry-sdk", "falcon", "aiohttp", "confluent-kafka"]),
    }
    fig, axes = new_figure(2)
    for i, (path, by_variant) in enumerate(samples.items()):
        off = median(by_variant["off"])
        result[path] = {v: {"median_us_per_event": round(median(s), 2),
                            "ratio_to_off": round(median(s) / off, 3),
                            "added_us_per_event": round(median(s) - off, 2),
                            "rounds_us": [round(x, 2) for x in s]} for v, s in by_variant.items()}
        ax = axes[0][i]
        ax.boxplot([by_variant[v] for v in VARIANTS], tick_labels=list(VARIANTS))
        ax.set_title(f"{path}: µs per event")
        ax.set_ylim(bottom=0)
        print(f"{path:10s} " + "  ".join(
            f"{v}={result[path][v]['median_us_per_event']:.1f}µs (x{result[path][v]['ratio_to_off']})"
            for v in VARIANTS))
    print(write_json("tracing", result))
    print(save_png(fig, "tracing"))


if __name__ == "__main__":
    main()
