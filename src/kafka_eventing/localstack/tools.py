"""Where the Go-built tools live: ``${KE_CACHE:-<repo>/.cache}/bin``, filled by ``make setup``.

The tools (kube-apiserver, kube-controller-manager, etcd, kubectl, helm, ...) are built at pinned versions by
``hack/setup/go-tools.sh``; looking only there (not on ``PATH``) keeps tests on those versions.
"""

from __future__ import annotations

import os
from pathlib import Path

# src/kafka_eventing/localstack/tools.py -> repo root is three levels above the package directory.
_REPO_ROOT = Path(__file__).resolve().parents[3]


class ToolNotFoundError(FileNotFoundError):
    """A Go-built tool is missing from the cache; the message says how to build it."""


def cache_dir() -> Path:
    """The project tool cache: ``KE_CACHE`` or ``<repo>/.cache``."""
    env = os.environ.get("KE_CACHE")
    return Path(env) if env else _REPO_ROOT / ".cache"


def bin_dir() -> Path:
    return cache_dir() / "bin"


def tool_path(name: str) -> Path:
    """Absolute path of the cached tool ``name``; raises :class:`ToolNotFoundError` if it was not built."""
    path = bin_dir() / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ToolNotFoundError(
            f"{name} not found in {bin_dir()}: run `make setup` (or `hack/setup/go-tools.sh {name}`) to build it"
        )
    return path
