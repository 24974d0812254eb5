"""The TCK runner and the CLI: conformance files in the spec's format, failures reported, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafka_eventing.cesql import cli, tck

HERE = Path(__file__).parent

FAILING = """\
name: Deliberately wrong expectations
tests:
  - name: wrong value
    expression: 1 + 1
    result: 3
  - name: wrong type (1 is not true)
    expression: TRUE
    result: 1
  - name: missing error
    expression: 1 / 0
    result: 0
  - name: unexpected parse success
    expression: TRUE
    error: parse
  - name: right
    expression: "time = '2018-04-26T14:48:09+02:00'"
    eventOverrides:
      time: 2018-04-26T14:48:09+02:00
    result: true
"""


def test_upstream_files_the_shared_copy_lacks() -> None:
    report = tck.run([HERE / "tck"])
    assert report.failures == []
    assert report.passed == 41  # spec_examples (13) + subscriptions_api_recreations (28)


def test_failures_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "wrong.yaml").write_text(FAILING)
    assert cli.main(["tck", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "1 passed, 4 failed"
    assert lines[0].startswith("FAIL wrong.yaml: Deliberately wrong expectations / wrong value: '1 + 1': value 2")
    assert "value True, expected 1" in lines[1]
    assert "errors: math: division by zero; expected none" in lines[2]
    assert "expected a parse error" in lines[3]


def test_tck_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tck", str(HERE / "tck" / "spec_examples.yaml")]) == 0
    assert capsys.readouterr().out.strip() == "13 passed, 0 failed"
    assert cli.main(["tck", str(tmp_path / "absent")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert cli.main(["tck", str(tmp_path)]) == 1  # an empty folder proves nothing
    assert "no test cases found" in capsys.readouterr().err


def test_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "seq": "7",
                                 "data": {"x": 1}}))
    assert cli.main(["eval", "seq + 1", "--event", str(event)]) == 0
    assert capsys.readouterr().out == "8\n"
    assert cli.main(["eval", "CONCAT(type, missing)", "--event", str(event)]) == 0
    assert capsys.readouterr().out == "\"\"\nerror missingAttribute: the event has no attribute 'missing'\n"
    assert cli.main(["eval", "EXISTS data"]) == 0
    assert capsys.readouterr().out == "false\n"
    assert cli.main(["eval", "ABC("]) == 1
    assert "parse: line 1, column 5: unexpected end of expression" in capsys.readouterr().err
    assert cli.main(["eval", "TRUE", "--event", str(tmp_path / "absent.json")]) == 2
    capsys.readouterr()


def test_the_project_command_dispatches_to_cesql(capsys: pytest.CaptureFixture[str]) -> None:
    from kafka_eventing.cli import main

    assert main(["cesql", "eval", "UPPER('ok')"]) == 0
    assert capsys.readouterr().out == '"OK"\n'
