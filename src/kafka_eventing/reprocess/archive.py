"""archive: a topic → Parquet partitioned by event date and type, incrementally and exactly once per offset.

Spark's Kafka source with ``trigger(availableNow=True)`` reads everything not yet read (per the checkpoint) and
stops; the file sink's ``_spark_metadata`` log commits each batch's files together with its offsets, so a run
that dies half-way is re-done by the next run without duplicates. Read the archive with Spark
(``spark.read.parquet(path)``), which honours that log; readers that list files directly may see files of an
uncommitted batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka_eventing.reprocess.sources import read_topic_stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PARTITION_COLUMNS = ("event_date", "type")
_METRICS = "kafka_eventing_archive"


@dataclass
class ArchiveResult:
    topic: str
    output: str
    batches: int = 0
    records: int = 0
    archived: int = 0
    malformed: int = 0
    seconds: float = 0.0
    per_batch: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"job": "archive", "topic": self.topic, "output": self.output, "batches": self.batches,
                "records": self.records, "archived": self.archived, "malformed": self.malformed,
                "seconds": round(self.seconds, 3)}


def run_archive(
    spark: SparkSession,
    *,
    topic: str,
    output: str,
    checkpoint: str,
    kafka_options: Mapping[str, str],
    max_offsets_per_trigger: int | None = None,
    fail_on_data_loss: bool = True,
    timeout: float | None = None,
) -> ArchiveResult:
    """Append what is new in ``topic`` to the archive at ``output``; malformed records are kept with ``error``
    set (type null), counted and reported."""
    import time

    from pyspark.sql import functions as F
    from pyspark.sql.streaming.listener import StreamingQueryListener

    result = ArchiveResult(topic=topic, output=output)
    decoded = read_topic_stream(
        spark, topic, kafka_options,
        max_offsets_per_trigger=max_offsets_per_trigger, fail_on_data_loss=fail_on_data_loss,
        min_partitions=spark.sparkContext.defaultParallelism,
    )
    # observe() computes the counts in the same pass that writes the files; they arrive in query progress.
    observed = decoded.observe(
        _METRICS,
        F.count(F.lit(1)).alias("records"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("malformed"),
    )

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            metrics = progress.observedMetrics.get(_METRICS)
            if metrics is None:
                return
            records, malformed = int(metrics["records"] or 0), int(metrics["malformed"] or 0)
            result.batches += 1
            result.records += records
            result.malformed += malformed
            result.per_batch.append({"batch": progress.batchId, "records": records, "malformed": malformed,
                                     "rows_per_second": progress.processedRowsPerSecond,
                                     "duration_ms": dict(progress.durationMs)})
            log.info("archive batch %s: %s records (%s malformed)", progress.batchId, records, malformed)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Progress()
    spark.streams.addListener(listener)
    started = time.monotonic()
    try:
        query = (
            observed.writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", checkpoint)
            .partitionBy(*PARTITION_COLUMNS)
            .trigger(availableNow=True)
            .queryName(f"archive-{topic}")
            .start()
        )
        finished = query.awaitTermination(int(timeout)) if timeout else query.awaitTermination()
        if finished is False:
            query.stop()
            raise TimeoutError(f"archive of {topic} did not finish within {timeout}s")
        exc = query.exception()
        if exc is not None:
            raise RuntimeError(f"archive of {topic} failed: {exc}")
        # The listener bus is asynchronous: wait (briefly) until it saw the last batch's progress.
        last = query.lastProgress
        deadline = time.monotonic() + 10
        while last is not None and last.get("batchId", -1) >= 0 and time.monotonic() < deadline:
            if any(b["batch"] == last["batchId"] for b in result.per_batch) or not last.get("numInputRows"):
                break
            time.sleep(0.05)
    finally:
        spark.streams.removeListener(listener)
    result.seconds = time.monotonic() - started
    result.archived = result.records - result.malformed
    return result
