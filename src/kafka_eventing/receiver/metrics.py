"""The receiver's Prometheus plumbing: multiprocess setup under gunicorn, per-request buffering, exposition.

Under gunicorn each worker is a process, so metrics live in ``PROMETHEUS_MULTIPROC_DIR`` (mmap files that
prometheus_client aggregates on scrape). prometheus_client picks the storage when it is first imported, so the
variable must be set in the gunicorn master before any worker imports it: ``prepare_multiprocess_dir`` does
that from the gunicorn config, and ``worker_exited`` cleans a dead worker's live gauges.
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

__all__ = ["MULTIPROC_ENV", "LoopTally", "Tally", "exposition", "multiprocess_registry",
           "prepare_multiprocess_dir", "worker_exited"]

log = logging.getLogger(__name__)

_PID = [os.getpid()]


def _pid() -> int:
    return _PID[0]


def _cache_pid_in_multiprocess_values() -> None:
    """Give multiprocess metric values a pid that is not a system call per update.

    prometheus_client's multiprocess values call ``os.getpid()`` on every ``inc``/``observe`` to notice a fork
    (glibc does not cache the pid, so that is a system call): ~4 % of a receiver worker's CPU in the profile
    (docs/receiver.md). The same check against a pid refreshed by ``os.register_at_fork`` sees every fork. Done
    at import, before any metric of ours exists: values made by two classes would share one file unsafely.
    """
    from prometheus_client import values

    if values.ValueClass is not values.MutexValue:  # multiprocess storage was chosen at import
        values.ValueClass = values.MultiProcessValue(process_identifier=_pid)  # type: ignore[no-untyped-call]


def _after_fork() -> None:
    _PID[0] = os.getpid()


os.register_at_fork(after_in_child=_after_fork)
_cache_pid_in_multiprocess_values()


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


class Tally:
    """A per-process buffer in front of prometheus_client metrics, for per-event hot paths.

    In multiprocess mode each ``inc``/``observe`` takes a lock and writes an mmap'd file; in the receiver's
    profile its three metrics per request cost more CPU than producing the event (docs/receiver.md). A Tally
    adds into plain dicts under one lock and applies the sums every ``interval`` seconds (a daemon thread),
    before every scrape served by this process (``exposition``) and at exit: a scrape lags by ≤ ``interval``.
    Children are passed in (``Counter.labels(...)``), so label validation stays prometheus_client's.
    """

    _all: list[Tally] = []

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._counts: dict[Any, float] = {}
        self._hists: dict[Any, list[float]] = {}  # child -> [sum, count per bucket...]
        self._thread: threading.Thread | None = None
        Tally._all.append(self)

    def inc(self, child: Any, amount: float = 1.0) -> None:
        with self._lock:
            self._counts[child] = self._counts.get(child, 0.0) + amount

    def observe(self, child: Any, value: float) -> None:
        with self._lock:
            self._add(child, value)

    def _add(self, child: Any, value: float) -> None:
        """Adds one observation to the child's buffered sum and bucket counts (the caller holds what guards them)."""
        bounds: list[float] = child._upper_bounds  # same bucket rule as Histogram.observe: first bound >= value
        i = bisect.bisect_left(bounds, value)
        acc = self._hists.get(child)
        if acc is None:
            acc = self._hists[child] = [0.0] * (len(bounds) + 1)
        acc[0] += value
        if i < len(bounds):
            acc[i + 1] += 1

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, {}
            hists, self._hists = self._hists, {}
        for child, amount in counts.items():
            child.inc(amount)
        for child, acc in hists.items():
            # Histogram.observe's own writes, a bucket at a time (its buckets are stored non-cumulative).
            child._sum.inc(acc[0])
            for bucket, n in zip(child._buckets, acc[1:], strict=True):
                if n:
                    bucket.inc(n)

    def start(self) -> None:
        """Flush every ``interval`` seconds from a daemon thread, and at exit."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="metrics-tally", daemon=True)
            self._thread.start()
            atexit.register(self.flush)

    def _run(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.interval):
            try:
                self.flush()
            except Exception:  # metrics must never take the process down
                log.exception("metrics flush failed")

    def count(self, child: Any) -> None:
        """An increment a scrape must see at once (an answered request): written through, not buffered — with
        several workers a scrape served by another one could not see it for up to ``interval`` seconds."""
        child.inc()

    @classmethod
    def flush_all(cls) -> None:
        for tally in cls._all:
            tally.flush()


class LoopTally(Tally):
    """A Tally for code that runs on one event loop's thread (the ASGI receiver): no lock per update, and no
    daemon thread — the loop flushes it ``interval`` seconds after the first update since the last flush.

    With a flush a few milliseconds behind, answers are buffered too (``count``): in the receiver's benchmark the
    three multiprocess writes per request cost ~3.5 µs of ~51 (7 %; profile of a uvicorn worker under
    bench/receiver.py's saturation load, docs/receiver.md).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float = 0.005) -> None:
        super().__init__(interval)
        self.loop = loop
        self.thread_id = threading.get_ident()
        self._timer: asyncio.TimerHandle | None = None

    def inc(self, child: Any, amount: float = 1.0) -> None:
        counts = self._counts
        counts[child] = counts.get(child, 0.0) + amount
        if self._timer is None:
            self._timer = self.loop.call_later(self.interval, self.flush)

    count = inc

    def observe(self, child: Any, value: float) -> None:
        self._add(child, value)
        if self._timer is None:
            self._timer = self.loop.call_later(self.interval, self.flush)

    def flush(self) -> None:
        if threading.get_ident() != self.thread_id and self.loop.is_running():
            # A scrape or exit hook on another thread: the loop's thread owns the dicts.
            self.loop.call_soon_threadsafe(self.flush)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().flush()

    def start(self) -> None:
        """Nothing to start: the loop flushes (a thread would race the lock-free updates)."""

    def close(self) -> None:
        """Flush and forget: this loop's updates end here."""
        self.flush()
        if self in Tally._all:
            Tally._all.remove(self)


def exposition(registry: CollectorRegistry | None = None) -> tuple[bytes, str]:
    """Body and Content-Type of a scrape (text format); this process's buffered metrics are applied first."""
    Tally.flush_all()
    return generate_latest(registry or multiprocess_registry()), CONTENT_TYPE_LATEST
