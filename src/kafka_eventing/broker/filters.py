"""Trigger filters: ``spec.filter.attributes`` and ``spec.filters[]`` compiled into matchers.

A Trigger's filter is compiled once, when the Trigger is seen or changes (``TriggerFilters`` keys compiled
matchers by the filter spec itself), and the compiled tree is what runs per event: no spec walking, no parsing,
no dict building on the hot path.

Semantics follow Knative Eventing's filters:

- ``filter.attributes``: every listed attribute must be present and equal; an empty value means "present with a
  non-empty value". The standard context attributes always count as present (an unset optional one is ``""``).
- ``filters[]``: all entries must match. Each entry sets exactly one dialect: ``exact``/``prefix``/``suffix``
  (every listed attribute present and its string form equal / starting / ending with the value; values must not
  be empty), ``all``/``any`` (nested lists, at least one entry), ``not`` (one nested entry), ``cesql`` (a
  CloudEvents SQL expression, true only when it evaluates to true without errors).
- When ``filters`` is non-empty it wins over ``filter``; no filter at all matches every event.

Stricter than upstream, so a mistake is a status condition instead of a silently ignored filter: an entry that
sets no dialect, an unknown dialect, or an empty ``all``/``any`` is an error. Errors carry a ``reason`` and a
message naming the field path (``spec.filters[1].any[0].prefix``) for the Trigger's status.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_eventing.cesql import CesqlParseError, Expression, compile_expression

Event = Mapping[str, object]

#: Attribute names Knative accepts: lowercase alphanumeric starting with a letter.
ATTRIBUTE_NAME = re.compile(r"^[a-z][a-z0-9]*$")
DIALECTS = ("exact", "prefix", "suffix", "all", "any", "not", "cesql")
#: Context attributes that exist on every event, unset optional ones reading as "" (upstream's LookupAttribute).
STANDARD_ATTRIBUTES = frozenset({"specversion", "type", "source", "subject", "id", "time", "dataschema",
                                 "schemaurl", "datacontenttype", "datamediatype", "datacontentencoding"})

REASON_INVALID = "InvalidFilter"
REASON_UNKNOWN_DIALECT = "UnknownFilterDialect"
REASON_MULTIPLE_DIALECTS = "MultipleFilterDialects"
REASON_CESQL = "InvalidCESQLExpression"


class FilterError(ValueError):
    """A filter that cannot be compiled. ``reason`` is a condition reason; ``str()`` is the condition message."""

    def __init__(self, reason: str, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.reason = reason
        self.path = path


class Filter(Protocol):
    def matches(self, event: Event) -> bool: ...


def lookup(event: Event, name: str) -> str | None:
    """The attribute's string form (CloudEvents canonical: ``true``/``false``, decimal ints), None when absent."""
    value = event.get(name)
    if value is None:
        if name == "datamediatype":
            content_type = event.get("datacontenttype")
            return "" if content_type is None else str(content_type).split(";", 1)[0].strip()
        if name == "schemaurl":
            return lookup(event, "dataschema")
        return "" if name in STANDARD_ATTRIBUTES else None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- compiled matchers -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MatchAll:
    def matches(self, event: Event) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class Attributes:
    """``filter.attributes``: every attribute equal; ``""`` = present and non-empty."""

    pairs: tuple[tuple[str, str], ...]

    def matches(self, event: Event) -> bool:
        for name, want in self.pairs:
            got = lookup(event, name)
            if not got if want == "" else got != want:
                return False
        return True


@dataclass(frozen=True, slots=True)
class StringTest:
    """``exact``/``prefix``/``suffix``: every attribute present and its string form passing ``test``."""

    dialect: str
    pairs: tuple[tuple[str, str], ...]
    test: Callable[[str, str], bool]

    def matches(self, event: Event) -> bool:
        for name, want in self.pairs:
            got = lookup(event, name)
            if got is None or not self.test(got, want):
                return False
        return True


@dataclass(frozen=True, slots=True)
class AllOf:
    parts: tuple[Filter, ...]

    def matches(self, event: Event) -> bool:
        return all(part.matches(event) for part in self.parts)


@dataclass(frozen=True, slots=True)
class AnyOf:
    parts: tuple[Filter, ...]

    def matches(self, event: Event) -> bool:
        return any(part.matches(event) for part in self.parts)


@dataclass(frozen=True, slots=True)
class Not:
    part: Filter

    def matches(self, event: Event) -> bool:
        return not self.part.matches(event)


@dataclass(frozen=True, slots=True)
class Cesql:
    text: str
    expression: Expression

    def matches(self, event: Event) -> bool:
        return bool(self.expression.matches(event))


_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "exact": str.__eq__,
    "prefix": str.startswith,
    "suffix": str.endswith,
}


# -- compilation ---------------------------------------------------------------------------------------------
def compile_attributes(attributes: object, path: str = "spec.filter.attributes") -> Filter:
    if attributes is None:
        return MatchAll()
    pairs = _string_map(attributes, path, allow_empty_values=True)
    return Attributes(pairs) if pairs else MatchAll()


def compile_filters(filters: object, path: str = "spec.filters") -> Filter:
    """All entries of a ``filters`` list; an empty list matches everything (as upstream)."""
    if filters is None:
        return MatchAll()
    parts = _compile_list(filters, path, allow_empty=True)
    return _all(parts)


def compile_filter(entry: object, path: str) -> Filter:
    """One ``SubscriptionsAPIFilter`` entry: exactly one dialect."""
    if not isinstance(entry, Mapping):
        raise FilterError(REASON_INVALID, path, f"a filter must be an object, not {type(entry).__name__}")
    unknown = sorted(str(k) for k in entry if k not in DIALECTS)
    if unknown:
        raise FilterError(REASON_UNKNOWN_DIALECT, path,
                          f"unknown filter dialect {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(DIALECTS)}")
    present = [k for k in DIALECTS if k in entry]
    if len(present) > 1:
        raise FilterError(REASON_MULTIPLE_DIALECTS, path,
                          f"one dialect per filter, found {', '.join(present)}: nest them in 'all' or 'any'")
    if not present:
        raise FilterError(REASON_INVALID, path, f"a filter must set one of {', '.join(DIALECTS)}")
    dialect = present[0]
    value, where = entry[dialect], f"{path}.{dialect}"
    if dialect in _STRING_TESTS:
        pairs = _string_map(value, where, allow_empty_values=False)
        if not pairs:
            raise FilterError(REASON_INVALID, where, "needs at least one attribute")
        return StringTest(dialect, pairs, _STRING_TESTS[dialect])
    if dialect in ("all", "any"):
        parts = _compile_list(value, where, allow_empty=False)
        return _all(parts) if dialect == "all" else (parts[0] if len(parts) == 1 else AnyOf(tuple(parts)))
    if dialect == "not":
        return Not(compile_filter(value, where))
    return _compile_cesql(value, where)


def compile_trigger(spec: Mapping[str, Any]) -> Filter:
    """The Trigger's matcher: ``spec.filters`` when non-empty, else ``spec.filter.attributes``."""
    filters = spec.get("filters")
    if filters:
        return compile_filters(filters)
    legacy = spec.get("filter")
    if legacy is None:
        return MatchAll()
    if not isinstance(legacy, Mapping):
        raise FilterError(REASON_INVALID, "spec.filter", "must be an object with 'attributes'")
    return compile_attributes(legacy.get("attributes"))


def fingerprint(spec: Mapping[str, Any]) -> str:
    """What a compiled filter depends on: a change of anything else in the spec does not recompile."""
    return json.dumps([spec.get("filters"), spec.get("filter")], sort_keys=True, separators=(",", ":"))


class TriggerFilters:
    """Compiled filters per Trigger key, recompiled only when the Trigger's filter spec changes.

    ``get`` answers the compiled matcher or raises the ``FilterError`` of a spec that does not compile (the
    error is cached too, so a bad Trigger costs one compile per change, not one per event).
    """

    def __init__(self) -> None:
        self._compiled: dict[object, tuple[str, Filter | FilterError]] = {}
        self.compiles = 0

    def get(self, key: object, spec: Mapping[str, Any]) -> Filter:
        want = fingerprint(spec)
        seen = self._compiled.get(key)
        if seen is None or seen[0] != want:
            self.compiles += 1
            try:
                compiled: Filter | FilterError = compile_trigger(spec)
            except FilterError as exc:
                compiled = exc
            seen = (want, compiled)
            self._compiled[key] = seen
        if isinstance(seen[1], FilterError):
            raise seen[1]
        return seen[1]

    def forget(self, key: object) -> None:
        self._compiled.pop(key, None)


# -- helpers -------------------------------------------------------------------------------------------------
def _all(parts: Sequence[Filter]) -> Filter:
    if not parts:
        return MatchAll()
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))


def _compile_list(value: object, path: str, *, allow_empty: bool) -> list[Filter]:
    if not isinstance(value, list):
        raise FilterError(REASON_INVALID, path, f"must be a list of filters, not {type(value).__name__}")
    if not value and not allow_empty:
        raise FilterError(REASON_INVALID, path, "needs at least one filter")
    return [compile_filter(entry, f"{path}[{i}]") for i, entry in enumerate(value)]


def _string_map(value: object, path: str, *, allow_empty_values: bool) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise FilterError(REASON_INVALID, path, f"must be a map of attribute name to value, not "
                                                f"{type(value).__name__}")
    pairs: list[tuple[str, str]] = []
    for name, want in sorted(value.items(), key=lambda kv: str(kv[0])):
        if not isinstance(name, str) or not ATTRIBUTE_NAME.match(name):
            raise FilterError(REASON_INVALID, f"{path}.{name}",
                              "attribute names start with a letter and contain only lowercase a-z and 0-9")
        if not isinstance(want, str):
            raise FilterError(REASON_INVALID, f"{path}.{name}",
                              f"the value must be a string, not {type(want).__name__}")
        if not want and not allow_empty_values:
            raise FilterError(REASON_INVALID, f"{path}.{name}", "the value must not be empty")
        pairs.append((name, want))
    return tuple(pairs)


def _compile_cesql(value: object, path: str) -> Filter:
    if not isinstance(value, str) or not value.strip():
        raise FilterError(REASON_CESQL, path, "must be a non-empty CloudEvents SQL expression")
    try:
        return Cesql(value, compile_expression(value))
    except CesqlParseError as exc:
        raise FilterError(REASON_CESQL, path, f"{value!r} does not parse: {exc}") from exc


# -- Kafka records ------------------------------------------------------------------------------------------
_STRUCTURED = "application/cloudevents"


def record_attributes(headers: Sequence[tuple[str, bytes | str | None]] | None,
                      value: bytes | None) -> dict[str, object]:
    """The context attributes of a Kafka record in either content mode (binary: ``ce_*`` headers and
    ``content-type``; structured: the JSON envelope without its data)."""
    attributes: dict[str, object] = {}
    structured = False
    for name, raw in headers or ():
        if raw is None:
            continue
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        low = name.lower()
        if low.startswith("ce_"):
            attributes[low[3:]] = text
        elif low == "content-type":
            if text.lower().startswith(_STRUCTURED):
                structured = True
            else:
                attributes["datacontenttype"] = text
    if structured and value:
        try:
            envelope = json.loads(value)
        except ValueError:
            return attributes
        if isinstance(envelope, dict):
            attributes.update((k, v) for k, v in envelope.items()
                              if k not in ("data", "data_base64") and isinstance(v, str | int | bool))
    return attributes


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """A compiled Trigger filter applied to Kafka records (the dispatcher's ``event_filter``); equal when the
    compiled filters are, so an unchanged Trigger does not restart its consumer."""

    compiled: Filter

    def __call__(self, message: Any) -> bool:
        return self.compiled.matches(record_attributes(message.headers(), message.value()))
