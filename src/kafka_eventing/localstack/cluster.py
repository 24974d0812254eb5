"""`make cluster-up` / `make cluster-down`: a one-node Kubernetes cluster whose pods really run.

Everything — Kafka, etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet and every
pod — runs inside a network namespace and a mount namespace that ``up`` creates (``unshare --net --mount``). The
network namespace has loopback and one bridge (``ke0``, the pods' network) and no route out: :func:`check_isolated`
verifies that before anything starts and refuses otherwise. Clients (kubectl, helm, tests) join it with
``nsenter --net=/proc/<pid>/ns/net`` (:func:`netns_command`) or :func:`enter_netns`.

Addresses inside the namespace:
- ``10.88.0.1`` on ``ke0``: the node's InternalIP and Kafka's PLAINTEXT listener, reachable from pods;
- ``10.0.0.1`` on ``lo``: the ``kubernetes`` Service IP, where kube-apiserver serves on 443, so that in-cluster
  clients work unchanged without kube-proxy (no other Service IP is routed; there is no cluster DNS).

What stays behind after ``down``: nothing. Runtime state (containerd's store, kubelet's root, CNI state, pod logs)
lives on tmpfs mounts inside the private mount namespace; pod cgroups live under one cgroup root per run, removed
on stop; every process left in the namespace (containerd shims) is killed; the namespaces go with the last process.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from kafka_eventing.localstack._proc import tail, terminate
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane
from kafka_eventing.localstack.tools import cache_dir, tool_path

BRIDGE = "ke0"
NODE_IP = "10.88.0.1"
POD_SUBNET = "10.88.0.0/16"
SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service (first address of kube.SERVICE_CLUSTER_IP_RANGE)
NODE_NAME = "ke-node"
PAUSE_IMAGE = "localhost/kafka-eventing-pause:1"
#: Every registry resolves to this closed port: a pull the cluster should not make fails at once, without DNS.
CLOSED_REGISTRY = "http://127.0.0.1:1"
#: Host paths containerd, the CNI plugins and the kubelet use whatever their configuration says; each gets a tmpfs
#: of its own inside the private mount namespace.
FIXED_PATHS = ("/run/containerd", "/run/netns", "/var/lib/cni", "/var/log/pods", "/var/log/containers")
#: What the kubelet would otherwise write machine-wide (pkg/kubelet/cm setupKernelTunables): inside the mount
#: namespace these /proc/sys files are bind-mounted over with files that already hold the kubelet's values.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
_PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
static void quit(int s) { (void)s; _exit(0); }
int main(void) {
  signal(SIGINT, quit); signal(SIGTERM, quit); signal(SIGCHLD, reap);
  for (;;) pause();
}
"""


class ClusterError(RuntimeError):
    """The cluster could not start (or refused to): the message says which part and why."""


class IsolationError(ClusterError):
    """The process is not in a network namespace of its own without a route out."""


def workdir() -> Path:
    return cache_dir() / "cluster"


def _state_file() -> Path:
    return workdir() / "state.json"


def read_state() -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(_state_file().read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state


def _run(*args: str, timeout: float = 60) -> str:
    out = subprocess.run(args, check=False, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise ClusterError(f"`{' '.join(args)}` failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def _netns_inode(pid: int | str = "self") -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


# ---------------------------------------------------------------------------------------------- isolation


def setup_network() -> None:
    """Loopback, the pods' bridge and the Service IP, in the (new, empty) network namespace of this process."""
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{NODE_IP}/16", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")


def check_isolated(outer_netns: int, allowed_links: tuple[str, ...] = ("lo", BRIDGE)) -> None:
    """Raise :class:`IsolationError` unless this process's network namespace is not ``outer_netns`` (the inode of
    the namespace the cluster was started from), has no default route in any routing table (IPv4 or IPv6), and has
    no interface but ``allowed_links`` (and pod veths enslaved to the bridge)."""
    if _netns_inode() == outer_netns:
        raise IsolationError("refusing to start: this process is in the network namespace it was started from")
    for family in ("-4", "-6"):
        routes = json.loads(_run("ip", "-j", family, "route", "show", "table", "all") or "[]")
        default = [r for r in routes if r.get("dst") == "default"]
        if default:
            raise IsolationError(f"refusing to start: the namespace has a default route ({family}): {default}")
    for link in json.loads(_run("ip", "-j", "link", "show") or "[]"):
        name = link.get("ifname", "")
        if name not in allowed_links and link.get("master") != BRIDGE:
            raise IsolationError(f"refusing to start: unexpected interface {name!r} in the namespace")


def netns_command(pid: int) -> list[str]:
    """The prefix that runs a command in the cluster's network namespace (held by process ``pid``)."""
    return ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]


def enter_netns(pid: int) -> None:
    """Move the calling thread into the cluster's network namespace. Call it first in a fresh, single-threaded
    process (a multiprocessing "spawn" worker's initializer): threads and sockets created later follow."""
    outer = _netns_inode()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET) failed")
    finally:
        os.close(fd)
    check_isolated(outer)


# ---------------------------------------------------------------------------------------------- images


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_docker_archive(path: Path, ref: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str]) -> None:
    """A one-layer image as a ``docker save`` archive (what ``ctr images import`` reads), without an engine."""
    layer = _tar_bytes(files)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64" if os.uname().machine == "x86_64" else "arm64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]).encode()
    path.write_bytes(_tar_bytes({"manifest.json": (manifest, 0o644), config_name: (config, 0o644),
                                 "layer.tar": (layer, 0o644)}))


def pause_image(out_dir: Path) -> Path:
    """The sandbox image: a static C binary that sleeps until a signal and reaps children (built once)."""
    archive = out_dir / "pause.tar"
    if archive.exists():
        return archive
    out_dir.mkdir(parents=True, exist_ok=True)
    src, binary = out_dir / "pause.c", out_dir / "pause"
    src.write_text(_PAUSE_C)
    _run("gcc", "-static", "-Os", "-s", "-o", str(binary), str(src), timeout=120)
    write_docker_archive(archive, PAUSE_IMAGE, {"pause": (binary.read_bytes(), 0o755)}, ["/pause"])
    return archive


def image_archives() -> list[Path]:
    """The role images saved by `make cluster-images` (hack/images.sh with KE_SAVE_IMAGES)."""
    return sorted((workdir() / "images").glob("*.tar"))


def archive_refs(archives: list[Path] | None = None) -> list[str]:
    """The image references (``RepoTags``) in docker-save archives, as containerd names them."""
    refs = []
    for archive in image_archives() if archives is None else archives:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("manifest.json")
            for entry in json.load(member) if member else ():
                for tag in entry.get("RepoTags") or ():
                    refs.append(tag if "/" in tag.split(":")[0] else f"docker.io/library/{tag}")
    return refs


# ---------------------------------------------------------------------------------------------- the node


class NodeCluster:
    """Kafka + control plane + containerd + kubelet in the calling process's (isolated) namespaces.

    Must run as root inside the network and mount namespaces ``up`` creates; :meth:`start` checks that first.
    """

    def __init__(self, root: Path, *, outer_netns: int, images: list[Path] | None = None,
                 start_timeout: float = 300.0) -> None:
        self.root = root.resolve()
        self.outer_netns = outer_netns
        self.rt = self.root / "rt"  # tmpfs: containerd's store, kubelet's root, CNI config and state
        self.images = list(images or [])
        self.start_timeout = start_timeout
        self.cgroup_root = f"kafka-eventing-{os.getpid()}"
        self.kafka = KafkaNode(self.root / "kafka", host=NODE_IP)
        self.kube = KubeControlPlane(self.root / "kube", scheduler=True, bind_address="0.0.0.0", secure_port=443,
                                     issuer_host=SERVICE_IP)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._mounts: list[str] = []
        self._created_dirs: list[Path] = []

    @property
    def containerd_socket(self) -> Path:
        return self.rt / "containerd" / "containerd.sock"

    @property
    def kubelet_log(self) -> Path:
        return self.root / "logs" / "kubelet.log"

    def start(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the cluster needs root (containerd, kubelet, mounts)")
        check_isolated(self.outer_netns)
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        # Every run starts from an empty broker: no topic outlives the cluster that made it.
        shutil.rmtree(self.kafka.workdir, ignore_errors=True)
        try:
            self._mount_private_dirs()
            self._progress("Kafka")
            self.kafka.start()
            self._progress("control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)")
            self.kube.start()
            self._progress("containerd")
            self._start_containerd()
            self._import_images([pause_image(self.root / "pause"), *self.images])
            self._progress("kubelet")
            self._start_kubelet()
            self._wait_node_ready()
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _progress(what: str) -> None:
        print(f"[cluster] starting {what}", flush=True)

    # -- mounts ----------------------------------------------------------------------------------------
    def _mount(self, *args: str) -> None:
        _run("mount", *args)
        self._mounts.append(args[-1])

    def _mount_private_dirs(self) -> None:
        # Nothing mounted here reaches the host: up runs us under `unshare --mount` (private propagation).
        # Make sure of it before the first mount, in case the caller's namespace was set up differently.
        _run("mount", "--make-rprivate", "/")
        self.rt.mkdir(parents=True, exist_ok=True)
        self._mount("-t", "tmpfs", "-o", "mode=0755", "kafka-eventing-rt", str(self.rt))
        for fixed in FIXED_PATHS:
            path = Path(fixed)
            if not path.exists():
                path.mkdir(parents=True)
                self._created_dirs.append(path)
            self._mount("-t", "tmpfs", "-o", "mode=0755", "kafka-eventing-rt", fixed)
        # containerd pins pod network namespaces with bind mounts under /run/netns; they must propagate.
        _run("mount", "--make-shared", "/run/netns")
        sysctl_dir = self.rt / "sysctl"
        sysctl_dir.mkdir()
        for key, value in KUBELET_SYSCTLS.items():
            proc = Path("/proc/sys") / key
            if proc.read_text().strip() == value:
                continue
            fake = sysctl_dir / key.replace("/", ".")
            fake.write_text(value + "\n")
            self._mount("--bind", str(fake), str(proc))

    def _unmount_all(self) -> None:
        for target in reversed(self._mounts):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        self._mounts.clear()
        for path in reversed(self._created_dirs):
            with contextlib.suppress(OSError):
                path.rmdir()
        self._created_dirs.clear()

    # -- containerd ------------------------------------------------------------------------------------
    def _launch(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.root / "logs" / f"{name}.log").open("ab")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self._procs[name] = proc
        return proc

    def _containerd_config(self) -> Path:
        base = self.rt / "containerd"
        certs = base / "certs.d" / "_default"
        certs.mkdir(parents=True)
        (certs / "hosts.toml").write_text(
            f'server = "{CLOSED_REGISTRY}"\n[host."{CLOSED_REGISTRY}"]\n  capabilities = ["pull", "resolve"]\n')
        net_d = self.rt / "cni" / "net.d"
        net_d.mkdir(parents=True)
        # Pods in their own network namespaces on the bridge; the bridge's address (the gateway) is the node.
        # No masquerade and no forwarding: packets for anything but the bridge's subnet and the namespace's own
        # addresses have nowhere to go.
        (net_d / "10-kafka-eventing.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "kafka-eventing",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.rt / "cni" / "ipam")},
            }],
        }, indent=2))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.internal.v1.opt"]
[grpc]
  address = "{self.containerd_socket}"
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{net_d}"
  [{cri}.registry]
    config_path = "{base / 'certs.d'}"
"""
        path = base / "config.toml"
        path.write_text(config)
        return path

    def _start_containerd(self) -> None:
        config = self._containerd_config()
        proc = self._launch("containerd", ["containerd", "--config", str(config)])
        self._wait(proc, "containerd", lambda: self.containerd_socket.is_socket()
                   and self._ctr("version").returncode == 0)

    def _ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
                              check=False, capture_output=True, text=True, timeout=timeout)

    def _import_images(self, archives: list[Path]) -> None:
        for archive in archives:
            print(f"[cluster] importing {archive.name} ({archive.stat().st_size // 2**20} MB)", flush=True)
            t0 = time.monotonic()
            out = self._ctr("images", "import", "--snapshotter", "overlayfs", str(archive))
            if out.returncode != 0:
                raise ClusterError(f"importing {archive} failed: {out.stderr.strip()}")
            print(f"[cluster] imported {archive.name} in {time.monotonic() - t0:.1f}s", flush=True)

    # -- kubelet ---------------------------------------------------------------------------------------
    def _create_cgroup_root(self) -> None:
        """The kubelet wants its cgroup root to exist in every hierarchy; a new cpuset needs its parent's CPUs
        and memory nodes before a task may join it."""
        base = Path("/sys/fs/cgroup")
        tops = [base] if (base / "cgroup.procs").exists() else [
            d for d in base.iterdir() if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").exists()]
        for top in tops:
            path = top / self.cgroup_root
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (top / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((top / name).read_text())

    def _start_kubelet(self) -> None:
        self._create_cgroup_root()
        root = self.rt / "kubelet"
        root.mkdir()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            # The API server (logs, exec) reaches the kubelet on the node address, inside the namespace. The
            # namespace holds nothing but this cluster, so the kubelet API allows what the API server asks.
            "address": NODE_IP, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True, "cgroupRoot": f"/{self.cgroup_root}",
            "enforceNodeAllocatable": ["pods"], "failSwapOn": False, "failCgroupV1": False,
            "resolvConf": "", "makeIPTablesUtilChains": False, "podLogsDir": "/var/log/pods",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "maxPods": 60, "registerNode": True,
            "staticPodPath": "", "syncFrequency": "10s", "fileCheckFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s", "localStorageCapacityIsolation": True,
        }
        config_path = root / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        proc = self._launch("kubelet", [
            str(tool_path("kubelet")), f"--config={config_path}", f"--kubeconfig={self.kube.kubeconfig}",
            f"--root-dir={root}", f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}", "--v=1",
        ])
        self._wait(proc, "kubelet", lambda: self._kubectl("get", "node", NODE_NAME).returncode == 0)

    def _kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(tool_path("kubectl")), f"--kubeconfig={self.kube.kubeconfig}", *args],
                              check=False, capture_output=True, text=True, timeout=timeout)

    def _wait_node_ready(self) -> None:
        def ready() -> bool:
            out = self._kubectl("get", "node", NODE_NAME, "-o",
                                "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
            return out.stdout.strip() == "True"

        self._wait(self._procs["kubelet"], "node Ready", ready)
        print(f"[cluster] node {NODE_NAME} Ready", flush=True)

    def _wait(self, proc: subprocess.Popen[bytes], what: str, check: Any) -> None:
        deadline = time.monotonic() + self.start_timeout
        name = next(n for n, p in self._procs.items() if p is proc)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited ({proc.returncode}) before {what}:\n"
                                   f"{tail(self.root / 'logs' / f'{name}.log')}")
            if check():
                return
            time.sleep(0.5)
        raise ClusterError(f"{what} not reached in {self.start_timeout:.0f}s:\n"
                           f"{tail(self.root / 'logs' / f'{name}.log')}")

    # -- stop ------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop everything and remove what the run made outside its tmpfs mounts (cgroups, processes)."""
        terminate(self._procs.pop("kubelet", None), timeout=20)
        kill_cgroup_tree(self.cgroup_root)
        containerd = self._procs.get("containerd")
        if containerd is not None and containerd.poll() is None:
            # Containers outside the pods' cgroups (none are expected): their tasks, through containerd.
            for task in self._ctr("tasks", "ls", "-q", timeout=30).stdout.split():
                self._ctr("tasks", "kill", "-s", "SIGKILL", "--all", task, timeout=30)
        terminate(self._procs.pop("containerd", None), timeout=20)
        self.kube.stop()
        self.kafka.stop()
        # unshare (our parent) shares the namespace and exits after us.
        kill_netns_processes(_netns_inode(), keep={os.getpid(), os.getppid()})
        remove_cgroup_tree(self.cgroup_root)
        self._unmount_all()


# ---------------------------------------------------------------------------------------------- cleanup


def _cgroup_dirs(cgroup_root: str) -> Iterator[Path]:
    """Every cgroup directory of ``cgroup_root`` in every mounted hierarchy, deepest first."""
    base = Path("/sys/fs/cgroup")
    tops = [base / cgroup_root] + [d / cgroup_root for d in base.iterdir() if d.is_dir() and not d.is_symlink()]
    for top in tops:
        if (top / "cgroup.procs").exists():
            yield from sorted((p.parent for p in top.rglob("cgroup.procs")), key=lambda p: -len(p.parts))


def _kill_until_gone(find: Callable[[], set[int]], timeout: float) -> None:
    """SIGKILL what ``find`` returns, again and again, until it returns nothing or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = find()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def kill_cgroup_tree(cgroup_root: str, timeout: float = 20.0) -> None:
    """SIGKILL every process in the pods' cgroups until they are empty."""
    _kill_until_gone(lambda: {int(p) for d in _cgroup_dirs(cgroup_root)
                              for p in (d / "cgroup.procs").read_text().split()}, timeout)


def remove_cgroup_tree(cgroup_root: str) -> None:
    for d in _cgroup_dirs(cgroup_root):
        with contextlib.suppress(OSError):
            d.rmdir()


def kill_netns_processes(inode: int, keep: set[int], timeout: float = 20.0) -> None:
    """SIGKILL every process in the network namespace ``inode`` but ``keep`` (containerd shims reparented away
    from us, anything a pod on the node network left)."""

    def in_netns() -> set[int]:
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in keep:
                continue
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino == inode:
                    found.add(int(entry.name))
        return found

    _kill_until_gone(in_netns, timeout)


# ---------------------------------------------------------------------------------------------- supervisor


def serve(ttl: float, outer_netns: int, extra_images: list[Path] | None = None) -> int:
    """Inside the namespaces: set the network up, check it, run the cluster until SIGTERM or the TTL."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    state: dict[str, Any] = {"pid": os.getpid(), "ready": False}
    cluster: NodeCluster | None = None
    try:
        setup_network()
        check_isolated(outer_netns)
        cluster = NodeCluster(workdir(), outer_netns=outer_netns, images=[*image_archives(), *(extra_images or [])])
        state["cgroup_root"] = cluster.cgroup_root
        _state_file().write_text(json.dumps(state))
        cluster.start()
        state.update(ready=True, kubeconfig=str(cluster.kube.kubeconfig), node=NODE_NAME, node_ip=NODE_IP,
                     bootstrap_servers=cluster.kafka.bootstrap_servers, expires_at=time.time() + ttl,
                     netns=f"/proc/{os.getpid()}/ns/net")
        _state_file().write_text(json.dumps(state, indent=2))
        stop.wait(ttl)
        return 0
    except BaseException as exc:
        state["error"] = f"{type(exc).__name__}: {exc}"
        _state_file().write_text(json.dumps(state, indent=2))
        print(state["error"], file=sys.stderr, flush=True)
        return 1
    finally:
        if cluster is not None:
            cluster.stop()
        with contextlib.suppress(FileNotFoundError):
            if (read_state() or {}).get("pid") == os.getpid():
                _state_file().unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def up(ttl: float, timeout: float = 420.0, extra_images: list[Path] | None = None) -> dict[str, Any]:
    """Start the supervisor in new network + mount namespaces; return its state once the node is Ready.
    ``extra_images``: docker-save archives imported besides `make cluster-images`' (the spark image's)."""
    state = read_state()
    if state and _alive(int(state.get("pid", 0))) and state.get("ready"):
        return state
    if state:
        down()
    workdir().mkdir(parents=True, exist_ok=True)
    _state_file().unlink(missing_ok=True)
    log_path = workdir() / "supervisor.log"
    with log_path.open("ab") as log:
        # --kill-child: if unshare itself is killed, the supervisor gets SIGKILL rather than living on unwatched
        # (its stop() would not run then; `down` still cleans up from the state file).
        proc = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "--fork", "--kill-child=SIGTERM",
             sys.executable, "-m", "kafka_eventing.localstack.cluster", "serve", "--ttl", str(ttl),
             "--outer-netns", str(_netns_inode()),
             *(arg for image in extra_images or () for arg in ("--image", str(Path(image).resolve())))],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    last_line = ""
    next_note = time.monotonic() + 15
    while time.monotonic() < deadline:
        state = read_state()
        if state and state.get("error"):
            raise ClusterError(f"cluster failed: {state['error']} (log {log_path})")
        if state and state.get("ready"):
            return state
        if proc.poll() is not None:
            raise ClusterError(f"cluster supervisor exited ({proc.returncode}):\n{tail(log_path)}")
        lines = tail(log_path, 1)
        if lines != last_line or time.monotonic() > next_note:
            print(f"[cluster-up] {lines.strip()}", flush=True)
            last_line, next_note = lines, time.monotonic() + 15
        time.sleep(0.5)
    down()
    raise ClusterError(f"cluster not ready in {timeout:.0f}s:\n{tail(log_path)}")


def down(timeout: float = 120.0) -> None:
    """Stop the supervisor (which tears everything down); clean up after it if it died without doing so."""
    state = read_state()
    if not state:
        return
    pid = int(state.get("pid", 0))
    if pid and _alive(pid):
        inode = _netns_inode(pid)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        # Whatever outlived the supervisor in its namespace (it was killed, or its stop() timed out).
        kill_netns_processes(inode, keep={os.getpid()})
    # A supervisor that died without stopping the cluster (SIGKILL) leaves no live pid to find its namespace by:
    # containerd, its shims and the kubelet still name the cluster's folder in their arguments, and run in another
    # network namespace than ours (a shell here reading the folder's logs does not).
    _kill_until_gone(lambda: {p for p in _workdir_processes() if _netns_of(p) not in (None, _netns_inode())}, 20.0)
    if state.get("cgroup_root"):
        kill_cgroup_tree(str(state["cgroup_root"]))
        remove_cgroup_tree(str(state["cgroup_root"]))
    _state_file().unlink(missing_ok=True)


def leftovers() -> list[str]:
    """What a stopped cluster must not leave: processes, cgroups, mounts (empty when clean)."""
    found = [f"cgroup {d}" for d in Path("/sys/fs/cgroup").glob("*/kafka-eventing-*")]
    found += [f"cgroup {d}" for d in Path("/sys/fs/cgroup").glob("kafka-eventing-*")]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if "kafka-eventing-rt" in line]
    found += [f"process {pid} {_cmdline(pid)}" for pid in sorted(_workdir_processes())]
    return found


def _netns_of(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return _netns_inode(pid)
    return None


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def _workdir_processes() -> set[int]:
    """Processes of this cluster but this one: containerd, its shims and the kubelet name the cluster's folder in
    their arguments (config, socket); other engines' containerd (a Docker engine's) do not."""
    return processes_naming(workdir())


def processes_naming(folder: Path) -> set[int]:
    """Processes but this one whose arguments name ``folder``, by the path as given or resolved: a cache reached
    through a symbolic link appears in arguments by either."""
    names = {str(folder), str(folder.resolve())}
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            cmdline = _cmdline(int(entry.name))
            if any(name in cmdline for name in names):
                found.add(int(entry.name))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-eventing cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--ttl", type=float, default=2 * 3600, help="seconds before the cluster stops by itself")
        p.add_argument("--outer-netns", type=int, default=0, help=argparse.SUPPRESS)
        p.add_argument("--image", type=Path, action="append", default=[],
                       help="a docker-save archive to import besides those of `make cluster-images` (repeatable)")
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    if args.command == "serve":
        if not args.outer_netns:
            parser.error("serve is started by `up`")
        return serve(args.ttl, args.outer_netns, args.image)
    if args.command == "up":
        try:
            state = up(args.ttl, extra_images=args.image)
        except ClusterError as exc:
            print(exc, file=sys.stderr)
            return 1
        pid = state["pid"]
        print(f"cluster ready: node {state['node']} ({state['node_ip']}), Kafka {state['bootstrap_servers']}")
        print(f"  every client runs in its network namespace: {' '.join(netns_command(pid))} "
              f"{tool_path('kubectl')} --kubeconfig {state['kubeconfig']} get pods -A")
        return 0
    if args.command == "down":
        down()
        left = leftovers()
        print("cluster stopped" + (f"; LEFT BEHIND: {left}" if left else ", nothing left behind"))
        return 1 if left else 0
    current = read_state()
    print(json.dumps(current, indent=2) if current else "cluster is not running")
    return 0 if current else 3


if __name__ == "__main__":
    sys.exit(main())
