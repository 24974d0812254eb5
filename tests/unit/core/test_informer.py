"""The shared Informer (core/informer.py) against scripted list/watch responses: resume, 410 relist, backoff."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kube_fakes import FakeCustomObjects, Obj, gone, kube_obj

from kafka_eventing.core.informer import Informer, NamedWatches
from waiting import wait_for


def names(objs: list[Mapping[str, Any]]) -> set[str]:
    return {str(o["metadata"]["name"]) for o in objs}


def test_resumes_from_bookmark_and_relists_on_gone() -> None:
    fake = FakeCustomObjects(
        lists=[{"metadata": {"resourceVersion": "10"}, "items": [kube_obj("a", "9", extra={"managedFields": [{}]})]},
               {"metadata": {"resourceVersion": "50"}, "items": [kube_obj("a", "12"), kube_obj("z", "49")]}],
        watches=[
            [{"type": "ADDED", "object": kube_obj("b", "11")},
             {"type": "MODIFIED", "object": kube_obj("a", "12")},
             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}],
            [gone()],
        ],
    )
    events: list[tuple[str, str]] = []
    cached_at_list: list[set[str]] = []
    informer: Informer

    def on_list() -> None:
        assert not events or events[-1] != ("list", "")  # once per list
        cached_at_list.append(names(informer.items()))
        events.append(("list", ""))

    informer = Informer("kafkachannels", fake.list_namespaced_custom_object,
                        lambda kind, obj: events.append((kind, str(obj["metadata"]["name"]))),
                        on_list=on_list, watch_timeout_seconds=7, group="g", namespace="ns")
    assert not informer.synced()
    informer.start()
    try:
        wait_for(lambda: informer.relists == 1 and len(fake.watch_calls()) >= 3)
    finally:
        informer.stop()

    assert informer.synced()
    assert events == [
        ("list", ""), ("ADDED", "a"),  # first list
        ("ADDED", "b"), ("MODIFIED", "a"),  # watch; the bookmark is not an event
        ("list", ""), ("DELETED", "b"), ("RELISTED", "a"), ("RELISTED", "z"),  # 410: list again, report all
    ]
    # on_list sees the whole new set already in the cache, before the per-object events.
    assert cached_at_list == [{"a"}, {"a", "z"}]
    assert names(informer.items()) == {"a", "z"}
    assert informer.get("ns", "a") == kube_obj("a", "12")
    assert "managedFields" not in informer.get("ns", "a")["metadata"]  # type: ignore[index]
    assert len(fake.list_calls()) == 2
    assert [c["resource_version"] for c in fake.watch_calls()[:3]] == ["10", "20", "50"]
    for call in fake.calls:
        assert call["group"] == "g" and call["namespace"] == "ns"
    for call in fake.watch_calls():
        assert call["timeout_seconds"] == 7  # server side
        assert call["_request_timeout"] == (10, 37)  # client side, past the server's
        assert call["allow_watch_bookmarks"] is True


def test_other_errors_back_off_and_resume_without_relisting() -> None:
    server_error: Obj = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError",
                                                "message": "etcd unavailable"}}
    fake = FakeCustomObjects(
        lists=[{"metadata": {"resourceVersion": "10"}, "items": []}],
        watches=[[{"type": "ADDED", "object": kube_obj("b", "11")}, server_error], [server_error]],
    )
    seen: list[str] = []
    informer = Informer("kafkachannels", fake.list_namespaced_custom_object,
                        lambda kind, obj: seen.append(kind), max_backoff_seconds=0.05, namespace="ns")
    informer.start()
    try:
        wait_for(lambda: len(fake.watch_calls()) >= 3)
    finally:
        informer.stop()
    assert seen == ["ADDED"]
    assert informer.relists == 0
    assert len(fake.list_calls()) == 1
    assert [c["resource_version"] for c in fake.watch_calls()[:3]] == ["10", "11", "11"]


def test_a_failing_handler_does_not_stop_the_watch_and_stop_is_prompt() -> None:
    fake = FakeCustomObjects(
        lists=[{"metadata": {"resourceVersion": "1"}, "items": [kube_obj("a", "1")]}],
        watches=[[{"type": "ADDED", "object": kube_obj("b", "2")}]],
    )

    def boom(kind: str, obj: Mapping[str, Any]) -> None:
        raise RuntimeError("handler bug")

    informer = Informer("kafkachannels", fake.list_namespaced_custom_object, boom, on_list=lambda: boom("", {}),
                        namespace="ns")
    informer.start()
    try:
        wait_for(lambda: informer.get("ns", "b") is not None)
    finally:
        began = time.monotonic()
        informer.stop()
    assert time.monotonic() - began < 1.0
    assert names(informer.items()) == {"a", "b"}


def test_named_watches_list_and_watch_one_object_each_and_stop_the_unwanted() -> None:
    fake = FakeCustomObjects(lists=[{"metadata": {"resourceVersion": "3"},
                                     "items": [kube_obj("cm", "2", namespace="a")]}])
    events: list[tuple[str, str]] = []
    watches = NamedWatches("configmaps", fake.list_namespaced_custom_object,
                           lambda kind, obj: events.append((kind, str(obj["metadata"]["name"]))),
                           watch_timeout_seconds=5)
    try:
        watches.want({("a", "cm"), ("b", "other")})
        wait_for(lambda: {(c.get("namespace"), c.get("field_selector")) for c in fake.list_calls()} == {
            ("a", "metadata.name=cm"), ("b", "metadata.name=other")})
        wait_for(lambda: ("ADDED", "cm") in events)
        assert watches.get("a", "cm") == kube_obj("cm", "2", namespace="a")
        watches.want({("b", "other")})
        assert watches.watched() == {("b", "other")}
        assert watches.get("a", "cm") is None
    finally:
        watches.stop()
    assert watches.watched() == set()
    watches.want({("a", "cm")})  # after stop: nothing starts again
    assert watches.watched() == set()
