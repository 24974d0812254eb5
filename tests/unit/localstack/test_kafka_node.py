"""localstack.kafka: a start that dies of Kafka's own start-up fault is started once more, on the same data; any
other exit fails at once. The processes are stand-ins (a real start is tests/integration's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kafka_eventing.localstack import kafka
from kafka_eventing.localstack.kafka import STARTUP_FAULT, KafkaNode


def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exits: list[str]) -> tuple[KafkaNode, list[str]]:
    """A node whose launches are processes that write the next of ``exits`` to the log and exit 1; once they run
    out, a launch stays up and counts as ready."""
    n = KafkaNode(tmp_path / f"kafka-{len(list(tmp_path.iterdir()))}", start_timeout=30)
    launched: list[str] = []
    monkeypatch.setattr(KafkaNode, "_write_config", lambda self: tmp_path / "server.properties")
    monkeypatch.setattr(KafkaNode, "_format", lambda self, props: None)

    def launch(self: KafkaNode, props: Path) -> None:
        text = exits[len(launched)] if len(launched) < len(exits) else ""
        launched.append(text)
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as out:
            out.write(text + "\n")
        self._proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(1)" if text
                                       else "import time; time.sleep(30)"], start_new_session=True)
        if text:
            self._proc.wait(10)  # it has died before anyone asks whether it is ready

    class Admin:
        def __init__(self, _config: object) -> None: ...

        def list_topics(self, timeout: float) -> object:
            if n._proc is None or n._proc.poll() is not None:
                raise RuntimeError("not up")
            return type("Metadata", (), {"brokers": {1: object()}})()

    monkeypatch.setattr(KafkaNode, "_launch", launch)
    monkeypatch.setattr("confluent_kafka.admin.AdminClient", Admin)
    monkeypatch.setattr(kafka._proc, "port_open", lambda port: True)
    return n, launched


def test_a_start_up_fault_is_started_once_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n, launched = node(tmp_path, monkeypatch, [f"ERROR {STARTUP_FAULT}: caught exception"])
    try:
        n.start()
        assert len(launched) == 2 and n.running
    finally:
        n.stop()


def test_a_second_fault_or_any_other_exit_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n, launched = node(tmp_path, monkeypatch, [f"{STARTUP_FAULT} one", f"{STARTUP_FAULT} two"])
    with pytest.raises(RuntimeError, match="exited"):
        n.start()
    assert len(launched) == 2
    n, launched = node(tmp_path, monkeypatch, ["Address already in use"])
    with pytest.raises(RuntimeError, match="Address already in use"):
        n.start()
    assert len(launched) == 1
