"""Chart tests: every scenario and overlay is rendered concurrently once, up front."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from .render import (
    KUSTOMIZE,
    SCENARIOS,
    kustomize,
    scenario,
)


@pytest.fixture(scope="module", autouse=True)
def _prefetch_renders() -> None:
    """Render every scenario and overlay concurrently up front: the binaries' start-up dominates this module."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        jobs = [pool.submit(scenario, n) for n in SCENARIOS]
        jobs += [pool.submit(kustomize, p.name) for p in (KUSTOMIZE / "overlays").iterdir()]
        for job in jobs:
            job.result()
