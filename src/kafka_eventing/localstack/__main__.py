"""`make local-up` / `make local-down`: the same real parts the tests use, started for people.

``up`` starts a detached supervisor that runs a Kafka node and a Kubernetes control plane on loopback, waits
until both answer, and prints how to reach them. The supervisor stops everything on ``down``, on SIGTERM, or
when its time-to-live runs out (default 4 h), so nothing is left running for ever.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.tools import cache_dir


def _state_dir() -> Path:
    return cache_dir() / "local"


def _state_file() -> Path:
    return _state_dir() / "state.json"


def _read_state() -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(_state_file().read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(ttl: float, with_kube: bool) -> int:
    """The supervisor: run the parts until SIGTERM/SIGINT or the TTL, then stop them."""
    from kafka_eventing.localstack.kube import KubeControlPlane

    workdir = _state_dir()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    kafka = KafkaNode(workdir / "kafka")
    kube: KubeControlPlane | None = None
    state: dict[str, Any] = {"pid": os.getpid(), "ready": False}
    try:
        kafka.start()
        state.update(
            bootstrap_servers=kafka.bootstrap_servers,
            sasl_ssl_bootstrap_servers=kafka.sasl_ssl_bootstrap_servers,
            sasl_user=kafka.scram_user.name,
            ca_file=str(kafka.ca_path),
            kafka_log=str(kafka.log_path),
        )
        # The SCRAM password goes to a 0600 file, never to stdout or the state file.
        secret = workdir / "kafka-sasl-password"
        secret.write_text(kafka.scram_user.password)
        secret.chmod(0o600)
        state["sasl_password_file"] = str(secret)
        if with_kube:
            kube = KubeControlPlane(workdir / "kube")
            kube.start()
            state["kubeconfig"] = str(kube.kubeconfig)
        state["ready"] = True
        state["expires_at"] = time.time() + ttl
        _state_file().write_text(json.dumps(state, indent=2))
        stop.wait(ttl)
        return 0
    except Exception as exc:
        state["error"] = str(exc)
        _state_file().write_text(json.dumps(state, indent=2))
        return 1
    finally:
        if kube is not None:
            kube.stop()
        kafka.stop()
        with contextlib.suppress(FileNotFoundError):
            if (_read_state() or {}).get("pid") == os.getpid():
                _state_file().unlink()


def up(ttl: float, with_kube: bool, timeout: float = 240.0) -> int:
    state = _read_state()
    if state and _alive(int(state.get("pid", 0))):
        print("already running:")
        _print(state)
        return 0
    _state_dir().mkdir(parents=True, exist_ok=True)
    _state_file().unlink(missing_ok=True)
    log = (_state_dir() / "supervisor.log").open("ab")
    args = [sys.executable, "-m", "kafka_eventing.localstack", "serve", "--ttl", str(ttl)]
    if not with_kube:
        args.append("--no-kube")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _read_state()
        if state and state.get("error"):
            print(f"local stack failed: {state['error']}", file=sys.stderr)
            return 1
        if state and state.get("ready"):
            _print(state)
            return 0
        if proc.poll() is not None:
            print(f"local stack exited early; see {_state_dir() / 'supervisor.log'}", file=sys.stderr)
            return 1
        time.sleep(0.5)
    print("local stack did not become ready in time; stopping it", file=sys.stderr)
    os.killpg(proc.pid, signal.SIGTERM)
    return 1


def down(timeout: float = 60.0) -> int:
    state = _read_state()
    if not state or not _alive(int(state.get("pid", 0))):
        print("local stack is not running")
        _state_file().unlink(missing_ok=True)
        return 0
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.3)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    print("local stack stopped")
    return 0


def _print(state: dict[str, Any]) -> None:
    print(f"Kafka bootstrap servers (PLAINTEXT): {state['bootstrap_servers']}")
    print(f"Kafka SASL_SSL (SCRAM-SHA-512):      {state['sasl_ssl_bootstrap_servers']}  "
          f"user {state['sasl_user']}, password in {state['sasl_password_file']}, CA {state['ca_file']}")
    if state.get("kubeconfig"):
        print(f"Kubernetes API kubeconfig:           {state['kubeconfig']}")
        print(f"  try: kubectl --kubeconfig {state['kubeconfig']} get namespaces")
    expires = state.get("expires_at")
    if expires:
        print(f"Stops by itself at {time.strftime('%H:%M:%S', time.localtime(expires))}; `make local-down` sooner.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-eventing local", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--ttl", type=float, default=4 * 3600, help="seconds before the stack stops by itself")
        p.add_argument("--no-kube", action="store_true", help="Kafka only")
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args.ttl, not args.no_kube)
    if args.command == "serve":
        return serve(args.ttl, not args.no_kube)
    if args.command == "down":
        return down()
    state = _read_state()
    if state and _alive(int(state.get("pid", 0))):
        _print(state)
        return 0
    print("local stack is not running")
    return 3


if __name__ == "__main__":
    sys.exit(main())
