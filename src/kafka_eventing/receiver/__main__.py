"""``python -m kafka_eventing.receiver [--worker-model uvicorn|gthread] [gunicorn flags]``: exec gunicorn.

The default model is the measured winner (uvicorn workers, ASGI app; docs/receiver.md). Other flags go to
gunicorn unchanged (e.g. ``--bind 127.0.0.1:8080 --workers 1``) and override the config module.
"""

from __future__ import annotations

import os
import sys

MODELS = {
    "uvicorn": ["-k", "uvicorn.workers.UvicornWorker", "kafka_eventing.receiver.asgi:get_app()"],
    "gthread": ["-k", "gthread", "kafka_eventing.receiver.app:get_app()"],
}


def command(argv: list[str]) -> list[str]:
    args = list(argv)
    model = "uvicorn"
    for i, arg in enumerate(args):
        if arg == "--worker-model" and i + 1 < len(args):
            model = args[i + 1]
            del args[i:i + 2]
            break
        if arg.startswith("--worker-model="):
            model = arg.split("=", 1)[1]
            del args[i]
            break
    if model not in MODELS:
        raise SystemExit(f"--worker-model must be one of {', '.join(MODELS)}, not {model!r}")
    *worker, app = MODELS[model]
    return [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf", *worker,
            *args, app]


def main(argv: list[str] | None = None) -> None:
    cmd = command(sys.argv[1:] if argv is None else argv)
    os.execv(cmd[0], cmd)  # noqa: S606 - replace this process, so gunicorn gets the signals


if __name__ == "__main__":
    main()
