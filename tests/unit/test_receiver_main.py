"""``python -m kafka_eventing.receiver``: the gunicorn command line for each worker model."""

from __future__ import annotations

import sys

import pytest

from kafka_eventing.receiver.__main__ import command


def test_default_is_uvicorn_asgi_and_flags_pass_through() -> None:
    cmd = command(["--bind", "127.0.0.1:9", "--workers", "1"])
    assert cmd[:5] == [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf"]
    assert cmd[5:7] == ["-k", "uvicorn.workers.UvicornWorker"]
    assert cmd[7:11] == ["--bind", "127.0.0.1:9", "--workers", "1"]
    assert cmd[-1] == "kafka_eventing.receiver.asgi:get_app()"


@pytest.mark.parametrize("flag", [["--worker-model", "gthread"], ["--worker-model=gthread"]])
def test_gthread_model(flag: list[str]) -> None:
    cmd = command([*flag, "--threads", "8"])
    assert cmd[5:7] == ["-k", "gthread"]
    assert "--worker-model" not in " ".join(cmd)
    assert cmd[-3:] == ["--threads", "8", "kafka_eventing.receiver.app:get_app()"]


def test_unknown_model() -> None:
    with pytest.raises(SystemExit, match="worker-model"):
        command(["--worker-model", "sync"])


def test_gunicorn_config_module_loads() -> None:
    from kafka_eventing.receiver import gunicorn_conf

    assert gunicorn_conf.preload_app is False  # the producer must be created after fork
    assert gunicorn_conf.graceful_timeout > 10  # > default produce timeout: in-flight reports can arrive
