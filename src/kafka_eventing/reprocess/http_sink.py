"""HTTP delivery for replay/redrive: the dispatcher's sender and retry policy, with bounded concurrency and a rate.

Runs inside Spark tasks (``mapInArrow``): each task owns one event loop, one aiohttp session, a semaphore of
``concurrency`` and a token bucket of ``rate`` events/s — the driver splits the job's totals across tasks.

A task attempt that Spark re-runs (its executor lost, a shuffle block gone) sends its events again, and only the
committed attempt's results survive. So each attempt journals the (source, id) of every event just before its first
request (``journal``: one file per task attempt); the driver reads the journals (``resent_ids``) and the manifest
reports the events that more than one attempt started to send: every duplicate delivery is among them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kafka_eventing.core.binding import BindingError, CloudEvent, event_to_http, with_extensions
from kafka_eventing.core.delivery import DeliverySpec
from kafka_eventing.reprocess.events import CORE_ATTRIBUTES, event_from_columns, ext_pairs

if TYPE_CHECKING:
    import aiohttp
    import pyarrow as pa

RESULT_COLUMNS = ("id", "source", "target", "status", "code", "attempts", "error")
SUCCEEDED, FAILED = "succeeded", "failed"


@dataclass(frozen=True)
class HttpSinkPolicy:
    """How one Spark task delivers: the DeliverySpec (retry/backoff/timeout) plus pacing."""

    delivery: DeliverySpec = field(default_factory=DeliverySpec)
    concurrency: int = 8
    rate: float | None = None  # events per second for this task; None = as fast as concurrency allows
    retry_after_max: float = 60.0


class RateLimiter:
    """Evenly spaced starts (``rate`` per second); no burst, so a target sees a steady load."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if not self._interval:
            return
        async with self._lock:
            now = time.monotonic()
            wait = self._next - now
            self._next = max(now, self._next) + self._interval
        if wait > 0:
            await asyncio.sleep(wait)


def result_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("source", pa.string()), ("target", pa.string()),
                      ("status", pa.string()), ("code", pa.int32()), ("attempts", pa.int32()),
                      ("error", pa.string())])


RESULT_DDL = "id string, source string, target string, status string, code int, attempts int, error string"


async def _deliver(
    session: aiohttp.ClientSession,
    *,
    row: dict[str, Any],
    policy: HttpSinkPolicy,
    limiter: RateLimiter,
    gate: asyncio.Semaphore,
    target: str | None,
    target_extension: str | None,
    drop_extensions: Sequence[str],
    journal: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    from kafka_eventing.core.http_delivery import Attempt, HttpSender, delivery_policy

    out: dict[str, Any] = {"id": row.get("id"), "source": row.get("source"), "target": target,
                           "status": FAILED, "code": None, "attempts": 0, "error": None}
    if target is None and target_extension:
        out["target"] = dict(ext_pairs(row.get("extensions"))).get(target_extension)
    if not out["target"]:
        out["error"] = f"no destination: no --to-url and no {target_extension or 'target'} extension"
        return out
    try:
        headers, body = event_to_http(strip_extensions(event_from_columns(row), drop_extensions))
    except (BindingError, ValueError) as exc:
        out["error"] = f"cannot rebuild the event: {exc}"[:1000]
        return out
    sender = HttpSender(session)
    attempts = 0

    async def once() -> Attempt:
        nonlocal attempts
        await limiter.acquire()  # every attempt, retries too, counts against the rate
        attempts += 1
        return await sender.post(out["target"], headers, body, policy.delivery.timeout_seconds)

    async with gate:
        if journal is not None:
            journal(out)
        attempt: Attempt = await delivery_policy(policy.delivery, policy.retry_after_max)(once)
    out.update(attempts=attempts, code=attempt.status)
    if attempt.ok:
        out["status"] = SUCCEEDED
    else:
        out["error"] = attempt.error or f"HTTP {attempt.status}: {attempt.body[:200].decode(errors='replace')}"
    return out


def strip_extensions(event: CloudEvent, patterns: Sequence[str]) -> CloudEvent:
    """Remove extensions named in ``patterns`` (``prefix*`` matches a prefix) — core's ``with_extensions``."""
    if not patterns:
        return event
    names = [name for name in event.get_attributes() if name not in CORE_ATTRIBUTES and any(
        name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)]
    return with_extensions(event, **dict.fromkeys(names)) if names else event


async def deliver_rows(
    rows: Sequence[dict[str, Any]],
    policy: HttpSinkPolicy,
    *,
    target: str | None,
    target_extension: str | None = None,
    drop_extensions: Sequence[str] = (),
    session: aiohttp.ClientSession | None = None,
    limiter: RateLimiter | None = None,
    journal: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Deliver decoded event rows; one result per row, in input order."""
    import aiohttp

    own = session is None
    if session is None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(1, policy.concurrency)))
    gate = asyncio.Semaphore(max(1, policy.concurrency))
    limiter = limiter or RateLimiter(policy.rate)
    try:
        return list(await asyncio.gather(*(
            _deliver(session, row=row, policy=policy, limiter=limiter, gate=gate, target=target,
                     target_extension=target_extension, drop_extensions=drop_extensions, journal=journal)
            for row in rows
        )))
    finally:
        if own:
            await session.close()


def send_batches(
    batches: Iterable[pa.RecordBatch],
    *,
    policy: HttpSinkPolicy,
    target: str | None,
    target_extension: str | None = None,
    drop_extensions: Sequence[str] = (),
    journal: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: decoded event rows → delivery results (schema ``RESULT_DDL``); with ``journal`` (a
    folder every executor can write, beside the results), this task attempt's journal file in it."""
    import aiohttp
    import pyarrow as pa

    loop = asyncio.new_event_loop()
    schema = result_arrow_schema()

    async def open_session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(1, policy.concurrency)))

    session = loop.run_until_complete(open_session())
    limiter = RateLimiter(policy.rate)  # one bucket for the whole task, across Arrow batches
    journal_file = _open_journal(journal) if journal else None

    def note(result: dict[str, Any]) -> None:
        assert journal_file is not None
        journal_file.write(json.dumps([result["source"], result["id"]]) + "\n")
        journal_file.flush()  # in the OS's hands before the request: a killed executor's process loses nothing

    try:
        for batch in batches:
            results = loop.run_until_complete(deliver_rows(
                batch.to_pylist(), policy, target=target, target_extension=target_extension,
                drop_extensions=drop_extensions, session=session, limiter=limiter,
                journal=note if journal_file else None,
            ))
            yield pa.RecordBatch.from_pylist(results, schema=schema)
    finally:
        loop.run_until_complete(session.close())
        loop.close()
        if journal_file is not None:
            journal_file.close()


def _open_journal(folder: str) -> IO[str]:
    """This task attempt's journal: ``<partition>.<attempt number>.<task attempt id>.jsonl`` (Spark's numbers; the
    id is unique in the application, across stage re-runs too)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None, "send_batches runs in a Spark task"
    path = Path(folder) / f"{ctx.partitionId()}.{ctx.attemptNumber()}.{ctx.taskAttemptId()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a", encoding="utf-8")


def resent_ids(folder: Path) -> list[tuple[str, str]]:
    """(source, id) pairs that more than one attempt of the same task started to send, from the journals."""
    attempts: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for path in sorted(folder.glob("*.jsonl")):
        partition = path.name.split(".", 1)[0]
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if line.endswith("\n"):  # a line cut by a kill before its newline was never followed by a send
                    source, event_id = json.loads(line)
                    attempts[(partition, source, event_id)].add(path.name)
    return sorted({(source, event_id) for (_, source, event_id), seen in attempts.items() if len(seen) > 1})
