"""The reprocessing jobs on Spark-on-Kubernetes executor pods, on kind (the ``test_spark_…`` tests of
tests/e2e/test_kind.py, the one tier that runs them).

The chart is rendered with ``helm template`` and only its reprocessing objects are applied (the settings ConfigMap,
the ServiceAccount and driver Role, the executors' pod template, the CronJob and the Job): the service roles play no
part in these jobs. With ``reprocess.cluster`` on, the job's pod is the driver of two executor pods from the
project's Spark image (`make cluster-spark-image`); the driver reaches the API server at the chart's default master
(the ``kubernetes`` Service by cluster DNS, as in a real install), the executors reach the driver at its pod IP, as
the chart sets it for every cluster.
The reference is the same chart job in local mode (``--master local[2]``, the chart's default, one pod). Output and
run folders are a hostPath volume on the one node, mounted at the same path as on the host (the archive's commit log
records absolute paths, and the test reads the archive and the journals on the host): the single-node stand-in for
the ReadWriteMany volume cluster mode needs. Events are produced, and replayed requests received, by a pod of the
receiver image (the scenario's sink, whose log is the ledger, reached by its Service), so no test process talks to
a pod's address.

- archive and replay on 2 executor pods: the same Parquet rows, the same requests (ids, CloudEvent headers, bodies)
  and the same manifest as local mode; both executors were pods Running during the run (restricted, no API token,
  owned by the driver pod), and no executor pod is left once the Job is complete;
- an executor pod killed mid-archive (force-deleted, as a lost node would lose it): Spark starts another executor
  pod in its place and the archive still holds every record exactly once;
- an executor pod killed mid-replay while its task is sending: every event of the window is delivered at least
  once, and each event delivered twice is one the manifest reports as possibly resent.

Kafka's address and the host folder the node shares are the :class:`Tier` the test passes in. Nothing here imports
pytest.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from e2e._scenario import RESTRICTED_POD, Kube, get, sink_container, sink_events, wait
from kafka_eventing.localstack.tools import tool_path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kafka-eventing"
NS = "reprocess"
RELEASE = "ke"
SINK_POD = "spark-sink"
#: Spark's label on executor pods.
EXECUTOR = "spark-role=executor"
PARTITIONS = 3
EVENTS = 60
#: Records per micro-batch of the killed archive: 60 batches, so the run outlives the killed executor's replacement
#: (on kind: Pending 5 s after the kill and Running at 7 s, 39 s before the archive ended, with the driver's 5 s pod
#: poll; with Spark's 30 s poll the replacement came 20 s after the kill, and in one CI run not before the end).
BATCH = 1
#: The chart's reprocessing objects: everything a reprocess Job needs, and nothing of the service roles. The driver's
#: Role and the executors' template exist only in cluster mode.
SHOW_ONLY = ("templates/config.yaml", "templates/reprocess/serviceaccount.yaml", "templates/reprocess/rbac.yaml",
             "templates/reprocess/executor-template.yaml", "templates/reprocess/cronjob-archive.yaml",
             "templates/reprocess/job-replay.yaml")
CLUSTER_ONLY = ("rbac.yaml", "executor-template.yaml")
#: Manifest fields that name the run rather than describe its outcome.
RUN_FIELDS = {"run_id", "run_dir", "started", "finished", "seconds", "sink", "attempt"}
#: A Kubernetes pod UID in a cgroup path: ``pod<uid>`` (cgroupfs) or ``pod<uid with _>.slice`` (systemd driver).
POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")

# Run in the sink pod (the receiver image): ``count`` CloudEvents on a new topic of ``partitions`` partitions, binary
# and (every third) structured, JSON and binary data, some with a subject: what the archive and the replay must carry
# unchanged. Prints the ids as a JSON list.
PRODUCE = """
import json, sys
from datetime import UTC, datetime
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_eventing.core.binding import CloudEvent, ContentMode, event_to_kafka
bootstrap, topic, count, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
admin = AdminClient({"bootstrap.servers": bootstrap})  # held: the futures fail once it is destroyed
for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
    future.result(30)
producer = Producer({"bootstrap.servers": bootstrap})
ids = []
for i in range(count):
    attrs = {"id": f"ev-{i}", "source": "/e2e/spark", "type": f"com.example.t{i % 2}", "specversion": "1.0",
             "time": datetime(2026, 11, 1 + i % 3, 10, 0, i % 60, tzinfo=UTC), "traceid": f"trace-{i}"}
    if i % 4 == 1:
        attrs["subject"] = f"subject-{i}"
    if i % 2:
        attrs["datacontenttype"] = "application/json"
        event = CloudEvent(attrs, {"n": i, "text": "\\u00e9"})
    else:
        event = CloudEvent(attrs, bytes([i % 256]) * 17 + b"\\x00\\xff")
    record = event_to_kafka(event, ContentMode.STRUCTURED if i % 3 == 2 else ContentMode.BINARY)
    producer.produce(topic, record.value, record.key, headers=record.headers, partition=i % partitions)
    ids.append(f"ev-{i}")
assert producer.flush(30) == 0, "records not acknowledged"
print(json.dumps(ids))
"""


class Cluster(Kube, Protocol):
    def apply(self, *docs: dict[str, Any]) -> None: ...


@dataclass
class Tier:
    """Where the reprocessing jobs run."""

    kube: Cluster
    spark_image: str  # the spark image's reference in the node
    receiver_image: str  # the sink pod's
    bootstrap_servers: str  # Kafka, as pods reach it
    shared: Path  # a host folder the node has at the same path, writable by pods


# ---------------------------------------------------------------------------------------------- the parts


def start_sink(tier: Tier) -> str:
    """The namespace and the sink pod (and its Service): returns the sink's URL (the Service's) for the jobs' pods."""
    labels = {"app": SINK_POD}
    tier.kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": SINK_POD, "namespace": NS, "labels": labels},
         "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                  "terminationGracePeriodSeconds": 1,
                  "containers": [{**sink_container(tier.receiver_image, "Never"),
                                  # A replay's window in the log, each body in base64: more than a channel's sink.
                                  "resources": {"limits": {"memory": "128Mi"}}}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SINK_POD, "namespace": NS},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
    )
    tier.kube.kubectl("wait", "--for=condition=Ready", f"pod/{SINK_POD}", "-n", NS, "--timeout=300s", timeout=360)
    return f"http://{SINK_POD}.{NS}.svc.cluster.local"


def produce(tier: Tier) -> str:
    """A new topic holding the scenario's :data:`EVENTS` events (written from the sink pod); returns its name."""
    topic = f"spark-{uuid.uuid4().hex[:8]}"
    out = tier.kube.kubectl("exec", "-n", NS, SINK_POD, "--", "python", "-c", PRODUCE, tier.bootstrap_servers, topic,
                            str(EVENTS), str(PARTITIONS), timeout=180).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [f"ev-{i}" for i in range(EVENTS)], out
    return topic


def run_folder(tier: Tier) -> Path:
    """A fresh folder under the shared one, writable by the spark image's UID 185."""
    folder = tier.shared / uuid.uuid4().hex[:8]
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def install(tier: Tier, shared: Path, *, cluster: bool = True, archive: list[str] | None = None,
            replay: list[str] | None = None) -> list[dict[str, Any]]:
    """Apply the chart's reprocessing objects (with ``reprocess.cluster`` on, or in local mode: ``--master local[2]``
    in the job's pod); returns what was applied."""
    local = [] if cluster else ["--master", "local[2]"]
    values = {
        "image": {"registry": "docker.io/library", "tag": tier.spark_image.rsplit(":", 1)[1],
                  "pullPolicy": "Never"},
        "kafka": {"bootstrapServers": tier.bootstrap_servers},
        "reprocess": {
            "extraVolumes": [{"name": "out", "hostPath": {"path": str(shared), "type": "Directory"}}],
            "extraVolumeMounts": [{"name": "out", "mountPath": str(shared)}],
            "cluster": {"enabled": cluster, "executors": 2,
                        # Two executors' whole cores would fill a 2-core node's allocatable CPU. The driver
                        # learns of a force-deleted executor pod at its next poll of the pods ("the driver
                        # missed the deletion event", its log says): every 5 s, not Spark's 30, so the killed
                        # executor's replacement starts well before the archive ends.
                        "conf": {"spark.kubernetes.executor.request.cores": "250m",
                                 "spark.kubernetes.executor.apiPollingInterval": "5s"}},
            # The CronJob is started by hand (a Job from it), never by its schedule during the test.
            "archive": {"enabled": archive is not None, "args": [*archive, *local] if archive else [],
                        "schedule": "0 0 1 1 *", "backoffLimit": 0},
            "replay": {"enabled": replay is not None, "args": [*replay, *local] if replay else []},
        },
    }
    values_file = shared / f"values-{uuid.uuid4().hex[:6]}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    shown = [a for path in SHOW_ONLY for a in ("--show-only", path)
             if ("archive" not in path or archive is not None) and ("replay" not in path or replay is not None)
             and (cluster or not path.endswith(CLUSTER_ONLY))]
    rendered = subprocess.run([str(tool_path("helm")), "template", RELEASE, str(CHART), "-n", NS, "-f",
                               str(values_file), *shown], capture_output=True, text=True, check=True,
                              timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    tier.kube.apply(*docs)
    return docs


def start_archive(tier: Tier, applied: list[dict[str, Any]]) -> str:
    """A Job from the chart's archive CronJob, as `kubectl create job --from` starts a run by hand; its name."""
    (cronjob,) = [d["metadata"]["name"] for d in applied if d["kind"] == "CronJob"]
    job = f"archive-{uuid.uuid4().hex[:6]}"
    tier.kube.kubectl("create", "job", job, f"--from=cronjob/{cronjob}", "-n", NS)
    return job


def replay_job(applied: list[dict[str, Any]]) -> str:
    (job,) = [d["metadata"]["name"] for d in applied if d["kind"] == "Job"]
    return str(job)


def _job_status(tier: Tier, job: str) -> str | None:
    conditions = get(tier.kube, "job", job, "-n", NS)["status"].get("conditions") or ()
    return next((c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"),
                None)


def executor_pods(tier: Tier) -> list[dict[str, Any]]:
    return list(get(tier.kube, "pods", "-n", NS, "-l", EXECUTOR)["items"])


def run(tier: Tier, job: str, during: Callable[[list[dict[str, Any]]], None] | None = None,
        timeout: float = 1200, interval: float = 1.0) -> dict[str, dict[str, Any]]:
    """Wait for ``job`` to complete, watching its executor pods; returns every executor pod seen Running (by name).
    ``during`` is called with the executor pods at each look."""
    running: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        pods = executor_pods(tier)
        for pod in pods:
            if pod["status"].get("phase") == "Running":
                running.setdefault(pod["metadata"]["name"], pod)
        if during is not None:
            during(pods)
        status = _job_status(tier, job)
        if status:
            break
        time.sleep(interval)
    logs = driver_logs(tier, job)
    assert status == "Complete", f"job {job}: {status or 'still running'} after the wait\n{logs[-6000:]}"
    # The driver's Role is all it needs: nothing it asked the API server for was refused (at the end, either).
    assert " is forbidden" not in logs, logs[-6000:]
    return running


def assert_executor_pods(tier: Tier, running: dict[str, dict[str, Any]], job: str) -> None:
    """Two executors ran as pods of the project's image, restricted and without an API token, owned by the driver
    pod; none is left now that the Job is complete."""
    (driver,) = get(tier.kube, "pods", "-n", NS, "-l", f"job-name={job}")["items"]
    assert len(running) >= 2, running.keys()
    for pod in running.values():
        spec = pod["spec"]
        (container,) = spec["containers"]
        assert container["image"] == tier.spark_image
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        owners = [o["name"] for o in pod["metadata"].get("ownerReferences") or ()]
        assert owners == [driver["metadata"]["name"]], owners
        assert pod["status"]["podIP"] != driver["status"]["podIP"]  # pods of their own, not threads of the driver
    wait(f"{job}'s executor pods gone", lambda: not executor_pods(tier), timeout=120, interval=2)


def rows(spark: Any, path: Path) -> list[tuple[str, ...]]:
    """The archive's rows as Spark reads them (a streaming sink's files through its _spark_metadata log)."""
    df = spark.read.parquet(str(path))
    cols = sorted(df.columns)
    return sorted(tuple(repr(r[c]) for c in cols) for r in df.select(*cols).collect())


def requests(tier: Tier, path: str) -> list[tuple[str, tuple[tuple[str, str], ...], bytes]]:
    """The requests the sink pod received on ``path``: (id, CloudEvent headers, body), sorted."""
    return sorted((e["headers"]["ce-id"], tuple(sorted(e["headers"].items())), base64.b64decode(e["body"]))
                  for e in sink_events(tier.kube, f"pod/{SINK_POD}", NS) if e["path"] == path)


def manifest(run_dir: Path, target: str) -> dict[str, Any]:
    written = json.loads((run_dir / "manifest.json").read_text().replace(target, "<target>"))
    return {k: v for k, v in written.items() if k not in RUN_FIELDS}


def driver_logs(tier: Tier, job: str) -> str:
    """What the Job's pod (the driver, in cluster mode) logged."""
    return str(tier.kube.kubectl("logs", f"job/{job}", "-n", NS, check=False).stdout)


def force_delete(tier: Tier, pod: str) -> None:
    """Its containers killed at once, as a lost node's are."""
    tier.kube.kubectl("delete", "pod", pod, "-n", NS, "--grace-period=0", "--force", "--wait=false")


def sending_pods(journal: Path) -> dict[str, int]:
    """UIDs of the pods whose processes hold a journal file of ``journal`` open — the executors' Python workers
    sending events now (the folder is at the same path in the pods) — and how many events each has started to send.
    Read from the host's /proc: a pod's processes are this machine's processes, in the pod's cgroup."""
    out: dict[str, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            held = [Path(f.readlink()) for f in (proc / "fd").iterdir()]
            journals = [path for path in held if path.parent == journal]
            if journals:
                found = POD_UID.search((proc / "cgroup").read_text())
                if found:
                    out[found.group(1).replace("_", "-")] = journals[0].read_text().count("\n")
        except OSError:  # gone meanwhile
            continue
    return out


# ---------------------------------------------------------------------------------------------- the scenarios


def archive_and_replay_match_local_mode(tier: Tier, spark: Any) -> None:
    target = start_sink(tier)
    topic = produce(tier)
    shared = run_folder(tier)

    # The reference: the same jobs in local mode, the same command lines.
    run(tier, start_archive(tier, install(tier, shared, cluster=False, archive=[
        "archive", "--topic", topic, "--output", f"{shared}/local-archive"])))
    local, on_pods = f"/local-{shared.name}", f"/cluster-{shared.name}"  # the sink pod serves every run of a tier
    run(tier, replay_job(install(tier, shared, cluster=False, replay=[
        "replay", "--topic", topic, "--to-url", f"{target}{local}", "--run-dir", f"{shared}/local-replay"])))

    job = start_archive(tier, install(tier, shared, archive=[
        "archive", "--topic", topic, "--output", f"{shared}/archive"]))
    assert_executor_pods(tier, run(tier, job), job)
    job = replay_job(install(tier, shared, replay=[
        "replay", "--topic", topic, "--to-url", f"{target}{on_pods}", "--run-dir", f"{shared}/replay"]))
    assert_executor_pods(tier, run(tier, job), job)

    archived = rows(spark, shared / "archive")
    assert archived == rows(spark, shared / "local-archive")
    assert len(archived) == EVENTS
    replayed = requests(tier, on_pods)
    assert replayed == requests(tier, local)
    assert sorted(r[0] for r in replayed) == sorted(f"ev-{i}" for i in range(EVENTS))  # each event once
    reference = manifest(shared / "local-replay", f"{target}{local}")
    assert manifest(shared / "replay", f"{target}{on_pods}") == reference
    assert reference["counts"]["succeeded"] == EVENTS


def killed_executor_mid_archive(tier: Tier, spark: Any) -> None:
    start_sink(tier)
    topic = produce(tier)
    shared = run_folder(tier)
    run(tier, start_archive(tier, install(tier, shared, cluster=False, archive=[
        "archive", "--topic", topic, "--output", f"{shared}/local-archive"])))

    # Batches of BATCH records, so the run outlives the first one by long enough for a new executor pod to start;
    # an executor pod is force-deleted once the first batch is committed.
    job = start_archive(tier, install(tier, shared, archive=[
        "archive", "--topic", topic, "--output", f"{shared}/archive", "--max-offsets-per-trigger", str(BATCH)]))
    killed: list[str] = []
    began = time.monotonic()
    phases: dict[str, str] = {}
    timeline: list[str] = []  # when each executor pod changed phase, for the failure message

    def kill_one(pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            name, phase = pod["metadata"]["name"], pod["status"].get("phase", "?")
            if phases.get(name) != phase:
                phases[name] = phase
                timeline.append(f"{time.monotonic() - began:.1f}s {name} {phase}")
        if killed or not (shared / "archive" / "_checkpoint" / "commits" / "0").exists():
            return
        victims = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
        if victims:
            force_delete(tier, victims[0])
            killed.append(victims[0])
            timeline.append(f"{time.monotonic() - began:.1f}s {victims[0]} force-deleted")

    running = run(tier, job, during=kill_one)
    timeline.append(f"{time.monotonic() - began:.1f}s job complete")
    assert killed, "the archive ended before an executor could be killed"
    # Spark asked for an executor in the killed one's place: a third executor pod ran.
    ids = sorted(int(p["metadata"]["labels"]["spark-exec-id"]) for p in running.values())
    assert len(ids) >= 3 and killed[0] in running, (
        ids, killed, timeline, [line for line in driver_logs(tier, job).splitlines() if "xecutor" in line][-40:])
    wait("the executor pods gone", lambda: not executor_pods(tier), timeout=120, interval=2)

    archived = rows(spark, shared / "archive")
    assert archived == rows(spark, shared / "local-archive")  # every record once: none lost, none twice
    assert len(archived) == EVENTS


def killed_executor_mid_replay(tier: Tier) -> None:
    target = start_sink(tier)
    topic = produce(tier)
    shared = run_folder(tier)
    path = f"/kill-{shared.name}"
    run_dir = shared / "replay"
    journal = run_dir / "journal" / "attempt=1"
    # 6 events/s and one request in flight per task (2 tasks, one per executor): 10 s and more of sending, long
    # enough to kill the pod of an executor whose task is sending; the kill then cuts at most one request of it.
    job = replay_job(install(tier, shared, replay=[
        "replay", "--topic", topic, "--to-url", f"{target}{path}", "--rate", "6", "--concurrency", "2",
        "--retry", "0", "--run-dir", str(run_dir)]))
    killed: list[tuple[str, int]] = []

    def kill_sending(pods: list[dict[str, Any]]) -> None:
        if killed:
            return
        # An executor whose task has sent a few events and is sending more.
        uid = next((uid for uid, n in sending_pods(journal).items() if n >= 4), None)
        victim = next((p["metadata"]["name"] for p in pods if p["metadata"]["uid"] == uid), None)
        if victim:
            force_delete(tier, victim)
            killed.append((victim, sending_pods(journal).get(str(uid), 0)))

    running = run(tier, job, during=kill_sending, interval=0.2)
    assert killed, "the replay ended before an executor could be killed while sending"
    assert killed[0][0] in running
    wait("the executor pods gone", lambda: not executor_pods(tier), timeout=120, interval=2)

    written = json.loads((run_dir / "manifest.json").read_text())
    received = [r[0] for r in requests(tier, path)]
    sent = {f"ev-{i}" for i in range(EVENTS)}
    assert set(received) == sent, (sent - set(received), written["counts"])  # every event arrived, at least once
    duplicates = {i for i in received if received.count(i) > 1}
    reported = {e["id"] for e in written["possibly_resent"]}
    assert duplicates, (written["counts"], killed)  # the killed task's deliveries were sent again ...
    assert duplicates <= reported, (duplicates - reported, written["counts"])  # ... and each is reported
    # Reported but not received twice: only a request the kill cut before it reached the sink (one in flight per
    # task attempt lost).
    assert len(reported - duplicates) <= 2, (reported - duplicates, duplicates)
    print(f"[spark] replay killed {killed[0][0]} after {killed[0][1]} events of its task: {len(received)} requests, "
          f"{len(duplicates)} events twice, {len(reported)} reported possibly resent", flush=True)
    assert written["counts"]["possibly_resent"] == len(reported) < len(sent)
    assert written["counts"]["succeeded"] == len(sent) and written["counts"]["failed"] == 0
