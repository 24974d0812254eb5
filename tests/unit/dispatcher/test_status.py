"""status: the status.subscribers document."""

from __future__ import annotations

from kafka_eventing.dispatcher.status import JOINING, SubscriberStatus, build_status, merge_subscribers


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
