"""controller.dependencies: which refs an object waits for (from its conditions), one watch by name per waited-for
object while something waits for it, and its events enqueue the waiting objects; controller.reconciler.TopicWait:
a missing topic is looked for again after 1, 2, then every 3 s. On the real API server and Kafka:
tests/integration/test_broker_controller.py and test_source_controller.py (``within_seconds``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from kafka_eventing.controller.dependencies import (
    Dependencies,
    Ref,
    annotated_ref,
    dead_letter_sink_waits,
    ref_of,
    waiting_for,
)
from kafka_eventing.controller.host import ControllerOptions
from kafka_eventing.controller.reconciler import TopicWait
from waiting import wait_for

SERVICE_REF = {"apiVersion": "v1", "kind": "Service", "name": "sub"}
KSVC_REF = {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "fn", "namespace": "other"}


def trigger(name: str, reason: str | None, status: str = "False", **spec: Any) -> dict[str, Any]:
    conditions = [] if reason is None else [{"type": "SubscriberResolved", "status": status, "reason": reason}]
    return {"metadata": {"namespace": "shop", "name": name}, "spec": spec, "status": {"conditions": conditions}}


def subscriber_waits(obj: Mapping[str, Any]) -> set[Ref]:
    return waiting_for(obj, "SubscriberResolved", ref_of((obj.get("spec") or {}).get("subscriber"), "shop"))


def test_refs_are_read_from_destinations_and_annotations() -> None:
    assert ref_of({"ref": SERVICE_REF, "uri": "/x"}, "shop") == ("v1", "Service", "shop", "sub")
    assert ref_of({"ref": KSVC_REF}, "shop") == ("serving.knative.dev/v1", "Service", "other", "fn")
    assert ref_of({"uri": "http://x"}, "shop") is None
    assert ref_of(None, "shop") is None
    assert annotated_ref(json.dumps({"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": "b"}),
                         "shop") == ("eventing.knative.dev/v1", "Broker", "shop", "b")
    assert annotated_ref("not json", "shop") is None


def test_only_a_missing_or_unaddressable_ref_is_waited_for() -> None:
    ref = ("v1", "Service", "shop", "sub")
    assert waiting_for(trigger("t", "DestinationNotFound"), "SubscriberResolved", ref) == {ref}
    assert waiting_for(trigger("t", "DestinationNotAddressable"), "SubscriberResolved", ref) == {ref}
    # Forbidden: a watch would be refused too; resolved, or not reconciled yet: nothing to wait for.
    assert waiting_for(trigger("t", "DestinationForbidden"), "SubscriberResolved", ref) == set()
    assert waiting_for(trigger("t", "SubscriberResolved", "True"), "SubscriberResolved", ref) == set()
    assert waiting_for(trigger("t", None), "SubscriberResolved", ref) == set()
    dls = {"metadata": {"namespace": "shop", "name": "c"},
           "spec": {"delivery": {"deadLetterSink": {"ref": SERVICE_REF}}},
           "status": {"conditions": [{"type": "DeadLetterSinkResolved", "status": "False",
                                      "reason": "DeadLetterSinkUnresolved"}]}}
    assert dead_letter_sink_waits(dls) == {ref}


class FakeApi:
    """A list function per API: lists what exists by the field selector's name; its watches end at once (the
    informer backs off)."""

    def __init__(self, existing: list[Mapping[str, Any]]) -> None:
        self.existing, self.listed = existing, []  # type: list[Mapping[str, Any]], list[dict[str, Any]]
        self.released = threading.Event()

    def list_func(self) -> Callable[..., Any]:
        def list_objects(**kwargs: Any) -> Any:
            if kwargs.get("watch"):
                self.released.wait(0.05)
                raise ConnectionError("watch ended")
            self.listed.append({k: v for k, v in kwargs.items() if not k.startswith("_")})
            name = kwargs["field_selector"].removeprefix("metadata.name=")
            items = [o for o in self.existing if o["metadata"] == {"namespace": kwargs["namespace"], "name": name}]
            return SimpleNamespace(data=json.dumps({"items": items, "metadata": {"resourceVersion": "1"}}))

        return list_objects


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi([{"metadata": {"namespace": "shop", "name": "sub"}}])
    yield fake
    fake.released.set()


def host(api: FakeApi, enqueued: list[tuple[str, str, str]]) -> Any:
    base = SimpleNamespace(core=SimpleNamespace(list_namespaced_service=api.list_func()),
                           custom=SimpleNamespace(list_namespaced_custom_object=api.list_func()))
    return SimpleNamespace(base=base, options=ControllerOptions(),
                           enqueue=lambda kind, namespace, name: enqueued.append((kind, namespace, name)))


def test_a_waited_for_object_is_watched_by_name_and_its_events_enqueue_the_waiting_objects(api: FakeApi) -> None:
    enqueued: list[tuple[str, str, str]] = []
    deps = Dependencies(host(api, enqueued), "Trigger", subscriber_waits)
    try:
        deps.on_object("ADDED", trigger("a", "DestinationNotFound", subscriber={"ref": SERVICE_REF}))
        deps.on_object("ADDED", trigger("c", "DestinationNotAddressable", subscriber={"ref": KSVC_REF}))
        deps.on_object("ADDED", trigger("ok", "SubscriberResolved", "True", subscriber={"ref": SERVICE_REF}))
        assert deps.watched() == {("v1", "Service", "shop", "sub"),
                                  ("serving.knative.dev/v1", "Service", "other", "fn")}
        # The Service exists (created between the reconcile's read and the watch starting): its listing enqueues a.
        wait_for(lambda: enqueued == [("Trigger", "shop", "a")], 5, "a enqueued")
        # b starts waiting for it after its event came (created between b's read and b's status write): b is
        # enqueued at once from the watch's cache.
        deps.on_object("ADDED", trigger("b", "DestinationNotFound", subscriber={"ref": SERVICE_REF}))
        assert enqueued == [("Trigger", "shop", "a"), ("Trigger", "shop", "b")]
        assert {"namespace": "shop", "field_selector": "metadata.name=sub"} in api.listed
        assert {"group": "serving.knative.dev", "version": "v1", "plural": "services", "namespace": "other",
                "field_selector": "metadata.name=fn"} in api.listed
        # Resolved (or deleted): the watch stops once nothing waits for it; a RESYNC changes nothing.
        deps.on_object("MODIFIED", trigger("a", "SubscriberResolved", "True", subscriber={"ref": SERVICE_REF}))
        assert ("v1", "Service", "shop", "sub") in deps.watched()
        deps.on_object("DELETED", trigger("b", "DestinationNotFound", subscriber={"ref": SERVICE_REF}))
        deps.on_object("RESYNC", trigger("a", "DestinationNotFound", subscriber={"ref": SERVICE_REF}))
        assert deps.watched() == {("serving.knative.dev/v1", "Service", "other", "fn")}
    finally:
        api.released.set()
        deps.stop()


def test_a_core_kind_other_than_service_is_not_watched(api: FakeApi) -> None:
    deps = Dependencies(host(api, []), "Trigger", subscriber_waits)
    try:
        deps.on_object("ADDED", trigger("a", "DestinationNotFound",
                                        subscriber={"ref": {"apiVersion": "v1", "kind": "Pod", "name": "p"}}))
        assert deps.watched() == set()
    finally:
        deps.stop()


def test_a_missing_topic_is_looked_for_after_1_2_then_every_3_seconds_until_found() -> None:
    wait = TopicWait()
    assert [wait.retry("shop", "s").requeue_after for _ in range(5)] == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert wait.retry("shop", "other").requeue_after == 1.0  # per object
    wait.found("shop", "s")
    assert wait.retry("shop", "s").requeue_after == 1.0
    wait.forget("shop", "s")
    wait.forget("shop", "other")
    assert wait.waiting() == 0
