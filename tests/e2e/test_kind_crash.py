"""The kind engine after a crash (`make test-kind`): its supervisor SIGKILLed while a privileged container runs.

dockerd, its containerd and the shims outlive the supervisor (they run in sessions of their own); ``down`` must still
find them (the engine's folder in their arguments, another network namespace than ours) and the container's
processes (the engine's cgroups), and leave the host as it was (the same checks as tests/e2e/test_kind.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from e2e.test_kind import assert_host_unchanged, host_state
from kafka_eventing.localstack import kind as engine_mod

pytestmark = [pytest.mark.kind, pytest.mark.timeout(600)]


def test_engine_is_found_and_stopped_after_its_supervisor_is_killed() -> None:
    tag_file = engine_mod.workdir() / "node-image.tag"
    assert tag_file.exists(), "no node image: run `make kind-image`"
    before = host_state()
    state = engine_mod.up(ttl=600)
    try:
        env = {**os.environ, "DOCKER_HOST": state["docker_host"]}
        subprocess.run(["docker", "run", "-d", "--privileged", "--network", "none", "--name", "crash",
                        "--entrypoint", "sleep", tag_file.read_text().strip(), "infinity"],
                       env=env, check=True, capture_output=True, timeout=120)
        os.kill(int(state["pid"]), signal.SIGKILL)
        time.sleep(1)
        left = engine_mod.leftovers()
        assert any("dockerd" in item for item in left), f"dockerd should outlive its supervisor: {left}"
        assert any("cgroup" in item for item in left), f"the container should outlive it too: {left}"
    finally:
        engine_mod.down()
    assert_host_unchanged(before)
