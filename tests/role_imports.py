"""What each role imports: the static import graph from ``kafka_eventing.<role>``'s modules through every
kafka_eventing module they import (function-level imports included). The image tier imports these inside each
role's image; the unit tier checks that the role's extra installs them."""

from __future__ import annotations

import sys
from functools import cache

import grimp

# What a role loads by name rather than by an import of ours: gunicorn (`python -m gunicorn`), uvloop (uvicorn's
# loop="auto"), httptools (uvicorn's protocol, under receiver/server.py), cryptography (PyJWT's RSA/EC algorithms
# exist only when it imports).
LOADED_BY_NAME = {"receiver": ("gunicorn", "uvloop", "httptools", "cryptography")}


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("kafka_eventing", include_external_packages=True)


@cache
def imports_of(role: str) -> frozenset[str]:
    """The third-party top-level modules a role imports, and those it loads by name."""
    graph = _graph()
    seen = {m for m in graph.modules if m == f"kafka_eventing.{role}" or m.startswith(f"kafka_eventing.{role}.")}
    todo = list(seen)
    while todo:
        for imported in graph.find_modules_directly_imported_by(todo.pop()):
            if imported not in seen:
                seen.add(imported)
                if imported.startswith("kafka_eventing."):
                    todo.append(imported)
    third_party = {m for m in seen if not m.startswith("kafka_eventing") and m not in sys.stdlib_module_names}
    return frozenset(third_party | set(LOADED_BY_NAME.get(role, ())))
