"""The receiver's HTTP→Kafka fast path (``core.transcode.raw_http_to_kafka``) against the SDK path it replaces.

For any request, the fast path must give exactly what ``event_to_kafka(event_from_http(...))`` gives — the
same key, value and headers in the same order — or raise the same ``BindingError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_eventing.core import transcode
from kafka_eventing.core.binding import BindingError, ContentMode, KafkaRecord, event_from_http, event_to_kafka
from kafka_eventing.core.transcode import raw_http_to_kafka, text_headers

BASE = {"ce-id": "1", "ce-source": "/s", "ce-type": "t", "ce-specversion": "1.0"}
TEXTS = st.one_of(
    st.sampled_from(["", "x", "a b", "1.0", "0.3", "%41", "ü", "2024-01-01T00:00:00Z", "2024-01-01T00:00:00",
                     "2024-01-01T01:02:03.123+02:00", "nope", "/src", "http://x/y", "application/json",
                     "application/cloudevents+json", "Application/CloudEvents+JSON; charset=utf-8"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=12),
)
NAMES = st.one_of(
    st.sampled_from(["ce-id", "ce-source", "ce-type", "ce-specversion", "ce-time", "ce-subject", "ce-dataschema",
                     "ce-datacontenttype", "ce-partitionkey", "ce-data", "ce-Ext1", "CE-ID", "ce-", "ce-a_b",
                     "content-type", "Content-Type", "host", "traceparent", "x-other"]),
    st.from_regex(r"ce-[a-z0-9]{1,8}", fullmatch=True),
)
TRACES = st.sampled_from([None, {}, {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                          {"tracestate": "a=b", "traceparent": ""}])


def _fast(headers: Mapping[str, str], body: bytes, mode: ContentMode = ContentMode.BINARY,
                  trace: Mapping[str, str] | None = None, subject_key: bool = True) -> KafkaRecord:
    """The fast path on a str mapping: the header pairs a server would have read (latin-1 bytes, as HTTP/1.1
    carries them) and the mapping itself as the framework's view."""
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    return raw_http_to_kafka(raw, body, mode, trace, headers=lambda: headers, subject_key=subject_key)


def _outcome(build: Any) -> Any:
    try:
        record = build()
    except BindingError as exc:
        return ("error", str(exc), exc.details)
    except (ValueError, TypeError) as exc:
        return ("cannot-write", type(exc).__name__, str(exc))
    return (record.key, record.value, record.headers)


@settings(suppress_health_check=list(HealthCheck))
@given(st.dictionaries(NAMES, TEXTS, max_size=8), st.booleans(), st.binary(max_size=8), TRACES,
       st.sampled_from(list(ContentMode)), st.booleans())
def test_fast_path_equals_the_sdk_path(extra: dict[str, str], with_base: bool, body: bytes,
                                       trace: dict[str, str] | None, mode: ContentMode, subject_key: bool) -> None:
    headers = {**(BASE if with_base else {}), **extra}
    # Without an explicit trace the fast path carries the request's own trace headers.
    own = {k.lower(): v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate") and v}
    sdk = _outcome(lambda: event_to_kafka(event_from_http(headers, body), mode, trace=own if trace is None else trace,
                                          subject_key=subject_key))
    assert _outcome(lambda: _fast(headers, body, mode, trace=trace, subject_key=subject_key)) == sdk, headers


@pytest.mark.parametrize("mode", list(ContentMode))
def test_a_sinks_records_are_keyed_by_partitionkey_only(mode: ContentMode) -> None:
    """Channels and Brokers fall back to ``subject``; a KafkaSink (``subject_key=False``) does not, as upstream:
    on a compacted topic, events sharing a subject would otherwise collapse into the last one."""
    subject = {**BASE, "ce-subject": "order-1"}
    if mode is ContentMode.STRUCTURED:
        subject = {"content-type": "application/cloudevents+json"}
        body = b'{"specversion":"1.0","id":"1","source":"/s","type":"t","subject":"order-1"}'
        keyed = b'{"specversion":"1.0","id":"1","source":"/s","type":"t","subject":"order-1","partitionkey":"p"}'
    else:
        body = keyed = b""
    assert _fast(subject, body, mode).key == b"order-1"
    assert _fast(subject, body, mode, subject_key=False).key is None
    with_key = {**subject, "ce-partitionkey": "p"} if mode is ContentMode.BINARY else subject
    assert _fast(with_key, keyed, mode, subject_key=False).key == b"p"


@pytest.mark.parametrize("headers", [
    {**BASE, "content-type": "application/octet-stream", "host": "h", "content-length": "4"},
    {**BASE, "ce-time": "2024-06-01T10:00:00.5+02:00", "ce-subject": "order-1", "ce-partitionkey": "p",
     "ce-myext": "v", "content-type": "application/json"},
    {"Ce-Id": "9", "Ce-Source": "/x", "Ce-Type": "t", "Ce-Specversion": "1.0"},  # capitalised names
])
def test_common_events_do_not_go_through_the_sdk(monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]) -> None:
    expected = event_to_kafka(event_from_http(headers, b"data"), trace={"traceparent": "00-a-b-01"})

    def no_sdk(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("took the SDK path")

    monkeypatch.setattr(transcode, "_http_to_kafka_sdk", no_sdk)
    record = _fast(headers, b"data", trace={"traceparent": "00-a-b-01"})
    assert (record.key, record.value, record.headers) == (expected.key, expected.value, expected.headers)


def test_invalid_events_get_the_sdk_error() -> None:
    with pytest.raises(BindingError) as fast:
        _fast({**BASE, "ce-id": ""}, b"x")
    with pytest.raises(BindingError) as sdk:
        event_from_http({**BASE, "ce-id": ""}, b"x")
    assert fast.value.as_dict() == sdk.value.as_dict()


def test_trace_context_comes_from_the_request_itself() -> None:
    # Whether a client spells the names capitalised or lower-case, the record carries them in a fixed order.
    headers = {**BASE, "TraceState": "a=b", "Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    record = _fast(headers, b"x")
    assert record.headers[-2:] == [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                                   ("tracestate", b"a=b")]
    # An explicit trace (the batch path) wins over the request's headers.
    assert _fast(headers, b"x", trace={}).headers == record.headers[:-2]


def _asgi_request(pairs: list[tuple[bytes, bytes]]) -> Any:
    import falcon.asgi

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/ns/ch", "raw_path": b"/ns/ch", "query_string": b"", "headers": pairs,
             "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 1234)}
    return falcon.asgi.Request(scope, receive)


RAW_BASE = [(b"ce-id", b"1"), (b"ce-source", b"/s"), (b"ce-type", b"t"), (b"ce-specversion", b"1.0")]
RAW_NAMES = st.sampled_from([b"ce-id", b"ce-subject", b"ce-time", b"ce-myext", b"ce-partitionkey", b"content-type",
                             b"traceparent", b"tracestate", b"host", b"ce-data"])
RAW_VALUES = st.one_of(st.sampled_from([b"", b"x", b"2024-01-01T00:00:00Z", b"a%20b", "\u00fc".encode("latin-1"),
                                        b"1.0"]), st.binary(max_size=6))


@settings(suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(RAW_NAMES, RAW_VALUES), max_size=6), st.binary(max_size=8))
def test_raw_header_pairs_give_what_the_sdk_gives_on_the_framework_headers(
        extra: list[tuple[bytes, bytes]], body: bytes) -> None:
    # Repeated names, non-ASCII bytes, trace headers: the ASGI server's raw pairs against what falcon makes of them.
    pairs = [*RAW_BASE, *extra]
    req = _asgi_request(pairs)
    headers = text_headers(req.headers)  # what the receiver hands the SDK path (ingress.Ingress.decode)
    own = {k: v for k, v in headers.items() if k in ("traceparent", "tracestate") and v}
    sdk = _outcome(lambda: event_to_kafka(event_from_http(headers, body), trace=own))
    assert _outcome(lambda: raw_http_to_kafka(pairs, body, headers=lambda: text_headers(req.headers))) == sdk, pairs


def test_ce_specversion_header_means_binary_mode_whatever_the_content_type() -> None:
    """The SDK's rule, kept by the fast path: a ce-specversion header makes a request binary mode, even when
    its Content-Type says structured (the body is then the data)."""
    import json

    body = json.dumps({"specversion": "1.0", "id": "from-body", "source": "/b", "type": "t.b"}).encode()
    headers = {**BASE, "Content-Type": "application/cloudevents+json"}
    record = _fast(headers, body)
    assert dict(record.headers)["ce_id"] == b"1"
    assert record.value == body
    assert _outcome(lambda: _fast(headers, body)) == _outcome(
        lambda: event_to_kafka(event_from_http(headers, body), ContentMode.BINARY))
