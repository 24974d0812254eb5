"""The one CloudEvents ⇄ HTTP ⇄ Kafka binding every role uses (receiver, dispatcher, broker, reprocess).

Built on the cloudevents SDK 2.x bindings (``cloudevents.core.bindings.http`` / ``.kafka``) and its v1.0 event.
Where the SDK would re-render what the sender wrote, this module keeps the sender's text instead (types are
validated, never re-rendered):

- ``time`` is parsed to check it (and for filters) but written out as the text that came in
  (:class:`Timestamp`): ``…56.789Z`` stays ``…56.789Z``, not the SDK's ``…56.789000Z``.
- Attribute values are written in binary mode by :func:`attribute_text` (a Boolean as ``true``, not Python's
  ``True``).
- Event data is the exact bytes received (``RawDataFormat``): a binary-mode body, or the bytes of a structured
  event's ``data`` member as written (a JSON value is not re-serialised). A structured event read from JSON is
  written back as the very document that came in when it goes out in structured mode again.
- Nothing is added in transit: no ``time``, no ``id``, no ``datacontenttype`` the producer did not set.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

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
    "KafkaRecord", "Timestamp", "attribute_text", "check_time",
    "event_from_http", "event_from_kafka", "event_to_http", "event_to_kafka",
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
    dataclass's ``__init__`` (``object.__setattr__`` per field) cost ~1 µs of it (profile of a receiver worker under
    bench/receiver.py's saturation load, 1 KB events).
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


# RFC 3339 date-time (section 5.6), what CloudEvents' Timestamp is; dateutil's isoparse alone also takes ISO 8601
# forms (basic format, no seconds, no zone) that a CloudEvents reader need not understand.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
# The SDK's HTTP header-value encoding (cloudevents.core.bindings.http): printable ASCII except space, '"' and '%'
# is sent as is, everything else percent-encoded.
HTTP_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ('"', "%"))


class Timestamp(datetime):
    """A ``time`` value: the parsed instant (for filters and comparisons) and the sender's text, which is what
    every binding writes (``isoformat()`` would re-render it: ``.789Z`` → ``.789000Z``)."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: Any, *args: Any, strict: bool = True, **kwargs: Any) -> Timestamp:
        """``strict``: RFC 3339 only (what an ingress accepts); else any ISO 8601 date-time with a zone that
        dateutil reads, as a record another producer wrote to Kafka may carry (delivered, its text unchanged)."""
        if args or kwargs or not isinstance(text, str):
            # datetime's own methods (astimezone, replace, +) build their result through the subclass with
            # datetime's arguments: the result is a new instant, a plain datetime without the sender's text.
            return datetime(text, *args, **kwargs)  # type: ignore[return-value]
        when = _parse_time(text, strict)
        obj = super().__new__(cls, when.year, when.month, when.day, when.hour, when.minute, when.second,
                              when.microsecond, when.tzinfo, fold=when.fold)
        obj.text = text
        return obj

    def __reduce_ex__(self, _protocol: Any) -> tuple[type[Timestamp], tuple[str]]:
        return (Timestamp, (self.text,))


def _parse_time(text: str, strict: bool = True) -> datetime:
    if strict and not _RFC3339.fullmatch(text):
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp")
    try:
        when = isoparse(text)
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp") from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return when


def check_time(text: str, strict: bool = True) -> str:
    """``text`` if it is a timestamp with a zone (``strict``: RFC 3339, what an ingress takes; else what
    :class:`Timestamp` reads from a Kafka record), else ValueError. The fast paths copy it as is."""
    _parse_time(text, strict)
    return text


def attribute_text(value: Any) -> str:
    """An attribute value's string form, as the binary modes carry it (the CloudEvents type system's canonical
    string, and for ``time`` the sender's own text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Timestamp):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        out = value.isoformat()
        return out[:-6] + "Z" if out.endswith("+00:00") else out
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    return str(value)


class CloudEvent(_SDKCloudEvent):
    """The SDK's v1.0 event, strict for a router: required attributes must be present.

    The SDK invents ``id`` and ``time`` when they are missing — right for a producer, wrong for an
    ingress, which must reject an event without an id (400) and must not add attributes in transit. A ``time``
    given as text becomes a :class:`Timestamp` (validated, its text kept).

    ``structured``: the JSON document this event was read from (structured mode), written out again as is in
    structured mode; any event built another way has None and is serialised from its attributes.
    """

    structured: bytes | None = None

    def __init__(self, attributes: dict[str, Any], data: Any = None) -> None:
        missing = [name for name in REQUIRED_ATTRIBUTES if not attributes.get(name)]
        if missing:
            raise CloudEventValidationError(
                {name: [MissingRequiredAttributeError(attribute_name=name)] for name in missing}
            )
        had_time = "time" in attributes
        if isinstance(attributes.get("time"), str):
            attributes = {**attributes, "time": Timestamp(attributes["time"])}
        super().__init__(attributes, data)
        if not had_time:
            self._attributes.pop("time", None)


def _with_time(text: str | None, strict: bool = True) -> Any:
    """The event factory for a binary-mode message: the SDK has parsed ``time``; the event keeps the text it was
    parsed from (``strict``: see :class:`Timestamp`)."""
    if text is None:
        return CloudEvent

    def build(attributes: dict[str, Any], data: Any = None) -> CloudEvent:
        return CloudEvent({**attributes, "time": Timestamp(text, strict=strict)}, data)
    return build


_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def _members(text: str) -> dict[str, tuple[Any, str]]:
    """A JSON object's members: name → (value, the value's JSON text as written). ValueError if not an object."""
    end = len(text)
    i = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[i:i + 1] != "{":
        raise ValueError("a structured CloudEvent must be a JSON object")
    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    out: dict[str, tuple[Any, str]] = {}
    if text[i:i + 1] == "}":
        i += 1
    else:
        while True:
            name, i = _DECODER.raw_decode(text, i)
            if not isinstance(name, str):
                raise ValueError("a JSON object member name must be a string")
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i:i + 1] != ":":
                raise ValueError(f"expected ':' at offset {i}")
            start = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            value, i = _DECODER.raw_decode(text, start)
            out[name] = (value, text[start:i])
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            sep = text[i:i + 1]
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            if sep == "}":
                break
            if sep != ",":
                raise ValueError(f"expected ',' or '}}' at offset {i}")
    if _WS.match(text, i).end() != end:  # type: ignore[union-attr]
        raise ValueError("extra data after the JSON object")
    return out


class RawDataFormat(JSONFormat):
    """The JSON event format, keeping what the sender wrote: data as the exact bytes (binary mode: the body;
    structured mode: the ``data`` member's JSON text, or a string's own text for a non-JSON ``datacontenttype``,
    or the ``data_base64`` bytes), ``time`` as its text, and the whole document for a structured round trip.

    ``strict``: ``time`` must be RFC 3339 (an ingress); else any timestamp :class:`Timestamp` reads (a record).
    """

    def __init__(self, strict: bool = True) -> None:
        super().__init__()
        self.strict = strict

    def read_data(self, body: bytes, datacontenttype: str | None) -> bytes | None:
        return bytes(body) if body else None

    def write_data(self, data: Any, datacontenttype: str | None) -> bytes:
        if data is None:
            return b""
        if isinstance(data, bytes | bytearray | memoryview):
            return bytes(data)
        if isinstance(data, str) and not _is_json(datacontenttype):
            return data.encode()
        # Data built in code (a reply, a test) as a JSON value.
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    def read(self, event_factory: Any, data: str | bytes) -> BaseCloudEvent:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        members = _members(text)
        # null is how JSON says "absent" (an optional attribute, or no data).
        attributes = {k: v for k, (v, _raw) in members.items() if k not in ("data", "data_base64") and v is not None}
        for name, value in attributes.items():
            if not isinstance(value, str | bool | int):
                raise ValueError(f"attribute {name!r}: {type(value).__name__} is not a CloudEvents type")
        if isinstance(attributes.get("time"), str):
            attributes["time"] = Timestamp(attributes["time"], strict=self.strict)
        body: bytes | None = None
        value, raw = members.get("data", (None, ""))
        if value is not None:
            if isinstance(value, str) and not _is_json(attributes.get("datacontenttype")):
                body = value.encode()
            else:
                body = raw.encode()
        elif (b64 := members.get("data_base64", (None, ""))[0]) is not None:
            if not isinstance(b64, str):
                raise ValueError("data_base64 must be a string")
            try:
                body = base64.b64decode(b64, validate=True)
            except binascii.Error as exc:
                raise ValueError(f"data_base64 is not base64: {exc}") from None
        event = CloudEvent(attributes, body)
        event.structured = data.encode() if isinstance(data, str) else bytes(data)
        return event

    def write(self, event: BaseCloudEvent) -> bytes:
        raw = getattr(event, "structured", None)
        if isinstance(raw, bytes):
            return raw
        parts = [f"{json.dumps(name)}:{_json_value(value)}"
                 for name, value in event.get_attributes().items() if value is not None]
        data = event.get_data()
        if data is not None:
            parts.append(_json_data(data, event.get_attributes().get("datacontenttype")))
        return ("{" + ",".join(parts) + "}").encode()


def _json_value(value: Any) -> str:
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return json.dumps(attribute_text(value), ensure_ascii=False)


def _json_data(data: Any, datacontenttype: str | None) -> str:
    """The ``data`` (or ``data_base64``) member for event data, so that reading it back gives the same bytes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        return '"data":' + json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    try:
        text = bytes(data).decode("utf-8")
        if _is_json(datacontenttype):
            # Only a JSON value can go in as it is, and only without surrounding blanks (a reader drops those).
            if text != text.strip(" \t\n\r"):
                raise ValueError("blanks around the JSON value")
            json.loads(text)
            return '"data":' + text
        return '"data":' + json.dumps(text, ensure_ascii=False)
    except ValueError:
        return '"data_base64":"' + base64.b64encode(data).decode() + '"'


_FORMAT = RawDataFormat()
_RECORD_FORMAT = RawDataFormat(strict=False)  # what a Kafka record is read with


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
        message = ce_http.HTTPMessage(headers=lowered, body=body)
        return _checked(ce_http.from_structured, message, _FORMAT, CloudEvent)
    time = lowered.get("ce-time")
    if time is not None:
        time = unquote(time)
        _check_time(time)
    message = ce_http.HTTPMessage(headers=lowered, body=body)
    return _checked(ce_http.from_binary, message, _FORMAT, _with_time(time))


def _check_time(value: str) -> None:
    try:
        check_time(value)
    except ValueError as exc:
        raise BindingError("invalid CloudEvent", {"time": [str(exc)]}) from None


def events_from_http_batch(body: bytes) -> list[CloudEvent]:
    """Batched content mode: a JSON array of structured events. All valid, or a BindingError."""
    try:
        text = body.decode("utf-8")  # JSON on the wire is UTF-8 (RFC 8259); each item keeps its own text
        items = json.loads(text)
    except ValueError as exc:
        raise BindingError(f"malformed batch: {exc}") from None
    if not isinstance(items, list):
        raise BindingError("a CloudEvents batch must be a JSON array")
    texts = _array_texts(text)
    events: list[CloudEvent] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BindingError(f"batch item {index} is not a JSON object")
        try:
            events.append(_checked(_FORMAT.read, CloudEvent, texts[index]))
        except BindingError as exc:
            raise BindingError(f"batch item {index}: {exc}", exc.details) from None
    return events


def _array_texts(text: str) -> list[str]:
    """Each item of a JSON array as written (each batched event keeps its own text)."""
    out: list[str] = []
    i = _WS.match(text, text.index("[") + 1).end()  # type: ignore[union-attr]
    while text[i:i + 1] not in ("]", ""):
        _value, end = _DECODER.raw_decode(text, i)
        out.append(text[i:end])
        i = _WS.match(text, end).end()  # type: ignore[union-attr]
        if text[i:i + 1] == ",":
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    return out


def partition_key(event: BaseCloudEvent, *, subject_key: bool = True) -> bytes | None:
    """``partitionkey`` extension, else (``subject_key``) ``subject``, else no key (Kafka spreads such events)."""
    value = event.get_extension("partitionkey")
    if value is None and subject_key:
        value = event.get_subject()
    if value is None or value == "":
        return None
    return value if isinstance(value, bytes) else attribute_text(value).encode()


def event_to_kafka(
    event: BaseCloudEvent,
    mode: ContentMode = ContentMode.BINARY,
    trace: Mapping[str, str] | None = None,
    *,
    subject_key: bool = True,
) -> KafkaRecord:
    """A Kafka record per the CloudEvents Kafka protocol binding; trace context as plain headers. The key:
    ``partition_key``."""
    key = partition_key(event, subject_key=subject_key)
    if mode is ContentMode.STRUCTURED:
        message = ce_kafka.to_structured(event, _FORMAT, key_mapper=lambda _e: None)
        headers = list(message.headers.items())
        value = message.value
    else:
        # The SDK's to_binary, with each value's text as the sender wrote it (attribute_text).
        headers = [(KAFKA_CONTENT_TYPE_HEADER if name == DATACONTENTTYPE else KAFKA_HEADER_PREFIX + name,
                    attribute_text(v).encode()) for name, v in event.get_attributes().items() if v is not None]
        value = _FORMAT.write_data(event.get_data(), event.get_attributes().get(DATACONTENTTYPE))
    if trace:
        headers.extend((name, trace[name].encode()) for name in TRACE_HEADERS if trace.get(name))
    return KafkaRecord(key=key, value=value, headers=headers)


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
        time = hdrs.get(f"{KAFKA_HEADER_PREFIX}time")
        return _checked(ce_kafka.from_binary, message, _RECORD_FORMAT,
                        _with_time(None if time is None else time.decode(errors="replace"), strict=False))
    if is_structured(content_type) or (value or b"").lstrip()[:1] == b"{":
        return _checked(ce_kafka.from_structured, message, _RECORD_FORMAT, CloudEvent)
    raise BindingError("record is not a CloudEvent: no ce_specversion header and no structured body")


def trace_from_kafka(headers: Sequence[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    hdrs = _header_dict(headers)
    return {name: hdrs[name].decode(errors="replace") for name in TRACE_HEADERS if name in hdrs}


def event_to_http(event: BaseCloudEvent, mode: ContentMode = ContentMode.BINARY) -> tuple[dict[str, str], bytes]:
    """Headers and body for an outgoing request, in the subscriber's content mode (binary by default)."""
    if mode is ContentMode.STRUCTURED:
        message = ce_http.to_structured(event, _FORMAT)
        return dict(message.headers), message.body
    # The SDK's to_binary, with each value's text as the sender wrote it (attribute_text), percent-encoded as
    # the HTTP binding says; Content-Type only if the event has a datacontenttype.
    headers: dict[str, str] = {}
    for name, value in event.get_attributes().items():
        if value is None:
            continue
        if name == DATACONTENTTYPE:
            headers[CONTENT_TYPE_HEADER] = str(value)
        else:
            headers[HTTP_HEADER_PREFIX + name] = quote(attribute_text(value), safe=HTTP_SAFE)
    return headers, _FORMAT.write_data(event.get_data(), event.get_attributes().get(DATACONTENTTYPE))


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
