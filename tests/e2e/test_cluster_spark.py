"""The reprocessing jobs on Spark-on-Kubernetes executor pods of the real-pod cluster (`make test-cluster`): the chart's
archive CronJob and replay Job with ``reprocess.cluster`` on — their pod the driver, two executor pods from the
project's Spark image (`make cluster-spark-image`) — produce exactly what the same jobs produce in local mode.

The chart is rendered with ``helm template`` and only its reprocessing objects are applied (the settings ConfigMap,
the ServiceAccount and driver Role, the executors' pod template, the CronJob and the Job): the service roles play no
part in these jobs. The cluster has no DNS, so ``reprocess.cluster.master`` names the ``kubernetes`` Service by
address; the executors reach the driver at its pod IP (downward API), as the chart sets it for every cluster. Output
and run folders are a hostPath volume on the one node (mounted at its host path), the single-node stand-in for the
ReadWriteMany volume cluster mode needs. The local-mode reference runs the same command line with
``--master local[2]`` in the cluster's network namespace, where Kafka and the replay target are; nothing reaches a
pod address from outside it.

- archive and replay on 2 executor pods: the same Parquet rows, the same requests (ids, CloudEvent headers, bodies)
  and the same manifest as local mode; both executors were pods Running during the run (restricted, no API token,
  owned by the driver pod), and no executor pod is left once the Job is complete;
- an executor pod killed mid-archive (force-deleted, as a lost node would lose it): Spark starts a third executor
  pod in its place and the archive still holds every record exactly once.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import _netns_clients as clients
from e2e import _spark_clients as spark_clients
from e2e._scenario import wait
from e2e.test_cluster import Cluster
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.tools import cache_dir, tool_path
from kafka_eventing.reprocess.session import SPARK_KAFKA_VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kafka-eventing"
#: `make cluster-spark-image`'s archive, imported into this module's cluster besides `make cluster-images`'.
SPARK_IMAGE = kc.workdir() / "spark" / "kafka-eventing-spark.tar"
NS = "reprocess"
RELEASE = "ke"
#: The `kubernetes` Service by address: there is no cluster DNS to resolve kubernetes.default.svc.
MASTER = f"k8s://https://{kc.SERVICE_IP}:443"
#: Spark's label on executor pods.
EXECUTOR = "spark-role=executor"
PARTITIONS = 3
EVENTS = 60
#: Records per micro-batch of the killed archive: 20 batches.
BATCH = 3
#: The chart's reprocessing objects: everything a reprocess Job needs, and nothing of the service roles.
SHOW_ONLY = ("templates/config.yaml", "templates/reprocess/serviceaccount.yaml", "templates/reprocess/rbac.yaml",
             "templates/reprocess/executor-template.yaml", "templates/reprocess/cronjob-archive.yaml",
             "templates/reprocess/job-replay.yaml")
#: Manifest fields that name the run rather than describe its outcome.
RUN_FIELDS = {"run_id", "run_dir", "started", "finished", "seconds", "sink", "attempt"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not SPARK_IMAGE.exists():
        pytest.fail(f"{SPARK_IMAGE} missing: run `make cluster-spark-image`")
    (spark_ref,) = kc.archive_refs([SPARK_IMAGE])
    try:
        state = kc.up(ttl=3600, extra_images=[SPARK_IMAGE])
    except kc.ClusterError as exc:
        kc.down()
        pytest.fail(f"the cluster did not start: {exc}")
    pool = multiprocessing.get_context("spawn").Pool(1, initializer=clients.init, initargs=(int(state["pid"]),))
    try:
        cl = Cluster(state, {"spark": spark_ref}, pool)
        cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield cl
    finally:
        pool.terminate()
        pool.join()
        kc.down()
        assert kc.leftovers() == [], "cluster-down left things behind"


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """The folder every pod of a run mounts (hostPath): the spark image's UID 185 writes there."""
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    return out


# ---------------------------------------------------------------------------------------------- helpers


def _install(cl: Cluster, shared: Path, tmp_path: Path, *, archive: list[str] | None = None,
             replay: list[str] | None = None) -> list[dict[str, Any]]:
    """Apply the chart's reprocessing objects with ``reprocess.cluster`` on; returns what was applied."""
    values = {
        "image": {"registry": "docker.io/library", "tag": cl.images["spark"].rsplit(":", 1)[1],
                  "pullPolicy": "Never"},
        "kafka": {"bootstrapServers": cl.state["bootstrap_servers"]},
        "reprocess": {
            "extraVolumes": [{"name": "out", "hostPath": {"path": str(shared), "type": "Directory"}}],
            # At the same path as on the host: the archive's commit log (_spark_metadata) records absolute paths,
            # and the test reads the archive on the host.
            "extraVolumeMounts": [{"name": "out", "mountPath": str(shared)}],
            "cluster": {"enabled": True, "master": MASTER, "executors": 2,
                        # Two executors' whole cores would fill this 2-core node's allocatable CPU.
                        "conf": {"spark.kubernetes.executor.request.cores": "250m"}},
            # The CronJob is started by hand (a Job from it), never by its schedule during the test.
            "archive": {"enabled": archive is not None, "args": archive or [], "schedule": "0 0 1 1 *",
                        "backoffLimit": 0},
            "replay": {"enabled": replay is not None, "args": replay or []},
        },
    }
    values_file = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    shown = [a for path in SHOW_ONLY for a in ("--show-only", path)
             if ("archive" not in path or archive is not None) and ("replay" not in path or replay is not None)]
    rendered = subprocess.run([str(tool_path("helm")), "template", RELEASE, str(CHART), "-n", NS, "-f",
                               str(values_file), *shown], capture_output=True, text=True, check=True,
                              timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    cl.apply(*docs)
    return docs


def _start_archive(cl: Cluster, job: str, applied: list[dict[str, Any]]) -> None:
    """A Job from the chart's archive CronJob, as `kubectl create job --from` starts a run by hand."""
    (cronjob,) = [d["metadata"]["name"] for d in applied if d["kind"] == "CronJob"]
    cl.kubectl("create", "job", job, f"--from=cronjob/{cronjob}", "-n", NS)


def _job_status(cl: Cluster, job: str) -> str | None:
    conditions = cl.get("job", job, "-n", NS)["status"].get("conditions") or ()
    return next((c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"),
                None)


def _executor_pods(cl: Cluster) -> list[dict[str, Any]]:
    return list(cl.get("pods", "-n", NS, "-l", EXECUTOR)["items"])


def _run(cl: Cluster, job: str, during: Callable[[list[dict[str, Any]]], None] | None = None,
         timeout: float = 1200) -> dict[str, dict[str, Any]]:
    """Wait for ``job`` to complete, watching its executor pods; returns every executor pod seen Running (by name).
    ``during`` is called with the executor pods at each look."""
    running: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        pods = _executor_pods(cl)
        for pod in pods:
            if pod["status"].get("phase") == "Running":
                running.setdefault(pod["metadata"]["name"], pod)
        if during is not None:
            during(pods)
        status = _job_status(cl, job)
        if status:
            break
        time.sleep(1)
    logs = cl.kubectl("logs", f"job/{job}", "-n", NS, check=False).stdout
    assert status == "Complete", f"job {job}: {status or 'still running'} after the wait\n{logs[-6000:]}"
    # The driver's Role is all it needs: nothing it asked the API server for was refused (at the end, either).
    assert " is forbidden" not in logs, logs[-6000:]
    return running


def _assert_executor_pods(cl: Cluster, running: dict[str, dict[str, Any]], job: str) -> None:
    """Two executors ran as pods of the project's image, restricted and without an API token, owned by the driver
    pod; none is left now that the Job is complete."""
    (driver,) = [p for p in cl.get("pods", "-n", NS, "-l", f"job-name={job}")["items"]]
    assert len(running) >= 2, running.keys()
    for pod in running.values():
        spec = pod["spec"]
        (container,) = spec["containers"]
        assert container["image"] == cl.images["spark"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        owners = [o["name"] for o in pod["metadata"].get("ownerReferences") or ()]
        assert owners == [driver["metadata"]["name"]], owners
        assert pod["status"]["podIP"] != driver["status"]["podIP"]  # pods of their own, not threads of the driver
    wait(f"{job}'s executor pods gone", lambda: not _executor_pods(cl), timeout=120, interval=2)


def _local(cl: Cluster, *args: str) -> None:
    """The same job in local mode, in the cluster's network namespace (Kafka and the target are there)."""
    jars = cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars"  # the image has them in pyspark's jars/
    cl.run(["env", "SPARK_LOCAL_IP=127.0.0.1", sys.executable, "-m", "kafka_eventing.reprocess", *args,
            "--master", "local[2]", "--jars", str(jars), "--bootstrap-servers", cl.state["bootstrap_servers"]],
           timeout=900)


def _rows(spark: Any, path: Path) -> list[tuple[str, ...]]:
    """The archive's rows as Spark reads them (a streaming sink's files through its _spark_metadata log)."""
    df = spark.read.parquet(str(path))
    cols = sorted(df.columns)
    return sorted(tuple(repr(r[c]) for c in cols) for r in df.select(*cols).collect())


def _requests(ledger: Path, path: str) -> list[tuple[str, tuple[tuple[str, str], ...], bytes]]:
    if not ledger.exists():
        return []
    seen = [json.loads(line) for line in ledger.read_text().splitlines() if line]
    return sorted((r["headers"]["ce-id"], tuple(sorted(r["headers"].items())), base64.b64decode(r["body"]))
                  for r in seen if r["path"] == path)


def _manifest(run_dir: Path, target: str) -> dict[str, Any]:
    written = json.loads((run_dir / "manifest.json").read_text().replace(target, "<target>"))
    return {k: v for k, v in written.items() if k not in RUN_FIELDS}


def _topic(cl: Cluster) -> str:
    topic = f"spark-{uuid.uuid4().hex[:8]}"
    ids = cl.in_netns(spark_clients.produce_events, cl.state["bootstrap_servers"], topic, EVENTS, PARTITIONS)
    assert len(ids) == EVENTS
    return topic


# ---------------------------------------------------------------------------------------------- tests


def test_archive_and_replay_on_executor_pods_match_local_mode(
    cluster: Cluster, shared: Path, tmp_path: Path, spark: Any,
) -> None:
    cl = cluster
    topic = _topic(cl)
    port = free_port()  # free in the namespace too: nothing listens there but the cluster
    ledger = tmp_path / "requests.jsonl"
    sink = multiprocessing.get_context("spawn").Process(
        target=spark_clients.run_sink, args=(cl.pid, kc.NODE_IP, port, str(ledger), 1800), daemon=True)
    sink.start()
    target = f"http://{kc.NODE_IP}:{port}"
    try:
        # The reference: local mode, the same command lines.
        local = tmp_path / "local"
        _local(cl, "archive", "--topic", topic, "--output", str(local / "archive"))
        _local(cl, "replay", "--topic", topic, "--to-url", f"{target}/local", "--run-dir", str(local / "replay"))

        _start_archive(cl, "archive-1", _install(cl, shared, tmp_path, archive=[
            "archive", "--topic", topic, "--output", f"{shared}/archive"]))
        _assert_executor_pods(cl, _run(cl, "archive-1"), "archive-1")

        (job,) = [d for d in _install(cl, shared, tmp_path, replay=[
            "replay", "--topic", topic, "--to-url", f"{target}/cluster", "--run-dir", f"{shared}/replay"])
            if d["kind"] == "Job"]
        name = job["metadata"]["name"]
        _assert_executor_pods(cl, _run(cl, name), name)
    finally:
        sink.terminate()
        sink.join(10)

    rows = _rows(spark, shared / "archive")
    assert rows == _rows(spark, local / "archive")
    assert len(rows) == EVENTS
    replayed = _requests(ledger, "/cluster")
    assert replayed == _requests(ledger, "/local")
    assert sorted(r[0] for r in replayed) == sorted(f"ev-{i}" for i in range(EVENTS))  # each event once
    assert _manifest(shared / "replay", f"{target}/cluster") == _manifest(local / "replay", f"{target}/local")
    assert _manifest(local / "replay", f"{target}/local")["counts"]["succeeded"] == EVENTS


def test_a_killed_executor_pod_is_replaced_and_the_archive_is_still_exact(
    cluster: Cluster, shared: Path, tmp_path: Path, spark: Any,
) -> None:
    cl = cluster
    topic = _topic(cl)
    local = tmp_path / "local"
    _local(cl, "archive", "--topic", topic, "--output", str(local / "archive"))

    # Batches of BATCH records, so the run outlives the first one by long enough for a new executor pod to start;
    # an executor pod is force-deleted (its containers killed at once, as a lost node's are) once the first batch
    # is committed.
    _start_archive(cl, "archive-kill", _install(cl, shared, tmp_path, archive=[
        "archive", "--topic", topic, "--output", f"{shared}/archive", "--max-offsets-per-trigger", str(BATCH)]))
    killed: list[str] = []

    def kill_one(pods: list[dict[str, Any]]) -> None:
        if killed or not (shared / "archive" / "_checkpoint" / "commits" / "0").exists():
            return
        victims = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
        if victims:
            cl.kubectl("delete", "pod", victims[0], "-n", NS, "--grace-period=0", "--force", "--wait=false")
            killed.append(victims[0])

    running = _run(cl, "archive-kill", during=kill_one)
    assert killed, "the archive ended before an executor could be killed"
    # Spark asked for an executor in the killed one's place: a third executor pod ran.
    ids = sorted(int(p["metadata"]["labels"]["spark-exec-id"]) for p in running.values())
    assert len(ids) >= 3 and killed[0] in running, (ids, killed, sorted(running))
    wait("the executor pods gone", lambda: not _executor_pods(cl), timeout=120, interval=2)

    rows = _rows(spark, shared / "archive")
    assert rows == _rows(spark, local / "archive")  # every record once: none lost, none twice
    assert len(rows) == EVENTS
