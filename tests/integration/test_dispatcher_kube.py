"""Dispatcher in kube mode: watches its KafkaChannel on a real apiserver and writes status.subscribers[]."""

from __future__ import annotations

import asyncio
import threading
import time
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


def test_subscriber_status_written_through_status_subresource(
        kafka_running: KafkaNode, topic: str, kube_control_plane: Any, kube_namespace: str) -> None:
    from kubernetes import client

    from kafka_eventing.controller.crd import install_crd

    api_client = kube_control_plane.api_client()
    install_crd(api_client)
    objects = client.CustomObjectsApi(api_client)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaChannel",
        "metadata": {"name": "kc", "namespace": kube_namespace,
                     "annotations": {"kafka.eventing.knative.dev/external.topic": topic}},
        "spec": {"numPartitions": 3, "subscribers": [
            {"uid": "sub-1", "generation": 3, "subscriberUri": "http://127.0.0.1:9/"}]},
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, body)
    # What the controller (not running here) reports once the topic exists: until then the channel is not ready.
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, kube_namespace, PLURAL, "kc", {"status": {
        "conditions": [{"type": "TopicReady", "status": "True", "reason": "TopicReady"}]}})

    settings = Settings(bootstrap_servers=kafka_running.bootstrap_servers, channel_source="kube",
                        channel_namespace=kube_namespace, channel_name="kc",
                        kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")
    source = KubeChannelSource(api_client, settings, namespace=kube_namespace, name="kc")
    dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                   status_writer=KubeStatusWriter(api_client), registry=CollectorRegistry(),
                                   host="127.0.0.1", port=0)
    thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
    thread.start()
    try:
        def subscribers() -> list[dict[str, Any]]:
            obj = objects.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "kc")
            return list((obj.get("status") or {}).get("subscribers") or [])

        ready = wait_for(lambda: [s for s in subscribers() if s.get("ready") == "True"], 60, "subscriber ready")
        assert ready == [{"uid": "sub-1", "observedGeneration": 3, "ready": "True"}]

        # A second subscriber added to the resource is picked up live and reported too.
        body["spec"]["subscribers"].append({"uid": "sub-2", "generation": 1, "subscriberUri": "http://127.0.0.1:9/"})
        objects.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "kc",
                                               {"spec": {"subscribers": body["spec"]["subscribers"]}})
        wait_for(lambda: {s["uid"]: s["ready"] for s in subscribers()} == {"sub-1": "True", "sub-2": "True"},
                 60, "both subscribers ready")
    finally:
        dispatcher.stop()
        thread.join(30)
        api_client.close()
    assert not thread.is_alive()


def test_two_dispatcher_replicas_do_not_flap_subscriber_readiness(
        kafka_running: KafkaNode, topic: str, kube_control_plane: Any, kube_namespace: str) -> None:
    # Each replica runs a member of every subscriber's group. A replica that is still joining must not
    # overwrite what another one reported (ready), and neither may drop the other's entries.
    from kubernetes import client, watch

    from kafka_eventing.controller.crd import install_crd

    api_client = kube_control_plane.api_client()
    install_crd(api_client)
    objects = client.CustomObjectsApi(api_client)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaChannel",
        "metadata": {"name": "kc2", "namespace": kube_namespace,
                     "annotations": {"kafka.eventing.knative.dev/external.topic": topic}},
        "spec": {"numPartitions": 3, "subscribers": [
            {"uid": "sub-1", "generation": 1, "subscriberUri": "http://127.0.0.1:9/"}]},
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, body)
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, kube_namespace, PLURAL, "kc2", {"status": {
        "conditions": [{"type": "TopicReady", "status": "True", "reason": "TopicReady"}]}})
    settings = Settings(bootstrap_servers=kafka_running.bootstrap_servers, channel_source="kube",
                        channel_namespace=kube_namespace, channel_name="kc2",
                        kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")

    def subscribers() -> dict[str, dict[str, Any]]:
        obj = objects.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "kc2")
        return {s["uid"]: s for s in (obj.get("status") or {}).get("subscribers") or []}

    replicas: list[tuple[Any, threading.Thread]] = []

    def start_replica() -> Any:
        source = KubeChannelSource(api_client, settings, namespace=kube_namespace, name="kc2")
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                       status_writer=KubeStatusWriter(api_client), registry=CollectorRegistry(),
                                       host="127.0.0.1", port=0)
        thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
        thread.start()
        replicas.append((dispatcher, thread))
        return dispatcher

    seen: list[tuple[str, str, str]] = []
    stop_watch = threading.Event()

    def record() -> None:
        w = watch.Watch()
        while not stop_watch.is_set():
            for event in w.stream(objects.list_namespaced_custom_object, GROUP, VERSION, kube_namespace, PLURAL,
                                  field_selector="metadata.name=kc2", timeout_seconds=2):
                for s in (event["object"].get("status") or {}).get("subscribers") or []:
                    seen.append((s["uid"], s["ready"], s.get("message", "")))

    try:
        first = start_replica()
        wait_for(lambda: subscribers().get("sub-1", {}).get("ready") == "True", 60, "sub-1 ready (one replica)")
        watcher = threading.Thread(target=record, daemon=True)
        watcher.start()
        second = start_replica()
        wait_for(lambda: second.readiness()[0], 60, "the second replica joined")

        # A subscriber added while both run: each replica reports it; the entries of the other stay.
        body["spec"]["subscribers"].append({"uid": "sub-2", "generation": 1, "subscriberUri": "http://127.0.0.1:9/"})
        objects.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "kc2",
                                               {"spec": {"subscribers": body["spec"]["subscribers"]}})
        wait_for(lambda: first.readiness()[0] and second.readiness()[0] and len(first._subs) == 2, 60,
                 "both replicas joined both groups")
        wait_for(lambda: {u: s["ready"] for u, s in subscribers().items()} == {"sub-1": "True", "sub-2": "True"},
                 30, "both subscribers ready")
        time.sleep(1.0)
        stop_watch.set()
        watcher.join(10)
        flaps = [s for s in seen if s[0] == "sub-1" and s[1] != "True"]
        assert seen and not flaps, flaps
    finally:
        stop_watch.set()
        for dispatcher, thread in replicas:
            dispatcher.stop()
            thread.join(30)
        api_client.close()
    assert not any(thread.is_alive() for _, thread in replicas)
