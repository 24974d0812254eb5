"""End-to-end benchmark (`make bench-e2e`): receiver → Kafka → dispatcher → subscriber, open loop.

One local Kafka node, one subscriber process (``dispatcher.SinkProcess``), and per data plane a receiver and a
dispatcher for one channel over a fresh 4-partition topic. An open-loop generator sends 1 KB binary-mode
CloudEvents at a fixed rate, each stamped with its *scheduled* send time (``ce-benchsent``, ``time.monotonic_ns``:
one clock for every process here), so a stall anywhere counts against the latency instead of slowing the load.
The receiver's latency is answer − schedule, taken by the generator; the end-to-end latency is arrival at the
subscriber − schedule, taken by the subscriber. Both data planes are run in turn, ``--repeats`` times,
interleaved: ours (gunicorn with 2 uvicorn workers, one dispatcher process), and Knative's Java data plane
(``bench/peer.py``) when it is built. Each run first carries the same load for ``WARMUP_SECONDS`` unmeasured (the
JVM's JIT, the group join); medians of the runs' p50/p99 of the measured window (steady state) are reported beside
the whole run's p99 and CPU per event (warm-up included); every accepted event must arrive exactly once (by id).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dispatcher as bench_dispatcher
import peer
import receiver as bench_receiver
from _common import (
    ROOT,
    busy_percent,
    cpu_seconds,
    machine_cpu_ticks,
    machine_facts,
    new_figure,
    percentile,
    process_tree,
    save_png,
    write_json,
)

from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode

NS = bench_dispatcher.NS
PARTITIONS = 4
#: a dispatcher still joining its group, or a JVM still compiling, is not the steady state being measured
WARMUP_SECONDS = 10.0


class Plane:
    """A receiver URL and the processes behind it (receiver and dispatcher), for one run."""

    def __init__(self, url: str, pids: list[int]) -> None:
        self.url, self.pids = url, pids


@contextlib.contextmanager
def ours(node: KafkaNode, workdir: Path, topic: str, subscriber: str) -> Iterator[Plane]:
    with bench_dispatcher.dispatcher(node, workdir, topic, [("s1", subscriber)], ordered=False, max_in_flight=64,
                                     partitions=PARTITIONS) as run:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
        env.update({"KE_BOOTSTRAP_SERVERS": node.bootstrap_servers, "KE_CHANNELS_FILE": str(run.channels),
                    "KE_LOG_LEVEL": "WARNING", "PROMETHEUS_MULTIPROC_DIR": str(workdir / f"prom-{run.name}")})
        proc, url = bench_receiver.start_server("uvicorn", "receiver", env, workdir)
        try:
            yield Plane(f"{url}/{NS}/{run.name}", [proc.pid, run.proc.pid])
        finally:
            bench_receiver.stop_server(proc)


@contextlib.contextmanager
def java_peer(node: KafkaNode, workdir: Path, topic: str, subscriber: str) -> Iterator[Plane]:
    port = free_port()
    receiver = peer.start_peer_receiver(node.bootstrap_servers, topic, port, workdir, namespace=NS, name="events")
    try:
        dispatcher = peer.start_peer_dispatcher(node.bootstrap_servers, topic, subscriber, workdir, ordered=False,
                                                group=f"bench-peer-{uuid.uuid4().hex[:6]}")
        try:
            yield Plane(f"http://127.0.0.1:{port}/{NS}/events", [receiver.pid, dispatcher.pid])
        finally:
            peer.stop(dispatcher)
    finally:
        peer.stop(receiver)


# -- the load -----------------------------------------------------------------------------------------------
HEADERS = {"ce-specversion": "1.0", "ce-source": "/bench", "ce-type": "bench.event",
           "content-type": "application/octet-stream"}


async def open_loop(url: str, rate: float, seconds: float, *, prefix: str, size: int) -> dict[str, Any]:
    """Send ``rate`` events/s for ``seconds`` on a fixed schedule; each answer's latency from its schedule."""
    import aiohttp

    body = b"x" * size
    answers: list[float] = []
    codes: dict[int, int] = {}
    lateness: list[float] = []

    async def send(session: aiohttp.ClientSession, i: int, due_ns: int) -> None:
        headers = {**HEADERS, "ce-id": f"{prefix}-{i}", "ce-benchsent": str(due_ns)}
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                codes[resp.status] = codes.get(resp.status, 0) + 1
        except aiohttp.ClientError:
            codes[0] = codes.get(0, 0) + 1
            return
        answers.append((time.monotonic_ns() - due_ns) / 1e6)

    count = int(rate * seconds)
    tasks = set()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:
        start = time.monotonic_ns() + 10_000_000
        for i in range(count):
            due = start + int(i * 1e9 / rate)
            delay = (due - time.monotonic_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            lateness.append(max(0.0, (time.monotonic_ns() - due) / 1e6))
            task = asyncio.create_task(send(session, i, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    return {"sent": count, "codes": codes, "answers_ms": answers,
            "generator_lateness_p99_ms": round(percentile(lateness, 99), 3)}


def run_load(url: str, rate: float, seconds: float, prefix: str, size: int) -> dict[str, Any]:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(open_loop(url, rate, seconds, prefix=prefix, size=size))


def measure(plane: Plane, sink: bench_dispatcher.SinkProcess, path: str, *, rate: float, seconds: float,
            size: int) -> dict[str, Any]:
    cpu_start = [cpu_seconds(process_tree(pid)) for pid in plane.pids]
    warm = run_load(plane.url, rate, WARMUP_SECONDS, "w", size)
    if warm["codes"].get(202, 0) == 0:
        raise RuntimeError(f"warm-up got no 202: {warm['codes']}")
    sink.wait([path], warm["codes"][202], 60)
    cpu0, machine0 = [cpu_seconds(process_tree(pid)) for pid in plane.pids], machine_cpu_ticks()
    load = run_load(plane.url, rate, seconds, "m", size)
    receiver_cpu, dispatcher_cpu = (cpu_seconds(process_tree(pid)) - c for pid, c in zip(plane.pids, cpu0,
                                                                                          strict=True))
    busy = busy_percent(machine0)
    accepted = load["codes"].get(202, 0)
    deadline = time.monotonic() + 60
    while True:
        arrivals = [(i, ms) for i, ms in sink.arrivals(path) if i.startswith("m-")]
        if len({i for i, _ in arrivals}) >= accepted or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    e2e = [ms for _, ms in arrivals]
    ids = [i for i, _ in arrivals]
    answers = load["answers_ms"]
    # The whole run beside the steady state: the warm-up's events too (a JIT still compiling, a group joining).
    whole_e2e = e2e + [ms for i, ms in sink.arrivals(path) if i.startswith("w-")]
    whole_answers = answers + warm["answers_ms"]
    whole_cpu = sum(cpu_seconds(process_tree(pid)) - c for pid, c in zip(plane.pids, cpu_start, strict=True))
    whole_accepted = accepted + warm["codes"].get(202, 0)
    return {
        "rate": rate, "seconds": seconds, "sent": load["sent"], "codes": load["codes"], "accepted": accepted,
        "delivered_unique": len(set(ids)), "duplicates": len(ids) - len(set(ids)),
        "receiver_p50_ms": round(percentile(answers, 50), 3), "receiver_p99_ms": round(percentile(answers, 99), 3),
        "e2e_p50_ms": round(percentile(e2e, 50), 3), "e2e_p99_ms": round(percentile(e2e, 99), 3),
        "e2e_max_ms": round(max(e2e), 3) if e2e else None,
        "receiver_cpu_us_per_event": round(receiver_cpu / max(1, accepted) * 1e6, 1),
        "dispatcher_cpu_us_per_event": round(dispatcher_cpu / max(1, accepted) * 1e6, 1),
        "whole_run_receiver_p99_ms": round(percentile(whole_answers, 99), 3),
        "whole_run_e2e_p99_ms": round(percentile(whole_e2e, 99), 3),
        "whole_run_cpu_us_per_event": round(whole_cpu / max(1, whole_accepted) * 1e6, 1),
        "machine_busy_percent": busy,
        "generator_lateness_p99_ms": load["generator_lateness_p99_ms"],
        "exactly_once": len(set(ids)) == accepted and len(ids) == len(set(ids)),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


PLANES = {"ours": ours, "peer": java_peer}


def plot(result: dict[str, Any]) -> None:
    """Medians per data plane: latency at the receiver and end to end, and CPU per event by process."""
    med = result["median"]
    names = list(med)
    fig, axes = new_figure(ncols=2, width=5.5, height=4.2)
    groups = (("receiver_p50_ms", "receiver p50"), ("receiver_p99_ms", "receiver p99"),
              ("e2e_p50_ms", "end-to-end p50"), ("e2e_p99_ms", "end-to-end p99"))
    cpu = (("receiver_cpu_us_per_event", "receiver"), ("dispatcher_cpu_us_per_event", "dispatcher"))
    for ax, fields, title in ((axes[0][0], groups, "latency, ms (median of runs)"),
                              (axes[0][1], cpu, "CPU µs per event (median of runs)")):
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ax.bar([x + i * width for x in range(len(fields))], [med[name][f] for f, _ in fields], width,
                   label={"ours": "kafka-eventing", "peer": "Knative (Java)"}.get(name, name))
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(fields))], [t for _, t in fields],
                      fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    settings = result["settings"]
    fig.suptitle(f"end to end at {settings['rate']:.0f} events/s, {settings['size']} B — "
                 f"{result['machine']['cpu_model']}, {result['machine']['cores']} cores", fontsize=10)
    save_png(fig, "e2e")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s offered")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--size", type=int, default=1024, help="event data bytes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--planes", default="ours,peer", help="which data planes: ours, peer")
    parser.add_argument("--plot-only", action="store_true", help="redraw docs/benchmarks/e2e.png from its JSON")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((ROOT / "docs" / "benchmarks" / "e2e.json").read_text()))
        return 0
    planes = [p for p in args.planes.split(",") if p]
    missing = peer.peer_available()
    if "peer" in planes and missing:
        print(f"Java peer not measured: {missing}", flush=True)
        planes.remove("peer")

    workdir = ROOT / ".cache" / "bench-e2e"
    subprocess.run(["rm", "-rf", str(workdir)], check=True)
    workdir.mkdir(parents=True)
    facts = machine_facts(["confluent-kafka", "falcon", "gunicorn", "uvicorn", "aiohttp", "uvloop"],
                          kafka=KAFKA_VERSION, partitions=PARTITIONS, event_bytes=args.size,
                          peer=peer.build_info() if "peer" in planes else None)
    result: dict[str, Any] = {"machine": facts, "settings": vars(args), "runs": {p: [] for p in planes},
                              "peer_missing": missing}
    node = KafkaNode(workdir / "kafka", heap="1g")
    node.start()
    sink = bench_dispatcher.SinkProcess()
    began = time.monotonic()
    try:
        for rep in range(args.repeats):
            for name in planes if rep % 2 == 0 else planes[::-1]:  # neither side always first
                topic = f"bench.e2e-{name}-{rep}"
                bench_dispatcher.create_topic(node, topic, PARTITIONS)
                path = f"/e2e/{name}-{rep}"
                with PLANES[name](node, workdir, topic, sink.url(path)) as plane:
                    run = measure(plane, sink, path, rate=args.rate, seconds=args.seconds, size=args.size)
                result["runs"][name].append(run)
                print(f"[{time.monotonic() - began:5.0f}s] {name} #{rep + 1}: "
                      + ", ".join(f"{k}={run[k]}" for k in ("accepted", "delivered_unique", "duplicates",
                                                           "receiver_p50_ms", "receiver_p99_ms", "e2e_p50_ms",
                                                           "e2e_p99_ms", "receiver_cpu_us_per_event",
                                                           "dispatcher_cpu_us_per_event")), flush=True)
    finally:
        sink.stop()
        node.stop()
    fields = ("receiver_p50_ms", "receiver_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "receiver_cpu_us_per_event",
              "dispatcher_cpu_us_per_event", "whole_run_receiver_p99_ms", "whole_run_e2e_p99_ms",
              "whole_run_cpu_us_per_event")
    result["median"] = {name: {f: statistics.median(r[f] for r in runs) for f in fields}
                        for name, runs in result["runs"].items() if runs}
    result["lost"] = {name: sum(r["accepted"] - r["delivered_unique"] for r in runs)
                      for name, runs in result["runs"].items()}
    result["elapsed_s"] = round(time.monotonic() - began)
    path = write_json("e2e", result)
    plot(result)
    for name, med in result["median"].items():
        print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in med.items()) + f", lost={result['lost'][name]}")
    print(f"wrote {path} in {result['elapsed_s']} s")
    return 1 if any(result["lost"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
