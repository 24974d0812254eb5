"""A Docker engine for the docker/e2e tiers, and the role images built on it by ``hack/images.sh``.

The engine is ``DOCKER_HOST`` when it answers; otherwise the private dockerd that ``hack/images.sh`` also uses
(data, exec root and socket under ``$KE_CACHE/docker``; bridge and iptables off). A private engine already running
there is reused and left running; one started here is stopped when the ``with`` block ends. Every reason this
machine cannot provide an engine becomes a ``pytest.skip`` naming it; a broken Dockerfile or build script is a
failure, never a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KE_CACHE", str(ROOT / ".cache")))
DOCKER_DIR = CACHE / "docker"
PRIVATE_SOCK = DOCKER_DIR / "docker.sock"
ROLES = ("receiver", "dispatcher", "controller")
START_DEADLINE_S = 60.0


@dataclass(frozen=True)
class Engine:
    docker_host: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.docker_host}

    def docker(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc

    def answers(self) -> bool:
        return _answers(self.docker_host)

    def has_image(self, ref: str) -> bool:
        return self.docker("image", "inspect", ref, check=False).returncode == 0


def _answers(docker_host: str) -> bool:
    try:
        proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                              env={**os.environ, "DOCKER_HOST": docker_host},
                              capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def docker_engine() -> Iterator[Engine]:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on PATH")
    given = os.environ.get("DOCKER_HOST")
    if given and _answers(given):
        yield Engine(given)
        return
    private = f"unix://{PRIVATE_SOCK}"
    if _answers(private):
        yield Engine(private)
        return
    where = f"DOCKER_HOST={given} does not answer" if given else "DOCKER_HOST is unset"
    if shutil.which("dockerd") is None:
        pytest.skip(f"no Docker engine: {where} and dockerd is not installed (apt-get install docker.io)")
    if os.geteuid() != 0:
        pytest.skip(f"no Docker engine: {where} and a private dockerd needs root (running as uid {os.geteuid()})")
    (DOCKER_DIR / "data").mkdir(parents=True, exist_ok=True)
    (DOCKER_DIR / "exec").mkdir(parents=True, exist_ok=True)
    PRIVATE_SOCK.unlink(missing_ok=True)
    log_path = DOCKER_DIR / "dockerd.log"
    with log_path.open("wb") as log:
        dockerd = subprocess.Popen(
            ["dockerd", "--data-root", str(DOCKER_DIR / "data"), "--exec-root", str(DOCKER_DIR / "exec"),
             "--host", private, "--pidfile", str(DOCKER_DIR / "dockerd.pid"),
             "--bridge=none", "--iptables=false", "--ip6tables=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not _answers(private):
            if dockerd.poll() is not None:
                pytest.skip(f"dockerd could not start (exit {dockerd.returncode}): {_log_tail(log_path)}")
            if time.monotonic() > deadline:
                pytest.skip(f"dockerd did not answer within {START_DEADLINE_S:.0f}s: {_log_tail(log_path)}")
            time.sleep(0.2)
        yield Engine(private)
    finally:
        if dockerd.poll() is None:
            dockerd.send_signal(signal.SIGTERM)
            try:
                dockerd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                dockerd.kill()
                dockerd.wait(timeout=10)


def git_sha() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "dev"


def build_role_images(engine: Engine, tag: str, roles: tuple[str, ...] = ROLES,
                      extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build ``roles`` with ``hack/images.sh`` (the very script ``make images`` runs); returns role → image ref.

    The script builds each role's ``kafka-eventing-<role>-base:<tag>`` first, and before that, without
    ``BASE_IMAGE`` (``JRE_BASE_IMAGE``, ``BUILDER_IMAGE``) in the environment, the local Debian OS bases, which need
    root and debootstrap; their absence is a skip, a failing build is a test failure.
    """
    env = {**engine.env, "IMAGE_PREFIX": "kafka-eventing-", **(extra_env or {})}
    needs = [var for var, wanted in (("BASE_IMAGE", set(roles) - {"spark"}), ("JRE_BASE_IMAGE", {"spark"} & set(roles)),
                                     ("BUILDER_IMAGE", set(roles)))
             if wanted and not env.get(var)]
    if needs and (os.geteuid() != 0 or shutil.which("debootstrap") is None):
        pytest.skip(f"{' and '.join(needs)} unset and hack/base-image.sh needs root and debootstrap to build one")
    proc = subprocess.run([str(ROOT / "hack" / "images.sh"), tag, *roles], env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, f"hack/images.sh failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return {role: f"kafka-eventing-{role}:{tag}" for role in roles}


def base_image(tag: str, role: str) -> str:
    """The images/base build (with ``ROLE=<role>``) a role image is ``FROM`` (hack/images.sh names it)."""
    return f"kafka-eventing-{role}-base:{tag}"
