"""The built-in functions (spec §3.5, and the casting functions the conformance suite uses): signatures for the
compiler's dispatch and type checks, and the Python code each call compiles to."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class Type(enum.Enum):
    """A value's static type. ANY is an attribute's, known only per event; a parameter of type ANY takes any
    value uncast."""

    BOOLEAN = "Boolean"
    INTEGER = "Integer"
    STRING = "String"
    ANY = "Any"


BOOL, INT, STR, ANY = Type.BOOLEAN, Type.INTEGER, Type.STRING, Type.ANY

#: Emits the Python source of a call from its arguments' sources (already cast to the parameter types) and the
#: name of the error list the function reports to ("None" to raise).
Emit = Callable[[Sequence[str], str], str]


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Type, ...]
    returns: Type
    emit: Emit
    #: The type of the arguments after ``params``; None for a fixed arity.
    variadic: Type | None = None

    def accepts(self, arity: int) -> bool:
        return arity == len(self.params) if self.variadic is None else arity >= len(self.params)

    def param(self, index: int) -> Type:
        return self.params[index] if index < len(self.params) else self.variadic  # type: ignore[return-value]


def _call(helper: str, *, fallible: bool = True) -> Emit:
    def emit(args: Sequence[str], errs: str) -> str:
        listed = [*args, errs] if fallible else list(args)
        return f"{helper}({', '.join(listed)})"

    return emit


def _concat(args: Sequence[str], _errs: str) -> str:
    return f"''.join(({', '.join(args)},))" if args else "''"


def _concat_ws(args: Sequence[str], _errs: str) -> str:
    separator, *parts = args
    return f"{separator}.join(({', '.join(parts)},))" if parts else f"({separator}, '')[1]"


BUILTINS: tuple[Function, ...] = (
    Function("LENGTH", (STR,), INT, lambda a, _: f"len({a[0]})"),
    Function("CONCAT", (), STR, _concat, variadic=STR),
    Function("CONCAT_WS", (STR,), STR, _concat_ws, variadic=STR),
    Function("LOWER", (STR,), STR, lambda a, _: f"{a[0]}.lower()"),
    Function("UPPER", (STR,), STR, lambda a, _: f"{a[0]}.upper()"),
    Function("TRIM", (STR,), STR, lambda a, _: f"{a[0]}.strip(_WHITESPACE)"),
    Function("LEFT", (STR, INT), STR, _call("_left")),
    Function("RIGHT", (STR, INT), STR, _call("_right")),
    Function("SUBSTRING", (STR, INT), STR, _call("_substring")),
    Function("SUBSTRING", (STR, INT, INT), STR, _call("_substring_length")),
    Function("ABS", (INT,), INT, _call("_abs")),
    Function("INT", (ANY,), INT, _call("_int_fn")),
    Function("BOOL", (ANY,), BOOL, _call("_bool_fn")),
    Function("STRING", (ANY,), STR, _call("_string_of", fallible=False)),
    Function("IS_BOOL", (ANY,), BOOL, _call("_is_bool", fallible=False)),
    Function("IS_INT", (ANY,), BOOL, _call("_is_int", fallible=False)),
)


def resolve(name: str, arity: int) -> Function | None:
    """The overload of ``name`` (upper-case) taking ``arity`` arguments; None means a MissingFunctionError."""
    return next((fn for fn in BUILTINS if fn.name == name and fn.accepts(arity)), None)
