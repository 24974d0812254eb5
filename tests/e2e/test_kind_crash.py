"""The kind engine after a crash (`make test-kind`): a run killed while ``kind create cluster`` boots a real node.

The node (systemd, containerd, the kubelet writing its sysctls) is up when the engine's supervisor and the kind
process are SIGKILLed, as a crashed or timed-out CI job leaves them. dockerd, its containerd and the shims outlive
the supervisor (they run in sessions of their own); ``down`` must still find them (the engine's folder in their
arguments, another network namespace than ours) and the node's processes (the engine's cgroups), and leave the host
as it was: the same checks as tests/e2e/test_kind.py, including no process left in the engine's network namespace.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e._host import assert_host_unchanged, hold_netns, host_state
from e2e._scenario import wait
from kafka_eventing.localstack import kind as engine_mod
from kafka_eventing.localstack.cluster import netns_command
from kafka_eventing.localstack.tools import tool_path

pytestmark = [pytest.mark.kind, pytest.mark.timeout(600)]


def test_engine_is_found_and_stopped_after_a_run_is_killed_mid_cluster(tmp_path: Path) -> None:
    tag_file = engine_mod.workdir() / "node-image.tag"
    assert tag_file.exists(), "no node image: run `make kind-image`"
    before = host_state()
    state = engine_mod.up(ttl=600)
    held = hold_netns(state)
    config = tmp_path / "kind.yaml"
    config.write_text(yaml.safe_dump({"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4",
                                      "networking": {"disableDefaultCNI": True, "apiServerAddress": "127.0.0.1"}}))
    env = {**os.environ, "DOCKER_HOST": state["docker_host"]}
    creating = subprocess.Popen(
        [*netns_command(int(state["pid"])), str(tool_path("kind")), "create", "cluster", "--name", "crash",
         "--image", tag_file.read_text().strip(), "--config", str(config), "--kubeconfig",
         str(tmp_path / "kubeconfig"), "--retain"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def kubelet_running() -> bool:
            assert creating.poll() is None, f"kind create cluster ended ({creating.returncode}) before the crash"
            return subprocess.run(["docker", "exec", "crash-control-plane", "pidof", "kubelet"], env=env,
                                  capture_output=True, timeout=30, check=False).returncode == 0

        wait("the node's kubelet running", kubelet_running, timeout=300, interval=1)
        os.kill(int(state["pid"]), signal.SIGKILL)
        creating.kill()
        creating.wait(timeout=30)
        left = engine_mod.leftovers()
        assert any("dockerd" in item for item in left), f"dockerd should outlive its supervisor: {left}"
        assert any("cgroup" in item for item in left), f"the node should outlive it too: {left}"
    finally:
        try:
            if creating.poll() is None:
                creating.kill()
                creating.wait(timeout=30)
            engine_mod.down()
            assert_host_unchanged(before, state["netns_inode"])
        finally:
            os.close(held)
