"""Dispatcher on the real broker with real HTTP subscribers on 127.0.0.1 (small counts, short backoffs)."""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from prometheus_client import CollectorRegistry
from support.dispatcher import KAFKA_EXTRA, NS, InProcess, Received, Subscriber, committed, produce

from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.channel_source import FileChannelSource
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.kafka import KafkaNode
from promtool import assert_promtool_passes
from waiting import wait_for

pytestmark = pytest.mark.kafka











# -- channels, events, dispatcher -------------------------------------------------------------------
def sub_doc(uid: str, uri: str, **extra: Any) -> dict[str, Any]:
    return {"uid": uid, "generation": 1, "subscriberUri": uri, **extra}


def write_channel(path: Path, name: str, topic: str, subscribers: list[dict[str, Any]], *,
                  ordered: bool = True, delivery: dict[str, Any] | None = None) -> None:
    doc: dict[str, Any] = {
        "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
        "metadata": {"name": name, "namespace": NS, "annotations": {
            "kafka.eventing.knative.dev/external.topic": topic,
            "kafka.eventing.knative.dev/delivery.order": "ordered" if ordered else "unordered"}},
        "spec": {"numPartitions": 3, "subscribers": subscribers, **({"delivery": delivery} if delivery else {})},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)  # atomic: the file source never reads half a file






def make_settings(kafka: KafkaNode, name: str, **kw: Any) -> Settings:
    kw.setdefault("kafka_extra", KAFKA_EXTRA)
    return Settings(bootstrap_servers=kafka.bootstrap_servers, channel_namespace=NS, channel_name=name,
                    log_level="WARNING", **kw)




@pytest.fixture
def dispatch(kafka_running: KafkaNode, tmp_path: Path) -> Iterator[Callable[..., InProcess]]:
    started: list[InProcess] = []

    def make(name: str, channels: Path, **kw: Any) -> InProcess:
        settings = make_settings(kafka_running, name, max_in_flight=kw.pop("max_in_flight", 64),
                                 kafka_extra=kw.pop("kafka_extra", KAFKA_EXTRA),
                                 retry_after_max_seconds=kw.pop("retry_after_max_seconds", 600.0))
        source = FileChannelSource(channels, settings, poll_interval=0.1)
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                       registry=CollectorRegistry(), host="127.0.0.1", port=0,
                                       initial_offset=kw.pop("initial_offset", "earliest"), **kw)
        running = InProcess(dispatcher, source).start()
        started.append(running)
        wait_for(running.ready, 30, "consumer groups joined")
        return running

    try:
        yield make
    finally:
        for running in started:
            running.stop()


def group_of(name: str, uid: str) -> str:
    return f"kafka.{NS}.{name}.{uid}"


def seqs_by_partition(received: list[Received]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for rec in received:
        body = json.loads(rec.body)
        out.setdefault(body["p"], []).append(body["i"])
    return out


# -- tests ------------------------------------------------------------------------------------------
def test_ordered_delivery_keeps_partition_order_and_commits(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    http.behaviours["/s"] = lambda _r, a: (200, {}, b"", 0.001 * (hash(_r.headers["ce-id"]) % 3))
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "ord", topic, [sub_doc("u1", http.url("/s"))])
    d = dispatch("ord", channels)
    ids = produce(kafka_running, topic, 300)
    wait_for(lambda: len(http.at("/s")) >= 300, 60, "300 deliveries")
    assert sorted(http.ids("/s")) == sorted(ids)
    for part, seq in seqs_by_partition(http.at("/s")).items():
        assert seq == sorted(seq), f"partition {part} out of order"
    assert http.max_active <= 3  # one in flight per partition
    wait_for(lambda: committed(kafka_running, topic, group_of("ord", "u1")) == [100, 100, 100], 15, "commit")
    status = d.subscriber_status()["u1"]
    assert status["ready"] == "True"
    assert status["observedGeneration"] == 1
    metrics = d.get("/metrics")
    assert 'eventing_kafka_consumed_msg_count_total{consumer="kafka.default.ord.u1",partition="0"' in metrics
    assert 'eventing_kafka_dispatch_attempts_total{channel="ord",code="200"' in metrics


def test_new_subscription_starts_at_latest_and_missing_topic_is_reported(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    produce(kafka_running, topic, 3, prefix="old")
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "latest", topic, [sub_doc("u1", http.url("/s"))])
    d = dispatch("latest", channels, initial_offset="latest")
    assert committed(kafka_running, topic, group_of("latest", "u1")) == [1, 1, 1]  # the start is pinned
    produce(kafka_running, topic, 3, prefix="new")
    wait_for(lambda: len(http.at("/s")) >= 3, 20, "new events")
    time.sleep(0.3)
    assert sorted(http.ids("/s")) == ["new-0", "new-1", "new-2"]

    write_channel(channels, "latest", "no.such.topic", [sub_doc("u1", http.url("/s"))])
    wait_for(lambda: "does not exist" in d.subscriber_status()["u1"].get("message", ""), 30, "not ready")
    assert d.subscriber_status()["u1"]["ready"] == "False"


@pytest.mark.parametrize("ordered", [True, False])
def test_partition_added_to_a_running_group_starts_at_earliest(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any, ordered: bool) -> None:
    # A group that starts at "latest": only the brand-new group may; a partition added later (the controller
    # grows numPartitions) has no committed offset, and what the receiver wrote to it before the dispatcher
    # noticed it must be delivered.
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "grow", topic, [sub_doc("u1", http.url("/g"))], ordered=ordered)
    d = dispatch("grow", channels, initial_offset="latest",
                 kafka_extra=KAFKA_EXTRA + ",topic.metadata.refresh.interval.ms=1000")
    wait_for(lambda: len(d.get("/status")["subscriptions"]["u1"]["partitions"]) == 3, 30, "three partitions")
    before = produce(kafka_running, topic, 3, prefix="before")
    wait_for(lambda: len(http.at("/g")) >= 3, 30, "events before the growth")
    admin = AdminClient(kafka_running.client_config())
    for fut in admin.create_partitions([NewPartitions(topic, 5)]).values():
        fut.result(timeout=30)
    producer = Producer(kafka_running.client_config())
    grown = []
    for part in (3, 4):
        event = CloudEvent({"id": f"grown-{part}", "source": "/test", "type": "test.event", "specversion": "1.0"},
                           b"{}")
        rec = event_to_kafka(event)
        producer.produce(topic, rec.value, rec.key, partition=part, headers=rec.headers)
        grown.append(f"grown-{part}")
    assert producer.flush(30) == 0
    wait_for(lambda: set(http.ids("/g")) >= set(before) | set(grown), 60, "events of the new partitions delivered")
    wait_for(lambda: committed(kafka_running, topic, group_of("grow", "u1"), 5)[3:] == [1, 1], 20, "commit")


def test_unordered_many_in_flight_commits_low_water_mark(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    # Every 7th event is slow: later offsets finish first, yet the commit may not pass the slow ones.
    http.behaviours["/u"] = lambda r, _a: (200, {}, b"", 0.3 if json.loads(r.body)["i"] % 7 == 0 else 0.02)
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "unord", topic, [sub_doc("u1", http.url("/u"))], ordered=False)
    dispatch("unord", channels, max_in_flight=32)
    ids = produce(kafka_running, topic, 240)
    wait_for(lambda: len(http.at("/u")) >= 240, 60, "240 deliveries")
    assert sorted(http.ids("/u")) == sorted(ids)
    assert http.max_active > 8, http.max_active
    wait_for(lambda: committed(kafka_running, topic, group_of("unord", "u1")) == [80, 80, 80], 15, "commit")


def test_unordered_window_behind_a_stuck_event_is_bounded(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    # The oldest event of partition 0 keeps failing (retried); behind it, at most `max_outstanding` events of
    # that partition start — a crash would redeliver only those — while the other partitions flow on.
    released = threading.Event()
    http.behaviours["/w"] = lambda r, _a: (
        503 if r.headers["ce-id"] == "e-0" and not released.is_set() else 200, {}, b"", 0.0)
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 10000, "backoffPolicy": "linear", "backoffDelay": "PT0.01S"}
    write_channel(channels, "window", topic, [sub_doc("u1", http.url("/w"), delivery=delivery)], ordered=False)
    d = dispatch("window", channels, max_in_flight=16, max_outstanding=20)
    ids = produce(kafka_running, topic, 600)  # 200 per partition, e-0 first on partition 0

    def delivered(part: int) -> set[str]:
        return {i for i in http.ids("/w") if int(i.split("-")[1]) % 3 == part}

    wait_for(lambda: len(delivered(1)) == 200 and len(delivered(2)) == 200, 60, "the other partitions delivered")
    wait_for(lambda: len(delivered(0)) >= 20, 30, "the window of partition 0 filled")
    time.sleep(1.0)  # the stuck event keeps being retried meanwhile
    assert len(delivered(0) - {"e-0"}) <= 20, len(delivered(0))
    assert d.get("/status")["subscriptions"]["u1"]["partitions"]["0"]["outstanding"] <= 20 + 512
    released.set()
    wait_for(lambda: set(http.ids("/w")) >= set(ids), 60, "everything after the release")
    wait_for(lambda: committed(kafka_running, topic, group_of("window", "u1")) == [200, 200, 200], 15, "commit")


def test_unordered_budget_is_shared_round_robin_across_partitions(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    # A backlog on every partition and a budget smaller than it: each freed slot goes to the next partition in
    # turn, so no partition waits (paused, its prefetch dropped) until another one is drained.
    http.behaviours["/rr"] = lambda _r, _a: (200, {}, b"", 0.02)
    produce(kafka_running, topic, 180)
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "rr", topic, [sub_doc("u1", http.url("/rr"))], ordered=False)
    dispatch("rr", channels, max_in_flight=6)
    wait_for(lambda: len(http.at("/rr")) >= 180, 60, "180 deliveries")
    first_half = seqs_by_partition(sorted(http.at("/rr"), key=lambda r: r.at)[:90])
    assert sorted(first_half) == [0, 1, 2]
    assert min(len(v) for v in first_half.values()) >= 20, {p: len(v) for p, v in first_half.items()}
    wait_for(lambda: committed(kafka_running, topic, group_of("rr", "u1")) == [60, 60, 60], 15, "commit")


@pytest.mark.parametrize(("policy", "expected"), [("linear", [0.2, 0.4, 0.6]),
                                                  ("exponential", [0.4, 0.8, 1.6])])
def test_retries_follow_backoff_policy(kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path,
                                       dispatch: Any, policy: str, expected: list[float]) -> None:
    http.behaviours["/r"] = lambda _r, a: (503 if a <= 3 else 200, {}, b"", 0.0)
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 3, "backoffPolicy": policy, "backoffDelay": "PT0.2S"}
    write_channel(channels, f"retry-{policy}", topic, [sub_doc("u1", http.url("/r"), delivery=delivery)])
    dispatch(f"retry-{policy}", channels)
    produce(kafka_running, topic, 1)
    wait_for(lambda: len(http.at("/r")) >= 4, 30, "4 attempts")
    time.sleep(0.3)
    times = [r.at for r in http.at("/r")]
    assert len(times) == 4  # 1 + 3 retries, the 4th succeeded: no more
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # No gap is shorter than the policy's delay (a slow host only lengthens them); up to half a second longer is
    # the host's. Still told apart: the other policy's third gap is 1.6 s (not <= 1.1) or 0.6 s (not >= 1.44).
    for gap, want in zip(gaps, expected, strict=True):
        assert want * 0.9 <= gap <= want + 0.5, (gaps, expected)


def test_per_attempt_timeout_cuts_a_hung_attempt_and_retries(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    http.behaviours["/hang"] = lambda _r, a: (200, {}, b"", 5.0 if a == 1 else 0.0)
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 2, "backoffPolicy": "linear", "backoffDelay": "PT0.05S", "timeout": "PT0.5S"}
    write_channel(channels, "timeout", topic, [sub_doc("u1", http.url("/hang"), delivery=delivery)])
    d = dispatch("timeout", channels)
    produce(kafka_running, topic, 1)
    wait_for(lambda: len(http.at("/hang")) >= 2, 20, "a second attempt")
    first, second = (r.at for r in http.at("/hang")[:2])
    assert 0.5 <= second - first <= 0.5 + 0.05 + 0.6, second - first  # the timeout + backoff, not the 5 s hang
    wait_for(lambda: committed(kafka_running, topic, group_of("timeout", "u1"))[0] == 1, 15, "commit")
    assert len(http.at("/hang")) == 2
    metrics = d.get("/metrics")
    assert 'eventing_kafka_dispatch_attempts_total{channel="timeout",code="none"' in metrics  # no response


@pytest.mark.parametrize(("status", "retry_after", "expected"), [(429, "1", 1.0), (503, "30", 1.5)])
def test_retry_after_is_honoured_up_to_the_maximum(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any,
        status: int, retry_after: str, expected: float) -> None:
    http.behaviours["/busy"] = lambda _r, a: (status if a == 1 else 200, {"Retry-After": retry_after}, b"", 0.0)
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 3, "backoffPolicy": "linear", "backoffDelay": "PT0.01S"}
    write_channel(channels, f"busy{status}", topic, [sub_doc("u1", http.url("/busy"), delivery=delivery)])
    dispatch(f"busy{status}", channels, retry_after_max_seconds=1.5)
    produce(kafka_running, topic, 1)
    wait_for(lambda: len(http.at("/busy")) >= 2, 20, "the retry")
    first, second = (r.at for r in http.at("/busy")[:2])
    # Retry-After instead of the 10 ms backoff; 30 s is capped at the dispatcher's maximum (1.5 s).
    assert expected * 0.95 <= second - first <= expected + 0.5, second - first


def test_exhausted_event_goes_to_dead_letter_sink_with_extensions(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    http.behaviours["/fail"] = lambda _r, _a: (500, {}, b"boom", 0.0)
    http.behaviours["/bad"] = lambda _r, _a: (400, {}, b"bad request", 0.0)
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 2, "backoffDelay": "PT0.02S", "deadLetterSink": {"uri": http.url("/dls")}}
    write_channel(channels, "dlq", topic, [sub_doc("u1", http.url("/fail")), sub_doc("u2", http.url("/bad"))],
                  delivery=delivery)
    dispatch("dlq", channels)
    produce(kafka_running, topic, 1)
    wait_for(lambda: len(http.at("/dls")) >= 2, 20, "two dead letters")
    assert len(http.at("/fail")) == 3  # 1 + 2 retries
    assert len(http.at("/bad")) == 1  # 400 is final
    by_dest = {r.headers["ce-knativeerrordest"]: r for r in http.at("/dls")}
    fail = by_dest[http.url("/fail")]
    assert fail.headers["ce-knativeerrorcode"] == "500"
    assert base64.b64decode(fail.headers["ce-knativeerrordata"]) == b"boom"
    assert fail.headers["ce-id"] == "e-0"
    assert json.loads(fail.body) == {"i": 0, "p": 0}
    assert by_dest[http.url("/bad")].headers["ce-knativeerrorcode"] == "400"
    wait_for(lambda: committed(kafka_running, topic, group_of("dlq", "u1"))[0] == 1, 15, "commit after DLS")


def test_unresolvable_dead_letter_sink_ref_is_reported_and_nothing_is_dropped(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    # A subscriber's deadLetterSink.ref that the data plane cannot resolve (an Addressable whose address only
    # the controller can read) must not mean "no sink": failed events would be dropped and committed.
    http.behaviours["/fail"] = lambda _r, _a: (400, {}, b"no", 0.0)
    channels = tmp_path / "channels.yaml"
    ref = {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "dls"}
    broken = {"retry": 0, "deadLetterSink": {"ref": ref}}
    write_channel(channels, "dlsref", topic, [sub_doc("u1", http.url("/fail"), delivery=broken)])
    d = dispatch("dlsref", channels)
    status = d.subscriber_status()["u1"]
    assert status["ready"] == "False"
    assert "deadLetterSink" in status["message"] and "serving.knative.dev/v1" in status["message"], status
    produce(kafka_running, topic, 3)
    time.sleep(1.5)  # longer than auto.commit.interval.ms: nothing may have been consumed and committed
    assert http.at("/fail") == []
    assert committed(kafka_running, topic, group_of("dlsref", "u1")) == [-1001, -1001, -1001]

    fixed = {"retry": 0, "deadLetterSink": {"uri": http.url("/dls")}}
    write_channel(channels, "dlsref", topic, [sub_doc("u1", http.url("/fail"), generation=2, delivery=fixed)])
    wait_for(lambda: len(http.at("/dls")) >= 3, 30, "the held events dead-lettered once the sink resolves")
    assert d.subscriber_status()["u1"]["ready"] == "True"


@pytest.mark.parametrize("delivered_before", [0, 1], ids=["alone", "after-a-delivered-event"])
def test_always_failing_event_is_dead_lettered_after_exactly_its_retries_across_rebalances(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any,
        delivered_before: int) -> None:
    # Upstream users saw an event retried 184 times and never dead-lettered: each revoke reset its count. Here
    # the member delivering it is replaced twice mid-retry (each a revoke and a new assignment). With an event
    # delivered before it, the mark has been stored (auto-commit), and librdkafka commits the stored offset again
    # after the revoke callback: that commit must carry the attempt counts too.
    poison = f"e-{delivered_before}"
    http.behaviours["/fail"] = lambda r, _a: (500, {}, b"always", 0.0) if r.headers["ce-id"] == poison \
        else (200, {}, b"", 0.0)
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 5, "backoffPolicy": "linear", "backoffDelay": "PT0.5S",
                "deadLetterSink": {"uri": http.url("/dls")}}
    write_channel(channels, "count", topic, [sub_doc("u1", http.url("/fail"), delivery=delivery)])
    member = dispatch("count", channels)
    produce(kafka_running, topic, delivered_before + 1, partitions=1)
    for seen in (2, 4):
        wait_for(lambda n=seen: http.attempts.get(("/fail", poison), 0) >= n, 30, f"{seen} attempts")
        member.stop()  # mid-retry: the partition is revoked
        member = dispatch("count", channels)
    wait_for(lambda: http.at("/dls"), 60, "the dead letter")
    time.sleep(1.0)
    tried = [r.at for r in http.at("/fail") if r.headers["ce-id"] == poison]
    assert len(tried) == 1 + 5, tried
    assert [r.headers["ce-id"] for r in http.at("/dls")] == [poison]
    wait_for(lambda: committed(kafka_running, topic, group_of("count", "u1"))[0] == delivered_before + 1, 15,
             "commit")


def test_dead_letter_sink_down_blocks_commit(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    sink_up = threading.Event()
    http.behaviours["/fail"] = lambda _r, _a: (400, {}, b"no", 0.0)
    http.behaviours["/dls"] = lambda _r, _a: (200 if sink_up.is_set() else 503, {}, b"", 0.0)
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 0, "backoffDelay": "PT0.05S", "deadLetterSink": {"uri": http.url("/dls")}}
    write_channel(channels, "dlsdown", topic, [sub_doc("u1", http.url("/fail"))], delivery=delivery)
    dispatch("dlsdown", channels)
    produce(kafka_running, topic, 6)  # two per partition
    wait_for(lambda: len(http.at("/dls")) >= 12, 20, "sink retried")
    # Ordered: the first event of each partition is stuck on the sink; the commit stays at the start.
    time.sleep(1.2)  # longer than auto.commit.interval.ms
    assert committed(kafka_running, topic, group_of("dlsdown", "u1")) == [0, 0, 0]
    assert len(http.at("/fail")) == 3
    sink_up.set()
    wait_for(lambda: committed(kafka_running, topic, group_of("dlsdown", "u1")) == [2, 2, 2], 20, "commit")
    accepted = {r.headers["ce-id"] for r in http.at("/dls")}
    assert accepted == {f"e-{i}" for i in range(6)}


def test_reply_is_forwarded_to_reply_uri(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    reply = {"ce-id": "reply-1", "ce-source": "/replier", "ce-type": "test.reply", "ce-specversion": "1.0",
             "Content-Type": "text/plain"}
    http.behaviours["/s"] = lambda r, _a: (
        200, {**reply, "ce-id": "reply-" + r.headers["ce-id"]}, b"pong", 0.0)
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "reply", topic, [sub_doc("u1", http.url("/s"), replyUri=http.url("/reply"))])
    dispatch("reply", channels)
    produce(kafka_running, topic, 2)
    wait_for(lambda: len(http.at("/reply")) >= 2, 20, "replies")
    got = http.at("/reply")
    assert {r.headers["ce-id"] for r in got} == {"reply-e-0", "reply-e-1"}
    assert all(r.body == b"pong" and r.headers["ce-type"] == "test.reply" for r in got)
    assert all(r.headers.get("Prefer") == "reply" for r in http.at("/s"))


def test_large_reply_is_forwarded_whole_and_an_oversized_one_is_an_error(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    from kafka_eventing.core.http_delivery import MAX_REPLY_BYTES

    sizes = {"e-0": 256 * 1024, "e-1": MAX_REPLY_BYTES + 1}
    reply = {"ce-source": "/replier", "ce-type": "test.reply", "ce-specversion": "1.0",
             "Content-Type": "application/octet-stream"}

    def answer(r: Received, _a: int) -> tuple[int, dict[str, str], bytes, float]:
        event_id = r.headers["ce-id"]
        return 200, {**reply, "ce-id": "reply-" + event_id}, bytes(range(256)) * (sizes[event_id] // 256 + 1), 0.0

    http.behaviours["/s"] = answer
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 0, "deadLetterSink": {"uri": http.url("/dls")}}
    write_channel(channels, "bigreply", topic,
                  [sub_doc("u1", http.url("/s"), replyUri=http.url("/reply"), delivery=delivery)])
    d = dispatch("bigreply", channels)
    produce(kafka_running, topic, 2)
    wait_for(lambda: http.at("/reply") and http.at("/dls"), 30, "a reply and a dead letter")
    [forwarded] = http.at("/reply")
    assert forwarded.headers["ce-id"] == "reply-e-0"
    assert forwarded.body == (bytes(range(256)) * (sizes["e-0"] // 256 + 1))  # whole, not the first chunk
    # Over the limit: not forwarded truncated; the original goes to the dead-letter sink, counted.
    [dead] = http.at("/dls")
    assert dead.headers["ce-id"] == "e-1"
    assert dead.headers["ce-knativeerrordest"] == http.url("/reply")
    assert 'reason="reply_too_large"' in d.get("/metrics")
    wait_for(lambda: committed(kafka_running, topic, group_of("bigreply", "u1"))[:2] == [1, 1], 15, "commit")


def test_rate_limit_spaces_deliveries(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "rate", topic, [sub_doc("u1", http.url("/s"), rateLimit=20)], ordered=False)
    dispatch("rate", channels)
    produced = time.monotonic()  # no event can be delivered before it was produced
    produce(kafka_running, topic, 80)
    wait_for(lambda: len(http.at("/s")) >= 80, 60, "80 deliveries")
    times = sorted(r.at - produced for r in http.at("/s"))
    # A burst of 20 (one second's worth), then one token every 1/20 s: the dispatcher starts the n-th event (from 1)
    # no sooner than (n - 20) / 20 s after its first, which is after ``produced``; each arrives later still. The bound
    # is measured from a moment before any event existed, so a slow host (a late first arrival) only adds to the
    # spans and never breaks it; without the limit all 80 would arrive within a fraction of a second, not 3 s.
    late = [(n, round(at, 3)) for n, at in enumerate(times, 1) if at < (n - 20) / 20]
    assert not late, f"arrivals (n, s after producing) ahead of 20/s: {late[:5]}; last at {times[-1]:.2f} s"


def test_subscribers_added_changed_and_removed_at_runtime(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "live", topic, [sub_doc("a", http.url("/a"))])
    d = dispatch("live", channels)
    produce(kafka_running, topic, 3, prefix="one")
    wait_for(lambda: len(http.at("/a")) >= 3, 20, "a gets the first events")

    write_channel(channels, "live", topic, [sub_doc("a", http.url("/a")), sub_doc("b", http.url("/b"))])
    wait_for(lambda: d.subscriber_status().get("b", {}).get("ready") == "True", 30, "b joined")
    produce(kafka_running, topic, 3, prefix="two")
    wait_for(lambda: len(http.at("/b")) >= 6 and len(http.at("/a")) >= 6, 20, "both get the second events")
    assert sorted(http.ids("/b")) == sorted(f"{p}-{i}" for p in ("one", "two") for i in range(3))

    # Change a's URI live (no restart: nothing redelivered), remove b.
    write_channel(channels, "live", topic, [sub_doc("a", http.url("/a2"), generation=2)])
    wait_for(lambda: "b" not in d.subscriber_status(), 20, "b removed")
    assert d.subscriber_status()["a"]["observedGeneration"] == 2
    produce(kafka_running, topic, 3, prefix="three")
    wait_for(lambda: len(http.at("/a2")) >= 3, 20, "a's new URI used")
    time.sleep(0.3)
    assert sorted(http.ids("/a2")) == ["three-0", "three-1", "three-2"]
    assert len(http.at("/b")) == 6
    assert len(http.at("/a")) == 6


def test_failing_subscriber_does_not_slow_another(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    # The bad subscriber holds every attempt unanswered until the test ends, so none of them ends while the good one
    # is served: a good subscription held up by the bad one's deliveries (a shared loop, a shared in-flight budget)
    # would get nothing. Served alone it takes a second or two; the wait allows a loaded host many times that.
    http.behaviours["/bad"] = lambda _r, _a: (503, {}, b"", math.inf)
    count = 600
    channels = tmp_path / "channels.yaml"
    delivery = {"retry": 5, "backoffDelay": "PT0.1S"}
    write_channel(channels, "iso", topic, [sub_doc("good", http.url("/good")),
                                           sub_doc("bad", http.url("/bad"), delivery=delivery)], ordered=False)
    d = dispatch("iso", channels)
    for name in ("good", "bad"):
        wait_for(lambda n=name: d.subscriber_status().get(n, {}).get("ready") == "True", 30, f"{name} joined")
    produce(kafka_running, topic, count, prefix="iso")
    wait_for(lambda: http.at("/bad"), 30, "the bad subscriber's first attempt")
    wait_for(lambda: len(http.at("/good")) >= count, 60, f"{count} events at the good subscriber")
    assert sorted(http.ids("/good")) == sorted(f"iso-{n}" for n in range(count))
    assert http.active > 0, "the bad subscriber's attempts were meant to be still hanging"


#: How late the coordinator answers the slow subscription's ``committed()``.
STALL = 8.0


class SlowCoordinatorConsumer(Consumer):  # type: ignore[misc]
    """The real consumer, with the group coordinator answering ``committed()`` STALL s late (a loaded broker);
    ``stalls`` gets each wait as [began, ended], ended infinite while it lasts."""

    stalls: list[list[float]]

    def committed(self, *args: Any, **kwargs: Any) -> Any:
        stall = [time.monotonic(), math.inf]
        self.stalls.append(stall)
        time.sleep(STALL)
        stall[1] = time.monotonic()
        return super().committed(*args, **kwargs)


def test_a_slow_rebalance_stalls_neither_probes_nor_other_subscriptions(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, dispatch: Any) -> None:
    stalls: list[list[float]] = []

    def factory(config: dict[str, Any]) -> Any:
        if not str(config["group.id"]).endswith(".slow"):
            return Consumer(config)
        slow = SlowCoordinatorConsumer(config)
        slow.stalls = stalls
        return slow

    channels = tmp_path / "channels.yaml"
    write_channel(channels, "stall", topic, [sub_doc("fast", http.url("/fast"))], ordered=False)
    d = dispatch("stall", channels, consumer_factory=factory)
    ids = produce(kafka_running, topic, 30, prefix="warm")
    wait_for(lambda: set(http.ids("/fast")) >= set(ids), 30, "fast delivers")

    # A second subscription joins: its assignment callback waits on the coordinator. Whatever the test checks, it
    # checks while that wait lasts (not for a fixed time after the subscription appeared, when the wait may not
    # have begun yet or be over).
    write_channel(channels, "stall", topic, [sub_doc("fast", http.url("/fast")), sub_doc("slow", http.url("/slow"))],
                  ordered=False)
    wait_for(lambda: stalls, 60, "the slow subscription's assignment waiting on the coordinator")
    during = produce(kafka_running, topic, 30, prefix="during")
    latencies = []
    while stalls[0][1] == math.inf:
        started = time.monotonic()
        assert d.get("/healthz") == {"status": "alive"}
        latencies.append(time.monotonic() - started)
        time.sleep(0.05)
    # A probe or a delivery that waited on the stall would take most of its STALL s.
    assert latencies and max(latencies) < 2.0, (len(latencies), max(latencies, default=None))
    wait_for(lambda: set(http.ids("/fast")) >= set(during), 30, "fast went on delivering")
    arrived = max(r.at for r in http.at("/fast") if r.headers.get("ce-id") in set(during))
    assert arrived < stalls[0][1], f"fast's events came {arrived - stalls[0][1]:.2f} s after the stall ended"
    wait_for(lambda: d.subscriber_status()["slow"]["ready"] == "True", 30, "slow joined in the end")


# -- as separate processes (the real entry point) ---------------------------------------------------
class DispatcherProcess:
    def __init__(self, kafka: KafkaNode, name: str, channels: Path, logdir: Path) -> None:
        self.port = free_port()
        self.log = logdir / f"dispatcher-{self.port}.log"
        env = {**os.environ, "KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels),
               "KE_CHANNEL_NAMESPACE": NS, "KE_CHANNEL_NAME": name, "KE_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
               "KE_KAFKA_EXTRA": KAFKA_EXTRA + ",auto.offset.reset=earliest", "KE_METRICS_PORT": str(self.port),
               "KE_LOG_FORMAT": "console", "KE_LOG_LEVEL": "INFO"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
            body = resp.read()
            return json.loads(body) if path != "/metrics" else body.decode()

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            self.get("/readyz")
            return True
        except OSError:
            return False

    def partitions(self, uid: str) -> set[int]:
        subs = self.get("/status")["subscriptions"]
        return {int(p) for p in subs[uid]["partitions"]} if uid in subs else set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def processes(kafka_running: KafkaNode, tmp_path: Path) -> Iterator[Callable[[str, Path], DispatcherProcess]]:
    started: list[DispatcherProcess] = []

    def make(name: str, channels: Path) -> DispatcherProcess:
        proc = DispatcherProcess(kafka_running, name, channels, tmp_path)
        started.append(proc)
        wait_for(proc.ready, 60, "dispatcher process ready")
        return proc

    try:
        yield make
    finally:
        for proc in started:
            proc.stop()


def test_two_dispatcher_processes_share_the_partitions(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, processes: Any) -> None:
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "shared", topic, [sub_doc("u1", http.url("/s"))])
    one = processes("shared", channels)
    two = processes("shared", channels)

    def split() -> bool:
        a, b = one.partitions("u1"), two.partitions("u1")
        return bool(a) and bool(b) and not a & b and a | b == {0, 1, 2}

    wait_for(split, 30, "partitions split between the two processes")
    ids = produce(kafka_running, topic, 60)
    wait_for(lambda: set(http.ids("/s")) >= set(ids), 30, "all delivered")
    for proc in (one, two):
        metrics = proc.get("/metrics")
        assert 'eventing_kafka_consumed_msg_count_total{consumer="kafka.default.shared.u1"' in metrics
        assert_promtool_passes(metrics, f"dispatcher process {proc.port}'s /metrics")


def test_sigkill_mid_stream_then_restart_delivers_everything(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path, processes: Any) -> None:
    http.behaviours["/s"] = lambda _r, _a: (200, {}, b"", 0.03)
    channels = tmp_path / "channels.yaml"
    write_channel(channels, "crash", topic, [sub_doc("u1", http.url("/s"))])
    first = processes("crash", channels)
    ids = produce(kafka_running, topic, 300)
    wait_for(lambda: len(http.at("/s")) >= 120, 30, "120 deliveries before the crash")
    first.kill()
    before = seqs_by_partition(http.at("/s"))
    processes("crash", channels)
    wait_for(lambda: set(http.ids("/s")) >= set(ids), 60, "every event delivered after the restart")
    after = seqs_by_partition(http.at("/s"))
    for part, seq in after.items():
        seen: set[int] = set()
        dups = [i for i in seq if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
        pre = before.get(part, [])
        # Redelivered: only a suffix of what was delivered before the crash (not yet committed: commit
        # interval 1 s at ~33 events/s per partition, plus the one in flight).
        assert dups == pre[len(pre) - len(dups):], (part, dups, pre[-5:])
        assert len(dups) <= 45, (part, len(dups))
