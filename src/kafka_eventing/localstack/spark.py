"""A standalone Spark cluster (a master and N workers) from the installed PySpark's own ``bin/spark-class``, on
loopback: what the tests and the Spark benchmark run the jobs against to get a multi-executor plan on one machine.

Every port is free and on 127.0.0.1 (RPC and web UIs: the UIs bind where ``SPARK_LOCAL_IP`` says), each daemon's
heap is bounded (``SPARK_DAEMON_MEMORY``), each worker offers ``cores`` cores and ``memory`` to executors, and the
REST submission gateway stays off.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_eventing.localstack._proc import free_port, terminate

#: An executor's log line for each task it finished: "Finished task 1.0 in stage 3.0 (TID 7). …".
_FINISHED = re.compile(r"Finished task \S+ in stage (\d+)\.\d+ ")


class SparkClusterError(RuntimeError):
    pass


def spark_home() -> Path:
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise SparkClusterError(f"{home}/bin/spark-class missing: the pyspark install is incomplete")
    return home


@dataclass
class StandaloneCluster:
    base: Path
    workers: int = 2
    cores: int = 1
    memory: str = "640m"  # what a worker offers its executors
    executor_memory: str = "512m"
    master_url: str = ""
    master_ui: str = ""
    work_dirs: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOCAL_HOSTNAME": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m", "SPARK_NO_DAEMONIZE": "1",
                "SPARK_LOG_DIR": str(self.base), "SPARK_CONF_DIR": str(self.base / "conf"),
                "PYSPARK_PYTHON": sys.executable,
                "SPARK_DAEMON_JAVA_OPTS": "-Dspark.master.rest.enabled=false"}

    def _spawn(self, cls: str, args: list[str], log: str) -> None:
        with (self.base / log).open("wb") as out:
            self.procs.append(subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), cls, *args], stdout=out, stderr=subprocess.STDOUT,
                env=self._env(), start_new_session=True))

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        (self.base / "conf").mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        self.master_url, self.master_ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}"
        self._spawn("org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)], "master.log")
        for i in range(self.workers):
            work = self.base / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self.work_dirs.append(work)
            self._spawn("org.apache.spark.deploy.worker.Worker",
                        ["--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
                         "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work),
                         self.master_url], f"worker-{i}.log")
        deadline, alive = time.monotonic() + timeout, 0
        while time.monotonic() < deadline and all(p.poll() is None for p in self.procs):
            try:
                alive = sum(w["state"] == "ALIVE" for w in self.status()["workers"])
            except OSError:
                alive = 0
            if alive == self.workers:
                return self
            time.sleep(1)
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.base.glob("*.log")))
        self.stop()
        raise SparkClusterError(f"standalone Spark cluster did not come up ({alive}/{self.workers} workers):\n{logs}")

    def stop(self) -> None:
        for proc in reversed(self.procs):  # workers first: each stops its executors
            terminate(proc, timeout=30)
        self.procs.clear()

    def status(self) -> dict[str, Any]:
        """The master's status JSON: workers, active and completed applications."""
        with urllib.request.urlopen(f"{self.master_ui}/json", timeout=10) as resp:  # noqa: S310 (http://127.0.0.1)
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def apps(self) -> list[dict[str, Any]]:
        return list(self.status()["completedapps"])

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    def session_conf(self) -> dict[str, str]:
        """Spark settings of a driver on this machine using every worker: one executor per worker, started only
        once all have registered, and no waiting for a preferred executor (Kafka's source prefers one executor per
        partition by hash, which on a small topic can be the same one), so a plan is spread over all of them; the
        driver on loopback."""
        return {"spark.executor.memory": self.executor_memory, "spark.executor.cores": str(self.cores),
                "spark.cores.max": str(self.cores * self.workers),
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s", "spark.locality.wait": "0s",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}

    def executors(self) -> dict[str, int]:
        """Running executor JVMs, ``worker-N/<app id>/<executor id>`` → pid: a worker starts each in its own
        directory under the worker's work dir (the executor's Python workers share it, hence the command check)."""
        out: dict[str, int] = {}
        works = {work.resolve(): work.name for work in self.work_dirs}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cwd = Path(os.readlink(proc / "cwd"))
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:  # gone, or not ours
                continue
            if cwd.parent.parent in works and b"CoarseGrainedExecutorBackend" in cmdline:
                out[f"{works[cwd.parent.parent]}/{cwd.parent.name}/{cwd.name}"] = int(proc.name)
        return out

    def task_counts(self, app_id: str, stages: Collection[int] | None = None) -> dict[str, int]:
        """Tasks each executor of ``app_id`` finished (of ``stages`` only, if given), from the executors' own logs
        in the workers' work dirs (``worker-N/<executor id>``)."""
        out: dict[str, int] = {}
        for work in self.work_dirs:
            for stderr in sorted((work / app_id).glob("*/stderr")):
                done = _FINISHED.findall(stderr.read_text(errors="replace"))
                out[f"{work.name}/{stderr.parent.name}"] = sum(stages is None or int(s) in stages for s in done)
        return out
