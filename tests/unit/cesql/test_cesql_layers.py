"""The cesql room imports nothing else of kafka_eventing, so the broker's filters and the reprocessing jobs can
both use it without pulling in another role."""

from __future__ import annotations

import ast
from pathlib import Path

import kafka_eventing.cesql

ROOM = Path(kafka_eventing.cesql.__file__).parent


def _imports(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            modules.add(node.module or "")
    return modules


def test_cesql_imports_only_itself_from_the_project() -> None:
    sources = sorted(ROOM.glob("*.py"))
    assert len(sources) >= 5
    offenders = {
        f"{path.name}: {module}"
        for path in sources
        for module in _imports(path)
        if module.split(".")[0] == "kafka_eventing" and not module.startswith("kafka_eventing.cesql")
    }
    assert not offenders
