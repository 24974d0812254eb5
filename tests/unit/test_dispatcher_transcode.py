"""The dispatcher's Kafka→HTTP fast path (``core.transcode.kafka_to_http``) against the SDK path it replaces.

For any record, ``kafka_to_http`` must give exactly what ``event_to_http(event_from_kafka(...))`` gives —
the same headers in the same order and the same body — or raise the same ``BindingError``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_eventing.core.binding import (
    BindingError,
    CloudEvent,
    ContentMode,
    event_from_kafka,
    event_to_http,
    event_to_kafka,
)
from kafka_eventing.core.transcode import kafka_to_http

Headers = list[tuple[str, bytes | str | None]]


def _sdk(headers: Headers, value: bytes | None) -> Any:
    try:
        out = event_to_http(event_from_kafka(headers, value))
    except BindingError as exc:
        return ("error", str(exc), exc.details)
    return (list(out[0].items()), out[1])


def _fast(headers: Headers, value: bytes | None) -> Any:
    try:
        out = kafka_to_http(headers, value)
    except BindingError as exc:
        return ("error", str(exc), exc.details)
    return (list(out[0].items()), out[1])


BASE: Headers = [("ce_id", b"1"), ("ce_source", b"/s"), ("ce_type", b"t"), ("ce_specversion", b"1.0")]


@pytest.mark.parametrize("headers", [
    BASE,
    [*BASE, ("content-type", b"application/json"), ("traceparent", b"00-abc-def-01")],
    [("content-type", b"text/plain; charset=utf-8"), *BASE, ("ce_subject", b"a b \"c\" 100%")],
    [*BASE, ("ce_time", b"2024-05-01T10:00:00.123Z"), ("ce_myext", "caf\u00e9".encode())],
    [*BASE, ("ce_time", b"2024-05-01T10:00:00+02:00"), ("ce_dataschema", b"https://x/y")],
    [*BASE, ("CE_Partitionkey", b"k"), ("ce_id", b"2")],  # upper-case names, a duplicate: the last one wins
    [*BASE, ("ce_time", b"2024-05-01T10:00:00")],  # no zone: invalid
    [*BASE, ("ce_time", b"yesterday")],
    [*BASE, ("ce_data", b"x")],  # reserved extension name
    [*BASE, ("ce_Bad-Name", b"x")],
    [*BASE, ("ce_", b"x")],
    [*BASE, ("ce_subject", b"")],
    [*BASE, ("content-type", b"")],
    [*BASE, ("ce_datacontenttype", b"text/plain")],
    [*BASE, ("traceparent", b"\xff\xfe")],  # not UTF-8, even outside the attributes
    [*BASE, ("ce_id", b"")],
    [("ce_source", b"/s"), ("ce_type", b"t"), ("ce_specversion", b"1.0")],  # no id
    [("ce_id", b"1"), ("ce_source", b"/s"), ("ce_type", b"t"), ("ce_specversion", b"0.3")],
    [("content-type", b"application/cloudevents+json")],  # structured mode
    [],
    [*BASE, ("ce_empty", None), ("ce_str", "text")],  # None skipped, str values allowed
])
@pytest.mark.parametrize("value", [None, b"", b'{"a": 1}', b"\x00\xffraw"])
def test_examples_match_the_sdk_path(headers: Headers, value: bytes | None) -> None:
    if not headers and value:
        value = b'{"specversion": "1.0", "id": "1", "source": "/s", "type": "t"}'
    assert _fast(headers, value) == _sdk(headers, value)


def test_a_structured_record_takes_the_sdk_path() -> None:
    event = CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0"}, b"x")
    record = event_to_kafka(event, ContentMode.STRUCTURED)
    headers: Headers = list(record.headers)
    assert _fast(headers, record.value) == _sdk(headers, record.value)
    assert kafka_to_http(headers, record.value)[0]["ce-id"] == "1"


_names = st.sampled_from([
    "ce_id", "ce_source", "ce_type", "ce_specversion", "ce_subject", "ce_time", "ce_dataschema", "content-type",
    "ce_datacontenttype", "ce_data", "ce_ext1", "ce_Ext", "ce_", "ce_bad_name", "traceparent", "x-other",
])
_values = st.one_of(
    st.none(),
    st.sampled_from([b"", b"1.0", b"0.3", b"2024-01-02T03:04:05Z", b"2024-01-02T03:04:05.5+01:00",
                     b"2024-01-02", b"application/json", b"/a b%20\"c\""]),
    st.binary(max_size=12),
    st.text(max_size=12).map(str.encode),
    st.text(max_size=6),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_names, _values), max_size=10), st.one_of(st.none(), st.binary(max_size=20)))
def test_any_record_matches_the_sdk_path(extra: Headers, value: bytes | None) -> None:
    for headers in (extra, [*BASE, *extra]):
        assert _fast(headers, value) == _sdk(headers, value)


def test_a_plain_binary_record_does_not_build_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    import kafka_eventing.core.binding as binding

    def no_sdk(*_args: Any) -> Any:
        raise AssertionError("took the SDK path")

    monkeypatch.setattr(binding, "event_from_kafka", no_sdk)
    headers, body = kafka_to_http([*BASE, ("content-type", b"application/json"), ("ce_time", b"2024-01-02T03:04:05Z")],
                                  b"{}")
    assert headers == {"ce-id": "1", "ce-source": "/s", "ce-type": "t", "ce-specversion": "1.0",
                       "content-type": "application/json", "ce-time": "2024-01-02T03:04:05Z"}
    assert body == b"{}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_names, _values), max_size=10), st.one_of(st.none(), st.binary(max_size=20)))
def test_with_trace_the_record_trace_context_comes_along(extra: Headers, value: bytes | None) -> None:
    from kafka_eventing.core.binding import trace_from_kafka

    headers = [*BASE, *extra]
    try:
        fast = kafka_to_http(headers, value, trace=True)
    except BindingError:
        with pytest.raises(BindingError):
            kafka_to_http(headers, value)
        return
    plain, body = kafka_to_http(headers, value)
    # What the dispatcher used to do in two steps: the event's headers, then the record's trace context.
    assert fast == ({**plain, **trace_from_kafka(headers)}, body)
