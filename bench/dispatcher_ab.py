"""Dispatcher A/B: the same backlog drained by the dispatcher of several source trees, interleaved in one run.

    git archive main src | tar -x -C /tmp/base
    .venv/bin/python bench/dispatcher_ab.py base=/tmp/base/src new=src [new4m=src:KE_QUEUED_MAX_MESSAGES_KBYTES=4096]

Each ``NAME=SRC[:K=V,...]`` runs ``python -m kafka_eventing.dispatcher`` with ``PYTHONPATH=SRC`` (and the extra
environment) over the same topic (4 partitions, ``--count`` events of ``--size`` bytes, a fresh consumer group each
time), to the subscriber process of bench/dispatcher.py, alternating trees within every repeat so that a noisy
machine moves them alike. Reported per run: the rate at the subscriber, process CPU µs per event from the first
event on (and per thread: ``main`` is the event loop, ``python`` the poll thread, ``rdk`` librdkafka's), peak RSS, and
the subscriber's own CPU µs per event. ``--profile PREFIX`` records each run with py-spy (raw collapsed stacks).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import dispatcher as bd
from _common import ROOT, cpu_seconds, median

from kafka_eventing.localstack.kafka import KafkaNode


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread kind: main (the event loop), python (other Python threads), rdk (librdkafka)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        key = "main" if task.name == str(pid) else ("rdk" if name.startswith("rdk:") else name)
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / 100
    return out


def run_one(node: KafkaNode, workdir: Path, sink: bd.SinkProcess, topic: str, count: int, *, ordered: bool,
            src: str, env: dict[str, str], profile: str | None, delay_ms: int = 0) -> dict[str, Any]:
    path = (f"/slow{delay_ms}" if delay_ms else "") + f"/ab-{uuid.uuid4().hex[:8]}"
    bd.DISPATCHER_ENV.clear()
    bd.DISPATCHER_ENV.update({"PYTHONPATH": src, **env})
    with bd.dispatcher(node, workdir, topic, [("s1", sink.url(path))], ordered=ordered, max_in_flight=64,
                       partitions=4) as run:
        seen0 = sink.wait_for(path, 1, 120)
        cpu0, sink0, threads0 = run.cpu(), cpu_seconds([sink.proc.pid]), threads_cpu(run.proc.pid)
        spy = None
        if profile:
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(run.proc.pid),
                                    "-r", "200", "-f", "raw", "-o", profile, "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        deadline = time.monotonic() + 300
        while sink.stats().get(path, [0])[0] < count and time.monotonic() < deadline:
            peak = max(peak, run.rss())
            time.sleep(0.2)
        rate = sink.wait([path], count, 300)[path]
        cpu, sink_cpu, threads1 = run.cpu() - cpu0, cpu_seconds([sink.proc.pid]) - sink0, threads_cpu(run.proc.pid)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        n = max(1, count - seen0)
        threads = {k: round((v - threads0.get(k, 0.0)) / n * 1e6, 1) for k, v in threads1.items()
                   if v > threads0.get(k, 0.0)}
        return {"rate": rate, "cpu_us": cpu / n * 1e6, "rss_mib": max(peak, run.rss()) / 2**20,
                "sink_cpu_us": sink_cpu / n * 1e6, "threads_cpu_us": threads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", metavar="NAME=SRC[:K=V,...]")
    parser.add_argument("--count", type=int, default=50000)
    parser.add_argument("--size", type=int, default=1024, help="event data bytes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="unordered,ordered")
    parser.add_argument("--delay-ms", type=int, default=0, help="the subscriber answers after this many ms")
    parser.add_argument("--profile", default="", metavar="PREFIX", help="py-spy raw profiles: PREFIX-NAME-MODE-N.txt")
    parser.add_argument("--out", default="", help="write the runs and medians as JSON here")
    args = parser.parse_args()
    trees = []
    for spec in args.trees:
        name, _, rest = spec.partition("=")
        src, _, extra = rest.partition(":")
        trees.append((name, str(Path(src).resolve()), dict(e.split("=", 1) for e in extra.split(",") if e)))
    workdir = ROOT / ".cache" / "bench-dispatcher-ab"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    node = KafkaNode(workdir / "kafka", heap="1g")
    node.start()
    sink = bd.SinkProcess()
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        topic = "ab.rates"
        bd.create_topic(node, topic, 4)
        bd.produce(node, topic, 0, args.count, args.size)
        print(f"produced {args.count} events of {args.size} B", flush=True)
        for rep in range(args.repeats):
            for mode in args.modes.split(","):
                for name, src, env in trees:
                    profile = f"{args.profile}-{name}-{mode}-{rep}.txt" if args.profile else None
                    out = run_one(node, workdir, sink, topic, args.count, ordered=mode == "ordered", src=src,
                                  env=env, profile=profile, delay_ms=args.delay_ms)
                    runs.setdefault(f"{name}/{mode}", []).append(out)
                    print(f"repeat {rep + 1} {mode:9} {name:10} {out['rate']:8.0f}/s {out['cpu_us']:6.1f} µs/event "
                          f"RSS {out['rss_mib']:5.1f} MiB subscriber {out['sink_cpu_us']:.1f} µs "
                          f"threads {out['threads_cpu_us']}", flush=True)
    finally:
        sink.stop()
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    summary = {key: {"median": {f: median([o[f] for o in outs]) for f in ("rate", "cpu_us", "rss_mib")},
                     "runs": outs} for key, outs in runs.items()}
    print("medians:")
    for key, value in summary.items():
        med = value["median"]
        print(f"  {key:22} {med['rate']:8.0f}/s {med['cpu_us']:6.1f} µs/event RSS {med['rss_mib']:5.1f} MiB")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
