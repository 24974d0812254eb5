"""brokers: a Trigger's Ready includes the dispatcher's ConsumerGroupReady, which the controller carries over as
stored and never writes, patching at the resourceVersion it read."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller.brokers import TRIGGER_FINALIZER, BrokerReconciler, BrokerStores
from kafka_eventing.controller.reconciler import Reconciler, Stores
from kafka_eventing.core import brokers as kb
from kafka_eventing.core.delivery import ANNOTATION_RATE_LIMIT

from .fakes import (
    SETTINGS,
    DictStore,
    StatusPatches,
)

BROKER = {"metadata": {"namespace": "ns", "name": "b", "annotations": {kb.ANNOTATION_BROKER_CLASS: "Kafka"}},
          "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def trigger(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "t", "generation": 1, "resourceVersion": "7",
                         "finalizers": [TRIGGER_FINALIZER]},
            "spec": {"broker": "b", "subscriber": {"uri": "http://sub/"}},
            "status": {"conditions": list(conditions)}}


def reconcile(obj: dict[str, Any]) -> dict[str, Any]:
    base = Reconciler(client.ApiClient(), SETTINGS, Stores(*(DictStore() for _ in range(4))))
    patches = StatusPatches()
    base.custom = patches  # type: ignore[assignment]
    BrokerReconciler(base, BrokerStores(DictStore(BROKER), DictStore(obj))).reconcile_trigger("ns", "t")
    (body,) = patches.calls
    return body


def by_type(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["status"]["conditions"]}


def test_ready_waits_for_the_dispatcher_to_report_the_consumer_group() -> None:
    body = reconcile(trigger())
    conditions = by_type(body)
    assert kb.CONSUMER_GROUP_READY not in conditions  # never written by the controller
    assert all(conditions[k]["status"] == "True" for k in (kb.BROKER_READY, kb.SUBSCRIBER_RESOLVED,
                                                           kb.SUBSCRIPTION_READY, kb.DEPENDENCY_READY))
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("Unknown", "ConsumerGroupNotReported")
    assert "knative-trigger-ns-t" in ready["message"]
    assert body["metadata"] == {"resourceVersion": "7"}  # conditional: a newer dispatcher write is not lost


def test_ready_follows_the_stored_consumer_group_condition_which_is_kept_as_is() -> None:
    joined = {"type": kb.CONSUMER_GROUP_READY, "status": "True", "reason": "ConsumerGroupJoined",
              "message": "consumer group knative-trigger-ns-t joined", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    body = reconcile(trigger(joined))
    assert by_type(body)[kb.CONSUMER_GROUP_READY] == joined
    assert by_type(body)["Ready"]["status"] == "True"
    failed = {"type": kb.CONSUMER_GROUP_READY, "status": "False", "reason": "KafkaError", "message": "Kafka: down",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ready = by_type(reconcile(trigger(failed)))["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "KafkaError", "Kafka: down")


def test_a_conflict_with_the_dispatchers_write_is_a_requeue_not_an_error() -> None:
    class Conflict(StatusPatches):
        def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
            super().patch_namespaced_custom_object_status(*args, **kwargs)
            raise ApiException(status=409)

    base = Reconciler(client.ApiClient(), SETTINGS, Stores(*(DictStore() for _ in range(4))))
    base.custom = Conflict()  # type: ignore[assignment]
    result = BrokerReconciler(base, BrokerStores(DictStore(BROKER), DictStore(trigger()))).reconcile_trigger("ns", "t")
    assert result.error is None and result.requeue_after is not None


def test_a_forbidden_read_is_a_condition_naming_the_chart_value_to_extend() -> None:
    """A 403 on a subscriber, dead-letter sink or dependency says which readableKinds entry grants the read."""
    class Forbidden(StatusPatches):
        def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
            raise ApiException(status=403, reason="Forbidden")

    obj = trigger()
    obj["metadata"]["annotations"] = {kb.ANNOTATION_DEPENDENCY: json.dumps(
        {"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "name": "ping"})}
    obj["spec"]["subscriber"] = {"ref": {"apiVersion": "flows.knative.dev/v1", "kind": "Sequence", "name": "seq"}}
    obj["spec"]["delivery"] = {"deadLetterSink": {"ref": {"apiVersion": "example.com/v1", "kind": "Widget",
                                                          "name": "w"}}}
    base = Reconciler(client.ApiClient(), SETTINGS, Stores(*(DictStore() for _ in range(4))))
    patches = Forbidden()
    base.custom = patches  # type: ignore[assignment]
    BrokerReconciler(base, BrokerStores(DictStore(BROKER), DictStore(obj))).reconcile_trigger("ns", "t")
    conditions = by_type(patches.calls[0])
    expected = {
        kb.SUBSCRIBER_RESOLVED: ("DestinationForbidden", "add sequences under flows.knative.dev"),
        kb.DEPENDENCY_READY: ("DependencyForbidden", "add pingsources under sources.knative.dev"),
        "DeadLetterSinkResolved": ("DeadLetterSinkForbidden", "add widgets under example.com"),
    }
    for kind, (reason, hint) in expected.items():
        c = conditions[kind]
        assert (c["status"], c["reason"]) == ("False", reason), c
        assert hint in c["message"] and "controller.rbac.readableKinds" in c["message"], c["message"]
        assert "verbs: [get, list, watch]" in c["message"]


def test_an_invalid_rate_limit_annotation_makes_the_subscription_not_ready() -> None:
    obj = trigger()
    obj["metadata"]["annotations"] = {ANNOTATION_RATE_LIMIT: "-3"}
    c = by_type(reconcile(obj))[kb.SUBSCRIPTION_READY]
    assert (c["status"], c["reason"]) == ("False", "InvalidRateLimit")
    assert ANNOTATION_RATE_LIMIT in c["message"] and "'-3'" in c["message"]
    obj["metadata"]["annotations"] = {ANNOTATION_RATE_LIMIT: "12.5"}
    assert by_type(reconcile(obj))[kb.SUBSCRIPTION_READY]["status"] == "True"
