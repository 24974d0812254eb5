"""controller.connection: the connection from config-kafka and its Secret, the Admin client pool, dispatcher
resources."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import SECRET_LABEL, AdminPool, resolve
from kafka_eventing.core.kafka_config import KafkaConfigError
from kafka_eventing.core.settings import Settings

from .fakes import SETTINGS, DictStore, FakeAdmin, _deployment, _secret


def test_connection_from_named_secret_and_configmap() -> None:
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"},
          "data": {"bootstrap.servers": "b:9093", "auth.secret.ref.name": "creds"}}
    secret = _secret("creds", {"protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "user": "u", "password": "p"})
    got = resolve(SETTINGS, DictStore(cm), DictStore(secret))
    assert got.secret_name == "creds" and got.bootstrap_servers == "b:9093"
    assert got.connection.config["sasl.username"] == "u"
    rotated = resolve(SETTINGS, DictStore(cm), DictStore({**secret, "data": {
        **secret["data"], "password": base64.b64encode(b"p2").decode()}}))
    assert rotated.checksum != got.checksum


def test_connection_secret_found_by_label_else_settings() -> None:
    labelled = _secret("any", {"protocol": "PLAINTEXT"}, {SECRET_LABEL: "true"})
    got = resolve(SETTINGS, DictStore(), DictStore(_secret("other", {}), labelled))
    assert got.secret_name == "any" and got.bootstrap_servers == SETTINGS.bootstrap_servers
    plain = resolve(SETTINGS, DictStore(), DictStore())
    assert plain.secret_name is None and plain.connection.config["bootstrap.servers"] == SETTINGS.bootstrap_servers


def test_connection_named_secret_missing_is_a_readable_error() -> None:
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"},
          "data": {"auth.secret.ref.name": "nope"}}
    with pytest.raises(KafkaConfigError, match="knative-eventing/nope"):
        resolve(SETTINGS, DictStore(cm), DictStore())


def test_admin_pool_replaces_the_client_when_the_connection_changes() -> None:
    made: list[str] = []

    def factory(conn: Any) -> FakeAdmin:
        made.append(conn.config["bootstrap.servers"])
        return FakeAdmin()

    pool = AdminPool(factory)
    one = resolve(SETTINGS, DictStore(), DictStore())
    assert pool.get(one) is pool.get(one)
    two = resolve(Settings(bootstrap_servers="other:9092"), DictStore(), DictStore())
    pool.get(two)
    assert made == ["127.0.0.1:9092", "other:9092"]


def test_dispatcher_resources_from_config_map() -> None:
    wanted = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"},
          "data": {"dispatcher.resources": json.dumps(wanted)}}
    got = resolve(SETTINGS, DictStore(cm), DictStore())
    assert got.dispatcher_resources == wanted
    config = res.DispatcherConfig(replicas=1, checksum=got.checksum, resources=got.dispatcher_resources)
    container = res.dispatcher_deployment(res.ChannelRef("team", "orders"), SETTINGS, config, 1)[
        "spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == wanted
    # The chart writes `{}` when no resources are set: no resources key at all then.
    empty = resolve(SETTINGS, DictStore({**cm, "data": {"dispatcher.resources": "{}"}}), DictStore())
    assert empty.dispatcher_resources is None
    assert "resources" not in _deployment(1)["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("raw", ["not json", '["a"]', '{"cpu": "1"}'])
def test_dispatcher_resources_invalid_is_a_readable_error(raw: str) -> None:
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"},
          "data": {"dispatcher.resources": raw}}
    with pytest.raises(KafkaConfigError, match=r"knative-eventing/config-kafka key dispatcher\.resources"):
        resolve(SETTINGS, DictStore(cm), DictStore())


def test_dispatcher_pod_settings_from_config_map() -> None:
    """The chart's pull, placement and security settings reach the dispatcher pods the controller makes."""
    psc = {"runAsNonRoot": True, "runAsUser": 65532, "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
    csc = {"readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": False}
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "eventing", "effect": "NoSchedule"}]
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"}, "data": {
        "dispatcher.imagePullSecrets": '["regcred"]', "dispatcher.imagePullPolicy": "Never",
        "dispatcher.nodeSelector": '{"pool": "eventing"}', "dispatcher.tolerations": json.dumps(tolerations),
        "dispatcher.podSecurityContext": json.dumps(psc), "dispatcher.securityContext": json.dumps(csc)}}
    got = resolve(SETTINGS, DictStore(cm), DictStore())
    config = res.DispatcherConfig(replicas=1, checksum=got.checksum, pod=got.dispatcher_pod)
    pod = res.dispatcher_deployment(res.ChannelRef("team", "orders"), SETTINGS, config, 1)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "eventing"}
    assert pod["tolerations"] == tolerations
    assert pod["securityContext"] == psc
    assert pod["containers"][0]["securityContext"] == csc
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    # Empty values (the chart's defaults `[]`, `{}`) keep the restricted defaults and add nothing.
    empty = resolve(SETTINGS, DictStore({**cm, "data": {k: "[]" if "Secrets" in k or "tolerations" in k else "{}"
                                                        for k in cm["data"] if k != "dispatcher.imagePullPolicy"}}),
                    DictStore())
    assert empty.dispatcher_pod is None
    default = _deployment(1)["spec"]["template"]["spec"]
    assert not {"imagePullSecrets", "nodeSelector", "tolerations"} & set(default)
    assert default["securityContext"]["runAsNonRoot"] is True
    assert default["containers"][0]["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.parametrize(("key", "raw"), [("dispatcher.nodeSelector", "[1]"), ("dispatcher.tolerations", "{"),
                                          ("dispatcher.imagePullPolicy", "Sometimes")])
def test_dispatcher_pod_settings_invalid_is_a_readable_error(key: str, raw: str) -> None:
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"}, "data": {key: raw}}
    with pytest.raises(KafkaConfigError, match=rf"knative-eventing/config-kafka key {key}"):
        resolve(SETTINGS, DictStore(cm), DictStore())
