"""Broker benchmark (`make bench-broker`): the Kafka Broker vs a channel-based broker built from this project's parts.

Both carry the same load to the same 10 Triggers (mixed filters: attributes, exact, prefix, suffix, cesql, any,
all, not, none) on one local Kafka node, side by side in one run:

- **broker**: client → receiver (``/<ns>/<broker>``, gunicorn) → Kafka → Broker dispatcher (one shared read
  fanned out to the Triggers, filters applied in the dispatcher) → subscriber;
- **channel**: client → ingress hop (a small HTTP forwarder) → receiver (``/<ns>/<channel>``) → Kafka → channel
  dispatcher (one subscription per Trigger) → filter hop (an HTTP service applying the same compiled filter and
  forwarding matches) → subscriber. This is how the channel-based MT broker is assembled upstream.

Measured per system:

1. closed loop: ``--count`` events posted with ``--concurrency`` in flight; events/s delivered (all Triggers,
   first to last delivery at the subscriber) and CPU per delivered event (user+system CPU of every eventing
   process from /proc: receiver tree, dispatcher, and for the channel the ingress and filter hops; the load
   generator and the subscriber are not counted);
2. open loop at ``--rate`` events/s for ``--seconds``: end-to-end latency p50/p99 (the send time is in the event,
   extension ``sentat``, read by the subscriber);
3. in-process: the 10 compiled filters' evaluation cost per event;
4. the dispatcher alone draining a backlog produced straight to Kafka (``drain``): CPU per delivery of the
   dispatcher process with ``--triggers`` half-matching Triggers — this tree's shared read (``fanout``) and, from
   ``--baseline-src``, one consumer group per Trigger (``per_trigger``) — beside the channel dispatcher's CPU per
   event with one subscription to the same subscriber.

The subscriber (``--serve sink``), the ingress hop (``--serve forward``) and the filter hops (``--serve filters``)
are aiohttp servers in their own processes. Every process listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from _common import (
    ROOT,
    cpu_seconds,
    machine_facts,
    median,
    new_figure,
    percentile,
    process_tree,
    pss_bytes,
    save_png,
    write_json,
)

from kafka_eventing.broker.filters import Filter, compile_trigger
from kafka_eventing.core.brokers import broker_topic
from kafka_eventing.localstack._proc import free_port, terminate
from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode

NAME = "broker"
NS = "bench"
BROKER = "default"
CHANNEL = "chan"
PARTITIONS = 4

#: The 10 Triggers' specs (as in a Trigger's ``spec``, without broker/subscriber): every dialect at least once.
TRIGGERS: list[dict[str, Any]] = [
    {"filter": {"attributes": {"type": "com.example.order.created"}}},
    {"filters": [{"prefix": {"type": "com.example.order."}}]},
    {"filters": [{"exact": {"region": "eu"}}]},
    {"filters": [{"suffix": {"type": ".created"}}]},
    {"filters": [{"cesql": "type LIKE 'com.example.order.%' AND region = 'eu'"}]},
    {"filters": [{"any": [{"exact": {"region": "eu"}}, {"prefix": {"type": "com.example.user."}}]}]},
    {"filters": [{"not": {"prefix": {"type": "com.example.order."}}}]},
    {"filters": [{"all": [{"prefix": {"type": "com.example."}}, {"exact": {"region": "us"}}]}]},
    {"filters": [{"cesql": "region IN ('eu', 'us') AND source = '/bench'"}]},
    {},  # no filter: every event
]
EVENT_KINDS = [("com.example.order.created", "eu"), ("com.example.order.shipped", "us"),
               ("com.example.user.created", "eu"), ("com.example.user.deleted", "us"),
               ("com.example.order.created", "us")]


def event_attributes(seq: int) -> dict[str, str]:
    event_type, region = EVENT_KINDS[seq % len(EVENT_KINDS)]
    return {"specversion": "1.0", "id": f"e{seq}", "source": "/bench", "type": event_type, "region": region,
            "seq": str(seq), "datacontenttype": "application/json"}


def compiled_filters() -> list[Filter]:
    return [compile_trigger(spec) for spec in TRIGGERS]


def expected_deliveries(filters: list[Filter], first: int, count: int) -> int:
    return sum(f.matches(event_attributes(seq)) for seq in range(first, first + count) for f in filters)


def headers_attributes(headers: Mapping[str, str]) -> dict[str, str]:
    """A binary-mode CloudEvent's attributes from its HTTP headers (what the filter hop filters on)."""
    out = {k[3:].lower(): v for k, v in headers.items() if k.lower().startswith("ce-")}
    if "Content-Type" in headers:
        out["datacontenttype"] = headers["Content-Type"]
    return out


# -- the helper servers (each its own process) --------------------------------------------------------------
def serve_sink(port: int) -> None:
    from aiohttp import web

    stats: dict[str, list[float]] = {}
    latencies: list[float] = []

    async def post(request: web.Request) -> web.Response:
        await request.read()
        now = time.time_ns()
        entry = stats.get(request.path)
        mono = time.monotonic()
        if entry is None:
            stats[request.path] = [1, mono, mono]
        else:
            entry[0] += 1
            entry[2] = mono
        sent = request.headers.get("ce-sentat")
        if sent:
            latencies.append((now - int(sent)) / 1e6)
        return web.Response(status=200)

    async def get(request: web.Request) -> web.Response:
        if request.path == "/reset":
            stats.clear()
            latencies.clear()
        body = {"stats": stats, "latencies_ms": latencies if request.path == "/latencies" else []}
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/{tail:.*}", post)
    app.router.add_get("/{tail:.*}", get)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _serve_hop(port: int, route: str, target_of: Any) -> None:
    """An HTTP hop: POST ``route`` in; ``target_of(request)`` says where to forward it (None: filtered out, 202)."""
    import aiohttp
    from aiohttp import web

    async def hop(request: web.Request) -> web.Response:
        body = await request.read()
        target = target_of(request)
        if target is None:
            return web.Response(status=202)
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with session.post(target, data=body, headers=headers) as resp:
            await resp.read()
            return web.Response(status=resp.status)

    async def on_startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512))

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application()
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post(route, hop)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def serve_forward(port: int, target: str) -> None:
    """The channel-based broker's ingress: one POST in, the same POST to the channel, its status back."""
    _serve_hop(port, "/{tail:.*}", lambda _request: target)


def serve_filters(port: int, sink: str) -> None:
    """The channel-based broker's filter hops: ``/t<i>`` applies Trigger i's filter and forwards a match."""
    filters = compiled_filters()

    def target_of(request: Any) -> str | None:
        index = int(request.match_info["index"])
        return f"{sink}/t{index}" if filters[index].matches(headers_attributes(request.headers)) else None

    _serve_hop(port, "/t{index:\\d+}", target_of)


# -- orchestration ------------------------------------------------------------------------------------------
class Procs:
    """The processes of one run; all stopped by ``stop()``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def pids(self, names: list[str]) -> list[int]:
        return [pid for name in names for pid in process_tree(self.procs[name].pid)]

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}); see {self.workdir / (name + '.log')}")

    def stop(self) -> None:
        for proc in self.procs.values():
            terminate(proc, timeout=20)
        self.procs.clear()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - 127.0.0.1 only
        return json.loads(resp.read())


def wait_http(url: str, procs: Procs, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        procs.check()
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - 127.0.0.1 only
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready") from None
            time.sleep(0.1)


def wait_port(port: int, procs: Procs, timeout: float) -> None:
    """Until something listens on 127.0.0.1:``port`` (the hops answer only POST, so no GET probe)."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        procs.check()
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on port {port}")
        time.sleep(0.1)


def sink_total(sink: str) -> tuple[int, float, float]:
    stats = get_json(f"{sink}/stats")["stats"]
    if not stats:
        return 0, 0.0, 0.0
    return (int(sum(v[0] for v in stats.values())), min(v[1] for v in stats.values()),
            max(v[2] for v in stats.values()))


def wait_delivered(sink: str, expected: int, procs: Procs, timeout: float) -> tuple[int, float, float]:
    deadline = time.monotonic() + timeout
    while True:
        procs.check()
        try:
            got = sink_total(sink)
        except OSError:  # the subscriber slow to answer on a loaded machine: ask again
            if time.monotonic() > deadline:
                raise
            continue
        if got[0] >= expected:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{got[0]} of {expected} deliveries")
        time.sleep(0.05)


async def post_events(url: str, first: int, count: int, *, concurrency: int = 0, rate: float = 0.0) -> int:
    """Closed loop (``concurrency`` in flight) or open loop (``rate``/s on a fixed schedule); returns non-2xx."""
    import aiohttp

    failures = 0
    body = b'{"hello": "world"}'

    async def one(session: aiohttp.ClientSession, seq: int) -> None:
        nonlocal failures
        headers = {f"ce-{k}": v for k, v in event_attributes(seq).items() if k != "datacontenttype"}
        headers["Content-Type"] = "application/json"
        headers["ce-sentat"] = str(time.time_ns())
        async with session.post(url, data=body, headers=headers) as resp:
            await resp.read()
            if resp.status >= 300:
                failures += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:
        if rate:
            start, tasks = time.monotonic(), []
            for i in range(count):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(session, first + i)))
            await asyncio.gather(*tasks)
        else:
            queue = iter(range(first, first + count))

            async def worker() -> None:
                for seq in queue:
                    await one(session, seq)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failures


def base_env(node: KafkaNode, config: Path, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
    env.update({"KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(config),
                "KE_BOOTSTRAP_SERVERS": node.bootstrap_servers, "KE_LOG_LEVEL": "WARNING",
                "KE_DISPATCHER_INITIAL_OFFSET": "earliest"})
    (workdir / "prom").mkdir(exist_ok=True)
    return env


def start_system(kind: str, node: KafkaNode, workdir: Path, procs: Procs, sink: str) -> tuple[str, list[str]]:
    """Start one system's processes; returns its ingress URL and the names of its eventing processes."""
    receiver_port, dispatcher_port = free_port(), free_port()
    hops = forward = 0
    config = workdir / f"{kind}.yaml"
    if kind == "broker":
        ingress = f"http://127.0.0.1:{receiver_port}/{NS}/{BROKER}"
        docs: list[dict[str, Any]] = [{
            "apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
            "metadata": {"name": BROKER, "namespace": NS,
                         "annotations": {"eventing.knative.dev/broker.class": "Kafka"}},
            "status": {"address": {"url": ingress}}}]
        docs += [{"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
                  "metadata": {"name": f"t{i}", "namespace": NS},
                  "spec": {"broker": BROKER, **spec, "subscriber": {"uri": f"{sink}/t{i}"}}}
                 for i, spec in enumerate(TRIGGERS)]
        extra = {"KE_BROKER_NAMESPACE": NS, "KE_BROKER_NAME": BROKER}
    else:
        hops = free_port()
        procs.start("filters", [sys.executable, __file__, "--serve", "filters", "--port", str(hops),
                                "--target", sink])
        docs = [{"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
                 "metadata": {"name": CHANNEL, "namespace": NS},
                 "spec": {"numPartitions": PARTITIONS,
                          "subscribers": [{"uid": f"t{i}", "subscriberUri": f"http://127.0.0.1:{hops}/t{i}"}
                                          for i in range(len(TRIGGERS))]}}]
        forward = free_port()
        procs.start("forward", [sys.executable, __file__, "--serve", "forward", "--port", str(forward),
                                "--target", f"http://127.0.0.1:{receiver_port}/{NS}/{CHANNEL}"])
        ingress = f"http://127.0.0.1:{forward}/"
        extra = {"KE_CHANNEL_NAMESPACE": NS, "KE_CHANNEL_NAME": CHANNEL}
    config.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    env = base_env(node, config, workdir)
    procs.start("receiver", [sys.executable, "-m", "kafka_eventing.receiver", "--bind",
                             f"127.0.0.1:{receiver_port}", "--workers", "1"],
                {**env, "PROMETHEUS_MULTIPROC_DIR": str(workdir / "prom")})
    procs.start("dispatcher", [sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                {**env, **extra, "KE_METRICS_PORT": str(dispatcher_port)})
    wait_http(f"http://127.0.0.1:{receiver_port}/readyz", procs, 90)
    wait_http(f"http://127.0.0.1:{dispatcher_port}/readyz", procs, 120)
    if kind != "broker":  # a loaded machine starts the hops late: the first post would be refused
        wait_port(hops, procs, 60)
        wait_port(forward, procs, 60)
    names = ["receiver", "dispatcher"] + ([] if kind == "broker" else ["filters", "forward"])
    return ingress, names


def measure(kind: str, node: KafkaNode, workdir: Path, sink: str, *, filters: list[Filter],
            args: argparse.Namespace, seq0: int) -> dict[str, Any]:
    procs = Procs(workdir)
    try:
        ingress, names = start_system(kind, node, workdir, procs, sink)
        # Warm-up: every Trigger's consumer has joined and delivered before anything is timed.
        get_json(f"{sink}/reset")
        warm = 50
        asyncio.run(post_events(ingress, seq0, warm, concurrency=8))
        wait_delivered(sink, expected_deliveries(filters, seq0, warm), procs, 120)
        seq = seq0 + warm
        out: dict[str, Any] = {"rate_runs": [], "cpu_us_per_delivered_runs": []}
        for _ in range(args.repeats):
            get_json(f"{sink}/reset")
            expected = expected_deliveries(filters, seq, args.count)
            cpu0 = cpu_seconds(procs.pids(names))
            failures = asyncio.run(post_events(ingress, seq, args.count, concurrency=args.concurrency))
            _, first, last = wait_delivered(sink, expected, procs, 300)
            cpu = cpu_seconds(procs.pids(names)) - cpu0
            if failures:
                raise RuntimeError(f"{kind}: {failures} posts failed")
            out["rate_runs"].append(expected / max(last - first, 1e-9))
            out["cpu_us_per_delivered_runs"].append(cpu / expected * 1e6)
            seq += args.count
            print(f"  {kind}: {out['rate_runs'][-1]:.0f} deliveries/s, "
                  f"{out['cpu_us_per_delivered_runs'][-1]:.0f} CPU µs/delivery", flush=True)
        # Open loop at a fixed rate; latency from the event's own send time.
        get_json(f"{sink}/reset")
        count = int(args.rate * args.seconds)
        expected = expected_deliveries(filters, seq, count)
        began = time.monotonic()
        failures = asyncio.run(post_events(ingress, seq, count, rate=args.rate))
        sent_for = time.monotonic() - began
        wait_delivered(sink, expected, procs, 300)
        lat = get_json(f"{sink}/latencies")["latencies_ms"]
        out["open_loop"] = {"rate": args.rate, "seconds": args.seconds, "sent_in_s": sent_for,
                            "failures": failures, "deliveries": len(lat), "p50_ms": percentile(lat, 50),
                            "p99_ms": percentile(lat, 99), "max_ms": max(lat)}
        print(f"  {kind}: open loop {args.rate:.0f}/s p50 {out['open_loop']['p50_ms']:.1f} ms, "
              f"p99 {out['open_loop']['p99_ms']:.1f} ms", flush=True)
        out["rate_median"] = median(out["rate_runs"])
        out["cpu_us_per_delivered_median"] = median(out["cpu_us_per_delivered_runs"])
        out["processes"] = names
        return out
    finally:
        procs.stop()


#: The drain runs' Triggers: every other one matches every event, the rest match none ("half matching").
HALF = [{"filters": [{"prefix": {"type": "com.example."}}]}, {"filters": [{"exact": {"type": "com.example.none"}}]}]


def drain(kind: str, triggers: int, *, node: KafkaNode, workdir: Path, sink: str, args: argparse.Namespace,
          src: Path) -> dict[str, Any]:
    """The dispatcher alone on a backlog produced straight to Kafka: CPU per delivery of the dispatcher process.

    ``fanout`` and ``per_trigger`` are a Broker with ``triggers`` half-matching Triggers (this tree's shared read,
    and the tree at ``--baseline-src`` with one consumer group per Trigger); ``peer`` the same Broker and Triggers
    on Knative's Java dispatcher; ``channel`` is the channel dispatcher with one subscription to the same
    subscriber, for its CPU per event. A first run, not measured, warms every side up alike.
    """
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"drain-{kind}-{triggers}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({**node.client_config()})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]).values():
        fut.result(timeout=30)
    config = workdir / f"drain-{kind}-{triggers}.yaml"
    if kind == "channel":
        docs: list[dict[str, Any]] = [{
            "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
            "metadata": {"name": CHANNEL, "namespace": NS, "annotations": {
                "kafka.eventing.knative.dev/external.topic": topic,
                "kafka.eventing.knative.dev/delivery.order": "unordered"}},
            "spec": {"numPartitions": PARTITIONS, "subscribers": [{"uid": "c", "subscriberUri": f"{sink}/c"}]}}]
        extra = {"KE_CHANNEL_NAMESPACE": NS, "KE_CHANNEL_NAME": CHANNEL}
        per_event = 1
    else:
        docs = [{"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                 "metadata": {"name": BROKER, "namespace": NS, "annotations": {
                     "eventing.knative.dev/broker.class": "Kafka",
                     "kafka.eventing.knative.dev/external.topic": topic}}}]
        docs += [{"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
                  "metadata": {"name": f"t{i}", "namespace": NS},
                  "spec": {"broker": BROKER, **HALF[i % 2], "subscriber": {"uri": f"{sink}/d{i}"}}}
                 for i in range(triggers)]
        extra = {"KE_BROKER_NAMESPACE": NS, "KE_BROKER_NAME": BROKER}
        per_event = (triggers + 1) // 2
    config.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    env = {**base_env(node, config, workdir), **extra, "PYTHONPATH": str(src)}
    port = free_port()
    procs = Procs(workdir)
    peer_proc = None
    count = max(200, args.drain_deliveries // per_event)
    producer = Producer({**node.client_config(), "linger.ms": 5})
    body = b'{"hello": "world"}'
    try:
        if kind == "peer":
            # Knative's Java dispatcher, given the same Broker and Triggers through its contract: one consumer group
            # per Trigger (knative-trigger-<ns>-<name>, as its control plane names them), the same filters.
            import peer

            egs = []
            for i in range(triggers):
                eg = peer.egress(f"{sink}/d{i}", group=f"knative-trigger-{NS}-t{i}", ordered=False, namespace=NS,
                                 trigger=f"t{i}")
                flt = HALF[i % 2]["filters"][0]
                eg["dialectedFilter"] = [{dialect: {"attributes": attrs}} for dialect, attrs in flt.items()]
                egs.append(eg)
            peer_proc = peer.start_peer_dispatcher(node.bootstrap_servers, topic, f"{sink}/d0", workdir,
                                                   ordered=False, group=f"knative-trigger-{NS}-t0", namespace=NS,
                                                   name=BROKER, egresses=egs, timeout=300)
            pids = process_tree(peer_proc.pid)
        else:
            procs.start(f"drain-{kind}", [sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                        {**env, "KE_METRICS_PORT": str(port)})
            wait_http(f"http://127.0.0.1:{port}/readyz", procs, 180)
            pids = procs.pids([f"drain-{kind}"])
        out: dict[str, Any] = {"events_per_run": count, "deliveries_per_event": per_event,
                               "cpu_us_per_delivery_runs": [], "rate_runs": [], "pss_mib_runs": []}
        seq = 0
        for run in range(args.repeats + 1):  # the first, unmeasured, warms up every side alike (the peer's JIT)
            get_json(f"{sink}/reset")
            cpu0 = cpu_seconds(pids)
            for _i in range(count):
                attrs = event_attributes(seq)
                headers = [(f"ce_{k}", v.encode()) for k, v in attrs.items() if k != "datacontenttype"]
                headers.append(("content-type", b"application/json"))
                producer.produce(topic, body, str(seq).encode(), headers=headers)
                producer.poll(0)
                seq += 1
            producer.flush(30)
            _, first, last = wait_delivered(sink, count * per_event, procs, 900)
            cpu = cpu_seconds(pids) - cpu0
            if run == 0:
                continue
            out["cpu_us_per_delivery_runs"].append(cpu / (count * per_event) * 1e6)
            out["rate_runs"].append(count * per_event / max(last - first, 1e-9))
            out["pss_mib_runs"].append(pss_bytes(pids) / 2**20)
            print(f"  drain {kind} x{triggers}: {out['cpu_us_per_delivery_runs'][-1]:.1f} CPU µs/delivery, "
                  f"{out['rate_runs'][-1]:.0f} deliveries/s, PSS {out['pss_mib_runs'][-1]:.0f} MiB", flush=True)
        for key in ("cpu_us_per_delivery", "rate", "pss_mib"):
            out[f"{key}_median"] = median(out[f"{key}_runs"])
        return out
    finally:
        procs.stop()
        if peer_proc is not None:
            import peer

            peer.stop(peer_proc)
        for fut in admin.delete_topics([topic], operation_timeout=10).values():
            with contextlib.suppress(Exception):  # cleanup of a throwaway topic
                fut.result(timeout=30)


def filter_cost(filters: list[Filter], events: int = 2000, repeats: int = 5) -> dict[str, float]:
    """In-process: all 10 compiled filters on one event, per event (µs); median of ``repeats``."""
    batch = [event_attributes(i) for i in range(events)]
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        for event in batch:
            for f in filters:
                f.matches(event)
        runs.append((time.perf_counter() - began) / events * 1e6)
    return {"us_per_event_all_10_triggers": median(runs), "us_per_filter": median(runs) / len(filters),
            "runs": runs}  # type: ignore[dict-item]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=("sink", "forward", "filters"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=3000, help="events per closed-loop run")
    parser.add_argument("--concurrency", type=int, default=32, help="posts in flight in the closed loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0,
                        help="open-loop events/s (each fans out to ~5.8 deliveries; 1000/s is beyond 2 shared cores)")
    parser.add_argument("--seconds", type=float, default=10.0, help="open-loop duration")
    parser.add_argument("--triggers", default="10,100", help="Trigger counts of the dispatcher-only drain runs")
    parser.add_argument("--drain-deliveries", type=int, default=20000, help="deliveries per drain run")
    parser.add_argument("--baseline-src", type=Path, default=ROOT.parent.parent / "main" / "src",
                        help="a tree whose Broker dispatcher runs one consumer group per Trigger (per_trigger)")
    parser.add_argument("--skip-e2e", action="store_true", help="only the dispatcher-only drain runs")
    parser.add_argument("--peer", action="store_true",
                        help="also drain with Knative's Java Broker dispatcher (make peer builds it)")
    args = parser.parse_args()
    if args.serve == "sink":
        serve_sink(args.port)
        return 0
    if args.serve == "forward":
        serve_forward(args.port, args.target)
        return 0
    if args.serve == "filters":
        serve_filters(args.port, args.target)
        return 0

    workdir = ROOT / ".cache" / "bench-broker"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    filters = compiled_filters()
    facts = machine_facts(["confluent-kafka", "aiohttp", "uvloop", "gunicorn", "falcon", "cloudevents"],
                          kafka=KAFKA_VERSION, partitions=PARTITIONS, triggers=len(TRIGGERS))
    result: dict[str, Any] = {"machine": facts, "settings": {k: v for k, v in vars(args).items()
                                                             if k not in ("serve", "port", "target")},
                              "triggers": TRIGGERS,
                              "match_fraction": expected_deliveries(filters, 0, 1000) / 1000 / len(TRIGGERS)}
    result["filter_cost"] = filter_cost(filters)
    node = KafkaNode(workdir / "kafka", heap="768m")
    sink_procs = Procs(workdir)
    sink_port = free_port()
    sink = f"http://127.0.0.1:{sink_port}"
    try:
        node.start()
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        config: dict[str, str | int | float | bool] = {**node.client_config()}
        admin = AdminClient(config)
        for topic in (broker_topic(NS, BROKER), f"{NS}.{CHANNEL}"):
            for fut in admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS,
                                                     replication_factor=1)]).values():
                fut.result(timeout=30)
        sink_procs.start("sink", [sys.executable, __file__, "--serve", "sink", "--port", str(sink_port)])
        wait_http(f"{sink}/stats", sink_procs, 30)
        result["drain"] = {}
        for n in (int(x) for x in args.triggers.split(",")):
            runs = result["drain"][str(n)] = {}
            runs["fanout"] = drain("fanout", n, node=node, workdir=workdir, sink=sink, args=args,
                                    src=ROOT / "src")
            if args.baseline_src.is_dir():
                runs["per_trigger"] = drain("per_trigger", n, node=node, workdir=workdir, sink=sink,
                                             args=args, src=args.baseline_src)
            if args.peer:
                runs["peer"] = drain("peer", n, node=node, workdir=workdir, sink=sink, args=args, src=ROOT / "src")
        result["drain"]["channel_1_subscriber"] = drain("channel", 1, node=node, workdir=workdir,
                                                              sink=sink, args=args, src=ROOT / "src")
        if not args.skip_e2e:
            result["broker"] = measure("broker", node, workdir, sink, filters=filters, args=args, seq0=0)
            result["channel"] = measure("channel", node, workdir, sink, filters=filters, args=args,
                                        seq0=1_000_000)
    finally:
        sink_procs.stop()
        node.stop()
        shutil.rmtree(workdir / "kafka", ignore_errors=True)
    channel_cpu = result["drain"]["channel_1_subscriber"]["cpu_us_per_delivery_median"]
    for n, runs in result["drain"].items():
        if n != "channel_1_subscriber":
            runs["fanout_vs_channel_cpu_per_delivery"] = runs["fanout"]["cpu_us_per_delivery_median"] / channel_cpu
    if args.skip_e2e:
        write_json(f"{NAME}-drain", result)  # beside, not over, the full run's broker.json
        print(json.dumps(result["drain"], indent=2))
        return 0
    b, c = result["broker"], result["channel"]
    result["ratios"] = {
        # deliveries per CPU-second = 1e6 / CPU µs per delivery
        "broker_vs_channel_deliveries_per_cpu_second":
            c["cpu_us_per_delivered_median"] / b["cpu_us_per_delivered_median"],
        "broker_vs_channel_deliveries_per_s": b["rate_median"] / c["rate_median"],
        "broker_vs_channel_p99": b["open_loop"]["p99_ms"] / c["open_loop"]["p99_ms"],
    }
    result["targets"] = {
        "broker >= 2x channel deliveries per CPU-second":
            result["ratios"]["broker_vs_channel_deliveries_per_cpu_second"] >= 2.0,
        "broker p99 at the fixed rate lower": b["open_loop"]["p99_ms"] < c["open_loop"]["p99_ms"],
    }
    write_json(NAME, result)
    plot(result)
    print(json.dumps({k: result[k] for k in ("filter_cost", "ratios", "targets")}, indent=2))
    return 0


def plot(result: dict[str, Any]) -> None:
    fig, axes = new_figure(ncols=3, width=4.5)
    kinds = ["broker", "channel"]
    colors = ["#4878a8", "#c8784a"]
    panels = [("rate_median", "rate_runs", "deliveries/s (closed loop)"),
              ("cpu_us_per_delivered_median", "cpu_us_per_delivered_runs", "CPU µs per delivered event")]
    for ax, (key, runs, label) in zip(axes[0][:2], panels, strict=True):
        ax.bar(range(2), [result[k][key] for k in kinds], color=colors)
        for i, k in enumerate(kinds):
            ax.scatter([i] * len(result[k][runs]), result[k][runs], color="black", s=8, zorder=3)
        ax.set_xticks(range(2), ["Kafka Broker", "channel-based"])
        ax.set_title(label)
    ax = axes[0][2]
    width = 0.35
    for j, q in enumerate(("p50_ms", "p99_ms")):
        ax.bar([i + j * width for i in range(2)], [result[k]["open_loop"][q] for k in kinds], width,
               label=q.replace("_ms", ""), color=["#6a9f58", "#a05a9f"][j])
    ax.set_xticks([i + width / 2 for i in range(2)], ["Kafka Broker", "channel-based"])
    ax.set_title(f"end-to-end latency at {result['settings']['rate']:.0f}/s (ms)")
    ax.legend(fontsize=7)
    save_png(fig, NAME)


if __name__ == "__main__":
    sys.exit(main())
