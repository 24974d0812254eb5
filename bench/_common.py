"""Helpers every benchmark shares: machine facts, medians/percentiles, process CPU/RSS, JSON + PNG output.

Kept small and generic on purpose; role-specific load generation lives in each bench/<name>.py.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "docs" / "benchmarks"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- machine facts ------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class CpuTicks(NamedTuple):
    """The whole machine's CPU time so far, in clock ticks (all cores)."""

    busy: int  # everything but idle and iowait (steal included)
    steal: int  # time the hypervisor gave to other guests
    total: int


def machine_cpu_ticks() -> CpuTicks:
    """From /proc/stat's first line: user nice system idle iowait irq softirq steal (guest time is already in user)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    total = sum(fields)
    return CpuTicks(busy=total - fields[3] - fields[4], steal=fields[7] if len(fields) > 7 else 0, total=total)


def busy_percent(since: CpuTicks) -> float:
    """How busy the whole machine was since ``since`` (all cores, steal included), in percent. A server's tail
    latency follows this more than its own CPU share: the broker and the load generator share the cores."""
    now = machine_cpu_ticks()
    return round(100 * (now.busy - since.busy) / max(now.total - since.total, 1), 1)


# Steal time: on a shared VM the host may run other guests on "our" cores; a run with much steal says more
# about the neighbours than about the code. Counted from the first machine_facts() to write_json().
_TICKS_AT_START: CpuTicks | None = None


def machine_facts(packages: Iterable[str] = (), **extra: Any) -> dict[str, Any]:
    """CPU model, cores, memory, OS, Python, the given packages' versions, librdkafka, the date."""
    global _TICKS_AT_START  # noqa: PLW0603 - one measuring window per benchmark process
    _TICKS_AT_START = machine_cpu_ticks()
    facts: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        facts["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError):
        pass
    facts["packages"] = {name: _version(name) for name in packages}
    try:
        import confluent_kafka

        facts["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    try:
        facts["git_sha"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                          text=True, check=False).stdout.strip() or None
    except OSError:
        facts["git_sha"] = None
    facts.update(extra)
    return facts


# -- statistics ---------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) — no interpolation, so p99 is a latency that really happened."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


# -- processes ----------------------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc), e.g. a gunicorn master and its workers."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, ()))
    return out


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds used so far by these processes (all their threads)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / CLK_TCK


def _proc_kib(pids: Iterable[int], name: str, field: str) -> int:
    """Sum of a kB field of ``/proc/<pid>/<name>`` over ``pids``, in bytes (a process gone meanwhile counts 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def rss_bytes(pids: Iterable[int]) -> int:
    return _proc_kib(pids, "status", "VmRSS:")


def pss_bytes(pids: Iterable[int]) -> int:
    """Proportional set size: a page shared by n of the processes counts 1/n in each, so over a forked server
    (gunicorn's master and its workers share their copy-on-write pages) the sum counts each page once, as the
    pod's memory cgroup does, where summed RSS counts the shared pages once per process."""
    return _proc_kib(pids, "smaps_rollup", "Pss:")


# -- output -------------------------------------------------------------------------------------------------


def steal_percent() -> float | None:
    """CPU time the hypervisor gave to other guests since machine_facts(), in % of all CPU time."""
    end = machine_cpu_ticks()
    if _TICKS_AT_START is None or end.total <= _TICKS_AT_START.total:
        return None
    return round(100 * (end.steal - _TICKS_AT_START.steal) / (end.total - _TICKS_AT_START.total), 1)


def write_json(name: str, data: dict[str, Any]) -> Path:
    if isinstance(data.get("machine"), dict):
        data["machine"]["cpu_steal_percent_during_run"] = steal_percent()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return path


def new_figure(ncols: int = 1, width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)


def save_png(fig: Any, name: str) -> Path:
    import matplotlib.pyplot as plt

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
