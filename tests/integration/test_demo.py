"""`python -m kafka_eventing run --exit-after-demo` (the README's `make run`) end to end, as a user runs it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kafka_eventing.localstack._proc import free_port

pytestmark = pytest.mark.kafka


def test_run_exit_after_demo_delivers_the_events() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "kafka_eventing", "run", "--exit-after-demo", "--port", str(port)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    sent = re.findall(r"\[sender\] POST /default/demo ce-id=(\S+) -> 202", out)
    delivered = re.findall(r"\[subscriber\] received CloudEvent id=(\S+) ", out)
    assert len(sent) == 3
    assert sorted(delivered) == sorted(sent)
    assert "round trip complete" in out
    assert f"curl -i -X POST http://127.0.0.1:{port}/default/demo" in out
    assert "all stopped" in out
