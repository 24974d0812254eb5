"""Evaluation semantics beyond the conformance suite: typed and string-valued attributes, every code path the
compiler picks (inline casts, LIKE shapes, IN shapes), overflow, the error model, and the public API."""

from __future__ import annotations

import datetime as dt
import pickle
from collections.abc import Iterator, Mapping

import pytest

from kafka_eventing.cesql import CesqlError, ErrorKind, Expression, Result, compile_expression

BASE = {"specversion": "1.0", "id": "e-1", "source": "https://example.com/shop", "type": "com.example.created"}
# The same event as Kafka headers carry it (every value a string) and as a typed JSON event.
HEADERS = {**BASE, "seq": "10", "flag": "TRUE", "subject": "order-42"}
TYPED = {**BASE, "seq": 10, "flag": True, "subject": "order-42"}


def run(text: str, event: Mapping[str, object]) -> tuple[object, list[ErrorKind]]:
    result = compile_expression(text).evaluate(event)
    return result.value, [error.kind for error in result.errors]


@pytest.mark.parametrize("event", [HEADERS, TYPED], ids=["string-attributes", "typed-attributes"])
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("seq = 10", True),
        ("seq > 9 AND seq <= 10", True),
        ("seq + 1", 11),
        ("-seq", -10),
        ("seq = '10'", True),
        ("seq IN (1, 10)", True),
        ("seq IN ('10', 'x')", True),
        ("flag", None),  # the attribute's own value: 'TRUE' (a String) or true (a Boolean)
        ("flag AND TRUE", True),
        ("NOT flag", False),
        ("flag = TRUE", True),
        ("LENGTH(subject) = 8 AND EXISTS subject", True),
        ("INT(seq) * 2", 20),
        ("STRING(seq)", "10"),
        ("IS_INT(seq)", True),
        ("seq LIKE '1_'", True),
        ("subject = 'order-42'", True),
    ],
)
def test_attribute_values_cast_as_the_spec_says(event: Mapping[str, object], text: str, value: object) -> None:
    result = compile_expression(text).evaluate(event)
    assert result.errors == ()
    assert result.value == (event["flag"] if value is None else value)


@pytest.mark.parametrize(
    ("event", "value", "errors"),
    [
        ({**BASE, "when": dt.datetime(2018, 4, 26, 12, 48, 9, tzinfo=dt.UTC)}, "2018-04-26T12:48:09Z", []),
        ({**BASE, "when": dt.datetime(2018, 4, 26, 14, 48, 9, tzinfo=dt.timezone(dt.timedelta(hours=2)))},
         "2018-04-26T14:48:09+02:00", []),
        ({**BASE, "when": b"\x00\x01"}, "AAE=", []),
        ({**BASE, "when": 2**40}, "1099511627776", []),  # beyond 32 bits: represented as a String
        ({**BASE, "when": None}, False, [ErrorKind.MISSING_ATTRIBUTE]),  # None means absent
    ],
)
def test_other_attribute_values_are_strings(event: Mapping[str, object], value: object,
                                            errors: list[ErrorKind]) -> None:
    assert run("when", event) == (value, errors)


def test_wide_integer_attribute_is_not_an_integer() -> None:
    assert run("big + 1", {**BASE, "big": 2**40}) == (1, [ErrorKind.CAST])  # the cast default 0, plus 1
    assert run("IS_INT(big)", {**BASE, "big": 2**40}) == (False, [])


def test_data_is_not_accessible() -> None:
    event = {**BASE, "data": "payload"}
    assert run("data = 'payload'", event) == (False, [ErrorKind.MISSING_ATTRIBUTE])
    assert run("EXISTS data", event) == (False, [])


def test_required_attributes_always_exist_but_optional_ones_are_checked() -> None:
    assert run("EXISTS id AND EXISTS specversion", {}) == (True, [])
    assert run("EXISTS subject", {**BASE, "subject": None}) == (False, [])
    assert run("EXISTS subject", HEADERS) == (True, [])


@pytest.mark.parametrize(
    ("text", "value", "errors"),
    [
        ("2147483647 + 1", 2147483647, [ErrorKind.MATH]),
        ("-2147483648 - 1", -2147483648, [ErrorKind.MATH]),
        ("65536 * 65536", 2147483647, [ErrorKind.MATH]),
        ("-2147483648 / -1", 2147483647, [ErrorKind.MATH]),
        ("-(-2147483648)", 2147483647, [ErrorKind.MATH]),
        ("-7 / 2", -3, []),  # rounded towards zero
        ("-7 % 3", -1, []),  # the sign of the dividend
        ("7 % -3", 1, []),
        ("(2147483647 + 1) = 0", False, [ErrorKind.MATH]),  # an error inside: the zero value of the whole
        ("1 / 0 = 0", False, [ErrorKind.MATH]),
        ("'abc' + 1", 1, [ErrorKind.CAST]),  # the outermost operator's own cast error: its value with the default
        ("'abc' + 'def'", 0, [ErrorKind.CAST, ErrorKind.CAST]),
        ("NOT NOT 10", False, [ErrorKind.CAST]),
        ("1 = TRUE", False, [ErrorKind.CAST]),  # an Integer is not implicitly a Boolean (as NOT 10 in the TCK)
        ("TRUE = 1", True, []),  # ... but a Boolean is an Integer
        ("BOOL(10)", True, []),
        ("UNKNOWN(1)", False, [ErrorKind.MISSING_FUNCTION]),
        ("LENGTH('a', 'b')", False, [ErrorKind.MISSING_FUNCTION]),
        ("LENGTH(UNKNOWN())", 0, [ErrorKind.MISSING_FUNCTION]),
        ("1 IN ('x', 1)", True, [ErrorKind.CAST]),
        ("SUBSTRING('abc', 2, -1)", "", [ErrorKind.FUNCTION_EVALUATION]),
        ("TRIM('\u2003 a\u001f')", "a\u001f", []),  # Unicode white space only, not control characters
        ("CONCAT_WS('-', 'a', 1, TRUE)", "a-1-true", []),
        ("RIGHT('abc', 0)", "", []),
        ("UPPER('straße')", "STRASSE", []),
    ],
)
def test_values_and_errors(text: str, value: object, errors: list[ErrorKind]) -> None:
    assert run(text, BASE) == (value, errors)


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("abc", ["abc"], ["abcd", "ab", ""]),
        ("https://%", ["https://x", "https://"], ["http://x"]),
        ("%.error", ["com.error", ".error"], ["com.errors"]),
        ("%shop%", ["shop", "my-shop-1"], ["sho"]),
        ("%", ["", "anything"], []),
        ("", [""], ["a"]),
        ("a%b%c", ["abc", "a-b-c"], ["acb"]),
        ("a_c", ["abc", "a\nc"], ["ac", "abbc"]),
        ("a\\%b", ["a%b"], ["azb"]),
        ("%a\\_b", ["xa_b"], ["xazb"]),
        ("100\\%", ["100%"], ["1000"]),
        ("\\%", ["%"], ["", "a"]),  # an escaped wildcard alone is a literal, not a wildcard
        ("\\_%", ["_", "_x"], ["x"]),
        ("%\\%%", ["%", "a%b"], ["ab"]),
        ("a.*(_", ["a.*(x"], ["ab*(x", "a.*("]),  # regex characters are literal
    ],
)
def test_like_shapes(pattern: str, yes: list[str], no: list[str]) -> None:
    escaped = pattern.replace("'", "\\'")
    expr, negated = compile_expression(f"s LIKE '{escaped}'"), compile_expression(f"s NOT LIKE '{escaped}'")
    for text in yes:
        assert expr.matches({"s": text}), text
        assert not negated.matches({"s": text}), text
    for text in no:
        assert not expr.matches({"s": text}), text
        assert negated.matches({"s": text}), text
    assert expr.evaluate({}) == (False, expr.evaluate({}).errors)
    assert [e.kind for e in expr.evaluate({}).errors] == [ErrorKind.MISSING_ATTRIBUTE]


@pytest.mark.parametrize(
    ("text", "event", "value", "errors"),
    [
        ("t IN ('a', 'b')", {"t": "b"}, True, []),  # String attribute: a set lookup
        ("t IN ('a', 1)", {"t": "1"}, True, []),
        ("t IN ('a', 1)", {"t": 1}, True, [ErrorKind.CAST]),  # Integer attribute: in order, 'a' fails to cast
        ("t IN (1, 'a')", {"t": 1}, True, []),  # ... stopping at the first equal one
        ("t IN (TRUE)", {"t": True}, True, []),
        ("t IN (u, 'x')", {"t": "q", "u": "q"}, True, []),  # attributes in the set
        ("t IN (u, 'x')", {"t": 5, "u": "5"}, True, []),
        ("t IN (u, 'x')", {"t": "q"}, False, [ErrorKind.MISSING_ATTRIBUTE]),
        ("t NOT IN ('a', 'b')", {"t": "c"}, True, []),
        ("1 IN (t, 2)", {"t": "1"}, True, []),  # static left type, attribute items
        ("'a' IN (t)", {"t": 5}, False, []),
        ("t IN ('a')", {}, False, [ErrorKind.MISSING_ATTRIBUTE]),
        ("t = u", {"t": "1", "u": 1}, True, []),  # the right operand's type decides, per event
        ("t = u", {"t": "x", "u": 1}, False, [ErrorKind.CAST]),
        ("'TRUE' = u", {"u": True}, True, []),
        ("t != u", {"t": "a", "u": "b"}, True, []),
    ],
)
def test_in_and_equality_with_attributes(text: str, event: Mapping[str, object], value: object,
                                          errors: list[ErrorKind]) -> None:
    assert run(text, event) == (value, errors)


def test_short_circuit_skips_errors() -> None:
    assert run("FALSE AND missing", {}) == (False, [])
    assert run("TRUE OR 1 / 0 = 1", {}) == (True, [])
    assert run("EXISTS subject AND LENGTH(subject) > 3", BASE) == (False, [])


def test_matches_is_boolean_true_without_errors() -> None:
    assert compile_expression("type = 'com.example.created'").matches(BASE)
    assert not compile_expression("type = 'other'").matches(BASE)
    assert not compile_expression("missing = 'x' OR TRUE").matches(BASE)  # an error: no match
    assert not compile_expression("NOT 10").matches(BASE)  # true, but with a cast error
    assert not compile_expression("'true'").matches(BASE)  # a String, not a Boolean
    assert not compile_expression("1").matches(BASE)
    assert compile_expression("flag").matches(TYPED)
    assert not compile_expression("flag").matches(HEADERS)  # the String 'TRUE' is not the Boolean true


class Exploding(Mapping[str, object]):
    """An event mapping whose reads fail in ways a real one might."""

    def __getitem__(self, key: str) -> object:
        raise RuntimeError("header decoding failed")

    def get(self, key: str, default: object = None) -> object:
        raise RuntimeError("header decoding failed")

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_evaluation_never_raises_out_of_the_engine() -> None:
    expr = compile_expression("type = 'x' AND EXISTS subject")
    result = expr.evaluate(Exploding())
    assert result.value is False
    assert [error.kind for error in result.errors] == [ErrorKind.GENERIC]
    assert expr.matches(Exploding()) is False


def test_public_api() -> None:
    expr = compile_expression("type = 'com.example.created' AND EXISTS subject")
    assert isinstance(expr, Expression)
    assert expr.text == "type = 'com.example.created' AND EXISTS subject"
    result = expr.evaluate(HEADERS)
    assert isinstance(result, Result)
    assert result == Result(True, ())
    failed = compile_expression("LEFT(subject, -1)").evaluate(HEADERS)
    assert failed.value == "order-42"
    assert all(isinstance(error, CesqlError) and error.message for error in failed.errors)
    assert str(failed.errors[0]).startswith("functionEvaluation: ")
    assert {kind.value for kind in ErrorKind} >= {"parse", "math", "cast", "missingFunction", "functionEvaluation",
                                                  "missingAttribute"}


def test_expressions_pickle_as_their_text() -> None:
    expr = compile_expression("seq > 5 AND source LIKE 'https://%'")
    copy = pickle.loads(pickle.dumps(expr))
    assert copy.text == expr.text
    assert copy.evaluate(HEADERS) == expr.evaluate(HEADERS) == Result(True, ())


def test_compiled_code_folds_constants_and_reads_attributes_inline() -> None:
    expr = compile_expression("type = CONCAT('com.', 'example') AND 2 * 3 = 6")
    assert "CONCAT" not in expr.source and "'com.example'" in expr.source
    assert "e['type']" in expr.source
    assert "_divide(1, 0, None)" in compile_expression("1 / 0").source  # the error is not folded away


@pytest.mark.parametrize("text", ["TRUE IN (EXISTS type LIKE '%')", "TRUE = (EXISTS type LIKE '%')"])
def test_a_like_of_only_a_percent_sign_compares_as_one_boolean(text: str) -> None:
    # Found by the reference-interpreter property: Python chains `==` and `is`, so an unparenthesised
    # `x.__class__ is str` inside a comparison compared the wrong things.
    assert compile_expression(text).evaluate({}).value is True
