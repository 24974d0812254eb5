"""``python -m kafka_eventing.receiver [gunicorn flags]``: exec gunicorn with the receiver's config.

Extra flags go to gunicorn (e.g. ``--bind 127.0.0.1:8080 --workers 1``) and override the config module.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    command = [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf", *args,
               "kafka_eventing.receiver.app:get_app()"]
    os.execv(sys.executable, command)  # noqa: S606 - replace this process: gunicorn gets the signals


if __name__ == "__main__":
    main()
