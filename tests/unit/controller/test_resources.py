"""controller.resources: the desired dispatcher Deployment/Service and channel Service."""

from __future__ import annotations

from kafka_eventing.controller import resources as res
from kafka_eventing.core.settings import Settings

from .fakes import SETTINGS, _deployment


def test_dispatcher_name_plain_when_it_fits() -> None:
    assert res.dispatcher_name("default", "orders") == "orders-default-dispatcher"


def test_dispatcher_name_hashed_when_long_or_invalid_and_deterministic() -> None:
    long_name = "a" * 60
    name = res.dispatcher_name("team-payments", long_name)
    assert len(name) <= 63 and res.is_dns1035(name) and name.endswith("-dispatcher")
    assert name == res.dispatcher_name("team-payments", long_name)
    assert name != res.dispatcher_name("team-payment", long_name)  # the hash tells them apart
    dotted = res.dispatcher_name("ns", "1.orders")
    assert res.is_dns1035(dotted) and dotted.startswith("kc-")


def test_channel_service_points_at_shared_receiver() -> None:
    svc = res.channel_service(res.ChannelRef("team", "orders", "uid-1"), SETTINGS)
    assert svc["metadata"]["name"] == "orders-kn-channel" and svc["metadata"]["namespace"] == "team"
    assert svc["spec"] == {"type": "ExternalName", "sessionAffinity": "None",
                           "externalName": "kafka-channel-receiver.knative-eventing.svc.cluster.local"}
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert res.channel_url("team", "orders") == "http://orders-kn-channel.team.svc.cluster.local"


def test_dispatcher_replicas_never_above_partitions() -> None:
    assert _deployment(1)["spec"]["replicas"] == 1
    assert _deployment(2)["spec"]["replicas"] == 2
    assert _deployment(10)["spec"]["replicas"] == 3


def test_dispatcher_pod_is_restricted_and_configured() -> None:
    dep = _deployment(3)
    assert dep["metadata"]["namespace"] == "knative-eventing"
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                  "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["KE_CHANNEL_SOURCE"] == "kube"
    assert (env["KE_CHANNEL_NAMESPACE"], env["KE_CHANNEL_NAME"]) == ("team", "orders")
    assert env["KE_KAFKA_SECRET_DIR"] == res.SECRET_MOUNT and env["KE_BOOTSTRAP_SERVERS"] == "k:9092"
    Settings.from_env({k: v for k, v in env.items() if k.startswith("KE_")})  # the dispatcher can read them all
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/tmp"] == "tmp" and mounts[res.SECRET_MOUNT] == "kafka-secret"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    assert volumes["kafka-secret"]["secret"]["secretName"] == "kafka"
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_no_secret_means_no_mount() -> None:
    dep = _deployment(1, secret=None)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "KE_KAFKA_SECRET_DIR" not in {e["name"] for e in container["env"]}
    assert [v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]] == ["tmp"]


def test_config_checksum_rolls_the_template_and_spec_hash() -> None:
    a, b = _deployment(1, checksum="c1"), _deployment(1, checksum="c2")
    assert a["spec"]["template"]["metadata"]["annotations"][res.ANNOTATION_CONFIG_CHECKSUM] == "c1"
    assert res.needs_update(a, b) and not res.needs_update(a, _deployment(1, checksum="c1"))
    assert res.needs_update(None, a)


def test_deployment_available_needs_a_replica() -> None:
    assert res.deployment_available(None)[0] is False
    # replicas=1 with maxUnavailable 25% reports Available=True with zero replicas up: not enough for us.
    zero = {"status": {"availableReplicas": 0, "conditions": [{"type": "Available", "status": "True"}]}}
    assert res.deployment_available(zero)[0] is False
    one = {"status": {"availableReplicas": 1, "conditions": [{"type": "Available", "status": "True"}]}}
    assert res.deployment_available(one) == (True, "")


def test_dispatchers_get_the_tracing_settings_only_when_tracing_is_on() -> None:
    ref, config = res.ChannelRef("team", "orders"), res.DispatcherConfig(replicas=1, checksum="c")
    off = {e["name"] for e in res.dispatcher_env(ref, SETTINGS, config)}
    assert not {n for n in off if n.startswith("KE_TRACING")}
    traced = Settings(tracing_endpoint="http://collector:4318", tracing_sample_ratio=0.25)
    env = {e["name"]: e["value"] for e in res.dispatcher_env(ref, traced, config)}
    assert env["KE_TRACING_ENDPOINT"] == "http://collector:4318" and env["KE_TRACING_SAMPLE_RATIO"] == "0.25"
