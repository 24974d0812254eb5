"""Shared pytest setup: real-part fixtures live in tests/fixtures/ and load as plugins.

Hypothesis runs under the ``dev`` profile (quick: 200 examples per property) or, when ``CI=true``, the ``ci``
profile (1,000 examples, derandomized so a failure reproduces, no example database); ``HYPOTHESIS_PROFILE``
picks one explicitly. A property that needs its own budget (a real server per example) sets it in ``@settings``.

With ``KAFKA_EVENTING_REQUIRE_REAL_TIERS=1`` (set by ``make test``), a skipped test of a real-component tier
(kafka, kube, knative, spark, cluster, kind) fails the run: a skip there means a real part was missing, which CI must
not hide.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

pytest_plugins = ["fixtures.kafka", "fixtures.kube", "fixtures.knative", "fixtures.spark"]

settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=1000, deadline=None, derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev"))

REAL_TIERS = ("kafka", "kube", "knative", "spark", "cluster", "kind")
_SKIPPED_REAL = pytest.StashKey[list[str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and any(item.get_closest_marker(m) for m in REAL_TIERS):
        item.session.stash.setdefault(_SKIPPED_REAL, []).append(f"{item.nodeid}: {report.longrepr}")


@functools.cache
def _uses_spark(path: str) -> bool:
    """A test file marked ``spark`` (its ``pytestmark``): read from the source, since xdist's controller, which
    schedules, collects nothing."""
    return "pytest.mark.spark" in (Path(__file__).parent.parent / path).read_text()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test-integration` runs under pytest-xdist. A test file runs whole on one worker, so that its
    module-scoped real parts (a control plane's CRDs, a Knative install, receivers) start once; every file that uses
    Spark runs on one worker (one local Spark and one standalone cluster, whose JVMs would crowd two cores), and
    first, being the longest. Each worker has a Kafka and an API server of its own (the session fixtures)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileSparkTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "spark" if _uses_spark(path) else path

    config.option.loadscopereorder = False  # the order below, not the count of tests
    return ByFileSparkTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Spark's files first (a stable sort): under xdist they are the longest unit of work."""
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None):
        items.sort(key=lambda item: not item.get_closest_marker("spark"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    skipped = session.stash.get(_SKIPPED_REAL, [])
    if skipped and os.environ.get("KAFKA_EVENTING_REQUIRE_REAL_TIERS") == "1":
        print("\nReal-component tests were skipped; CI requires them to run:")
        for line in skipped:
            print(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
