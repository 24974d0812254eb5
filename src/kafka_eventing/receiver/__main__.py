"""``python -m kafka_eventing.receiver [gunicorn flags]``: exec gunicorn with uvicorn workers running the app.

Flags go to gunicorn unchanged (e.g. ``--bind 127.0.0.1:8080 --workers 1``) and override the config module.
"""

from __future__ import annotations

import os
import sys

APP = "kafka_eventing.receiver.app:get_app()"
WORKER = "kafka_eventing.receiver.server.ReceiverWorker"  # uvicorn, with deadlines for slow clients


def command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf",
            "-k", WORKER, *argv, APP]


def preflight() -> None:
    """Settings and the API server checked before gunicorn starts: a worker that fails to boot exits with a
    traceback per worker; here the receiver stops with one line saying what to set."""
    from kafka_eventing.core.kube import load_configuration
    from kafka_eventing.core.settings import Settings, SettingsError

    try:
        settings = Settings.from_env()
        if settings.channel_source == "kube":
            load_configuration(settings.kubeconfig)
    except SettingsError as exc:
        raise SystemExit(f"receiver: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    preflight()
    cmd = command(sys.argv[1:] if argv is None else argv)
    os.execv(cmd[0], cmd)  # noqa: S606 - replace this process, so gunicorn gets the signals


if __name__ == "__main__":
    main()
