"""CloudEvents SQL → a Spark Column: the filter of ``reprocess replay|redrive --where``, with a Trigger's semantics.

The project's CESQL syntax tree (``kafka_eventing.cesql``) is compiled to plain Column expressions (no UDF, so the
filter runs in the JVM and is pushed down like any other predicate). The result is the Python engine's
``Expression.matches``: true only when the expression's value is Boolean true and no error occurred. Each node
compiles to a value and an "ok" condition (no error so far), following the Python engine's fail-fast evaluation
order exactly: ``AND``/``OR`` do not evaluate their right operand once the left decides, ``IN`` stops at the first
equal element, ``=`` casts its left operand to the right one's type, every other operator casts its operands to its
parameter types (spec §3.7), arithmetic is 32-bit with overflow, division by zero, casts and function argument
errors as errors, and a function the spec does not define is an error on every event.

The event a row presents (``row_attributes`` is the same view for the Python engine):

* ``id``, ``source``, ``type``, ``specversion``, ``subject``, ``datacontenttype``, ``dataschema``: their columns;
* ``time``: as the sender wrote it (the ``time_text`` column), as a Trigger reads it; only a row of an archive
  written before ``time_text`` existed gives the instant, in RFC 3339, UTC, ``Z``, microseconds only when non-zero
  (``2024-05-01T12:34:56.789000Z``);
* every other name: ``extensions[name]``, a String (a structured-mode number or boolean is its canonical string);
* ``data``: not accessible to CESQL (spec §1), as in a Trigger: reading it is a missing-attribute error.

A null column is an absent attribute: reading it is an error, ``EXISTS`` is false. Every value is a String, so an
attribute never has a type of its own here; CESQL's casts decide, as in a Trigger receiving binary-mode events.
No expression the compiler builds can raise under Spark's ANSI mode: Integer values stay inside 32 bits (an
overflowing result is marked as an error and saturated), divisors are never zero, and string-to-integer casts are
made only of strings already checked to be 32-bit decimal integers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce
from typing import TYPE_CHECKING, Any

from kafka_eventing.cesql import _runtime as rt
from kafka_eventing.cesql import ast
from kafka_eventing.cesql.compiler import REQUIRED_ATTRIBUTES
from kafka_eventing.cesql.functions import Type, resolve
from kafka_eventing.cesql.parser import parse
from kafka_eventing.reprocess.events import CORE_ATTRIBUTES, ext_pairs

if TYPE_CHECKING:
    from pyspark.sql import Column

INT_MIN, INT_MAX = rt.INT_MIN, rt.INT_MAX
_PY_TYPE: dict[Type, type] = {Type.BOOLEAN: bool, Type.INTEGER: int, Type.STRING: str}
_TYPE_OF: dict[type, Type] = {bool: Type.BOOLEAN, int: Type.INTEGER, str: Type.STRING}
_ZERO: dict[Type, bool | int | str] = {Type.BOOLEAN: False, Type.INTEGER: 0, Type.STRING: ""}
_NO_CONST: Any = object()
#: A 32-bit decimal integer as CESQL casts it (``_runtime.int_of_str``): a sign, ASCII digits, at most 10 of them
#: once leading zeros go (the range is checked after). ``\z``: Java's ``$`` would also match before a final newline.
_INT_TEXT = r"^[+-]?[0-9]+\z"
_WHITESPACE_CLASS = "[" + "".join(f"\\u{ord(ch):04x}" for ch in rt.WHITESPACE) + "]"
_TRIM = rf"\A{_WHITESPACE_CLASS}+|{_WHITESPACE_CLASS}+\z"


def _F() -> Any:
    from pyspark.sql import functions as F

    return F


@dataclass(frozen=True)
class _Code:
    """A compiled sub-expression. ``value`` is meaningful only where ``ok`` holds; ``ok`` None means the
    sub-expression cannot fail. Wherever ``ok`` holds, ``value`` is not null."""

    value: Column
    type: Type
    ok: Column | None = None
    const: Any = _NO_CONST

    @property
    def is_const(self) -> bool:
        return self.const is not _NO_CONST


def _all(*oks: Column | None) -> Column | None:
    present = [ok for ok in oks if ok is not None]
    return reduce(lambda a, b: a & b, present) if present else None


def _literal(val: bool | int | str) -> _Code:
    F = _F()
    column = F.lit(val).cast("long") if val.__class__ is int else F.lit(val)
    return _Code(column, _TYPE_OF[val.__class__], const=val)


def _failed(target: Type) -> _Code:
    """A sub-expression that is an error on every event."""
    return _Code(_literal(_ZERO[target]).value, target, ok=_F().lit(False))


def time_text(column: Column) -> Column:
    """A timestamp column as CESQL reads ``time`` (see the module's docstring); the session's time zone is UTC."""
    F = _F()
    fraction = F.when(F.pmod(F.unix_micros(column), F.lit(1_000_000)) != 0,
                      F.concat(F.lit("."), F.date_format(column, "SSSSSS"))).otherwise(F.lit(""))
    text: Column = F.concat(F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss"), fraction, F.lit("Z"))
    return text


def attribute_column(name: str) -> Column:
    """The String column of an attribute by its CESQL (lower-case) name; null when the event lacks it."""
    F = _F()
    if name == "time":
        text: Column = F.coalesce(F.col("time_text"), time_text(F.col("time")))
        return text
    column: Column = F.col(name) if name in CORE_ATTRIBUTES else F.col("extensions").getItem(name)
    return column


def row_attributes(row: Mapping[str, Any]) -> dict[str, object]:
    """A decoded row as the event the Python engine evaluates — the view ``attribute_column`` gives Spark."""
    out: dict[str, object] = {}
    for name in CORE_ATTRIBUTES:
        val = row.get(name)
        if val is None:
            continue
        if name == "time" and row.get("time_text") is not None:
            out[name] = str(row["time_text"])
        elif isinstance(val, datetime):
            val = val.astimezone(UTC) if val.tzinfo else val.replace(tzinfo=UTC)
            text = val.isoformat()
            out[name] = text[:-6] + "Z" if text.endswith("+00:00") else text
        else:
            out[name] = str(val)
    out.update((k, v) for k, v in ext_pairs(row.get("extensions")) if v is not None and k not in out)
    return out


# -- casts (spec §3.7), as _runtime.cast ---------------------------------------------------------------------


def _int_of_text(text: Column) -> tuple[Column, Column]:
    """(value, ok) of a String cast to Integer."""
    F = _F()
    digits = F.regexp_replace(text, r"^[+-]?0*", "")
    shaped = text.rlike(_INT_TEXT) & (F.length(digits) <= 10)
    number = F.when(shaped, text).otherwise(F.lit("0")).try_cast("long")
    ok = shaped & number.between(INT_MIN, INT_MAX)
    return F.when(ok, number).otherwise(F.lit(0).cast("long")), ok


def _bool_of_text(text: Column) -> tuple[Column, Column]:
    F = _F()
    lowered = F.lower(text)
    return lowered == F.lit("true"), lowered.isin("true", "false")


def _cast(code: _Code, target: Type) -> _Code:
    """``code`` implicitly cast to ``target`` (ANY: unchanged)."""
    if target is Type.ANY or code.type is target:
        return code
    F = _F()
    if code.is_const:
        try:
            return _literal(rt.cast(code.const, _PY_TYPE[target], None))
        except rt.Fail:
            return _failed(target)
    value = code.value
    match (code.type, target):
        case (Type.INTEGER, Type.STRING):
            return _Code(value.cast("string"), target, code.ok)
        case (Type.BOOLEAN, Type.STRING):
            return _Code(F.when(value, F.lit("true")).otherwise(F.lit("false")), target, code.ok)
        case (Type.BOOLEAN, Type.INTEGER):
            return _Code(F.when(value, F.lit(1)).otherwise(F.lit(0)).cast("long"), target, code.ok)
        case (Type.STRING, Type.INTEGER):
            number, ok = _int_of_text(value)
            return _Code(number, target, _all(code.ok, ok))
        case (Type.STRING, Type.BOOLEAN):
            truth, ok = _bool_of_text(value)
            return _Code(truth, target, _all(code.ok, ok))
        case (Type.INTEGER, Type.BOOLEAN):
            # As the Python engine (and the TCK's not_operator.yaml): an Integer is never implicitly a Boolean.
            return _Code(F.lit(False), target, F.lit(False))
    raise TypeError(f"no cast from {code.type} to {target}")


def _saturated(raw: Column, *oks: Column | None) -> _Code:
    """A 64-bit result of 32-bit operands: an error outside 32 bits, the value then saturated (as _runtime)."""
    F = _F()
    inside = raw.between(INT_MIN, INT_MAX)
    value = F.when(raw > INT_MAX, F.lit(INT_MAX)).when(raw < INT_MIN, F.lit(INT_MIN)).otherwise(raw).cast("long")
    return _Code(value, Type.INTEGER, _all(*oks, inside))


# -- the compiler --------------------------------------------------------------------------------------------


def _emit(node: ast.Node) -> _Code:
    match node:
        case ast.BoolLit(val) | ast.IntLit(val) | ast.StrLit(val):
            return _literal(val)
        case ast.Attribute(name):
            if name == "data":
                return _failed(Type.STRING)
            column = attribute_column(name)
            return _Code(column, Type.STRING, column.isNotNull())
        case ast.Exists(name):
            if name in REQUIRED_ATTRIBUTES or name == "data":
                return _literal(name != "data")
            return _Code(attribute_column(name).isNotNull(), Type.BOOLEAN)
        case ast.Not(operand):
            code = _cast(_emit(operand), Type.BOOLEAN)
            return _Code(~code.value, Type.BOOLEAN, code.ok)
        case ast.Negate(operand):
            code = _cast(_emit(operand), Type.INTEGER)
            return _saturated(-code.value, code.ok)
        case ast.Binary(op, left, right):
            return _binary(op, left, right)
        case ast.Like(operand, pattern, negated):
            code = _cast(_emit(operand), Type.STRING)
            test = _like(code.value, pattern.value)
            return _Code(~test if negated else test, Type.BOOLEAN, code.ok)
        case ast.In(operand, items, negated):
            code = _in(_emit(operand), [_emit(item) for item in items])
            return _Code(~code.value, Type.BOOLEAN, code.ok) if negated else code
        case ast.Call(name, args):
            return _call(name, args)
    raise TypeError(f"not a CESQL node: {node!r}")


def _binary(op: str, left_node: ast.Node, right_node: ast.Node) -> _Code:
    F = _F()
    if op in ast.LOGIC_OPS:
        left, right = _cast(_emit(left_node), Type.BOOLEAN), _cast(_emit(right_node), Type.BOOLEAN)
        if op == "XOR":
            return _Code(left.value != right.value, Type.BOOLEAN, _all(left.ok, right.ok))
        # The right operand is evaluated (and may fail) only when the left does not decide, as in Python.
        decides = ~left.value if op == "AND" else left.value
        value = left.value & right.value if op == "AND" else left.value | right.value
        ok = _all(left.ok, None if right.ok is None else decides | right.ok)
        return _Code(value, Type.BOOLEAN, ok)
    if op in ast.EQUALITY_OPS:
        # Both operands are evaluated, then the left is cast to the right one's type (spec §3.7).
        right = _emit(right_node)
        left = _cast(_emit(left_node), right.type)
        equal = left.value == right.value
        return _Code(equal if op == "=" else ~equal, Type.BOOLEAN, _all(left.ok, right.ok))
    left, right = _cast(_emit(left_node), Type.INTEGER), _cast(_emit(right_node), Type.INTEGER)
    both = _all(left.ok, right.ok)
    if op in ast.ORDER_OPS:
        compare: dict[str, Callable[[Column, Column], Column]] = {
            "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}
        return _Code(compare[op](left.value, right.value), Type.BOOLEAN, both)
    if op in ("/", "%"):
        zero = right.value == 0
        divisor = F.when(zero, F.lit(1).cast("long")).otherwise(right.value)
        remainder = left.value % divisor  # Java's remainder: the sign of the dividend, as CESQL's
        if op == "%":
            return _Code(F.when(zero, F.lit(0).cast("long")).otherwise(remainder), Type.INTEGER, _all(both, ~zero))
        # Exact in a double (|operands| <= 2^31) and rounded towards zero, as CESQL's.
        quotient = ((left.value - remainder) / divisor).cast("long")
        code = _saturated(quotient, both, ~zero)
        return _Code(F.when(zero, F.lit(0).cast("long")).otherwise(code.value), Type.INTEGER, code.ok)
    arithmetic: dict[str, Callable[[Column, Column], Column]] = {
        "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    return _saturated(arithmetic[op](left.value, right.value), both)


def like_regex(pattern: str) -> str | None:
    """A Java regular expression matching what the LIKE pattern matches (whole string), or None when the pattern
    has no wildcard (then it is an equality)."""
    parts = rt.like_parts(pattern)
    if not any(isinstance(part, rt.Wildcard) for part in parts):
        return None
    body = "".join(part.value if isinstance(part, rt.Wildcard) else _java_quote(part) for part in parts)
    return rf"(?s)\A(?:{body})\z"


def _java_quote(text: str) -> str:
    # A backslash before a non-alphabetic character is always that character in Java's syntax; letters, digits
    # and non-ASCII characters have no special meaning unescaped.
    return re.sub(r"[^A-Za-z0-9\u0080-\U0010ffff]", lambda m: "\\" + m.group(0), text)


def _like(value: Column, pattern: str) -> Column:
    F = _F()
    regex = like_regex(pattern)
    return value == F.lit("".join(p for p in rt.like_parts(pattern) if isinstance(p, str))) if regex is None \
        else value.rlike(regex)


def _in(left: _Code, items: list[_Code]) -> _Code:
    """``left IN (items)``: each element cast to the left operand's type, in order, stopping at the first equal."""
    cast = [_cast(item, left.type) for item in items]
    if all(item.is_const and item.ok is None for item in cast):
        return _Code(left.value.isin(*[item.const for item in cast]), Type.BOOLEAN, left.ok)
    value: Column = _F().lit(False)
    ok: Column | None = None
    for item in reversed(cast):
        equal = item.value == left.value
        value = equal | value
        ok = _all(item.ok, None if ok is None else equal | ok)
    return _Code(value, Type.BOOLEAN, _all(left.ok, ok))


def _call(name: str, arg_nodes: tuple[ast.Node, ...]) -> _Code:
    F = _F()
    function = resolve(name, len(arg_nodes))
    if function is None:
        return _failed(Type.BOOLEAN)  # a MissingFunctionError on every event, as in the Python engine
    args = [_cast(_emit(node), function.param(i)) for i, node in enumerate(arg_nodes)]
    ok = _all(*(arg.ok for arg in args))
    values = [arg.value for arg in args]
    long = "long"
    match name:
        case "LENGTH":
            return _Code(F.length(values[0]).cast(long), Type.INTEGER, ok)
        case "CONCAT":
            return _Code(F.concat(*values) if values else F.lit(""), Type.STRING, ok)
        case "CONCAT_WS":
            separator, *parts = values
            joined = [piece for i, part in enumerate(parts) for piece in ((separator, part) if i else (part,))]
            return _Code(F.concat(*joined) if joined else F.lit(""), Type.STRING, ok)
        case "LOWER":
            return _Code(F.lower(values[0]), Type.STRING, ok)
        case "UPPER":
            return _Code(F.upper(values[0]), Type.STRING, ok)
        case "TRIM":
            return _Code(F.regexp_replace(values[0], _TRIM, ""), Type.STRING, ok)
        case "LEFT" | "RIGHT":
            text, count = values
            negative = count < 0
            size = F.length(text)
            part = (text.substr(F.lit(1), count.cast("int")) if name == "LEFT"
                    else F.when(count >= size, text).when(count == 0, F.lit(""))
                    .otherwise(text.substr((size - count + 1).cast("int"), count.cast("int"))))
            return _Code(F.when(negative, text).otherwise(part), Type.STRING, _all(ok, ~negative))
        case "SUBSTRING":
            text, pos = values[0], values[1]
            size = F.length(text).cast(long)
            outside = (pos > size) | (pos < -size)
            empty = outside | (pos == 0)
            start = F.when(pos > 0, pos).otherwise(size + pos + 1).cast("int")  # 1-based
            if len(values) == 2:
                return _Code(F.when(empty, F.lit("")).otherwise(text.substr(start, size.cast("int"))),
                             Type.STRING, _all(ok, ~outside))
            length = values[2]
            negative = length < 0
            part = F.when(empty | negative, F.lit("")).otherwise(text.substr(start, length.cast("int")))
            return _Code(part, Type.STRING, _all(ok, ~outside, (pos == 0) | ~negative))
        case "ABS":
            return _saturated(F.abs(values[0]), ok)
        case "BOOL" if args[0].type is Type.INTEGER:
            return _Code(values[0] != 0, Type.BOOLEAN, ok)  # the explicit cast: true unless 0
        case "INT" | "BOOL" | "STRING":
            return _cast(args[0], {"INT": Type.INTEGER, "BOOL": Type.BOOLEAN, "STRING": Type.STRING}[name])
        case "IS_BOOL" | "IS_INT":
            arg = args[0]
            own = Type.BOOLEAN if name == "IS_BOOL" else Type.INTEGER
            if arg.type is not Type.STRING:
                return _Code(F.lit(arg.type is own), Type.BOOLEAN, ok)
            test = (_bool_of_text if name == "IS_BOOL" else _int_of_text)(values[0])[1]
            return _Code(test, Type.BOOLEAN, ok)
    raise TypeError(f"CESQL function {name} has no Spark form")  # every entry of functions.BUILTINS has one


@dataclass(frozen=True)
class SparkFilter:
    """A CESQL expression compiled for decoded rows. ``matches`` is the filter; ``value``/``ok`` are the
    expression's value and whether it evaluated without error (for checks against the Python engine)."""

    text: str
    type: Type
    value: Column
    ok: Column

    @property
    def matches(self) -> Column:
        F = _F()
        # Only a Boolean true without error passes a filter.
        verdict: Column = F.coalesce(self.ok & self.value, F.lit(False)) if self.type is Type.BOOLEAN else F.lit(False)
        return verdict


def check_where(text: str) -> ast.Node:
    """Parse ``text`` as CESQL (``CesqlParseError`` with line and column if it is not); no Spark needed."""
    return parse(text)


def compile_where(text: str) -> SparkFilter:
    """``text`` (CESQL) as Spark columns over decoded rows (``reprocess.events.event_schema``)."""
    F = _F()
    code = _emit(check_where(text))
    ok = F.lit(True) if code.ok is None else F.coalesce(code.ok, F.lit(False))
    return SparkFilter(text, code.type, code.value, ok)

