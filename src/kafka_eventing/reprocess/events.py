"""Kafka records ⇄ event columns, for Spark's ``mapInArrow`` — decoding is the core binding, nothing else.

Each Arrow batch from Spark's Kafka source (key, value, headers, topic, partition, offset, timestamp) is decoded
by the core binding: binary-mode records (``ce_`` headers) column-wise by ``reprocess.binding_arrow``, every other
record row by row through ``core.binding.event_from_kafka``, so records decode exactly as the receiver and
dispatcher see them (tests/unit/reprocess/test_binding_arrow.py holds the two paths to the same rows). A record
that is not a CloudEvent becomes a row with ``error`` set and the raw value in ``data``: counted and reported,
never a crashed job.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from kafka_eventing.core.binding import (
    BindingError,
    CloudEvent,
    ContentMode,
    RawDataFormat,
    Timestamp,
    attribute_text,
    event_from_kafka,
    event_to_kafka,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

#: Attributes with their own column, in this order; every other attribute is an extension.
CORE_ATTRIBUTES = ("id", "source", "type", "specversion", "subject", "time", "datacontenttype", "dataschema")
KAFKA_COLUMNS = ("topic", "partition", "offset", "timestamp")
RAW_COLUMNS = ("kafka_key", "kafka_value", "kafka_headers")

# (name, Spark type) of the decoded rows; built without a session, as Python workers have none.
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "string"), ("source", "string"), ("type", "string"), ("specversion", "string"),
    ("subject", "string"), ("time", "timestamp"), ("datacontenttype", "string"), ("dataschema", "string"),
    ("time_text", "string"), ("extensions", "map"), ("data", "binary"),
    ("topic", "string"), ("partition", "int"), ("offset", "long"), ("timestamp", "timestamp"),
    ("event_date", "date"), ("error", "string"),
)
_RAW: tuple[tuple[str, str], ...] = (("kafka_key", "binary"), ("kafka_value", "binary"), ("kafka_headers", "headers"))
_FORMAT = RawDataFormat()
_EPOCH = date(1970, 1, 1)  # event_date of a record with neither time nor timestamp


def _spark_type(kind: str) -> Any:
    from pyspark.sql import types as T

    simple = {"string": T.StringType(), "timestamp": T.TimestampType(), "binary": T.BinaryType(),
              "int": T.IntegerType(), "long": T.LongType(), "date": T.DateType()}
    if kind == "map":
        return T.MapType(T.StringType(), T.StringType())
    if kind == "headers":
        return T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))
    return simple[kind]


def event_schema(keep_raw: bool = False) -> StructType:
    """The decoded rows' Spark schema; ``keep_raw`` adds the original key/value/headers (topic → topic replay)."""
    from pyspark.sql.types import StructField, StructType

    columns = _COLUMNS + _RAW if keep_raw else _COLUMNS
    return StructType([StructField(name, _spark_type(kind)) for name, kind in columns])


def _text(value: Any) -> str:
    if isinstance(value, bool):  # CloudEvents' canonical string form of a Boolean
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def event_row(event: CloudEvent) -> dict[str, Any]:
    """A decoded event's attribute columns (no Kafka columns)."""
    attrs = event.get_attributes()
    data = event.get_data()
    row: dict[str, Any] = {name: attrs.get(name) for name in CORE_ATTRIBUTES}
    # `time` (a timestamp) serves windows, filters and partitioning; `time_text` is what a replay sends, as the
    # sender wrote it (a timestamp would re-render `.789Z` as `.789000Z`).
    row["time_text"] = None if row["time"] is None else attribute_text(row["time"])
    row["time"] = _utc(row["time"])
    for name in ("subject", "datacontenttype", "dataschema"):
        if row[name] is not None:
            row[name] = _text(row[name])
    row["extensions"] = {k: _text(v) for k, v in attrs.items() if k not in CORE_ATTRIBUTES and v is not None}
    row["data"] = None if data is None else _FORMAT.write_data(data, attrs.get("datacontenttype"))
    return row


def decode_record(
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[Mapping[str, Any]] | None,
    timestamp: datetime | None,
) -> dict[str, Any]:
    """One Kafka record → the event columns plus ``event_date`` and ``error`` (set when not a CloudEvent)."""
    pairs = [(h["key"], h["value"]) for h in headers or ()]
    kafka_ts = _utc(timestamp)
    try:
        row = event_row(event_from_kafka(pairs, value))
        row["error"] = None
    except (BindingError, OverflowError) as exc:
        # OverflowError: a valid `time` near year 1 or 9999 whose offset leaves datetime's range in UTC.
        row = {name: None for name in CORE_ATTRIBUTES}
        row.update(time_text=None, extensions=None, data=value, error=str(exc)[:1000] or type(exc).__name__)
    when = row["time"] or kafka_ts
    row["event_date"] = when.date() if when is not None else _EPOCH
    return row


def decode_batches(batches: Iterable[pa.RecordBatch], keep_raw: bool = False) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: Spark Kafka source batches → decoded batches (schema ``event_schema(keep_raw)``).

    Binary-mode records decode column-wise (``reprocess.binding_arrow``); whatever that path does not vouch for —
    structured mode, anything invalid or unusual — goes row by row through ``decode_record``. Row order is kept.
    """
    for batch in batches:
        yield decode_batch(batch, keep_raw)


def decode_batch(batch: pa.RecordBatch, keep_raw: bool = False) -> pa.RecordBatch:
    """One Spark Kafka source batch → one decoded batch, row for row as ``decode_record`` would give it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from kafka_eventing.reprocess.binding_arrow import TIME_TYPE, decode_binary

    schema = _arrow_schema(keep_raw)
    n = batch.num_rows
    cols = decode_binary(batch.column("headers"), batch.column("value"))
    kafka_ts = batch.column("timestamp").cast(TIME_TYPE)
    when = pc.coalesce(cols.attributes["time"], kafka_ts)
    arrays: dict[str, pa.Array] = {
        **cols.attributes, "time_text": cols.time_text, "extensions": cols.extensions, "data": cols.data,
        "topic": batch.column("topic"), "partition": batch.column("partition"), "offset": batch.column("offset"),
        "timestamp": kafka_ts, "event_date": pc.fill_null(when.cast(pa.date32()), pa.scalar(_EPOCH, pa.date32())),
        "error": pa.nulls(n, pa.string()),
    }
    if keep_raw:
        arrays.update(kafka_key=batch.column("key"), kafka_value=batch.column("value"),
                      kafka_headers=batch.column("headers"))
    fast = pa.RecordBatch.from_arrays([arrays[f.name].cast(f.type) for f in schema], schema=schema)
    if pc.all(cols.decoded).as_py():
        return fast
    decoded = cols.decoded.to_numpy(zero_copy_only=False)
    slow_idx = pa.array((~decoded).nonzero()[0])
    slow = pa.RecordBatch.from_pylist(_rows_one_by_one(batch.take(slow_idx), keep_raw), schema=schema)
    if len(slow_idx) == n:
        return slow
    # Put the rows back in input order (a batch's rows are one offset range of a partition).
    order = pc.inverse_permutation(pa.concat_arrays([pa.array(decoded.nonzero()[0]), slow_idx]))
    return pa.concat_batches([fast.filter(cols.decoded), slow]).take(order)


def _rows_one_by_one(batch: pa.RecordBatch, keep_raw: bool) -> list[dict[str, Any]]:
    cols = batch.to_pydict()
    rows = []
    for i in range(batch.num_rows):
        row = decode_record(cols["key"][i], cols["value"][i], cols["headers"][i], cols["timestamp"][i])
        for name in KAFKA_COLUMNS:
            row[name] = cols[name][i]
        row["timestamp"] = _utc(row["timestamp"])
        if keep_raw:
            row["kafka_key"] = cols["key"][i]
            row["kafka_value"] = cols["value"][i]
            row["kafka_headers"] = cols["headers"][i]
        rows.append(row)
    return rows


def _arrow_type(kind: str) -> pa.DataType:
    import pyarrow as pa

    if kind == "map":
        return pa.map_(pa.string(), pa.string())
    if kind == "headers":
        return pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    simple = {"string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"), "binary": pa.binary(),
              "int": pa.int32(), "long": pa.int64(), "date": pa.date32()}
    return simple[kind]


@functools.cache
def _arrow_schema(keep_raw: bool) -> pa.Schema:
    import pyarrow as pa

    columns = _COLUMNS + _RAW if keep_raw else _COLUMNS
    return pa.schema([(name, _arrow_type(kind)) for name, kind in columns])


def ext_pairs(extensions: Any) -> Iterable[tuple[str, Any]]:
    # A map column arrives as a dict (Spark rows, pandas) or as (key, value) pairs (Arrow's to_pylist).
    if extensions is None:
        return ()
    if isinstance(extensions, Mapping):
        return extensions.items()
    return [(k, v) for k, v in extensions]


def event_from_columns(row: Mapping[str, Any]) -> CloudEvent:
    """Rebuild the event from its columns (archive or decoded rows), ``time`` as the sender wrote it."""
    attrs: dict[str, Any] = {name: row.get(name) for name in CORE_ATTRIBUTES if row.get(name) is not None}
    if row.get("time_text") is not None:
        attrs["time"] = Timestamp(row["time_text"], strict=False)
    elif "time" in attrs:  # an archive written before `time_text` existed: the instant is all there is
        attrs["time"] = _utc(attrs["time"])
    for name, value in ext_pairs(row.get("extensions")):
        if value is not None:
            attrs[name] = value
    return CloudEvent(attrs, row.get("data"))


def encode_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: event columns → Kafka records in binary mode (key, value, headers)."""
    import pyarrow as pa

    schema = pa.schema([
        ("key", pa.binary()), ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ])
    for batch in batches:
        out = []
        for row in batch.to_pylist():
            record = event_to_kafka(event_from_columns(row), ContentMode.BINARY)
            out.append({"key": record.key, "value": record.value,
                        "headers": [{"key": k, "value": v} for k, v in record.headers]})
        yield pa.RecordBatch.from_pylist(out, schema=schema)


KAFKA_RECORD_DDL = "key binary, value binary, headers array<struct<key:string,value:binary>>"
