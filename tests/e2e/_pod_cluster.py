"""The real-pod cluster as its tests reach it (tests/e2e/conftest.py starts it; test_cluster.py and
test_cluster_life.py use it): kubectl and helm through ``nsenter`` into its network namespace, and a pool whose
worker lives in that namespace for the HTTP and Kafka clients of tests/e2e/_netns_clients.py. Nothing here imports
pytest.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from e2e._scenario import APP_NS, CLUSTER_KINDS, PART_OF, SYSTEM_NS, get, role_images
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack.tools import tool_path


@dataclass
class Cluster:
    state: dict[str, Any]
    images: dict[str, str]  # role -> image reference imported into containerd
    pool: Any = field(repr=False)  # multiprocessing pool whose worker lives in the namespace

    @property
    def pid(self) -> int:
        return int(self.state["pid"])

    @property
    def kubectl_cmd(self) -> list[str]:
        return [str(tool_path("kubectl")), f"--kubeconfig={self.state['kubeconfig']}"]

    def run(self, args: list[str], *, stdin: str | None = None, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*kc.netns_command(self.pid), *args], input=stdin, capture_output=True, text=True,
                             timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise AssertionError(f"`{' '.join(args[:6])} ...` failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run([*self.kubectl_cmd, *args], stdin=stdin, check=check, timeout=timeout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([str(tool_path("helm")), f"--kubeconfig={self.state['kubeconfig']}", *args],
                        timeout=timeout, check=check)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def in_netns(self, fn: Callable[..., Any], *args: Any, timeout: float = 600) -> Any:
        return self.pool.apply_async(fn, args).get(timeout)


def image_roles() -> dict[str, str]:
    """Role → image reference in `make cluster-images`' archive, which the cluster imports at start."""
    try:
        return role_images(kc.archive_refs())
    except AssertionError as exc:
        raise AssertionError(f"{exc} (archives: {kc.image_archives()})") from None


def left_behind(cl: Cluster) -> list[str]:
    """What a test must not leave on the shared cluster: a Helm release, the system or the app namespace, a
    cluster-wide object of the chart or the overlay (CRDs aside: they stay on purpose, as ``crds.keep`` keeps them)."""
    releases = json.loads(cl.helm("list", "-A", "-a", "-o", "json").stdout or "[]")
    left = [f"release {r['namespace']}/{r['name']}" for r in releases]
    left += [f"namespace {ns}" for ns in (APP_NS, SYSTEM_NS)
             if cl.kubectl("get", "namespace", ns, "--ignore-not-found", "-o", "name").stdout.strip()]
    left += [f"{i['kind']}/{i['metadata']['name']}" for i in get(cl, CLUSTER_KINDS, "-l", PART_OF)["items"]]
    return left


def clean_up(cl: Cluster) -> None:
    """Remove what :func:`left_behind` finds, best effort: the app namespace first, while a controller may still run
    its finalizers, then the releases, the system namespace and the cluster-wide objects."""
    cl.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)
    for r in json.loads(cl.helm("list", "-A", "-a", "-o", "json", check=False).stdout or "[]"):
        cl.helm("uninstall", r["name"], "-n", r["namespace"], "--wait", "--timeout=5m", check=False)
    cl.kubectl("delete", "namespace", SYSTEM_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)
    cl.kubectl("delete", CLUSTER_KINDS, "-l", PART_OF, "--ignore-not-found", check=False)
