"""Load one of the repository's scripts (hack/, bench/) as a module, for tests that call its functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str) -> ModuleType:
    """``relative``: the script's path from the repository root, e.g. ``hack/generate.py``."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
