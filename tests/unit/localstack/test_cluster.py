"""cluster: finding what a cluster left behind by the folder its processes name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kafka_eventing.localstack import cluster as kc


@pytest.mark.parametrize("named_by", ["link", "target"])
def test_a_process_naming_the_folder_by_either_path_is_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_by: str) -> None:
    real = tmp_path / "real-cache"
    (real / "cluster").mkdir(parents=True)
    link = tmp_path / "cache"
    link.symlink_to(real)
    monkeypatch.setenv("KE_CACHE", str(link))
    folder = (link if named_by == "link" else real) / "cluster" / "config.toml"
    # A process that names the folder in its arguments, as containerd and the kubelet do (--config <folder>/...).
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)",
                             "--config", str(folder)], stdout=subprocess.PIPE)
    try:
        # Between fork and exec the child's /proc cmdline is still this process's: wait until it runs its own.
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        assert proc.pid in kc._workdir_processes()
        assert proc.pid in kc.processes_naming(link / "cluster")
        assert proc.pid not in kc.processes_naming(tmp_path / "elsewhere")
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in kc._workdir_processes()
