"""Prometheus metrics for every role: the exposition helpers and the multiprocess setup gunicorn needs.

Under gunicorn each worker is a process, so metrics live in ``PROMETHEUS_MULTIPROC_DIR`` (mmap files that
prometheus_client aggregates on scrape). prometheus_client picks the storage when it is first imported, so the
variable must be set in the gunicorn master before any worker imports it: ``prepare_multiprocess_dir`` does
that from the gunicorn config, and ``worker_exited`` cleans a dead worker's live gauges.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

__all__ = ["MULTIPROC_ENV", "MetricsResource", "exposition", "multiprocess_registry",
           "prepare_multiprocess_dir", "worker_exited"]


def prepare_multiprocess_dir(environ: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """Make ``PROMETHEUS_MULTIPROC_DIR`` exist and be empty (stale files from a previous run would add up).

    When unset, a fresh temporary directory is created and exported, so workers inherit it.
    """
    env = os.environ if environ is None else environ
    raw = env.get(MULTIPROC_ENV)
    if raw:
        path = Path(raw)
        path.mkdir(parents=True, exist_ok=True)
        for item in path.iterdir():
            if item.suffix == ".db":
                item.unlink(missing_ok=True)
            elif item.is_dir():
                shutil.rmtree(item, ignore_errors=True)
    else:
        path = Path(tempfile.mkdtemp(prefix="ke-prometheus-"))
        env[MULTIPROC_ENV] = str(path)
    return path


def worker_exited(pid: int) -> None:
    """gunicorn ``child_exit``: drop the dead worker's live-gauge files."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def multiprocess_registry() -> CollectorRegistry:
    """The registry to scrape: all workers' files in multiprocess mode, else this process's default one."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def exposition(registry: CollectorRegistry | None = None) -> tuple[bytes, str]:
    """Body and Content-Type of a scrape (text format)."""
    return generate_latest(registry or multiprocess_registry()), CONTENT_TYPE_LATEST


class MetricsResource:
    """``GET /metrics`` for a falcon app (WSGI); every role mounts it the same way."""

    def on_get(self, req: Any, resp: Any) -> None:
        body, content_type = exposition()
        resp.data = body
        resp.content_type = content_type
