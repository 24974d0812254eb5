"""Dispatcher in kube mode: watches its KafkaChannel on a real apiserver and writes status.subscribers[]."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kafka_eventing.core.channel_source import KubeChannelSource
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.dispatcher.status import KubeStatusWriter
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.kube]

GROUP, VERSION, PLURAL = "messaging.knative.dev", "v1beta1", "kafkachannels"


@dataclass
class KubeChannel:
    """A KafkaChannel on the real apiserver, reported TopicReady, and the in-process dispatcher replicas of it."""

    api_client: Any
    namespace: str
    name: str
    topic: str
    kafka: KafkaNode
    subscribers: list[dict[str, Any]]
    replicas: list[tuple[Any, threading.Thread]] = field(default_factory=list)

    @property
    def objects(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    def create(self) -> KubeChannel:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaChannel",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "annotations": {"kafka.eventing.knative.dev/external.topic": self.topic}},
            "spec": {"numPartitions": 3, "subscribers": self.subscribers},
        }
        self.objects.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        # What the controller (not running here) reports once the topic exists: until then the channel is not
        # ready.
        self.objects.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, self.name, {
            "status": {"conditions": [{"type": "TopicReady", "status": "True", "reason": "TopicReady"}]}})
        return self

    def add_subscriber(self, uid: str) -> None:
        self.subscribers.append({"uid": uid, "generation": 1, "subscriberUri": "http://127.0.0.1:9/"})
        self.objects.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name,
                                                    {"spec": {"subscribers": self.subscribers}})

    def status_subscribers(self) -> dict[str, dict[str, Any]]:
        obj = self.objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        return {s["uid"]: s for s in (obj.get("status") or {}).get("subscribers") or []}

    def start_replica(self) -> Any:
        settings = Settings(bootstrap_servers=self.kafka.bootstrap_servers, channel_source="kube",
                            channel_namespace=self.namespace, channel_name=self.name,
                            kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")
        source = KubeChannelSource(self.api_client, settings, namespace=self.namespace, name=self.name)
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                       status_writer=KubeStatusWriter(self.api_client), registry=CollectorRegistry(),
                                       host="127.0.0.1", port=0)
        thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
        thread.start()
        self.replicas.append((dispatcher, thread))
        return dispatcher

    def stop(self) -> None:
        for dispatcher, thread in self.replicas:
            dispatcher.stop()
            thread.join(30)
        alive = [thread for _, thread in self.replicas if thread.is_alive()]
        frames = sys._current_frames()
        stacks = ["".join(traceback.format_stack(frames[t.ident])) for t in alive if t.ident in frames]
        assert not alive, "dispatcher thread still running after stop():\n" + "\n".join(stacks)


@pytest.fixture
def kube_channel(kafka_running: KafkaNode, topic: str, kube_control_plane: Any,
                 kube_namespace: str) -> Iterator[KubeChannel]:
    from kafka_eventing.controller.crd import install_crd

    api_client = kube_control_plane.api_client()
    install_crd(api_client)
    channel = KubeChannel(api_client, kube_namespace, "kc", topic, kafka_running,
                          [{"uid": "sub-1", "generation": 3, "subscriberUri": "http://127.0.0.1:9/"}]).create()
    try:
        yield channel
    finally:
        try:
            channel.stop()
        finally:
            api_client.close()


def test_subscriber_status_written_through_status_subresource(kube_channel: KubeChannel) -> None:
    kube_channel.start_replica()
    wait_for(lambda: kube_channel.status_subscribers().get("sub-1", {}).get("ready") == "True", 60,
             "subscriber ready")
    assert kube_channel.status_subscribers() == {"sub-1": {"uid": "sub-1", "observedGeneration": 3, "ready": "True"}}

    # A second subscriber added to the resource is picked up live and reported too.
    kube_channel.add_subscriber("sub-2")
    wait_for(lambda: {u: s["ready"] for u, s in kube_channel.status_subscribers().items()}
             == {"sub-1": "True", "sub-2": "True"}, 60, "both subscribers ready")


def test_two_dispatcher_replicas_do_not_flap_subscriber_readiness(kube_channel: KubeChannel) -> None:
    # Each replica runs a member of every subscriber's group. A replica that is still joining must not
    # overwrite what another one reported (ready), and neither may drop the other's entries.
    from kubernetes import watch

    seen: list[tuple[str, str, str]] = []
    stop_watch = threading.Event()

    def record() -> None:
        w = watch.Watch()
        while not stop_watch.is_set():
            for event in w.stream(kube_channel.objects.list_namespaced_custom_object, GROUP, VERSION,
                                  kube_channel.namespace, PLURAL, field_selector="metadata.name=kc",
                                  timeout_seconds=2):
                for s in (event["object"].get("status") or {}).get("subscribers") or []:
                    seen.append((s["uid"], s["ready"], s.get("message", "")))

    first = kube_channel.start_replica()
    wait_for(lambda: kube_channel.status_subscribers().get("sub-1", {}).get("ready") == "True", 60,
             "sub-1 ready (one replica)")
    watcher = threading.Thread(target=record, daemon=True)
    watcher.start()
    try:
        second = kube_channel.start_replica()
        wait_for(lambda: second.readiness()[0], 60, "the second replica joined")
        # A subscriber added while both run: each replica reports it; the entries of the other stay.
        kube_channel.add_subscriber("sub-2")
        wait_for(lambda: all(len(d._subs) == 2 and d.readiness()[0] for d in (first, second)), 60,
                 "both replicas joined both groups")
        wait_for(lambda: {u: s["ready"] for u, s in kube_channel.status_subscribers().items()}
                 == {"sub-1": "True", "sub-2": "True"}, 30, "both subscribers ready")
        time.sleep(1.0)  # let the watch see any late write
    finally:
        stop_watch.set()
        watcher.join(10)
    flaps = [s for s in seen if s[0] == "sub-1" and s[1] != "True"]
    assert seen and not flaps, flaps
