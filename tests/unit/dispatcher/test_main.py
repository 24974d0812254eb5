"""``python -m kafka_eventing.dispatcher``: the process starts as each kind of Deployment runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kafka_eventing.localstack._proc import free_port, terminate

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
current-context: c
"""


def test_a_kafkasources_dispatcher_starts_in_kube_mode_and_stays_alive(tmp_path: Path) -> None:
    """A KafkaSource's Deployment runs it with KE_CHANNEL_SOURCE=kube and empty channel names: it must serve its
    liveness probe while the API server and Kafka are not reachable yet (closed loopback ports here), not exit:
    the ResetOffsets it watches are looked up through its own API client, and an unreachable API is retried."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KE_")},
           "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kubeconfig), "KE_CHANNEL_NAMESPACE": "",
           "KE_CHANNEL_NAME": "", "KE_SOURCE_NAMESPACE": "team", "KE_SOURCE_NAME": "orders",
           "KE_BOOTSTRAP_SERVERS": "127.0.0.1:9", "KE_METRICS_PORT": str(port), "KE_LOG_LEVEL": "ERROR"}
    log = tmp_path / "dispatcher.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, alive = time.monotonic() + 30, False
        while time.monotonic() < deadline and not alive:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                    alive = answer.status == 200
            except OSError:
                time.sleep(0.2)
        assert alive, log.read_text()[-2000:]
        time.sleep(2)  # past the first API and Kafka attempts
        assert proc.poll() is None, log.read_text()[-2000:]
    finally:
        terminate(proc, timeout=15)  # type: ignore[arg-type]
