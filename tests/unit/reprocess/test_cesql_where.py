"""``reprocess replay|redrive --where`` (CESQL) and ``--where-sql`` on the command line, without Spark: parse errors
stop the job before Spark starts, the filters are recorded as given. The Spark compilation itself is checked
against the Python engine on a real Spark in tests/integration/test_cesql_spark.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from kafka_eventing.cesql import CesqlParseError, compile_expression
from kafka_eventing.cesql import _runtime as rt
from kafka_eventing.reprocess.cesql_spark import check_where, like_regex, row_attributes
from kafka_eventing.reprocess.cli import EXIT_USAGE, _filters, build_parser, main
from kafka_eventing.reprocess.replay import Filters

URL = "http://127.0.0.1:1/"


@pytest.mark.parametrize("job", [["replay", "--to-url", URL], ["redrive"]])
def test_where_is_cesql_and_where_sql_is_spark_sql(job: list[str]) -> None:
    args = build_parser().parse_args([*job, "--topic", "t", "--where", "region = 'eu' AND EXISTS subject",
                                      "--where-sql", "partition = 3", "--where-attr", "type=x"])
    filters = _filters(args)
    assert filters == Filters(equals={"type": "x"}, where="region = 'eu' AND EXISTS subject",
                              where_sql="partition = 3")
    assert filters.describe() == {"equals": {"type": "x"}, "where": "region = 'eu' AND EXISTS subject",
                                  "where_sql": "partition = 3"}


def test_a_where_that_is_not_cesql_stops_the_job_before_spark(capsys: pytest.CaptureFixture[str]) -> None:
    # The Spark SQL spelling that --where took before is not CESQL: refused with where it fails, exit 2.
    code = main(["replay", "--topic", "t", "--to-url", URL, "--bootstrap-servers", "127.0.0.1:9",
                 "--where", "extensions['region'] = 'eu'"])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert re.search(r"--where is not CloudEvents SQL: line 1, column \d+", err), err
    with pytest.raises(CesqlParseError):
        Filters(where="type = ").check()
    Filters(where_sql="extensions['region'] = 'eu'").check()  # Spark SQL is Spark's to check


def test_like_regex_escapes_every_regular_expression_character() -> None:
    # Java's syntax for these escapes is Python's too: the pattern must match what CESQL's LIKE matches.
    pattern = r"a.b+c(%)[_]$^{\%}|?*\_"
    java = like_regex(pattern)
    assert java is not None
    python = re.compile(java.replace(r"\z", r"\Z"))
    for text in ("a.b+c(xyz)[q]$^{%}|?*_", "a.b+c()[q]$^{%}|?*_", "axb+c()[q]$^{%}|?*_", "a.b+c()[]$^{%}|?*_",
                 "a.b+c(\n)[\n]$^{%}|?*_", "a.b+c()[q]$^{x}|?*_"):
        assert (python.match(text) is not None) == (rt.like_regex(rt.like_parts(pattern)).fullmatch(text) is not None)
    assert like_regex("no wildcards \\% here") is None


def test_row_attributes_is_the_event_a_decoded_row_presents() -> None:
    row = {"id": "1", "source": "/s", "type": "t", "specversion": "1.0", "subject": None,
           "time": datetime(2024, 5, 1, 10, 34, 56, 789000, tzinfo=UTC), "datacontenttype": None,
           "dataschema": None, "extensions": {"region": "eu", "seq": "10", "gone": None}, "data": b"x"}
    view = row_attributes(row)
    assert view == {"id": "1", "source": "/s", "type": "t", "specversion": "1.0",
                    "time": "2024-05-01T10:34:56.789000Z", "region": "eu", "seq": "10"}
    assert compile_expression("seq + 1 = 11 AND NOT EXISTS subject AND time LIKE '%.789000Z'").matches(view)
    assert row_attributes({**row, "time": datetime(2024, 5, 1, 10, 34, 56, tzinfo=UTC)})["time"] == \
        "2024-05-01T10:34:56Z"
    # A decoded row keeps the sender's spelling (``time_text``): that is what a Trigger compares.
    sent = row_attributes({**row, "time_text": "2024-05-01T12:34:56.789+02:00"})
    assert sent["time"] == "2024-05-01T12:34:56.789+02:00"
    assert compile_expression("time = '2024-05-01T12:34:56.789+02:00'").matches(sent)


def test_check_where_returns_the_tree() -> None:
    assert check_where("a = 1") == compile_expression("a = 1").tree
