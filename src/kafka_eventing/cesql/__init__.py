"""CloudEvents SQL (CESQL) v1: parse, type-check and compile an expression once, then evaluate it per event.

    expr = compile_expression("type = 'com.example' AND EXISTS subject")   # CesqlParseError if invalid
    expr.matches(event)       # the filter's question: Boolean true and no error
    expr.evaluate(event)      # Result(value, errors)

``event`` maps context attribute and extension names (lower case) to values: str, int or bool (other values are
represented as strings; see docs/cesql.md). This package imports nothing else of kafka_eventing, so every role can
use it.
"""

from kafka_eventing.cesql.compiler import Expression, Result, compile_expression
from kafka_eventing.cesql.errors import CesqlError, CesqlParseError, ErrorKind

__all__ = ["CesqlError", "CesqlParseError", "ErrorKind", "Expression", "Result", "compile_expression"]
