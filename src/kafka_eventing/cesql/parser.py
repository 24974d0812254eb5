"""Text → syntax tree, with lark's LALR(1) parser on the grammar in ``cesql.lark``.

The tree is built while parsing (lark calls the transformer per reduction), so no parse tree is kept. Every
problem — bad characters, unexpected tokens, an identifier or function name spelled against the spec's rules, an
integer literal outside 32 bits — becomes a ``CesqlParseError`` naming the line and column.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import lark
from lark import Lark, Token, Transformer

from kafka_eventing.cesql import ast
from kafka_eventing.cesql.errors import CesqlParseError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1

#: Deeper trees are refused: evaluation compiles to Python code, whose own parser limits nesting.
MAX_DEPTH = 64

KEYWORDS = frozenset({"AND", "OR", "XOR", "NOT", "LIKE", "IN", "EXISTS", "TRUE", "FALSE"})
# Attribute names: ASCII letters and digits (CloudEvents naming convention; upper case is read as lower case, as
# the Go and Java engines do). Function names: a letter, then letters and underscores (CESQLLexer.g4).
_IDENTIFIER = re.compile(r"[A-Za-z0-9]+")
_FUNCTION_NAME = re.compile(r"[A-Za-z][A-Za-z_]*")

# How the parser's terminals read in an error message.
_TERMINAL_TEXT = {
    "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "EQ": "'='", "NE": "'!='", "LTGT": "'<>'", "LE": "'<='",
    "GE": "'>='", "LT": "'<'", "GT": "'>'", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'",
    "PERCENT": "'%'", "INT": "an integer", "NAME": "a name", "SQ_STRING": "a string", "DQ_STRING": "a string",
    "$END": "the end",
}


def _error(message: str, token: Token | None) -> CesqlParseError:
    if token is None:
        return CesqlParseError(message)
    return CesqlParseError(message, token.line, token.column)


def _check_identifier(token: Token) -> str:
    text = str(token)
    if text.upper() in KEYWORDS:
        raise _error(f"the keyword {text.upper()} cannot be used as an attribute name", token)
    if not _IDENTIFIER.fullmatch(text):
        raise _error(f"{text!r} is not an attribute name (only letters a-z and digits 0-9)", token)
    return text.lower()


class _ToAst(Transformer[Token, ast.Node]):
    """Builds ``ast`` nodes bottom-up; lark calls one method per grammar alternative (by its ``->`` alias)."""

    def logic(self, items: list[Any]) -> ast.Node:
        left, op, right = items
        return ast.Binary(str(op).upper(), left, right)

    def binary(self, items: list[Any]) -> ast.Node:
        left, op, right = items
        text = str(op)
        return ast.Binary("!=" if text == "<>" else text, left, right)

    def like(self, items: list[Any]) -> ast.Node:
        operand, negated, _like, pattern = items
        return ast.Like(operand, pattern, negated is not None)

    def in_set(self, items: list[Any]) -> ast.Node:
        operand, negated, _in, *elements = items
        return ast.In(operand, tuple(elements), negated is not None)

    def not_(self, items: list[Any]) -> ast.Node:
        return ast.Not(items[1])

    def negate(self, items: list[Any]) -> ast.Node:
        return ast.Negate(items[1])

    def call(self, items: list[Any]) -> ast.Node:
        name_token, *args = items
        name = str(name_token)
        if name.upper() in KEYWORDS:
            raise _error(f"the keyword {name.upper()} cannot be used as a function name", name_token)
        if not _FUNCTION_NAME.fullmatch(name):
            raise _error(f"{name!r} is not a function name (a letter, then letters and '_')", name_token)
        # `f()` gives one None placeholder for the empty optional argument list.
        return ast.Call(name.upper(), tuple(arg for arg in args if arg is not None))

    def exists(self, items: list[Any]) -> ast.Node:
        return ast.Exists(_check_identifier(items[1]))

    def attribute(self, items: list[Any]) -> ast.Node:
        return ast.Attribute(_check_identifier(items[0]))

    def integer(self, items: list[Any]) -> ast.Node:
        token = items[0]
        value = int(token)
        if not INT_MIN <= value <= INT_MAX:
            raise _error(f"integer literal {token} is outside the 32-bit range", token)
        return ast.IntLit(value)

    def true(self, _items: list[Any]) -> ast.Node:
        return ast.BoolLit(True)

    def false(self, _items: list[Any]) -> ast.Node:
        return ast.BoolLit(False)

    def string(self, items: list[Any]) -> ast.StrLit:
        text = str(items[0])
        quote = text[0]
        return ast.StrLit(text[1:-1].replace("\\" + quote, quote), quote)


@functools.cache
def _parser() -> Lark:
    grammar = resources.files("kafka_eventing.cesql").joinpath("cesql.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", transformer=_ToAst(), maybe_placeholders=True, propagate_positions=False)


def _at_end(text: str, message: str) -> CesqlParseError:
    line = text.count("\n") + 1
    return CesqlParseError(message, line, len(text) - (text.rfind("\n") + 1) + 1)


def _describe(expected: set[str] | frozenset[str]) -> str:
    names = sorted({_TERMINAL_TEXT.get(name, name if name.isupper() else repr(name)) for name in expected})
    return ", ".join(names)


def parse(text: str) -> ast.Node:
    """Parse a CESQL expression into its syntax tree; raises ``CesqlParseError``."""
    try:
        tree: ast.Node = _parser().parse(text)  # type: ignore[assignment] # the transformer builds ast nodes
    except CesqlParseError:
        raise
    except lark.exceptions.UnexpectedCharacters as exc:
        raise CesqlParseError(f"unexpected character {exc.char!r}", exc.line, exc.column) from None
    except lark.exceptions.UnexpectedEOF as exc:
        raise _at_end(text, f"unexpected end of expression; expected {_describe(set(exc.expected))}") from None
    except lark.exceptions.UnexpectedToken as exc:
        token = exc.token
        if token.type == "$END":
            raise _at_end(text, f"unexpected end of expression; expected {_describe(exc.expected)}") from None
        raise _error(f"unexpected {str(token)!r}; expected {_describe(exc.expected)}", token) from None
    except lark.exceptions.VisitError as exc:  # a transformer check, wrapped by lark
        if isinstance(exc.orig_exc, CesqlParseError):
            raise exc.orig_exc from None
        raise
    if ast.depth(tree) > MAX_DEPTH:
        raise CesqlParseError(f"the expression nests deeper than {MAX_DEPTH} levels")
    return tree
