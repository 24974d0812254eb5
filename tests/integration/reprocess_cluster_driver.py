"""The Spark driver of ``test_reprocess_cluster``, run as its own process (one JVM per process can hold one
SparkContext, and the test's own process holds the local-mode one).

One driver JVM serves every job: the archive through the command line (``reprocess.cli.main`` with ``--master
spark://…``, its own application, as the chart's CronJob runs it), then replay, redrive and stats in one more
application on the same JVM, each in a job group so the test can tell which executor ran which job's tasks.
Usage: ``python reprocess_cluster_driver.py SPEC.json``; the result goes to ``SPEC.json``'s ``result`` path.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from kafka_eventing.core.delivery import DeliverySpec
from kafka_eventing.reprocess import cli
from kafka_eventing.reprocess.http_sink import HttpSinkPolicy
from kafka_eventing.reprocess.replay import Filters, HttpTarget, run_redrive, run_replay
from kafka_eventing.reprocess.session import build_session
from kafka_eventing.reprocess.sources import read_topic
from kafka_eventing.reprocess.stats import run_stats

JOBS = ("replay", "redrive", "stats")


def _stages(spark: Any, timeout: float = 60.0) -> dict[str, list[int]]:
    """Stage ids of each job group, once the status store has every job of each as ended (it learns of them
    from the listener bus, a little after the action returns)."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    while True:
        out: dict[str, list[int]] = {}
        done = True
        for group in JOBS:
            infos = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
            done = done and bool(infos) and all(i is not None and i.status != "RUNNING" for i in infos)
            out[group] = sorted(s for i in infos if i is not None for s in i.stageIds)
        if done or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    conf_flags = [f"--conf={k}={v}" for k, v in spec["conf"].items()]
    common = ["--master", spec["master"], "--jars", spec["jars"], "--driver-memory", "512m",
              "--bootstrap-servers", spec["bootstrap_servers"], *conf_flags]
    out = Path(spec["out"])
    result: dict[str, Any] = {}
    result["archive_exit"] = cli.main(["archive", "--topic", spec["topic"], "--output", str(out / "archive"),
                                       "--checkpoint", str(out / "ckpt"), *common])

    spark = build_session(master=spec["master"], app_name="kafka-eventing-cluster-jobs", jars=[spec["jars"]],
                          conf=spec["conf"])
    try:
        sc = spark.sparkContext
        result["app_id"] = sc.applicationId
        options, topic, sink = spec["kafka_options"], spec["topic"], spec["sink"]
        policy = HttpSinkPolicy(delivery=DeliverySpec(retry=0))
        source = {"topic": topic, "start": None, "end": None, "starting_offsets": None, "ending_offsets": None}
        sc.setJobGroup("replay", "replay")
        run_replay(spark, read_topic(spark, topic, options), HttpTarget(url=f"{sink}/cluster", policy=policy),
                   run_dir=out / "replay", source=source, filters=Filters(where=spec["where"]))
        sc.setJobGroup("redrive", "redrive")
        run_redrive(spark, read_topic(spark, topic, options), url=f"{sink}/cluster-redrive", policy=policy,
                    run_dir=out / "redrive", source=source, filters=Filters())
        sc.setJobGroup("stats", "stats")
        run_stats(read_topic(spark, topic, options), out / "stats", title=topic)
        result["stages"] = _stages(spark)
    finally:
        spark.stop()
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
