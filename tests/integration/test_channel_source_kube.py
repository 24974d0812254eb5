"""KubeChannelSource on a real kube-apiserver: list, watch, add/change/remove a KafkaChannel at runtime."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_eventing.core.channel_source import KubeChannelSource
from kafka_eventing.core.settings import Settings
from waiting import wait_for

pytestmark = pytest.mark.kube

CANONICAL_CRD = Path(__file__).resolve().parents[2] / "src/kafka_eventing/controller/crds/kafkachannels.yaml"
# Used only while the controller's canonical CRD is not in the tree yet.
MINIMAL_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "kafkachannels.messaging.knative.dev"},
    "spec": {
        "group": "messaging.knative.dev", "scope": "Namespaced",
        "names": {"kind": "KafkaChannel", "plural": "kafkachannels", "singular": "kafkachannel",
                  "listKind": "KafkaChannelList", "shortNames": ["kc"]},
        "versions": [{
            "name": "v1beta1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        }],
    },
}
GROUP, VERSION, PLURAL = "messaging.knative.dev", "v1beta1", "kafkachannels"


def _namespace_name(ns: Any) -> str:
    return ns if isinstance(ns, str) else str(getattr(ns, "name", ns))


@pytest.fixture
def api_client(kube_control_plane: Any) -> Iterator[Any]:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kube_control_plane.kubeconfig))
    crd = yaml.safe_load(CANONICAL_CRD.read_text()) if CANONICAL_CRD.exists() else MINIMAL_CRD
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(crd)
    except client.ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in (got.status.conditions or ()))

    wait_for(established)
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

        # Status drives readiness: TopicReady=False makes the channel known but not ready.
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, second, {"status": {
            "conditions": [{"type": "TopicReady", "status": "False", "reason": "TopicFailed",
                            "message": "quota exceeded"}]}})
        wait_for(lambda: (c := source.get((ns, second))) is not None and not c.ready)
        assert source.get((ns, second)).reason == "quota exceeded"  # type: ignore[union-attr]

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

