"""``python -m kafka_eventing.receiver``: the gunicorn command line (uvicorn workers, the ASGI app)."""

from __future__ import annotations

import sys

from kafka_eventing.receiver.__main__ import command


def test_uvicorn_workers_and_flags_pass_through() -> None:
    cmd = command(["--bind", "127.0.0.1:9", "--workers", "1"])
    assert cmd[:5] == [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf"]
    assert cmd[5:7] == ["-k", "kafka_eventing.receiver.server.ReceiverWorker"]
    assert cmd[7:11] == ["--bind", "127.0.0.1:9", "--workers", "1"]
    assert cmd[-1] == "kafka_eventing.receiver.app:get_app()"


def test_gunicorn_config_module_loads() -> None:
    from kafka_eventing.receiver import gunicorn_conf

    assert gunicorn_conf.preload_app is False  # the producer must be created after fork
    assert gunicorn_conf.wsgi_app == "kafka_eventing.receiver.app:get_app()"
    assert gunicorn_conf.worker_class == "kafka_eventing.receiver.server.ReceiverWorker"
    assert gunicorn_conf.graceful_timeout > 10  # > default produce timeout: in-flight reports can arrive


def test_help_says_what_the_receiver_serves() -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-m", "kafka_eventing.receiver", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "KafkaChannels, Kafka Brokers and KafkaSinks" in out and "usage: gunicorn" in out
