"""``promtool check metrics``: Prometheus' own lint of a /metrics text (units in names, ``_total`` counters, HELP on
every family). One helper for the chart tests, which check registries assembled from each role's metric
definitions, and the integration tests, which check what the real processes serve."""

from __future__ import annotations

import subprocess

import pytest

from kafka_eventing.localstack.tools import ToolNotFoundError, tool_path


def check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on ``text``: a non-zero return code and its findings on stdout when it objects."""
    try:
        promtool = tool_path("promtool")
    except ToolNotFoundError as exc:
        pytest.fail(str(exc))
    return subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)


def assert_promtool_passes(text: str, what: str) -> None:
    assert "# TYPE" in text, f"{what}: not a Prometheus scrape:\n{text[:2000]}"
    result = check_metrics(text)
    assert result.returncode == 0, f"promtool check metrics on {what}:\n{result.stdout}{result.stderr}"
