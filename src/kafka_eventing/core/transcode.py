"""The two hand-tuned fast paths between HTTP binary mode and Kafka binary mode, with the SDK binding
(``core.binding``) as their reference: each must give exactly what the SDK path gives (same headers, same body,
same errors), and hands any input it is not certain about to the SDK.

- ``kafka_to_http``: the dispatcher's per-event path, a Kafka record straight to an HTTP request.
- ``raw_http_to_kafka``: the receiver's per-request path, an HTTP request straight to a Kafka record, from the
  header bytes the ASGI server read.

They exist because building an SDK event per event was most of the CPU per event in the receiver's and the
dispatcher's profiles (docs/receiver.md, docs/dispatcher.md); tests/unit/core/test_transcode_*.py check them against
the SDK for any input hypothesis finds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from cloudevents.core.bindings.common import CONTENT_TYPE_HEADER

from kafka_eventing.core.binding import (
    EXTENSION_NAME,
    HTTP_HEADER_PREFIX,
    HTTP_SAFE,
    KAFKA_HEADER_PREFIX,
    RESERVED_EXTENSION_NAMES,
    SPECVERSION,
    TRACE_HEADERS,
    ContentMode,
    KafkaRecord,
    check_time,
    event_from_http,
    event_from_kafka,
    event_to_http,
    event_to_kafka,
    trace_from_kafka,
)

# -- the dispatcher's per-event path: Kafka binary mode straight to HTTP binary mode --------------------------
_HTTP_SAFE = HTTP_SAFE
_HTTP_SAFE_SET = frozenset(_HTTP_SAFE)
_V1_ATTRIBUTES = frozenset(("id", "source", "type", "specversion", "dataschema", "subject", "time"))
_NON_EMPTY = frozenset(("id", "source", "type", "dataschema", "subject"))
_EXTENSION = re.compile(EXTENSION_NAME)


# What a header is to the fast paths (kafka_to_http, raw_http_to_kafka), by its lower-case name.
_CONTENT_TYPE, _TRACE, _ATTR, _INVALID, _OTHER = "content-type", "trace", "attr", "invalid", "other"
# Each path caches its routes by the name as it arrives (the work is per name, not per event); bounded so that
# random names cannot grow the caches.
_ROUTES_MAX = 256


def _header_kind(lname: str, prefix: str) -> tuple[str, str]:
    """(kind, attribute) of a lower-case header name; ``prefix`` is the binding's (``ce_`` Kafka, ``ce-`` HTTP)."""
    if lname == CONTENT_TYPE_HEADER:
        return _CONTENT_TYPE, ""
    if lname in TRACE_HEADERS:
        return _TRACE, ""
    if lname.startswith(prefix):
        attr = lname[len(prefix):]
        valid = attr in _V1_ATTRIBUTES or (attr != RESERVED_EXTENSION_NAMES[0] and _EXTENSION.match(attr))
        return (_ATTR if valid else _INVALID), attr
    return _OTHER, ""


_KAFKA_ROUTES: dict[str, tuple[str, str, str]] = {}


def _kafka_route(name: str) -> tuple[str, str, str]:
    """(kind, HTTP header name, attribute) for a Kafka header name."""
    lname = name.lower()
    kind, attr = _header_kind(lname, KAFKA_HEADER_PREFIX)
    route = (kind, HTTP_HEADER_PREFIX + attr if attr else lname, attr)
    if len(_KAFKA_ROUTES) < _ROUTES_MAX:
        _KAFKA_ROUTES[name] = route
    return route


def kafka_to_http(
    headers: Sequence[tuple[str, bytes | str | None]] | None,
    value: bytes | None,
    *,
    trace: bool = False,
) -> tuple[dict[str, str], bytes]:
    """``event_to_http(event_from_kafka(headers, value))`` without building the event, for the dispatcher.

    With ``trace``, the record's ``traceparent``/``tracestate`` come along as HTTP headers. Only a binary-mode
    record that the SDK would accept unchanged is mapped here (``ce_x`` → ``ce-x``, the body as is; a repeated
    header: the last one wins, as in the SDK); anything else — structured mode, a missing or empty attribute, an
    odd extension name, bytes that are not UTF-8 — takes the SDK path, so its errors and edge cases stay the
    SDK's own. Checked against the SDK path in tests/unit/core/test_transcode_kafka_to_http.py.
    """
    out: dict[str, str] = {}
    specversion = None
    routes = _KAFKA_ROUTES
    try:
        for name, raw in headers or ():
            if raw is None:
                continue
            # Every header is decoded, as the SDK does: one that is not UTF-8 fails the record.
            text = raw if isinstance(raw, str) else raw.decode()
            kind, http_name, attr = routes[name] if name in routes else _kafka_route(name)
            if kind == _ATTR:
                if attr == "time":
                    check_time(text, strict=False)  # as event_from_kafka reads it, then copied as it came
                elif not text and attr in _NON_EMPTY:
                    raise ValueError("empty attribute")
                elif attr == "specversion":
                    specversion = text
                elif attr == "datacontenttype":
                    raise ValueError("ce_datacontenttype header")
                out[http_name] = text if _HTTP_SAFE_SET.issuperset(text) else quote(text, safe=_HTTP_SAFE)
            elif kind == _CONTENT_TYPE:
                if not text:
                    raise ValueError("empty datacontenttype")
                out[http_name] = text  # the SDK does not percent-encode Content-Type
            elif kind == _TRACE:
                if trace:
                    out[http_name] = text
            elif kind == _INVALID:
                raise ValueError("invalid extension name")
    except Exception:  # whatever it is, the SDK path decides (and raises its BindingError)
        return _kafka_to_http_sdk(headers, value, trace)
    if specversion != SPECVERSION or "ce-id" not in out or "ce-source" not in out or "ce-type" not in out:
        return _kafka_to_http_sdk(headers, value, trace)
    return out, bytes(value) if value else b""


def _kafka_to_http_sdk(headers: Sequence[tuple[str, bytes | str | None]] | None, value: bytes | None,
                       trace: bool) -> tuple[dict[str, str], bytes]:
    out, body = event_to_http(event_from_kafka(headers, value))
    if trace:
        out.update(trace_from_kafka(headers))
    return out, body


_ROUTES: dict[bytes, tuple[str, str, int] | None] = {}
_SPECVERSION_BYTES = SPECVERSION.encode()
# What the fast path does with a header beyond copying it, as a small int in its route: most headers (id, source,
# type, Content-Type) are 0, so the loop tests one int instead of comparing the name against each special case.
_PLAIN, _S_TRACE, _S_INVALID, _S_TIME, _S_SPECVERSION, _S_PARTITIONKEY, _S_SUBJECT = range(7)
_SPECIAL = {"time": _S_TIME, "specversion": _S_SPECVERSION, "partitionkey": _S_PARTITIONKEY, "subject": _S_SUBJECT}
_MUST_NOT_BE_EMPTY = _NON_EMPTY | {CONTENT_TYPE_HEADER}
# `int in bytes` is a plain byte scan; `b"%" in value` goes through the buffer protocol (~140 vs ~15 ns).
_PERCENT = ord("%")
_REQUIRED = frozenset({"id", "source", "type"})
_UNSEEN: Any = object()  # a header name not in _ROUTES yet (None there means "not ours to copy")


def _route(name: bytes) -> tuple[str, str, int] | None:
    """(attribute or header name, Kafka header name, special case) for a request header name as the server read
    it; None: not ours to copy (Host, Content-Length, ...)."""
    lname = name.decode("latin-1").lower()
    kind, attr = _header_kind(lname, HTTP_HEADER_PREFIX)
    route: tuple[str, str, int] | None
    if kind == _OTHER:
        route = None
    elif kind == _TRACE:
        route = (lname, lname, _S_TRACE)
    elif kind == _CONTENT_TYPE:
        route = (lname, lname, _PLAIN)
    else:
        route = (attr, KAFKA_HEADER_PREFIX + attr, _S_INVALID if kind == _INVALID else _SPECIAL.get(attr, _PLAIN))
    if len(_ROUTES) < _ROUTES_MAX:
        _ROUTES[name] = route
    return route


def text_headers(latin1: Mapping[str, str]) -> dict[str, str]:
    """Request headers as the SDK path reads them, from the framework's (values read as Latin-1, HTTP's own
    charset): a value that is UTF-8 is read as UTF-8 — a sender that wrote a non-ASCII attribute without
    percent-encoding it meant that text (``café``, not ``cafÃ©``)."""
    out: dict[str, str] = {}
    for name, value in latin1.items():
        text = value
        if not value.isascii():
            try:
                text = value.encode("latin-1").decode("utf-8")
            except UnicodeError:
                pass  # not UTF-8: Latin-1 it stays
        out[name] = text
    return out


def _trace_from_http(headers: Mapping[str, str]) -> dict[str, str]:
    return {lname: value for name, value in headers.items() if (lname := name.lower()) in TRACE_HEADERS and value}


def raw_http_to_kafka(
    raw: Iterable[tuple[bytes, bytes]],
    body: bytes,
    mode: ContentMode = ContentMode.BINARY,
    trace: Mapping[str, str] | None = None,
    *,
    headers: Callable[[], Mapping[str, str]],
    subject_key: bool = True,
) -> KafkaRecord:
    """The receiver's fast path, from the header pairs as the server read them (ASGI ``scope["headers"]``).

    ``headers`` gives the same headers as a str mapping (the framework's, with repeated names joined); it is only
    asked for when the SDK decides. ``trace`` defaults to the request's own ``traceparent``/``tracestate``.

    Only a binary-mode request that the SDK would accept unchanged, going to a binary-mode channel, is mapped here
    (``ce-x`` → ``ce_x`` in header order, value bytes and body as they came); anything else — structured or
    batched mode, a percent-encoded or non-ASCII value, a missing or empty attribute, an odd extension name, a
    repeated attribute — takes the SDK path, so its errors (the 400 bodies) and edge cases stay the SDK's own.
    Checked against the SDK path in tests/unit/core/test_transcode_http_to_kafka.py.
    """
    if mode is not ContentMode.BINARY:
        return _http_to_kafka_sdk(headers(), body, mode, trace, subject_key)
    out: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    found: dict[str, bytes] = {}
    specversion = partitionkey = subject = None
    routes = _ROUTES
    try:
        # Every raise below means "not certain": the SDK path decides, so the checks' order does not matter.
        for name, value in raw:
            route = routes.get(name, _UNSEEN)
            if route is _UNSEEN:
                route = _route(name)
            if route is None:
                continue  # not an attribute (Host, Content-Length, ...)
            attr, header, special = route
            if not value.isascii():
                raise ValueError("non-ASCII value")  # the SDK writes the decoded text as UTF-8
            if special == _S_TRACE:
                if attr in found:
                    raise ValueError("repeated trace header")  # the framework joins them; the SDK path does too
                found[attr] = value
                continue
            if attr in seen or _PERCENT in value:
                raise ValueError("repeated attribute or percent-encoded value")
            seen.add(attr)
            if special:
                if special == _S_INVALID:
                    raise ValueError("invalid extension name")
                if special == _S_TIME:
                    check_time(value.decode())  # checked, then copied as it came
                    out.append((header, value))
                    continue
                if not value and attr in _MUST_NOT_BE_EMPTY:
                    raise ValueError("empty attribute")
                if special == _S_SPECVERSION:
                    specversion = value
                elif special == _S_PARTITIONKEY:
                    partitionkey = value
                else:
                    subject = value
            elif not value and attr in _MUST_NOT_BE_EMPTY:
                raise ValueError("empty attribute")
            out.append((header, value))
    except Exception:  # whatever it is, the SDK path decides (and raises its BindingError)
        return _http_to_kafka_sdk(headers(), body, mode, trace, subject_key)
    if specversion != _SPECVERSION_BYTES or not seen >= _REQUIRED or "datacontenttype" in seen:
        return _http_to_kafka_sdk(headers(), body, mode, trace, subject_key)
    if trace is None:
        if found:  # most requests carry no trace context: no generator to build for them
            out.extend((name, found[name]) for name in TRACE_HEADERS if found.get(name))
    elif trace:
        out.extend((name, trace[name].encode()) for name in TRACE_HEADERS if trace.get(name))
    # partition_key(): partitionkey, then (subject_key) subject
    key = partitionkey if partitionkey is not None else subject if subject_key else None
    return KafkaRecord(key or None, bytes(body) if body else b"", out)  # positional: the faster __new__


def _http_to_kafka_sdk(headers: Mapping[str, str], body: bytes, mode: ContentMode,
                       trace: Mapping[str, str] | None, subject_key: bool = True) -> KafkaRecord:
    event = event_from_http(headers, body)
    return event_to_kafka(event, mode, trace=_trace_from_http(headers) if trace is None else trace,
                          subject_key=subject_key)
