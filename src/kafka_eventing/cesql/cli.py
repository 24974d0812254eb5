"""``kafka-eventing cesql <eval|tck> ...`` — try an expression, or run CESQL conformance (TCK) files.

eval: prints the value (as JSON) and one ``error <kind>: <message>`` line per error. The event is a JSON
CloudEvent in structured mode (``--event FILE``, ``-`` for stdin); without one, the event has no attributes.
tck:  prints one line per failing case and a closing ``N passed, M failed`` line.
Exit codes: 0 done (eval: even with evaluation errors), 1 parse error (eval) or a failing case (tck), 2 bad
arguments or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kafka_eventing.cesql import tck
from kafka_eventing.cesql.compiler import compile_expression
from kafka_eventing.cesql.errors import CesqlParseError

EXIT_FAILED, EXIT_USAGE = 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-eventing cesql", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("eval", help="evaluate one expression against an event")
    e.add_argument("expression")
    e.add_argument("--event", help="JSON CloudEvent file (structured mode); '-' reads stdin")
    t = sub.add_parser("tck", help="run conformance files in the format of cloudevents/spec cesql/cesql_tck")
    t.add_argument("paths", nargs="+", type=Path, metavar="FILE_OR_DIR")
    return parser


def _read_event(source: str | None) -> dict[str, object]:
    if source is None:
        return {}
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    doc: Any = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("the event must be a JSON object (a CloudEvent in structured mode)")
    return tck.event_attributes(doc)


def _eval(expression: str, event_source: str | None) -> int:
    try:
        event = _read_event(event_source)
    except (OSError, ValueError) as exc:
        print(f"kafka-eventing cesql eval: cannot read the event: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        expr = compile_expression(expression)
    except CesqlParseError as exc:
        print(f"kafka-eventing cesql eval: {exc}", file=sys.stderr)
        return EXIT_FAILED
    result = expr.evaluate(event)
    print(json.dumps(result.value))
    for error in result.errors:
        print(f"error {error.kind.value}: {error.message}")
    return 0


def _tck(paths: list[Path]) -> int:
    try:
        report = tck.run(paths)
    except (OSError, ValueError) as exc:
        print(f"kafka-eventing cesql tck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(report.lines()))
    if report.passed == 0 and not report.failures:
        print("kafka-eventing cesql tck: no test cases found", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED if report.failures else 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "eval":
        return _eval(args.expression, args.event)
    return _tck(args.paths)
