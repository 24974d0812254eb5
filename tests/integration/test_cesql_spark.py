"""``reprocess --where``: CESQL compiled to Spark columns gives what the Python engine (a Trigger's filter) gives.

Every case of the conformance suite (tests/cesql-tck and the upstream files in tests/unit/cesql/tck) runs through
both engines on a real local Spark: the case's event becomes a decoded row exactly as the binding makes one
(``reprocess.events.decode_record``), the Python engine evaluates that row's view (``row_attributes``), and Spark
evaluates the compiled columns on the row. Value, error-or-not and the filter's verdict must be identical. Each
file's expressions run in one Spark job over all of that file's rows, so every expression also meets events it was
not written for — and none may make Spark raise (ANSI mode is on in Spark 4).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_eventing.cesql import CesqlParseError, compile_expression, tck
from kafka_eventing.cesql import ast as cst
from kafka_eventing.reprocess.cesql_spark import compile_where, row_attributes
from kafka_eventing.reprocess.events import CORE_ATTRIBUTES, decode_record, event_schema
from unit.cesql.test_cesql_properties import NAMES, trees

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

TESTS = Path(__file__).resolve().parents[1]
TCK_FILES = list(tck.files([TESTS / "cesql-tck", TESTS / "unit" / "cesql" / "tck"]))

#: Cases whose event a decoded row cannot present as the suite wrote it. Both engines still run them on the row
#: and must agree; only the suite's own expectation does not hold there, because a decoded row keeps extension values
#: as strings (a JSON 10 is "10").
ROW_VIEW_DIFFERS = {
    ("context_attributes_access.yaml", "Access to optional integer extension"),  # 10 → "10"
    ("context_attributes_access.yaml", "Access to optional boolean extension"),  # true → "true"
}


#: Edges the suite touches lightly, in its format: 32-bit limits, casts from odd strings, Unicode whitespace, LIKE
#: on regular-expression characters, the order of evaluation (which operands a false AND or a found IN skip), and
#: ``time`` with and without a fraction.
EDGES = r"""
name: Spark edges
tests:
  - {name: overflow +, expression: 2147483647 + 1}
  - {name: overflow *, expression: 65536 * 65536}
  - {name: overflow nested, expression: (2147483647 * 2147483647) * (2147483647 * 2147483647)}
  - {name: min / -1, expression: -2147483648 / -1}
  - {name: min % -1, expression: -2147483648 % -1}
  - {name: division truncates, expression: -7 / 2}
  - {name: modulo sign, expression: -7 % 2 = -1 AND 7 % -2 = 1}
  - {name: negate min, expression: -(-2147483648)}
  - {name: abs min, expression: ABS(-2147483648)}
  - {name: int of plus, expression: INT('+5') + INT('-0') + INT('007')}
  - {name: int too wide, expression: INT('2147483648')}
  - {name: int of many zeros, expression: INT('-0000000000002147483648')}
  - {name: int of space, expression: "INT(' 5')"}
  - {name: int of newline, expression: INT(nl)}
  - {name: int of arabic digit, expression: "INT('\u0663')"}
  - {name: is_int, expression: IS_INT(nl) OR IS_INT('12345678901') OR IS_INT('-12')}
  - {name: bool of case, expression: BOOL('TrUe') AND NOT BOOL('FALSE')}
  - {name: bool of int, expression: BOOL(0) OR BOOL(-3)}
  - {name: implicit int to bool, expression: NOT 1}
  - {name: trim unicode, expression: "TRIM('\u00a0\u2003 x y\u0085\u3000') = 'x y'"}
  - {name: trim keeps separators, expression: "LENGTH(TRIM('\u001cx\u001f'))"}
  - {name: like regex chars, expression: "'a.b+c(d)[e]$^{1}|?*' LIKE 'a.b+c(%)[_]$^{_}|?*'"}
  - {name: like dot is literal, expression: "'axb' LIKE 'a.b'"}
  - {name: like newline, expression: "nl LIKE '5_'"}
  - {name: like escaped wildcards, expression: '"50%_" LIKE "50\%\_" AND NOT ("50x_" LIKE "50\%\_")'}
  - {name: like astral, expression: "'\U0001F600x' LIKE '_x'"}
  - {name: length astral, expression: "LENGTH('\U0001F600')"}
  - {name: upper sharp s, expression: "UPPER('stra\u00dfe')"}
  - name: left right substring
    expression: "CONCAT(LEFT('abc', 5), RIGHT('abc', 2), SUBSTRING('abcdef', -2), SUBSTRING('abcdef', 2, 3),
      SUBSTRING('abc', 0, -1))"
  - {name: right all, expression: "RIGHT('abc', 3) = 'abc' AND RIGHT('', 0) = ''"}
  - {name: left negative, expression: "LEFT('abc', -1)"}
  - {name: substring outside, expression: "SUBSTRING('abc', 4)"}
  - {name: substring negative length, expression: "SUBSTRING('abc', 1, -1)"}
  - {name: false and skips, expression: FALSE AND (1 / 0 = 1)}
  - {name: true or skips, expression: TRUE OR missing = 'x'}
  - {name: missing or true, expression: missing = 'x' OR TRUE}
  - {name: xor evaluates both, expression: TRUE XOR (1 / 0 = 1)}
  - {name: in found first, expression: "1 IN (1, 'x')"}
  - {name: in error first, expression: "1 IN ('x', 1)"}
  - {name: in attribute, expression: "nl IN (5, 'a', TRUE)"}
  - {name: in expressions, expression: "LENGTH(source) IN (1 / 0, 11)"}
  - {name: not in, expression: "type NOT IN ('a', 'b')"}
  - {name: equality casts left, expression: "5 = padded"}
  - {name: equality casts left to int, expression: "padded = 5"}
  - {name: equality of two attributes, expression: "nl = padded"}
  - {name: data, expression: data = 'x'}
  - {name: exists data, expression: EXISTS data}
  - {name: exists extension, expression: EXISTS nl AND NOT EXISTS missing AND EXISTS id}
  - {name: time with fraction, expression: time, eventOverrides: {time: "2024-05-01T12:34:56.789+02:00"}}
  - {name: time without fraction, expression: time, eventOverrides: {time: "2024-05-01T12:34:56Z"}}
  - {name: time unset, expression: time}
  - name: time as sent
    expression: "time = '2024-05-01T12:34:56.789+02:00' AND time LIKE '%+02:00'"
    eventOverrides: {time: "2024-05-01T12:34:56.789+02:00"}
  - name: string of bool
    expression: "CONCAT(STRING(TRUE), STRING(-5), CONCAT_WS('-', 'a', 1, FALSE), CONCAT_WS('x'))"
  - {name: unknown function, expression: NOSUCH(1) OR TRUE}
  - {name: attribute as result, expression: nl}
  - {name: integer as result, expression: LENGTH(nl) * 3}
"""


def _row(case: tck.Case, index: int) -> dict[str, Any]:
    """The case's event sent in structured mode and decoded as every reprocess job decodes a record."""
    value = json.dumps(case.input_event()).encode()
    row = decode_record(None, value, [{"key": "content-type", "value": b"application/cloudevents+json"}], None)
    assert row["error"] is None, (case.name, row["error"])
    row.update(topic="tck", partition=0, offset=index, timestamp=None)
    return row


def _cases(tmp_path: Path) -> Iterator[tuple[Path, list[tck.Case]]]:
    edges = tmp_path / "spark_edges.yaml"
    edges.write_text(EDGES, encoding="utf-8")
    for path in [*TCK_FILES, edges]:
        cases = tck.load(path)
        if path == edges:  # every edge case runs on an event with a few odd extension values
            extensions = {"nl": "5\n", "padded": " 5"}
            cases = [dataclasses.replace(c, overrides={**extensions, **(c.overrides or {})}) for c in cases]
        yield path, cases


def test_every_tck_case_evaluates_alike_in_spark_and_python(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    schema = event_schema()
    compared = refused = 0
    mismatches: list[str] = []
    differs: set[tuple[str, str]] = set()
    for path, cases in _cases(tmp_path):
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
            if path in TCK_FILES and (original.value, bool(original.errors)) != (result.value, bool(result.errors)):
                differs.add((path.name, case.name))
            compared += 1
    assert not mismatches, "\n".join(mismatches)
    assert differs == ROW_VIEW_DIFFERS
    assert (compared, refused) == (273 + 56, 2)  # the suite's 275 cases (2 expect a parse error) and the edges


EXTENSION_NAMES = [name for name in NAMES if name not in CORE_ATTRIBUTES and name != "data"]
_ext_values = st.one_of(st.text(max_size=6), st.sampled_from(["10", "-3", "true", "FALSE", "", " 1", "2147483648"]))
_rows = st.fixed_dictionaries(
    {"id": st.just("e"), "source": st.just("/s"), "type": st.sampled_from(["t", "10", "TRUE"]),
     "specversion": st.just("1.0"), "subject": st.none() | _ext_values,
     "time": st.none() | st.datetimes(timezones=st.just(UTC)), "time_text": st.none(), "datacontenttype": st.none(),
     "dataschema": st.none(), "extensions": st.dictionaries(st.sampled_from(EXTENSION_NAMES), _ext_values),
     "data": st.none(), "topic": st.just("p"), "partition": st.just(0), "offset": st.just(0),
     "timestamp": st.none(), "event_date": st.none(), "error": st.none()})


@settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(trees, min_size=20, max_size=20), st.lists(_rows, min_size=6, max_size=6))
def test_generated_expressions_evaluate_alike_in_spark_and_python(
    spark: SparkSession, expressions: list[cst.Node], rows: list[dict[str, Any]],
) -> None:
    """The property suite's generated expressions (tests/unit/cesql) over generated rows: 120 pairs per example,
    one Spark job each."""
    from pyspark.sql import functions as F

    texts = [cst.to_text(tree) for tree in expressions]
    compiled = [compile_where(text) for text in texts]
    schema = event_schema()
    frame = spark.createDataFrame([tuple(row[f.name] for f in schema) for row in rows], schema)
    columns = [F.struct(f.value.alias("v"), f.ok.alias("ok"), f.matches.alias("m")) for f in compiled]
    results = frame.select(*columns).collect()
    for row, got in zip(rows, results, strict=True):
        view = row_attributes(row)
        for i, text in enumerate(texts):
            expr = compile_expression(text)
            result = expr.evaluate(view)
            python = (not result.errors, result.value if not result.errors else None, expr.matches(view))
            spark_says = (got[i]["ok"], got[i]["v"] if got[i]["ok"] else None, got[i]["m"])
            assert python == spark_says, f"{text!r} on {view}"
            assert not python[0] or type(python[1]) is type(spark_says[1]), f"{text!r} on {view}"
