"""``python -m kafka_eventing.receiver [gunicorn flags]``: exec gunicorn with uvicorn workers running the app.

Flags go to gunicorn unchanged (e.g. ``--bind 127.0.0.1:8080 --workers 1``) and override the config module.
"""

from __future__ import annotations

import os
import sys

APP = "kafka_eventing.receiver.app:get_app()"
WORKER = "uvicorn.workers.UvicornWorker"


def command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf",
            "-k", WORKER, *argv, APP]


def main(argv: list[str] | None = None) -> None:
    cmd = command(sys.argv[1:] if argv is None else argv)
    os.execv(cmd[0], cmd)  # noqa: S606 - replace this process, so gunicorn gets the signals


if __name__ == "__main__":
    main()
