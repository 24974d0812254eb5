"""The reprocessing jobs on a standalone Spark cluster (a master and two 1-core workers on loopback): the archive
through the command line with ``--master spark://…``, replay, redrive and stats in one more application of the same
driver (``reprocess_cluster_driver.py``): the same output as local mode, each job's work spread over both executors.

Local mode (``local[2]``) keeps every task in one JVM; a cluster ships the job's Python code, the Kafka connector
jars (``spark.jars``) and the shuffles across executors, which is what this file makes every CI run exercise. An
executor lost mid-archive or mid-replay is proven once, on executor pods (tests/e2e/_spark_pods.py, the kind tier):
Spark replaces it the same way on either master, and what this project adds (the archive's exactness, the
manifest's resends) does not depend on the master.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.reprocess import Sink, _event, _produce, _produce_raw

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

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(900)]

DRIVER = Path(__file__).with_name("reprocess_cluster_driver.py")

#: Manifest fields that name the run rather than describe its outcome.
_RUN_FIELDS = {"run_id", "run_dir", "started", "finished", "seconds", "sink", "attempt"}


@contextlib.contextmanager
def _driver(tmp_path: Path, argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A cluster-mode driver in its own process, its output in ``driver.log``; killed on the way out if it still
    runs (a failed assertion must not leave it behind)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_KAFKA_")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    with (tmp_path / "driver.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _log_tail(tmp_path: Path) -> str:
    return (tmp_path / "driver.log").read_text(errors="replace")[-4000:]


def _on_cluster(spark_cluster: StandaloneCluster, kafka_running: KafkaNode) -> list[str]:
    """The CLI's arguments that run a job on the standalone cluster."""
    jars = cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars"
    return ["--master", spark_cluster.master_url, "--jars", str(jars), "--driver-memory", "512m",
            "--bootstrap-servers", kafka_running.bootstrap_servers,
            *[f"--conf={k}={v}" for k, v in spark_cluster.session_conf().items()]]


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

    # The cluster's driver in its own process, started first: its JVM and executors come up while local mode runs.
    remote = tmp_path / "cluster"
    spec = {"master": spark_cluster.master_url, "conf": spark_cluster.session_conf(),
            "jars": str(cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars"),
            "bootstrap_servers": kafka_running.bootstrap_servers, "kafka_options": options, "topic": topic,
            "sink": sink.url, "where": where, "out": str(remote), "result": str(tmp_path / "result.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    with _driver(tmp_path, [sys.executable, str(DRIVER), str(tmp_path / "spec.json")]) as driver:
        # Local mode, in this process: the reference.
        local = tmp_path / "local"
        run_archive(spark, topic=topic, output=str(local / "archive"), checkpoint=str(local / "ckpt"),
                    kafka_options=options, timeout=300)
        source = {"topic": topic, "start": None, "end": None, "starting_offsets": None, "ending_offsets": None}
        run_replay(spark, read_topic(spark, topic, options), HttpTarget(url=f"{sink.url}/local", policy=policy),
                   run_dir=local / "replay", source=source, filters=Filters(where=where))
        run_redrive(spark, read_topic(spark, topic, options), url=f"{sink.url}/local-redrive", policy=policy,
                    run_dir=local / "redrive", source=source, filters=Filters())
        run_stats(read_topic(spark, topic, options), local / "stats", title=topic)
        code = driver.wait(timeout=600)
    log_tail = _log_tail(tmp_path)
    assert code == 0, log_tail
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["archive_exit"] == 0, log_tail

    assert _rows(spark, str(remote / "archive")) == _rows(spark, str(local / "archive"))
    assert len(_rows(spark, str(local / "archive"))) == 61
    for job, here, there in (("replay", "/local", "/cluster"), ("redrive", "/local-redrive", "/cluster-redrive")):
        assert _requests(sink, there) == _requests(sink, here), job
        assert _requests(sink, here), job
        assert _manifest(remote / job, sink.url + there) == _manifest(local / job, sink.url + here), job
        assert _manifest(local / job, sink.url + here)["counts"]["failed"] == 1, job
    for name in ("counts.csv", "errors.csv"):
        assert (remote / "stats" / name).read_text() == (local / "stats" / name).read_text(), name

    # Each job's tasks ran on both executors, one per worker (their own logs say which tasks they finished): the
    # archive in the command line's own application, the others by their job groups' stages in the second one.
    apps = spark_cluster.apps()
    (jobs_app,) = [a for a in apps if a["id"] == result["app_id"]]
    archive_app = max((a for a in apps if a["name"] == "kafka-eventing-archive" and a["starttime"] <= jobs_app[
        "starttime"]), key=lambda a: a["starttime"])  # the command line's, just before the driver's second one
    runs: dict[str, dict[str, int]] = {"archive": spark_cluster.task_counts(archive_app["id"])}
    for job, stages in result["stages"].items():
        assert stages, job
        runs[job] = spark_cluster.task_counts(result["app_id"], set(stages))
    assert set(runs) == {"archive", "replay", "redrive", "stats"}
    for job, tasks in runs.items():
        workers = {name.split("/")[0] for name, n in tasks.items() if n > 0}
        assert workers == {"worker-0", "worker-1"}, (job, tasks)


def test_no_executor_ends_the_job_with_one_line_and_writes_nothing(
    spark_cluster: StandaloneCluster, kafka_running: KafkaNode, topic: str, tmp_path: Path,
) -> None:
    # More memory than any worker offers: the master never starts an executor (as a missing image or a Role
    # without pods/create leaves executor pods pending on Kubernetes), and Spark alone would wait for ever.
    _produce(kafka_running, topic, [_event(i) for i in range(3)])
    # The session's own wait for executors (120 s in session_conf) is shortened: it counts within the 10 s.
    conf = {**spark_cluster.session_conf(), "spark.executor.memory": "4g",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "5s"}
    out = tmp_path / "archive"
    jars = cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_KAFKA_")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        [sys.executable, "-m", "kafka_eventing.reprocess", "archive", "--topic", topic, "--output", str(out),
         "--master", spark_cluster.master_url, "--executor-timeout", "10", "--jars", str(jars),
         "--driver-memory", "512m", "--bootstrap-servers", kafka_running.bootstrap_servers,
         *[f"--conf={k}={v}" for k, v in conf.items()]],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 5, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("kafka-eventing reprocess")]
    assert lines == [f"kafka-eventing reprocess archive: no executor started within 10 s on "
                     f"{spark_cluster.master_url} (check the executor image and its pull secret, the driver's RBAC "
                     "for pods, and that a node or worker offers the executor's cores and memory)"], done.stderr[-3000:]
    assert not out.exists()  # no archive and no checkpoint a later run would resume from
    status = spark_cluster.status()
    assert status["activeapps"] == []  # the application ended with the driver: nothing of it left on the workers
    app = max((a for a in status["completedapps"] if a["name"] == "kafka-eventing-archive"),
              key=lambda a: a["starttime"])
    assert spark_cluster.task_counts(app["id"]) == {}  # no executor of it was ever started on a worker
