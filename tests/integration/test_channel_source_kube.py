"""KubeChannelSource on a real kube-apiserver: list, watch, add/change/remove a KafkaChannel at runtime."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_eventing.core.channel_source import KubeChannelSource
from kafka_eventing.core.settings import Settings
from waiting import wait_for

pytestmark = pytest.mark.kube

GROUP, VERSION, PLURAL = "messaging.knative.dev", "v1beta1", "kafkachannels"


def _namespace_name(ns: Any) -> str:
    return ns if isinstance(ns, str) else str(getattr(ns, "name", ns))


@pytest.fixture
def api_client(kube_control_plane: Any) -> Iterator[Any]:
    from kafka_eventing.controller.crd import install_crd

    api = kube_control_plane.api_client()
    install_crd(api)  # the controller's own CRD, as the other kube tests install it
    try:
        yield api
    finally:
        api.close()


def _channel(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaChannel",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"numPartitions": 3}}


def test_watch_follows_changes(api_client: Any, kube_namespace: Any) -> None:
    from kubernetes import client

    ns = _namespace_name(kube_namespace)
    objects = client.CustomObjectsApi(api_client)
    first, second = f"c-{uuid.uuid4().hex[:6]}", f"d-{uuid.uuid4().hex[:6]}"
    objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _channel(first, ns))

    source = KubeChannelSource(api_client, Settings(), namespace=ns, watch_timeout_seconds=5)
    single = KubeChannelSource(api_client, Settings(), namespace=ns, name=second, watch_timeout_seconds=5)
    changes: list[set[tuple[str, str]]] = []
    source.subscribe(lambda snap: changes.append(set(snap)))
    source.start()
    single.start()
    try:
        wait_for(source.synced)
        assert source.get((ns, first)) is not None
        assert source.get((ns, first)).num_partitions == 3  # type: ignore[union-attr]
        wait_for(single.synced)
        assert single.snapshot() == {}  # the name filter keeps other channels out

        objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _channel(second, ns))
        wait_for(lambda: source.get((ns, second)) is not None)
        wait_for(lambda: set(single.snapshot()) == {(ns, second)})
        # No controller has reported on it yet: known, not ready.
        fresh = source.get((ns, second))
        assert fresh is not None and not fresh.ready and fresh.reason.startswith("not reconciled yet")

        # Status drives readiness: TopicReady=False makes the channel known but not ready.
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, second, {"status": {
            "conditions": [{"type": "TopicReady", "status": "False", "reason": "TopicFailed",
                            "message": "quota exceeded"}]}})
        wait_for(lambda: (c := source.get((ns, second))) is not None and c.reason == "quota exceeded")
        assert not source.get((ns, second)).ready  # type: ignore[union-attr]

        # An invalid spec is kept out (and logged), not served with a guessed meaning.
        objects.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, first, {"metadata": {
            "annotations": {"kafka.eventing.knative.dev/content.mode": "weird"}}})
        wait_for(lambda: source.get((ns, first)) is None)

        objects.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, second)
        wait_for(lambda: source.get((ns, second)) is None)
        wait_for(lambda: single.snapshot() == {})

        # The watch outlives its server-side timeout (5 s here): it resumes from the last resourceVersion.
        time.sleep(6)
        objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _channel(second, ns))
        wait_for(lambda: source.get((ns, second)) is not None)
        assert changes[0] == {(ns, first)}
    finally:
        source.stop()
        single.stop()

