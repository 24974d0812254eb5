"""status: the status.subscribers document of a channel, the ConsumerGroupReady condition of a Trigger."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kafka_eventing.core import brokers as kb
from kafka_eventing.dispatcher.status import (
    CONFLICT_ATTEMPTS,
    JOINING,
    REASON_JOINED,
    REASON_JOINING,
    REASON_KAFKA,
    REASON_TRIGGER_NOT_READY,
    KubeTriggerStatusWriter,
    SubscriberStatus,
    build_status,
    consumer_group_condition,
    merge_subscribers,
    merge_trigger_condition,
)


def test_status_document() -> None:
    body = build_status([SubscriberStatus("b", 2, False, "joining consumer group"), SubscriberStatus("a", 1, True)])
    assert body == {"status": {"subscribers": [
        {"uid": "a", "observedGeneration": 1, "ready": "True"},
        {"uid": "b", "observedGeneration": 2, "ready": "False", "message": "joining consumer group"},
    ]}}


def _entry(uid: str, generation: int, ready: bool, message: str = "") -> dict[str, object]:
    return SubscriberStatus(uid, generation, ready, message).as_dict()


def test_a_joining_replica_never_overwrites_another_ones_ready() -> None:
    stored = [_entry("a", 1, True), _entry("b", 1, True)]
    mine = [_entry("a", 1, False, JOINING), _entry("b", 1, False, "topic t does not exist")]
    assert merge_subscribers(stored, mine, ["a", "b"]) == [_entry("a", 1, True),
                                                           _entry("b", 1, False, "topic t does not exist")]


def test_merge_keeps_unknown_entries_drops_removed_ones_and_respects_generations() -> None:
    stored = [_entry("a", 3, False, JOINING), _entry("gone", 1, True), _entry("other", 1, True)]
    mine = [_entry("a", 2, True), _entry("new", 1, False, JOINING)]
    assert merge_subscribers(stored, mine, ["a", "other", "new"]) == [
        _entry("a", 3, False, JOINING),  # the stored entry is of a newer generation
        _entry("new", 1, False, JOINING),
        _entry("other", 1, True),  # another replica's, unknown here: kept
    ]
    assert merge_subscribers(stored, [_entry("a", 3, True)], ["a"]) == [_entry("a", 3, True)]


# -- a Trigger's ConsumerGroupReady -------------------------------------------------------------------------
CONTROLLER_CONDITIONS = [
    {"type": "BrokerReady", "status": "True", "lastTransitionTime": "t0"},
    {"type": "Ready", "status": "Unknown", "reason": "ConsumerGroupNotReported", "lastTransitionTime": "t0"},
]


def _trigger(generation: int = 2, conditions: list[dict[str, Any]] | None = None, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "t", "generation": generation, "resourceVersion": rv},
            "status": {"subscriberUri": "http://sub/",
                       "conditions": list(CONTROLLER_CONDITIONS if conditions is None else conditions)}}


def _group_condition(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in conditions if c["type"] == kb.CONSUMER_GROUP_READY)


def test_consumer_group_condition_joined_joining_and_why_not() -> None:
    group = "knative-trigger-ns-t"
    joined = consumer_group_condition(SubscriberStatus("t", 1, True, "", REASON_JOINED), group)
    assert (joined.status, joined.reason, joined.message) == ("True", "ConsumerGroupJoined",
                                                              f"consumer group {group} joined")
    joining = consumer_group_condition(SubscriberStatus("t", 1, False, JOINING, REASON_JOINING), group)
    assert (joining.status, joining.reason) == ("Unknown", "Joining")
    held = consumer_group_condition(
        SubscriberStatus("t", 1, False, "BrokerReady is False (BrokerDoesNotExist)", REASON_TRIGGER_NOT_READY), group)
    assert (held.status, held.reason, held.message) == ("False", "TriggerNotReady",
                                                        "BrokerReady is False (BrokerDoesNotExist)")


def test_merge_trigger_condition_replaces_only_its_own_condition() -> None:
    merged = merge_trigger_condition(_trigger(), SubscriberStatus("t", 2, True, "", REASON_JOINED))
    assert merged is not None
    conditions = merged["conditions"]
    assert [c["type"] for c in conditions] == ["BrokerReady", kb.CONSUMER_GROUP_READY, "Ready"]  # sorted by type
    assert [c for c in conditions if c["type"] != kb.CONSUMER_GROUP_READY] == CONTROLLER_CONDITIONS  # untouched
    assert _group_condition(conditions)["status"] == "True"
    # Stored already: nothing to write; lastTransitionTime kept while the status stays.
    again = _trigger(conditions=conditions)
    assert merge_trigger_condition(again, SubscriberStatus("t", 2, True, "", REASON_JOINED)) is None
    failed = merge_trigger_condition(again, SubscriberStatus("t", 2, False, "Kafka: down", REASON_KAFKA))
    assert failed is not None and _group_condition(failed["conditions"])["reason"] == REASON_KAFKA


def test_merge_trigger_condition_never_lets_a_joining_or_stale_replica_overwrite() -> None:
    joined = merge_trigger_condition(_trigger(), SubscriberStatus("t", 2, True, "", REASON_JOINED))
    assert joined is not None
    stored = _trigger(conditions=joined["conditions"])
    # Another replica still joining: the group already consumes, the stored True stays.
    assert merge_trigger_condition(stored, SubscriberStatus("t", 2, False, JOINING, REASON_JOINING)) is None
    # A replica that has not seen the Trigger's current generation yet reports again once it has.
    assert merge_trigger_condition(_trigger(generation=3), SubscriberStatus("t", 2, True)) is None
    # Joining does replace a False (a held Trigger now being joined).
    held = merge_trigger_condition(_trigger(), SubscriberStatus("t", 2, False, "no", REASON_TRIGGER_NOT_READY))
    assert held is not None
    joining = merge_trigger_condition(_trigger(conditions=held["conditions"]),
                                      SubscriberStatus("t", 2, False, JOINING, REASON_JOINING))
    assert joining is not None and _group_condition(joining["conditions"])["status"] == "Unknown"


class FakeTriggers:
    """Triggers by name with a resourceVersion that every status patch checks, as the API server does."""

    def __init__(self, *triggers: dict[str, Any]) -> None:
        self.objs = {t["metadata"]["name"]: copy.deepcopy(t) for t in triggers}
        self.patches: list[dict[str, Any]] = []
        self.before_patch: list[Callable[[], None]] = []  # a concurrent writer's move, one per patch

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                     **_: Any) -> dict[str, Any]:
        assert (group, version, plural) == (kb.GROUP, kb.VERSION, kb.TRIGGERS)
        if name not in self.objs:
            raise ApiException(status=404)
        return copy.deepcopy(self.objs[name])

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: dict[str, Any], **_: Any) -> None:
        if self.before_patch:
            self.before_patch.pop(0)()
        obj = self.objs[name]
        self.patches.append(body)
        if body["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        obj["status"] = {**obj.get("status", {}), **body["status"]}
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)

    def controller_writes(self, name: str, reason: str) -> None:
        obj = self.objs[name]
        obj["status"]["conditions"] = [{**c, "reason": reason} if c["type"] == "Ready" else c
                                       for c in obj["status"]["conditions"]]
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)


def test_trigger_writer_merges_again_after_a_conflict_and_keeps_the_controllers_write() -> None:
    api = FakeTriggers(_trigger())
    writer = KubeTriggerStatusWriter(None, api=api)
    api.before_patch.append(lambda: api.controller_writes("t", "SomethingNew"))  # the controller, in between
    writer.write(("ns", "b"), [SubscriberStatus("t", 2, True, "", REASON_JOINED)])
    assert len(api.patches) == 2  # 409, then read and merged again
    conditions = api.objs["t"]["status"]["conditions"]
    assert _group_condition(conditions)["status"] == "True"
    assert next(c for c in conditions if c["type"] == "Ready")["reason"] == "SomethingNew"
    assert api.objs["t"]["status"]["subscriberUri"] == "http://sub/"
    # Unchanged statuses are not read or written again; a deleted Trigger is skipped.
    writer.write(("ns", "b"), [SubscriberStatus("t", 2, True, "", REASON_JOINED),
                               SubscriberStatus("gone", 1, True, "", REASON_JOINED)])
    assert len(api.patches) == 2


def test_write_merged_gives_up_after_repeated_conflicts() -> None:
    api = FakeTriggers(_trigger())
    writer = KubeTriggerStatusWriter(None, api=api)
    api.before_patch.extend(lambda i=i: api.controller_writes("t", f"r{i}") for i in range(CONFLICT_ATTEMPTS))
    with pytest.raises(ApiException) as info:
        writer.write(("ns", "b"), [SubscriberStatus("t", 2, True)])
    assert info.value.status == 409 and len(api.patches) == CONFLICT_ATTEMPTS
    writer.write(("ns", "b"), [SubscriberStatus("t", 2, True)])  # the board retries: now it goes through
    assert _group_condition(api.objs["t"]["status"]["conditions"])["status"] == "True"
