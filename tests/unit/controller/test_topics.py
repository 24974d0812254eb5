"""controller.topics: create/grow/check topics through a fake Admin client, error wording, request batching."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_eventing.controller.topics import (
    ShrinkRefused,
    TopicError,
    TopicSpec,
    TopicState,
    ensure_topic,
    explain,
)

from .fakes import FakeAdmin


def test_ensure_topic_creates_then_is_idempotent() -> None:
    admin = FakeAdmin()
    spec = TopicSpec("ns.c", 3, 1, 1000)
    assert ensure_topic(admin, spec, manage=True).created
    assert ensure_topic(admin, spec, manage=True) == ensure_topic(admin, spec, manage=True)
    assert admin.calls == ["create"]


def test_ensure_topic_grows_partitions_and_sets_retention() -> None:
    admin = FakeAdmin({"t": TopicState("t", 2, 1000)})
    out = ensure_topic(admin, TopicSpec("t", 4, 1, 2000), manage=True)
    assert out.partitions_added == 2 and out.retention_changed
    assert admin.topics["t"] == TopicState("t", 4, 2000)


def test_ensure_topic_refuses_to_shrink_and_changes_nothing() -> None:
    admin = FakeAdmin({"t": TopicState("t", 4, 1000)})
    with pytest.raises(ShrinkRefused) as info:
        ensure_topic(admin, TopicSpec("t", 2, 1, 5000), manage=True)
    assert info.value.reason == "PartitionsShrinkRefused" and not info.value.retriable
    assert admin.calls == []


def test_external_topic_is_checked_never_created_or_altered() -> None:
    admin = FakeAdmin()
    with pytest.raises(TopicError, match="does not exist") as info:
        ensure_topic(admin, TopicSpec("hub", 1, 1, 1), manage=False)
    assert info.value.reason == "TopicNotFound"
    admin.topics["hub"] = TopicState("hub", 32, 1)
    ensure_topic(admin, TopicSpec("hub", 1, 1, 99), manage=False)
    assert admin.calls == []


@pytest.mark.parametrize(("code", "reason"), [
    (KafkaError._TRANSPORT, "KafkaUnreachable"),
    (KafkaError.POLICY_VIOLATION, "TopicQuotaExceeded"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, "TopicNotAuthorized"),
    (KafkaError.INVALID_REPLICATION_FACTOR, "InvalidReplicationFactor"),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, "TopicNotFound"),
    (KafkaError.INVALID_CONFIG, "TopicFailed"),
])
def test_explain_maps_provider_errors_to_readable_reasons(code: int, reason: str) -> None:
    err = explain(KafkaException(KafkaError(code, "broker says no")), "ns.c", "create", "k:9092")
    assert err.reason == reason
    assert "ns.c" in err.message


def test_batcher_coalesces_concurrent_calls_into_one_request() -> None:
    from concurrent.futures import Future

    from kafka_eventing.controller.topics import _Batcher

    requests: list[list[str]] = []

    def send(items: list[str]) -> dict[str, Future[str]]:
        requests.append(items)
        out: dict[str, Future[str]] = {}
        for item in items:
            out[item] = Future()
            out[item].set_result(item.upper())
        return out

    batcher = _Batcher(send, window=0.2)
    results: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=n: results.update({n: batcher.submit(n).result(5)}))
               for n in ("a", "b", "a", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == {"a": "A", "b": "B", "c": "C"}
    assert len(requests) == 1 and sorted(requests[0]) == ["a", "b", "c"]  # the duplicate is sent once
