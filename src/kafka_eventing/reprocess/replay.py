"""replay and redrive: selected events → an HTTP target or a Kafka topic, with a JSON run manifest.

A run directory holds ``manifest.json``, ``results/attempt=N/`` (one row per event sent: id, source, target,
status) and ``journal/attempt=N/`` (HTTP targets: the events each Spark task attempt started to send, from which the
manifest's ``possibly_resent`` comes — delivery is at least once, and a task Spark re-runs sends again what its lost
attempt had sent). The run directory must be on storage every executor can write, as the results are.

Running again with the same run directory skips every (source, id) that already succeeded, so a redrive
interrupted or partly failed can simply be re-run without sending anything twice.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial, reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_eventing.reprocess.cesql_spark import check_where, compile_where
from kafka_eventing.reprocess.events import CORE_ATTRIBUTES, encode_batches
from kafka_eventing.reprocess.http_sink import (
    FAILED,
    RESULT_DDL,
    SUCCEEDED,
    HttpSinkPolicy,
    resent_ids,
    send_batches,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The dead-letter extensions a redrive removes (``knativeerrordest``, ``knativeerrorcode``, ``knativeerrordata``).
DEAD_LETTER_EXTENSIONS = ("knativeerror*",)
DEAD_LETTER_DEST = "knativeerrordest"
MAX_LISTED = 1000  # ids listed in the manifest; the full list is in results/


@dataclass(frozen=True)
class HttpTarget:
    """Deliver over HTTP: to ``url``, or (redrive) to each event's ``knativeerrordest`` when ``url`` is None."""

    url: str | None
    policy: HttpSinkPolicy = field(default_factory=HttpSinkPolicy)
    parallelism: int | None = None  # Spark tasks; concurrency and rate are split across them

    def describe(self) -> dict[str, Any]:
        spec = self.policy.delivery
        return {"kind": "http", "url": self.url, "concurrency": self.policy.concurrency, "rate": self.policy.rate,
                "retry": spec.retry, "backoff_policy": spec.backoff_policy.value,
                "backoff_delay": spec.backoff_delay.total_seconds(), "timeout": spec.timeout_seconds}


@dataclass(frozen=True)
class TopicTarget:
    """Produce to a Kafka topic; records read from a topic keep their key, value and headers byte for byte."""

    topic: str
    kafka_options: Mapping[str, str]

    def describe(self) -> dict[str, Any]:
        return {"kind": "kafka", "topic": self.topic,
                "bootstrap.servers": self.kafka_options.get("kafka.bootstrap.servers")}


@dataclass(frozen=True)
class Filters:
    """Which events a run takes, all conditions together: attribute equality (``--where-attr``, extensions by name
    too), a CloudEvents SQL expression (``--where``, the same one a Trigger filters with; ``reprocess.cesql_spark``)
    and a Spark SQL predicate over the row's columns (``--where-sql``)."""

    equals: Mapping[str, str] = field(default_factory=dict)
    where: str | None = None
    where_sql: str | None = None

    def check(self) -> None:
        """Refuse an expression that is not CESQL before Spark starts (``CesqlParseError``, with line and column)."""
        if self.where is not None:
            check_where(self.where)

    def describe(self) -> dict[str, Any]:
        return {"equals": dict(self.equals), "where": self.where, "where_sql": self.where_sql}

    def column(self) -> Column | None:
        from pyspark.sql import functions as F

        terms: list[Column] = []
        for name, value in self.equals.items():
            col = F.col(name) if name in CORE_ATTRIBUTES else F.col("extensions").getItem(name)
            terms.append(col.cast("string") == F.lit(value))
        if self.where is not None:
            terms.append(compile_where(self.where).matches)
        if self.where_sql:
            terms.append(F.expr(self.where_sql))
        return reduce(lambda a, b: a & b, terms) if terms else None


@dataclass
class Manifest:
    job: str
    run_id: str
    run_dir: str
    dry_run: bool
    source: dict[str, Any]
    sink: dict[str, Any]
    filters: dict[str, Any]
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    finished: str | None = None
    attempt: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    malformed: list[dict[str, Any]] = field(default_factory=list)
    would_send: list[dict[str, Any]] = field(default_factory=list)
    #: Events that more than one attempt of a Spark task started to send: every duplicate delivery is one of these.
    possibly_resent: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def path(self) -> Path:
        return Path(self.run_dir) / "manifest.json"

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, default=str) + "\n")
        tmp.replace(self.path)  # a reader never sees half a manifest
        return self.path


def _previous_attempts(run_dir: Path) -> int:
    results = run_dir / "results"
    if not results.is_dir():
        return 0
    done = [p for p in results.glob("attempt=*") if (p / "_SUCCESS").exists()]
    return max((int(p.name.split("=", 1)[1]) for p in done), default=0)


def _already_succeeded(spark: SparkSession, run_dir: Path) -> DataFrame | None:
    from pyspark.sql import functions as F

    if _previous_attempts(run_dir) == 0:
        return None
    done = spark.read.parquet(str(run_dir / "results"))
    return done.where(F.col("status") == SUCCEEDED).select("source", "id").distinct()


def run_replay(
    spark: SparkSession,
    events: DataFrame,
    target: HttpTarget | TopicTarget,
    *,
    run_dir: str | Path,
    source: Mapping[str, Any],
    filters: Filters = Filters(),
    dry_run: bool = False,
    job: str = "replay",
    drop_extensions: Sequence[str] = (),
    target_extension: str | None = None,
    dedupe: bool = False,
) -> Manifest:
    """Select ``events`` (decoded rows), skip what this run already delivered, send the rest, write the manifest."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    started = time.monotonic()
    run_path = Path(run_dir)
    previous = _previous_attempts(run_path)
    manifest = Manifest(
        job=job, run_id=_run_id(run_path), run_dir=str(run_path), dry_run=dry_run, source=dict(source),
        sink=target.describe(), filters=filters.describe(),
        attempt=previous + 1,
    )
    events = events.persist(StorageLevel.MEMORY_AND_DISK)  # read Kafka/Parquet once for count + send
    try:
        bad = F.col("error").isNotNull()
        cond = filters.column()
        wanted = ~bad if cond is None else (~bad & cond)
        # One pass for the counts (the first action also fills the cache).
        totals = events.agg(
            F.count(F.lit(1)).alias("read"),
            F.sum(F.when(bad, 1).otherwise(0)).alias("malformed"),
            F.sum(F.when(wanted, 1).otherwise(0)).alias("matched"),
        ).first()
        assert totals is not None
        read, bad_count, matched = (int(totals[name] or 0) for name in ("read", "malformed", "matched"))
        if bad_count:
            manifest.malformed = [r.asDict() for r in events.where(bad).select("topic", "partition", "offset", "error")
                                  .limit(MAX_LISTED).collect()]
        selected = events.where(wanted)
        if dedupe:
            selected = selected.dropDuplicates(["source", "id"])
            matched = selected.count()
        todo = matched
        done = _already_succeeded(spark, run_path)
        if done is not None:
            selected = selected.join(done, on=["source", "id"], how="left_anti")
            todo = selected.count()
        manifest.counts = {"read": read, "malformed": bad_count, "matched": matched,
                           "already_succeeded": matched - todo, "selected": todo}
        if dry_run:
            cols = ["id", "source", "type", "topic", "partition", "offset"]
            if target_extension:
                cols.append(F.col("extensions").getItem(target_extension).alias("target"))  # type: ignore[arg-type]
            manifest.would_send = [r.asDict() for r in selected.select(*cols).limit(MAX_LISTED).collect()]
            manifest.counts.update(sent=0, succeeded=0, failed=0)
        elif isinstance(target, HttpTarget):
            _send_http(spark, selected, target, manifest=manifest, run_dir=run_path,
                       drop_extensions=drop_extensions, target_extension=target_extension)
        else:
            _send_topic(spark, selected, target, manifest, run_path)
    finally:
        events.unpersist()
    manifest.finished = datetime.now(UTC).isoformat()
    manifest.seconds = round(time.monotonic() - started, 3)
    manifest.write()
    return manifest


def _run_id(run_dir: Path) -> str:
    existing = run_dir / "manifest.json"
    if existing.exists():
        try:
            return str(json.loads(existing.read_text())["run_id"])
        except (ValueError, KeyError):
            pass
    return uuid.uuid4().hex[:12]


def _send_http(
    spark: SparkSession,
    selected: DataFrame,
    target: HttpTarget,
    *,
    manifest: Manifest,
    run_dir: Path,
    drop_extensions: Sequence[str],
    target_extension: str | None,
) -> None:
    from pyspark.sql import functions as F

    tasks = max(1, target.parallelism or spark.sparkContext.defaultParallelism)
    per_task = HttpSinkPolicy(
        delivery=target.policy.delivery,
        concurrency=max(1, target.policy.concurrency // tasks),
        rate=target.policy.rate / tasks if target.policy.rate else None,
        retry_after_max=target.policy.retry_after_max,
    )
    # Events of one Kafka partition stay in one task, in offset order (replays keep per-partition order
    # when concurrency is 1).
    ordered = selected.repartition(tasks, "topic", "partition").sortWithinPartitions("topic", "partition", "offset")
    journal = (run_dir / "journal" / f"attempt={manifest.attempt}").resolve()
    send = partial(send_batches, policy=per_task, target=target.url, target_extension=target_extension,
                   drop_extensions=tuple(drop_extensions), journal=str(journal))
    out = run_dir / "results" / f"attempt={manifest.attempt}"
    # Written once, then read back: the sending happens in exactly one Spark action.
    ordered.mapInArrow(send, RESULT_DDL).write.mode("overwrite").parquet(str(out))
    results = spark.read.parquet(str(out))
    by_status = {r["status"]: int(r["count"]) for r in results.groupBy("status").count().collect()}
    resent = resent_ids(journal)
    manifest.counts.update(sent=sum(by_status.values()), succeeded=by_status.get(SUCCEEDED, 0),
                           failed=by_status.get(FAILED, 0), possibly_resent=len(resent))
    manifest.possibly_resent = [{"source": source, "id": event_id} for source, event_id in resent[:MAX_LISTED]]
    manifest.failed = [r.asDict() for r in results.where(F.col("status") == FAILED)
                       .select("id", "source", "target", "code", "attempts", "error").limit(MAX_LISTED).collect()]


def _send_topic(
    spark: SparkSession, selected: DataFrame, target: TopicTarget, manifest: Manifest, run_dir: Path,
) -> None:
    from pyspark.sql import functions as F

    selected = selected.persist()
    try:
        if "kafka_value" in selected.columns:
            records = selected.select(F.col("kafka_key").alias("key"), F.col("kafka_value").alias("value"),
                                      F.col("kafka_headers").alias("headers"))
        else:
            from kafka_eventing.reprocess.events import KAFKA_RECORD_DDL

            records = selected.mapInArrow(encode_batches, KAFKA_RECORD_DDL)
        # Spark's Kafka writer fails the job on a produce error, so a finished write means all were acked.
        records.write.format("kafka").options(**target.kafka_options).option("topic", target.topic).save()
        sent = selected.count()
        out = run_dir / "results" / f"attempt={manifest.attempt}"
        (selected.select("id", "source", F.lit(f"kafka:{target.topic}").alias("target"),
                         F.lit(SUCCEEDED).alias("status"), F.lit(None).cast("int").alias("code"),
                         F.lit(1).alias("attempts"), F.lit(None).cast("string").alias("error"))
         .write.mode("overwrite").parquet(str(out)))
    finally:
        selected.unpersist()
    manifest.counts.update(sent=sent, succeeded=sent, failed=0)


def run_redrive(
    spark: SparkSession,
    dead_letters: DataFrame,
    *,
    url: str | None,
    policy: HttpSinkPolicy,
    run_dir: str | Path,
    source: Mapping[str, Any],
    filters: Filters = Filters(),
    dry_run: bool = False,
    parallelism: int | None = None,
) -> Manifest:
    """Dead letters → their original destination (``knativeerrordest``) or ``url``, without the
    ``knativeerror*`` extensions; each (source, id) once per run directory."""
    return run_replay(
        spark, dead_letters, HttpTarget(url=url, policy=policy, parallelism=parallelism),
        run_dir=run_dir, source=source, filters=filters, dry_run=dry_run, job="redrive",
        drop_extensions=DEAD_LETTER_EXTENSIONS, target_extension=None if url else DEAD_LETTER_DEST, dedupe=True,
    )
