"""Spark archive throughput at local[1] and local[2], beside a single-process baseline (confluent-kafka reader +
the same columnar decoding + pyarrow Parquet writer, partitioned the same way) on the same data in the same run;
replay (topic → topic) on a smaller topic for reference. Writes docs/benchmarks/spark.json and spark.png.

Targets from the issue: archive scaling ≥ 1.7× from 1 to 2 cores; archive ≥ 50,000 events/s per core (1 KB events).

Rates reported per run:
- wall: events / the whole ``run_archive`` call (query start, every micro-batch, stop);
- steady: events / the summed ``triggerExecution`` time of the micro-batches (Spark's query progress), i.e.
  without the query's start-up and shutdown — what a long catch-up converges to;
- CPU seconds per 1,000 events of the Spark JVM + its Python workers (+ the idle driver), from /proc, so
  efficiency per core is visible on a shared machine; and the Kafka broker's and everything else's share of the
  machine's CPU during the run (the broker runs on the same cores: read the scaling number with it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import (
    CLK_TCK,
    ROOT,
    machine_cpu_ticks,
    machine_facts,
    median,
    new_figure,
    process_tree,
    save_png,
    write_json,
)
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.kafka_config import connection_from_secret
from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode
from kafka_eventing.localstack.spark import StandaloneCluster
from kafka_eventing.reprocess.archive import PARTITION_COLUMNS, run_archive
from kafka_eventing.reprocess.events import decode_batch
from kafka_eventing.reprocess.kafka_options import spark_kafka_options
from kafka_eventing.reprocess.replay import TopicTarget, run_replay
from kafka_eventing.reprocess.session import build_session, connector_jars
from kafka_eventing.reprocess.sources import read_topic

PARTITIONS = 4
WARM_EVENTS = 20_000  # a small topic archived first in each session (JIT, Python workers)


def produce(node: KafkaNode, topic: str, n: int, size: int) -> None:
    producer = Producer({**node.client_config(), "linger.ms": 20, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 200000})
    base = datetime(2024, 6, 1, tzinfo=UTC)
    payload = os.urandom(size)
    for i in range(n):
        ev = CloudEvent({"id": f"b-{i}", "source": "/bench", "type": f"bench.t{i % 4}", "specversion": "1.0",
                         "time": base + timedelta(seconds=i), "region": "eu"}, payload)
        rec = event_to_kafka(ev)
        while True:
            try:
                producer.produce(topic, rec.value, rec.key, headers=rec.headers)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0


def _tree_cpu(root: int, exclude: set[int]) -> float:
    """CPU seconds of ``root`` and its descendants, minus the ``exclude`` subtrees. Live processes count their
    own time and that of the children they reaped (PySpark's daemon reaps its workers), so nothing is lost
    when a worker exits mid-run."""
    skip: set[int] = set()
    for pid in exclude:
        skip.update(process_tree(pid))
    total = 0
    for pid in process_tree(root):
        if pid in skip:
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / CLK_TCK


@dataclass
class Meter:
    """CPU used between ``start()`` and ``stop()``: ours (driver + JVM + Python workers, and a standalone cluster's
    daemons with their executors), the broker's, the rest."""

    broker_pid: int
    cluster_pids: tuple[int, ...] = ()

    def _ours(self) -> float:
        return _tree_cpu(os.getpid(), {self.broker_pid}) + sum(_tree_cpu(p, set()) for p in self.cluster_pids)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.ours0 = self._ours()
        self.broker0 = _tree_cpu(self.broker_pid, set())
        self.machine0 = machine_cpu_ticks()
        self.load = os.getloadavg()[0]

    def stop(self, events: int) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        ours = self._ours() - self.ours0
        broker = _tree_cpu(self.broker_pid, set()) - self.broker0
        end = machine_cpu_ticks()
        busy, total = end.busy - self.machine0.busy, end.total - self.machine0.total
        capacity = total / CLK_TCK  # CPU seconds the machine had (all cores) during the run
        return {
            "wall_seconds": wall, "wall_events_per_s": events / wall,
            "cpu_seconds": ours, "cpu_seconds_per_1k_events": 1000 * ours / events,
            "events_per_cpu_second": events / ours if ours else None,
            "broker_cpu_seconds": broker, "broker_cpu_share": broker / capacity if capacity else None,
            "our_cpu_share": ours / capacity if capacity else None,
            "other_cpu_share": max(0.0, busy / CLK_TCK - ours - broker) / capacity if capacity else None,
            "load_1m_before": self.load,
        }


def _arrow_source(msgs: list[Any]) -> Any:
    """confluent-kafka messages → the batch layout Spark's Kafka source gives ``mapInArrow``."""
    import pyarrow as pa

    from kafka_eventing.reprocess.events import _arrow_type

    return pa.RecordBatch.from_arrays([
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in m.headers() or ()] for m in msgs], _arrow_type("headers")),
        pa.array([m.topic() for m in msgs], pa.string()),
        pa.array([m.partition() for m in msgs], pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        pa.array([m.timestamp()[1] * 1000 for m in msgs], pa.timestamp("us", tz="UTC")),
    ], names=["key", "value", "headers", "topic", "partition", "offset", "timestamp"])


def baseline(node: KafkaNode, topic: str, n: int, out: Path) -> None:
    """One process: read with confluent-kafka, decode with the same columnar binding as the Spark job, write
    Parquet with pyarrow partitioned by event_date/type (snappy, as Spark)."""
    import pyarrow.dataset as ds

    consumer = Consumer({**node.client_config(), "group.id": uuid.uuid4().hex, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = part = 0
    while seen < n:
        msgs = [m for m in consumer.consume(10000, timeout=1.0) if not m.error()]
        if not msgs:
            continue
        seen += len(msgs)
        ds.write_dataset(decode_batch(_arrow_source(msgs)), out, format="parquet", partitioning=list(PARTITION_COLUMNS),
                         partitioning_flavor="hive", basename_template=f"part-{part}-{{i}}.parquet",
                         existing_data_behavior="overwrite_or_ignore")
        part += 1
    consumer.close()


def archive_run(spark: Any, meter: Meter, *, work: Path, name: str, topic: str, options: Any, events: int,
                max_offsets: int | None) -> dict[str, Any]:
    meter.start()
    res = run_archive(spark, topic=topic, output=str(work / f"a-{name}"), checkpoint=str(work / f"ck-{name}"),
                      kafka_options=options, max_offsets_per_trigger=max_offsets)
    run = meter.stop(res.records)
    assert res.records == events, (name, res.records)
    trigger_ms = sum(b["duration_ms"].get("triggerExecution", 0) for b in res.per_batch)
    run.update(batches=res.batches, steady_seconds=trigger_ms / 1000,
               steady_events_per_s=res.records / (trigger_ms / 1000) if trigger_ms else None,
               per_batch=[{"records": b["records"], "trigger_ms": b["duration_ms"].get("triggerExecution"),
                           "add_batch_ms": b["duration_ms"].get("addBatch")} for b in res.per_batch])
    shutil.rmtree(work / f"a-{name}", ignore_errors=True)
    return run


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("wall_events_per_s", "steady_events_per_s", "cpu_seconds_per_1k_events", "events_per_cpu_second",
            "broker_cpu_share", "other_cpu_share")
    return {"runs": runs, **{f"median_{k}": median([r[k] for r in runs if r.get(k) is not None]) for k in keys
                             if any(r.get(k) is not None for r in runs)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=400_000, help="archive events (≈ size bytes each on disk)")
    parser.add_argument("--size", type=int, default=1024, help="data bytes per event")
    parser.add_argument("--replay-events", type=int, default=20_000, help="events on the replay topic (0: skip)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cores", default="1,2")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000,
                        help="archive micro-batch size (several batches give a steady-state rate)")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value (A/B tests)")
    parser.add_argument("--standalone", default="",
                        help="also archive on a standalone cluster (localstack.spark) of these executor counts, "
                             "1 core each, e.g. 1,2; --cores '' runs only these and the baseline")
    parser.add_argument("--name", default="spark", help="docs/benchmarks/<name>.json and .png")
    args = parser.parse_args()
    # The connector jars are found under $KE_CACHE (`make` exports it), and every Spark process here, the driver
    # included, binds and advertises loopback only.
    os.environ.setdefault("KE_CACHE", str(ROOT / ".cache"))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if not connector_jars(None):
        raise SystemExit(f"the Spark Kafka connector is not in {os.environ['KE_CACHE']}: run `make setup`")

    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    need = 3 * args.events * (args.size + 300)  # Kafka log + the largest output + slack
    if shutil.disk_usage(work).free < need:
        raise SystemExit(f"need ~{need / 2**30:.1f} GiB free in {work.parent}")
    node = KafkaNode(work / "kafka", heap="1g")
    node.start()
    assert node._proc is not None  # the broker's process, to tell its CPU from ours
    meter = Meter(node._proc.pid)
    extra_conf = dict(kv.split("=", 1) for kv in args.conf)
    results: dict[str, Any] = {"archive": {}, "replay": {}, "baseline": {}}
    try:
        run_id = uuid.uuid4().hex[:8]
        topic, replay_topic, warm_topic = f"bench.{run_id}", f"bench.replay.{run_id}", f"bench.warm.{run_id}"
        admin = AdminClient(node.client_config())
        for fut in admin.create_topics([NewTopic(t, PARTITIONS, 1)
                                        for t in (topic, replay_topic, warm_topic)]).values():
            fut.result(timeout=30)
        started = time.monotonic()
        produce(node, topic, args.events, args.size)
        produce(node, warm_topic, WARM_EVENTS, args.size)
        if args.replay_events:
            produce(node, replay_topic, args.replay_events, args.size)
        print(f"produced in {time.monotonic() - started:.0f}s", flush=True)
        options = spark_kafka_options(connection_from_secret(node.connection_secret()))
        facts = machine_facts(["pyspark", "pyarrow", "confluent-kafka", "cloudevents"],
                              kafka=KAFKA_VERSION, events=args.events, event_data_bytes=args.size,
                              replay_events=args.replay_events, partitions=PARTITIONS,
                              max_offsets_per_trigger=args.max_offsets_per_trigger, spark_conf=extra_conf)

        runs = []
        for r in range(args.repeat):
            out = work / f"baseline-{r}"
            meter.start()
            baseline(node, topic, args.events, out)
            runs.append(meter.stop(args.events))
            shutil.rmtree(out, ignore_errors=True)
            print(f"baseline: {runs[-1]['wall_events_per_s']:,.0f} events/s, "
                  f"{runs[-1]['cpu_seconds_per_1k_events']:.3f} CPU s/1k", flush=True)
        results["baseline"] = _summary(runs)

        for n in (int(c) for c in args.standalone.split(",") if c):
            cluster = StandaloneCluster(work / f"cluster-{n}", workers=n, cores=1, memory="1400m",
                                        executor_memory="1g").start()
            try:
                spark = build_session(master=cluster.master_url, app_name=f"bench-standalone-{n}",
                                      shuffle_partitions=n, conf={**cluster.session_conf(),
                                                                  "spark.ui.showConsoleProgress": "false",
                                                                  **extra_conf})
                cmeter = Meter(meter.broker_pid, tuple(cluster.pids()))
                run_archive(spark, topic=warm_topic, output=str(work / f"warm-s{n}"), kafka_options=options,
                            checkpoint=str(work / f"warm-ck-s{n}"), max_offsets_per_trigger=WARM_EVENTS // 2)
                runs = []
                for r in range(args.repeat):
                    runs.append(archive_run(spark, cmeter, work=work, name=f"s{n}-{r}", topic=topic,
                                            options=options, events=args.events,
                                            max_offsets=args.max_offsets_per_trigger))
                    x = runs[-1]
                    print(f"archive standalone {n} executor(s): wall {x['wall_events_per_s']:,.0f} ev/s, steady "
                          f"{x['steady_events_per_s']:,.0f} ev/s, {x['cpu_seconds_per_1k_events']:.3f} CPU s/1k",
                          flush=True)
                results["archive"][f"standalone {n}x1"] = _summary(runs)
                spark.stop()
            finally:
                cluster.stop()

        for cores in (int(c) for c in args.cores.split(",") if c):
            spark = build_session(master=f"local[{cores}]", app_name=f"bench-{cores}", shuffle_partitions=cores,
                                  conf={"spark.ui.showConsoleProgress": "false", **extra_conf})
            # Warm up the JVM and the Python workers so the first measurement is not a start-up cost.
            run_archive(spark, topic=warm_topic, output=str(work / f"warm-{cores}"), kafka_options=options,
                        checkpoint=str(work / f"warm-ck-{cores}"), max_offsets_per_trigger=WARM_EVENTS // 2)
            shutil.rmtree(work / f"warm-{cores}", ignore_errors=True)
            # ...and one full run, not counted: the JVM's JIT keeps speeding the job up over the first ~10^6
            # events (measured: local[1] 12.9k → 15.6k → 17.8k events/s in three runs after the small warm-up),
            # and the JVM outlives the session, so without this the later master ran warmer than the first.
            archive_run(spark, meter, work=work, name=f"{cores}-warm", topic=topic, options=options,
                        events=args.events, max_offsets=args.max_offsets_per_trigger)
            runs = []
            for r in range(args.repeat):
                runs.append(archive_run(spark, meter, work=work, name=f"{cores}-{r}", topic=topic, options=options,
                                        events=args.events, max_offsets=args.max_offsets_per_trigger))
                x = runs[-1]
                print(f"archive local[{cores}]: wall {x['wall_events_per_s']:,.0f} ev/s, steady "
                      f"{x['steady_events_per_s']:,.0f} ev/s, {x['cpu_seconds_per_1k_events']:.3f} CPU s/1k, "
                      f"broker {x['broker_cpu_share']:.0%} other {x['other_cpu_share']:.0%} of the machine",
                      flush=True)
            # The fixed cost of a run with nothing new (query start, offsets check, stop).
            meter.start()
            run_archive(spark, topic=topic, output=str(work / f"a-{cores}-0"), kafka_options=options,
                        checkpoint=str(work / f"ck-{cores}-0"))
            empty = time.monotonic() - meter.t0
            results["archive"][f"local[{cores}]"] = {**_summary(runs), "empty_run_seconds": empty}
            if args.replay_events:
                runs = []
                for r in range(args.repeat):
                    dest = f"{replay_topic}.{cores}.{r}"
                    for fut in admin.create_topics([NewTopic(dest, PARTITIONS, 1)]).values():
                        fut.result(timeout=30)
                    meter.start()
                    manifest = run_replay(spark, read_topic(spark, replay_topic, options, keep_raw=True),
                                          TopicTarget(dest, options), run_dir=work / f"run-{cores}-{r}",
                                          source={"topic": replay_topic})
                    assert manifest.counts["succeeded"] == args.replay_events
                    runs.append(meter.stop(args.replay_events))
                    print(f"replay local[{cores}]: {runs[-1]['wall_events_per_s']:,.0f} events/s", flush=True)
                results["replay"][f"local[{cores}]"] = _summary(runs)
            spark.stop()
    finally:
        node.stop()
        shutil.rmtree(work, ignore_errors=True)

    arch, base = results["archive"], results["baseline"]
    one, two = arch.get("local[1]", {}), arch.get("local[2]", {})

    def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
        return a[key] / b[key] if a.get(key) and b.get(key) else None

    summary = {
        "rates": "wall = events / whole run_archive call; steady = events / summed micro-batch triggerExecution "
                 "(query progress); cpu = Spark JVM + Python workers + driver, from /proc",
        "archive_scaling_1_to_2_steady": ratio(two, one, "median_steady_events_per_s"),
        "archive_scaling_1_to_2_wall": ratio(two, one, "median_wall_events_per_s"),
        "archive_steady_events_per_s_local1": one.get("median_steady_events_per_s"),
        "archive_events_per_cpu_second_local1": one.get("median_events_per_cpu_second"),
        "archive_events_per_cpu_second_local2": two.get("median_events_per_cpu_second"),
        "baseline_events_per_cpu_second": base.get("median_events_per_cpu_second"),
        "archive_vs_baseline_local2_wall": ratio(two, base, "median_wall_events_per_s"),
        "broker_cpu_share_local2": two.get("median_broker_cpu_share"),
        "targets": {"archive_scaling_min": 1.7, "archive_events_per_s_per_core_min": 50000},
        "load_1m_at_end": os.getloadavg()[0],
    }
    data = {"machine": facts, "results": results, "summary": summary}
    print(write_json(args.name, data))

    fig, axes = new_figure(2, width=6.0, height=4.5)
    labels = ["baseline\n(1 process)", *(f"archive\n{k}" for k in arch)]
    rows = [base, *arch.values()]
    ax = axes[0][0]
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [r.get("median_wall_events_per_s", 0) for r in rows], 0.4, label="wall")
    ax.bar([x + 0.2 for x in xs], [r.get("median_steady_events_per_s", 0) for r in rows], 0.4, label="steady")
    ax.axhline(50000, color="tab:red", linestyle="--", linewidth=1, label="target 50k/s per core")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("events/s (median)")
    ax.set_title(f"{args.events:,} × {args.size} B events, 2 cores shared with the broker")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ax.bar(labels, [r.get("median_events_per_cpu_second", 0) for r in rows], color="tab:green")
    ax.set_ylabel("events per CPU second (median)")
    ax.set_title("efficiency: Spark JVM + Python workers (baseline: its process)")
    print(save_png(fig, args.name))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
