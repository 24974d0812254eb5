"""Spark reprocessing throughput: archive and replay (topic → topic) at local[1] and local[2], beside a
single-process baseline (confluent-kafka reader + the same core decoding + pyarrow Parquet writer) on the same data
in the same run. Writes docs/benchmarks/spark.json and spark.png.

Targets from the issue: archive scaling ≥ 1.7× from 1 to 2 cores; archive ≥ 50,000 events/s per core (1 KB events).
The machine is shared: the load average is recorded before and after each measurement.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import machine_facts, median, new_figure, save_png, write_json
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.kafka_config import connection_from_secret
from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode
from kafka_eventing.reprocess.archive import run_archive
from kafka_eventing.reprocess.events import decode_record
from kafka_eventing.reprocess.kafka_options import spark_kafka_options
from kafka_eventing.reprocess.replay import TopicTarget, run_replay
from kafka_eventing.reprocess.session import build_session
from kafka_eventing.reprocess.sources import read_topic

PARTITIONS = 4


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


def baseline(node: KafkaNode, topic: str, n: int, out: Path) -> float:
    """One process: read with confluent-kafka, decode with the core binding, write Parquet with pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    consumer = Consumer({**node.client_config(), "group.id": uuid.uuid4().hex, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    written = 0
    while written + len(rows) < n:
        for msg in consumer.consume(5000, timeout=1.0):
            if msg.error():
                continue
            headers = [{"key": k, "value": v} for k, v in msg.headers() or []]
            row = decode_record(msg.key(), msg.value(), headers,
                                datetime.fromtimestamp(msg.timestamp()[1] / 1000, UTC))
            row.update(topic=msg.topic(), partition=msg.partition(), offset=msg.offset())
            rows.append(row)
        if len(rows) >= 20000 or written + len(rows) >= n:
            pq.write_table(pa.Table.from_pylist(rows), out / f"part-{written}.parquet")
            written += len(rows)
            rows = []
    seconds = time.monotonic() - started
    consumer.close()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1024, help="data bytes per event")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cores", default="1,2")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    node = KafkaNode(work / "kafka", heap="1g")
    node.start()
    results: dict[str, Any] = {"archive": {}, "replay": {}, "baseline": {}}
    try:
        topic = f"bench.{uuid.uuid4().hex[:8]}"
        admin = AdminClient(node.client_config())
        for fut in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
            fut.result(timeout=30)
        produce(node, topic, args.events, args.size)
        options = spark_kafka_options(connection_from_secret(node.connection_secret()))
        facts = machine_facts(["pyspark", "pyarrow", "confluent-kafka", "cloudevents"],
                              kafka=KAFKA_VERSION, events=args.events, event_data_bytes=args.size,
                              partitions=PARTITIONS)

        runs = []
        for r in range(args.repeat):
            out = work / f"baseline-{r}"
            out.mkdir()
            load = os.getloadavg()[0]
            seconds = baseline(node, topic, args.events, out)
            runs.append({"seconds": seconds, "events_per_s": args.events / seconds, "load_1m": load})
            print(f"baseline: {args.events / seconds:,.0f} events/s (load {load:.1f})", flush=True)
        results["baseline"] = {"runs": runs, "median_events_per_s": median([x["events_per_s"] for x in runs])}

        for cores in (int(c) for c in args.cores.split(",")):
            spark = build_session(master=f"local[{cores}]", app_name=f"bench-{cores}", shuffle_partitions=cores,
                                  conf={"spark.ui.showConsoleProgress": "false"})
            # Warm up the JVM and the Python workers so the first measurement is not a start-up cost.
            run_archive(spark, topic=topic, output=str(work / f"warm-{cores}"), kafka_options=options,
                        checkpoint=str(work / f"warm-ck-{cores}"), max_offsets_per_trigger=2000)
            for job in ("archive", "replay"):
                runs = []
                for r in range(args.repeat):
                    load = os.getloadavg()[0]
                    if job == "archive":
                        res = run_archive(spark, topic=topic, output=str(work / f"a-{cores}-{r}"),
                                          checkpoint=str(work / f"ck-{cores}-{r}"), kafka_options=options)
                        seconds, count = res.seconds, res.records
                    else:
                        dest = f"{topic}.replay.{cores}.{r}"
                        for fut in admin.create_topics([NewTopic(dest, PARTITIONS, 1)]).values():
                            fut.result(timeout=30)
                        started = time.monotonic()
                        manifest = run_replay(spark, read_topic(spark, topic, options, keep_raw=True),
                                              TopicTarget(dest, options), run_dir=work / f"run-{cores}-{r}",
                                              source={"topic": topic})
                        seconds, count = time.monotonic() - started, manifest.counts["succeeded"]
                    assert count == args.events, (job, count)
                    runs.append({"seconds": seconds, "events_per_s": count / seconds, "load_1m": load})
                    print(f"{job} local[{cores}]: {count / seconds:,.0f} events/s (load {load:.1f})", flush=True)
                results[job][f"local[{cores}]"] = {
                    "runs": runs, "median_events_per_s": median([x["events_per_s"] for x in runs])}
            spark.stop()
    finally:
        node.stop()
        shutil.rmtree(work, ignore_errors=True)

    arch = results["archive"]
    one, two = arch.get("local[1]", {}).get("median_events_per_s"), arch.get("local[2]", {}).get("median_events_per_s")
    summary = {
        "archive_scaling_1_to_2": (two / one) if one and two else None,
        "archive_events_per_s_per_core_local1": one,
        "archive_vs_baseline_local2": (two / results["baseline"]["median_events_per_s"]) if two else None,
        "targets": {"archive_scaling_min": 1.7, "archive_events_per_s_per_core_min": 50000},
        "load_1m_at_end": os.getloadavg()[0],
    }
    data = {"machine": facts, "results": results, "summary": summary}
    print(write_json("spark", data))

    fig, axes = new_figure(1, width=8.0, height=4.5)
    ax = axes[0][0]
    labels, values = ["baseline\n(1 process)"], [results["baseline"]["median_events_per_s"]]
    for job in ("archive", "replay"):
        for key, val in results[job].items():
            labels.append(f"{job}\n{key}")
            values.append(val["median_events_per_s"])
    ax.bar(labels, values, color=["tab:gray", *["tab:blue", "tab:blue", "tab:green", "tab:green"][:len(values) - 1]])
    ax.axhline(50000, color="tab:red", linestyle="--", linewidth=1, label="target 50k/s per core")
    ax.set_ylabel("events/s (median)")
    load = facts["load_average_at_start"][0]
    ax.set_title(f"Spark reprocessing, {args.events} × {args.size} B events, load ≈ {load:.0f} on 2 cores")
    ax.legend(fontsize=8)
    print(save_png(fig, "spark"))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
