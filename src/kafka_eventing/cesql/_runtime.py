"""What compiled expressions call at evaluation time: reading event values, the casts, the fallible operators and
the built-in functions.

Every fallible helper takes ``errs``: ``None`` makes an error raise ``Fail`` (evaluation stops: the error belongs to
a sub-expression, so the whole expression takes its zero value), a list makes it append the error and return the
spec's value for that case (the error belongs to the outermost operator, whose own result the spec defines).
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import re
from collections.abc import Sequence
from typing import NoReturn, TypeVar

from kafka_eventing.cesql.errors import CesqlError, ErrorKind

INT_MIN, INT_MAX = -(2**31), 2**31 - 1

Value = bool | int | str
Errors = list[CesqlError] | None
_V = TypeVar("_V", bool, int, str)

#: Unicode's White_Space characters, the set TRIM removes (spec §3.5.1). Python's str.strip() would also remove
#: the separators U+001C..U+001F, which are control characters.
WHITESPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


class Fail(Exception):
    """Stops an evaluation at its first error."""

    __slots__ = ("error",)

    def __init__(self, error: CesqlError) -> None:
        super().__init__(error)
        self.error = error


def report(errs: Errors, kind: ErrorKind, message: str, fallback: _V) -> _V:
    error = CesqlError(kind, message)
    if errs is None:
        raise Fail(error)
    errs.append(error)
    return fallback


def missing(name: str) -> NoReturn:
    raise Fail(CesqlError(ErrorKind.MISSING_ATTRIBUTE, f"the event has no attribute {name!r}"))


def no_data() -> NoReturn:
    raise Fail(CesqlError(ErrorKind.MISSING_ATTRIBUTE, "the event's data is not accessible to CESQL (spec §1)"))


# -- event values --------------------------------------------------------------------------------------------


def _timestamp(value: dt.datetime) -> str:
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def value(raw: object, name: str) -> Value:
    """An attribute's value as a CESQL value: str, bool and 32-bit ints as they are; anything else is represented
    as a String (spec §3.2): a wider int in decimal, a datetime in RFC 3339, bytes in base64, others by str().
    ``None`` means the attribute is absent."""
    cls = raw.__class__
    if cls is str or cls is bool:
        return raw  # type: ignore[return-value]
    if cls is int:
        return raw if INT_MIN <= raw <= INT_MAX else str(raw)  # type: ignore[operator,return-value]
    if raw is None:
        missing(name)
    if isinstance(raw, bool):
        return bool(raw)
    if isinstance(raw, int):
        return value(int(raw), name)
    if isinstance(raw, str):
        return str(raw)
    if isinstance(raw, dt.datetime):
        return _timestamp(raw)
    if isinstance(raw, bytes | bytearray | memoryview):
        return base64.b64encode(raw).decode("ascii")
    return str(raw)


# -- casts (spec §3.7) ---------------------------------------------------------------------------------------


def _parse_int(text: str) -> int | None:
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isascii() and digits.isdigit():
        number = int(text)
        if INT_MIN <= number <= INT_MAX:
            return number
    return None


def string_of(val: Value) -> str:
    if val.__class__ is bool:
        return "true" if val else "false"
    return str(val)


def int_of_str(text: str, errs: Errors) -> int:
    number = _parse_int(text)
    if number is None:
        return report(errs, ErrorKind.CAST, f"cannot cast {text!r} to Integer (32-bit, base 10)", 0)
    return number


def bool_of_str(text: str, errs: Errors) -> bool:
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return report(errs, ErrorKind.CAST, f"cannot cast {text!r} to Boolean (true or false)", False)


def implicit_bool_of_int(number: int, errs: Errors) -> bool:
    # The conformance suite (not_operator.yaml: NOT 10 → true + cast error) keeps the draft's rule that an Integer
    # is not implicitly a Boolean; BOOL(x) converts explicitly (x != 0).
    return report(errs, ErrorKind.CAST, f"the Integer {number} is not a Boolean (convert with BOOL(x))", False)


def cast(val: Value, target: type, errs: Errors) -> Value:
    """The implicit cast of ``val`` to ``target`` (bool, int or str)."""
    cls = val.__class__
    if cls is target:
        return val
    if target is str:
        return string_of(val)
    if target is int:
        return (1 if val else 0) if cls is bool else int_of_str(val, errs)  # type: ignore[arg-type]
    return bool_of_str(val, errs) if cls is str else implicit_bool_of_int(val, errs)  # type: ignore[arg-type]


def as_str(raw: object, name: str, errs: Errors) -> str:
    return string_of(value(raw, name))


def as_int(raw: object, name: str, errs: Errors) -> int:
    return cast(value(raw, name), int, errs)  # type: ignore[return-value]


def as_bool(raw: object, name: str, errs: Errors) -> bool:
    return cast(value(raw, name), bool, errs)  # type: ignore[return-value]


# -- operators -----------------------------------------------------------------------------------------------


def overflow(number: int, errs: Errors) -> int:
    """An Integer result outside 32 bits: a math error, and the value saturates (as the spec defines for ABS)."""
    return report(errs, ErrorKind.MATH, f"integer overflow ({number} is outside the 32-bit range)",
                  INT_MAX if number > INT_MAX else INT_MIN)


def divide(left: int, right: int, errs: Errors) -> int:
    if right == 0:
        return report(errs, ErrorKind.MATH, "division by zero", 0)
    quotient = abs(left) // abs(right)  # rounded towards 0, not floored
    quotient = quotient if (left < 0) == (right < 0) else -quotient
    return quotient if quotient <= INT_MAX else overflow(quotient, errs)


def modulo(left: int, right: int, errs: Errors) -> int:
    if right == 0:
        return report(errs, ErrorKind.MATH, "modulo by zero", 0)
    remainder = abs(left) % abs(right)  # the sign of the dividend
    return -remainder if left < 0 else remainder


def equals(left: Value, right: Value, errs: Errors) -> bool:
    """``=`` when the right operand's type is known only at run time: the left is cast to it (spec §3.7)."""
    return cast(left, right.__class__, errs) == right


def in_equals(left: Value, item: Value, errs: Errors) -> bool:
    """One ``IN`` comparison: the set element is cast to the left operand's type (spec §3.4.5)."""
    return cast(item, left.__class__, errs) == left


def member(left: Value, items: Sequence[Value], errs: Errors) -> bool:
    """``left IN items`` for literal items, tried in order and stopping at the first equal one."""
    target = left.__class__
    return any(cast(item, target, errs) == left for item in items)


def no_function(name: str, arity: int, errs: Errors) -> bool:
    return report(errs, ErrorKind.MISSING_FUNCTION, f"there is no function {name} taking {arity} argument(s)", False)


# -- LIKE ----------------------------------------------------------------------------------------------------


class Wildcard(enum.Enum):
    """A LIKE wildcard, by the regular expression it stands for."""

    ANY = ".*"  # %
    ONE = "."  # _


def like_parts(pattern: str) -> list[str | Wildcard]:
    """The pattern as literal runs and wildcards ('%', '_'); a backslash escapes '%' and '_', before any other
    character it is itself."""
    parts: list[str | Wildcard] = []
    literal: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and pattern[i + 1:i + 2] in ("%", "_"):
            literal.append(pattern[i + 1])
            i += 2
            continue
        if char in ("%", "_"):
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(Wildcard.ANY if char == "%" else Wildcard.ONE)
        else:
            literal.append(char)
        i += 1
    if literal:
        parts.append("".join(literal))
    return parts


def like_regex(parts: list[str | Wildcard]) -> re.Pattern[str]:
    return re.compile("".join(p.value if isinstance(p, Wildcard) else re.escape(p) for p in parts), re.DOTALL)


# -- built-in functions (spec §3.5) --------------------------------------------------------------------------


def abs_(number: int, errs: Errors) -> int:
    if number == INT_MIN:
        return report(errs, ErrorKind.MATH, "ABS(-2147483648) overflows 32 bits", INT_MAX)
    return -number if number < 0 else number


def left(text: str, count: int, errs: Errors) -> str:
    if count < 0:
        return report(errs, ErrorKind.FUNCTION_EVALUATION, f"LEFT: the length {count} is negative", text)
    return text[:count]


def right(text: str, count: int, errs: Errors) -> str:
    if count < 0:
        return report(errs, ErrorKind.FUNCTION_EVALUATION, f"RIGHT: the length {count} is negative", text)
    return text[len(text) - count:] if count < len(text) else text


def _start(text: str, pos: int, errs: Errors) -> int | None:
    """Where SUBSTRING starts (0-based), or None for the empty result; an out-of-range pos is an error."""
    if pos > len(text) or pos < -len(text):
        report(errs, ErrorKind.FUNCTION_EVALUATION, f"SUBSTRING: position {pos} is outside a string of "
               f"length {len(text)}", "")
        return None
    if pos == 0:
        return None
    return pos - 1 if pos > 0 else len(text) + pos


def substring(text: str, pos: int, errs: Errors) -> str:
    start = _start(text, pos, errs)
    return "" if start is None else text[start:]


def substring_length(text: str, pos: int, length: int, errs: Errors) -> str:
    start = _start(text, pos, errs)
    if start is None:
        return ""
    if length < 0:
        return report(errs, ErrorKind.FUNCTION_EVALUATION, f"SUBSTRING: the length {length} is negative", "")
    return text[start:start + length]


def int_fn(val: Value, errs: Errors) -> int:
    """INT(x): the explicit cast (spec §3.7's table)."""
    if val.__class__ is str:
        return int_of_str(val, errs)  # type: ignore[arg-type]
    return int(val)


def bool_fn(val: Value, errs: Errors) -> bool:
    """BOOL(x): the explicit cast; an Integer is true unless 0."""
    if val.__class__ is str:
        return bool_of_str(val, errs)  # type: ignore[arg-type]
    return bool(val)


def is_bool(val: Value) -> bool:
    """IS_BOOL(x): x is a Boolean, or a String that casts to one."""
    cls = val.__class__
    return cls is bool or (cls is str and val.lower() in ("true", "false"))  # type: ignore[union-attr]


def is_int(val: Value) -> bool:
    """IS_INT(x): x is an Integer, or a String that casts to one."""
    cls = val.__class__
    return cls is int or (cls is str and _parse_int(val) is not None)  # type: ignore[arg-type]
