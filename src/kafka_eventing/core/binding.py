"""The one CloudEvents ⇄ HTTP ⇄ Kafka binding every role uses (receiver, dispatcher, broker, reprocess).

Built on the cloudevents SDK 2.x bindings (``cloudevents.core.bindings.http`` / ``.kafka``). One deliberate
difference from the SDK's defaults: event data is carried as the exact bytes received (``RawDataFormat``), so a
binary-mode event goes HTTP → Kafka → HTTP with its body byte-for-byte unchanged.
"""

from __future__ import annotations

import base64
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.bindings.common import CONTENT_TYPE_HEADER, DATACONTENTTYPE_ATTR
from cloudevents.core.exceptions import (
    BaseCloudEventException,
    CloudEventValidationError,
    MissingRequiredAttributeError,
)
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.spec import SPECVERSION_V1_0
from cloudevents.core.v1.event import OPTIONAL_ATTRIBUTES as _SDK_OPTIONAL_ATTRIBUTES
from cloudevents.core.v1.event import CloudEvent as _SDKCloudEvent
from dateutil.parser import isoparse

STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
TRACE_HEADERS = ("traceparent", "tracestate")
_JSON_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9\-.]+\+)?json(;.*)?$")

__all__ = [
    "BATCH_CONTENT_TYPE", "STRUCTURED_CONTENT_TYPE", "BindingError", "CloudEvent", "ContentMode",
    "KafkaRecord", "event_from_http", "event_from_kafka", "event_to_http", "event_to_kafka",
    "events_from_http_batch", "is_batch", "is_structured", "partition_key",
]


class BindingError(ValueError):
    """The input is not a valid CloudEvent. ``details`` names each problem (for a 400 body)."""

    def __init__(self, message: str, details: Mapping[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, list[str]] = dict(details or {})

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": str(self)}
        if self.details:
            out["details"] = self.details
        return out


class ContentMode(enum.StrEnum):
    BINARY = "binary"
    STRUCTURED = "structured"


class KafkaRecord(NamedTuple):
    """What goes to ``Producer.produce``: key, value and headers as a list (duplicates allowed by Kafka).

    A NamedTuple, not a frozen dataclass: one is built per event on the receiver's hot path, and a frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) cost ~1 µs of it (session 6 profile).
    """

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


REQUIRED_ATTRIBUTES = ("id", "source", "specversion", "type")
OPTIONAL_ATTRIBUTES = tuple(_SDK_OPTIONAL_ATTRIBUTES)  # datacontenttype, dataschema, subject, time
SPECVERSION = SPECVERSION_V1_0  # the only one CloudEvent accepts

# The Kafka binary mode's naming (the SDK's): attribute ``x`` is header ``ce_x``, except ``datacontenttype``,
# which is ``content-type``. Exported for the columnar decoder (reprocess/binding_arrow.py), which must agree.
KAFKA_HEADER_PREFIX = ce_kafka.CE_PREFIX
HTTP_HEADER_PREFIX = ce_http.CE_PREFIX  # ``ce-x`` in HTTP binary mode
KAFKA_CONTENT_TYPE_HEADER = CONTENT_TYPE_HEADER
DATACONTENTTYPE = DATACONTENTTYPE_ATTR
# The SDK's rule for extension names (checked inline in its v1 CloudEvent, not exported); "data" is reserved.
EXTENSION_NAME = r"^[a-z0-9]+$"
RESERVED_EXTENSION_NAMES = ("data",)


class CloudEvent(_SDKCloudEvent):
    """The SDK's v1.0 event, strict for a router: required attributes must be present.

    The SDK invents ``id`` and ``time`` when they are missing — right for a producer, wrong for an
    ingress, which must reject an event without an id (400) and must not add attributes in transit.
    """

    def __init__(self, attributes: dict[str, Any], data: Any = None) -> None:
        missing = [name for name in REQUIRED_ATTRIBUTES if not attributes.get(name)]
        if missing:
            raise CloudEventValidationError(
                {name: [MissingRequiredAttributeError(attribute_name=name)] for name in missing}
            )
        had_time = "time" in attributes
        super().__init__(attributes, data)
        if not had_time:
            self._attributes.pop("time", None)


class RawDataFormat(JSONFormat):
    """JSON event format that keeps binary-mode data as the exact bytes (the SDK would parse JSON bodies)."""

    def read_data(self, body: bytes, datacontenttype: str | None) -> bytes | None:
        return bytes(body) if body else None

    def write_data(self, data: Any, datacontenttype: str | None) -> bytes:
        if data is None:
            return b""
        if isinstance(data, bytes | bytearray | memoryview):
            return bytes(data)
        if isinstance(data, str) and not _is_json(datacontenttype):
            return data.encode()
        # Structured JSON events carry data as a JSON value (object, array, string, number...).
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    def write(self, event: BaseCloudEvent) -> bytes:
        attrs = dict(event.get_attributes())
        data = event.get_data()
        if isinstance(data, bytes | bytearray) and _is_json(attrs.get("datacontenttype")):
            # Bytes that are JSON go in "data" as JSON, not as data_base64, so readers see the value.
            try:
                data = json.loads(data)
            except ValueError:
                pass
        clone = CloudEvent(attrs, data) if not isinstance(data, bytes | bytearray) or data else event
        return super().write(clone)


_FORMAT = RawDataFormat()


def _is_json(content_type: str | None) -> bool:
    return content_type is None or bool(_JSON_TYPE.match(content_type))


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_structured(content_type: str | None) -> bool:
    return _media_type(content_type) == STRUCTURED_CONTENT_TYPE


def is_batch(content_type: str | None) -> bool:
    # Asked once per request: a substring test first, the full parse only for what could be a batch.
    return content_type is not None and "batch" in content_type.lower() and (
        _media_type(content_type) == BATCH_CONTENT_TYPE)


def _validation_details(exc: BaseCloudEventException) -> dict[str, list[str]]:
    if isinstance(exc, CloudEventValidationError):
        return {name: [str(e) for e in errs] for name, errs in exc.errors.items()}
    return {"event": [str(exc)]}


def _checked(build: Any, *args: Any) -> CloudEvent:
    try:
        event = build(*args)
    except BaseCloudEventException as exc:
        raise BindingError("invalid CloudEvent", _validation_details(exc)) from None
    except (ValueError, TypeError, UnicodeDecodeError, KeyError, AttributeError) as exc:
        # JSON syntax errors, bad `time` values, non-object JSON...: all the sender's to fix.
        raise BindingError(f"malformed CloudEvent: {exc}") from None
    if not isinstance(event, CloudEvent):
        raise BindingError("unsupported CloudEvents specversion (only 1.0 is accepted)")
    return event


def event_from_http(headers: Mapping[str, str], body: bytes) -> CloudEvent:
    """One event in binary or structured content mode (mode by the ``ce-*`` headers, as the spec says)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    content_type = lowered.get("content-type")
    if not any(k.startswith(HTTP_HEADER_PREFIX) for k in lowered):
        if not is_structured(content_type):
            raise BindingError(
                "not a CloudEvent: no ce-* headers (binary mode) and Content-Type is not "
                f"{STRUCTURED_CONTENT_TYPE} (structured mode)"
            )
        if body.lstrip()[:1] != b"{":
            raise BindingError("a structured CloudEvent must be a JSON object")
    elif "ce-time" in lowered:
        _check_time(lowered["ce-time"])
    message = ce_http.HTTPMessage(headers=lowered, body=body)
    return _checked(ce_http.from_http, message, _FORMAT, CloudEvent)


def _check_time(value: str) -> None:
    try:
        isoparse(value)
    except (ValueError, OverflowError):
        raise BindingError(
            "invalid CloudEvent", {"time": [f"{value!r} is not an RFC 3339 timestamp"]}
        ) from None


def events_from_http_batch(body: bytes) -> list[CloudEvent]:
    """Batched content mode: a JSON array of structured events. All valid, or a BindingError."""
    try:
        items = json.loads(body)
    except ValueError as exc:
        raise BindingError(f"malformed batch: {exc}") from None
    if not isinstance(items, list):
        raise BindingError("a CloudEvents batch must be a JSON array")
    events: list[CloudEvent] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BindingError(f"batch item {index} is not a JSON object")
        try:
            events.append(_checked(_FORMAT.read, CloudEvent, json.dumps(item)))
        except BindingError as exc:
            raise BindingError(f"batch item {index}: {exc}", exc.details) from None
    return events


def partition_key(event: BaseCloudEvent) -> bytes | None:
    """``partitionkey`` extension, else ``subject``, else no key (Kafka spreads such events)."""
    value = event.get_extension("partitionkey")
    if value is None:
        value = event.get_subject()
    if value is None or value == "":
        return None
    return value if isinstance(value, bytes) else str(value).encode()


def event_to_kafka(
    event: BaseCloudEvent,
    mode: ContentMode = ContentMode.BINARY,
    trace: Mapping[str, str] | None = None,
) -> KafkaRecord:
    """A Kafka record per the CloudEvents Kafka protocol binding; trace context as plain headers."""
    key = partition_key(event)
    if mode is ContentMode.STRUCTURED:
        message = ce_kafka.to_structured(event, _FORMAT, key_mapper=lambda _e: None)
    else:
        message = ce_kafka.to_binary(event, _FORMAT, key_mapper=lambda _e: None)
    headers = list(message.headers.items())
    if mode is ContentMode.BINARY and "content-type" not in message.headers:
        _implied_json(event, headers)
    if trace:
        headers.extend((name, trace[name].encode()) for name in TRACE_HEADERS if trace.get(name))
    return KafkaRecord(key=key, value=message.value, headers=headers)


def _header_dict(headers: Iterable[tuple[str, bytes | str | None]] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, value in headers or ():
        if value is None:
            continue
        out[name.lower()] = value.encode() if isinstance(value, str) else bytes(value)
    return out


def event_from_kafka(
    headers: Sequence[tuple[str, bytes | str | None]] | None,
    value: bytes | None,
) -> CloudEvent:
    """Decode a record written in binary (``ce_`` headers) or structured mode.

    The record key is not turned into a ``partitionkey`` attribute: the binary mode carries
    ``ce_partitionkey`` itself when the event had one, so attributes round-trip exactly.
    """
    hdrs = _header_dict(headers)
    content_type = hdrs.get(KAFKA_CONTENT_TYPE_HEADER, b"").decode(errors="replace")
    message = ce_kafka.KafkaMessage(headers=hdrs, key=None, value=value or b"")
    if f"{KAFKA_HEADER_PREFIX}specversion" in hdrs:
        return _checked(ce_kafka.from_binary, message, _FORMAT, CloudEvent)
    if is_structured(content_type) or (value or b"").lstrip()[:1] == b"{":
        return _checked(ce_kafka.from_structured, message, _FORMAT, CloudEvent)
    raise BindingError("record is not a CloudEvent: no ce_specversion header and no structured body")


def trace_from_kafka(headers: Sequence[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    hdrs = _header_dict(headers)
    return {name: hdrs[name].decode(errors="replace") for name in TRACE_HEADERS if name in hdrs}


def event_to_http(event: BaseCloudEvent, mode: ContentMode = ContentMode.BINARY) -> tuple[dict[str, str], bytes]:
    """Headers and body for an outgoing request (the dispatcher sends binary mode)."""
    if mode is ContentMode.STRUCTURED:
        message = ce_http.to_structured(event, _FORMAT)
    else:
        message = ce_http.to_binary(event, _FORMAT)
    headers = dict(message.headers)
    if mode is ContentMode.BINARY and "content-type" not in headers:
        implied: list[tuple[str, bytes]] = []
        _implied_json(event, implied)
        headers.update((k, v.decode()) for k, v in implied)
    return headers, message.body


def _implied_json(event: BaseCloudEvent, headers: list[tuple[str, bytes]]) -> None:
    """Structured JSON data without ``datacontenttype`` is JSON (spec); binary mode must say so."""
    data = event.get_data()
    if data is not None and not isinstance(data, bytes | bytearray):
        headers.append(("content-type", b"application/json"))


def with_extensions(event: BaseCloudEvent, **extensions: str | None) -> CloudEvent:
    """A copy with extensions set (``None`` removes one) — dead-letter and redrive use it."""
    attrs = dict(event.get_attributes())
    for name, value in extensions.items():
        if value is None:
            attrs.pop(name, None)
        else:
            attrs[name] = value
    return CloudEvent(attrs, event.get_data())


def error_data(body: bytes, limit: int = 1024) -> str:
    """``knativeerrordata``: the response body, truncated to ``limit`` bytes, base64."""
    return base64.b64encode(body[:limit]).decode()
