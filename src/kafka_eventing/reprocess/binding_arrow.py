"""The Kafka binary-mode binding of core/binding.py, over a whole Arrow batch at once (for Spark's ``mapInArrow``).

``event_from_kafka`` decodes one record through the cloudevents SDK: tens of µs a record. Binary mode (attributes
in ``ce_`` headers, data as the value) is the common case and needs no per-record logic, so here it runs as Arrow
compute kernels on the batch: flatten the headers, match ``ce_<attr>`` / ``content-type``, scatter the values
back to one column per attribute, the other ``ce_*`` headers into an extensions map, ``time`` to a timestamp.

This path only *vouches* for records it is sure the SDK would accept and decode the same way: ``decoded`` marks
them. Every other record — structured mode, a missing or empty required attribute, another specversion, a
``time`` outside the strict RFC 3339 form, an odd extension name, a duplicate or non-ASCII header name, a header
value that is not UTF-8 — must go through ``event_from_kafka``, which stays the single authority on validity.
The naming rules come from core/binding.py; tests/unit/reprocess/test_binding_arrow.py checks both paths agree
row by row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafka_eventing.core.binding import (
    DATACONTENTTYPE,
    EXTENSION_NAME,
    KAFKA_CONTENT_TYPE_HEADER,
    KAFKA_HEADER_PREFIX,
    OPTIONAL_ATTRIBUTES,
    REQUIRED_ATTRIBUTES,
    RESERVED_EXTENSION_NAMES,
    SPECVERSION,
)

__all__ = ["ATTRIBUTES", "TIME_TYPE", "BinaryColumns", "decode_binary"]

#: Every context attribute with its own column (required, then optional); the rest are extensions.
ATTRIBUTES: tuple[str, ...] = REQUIRED_ATTRIBUTES + OPTIONAL_ATTRIBUTES
TIME_TYPE = pa.timestamp("us", tz="UTC")
_HEADER_ATTRIBUTES = tuple(name for name in ATTRIBUTES if name != DATACONTENTTYPE)
_OPTIONAL_STRINGS = tuple(name for name in OPTIONAL_ATTRIBUTES if name != "time")  # must not be empty if present
# The RFC 3339 form the SDK writes (and nearly every producer). dateutil's isoparse accepts far more (basic
# format, a comma, hour 24, no zone — which CloudEvent then rejects); all of that falls back. Years 1000-8999
# only, so that converting to UTC can never leave Python's datetime range.
_RFC3339 = (
    r"^[1-8][0-9]{3}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)


@dataclass(frozen=True)
class BinaryColumns:
    """One value per input row. Only rows where ``decoded`` is true hold an event; the rest are all null."""

    decoded: pa.BooleanArray
    attributes: dict[str, pa.Array]  # ATTRIBUTES → string arrays, "time" → TIME_TYPE (UTC)
    time_text: pa.StringArray  # ``time`` as the sender wrote it, which is what a replay sends
    extensions: pa.MapArray  # map<string, string>, in header order
    data: pa.BinaryArray  # the record value; null when absent or empty (as RawDataFormat reads it)


def _rows(entries: np.ndarray, parents: np.ndarray, n: int) -> np.ndarray:
    """A boolean per row: true for the rows that hold one of the ``entries`` (indices into the flat headers)."""
    flags = np.zeros(n, dtype=bool)
    flags[parents[entries]] = True
    return flags


def _utf8(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Header values as strings, and which are not valid UTF-8 (the SDK decodes every header value strictly)."""
    try:
        return values.cast(pa.string()), np.zeros(len(values), dtype=bool)
    except pa.ArrowInvalid:
        pass
    # Rare: find the offenders one by one, null them, cast the rest.
    bad = np.zeros(len(values), dtype=bool)
    for i, raw in enumerate(values.to_pylist()):
        if raw is not None:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                bad[i] = True
    return pc.if_else(pa.array(bad), pa.nulls(len(values), values.type), values).cast(pa.string()), bad


def _parse_time(text: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """``time`` strings → UTC timestamps, and which rows hold a ``time`` this path does not vouch for."""
    strict = pc.fill_null(pc.match_substring_regex(text, _RFC3339), False)
    present = pc.is_valid(text).to_numpy(zero_copy_only=False)
    candidates = pc.if_else(strict, text, pa.nulls(len(text), pa.string()))
    try:
        return candidates.cast(TIME_TYPE), present & ~strict.to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        pass
    # A well-formed but impossible date (Feb 30...): find them, leave them to the SDK.
    ok = strict.to_numpy(zero_copy_only=False).copy()
    for i, value in enumerate(candidates.to_pylist()):
        if value is not None:
            try:
                datetime.fromisoformat(value)
            except ValueError:
                ok[i] = False
    candidates = pc.if_else(pa.array(ok), text, pa.nulls(len(text), pa.string()))
    try:
        return candidates.cast(TIME_TYPE), present & ~ok
    except pa.ArrowInvalid:
        return pa.nulls(len(text), TIME_TYPE), present


# What a header name means, decided once per distinct name in a batch (names repeat on every record).
_OTHER, _EXTENSION, _UNSURE = -1, -2, -3  # else: index into _HEADER_ATTRIBUTES + (DATACONTENTTYPE,)
_SLOTS = (*_HEADER_ATTRIBUTES, DATACONTENTTYPE)


def _role(name: str | None) -> tuple[int, str | None]:
    """(role, extension name) of one header name, as binding.py + the SDK would read it."""
    if name is None or not name.isascii():
        # binding.py lowers names with str.lower, which maps a few non-ASCII letters to ASCII ones (K → k).
        return _UNSURE, None
    low = name.lower()
    if low == KAFKA_CONTENT_TYPE_HEADER:
        return _SLOTS.index(DATACONTENTTYPE), None
    if not low.startswith(KAFKA_HEADER_PREFIX):
        return _OTHER, None
    attr = low[len(KAFKA_HEADER_PREFIX):]
    if attr in _HEADER_ATTRIBUTES:
        return _SLOTS.index(attr), None
    if attr == DATACONTENTTYPE:  # would compete with content-type for the attribute, by header order
        return _UNSURE, None
    if re.match(EXTENSION_NAME, attr) and attr not in RESERVED_EXTENSION_NAMES:  # re.match: as the SDK checks
        return _EXTENSION, attr
    return _UNSURE, None


def decode_binary(headers: pa.Array | pa.ChunkedArray, values: pa.Array | pa.ChunkedArray) -> BinaryColumns:
    """Decode the binary-mode records of a batch: ``headers`` list<struct<key: string, value: binary>> (Spark's
    Kafka source layout) and ``values`` binary, one entry per record."""
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    n = len(headers)
    flat = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    texts, unsure = _utf8(pc.struct_field(flat, [1]))
    unsure |= pc.is_null(texts).to_numpy(zero_copy_only=False)  # binding.py skips a null value: the SDK's call

    names = pc.dictionary_encode(pc.struct_field(flat, [0]))
    distinct = names.dictionary.to_pylist()
    roles = [_role(name) for name in distinct]
    lowered = {name.lower() for name in distinct if name is not None}
    low_id = {low: i for i, low in enumerate(sorted(lowered))}
    # Per flat header: its role and its lowered name's id (one extra slot for a null name).
    role = np.array([r for r, _ in roles] + [_UNSURE], dtype=np.int64)[
        pc.fill_null(names.indices, len(distinct)).to_numpy(zero_copy_only=False)]
    name_id = np.array([low_id.get((x or "").lower(), -1) for x in distinct] + [-1], dtype=np.int64)[
        pc.fill_null(names.indices, len(distinct)).to_numpy(zero_copy_only=False)]
    unsure |= role == _UNSURE
    # A repeated name (in any case) is last-wins in binding.py's header dict; rare enough to leave to it.
    relevant = np.flatnonzero(role != _OTHER)
    pair = np.sort(parents[relevant].astype(np.int64) * max(len(low_id), 1) + name_id[relevant], kind="stable")
    repeated = pair[1:][pair[1:] == pair[:-1]] // max(len(low_id), 1)
    bad = np.zeros(n, dtype=bool)
    bad[repeated] = True
    bad |= _rows(np.flatnonzero(unsure), parents, n)

    attributes: dict[str, pa.Array] = {}
    for slot, attr in enumerate(_SLOTS):
        hit = np.flatnonzero(role == slot)
        where = np.full(n, -1, dtype=np.int64)
        where[parents[hit]] = hit
        attributes[attr] = texts.take(pa.array(where, mask=where < 0))

    ok = ~bad
    ok &= pc.fill_null(pc.equal(attributes["specversion"], SPECVERSION), False).to_numpy(zero_copy_only=False)
    for attr in REQUIRED_ATTRIBUTES:  # present and not empty
        ok &= pc.fill_null(pc.greater(pc.binary_length(attributes[attr]), 0), False).to_numpy(zero_copy_only=False)
    for attr in _OPTIONAL_STRINGS:  # absent, or not empty
        ok &= pc.fill_null(pc.greater(pc.binary_length(attributes[attr]), 0), True).to_numpy(zero_copy_only=False)
    sent_time = attributes["time"]
    attributes["time"], unsure_time = _parse_time(sent_time)
    ok &= ~unsure_time

    # Extensions: the other ce_ headers, named by what follows the prefix, in header order.
    ext = np.flatnonzero(role == _EXTENSION)
    ext_names = pa.array([e or "" for _, e in roles], pa.string()).take(
        pa.array(names.indices.to_numpy(zero_copy_only=False)[ext]))
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(parents[ext], minlength=n), out=offsets[1:])
    decoded = pa.array(ok)
    extensions = pa.MapArray.from_arrays(pa.array(offsets), ext_names, texts.take(pa.array(ext)), mask=pa.array(~ok))
    none = pa.nulls(n, pa.string())
    for attr in ATTRIBUTES:
        if attr != "time":
            attributes[attr] = pc.if_else(decoded, attributes[attr], none)
    attributes["time"] = pc.if_else(decoded, attributes["time"], pa.nulls(n, TIME_TYPE))
    # RawDataFormat reads an empty value as no data. The value buffer (most of a batch's bytes) is copied only
    # when some row has to become null.
    values = values.cast(pa.binary())
    keep = ok & pc.fill_null(pc.greater(pc.binary_length(values), 0), False).to_numpy(zero_copy_only=False)
    data = values if keep.all() else pc.if_else(pa.array(keep), values, pa.nulls(n, pa.binary()))
    return BinaryColumns(decoded=decoded, attributes=attributes, time_text=pc.if_else(decoded, sent_time, none),
                         extensions=extensions, data=data)
