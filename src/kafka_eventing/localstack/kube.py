"""A real Kubernetes control plane on loopback: etcd + kube-apiserver (+ kube-controller-manager).

Envtest-style: no nodes, so pods stay Pending, but everything the API server does itself is real — CRDs and
structural-schema validation, RBAC, admission, service-account tokens, watches — and the controller manager
turns Deployments into ReplicaSets and Pods, garbage-collects and deletes namespaces.

    with KubeControlPlane(tmp_path / "kube") as kube:
        api = kube.api_client()          # kubernetes.client.ApiClient
        subprocess.run([kube.kubectl, "--kubeconfig", kube.kubeconfig, "get", "ns"])

Binaries come from ``${KE_CACHE:-<repo>/.cache}/bin`` (``make setup`` builds them).
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kafka_eventing.localstack._proc import free_port, tail, terminate
from kafka_eventing.localstack.tls import CertificateAuthority
from kafka_eventing.localstack.tools import ToolNotFoundError, tool_path

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = ["ADMIN_USER", "KubeControlPlane", "KubeControlPlaneError", "ToolNotFoundError"]

ADMIN_USER = "kafka-eventing-admin"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
# The first address of the service range is the in-cluster "kubernetes" Service; the serving cert names it.
_KUBERNETES_SERVICE_IP = "10.0.0.1"


class KubeControlPlaneError(RuntimeError):
    """The control plane did not come up; the message carries the failing component's log tail."""


@dataclass
class _Component:
    name: str
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None


class KubeControlPlane:
    """etcd, kube-apiserver and (optionally) kube-controller-manager as child processes on 127.0.0.1.

    ``workdir`` holds certificates, the kubeconfig, etcd's data and the logs (``workdir/logs``). Each
    ``start()`` begins from an empty etcd, so a control plane never inherits objects from an earlier run.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        controller_manager: bool = True,
        scheduler: bool = False,
        bind_address: str = "127.0.0.1",
        secure_port: int = 0,
        issuer_host: str = "",
        start_timeout: float = 180.0,
        stop_timeout: float = 20.0,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.controller_manager = controller_manager
        # A scheduler only matters with a node (localstack.cluster); envtest-style planes leave pods Pending.
        self.scheduler = scheduler
        # cluster.py serves on every address of its own network namespace, on 443, so that in-cluster clients
        # reach the API through the `kubernetes` Service IP it puts on the namespace's loopback.
        self.bind_address = bind_address
        self.secure_port = secure_port
        # Where token verifiers fetch the issuer's discovery document and keys: this loopback by default;
        # cluster.py names the `kubernetes` Service IP, the one API address its pods reach.
        self.issuer_host = issuer_host
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.ca_path = self.pki_dir / "ca.crt"
        self.token = ""
        self._kcm_token = ""
        self._ssl: ssl.SSLContext | None = None
        self.etcd_port = 0
        self.api_port = 0
        self._components: list[_Component] = []

    # ------------------------------------------------------------------ public API

    @property
    def server(self) -> str:
        """The API server URL (``https://127.0.0.1:<port>``)."""
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def issuer(self) -> str:
        """The issuer of the service-account tokens this API server mints: the API server URL, or
        ``https://<issuer_host>:<port>`` where one is given."""
        if not self.issuer_host:
            return self.server
        port = "" if self.api_port == 443 else f":{self.api_port}"
        return f"https://{self.issuer_host}{port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def kubectl(self) -> Path:
        """The pinned kubectl from the tool cache (built with the same Kubernetes version)."""
        return tool_path("kubectl")

    @property
    def running(self) -> bool:
        return bool(self._components) and all(c.proc is not None and c.proc.poll() is None for c in self._components)

    @property
    def log_paths(self) -> dict[str, Path]:
        """Component name -> log file; still valid after ``stop()`` (unless ``keep_logs=False``)."""
        return {p.stem: p for p in sorted(self.log_dir.glob("*.log"))}

    def start(self) -> None:
        """Start etcd, the API server and the controller manager; return once ``/readyz`` answers ``ok``.

        Raises :class:`KubeControlPlaneError` (with the log tail) if a component exits or is not ready within
        ``start_timeout`` seconds; whatever had started is stopped again.
        """
        if self._components:
            raise KubeControlPlaneError("control plane already started")
        # Resolve all binaries first so a missing `make setup` fails before anything runs.
        binaries = {name: tool_path(name) for name in self._binary_names()}
        deadline = time.monotonic() + self.start_timeout
        try:
            self._prepare_workdir()
            self._start_etcd(binaries["etcd"], deadline)
            self._start_apiserver(binaries["kube-apiserver"], deadline)
            self._write_kubeconfig(self.kubeconfig, self.token)
            if self.controller_manager:
                self._start_controller_manager(binaries["kube-controller-manager"], deadline)
            if self.scheduler:
                self._start_scheduler(binaries["kube-scheduler"], deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self, *, keep_logs: bool = True) -> None:
        """Stop all components (SIGTERM, then SIGKILL after ``stop_timeout``), newest first.

        With ``keep_logs=False`` the whole work directory (data, certs, logs) is removed afterwards.
        """
        for comp in reversed(self._components):
            terminate(comp.proc, timeout=self.stop_timeout)
        self._components.clear()
        # etcd's data is only useful while it runs; logs and the kubeconfig stay for post-mortems.
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        if not keep_logs:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def api_client(self) -> ApiClient:
        """A ``kubernetes.client.ApiClient`` for the admin user (close it when done)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ setup

    def _binary_names(self) -> list[str]:
        names = ["etcd", "kube-apiserver"]
        if self.controller_manager:
            names.append("kube-controller-manager")
        if self.scheduler:
            names.append("kube-scheduler")
        return names

    def _prepare_workdir(self) -> None:
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        for d in (self.workdir, self.pki_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._ssl = None
        ca = CertificateAuthority("kafka-eventing local kube CA")
        self.ca_path.write_bytes(ca.cert_pem)
        (self.pki_dir / "ca.key").write_bytes(ca.key_pem)
        (self.pki_dir / "ca.key").chmod(0o600)
        hosts = ("127.0.0.1", "localhost", _KUBERNETES_SERVICE_IP, "kubernetes", "kubernetes.default",
                 "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
        ca.issue("kube-apiserver", hosts).write(self.pki_dir / "apiserver.crt", self.pki_dir / "apiserver.key")
        # Service-account tokens are signed with this key and verified with its public half.
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        sa_priv = self.pki_dir / "sa.key"
        sa_priv.write_bytes(sa_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
        sa_priv.chmod(0o600)
        (self.pki_dir / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        # Static bearer tokens: simpler than client certs for every client (python, kubectl, helm).
        # The controller manager also gets system:masters: it then needs no per-controller RBAC bootstrap.
        self.token = secrets.token_hex(24)
        self._kcm_token = secrets.token_hex(24)
        tokens = self.pki_dir / "tokens.csv"
        tokens.write_text(
            f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
            f'{self._kcm_token},system:kube-controller-manager,kube-controller-manager,"system:masters"\n'
        )
        tokens.chmod(0o600)

    def _launch(self, name: str, args: list[str]) -> _Component:
        comp = _Component(name, args, self.log_dir / f"{name}.log")
        self._components.append(comp)
        with comp.log.open("ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n".encode())
            log.flush()
            # Own session: stop() signals the whole group and a Ctrl-C in the test runner does not hit it first.
            comp.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.workdir, start_new_session=True)
        return comp

    def _wait(self, comp: _Component, ready: Any, deadline: float, what: str) -> None:
        """Poll ``ready()`` until true; fail fast if the process exits, or at the deadline."""
        last_error = ""
        while time.monotonic() < deadline:
            if comp.proc is not None and comp.proc.poll() is not None:
                raise KubeControlPlaneError(
                    f"{comp.name} exited with code {comp.proc.returncode} before {what}; "
                    f"log {comp.log}:\n{tail(comp.log)}")
            try:
                if ready():
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last_error = str(exc)
            time.sleep(0.25)
        raise KubeControlPlaneError(
            f"{comp.name} not {what} within {self.start_timeout:.0f}s (last error: {last_error or 'none'}); "
            f"log {comp.log}:\n{tail(comp.log)}")

    def _start_etcd(self, binary: Path, deadline: float) -> None:
        self.etcd_port = free_port()
        peer = f"http://127.0.0.1:{free_port()}"
        comp = self._launch("etcd", [
            str(binary),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            # Throwaway data: skipping fsync keeps tests fast on slow disks.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:  # noqa: S310 - loopback
                return bool(json.load(resp).get("health") == "true")

        self._wait(comp, healthy, deadline, "healthy")

    def _start_apiserver(self, binary: Path, deadline: float) -> None:
        self.api_port = self.secure_port or free_port()
        pki = self.pki_dir
        args = [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.bind_address}",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_path}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # The first issuer names new tokens and the discovery document: an address token verifiers reach (the
            # receiver's ingress authentication fetches /.well-known/openid-configuration and the JWKS from the
            # issuer itself). The in-cluster name stays accepted.
            f"--service-account-issuer={self.issuer}",
            f"--service-account-jwks-uri={self.issuer}/openid/v1/jwks",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            # A loopback advertise address is not a valid Endpoints IP: don't reconcile the kubernetes Endpoints.
            "--endpoint-reconciler-type=none",
            # Reach kubelets (logs, exec) at the node address they report; a node name is no DNS name here.
            "--kubelet-preferred-address-types=InternalIP",
            "--profiling=false",
        ]
        if not self.controller_manager:
            # Without the controller manager nobody creates the "default" ServiceAccount that this plugin
            # requires of every pod.
            args.append("--disable-admission-plugins=ServiceAccount")
        comp = self._launch("kube-apiserver", args)

        def ready() -> bool:
            # 500 until all post-start hooks (RBAC bootstrap roles, priority classes, ...) have run.
            return self._api_get("/readyz") == b"ok"

        self._wait(comp, ready, deadline, "ready (/readyz)")

    def _start_controller_manager(self, binary: Path, deadline: float) -> None:
        kcm_kubeconfig = self.pki_dir / "controller-manager.kubeconfig"
        self._write_kubeconfig(kcm_kubeconfig, self._kcm_token, user="kube-controller-manager")
        comp = self._launch("kube-controller-manager", [
            str(binary),
            f"--kubeconfig={kcm_kubeconfig}",
            "--controllers=*",
            f"--service-account-private-key-file={self.pki_dir / 'sa.key'}",
            f"--root-ca-file={self.ca_path}",
            f"--cluster-signing-cert-file={self.ca_path}",
            f"--cluster-signing-key-file={self.pki_dir / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            # No serving endpoint at all: nothing scrapes it, and it saves a port.
            "--secure-port=0",
            "--profiling=false",
            # The default 20 requests/s makes hundreds of Deployments take minutes to get Pods; a test
            # control plane has no other clients to protect.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ])

        # The serviceaccount controller creating "default" in "default" shows the controllers are running.
        def default_sa_exists() -> bool:
            return self._api_get("/api/v1/namespaces/default/serviceaccounts/default") is not None

        self._wait(comp, default_sa_exists, deadline, "running (default ServiceAccount created)")

    def _start_scheduler(self, binary: Path, deadline: float) -> None:
        comp = self._launch("kube-scheduler", [
            str(binary),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--profiling=false",
        ])

        # The scheduler has no serving endpoint (secure-port 0): running for a few seconds is what can be checked;
        # a pod that never gets a node shows a scheduler that does not work.
        started = time.monotonic()
        self._wait(comp, lambda: time.monotonic() - started > 2, deadline, "running")

    def _api_get(self, path: str) -> bytes | None:
        """GET ``path`` as the admin user: the stripped body on 2xx, ``None`` on an HTTP error status."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_path))
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=3, context=self._ssl) as resp:  # noqa: S310 - https on loopback
                return bytes(resp.read()).strip()
        except urllib.error.HTTPError:
            return None

    def _write_kubeconfig(self, path: Path, token: str, user: str = ADMIN_USER) -> None:
        # The CA is embedded so the file works from any directory and for every client (python, kubectl, helm).
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kafka-eventing-local", "cluster": {
                "server": self.server,
                "certificate-authority-data": _b64(self.ca_path.read_bytes()),
            }}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "kafka-eventing-local",
                          "context": {"cluster": "kafka-eventing-local", "user": user, "namespace": "default"}}],
            "current-context": "kafka-eventing-local",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        # helm warns about group/world-readable kubeconfigs; it also holds a credential.
        path.chmod(0o600)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
