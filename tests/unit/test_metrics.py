"""receiver.metrics: Tally's buffered increments reach prometheus_client exactly as direct calls would; the
cached pid of multiprocess values still tells a forked process apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from kafka_eventing.receiver.metrics import Tally

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = (0.0005, 0.001, 0.002, 0.01, 0.05, 0.5, 0.99, 1.0, 3.0, 0.0)


def _metrics() -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    counter = Counter("t_events_total", "events", ["code"], registry=registry)
    hist = Histogram("t_latency_seconds", "latency", buckets=BUCKETS, registry=registry)
    return registry, counter, hist


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in registry.collect() for s in m.samples if not s.name.endswith("_created")}


def test_tally_matches_direct_calls_and_waits_for_flush() -> None:
    direct, d_counter, d_hist = _metrics()
    buffered, b_counter, b_hist = _metrics()
    tally = Tally(interval=3600)
    for i, value in enumerate(VALUES):
        code = "202" if i % 3 else "503"
        d_counter.labels(code).inc()
        d_hist.observe(value)
        tally.inc(b_counter.labels(code))
        tally.observe(b_hist, value)
    d_counter.labels("202").inc(1024)
    tally.inc(b_counter.labels("202"), 1024)

    assert _samples(buffered)[("t_latency_seconds_count", ())] == 0  # nothing written before a flush
    tally.flush()
    assert _samples(buffered) == _samples(direct)
    assert b"t_latency_seconds_bucket{le=\"0.01\"} 5.0" in generate_latest(buffered)
    tally.flush()  # a second flush adds nothing
    assert _samples(buffered) == _samples(direct)


def test_flush_all_is_what_a_scrape_runs() -> None:
    registry, counter, _ = _metrics()
    tally = Tally(interval=3600)
    tally.inc(counter.labels("400"), 2)
    Tally.flush_all()
    assert _samples(registry)[("t_events_total", (("code", "400"),))] == 2


_FORK_SCRIPT = """
import os, sys
from kafka_eventing.receiver import metrics
from prometheus_client import CollectorRegistry, Counter, values, multiprocess
assert values.ValueClass is not values.MutexValue
counter = Counter("t_forked_total", "events")
counter.inc(2)                      # the parent's file exists before the fork
pid = os.fork()
if pid == 0:
    counter.inc(5)                  # must go to the child's own file, not the parent's
    os._exit(0)
os.waitpid(pid, 0)
counter.inc(1)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
total = registry.get_sample_value("t_forked_total")
files = sorted(f for f in os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"]) if f.startswith("counter_"))
print(total, len(files), metrics._pid() == os.getpid())
"""


def test_multiprocess_values_notice_a_fork_with_the_cached_pid(tmp_path: Path) -> None:
    # The pid prometheus_client checks per update is cached (no getpid() system call); a forked worker must
    # still get its own file and the parent's counts must not be reset or double counted.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["8.0", "2", "True"]


def test_loop_tally_is_flushed_by_its_loop_after_the_interval() -> None:
    """The ASGI receiver's tally: lock-free updates on the loop's thread, written out by the loop itself."""
    import asyncio
    import threading

    from kafka_eventing.receiver.metrics import LoopTally

    registry, counter, hist = _metrics()

    async def run() -> tuple[float, float, float, float]:
        tally = LoopTally(asyncio.get_running_loop(), interval=0.05)
        tally.count(counter.labels("202"))
        tally.inc(counter.labels("202"), 2)
        tally.observe(hist, 0.005)
        before = _samples(registry)[("t_events_total", (("code", "202"),))]
        await asyncio.sleep(0.2)  # the loop's timer flushes
        after = _samples(registry)[("t_events_total", (("code", "202"),))]
        tally.count(counter.labels("202"))
        # A flush asked for from another thread (a scrape hook) is handed to the loop, not run on the dicts.
        other = threading.Thread(target=tally.flush)
        other.start()
        other.join()
        handed = _samples(registry)[("t_events_total", (("code", "202"),))]
        await asyncio.sleep(0)  # the loop runs the handed-over flush (well before the 50 ms timer)
        ran = _samples(registry)[("t_events_total", (("code", "202"),))]
        tally.count(counter.labels("202"))
        tally.close()  # shutdown: flushed at once
        return before, after, handed, ran, _samples(registry)[("t_events_total", (("code", "202"),))]

    assert asyncio.run(run()) == (0, 3, 3, 4, 5)
    assert _samples(registry)[("t_latency_seconds_count", ())] == 1
