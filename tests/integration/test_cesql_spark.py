"""``reprocess --where``: CESQL compiled to Spark columns gives what the Python engine (a Trigger's filter) gives.

Every case of the conformance suite (tests/cesql-tck and the upstream files in tests/unit/cesql/tck) runs through
both engines on a real local Spark: the case's event becomes a decoded row exactly as the binding makes one
(``reprocess.events.decode_record``), the Python engine evaluates that row's view (``row_attributes``), and Spark
evaluates the compiled columns on the row. Value, error-or-not and the filter's verdict must be identical. Each
file's expressions run in one Spark job over all of that file's rows, so every expression also meets events it was
not written for — and none may make Spark raise (ANSI mode is on in Spark 4).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kafka_eventing.cesql import CesqlParseError, compile_expression, tck
from kafka_eventing.reprocess.cesql_spark import compile_where, row_attributes
from kafka_eventing.reprocess.events import decode_record, event_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

TESTS = Path(__file__).resolve().parents[1]
TCK_FILES = list(tck.files([TESTS / "cesql-tck", TESTS / "unit" / "cesql" / "tck"]))

#: Cases whose event a decoded row cannot present as the suite wrote it. Both engines still run them on the row
#: and must agree; only the suite's own expectation does not hold there, because a decoded row keeps the instant
#: of ``time`` (read in UTC), not the sender's spelling, and extension values as strings (a JSON 10 is "10").
ROW_VIEW_DIFFERS = {
    ("context_attributes_access.yaml", "Access to optional integer extension"),  # 10 → "10"
    ("context_attributes_access.yaml", "Access to optional boolean extension"),  # true → "true"
    ("context_attributes_access.yaml", "Timestamp type cohercion to string"),  # +02:00 → UTC "Z"
}


def _row(case: tck.Case, index: int) -> dict[str, Any]:
    """The case's event sent in structured mode and decoded as every reprocess job decodes a record."""
    value = json.dumps(case.input_event()).encode()
    row = decode_record(None, value, [{"key": "content-type", "value": b"application/cloudevents+json"}], None)
    assert row["error"] is None, (case.name, row["error"])
    row.update(topic="tck", partition=0, offset=index, timestamp=None)
    return row


def _cases() -> Iterator[tuple[Path, list[tck.Case]]]:
    for path in TCK_FILES:
        yield path, tck.load(path)


def test_every_tck_case_evaluates_alike_in_spark_and_python(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    schema = event_schema()
    compared = refused = 0
    mismatches: list[str] = []
    differs: set[tuple[str, str]] = set()
    for path, cases in _cases():
        runnable: list[tuple[tck.Case, Any]] = []
        for case in cases:
            if case.error == "parse":
                # Refused when the job starts, as a Trigger refuses it.
                with pytest.raises(CesqlParseError):
                    compile_where(case.expression)
                refused += 1
                continue
            runnable.append((case, compile_where(case.expression)))
        if not runnable:
            continue
        rows = [_row(case, i) for i, (case, _) in enumerate(runnable)]
        frame = spark.createDataFrame([tuple(row[f.name] for f in schema) for row in rows], schema)
        columns = [F.struct(f.value.alias("v"), f.ok.alias("ok"), f.matches.alias("m")).alias(f"c{i}")
                   for i, (_, f) in enumerate(runnable)]
        results = frame.select(*columns).collect()  # a local DataFrame keeps its rows' order
        assert len(results) == len(runnable)
        for i, (case, _) in enumerate(runnable):
            expr = compile_expression(case.expression)
            view = row_attributes(rows[i])
            result = expr.evaluate(view)
            python = (not result.errors, result.value if not result.errors else None, expr.matches(view))
            got = results[i][f"c{i}"]
            on_spark = (got["ok"], got["v"] if got["ok"] else None, got["m"])
            if python != on_spark or (python[0] and type(python[1]) is not type(on_spark[1])):
                mismatches.append(f"{path.name}: {case.name}: {case.expression!r} on {view}: "
                                  f"python {python}, spark {on_spark}")
            original = expr.evaluate(case.input_event())
            if (original.value, bool(original.errors)) != (result.value, bool(result.errors)):
                differs.add((path.name, case.name))
            compared += 1
    assert not mismatches, "\n".join(mismatches)
    assert differs == ROW_VIEW_DIFFERS
    assert compared >= 250 and refused >= 1, (compared, refused)
