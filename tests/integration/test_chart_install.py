"""The chart and the Kustomize overlays against a real kube-apiserver (envtest style: no nodes).

`helm install` of every ci/ scenario, `helm upgrade` from the previous chart version, `helm uninstall` (the CRD
stays with `crds.keep`), the chart's install-time check of an existing connection Secret, and `kubectl apply -k` /
`kubectl delete -k` of every overlay. Pods never run here (no nodes), so the assertions are on the objects the API
server accepted — which also means admission, defaulting and the CRD's structural schema are real.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fixtures.kube import delete_crds
from fixtures.kube import wait_established as crds_established
from kafka_eventing.controller.crd import CRD_NAME, install_crd

pytestmark = pytest.mark.kube

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kafka-eventing"
OVERLAYS = ROOT / "kustomize" / "overlays"
RELEASE = "kafka-eventing"
NS = "knative-eventing"  # the system namespace of the chart's examples and of every overlay
CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl_bin: Path
    helm_bin: Path
    env: dict[str, str]

    def run(self, args: list[str], *, ok: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, env=self.env, timeout=180,
                              check=False)
        if ok and proc.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def helm(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([str(self.helm_bin), "--kubeconfig", str(self.kubeconfig), *args], ok=ok)

    def kubectl(self, *args: str, ok: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run([str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig), *args], ok=ok, stdin=stdin)

    def names(self, manifest: str) -> set[str]:
        """`kind/name` of the objects of a manifest that exist in the cluster."""
        out = self.kubectl("get", "-f", "-", "-o", "name", "--ignore-not-found", stdin=manifest).stdout
        return set(out.split())

    def settle_namespace(self) -> None:
        """Wait out a terminating system namespace left by an earlier test's delete."""
        phase = self.kubectl("get", "namespace", NS, "--ignore-not-found", "-o", "jsonpath={.status.phase}").stdout
        if phase == "Terminating":
            self.kubectl("wait", "--for=delete", f"namespace/{NS}", "--timeout=120s")

    def crd_exists(self) -> bool:
        return bool(self.kubectl("get", "crd", CRD_NAME, "--ignore-not-found", "-o", "name").stdout.strip())

    def adopt_crd(self) -> None:
        """Other test modules of the session create the CRD directly; hand it to the release the way Helm
        documents for adopting existing objects, so `helm install` may manage it."""
        if not self.crd_exists():
            return
        self.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")
        self.kubectl("annotate", "--overwrite", "crd", CRD_NAME, f"meta.helm.sh/release-name={RELEASE}",
                     f"meta.helm.sh/release-namespace={NS}")


def objects(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest) if d]


@pytest.fixture(scope="module")
def cluster(kube_control_plane: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("helm-home")
    helm_bin = kube_control_plane.kubectl.parent / "helm"
    assert helm_bin.is_file(), f"{helm_bin} missing: run make setup"
    # Helm keeps its cache/config/data under these; never in the developer's home.
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    c = Cluster(Path(kube_control_plane.kubeconfig), Path(kube_control_plane.kubectl), helm_bin, env)
    crd_was_there = c.crd_exists()
    try:
        yield c
    finally:
        c.helm("uninstall", RELEASE, "-n", NS, "--wait", "--ignore-not-found", ok=False)
        c.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false", ok=False)
        if crd_was_there:
            # Leave the CRD as the session had it (later modules create channels): whatever a test's uninstall or
            # `kubectl delete -k` began deleting is finished (its objects first), then the CRD is installed anew.
            api = kube_control_plane.api_client()
            try:
                delete_crds(api, [CRD_NAME])
                install_crd(api)
            finally:
                api.close()


def wait_established(c: Cluster) -> None:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(c.kubeconfig))
    try:
        crds_established(api, [CRD_NAME])
    finally:
        api.close()


@pytest.mark.parametrize("values", CI_VALUES)
def test_helm_install_and_uninstall(cluster: Cluster, values: str) -> None:
    cluster.settle_namespace()
    cluster.adopt_crd()
    out = cluster.helm("install", RELEASE, str(CHART), "-n", NS, "--create-namespace", "-f",
                       str(CHART / "ci" / values), "--timeout", "120s").stdout
    try:
        assert "STATUS: deployed" in out
        assert "kind: KafkaChannel" in out and "rollout status deploy/kafka-eventing-controller" in out  # NOTES
        manifest = cluster.helm("get", "manifest", RELEASE, "-n", NS).stdout
        assert cluster.names(manifest) == kind_names(objects(manifest))
        wait_established(cluster)
        kinds = {d["kind"] for d in objects(manifest)}
        # No Prometheus Operator here: the capability-guarded ServiceMonitors must stay out.
        assert "ServiceMonitor" not in kinds
        # KEDA is passed through as set: the controller checks for KEDA's API itself (reason KEDANotInstalled).
        keda = cluster.kubectl("get", "configmap", "config-kafka", "-n", NS, "-o",
                               "jsonpath={.data.dispatcher\\.keda\\.enabled}").stdout
        assert keda == ("true" if values == "all-optins-values.yaml" else "false")
        if values == "all-optins-values.yaml":
            assert {"HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
        if "secret" in values or "event-hubs" in values:
            assert "Secret" in kinds
    finally:
        cluster.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
    left = cluster.names(manifest)
    # The release's CRDs: the KafkaChannel one, and Broker/Trigger where crds.brokers rendered them (no other
    # module of the session had created them first).
    crds = {n for n in kind_names(objects(manifest)) if n.startswith("customresourcedefinition.")}
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in crds
    assert left == crds, "crds.keep keeps only the CRDs"


def _previous_chart(dest: Path) -> tuple[Path, str]:
    """The chart as of the last commit whose Chart.yaml had another version: what users upgrade from."""
    current = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    root = CHART.parent.parent
    rel = CHART.relative_to(root)

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True).stdout

    for sha in git("log", "--format=%H", "--", str(rel / "Chart.yaml")).decode().split():
        version = yaml.safe_load(git("show", f"{sha}:{rel}/Chart.yaml"))["version"]
        if version != current:
            archive = git("archive", "--format=tar", sha, str(rel))
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
            return dest / rel, version
    pytest.fail(f"no earlier chart version than {current} in git history (a shallow clone? git fetch --unshallow)")


def served_schemas(c: Cluster) -> dict[str, Any]:
    """The KafkaChannel CRD's schema per version as the API server has it."""
    crd = yaml.safe_load(c.kubectl("get", "crd", CRD_NAME, "-o", "yaml").stdout)
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}


def chart_schemas(chart: Path) -> dict[str, Any]:
    crd = yaml.safe_load((chart / "files" / "crds" / "kafkachannels.yaml").read_text())
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}


def test_helm_upgrade_from_previous_version(cluster: Cluster, tmp_path: Path) -> None:
    prev_dir, previous = _previous_chart(tmp_path)
    cluster.helm("package", str(prev_dir), "-d", str(tmp_path))
    package = tmp_path / f"kafka-eventing-{previous}.tgz"

    cluster.settle_namespace()
    cluster.adopt_crd()
    # The previous chart with its own values (its strict schema may not know keys added since).
    cluster.helm("install", RELEASE, str(package), "-n", NS, "--create-namespace", "-f",
                 str(prev_dir / "ci" / "default-values.yaml"))
    channel = ("apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\n"
               f"metadata: {{name: survives-upgrade, namespace: {NS}}}\nspec: {{numPartitions: 2}}\n")
    try:
        wait_established(cluster)
        assert served_schemas(cluster) == chart_schemas(prev_dir)
        cluster.kubectl("apply", "-f", "-", stdin=channel)
        before = cluster.kubectl("get", "deploy/kafka-eventing-receiver", "-n", NS, "-o",
                                 "jsonpath={.spec.template.metadata.annotations.checksum/config}").stdout
        cluster.helm("upgrade", RELEASE, str(CHART), "-n", NS, "-f",
                     str(CHART / "ci" / "strimzi-sasl-scram-values.yaml"))
        history = yaml.safe_load(cluster.helm("history", RELEASE, "-n", NS, "-o", "yaml").stdout)
        current = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
        assert [h["chart"] for h in history] == [f"kafka-eventing-{previous}", f"kafka-eventing-{current}"]
        assert history[-1]["status"] == "deployed"
        # The CRD is a template, so the upgrade carries its schema (Helm never upgrades a chart's crds/ folder).
        assert served_schemas(cluster) == chart_schemas(CHART)
        provider = cluster.kubectl("get", "configmap", "kafka-eventing-config", "-n", NS, "-o",
                                   "jsonpath={.data.KE_KAFKA_PROVIDER}").stdout
        assert provider == "strimzi"
        after = cluster.kubectl("get", "deploy/kafka-eventing-receiver", "-n", NS, "-o",
                                "jsonpath={.spec.template.metadata.annotations.checksum/config}").stdout
        assert before and after and before != after, "a settings change must roll the pods"
        secret = cluster.kubectl("get", "configmap", "config-kafka", "-n", NS, "-o",
                                 "jsonpath={.data.auth\\.secret\\.ref\\.name}").stdout
        assert secret == "kafka-eventing-kafka"  # the dev Secret of the strimzi scenario, named for the controller
        assert cluster.names(channel) == {"kafkachannel.messaging.knative.dev/survives-upgrade"}
    finally:
        cluster.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
    # The CRD is kept, and with it the users' channels.
    assert cluster.names(channel) == {"kafkachannel.messaging.knative.dev/survives-upgrade"}
    cluster.kubectl("delete", "-f", "-", "--wait", stdin=channel)


def test_install_checks_the_existing_connection_secret(cluster: Cluster) -> None:
    preset = str(CHART / "values-strimzi.yaml")
    cluster.settle_namespace()
    cluster.kubectl("create", "namespace", NS, ok=False)
    cluster.kubectl("create", "secret", "generic", "kafka-connection", "-n", NS, "--from-literal=user=u",
                    "--from-literal=protocol=SASL_SSL", "--from-literal=sasl.mechanism=SCRAM-SHA-512")
    try:
        cluster.adopt_crd()
        proc = cluster.helm("install", RELEASE, str(CHART), "-n", NS, "-f", preset, ok=False)
        assert proc.returncode != 0
        assert 'lacks key "password"' in proc.stderr
        full = cluster.kubectl("create", "secret", "generic", "kafka-connection", "-n", NS, "--from-literal=user=u",
                               "--from-literal=protocol=SASL_SSL", "--from-literal=sasl.mechanism=SCRAM-SHA-512",
                               "--from-literal=password=p", "--from-literal=ca.crt=x", "--dry-run=client",
                               "-o", "yaml").stdout
        cluster.kubectl("apply", "-f", "-", stdin=full)
        out = cluster.helm("install", RELEASE, str(CHART), "-n", NS, "-f", preset).stdout
        assert "STATUS: deployed" in out
        assert "with keys: protocol, sasl.mechanism, user, password, ca.crt" in out  # NOTES name the keys
        cluster.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
    finally:
        cluster.kubectl("delete", "secret", "kafka-connection", "-n", NS, "--ignore-not-found")


def test_a_crd_of_another_owner_is_left_alone(cluster: Cluster, kube_control_plane: Any) -> None:
    # The KafkaChannel CRD as another implementation (or a kubectl apply) put it there: no Helm ownership. The
    # chart installs beside it instead of failing on it, says so, and leaves it on uninstall.
    cluster.settle_namespace()
    if not cluster.crd_exists():
        api = kube_control_plane.api_client()
        try:
            install_crd(api)
        finally:
            api.close()
    cluster.kubectl("annotate", "crd", CRD_NAME, "meta.helm.sh/release-name-", "meta.helm.sh/release-namespace-")
    cluster.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by-")
    out = cluster.helm("install", RELEASE, str(CHART), "-n", NS, "--create-namespace").stdout
    try:
        assert "STATUS: deployed" in out
        assert f"CRD {CRD_NAME} already exists and does not belong to this release" in out
        manifest = cluster.helm("get", "manifest", RELEASE, "-n", NS).stdout
        assert "CustomResourceDefinition" not in {d["kind"] for d in objects(manifest)}
        assert "ClusterRole" in {d["kind"] for d in objects(manifest)}
    finally:
        cluster.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
    assert cluster.crd_exists()


def kind_names(docs: list[dict[str, Any]]) -> set[str]:
    """What `kubectl get -o name` prints for these objects."""
    out = set()
    for d in docs:
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        out.add(f"{d['kind'].lower()}{'.' + group if group else ''}/{d['metadata']['name']}")
    return out


def test_kustomize_apply_every_overlay_then_delete(cluster: Cluster) -> None:
    # One install switched from provider to provider (as `kubectl apply -k` of another overlay does in place), then
    # `kubectl delete -k`: faster than a full install/delete per overlay, and the switch itself is worth checking.
    cluster.settle_namespace()
    built: dict[str, str] = {}
    try:
        for overlay in sorted(p.name for p in OVERLAYS.iterdir()):
            path = str(OVERLAYS / overlay)
            # kubectl's built-in kustomize must build what the pinned kustomize builds.
            built[overlay] = cluster.kubectl("kustomize", path).stdout
            pinned = cluster.run([str(cluster.helm_bin.parent / "kustomize"), "build", path]).stdout
            assert objects(built[overlay]) == objects(pinned), overlay
            # Server-side apply: the CRD may be owned by an earlier Helm release of this module (take it over).
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-k", path)
            wait_established(cluster)
            docs = objects(built[overlay])
            assert cluster.names(built[overlay]) == kind_names(docs), overlay
            config = next(d for d in docs if d["metadata"]["name"].startswith("kafka-eventing-config-"))
            env = cluster.kubectl("get", "deploy/kafka-eventing-receiver", "-n", NS, "-o",
                                  "jsonpath={.spec.template.spec.containers[0].envFrom[0].configMapRef.name}").stdout
            assert env == config["metadata"]["name"], "the receiver must load this overlay's settings"
            live = cluster.kubectl("get", "configmap", env, "-n", NS, "-o", "jsonpath={.data.KE_KAFKA_PROVIDER}").stdout
            assert live == config["data"]["KE_KAFKA_PROVIDER"], overlay
    finally:
        if built:
            cluster.kubectl("delete", "-k", str(OVERLAYS / list(built)[-1]), "--ignore-not-found", "--wait",
                            "--timeout=120s")
    for overlay, manifest in built.items():
        assert cluster.names(manifest) == set(), f"{overlay}: objects left after kubectl delete -k"
