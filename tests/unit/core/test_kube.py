"""Connecting to the API server: ``KE_KUBECONFIG``, else the standard ``KUBECONFIG``, else the pod's service
account; with none of them every role stops with one line saying what to set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_eventing.core.kube import KubeConfigError, api_client
from kafka_eventing.core.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def test_the_standard_kubeconfig_is_read_and_ke_kubeconfig_wins() -> None:
    assert Settings.from_env({"KUBECONFIG": "/home/u/.kube/config"}).kubeconfig == Path("/home/u/.kube/config")
    assert Settings.from_env({"KUBECONFIG": "/a", "KE_KUBECONFIG": "/b"}).kubeconfig == Path("/b")
    assert Settings.from_env({"KUBECONFIG": ""}).kubeconfig is None
    assert Settings.from_env({}).kubeconfig is None


def test_outside_a_cluster_without_a_kubeconfig_the_error_says_what_to_set() -> None:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        pytest.fail("this test runs outside a cluster; KUBERNETES_SERVICE_HOST is set")
    with pytest.raises(KubeConfigError, match="set KUBECONFIG \\(or KE_KUBECONFIG\\)"):
        api_client(None)


def test_a_missing_kubeconfig_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=f"kubeconfig {tmp_path / 'nope'} cannot be used"):
        api_client(tmp_path / "nope")


def test_a_kubeconfig_list_is_merged(tmp_path: Path) -> None:
    (tmp_path / "a").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    (tmp_path / "b").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n")
    settings = Settings.from_env({"KUBECONFIG": f"{tmp_path / 'a'}:{tmp_path / 'b'}"})
    with api_client(settings.kubeconfig) as api:
        assert api.configuration.host == "https://127.0.0.1:6443"


@pytest.mark.parametrize(("role", "env"), [
    ("controller", {}),
    ("dispatcher", {"KE_CHANNEL_SOURCE": "kube", "KE_CHANNEL_NAMESPACE": "ns", "KE_CHANNEL_NAME": "c"}),
    ("dispatcher", {"KE_CHANNEL_SOURCE": "kube", "KE_BROKER_NAMESPACE": "ns", "KE_BROKER_NAME": "b"}),
    ("receiver", {"KE_CHANNEL_SOURCE": "kube"}),
])
def test_every_role_stops_with_one_line_without_a_kubeconfig(role: str, env: dict[str, str]) -> None:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("KE_", "KUBERNETES_")) and k != "KUBECONFIG"}
    base["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{base.get('PYTHONPATH', '')}"
    done = subprocess.run([sys.executable, "-m", "kafka_eventing", role], env=base | env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{role}: not in a cluster and no kubeconfig given: set KUBECONFIG (or KE_KUBECONFIG)")
