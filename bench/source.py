"""KafkaSource benchmark (`make bench-source`): our source dispatcher beside the peer's, on the same backlogs.

One local Kafka node, one subscriber process (bench/dispatcher.py's, answering at once), two backlogs of ``--count``
records of 1 KB on 4 partitions: ``plain`` records (a key, no headers: each one converted into a CloudEvent as
upstream converts it) and ``cloudevent`` records (binary-mode CloudEvents, passed through). Each run drains one
backlog from the start in a fresh consumer group, unordered, with:

- ours: ``python -m kafka_eventing.dispatcher`` serving one KafkaSource from a file (``KE_SOURCE_NAME``), as its
  Deployment runs it;
- the peer: Knative's Java dispatcher (``bench/peer.py``, built by ``make peer``) with the contract and consumer
  properties Knative writes for a KafkaSource (its kafka-source-dispatcher runs the same jar).

Fairness: each run's first 20 % of events is its warm-up (interpreter start and imports for ours, class loading
and JIT for the JVM, the group join for both); rate and CPU per event are taken over the remaining 80 % (the steady
state) and the whole-run rate is reported beside them. Every run is checked exactly-once **by id** at the
subscriber: the set of ids equals the backlog's and no id arrives twice. The two planes alternate which goes first
in each repeat, and each figure is the median over ``--repeats``. RSS is read at the end of each run. CPU per event
is process CPU (the whole tree) over the steady window, which stays comparable when the machine is busy and rates
are not; the load average is recorded beside the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dispatcher as bd
import peer
import yaml
from _common import ROOT, cpu_seconds, machine_facts, median, new_figure, process_tree, rss_bytes, save_png, write_json

from kafka_eventing.localstack._proc import free_port, terminate
from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode

NS = "bench"
PARTITIONS = 4
KINDS = ("plain", "cloudevent")
PLANES = ("ours", "peer")


def produce_plain(node: KafkaNode, topic: str, count: int, size: int) -> None:
    """``count`` records that are not CloudEvents: a string key, a ``size``-byte value, no headers."""
    from confluent_kafka import Producer

    producer = Producer({**node.client_config(), "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.kbytes": 256 * 1024})
    value = b"x" * size
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, f"key-{i}".encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(300) == 0


def expected_ids(kind: str, count: int) -> set[str]:
    if kind == "cloudevent":
        return {f"bench-{i}" for i in range(count)}
    # Round-robin over the partitions: partition p holds offsets 0..n-1; the converted id names both.
    return {f"partition:{i % PARTITIONS}/offset:{i // PARTITIONS}" for i in range(count)}


class OursRun:
    def __init__(self, node: KafkaNode, workdir: Path, topic: str, url: str) -> None:
        name = f"s{uuid.uuid4().hex[:8]}"
        path = workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource",
            "metadata": {"name": name, "namespace": NS, "uid": name},
            "spec": {"bootstrapServers": [node.bootstrap_servers], "topics": [topic], "consumerGroup": f"g-{name}",
                     "initialOffset": "earliest", "ordering": "unordered", "sink": {"uri": url}}}))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("KE_")},
               "KE_CHANNELS_FILE": str(path), "KE_SOURCE_NAMESPACE": NS, "KE_SOURCE_NAME": name,
               "KE_BOOTSTRAP_SERVERS": node.bootstrap_servers, "KE_DISPATCHER_INITIAL_OFFSET": "earliest",
               "KE_METRICS_PORT": str(free_port()), "KE_LOG_LEVEL": "WARNING"}
        with (workdir / f"{name}.log").open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def pids(self) -> list[int]:
        return process_tree(self.proc.pid)

    def stop(self) -> None:
        terminate(self.proc, timeout=30)  # type: ignore[arg-type]


class PeerRun:
    def __init__(self, node: KafkaNode, workdir: Path, topic: str, url: str) -> None:
        self.proc = peer.start_peer_dispatcher(node.bootstrap_servers, topic, url, workdir, ordered=False,
                                               group=f"bench-src-{uuid.uuid4().hex[:8]}", source=True,
                                               name="source")

    def pids(self) -> list[int]:
        return process_tree(self.proc.pid)

    def stop(self) -> None:
        peer.stop(self.proc)


@contextlib.contextmanager
def running(plane: str, *args: Any) -> Iterator[OursRun | PeerRun]:
    run = OursRun(*args) if plane == "ours" else PeerRun(*args)
    try:
        yield run
    finally:
        run.stop()


def drain(plane: str, node: KafkaNode, workdir: Path, sink: bd.SinkProcess, topic: str, *, kind: str,
          count: int) -> dict[str, Any]:
    path = f"/e2e-{plane}-{kind}-{uuid.uuid4().hex[:8]}"  # /e2e…: the subscriber keeps every id
    with running(plane, node, workdir, topic, sink.url(path)) as run:
        sink.wait_for(path, 1, 180)
        seen0 = sink.wait_for(path, count // 5, 600)
        began, cpu0 = time.monotonic(), cpu_seconds(run.pids())
        whole = sink.wait([path], count, float(os.environ.get("BENCH_WAIT", "900")))[path]
        cpu = cpu_seconds(run.pids()) - cpu0
        seen, _, last = sink.stats()[path]
        rss = rss_bytes(run.pids())
    done = int(seen) - seen0
    ids = [i for i, _ in sink.arrivals(path)]
    want = expected_ids(kind, count)
    return {"rate": done / max(1e-9, last - began), "rate_whole_run": whole,
            "cpu_us_per_event": cpu / max(1, done) * 1e6, "events_per_cpu_second": done / max(1e-9, cpu),
            "rss_mib": rss / 2**20, "delivered": len(ids), "duplicates": len(ids) - len(set(ids)),
            "missing": len(want - set(ids)), "unexpected": len(set(ids) - want)}


def _measure(node: KafkaNode, workdir: Path, args: argparse.Namespace, planes: tuple[str, ...],
             runs: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    topics = {k: f"src-{k}-{uuid.uuid4().hex[:6]}" for k in KINDS}
    for kind, topic in topics.items():
        bd.create_topic(node, topic, PARTITIONS)
        if kind == "plain":
            produce_plain(node, topic, args.count, args.size)
        else:
            bd.produce(node, topic, 0, args.count, args.size, partitions=PARTITIONS)
    sink = bd.SinkProcess()
    try:
        for rep in range(args.repeats):
            order = planes if rep % 2 == 0 else tuple(reversed(planes))  # who goes first alternates
            for kind in KINDS:
                for plane in order:
                    got = drain(plane, node, workdir, sink, topics[kind], kind=kind, count=args.count)
                    runs[plane][kind].append(got)
                    print(f"rep {rep} {kind:10} {plane:4}: {got['rate']:8.0f} ev/s "
                          f"{got['cpu_us_per_event']:6.0f} µs/ev {got['rss_mib']:6.0f} MiB "
                          f"dup {got['duplicates']} missing {got['missing']}  load {os.getloadavg()[0]:.1f}",
                          flush=True)
    finally:
        sink.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="records in each backlog")
    parser.add_argument("--size", type=int, default=1024, help="record value bytes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--plot-only", action="store_true", help="redraw source.png from source.json")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((ROOT / "docs" / "benchmarks" / "source.json").read_text()))
        return 0
    why_not = peer.peer_available()
    planes = PLANES if why_not is None else ("ours",)
    facts = machine_facts(["confluent-kafka", "aiohttp", "uvloop"], kafka=KAFKA_VERSION,
                          peer=peer.build_info() or why_not, count=args.count, size=args.size,
                          repeats=args.repeats, partitions=PARTITIONS)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {k: [] for k in KINDS} for p in planes}
    with tempfile.TemporaryDirectory(prefix="bench-source-") as tmp:
        workdir = Path(tmp)
        node = KafkaNode(workdir / "kafka", heap="1g")
        node.start()
        try:
            _measure(node, workdir, args, planes, runs)
        finally:
            node.stop()
    summary: dict[str, Any] = {}
    for plane, kinds in runs.items():
        for kind, results in kinds.items():
            summary[f"{plane}_{kind}"] = {key: median([r[key] for r in results]) for key in
                                          ("rate", "rate_whole_run", "cpu_us_per_event", "events_per_cpu_second",
                                           "rss_mib")}
            summary[f"{plane}_{kind}"]["exactly_once_by_id"] = all(
                r["duplicates"] == r["missing"] == r["unexpected"] == 0 for r in results)
    if "peer" in planes:
        for kind in KINDS:
            ours, theirs = summary[f"ours_{kind}"], summary[f"peer_{kind}"]
            summary[f"ratio_{kind}"] = {
                "events_per_cpu_second": ours["events_per_cpu_second"] / theirs["events_per_cpu_second"],
                "rss": ours["rss_mib"] / theirs["rss_mib"], "rate": ours["rate"] / theirs["rate"]}
    facts["load_average_at_end"] = list(os.getloadavg())
    result = {"machine": facts, "summary": summary, "runs": runs,
              "targets": {"events_per_cpu_second_vs_peer": ">= 1", "rss_vs_peer": "<= 1/3"}}
    print(write_json("source", result))
    if not args.no_plot:
        plot(result)
    exactly_once = all(v.get("exactly_once_by_id", True) for v in summary.values())
    return 0 if exactly_once else 1


def plot(result: dict[str, Any]) -> None:
    summary = result["summary"]
    planes = [p for p in PLANES if f"{p}_plain" in summary]
    fig, axes = new_figure(ncols=3, width=4.5, height=4.0)
    for ax, (key, label) in zip(axes[0], (("rate", "events/s (steady state)"),
                                       ("events_per_cpu_second", "events per CPU-second"),
                                       ("rss_mib", "RSS MiB")), strict=True):
        for n, plane in enumerate(planes):
            values = [summary[f"{plane}_{kind}"][key] for kind in KINDS]
            ax.bar([x + n * 0.4 for x in range(len(KINDS))], values, width=0.4, label=plane)
        ax.set_xticks([x + 0.2 for x in range(len(KINDS))], KINDS)
        ax.set_title(label)
    axes[0][0].legend()
    m = result["machine"]
    peer_ref = m["peer"].get("ref", "") if isinstance(m["peer"], dict) else "not measured"
    fig.suptitle(f"KafkaSource drain, {m['count']} × {m['size']} B on {PARTITIONS} partitions, unordered, median of "
                 f"{m['repeats']}; peer: Knative {peer_ref} Java dispatcher\n{m['cpu_model']}, {m['cores']} cores, "
                 f"load {m['load_average_at_start'][0]:.1f} at start, "
                 f"{m.get('load_average_at_end', [0])[0]:.1f} at end", fontsize=9)
    fig.tight_layout()
    print(save_png(fig, "source"))


if __name__ == "__main__":
    sys.exit(main())
