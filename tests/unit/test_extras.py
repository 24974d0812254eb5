"""Each role's extra installs what the role imports: its image is `dependencies` + that extra alone
(images/base/Dockerfile), so a module one role reaches and its extra lacks crash-loops that role's pods. The image
tier (tests/e2e/test_images.py) imports the same modules inside the built images; this finds the gap without one."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from role_imports import imports_of

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("receiver", "dispatcher", "controller")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(requirements: list[str]) -> set[str]:
    """The distributions those requirements install (their own requirements followed, markers evaluated as on this
    interpreter, extras followed only where asked)."""
    out: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = _canonical(req.name)
        if name == "kafka-eventing":
            continue  # `all` and `dev` name the project's own extras; each role is checked on its own
        asked = set(req.extras)
        key = f"{name}[{','.join(sorted(asked))}]"
        if key in out:
            continue
        out.update({name, key})
        for child in md.requires(req.name) or ():
            todo.extend((Requirement(child), e) for e in ["", *sorted(asked)])
    return {n for n in out if "[" not in n}


@pytest.mark.parametrize("role", ROLES)
def test_a_roles_extra_installs_every_module_the_role_imports(role: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _installed([*project["dependencies"], *project["optional-dependencies"][role]])
    providers = md.packages_distributions()
    needs = imports_of(role)
    assert {"kubernetes", "confluent_kafka"} <= needs  # the graph really was read
    missing = {module: providers.get(module.split(".")[0], ["?"]) for module in needs
               if not any(_canonical(d) in installed for d in providers.get(module.split(".")[0], ()))}
    assert not missing, f"the {role} extra (with `dependencies`) does not install what {role} imports: {missing}"


def test_the_check_sees_a_missing_extra() -> None:
    """Without lark the receiver's EventPolicy filters cannot compile: the closure above must not contain it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    without = [r for r in project["optional-dependencies"]["receiver"] if Requirement(r).name != "lark"]
    assert "lark" in imports_of("receiver")
    assert "lark" not in _installed([*project["dependencies"], *without])
