"""Where jobs read from: a topic (a window of it, or incrementally as a stream) or a Parquet archive."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

from kafka_eventing.reprocess.events import decode_batches, event_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_SOURCE_COLUMNS = ("key", "value", "headers", "topic", "partition", "offset", "timestamp")


@dataclass(frozen=True)
class Window:
    """A slice of a topic: ``[start, end)`` by record timestamp, and/or Spark offset JSON per partition."""

    start: datetime | None = None
    end: datetime | None = None
    starting_offsets: str | None = None  # e.g. {"topic":{"0":10,"1":-2}} (-2 earliest, -1 latest)
    ending_offsets: str | None = None

    def describe(self) -> dict[str, str | None]:
        return {
            "start": self.start.isoformat() if self.start else None,
            "end": self.end.isoformat() if self.end else None,
            "starting_offsets": self.starting_offsets,
            "ending_offsets": self.ending_offsets,
        }


def parse_time(value: str) -> datetime:
    """RFC 3339 / ISO-8601; a time without zone is UTC."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def parse_offsets(value: str) -> str:
    """Check Spark's offset JSON early (a typo should fail before a Spark job starts)."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"offsets {value!r} are not JSON like {{\"topic\":{{\"0\":42}}}}: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"offsets {value!r} must be a JSON object of topic → {{partition: offset}}")
    return value


def _ms(when: datetime) -> str:
    return str(int(when.timestamp() * 1000))


def decode(raw: DataFrame, keep_raw: bool = False) -> DataFrame:
    """Spark Kafka rows → event columns through the core binding (one implementation, see events.py)."""
    return raw.select(*_SOURCE_COLUMNS).mapInArrow(partial(decode_batches, keep_raw=keep_raw), event_schema(keep_raw))


def read_topic(
    spark: SparkSession,
    topic: str,
    kafka_options: Mapping[str, str],
    window: Window = Window(),
    *,
    keep_raw: bool = False,
) -> DataFrame:
    """A batch read of a topic window, decoded. The time bounds are also filtered on the record timestamp,
    so a partition with no record past ``end`` still stops at ``end``."""
    from pyspark.sql import functions as F

    reader = (
        spark.read.format("kafka").options(**kafka_options)
        .option("subscribe", topic).option("includeHeaders", "true")
    )
    if window.starting_offsets:
        reader = reader.option("startingOffsets", window.starting_offsets)
    elif window.start is not None:
        reader = reader.option("startingTimestamp", _ms(window.start))
        reader = reader.option("startingOffsetsByTimestampStrategy", "latest")
    if window.ending_offsets:
        reader = reader.option("endingOffsets", window.ending_offsets)
    elif window.end is not None:
        reader = reader.option("endingTimestamp", _ms(window.end))
    raw = reader.load()
    if window.start is not None:
        raw = raw.where(F.col("timestamp") >= F.lit(window.start))
    if window.end is not None:
        raw = raw.where(F.col("timestamp") < F.lit(window.end))
    return decode(raw, keep_raw)


def read_topic_stream(
    spark: SparkSession,
    topic: str,
    kafka_options: Mapping[str, str],
    *,
    max_offsets_per_trigger: int | None = None,
    fail_on_data_loss: bool = True,
    min_partitions: int | None = None,
) -> DataFrame:
    """The topic as a stream from its earliest offset (a checkpoint takes over after the first run), decoded.

    ``min_partitions``: split a micro-batch's offset ranges into at least that many tasks, so a topic with fewer
    partitions than cores still uses every core (Spark only splits when it has fewer partitions than this)."""
    reader = (
        spark.readStream.format("kafka").options(**kafka_options)
        .option("subscribe", topic).option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", str(fail_on_data_loss).lower())
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    if min_partitions:
        reader = reader.option("minPartitions", str(min_partitions))
    return decode(reader.load())


def read_archive(spark: SparkSession, path: str, window: Window = Window()) -> DataFrame:
    """An archive written by the archive job; the window applies to the Kafka timestamp of each row."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(path)
    if "time_text" not in df.columns:  # written before the column existed: replay falls back to the instant
        df = df.withColumn("time_text", F.lit(None).cast("string"))
    if window.start is not None:
        df = df.where(F.col("timestamp") >= F.lit(window.start))
    if window.end is not None:
        df = df.where(F.col("timestamp") < F.lit(window.end))
    return df
