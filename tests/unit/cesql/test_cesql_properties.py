"""Properties over generated expressions and events: the canonical printer reads back to the same tree, and
evaluation never raises, returns a value of the compiled type, and agrees with ``matches``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_eventing.cesql import CesqlError, ErrorKind, compile_expression
from kafka_eventing.cesql import ast as cst
from kafka_eventing.cesql.functions import BUILTINS, Type
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
