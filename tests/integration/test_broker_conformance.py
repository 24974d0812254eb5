"""The Kafka Broker end to end, following Knative's Broker conformance spec (docs/spec/broker.md, data plane):
the real controller and kube-apiserver, the real receiver (gunicorn, Brokers from the API server), the real
dispatcher (its Trigger source on the API server) and real Kafka, with HTTP subscribers on 127.0.0.1.

Covered: ingress answers 202 only for events Kafka holds; every matching Trigger gets each event at least once and
a non-matching one never (its group still moves past it); attributes, extensions and data arrive unchanged;
replies go back into the Broker and reach the Triggers that match them; a reply loop ends when the hop TTL runs
out (dropped and counted); failed deliveries are retried then dead-lettered with the error extensions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from support.broker_dispatch import PONG, RunningDispatcher, reply_with
from support.brokers import (
    Brokers,
    start,
)
from support.brokers import api as brokers_api
from support.dispatcher import Received, Subscriber, committed
from support.receiver import Receiver, binary_headers, read_all

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher.delivery import TTL_EXTENSION
from kafka_eventing.dispatcher.status import KubeTriggerStatusWriter
from kafka_eventing.dispatcher.triggers import KubeTriggerSource
from kafka_eventing.localstack.kube import KubeControlPlane
from waiting import wait_for

#: The module's API server, with these kinds' CRDs (a fixture, used by name).
api = brokers_api

pytestmark = [pytest.mark.kube, pytest.mark.kafka]

BROKER = "default"


def loop_reply(received: Received, _attempt: int) -> tuple[int, dict[str, str], bytes, float]:
    # Answers every loop event with another one of the same type: only the hop TTL ends it.
    hop = received.headers.get(f"ce-{TTL_EXTENSION}", "?")
    return 200, {"ce-specversion": "1.0", "ce-id": f"loop-{hop}", "ce-source": "/loop",
                 "ce-type": "com.example.loop"}, b"", 0.0


@pytest.fixture
def http() -> Iterator[Subscriber]:
    with Subscriber().running() as sub:
        yield sub


@pytest.fixture
def dispatcher(kube_control_plane: KubeControlPlane, brokers: Brokers) -> Iterator[Callable[[str], RunningDispatcher]]:
    running: list[RunningDispatcher] = []

    def run(reply_uri: str) -> RunningDispatcher:
        e = brokers.env
        settings = Settings(bootstrap_servers=e.kafka.bootstrap_servers, broker_namespace=e.namespace,
                            broker_name=BROKER, log_level="WARNING", retry_after_max_seconds=1,
                            kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")
        api_client = kube_control_plane.api_client()
        source = KubeTriggerSource(api_client, e.namespace, BROKER, reply_uri=reply_uri)
        d = RunningDispatcher(settings, source, KubeTriggerStatusWriter(api_client))
        running.append(d)
        return d

    try:
        yield run
    finally:
        for d in running:
            d.stop()


def test_broker_data_plane(brokers: Brokers, http: Subscriber, start_receiver: Callable[..., Receiver],
                           kube_control_plane: KubeControlPlane,
                           dispatcher: Callable[[str], RunningDispatcher]) -> None:
    e = brokers.env
    start(e)
    brokers.ready_broker(BROKER)
    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
    ingress = f"/{e.namespace}/{BROKER}"
    http.behaviours.update({"/replier": reply_with(PONG), "/loop": loop_reply,
                            "/failing": lambda _r, _a: (500, {}, b"broken", 0.0)})

    def trigger(name: str, path: str, filters: list[dict[str, Any]] | None = None,
                annotations: dict[str, str] | None = None, **spec: Any) -> None:
        body: dict[str, Any] = {"broker": BROKER, "subscriber": {"uri": http.url(path)}, **spec}
        if filters is not None:
            body["filters"] = filters
        brokers.trigger(name, body, annotations)

    trigger("all", "/all")
    trigger("orders", "/orders", [{"prefix": {"type": "com.example.order."}}])
    trigger("eu-orders", "/eu", [{"cesql": "type LIKE 'com.example.order.%' AND region = 'eu'"}])
    trigger("none", "/none", [{"exact": {"type": "com.example.nothing"}}])
    trigger("replier", "/replier", [{"exact": {"type": "com.example.ping"}}])
    trigger("pongs", "/pongs", [{"exact": {"type": "com.example.pong"}}])
    trigger("loop", "/loop", [{"exact": {"type": "com.example.loop"}}])
    trigger("failing", "/failing", [{"exact": {"type": "com.example.fail"}}],
            delivery={"retry": 1, "backoffDelay": "PT0.05S", "deadLetterSink": {"uri": http.url("/dls")}})
    # Ordered: one event at a time per partition, so the slower early events still arrive first.
    http.behaviours["/ordered"] = lambda r, _a: (200, {}, b"", 0.05 if int(r.headers["ce-seq"]) % 3 == 0 else 0.0)
    trigger("ordered", "/ordered", [{"exact": {"type": "com.example.seq"}}],
            {kb.ANNOTATION_DELIVERY_ORDER: "ordered"})
    names = ("all", "orders", "eu-orders", "none", "replier", "pongs", "loop", "failing", "ordered")
    running = dispatcher(receiver.url + ingress)
    for name in names:
        # Ready only once the dispatcher reported the Trigger's consumer group joined (ConsumerGroupReady).
        brokers.wait(kb.TRIGGERS, name, "Ready", "True", timeout=60)
        group = brokers.condition(kb.TRIGGERS, name, kb.CONSUMER_GROUP_READY)
        assert group is not None and (group["status"], group["reason"]) == ("True", "ConsumerGroupJoined")
        assert kb.trigger_group(e.namespace, name) in group["message"]

    def joined() -> bool:
        return (running.dispatcher.readiness()[0]
                and len(running.dispatcher.status_document()["subscriptions"]) == len(names))

    wait_for(joined, 60, "every Trigger's consumer group joined")

    def send(event_id: str, event_type: str, body: bytes = b'{"n":1}', **extensions: str) -> None:
        headers = {**binary_headers(event_id), "ce-type": event_type, "content-type": "application/json",
                   **{f"ce-{k}": v for k, v in extensions.items()}}
        answer = httpx.post(receiver.url + ingress, content=body, headers=headers, timeout=20)
        assert answer.status_code == 202, answer.text

    send("o-1", "com.example.order.created", region="eu")
    send("o-2", "com.example.order.shipped", b'{"n":2}', region="us")
    send("u-1", "com.example.user.created", b"\x00\xffraw")
    send("ping-1", "com.example.ping")
    send("loop-start", "com.example.loop", **{TTL_EXTENSION: "3"})
    send("f-1", "com.example.fail")
    # One batch: all twelve reach Kafka (and the dispatcher) together, so only ordering can space them out.
    sequence = [f"seq-{i}" for i in range(12)]
    batch = [{"specversion": "1.0", "id": event_id, "source": "/itest", "type": "com.example.seq",
              "partitionkey": "one-key", "seq": str(i), "data": {"i": i}} for i, event_id in enumerate(sequence)]
    answer = httpx.post(receiver.url + ingress, content=json.dumps(batch).encode(), timeout=20,
                        headers={"content-type": "application/cloudevents-batch+json"})
    assert answer.status_code == 202, answer.text

    wait_for(lambda: {"o-1", "o-2", "u-1", "ping-1", "pong-1", "loop-start", "f-1"} <= set(http.ids("/all")), 60,
             "every event, the reply included, at the Trigger without a filter")
    wait_for(lambda: set(http.ids("/orders")) == {"o-1", "o-2"}, 30, "order events at the prefix Trigger")
    wait_for(lambda: set(http.ids("/eu")) == {"o-1"}, 30, "the CESQL Trigger's one event")
    wait_for(lambda: http.ids("/pongs") == ["pong-1"], 30, "the reply routed back through the Broker")
    wait_for(lambda: http.ids("/dls") == ["f-1"], 30, "the failing delivery dead-lettered")
    wait_for(lambda: len(http.ids("/ordered")) == len(sequence), 30, "the ordered Trigger's events")
    assert http.ids("/ordered") == sequence  # one partition key: one partition, delivered in order
    # ... one at a time: an event goes out only once the one before it was answered (a 50 ms answer for every
    # third), which unordered delivery, all in flight at once, would not wait for.
    arrivals = [r.at for r in http.at("/ordered")]
    assert all(arrivals[i + 1] - arrivals[i] >= 0.045 for i in range(0, len(sequence) - 1, 3))

    # Attributes, extensions and data byte-identical.
    o1 = next(r for r in http.at("/orders") if r.headers["ce-id"] == "o-1")
    assert (o1.headers["ce-type"], o1.headers["ce-region"], o1.body) == (
        "com.example.order.created", "eu", b'{"n":1}')
    raw = next(r for r in http.at("/all") if r.headers["ce-id"] == "u-1")
    assert raw.body == b"\x00\xffraw"
    pong = http.at("/pongs")[0]
    assert pong.headers[f"ce-{TTL_EXTENSION}"] == "254" and pong.body == b"pong"

    # The loop ends when its hops run out: 3 → 2 → 1 → 0; the event at 0 is dropped and counted.
    labels = {"namespace": e.namespace, "channel": BROKER, "subscriber": "loop"}
    wait_for(lambda: running.metric("eventing_kafka_dropped_total", **labels, reason="ttl_expired") == 1, 60,
             "the looping event dropped at TTL 0")
    assert sorted(http.ids("/loop")) == ["loop-2", "loop-3", "loop-start"]

    # Dead letter carries the error extensions; it was retried once first.
    dead = http.at("/dls")[0]
    assert dead.headers["ce-knativeerrorcode"] == "500" and dead.headers["ce-knativeerrordest"] == http.url("/failing")
    assert len(http.at("/failing")) == 2

    # Never to a non-matching Trigger, whose consumer group still commits past every event.
    assert http.ids("/none") == []
    assert running.metric("eventing_kafka_filtered_out_total", namespace=e.namespace, channel=BROKER,
                          subscriber="none") >= 7
    topic = kb.broker_topic(e.namespace, BROKER)
    end = e.admin.list_topics(topic, timeout=10).topics[topic].partitions
    probe = Consumer({**e.kafka.client_config(), "group.id": "probe", "enable.auto.commit": False})
    try:
        high = sum(probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in end)
    finally:
        probe.close()
    wait_for(lambda: sum(max(0, o) for o in committed(e.kafka, topic, kb.trigger_group(e.namespace, "none"),
                                                       len(end))) == high, 30,
             "the non-matching Trigger's group committed to the end of the topic")
    # Each event at least once at every matching Trigger; exactly these events, no other.
    assert set(http.ids("/all")) == {"o-1", "o-2", "u-1", "ping-1", "pong-1", "loop-start", "loop-3", "loop-2",
                                     "f-1", *sequence}


def test_trigger_consumes_only_once_ready_from_the_latest_offset_and_keeps_its_group_across_restarts(
        brokers: Brokers, http: Subscriber, start_receiver: Callable[..., Receiver],
        kube_control_plane: KubeControlPlane, dispatcher: Callable[[str], RunningDispatcher]) -> None:
    e = brokers.env
    start(e)
    brokers.ready_broker(BROKER)
    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
    ingress = receiver.url + f"/{e.namespace}/{BROKER}"
    running = dispatcher(ingress)

    def trigger(name: str, annotations: dict[str, str] | None = None) -> None:
        brokers.trigger(name, {"broker": BROKER, "subscriber": {"uri": http.url(f"/{name}")}}, annotations)

    def send(event_id: str) -> None:
        answer = httpx.post(ingress, content=b"{}", timeout=20, headers={
            **binary_headers(event_id), "ce-type": "com.example.any", "content-type": "application/json"})
        assert answer.status_code == 202, answer.text

    # "held" waits for a Broker that does not exist yet (knative.dev/dependency): not ready, so not consumed.
    dependency = json.dumps({"apiVersion": f"{kb.GROUP}/{kb.VERSION}", "kind": "Broker", "name": "dep"})
    trigger("all")
    trigger("held", {kb.ANNOTATION_DEPENDENCY: dependency})
    brokers.wait(kb.TRIGGERS, "all", "Ready", "True", timeout=60)
    brokers.wait(kb.TRIGGERS, "held", "DependencyReady", "False", "DependencyDoesNotExist")
    held = brokers.wait(kb.TRIGGERS, "held", kb.CONSUMER_GROUP_READY, "False", "TriggerNotReady")
    assert held["message"].startswith("DependencyReady is False")
    assert brokers.wait(kb.TRIGGERS, "held", "Ready", "False")["reason"] == "DependencyDoesNotExist"
    send("e1")
    wait_for(lambda: http.ids("/all") == ["e1"], 30, "e1 at the ready Trigger")

    # A Trigger added now starts at the latest offset: e1 is not for it.
    trigger("late")
    brokers.wait(kb.TRIGGERS, "late", "Ready", "True", timeout=60)
    assert "held" not in running.dispatcher.status_document()["subscriptions"]  # never joined: no group
    assert http.ids("/held") == []

    brokers.ready_broker("dep")  # the dependency appears: the held Trigger is consumed for from then on
    brokers.wait(kb.TRIGGERS, "held", "Ready", "True", timeout=60)
    send("e2")
    wait_for(lambda: http.ids("/all") == ["e1", "e2"] and http.ids("/late") == ["e2"]
             and http.ids("/held") == ["e2"], 30, "e2 at every Trigger, e1 at none that was not ready")

    # A dispatcher restart: each Trigger's group resumes from its commits, so what was delivered is not again
    # and what arrived while it was down is.
    running.stop()
    send("e3")
    restarted = dispatcher(ingress)
    wait_for(lambda: restarted.dispatcher.readiness()[0]
             and len(restarted.dispatcher.status_document()["subscriptions"]) == 3, 60, "groups joined again")
    send("e4")
    want = {"/all": ["e1", "e2", "e3", "e4"], "/late": ["e2", "e3", "e4"], "/held": ["e2", "e3", "e4"]}
    wait_for(lambda: all(set(http.ids(path)) == set(ids) for path, ids in want.items()), 30,
             "e3 (sent while it was down) and e4 at every Trigger")
    time.sleep(1)  # a redelivery would follow right behind
    assert {path: sorted(http.ids(path)) for path in want} == want  # each once: nothing committed came again


def test_the_shared_receiver_and_a_namespaced_one_each_serve_only_their_own_brokers(
        brokers: Brokers, start_receiver: Callable[..., Receiver], kube_control_plane: KubeControlPlane) -> None:
    """A Kafka-class Broker on the shared receiver, a KafkaNamespaced one on its namespace's receiver
    (``KE_RECEIVER_NAMESPACE``, as the controller runs it there): each accepts its own Broker's events into that
    Broker's topic and answers 404 for the other's, so neither data plane carries the other's traffic."""
    e = brokers.env
    start(e, namespaced_receiver_role="kafka-eventing-receiver", namespaced_dispatcher_role="kafka-eventing-dispatcher")
    brokers.ready_broker("shared")
    brokers.create(kb.BROKERS, "own", {}, {kb.ANNOTATION_BROKER_CLASS: kb.NAMESPACED_BROKER_CLASS})
    brokers.wait(kb.BROKERS, "own", "TopicReady", "True")
    kube = {"KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)}
    shared = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env=kube)
    scoped = start_receiver("", bootstrap=e.kafka.bootstrap_servers,
                            env={**kube, "KE_RECEIVER_NAMESPACE": e.namespace})

    def send(receiver: Receiver, broker: str, event_id: str) -> int:
        return receiver.post(f"/{e.namespace}/{broker}", b'{"n":1}', binary_headers(event_id)).status_code

    assert send(shared, "shared", "to-shared") == 202
    assert send(scoped, "own", "to-own") == 202
    assert send(shared, "own", "own-via-shared") == 404
    assert send(scoped, "shared", "shared-via-scoped") == 404
    for broker, event_id in (("shared", "to-shared"), ("own", "to-own")):
        records = read_all(e.kafka, kb.broker_topic(e.namespace, broker))
        assert [dict(r.headers())["ce_id"] for r in records] == [event_id.encode()]
