"""The role images, built by hack/images.sh and run the way Kubernetes runs them under the chart's securityContext.

Each container runs with ``--network none --read-only --tmpfs /tmp --user 65532``: no network (this machine has
none to give), a read-only root filesystem with /tmp as the only writable path (the emptyDir in the chart), and
the numeric non-root UID that ``runAsNonRoot`` verifies.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e._engine import ROLES, ROOT, Engine, base_image, build_role_images, docker_engine, git_sha
from role_imports import imports_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

UID = "65532"
RUN_FLAGS = ("--network", "none", "--read-only", "--tmpfs", "/tmp", "--user", UID)
# What the role images must not carry: the [spark] extra and the dev tools that requirements.lock also pins.
NOT_IN_ROLE_IMAGES = ("pyspark", "pyarrow", "pandas", "matplotlib", "pytest", "mypy", "ruff", "hypothesis", "pip")
# Another role's import that a role's own dependencies bring along: the Kubernetes client requires aiohttp (v35+).
BROUGHT_ALONG = {"aiohttp"}
# Issue #20's budget: what a role's image adds to the Python base it runs on.
BUDGET_OVER_OS_BASE_MB = 80
INSTRUCTION = re.compile(r"^([A-Z]+)\s", re.MULTILINE)

PROBE = """
import importlib.util, json, os, sys
import confluent_kafka, kafka_eventing
try:
    open("/opt/venv/written-at-runtime", "w")
    root_writable = True
except OSError:
    root_writable = False
tmp_file = "/tmp/probe"
open(tmp_file, "w").write("ok")
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "home": os.environ.get("HOME"),
    "python": "%d.%d" % sys.version_info[:2], "librdkafka": confluent_kafka.libversion()[0],
    "package": kafka_eventing.__file__, "root_writable": root_writable, "tmp_writable": open(tmp_file).read() == "ok",
    "main_module": importlib.util.find_spec(sys.argv[1] + ".__main__") is not None,
    "present": [m for m in sys.argv[2:] if importlib.util.find_spec(m) is not None],
}))
"""


def _dockerfile(role: str) -> str:
    return (ROOT / "images" / role / "Dockerfile").read_text()


def test_role_dockerfiles_are_the_base_plus_labels_and_entrypoint() -> None:
    """One package, one recipe: images/base installs it; a role's Dockerfile only names its entrypoint."""
    base = _dockerfile("base")
    # The shared recipe: Debian/Python default, the lock-pinning check, the numeric non-root user (overridable
    # only by build arg, for the spark flavour), no BuildKit-only syntax (a bare dockerd builds it).
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in base
    assert "installed but not pinned by requirements.lock" in base
    assert "ARG ROLE\n" in base and "ARG BUILDER_IMAGE=python:3.11-bookworm" in base
    assert "ARG APP_UID=65532" in base and "USER ${APP_UID}:${APP_UID}" in base
    assert not re.search(r"^# syntax=|--mount=|--chmod=|^COPY <<|^RUN <<", base, re.MULTILINE)
    for role in ROLES:
        text = _dockerfile(role)
        instructions = INSTRUCTION.findall(text)
        # Nothing role-specific hides in images/: no RUN, COPY or USER of its own, the base's layers as they are.
        assert instructions[:2] == ["ARG", "FROM"] and "FROM ${BASE}" in text, role
        assert set(instructions) <= {"ARG", "FROM", "LABEL", "EXPOSE", "ENTRYPOINT"}, (role, instructions)
        assert instructions.count("FROM") == 1, role
        assert f'ENTRYPOINT ["python", "-m", "kafka_eventing.{role}"]' in text
        assert f'org.opencontainers.image.title="kafka-eventing-{role}"' in text
        assert f"# ---- role: {role} ----" in text


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with docker_engine() as eng:
        yield eng


TAG = f"e2e-{git_sha()}"


@pytest.fixture(scope="module")
def images(engine: Engine) -> dict[str, str]:
    return build_role_images(engine, TAG)


def test_role_images_share_every_layer_of_their_base(engine: Engine, images: dict[str, str]) -> None:
    """A role image adds configuration (labels, entrypoint) to its role base, no layer; every role base starts with
    the same OS base layer, which a node stores once."""
    def layers(ref: str) -> list[str]:
        return list(json.loads(engine.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref).stdout))

    for role, image in images.items():
        base = layers(base_image(TAG, role))
        assert len(base) >= 3, role  # the OS base, the user, the venv, the package
        assert layers(image) == base, role
    assert len({layers(image)[0] for image in images.values()}) == 1


@pytest.mark.parametrize("role", ROLES)
def test_image_carries_what_its_role_imports_and_nothing_another_role_does(
        engine: Engine, images: dict[str, str], role: str) -> None:
    """Each role's image imports every module its code imports, and lacks what only the other roles import and the
    dev harness (``kafka_eventing.localstack``), which no role imports."""
    needs = sorted(imports_of(role))
    others = set().union(*(imports_of(r) for r in ROLES if r != role)) - imports_of(role) - BROUGHT_ALONG
    others.add("kafka_eventing.localstack")
    assert {"kubernetes", "confluent_kafka"} <= set(needs)  # the graph really was read
    proc = engine.docker(
        "run", "--rm", *RUN_FLAGS, "--entrypoint", "python", images[role], "-c",
        "import importlib, importlib.util, json, sys; needs, others = json.loads(sys.argv[1]); "
        "[importlib.import_module(m) for m in needs]; "
        "print(json.dumps([m for m in others if importlib.util.find_spec(m) is not None]))",
        json.dumps([needs, sorted(others)]), check=False)
    assert proc.returncode == 0, f"{role} image cannot import what its role imports:\n{proc.stderr[-3000:]}"
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], f"{role} image carries another role's imports"


def test_each_role_adds_at_most_its_budget_to_the_python_base(engine: Engine, images: dict[str, str]) -> None:
    os_base = os.environ.get("BASE_IMAGE") or subprocess.run(
        [str(ROOT / "hack" / "base-image.sh"), "py"], env=engine.env, capture_output=True, text=True,
        check=True).stdout.strip()

    def size(ref: str) -> int:
        return int(engine.docker("image", "inspect", "--format", "{{.Size}}", ref).stdout)

    over = {role: (size(image) - size(os_base)) / 1e6 for role, image in images.items()}
    assert all(mb <= BUDGET_OVER_OS_BASE_MB for mb in over.values()), over


@pytest.mark.parametrize("role", ROLES)
def test_image_runs_as_numeric_nonroot_on_a_read_only_root(engine: Engine, images: dict[str, str], role: str) -> None:
    image = images[role]
    config = json.loads(engine.docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    # runAsNonRoot can only verify a numeric USER; the image must not rely on --user to be non-root.
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["python", "-m", f"kafka_eventing.{role}"]
    assert config["Labels"]["org.opencontainers.image.title"] == f"kafka-eventing-{role}"

    proc = engine.docker("run", "--rm", *RUN_FLAGS, "--entrypoint", "python", image,
                         "-c", PROBE, f"kafka_eventing.{role}", *NOT_IN_ROLE_IMAGES)
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["uid"] == int(UID) and facts["gid"] == int(UID)
    assert facts["home"] == "/tmp"
    assert facts["python"] == "3.11"
    assert facts["package"].startswith("/opt/venv/lib/python3.11/site-packages/kafka_eventing/")
    assert facts["librdkafka"]
    assert facts["root_writable"] is False
    assert facts["tmp_writable"] is True
    assert facts["main_module"] is True, f"kafka_eventing.{role} has no __main__ for the ENTRYPOINT"
    assert facts["present"] == [], f"{role} image carries {facts['present']}"

    # Without --user the image's own USER applies.
    whoami = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "python", image,
                           "-c", "import os; print(os.getuid())")
    assert whoami.stdout.strip() == UID


def test_images_are_labelled_with_source_revision_and_version(engine: Engine, images: dict[str, str]) -> None:
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for role, image in images.items():
        labels = json.loads(engine.docker("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout)
        assert labels["org.opencontainers.image.revision"] == revision, role
        assert labels["org.opencontainers.image.version"] == version, role
        assert labels["org.opencontainers.image.source"].startswith("https://"), role
        tags = json.loads(engine.docker("image", "inspect", "--format", "{{json .RepoTags}}", image).stdout)
        assert not any(t.endswith(":latest") for t in tags), tags


def test_receiver_answers_healthz_in_standalone_file_mode(
        engine: Engine, images: dict[str, str], tmp_path: Path) -> None:
    """The receiver's real entrypoint (gunicorn) starts under the restricted flags and serves /healthz.

    The uvicorn workers must find everything they import in the image. There is no Kafka in a ``--network none``
    container; readiness means "this pod can answer" (channels loaded), not "Kafka is up" (a broker blip must not
    empty the Service), so /readyz answers 200 too.
    """
    config = tmp_path / "config"
    config.mkdir()
    (config / "channels.yaml").write_text(
        "apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\n"
        "metadata: {name: demo, namespace: default}\nspec: {numPartitions: 1}\n")
    config.chmod(0o755)
    (config / "channels.yaml").chmod(0o644)
    name = f"ke-e2e-receiver-{uuid.uuid4().hex[:8]}"
    engine.docker("run", "--detach", "--name", name, *RUN_FLAGS,
                  "--volume", f"{config}:/config:ro",
                  "--env", "KE_CHANNEL_SOURCE=file", "--env", "KE_CHANNELS_FILE=/config/channels.yaml",
                  "--env", "WEB_CONCURRENCY=1",
                  images["receiver"])
    try:
        status = _wait_for_status(engine, name, "/healthz", deadline_s=60)
        assert status == 200, f"/healthz answered {status}\n{_logs(engine, name)}"
        ready = _http_status(engine, name, "/readyz")
        assert ready == 200, f"/readyz answered {ready} with the channels loaded\n{_logs(engine, name)}"
        state = engine.docker("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", _logs(engine, name)
    finally:
        engine.docker("rm", "--force", name, check=False)


HTTP_PROBE = """
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen("http://127.0.0.1:8080" + sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as err:
    print(err.code)
except OSError:
    print("down")
"""


def _http_status(engine: Engine, name: str, path: str) -> int | None:
    # --network none: the only way in is through the container's own loopback, via docker exec.
    proc = engine.docker("exec", name, "python", "-c", HTTP_PROBE, path, check=False, timeout=30)
    out = proc.stdout.strip()
    return int(out) if out.isdigit() else None


def _wait_for_status(engine: Engine, name: str, path: str, deadline_s: float) -> int | None:
    deadline = time.monotonic() + deadline_s
    status = None
    while time.monotonic() < deadline:
        running = engine.docker("inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip()
        if running != "true":
            pytest.fail(f"receiver container exited before answering {path}:\n{_logs(engine, name)}")
        status = _http_status(engine, name, path)
        if status is not None:
            return status
        time.sleep(0.5)
    return status


def _logs(engine: Engine, name: str) -> str:
    proc = engine.docker("logs", "--tail", "40", name, check=False)
    return proc.stdout + proc.stderr
