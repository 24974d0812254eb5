"""The grammar: precedence and associativity as CESQLParser.g4 sets them, literals, names, and parse errors."""

from __future__ import annotations

import pytest

from kafka_eventing.cesql import CesqlError, CesqlParseError, ErrorKind, compile_expression
from kafka_eventing.cesql.ast import (
    Attribute,
    Binary,
    BoolLit,
    Call,
    Exists,
    In,
    IntLit,
    Like,
    Negate,
    Not,
    StrLit,
    to_text,
)
from kafka_eventing.cesql.parser import MAX_DEPTH, parse

a, b, c = Attribute("a"), Attribute("b"), Attribute("c")


@pytest.mark.parametrize(
    ("text", "tree"),
    [
        # AND, OR and XOR share one level and group to the right (`<assoc=right>` in the .g4).
        ("a AND b OR c", Binary("AND", a, Binary("OR", b, c))),
        ("a or b and c", Binary("OR", a, Binary("AND", b, c))),
        ("a XOR b AND c", Binary("XOR", a, Binary("AND", b, c))),
        # comparisons bind tighter than logic, arithmetic tighter than comparisons, left to right
        ("a = 1 AND b", Binary("AND", Binary("=", a, IntLit(1)), b)),
        ("1 + 2 * 3 - 4", Binary("-", Binary("+", IntLit(1), Binary("*", IntLit(2), IntLit(3))), IntLit(4))),
        ("a - b - c", Binary("-", Binary("-", a, b), c)),
        ("a / b % c", Binary("%", Binary("/", a, b), c)),
        ("a < b = c", Binary("=", Binary("<", a, b), c)),
        # prefix operators bind tightest: NOT a = b is (NOT a) = b
        ("NOT a = b", Binary("=", Not(a), b)),
        ("-a * b", Binary("*", Negate(a), b)),
        ("NOT EXISTS a", Not(Exists("a"))),
        # LIKE / IN are postfix, tighter than arithmetic
        ("a + b LIKE 'x'", Binary("+", a, Like(b, StrLit("x")))),
        ("a IN (1) LIKE 'x'", Like(In(a, (IntLit(1),)), StrLit("x"))),
        ("NOT a LIKE 'x'", Like(Not(a), StrLit("x"))),
        ("a NOT LIKE 'x'", Like(a, StrLit("x"), negated=True)),
        ("a not in (b, 'c')", In(a, (b, StrLit("c")), negated=True)),
        # signed literals where an operand starts; binary minus elsewhere
        ("5-3", Binary("-", IntLit(5), IntLit(3))),
        ("4 -1", Binary("-", IntLit(4), IntLit(1))),
        ("-2147483648", IntLit(-2147483648)),
        ("+7", IntLit(7)),
        ("--5", Negate(IntLit(-5))),
        ("- 5", Negate(IntLit(5))),
        # keywords case-insensitive, identifiers read lower-case, function names upper-case
        ("tRuE XoR FaLsE", Binary("XOR", BoolLit(True), BoolLit(False))),
        ("EXISTS SOURCE", Exists("source")),
        ("MyExt1", Attribute("myext1")),
        ("android", Attribute("android")),
        ("concat_ws(',', a)", Call("CONCAT_WS", (StrLit(","), a))),
        ("f ( )", Call("F", ())),
        ("a <> b", Binary("!=", a, b)),
        # strings: both quotes; only the delimiting quote is unescaped, other backslash pairs stay as written
        ("'a\"b\\'c'", StrLit("a\"b'c")),
        ('"a\'b\\"c"', StrLit("a'b\"c", '"')),
        ("'ab\\c'", StrLit("ab\\c")),
        ("'a\\%'", StrLit("a\\%")),
        ("'multi\nline'", StrLit("multi\nline")),
        ("(((a)))", a),
    ],
)
def test_parse(text: str, tree: object) -> None:
    assert parse(text) == tree
    assert parse(to_text(parse(text))) == tree


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("ABC(", "line 1, column 5", "unexpected end of expression"),
        ("x LIKE 123", "line 1, column 8", "expected a string"),
        ("x LIKE y", "line 1, column 8", "expected a string"),
        ("2147483648", "line 1, column 1", "outside the 32-bit range"),
        ("-2147483649", "line 1, column 1", "outside the 32-bit range"),
        ("my_ext = 1", "line 1, column 1", "not an attribute name"),
        ("f1(2)", "line 1, column 1", "not a function name"),
        ("and = 1", "line 1, column 1", "keyword AND"),
        ("EXISTS in", "line 1, column 8", "keyword IN"),
        ("a = 'open", "line 1, column 5", "unexpected character"),
        ("a\n  # b", "line 2, column 3", "unexpected character '#'"),
        ("1 2", "line 1, column 3", "unexpected '2'"),
        ("x IN ()", "line 1, column 7", "unexpected ')'"),
        ("", "line 1, column 1", "unexpected end"),
        ("a AND", "line 1, column 6", "unexpected end"),
    ],
)
def test_parse_errors_name_the_position(text: str, where: str, says: str) -> None:
    with pytest.raises(CesqlParseError) as caught:
        compile_expression(text)
    error = caught.value
    assert isinstance(error, CesqlError)
    assert error.kind is ErrorKind.PARSE
    assert where in str(error)
    assert says in str(error)


def test_nesting_is_bounded() -> None:
    deep = "(" * MAX_DEPTH + "NOT " * MAX_DEPTH + "TRUE" + ")" * MAX_DEPTH
    with pytest.raises(CesqlParseError, match="deeper than"):
        compile_expression(deep)
    ok = "NOT " * (MAX_DEPTH - 1) + "TRUE"
    assert compile_expression(ok).evaluate({}).value is ((MAX_DEPTH - 1) % 2 == 0)


def test_canonical_text() -> None:
    text = "not a aNd b <> 'x' or -(5) + - c * -3 in (1, \"q\") and x like '%.y' and f(1,2)"
    assert to_text(parse(text)) == (
        "NOT a AND ((b != 'x') OR ((-(5) + (-c * (-3 IN (1, \"q\")))) AND ((x LIKE '%.y') AND F(1, 2))))"
    )
