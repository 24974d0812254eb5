"""`cluster down` after the supervisor died without stopping the cluster (SIGKILL, an OOM kill): containerd, the
kubelet, the control plane and Kafka outlive it, and `down` must still find and stop them from the state file.

Part of `make test-cluster`; it starts a cluster of its own (no pods), before the tier's shared one starts
(tests/e2e/conftest.py orders the session so, and ``cluster_of_its_own`` fails the test should the shared one be up).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from kafka_eventing.localstack import cluster as kc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]


@pytest.mark.usefixtures("cluster_of_its_own")
def test_down_finds_what_a_killed_supervisor_left() -> None:
    try:
        state = kc.up(ttl=900)
    except kc.ClusterError as exc:
        kc.down()
        pytest.fail(f"the cluster did not start: {exc}")
    try:
        pid = int(state["pid"])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.2)
        orphans = kc.leftovers()
        # Without them the test would prove nothing: the kill must have left the cluster's processes running.
        assert any(line.startswith("process ") for line in orphans), orphans
    finally:
        kc.down()
    assert kc.leftovers() == [], "cluster down left things behind after the supervisor was killed"
