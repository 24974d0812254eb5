"""KEDA scaling of the dispatchers: the controller against a real kube-apiserver holding KEDA's real CRDs.

KEDA itself does not run here (no nodes, no metrics pipeline): the API server validates every ScaledObject and
TriggerAuthentication the controller writes against KEDA's own schema, and the test plays KEDA's part where it
matters — it changes the dispatcher's replicas and checks the controller leaves them alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from support.controller import Env, dispatcher, eventually, reconciles

from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP

pytestmark = [pytest.mark.kube, pytest.mark.kafka]


KEDA_ON = {"dispatcher.keda.enabled": "true", "dispatcher.keda.minReplicas": "1",
           "dispatcher.keda.maxReplicas": "8", "dispatcher.keda.lagThreshold": "50",
           "dispatcher.keda.pollingInterval": "15", "dispatcher.keda.cooldownPeriod": "120"}


def _keda_object(env: Env, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(env.custom.get_namespaced_custom_object(keda.GROUP, keda.VERSION, env.system, plural, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def scaled_object(env: Env, name: str) -> dict[str, Any] | None:
    return _keda_object(env, keda.SCALED_OBJECTS, name)


def trigger_auth(env: Env, name: str) -> dict[str, Any] | None:
    return _keda_object(env, keda.TRIGGER_AUTHENTICATIONS, name)


def set_config(env: Env, data: dict[str, str]) -> None:
    body = {"metadata": {"name": DEFAULT_CONFIG_MAP}, "data": data}
    try:
        env.core.create_namespaced_config_map(env.system, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        env.core.patch_namespaced_config_map(DEFAULT_CONFIG_MAP, env.system, body)


def replicas(env: Env, name: str) -> int:
    return int(env.apps.read_namespaced_deployment(name, env.system).spec.replicas)


def groups(so: dict[str, Any]) -> list[str]:
    return [t["metadata"]["consumerGroup"] for t in so["spec"]["triggers"]]


def test_keda_scaled_object_lifecycle(env: Env, keda_crds: Any) -> None:
    set_config(env, KEDA_ON)  # the fixture starts where KEDA is not installed
    ctl = env.start_controller(keda_discovery_seconds=0.5)
    settings = ctl.settings
    env.create("orders", {"numPartitions": 3, "subscribers": [{"uid": "s1", "subscriberUri": "http://a.example"}]})
    name = dispatcher(env, "orders")

    # No CRD: a reason on the channel, and the controller keeps the replicas (nobody else would scale).
    missing = env.wait_condition("orders", "DispatcherAutoscalerReady", "False")
    assert missing["reason"] == "KEDANotInstalled", missing
    assert eventually(lambda: replicas(env, name) == 3, what="controller-set replicas")
    env.make_available(name, replicas=3)
    env.make_available("kafka-channel-receiver")
    env.wait_condition("orders", "Ready", "True")  # KEDA is an opt-in extra, not a readiness dependency

    # KEDA installed later: picked up without a restart; the API server accepted it against KEDA's schema.
    keda_crds.install()
    env.wait_condition("orders", "DispatcherAutoscalerReady", "True")
    so = eventually(lambda: scaled_object(env, name), what="ScaledObject")
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 3)  # max capped at the 3 partitions
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (15, 120)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "kafka" and "authenticationRef" not in trigger  # PLAINTEXT: nothing to hand over
    assert trigger["metadata"] == {
        "bootstrapServers": env.kafka.bootstrap_servers, "topic": f"{env.namespace}.orders",
        "consumerGroup": settings.consumer_group_for(env.namespace, "orders", "s1"),
        "lagThreshold": "50", "tls": "disable"}
    assert so["metadata"]["annotations"][res.ANNOTATION_CHANNEL] == f"{env.namespace}/orders"
    assert trigger_auth(env, name) is None
    dep = env.apps.read_namespaced_deployment(name, env.system)
    assert dep.metadata.annotations[res.ANNOTATION_SCALER] == res.SCALER_KEDA

    # The schema is really enforced: what the controller wrote passed it, this does not.
    bad = {**so, "metadata": {"name": "bad"}, "spec": {**spec, "minReplicaCount": "one"}}
    with pytest.raises(ApiException) as info:
        env.custom.create_namespaced_custom_object(keda.GROUP, keda.VERSION, env.system, keda.SCALED_OBJECTS, bad)
    assert info.value.status == 422

    # KEDA scales: the controller does not set replicas back, not even when it patches the Deployment.
    env.apps.patch_namespaced_deployment_scale(name, env.system, {"spec": {"replicas": 2}})
    before = reconciles(ctl)
    eventually(lambda: reconciles(ctl) >= before + 3, what="a few reconciles")
    assert replicas(env, name) == 2
    checksum = dep.spec.template.metadata.annotations[res.ANNOTATION_CONFIG_CHECKSUM]
    env.core.patch_namespaced_secret("kafka-connection", env.system, {"stringData": {"client.id": "rotated"}})
    eventually(lambda: env.apps.read_namespaced_deployment(name, env.system).spec.template.metadata.annotations[
        res.ANNOTATION_CONFIG_CHECKSUM] != checksum, what="Deployment patched for the rotated Secret")
    assert replicas(env, name) == 2

    # A new subscription: a trigger on its consumer group.
    env.patch_spec("orders", {"subscribers": [{"uid": "s1", "subscriberUri": "http://a.example"},
                                              {"uid": "s2", "subscriberUri": "http://b.example"}]})
    so = eventually(lambda: (s := scaled_object(env, name)) and len(s["spec"]["triggers"]) == 2 and s,
                    what="second trigger")
    assert groups(so) == [
        settings.consumer_group_for(env.namespace, "orders", uid) for uid in ("s1", "s2")]

    # SASL_SSL + SCRAM: a TriggerAuthentication pointing into the same connection Secret.
    env.core.replace_namespaced_secret("kafka-connection", env.system, {
        "metadata": {"name": "kafka-connection", "labels": {"eventing-kafka.knative.dev/kafka-secret": "true"}},
        "stringData": env.kafka.connection_secret(sasl_ssl=True)})
    ta = eventually(lambda: trigger_auth(env, name), what="TriggerAuthentication")
    assert sorted(ta["spec"]["secretTargetRef"], key=lambda r: r["parameter"]) == [
        {"parameter": "ca", "name": "kafka-connection", "key": "ca.crt"},
        {"parameter": "password", "name": "kafka-connection", "key": "password"},
        {"parameter": "username", "name": "kafka-connection", "key": "user"}]
    so = eventually(lambda: (s := scaled_object(env, name)) and s["spec"]["triggers"][0]["metadata"].get(
        "sasl") and s, what="SASL triggers")
    for t in so["spec"]["triggers"]:
        assert t["authenticationRef"] == {"name": name}
        assert (t["metadata"]["sasl"], t["metadata"]["tls"]) == ("scram_sha512", "enable")
        assert t["metadata"]["bootstrapServers"] == env.kafka.sasl_ssl_bootstrap_servers
    env.wait_condition("orders", "TopicReady", "True")  # the same Secret really works against Kafka

    # KEDA disabled: both objects go, and the controller owns replicas again.
    set_config(env, {**KEDA_ON, "dispatcher.keda.enabled": "false"})
    eventually(lambda: scaled_object(env, name) is None and trigger_auth(env, name) is None, what="KEDA objects gone")
    eventually(lambda: replicas(env, name) == 3, what="replicas restored by the controller")
    eventually(lambda: env.condition("orders", "DispatcherAutoscalerReady") is None, what="condition dropped")
    assert env.apps.read_namespaced_deployment(name, env.system).metadata.annotations[
        res.ANNOTATION_SCALER] == res.SCALER_CONTROLLER

    # Enabled again but no subscribers: nothing to scale on, so no ScaledObject.
    env.patch_spec("orders", {"subscribers": []})
    set_config(env, KEDA_ON)
    idle = env.wait_condition("orders", "DispatcherAutoscalerReady", "True")
    assert idle["reason"] == "NoSubscribers"
    before = reconciles(ctl)
    eventually(lambda: reconciles(ctl) >= before + 2, what="a couple of reconciles")
    assert scaled_object(env, name) is None and replicas(env, name) == 3

    # Deleting the channel removes what KEDA got too.
    env.patch_spec("orders", {"subscribers": [{"uid": "s1", "subscriberUri": "http://a.example"}]})
    eventually(lambda: scaled_object(env, name), what="ScaledObject back")
    env.delete("orders")
    eventually(lambda: env.gone("orders"), what="channel deleted")
    assert scaled_object(env, name) is None and trigger_auth(env, name) is None
