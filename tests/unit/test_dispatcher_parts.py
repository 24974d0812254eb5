"""Dispatcher pieces with fakes: offset low-water mark, retry timing, delivery pipeline, status, rate limit,
flow control."""

from __future__ import annotations

import asyncio
import base64
import email.utils
from collections.abc import Mapping
from datetime import timedelta

import pytest
from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.core.delivery import BackoffPolicy, DeliverySpec
from kafka_eventing.core.http_delivery import Attempt, parse_retry_after, retry_delay
from kafka_eventing.dispatcher.delivery import Deliverer, Outcome
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.offsets import OffsetTracker
from kafka_eventing.dispatcher.status import SubscriberStatus, build_status
from kafka_eventing.dispatcher.subscription import SubscriptionConsumer, TokenBucket, _Partition

LABELS = Labels("ns", "ch", "uid")


# -- offsets ----------------------------------------------------------------------------------------
def test_low_water_mark_waits_for_the_oldest() -> None:
    t = OffsetTracker()
    for offset in (10, 11, 12, 13):
        t.add(offset)
    assert t.done(12) is None
    assert t.done(11) is None
    assert t.commit_position is None
    assert t.done(10) == 13  # 10, 11, 12 finished: next to read is 13
    assert t.done(13) == 14
    assert t.outstanding == 0


def test_low_water_mark_skips_offset_gaps() -> None:
    t = OffsetTracker()
    for offset in (5, 7, 9):  # compaction / transaction markers leave holes
        t.add(offset)
    t.done(7)
    assert t.done(5) == 8
    assert t.done(9) == 10


def test_duplicate_completion_and_out_of_order_add() -> None:
    t = OffsetTracker()
    t.add(1)
    assert t.done(1) == 2
    assert t.done(1) is None
    assert t.add(1) is False  # a record seen before (e.g. refetched) is not tracked twice
    assert t.add(2) is True


@given(st.permutations(list(range(30))))
def test_mark_never_passes_an_unfinished_offset(order: list[int]) -> None:
    t = OffsetTracker()
    for offset in range(30):
        t.add(offset)
    finished: set[int] = set()
    for offset in order:
        t.done(offset)
        finished.add(offset)
        if t.commit_position is not None:
            assert set(range(t.commit_position)) <= finished
            assert t.commit_position == 30 or t.commit_position not in finished
    assert t.commit_position == 30


# -- backoff and Retry-After ------------------------------------------------------------------------
def spec(policy: BackoffPolicy = BackoffPolicy.EXPONENTIAL, retry: int = 3, sink: str | None = None) -> DeliverySpec:
    return DeliverySpec(retry=retry, backoff_policy=policy, backoff_delay=timedelta(seconds=0.1),
                        dead_letter_uri=sink)


def test_backoff_linear_and_exponential() -> None:
    assert [retry_delay(spec(BackoffPolicy.LINEAR), n, None, 600) for n in (1, 2, 3)] == pytest.approx(
        [0.1, 0.2, 0.3])
    assert [retry_delay(spec(), n, None, 600) for n in (1, 2, 3)] == pytest.approx([0.2, 0.4, 0.8])


def test_retry_after_is_honoured_up_to_the_maximum() -> None:
    assert retry_delay(spec(), 1, 5.0, 600) == 5.0
    assert retry_delay(spec(), 1, 5000.0, 600) == 600
    assert retry_delay(spec(), 3, 0.1, 600) == pytest.approx(0.8)  # the backoff is longer


def test_parse_retry_after() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(30)
    assert Attempt(429, headers={"Retry-After": "3"}).retry_after == 3.0
    assert Attempt(500, headers={"Retry-After": "3"}).retry_after is None


# -- the delivery pipeline with a fake sender -------------------------------------------------------
class FakeSender:
    def __init__(self, script: dict[str, list[Attempt]]) -> None:
        self.script = script
        self.calls: list[tuple[str, dict[str, str], bytes]] = []

    async def post(self, url: str, headers: Mapping[str, str], body: bytes, timeout: float | None) -> Attempt:
        self.calls.append((url, dict(headers), body))
        answers = self.script[url]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def to(self, url: str) -> list[tuple[str, dict[str, str], bytes]]:
        return [c for c in self.calls if c[0] == url]


def run(sender: FakeSender, sub: Subscriber) -> tuple[Outcome, list[float]]:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    deliverer = Deliverer(sender, Metrics(CollectorRegistry()), 600, sleep=sleep)  # type: ignore[arg-type]
    event = CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0", "traceparent": "x"}, b"hi")
    record = event_to_kafka(event, trace={"traceparent": "00-abc-def-01"})
    outcome = asyncio.run(deliverer.handle(record.headers, record.value, sub, LABELS))
    return outcome, sleeps


def test_retryable_codes_are_retried_then_delivered() -> None:
    sender = FakeSender({"http://s": [Attempt(503), Attempt(None, error="refused"), Attempt(429), Attempt(202)]})
    outcome, sleeps = run(sender, Subscriber("u", "http://s", delivery=spec(BackoffPolicy.LINEAR)))
    assert outcome is Outcome.DELIVERED
    assert sleeps == pytest.approx([0.1, 0.2, 0.3])
    _url, headers, body = sender.calls[0]
    assert headers["ce-id"] == "1" and headers["Prefer"] == "reply" and body == b"hi"
    assert headers["traceparent"] == "00-abc-def-01"


def test_final_4xx_is_not_retried_and_goes_to_the_sink_with_extensions() -> None:
    sender = FakeSender({"http://s": [Attempt(400, b"nope")], "http://dls": [Attempt(200)]})
    outcome, sleeps = run(sender, Subscriber("u", "http://s", delivery=spec(sink="http://dls")))
    assert outcome is Outcome.DEAD_LETTERED
    assert len(sender.to("http://s")) == 1
    assert sleeps == []
    _, headers, _ = sender.to("http://dls")[0]
    assert headers["ce-knativeerrordest"] == "http://s"
    assert headers["ce-knativeerrorcode"] == "400"
    assert base64.b64decode(headers["ce-knativeerrordata"]) == b"nope"


def test_exhausted_without_sink_is_dropped() -> None:
    sender = FakeSender({"http://s": [Attempt(500)]})
    outcome, sleeps = run(sender, Subscriber("u", "http://s", delivery=spec(retry=2)))
    assert outcome is Outcome.DROPPED
    assert len(sender.calls) == 3 and len(sleeps) == 2


def test_failing_sink_is_retried_until_it_accepts() -> None:
    sink = [Attempt(503)] * 7 + [Attempt(400)] * 3 + [Attempt(201)]
    sender = FakeSender({"http://s": [Attempt(500)], "http://dls": sink})
    outcome, _ = run(sender, Subscriber("u", "http://s", delivery=spec(retry=0, sink="http://dls")))
    assert outcome is Outcome.DEAD_LETTERED
    assert len(sender.to("http://dls")) == 11


def test_reply_goes_to_reply_uri_and_a_failed_reply_dead_letters_the_original() -> None:
    reply = Attempt(200, b"pong", {"ce-id": "r", "ce-source": "/r", "ce-type": "reply", "ce-specversion": "1.0"})
    ok = FakeSender({"http://s": [reply], "http://reply": [Attempt(202)]})
    outcome, _ = run(ok, Subscriber("u", "http://s", reply_uri="http://reply"))
    assert outcome is Outcome.DELIVERED
    assert ok.to("http://reply")[0][1]["ce-id"] == "r"

    bad = FakeSender({"http://s": [reply], "http://reply": [Attempt(500)], "http://dls": [Attempt(200)]})
    outcome, _ = run(bad, Subscriber("u", "http://s", reply_uri="http://reply",
                                     delivery=spec(retry=1, sink="http://dls")))
    assert outcome is Outcome.DEAD_LETTERED
    _, headers, body = bad.to("http://dls")[0]
    assert headers["ce-id"] == "1" and body == b"hi"
    assert headers["ce-knativeerrordest"] == "http://reply"


def test_record_that_is_not_a_cloudevent_is_dropped() -> None:
    sender = FakeSender({"http://s": [Attempt(200)]})
    deliverer = Deliverer(sender, Metrics(CollectorRegistry()), 600)  # type: ignore[arg-type]
    outcome = asyncio.run(deliverer.handle([], b"not an event", Subscriber("u", "http://s"), LABELS))
    assert outcome is Outcome.DROPPED and sender.calls == []


# -- status and rate limit --------------------------------------------------------------------------
def test_status_document() -> None:
    body = build_status([SubscriberStatus("b", 2, False, "joining consumer group"), SubscriberStatus("a", 1, True)])
    assert body == {"status": {"subscribers": [
        {"uid": "a", "observedGeneration": 1, "ready": "True"},
        {"uid": "b", "observedGeneration": 2, "ready": "False", "message": "joining consumer group"},
    ]}}


def test_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, clock=lambda: now[0])
    assert bucket.take() == 0.0 and bucket.take() == 0.0
    assert bucket.take() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.take() == 0.0


# -- flow control -----------------------------------------------------------------------------------
class _PausingConsumer:
    def __init__(self) -> None:
        self.paused: set[int] = set()
        self.calls: list[tuple[str, list[int]]] = []

    def pause(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("pause", [tp.partition for tp in tps]))
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("resume", [tp.partition for tp in tps]))
        self.paused -= {tp.partition for tp in tps}


def _consumer_with(ordered: bool, queued: dict[int, int]) -> tuple[SubscriptionConsumer, _PausingConsumer]:
    sub = Subscriber(uid="u1", subscriber_uri="http://sink", ordered=ordered)
    channel = Channel(namespace="ns", name="ch", topic="t", num_partitions=len(queued), subscribers=(sub,))
    metrics = Metrics(CollectorRegistry())
    consumer = SubscriptionConsumer(channel, sub, group_id="g", consumer_config={}, deliverer=None,  # type: ignore[arg-type]
                                    metrics=metrics, board=None, max_in_flight=64,  # type: ignore[arg-type]
                                    queue_bytes=256 * 1024)
    for number in queued:
        consumer._parts[number] = _Partition(number, None, TopicPartition("t", number))
    consumer._resize()
    fake = _PausingConsumer()
    consumer._consumer = fake
    for number, size in queued.items():
        consumer._parts[number].queued_bytes = size
    return consumer, fake


def test_unordered_never_pauses_a_partition_for_its_share() -> None:
    # One partition holding the whole budget while the others are empty (the end of a backlog) is not paused:
    # a pause drops librdkafka's prefetched batch and stalled delivery at ~1,000 events/s (docs/dispatcher.md).
    consumer, fake = _consumer_with(False, {0: 250 * 1024, 1: 0, 2: 0, 3: 0})
    consumer._flow_control()
    assert fake.calls == []


def test_unordered_pauses_at_twice_the_budget_and_resumes_within_it() -> None:
    consumer, fake = _consumer_with(False, {0: 400 * 1024, 1: 120 * 1024, 2: 0, 3: 0})
    consumer._flow_control()
    assert fake.paused == {0, 1, 2, 3}  # a subscriber that takes nothing: the valve
    consumer._parts[0].queued_bytes = 200 * 1024
    consumer._flow_control()
    assert fake.paused == {0, 1, 2, 3}  # 320 KB: still over the 256 KB budget
    consumer._parts[1].queued_bytes = 0
    consumer._flow_control()
    assert fake.paused == set()


def test_ordered_pauses_a_partition_over_its_share() -> None:
    consumer, fake = _consumer_with(True, {0: 70 * 1024, 1: 0, 2: 0, 3: 0})  # share: 64 KB each
    consumer._flow_control()
    assert fake.paused == {0}
    consumer._parts[0].queued_bytes = 40 * 1024
    consumer._flow_control()
    assert fake.paused == {0}  # resumed only at half its share
    consumer._parts[0].queued_bytes = 30 * 1024
    consumer._flow_control()
    assert fake.paused == set()
