"""The reprocessing jobs on a standalone Spark cluster (a master and two 1-core workers on loopback), through the
command line with ``--master spark://…``: the same output as local mode, the work spread over both executors.

Local mode (``local[2]``) keeps every task in one JVM; a cluster ships the job's Python code, the Kafka connector
jars (``spark.jars``) and the shuffles across executors, which is what this file makes every CI run exercise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_reprocess import Sink, _event, _produce, _produce_raw

from kafka_eventing.core.delivery import DeliverySpec
from kafka_eventing.core.kafka_config import connection_from_secret
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.spark import StandaloneCluster
from kafka_eventing.localstack.tools import cache_dir
from kafka_eventing.reprocess.archive import run_archive
from kafka_eventing.reprocess.http_sink import HttpSinkPolicy
from kafka_eventing.reprocess.kafka_options import spark_kafka_options
from kafka_eventing.reprocess.replay import Filters, HttpTarget, run_redrive, run_replay
from kafka_eventing.reprocess.session import SPARK_KAFKA_VERSION
from kafka_eventing.reprocess.sources import read_topic
from kafka_eventing.reprocess.stats import run_stats

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(1500)]

#: Manifest fields that name the run rather than describe its outcome.
_RUN_FIELDS = {"run_id", "run_dir", "started", "finished", "seconds", "sink", "attempt"}


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    s.thread.start()
    try:
        yield s
    finally:
        s.server.shutdown()
        s.server.server_close()


def _cli(cluster: StandaloneCluster, kafka: KafkaNode, job: str, *args: str, code: int = 0) -> str:
    """One job through ``python -m kafka_eventing.reprocess`` against the cluster; its stdout."""
    jars = cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars"
    conf = cluster.session_conf()  # one executor per worker, started once both have registered
    cmd = [sys.executable, "-m", "kafka_eventing.reprocess", job, *args, "--master", cluster.master_url,
           "--jars", str(jars), "--driver-memory", "512m", "--bootstrap-servers", kafka.bootstrap_servers,
           *[f"--conf={k}={v}" for k, v in conf.items()]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_KAFKA_")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == code, f"{job} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def _rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    df = spark.read.parquet(path)
    cols = sorted(df.columns)
    return sorted(tuple(repr(r[c]) for c in cols) for r in df.select(*cols).collect())


def _requests(sink: Sink, path: str) -> list[tuple[str, tuple[tuple[str, str], ...], bytes]]:
    def kept(h: dict[str, str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, v) for k, v in h.items() if k.startswith("ce-") or k == "content-type"))

    return sorted((h["ce-id"], kept(h), body) for p, h, body in sink.requests if p == path)


def _manifest(run_dir: Path, target: str) -> dict[str, Any]:
    written = json.loads((run_dir / "manifest.json").read_text().replace(target, "<target>"))
    return {k: v for k, v in written.items() if k not in _RUN_FIELDS}


def test_every_job_on_a_standalone_cluster_matches_local_mode(
    spark: Any, spark_cluster: StandaloneCluster, kafka_running: KafkaNode, topic: str, sink: Sink,
    tmp_path: Path,
) -> None:
    events = [_event(i, knativeerrordest=f"{sink.url}/orig", knativeerrorcode=str(500 + i % 3),
                     knativeerrordata="b29wcw==") for i in range(60)]
    _produce(kafka_running, topic, events)  # 3 partitions, binary and structured records
    _produce_raw(kafka_running, topic, b"not a cloudevent")
    sink.script = {"ev-7": [400] * 4}  # failed both times, in the manifests alike
    options = dict(spark_kafka_options(connection_from_secret(kafka_running.connection_secret())))
    policy = HttpSinkPolicy(delivery=DeliverySpec(retry=0))
    where = "type = 'com.example.t1' OR traceid LIKE 'trace-2%'"

    # Local mode, in this process: the reference.
    local = tmp_path / "local"
    run_archive(spark, topic=topic, output=str(local / "archive"), checkpoint=str(local / "ckpt"),
                kafka_options=options, timeout=300)
    run_replay(spark, read_topic(spark, topic, options), HttpTarget(url=f"{sink.url}/local", policy=policy),
               run_dir=local / "replay", source={"topic": topic, "start": None, "end": None,
                                                 "starting_offsets": None, "ending_offsets": None},
               filters=Filters(where=where))
    run_redrive(spark, read_topic(spark, topic, options), url=f"{sink.url}/local-redrive", policy=policy,
                run_dir=local / "redrive", source={"topic": topic, "start": None, "end": None,
                                                   "starting_offsets": None, "ending_offsets": None},
                filters=Filters())
    run_stats(read_topic(spark, topic, options), local / "stats", title=topic)

    # The same jobs on the cluster, through the command line.
    remote = tmp_path / "cluster"
    _cli(spark_cluster, kafka_running, "archive", "--topic", topic, "--output", str(remote / "archive"),
         "--checkpoint", str(remote / "ckpt"))
    _cli(spark_cluster, kafka_running, "replay", "--topic", topic, "--to-url", f"{sink.url}/cluster",
         "--where", where, "--retry", "0", "--run-dir", str(remote / "replay"), code=3)
    _cli(spark_cluster, kafka_running, "redrive", "--topic", topic, "--to-url", f"{sink.url}/cluster-redrive",
         "--retry", "0", "--run-dir", str(remote / "redrive"), code=3)
    _cli(spark_cluster, kafka_running, "stats", "--topic", topic, "--out", str(remote / "stats"))

    assert _rows(spark, str(remote / "archive")) == _rows(spark, str(local / "archive"))
    assert len(_rows(spark, str(local / "archive"))) == 61
    for job, here, there in (("replay", "/local", "/cluster"), ("redrive", "/local-redrive", "/cluster-redrive")):
        assert _requests(sink, there) == _requests(sink, here), job
        assert _requests(sink, here), job
        assert _manifest(remote / job, sink.url + there) == _manifest(local / job, sink.url + here), job
        assert _manifest(local / job, sink.url + here)["counts"]["failed"] == 1, job
    for name in ("counts.csv", "errors.csv"):
        assert (remote / "stats" / name).read_text() == (local / "stats" / name).read_text(), name

    # Each job's tasks ran on both executors, one per worker (their own logs say which tasks they finished).
    apps = {a["name"]: a["id"] for a in spark_cluster.apps()}
    for job in ("archive", "replay", "redrive", "stats"):
        tasks = spark_cluster.task_counts(apps[f"kafka-eventing-{job}"])
        workers = {name.split("/")[0] for name, n in tasks.items() if n > 0}
        assert workers == {"worker-0", "worker-1"}, (job, tasks)
