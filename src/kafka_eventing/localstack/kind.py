"""The Docker engine kind runs on (`make kind-image`, `make test-kind`): a private dockerd in a network namespace
with no route out.

``up`` starts a supervisor under ``unshare --net --mount`` (as :mod:`kafka_eventing.localstack.cluster` does): it
brings up loopback, refuses to go on unless :func:`cluster.check_isolated` passes, and starts dockerd with its data,
exec root and socket under ``$KE_CACHE/kind/docker`` (the data root keeps the node image between runs), no default
bridge, no iptables, and every container's cgroup under ``kafka-eventing-kind``. The networks kind makes are bridges
inside that namespace: nothing a node or a pod sends can leave it. The socket is a file, so ``docker`` (and image
builds) work from anywhere with ``DOCKER_HOST``; ``kind``, ``kubectl`` and ``helm`` reach the API server's
127.0.0.1 port only from inside the namespace (:func:`netns_command`).

Two things this sandbox lacks and kind needs are handled here:
- ``docker run --privileged`` (every kind node) asks for CAP_SYS_RESOURCE, which the machine's bounding set does not
  hold, and runc refuses. dockerd's default runtime is therefore a small wrapper (:data:`RUNC_WRAPPER`) that takes
  that one capability out of the bundle's ``config.json`` (``create``/``run``) and of the ``--process`` file
  (``exec``), then runs Debian's runc with the same arguments.
- The containerd dockerd starts names its shims' sockets under the fixed ``/run/containerd``: a tmpfs there, inside
  the private mount namespace, keeps them off the host.

``down`` stops the supervisor, which removes every container, stops dockerd and kills what is left in the
namespace; after a crashed run it finds dockerd, containerd and the shims by the engine's folder in their arguments
and the nodes by their cgroups. :func:`leftovers` lists what must not survive either.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kafka_eventing.localstack._proc import tail, terminate
from kafka_eventing.localstack.cluster import (
    ClusterError,
    _alive,
    _cmdline,
    _kill_until_gone,
    _netns_inode,
    _netns_of,
    check_isolated,
    kill_cgroup_tree,
    kill_netns_processes,
    netns_command,
    processes_naming,
    remove_cgroup_tree,
)
from kafka_eventing.localstack.tools import cache_dir

CGROUP_PARENT = "kafka-eventing-kind"
RUNTIME = "ke-runc"
#: Made by dockerd on the host's filesystem for kind's ``-v /lib/modules`` when the host has none; removed by down.
MODULES_DIR = Path("/usr/lib/modules")
SHIM_DIR = Path("/run/containerd")
RUNC_WRAPPER = r"""#!/bin/sh
# dockerd's runtime for kind (kafka_eventing.localstack.kind): runc without CAP_SYS_RESOURCE, which this machine's
# capability bounding set lacks (a privileged container asks for every capability, and runc then fails).
set -eu
strip() {
  jq "$2 |= (if . == null then . else with_entries(.value |= map(select(. != \"CAP_SYS_RESOURCE\"))) end)" \
    "$1" >"$1.ke" && mv "$1.ke" "$1"
}
cmd="" bundle="." process="" prev=""
for arg in "$@"; do
  case "$prev" in
    --bundle|-b) bundle=$arg ;;
    --process|-p) process=$arg ;;
  esac
  case "$arg" in
    --bundle=*) bundle=${arg#--bundle=} ;;
    --process=*) process=${arg#--process=} ;;
    create|run|exec) [ -n "$cmd" ] || cmd=$arg ;;
  esac
  prev=$arg
done
case "$cmd" in
  create|run) strip "$bundle/config.json" .process.capabilities ;;
  exec) [ -z "$process" ] || strip "$process" .capabilities ;;
esac
exec /usr/sbin/runc "$@"
"""


class EngineError(ClusterError):
    """The engine could not start (or refused to): the message says why."""


def workdir() -> Path:
    return cache_dir() / "kind"


def docker_dir() -> Path:
    return workdir() / "docker"


def socket_path() -> Path:
    return docker_dir() / "docker.sock"


def docker_host() -> str:
    return f"unix://{socket_path()}"


def _state_file() -> Path:
    return workdir() / "engine.json"


def read_state() -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(_state_file().read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state


def _write_state(state: dict[str, Any]) -> None:
    tmp = _state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(_state_file())


def answers(timeout: float = 20) -> bool:
    try:
        proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                              env={**os.environ, "DOCKER_HOST": docker_host()},
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


# ---------------------------------------------------------------------------------------------- supervisor


class Engine:
    """dockerd in the calling process's (isolated) network and mount namespaces."""

    def __init__(self, outer_netns: int) -> None:
        self.outer_netns = outer_netns
        self.dir = docker_dir()
        self.dockerd: subprocess.Popen[bytes] | None = None
        self.mounted: list[str] = []

    def start(self) -> None:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True)
        # Only loopback may exist before dockerd starts; the bridges kind asks for come later, inside.
        check_isolated(self.outer_netns, allowed_links=("lo",))
        subprocess.run(["mount", "--make-rprivate", "/"], check=True, capture_output=True)
        SHIM_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0711", "kafka-eventing-kind", str(SHIM_DIR)],
                       check=True, capture_output=True)
        self.mounted.append(str(SHIM_DIR))
        for sub in ("data", "exec"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        wrapper = workdir() / "runc-wrapper"
        wrapper.write_text(RUNC_WRAPPER)
        wrapper.chmod(0o755)
        socket_path().unlink(missing_ok=True)
        with (workdir() / "dockerd.log").open("ab") as log:
            self.dockerd = subprocess.Popen(
                ["dockerd", "--data-root", str(self.dir / "data"), "--exec-root", str(self.dir / "exec"),
                 "--pidfile", str(self.dir / "dockerd.pid"), "--host", docker_host(),
                 "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false", "--dns", "127.0.0.1",
                 "--cgroup-parent", f"/{CGROUP_PARENT}", "--add-runtime", f"{RUNTIME}={wrapper}",
                 "--default-runtime", RUNTIME, "--config-file", str(self._config())],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while not answers():
            if self.dockerd.poll() is not None:
                raise EngineError(f"dockerd exited ({self.dockerd.returncode}):\n{tail(workdir() / 'dockerd.log')}")
            if time.monotonic() > deadline:
                raise EngineError(f"dockerd did not answer in 60s:\n{tail(workdir() / 'dockerd.log')}")
            time.sleep(0.3)

    def _config(self) -> Path:
        # An empty daemon.json of its own: a host /etc/docker/daemon.json must not change this engine.
        path = workdir() / "daemon.json"
        path.write_text("{}\n")
        return path

    def stop(self) -> None:
        env = {**os.environ, "DOCKER_HOST": docker_host()}
        if self.dockerd is not None and self.dockerd.poll() is None:
            ids = subprocess.run(["docker", "ps", "-aq"], env=env, capture_output=True, text=True, timeout=60,
                                 check=False).stdout.split()
            if ids:
                subprocess.run(["docker", "rm", "-f", "-v", *ids], env=env, capture_output=True, timeout=180,
                               check=False)
        terminate(self.dockerd, timeout=60)
        kill_netns_processes(_netns_inode(), keep={os.getpid(), os.getppid()})
        kill_cgroup_tree(CGROUP_PARENT)
        remove_cgroup_tree(CGROUP_PARENT)
        for target in reversed(self.mounted):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        self.mounted.clear()


def serve(ttl: float, outer_netns: int) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    state = read_state() or {}
    state.update(pid=os.getpid(), ready=False)
    engine = Engine(outer_netns)
    try:
        _write_state(state)
        engine.start()
        state.update(ready=True, docker_host=docker_host(), netns=f"/proc/{os.getpid()}/ns/net",
                     netns_inode=_netns_inode(), expires_at=time.time() + ttl)
        _write_state(state)
        stop.wait(ttl)
        return 0
    except BaseException as exc:
        state["error"] = f"{type(exc).__name__}: {exc}"
        _write_state(state)
        print(state["error"], file=sys.stderr, flush=True)
        return 1
    finally:
        engine.stop()


def up(ttl: float = 2 * 3600, timeout: float = 120.0) -> dict[str, Any]:
    """Start the engine (or return the running one's state) once dockerd answers."""
    state = read_state()
    if state and state.get("ready") and _alive(int(state.get("pid", 0))) and answers():
        return state
    if state:
        down()
    workdir().mkdir(parents=True, exist_ok=True)
    # What down must remove again: only what this run made on the host's filesystem.
    _write_state({"made": [str(p) for p in (MODULES_DIR, SHIM_DIR) if not p.exists()]})
    log_path = workdir() / "supervisor.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "--fork", "--kill-child=SIGTERM",
             sys.executable, "-m", "kafka_eventing.localstack.kind", "serve", "--ttl", str(ttl),
             "--outer-netns", str(_netns_inode())],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state()
        if state and state.get("error"):
            down()
            raise EngineError(f"engine failed: {state['error']} (log {log_path})")
        if state and state.get("ready"):
            return state
        if proc.poll() is not None:
            down()
            raise EngineError(f"engine supervisor exited ({proc.returncode}):\n{tail(log_path)}")
        time.sleep(0.3)
    down()
    raise EngineError(f"engine not ready in {timeout:.0f}s:\n{tail(log_path)}")


def down(timeout: float = 240.0) -> None:
    """Stop the supervisor (which removes the containers and stops dockerd); clean up after one that died."""
    state = read_state()
    if state is None:
        return
    pid = int(state.get("pid", 0))
    # None when the supervisor is gone, or killed and not yet reaped (a zombie has no namespaces left).
    inode = _netns_of(pid) if pid else None
    if inode is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        kill_netns_processes(inode, keep={os.getpid()})
    # A supervisor killed with SIGKILL leaves its dockerd, containerd and shims (they name the engine's folder and
    # live in another network namespace than ours) and the nodes' processes (in the engine's cgroups).
    _kill_until_gone(lambda: {p for p in _engine_processes() if _netns_of(p) not in (None, _netns_inode())}, 30.0)
    kill_cgroup_tree(CGROUP_PARENT)
    remove_cgroup_tree(CGROUP_PARENT)
    for made in state.get("made", ()):
        with contextlib.suppress(OSError):
            Path(made).rmdir()  # only when empty: never anything the host put there since
    _state_file().unlink(missing_ok=True)


def _engine_processes() -> set[int]:
    return processes_naming(docker_dir())


def _netns_processes(inode: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _netns_of(int(entry.name)) == inode:
            found.add(int(entry.name))
    return found


def leftovers(made: list[str] | None = None, netns_inode: int | None = None) -> list[str]:
    """What a stopped engine must not leave (empty when clean): its processes, cgroups and mounts, the paths in
    ``made`` (those that did not exist before it started) and, given the engine's network namespace
    (``netns_inode`` of its state), any process still in it: whatever the nodes or pods started, by any path."""
    found = [f"cgroup {d}" for d in Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PARENT}")]
    found += [f"cgroup {d}" for d in Path("/sys/fs/cgroup").glob(CGROUP_PARENT)]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {line.split()[4]}" for line in mounts.splitlines()
              if "kafka-eventing-kind" in line or str(workdir()) in line]
    found += [f"process {pid} {_cmdline(pid)}" for pid in sorted(_engine_processes())]
    found += [f"path {p}" for p in made or () if Path(p).exists()]
    if netns_inode is not None:
        found += [f"process {pid} in the engine's network namespace: {_cmdline(pid)}"
                  for pid in sorted(_netns_processes(netns_inode))]
    return found


@contextlib.contextmanager
def engine(ttl: float = 2 * 3600) -> Iterator[dict[str, Any]]:
    """The engine for a ``with`` block: started if none runs (and then stopped at the end), else reused."""
    state = read_state()
    running = bool(state and state.get("ready") and _alive(int(state.get("pid", 0))) and answers())
    state = up(ttl)
    try:
        yield state
    finally:
        if not running:
            down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-eventing kind engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--ttl", type=float, default=2 * 3600, help="seconds before the engine stops by itself")
        p.add_argument("--outer-netns", type=int, default=0, help=argparse.SUPPRESS)
    run = sub.add_parser("run", help="run a command with DOCKER_HOST set to the engine (started and stopped "
                                     "around it unless one runs)")
    run.add_argument("--netns", action="store_true", help="run it inside the engine's network namespace")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            if not args.outer_netns:
                parser.error("serve is started by `up`")
            return serve(args.ttl, args.outer_netns)
        if args.command == "up":
            state = up(args.ttl)
            print(f"engine ready: DOCKER_HOST={state['docker_host']}; kind, kubectl and helm run inside its "
                  f"network namespace: {' '.join(netns_command(int(state['pid'])))} <command>")
            return 0
        if args.command == "run":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                parser.error("run needs a command")
            with engine() as state:
                prefix = netns_command(int(state["pid"])) if args.netns else []
                return subprocess.run([*prefix, *cmd], env={**os.environ, "DOCKER_HOST": state["docker_host"]},
                                      check=False).returncode
        if args.command == "down":
            state = read_state() or {}
            down()
            left = leftovers(state.get("made", []), state.get("netns_inode"))
            print("engine stopped" + (f"; LEFT BEHIND: {left}" if left else ", nothing left behind"))
            return 1 if left else 0
    except ClusterError as exc:
        print(exc, file=sys.stderr)
        return 1
    current = read_state()
    print(json.dumps(current, indent=2) if current else "engine is not running")
    return 0 if current else 3


if __name__ == "__main__":
    sys.exit(main())
