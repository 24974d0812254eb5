"""ResetOffset on real Kafka and the real apiserver, with live traffic: the controller's reconciler resolves and
validates, the channel's dispatcher (in-process, or a real process that is SIGKILLed mid-reset) carries it out.

Knative's Subscription type is not installed by the kube tier: a minimal CRD of it stands in (the reconciler reads
only ``spec.channel`` and ``metadata.uid`` of a Subscription).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry
from support.dispatcher import Subscriber, committed, produce

from fixtures.kube import delete_crds
from kafka_eventing.controller.crd import install_crd
from kafka_eventing.controller.resetoffsets import ResetOffsetReconciler
from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.channel_source import KubeChannelSource
from kafka_eventing.core.group_offsets import GroupOffsets
from kafka_eventing.core.informer import Informer
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.offsets_cli import main as offsets_main
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.dispatcher.app import consumer_settings
from kafka_eventing.dispatcher.resets import KubeResetApi, Resets
from kafka_eventing.dispatcher.status import KubeStatusWriter
from kafka_eventing.dispatcher.subscription import MAX_IDLE_POLL
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import NotYet, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.kube]

CH_GROUP, CH_VERSION, CH_PLURAL = "messaging.knative.dev", "v1beta1", "kafkachannels"
KAFKA_EXTRA = "session.timeout.ms=6000,heartbeat.interval.ms=500"
SUBSCRIPTION_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "subscriptions.messaging.knative.dev"},
    "spec": {"group": "messaging.knative.dev", "scope": "Namespaced",
             "names": {"kind": "Subscription", "plural": "subscriptions", "singular": "subscription",
                       "listKind": "SubscriptionList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def _install_subscription_crd(api_client: Any) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.ApiextensionsV1Api(api_client)
    name = SUBSCRIPTION_CRD["metadata"]["name"]  # type: ignore[index]

    objects = client.CustomObjectsApi(api_client)
    # Knative's own CRDs (tests/fixtures/knative.py) are deleted when their tests end; one still terminating
    # refuses new objects, so it is seen gone before the stand-in is installed.
    with contextlib.suppress(ApiException):
        if api.read_custom_resource_definition(name).metadata.deletion_timestamp is not None:
            delete_crds(api_client, [name])
    try:
        api.create_custom_resource_definition(SUBSCRIPTION_CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise
    wait_for(lambda: _served(objects), 30, "Subscription CRD served")


def _served(objects: Any) -> bool:
    try:
        objects.list_namespaced_custom_object("messaging.knative.dev", "v1", "default", "subscriptions")
        return True
    except Exception:
        return False


class Env:
    """A KafkaChannel with two Subscriptions (a, b), the ResetOffset reconciler, and dispatcher replicas."""

    def __init__(self, api_client: Any, kafka: KafkaNode, namespace: str, topic: str, sub: Subscriber,
                 kubeconfig: str) -> None:
        from kubernetes import client

        self.api_client, self.kafka, self.ns, self.topic, self.http = api_client, kafka, namespace, topic, sub
        self.kubeconfig = kubeconfig
        self.objects = client.CustomObjectsApi(api_client)
        self.uids: dict[str, str] = {}
        self.replicas: list[tuple[Any, threading.Thread]] = []
        self.settings = Settings(bootstrap_servers=kafka.bootstrap_servers, channel_source="kube",
                                 channel_namespace=namespace, channel_name="kc", kafka_extra=KAFKA_EXTRA)
        self._stop = threading.Event()
        self.informer: Informer | None = None

    # -- objects ------------------------------------------------------------------------------------
    def create(self) -> Env:
        for name in ("a", "b"):
            sub = self.objects.create_namespaced_custom_object(
                "messaging.knative.dev", "v1", self.ns, "subscriptions", {
                "apiVersion": "messaging.knative.dev/v1", "kind": "Subscription", "metadata": {"name": name},
                "spec": {"channel": {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
                                     "name": "kc"}, "subscriber": {"uri": self.http.url(f"/{name}")}}})
            self.uids[name] = sub["metadata"]["uid"]
        body = {"apiVersion": f"{CH_GROUP}/{CH_VERSION}", "kind": "KafkaChannel",
                "metadata": {"name": "kc", "namespace": self.ns,
                             "annotations": {"kafka.eventing.knative.dev/external.topic": self.topic}},
                "spec": {"numPartitions": 3, "subscribers": [
                    {"uid": self.uids[n], "generation": 1, "subscriberUri": self.http.url(f"/{n}")}
                    for n in ("a", "b")]}}
        self.objects.create_namespaced_custom_object(CH_GROUP, CH_VERSION, self.ns, CH_PLURAL, body)
        self.objects.patch_namespaced_custom_object_status(CH_GROUP, CH_VERSION, self.ns, CH_PLURAL, "kc", {
            "status": {"conditions": [{"type": "TopicReady", "status": "True", "reason": "TopicReady"}]}})
        return self

    def group(self, name: str) -> str:
        return self.settings.consumer_group_for(self.ns, "kc", self.uids[name])

    def reset(self, name: str, time_: str, ref: dict[str, str] | None = None) -> None:
        ref = ref or {"apiVersion": "messaging.knative.dev/v1", "kind": "Subscription", "name": "a"}
        self.objects.create_namespaced_custom_object(ro.GROUP, ro.VERSION, self.ns, ro.PLURAL, {
            "apiVersion": f"{ro.GROUP}/{ro.VERSION}", "kind": ro.KIND, "metadata": {"name": name},
            "spec": {"offset": {"time": time_}, "ref": ref}})

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.objects.get_namespaced_custom_object(ro.GROUP, ro.VERSION, self.ns, ro.PLURAL, name)
                    .get("status") or {})

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions") or () if c["type"] == kind), {})

    def wait_done(self, name: str, timeout: float = 90) -> dict[str, Any]:
        wait_for(lambda: self.condition(name, ro.DONE).get("status") in ("True", "False"), timeout, f"{name} done")
        return self.condition(name, ro.DONE)

    # -- the controller's reconciler ------------------------------------------------------------------
    def start_controller(self) -> None:
        def on_event(_kind: str, obj: Any) -> None:
            meta = obj.get("metadata") or {}
            if meta.get("name"):
                pending.add((meta["namespace"], meta["name"]))

        pending: set[tuple[str, str]] = set()
        self.informer = Informer("resetoffsets", self.objects.list_cluster_custom_object, on_event,
                                 group=ro.GROUP, version=ro.VERSION, plural=ro.PLURAL)
        reconciler = ResetOffsetReconciler(self.api_client, self.settings, self.informer, lambda: True)
        self.informer.start()

        def loop() -> None:
            while not self._stop.wait(0.1):
                for key in list(pending):
                    pending.discard(key)
                    reconciler.reconcile(*key)

        threading.Thread(target=loop, daemon=True).start()

    # -- dispatchers --------------------------------------------------------------------------------
    def start_replica(self, identity: str = "replica-0") -> Any:
        source = KubeChannelSource(self.api_client, self.settings, namespace=self.ns, name="kc")
        connection = connection_from_settings(self.settings)
        resets = Resets(ro.KAFKA_CHANNEL_KIND, self.ns, "kc", KubeResetApi(self.api_client),
                        GroupOffsets(connection.admin_config()), identity=identity, poll_seconds=0.2)
        dispatcher = create_dispatcher(self.settings, connection, source,
                                       status_writer=KubeStatusWriter(self.api_client), registry=CollectorRegistry(),
                                       host="127.0.0.1", port=0, resets=resets)
        thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
        thread.start()
        self.replicas.append((dispatcher, thread))
        return dispatcher

    def start_process(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": self.kubeconfig,
               "KE_CHANNEL_NAMESPACE": self.ns, "KE_CHANNEL_NAME": "kc",
               "KE_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers, "KE_KAFKA_EXTRA": KAFKA_EXTRA,
               "KE_METRICS_PORT": "0"}
        return subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"], env=env)

    def joined(self) -> bool:
        obj = self.objects.get_namespaced_custom_object(CH_GROUP, CH_VERSION, self.ns, CH_PLURAL, "kc")
        return sum(1 for s in (obj.get("status") or {}).get("subscribers") or () if s.get("ready") == "True") == 2

    def stop(self) -> None:
        self._stop.set()
        for dispatcher, thread in self.replicas:
            dispatcher.stop()
            thread.join(30)
        if self.informer is not None:
            self.informer.stop()


@pytest.fixture
def env(kafka_running: KafkaNode, topic: str, kube_control_plane: Any, kube_namespace: str) -> Iterator[Env]:
    api_client = kube_control_plane.api_client()
    install_crd(api_client)
    install_crd(api_client, file="resetoffsets.yaml")
    _install_subscription_crd(api_client)
    with Subscriber().running() as http:
        e = Env(api_client, kafka_running, kube_namespace, topic, http, str(kube_control_plane.kubeconfig)).create()
        e.start_controller()
        try:
            yield e
        finally:
            e.stop()
            api_client.close()


class Traffic:
    """Live events (ids live-N) produced at ~20/s, round-robin over the topics and their partitions, until
    stopped."""

    INTERVAL = 0.05

    def __init__(self, kafka: KafkaNode, *topics: str) -> None:
        self.producer = Producer({**kafka.client_config(), "linger.ms": 1})
        self.topics = topics
        self.ids: list[str] = []
        self.sent: dict[str, float] = {}  # id -> time.monotonic() when produced
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.INTERVAL):
            event = CloudEvent({"id": f"live-{n}", "source": "/test", "type": "test.event", "specversion": "1.0"},
                               b"{}")
            record = event_to_kafka(event)
            topic = self.topics[n % len(self.topics)]
            self.producer.produce(topic, record.value, record.key, partition=(n // len(self.topics)) % 3,
                                  headers=record.headers)
            self.producer.poll(0)
            self.sent[f"live-{n}"] = time.monotonic()
            self.ids.append(f"live-{n}")
            n += 1

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(30) == 0


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_reset_to_a_time_redelivers_exactly_the_events_from_then_on_to_that_subscriber_only(env: Env) -> None:
    env.start_replica()
    wait_for(env.joined, 60, "both subscriptions joined")
    before = produce(env.kafka, env.topic, 60, prefix="before")
    wait_for(lambda: set(before) <= set(env.http.ids("/a")) and set(before) <= set(env.http.ids("/b")), 60,
             "first batch delivered")
    time.sleep(0.3)
    point = time.time()
    time.sleep(0.3)
    after = produce(env.kafka, env.topic, 60, prefix="after")
    wait_for(lambda: set(after) <= set(env.http.ids("/a")) and set(after) <= set(env.http.ids("/b")), 60,
             "second batch delivered")
    with Traffic(env.kafka, env.topic) as live:
        time.sleep(4.5)  # the same traffic without a reset: b's baseline
        started = time.monotonic()
        env.reset("replay", rfc3339(point))
        done = env.wait_done("replay")
        finished = time.monotonic()
        # a's member rejoins after Done: b's reception across that too, then more baseline.
        wait_for(lambda: any(r.at > finished for r in env.http.at("/a")), 30, "a receiving again")
        rejoined = time.monotonic()
        time.sleep(3.0)
        stopped = time.monotonic()
    wait_for(lambda: set(live.ids) <= set(env.http.ids("/a")) and set(live.ids) <= set(env.http.ids("/b")), 60,
             "live traffic delivered")
    assert done["status"] == "True", done
    status = env.status("replay")
    assert status["completedGeneration"] == 1
    assert [p["new"] for p in status["partitions"]] == [20, 20, 20]  # 60 "before" events, 20 per partition
    assert all(p["old"] >= 40 for p in status["partitions"])

    # The ledger, by event id: subscriber a got every "after" event exactly twice and every "before" once;
    a_ids, b_ids = env.http.ids("/a"), env.http.ids("/b")
    assert {i: a_ids.count(i) for i in before} == dict.fromkeys(before, 1)
    assert {i: a_ids.count(i) for i in after} == dict.fromkeys(after, 2)
    assert all(1 <= a_ids.count(i) <= 2 for i in live.ids)
    # ... and subscriber b nothing twice, and no pause while a's group was reset.
    assert {i: b_ids.count(i) for i in before + after + live.ids} == dict.fromkeys(before + after + live.ids, 1)
    # The other subscription saw no pause longer than one poll: b's longest gap between two receptions while a's
    # group was paused, moved and rejoined is at most its longest gap over the same traffic without a reset (the
    # seconds before and after) plus one poll. One poll: the broker holds a fetch up to fetch.wait.max.ms when
    # nothing is new, and the dispatcher waits up to MAX_IDLE_POLL in consume() before polling again.
    fetch_wait = consumer_settings(env.settings, connection_from_settings(env.settings), "g", "latest", 3)
    one_poll = fetch_wait["fetch.wait.max.ms"] / 1000 + MAX_IDLE_POLL
    arrivals = sorted(r.at for r in env.http.at("/b") if r.headers.get("ce-id", "") in live.sent)

    def longest_gap(start: float, end: float) -> float:
        inside = [t for t in arrivals if start <= t <= end]
        assert inside, (start, end, arrivals)
        return max(b - a for a, b in itertools.pairwise([start, *inside, end]))

    during = longest_gap(started, rejoined)
    baseline = max(longest_gap(started - 4.0, started), longest_gap(rejoined, stopped))
    print(f"b's longest reception gap: {during:.3f} s during the reset ({rejoined - started:.1f} s), "
          f"{baseline:.3f} s without ({4.0 + stopped - rejoined:.1f} s); one poll {one_poll:.3f} s")
    assert during <= baseline + one_poll, (during, baseline, one_poll)

    # Done once: a restart of the dispatcher does not apply it again.
    count = len(env.http.ids("/a"))
    dispatcher, thread = env.replicas.pop()
    dispatcher.stop()
    thread.join(30)
    env.start_replica("replica-1")
    wait_for(env.joined, 60, "rejoined")
    time.sleep(2)
    assert len(env.http.ids("/a")) == count
    assert env.status("replay")["partitions"] == status["partitions"]


def test_reset_to_latest_skips_the_backlog(env: Env) -> None:
    slow = {"on": True}
    env.http.behaviours["/a"] = lambda _r, _n: (200, {}, b"", 0.2 if slow["on"] else 0.0)
    env.start_replica()
    wait_for(env.joined, 60, "both subscriptions joined")
    backlog = produce(env.kafka, env.topic, 600, prefix="backlog")
    wait_for(lambda: len(env.http.ids("/a")) >= 10, 30, "a working through the backlog")
    env.reset("skip", "latest")
    assert env.wait_done("skip")["status"] == "True"
    done_at = time.monotonic()
    slow["on"] = False
    fresh = produce(env.kafka, env.topic, 30, prefix="fresh")
    wait_for(lambda: set(fresh) <= set(env.http.ids("/a")), 60, "fresh events delivered")
    late = [r for r in env.http.at("/a") if r.at > done_at and r.headers.get("ce-id", "").startswith("backlog")]
    assert late == [], "backlog delivered after the reset to latest"
    assert len(set(env.http.ids("/a")) & set(backlog)) < 300
    assert set(backlog) <= set(env.http.ids("/b"))  # b had its backlog, untouched


def test_bad_input_gets_a_reason_and_moves_nothing(env: Env) -> None:
    install_crd(env.api_client, file="brokers.yaml")
    install_crd(env.api_client, file="triggers.yaml")
    env.start_replica()
    wait_for(env.joined, 60, "both subscriptions joined")
    produce(env.kafka, env.topic, 30)
    wait_for(lambda: len(env.http.ids("/a")) == 30, 60, "delivered")
    wait_for(lambda: committed(env.kafka, env.topic, env.group("a")) == [10, 10, 10], 30, "committed")
    env.objects.create_namespaced_custom_object("eventing.knative.dev", "v1", env.ns, "brokers", {
        "apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
        "metadata": {"name": "mt", "annotations": {"eventing.knative.dev/broker.class": "MTChannelBasedBroker"}}})
    env.objects.create_namespaced_custom_object("eventing.knative.dev", "v1", env.ns, "triggers", {
        "apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "metadata": {"name": "t"},
        "spec": {"broker": "mt", "subscriber": {"uri": "http://127.0.0.1:9/"}}})
    cases = {
        "unknown": ("earliest", {"apiVersion": "messaging.knative.dev/v1", "kind": "Subscription", "name": "nope"},
                    ro.REASON_REF_NOT_FOUND),
        "badtime": ("last tuesday", None, ro.REASON_INVALID_TIME),
        "otherclass": ("earliest", {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "name": "t"},
                       ro.REASON_NOT_KAFKA),
        "nosource": ("earliest", {"apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource", "name": "s"},
                     ro.REASON_REF_NOT_FOUND),
        "pod": ("earliest", {"apiVersion": "v1", "kind": "Pod", "name": "p"}, ro.REASON_UNSUPPORTED_REF),
    }
    for name, (when, ref, _reason) in cases.items():
        env.reset(name, when, ref)
    for name, (_when, _ref, reason) in cases.items():
        done = env.wait_done(name, 30)
        accepted = env.condition(name, ro.ACCEPTED)
        assert (accepted["status"], accepted["reason"], done["status"], done["reason"]) == \
            ("False", reason, "False", reason), (name, accepted)
        assert accepted["message"]
    assert committed(env.kafka, env.topic, env.group("a")) == [10, 10, 10]
    assert len(env.http.ids("/a")) == 30


def test_a_group_without_commits_is_group_not_found(env: Env) -> None:
    # No dispatcher has run yet, so neither group has committed anything; the dispatcher that starts holds a's
    # group out while the reset is pending, finds nothing to move, and only then lets it join.
    env.reset("early", "earliest")
    wait_for(lambda: env.condition("early", ro.ACCEPTED).get("status") == "True", 30, "accepted")
    env.start_replica()
    done = env.wait_done("early")
    assert (done["status"], done["reason"]) == ("False", ro.REASON_GROUP_NOT_FOUND), done
    assert "partitions" not in env.status("early")
    wait_for(env.joined, 60, "both subscriptions joined after it")


def test_a_time_older_than_retention_moves_to_the_earliest_kept_offset_and_says_so(env: Env) -> None:
    env.start_replica()
    wait_for(env.joined, 60, "both subscriptions joined")
    ids = produce(env.kafka, env.topic, 30)
    wait_for(lambda: len(env.http.ids("/a")) == 30, 60, "delivered")
    admin = AdminClient(env.kafka.client_config())
    # What retention does to old segments: the first 4 records of every partition are gone.
    for future in admin.delete_records([TopicPartition(env.topic, p, 4) for p in range(3)]).values():
        future.result(30)
    env.reset("ancient", "2001-01-01T00:00:00Z")
    done = env.wait_done("ancient")
    assert done["status"] == "True" and "(retention)" in done["message"], done
    partitions = env.status("ancient")["partitions"]
    assert [(p["new"], p.get("beforeRetention")) for p in partitions] == [(4, True)] * 3
    kept = [i for i in ids if int(i.split("-")[1]) >= 12]  # ids are round-robin over 3 partitions: 4 rounds gone
    wait_for(lambda: all(env.http.ids("/a").count(i) == 2 for i in kept), 60, "kept events redelivered")
    assert all(env.http.ids("/a").count(i) == 1 for i in ids if i not in kept)


def test_a_dispatcher_killed_mid_reset_leaves_the_group_where_it_was_and_finishes_after_restart(env: Env) -> None:
    process = env.start_process()
    try:
        wait_for(env.joined, 60, "both subscriptions joined")
        produce(env.kafka, env.topic, 30)
        wait_for(lambda: len(env.http.ids("/a")) == 30, 60, "delivered")
        wait_for(lambda: committed(env.kafka, env.topic, env.group("a")) == [10, 10, 10], 30, "committed")
        # A member the dispatcher does not control (another replica that has not let go): the reset waits for it.
        stranger = Consumer({**env.kafka.client_config(), "group.id": env.group("a"), "enable.auto.commit": False,
                             "partition.assignment.strategy": "cooperative-sticky",
                             "session.timeout.ms": 6000})
        stranger.subscribe([env.topic])
        polling = threading.Event()

        def poll() -> None:
            while not polling.is_set():
                stranger.poll(0.1)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        group_offsets = GroupOffsets(env.kafka.client_config())
        wait_for(lambda: group_offsets.members(env.group("a")).count == 2, 60, "the stranger in the group")
        env.reset("killed", "earliest")
        wait_for(lambda: env.condition("killed", ro.RESETTING).get("reason") == ro.REASON_MEMBERS, 60,
                 "waiting for the stranger to leave")
        # A second reset of the same group while this one runs is refused, with the running one named.
        env.reset("second", "latest")
        second = env.wait_done("second", 30)
        accepted = env.condition("second", ro.ACCEPTED)
        assert (accepted["status"], accepted["reason"], second["reason"]) == \
            ("False", ro.REASON_IN_PROGRESS, ro.REASON_IN_PROGRESS), accepted
        assert "killed" in accepted["message"]
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        assert committed(env.kafka, env.topic, env.group("a")) == [10, 10, 10]  # where it was
        polling.set()
        poller.join(10)
        stranger.close()
        process = env.start_process()
        done = env.wait_done("killed")
        assert done["status"] == "True", done
        assert [(p["old"], p["new"]) for p in env.status("killed")["partitions"]] == [(10, 0)] * 3
        wait_for(lambda: len(env.http.ids("/a")) == 60, 60, "replayed from the earliest offset")
        assert "partitions" not in env.status("second")  # refused is final: never carried out afterwards
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_offsets_cli_shows_and_refuses_a_group_with_members_then_resets_it(env: Env, capsys: Any,
                                                                           monkeypatch: Any) -> None:
    monkeypatch.setenv("KE_BOOTSTRAP_SERVERS", env.kafka.bootstrap_servers)
    dispatcher = env.start_replica()
    wait_for(env.joined, 60, "both subscriptions joined")
    produce(env.kafka, env.topic, 30)
    wait_for(lambda: committed(env.kafka, env.topic, env.group("b")) == [10, 10, 10], 60, "committed")
    args = ["--group", env.group("b"), "--topic", env.topic]
    assert offsets_main(["show", *args]) == 0
    shown = capsys.readouterr().out
    assert "partition  committed  high  lag" in shown and "members: 1" in shown
    assert offsets_main(["reset", *args, "--to", "earliest", "--yes"]) == 3
    assert "refused: the group has 1 active member" in capsys.readouterr().out
    dispatcher.stop()
    env.replicas[0][1].join(30)
    assert offsets_main(["reset", *args, "--to", "earliest", "--yes", "--wait", "20"]) == 0
    assert "moved 3 of 3 partitions" in capsys.readouterr().out
    assert committed(env.kafka, env.topic, env.group("b")) == [0, 0, 0]


def test_a_trigger_of_a_kafka_broker_is_replayed_and_its_sibling_is_not(env: Env) -> None:
    from kafka_eventing.core import brokers as kb
    from kafka_eventing.dispatcher.status import KubeTriggerStatusWriter
    from kafka_eventing.dispatcher.triggers import KubeTriggerSource

    install_crd(env.api_client, file="brokers.yaml")
    install_crd(env.api_client, file="triggers.yaml")
    env.objects.create_namespaced_custom_object(kb.GROUP, kb.VERSION, env.ns, kb.BROKERS, {
        "apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
        "metadata": {"name": "kb", "annotations": {kb.ANNOTATION_BROKER_CLASS: "Kafka",
                                                   kb.ANNOTATION_EXTERNAL_TOPIC: env.topic}}})
    env.objects.patch_namespaced_custom_object_status(kb.GROUP, kb.VERSION, env.ns, kb.BROKERS, "kb", {
        "status": {"conditions": [{"type": "TopicReady", "status": "True", "reason": "TopicReady"}]}})
    for name in ("t1", "t2"):
        env.objects.create_namespaced_custom_object(kb.GROUP, kb.VERSION, env.ns, kb.TRIGGERS, {
            "apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "metadata": {"name": name},
            "spec": {"broker": "kb", "subscriber": {"uri": env.http.url(f"/{name}")}}})
        env.objects.patch_namespaced_custom_object_status(kb.GROUP, kb.VERSION, env.ns, kb.TRIGGERS, name, {
            "status": {"subscriberUri": env.http.url(f"/{name}"), "conditions": [
                {"type": kind, "status": "True", "reason": kind} for kind in kb.DISPATCH_GATES]}})
    settings = Settings(bootstrap_servers=env.kafka.bootstrap_servers, channel_source="kube",
                        broker_namespace=env.ns, broker_name="kb", kafka_extra=KAFKA_EXTRA)
    connection = connection_from_settings(settings)
    resets = Resets("Broker", env.ns, "kb", KubeResetApi(env.api_client), GroupOffsets(connection.admin_config()),
                    identity="broker-0", poll_seconds=0.2)
    dispatcher = create_dispatcher(settings, connection, KubeTriggerSource(env.api_client, env.ns, "kb"),
                                   status_writer=KubeTriggerStatusWriter(env.api_client),
                                   registry=CollectorRegistry(), host="127.0.0.1", port=0, resets=resets)
    thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
    thread.start()
    env.replicas.append((dispatcher, thread))

    def joined() -> bool:
        return all(next((c for c in (env.objects.get_namespaced_custom_object(
            kb.GROUP, kb.VERSION, env.ns, kb.TRIGGERS, n).get("status") or {}).get("conditions") or ()
            if c["type"] == kb.CONSUMER_GROUP_READY), {}).get("status") == "True" for n in ("t1", "t2"))

    wait_for(joined, 60, "both Triggers' groups joined")
    ids = produce(env.kafka, env.topic, 30)
    wait_for(lambda: set(ids) <= set(env.http.ids("/t1")) and set(ids) <= set(env.http.ids("/t2")), 60,
             "delivered to both Triggers")
    wait_for(lambda: committed(env.kafka, env.topic, kb.trigger_group(env.ns, "t1")) == [10, 10, 10], 30,
             "t1 committed")
    env.reset("trigger-replay", "earliest", {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
                                             "name": "t1"})
    done = env.wait_done("trigger-replay")
    assert done["status"] == "True", done
    assert env.status("trigger-replay")["target"]["group"] == "knative-trigger-" + env.ns + "-t1"
    wait_for(lambda: all(env.http.ids("/t1").count(i) == 2 for i in ids), 60, "t1 replayed")
    time.sleep(1)
    assert all(env.http.ids("/t2").count(i) == 1 for i in ids)


def test_a_kafka_source_is_replayed_from_a_time_by_its_own_dispatcher(env: Env) -> None:
    """The source's dispatcher (the real process, KE_SOURCE_*) carries out a reset of the source's one group over
    both its topics, with live traffic: exactly the events from the time on are redelivered to its sink."""
    from kubernetes import client

    from kafka_eventing.core import kafkasources as ks

    install_crd(env.api_client, file="kafkasources.yaml")
    admin = AdminClient(env.kafka.client_config())
    second = f"{env.topic}.b"
    for future in admin.create_topics([NewTopic(second, num_partitions=3, replication_factor=1)]).values():
        future.result(30)
    topics, group = [env.topic, second], f"ks-{env.ns}"
    objects = client.CustomObjectsApi(env.api_client)
    objects.create_namespaced_custom_object(ks.GROUP, ks.VERSION, env.ns, ks.PLURAL, {
        "apiVersion": f"{ks.GROUP}/{ks.VERSION}", "kind": ks.KIND, "metadata": {"name": "src"},
        "spec": {"bootstrapServers": [env.kafka.bootstrap_servers], "topics": topics, "consumerGroup": group,
                 "initialOffset": "earliest", "sink": {"uri": env.http.url("/sink")}}})
    objects.patch_namespaced_custom_object_status(ks.GROUP, ks.VERSION, env.ns, ks.PLURAL, "src", {
        "status": {"sinkUri": env.http.url("/sink"), "conditions": [
            {"type": kind, "status": "True", "reason": kind} for kind in ks.DISPATCH_GATES]}})
    env_vars = {**os.environ, "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": env.kubeconfig,
                "KE_SOURCE_NAMESPACE": env.ns, "KE_SOURCE_NAME": "src", "KE_DISPATCHER_INITIAL_OFFSET": "earliest",
                "KE_BOOTSTRAP_SERVERS": env.kafka.bootstrap_servers, "KE_KAFKA_EXTRA": KAFKA_EXTRA,
                "KE_METRICS_PORT": "0"}
    process = subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                               env=env_vars)
    sink = lambda: env.http.ids("/sink")  # noqa: E731
    try:
        before = [i for t in topics for i in produce(env.kafka, t, 30, prefix=f"before-{t}")]
        wait_for(lambda: set(before) <= set(sink()), 90, "first batch delivered to the sink")
        time.sleep(0.3)
        point = time.time()
        time.sleep(0.3)
        after = [i for t in topics for i in produce(env.kafka, t, 30, prefix=f"after-{t}")]
        wait_for(lambda: set(after) <= set(sink()), 60, "second batch delivered")
        wait_for(lambda: all(committed(env.kafka, t, group) == [20, 20, 20] for t in topics), 30, "committed")
        with Traffic(env.kafka, *topics) as live:
            time.sleep(1.0)
            env.reset("source-replay", rfc3339(point),
                      {"apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource", "name": "src"})
            done = env.wait_done("source-replay")
            time.sleep(1.0)
        wait_for(lambda: set(live.ids) <= set(sink()), 60, "live traffic delivered")
        assert done["status"] == "True", done
        status = env.status("source-replay")
        assert status["target"] == {"group": group, "topics": topics,
                                    "dispatcher": {"kind": "KafkaSource", "namespace": env.ns, "name": "src"}}
        # Both topics moved, in the one commit: to the first "after" record of every partition.
        assert [(p["topic"], p["partition"], p["new"]) for p in status["partitions"]] == \
            [(t, p, 10) for t in topics for p in range(3)]
        assert all(p["old"] >= 20 for p in status["partitions"])
        # The ledger, by id: every event from the time on twice, none before it again.
        ids = sink()
        assert {i: ids.count(i) for i in before} == dict.fromkeys(before, 1)
        assert {i: ids.count(i) for i in after} == dict.fromkeys(after, 2)
        assert all(1 <= ids.count(i) <= 2 for i in live.ids)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        for future in admin.delete_topics([second], operation_timeout=10).values():
            with contextlib.suppress(Exception):
                future.result(30)


def test_with_two_replicas_exactly_one_commits_and_both_pick_up_the_new_positions(env: Env) -> None:
    env.start_replica("replica-0")
    env.start_replica("replica-1")
    wait_for(env.joined, 60, "both subscriptions joined")
    group_offsets = GroupOffsets(env.kafka.client_config())
    # Both replicas' members share each group (three partitions between them), the rebalance done.
    wait_for(lambda: (m := group_offsets.members(env.group("a"))).count == 2 and m.state == "STABLE", 60,
             "a's group has both replicas, stable")
    ids = produce(env.kafka, env.topic, 30)

    def delivered() -> bool:
        missing = set(ids) - set(env.http.ids("/a"))
        if missing:
            raise NotYet(f"{len(missing)} not delivered, e.g. {sorted(missing)[:3]}; "
                         f"group {group_offsets.members(env.group('a'))}")
        return True

    wait_for(delivered, 60, "delivered")
    wait_for(lambda: committed(env.kafka, env.topic, env.group("a")) == [10, 10, 10], 30, "committed")
    commits: list[str] = []
    for resets in (dispatcher._resets for dispatcher, _ in env.replicas):
        original = resets.offsets.commit

        def spy(group: str, offsets: list[TopicPartition], original: Any = original,
                identity: str = resets.identity) -> None:
            commits.append(identity)
            original(group, offsets)

        resets.offsets.commit = spy
    env.reset("both", "earliest")
    done = env.wait_done("both")
    assert done["status"] == "True", done
    assert len(commits) == 1 and env.status("both")["executor"]["identity"] == commits[0]
    # Both replicas' members came back at the new positions: every event once more, none lost, none thrice.
    wait_for(lambda: all(env.http.ids("/a").count(i) == 2 for i in ids), 60, "replayed by both replicas")
    wait_for(lambda: group_offsets.members(env.group("a")).count == 2, 60, "both replicas rejoined")
    time.sleep(1)
    assert all(env.http.ids("/a").count(i) == 2 for i in ids)
    assert all(env.http.ids("/b").count(i) == 1 for i in ids)
