"""Inside a Knative Eventing install: Knative's own controller (built from its Go module, `make setup`) drives
KafkaChannels through the duck-typed contract, with the chart's aggregated ClusterRoles as its only access to them;
Kafka Brokers and Triggers on Knative's CRDs, and a KafkaSource whose sink is such a Broker.

Real parts: kube-apiserver + controller-manager, Knative's released CRDs, roles and ConfigMaps, Knative's
eventing controller (as its ServiceAccount), this project's controller (in process), receiver (gunicorn, channels
from the API server) and dispatcher (in process, status.subscribers through the status subresource), and Kafka.
What Knative's webhook would default is written out (tests/fixtures/knative.py says why it does not run).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry
from support.brokers import Brokers
from support.controller import RECEIVER, Env, eventually
from support.dispatcher import Received, Subscriber
from support.receiver import Receiver, binary_headers

from fixtures.knative import KnativeEventing
from fixtures.kube import account_client, gone
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.crd import SOURCE_CRD, install_crd
from kafka_eventing.controller.kafkasources import source_dispatcher_name
from kafka_eventing.core import brokers as kb
from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core.channel_source import KubeChannelSource
from kafka_eventing.core.delivery import ANNOTATION_RATE_LIMIT
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.kube import api_client
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import DISPATCHER_SERVICE_ACCOUNT, TOKEN_ROLE, TokenSource, kube_requester
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.dispatcher.sources import KubeSourceSource
from kafka_eventing.dispatcher.status import KubeStatusWriter, KubeTriggerStatusWriter
from kafka_eventing.dispatcher.triggers import KubeTriggerSource
from kafka_eventing.localstack.kube import KubeControlPlane
from waiting import NotYet, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.kafka, pytest.mark.knative]

MESSAGING = "messaging.knative.dev"
MERGE = "application/merge-patch+json"
KAFKA_EXTRA = "session.timeout.ms=6000,heartbeat.interval.ms=500"
PONG = {"ce-specversion": "1.0", "ce-id": "pong-1", "ce-source": "/replier", "ce-type": "com.example.pong"}


@pytest.fixture(scope="module")
def api(kube_control_plane: KubeControlPlane, knative_eventing: KnativeEventing) -> Iterator[client.ApiClient]:
    """Admin client; the KafkaChannel and KafkaSource CRDs are this project's (Knative's eventing core has neither),
    Broker and Trigger are Knative's."""
    c = api_client(kube_control_plane.kubeconfig)
    install_crd(c)
    install_crd(c, file=SOURCE_CRD)
    yield c
    c.close()


@pytest.fixture
def knative(env: Env, knative_eventing: KnativeEventing) -> Iterator[Knative]:
    k = Knative(env, knative_eventing)
    try:
        yield k
    finally:
        for dispatcher in k.dispatchers:
            dispatcher.stop()
        for ctl in env.controllers:
            ctl.stop()
        env.controllers.clear()
        # Without the controllers nobody removes finalizers (Knative's on Subscriptions, ours on channels and
        # Brokers): strip them so that the namespace can go.
        for group, version, plural in ((MESSAGING, "v1", "subscriptions"), (kb.GROUP, kb.VERSION, kb.BROKERS),
                                       (kb.GROUP, kb.VERSION, kb.TRIGGERS), (ks.GROUP, ks.VERSION, ks.PLURAL)):
            for item in env.custom.list_namespaced_custom_object(group, version, env.namespace, plural)["items"]:
                with contextlib.suppress(ApiException):
                    env.custom.patch_namespaced_custom_object(group, version, env.namespace, plural,
                                                              item["metadata"]["name"],
                                                              {"metadata": {"finalizers": []}}, _content_type=MERGE)


@pytest.fixture
def http() -> Iterator[Subscriber]:
    with Subscriber().running() as sub:
        yield sub


class RunningDispatcher:
    """The dispatcher of one KafkaChannel (or, with ``broker``, of that Broker), in process, as its Deployment
    would run it."""

    def __init__(self, e: Env, name: str, broker: bool = False, reply_uri: str = "",
                 tokens: TokenSource | None = None) -> None:
        source: KubeChannelSource | KubeTriggerSource
        writer: KubeStatusWriter | KubeTriggerStatusWriter
        if broker:
            settings = Settings(bootstrap_servers=e.kafka.bootstrap_servers, broker_namespace=e.namespace,
                                broker_name=name, kafka_extra=KAFKA_EXTRA, log_level="WARNING")
            source, writer = KubeTriggerSource(e.api, e.namespace, name, reply_uri=reply_uri), \
                KubeTriggerStatusWriter(e.api)
        else:
            settings = Settings(bootstrap_servers=e.kafka.bootstrap_servers, channel_source="kube",
                                channel_namespace=e.namespace, channel_name=name, kafka_extra=KAFKA_EXTRA,
                                log_level="WARNING")
            source, writer = KubeChannelSource(e.api, settings, namespace=e.namespace, name=name), \
                KubeStatusWriter(e.api)
        self.dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                            status_writer=writer, registry=CollectorRegistry(),
                                            host="127.0.0.1", port=0, tokens=tokens)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.dispatcher.run()), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.dispatcher.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


class Knative:
    """Knative objects in the test namespace, and the parts of this project that serve them."""

    def __init__(self, e: Env, eventing: KnativeEventing) -> None:
        self.env, self.eventing, self.ns = e, eventing, e.namespace
        self.dispatchers: list[RunningDispatcher] = []

    def create(self, plural: str, kind: str, name: str, spec: dict[str, Any], version: str = "v1") -> dict[str, Any]:
        body = {"apiVersion": f"{MESSAGING}/{version}", "kind": kind,
                "metadata": {"name": name, "namespace": self.ns}, "spec": spec}
        return dict(self.env.custom.create_namespaced_custom_object(MESSAGING, version, self.ns, plural, body))

    def get(self, plural: str, name: str, version: str = "v1") -> dict[str, Any]:
        return dict(self.env.custom.get_namespaced_custom_object(MESSAGING, version, self.ns, plural, name))

    def condition(self, plural: str, name: str, kind: str = "Ready") -> dict[str, Any] | None:
        """The condition as the object has it now; None until Knative has written it (its first reconcile may not
        have finished yet)."""
        status = self.get(plural, name).get("status") or {}
        return next((dict(c) for c in status.get("conditions") or () if c["type"] == kind), None)

    def is_ready(self, plural: str, name: str) -> bool:
        return (self.condition(plural, name) or {}).get("status") == "True"

    def wait_ready(self, plural: str, name: str, timeout: float = 60) -> dict[str, Any]:
        def ready() -> dict[str, Any]:
            obj = self.get(plural, name)
            found = [c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == "Ready"]
            if not found or found[0]["status"] != "True":
                raise NotYet(f"Ready: {found[0] if found else 'not written yet'}")
            return obj

        return eventually(ready, timeout, f"{plural} {name} Ready")

    def gone(self, plural: str, name: str) -> bool:
        return gone(lambda: self.get(plural, name))

    def subscription(self, name: str, channel: dict[str, str], **spec: Any) -> dict[str, Any]:
        return self.create("subscriptions", "Subscription", name, {"channel": channel, **spec})

    def ready_channel(self, name: str) -> None:
        """What the kubelet would do for a KafkaChannel our controller reconciles: its dispatcher and the receiver
        available; then it is Ready."""
        dispatcher = res.dispatcher_name(self.ns, name)
        eventually(lambda: self.env.apps.read_namespaced_deployment(dispatcher, self.env.system),
                   what=f"dispatcher Deployment of {name}")
        self.env.make_available(dispatcher)
        self.env.make_available(RECEIVER)
        self.env.wait_condition(name, "Ready", "True")

    def serve(self, name: str, **options: Any) -> RunningDispatcher:
        d = RunningDispatcher(self.env, name, **options)
        self.dispatchers.append(d)
        return d

    def manager_of(self, obj: dict[str, Any], field: str) -> set[str]:
        """The field managers of ``obj`` whose fields include ``field`` (e.g. ``f:subscribers``)."""
        return {m["manager"] for m in obj["metadata"].get("managedFields") or () if field in str(m.get("fieldsV1"))}


def reply_with(headers: dict[str, str]) -> Callable[[Received, int], tuple[int, dict[str, str], bytes, float]]:
    return lambda _r, _a: (200, headers, b"pong", 0.0)


def send(receiver: Receiver, ns: str, channel: str, event_id: str, event_type: str) -> None:
    headers = {**binary_headers(event_id), "ce-type": event_type,
               "Host": f"{channel}-kn-channel.{ns}.svc.cluster.local"}
    answer = httpx.post(receiver.url + "/", content=b'{"n":1}', headers=headers, timeout=20)
    assert answer.status_code == 202, answer.text


# -- tests ------------------------------------------------------------------------------------------------------
def test_subscription_is_written_by_knative_and_delivered(knative: Knative, http: Subscriber,
                                                          start_receiver: Callable[..., Receiver],
                                                          kube_control_plane: KubeControlPlane) -> None:
    e = knative.env
    e.start_controller()
    e.create("orders", {"numPartitions": 2})
    knative.ready_channel("orders")
    http.behaviours.update({"/replier": lambda r, _a: (
        (500, {}, b"broken", 0.0) if r.headers.get("ce-type") == "com.example.fail" else (200, PONG, b"pong", 0.0))})
    ref = {"apiVersion": f"{MESSAGING}/v1beta1", "kind": "KafkaChannel", "name": "orders"}
    sub = knative.subscription("orders-sub", ref, subscriber={"uri": http.url("/replier")},
                               reply={"uri": http.url("/replies")},
                               delivery={"retry": 1, "backoffDelay": "PT0.05S", "retryAfterMax": "PT1S",
                                         "deadLetterSink": {"uri": http.url("/dls")}})
    uid = sub["metadata"]["uid"]

    # Knative's Subscription controller writes the subscriber into the KafkaChannel (through the chart's
    # channelable-manipulator ClusterRole), every field of it kept by the CRD's schema.
    def written() -> dict[str, Any] | None:
        subscribers = e.get("orders")["spec"].get("subscribers") or []
        return next((s for s in subscribers if s["uid"] == uid), None)

    entry = eventually(written, 60, "the Subscription in spec.subscribers")
    assert entry["name"] == "orders-sub" and entry["generation"] == sub["metadata"]["generation"]
    assert entry["subscriberUri"] == http.url("/replier") and entry["replyUri"] == http.url("/replies")
    assert entry["delivery"] == {"retry": 1, "backoffDelay": "PT0.05S", "retryAfterMax": "PT1S",
                                 "deadLetterSink": {"uri": http.url("/dls")}}
    # Until a dispatcher reports the subscriber, Knative does not call the Subscription Ready.
    assert not knative.is_ready("subscriptions", "orders-sub")

    knative.serve("orders")
    subscription = knative.wait_ready("subscriptions", "orders-sub")
    assert subscription["status"]["physicalSubscription"]["subscriberUri"] == http.url("/replier")
    status = {s["uid"]: s for s in e.get("orders")["status"]["subscribers"]}
    assert status[uid] == {"uid": uid, "observedGeneration": sub["metadata"]["generation"], "ready": "True"}
    # Knative wrote spec.subscribers, and only once although it reconciled the Subscription again on every status
    # change: the schema keeps all it writes, so its next merge patch is empty (no patch loop).
    assert knative.eventing.field_manager() in knative.manager_of(e.get("orders"), "f:subscribers")
    synced = e.core.list_namespaced_event(e.namespace, field_selector="involvedObject.name=orders-sub").items
    assert sum(ev.count or 1 for ev in synced if ev.reason == "SubscriberSync") == 1

    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
    send(receiver, e.namespace, "orders", "ping-1", "com.example.ping")
    send(receiver, e.namespace, "orders", "fail-1", "com.example.fail")
    wait_for(lambda: "ping-1" in http.ids("/replier"), 60, "the event at the subscriber")
    wait_for(lambda: http.ids("/replies") == ["pong-1"], 30, "the subscriber's reply at the reply URI")
    wait_for(lambda: http.ids("/dls") == ["fail-1"], 30, "the failing event dead-lettered after one retry")
    assert http.ids("/replier").count("fail-1") == 2

    # A changed Subscription: Knative writes its new generation, the dispatcher reports that generation, and only
    # then is the Subscription Ready again.
    e.custom.patch_namespaced_custom_object(MESSAGING, "v1", e.namespace, "subscriptions", "orders-sub",
                                            {"spec": {"delivery": {"retry": 2}}}, _content_type=MERGE)
    eventually(lambda: written()["generation"] == 2 and written()["delivery"]["retry"] == 2, 60,
               "generation 2 in spec.subscribers")
    eventually(lambda: {s["uid"]: s for s in e.get("orders")["status"]["subscribers"]}[uid][
        "observedGeneration"] == 2, 30, "generation 2 reported by the dispatcher")
    eventually(lambda: knative.get("subscriptions", "orders-sub")["status"]["observedGeneration"] == 2
               and knative.is_ready("subscriptions", "orders-sub"), 60,
               "the changed Subscription Ready")

    # Deleting the Subscription: Knative removes the subscriber (its finalizer), the dispatcher stops its
    # consumer group and drops its status entry, and the Subscription goes.
    e.custom.delete_namespaced_custom_object(MESSAGING, "v1", e.namespace, "subscriptions", "orders-sub")
    eventually(lambda: not e.get("orders")["spec"].get("subscribers"), 60, "subscriber removed by Knative")
    eventually(lambda: not (e.get("orders").get("status") or {}).get("subscribers"), 30, "status entry removed")
    eventually(lambda: knative.gone("subscriptions", "orders-sub"), 30, "Subscription deleted")
    eventually(lambda: not knative.dispatchers[0].dispatcher.status_document()["subscriptions"], 30,
               "the dispatcher's consumer for the Subscription stopped")


def test_with_oidc_on_a_subscription_sends_as_the_account_knative_made_for_it(
        knative: Knative, http: Subscriber, start_receiver: Callable[..., Receiver],
        kube_control_plane: KubeControlPlane, tmp_path: Path) -> None:
    """Knative's ``authentication-oidc`` on: its Subscription controller makes the Subscription's ServiceAccount and
    names it in the channel's ``spec.subscribers[].auth``; our controller lets the dispatchers request that account's
    tokens, and the dispatcher (as its ServiceAccount, under real RBAC) sends one to the subscriber that declares an
    audience — the Subscription's identity, not the dispatcher's."""
    e = knative.env
    features = client.CoreV1Api(e.api)
    ns = knative.eventing.namespace
    before = features.read_namespaced_config_map("config-features", ns).data or {}
    features.patch_namespaced_config_map("config-features", ns, {"data": {"authentication-oidc": "enabled"}})
    try:
        e.start_controller(e.settings(auth_issuer=kube_control_plane.server))
        e.create("orders", {"numPartitions": 1})
        knative.ready_channel("orders")
        audience = "https://subscriber.example/ingest"
        ref = {"apiVersion": f"{MESSAGING}/v1beta1", "kind": "KafkaChannel", "name": "orders"}
        knative.subscription("orders-sub", ref, subscriber={"uri": http.url("/sub"), "audience": audience})
        account = "orders-sub-oidc-messaging.knative.dev-subscription"  # Knative's name for it

        def named() -> dict[str, Any] | None:
            subscribers = e.get("orders")["spec"].get("subscribers") or []
            return next((s for s in subscribers if (s.get("auth") or {}).get("serviceAccountName")), None)

        entry = eventually(named, 60, "the Subscription's account in spec.subscribers")
        assert entry["auth"]["serviceAccountName"] == account and entry["subscriberAudience"] == audience
        rbac = client.RbacAuthorizationV1Api(e.api)
        eventually(lambda: account in rbac.read_namespaced_role(TOKEN_ROLE, e.namespace).rules[0].resource_names,
                   60, "the account in the token Role")

        dispatcher_client = account_client(kube_control_plane, e.system, DISPATCHER_SERVICE_ACCOUNT,
                                           tmp_path / "dispatcher.kubeconfig")
        knative.serve("orders", tokens=TokenSource(kube_requester(dispatcher_client)))
        knative.wait_ready("subscriptions", "orders-sub")
        receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
            "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
        send(receiver, e.namespace, "orders", "ping-1", "com.example.ping")
        wait_for(lambda: http.ids("/sub") == ["ping-1"], 60, "the event at the subscriber")
        authorization = next(v for k, v in http.at("/sub")[0].headers.items() if k.lower() == "authorization")
        payload = authorization.removeprefix("Bearer ").split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        assert (claims["sub"], claims["aud"]) == (f"system:serviceaccount:{e.namespace}:{account}", [audience])
    finally:
        features.patch_namespaced_config_map("config-features", ns, {"data": {
            "authentication-oidc": before.get("authentication-oidc", "disabled")}})


def test_channel_with_a_kafkachannel_template(knative: Knative, http: Subscriber) -> None:
    e = knative.env
    e.start_controller()
    knative.create("channels", "Channel", "events", {"channelTemplate": {
        "apiVersion": f"{MESSAGING}/v1beta1", "kind": "KafkaChannel", "spec": {"numPartitions": 3}}})
    # Knative's Channel reconciler creates the KafkaChannel (owned by the Channel) from the template.
    backing = eventually(lambda: e.get("events"), 60, "the KafkaChannel created by Knative")
    assert backing["spec"]["numPartitions"] == 3
    (owner,) = backing["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Channel", "events", True)
    eventually(lambda: e.topic(f"{e.namespace}.events") is not None and e.topic(f"{e.namespace}.events")[0] == 3,
               what="its topic, 3 partitions")
    knative.ready_channel("events")

    # Knative propagates the KafkaChannel's status: Ready, addressable at the KafkaChannel's address.
    channel = knative.wait_ready("channels", "events")
    address = f"http://events-kn-channel.{e.namespace}.svc.cluster.local"
    assert channel["status"]["address"]["url"] == address == e.get("events")["status"]["address"]["url"]
    assert channel["status"]["channel"] == {"apiVersion": f"{MESSAGING}/v1beta1", "kind": "KafkaChannel",
                                            "name": "events", "namespace": e.namespace}
    conditions = {c["type"]: c["status"] for c in channel["status"]["conditions"]}
    assert conditions["BackingChannelReady"] == conditions["Addressable"] == "True"

    # A Subscription to the generic Channel lands in the KafkaChannel, and is Ready once dispatched.
    ref = {"apiVersion": f"{MESSAGING}/v1", "kind": "Channel", "name": "events"}
    sub = knative.subscription("events-sub", ref, subscriber={"uri": http.url("/events")})
    eventually(lambda: [s["uid"] for s in e.get("events")["spec"].get("subscribers") or []] == [
        sub["metadata"]["uid"]], 60, "the Subscription in the KafkaChannel's spec.subscribers")
    served = knative.serve("events")
    knative.wait_ready("subscriptions", "events-sub")
    assert [s["uid"] for s in knative.get("channels", "events")["status"]["subscribers"]] == [sub["metadata"]["uid"]]

    # Deleting the Channel: the garbage collector deletes its KafkaChannel, whose finalizer stops the dispatcher
    # and then deletes the subscribers' consumer groups and the topic. The dispatcher here is a process, not the
    # Deployment's pods: it stops as they would.
    e.custom.delete_namespaced_custom_object(MESSAGING, "v1", e.namespace, "channels", "events")
    eventually(lambda: gone(lambda: e.apps.read_namespaced_deployment(res.dispatcher_name(e.namespace, "events"),
                                                                      e.system)), 60, "the dispatcher Deployment gone")
    served.stop()
    knative.dispatchers.remove(served)
    eventually(lambda: e.gone("events"), 60, "the KafkaChannel deleted with its Channel")
    assert e.topic(f"{e.namespace}.events") is None


def test_kafka_broker_and_trigger_on_knatives_crds(knative: Knative, http: Subscriber,
                                                   start_receiver: Callable[..., Receiver],
                                                   kube_control_plane: KubeControlPlane) -> None:
    e = knative.env
    brokers = Brokers(e)
    e.start_controller(brokers=True)
    # A Broker of another class, as Knative's MT channel broker would own: neither controller here touches it.
    brokers.create(kb.BROKERS, "mt", {}, {kb.ANNOTATION_BROKER_CLASS: "MTChannelBasedBroker"})
    brokers.ready_broker("default")
    brokers.trigger("all", {"broker": "default", "subscriber": {"uri": http.url("/all")}})
    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
    ingress = f"{receiver.url}/{e.namespace}/default"
    # Ready once the Broker's dispatcher reports the Trigger's consumer group joined; then events flow.
    knative.serve("default", broker=True, reply_uri=ingress)
    brokers.wait(kb.TRIGGERS, "all", "Ready", "True", timeout=60)
    got = brokers.get(kb.TRIGGERS, "all")
    assert got["status"]["subscriberUri"] == http.url("/all")
    answer = httpx.post(ingress, content=b"{}", headers=binary_headers("b-1"), timeout=20)
    assert answer.status_code == 202, answer.text
    wait_for(lambda: http.ids("/all") == ["b-1"], 60, "the event through the Kafka Broker at the Trigger")

    # Knative's controller runs beside ours and leaves Brokers and Triggers alone: no field of them is its own.
    theirs = knative.eventing.field_manager()
    for obj in (brokers.get(kb.BROKERS, "default"), got, brokers.get(kb.BROKERS, "mt")):
        managers = {m["manager"] for m in obj["metadata"].get("managedFields") or ()}
        assert managers and theirs not in managers, (obj["metadata"]["name"], managers)
    assert "status" not in brokers.get(kb.BROKERS, "mt")


class ClusterDnsSource(KubeSourceSource):
    """A KafkaSource as its dispatcher pod sees it, with the pod's cluster DNS played here: the sink URI the
    controller resolved (a Service's cluster name) is sent to ``address`` on loopback; the path stays."""

    def __init__(self, *args: Any, service_url: str, address: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service_url, self.address = service_url, address

    def _publish(self, channels: Any) -> None:
        def local(uri: str) -> str:
            return self.address + uri.removeprefix(self.service_url) if uri.startswith(self.service_url) else uri

        super()._publish({key: dataclasses.replace(channel, subscribers=tuple(
            dataclasses.replace(s, subscriber_uri=local(s.subscriber_uri)) for s in channel.subscribers))
            for key, channel in channels.items()})


def test_kafka_source_into_a_kafka_broker_on_knatives_crds(knative: Knative, http: Subscriber,
                                                          start_receiver: Callable[..., Receiver],
                                                          kube_control_plane: KubeControlPlane) -> None:
    e = knative.env
    brokers = Brokers(e)
    e.start_controller(brokers=True, sources=True)
    brokers.ready_broker("default")
    brokers.trigger("from-source", {"broker": "default", "subscriber": {"uri": http.url("/src")}})
    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
    knative.serve("default", broker=True, reply_uri=f"{receiver.url}/{e.namespace}/default")
    brokers.wait(kb.TRIGGERS, "from-source", "Ready", "True", timeout=60)

    # Records written before the source exists (initialOffset earliest): a plain one and a binary CloudEvent.
    topic = f"kn.src.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(e.kafka.client_config())
    for fut in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        fut.result(timeout=30)
    producer = Producer(e.kafka.client_config())
    producer.produce(topic, key=b"order-7", value=b'{"plain":true}',
                     headers=[("content-type", b"application/json"), ("X-Trace_ID", b"t-1")])
    producer.produce(topic, value=b"ce-body", headers=[
        ("ce_specversion", b"1.0"), ("ce_id", b"ce-1"), ("ce_source", b"/orders"), ("ce_type", b"com.example.ce"),
        ("ce_team", b"pay"), ("content-type", b"text/plain")])
    assert producer.flush(30) == 0

    body = {"apiVersion": f"{ks.GROUP}/{ks.VERSION}", "kind": ks.KIND,
            "metadata": {"name": "orders", "namespace": e.namespace},
            "spec": {"bootstrapServers": [e.kafka.bootstrap_servers], "topics": [topic], "initialOffset": "earliest",
                     "sink": {"ref": {"apiVersion": f"{kb.GROUP}/{kb.VERSION}", "kind": "Broker",
                                      "name": "default"}}}}
    e.custom.create_namespaced_custom_object(ks.GROUP, ks.VERSION, e.namespace, ks.PLURAL, body)
    address = brokers.get(kb.BROKERS, "default")["status"]["address"]["url"]

    def source() -> dict[str, Any]:
        return dict(e.custom.get_namespaced_custom_object(ks.GROUP, ks.VERSION, e.namespace, ks.PLURAL, "orders"))

    # The sink ref to Knative's Broker kind resolves to the Kafka Broker's address, as a Trigger's subscriber would.
    eventually(lambda: source().get("status", {}).get("sinkUri") == address, 60, f"sinkUri {address}")
    e.make_available(source_dispatcher_name(e.namespace, "orders"))
    eventually(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                           for c in source().get("status", {}).get("conditions") or ()), 60, "source Ready")

    # Its dispatcher, as the pod runs it: records → the Broker's ingress → the Broker's topic → the Trigger.
    service_url = address.removesuffix(f"/{e.namespace}/default")
    settings = Settings(source_namespace=e.namespace, source_name="orders", bootstrap_servers=e.kafka.bootstrap_servers,
                        kafka_extra=KAFKA_EXTRA, log_level="WARNING")
    dispatcher = create_dispatcher(settings, connection_from_settings(settings), ClusterDnsSource(
        e.api, e.namespace, "orders", watch_timeout_seconds=30, service_url=service_url, address=receiver.url),
        registry=CollectorRegistry(), host="127.0.0.1", port=0)
    thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(http.at("/src")) >= 2, 60, "both records through the Broker at the Trigger")
        got = {r.headers["ce-id"]: r for r in http.at("/src")}
        assert set(got) == {"partition:0/offset:0", "ce-1"}, list(got)
        plain = got["partition:0/offset:0"]
        assert plain.body == b'{"plain":true}'
        assert plain.headers["ce-type"] == ks.EVENT_TYPE
        assert plain.headers["ce-source"] == f"/apis/v1/namespaces/{e.namespace}/kafkasources/orders#{topic}"
        assert plain.headers["ce-subject"] == "partition:0#0"
        assert (plain.headers["ce-key"], plain.headers["ce-partitionkey"]) == ("order-7", "order-7")
        assert plain.headers["ce-kafkaheaderxtraceid"] == "t-1"
        assert plain.headers["Content-Type"] == "application/json"
        event = got["ce-1"]  # a CloudEvent record passes through unchanged
        assert (event.body, event.headers["ce-type"], event.headers["ce-source"], event.headers["ce-team"],
                event.headers["Content-Type"]) == (b"ce-body", "com.example.ce", "/orders", "pay", "text/plain")
    finally:
        dispatcher.stop()
        thread.join(30)


# -- rate limits: an annotation, since Knative's Subscription has no field for one and a Trigger none at all -------
RATE, BURST, EVENTS = 2.0, 2, 12  # a burst of one second's worth, then one event every 1/RATE s


def _paced(http: Subscriber, path: str, post: Callable[[str], None], prefix: str) -> None:
    """Send EVENTS at once (in parallel), wait for all at ``path``, and check they arrived no faster than RATE."""
    ids = [f"{prefix}-{i}" for i in range(EVENTS)]
    started = time.monotonic()  # before any of the events exists
    with ThreadPoolExecutor(EVENTS) as pool:
        list(pool.map(post, ids))
    sent_in = time.monotonic() - started
    wait_for(lambda: sorted(http.ids(path)) == sorted(ids), 60, f"{EVENTS} events at {path}")
    arrivals = sorted(r.at - started for r in http.at(path))
    least = (EVENTS - BURST) / RATE  # 5 s
    # Sent faster than the limit allows, so any pacing seen is the dispatcher's.
    assert sent_in < least, f"sending took {sent_in:.2f} s: too slow to show a limit of {RATE}/s"
    # The bucket holds BURST tokens and gains RATE a second, so the dispatcher starts the n-th event (from 1) no
    # sooner than (n - BURST) / RATE s after its first, which is after ``started``; each arrives later still. Measured
    # from before the first send, a slow host (a late first arrival) only lengthens the spans; without the limit
    # all would arrive about when the sending ends, well before the last one's 5 s.
    early = [(n, round(at, 3)) for n, at in enumerate(arrivals, 1) if at < (n - BURST) / RATE]
    assert not early, f"arrivals (n, s after the first send) ahead of {RATE}/s: {early}; all: {arrivals}"


def test_rate_limits_of_subscriptions_and_triggers_on_knatives_controller(
        knative: Knative, http: Subscriber, start_receiver: Callable[..., Receiver],
        kube_control_plane: KubeControlPlane) -> None:
    e = knative.env
    e.start_controller(brokers=True)
    # A Subscription's limit: its channel's annotation (an invalid one is refused with a condition, not ignored).
    e.create("slow", {"numPartitions": 1}, annotations={ANNOTATION_RATE_LIMIT: "fast"})
    refused = e.wait_condition("slow", "ConfigParsed", "False")
    assert refused["reason"] == "InvalidChannelSpec" and ANNOTATION_RATE_LIMIT in refused["message"]
    e.custom.patch_namespaced_custom_object(
        MESSAGING, "v1beta1", e.namespace, "kafkachannels", "slow",
        {"metadata": {"annotations": {ANNOTATION_RATE_LIMIT: str(RATE)}}}, _content_type=MERGE)
    e.wait_condition("slow", "ConfigParsed", "True")
    knative.ready_channel("slow")
    ref = {"apiVersion": f"{MESSAGING}/v1beta1", "kind": "KafkaChannel", "name": "slow"}
    uid = knative.subscription("slow-sub", ref, subscriber={"uri": http.url("/sub")})["metadata"]["uid"]
    eventually(lambda: uid in [s["uid"] for s in e.get("slow")["spec"].get("subscribers") or []], 60,
               "the Subscription in spec.subscribers, written by Knative")
    knative.serve("slow")
    knative.wait_ready("subscriptions", "slow-sub")
    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
    _paced(http, "/sub", lambda i: send(receiver, e.namespace, "slow", i, "com.example.paced"), "s")

    # A Trigger's limit: its own annotation; the Broker's other Trigger is not limited by it.
    brokers = Brokers(e)
    brokers.ready_broker("default")
    brokers.trigger("paced", {"broker": "default", "subscriber": {"uri": http.url("/trigger")}},
                    {ANNOTATION_RATE_LIMIT: str(RATE)})
    brokers.trigger("free", {"broker": "default", "subscriber": {"uri": http.url("/free")}})
    ingress = f"{receiver.url}/{e.namespace}/default"
    knative.serve("default", broker=True, reply_uri=ingress)
    for name in ("paced", "free"):
        brokers.wait(kb.TRIGGERS, name, "Ready", "True", timeout=60)

    def post(event_id: str) -> None:
        answer = httpx.post(ingress, content=b"{}", headers=binary_headers(event_id), timeout=20)
        assert answer.status_code == 202, answer.text

    _paced(http, "/trigger", post, "t")
    free = sorted(r.at for r in http.at("/free"))
    assert len(free) == EVENTS and free[-1] - free[0] < (EVENTS - BURST) / RATE  # the same events, unpaced
