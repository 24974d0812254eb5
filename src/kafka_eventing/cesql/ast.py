"""The syntax tree of a CESQL expression and its canonical printer.

The parser builds these nodes; the compiler turns them into Python code. ``to_text`` prints a tree back as CESQL in
one canonical spelling (upper-case keywords and function names, lower-case identifiers, every compound operand in
parentheses), so that ``parse(to_text(tree)) == tree`` for every tree the parser builds.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Binary operators, by their canonical spelling (``<>`` is parsed as ``!=``).
ARITHMETIC_OPS = frozenset({"*", "/", "%", "+", "-"})
ORDER_OPS = frozenset({"<", "<=", ">", ">="})
EQUALITY_OPS = frozenset({"=", "!="})
LOGIC_OPS = frozenset({"AND", "OR", "XOR"})


@dataclass(frozen=True, slots=True)
class BoolLit:
    value: bool


@dataclass(frozen=True, slots=True)
class IntLit:
    value: int


@dataclass(frozen=True, slots=True)
class StrLit:
    value: str
    #: The quote the literal was written with: it decides which escapes the value can be printed with.
    quote: str = "'"


@dataclass(frozen=True, slots=True)
class Attribute:
    """A context attribute or extension, by its lower-case name."""

    name: str


@dataclass(frozen=True, slots=True)
class Exists:
    name: str


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class Negate:
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: StrLit
    negated: bool = False


@dataclass(frozen=True, slots=True)
class In:
    operand: Node
    items: tuple[Node, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """A function invocation; ``name`` is upper-case (function names are case-insensitive)."""

    name: str
    args: tuple[Node, ...]


Literal = BoolLit | IntLit | StrLit
Node = BoolLit | IntLit | StrLit | Attribute | Exists | Not | Negate | Binary | Like | In | Call


def children(node: Node) -> tuple[Node, ...]:
    match node:
        case Not(operand) | Negate(operand) | Like(operand):
            return (operand,)
        case Binary(_, left, right):
            return (left, right)
        case In(operand, items):
            return (operand, *items)
        case Call(_, args):
            return args
    return ()


def depth(node: Node) -> int:
    """How deeply the tree nests (a literal is 1), without recursion."""
    deepest, todo = 0, [(node, 1)]
    while todo:
        current, level = todo.pop()
        deepest = max(deepest, level)
        todo.extend((child, level + 1) for child in children(current))
    return deepest


# -- printing ------------------------------------------------------------------------------------------------


def quote_string(value: str, quote: str = "'") -> str:
    """A string literal for ``value``: only the delimiting quote is escaped (``\\'`` or ``\\"``), as the spec says."""
    return quote + value.replace(quote, "\\" + quote) + quote


def _operand(node: Node) -> str:
    """A sub-expression as an operand: compound expressions get parentheses, so the printed text needs no
    precedence rules to read back."""
    text = to_text(node)
    return f"({text})" if isinstance(node, Binary | Like | In) else text


def to_text(node: Node) -> str:
    """The canonical CESQL text of ``node``."""
    match node:
        case BoolLit(value):
            return "TRUE" if value else "FALSE"
        case IntLit(value):
            return str(value)
        case StrLit(value, quote):
            return quote_string(value, quote)
        case Attribute(name):
            return name
        case Exists(name):
            return f"EXISTS {name}"
        case Not(operand):
            return f"NOT {_operand(operand)}"
        case Negate(operand):
            # -(5) is minus applied to 5; -5 would read back as the literal -5.
            inner = f"({to_text(operand)})" if isinstance(operand, IntLit) else _operand(operand)
            return f"-{inner}"
        case Binary(op, left, right):
            return f"{_operand(left)} {op} {_operand(right)}"
        case Like(operand, pattern, negated):
            return f"{_operand(operand)} {'NOT LIKE' if negated else 'LIKE'} {to_text(pattern)}"
        case In(operand, items, negated):
            listed = ", ".join(to_text(item) for item in items)
            return f"{_operand(operand)} {'NOT IN' if negated else 'IN'} ({listed})"
        case Call(name, args):
            return f"{name}({', '.join(to_text(arg) for arg in args)})"
    raise TypeError(f"not a CESQL node: {node!r}")
