"""`make local-up` / `make local-down` as a person runs them: real Kafka + API server, then nothing left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kafka_eventing.localstack.tools import tool_path

pytestmark = [pytest.mark.kafka, pytest.mark.kube]


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka_eventing", "local", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


def test_local_up_status_down(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # The state lives under the cache dir; point it at a temp one that reuses the real tool binaries/jars.
    cache.mkdir()
    real = tool_path("kube-apiserver").parent.parent
    for item in real.iterdir():
        if item.name not in ("local", "logs", "run"):
            (cache / item.name).symlink_to(item)
    env = {**os.environ, "KE_CACHE": str(cache)}
    up = _cli(["up", "--ttl", "300"], env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((cache / "local" / "state.json").read_text())
        assert state["bootstrap_servers"] in up.stdout
        assert state["kubeconfig"] in up.stdout
        password = Path(state["sasl_password_file"]).read_text()
        assert password not in up.stdout  # the SCRAM password is only in its 0600 file
        assert oct(Path(state["sasl_password_file"]).stat().st_mode & 0o777) == "0o600"
        md = AdminClient({"bootstrap.servers": state["bootstrap_servers"]}).list_topics(timeout=10)
        assert md.brokers
        kubectl = subprocess.run([str(tool_path("kubectl")), "--kubeconfig", state["kubeconfig"], "get", "ns",
                                  "-o", "name"], capture_output=True, text=True, timeout=60, check=False)
        assert "namespace/default" in kubectl.stdout, kubectl.stderr
        assert _cli(["status"], env).returncode == 0
    finally:
        down = _cli(["down"], env)
    assert down.returncode == 0
    assert "stopped" in down.stdout
    assert _cli(["status"], env).returncode == 3
    assert not (cache / "local" / "state.json").exists()
