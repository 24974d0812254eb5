"""Syntax tree → Python code, compiled once per expression.

Types are checked and every cast the spec calls for is decided at compile time: an operand whose type is known is
converted by code chosen for that pair of types, a literal is converted right away, and only an attribute (whose
type is known per event) is tested at run time — inline, with the common case (already the wanted type) costing one
class check. Constant sub-expressions are folded. The result is a Python function per mode:

* ``matches(event)``: the filter's question, "is the value Boolean true with no error". Any error stops the
  evaluation (the spec's fail-fast mode, §4.1); nothing is allocated on the way.
* ``evaluate(event)``: value and errors. It runs the same fail-fast code. An error in a sub-expression makes the
  whole expression take the zero value of its type with that error (spec §3.2, §3.3), which is what the
  conformance suite expects (``true AND (1 != 1/0)`` is ``false`` with a math error). An error of the outermost
  operator itself gives the value the spec defines for it (``ABS(-2147483648)`` is ``2147483647`` with a math
  error): for that, when the fail-fast code stopped, a second variant runs in which the outermost operator
  reports its own errors and carries on. It is generated only for operators that can have errors.

Attribute reads are ``event[name]``: a missing one raises ``KeyError``, which the caller turns into a
MissingAttributeError.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from kafka_eventing.cesql import _runtime as rt
from kafka_eventing.cesql import ast
from kafka_eventing.cesql.errors import CesqlError, CesqlParseError, ErrorKind
from kafka_eventing.cesql.functions import Type, resolve
from kafka_eventing.cesql.parser import parse

Event = Mapping[str, object]
Value = bool | int | str

#: The CloudEvents attributes every valid event has: ``EXISTS`` is always true for them (spec §3.4.4).
REQUIRED_ATTRIBUTES = frozenset({"specversion", "id", "source", "type"})

_PY_TYPE: dict[Type, type] = {Type.BOOLEAN: bool, Type.INTEGER: int, Type.STRING: str}
_TYPE_OF: dict[type, Type] = {bool: Type.BOOLEAN, int: Type.INTEGER, str: Type.STRING}
#: The zero value of each type; an expression of unknown type defaults to Boolean (spec §3.2).
ZERO: dict[Type, Value] = {Type.BOOLEAN: False, Type.INTEGER: 0, Type.STRING: "", Type.ANY: False}

# The helpers generated code calls, by the names it uses.
_HELPERS: dict[str, object] = {
    "_value": rt.value, "_cast": rt.cast, "_as_str": rt.as_str, "_as_int": rt.as_int,
    "_as_bool": rt.as_bool, "_int_of_str": rt.int_of_str, "_bool_of_str": rt.bool_of_str,
    "_implicit_bool_of_int": rt.implicit_bool_of_int, "_overflow": rt.overflow, "_divide": rt.divide,
    "_modulo": rt.modulo, "_equals": rt.equals, "_in_equals": rt.in_equals, "_member": rt.member,
    "_no_function": rt.no_function, "_no_data": rt.no_data, "_WHITESPACE": rt.WHITESPACE, "_left": rt.left,
    "_right": rt.right, "_substring": rt.substring, "_substring_length": rt.substring_length, "_abs": rt.abs_,
    "_int_fn": rt.int_fn, "_bool_fn": rt.bool_fn, "_string_of": rt.string_of, "_is_bool": rt.is_bool,
    "_is_int": rt.is_int,
}

_NO_VALUE: Any = object()
#: Suffixes for the names generated code binds (temporaries, constants); unique across all compilations, so that
#: generators sharing a namespace never collide.
_NAMES = itertools.count()


@dataclass(frozen=True)
class _Code:
    """A sub-expression compiled to a Python expression."""

    src: str
    type: Type
    #: The value, when it is known at compile time (a literal or a folded constant).
    const: Any = _NO_VALUE
    #: For an attribute read: its name (the run-time casts name it when it is missing).
    attribute: str | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not _NO_VALUE


def _literal(val: Value) -> _Code:
    return _Code(repr(val), _TYPE_OF[val.__class__], const=val)


@dataclass
class _Generator:
    """Emits the Python expression for a tree. ``tolerant`` is the ``evaluate`` fallback's variant, in which the
    outermost operator reports its errors to the list ``_R`` instead of raising."""

    namespace: dict[str, object]
    tolerant: bool

    @staticmethod
    def _temp() -> str:
        return f"_t{next(_NAMES)}"

    def _const_name(self, val: object) -> str:
        name = f"_k{next(_NAMES)}"
        self.namespace[name] = val
        return name

    # -- entry points ----------------------------------------------------------------------------------------

    def root(self, node: ast.Node) -> _Code:
        code = self.emit(node, "_R" if self.tolerant else "None")
        return _Code(self.value_of(code), code.type) if code.type is Type.ANY else code

    # -- casts -----------------------------------------------------------------------------------------------

    def value_of(self, code: _Code) -> str:
        """An attribute's run-time value, normalised to bool/int/str; other codes as they are."""
        if code.type is not Type.ANY:
            return code.src
        t = self._temp()
        return f"({t} if ({t} := {code.src}).__class__ is str else _value({t}, {code.attribute!r}))"

    def cast(self, code: _Code, target: Type, errs: str) -> _Code:
        """``code`` implicitly cast to ``target`` by the operator that owns ``errs``."""
        if target is Type.ANY:
            return _Code(self.value_of(code), code.type)
        if code.type is target:
            return code
        if code.is_const:
            try:
                return _literal(rt.cast(code.const, _PY_TYPE[target], None))
            except rt.Fail:
                return _Code(f"_cast({code.src}, {_PY_TYPE[target].__name__}, {errs})", target)
        src = code.src
        if code.type is Type.ANY:
            t, name = self._temp(), code.attribute
            bound = f"({t} := {src})"
            check = {
                Type.STRING: f"{bound}.__class__ is str",
                Type.INTEGER: f"{bound}.__class__ is int and -2147483648 <= {t} <= 2147483647",
                Type.BOOLEAN: f"{bound}.__class__ is bool",
            }[target]
            helper = {Type.STRING: "_as_str", Type.INTEGER: "_as_int", Type.BOOLEAN: "_as_bool"}[target]
            return _Code(f"({t} if {check} else {helper}({t}, {name!r}, {errs}))", target)
        converted = {
            (Type.INTEGER, Type.STRING): f"str({src})",
            (Type.BOOLEAN, Type.STRING): f"('true' if {src} else 'false')",
            (Type.BOOLEAN, Type.INTEGER): f"(1 if {src} else 0)",
            (Type.STRING, Type.INTEGER): f"_int_of_str({src}, {errs})",
            (Type.STRING, Type.BOOLEAN): f"_bool_of_str({src}, {errs})",
            (Type.INTEGER, Type.BOOLEAN): f"_implicit_bool_of_int({src}, {errs})",
        }[(code.type, target)]
        return _Code(converted, target)

    def operand(self, node: ast.Node, target: Type, errs: str) -> str:
        return self.cast(self.emit(node), target, errs).src

    # -- nodes -----------------------------------------------------------------------------------------------

    def emit(self, node: ast.Node, errs: str = "None") -> _Code:
        """``node`` compiled; its own errors go to the list named ``errs`` ("None": raise)."""
        match node:
            case ast.BoolLit(val) | ast.IntLit(val) | ast.StrLit(val):
                return _literal(val)
            case ast.Attribute(name):
                if name == "data":
                    return _Code("_no_data()", Type.ANY, attribute=name)
                return _Code(f"e[{name!r}]", Type.ANY, attribute=name)
            case ast.Exists(name):
                if name in REQUIRED_ATTRIBUTES or name == "data":
                    return _literal(name != "data")
                return _Code(f"(e.get({name!r}) is not None)", Type.BOOLEAN)
            case ast.Not(operand):
                return _Code(f"(not {self.operand(operand, Type.BOOLEAN, errs)})", Type.BOOLEAN)
            case ast.Negate(operand):
                t = self._temp()
                src = self.operand(operand, Type.INTEGER, errs)
                return _Code(f"(-{t} if ({t} := {src}) != -2147483648 else _overflow(2147483648, {errs}))",
                             Type.INTEGER)
            case ast.Binary(op, left, right):
                return self._binary(op, left, right, errs)
            case ast.Like(operand, pattern, negated):
                return self._like(self.operand(operand, Type.STRING, errs), pattern.value, negated)
            case ast.In(operand, items, negated):
                code = self._in(self.emit(operand), [self.emit(item) for item in items], errs)
                return _Code(f"(not {code.src})", Type.BOOLEAN) if negated else code
            case ast.Call(name, args):
                return self._call(name, args, errs)
        raise TypeError(f"not a CESQL node: {node!r}")

    def _binary(self, op: str, left: ast.Node, right: ast.Node, errs: str) -> _Code:
        if op in ast.LOGIC_OPS:
            lsrc, rsrc = self.operand(left, Type.BOOLEAN, errs), self.operand(right, Type.BOOLEAN, errs)
            python_op = {"AND": "and", "OR": "or", "XOR": "!="}[op]
            return _Code(f"({lsrc} {python_op} {rsrc})", Type.BOOLEAN)
        if op in ast.ORDER_OPS:
            lsrc, rsrc = self.operand(left, Type.INTEGER, errs), self.operand(right, Type.INTEGER, errs)
            return _Code(f"({lsrc} {op} {rsrc})", Type.BOOLEAN)
        if op in ast.EQUALITY_OPS:
            python_op = "==" if op == "=" else "!="
            lcode, rcode = self.emit(left), self.emit(right)
            if rcode.is_const:
                # The common `attribute = 'literal'`: the left operand cast inline to the literal's type.
                lsrc = self.cast(lcode, rcode.type, errs).src
                return _Code(f"({lsrc} {python_op} {rcode.src})", Type.BOOLEAN)
            # Otherwise both operands are evaluated first, then the left is cast to the right's type (spec §3.7),
            # which for an attribute is known per event only.
            call = f"_equals({self.value_of(lcode)}, {self.value_of(rcode)}, {errs})"
            return _Code(call if op == "=" else f"(not {call})", Type.BOOLEAN)
        lsrc, rsrc = self.operand(left, Type.INTEGER, errs), self.operand(right, Type.INTEGER, errs)
        if op in ("/", "%"):
            return _Code(f"{'_divide' if op == '/' else '_modulo'}({lsrc}, {rsrc}, {errs})", Type.INTEGER)
        t = self._temp()
        return _Code(f"({t} if -2147483648 <= ({t} := {lsrc} {op} {rsrc}) <= 2147483647 else _overflow({t}, {errs}))",
                     Type.INTEGER)

    def _like(self, src: str, pattern: str, negated: bool) -> _Code:
        # The common shapes become string methods; the rest a regular expression.
        parts = rt.like_parts(pattern)
        literals = [part for part in parts if isinstance(part, str)]
        wildcards = len(parts) - len(literals)
        any_, one = rt.Wildcard.ANY, rt.Wildcard.ONE
        if one in parts or len(literals) > 1 or wildcards > 2:
            test = f"({self._const_name(rt.like_regex(parts).fullmatch)}({src}) is not None)"
        elif not parts:
            test = f"({src} == '')"
        elif not wildcards:
            test = f"({src} == {literals[0]!r})"
        elif not literals:  # only '%': anything matches, but the operand is still evaluated
            test = f"(({src}).__class__ is str)"
        elif parts == [literals[0], any_]:
            test = f"{src}.startswith({literals[0]!r})"
        elif parts == [any_, literals[0]]:
            test = f"{src}.endswith({literals[0]!r})"
        elif parts == [any_, literals[0], any_]:
            test = f"({literals[0]!r} in {src})"
        else:
            test = f"({self._const_name(rt.like_regex(parts).fullmatch)}({src}) is not None)"
        return _Code(f"(not {test})" if negated else test, Type.BOOLEAN)

    def _in(self, left: _Code, items: list[_Code], errs: str) -> _Code:
        t = self._temp()
        if left.type is Type.ANY:
            if all(item.is_const for item in items):
                # A String left operand (the common case) casts every literal to String, which cannot fail, so a
                # set lookup decides; other types compare in order, as the casts may fail.
                as_strings = frozenset(rt.string_of(item.const) for item in items)
                consts = tuple(item.const for item in items)
                return _Code(f"({t} in {self._const_name(as_strings)} if ({t} := {left.src}).__class__ is str else "
                             f"_member(_value({t}, {left.attribute!r}), {self._const_name(consts)}, {errs}))",
                             Type.BOOLEAN)
            first, *rest = (self.value_of(item) for item in items)
            tests = [f"_in_equals(({t} := {self.value_of(left)}), {first}, {errs})"]
            tests += [f"_in_equals({t}, {src}, {errs})" for src in rest]
            return _Code(f"({' or '.join(tests)})", Type.BOOLEAN)
        cast_items = [self.cast(item, left.type, errs) for item in items]
        if all(item.is_const for item in cast_items):
            return _Code(f"({left.src} in {self._const_name(frozenset(i.const for i in cast_items))})", Type.BOOLEAN)
        first, *rest = (item.src for item in cast_items)
        tests = [f"({t} := {left.src}) == {first}", *(f"{t} == {src}" for src in rest)]
        return _Code(f"({' or '.join(tests)})", Type.BOOLEAN)

    def _call(self, name: str, args: tuple[ast.Node, ...], errs: str) -> _Code:
        function = resolve(name, len(args))
        if function is None:
            return _Code(f"_no_function({name!r}, {len(args)}, {errs})", Type.BOOLEAN)
        sources = [self.operand(arg, function.param(i), errs) for i, arg in enumerate(args)]
        return _Code(function.emit(sources, errs), function.returns)


def fold(node: ast.Node, namespace: dict[str, object]) -> ast.Node:
    """``node`` with every sub-expression that reads nothing of the event and evaluates without error replaced by
    its value. (One that fails, like ``1 / 0``, stays: its error must happen at evaluation time, in its place.)"""
    match node:
        case ast.BoolLit() | ast.IntLit() | ast.StrLit() | ast.Attribute() | ast.Exists():
            return node
        case ast.Not(operand):
            node = ast.Not(fold(operand, namespace))
        case ast.Negate(operand):
            node = ast.Negate(fold(operand, namespace))
        case ast.Binary(op, left, right):
            node = ast.Binary(op, fold(left, namespace), fold(right, namespace))
        case ast.Like(operand, pattern, negated):
            node = ast.Like(fold(operand, namespace), pattern, negated)
        case ast.In(operand, items, negated):
            node = ast.In(fold(operand, namespace), tuple(fold(item, namespace) for item in items), negated)
        case ast.Call(name, args):
            node = ast.Call(name, tuple(fold(arg, namespace) for arg in args))
    if not all(isinstance(child, ast.BoolLit | ast.IntLit | ast.StrLit) for child in ast.children(node)):
        return node
    src = _Generator(namespace, tolerant=False).emit(node).src
    try:
        val = eval(src, namespace, {})  # noqa: S307 - our own generated code; names are validated identifiers
    except rt.Fail:
        return node
    literal: ast.Node = {bool: ast.BoolLit, int: ast.IntLit, str: ast.StrLit}[val.__class__](val)
    return literal


class Result(NamedTuple):
    """An evaluation's outcome: the value (bool, int or str) and the errors met, in order (empty if none)."""

    value: Value
    errors: tuple[CesqlError, ...]


_TRUE, _FALSE = Result(True, ()), Result(False, ())


def _too_complex(why: str) -> CesqlParseError:
    # The parser's depth limit keeps ordinary expressions well below this; a defence against what slips past it.
    return CesqlParseError(f"the expression is too complex to compile ({why}); split it or use IN for long lists")


def _error_of(exc: Exception) -> CesqlError:
    """The error an evaluation stopped with: its own, a missing attribute (``event[name]`` raised KeyError), or
    whatever else the event mapping raised, as a generic error."""
    if isinstance(exc, rt.Fail):
        return exc.error
    if isinstance(exc, KeyError):
        name = exc.args[0] if exc.args else "?"
        return CesqlError(ErrorKind.MISSING_ATTRIBUTE, f"the event has no attribute {name!r}")
    return CesqlError(ErrorKind.GENERIC, f"reading the event failed: {exc!r}")


class Expression:
    """A compiled CESQL expression. Build with ``compile_expression``; use from any number of threads.

    ``matches`` and ``evaluate`` are the generated functions themselves (attributes, not methods), so a call costs
    no extra Python frame.
    """

    __slots__ = ("_fallback", "_zero", "evaluate", "matches", "source", "text", "tree", "type")

    #: True only when the expression's value is Boolean true and no error occurred (the filter's rule, spec §1.2).
    matches: Callable[[Event], bool]
    #: The value and the errors of this expression on an event (attribute name → value). Never raises.
    evaluate: Callable[[Event], Result]

    def __init__(self, text: str, tree: ast.Node) -> None:
        self.text = text
        self.tree = tree
        namespace: dict[str, object] = {**_HELPERS, "_TRUE": _TRUE, "_FALSE": _FALSE, "_Result": Result,
                                        "_new_result": tuple.__new__, "_with_errors": self._evaluate_with_errors}
        try:
            folded = fold(tree, namespace)
            strict = _Generator(namespace, tolerant=False).root(folded)
            tolerant = _Generator(namespace, tolerant=True).root(folded)
        except RecursionError:
            raise _too_complex("nesting") from None
        self.type = strict.type
        self._zero = ZERO[strict.type]
        # The filter's verdict, and the Result of an error-free evaluation: a Boolean one is one of two shared
        # Results (nothing allocated); other values get a new one (tuple.__new__ skips Result's Python __new__).
        if strict.type is Type.BOOLEAN:
            verdict, result = strict.src, "_TRUE if v else _FALSE"
        elif strict.type is Type.ANY:
            verdict = f"({strict.src}) is True"
            result = "_TRUE if v is True else _FALSE if v is False else _new_result(_Result, (v, ()))"
        else:
            verdict, result = "False", "_new_result(_Result, (v, ()))"
        # The variant in which the outermost operator reports its own errors is needed only where it has some
        # (a cast, a division, a function); otherwise the first error decides, and the exception carries it.
        fallback = re.search(r"\b_R\b", tolerant.src) is not None
        self.source = (
            f"def _matches(e):\n    try:\n        return {verdict}\n    except Exception:\n        return False\n\n"
            f"def _evaluate(e):\n    try:\n        v = {strict.src}\n    except Exception as x:\n"
            f"        return _with_errors(e, x)\n    return {result}\n"
            + (f"\ndef _tolerant(e, _R):\n    return {tolerant.src}\n" if fallback else "")
        )
        try:
            exec(compile(self.source, "<cesql>", "exec"), namespace)  # noqa: S102 - code generated from the tree
        except (SyntaxError, RecursionError, MemoryError) as exc:
            raise _too_complex(str(exc) or type(exc).__name__) from None
        self._fallback: Callable[[Event, list[CesqlError]], Value] | None = \
            namespace["_tolerant"] if fallback else None  # type: ignore[assignment]
        self.matches = namespace["_matches"]  # type: ignore[assignment]
        self.evaluate = namespace["_evaluate"]  # type: ignore[assignment]

    def _evaluate_with_errors(self, event: Event, first: Exception) -> Result:
        """``evaluate`` after the fail-fast code stopped with ``first``."""
        errors: list[CesqlError] = []
        if self._fallback is not None:
            try:
                return Result(self._fallback(event, errors), tuple(errors))
            except Exception as exc:  # the same error again, from a sub-expression
                first = exc
        errors.append(_error_of(first))
        return Result(self._zero, tuple(errors))

    def __reduce__(self) -> tuple[Callable[[str], Expression], tuple[str]]:
        # Pickled as its text and compiled again where it lands (e.g. a Spark executor): generated code does not
        # travel.
        return compile_expression, (self.text,)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def compile_expression(text: str) -> Expression:
    """Parse and compile ``text``; raises ``CesqlParseError`` (with line and column) if it is not valid CESQL."""
    return Expression(text, parse(text))
