"""The local Kubernetes control plane is a real one: CRDs with structural schemas, RBAC, service-account tokens,
the controller manager, and a kubeconfig that the Python client, kubectl and helm all accept."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kafka_eventing.localstack.kube import KubeControlPlane, KubeControlPlaneError
from kafka_eventing.localstack.tools import ToolNotFoundError, tool_path
from waiting import wait_for

pytestmark = pytest.mark.kube

GROUP, VERSION, PLURAL, KIND = "example.test", "v1", "widgets", "Widget"
WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"kind": KIND, "plural": PLURAL, "singular": "widget", "listKind": "WidgetList"},
        "versions": [{
            "name": VERSION, "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1, "maximum": 10},
                            "color": {"type": "string", "enum": ["red", "blue"], "default": "blue"},
                        },
                    },
                    "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
                },
            }},
        }],
    },
}


@pytest.fixture
def api(kube_control_plane: KubeControlPlane) -> Iterator[client.ApiClient]:
    api_client = kube_control_plane.api_client()
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture
def widget_crd(api: client.ApiClient) -> str:
    ext = client.ApiextensionsV1Api(api)
    name: str = WIDGET_CRD["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(WIDGET_CRD)
    except client.ApiException as exc:
        if exc.status != 409:  # created by an earlier test of this session
            raise

    def established() -> bool:
        conds = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    wait_for(established, what=f"CRD {name} Established")
    return name


def _widget(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def test_server_reports_pinned_version(api: client.ApiClient) -> None:
    info = client.VersionApi(api).get_code()
    assert info.major == "1"
    assert info.git_version.startswith("v1.")
    assert info.git_version != "v0.0.0-master+$Format:%H$"  # the version ldflags were applied


def test_custom_resource_round_trip_with_defaulting_and_status(
    api: client.ApiClient, widget_crd: str, kube_namespace: str
) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, _widget("w1", kube_namespace,
                                                                                         {"size": 3}))
    got = co.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "w1")
    assert got["spec"] == {"size": 3, "color": "blue"}  # structural-schema default applied by the server
    assert got["metadata"]["uid"]

    # With the status subresource, status is only written through /status, and /status ignores spec.
    got["status"] = {"ready": True}
    got["spec"]["size"] = 9
    co.replace_namespaced_custom_object_status(GROUP, VERSION, kube_namespace, PLURAL, "w1", got)
    after = co.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "w1")
    assert after["status"] == {"ready": True}
    assert after["spec"]["size"] == 3

    listed = co.list_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w1"]


@pytest.mark.parametrize("spec", [{"size": "big"}, {"size": 0}, {"color": "red"}, {"size": 2, "color": "green"}],
                         ids=["wrong-type", "below-minimum", "missing-required", "not-in-enum"])
def test_schema_invalid_custom_resource_is_rejected(
    api: client.ApiClient, widget_crd: str, kube_namespace: str, spec: dict[str, Any]
) -> None:
    co = client.CustomObjectsApi(api)
    with pytest.raises(client.ApiException) as info:
        co.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, _widget("bad", kube_namespace,
                                                                                             spec))
    assert info.value.status == 422
    assert json.loads(info.value.body)["reason"] == "Invalid"
    with pytest.raises(client.ApiException) as missing:
        co.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "bad")
    assert missing.value.status == 404


def test_kubectl_uses_the_kubeconfig(kube_control_plane: KubeControlPlane, api: client.ApiClient,
                                     widget_crd: str, kube_namespace: str) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, kube_namespace, PLURAL, _widget("from-python", kube_namespace, {"size": 5}))
    kubectl = [str(kube_control_plane.kubectl), "--kubeconfig", str(kube_control_plane.kubeconfig)]
    out = subprocess.run([*kubectl, "get", f"{PLURAL}.{GROUP}", "-n", kube_namespace, "-o", "json"],
                         capture_output=True, text=True, timeout=60, check=True)
    items = json.loads(out.stdout)["items"]
    assert [(i["metadata"]["name"], i["spec"]["size"]) for i in items] == [("from-python", 5)]

    # ...and writes go through it too: a ConfigMap created by kubectl is visible to the Python client.
    subprocess.run([*kubectl, "create", "configmap", "made-by-kubectl", "-n", kube_namespace, "--from-literal=k=v"],
                   capture_output=True, text=True, timeout=60, check=True)
    cm = client.CoreV1Api(api).read_namespaced_config_map("made-by-kubectl", kube_namespace)
    assert cm.data == {"k": "v"}

    whoami = subprocess.run([*kubectl, "auth", "whoami", "-o", "json"], capture_output=True, text=True, timeout=60,
                            check=True)
    assert "system:masters" in json.loads(whoami.stdout)["status"]["userInfo"]["groups"]


def test_helm_installs_a_chart(kube_control_plane: KubeControlPlane, api: client.ApiClient, kube_namespace: str,
                               tmp_path: Path) -> None:
    chart = tmp_path / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n")
    # Keep helm's caches and config out of the user's home.
    env = {**os.environ, **{k: str(tmp_path / k.lower()) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME",
                                                                  "HELM_DATA_HOME")}}
    helm = [str(tool_path("helm")), "--kubeconfig", str(kube_control_plane.kubeconfig), "-n", kube_namespace]
    subprocess.run([*helm, "install", "rel", str(chart), "--set", "greeting=hi", "--wait", "--timeout", "60s"],
                   capture_output=True, text=True, timeout=120, check=True, env=env)
    cm = client.CoreV1Api(api).read_namespaced_config_map("rel-cm", kube_namespace)
    version = client.VersionApi(api).get_code().git_version
    # Installed against a live cluster, helm reads the server's version rather than its built-in default.
    assert cm.data == {"greeting": "hi", "kube": version}

    listed = subprocess.run([*helm, "list", "-o", "json"], capture_output=True, text=True, timeout=60, check=True,
                            env=env)
    assert [(r["name"], r["status"]) for r in json.loads(listed.stdout)] == [("rel", "deployed")]
    subprocess.run([*helm, "uninstall", "rel", "--wait"], capture_output=True, text=True, timeout=120, check=True,
                   env=env)
    with pytest.raises(client.ApiException) as gone:
        client.CoreV1Api(api).read_namespaced_config_map("rel-cm", kube_namespace)
    assert gone.value.status == 404


def test_controller_manager_turns_a_deployment_into_a_replicaset_and_pods(api: client.ApiClient,
                                                                            kube_namespace: str) -> None:
    apps = client.AppsV1Api(api)
    core = client.CoreV1Api(api)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(kube_namespace, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="example.invalid/web:1")]),
            ),
        ),
    ))
    deployment = apps.read_namespaced_deployment("web", kube_namespace)

    def owned_replicasets() -> list[client.V1ReplicaSet]:
        items = apps.list_namespaced_replica_set(kube_namespace).items
        return [rs for rs in items if any(o.uid == deployment.metadata.uid for o in rs.metadata.owner_references or [])]

    rs = wait_for(owned_replicasets, what="ReplicaSet owned by the Deployment")[0]
    assert rs.spec.replicas == 2
    # No nodes exist, so the pods are created but stay Pending.
    def replicaset_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(kube_namespace, label_selector="app=web").items
        owned = [p for p in pods if any(o.uid == rs.metadata.uid for o in p.metadata.owner_references or [])]
        return owned if len(owned) == 2 else []

    pods = wait_for(replicaset_pods, what="2 pods created by the ReplicaSet")
    assert {p.status.phase for p in pods} == {"Pending"}

    # The garbage collector removes the ReplicaSet once its owner is gone.
    apps.delete_namespaced_deployment("web", kube_namespace, propagation_policy="Background")
    wait_for(lambda: not owned_replicasets(), what="ReplicaSet garbage-collected")


def test_service_account_tokens_are_issued_and_rbac_is_enforced(kube_control_plane: KubeControlPlane,
                                                                api: client.ApiClient, kube_namespace: str) -> None:
    core = client.CoreV1Api(api)
    # The serviceaccount controller creates "default" in every new namespace.
    wait_for(lambda: any(sa.metadata.name == "default"
                         for sa in core.list_namespaced_service_account(kube_namespace).items),
             what="default ServiceAccount")
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    token = core.create_namespaced_service_account_token("default", kube_namespace, req).status.token
    assert token.count(".") == 2  # a signed JWT

    cfg = client.Configuration()
    cfg.host = kube_control_plane.server
    cfg.ssl_ca_cert = str(kube_control_plane.ca_path)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as sa_api:
        review = client.AuthenticationV1Api(sa_api).create_self_subject_review(
            client.V1SelfSubjectReview())
        assert review.status.user_info.username == f"system:serviceaccount:{kube_namespace}:default"
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(sa_api).list_namespaced_secret(kube_namespace)
        assert denied.value.status == 403

        # Granting a Role through RBAC lets the same token read secrets.
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(kube_namespace, client.V1Role(
            metadata=client.V1ObjectMeta(name="read-secrets"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["secrets"], verbs=["list"])]))
        rbac.create_namespaced_role_binding(kube_namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="read-secrets"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-secrets"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="default", namespace=kube_namespace)]))
        wait_for(lambda: _can_list_secrets(sa_api, kube_namespace), what="RoleBinding takes effect")


def _can_list_secrets(sa_api: client.ApiClient, namespace: str) -> bool:
    try:
        client.CoreV1Api(sa_api).list_namespaced_secret(namespace)
    except client.ApiException as exc:
        if exc.status == 403:
            return False
        raise
    return True


def test_missing_binaries_point_to_make_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KE_CACHE", str(tmp_path))
    with pytest.raises(ToolNotFoundError, match=r"make setup"):
        tool_path("kube-apiserver")
    with pytest.raises(ToolNotFoundError, match=r"etcd not found"):
        KubeControlPlane(tmp_path / "kube").start()
    assert not (tmp_path / "kube").exists()  # nothing was started or written


def test_a_component_that_dies_fails_start_with_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "cache" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho '{name}: cannot start, disk on fire' >&2\nexit 3\n")
        script.chmod(0o755)
    monkeypatch.setenv("KE_CACHE", str(tmp_path / "cache"))
    plane = KubeControlPlane(tmp_path / "kube", start_timeout=30)
    with pytest.raises(KubeControlPlaneError, match=r"etcd exited with code 3") as info:
        plane.start()
    assert "etcd: cannot start, disk on fire" in str(info.value)
    assert not plane.running
    assert plane.log_paths["etcd"].is_file()  # kept for the post-mortem


def test_the_standard_kubeconfig_variable_reaches_the_api_server(kube_control_plane: KubeControlPlane) -> None:
    """``KUBECONFIG`` alone (no ``KE_KUBECONFIG``) is how a role finds this API server, as kubectl would."""
    from kafka_eventing.core.kube import api_client
    from kafka_eventing.core.settings import Settings

    settings = Settings.from_env({"KUBECONFIG": str(kube_control_plane.kubeconfig)})
    with api_client(settings.kubeconfig) as api:
        names = {ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items}
    assert "kube-system" in names
