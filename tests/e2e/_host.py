"""What a tier that runs as root may not leave changed on the host: sysctls, mounts, interfaces, network
namespaces; and holding a network namespace open."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from kafka_eventing.localstack import kind as engine_mod

# What an unrelated process may change on the host while the test runs: counters, never settings.
VOLATILE_SYSCTLS = ("fs/dentry-state", "fs/file-nr", "fs/inode-nr", "fs/inode-state", "fs/aio-nr", "kernel/random/",
                    "kernel/ns_last_pid", "kernel/pty/nr", "fs/quota/", "net/netfilter/nf_conntrack_count")


def _sysctls() -> dict[str, str]:
    values = {}
    for path in Path("/proc/sys").rglob("*"):
        key = str(path.relative_to("/proc/sys"))
        if path.is_dir() or any(key.startswith(v) for v in VOLATILE_SYSCTLS):
            continue
        try:
            values[key] = path.read_text()
        except OSError:
            continue  # write-only or refused entries
    return values


def host_state() -> dict[str, Any]:
    """What the kind tier must leave as it found it."""
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True,
                                      check=True).stdout)
    mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    netns = sorted(p.name for p in Path("/run/netns").iterdir()) if Path("/run/netns").is_dir() else []
    return {"sysctls": _sysctls(), "links": sorted(link["ifname"] for link in links), "mounts": mounts,
            "netns": netns, "modules": engine_mod.MODULES_DIR.exists(), "containerd": engine_mod.SHIM_DIR.exists()}


def assert_host_unchanged(before: dict[str, Any], engine_netns: int | None) -> None:
    """After the engine is down: the host as ``before``, and no process left in the engine's network namespace
    (``engine_netns``, the inode its state named while it ran)."""
    after = host_state()
    changed = {k: (before["sysctls"][k], after["sysctls"].get(k)) for k in before["sysctls"]
               if after["sysctls"].get(k) != before["sysctls"][k]}
    assert changed == {}, f"host sysctls changed: {changed}"
    for what in ("links", "netns", "modules", "containerd"):
        assert after[what] == before[what], f"host {what}: {before[what]} -> {after[what]}"
    assert after["mounts"] - before["mounts"] == set(), "new mounts on the host"
    assert engine_mod.leftovers(netns_inode=engine_netns) == [], "the kind engine left things behind"


def hold_netns(state: dict[str, Any]) -> int:
    """An open handle on the engine's network namespace: while it is held, the namespace (and its inode number,
    which the kernel would otherwise hand to the next new namespace) stays the engine's, so a process found in it
    after ``down`` is the engine's leftover. Close it after :func:`assert_host_unchanged`."""
    fd = os.open(f"/proc/{state['pid']}/ns/net", os.O_RDONLY)
    assert os.fstat(fd).st_ino == state["netns_inode"], "the engine's supervisor is not the one its state names"
    return fd
