"""The columnar binary-mode decoder (reprocess/binding_arrow.py) against the SDK path (``decode_record``), row by row.

Batches are built the way Spark's Kafka source hands them to ``mapInArrow``; valid binary events, structured
events and malformed or unusual records are mixed in the same batch.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_eventing.core.binding import CloudEvent, ContentMode, event_to_kafka
from kafka_eventing.reprocess.binding_arrow import decode_binary
from kafka_eventing.reprocess.events import _arrow_schema, _rows_one_by_one, decode_batch

SOURCE_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
])
Headers = list[tuple[str, bytes | None]]
Record = tuple[bytes | None, bytes | None, Headers | None, datetime | None]


def source_batch(records: list[Record]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        {"key": key, "value": value, "topic": "t", "partition": i % 3, "offset": i, "timestamp": ts,
         "headers": None if headers is None else [{"key": k, "value": v} for k, v in headers]}
        for i, (key, value, headers, ts) in enumerate(records)
    ], schema=SOURCE_SCHEMA)


def sdk_rows(batch: pa.RecordBatch, keep_raw: bool = False) -> list[dict[str, Any]]:
    """What the row-by-row SDK path gives, through the same Arrow schema."""
    rows = _rows_one_by_one(batch, keep_raw)
    return pa.RecordBatch.from_pylist(rows, schema=_arrow_schema(keep_raw)).to_pylist()


# -- strategies ---------------------------------------------------------------------------------------------

CORE = ("id", "source", "type", "specversion", "subject", "time", "datacontenttype", "dataschema")
ext_names = st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True).filter(lambda s: s not in CORE and s != "data")
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
times = st.builds(
    lambda dt, tz: dt.replace(tzinfo=tz),
    st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(8999, 12, 30)), offsets,
)


@st.composite
def events(draw: st.DrawFn) -> CloudEvent:
    attrs: dict[str, Any] = {"id": draw(text), "source": draw(text), "type": draw(text), "specversion": "1.0"}
    for name, value in (("subject", text), ("dataschema", text), ("time", times),
                        ("datacontenttype", st.sampled_from(["application/json", "text/plain", "a/b; x=1"]))):
        if draw(st.booleans()):
            attrs[name] = draw(value)
    attrs.update(draw(st.dictionaries(ext_names, text, max_size=4)))
    return CloudEvent(attrs, draw(st.binary(max_size=40)))


TIME_TEXT = [
    "2024-02-30T00:00:00Z", "2024-01-01", "2024-01-01T00:00:00", "20240101T000000Z", "2024-01-01T24:00:00Z",
    "2024-01-01T00:00:00,5Z", "2024-01-01T00:00:00z", "2024-01-01T00:00:00.1234567Z", "2024-13-01T00:00:00Z",
    "2024-01-01T00:00:60Z", "2024-01-01 00:00:00Z", "", "soon", "2024-01-01T00:00:00+0100", "2024-01-01T00:00Z",
    "0999-01-01T00:00:00Z", "2024-02-29T23:59:59.5-00:30", "2023-02-29T00:00:00Z", "2024-01-01T00:00:00+24:00",
]


@st.composite
def mutated(draw: st.DrawFn, headers: Headers) -> Headers:
    """A valid binary record's headers, bent in one of the ways the columnar path must leave to the SDK."""
    h = list(headers)
    i = draw(st.integers(0, len(h) - 1))
    how = draw(st.sampled_from([
        "drop", "empty", "specversion", "time", "upper", "duplicate", "not-utf8", "non-ascii-name", "ext-name",
        "ce_datacontenttype", "null-value", "other-header", "empty-content-type",
    ]))
    name, value = h[i]
    if how == "drop":
        del h[i]
    elif how == "empty":
        h[i] = (name, b"")
    elif how == "specversion":
        h = [(k, draw(st.sampled_from([b"0.3", b"2.0", b"1.0 ", b""])) if k == "ce_specversion" else v) for k, v in h]
    elif how == "time":
        h = [(k, v) for k, v in h if k != "ce_time"] + [("ce_time", draw(st.sampled_from(TIME_TEXT)).encode())]
    elif how == "upper":
        h[i] = (name.upper(), value)
    elif how == "duplicate":
        again = (draw(st.sampled_from([name, name.upper()])), draw(st.binary(max_size=4)))
        h.insert(draw(st.integers(0, len(h))), again)
    elif how == "not-utf8":
        h[i] = (name, b"\xff\xfe")
    elif how == "non-ascii-name":
        h.append((draw(st.sampled_from(["ce_\u212aey", "ce_é", "\u212ae"])), b"x"))
    elif how == "ext-name":
        h.append((draw(st.sampled_from(["ce_data", "ce_", "ce_a-b", "ce_a_b", "ce_x\n", "ce_" + "a" * 30])), b"v"))
    elif how == "ce_datacontenttype":
        h.append(("ce_datacontenttype", b"text/plain"))
    elif how == "null-value":
        h[i] = (name, None)
    elif how == "other-header":
        h.insert(i, (draw(st.sampled_from(["traceparent", "X-Other", "content-typ"])), draw(st.binary(max_size=6))))
    else:
        h.append(("content-type", b""))
    return h


kafka_ts = st.one_of(st.none(), st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1),
                                              timezones=st.just(UTC)))


@st.composite
def records(draw: st.DrawFn) -> tuple[Record, bool]:
    """A record, and whether the columnar path must decode it (a plain valid binary-mode event)."""
    kind = draw(st.sampled_from(["binary", "binary", "structured", "mutated", "mutated", "mutated", "raw"]))
    ts = draw(kafka_ts)
    if kind == "raw":
        headers = draw(st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(["content-type", "x"]),
                                                              st.binary(max_size=8)), max_size=2)))
        return (None, draw(st.one_of(st.none(), st.binary(max_size=20))), headers, ts), False
    event = draw(events())
    rec = event_to_kafka(event, ContentMode.STRUCTURED if kind == "structured" else ContentMode.BINARY)
    headers = list(rec.headers)
    if kind == "mutated":
        headers = draw(mutated(headers))
    elif kind == "binary" and draw(st.booleans()):
        headers.insert(0, ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
    return (rec.key, rec.value, headers, ts), kind == "binary"


# -- properties ---------------------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(records(), min_size=1, max_size=25), st.booleans())
def test_columnar_decode_matches_the_sdk_path_row_for_row(batch_records: list[tuple[Record, bool]],
                                                          keep_raw: bool) -> None:
    batch = source_batch([r for r, _ in batch_records])
    assert decode_batch(batch, keep_raw).to_pylist() == sdk_rows(batch, keep_raw)
    # The fast path really is taken for plain binary events (otherwise the above proves nothing about it).
    decoded = decode_binary(batch.column("headers"), batch.column("value")).decoded.to_pylist()
    for (_, must), got in zip(batch_records, decoded, strict=True):
        if must:
            assert got


def test_a_mixed_batch_keeps_order_and_reports_errors() -> None:
    base = datetime(2024, 2, 3, 4, 5, 6, 789000, tzinfo=timezone(timedelta(hours=-2)))
    good = CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0", "time": base,
                       "zone": "eu", "tier": "gold"}, b"\x00payload")
    binary, structured = event_to_kafka(good), event_to_kafka(good, ContentMode.STRUCTURED)
    ts = datetime(2025, 1, 1, tzinfo=UTC)
    batch = source_batch([
        (binary.key, binary.value, binary.headers, ts),
        (None, b"plain text", [("content-type", b"text/plain")], ts),
        (structured.key, structured.value, structured.headers, None),
        (binary.key, b"", binary.headers, None),
    ])
    rows = decode_batch(batch).to_pylist()
    assert rows == sdk_rows(batch)
    assert [r["offset"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["extensions"] == [("zone", "eu"), ("tier", "gold")]
    assert rows[0]["time"] == datetime(2024, 2, 3, 6, 5, 6, 789000, tzinfo=UTC)
    assert rows[0]["event_date"].isoformat() == "2024-02-03" and rows[0]["error"] is None
    assert rows[1]["error"] and rows[1]["event_date"].isoformat() == "2025-01-01" and rows[1]["data"] == b"plain text"
    assert rows[2]["id"] == "1" and rows[2]["error"] is None
    assert rows[3]["data"] is None
    assert decode_binary(batch.column("headers"), batch.column("value")).decoded.to_pylist() == [
        True, False, False, True]


@pytest.mark.parametrize("headers", [None, []])
def test_records_without_headers_fall_back(headers: Headers | None) -> None:
    batch = source_batch([(None, b"x", headers, None)])
    assert decode_batch(batch).to_pylist() == sdk_rows(batch)
    assert decode_batch(batch).to_pylist()[0]["event_date"].isoformat() == "1970-01-01"


FULL = CloudEvent({"id": "e-1", "source": "/s", "type": "t", "specversion": "1.0", "subject": "sub",
                   "dataschema": "http://schema", "datacontenttype": "application/json",
                   "time": datetime(2024, 2, 29, 23, 30, tzinfo=timezone(timedelta(hours=-1))), "zone": "eu"},
                  b'{"a":1}')
FULL_HEADERS = event_to_kafka(FULL).headers


def _replace(name: str, value: bytes | None) -> Headers:
    return [(k, value if k == name else v) for k, v in FULL_HEADERS]


EDGE_CASES: dict[str, Headers] = {
    **{f"empty {name}": _replace(name, b"") for name, _ in FULL_HEADERS},
    **{f"no {name}": [(k, v) for k, v in FULL_HEADERS if k != name] for name, _ in FULL_HEADERS},
    **{f"time {t!r}": _replace("ce_time", t.encode()) for t in TIME_TEXT},
    **{f"specversion {v!r}": _replace("ce_specversion", v) for v in (b"0.3", b"2.0", b"1.0 ", b"1")},
    **{f"extension {n!r}": [*FULL_HEADERS, (n, b"v")]
       for n in ("ce_data", "ce_", "ce_a-b", "ce_a_b", "ce_x\n", "ce_\u212aey", "ce_é", "CE_ZONE", "ce_Zone2")},
    "ce_datacontenttype": [*FULL_HEADERS, ("ce_datacontenttype", b"text/plain")],
    "duplicate id": [*FULL_HEADERS, ("ce_id", b"e-2")],
    "duplicate extension, other case": [*FULL_HEADERS, ("CE_zone", b"us")],
    "duplicate content-type": [*FULL_HEADERS, ("Content-Type", b"text/plain")],
    "not UTF-8 in another header": [*FULL_HEADERS, ("traceparent", b"\xff")],
    "not UTF-8 in an attribute": _replace("ce_source", b"/\xc3"),
    "null value": _replace("ce_subject", None),
    "upper-case names": [(k.upper(), v) for k, v in FULL_HEADERS],
}


@pytest.mark.parametrize("headers", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_edge_cases_match_the_sdk_path(headers: Headers) -> None:
    ts = datetime(2025, 1, 1, tzinfo=UTC)
    batch = source_batch([(None, b'{"a":1}', FULL_HEADERS, ts), (None, b'{"a":1}', headers, ts)])
    assert decode_batch(batch).to_pylist() == sdk_rows(batch)
    assert decode_binary(batch.column("headers"), batch.column("value")).decoded[0].as_py()


@pytest.mark.parametrize("mode", [ContentMode.BINARY, ContentMode.STRUCTURED])
@pytest.mark.parametrize("text", ["2024-05-01T12:34:56.789Z", "2024-05-01T14:34:56.5+02:00",
                                  "2024-05-01T12:34:56Z", "2024-05-01T12:34:56.123456789Z"])
def test_a_replayed_event_carries_time_as_the_record_had_it(mode: ContentMode, text: str) -> None:
    from kafka_eventing.core.binding import event_to_http
    from kafka_eventing.reprocess.events import event_from_columns

    record = event_to_kafka(CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0",
                                        "time": text}, b"x"), mode)
    (row,) = decode_batch(source_batch([(record.key, record.value, list(record.headers), None)])).to_pylist()
    assert row["time_text"] == text and row["time"] is not None  # the instant stays for windows and filters
    headers, _ = event_to_http(event_from_columns(row), ContentMode.BINARY)
    assert headers["ce-time"] == text
    assert dict(event_to_kafka(event_from_columns(row), ContentMode.BINARY).headers)["ce_time"] == text.encode()
