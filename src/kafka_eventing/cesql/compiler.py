"""Syntax tree → Python code, compiled once per expression.

Types are checked and every cast the spec calls for is decided at compile time: an operand whose type is known is
converted by code chosen for that pair of types, a literal is converted right away, and only an attribute (whose
type is known per event) is tested at run time — inline, with the common case (already the wanted type) costing one
class check. Constant sub-expressions are folded. The result is a Python function per mode:

* ``matches(event)``: the filter's question, "is the value Boolean true with no error". Any error stops the
  evaluation (the spec's fail-fast mode, §4.1); nothing is allocated on the way.
* ``evaluate(event)``: value and errors. It first runs the same fail-fast code; only when that meets an error does
  it run a second variant in which the outermost operator reports its own errors and still returns the value the
  spec defines for them (``ABS(-2147483648)`` is ``2147483647`` with a math error). An error in any
  sub-expression makes the whole expression take the zero value of its type (spec §3.2, §3.3), which is what the
  conformance suite expects (``true AND (1 != 1/0)`` is ``false`` with a math error).

Attribute reads are ``event[name]``: a missing one raises ``KeyError``, which the caller turns into a
MissingAttributeError.
"""

from __future__ import annotations

import itertools
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
    "_Fail": rt.Fail, "_value": rt.value, "_cast": rt.cast, "_as_str": rt.as_str, "_as_int": rt.as_int,
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

    def emit(self, node: ast.Node, errs: str = "None") -> _Code:
        """``node`` compiled; its own errors go to the list named ``errs`` ("None": raise)."""
        return self._emit(node, errs)

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
            return _Code(self.value_of(code), code.type if code.type is not Type.ANY else Type.ANY)
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

    def _emit(self, node: ast.Node, errs: str) -> _Code:
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
            if rcode.type is Type.ANY:
                # The right operand's type, which decides the cast (spec §3.7), is known per event only.
                call = f"_equals({self.value_of(lcode)}, {self.value_of(rcode)}, {errs})"
                return _Code(call if op == "=" else f"(not {call})", Type.BOOLEAN)
            lsrc = self.cast(lcode, rcode.type, errs).src
            return _Code(f"({lsrc} {python_op} {rcode.src})", Type.BOOLEAN)
        lsrc, rsrc = self.operand(left, Type.INTEGER, errs), self.operand(right, Type.INTEGER, errs)
        if op in ("/", "%"):
            return _Code(f"{'_divide' if op == '/' else '_modulo'}({lsrc}, {rsrc}, {errs})", Type.INTEGER)
        t = self._temp()
        return _Code(f"({t} if -2147483648 <= ({t} := {lsrc} {op} {rsrc}) <= 2147483647 else _overflow({t}, {errs}))",
                     Type.INTEGER)

    def _like(self, src: str, pattern: str, negated: bool) -> _Code:
        parts = rt.like_parts(pattern)
        literals = [part for part in parts if part not in ("%", "_")]
        if "_" in parts or len(literals) > 1 or parts.count("%") > 2:
            test = f"({self._const_name(rt.like_regex(parts).fullmatch)}({src}) is not None)"
        elif not parts:
            test = f"({src} == '')"
        elif parts == literals:
            test = f"({src} == {literals[0]!r})"
        elif not literals:  # only '%': anything matches, but the operand is still evaluated
            test = f"({src}).__class__ is str"
        elif parts == [literals[0], "%"]:
            test = f"{src}.startswith({literals[0]!r})"
        elif parts == ["%", literals[0]]:
            test = f"{src}.endswith({literals[0]!r})"
        elif parts == ["%", literals[0], "%"]:
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
    return {bool: ast.BoolLit, int: ast.IntLit, str: ast.StrLit}[val.__class__](val)


class Result(NamedTuple):
    """An evaluation's outcome: the value (bool, int or str) and the errors met, in order (empty if none)."""

    value: Value
    errors: tuple[CesqlError, ...]


def _missing_attribute(exc: KeyError) -> CesqlError:
    name = exc.args[0] if exc.args else "?"
    return CesqlError(ErrorKind.MISSING_ATTRIBUTE, f"the event has no attribute {name!r}")


class Expression:
    """A compiled CESQL expression. Build with ``compile_expression``; use from any number of threads."""

    __slots__ = ("_fallback", "_strict", "_zero", "matches", "source", "text", "tree", "type")

    #: True only when the expression's value is Boolean true and no error occurred (the filter's rule, spec §1.2).
    matches: Callable[[Event], bool]

    def __init__(self, text: str, tree: ast.Node) -> None:
        self.text = text
        self.tree = tree
        namespace: dict[str, object] = dict(_HELPERS)
        folded = fold(tree, namespace)
        strict = _Generator(namespace, tolerant=False).root(folded)
        tolerant = _Generator(namespace, tolerant=True).root(folded)
        self.type = strict.type
        self._zero = ZERO[strict.type]
        if strict.type is Type.BOOLEAN:
            verdict = strict.src
        elif strict.type is Type.ANY:
            verdict = f"({strict.src}) is True"
        else:
            verdict = "False"
        self.source = (
            f"def _strict(e):\n    return {strict.src}\n\n"
            f"def _tolerant(e, _R):\n    return {tolerant.src}\n\n"
            f"def _matches(e):\n    try:\n        return {verdict}\n    except Exception:\n        return False\n"
        )
        try:
            exec(compile(self.source, "<cesql>", "exec"), namespace)  # noqa: S102 - code generated from the tree
        except (SyntaxError, RecursionError, MemoryError) as exc:
            raise CesqlParseError(f"the expression is too complex to compile ({exc})") from None
        self._strict: Callable[[Event], Value] = namespace["_strict"]  # type: ignore[assignment]
        self._fallback: Callable[[Event, list[CesqlError]], Value] = namespace["_tolerant"]  # type: ignore[assignment]
        self.matches = namespace["_matches"]  # type: ignore[assignment]

    def evaluate(self, event: Event) -> Result:
        """The value and the errors of this expression on ``event`` (attribute name → value). Never raises."""
        try:
            return Result(self._strict(event), ())
        except Exception:  # noqa: S110 - any error: evaluate again, collecting the errors
            pass
        errors: list[CesqlError] = []
        try:
            return Result(self._fallback(event, errors), tuple(errors))
        except rt.Fail as exc:
            errors.append(exc.error)
        except KeyError as exc:
            errors.append(_missing_attribute(exc))
        except Exception as exc:
            errors.append(CesqlError(ErrorKind.GENERIC, f"reading the event failed: {exc!r}"))
        return Result(self._zero, tuple(errors))

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def compile_expression(text: str) -> Expression:
    """Parse and compile ``text``; raises ``CesqlParseError`` (with line and column) if it is not valid CESQL."""
    return Expression(text, parse(text))
