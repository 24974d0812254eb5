"""Controller pieces without an API server: desired objects, conditions, work queue, topic logic, connection."""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
from collections.abc import Mapping
from importlib import resources as importlib_resources
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.conditions import Condition
from kafka_eventing.controller.connection import SECRET_LABEL, AdminPool, KedaConfig, ResolvedConnection, resolve
from kafka_eventing.controller.topics import (
    ShrinkRefused,
    TopicError,
    TopicNotFound,
    TopicSpec,
    TopicState,
    ensure_topic,
    explain,
)
from kafka_eventing.controller.workqueue import WorkQueue
from kafka_eventing.core.kafka_config import KafkaConfigError
from kafka_eventing.core.settings import Settings

SETTINGS = Settings(system_namespace="knative-eventing", dispatcher_replicas=3, dispatcher_image="disp:1")


# -- CRD --------------------------------------------------------------------------------------------
def _crd() -> dict[str, Any]:
    text = importlib_resources.files("kafka_eventing.controller").joinpath("crds/kafkachannels.yaml").read_text()
    return dict(yaml.safe_load(text))


def test_crd_serves_v1beta1_storage_and_v1_with_one_schema() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == "kafkachannels.messaging.knative.dev"
    assert crd["metadata"]["labels"]["messaging.knative.dev/subscribable"] == "true"
    assert crd["metadata"]["labels"]["duck.knative.dev/addressable"] == "true"
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["kc"]
    assert set(names["categories"]) == {"all", "knative", "messaging", "channel"}
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert versions["v1beta1"]["storage"] and not versions["v1"]["storage"]
    assert versions["v1"]["schema"] == versions["v1beta1"]["schema"]
    for v in versions.values():
        assert v["served"] and v["subresources"] == {"status": {}}
        assert [c["name"] for c in v["additionalPrinterColumns"]] == ["Ready", "Reason", "URL", "Age"]
    spec = versions["v1beta1"]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["numPartitions"]["default"] == 1 and spec["numPartitions"]["minimum"] == 1
    assert spec["replicationFactor"]["default"] == 1 and spec["replicationFactor"]["minimum"] == 1
    assert spec["retentionDuration"]["default"] == "PT168H"
    sub = spec["subscribers"]["items"]["properties"]
    assert {"uid", "generation", "subscriberUri", "replyUri", "delivery", "deliveryOrder", "rateLimit"} <= set(sub)


@pytest.mark.parametrize(("value", "ok"), [("PT168H", True), ("P7D", True), ("PT1.5S", True), ("P1DT2H30M", True),
                                           ("168h", False), ("P1Y", False), ("7 days", False)])
def test_crd_retention_pattern(value: str, ok: bool) -> None:
    import re

    spec = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert bool(re.match(spec["retentionDuration"]["pattern"], value)) is ok


# -- names and desired objects ----------------------------------------------------------------------
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


def _deployment(partitions: int, secret: str | None = "kafka", checksum: str = "c1") -> dict[str, Any]:
    config = res.DispatcherConfig(replicas=3, checksum=checksum, secret_name=secret, bootstrap_servers="k:9092")
    return res.dispatcher_deployment(res.ChannelRef("team", "orders"), SETTINGS, config, partitions)


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


# -- conditions -------------------------------------------------------------------------------------
def test_merge_keeps_transition_time_unless_status_changes() -> None:
    first = cond.merge(None, [Condition.false(cond.TOPIC_READY, "KafkaUnreachable", "down")], now="t1")
    same = cond.merge(first, [Condition.false(cond.TOPIC_READY, "KafkaUnreachable", "still down")], now="t2")
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["message"] == "still down"
    flipped = cond.merge(same, [Condition.true(cond.TOPIC_READY)], now="t3")
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["status"] == "True"


def test_ready_reports_the_first_false_dependent() -> None:
    all_true = [Condition.true(kind) for kind in cond.DEPENDENTS]
    assert cond.ready_condition(all_true).is_true
    some = [*all_true[1:], Condition.false(cond.TOPIC_READY, "TopicQuotaExceeded", "quota")]
    ready = cond.ready_condition(some)
    assert (ready.status, ready.reason, ready.message) == ("False", "TopicQuotaExceeded", "quota")
    missing = cond.ready_condition(all_true[:-1])
    assert missing.status == "Unknown"
    with_dls = cond.ready_condition([*all_true, Condition.false(cond.DEAD_LETTER_SINK_RESOLVED, "X", "y")])
    assert with_dls.status == "False" and with_dls.reason == "X"


# -- work queue -------------------------------------------------------------------------------------
def test_queue_dedups_and_never_hands_one_key_to_two_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(0) == "a"
    q.add("a")  # changed while processing: queued again only after done()
    assert q.get(0) == "b"
    assert q.get(0) is None
    q.done("a")
    assert q.get(0) == "a"


def test_queue_rate_limit_grows_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=5.0)
    delays = [q.add_rate_limited("k") for _ in range(5)]
    assert delays[0] == pytest.approx(1.0, rel=0.11) and delays[1] == pytest.approx(2.0, rel=0.11)
    assert max(delays) <= 5.5 and q.failures("k") == 5
    q.forget("k")
    assert q.failures("k") == 0


def test_queue_add_after_is_delivered_when_due() -> None:
    now = [0.0]
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0])
    q.add_after("late", 10)
    q.add_after("early", 1)
    assert q.get(0) is None
    now[0] = 5
    assert q.get(0) == "early"
    now[0] = 11
    assert q.get(0) == "late"


def test_queue_shutdown_wakes_waiters() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(2)
    assert got == [None]


# -- topics -----------------------------------------------------------------------------------------
class FakeAdmin:
    def __init__(self, topics: dict[str, TopicState] | None = None, fail: TopicError | None = None) -> None:
        self.topics = topics or {}
        self.fail = fail
        self.calls: list[str] = []

    def describe(self, name: str) -> TopicState:
        if self.fail:
            raise self.fail
        if name not in self.topics:
            raise TopicNotFound(name)
        return self.topics[name]

    def create(self, spec: TopicSpec) -> None:
        self.calls.append("create")
        self.topics[spec.name] = TopicState(spec.name, spec.partitions, spec.retention_ms)

    def set_partitions(self, name: str, partitions: int) -> None:
        self.calls.append(f"partitions={partitions}")
        self.topics[name] = TopicState(name, partitions, self.topics[name].retention_ms)

    def set_retention(self, name: str, retention_ms: int) -> None:
        self.calls.append(f"retention={retention_ms}")
        self.topics[name] = TopicState(name, self.topics[name].partitions, retention_ms)

    def delete(self, name: str) -> None:
        self.topics.pop(name, None)


def test_ensure_topic_creates_then_is_idempotent() -> None:
    admin = FakeAdmin()
    spec = TopicSpec("ns.c", 3, 1, 1000)
    assert ensure_topic(admin, spec, manage=True).created
    assert ensure_topic(admin, spec, manage=True) == ensure_topic(admin, spec, manage=True)
    assert admin.calls == ["create"]


def test_ensure_topic_grows_partitions_and_sets_retention() -> None:
    admin = FakeAdmin({"t": TopicState("t", 2, 1000)})
    out = ensure_topic(admin, TopicSpec("t", 4, 1, 2000), manage=True)
    assert out.partitions_added == 2 and out.retention_changed
    assert admin.topics["t"] == TopicState("t", 4, 2000)


def test_ensure_topic_refuses_to_shrink_and_changes_nothing() -> None:
    admin = FakeAdmin({"t": TopicState("t", 4, 1000)})
    with pytest.raises(ShrinkRefused) as info:
        ensure_topic(admin, TopicSpec("t", 2, 1, 5000), manage=True)
    assert info.value.reason == "PartitionsShrinkRefused" and not info.value.retriable
    assert admin.calls == []


def test_external_topic_is_checked_never_created_or_altered() -> None:
    admin = FakeAdmin()
    with pytest.raises(TopicError, match="does not exist") as info:
        ensure_topic(admin, TopicSpec("hub", 1, 1, 1), manage=False)
    assert info.value.reason == "TopicNotFound"
    admin.topics["hub"] = TopicState("hub", 32, 1)
    ensure_topic(admin, TopicSpec("hub", 1, 1, 99), manage=False)
    assert admin.calls == []


@pytest.mark.parametrize(("code", "reason"), [
    (KafkaError._TRANSPORT, "KafkaUnreachable"),
    (KafkaError.POLICY_VIOLATION, "TopicQuotaExceeded"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, "TopicNotAuthorized"),
    (KafkaError.INVALID_REPLICATION_FACTOR, "InvalidReplicationFactor"),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, "TopicNotFound"),
    (KafkaError.INVALID_CONFIG, "TopicFailed"),
])
def test_explain_maps_provider_errors_to_readable_reasons(code: int, reason: str) -> None:
    err = explain(KafkaException(KafkaError(code, "broker says no")), "ns.c", "create", "k:9092")
    assert err.reason == reason
    assert "ns.c" in err.message


# -- connection -------------------------------------------------------------------------------------
class DictStore:
    def __init__(self, *objs: Mapping[str, Any]) -> None:
        self.objs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objs.get((namespace, name))

    def items(self) -> list[Mapping[str, Any]]:
        return list(self.objs.values())


def _secret(name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "knative-eventing", "labels": labels or {}},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


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


def test_batcher_coalesces_concurrent_calls_into_one_request() -> None:
    from concurrent.futures import Future

    from kafka_eventing.controller.topics import _Batcher

    requests: list[list[str]] = []

    def send(items: list[str]) -> dict[str, Future[str]]:
        requests.append(items)
        out: dict[str, Future[str]] = {}
        for item in items:
            out[item] = Future()
            out[item].set_result(item.upper())
        return out

    batcher = _Batcher(send, window=0.2)
    results: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=n: results.update({n: batcher.submit(n).result(5)}))
               for n in ("a", "b", "a", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == {"a": "A", "b": "B", "c": "C"}
    assert len(requests) == 1 and sorted(requests[0]) == ["a", "b", "c"]  # the duplicate is sent once


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


# -- KEDA -------------------------------------------------------------------------------------------
KEDA_CM = {"dispatcher.keda.enabled": "true", "dispatcher.keda.minReplicas": "2", "dispatcher.keda.maxReplicas": "10",
           "dispatcher.keda.lagThreshold": "25", "dispatcher.keda.pollingInterval": "10",
           "dispatcher.keda.cooldownPeriod": "60"}


def _keda_connection(secret: dict[str, str] | None, **cm: str) -> ResolvedConnection:
    data = {**KEDA_CM, **cm, "bootstrap.servers": "b:9092"}
    if secret is not None:
        data["auth.secret.ref.name"] = "creds"
    config_map = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"}, "data": data}
    return resolve(SETTINGS, DictStore(config_map), DictStore(_secret("creds", secret or {})),
                   environ={"AWS_REGION": "eu-west-1"})


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
