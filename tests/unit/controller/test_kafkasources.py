"""kafkasources: the connection gathered from the net Secret keys of the source's own namespace (reasons for each
missing piece, never a value in a message), how the dispatcher mounts their copy, and the refusal of a spec field as a
condition."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.kafkasources import (
    ANNOTATION_PROTOCOL,
    ConnectionProblem,
    SourceReconciler,
    _mount_connection,
    selector,
    source_dispatcher_name,
)
from kafka_eventing.controller.reconciler import Reconciler, Stores
from kafka_eventing.core import kafkasources as ks

from .fakes import SETTINGS, DictStore, _secret

REF = lambda key: {"secretKeyRef": {"name": "creds", "key": key}}  # noqa: E731


class Secrets:
    """``read_namespaced_secret`` over Secrets of the source's namespace; 403 for namespaces it may not read."""

    def __init__(self, namespace: str, *secrets: dict[str, Any], readable: bool = True) -> None:
        self.namespace, self.readable = namespace, readable
        self.secrets = {s["metadata"]["name"]: s for s in secrets}

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        if not self.readable:
            raise client.ApiException(status=403, reason="Forbidden")
        if namespace != self.namespace or name not in self.secrets:
            raise client.ApiException(status=404, reason="Not Found")
        return client.V1Secret(data=self.secrets[name]["data"])


def reconciler(*secrets: dict[str, Any], sources: DictStore | None = None, readable: bool = True) -> SourceReconciler:
    stores = Stores(deployments=DictStore(), services=DictStore(), config_maps=DictStore(),
                    secrets=DictStore())
    r = SourceReconciler(Reconciler(client.ApiClient(), SETTINGS, stores), sources or DictStore())
    r.base.core = Secrets("team", *secrets, readable=readable)  # type: ignore[assignment]
    return r


def spec(net: dict[str, Any]) -> ks.SourceSpec:
    return ks.parse_source({"metadata": {"namespace": "team", "name": "s", "uid": "u"},
                            "spec": {"bootstrapServers": ["k:9093"], "topics": ["t"], "sink": {"uri": "http://x"},
                                     "net": net}})


SASL_TLS = {"sasl": {"enable": True, "user": REF("u"), "password": REF("p"), "type": REF("m")},
            "tls": {"enable": True, "caCert": REF("ca")}}


def test_the_connection_from_the_secret_keys() -> None:
    creds = _secret("creds", {"u": "alice", "p": "s3cret", "m": "scram-sha-512", "ca": "-----BEGIN CERT"})
    data, connection, files = reconciler(creds).connection(spec(SASL_TLS))
    assert data["protocol"] == "SASL_SSL" and data["bootstrap.servers"] == "k:9093"
    assert connection.config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert connection.config["sasl.username"] == "alice"
    assert [(path, ref.key) for path, ref in files] == [("user", "u"), ("password", "p"), ("sasl.mechanism", "m"),
                                                         ("ca.crt", "ca")]
    assert "s3cret" not in repr(connection)


@pytest.mark.parametrize(("secrets", "reason"), [
    ((), "SecretNotFound"),
    ((_secret("creds", {"u": "alice", "m": "PLAIN", "ca": "x"}),), "SecretKeyNotFound"),
    ((_secret("creds", {"u": "alice", "p": "pw-value", "m": "GSSAPI", "ca": "x"}),), "InvalidSaslMechanism"),
])
def test_each_missing_piece_has_its_reason(secrets: tuple[dict[str, Any], ...], reason: str) -> None:
    with pytest.raises(ConnectionProblem) as caught:
        reconciler(*secrets).connection(spec(SASL_TLS))
    assert caught.value.reason == reason
    assert "pw-value" not in str(caught.value) and "GSSAPI" not in str(caught.value)
    if reason == "SecretNotFound":
        assert "team/creds" in str(caught.value)  # says where the Secret must be: the source's namespace


def test_a_namespace_the_controller_may_not_read_names_the_value_to_set() -> None:
    creds = _secret("creds", {"u": "alice", "p": "s3cret", "m": "PLAIN", "ca": "x"})
    with pytest.raises(ConnectionProblem) as caught:
        reconciler(creds, readable=False).connection(spec(SASL_TLS))
    assert caught.value.reason == "SecretNotReadable"
    assert "controller.rbac.secretNamespaces" in str(caught.value) and "team" in str(caught.value)


def test_the_dispatcher_mounts_the_copy_of_exactly_the_named_keys_and_the_protocol() -> None:
    template: dict[str, Any] = {"metadata": {"annotations": {}}, "spec": {
        "volumes": [], "containers": [{"volumeMounts": []}]}}
    ref = ks.SecretKeyRef("creds", "pw")
    copy = res.secret_copy_name(source_dispatcher_name("team", "s"))
    _mount_connection(template, "SASL_SSL", copy, [("password", ref)])
    assert template["metadata"]["annotations"][ANNOTATION_PROTOCOL] == "SASL_SSL"
    (volume,) = template["spec"]["volumes"]
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "s-team-ks-dispatcher-secret", "items": [{"key": "password", "path": "password"}]}},
        {"downwardAPI": {"items": [{"path": "protocol", "fieldRef": {
            "fieldPath": f"metadata.annotations['{ANNOTATION_PROTOCOL}']"}}]}}]
    assert template["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "kafka-secret", "mountPath": res.SECRET_MOUNT, "readOnly": True}]


def test_names() -> None:
    name = source_dispatcher_name("team", "orders")
    assert name == "orders-team-ks-dispatcher"
    assert selector(name) == (f"app.kubernetes.io/name={res.DISPATCHER_APP},"
                              f"kafka.eventing.knative.dev/dispatcher={name}")


class StatusPatches:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append(body)


@pytest.mark.parametrize(("field", "labels", "condition", "reason"), [
    ({"ordering": "random"}, {}, ks.DEPLOYED, "InvalidOrdering"),
    ({"topics": []}, {}, ks.CONNECTION_ESTABLISHED, "InvalidTopics"),
    ({}, {ks.LABEL_KEY_TYPE: "uuid"}, ks.KEY_TYPE_CORRECT, "InvalidKeyType"),
    ({"annotations": {"autoscaling.knative.dev/maxScale": "3"}}, {}, "DispatcherAutoscalerReady",
     "InvalidAutoscaling"),
])
def test_a_refused_field_is_a_condition_and_ready_says_so(field: dict[str, Any], labels: dict[str, str],
                                                           condition: str, reason: str) -> None:
    field = dict(field)
    annotations = field.pop("annotations", {})  # metadata, not spec
    obj = {"metadata": {"namespace": "team", "name": "s", "uid": "u", "generation": 2, "resourceVersion": "1",
                        "finalizers": ["kafka.eventing.knative.dev/kafkasource"], "labels": labels,
                        "annotations": annotations},
           "spec": {"bootstrapServers": ["k:9092"], "topics": ["t"], "sink": {"uri": "http://x"}, **field}}
    r = reconciler(sources=DictStore(obj))
    patches = StatusPatches()
    r.base.custom = patches  # type: ignore[assignment]
    assert r.reconcile("team", "s").error is None
    (body,) = patches.calls
    conditions = {c["type"]: c for c in body["status"]["conditions"]}
    assert (conditions[condition]["status"], conditions[condition]["reason"]) == ("False", reason)
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", reason)
    others = set(ks.DEPENDENTS) - {condition}
    assert {conditions[k]["status"] for k in others} == {"Unknown"}
    assert body["status"]["observedGeneration"] == 2


class Calls:
    """Records the Secret writes the controller makes in the system namespace; 403 on a delete (the right an install
    rolled back to an older chart does not grant)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append(("create", body["metadata"]["name"]))

    def replace_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append(("replace", name))

    def delete_namespaced_secret(self, name: str, namespace: str, **_: Any) -> None:
        self.calls.append(("delete", name))
        raise client.ApiException(status=403, reason="Forbidden")


def test_the_copy_is_written_only_when_the_cache_differs_and_deleted_only_when_it_exists() -> None:
    cached = _secret("held-secret", {"k": "v"})
    stores = Stores(deployments=DictStore(), services=DictStore(), config_maps=DictStore(),
                    secrets=DictStore(cached))
    base = Reconciler(client.ApiClient(), SETTINGS, stores)
    calls = Calls()
    base.core = calls  # type: ignore[assignment]
    base.write_secret_copy("held-secret", {"k": b"v"})
    base.write_secret_copy("held-secret", {"k": b"changed"})
    base.write_secret_copy("new-secret", {"k": b"v"})
    base.delete_secret_copy("never-made-secret")
    assert calls.calls == [("replace", "held-secret"), ("create", "new-secret")]
    with pytest.raises(client.ApiException):
        base.delete_secret_copy("held-secret")
    assert calls.calls[-1] == ("delete", "held-secret")
