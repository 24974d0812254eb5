"""The controller against a real kube-apiserver (+ controller-manager) and a real Kafka broker.

The control plane has no nodes, so dispatcher Pods stay Pending. Availability is driven the way a kubelet
would report it: the test marks the Pods that the real ReplicaSet controller created as Running and Ready
(``mark_pods_ready``); the Deployment controller then reports the Deployment available by itself.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.controller import GROUP, PLURAL, RECEIVER, VERSION, Env, dispatcher, eventually, reconciles

from fixtures.kube import gone
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.channels import FINALIZER
from kafka_eventing.core.channels import ANNOTATION_EXTERNAL_TOPIC
from promtool import assert_promtool_passes

pytestmark = [pytest.mark.kube, pytest.mark.kafka]
















# -- tests ------------------------------------------------------------------------------------------
def test_schema_rejects_invalid_specs(env: Env) -> None:
    for i, bad in enumerate(({"numPartitions": 0}, {"replicationFactor": 0}, {"retentionDuration": "1 week"},
                             {"subscribers": [{"uid": "u", "deliveryOrder": "random"}]})):
        with pytest.raises(ApiException) as info:
            env.create(f"bad-{i}", bad)
        assert info.value.status == 422, bad
    env.create("defaults")
    spec = env.get("defaults")["spec"]
    assert (spec["numPartitions"], spec["replicationFactor"], spec["retentionDuration"]) == (1, 1, "PT168H")
    # The same object is served as v1.
    v1 = env.custom.get_namespaced_custom_object(GROUP, "v1", env.namespace, PLURAL, "defaults")
    assert v1["spec"] == spec


def test_channel_lifecycle(env: Env) -> None:
    env.core.create_namespaced_service(env.namespace, {"metadata": {"name": "dls"},
                                                       "spec": {"ports": [{"port": 80}]}})
    env.start_controller()
    env.create("orders", {"numPartitions": 3, "retentionDuration": "PT1H",
                          "delivery": {"deadLetterSink": {"ref": {"apiVersion": "v1", "kind": "Service",
                                                                  "name": "dls"}, "uri": "/dead"}}})
    topic = f"{env.namespace}.orders"
    eventually(lambda: env.topic(topic) == (3, 3_600_000), what="topic with 3 partitions, 1h retention")
    env.wait_condition("orders", "TopicReady", "True")

    svc = eventually(lambda: env.core.read_namespaced_service("orders-kn-channel", env.namespace))
    assert svc.spec.type == "ExternalName"
    assert svc.spec.external_name == f"{RECEIVER}.{env.system}.svc.cluster.local"
    name = dispatcher(env, "orders")
    dep = eventually(lambda: env.apps.read_namespaced_deployment(name, env.system))
    assert dep.spec.replicas == 3  # min(dispatcher_replicas=4, partitions=3)
    container = dep.spec.template.spec.containers[0]
    env_vars = {e.name: e.value for e in container.env}
    assert env_vars["KE_CHANNEL_NAME"] == "orders" and env_vars["KE_CHANNEL_NAMESPACE"] == env.namespace
    assert container.security_context.read_only_root_filesystem and container.security_context.run_as_non_root
    assert dep.spec.template.spec.volumes[1].secret.secret_name == "kafka-connection"
    assert env.core.read_namespaced_service(name, env.system).spec.ports[0].name == "metrics"

    # Addressable at once, but not Ready until the dispatcher and the receiver are available.
    status = eventually(lambda: env.get("orders").get("status", {}).get("address"), what="address")
    assert status["url"] == f"http://orders-kn-channel.{env.namespace}.svc.cluster.local"
    got = env.get("orders")
    assert FINALIZER in got["metadata"]["finalizers"]
    assert got["status"]["deadLetterSinkUri"] == f"http://dls.{env.namespace}.svc.cluster.local/dead"
    assert env.wait_condition("orders", "Ready", "False")["reason"] in (
        "DispatcherDeploymentUnavailable", "ReceiverDeploymentUnavailable")
    env.make_available(name, replicas=3)
    env.make_available(RECEIVER)
    ready = env.wait_condition("orders", "Ready", "True")
    assert env.get("orders")["status"]["observedGeneration"] == env.get("orders")["metadata"]["generation"]

    # A dispatcher's status.subscribers survives the controller's status writes.
    env.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, env.namespace, PLURAL, "orders",
        {"status": {"subscribers": [{"uid": "s1", "ready": "True", "observedGeneration": 1}]}},
        _content_type="application/merge-patch+json")

    # Grow partitions and change retention: applied; the Deployment follows the partition count.
    env.patch_spec("orders", {"numPartitions": 5, "retentionDuration": "PT2H"})
    eventually(lambda: env.topic(topic) == (5, 7_200_000), what="topic grown to 5 partitions, 2h retention")
    eventually(lambda: env.apps.read_namespaced_deployment(name, env.system).spec.replicas == 4, what="replicas")
    # Shrink: refused at apply by the CRD's rule (the controller's PartitionsShrinkRefused is left for a channel
    # stored before it, tests/unit/controller/test_topics.py), nothing changes.
    with pytest.raises(ApiException) as info:
        env.patch_spec("orders", {"numPartitions": 2})
    assert info.value.status == 422 and "numPartitions may grow, never shrink" in info.value.body
    assert env.get("orders")["spec"]["numPartitions"] == 5 and env.topic(topic) == (5, 7_200_000)
    assert env.get("orders")["status"]["subscribers"][0]["uid"] == "s1"
    # Ready's lastTransitionTime moved only when Ready changed.
    assert env.condition("orders", "Ready")["lastTransitionTime"] >= ready["lastTransitionTime"]

    # A rotated connection Secret rolls the dispatcher's pod template.
    before = dep.spec.template.metadata.annotations[res.ANNOTATION_CONFIG_CHECKSUM]
    env.core.patch_namespaced_secret("kafka-connection", env.system, {"stringData": {"client.id": "rotated"}})
    eventually(lambda: env.apps.read_namespaced_deployment(name, env.system).spec.template.metadata.annotations[
        res.ANNOTATION_CONFIG_CHECKSUM] != before, what="checksum change")

    # Delete: topic, dispatcher and Services go, then the finalizer is removed.
    env.delete("orders")
    eventually(lambda: env.gone("orders"), what="channel deleted")
    assert env.topic(topic) is None
    for read, ns, obj in ((env.apps.read_namespaced_deployment, env.system, name),
                          (env.core.read_namespaced_service, env.system, name),
                          (env.core.read_namespaced_service, env.namespace, "orders-kn-channel")):
        with pytest.raises(ApiException) as info:
            read(obj, ns)
        assert info.value.status == 404


def test_topics_kept_external_and_already_gone(env: Env) -> None:
    env.start_controller(env.settings(delete_topics=False))
    # A topic managed outside (Event Hubs style): named by annotation, must exist, never altered or deleted.
    env.create("ext", {"numPartitions": 1}, {ANNOTATION_EXTERNAL_TOPIC: f"ext-{env.namespace}"})
    missing = env.wait_condition("ext", "TopicReady", "False")
    assert missing["reason"] == "TopicNotFound" and "does not exist" in missing["message"]
    env.admin.create_topics([NewTopic(f"ext-{env.namespace}", 2, 1)])[f"ext-{env.namespace}"].result(timeout=20)
    env.wait_condition("ext", "TopicReady", "True")
    assert env.topic(f"ext-{env.namespace}")[0] == 2  # not grown nor shrunk to numPartitions

    env.create("kept")
    eventually(lambda: env.topic(f"{env.namespace}.kept"), what="topic kept created")
    env.delete("kept")
    env.delete("ext")
    eventually(lambda: env.gone("kept") and env.gone("ext"), what="both channels deleted")
    assert env.topic(f"{env.namespace}.kept") is not None  # delete_topics=False
    assert env.topic(f"ext-{env.namespace}") is not None


def test_deleting_a_channel_whose_topic_is_gone(env: Env) -> None:
    env.start_controller()
    env.create("vanished")
    topic = f"{env.namespace}.vanished"
    eventually(lambda: env.topic(topic), what="topic created")
    env.admin.delete_topics([topic])[topic].result(timeout=20)
    eventually(lambda: env.topic(topic) is None, what="topic deleted by hand")
    env.delete("vanished")
    eventually(lambda: env.gone("vanished"), what="channel deleted")


def test_deleting_a_channel_stops_its_dispatcher_before_deleting_its_topic(env: Env) -> None:
    """While a dispatcher pod still exists (held here by a finalizer, as a kubelet keeps a terminating pod until
    its process exits) the channel's topic stays; once the Deployment is gone, pods and all, the topic goes."""
    env.start_controller()
    env.create("held")
    topic = f"{env.namespace}.held"
    eventually(lambda: env.topic(topic), what="topic created")
    dispatcher = res.dispatcher_name(env.namespace, "held")
    eventually(lambda: env.apps.read_namespaced_deployment(dispatcher, env.system), what="dispatcher")
    pods = env.hold_pods(dispatcher)

    env.delete("held")
    eventually(lambda: all(env.core.read_namespaced_pod(pod, env.system).metadata.deletion_timestamp
                           for pod in pods), what="the dispatcher pods terminating")
    # Many reconciles happen meanwhile (the recheck is 2 s, each Deployment event one more): none may delete
    # the topic while a dispatcher pod could still be consuming it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert env.topic(topic) is not None, "the topic was deleted while the dispatcher pod still existed"
        time.sleep(0.2)
    assert not env.gone("held")

    env.release_pods(pods)
    eventually(lambda: gone(lambda: env.apps.read_namespaced_deployment(dispatcher, env.system)),
               what="the dispatcher Deployment gone")
    eventually(lambda: env.topic(topic) is None, what="the topic deleted after the dispatcher")
    eventually(lambda: env.gone("held"), what="the channel deleted")


def test_deleting_a_channel_deletes_its_subscribers_consumer_groups(env: Env) -> None:
    from confluent_kafka import Consumer, TopicPartition

    # The topic stays (delete_topics=False): Kafka itself drops the offsets, and so the empty groups, of a deleted
    # topic, which would hide a group the controller left behind.
    env.start_controller(env.settings(delete_topics=False))
    subscribers = [{"uid": uid, "generation": 1, "subscriberUri": f"http://{uid}.example/"} for uid in ("a", "b")]
    env.create("grouped", {"subscribers": subscribers})
    topic = f"{env.namespace}.grouped"
    eventually(lambda: env.topic(topic), what="topic created")
    groups = {f"kafka.{env.namespace}.grouped.{uid}" for uid in ("a", "b")}
    for group in groups:  # what a dispatcher leaves: committed offsets, no members
        consumer = Consumer({**env.kafka.client_config(), "group.id": group, "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        consumer.close()

    def listed() -> set[str]:
        return {g.group_id for g in env.admin.list_consumer_groups().result(10).valid}

    assert groups <= listed()
    env.delete("grouped")
    eventually(lambda: env.gone("grouped"), what="channel deleted")
    assert not groups & listed(), "a deleted channel's consumer groups were left behind"


def test_kafka_outage_is_reported_and_recovered(env: Env) -> None:
    env.start_controller()
    env.kafka.stop()
    try:
        env.create("outage", {"numPartitions": 2})
        down = env.wait_condition("outage", "TopicReady", "False", timeout=40)
        assert down["reason"] == "KafkaUnreachable", down
        assert env.kafka.bootstrap_servers in down["message"]
    finally:
        env.kafka.start()
    # Same controller, no restart: the requeue with backoff retries until Kafka answers.
    env.wait_condition("outage", "TopicReady", "True", timeout=60)
    assert env.topic(f"{env.namespace}.outage") == (2, 168 * 3_600_000)


def test_only_the_lease_holder_writes_and_a_restart_converges(env: Env) -> None:
    first = env.start_controller(health_port=0, health_address="127.0.0.1")
    eventually(lambda: first.elector.is_leader, what="first controller leads")
    base = f"http://127.0.0.1:{first.health_port}"
    assert urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok"
    second = env.start_controller()
    eventually(second.synced, what="second controller synced")
    names = [f"c{i}" for i in range(3)]
    for n in names:
        env.create(n, {"numPartitions": 2})
    eventually(lambda: all(env.condition(n, "TopicReady") for n in names), what="channels reconciled")
    assert not second.elector.is_leader
    assert reconciles(second) == 0
    assert reconciles(first) > 0
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    assert "kafkachannel_reconcile_duration_seconds_count" in metrics
    assert "kafkachannel_controller_leader 1.0" in metrics
    assert_promtool_passes(metrics, "the leading controller's /metrics")

    # Stop the leader mid-way (a new channel pending); the standby takes over and converges.
    first.stop()
    env.controllers.remove(first)
    env.create("late", {"numPartitions": 2})
    eventually(lambda: second.elector.is_leader, timeout=20, what="second controller leads")
    eventually(lambda: env.condition("late", "TopicReady"), what="late channel reconciled by the new leader")
    # A restarted controller (fresh caches) converges without duplicates.
    third = env.start_controller()
    second.stop()
    env.controllers.remove(second)
    eventually(lambda: third.elector.is_leader, timeout=20, what="third controller leads")
    for n in [*names, "late"]:
        env.make_available(dispatcher(env, n), replicas=2)
    env.make_available(RECEIVER)
    for n in [*names, "late"]:
        env.wait_condition(n, "Ready", "True")
    selector = f"{res.LABEL_MANAGED_BY}={res.MANAGED_BY},{res.LABEL_COMPONENT}=dispatcher"
    # Controllers watch every namespace, so leftovers of earlier tests may have dispatchers here (a Broker's or a
    # KafkaSource's too, without a channel annotation): count ours.
    def ours(items: list[Any]) -> list[str]:
        return sorted(i.metadata.name for i in items
                      if (i.metadata.annotations or {}).get(res.ANNOTATION_CHANNEL, "").startswith(f"{env.namespace}/"))

    expected = sorted(dispatcher(env, n) for n in [*names, "late"])
    assert ours(env.apps.list_namespaced_deployment(env.system, label_selector=selector).items) == expected
    assert ours(env.core.list_namespaced_service(env.system, label_selector=selector).items) == expected
    assert len(env.core.list_namespaced_service(env.namespace).items) == 4
    lease = client.CoordinationV1Api(env.api).read_namespaced_lease("kafka-channel-controller", env.system)
    assert lease.spec.holder_identity == third.identity


def test_with_ingress_auth_on_channels_publish_their_audience(env: Env) -> None:
    issuer = "https://issuer.example"
    env.start_controller(env.settings(auth_issuer=issuer))
    env.create("secured")
    address = eventually(lambda: env.get("secured").get("status", {}).get("address"), what="address")
    assert address["audience"] == f"messaging.knative.dev/kafkachannel/{env.namespace}/secured"
    # Its dispatcher knows auth is on (a Broker's replies into the ingress carry a token then).
    dep = eventually(lambda: env.apps.read_namespaced_deployment(dispatcher(env, "secured"), env.system))
    assert {v.name: v.value for v in dep.spec.template.spec.containers[0].env}["KE_AUTH_ISSUER"] == issuer


def test_with_ingress_auth_off_no_audience_is_published(env: Env) -> None:
    env.start_controller()
    env.create("open")
    address = eventually(lambda: env.get("open").get("status", {}).get("address"), what="address")
    assert "audience" not in address
    dep = eventually(lambda: env.apps.read_namespaced_deployment(dispatcher(env, "open"), env.system))
    assert "KE_AUTH_ISSUER" not in {v.name for v in dep.spec.template.spec.containers[0].env}
