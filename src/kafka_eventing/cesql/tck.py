"""The CESQL conformance suite (TCK) runner: YAML files in the format of cloudevents/spec ``cesql/cesql_tck``.

A file has ``name`` and ``tests``; a test has ``name``, ``expression``, and optionally ``result``, ``error`` (an
error kind: parse, math, cast, missingFunction, functionEvaluation, missingAttribute, generic), ``event`` (a JSON
CloudEvent) or ``eventOverrides`` (attributes over a minimal valid event).

A case passes when: a parse error is expected and compiling fails with one; otherwise the expression compiles, the
value equals ``result`` in type and value (when given), the errors are exactly of the expected kind (none when no
error is expected), and ``matches`` agrees with ``evaluate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kafka_eventing.cesql.compiler import compile_expression
from kafka_eventing.cesql.errors import CesqlParseError, ErrorKind

#: The required attributes of the event a case without ``event`` runs on (values are arbitrary but valid).
BASE_EVENT: Mapping[str, object] = {
    "specversion": "1.0",
    "id": "tck-event",
    "source": "/cesql/tck",
    "type": "io.cloudevents.cesql.tck",
}

_ABSENT: Any = object()


class _JsonLikeLoader(yaml.SafeLoader):
    """YAML without the timestamp type: the suite's events are JSON, where a time is a string."""


_JsonLikeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def event_attributes(event: Mapping[str, Any]) -> dict[str, object]:
    """A JSON CloudEvent (structured mode) → the attributes CESQL sees: everything but the data."""
    return {name: val for name, val in event.items() if name not in ("data", "data_base64")}


@dataclass(frozen=True)
class Case:
    file: str
    suite: str
    name: str
    expression: str
    result: Any = _ABSENT
    error: str | None = None
    event: Mapping[str, Any] | None = None
    overrides: Mapping[str, Any] | None = None

    def input_event(self) -> dict[str, object]:
        base = event_attributes(self.event) if self.event is not None else dict(BASE_EVENT)
        return {**base, **(self.overrides or {})}


def load(path: Path) -> list[Case]:
    doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_JsonLikeLoader)  # noqa: S506 - a SafeLoader
    if not isinstance(doc, dict) or not isinstance(doc.get("tests"), list):
        raise ValueError(f"{path}: not a CESQL TCK file (needs 'name' and a list 'tests')")
    suite = str(doc.get("name", path.stem))
    return [
        Case(
            file=path.name,
            suite=suite,
            name=str(test.get("name", f"#{index}")),
            expression=str(test["expression"]),
            result=test.get("result", _ABSENT),
            error=test.get("error"),
            event=test.get("event"),
            overrides=test.get("eventOverrides"),
        )
        for index, test in enumerate(doc["tests"], 1)
    ]


def files(paths: Iterable[Path]) -> Iterator[Path]:
    """The YAML files named, directories expanded (sorted); a path that does not exist raises FileNotFoundError."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")


def check(case: Case) -> str | None:
    """None if ``case`` passes, else what went wrong."""
    if case.error is not None and case.error not in {kind.value for kind in ErrorKind}:
        return f"unknown error kind {case.error!r} in the test"
    try:
        expr = compile_expression(case.expression)
    except CesqlParseError as exc:
        return None if case.error == ErrorKind.PARSE.value else f"unexpected {exc}"
    if case.error == ErrorKind.PARSE.value:
        return "expected a parse error, but the expression compiled"
    event = case.input_event()
    result = expr.evaluate(event)
    problems = []
    if case.result is not _ABSENT and not (type(result.value) is type(case.result) and result.value == case.result):
        problems.append(f"value {result.value!r}, expected {case.result!r}")
    kinds = {error.kind.value for error in result.errors}
    expected = {case.error} if case.error else set()
    if kinds != expected:
        got = ", ".join(str(error) for error in result.errors) or "none"
        problems.append(f"errors: {got}; expected {case.error or 'none'}")
    if expr.matches(event) != (result.value is True and not result.errors):
        problems.append(f"matches() is {expr.matches(event)} but evaluate() gave {result}")
    return "; ".join(problems) or None


@dataclass(frozen=True)
class Report:
    passed: int
    failures: list[tuple[Case, str]]

    def lines(self) -> list[str]:
        out = [f"FAIL {case.file}: {case.suite} / {case.name}: {case.expression!r}: {problem}"
               for case, problem in self.failures]
        out.append(f"{self.passed} passed, {len(self.failures)} failed")
        return out


def run(paths: Iterable[Path]) -> Report:
    passed, failures = 0, []
    for path in files(paths):
        for case in load(path):
            problem = check(case)
            if problem is None:
                passed += 1
            else:
                failures.append((case, problem))
    return Report(passed, failures)
