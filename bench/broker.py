"""Broker benchmark (`make bench-broker`): the Kafka Broker vs a channel-based broker built from this project's parts.

Both carry the same load to the same 10 Triggers (mixed filters: attributes, exact, prefix, suffix, cesql, any,
all, not, none; ``--e2e-triggers 100`` repeats each 10 times) on one local Kafka node, side by side in one run:

- **broker**: client → receiver (``/<ns>/<broker>``, gunicorn) → Kafka → Broker dispatcher (one shared read
  fanned out to the Triggers, filters applied in the dispatcher) → subscriber;
- **channel**: client → ingress hop (a small HTTP forwarder) → receiver (``/<ns>/<channel>``) → Kafka → channel
  dispatcher (one subscription per Trigger) → filter hop (an HTTP service applying the same compiled filter and
  forwarding matches) → subscriber. This is how the channel-based MT broker is assembled upstream;
- **peer** (``--peer``): Knative's Java Broker receiver and dispatcher (``make peer``), given the same Broker,
  Triggers and filters through their contract as their control plane writes it (filters as ``dialectedFilter``),
  on a fresh topic per round.

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
    rss_bytes,
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
#: The helper servers' listen backlog (aiohttp's default is 128): at 100 Triggers a side opens thousands of
#: connections to the subscriber at once, and a full accept queue drops them (a 1 s SYN retry, then 3 s, ...).
LISTEN_BACKLOG = 4096

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


def trigger_specs(n: int) -> list[dict[str, Any]]:
    """``n`` end-to-end Triggers: the 10 mixed specs in turn (100 Triggers are each spec 10 times)."""
    return [TRIGGERS[i % len(TRIGGERS)] for i in range(n)]


def compiled_filters(n: int = len(TRIGGERS)) -> list[Filter]:
    return [compile_trigger(spec) for spec in trigger_specs(n)]


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
    """The subscriber: per path, deliveries, first/last arrival (monotonic, comparable across processes), and the
    ``ce-id`` s seen, so a run checks that every event reached every matching Trigger exactly once (by id)."""
    from aiohttp import web

    stats: dict[str, list[float]] = {}  # path -> [deliveries, first, last, duplicates]
    ids: dict[str, set[str]] = {}
    latencies: list[tuple[int, float]] = []  # (sent at, ns since the epoch; end-to-end ms)

    async def post(request: web.Request) -> web.Response:
        await request.read()
        now = time.time_ns()
        mono = time.monotonic()
        entry = stats.get(request.path)
        seen = ids.setdefault(request.path, set())
        if entry is None:
            entry = stats[request.path] = [0, mono, mono, 0]
        entry[0] += 1
        entry[2] = mono
        event_id = request.headers.get("ce-id", "")
        if event_id in seen:
            entry[3] += 1
        else:
            seen.add(event_id)
        sent = request.headers.get("ce-sentat")
        if sent:
            latencies.append((int(sent), (now - int(sent)) / 1e6))
        return web.Response(status=200)

    async def get(request: web.Request) -> web.Response:
        if request.path == "/reset":
            stats.clear()
            ids.clear()
            latencies.clear()
        # per path: [deliveries, first, last, unique ids, duplicates]
        body = {"stats": {p: [v[0], v[1], v[2], len(ids[p]), v[3]] for p, v in stats.items()},
                "latencies": latencies if request.path == "/latencies" else []}
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/{tail:.*}", post)
    app.router.add_get("/{tail:.*}", get)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=LISTEN_BACKLOG)


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
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=LISTEN_BACKLOG)


def serve_forward(port: int, target: str) -> None:
    """The channel-based broker's ingress: one POST in, the same POST to the channel, its status back."""
    _serve_hop(port, "/{tail:.*}", lambda _request: target)


def serve_filters(port: int, sink: str, triggers: int) -> None:
    """The channel-based broker's filter hops: ``/t<i>`` applies Trigger i's filter and forwards a match."""
    filters = compiled_filters(triggers)

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

    def adopt(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        """A process started elsewhere (the peer's launchers), stopped with the rest."""
        self.procs[name] = proc

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


def sink_stats(sink: str) -> dict[str, list[float]]:
    """Per path: [deliveries, first, last, unique ids, duplicates] (see ``serve_sink``)."""
    return dict(get_json(f"{sink}/stats")["stats"])


def wait_delivered(sink: str, expected: int, procs: Procs, timeout: float,
                   pids: list[int] | None = None) -> tuple[dict[str, list[float]], list[tuple[float, int, float]]]:
    """Until ``expected`` distinct (path, id) deliveries arrived — unique, so a duplicate cannot stand in for a
    lost one. Returns the sink's stats and samples (time, unique deliveries, CPU seconds of ``pids``) taken every
    50 ms, from which ``steady`` takes the steady-state window."""
    deadline = time.monotonic() + timeout
    samples: list[tuple[float, int, float]] = []
    while True:
        procs.check()
        try:
            stats = sink_stats(sink)
        except OSError:  # the subscriber slow to answer on a loaded machine: ask again
            if time.monotonic() > deadline:
                raise
            continue
        unique = int(sum(v[3] for v in stats.values()))
        samples.append((time.monotonic(), unique, cpu_seconds(pids) if pids else 0.0))
        if unique >= expected:
            return stats, samples
        if time.monotonic() > deadline:
            raise TimeoutError(f"{unique} of {expected} deliveries")
        time.sleep(0.05)


def steady(samples: list[tuple[float, int, float]], expected: int, lo: float = 0.2,
           hi: float = 0.8) -> dict[str, float]:
    """Rate and CPU per delivery between the samples where ``lo`` and ``hi`` of the deliveries had arrived: the
    steady state, without process start, group join, the first fetches and the tail of the last partition."""
    first = next((s for s in samples if s[1] >= lo * expected), None)
    last = next((s for s in samples if s[1] >= hi * expected), None)
    if first is None or last is None or last[1] <= first[1] or last[0] <= first[0]:
        return {"rate": float("nan"), "cpu_us_per_delivery": float("nan"), "seconds": 0.0}
    done = last[1] - first[1]
    return {"rate": done / (last[0] - first[0]), "cpu_us_per_delivery": (last[2] - first[2]) / done * 1e6,
            "seconds": last[0] - first[0]}


def exactly_once(stats: dict[str, list[float]], expected: Mapping[str, int]) -> dict[str, Any]:
    """Every path got exactly its expected events, each id once: missing, duplicates and unexpected deliveries."""
    missing = sum(max(0, n - int(stats.get(path, [0, 0, 0, 0, 0])[3])) for path, n in expected.items())
    unexpected = sum(max(0, int(v[3]) - expected.get(path, 0)) for path, v in stats.items())
    duplicates = int(sum(v[4] for v in stats.values()))
    return {"expected": sum(expected.values()), "unique": int(sum(v[3] for v in stats.values())),
            "missing": missing, "duplicates": duplicates, "unexpected": unexpected,
            "ok": missing == 0 and duplicates == 0 and unexpected == 0}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


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


def dialected(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of a Trigger's ``spec.filters`` as the peer's contract holds it (a ``DialectedFilter``)."""
    ((dialect, value),) = spec.items()
    if dialect in ("exact", "prefix", "suffix"):
        return {dialect: {"attributes": value}}
    if dialect in ("all", "any"):
        return {dialect: {"filters": [dialected(f) for f in value]}}
    if dialect == "not":
        return {"not": {"filter": dialected(value)}}
    return {"cesql": {"expression": value}}


def start_peer_broker(node: KafkaNode, workdir: Path, procs: Procs, sink: str, *, rnd: int,
                      specs: list[dict[str, Any]]) -> str:
    """Knative's Java receiver and Broker dispatcher for the Broker and its Triggers, on a fresh topic (so the
    Triggers' groups start at its beginning, where the control plane would have committed the end); returns the
    ingress URL."""
    import peer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"{broker_topic(NS, BROKER)}.peer{rnd}"
    admin = AdminClient({**node.client_config()})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]).values():
        fut.result(timeout=30)
    egresses = []
    for i, spec in enumerate(specs):
        eg = peer.egress(f"{sink}/t{i}", group=f"knative-trigger-{NS}-t{i}", ordered=False, namespace=NS,
                         trigger=f"t{i}")
        if "filter" in spec:
            eg["filter"] = spec["filter"]
        if "filters" in spec:
            eg["dialectedFilter"] = [dialected(f) for f in spec["filters"]]
        egresses.append(eg)
    port = free_port()
    procs.adopt("peer-receiver", peer.start_peer_receiver(node.bootstrap_servers, topic, port, workdir,
                                                          namespace=NS, name=BROKER))
    procs.adopt("peer-dispatcher", peer.start_peer_dispatcher(
        node.bootstrap_servers, topic, f"{sink}/t0", workdir, ordered=False, group=f"knative-trigger-{NS}-t0",
        namespace=NS, name=BROKER, egresses=egresses, timeout=300))
    return f"http://127.0.0.1:{port}/{NS}/{BROKER}"


def start_system(kind: str, node: KafkaNode, workdir: Path, procs: Procs, sink: str, *,
                 specs: list[dict[str, Any]], rnd: int = 0) -> tuple[str, list[str]]:
    """Start one system's processes; returns its ingress URL and the names of its eventing processes."""
    if kind == "peer":
        return start_peer_broker(node, workdir, procs, sink, rnd=rnd, specs=specs), ["peer-receiver", "peer-dispatcher"]
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
                 for i, spec in enumerate(specs)]
        extra = {"KE_BROKER_NAMESPACE": NS, "KE_BROKER_NAME": BROKER}
    else:
        hops = free_port()
        procs.start("filters", [sys.executable, __file__, "--serve", "filters", "--port", str(hops),
                                "--target", sink, "--e2e-triggers", str(len(specs))])
        docs = [{"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
                 "metadata": {"name": CHANNEL, "namespace": NS},
                 "spec": {"numPartitions": PARTITIONS,
                          "subscribers": [{"uid": f"t{i}", "subscriberUri": f"http://127.0.0.1:{hops}/t{i}"}
                                          for i in range(len(specs))]}}]
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


def trigger_paths(filters: list[Filter], first: int, count: int) -> dict[str, int]:
    """Events each Trigger's subscriber path must get for events ``first`` .. ``first + count - 1``."""
    return {f"/t{i}": sum(f.matches(event_attributes(seq)) for seq in range(first, first + count))
            for i, f in enumerate(filters)}


def open_loop(ingress: str, sink: str, procs: Procs, filters: list[Filter], *, seq: int, rate: float,
              seconds: float) -> dict[str, Any]:
    """``rate`` events/s for ``seconds`` on a fixed schedule; latency from the event's own send time, over the
    whole run and over its steady state (events sent in the middle 60 % of the schedule)."""
    get_json(f"{sink}/reset")
    count = int(rate * seconds)
    expected = trigger_paths(filters, seq, count)
    load0, began = load_average(), time.monotonic()
    failures = asyncio.run(post_events(ingress, seq, count, rate=rate))
    sent_for = time.monotonic() - began
    stats, _ = wait_delivered(sink, sum(expected.values()), procs, 300)
    pairs = get_json(f"{sink}/latencies")["latencies"]
    lat = [ms for _sent, ms in pairs]
    t0 = min(sent for sent, _ in pairs)
    span = seconds * 1e9
    mid = [ms for sent, ms in pairs if 0.2 * span <= sent - t0 < 0.8 * span]
    return {"rate": rate, "seconds": seconds, "sent_in_s": sent_for, "failures": failures,
            "deliveries": len(lat), "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "max_ms": max(lat), "steady_p50_ms": percentile(mid, 50), "steady_p99_ms": percentile(mid, 99),
            "exactly_once": exactly_once(stats, expected), "load_average_before": load0,
            "load_average_after": load_average()}


def measure_round(kind: str, node: KafkaNode, workdir: Path, sink: str, *, filters: list[Filter],
                  args: argparse.Namespace, seq: int, rnd: int) -> dict[str, Any]:
    """One round for one system, on fresh processes: a warm-up, a closed-loop run and an open-loop run."""
    procs = Procs(workdir)
    try:
        ingress, names = start_system(kind, node, workdir, procs, sink, rnd=rnd,
                                      specs=trigger_specs(args.e2e_triggers))
        # Warm-up, the same closed loop for every side and not measured: every Trigger has delivered, every code
        # path ran, and the peer's JIT has compiled its hot paths before anything is timed.
        get_json(f"{sink}/reset")
        warm = args.warmup
        asyncio.run(post_events(ingress, seq, warm, concurrency=args.concurrency))
        wait_delivered(sink, expected_deliveries(filters, seq, warm), procs, 300)
        seq += warm
        get_json(f"{sink}/reset")
        expected = trigger_paths(filters, seq, args.count)
        total = sum(expected.values())
        pids = procs.pids(names)
        load0, cpu0 = load_average(), cpu_seconds(pids)
        failures = asyncio.run(post_events(ingress, seq, args.count, concurrency=args.concurrency))
        stats, samples = wait_delivered(sink, total, procs, 300, pids)
        cpu = cpu_seconds(pids) - cpu0
        if failures:
            raise RuntimeError(f"{kind}: {failures} posts failed")
        first, last = min(v[1] for v in stats.values()), max(v[2] for v in stats.values())
        out: dict[str, Any] = {
            "rate": total / max(last - first, 1e-9), "cpu_us_per_delivered": cpu / total * 1e6,
            "steady": steady(samples, total), "exactly_once": exactly_once(stats, expected),
            "load_average_before": load0, "load_average_after": load_average()}
        seq += args.count
        out["open_loop"] = open_loop(ingress, sink, procs, filters, seq=seq, rate=args.rate, seconds=args.seconds)
        out["pss_mib"] = pss_bytes(procs.pids(names)) / 2**20
        out["processes"] = names
        ol = out["open_loop"]
        print(f"  {kind}: {out['rate']:.0f} deliveries/s, {out['cpu_us_per_delivered']:.0f} CPU µs/delivery "
              f"(steady {out['steady']['cpu_us_per_delivery']:.0f}), exactly once {out['exactly_once']['ok']}; "
              f"open loop {args.rate:.0f}/s p50 {ol['p50_ms']:.1f} ms, p99 {ol['p99_ms']:.1f} ms "
              f"(steady {ol['steady_p99_ms']:.1f}), exactly once {ol['exactly_once']['ok']}; "
              f"load {out['load_average_before'][0]} → {ol['load_average_after'][0]}", flush=True)
        return out
    finally:
        procs.stop()


def sweep(node: KafkaNode, workdir: Path, sink: str, *, filters: list[Filter], rates: list[float],
          seconds: float, seq: int) -> list[dict[str, Any]]:
    """The Broker alone at rising open-loop rates until p99 passes 100 ms (one run each, after a warm-up)."""
    procs = Procs(workdir)
    out = []
    try:
        ingress, _names = start_system("broker", node, workdir, procs, sink, specs=trigger_specs(len(filters)))
        get_json(f"{sink}/reset")
        asyncio.run(post_events(ingress, seq, 300, concurrency=8))
        wait_delivered(sink, expected_deliveries(filters, seq, 300), procs, 120)
        seq += 300
        for rate in rates:
            run = open_loop(ingress, sink, procs, filters, seq=seq, rate=rate, seconds=seconds)
            seq += int(rate * seconds)
            out.append(run)
            print(f"  sweep {rate:.0f}/s: p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms "
                  f"(steady {run['steady_p99_ms']:.1f}), sent in {run['sent_in_s']:.1f} s, "
                  f"exactly once {run['exactly_once']['ok']}, load {run['load_average_after'][0]}", flush=True)
            if run["p99_ms"] > 100:
                break
        return out
    finally:
        procs.stop()


#: The drain runs' Triggers: every other one matches every event, the rest match none ("half matching").
HALF = [{"filters": [{"prefix": {"type": "com.example."}}]}, {"filters": [{"exact": {"type": "com.example.none"}}]}]


def record_headers(seq: int) -> list[tuple[str, str | bytes | None]]:
    """Event ``seq`` as a binary-mode Kafka record's headers."""
    headers: list[tuple[str, str | bytes | None]] = [
        (f"ce_{k}", v.encode()) for k, v in event_attributes(seq).items() if k != "datacontenttype"]
    headers.append(("content-type", b"application/json"))
    return headers


def drain_config(kind: str, triggers: int, topic: str, sink: str, workdir: Path) -> tuple[Path, dict[str, str], int]:
    """The dispatcher's resources for a drain run: its config file, extra env and deliveries per event."""
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
    return config, extra, per_event


def drain_paths(kind: str, triggers: int, count: int) -> dict[str, int]:
    """Events each subscriber path must get: every event on the matching (even) Triggers, none on the others."""
    if kind == "channel":
        return {"/c": count}
    return {f"/d{i}": count for i in range(0, triggers, 2)}


def start_peer(node: KafkaNode, topic: str, triggers: int, sink: str, workdir: Path) -> subprocess.Popen[bytes]:
    """Knative's Java dispatcher, given the same Broker and Triggers through its contract: one consumer group per
    Trigger (knative-trigger-<ns>-<name>, as its control plane names them), the same filters as dialectedFilter."""
    import peer

    egs = []
    for i in range(triggers):
        eg = peer.egress(f"{sink}/d{i}", group=f"knative-trigger-{NS}-t{i}", ordered=False, namespace=NS,
                         trigger=f"t{i}")
        flt = HALF[i % 2]["filters"][0]
        eg["dialectedFilter"] = [{dialect: {"attributes": attrs}} for dialect, attrs in flt.items()]
        egs.append(eg)
    return peer.start_peer_dispatcher(node.bootstrap_servers, topic, f"{sink}/d0", workdir, ordered=False,
                                      group=f"knative-trigger-{NS}-t0", namespace=NS, name=BROKER, egresses=egs,
                                      timeout=300)


def drain(kind: str, triggers: int, *, node: KafkaNode, workdir: Path, sink: str, args: argparse.Namespace,
          src: Path) -> dict[str, Any]:
    """One round of the dispatcher alone on a backlog produced straight to Kafka, on a fresh process and topic.

    ``fanout`` and ``per_trigger`` are a Broker with ``triggers`` half-matching Triggers (this tree's shared read,
    and the tree at ``--baseline-src`` with one consumer group per Trigger); ``peer`` the same Broker and Triggers
    on Knative's Java dispatcher; ``channel`` is the channel dispatcher with one subscription to the same
    subscriber, for its CPU per event. A first drain of the same size, not measured, warms each side up (the peer's
    JIT compiles its hot paths in it); the measured drain is reported whole (first to last delivery, all the
    process's CPU from before the first record was produced) and in its steady state (20 % to 80 % of the
    deliveries), and checked: every matching Trigger got every event exactly once, by id.
    """
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"drain-{kind}-{triggers}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({**node.client_config()})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]).values():
        fut.result(timeout=30)
    config, extra, per_event = drain_config(kind, triggers, topic, sink, workdir)
    env = {**base_env(node, config, workdir), **extra, "PYTHONPATH": str(src)}
    port = free_port()
    procs = Procs(workdir)
    peer_proc = None
    count = max(200, args.drain_deliveries // per_event)
    producer = Producer({**node.client_config(), "linger.ms": 5})
    body = b'{"hello": "world"}'
    try:
        started = time.monotonic()
        if kind == "peer":
            peer_proc = start_peer(node, topic, triggers, sink, workdir)
            pids = process_tree(peer_proc.pid)
        else:
            procs.start(f"drain-{kind}", [sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                        {**env, "KE_METRICS_PORT": str(port)})
            wait_http(f"http://127.0.0.1:{port}/readyz", procs, 180)
            pids = procs.pids([f"drain-{kind}"])
        out: dict[str, Any] = {"events": count, "deliveries_per_event": per_event,
                               "start_seconds": time.monotonic() - started}
        seq = 0
        for run in range(2):  # the first, unmeasured, warms up every side alike (the peer's JIT)
            get_json(f"{sink}/reset")
            expected = drain_paths(kind, triggers, count)
            load0, cpu0 = load_average(), cpu_seconds(pids)
            for _i in range(count):
                producer.produce(topic, body, str(seq).encode(), headers=record_headers(seq))
                producer.poll(0)
                seq += 1
            producer.flush(30)
            stats, samples = wait_delivered(sink, count * per_event, procs, 900, pids)
            cpu = cpu_seconds(pids) - cpu0
            if run == 0:
                out["warmup_seconds"] = samples[-1][0] - samples[0][0]
                continue
            time.sleep(0.5)  # a late duplicate still counts
            stats = sink_stats(sink)
            first, last = min(v[1] for v in stats.values()), max(v[2] for v in stats.values())
            out.update({"cpu_us_per_delivery": cpu / (count * per_event) * 1e6,
                        "rate": count * per_event / max(last - first, 1e-9),
                        "steady": steady(samples, count * per_event),
                        "pss_mib": pss_bytes(pids) / 2**20, "rss_mib": rss_bytes(pids) / 2**20,
                        "exactly_once": exactly_once(stats, expected),
                        "load_average_before": load0, "load_average_after": load_average()})
        print(f"  drain {kind} x{triggers}: {out['cpu_us_per_delivery']:.1f} CPU µs/delivery "
              f"(steady {out['steady']['cpu_us_per_delivery']:.1f}), {out['rate']:.0f} deliveries/s "
              f"(steady {out['steady']['rate']:.0f}), PSS {out['pss_mib']:.0f} MiB, "
              f"exactly once {out['exactly_once']['ok']} (dup {out['exactly_once']['duplicates']}), "
              f"load {out['load_average_before'][0]} → {out['load_average_after'][0]}", flush=True)
        return out
    finally:
        procs.stop()
        if peer_proc is not None:
            import peer

            peer.stop(peer_proc)
        for fut in admin.delete_topics([topic], operation_timeout=10).values():
            with contextlib.suppress(Exception):  # cleanup of a throwaway topic
                fut.result(timeout=30)


def backlog_memory(node: KafkaNode, workdir: Path, sink: str, *, triggers: int, events: int,
                   seconds: float) -> dict[str, Any]:
    """The Broker dispatcher with ``triggers`` half-matching Triggers started on a backlog of ``events`` records:
    its RSS/PSS sampled every second for ``seconds`` while it works through the backlog (bounded means flat, not
    growing with what is still unread)."""
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"backlog-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({**node.client_config()})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]).values():
        fut.result(timeout=30)
    producer = Producer({**node.client_config(), "linger.ms": 50, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000})
    body = b'{"hello": "world"}'
    began = time.monotonic()
    for seq in range(events):
        while True:
            try:
                producer.produce(topic, body, str(seq).encode(), headers=record_headers(seq))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(120)
    produced_in = time.monotonic() - began
    config, extra, per_event = drain_config("fanout", triggers, topic, sink, workdir)
    env = {**base_env(node, config, workdir), **extra}
    port = free_port()
    procs = Procs(workdir)
    try:
        get_json(f"{sink}/reset")
        load0 = load_average()
        procs.start("backlog", [sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                    {**env, "KE_METRICS_PORT": str(port)})
        wait_http(f"http://127.0.0.1:{port}/readyz", procs, 180)
        pids = procs.pids(["backlog"])
        samples: list[dict[str, float]] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            procs.check()
            stats = sink_stats(sink)
            samples.append({"t": round(time.monotonic() - t0, 1), "rss_mib": rss_bytes(pids) / 2**20,
                            "pss_mib": pss_bytes(pids) / 2**20,
                            "deliveries": int(sum(v[0] for v in stats.values())),
                            "duplicates": int(sum(v[4] for v in stats.values()))})
            time.sleep(1.0)
        out: dict[str, Any] = {"triggers": triggers, "backlog_events": events, "produced_in_s": produced_in,
                               "deliveries_per_event": per_event, "seconds": seconds, "samples": samples,
               "rss_mib_max": max(s["rss_mib"] for s in samples),
               "rss_mib_last": samples[-1]["rss_mib"],
               "rss_mib_at_10s": next((s["rss_mib"] for s in samples if s["t"] >= 10), samples[-1]["rss_mib"]),
               "deliveries": samples[-1]["deliveries"], "load_average_before": load0,
               "load_average_after": load_average()}
        print(f"  backlog {events} x{triggers}: RSS max {out['rss_mib_max']:.0f} MiB (at 10 s "
              f"{out['rss_mib_at_10s']:.0f}, last {out['rss_mib_last']:.0f}), {out['deliveries']} deliveries "
              f"in {seconds:.0f} s, load {load0[0]} → {out['load_average_after'][0]}", flush=True)
        return out
    finally:
        procs.stop()
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


def summarize(runs: list[dict[str, Any]], keys: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """Medians over the rounds of the values at the given paths in each run."""
    out = {}
    for name, path in keys.items():
        values = []
        for run in runs:
            value: Any = run
            for part in path:
                value = value[part]
            values.append(float(value))
        out[name] = median(values)
    return out


DRAIN_KEYS = {"cpu_us_per_delivery": ("cpu_us_per_delivery",), "rate": ("rate",),
              "steady_cpu_us_per_delivery": ("steady", "cpu_us_per_delivery"), "steady_rate": ("steady", "rate"),
              "pss_mib": ("pss_mib",), "rss_mib": ("rss_mib",)}
E2E_KEYS = {"rate": ("rate",), "cpu_us_per_delivered": ("cpu_us_per_delivered",),
            "steady_rate": ("steady", "rate"), "steady_cpu_us_per_delivered": ("steady", "cpu_us_per_delivery"),
            "p50_ms": ("open_loop", "p50_ms"), "p99_ms": ("open_loop", "p99_ms"),
            "steady_p99_ms": ("open_loop", "steady_p99_ms"), "pss_mib": ("pss_mib",)}


def rounds_order(kinds: list[str], rnd: int) -> list[str]:
    """Round 0 in the given order, round 1 reversed, and so on: no side always runs first (or on a warmer page
    cache, a JIT-compiled Kafka broker, a machine whose neighbours have just gone quiet)."""
    return kinds if rnd % 2 == 0 else kinds[::-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=("sink", "forward", "filters"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=3000, help="events per closed-loop run")
    parser.add_argument("--concurrency", type=int, default=32, help="posts in flight in the closed loop")
    parser.add_argument("--warmup", type=int, default=3000,
                        help="events of the unmeasured closed loop every side runs first (the peer's JIT)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each side once per round, order alternated")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="open-loop events/s (each fans out to ~5.8 deliveries; 1000/s is beyond 2 shared cores)")
    parser.add_argument("--seconds", type=float, default=10.0, help="open-loop duration")
    parser.add_argument("--sweep", default="", help="also the Broker alone at these open-loop rates (comma list), "
                                                    "until p99 passes 100 ms")
    parser.add_argument("--triggers", default="10,100", help="Trigger counts of the dispatcher-only drain runs")
    parser.add_argument("--drain-deliveries", type=int, default=20000, help="deliveries per drain run")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="a tree whose Broker dispatcher runs one consumer group per Trigger (per_trigger)")
    parser.add_argument("--skip-e2e", action="store_true", help="no end-to-end runs")
    parser.add_argument("--skip-drain", action="store_true", help="no dispatcher-only drain runs")
    parser.add_argument("--backlog", type=int, default=0,
                        help="also: dispatcher RSS with 100 half-matching Triggers started on this many records")
    parser.add_argument("--backlog-seconds", type=float, default=90.0)
    parser.add_argument("--peer", action="store_true",
                        help="also Knative's Java Broker data plane (make peer builds it): in the drains its "
                             "dispatcher, end to end its receiver and dispatcher")
    parser.add_argument("--e2e-triggers", type=int, default=len(TRIGGERS),
                        help="Triggers of the end-to-end runs: the 10 mixed specs in turn (100: each 10 times)")
    parser.add_argument("--skip-channel", action="store_true",
                        help="end to end, no channel-based broker (its filter hops do not scale to 100 Triggers)")
    parser.add_argument("--name", default=None, help="results file name under docs/benchmarks (default: broker, "
                                                     "broker-drain with --skip-e2e, broker-backlog for a backlog run)")
    args = parser.parse_args()
    if args.serve == "sink":
        serve_sink(args.port)
        return 0
    if args.serve == "forward":
        serve_forward(args.port, args.target)
        return 0
    if args.serve == "filters":
        serve_filters(args.port, args.target, args.e2e_triggers)
        return 0

    workdir = ROOT / ".cache" / "bench-broker"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    filters = compiled_filters(args.e2e_triggers)
    facts = machine_facts(["confluent-kafka", "aiohttp", "uvloop", "gunicorn", "falcon", "cloudevents"],
                          kafka=KAFKA_VERSION, partitions=PARTITIONS, triggers=args.e2e_triggers)
    if args.peer:
        import peer

        reason = peer.peer_available()
        if reason:
            raise SystemExit(f"--peer: {reason}")
        facts["peer"] = peer.build_info()
    result: dict[str, Any] = {"machine": facts, "settings": {k: v for k, v in vars(args).items()
                                                             if k not in ("serve", "port", "target")},
                              "triggers": TRIGGERS,
                              "match_fraction": expected_deliveries(filters, 0, 1000) / 1000 / len(filters)}
    result["filter_cost"] = filter_cost(compiled_filters())
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
        if not args.skip_drain:
            result["drain"] = run_drains(args, node, workdir, sink)
        if not args.skip_e2e:
            seq = 0
            kinds = ["broker"] + ([] if args.skip_channel else ["channel"]) + (["peer"] if args.peer else [])
            rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
            for rnd in range(args.repeats):
                for kind in rounds_order(kinds, rnd):
                    rounds[kind].append(measure_round(kind, node, workdir, sink, filters=filters, args=args,
                                                      seq=seq, rnd=rnd))
                    seq += 1_000_000
            for kind, runs in rounds.items():
                result[kind] = {"runs": runs, "medians": summarize(runs, E2E_KEYS),
                                "exactly_once": all(r["exactly_once"]["ok"] and r["open_loop"]["exactly_once"]["ok"]
                                                    for r in runs)}
            if args.sweep:
                result["sweep"] = sweep(node, workdir, sink, filters=filters, seconds=args.seconds, seq=seq,
                                        rates=[float(r) for r in args.sweep.split(",")])
                carried = [r["rate"] for r in result["sweep"] if r["p99_ms"] <= 100]
                result["highest_rate_p99_le_100ms"] = max(carried) if carried else None
        if args.backlog:
            result["backlog"] = backlog_memory(node, workdir, sink, triggers=100, events=args.backlog,
                                               seconds=args.backlog_seconds)
    finally:
        sink_procs.stop()
        node.stop()
        shutil.rmtree(workdir / "kafka", ignore_errors=True)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    result["targets"] = targets(result)
    name = args.name or (NAME if not args.skip_e2e else "broker-backlog" if args.skip_drain else f"{NAME}-drain")
    write_json(name, result)
    plot(result, name)
    print(json.dumps({k: result.get(k) for k in ("filter_cost", "targets")}, indent=2))
    return 0


def run_drains(args: argparse.Namespace, node: KafkaNode, workdir: Path, sink: str) -> dict[str, Any]:
    """Per Trigger count: ``--repeats`` rounds of every side (ours, the baseline, the peer, the channel), each on a
    fresh process, the order alternated between rounds; medians of whole runs and steady states."""
    kinds = ["fanout"] + (["per_trigger"] if args.baseline_src else []) + (["peer"] if args.peer else [])
    kinds.append("channel")
    out: dict[str, Any] = {}
    for n in (int(x) for x in args.triggers.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for rnd in range(args.repeats):
            for kind in rounds_order(kinds, rnd):
                src = args.baseline_src if kind == "per_trigger" else ROOT / "src"
                runs[kind].append(drain(kind, 1 if kind == "channel" else n, node=node, workdir=workdir, sink=sink,
                                        args=args, src=src))
        out[str(n)] = {kind: {"runs": r, "medians": summarize(r, DRAIN_KEYS),
                              "exactly_once": all(x["exactly_once"]["ok"] for x in r)} for kind, r in runs.items()}
    return out


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the measured numbers it was judged on."""
    out: dict[str, Any] = {}
    drain_runs = result.get("drain", {})
    for n, sides in drain_runs.items():
        fan, chan = sides["fanout"]["medians"], sides["channel"]["medians"]
        out[f"drain x{n}: fanout CPU/delivery <= 2x channel CPU/event"] = {
            "whole": fan["cpu_us_per_delivery"] / chan["cpu_us_per_delivery"],
            "steady": fan["steady_cpu_us_per_delivery"] / chan["steady_cpu_us_per_delivery"]}
        if "peer" in sides:
            p = sides["peer"]["medians"]
            out[f"drain x{n}: vs peer"] = {
                "deliveries_per_cpu_second_whole": p["cpu_us_per_delivery"] / fan["cpu_us_per_delivery"],
                "deliveries_per_cpu_second_steady": p["steady_cpu_us_per_delivery"] / fan["steady_cpu_us_per_delivery"],
                "rate_whole": fan["rate"] / p["rate"], "rate_steady": fan["steady_rate"] / p["steady_rate"],
                "pss": fan["pss_mib"] / p["pss_mib"]}
    if "10" in drain_runs and "100" in drain_runs:
        f10, f100 = drain_runs["10"]["fanout"]["medians"], drain_runs["100"]["fanout"]["medians"]
        out["10 -> 100 Triggers CPU/delivery growth <= 1.3"] = {
            "whole": f100["cpu_us_per_delivery"] / f10["cpu_us_per_delivery"],
            "steady": f100["steady_cpu_us_per_delivery"] / f10["steady_cpu_us_per_delivery"]}
    if "broker" in result and "channel" in result:
        b, c = result["broker"]["medians"], result["channel"]["medians"]
        out["open loop p99 <= 10 ms and below the channel-based broker's"] = {
            "broker_p99_ms": b["p99_ms"], "broker_steady_p99_ms": b["steady_p99_ms"], "channel_p99_ms": c["p99_ms"],
            "met": b["p99_ms"] <= 10 and b["p99_ms"] < c["p99_ms"]}
        out["broker vs channel deliveries per CPU-second (closed loop)"] = (
            c["cpu_us_per_delivered"] / b["cpu_us_per_delivered"])
    if "peer" in result:
        b, k = result["broker"]["medians"], result["peer"]["medians"]
        out["end to end vs peer: more deliveries per CPU-second, lower p99, a third of its memory or less"] = {
            "deliveries_per_cpu_second_whole": k["cpu_us_per_delivered"] / b["cpu_us_per_delivered"],
            "deliveries_per_cpu_second_steady": k["steady_cpu_us_per_delivered"] / b["steady_cpu_us_per_delivered"],
            "broker_p99_ms": b["p99_ms"], "peer_p99_ms": k["p99_ms"],
            "broker_steady_p99_ms": b["steady_p99_ms"], "peer_steady_p99_ms": k["steady_p99_ms"],
            "pss": b["pss_mib"] / k["pss_mib"],
            "met": (b["cpu_us_per_delivered"] <= k["cpu_us_per_delivered"] and b["p99_ms"] < k["p99_ms"]
                    and b["pss_mib"] <= k["pss_mib"] / 3)}
    if "highest_rate_p99_le_100ms" in result:
        out["highest open-loop rate with p99 <= 100 ms"] = result["highest_rate_p99_le_100ms"]
    return out


def plot(result: dict[str, Any], name: str) -> None:
    panels = []
    if "drain" in result:
        panels += ["drain_cpu", "drain_rate"]
    if "broker" in result:
        panels += ["e2e_cpu", "e2e_latency"]
    if "sweep" in result:
        panels.append("sweep")
    if "backlog" in result:
        panels.append("backlog")
    fig, axes = new_figure(ncols=len(panels), width=4.5)
    colors = {"fanout": "#4878a8", "per_trigger": "#888888", "peer": "#c84a4a", "channel": "#c8784a",
              "broker": "#4878a8"}
    e2e = [k for k in ("broker", "channel", "peer") if k in result]
    labels = {"broker": "Kafka Broker", "channel": "channel-based", "peer": "Knative's Java"}
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel.startswith("drain"):
            metric = "cpu_us_per_delivery" if panel == "drain_cpu" else "rate"
            groups = list(result["drain"])
            kinds = list(result["drain"][groups[0]])
            width = 0.8 / len(kinds)
            for j, kind in enumerate(kinds):
                xs = [g + j * width for g in range(len(groups))]
                ax.bar(xs, [result["drain"][n][kind]["medians"][f"steady_{metric}"] for n in groups], width,
                       color=colors[kind], label=f"{kind} (steady)")
                for x, n in zip(xs, groups, strict=True):
                    whole = [r[metric] for r in result["drain"][n][kind]["runs"]]
                    ax.scatter([x] * len(whole), whole, color="black", s=8, zorder=3)
            ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [f"{n} Triggers" for n in groups])
            ax.set_yscale("log")
            ax.set_title("dispatcher drain: " + ("CPU µs per delivery" if metric != "rate" else "deliveries/s")
                         + "\n(bars: steady median; dots: whole runs)", fontsize=9)
            ax.legend(fontsize=6)
        elif panel == "e2e_cpu":
            ax.bar(range(len(e2e)), [result[k]["medians"]["cpu_us_per_delivered"] for k in e2e],
                   color=[colors[k] for k in e2e])
            for i, k in enumerate(e2e):
                vals = [r["cpu_us_per_delivered"] for r in result[k]["runs"]]
                ax.scatter([i] * len(vals), vals, color="black", s=8, zorder=3)
            ax.set_xticks(range(len(e2e)), [labels[k] for k in e2e])
            ax.set_title(f"end to end, {result['machine']['triggers']} Triggers: CPU µs per delivery", fontsize=9)
        elif panel == "e2e_latency":
            width = 0.35
            for j, q in enumerate(("p50_ms", "p99_ms")):
                ax.bar([i + j * width for i in range(len(e2e))], [result[k]["medians"][q] for k in e2e], width,
                       label=q.replace("_ms", ""), color=["#6a9f58", "#a05a9f"][j])
            ax.set_xticks([i + width / 2 for i in range(len(e2e))], [labels[k] for k in e2e])
            ax.set_yscale("log")
            ax.set_title(f"latency at {result['settings']['rate']:.0f} events/s × {result['machine']['triggers']} "
                         "Triggers (ms, medians)", fontsize=9)
            ax.legend(fontsize=7)
        elif panel == "sweep":
            rates = [r["rate"] for r in result["sweep"]]
            ax.plot(rates, [r["p50_ms"] for r in result["sweep"]], "o-", label="p50")
            ax.plot(rates, [r["p99_ms"] for r in result["sweep"]], "o-", label="p99")
            ax.axhline(100, color="grey", linestyle=":")
            ax.set_yscale("log")
            ax.set_xlabel("events/s (10 Triggers)")
            ax.set_title("Broker open loop: latency (ms) by rate", fontsize=9)
            ax.legend(fontsize=7)
        elif panel == "backlog":
            samples = result["backlog"]["samples"]
            ax.plot([s["t"] for s in samples], [s["rss_mib"] for s in samples], label="RSS")
            ax.plot([s["t"] for s in samples], [s["pss_mib"] for s in samples], label="PSS")
            ax.set_xlabel("s since start")
            ax.set_ylim(bottom=0)
            ax.set_title(f"dispatcher memory (MiB), 100 Triggers,\n{result['backlog']['backlog_events']:,} "
                         "record backlog", fontsize=9)
            ax.legend(fontsize=7)
    save_png(fig, name)


if __name__ == "__main__":
    sys.exit(main())
