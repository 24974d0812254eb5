from __future__ import annotations

import json

import pytest

from kafka_eventing.core.binding import (
    BindingError,
    ContentMode,
    error_data,
    event_from_http,
    event_from_kafka,
    event_to_http,
    event_to_kafka,
    events_from_http_batch,
    partition_key,
    with_extensions,
)

BINARY = {"ce-id": "1", "ce-source": "/src", "ce-type": "com.example.t", "ce-specversion": "1.0",
          "Content-Type": "application/json"}


def test_binary_roundtrip_keeps_data_bytes_and_attributes() -> None:
    body = b'{"b": 1,   "a": [2]}'  # odd spacing and key order must survive
    event = event_from_http({**BINARY, "ce-time": "2024-05-01T10:00:00Z", "ce-myext": "x%20y"}, body)
    assert event.get_extension("myext") == "x y"  # percent-decoding per the HTTP binding
    record = event_to_kafka(event)
    headers = dict(record.headers)
    assert headers["ce_id"] == b"1" and headers["content-type"] == b"application/json"
    assert record.value == body
    back = event_from_kafka(record.headers, record.value)
    assert back.get_attributes() == event.get_attributes()
    out_headers, out_body = event_to_http(back)
    assert out_body == body
    assert out_headers["ce-type"] == "com.example.t"


def test_structured_in_structured_kafka_out() -> None:
    doc = {"id": "9", "source": "/s", "type": "t", "specversion": "1.0", "subject": "sub", "data": {"k": "v"}}
    event = event_from_http({"content-type": "application/cloudevents+json; charset=utf-8"}, json.dumps(doc).encode())
    record = event_to_kafka(event, ContentMode.STRUCTURED)
    assert dict(record.headers)["content-type"] == b"application/cloudevents+json"
    assert json.loads(record.value)["data"] == {"k": "v"}
    assert record.key == b"sub"
    back = event_from_kafka(record.headers, record.value)
    assert back.get_attributes() == event.get_attributes()
    assert "time" not in back.get_attributes()  # nothing invented in transit


def test_structured_json_data_to_binary_is_the_data_as_written() -> None:
    doc = {"id": "9", "source": "/s", "type": "t", "specversion": "1.0", "data": [1, 2]}
    record = event_to_kafka(event_from_http({"content-type": "application/cloudevents+json"}, json.dumps(doc).encode()))
    assert record.value == b"[1, 2]"  # the member's JSON text, not re-serialised
    assert "content-type" not in dict(record.headers)  # no datacontenttype the producer did not set


def test_key_order_partitionkey_subject_none() -> None:
    base = {**BINARY}
    assert partition_key(event_from_http({**base, "ce-partitionkey": "pk", "ce-subject": "s"}, b"")) == b"pk"
    assert partition_key(event_from_http({**base, "ce-subject": "s"}, b"")) == b"s"
    assert partition_key(event_from_http(base, b"")) is None


def test_trace_headers_carried() -> None:
    event = event_from_http(BINARY, b"{}")
    record = event_to_kafka(event, trace={"traceparent": "00-abc-def-01", "tracestate": "a=b"})
    assert ("traceparent", b"00-abc-def-01") in record.headers
    assert ("tracestate", b"a=b") in record.headers


@pytest.mark.parametrize(
    ("headers", "body", "field"),
    [
        ({k: v for k, v in BINARY.items() if k != "ce-id"}, b"", "id"),
        ({k: v for k, v in BINARY.items() if k != "ce-source"}, b"", "source"),
        ({k: v for k, v in BINARY.items() if k != "ce-specversion"}, b"", "specversion"),
        ({**BINARY, "ce-time": "yesterday"}, b"", "time"),
    ],
)
def test_invalid_binary_names_the_attribute(headers: dict[str, str], body: bytes, field: str) -> None:
    with pytest.raises(BindingError) as err:
        event_from_http(headers, body)
    assert field in err.value.details


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"content-type": "text/plain"}, b"hello"),
        ({"content-type": "application/cloudevents+json"}, b"{not json"),
        ({"content-type": "application/cloudevents+json"}, b"[]"),
        ({"content-type": "application/cloudevents+json"}, b'{"id":"1","source":"/s","type":"t","specversion":"0.1"}'),
    ],
)
def test_malformed_is_binding_error(headers: dict[str, str], body: bytes) -> None:
    with pytest.raises(BindingError):
        event_from_http(headers, body)


def test_batch_all_or_nothing() -> None:
    good = {"id": "1", "source": "/s", "type": "t", "specversion": "1.0", "data_base64": "AAE="}
    events = events_from_http_batch(json.dumps([good, {**good, "id": "2"}]).encode())
    assert [e.get_id() for e in events] == ["1", "2"]
    assert events[0].get_data() == b"\x00\x01"
    with pytest.raises(BindingError, match="batch item 1"):
        events_from_http_batch(json.dumps([good, {"id": "2"}]).encode())
    with pytest.raises(BindingError, match="array"):
        events_from_http_batch(b"{}")


def test_record_that_is_not_a_cloudevent() -> None:
    with pytest.raises(BindingError, match="not a CloudEvent"):
        event_from_kafka([("x", b"y")], b"plain text")


def test_dead_letter_helpers() -> None:
    event = event_from_http(BINARY, b"{}")
    dl = with_extensions(event, knativeerrorcode="500", knativeerrordata=error_data(b"x" * 5000))
    assert dl.get_extension("knativeerrorcode") == "500"
    assert len(dl.get_extension("knativeerrordata")) == 1368  # base64 of 1024 bytes
    assert with_extensions(dl, knativeerrorcode=None).get_extension("knativeerrorcode") is None
