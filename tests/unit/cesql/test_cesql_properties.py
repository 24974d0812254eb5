"""Properties over generated expressions and events: the canonical printer reads back to the same tree, and
evaluation never raises, returns a value of the compiled type, and agrees with ``matches``."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_eventing.cesql import CesqlError, CesqlParseError, ErrorKind, compile_expression
from kafka_eventing.cesql import _runtime as rt
from kafka_eventing.cesql import ast as cst
from kafka_eventing.cesql.functions import BUILTINS, Type, resolve
from kafka_eventing.cesql.parser import parse

NAMES = ["type", "source", "id", "subject", "seq", "flag", "big", "when", "raw", "data", "missing", "x1", "9lives"]
FUNCTIONS = sorted({fn.name for fn in BUILTINS} | {"NOPE", "IS_STRING"})
OPS = sorted(cst.ARITHMETIC_OPS | cst.ORDER_OPS | cst.EQUALITY_OPS | cst.LOGIC_OPS)

# String contents a literal can spell: any character but a lone backslash, which always escapes the next one.
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\\")
_escapes = st.sampled_from(["\\%", "\\_", "\\n", "\\a"])
_contents = st.lists(st.one_of(_chars, _escapes, st.sampled_from(["%", "_", "'", '"'])), max_size=8).map("".join)
strings = st.builds(cst.StrLit, _contents, st.sampled_from(["'", '"']))
integers = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]))
leaves = st.one_of(
    st.builds(cst.BoolLit, st.booleans()),
    st.builds(cst.IntLit, integers),
    strings,
    st.builds(cst.Attribute, st.sampled_from(NAMES)),
    st.builds(cst.Exists, st.sampled_from(NAMES)),
)


def _compound(children: st.SearchStrategy[cst.Node]) -> st.SearchStrategy[cst.Node]:
    items = st.lists(children, min_size=1, max_size=4).map(tuple)
    return st.one_of(
        st.builds(cst.Not, children),
        st.builds(cst.Negate, children),
        st.builds(cst.Binary, st.sampled_from(OPS), children, children),
        st.builds(cst.Like, children, strings, st.booleans()),
        st.builds(cst.In, children, items, st.booleans()),
        st.builds(cst.Call, st.sampled_from(FUNCTIONS), st.lists(children, max_size=3).map(tuple)),
    )


trees = st.recursive(leaves, _compound, max_leaves=20)

event_values = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["10", "-3", "true", "FALSE", "", " 1", "2147483648", "abc"]),
    st.integers(-(2**40), 2**40),
    st.booleans(),
    st.none(),
    st.datetimes(timezones=st.just(dt.UTC)),
    st.binary(max_size=4),
)
events = st.dictionaries(st.sampled_from(NAMES), event_values, max_size=len(NAMES))

PYTHON_TYPE = {Type.BOOLEAN: bool, Type.INTEGER: int, Type.STRING: str}
FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(trees)
def test_print_then_parse_gives_the_same_tree(tree: cst.Node) -> None:
    text = cst.to_text(tree)
    reparsed = parse(text)
    assert reparsed == tree, text
    assert cst.to_text(reparsed) == text


@FAST
@given(trees, events)
def test_evaluation_never_raises_and_agrees_with_matches(tree: cst.Node, event: Mapping[str, object]) -> None:
    expr = compile_expression(cst.to_text(tree))
    result = expr.evaluate(event)
    if expr.type is Type.ANY:
        assert result.value.__class__ in (bool, int, str)
    else:
        assert result.value.__class__ is PYTHON_TYPE[expr.type]
    if result.value.__class__ is int:
        assert -(2**31) <= result.value <= 2**31 - 1
    assert all(error.kind is not ErrorKind.GENERIC for error in result.errors), result.errors
    assert expr.matches(event) is (result.value is True and not result.errors)


@FAST
@given(trees, events)
def test_both_compiled_variants_agree_when_nothing_fails(tree: cst.Node, event: Mapping[str, object]) -> None:
    expr = compile_expression(cst.to_text(tree))
    result = expr.evaluate(event)
    if not result.errors and expr._fallback is not None:
        errors: list[CesqlError] = []
        assert expr._fallback(event, errors) == result.value  # the variant evaluate() falls back to
        assert errors == []


# -- a reference interpreter -----------------------------------------------------------------------------------
# Walks the tree and decides every cast from the run-time values (the compiler decides them from static types,
# inlines attribute reads, folds constants and picks set lookups or string methods); both must agree on the value
# and the errors for every expression and event. It shares the casts and built-in bodies of the runtime.

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_ZERO = {Type.BOOLEAN: False, Type.INTEGER: 0, Type.STRING: "", Type.ANY: False}


def _like(text: str, pattern: str) -> bool:
    regex, i = "", 0
    while i < len(pattern):
        if pattern[i] == "\\" and pattern[i + 1:i + 2] in ("%", "_"):
            regex += re.escape(pattern[i + 1])
            i += 2
            continue
        regex += {"%": ".*", "_": "."}.get(pattern[i], re.escape(pattern[i]))
        i += 1
    return re.fullmatch(regex, text, re.DOTALL) is not None


def _return_type(node: cst.Node) -> Type:
    match node:
        case cst.BoolLit() | cst.Exists() | cst.Not() | cst.Like() | cst.In():
            return Type.BOOLEAN
        case cst.IntLit() | cst.Negate():
            return Type.INTEGER
        case cst.StrLit():
            return Type.STRING
        case cst.Binary(op):
            return Type.INTEGER if op in cst.ARITHMETIC_OPS else Type.BOOLEAN
        case cst.Call(name, args):
            fn = resolve(name, len(args))
            return fn.returns if fn else Type.BOOLEAN
    return Type.ANY


def _cast(val: object, target: type, errs: list[CesqlError] | None) -> Any:
    return rt.cast(val, target, errs)  # type: ignore[arg-type]


def _clamp(number: int, errs: list[CesqlError] | None) -> int:
    return number if _INT_MIN <= number <= _INT_MAX else rt.overflow(number, errs)


_BODIES: dict[str, Any] = {
    "LENGTH": lambda a, _: len(a[0]), "CONCAT": lambda a, _: "".join(a), "LOWER": lambda a, _: a[0].lower(),
    "CONCAT_WS": lambda a, _: a[0].join(a[1:]), "UPPER": lambda a, _: a[0].upper(),
    "TRIM": lambda a, _: a[0].strip(rt.WHITESPACE), "LEFT": lambda a, e: rt.left(a[0], a[1], e),
    "RIGHT": lambda a, e: rt.right(a[0], a[1], e), "ABS": lambda a, e: rt.abs_(a[0], e),
    "SUBSTRING": lambda a, e: rt.substring(a[0], a[1], e) if len(a) == 2 else rt.substring_length(*a, e),
    "INT": lambda a, e: rt.int_fn(a[0], e), "BOOL": lambda a, e: rt.bool_fn(a[0], e),
    "STRING": lambda a, _: rt.string_of(a[0]), "IS_BOOL": lambda a, _: rt.is_bool(a[0]),
    "IS_INT": lambda a, _: rt.is_int(a[0]),
}


def _run(node: cst.Node, event: Mapping[str, object], errs: list[CesqlError] | None) -> Any:
    """The value of ``node``; its own errors go to ``errs`` (None: raise rt.Fail), its operands' always raise."""
    match node:
        case cst.BoolLit(val) | cst.IntLit(val) | cst.StrLit(val):
            return val
        case cst.Attribute(name):
            if name == "data" or event.get(name) is None:
                rt.missing(name)
            return rt.value(event[name], name)
        case cst.Exists(name):
            return name in ("specversion", "id", "source", "type") or (name != "data" and event.get(name) is not None)
        case cst.Not(operand):
            return not _cast(_run(operand, event, None), bool, errs)
        case cst.Negate(operand):
            return _clamp(-_cast(_run(operand, event, None), int, errs), errs)
        case cst.Like(operand, pattern, negated):
            return _like(_cast(_run(operand, event, None), str, errs), pattern.value) != negated
        case cst.In(operand, items, negated):
            left = _run(operand, event, None)
            found = any(_cast(_run(item, event, None), left.__class__, errs) == left for item in items)
            return found != negated
        case cst.Call(name, args):
            fn = resolve(name, len(args))
            if fn is None:
                return rt.no_function(name, len(args), errs)
            values = []
            for i, arg in enumerate(args):
                val = _run(arg, event, None)
                param = fn.param(i)
                values.append(val if param is Type.ANY else _cast(val, PYTHON_TYPE[param], errs))
            return _BODIES[name](values, errs)
        case cst.Binary(op, left, right) if op in ("AND", "OR"):
            first = _cast(_run(left, event, None), bool, errs)
            if first == (op == "OR"):
                return first
            return _cast(_run(right, event, None), bool, errs)
        case cst.Binary("XOR", left, right):
            first = _cast(_run(left, event, None), bool, errs)
            return first != _cast(_run(right, event, None), bool, errs)
        case cst.Binary("=" | "!=" as op, left, right):
            lval = _run(left, event, None)
            rval = _run(right, event, None)
            return (_cast(lval, rval.__class__, errs) == rval) == (op == "=")
        case cst.Binary(op, left, right):
            lnum = _cast(_run(left, event, None), int, errs)
            rnum = _cast(_run(right, event, None), int, errs)
            if op in cst.ORDER_OPS:
                return {"<": lnum < rnum, "<=": lnum <= rnum, ">": lnum > rnum, ">=": lnum >= rnum}[op]
            if op == "/":
                return rt.divide(lnum, rnum, errs)
            if op == "%":
                return rt.modulo(lnum, rnum, errs)
            return _clamp({"+": lnum + rnum, "-": lnum - rnum, "*": lnum * rnum}[op], errs)
    raise AssertionError(node)


def reference(tree: cst.Node, event: Mapping[str, object]) -> tuple[object, list[ErrorKind]]:
    errors: list[CesqlError] = []
    try:
        val = _run(tree, event, errors)
    except rt.Fail as stop:
        return _ZERO[_return_type(tree)], [e.kind for e in errors] + [stop.error.kind]
    return val, [e.kind for e in errors]


@FAST
@given(trees, events)
def test_compiled_code_agrees_with_a_reference_interpreter(tree: cst.Node, event: Mapping[str, object]) -> None:
    result = compile_expression(cst.to_text(tree)).evaluate(event)
    expected_value, expected_kinds = reference(tree, event)
    assert (result.value.__class__, result.value) == (expected_value.__class__, expected_value)
    assert [error.kind for error in result.errors] == expected_kinds


# Raw text, not only printed trees: mostly CESQL's own tokens glued together (with stray quotes, escapes and
# operators), so that many inputs get past the lexer, plus arbitrary characters.
_tokens = st.sampled_from(["AND", "or", "XOR", "NOT", "LIKE", "IN", "EXISTS", "TRUE", "false", "(", ")", ",", "'",
                           '"', "\\", "=", "!=", "<>", "<=", ">", "+", "-", "*", "/", "%", "1", "2147483648",
                           "type", "LENGTH(", "SUBSTRING(", "CONCAT_WS(", "'a%_'", '"b\\""', " ", "\n", "\t", "é"])
raw_texts = st.one_of(st.lists(_tokens, max_size=12).map("".join), st.text(max_size=40))


@FAST
@given(raw_texts, events)
def test_any_text_compiles_or_is_a_parse_error_and_then_never_raises(text: str, event: Mapping[str, object]) -> None:
    try:
        expr = compile_expression(text)
    except CesqlParseError as exc:
        error = exc
    else:
        result = expr.evaluate(event)
        assert all(isinstance(found, CesqlError) for found in result.errors)
        assert isinstance(expr.matches(event), bool)
        return
    assert error.kind is ErrorKind.PARSE
