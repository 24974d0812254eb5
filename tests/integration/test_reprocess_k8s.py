"""The reprocess command line as a Spark-on-Kubernetes driver (``--master k8s://…``, client mode, as the chart's
``reprocess.cluster`` runs it) against the real kube-apiserver of the ``kube`` tier, where no executor can start:
there is no kubelet (the executor pods stay Pending, as with a missing image or no node with room), the
ServiceAccount may not create pods (a Role without pods/create), or no API server answers at all.

Each fails with one line and a non-zero exit, writes no archive and no checkpoint a later incremental run would
resume from, and leaves no executor pod (nor the executors' ConfigMap) behind: the driver deletes what it created.
Executors that do start are the kind tier's (``make test-kind``, the ``test_spark_…`` tests of
tests/e2e/test_kind.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.reprocess import _event, _one_line, _produce
from urllib3.exceptions import ProtocolError

from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane
from kafka_eventing.localstack.tools import cache_dir
from kafka_eventing.reprocess.session import SPARK_KAFKA_VERSION

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.kube, pytest.mark.timeout(600)]

#: Spark's label on the pods (and ConfigMaps) of one application and on its executors.
EXECUTOR = "spark-role=executor"
TIMEOUT = 15


def _archive(kafka: KafkaNode, topic: str, out: Path, master: str, namespace: str,
             kubeconfig: Path) -> subprocess.Popen[str]:
    jars = cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars"
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": "kafka-eventing/spark:not-loaded",
        "spark.kubernetes.executor.deleteOnTermination": "true",
        "spark.executor.instances": "2",
        # The session's own wait for executors, inside --executor-timeout.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "5s",
    }
    # Spark's Kubernetes client (fabric8) reads the credentials and the CA from the kubeconfig; --master names
    # the API server.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_KAFKA_")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", KUBECONFIG=str(kubeconfig))
    return subprocess.Popen(
        [sys.executable, "-m", "kafka_eventing.reprocess", "archive", "--topic", topic, "--output", str(out),
         "--master", master, "--executor-timeout", str(TIMEOUT), "--jars", str(jars), "--driver-memory", "512m",
         "--bootstrap-servers", kafka.bootstrap_servers, *[f"--conf={k}={v}" for k, v in conf.items()]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stderr


def _names(items: Any) -> list[str]:
    return sorted(i.metadata.name for i in items.items)


def test_executor_pods_that_never_start_end_the_job_and_are_deleted(
    kube_control_plane: KubeControlPlane, kube_namespace: str, kafka_running: KafkaNode, topic: str,
    tmp_path: Path,
) -> None:
    from kubernetes import client

    _produce(kafka_running, topic, [_event(i) for i in range(3)])
    master = f"k8s://{kube_control_plane.server}"
    out = tmp_path / "archive"
    core = client.CoreV1Api(kube_control_plane.api_client())
    # The executor pods the driver creates, as the API server saw them (a watch: they may be deleted again
    # before a poll would find them).
    seen: set[str] = set()
    watching = threading.Event()

    def watch() -> None:
        from kubernetes import watch as kwatch

        w = kwatch.Watch()
        watching.set()
        # Ends when the API server closes it (its timeout, or the session's control plane stopping).
        with contextlib.suppress(ProtocolError):
            for ev in w.stream(core.list_namespaced_pod, kube_namespace, label_selector=EXECUTOR,
                               timeout_seconds=120):
                seen.add(ev["object"].metadata.name)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    watching.wait(10)

    code, stderr = _finish(_archive(kafka_running, topic, out, master, kube_namespace, kube_control_plane.kubeconfig))

    assert code == 5, stderr[-3000:]
    assert _one_line(stderr) == (
        f"kafka-eventing reprocess archive: no executor started within {TIMEOUT} s on {master} (check the executor "
        "image and its pull secret, the driver's RBAC for pods, and that a node or worker offers the executor's "
        "cores and memory)")
    assert not out.exists()  # no archive and no checkpoint a later run would take for a finished one
    assert len(seen) >= 2, seen  # the driver did ask for its two executors, as pods that never ran ...
    assert _names(core.list_namespaced_pod(kube_namespace, label_selector=EXECUTOR)) == []  # ... and deleted them
    assert _names(core.list_namespaced_config_map(kube_namespace, label_selector="spark-app-selector")) == []


def _service_account_kubeconfig(plane: KubeControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig for ``account`` (a TokenRequest token): a driver whose ServiceAccount has no Role at all."""
    from kubernetes import client

    core = client.CoreV1Api(plane.api_client())
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=account)))
    token = core.create_namespaced_service_account_token(account, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    config = yaml.safe_load(plane.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"].update(user=account, namespace=namespace)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def test_a_forbidden_or_unreachable_api_server_ends_the_job_with_one_line(
    kube_control_plane: KubeControlPlane, kube_namespace: str, kafka_running: KafkaNode, topic: str,
    tmp_path: Path,
) -> None:
    from kubernetes import client

    _produce(kafka_running, topic, [_event(i) for i in range(3)])
    master = f"k8s://{kube_control_plane.server}"
    kubeconfig = _service_account_kubeconfig(kube_control_plane, kube_namespace, "no-rbac", tmp_path / "kubeconfig")
    out = tmp_path / "archive"
    code, stderr = _finish(_archive(kafka_running, topic, out, master, kube_namespace, kubeconfig))
    assert code == 5, stderr[-3000:]
    line = _one_line(stderr)
    assert line.startswith(f"kafka-eventing reprocess archive: the Kubernetes API at {kube_control_plane.server} "
                           "refused the driver: "), line
    assert "HTTP 403: " in line and "forbidden" in line.lower(), line
    assert not out.exists()
    core = client.CoreV1Api(kube_control_plane.api_client())
    assert _names(core.list_namespaced_pod(kube_namespace)) == []

    # No API server at all (a wrong --master, or the API unreachable from the driver's pod).
    nowhere = f"https://127.0.0.1:{free_port()}"
    code, stderr = _finish(_archive(kafka_running, topic, out, f"k8s://{nowhere}", kube_namespace,
                                    kube_control_plane.kubeconfig))
    assert code == 5, stderr[-3000:]
    line = _one_line(stderr)
    assert line.startswith(f"kafka-eventing reprocess archive: the Kubernetes API at {nowhere} could not be "
                           "reached: "), line
    assert not out.exists()
