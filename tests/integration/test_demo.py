"""`python -m kafka_eventing run --exit-after-demo` (the README's `make run`) end to end, as a user runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def test_run_broker_fans_out_by_filter(tmp_path: Path) -> None:
    """`run --broker`: one Broker, three Triggers of three dialects; each subscriber gets exactly its events."""
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "kafka_eventing", "run", "--broker", "--exit-after-demo", "--port", str(port),
         "--workdir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240, check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    sent = dict(re.findall(r"\[sender\] POST /default/demo (\S+) type=(\S+) region=\S+ -> 202", out))
    assert len(sent) == 5
    got = {name: set(ids.split(", ")) for name, ids in re.findall(r"^  (\S+) +\(.*\): (.*)$", out, re.M)}
    orders = {i for i, t in sent.items() if t.startswith("com.example.order.")}
    assert got["all-orders"] == orders
    assert got["not-orders"] == set(sent) - orders
    assert got["eu-orders"] < orders and got["eu-orders"]
    assert "fan-out complete" in out and "all stopped" in out


def test_run_source_turns_plain_records_into_cloudevents(tmp_path: Path) -> None:
    """`run --source`: plain records written to a topic arrive at the demo subscriber as CloudEvents, printed."""
    proc = subprocess.run(
        [sys.executable, "-m", "kafka_eventing", "run", "--source", "--exit-after-demo", "--port", "0",
         "--workdir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    received = re.findall(r"\[subscriber\] received CloudEvent id=(\S+) type=(\S+) source=(\S+) data=(.*)", out)
    assert [r[0] for r in received] == [f"partition:0/offset:{i}" for i in range(3)]
    assert {r[1] for r in received} == {"dev.knative.kafka.event"}
    assert {r[2] for r in received} == {"/apis/v1/namespaces/default/kafkasources/demo#demo-orders"}
    assert received[0][3].startswith('{"order": 1, "total": 9.5} ')
    assert "key=order-1" in received[0][3] and "kafkaheaderxshop=eu-1" in received[0][3]
    assert "demo=true" in received[2][3] and "kafkaheadertraceid=abc123" in received[2][3]
    assert "source complete: 3 plain records" in out
