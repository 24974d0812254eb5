"""status: the status.subscribers document."""

from __future__ import annotations

from kafka_eventing.dispatcher.status import SubscriberStatus, build_status


def test_status_document() -> None:
    body = build_status([SubscriberStatus("b", 2, False, "joining consumer group"), SubscriberStatus("a", 1, True)])
    assert body == {"status": {"subscribers": [
        {"uid": "a", "observedGeneration": 1, "ready": "True"},
        {"uid": "b", "observedGeneration": 2, "ready": "False", "message": "joining consumer group"},
    ]}}
