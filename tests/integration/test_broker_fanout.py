"""A Broker's fan-out dispatch on the real Kafka broker: one shared read, each Trigger's progress in its own group.

Standalone mode (a Broker and its Triggers from a YAML file, as ``kafka-eventing run --broker`` writes) with real
HTTP subscribers on 127.0.0.1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from support.broker_dispatch import BROKER, NS, ends, trigger, write_broker
from support.dispatcher import InProcess, Subscriber, committed, produce

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.brokers import reader_group
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

pytestmark = pytest.mark.kafka









def group_offsets(kafka: KafkaNode, group: str) -> dict[int, int]:
    admin = AdminClient(kafka.client_config())
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    return {tp.partition: tp.offset for tp in result.topic_partitions or []}


def groups(kafka: KafkaNode) -> set[str]:
    admin = AdminClient(kafka.client_config())
    return {g.group_id for g in admin.list_consumer_groups().result(10).valid}




def test_each_trigger_commits_to_its_own_group_from_one_shared_read(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path,
        broker_dispatch: Callable[..., InProcess]) -> None:
    path = tmp_path / "broker.yaml"
    write_broker(path, topic, [
        trigger("all", http.url("/all")),
        trigger("even", http.url("/even"), filters=[{"suffix": {"id": "0"}}, {"exact": {"type": "test.event"}}]),
        trigger("none", http.url("/none"), filters=[{"exact": {"type": "other"}}]),
    ])
    running = broker_dispatch(path)
    sent = produce(kafka_running, topic, 60)
    wait_for(lambda: len(set(http.ids("/all"))) == 60, 30, "every event at the unfiltered Trigger")
    wait_for(lambda: len(set(http.ids("/even"))) == 6, 30, "the filtered Trigger's events")
    assert sorted(http.ids("/all")) == sorted(sent)
    assert sorted(http.ids("/even")) == sorted(i for i in sent if i.endswith("0"))
    assert http.ids("/none") == []
    end = ends(kafka_running, topic)
    for name in ("all", "even", "none"):
        group = kb.trigger_group(NS, name)
        # A Trigger whose filter rejects everything still moves its offsets: its lag is 0, not the whole topic.
        wait_for(lambda g=group: committed(kafka_running, topic, g) == end, 15, f"{group} committed to the end")
    # The shared reader's group spreads the partitions and holds no offsets; the Triggers' groups have no members.
    assert group_offsets(kafka_running, reader_group(NS, BROKER)) == {}
    stats = running.get("/status")["subscriptions"]
    assert set(stats) == {"all", "even", "none"} and not any(s["behind"] for s in stats.values())


def test_a_failing_trigger_holds_the_others_back_at_most_the_window_then_catches_up(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path,
        broker_dispatch: Callable[..., InProcess]) -> None:
    failing = {"on": True}
    http.behaviours["/slow"] = lambda _r, _a: (503 if failing["on"] else 200, {}, b"", 0.0)
    path = tmp_path / "broker.yaml"
    write_broker(path, topic, [
        trigger("slow", http.url("/slow"), ordered=True,
                delivery={"retry": 1000, "backoffPolicy": "linear", "backoffDelay": "PT0.2S"}),
        trigger("fast", http.url("/fast")),
    ])
    # A small budget (32 KiB per Trigger): the failing ordered Trigger fills its queues with a few dozen events.
    running = broker_dispatch(path, window=1.0, queued_max_messages_kbytes=128)
    started = time.monotonic()
    sent = produce(kafka_running, topic, 600, data=b"x" * 1024)
    wait_for(lambda: len(set(http.ids("/fast"))) == 600, 30, "the healthy Trigger gets everything")
    took = time.monotonic() - started
    assert took < 20, took
    assert running.get("/status")["subscriptions"]["slow"]["behind"]
    assert 'eventing_kafka_trigger_fell_behind_total{channel="b",namespace="default",subscriber="slow"} 1.0' \
        in running.get("/metrics")
    end = ends(kafka_running, topic)
    wait_for(lambda: committed(kafka_running, topic, kb.trigger_group(NS, "fast")) == end, 15, "fast committed")
    slow_group = kb.trigger_group(NS, "slow")
    assert all(c < e for c, e in zip(committed(kafka_running, topic, slow_group), end, strict=True))
    failing["on"] = False
    wait_for(lambda: set(http.ids("/slow")) == set(sent), 60, "the failing Trigger catches up on its own")
    wait_for(lambda: committed(kafka_running, topic, slow_group) == end, 15, "slow committed")
    wait_for(lambda: not running.get("/status")["subscriptions"]["slow"]["behind"], 15, "slow rejoined")
    after = produce(kafka_running, topic, 30, prefix="after")
    wait_for(lambda: set(after) <= set(http.ids("/slow")) and set(after) <= set(http.ids("/fast")), 30,
             "both Triggers on the shared read again")
    assert len(http.ids("/fast")) == 630  # nothing delivered twice to the healthy Trigger


def test_trigger_added_later_starts_at_latest_and_a_deleted_triggers_group_goes(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path,
        broker_dispatch: Callable[..., InProcess]) -> None:
    path = tmp_path / "broker.yaml"
    first = trigger("first", http.url("/first"))
    write_broker(path, topic, [first])
    running = broker_dispatch(path)
    before = produce(kafka_running, topic, 30, prefix="before")
    wait_for(lambda: len(http.ids("/first")) == 30, 30, "first Trigger's events")
    write_broker(path, topic, [first, trigger("later", http.url("/later"))])
    wait_for(lambda: running.subscriber_status().get("later", {}).get("ready") == "True", 20, "later placed")
    after = produce(kafka_running, topic, 30, prefix="after")
    wait_for(lambda: len(http.ids("/later")) == 30, 30, "the later Trigger's events")
    assert sorted(http.ids("/later")) == sorted(after)
    assert not set(before) & set(http.ids("/later"))
    later_group = kb.trigger_group(NS, "later")
    end = ends(kafka_running, topic)
    wait_for(lambda: committed(kafka_running, topic, later_group) == end, 15, "later committed")
    write_broker(path, topic, [first])  # the Trigger is deleted
    wait_for(lambda: later_group not in groups(kafka_running), 20, "the deleted Trigger's group removed")
    assert kb.trigger_group(NS, "first") in groups(kafka_running)
    time.sleep(2)  # two commit intervals: nothing brings the group back
    assert later_group not in groups(kafka_running)


def test_restart_replays_only_what_each_trigger_had_not_committed_and_ordered_keeps_order(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path,
        broker_dispatch: Callable[..., InProcess]) -> None:
    path = tmp_path / "broker.yaml"
    write_broker(path, topic, [trigger("ord", http.url("/ord"), ordered=True), trigger("un", http.url("/un"))])
    running = broker_dispatch(path)
    first = produce(kafka_running, topic, 60)
    wait_for(lambda: len(http.ids("/ord")) == 60 and len(http.ids("/un")) == 60, 30, "first batch delivered")
    running.stop()  # commits what is done
    end = ends(kafka_running, topic)
    for name in ("ord", "un"):
        assert committed(kafka_running, topic, kb.trigger_group(NS, name)) == end
    second = produce(kafka_running, topic, 60, prefix="second")  # sent while the dispatcher is down
    broker_dispatch(path)
    wait_for(lambda: len(http.ids("/ord")) == 120 and len(http.ids("/un")) == 120, 30, "second batch delivered")
    time.sleep(1)
    assert sorted(http.ids("/ord")) == sorted(first + second)  # nothing lost, nothing replayed
    assert sorted(http.ids("/un")) == sorted(first + second)
    by_partition: dict[int, list[int]] = {}
    for rec in http.at("/ord"):
        if rec.headers.get("ce-id", "").startswith("second"):
            body = json.loads(rec.body)
            by_partition.setdefault(body["p"], []).append(body["i"])
    assert by_partition and all(seq == sorted(seq) for seq in by_partition.values()), by_partition

