"""The error model of CESQL v1 (spec §3.3): every error has a kind; evaluation returns errors, parsing raises one."""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """The spec's error types; the values are the names the conformance suite (TCK) uses."""

    PARSE = "parse"
    MATH = "math"
    CAST = "cast"
    MISSING_FUNCTION = "missingFunction"
    FUNCTION_EVALUATION = "functionEvaluation"
    MISSING_ATTRIBUTE = "missingAttribute"
    #: "Any error not specified above" (spec §3.3); the built-ins never raise it. The engine reports an event
    #: mapping that fails while being read (e.g. its ``__getitem__`` raises) as a generic error.
    GENERIC = "generic"


class CesqlError(Exception):
    """One error of an evaluation (returned in ``Result.errors``), or the parse error ``compile_expression`` raises."""

    kind: ErrorKind

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"

    def __eq__(self, other: object) -> bool:
        # By value, so that two evaluations' results compare equal when they found the same errors.
        return isinstance(other, CesqlError) and (self.kind, self.message) == (other.kind, other.message)

    def __hash__(self) -> int:
        return hash((self.kind, self.message))

    def __repr__(self) -> str:
        return f"CesqlError({self.kind.name}, {self.message!r})"


class CesqlParseError(CesqlError):
    """The expression is not valid CESQL; ``line`` and ``column`` (1-based) point at the offending character."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        where = f"line {line}, column {column}: " if line is not None and column is not None else ""
        super().__init__(ErrorKind.PARSE, where + message)
        self.line = line
        self.column = column

    def __repr__(self) -> str:
        return f"CesqlParseError({self.message!r})"
