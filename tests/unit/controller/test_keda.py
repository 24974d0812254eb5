"""controller.keda: ScaledObject and TriggerAuthentication built from the connection."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import KedaConfig, ResolvedConnection, resolve
from kafka_eventing.core.kafka_config import KafkaConfigError

from .fakes import KEDA_CM, SETTINGS, DictStore, _keda_connection, _secret


def _scaled(connection: ResolvedConnection, subscribers: list[str], partitions: int = 3) -> dict[str, Any]:
    return keda.scaled_object(res.ChannelRef("team", "orders"), SETTINGS, connection, keda.keda_auth(connection),
                              topic="team.orders", subscribers=subscribers, num_partitions=partitions)


def test_keda_config_from_config_map_and_errors() -> None:
    got = _keda_connection(None).keda
    assert got == KedaConfig(enabled=True, min_replicas=2, max_replicas=10, lag_threshold=25, polling_interval=10,
                             cooldown_period=60)
    assert resolve(SETTINGS, DictStore(), DictStore()).keda == KedaConfig()  # no ConfigMap: off
    for key, value, match in (("dispatcher.keda.enabled", "yes", "true or false"),
                              ("dispatcher.keda.maxReplicas", "0", "at least 1"),
                              ("dispatcher.keda.lagThreshold", "lots", "not an integer"),
                              ("dispatcher.keda.maxReplica", "3", "unknown")):
        with pytest.raises(KafkaConfigError, match=match):
            _keda_connection(None, **{key: value})


def test_scaled_object_one_trigger_per_subscription_with_the_dispatchers_group() -> None:
    so = _scaled(_keda_connection(None), ["s2", "s1"])
    name = res.dispatcher_name("team", "orders")
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert (so["metadata"]["name"], so["metadata"]["namespace"]) == (name, "knative-eventing")
    assert so["metadata"]["annotations"][res.ANNOTATION_CHANNEL] == "team/orders"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert (spec["minReplicaCount"], spec["pollingInterval"], spec["cooldownPeriod"]) == (2, 10, 60)
    assert [t["metadata"]["consumerGroup"] for t in spec["triggers"]] == [
        SETTINGS.consumer_group_template.format(namespace="team", channel="orders", uid=uid) for uid in ("s2", "s1")]
    for t in spec["triggers"]:
        assert t["type"] == "kafka" and "authenticationRef" not in t  # PLAINTEXT: no TriggerAuthentication
        assert t["metadata"] == {**t["metadata"], "topic": "team.orders", "bootstrapServers": "b:9092",
                                 "lagThreshold": "25", "tls": "disable"}
        assert all(isinstance(v, str) for v in t["metadata"].values())  # KEDA's schema: a map of strings
    assert keda.subscriber_uids({"subscribers": [{"uid": "b"}, {"uid": "a"}, {"uid": "a"}, {}]}) == ["a", "b"]


@pytest.mark.parametrize(("maximum", "minimum", "partitions", "bounds"), [
    (10, 2, 3, (2, 3)),  # capped at the partitions: more consumers would idle
    (4, 1, 12, (1, 4)),
    (10, 5, 3, (3, 3)),  # min never above the (capped) max
    (4, 0, 1, (0, 1)),
])
def test_scaled_object_replicas_capped_at_partitions(maximum: int, minimum: int, partitions: int,
                                                     bounds: tuple[int, int]) -> None:
    connection = _keda_connection(None, **{"dispatcher.keda.maxReplicas": str(maximum),
                                           "dispatcher.keda.minReplicas": str(minimum)})
    spec = _scaled(connection, ["s1"], partitions)["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == bounds


@pytest.mark.parametrize(("secret", "metadata", "refs"), [
    ({"protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "user": "u", "password": "p", "ca.crt": "CA"},
     {"tls": "enable", "sasl": "scram_sha512"},
     {"username": "user", "password": "password", "ca": "ca.crt"}),
    # The distributed channel's format: username/sasltype, TLS implied, public CAs (no `ca`).
    ({"brokers": "b:9093", "username": "u", "password": "p", "sasltype": "SCRAM-SHA-256"},
     {"tls": "enable", "sasl": "scram_sha256"},
     {"username": "username", "password": "password"}),
    ({"protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "user": "u", "password": "p"},
     {"tls": "disable", "sasl": "plaintext"},
     {"username": "user", "password": "password"}),
    ({"protocol": "SSL", "ca.crt": "CA", "user.crt": "CERT", "user.key": "KEY"},
     {"tls": "enable"},
     {"ca": "ca.crt", "cert": "user.crt", "key": "user.key"}),
])
def test_keda_auth_maps_our_secret_keys(secret: dict[str, str], metadata: dict[str, str],
                                        refs: dict[str, str]) -> None:
    connection = _keda_connection(secret)
    auth = keda.keda_auth(connection)
    assert dict(auth.metadata) == metadata
    assert {r["parameter"]: r["key"] for r in auth.secret_refs} == refs
    assert {r["name"] for r in auth.secret_refs} == {"creds"}  # the dispatcher's own Secret, never a copy
    ta = keda.trigger_authentication(res.ChannelRef("team", "orders"), SETTINGS, auth)
    assert (ta["kind"], ta["metadata"]["name"]) == ("TriggerAuthentication", res.dispatcher_name("team", "orders"))
    assert ta["spec"] == {"secretTargetRef": [dict(r) for r in auth.secret_refs]}
    for t in _scaled(connection, ["s1"])["spec"]["triggers"]:
        assert t["authenticationRef"] == {"name": ta["metadata"]["name"]}
        assert t["metadata"].items() >= metadata.items()


def test_keda_auth_msk_iam_uses_keda_pod_identity() -> None:
    settings = dataclasses.replace(SETTINGS, kafka_provider="aws-msk-iam")
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"},
          "data": {**KEDA_CM, "bootstrap.servers": "b:9098", "auth.secret.ref.name": "creds"}}
    connection = resolve(settings, DictStore(cm), DictStore(_secret("creds", {"aws.region": "eu-west-1"})))
    auth = keda.keda_auth(connection)
    assert dict(auth.metadata) == {"tls": "enable", "sasl": "oauthbearer", "saslTokenProvider": "aws_msk_iam",
                                   "awsRegion": "eu-west-1"}
    assert auth.pod_identity == {"provider": "aws"} and not auth.secret_refs
    no_region = resolve(settings, DictStore(cm), DictStore(_secret("creds", {})), environ={"AWS_REGION": "x"})
    with pytest.raises(keda.KedaAuthError, match=r"aws\.region"):
        keda.keda_auth(no_region)


def test_keda_auth_needs_the_user_in_the_secret() -> None:
    # Event Hubs' preset supplies the user `$ConnectionString`; KEDA can read it only from the Secret.
    settings = dataclasses.replace(SETTINGS, kafka_provider="azure-event-hubs")
    cm = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"},
          "data": {**KEDA_CM, "bootstrap.servers": "ns.servicebus.windows.net:9093", "auth.secret.ref.name": "creds"}}
    connection = resolve(settings, DictStore(cm), DictStore(_secret("creds", {"password": "Endpoint=sb://"})))
    with pytest.raises(keda.KedaAuthError, match="`user`"):
        keda.keda_auth(connection)


def test_keda_scaled_deployment_has_no_replicas_so_patches_leave_kedas() -> None:
    config = res.DispatcherConfig(replicas=3, checksum="c1")
    ref = res.ChannelRef("team", "orders")
    scaled = res.dispatcher_deployment(ref, SETTINGS, config, 4, keda_scaled=True)
    plain = res.dispatcher_deployment(ref, SETTINGS, config, 4)
    assert "replicas" not in scaled["spec"] and plain["spec"]["replicas"] == 3
    assert scaled["metadata"]["annotations"][res.ANNOTATION_SCALER] == res.SCALER_KEDA
    assert plain["metadata"]["annotations"][res.ANNOTATION_SCALER] == res.SCALER_CONTROLLER
    # Switching either way is a change the reconciler writes (and switching back restores replicas).
    assert res.needs_update(plain, scaled) and res.needs_update(scaled, plain)


def _source(annotations: dict[str, str], net: dict[str, Any] | None = None) -> Any:
    from kafka_eventing.core import kafkasources as ks
    return ks.parse_source({"metadata": {"namespace": "team", "name": "s", "uid": "u", "annotations": annotations},
                            "spec": {"bootstrapServers": ["a:9092", "b:9092"], "topics": ["t1", "t2"],
                                     "initialOffset": "earliest", "sink": {"uri": "http://x"}, "net": net or {}}})


def test_source_scaled_object_one_trigger_per_topic_on_the_sources_group() -> None:
    spec = _source({"autoscaling.knative.dev/class": "keda.autoscaling.knative.dev",
                    "autoscaling.knative.dev/minScale": "0", "autoscaling.knative.dev/maxScale": "8",
                    "keda.autoscaling.knative.dev/kafkaLagThreshold": "7",
                    "keda.autoscaling.knative.dev/pollingInterval": "5",
                    "keda.autoscaling.knative.dev/cooldownPeriod": "60"})
    assert spec.autoscaling is not None
    auth = keda.source_auth(spec, None, "s-team-ks-dispatcher-secret")
    assert not auth.needs_trigger_authentication
    owner = ("kafka.eventing.knative.dev/kafkasource", "team/s")
    so = keda.source_scaled_object(spec, spec.autoscaling, SETTINGS, auth, name="s-team-ks-dispatcher", owner=owner,
                                   num_partitions=3)
    assert so["metadata"]["annotations"][owner[0]] == owner[1]
    assert so["metadata"]["namespace"] == SETTINGS.system_namespace
    s = so["spec"]
    assert s["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "s-team-ks-dispatcher"}
    assert (s["minReplicaCount"], s["maxReplicaCount"], s["pollingInterval"], s["cooldownPeriod"]) == (0, 3, 5, 60)
    assert [t["metadata"] for t in s["triggers"]] == [
        {"bootstrapServers": "a:9092,b:9092", "consumerGroup": "knative-kafka-source-u", "topic": topic,
         "lagThreshold": "7", "activationLagThreshold": "0", "offsetResetPolicy": "earliest", "tls": "disable"}
        for topic in ("t1", "t2")]


def test_source_auth_names_the_copy_of_the_net_secret_keys() -> None:
    ref = lambda key: {"secretKeyRef": {"name": "creds", "key": key}}  # noqa: E731
    spec = _source({}, {"sasl": {"enable": True, "user": ref("u"), "password": ref("p"), "type": ref("m")},
                        "tls": {"enable": True, "caCert": ref("ca")}})
    auth = keda.source_auth(spec, "scram-sha-512", "copy")
    assert auth.metadata == {"tls": "enable", "sasl": "scram_sha512"}
    # KEDA reads Secrets beside its ScaledObject: the system namespace's copy, by the dispatcher's file names.
    assert list(auth.secret_refs) == [{"parameter": "username", "name": "copy", "key": "user"},
                                      {"parameter": "password", "name": "copy", "key": "password"},
                                      {"parameter": "ca", "name": "copy", "key": "ca.crt"}]
    ta = keda.source_trigger_authentication("d", SETTINGS, ("k", "team/s"), auth)
    assert ta["kind"] == "TriggerAuthentication" and ta["spec"] == {"secretTargetRef": list(auth.secret_refs)}
    assert keda.source_auth(_source({}, {"sasl": {"enable": True, "user": ref("u"), "password": ref("p")}}),
                            None, "copy").metadata == {"tls": "disable", "sasl": "plaintext"}
