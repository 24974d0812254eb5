"""`kafka-eventing offsets show|reset` and the group offsets it shares with the dispatcher's reset
(core/group_offsets.py), on real Kafka: the table, the refusal while the group has members, the question, the
one-request move, a time between batches and one older than what retention kept, and a Trigger's group, which has
no members while its Broker's dispatcher commits it (a real Broker dispatcher, real HTTP subscriber)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.broker_dispatch import BROKER, NS, ends, trigger, write_broker
from support.dispatcher import InProcess, Subscriber, committed, produce

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.group_offsets import GroupOffsets
from kafka_eventing.core.offsets_cli import main, parser, run
from kafka_eventing.core.settings import Settings
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import NotYet, wait_for

pytestmark = [pytest.mark.kafka]

GROUP = "offsets-cli"


def commit(kafka: KafkaNode, topic: str, group: str, offsets: list[int]) -> None:
    consumer = Consumer({**kafka.client_config(), "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in enumerate(offsets)], asynchronous=False)
    finally:
        consumer.close()


@pytest.fixture
def loaded(kafka_running: KafkaNode, topic: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KafkaNode, str]]:
    monkeypatch.setenv("KE_BOOTSTRAP_SERVERS", kafka_running.bootstrap_servers)
    produce(kafka_running, topic, 30)  # 10 per partition
    commit(kafka_running, topic, GROUP, [8, 9, 10])
    return kafka_running, topic


def test_show_prints_committed_high_and_lag(loaded: tuple[KafkaNode, str], capsys: Any) -> None:
    _kafka, topic = loaded
    assert main(["show", "--group", GROUP, "--topic", topic]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["partition", "committed", "high", "lag"]
    assert [line.split() for line in out[2:5]] == [["0", "8", "10", "2"], ["1", "9", "10", "1"], ["2", "10", "10", "0"]]
    assert out[5] == "members: 0 (empty)"


def test_reset_asks_and_a_no_moves_nothing(loaded: tuple[KafkaNode, str], capsys: Any) -> None:
    kafka, topic = loaded
    args = parser().parse_args(["reset", "--group", GROUP, "--topic", topic, "--to", "earliest"])
    offsets = GroupOffsets(kafka.client_config())
    asked: list[str] = []

    def no(question: str) -> str:
        asked.append(question)
        return "n"

    assert run(args, offsets, Settings(), ask=no) == 1
    assert asked == [f"move group {GROUP} to earliest? [y/N] "]
    out = capsys.readouterr().out
    assert "partition  committed  new  high  lag" in out and "nothing moved" in out
    assert committed(kafka, topic, GROUP) == [8, 9, 10]
    assert run(args, offsets, Settings(), ask=lambda q: "y") == 0
    assert committed(kafka, topic, GROUP) == [0, 0, 0]


def test_reset_refuses_a_group_with_members(loaded: tuple[KafkaNode, str], capsys: Any) -> None:
    kafka, topic = loaded
    member = Consumer({**kafka.client_config(), "group.id": GROUP, "enable.auto.commit": False})
    member.subscribe([topic])
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            member.poll(0.1)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        def joined() -> object:
            members = GroupOffsets(kafka.client_config()).members(GROUP)
            if members.empty:
                raise NotYet(members)
            return members

        wait_for(joined, 60, f"a member in {GROUP}")
        assert main(["reset", "--group", GROUP, "--topic", topic, "--to", "latest", "--yes"]) == 3
        assert "refused: the group has 1 active member" in capsys.readouterr().out
    finally:
        stop.set()
        thread.join(10)
        member.close()
    assert committed(kafka, topic, GROUP) == [8, 9, 10]
    # Once it has left, the same command moves every partition (in one request) to the high watermark.
    assert main(["reset", "--group", GROUP, "--topic", topic, "--to", "latest", "--yes", "--wait", "15"]) == 0
    assert committed(kafka, topic, GROUP) == [10, 10, 10]


def test_reset_to_a_time_and_to_one_older_than_retention(loaded: tuple[KafkaNode, str], capsys: Any) -> None:
    kafka, topic = loaded
    time.sleep(0.2)
    point = time.time()
    time.sleep(0.2)
    produce(kafka, topic, 15, prefix="later")  # offsets 10..14 on every partition
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(point)) + f".{int(point * 1000) % 1000:03d}Z"
    assert main(["reset", "--group", GROUP, "--topic", topic, "--to", when, "--yes"]) == 0
    assert committed(kafka, topic, GROUP) == [10, 10, 10]
    admin = AdminClient(kafka.client_config())
    for future in admin.delete_records([TopicPartition(topic, p, 3) for p in range(3)]).values():
        future.result(30)
    capsys.readouterr()
    assert main(["reset", "--group", GROUP, "--topic", topic, "--to", "2001-01-01T00:00:00Z", "--yes"]) == 0
    out = capsys.readouterr().out
    assert committed(kafka, topic, GROUP) == [3, 3, 3]
    assert "3 *" in out and "older than the oldest record kept (retention)" in out


def test_bad_time_and_unknown_group(loaded: tuple[KafkaNode, str], capsys: Any) -> None:
    _kafka, topic = loaded
    assert main(["reset", "--group", GROUP, "--topic", topic, "--to", "noon", "--yes"]) == 2
    assert "is not RFC 3339" in capsys.readouterr().err
    assert main(["reset", "--group", "never-used", "--topic", topic, "--to", "earliest", "--yes"]) == 1
    assert "has no committed offsets" in capsys.readouterr().out


def test_a_group_over_two_topics_is_shown_and_moved_in_one_commit(loaded: tuple[KafkaNode, str],
                                                                   capsys: Any) -> None:
    """A KafkaSource's group reads several topics: every partition of each is moved by the one command."""
    from confluent_kafka.admin import NewTopic

    kafka, topic = loaded
    second = f"{topic}.two"
    admin = AdminClient(kafka.client_config())
    for future in admin.create_topics([NewTopic(second, num_partitions=3, replication_factor=1)]).values():
        future.result(30)
    try:
        produce(kafka, second, 30)
        commit(kafka, second, GROUP, [5, 6, 7])
        args = ["--group", GROUP, "--topic", topic, "--topic", second]
        assert main(["show", *args]) == 0
        shown = capsys.readouterr().out
        assert f"group {GROUP}, topic {topic}" in shown and f"group {GROUP}, topic {second}" in shown
        assert main(["reset", *args, "--to", "earliest", "--yes"]) == 0
        assert "moved 6 of 6 partitions" in capsys.readouterr().out
        assert committed(kafka, topic, GROUP) == [0, 0, 0] and committed(kafka, second, GROUP) == [0, 0, 0]
    finally:
        for future in admin.delete_topics([second], operation_timeout=10).values():
            try:
                future.result(30)
            except Exception:
                pass


def rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"


def test_a_trigger_is_not_reset_under_its_running_broker_dispatcher_and_is_once_it_stops(
        kafka_running: KafkaNode, topic: str, http: Subscriber, tmp_path: Path,
        broker_dispatch: Callable[..., InProcess], monkeypatch: pytest.MonkeyPatch,
        capsys: Any) -> None:
    """The Trigger's group has no members (the Broker's dispatcher commits it from its shared read), so Kafka
    would take the commit and the dispatcher would commit over it with the next events: the reset is refused while
    the dispatcher runs, under live traffic, and nothing moves or is redelivered. Once the dispatcher has stopped
    the same command moves the group, and the restarted dispatcher redelivers exactly what came after the time."""
    monkeypatch.setenv("KE_BOOTSTRAP_SERVERS", kafka_running.bootstrap_servers)
    path = tmp_path / "broker.yaml"
    write_broker(path, topic, [trigger("t", http.url("/t"))])
    running = broker_dispatch(path)
    group = kb.trigger_group(NS, "t")
    first = produce(kafka_running, topic, 30, prefix="first")  # offsets 0..9 on every partition
    time.sleep(0.2)
    point = time.time()
    time.sleep(0.2)
    second = produce(kafka_running, topic, 30, prefix="second")  # 10..19
    wait_for(lambda: Counter(http.ids("/t")) == Counter(first + second), 30, "both batches delivered")
    wait_for(lambda: committed(kafka_running, topic, group) == [20, 20, 20], 15, "the Trigger committed")
    args = ["reset", "--trigger", f"{NS}/t", "--broker", BROKER, "--topic", topic, "--to", rfc3339(point), "--yes"]

    live: list[str] = []

    def traffic() -> None:
        for i in range(10):
            live.extend(produce(kafka_running, topic, 3, prefix=f"live{i}"))
            time.sleep(0.1)

    producer = threading.Thread(target=traffic)
    producer.start()
    try:
        code = main(args)
    finally:
        producer.join(30)
    out = capsys.readouterr().out
    wait_for(lambda: Counter(http.ids("/t")) == Counter(first + second + live), 30, "the live events delivered")
    wait_for(lambda: committed(kafka_running, topic, group) == ends(kafka_running, topic), 15, "live committed")
    time.sleep(2.5)  # two commit intervals of the dispatcher
    after = committed(kafka_running, topic, group)
    assert code == 3, f"exit {code}, the CLI said {out!r}, yet the group is at {after}: the reset was undone"
    assert f"refused: the dispatcher of Broker {NS}/{BROKER} is running" in out and "ResetOffset" in out
    assert after == [30, 30, 30]
    assert Counter(http.ids("/t")) == Counter(first + second + live)  # nothing redelivered

    # A Trigger's group named by --group alone is refused: its Broker's dispatcher could not be checked.
    assert main(["reset", "--group", group, "--topic", topic, "--to", "earliest", "--yes"]) == 2
    assert "name it with --trigger NS/NAME --broker NAME" in capsys.readouterr().err

    running.stop()  # the dispatcher scaled down: --wait sees its shared read leave
    assert main([*args, "--wait", "20"]) == 0
    assert "moved 3 of 3 partitions" in capsys.readouterr().out
    assert committed(kafka_running, topic, group) == [10, 10, 10]
    stopped = produce(kafka_running, topic, 6, prefix="stopped")
    broker_dispatch(path)
    replayed = second + live + stopped
    expected = Counter(first + second + live + replayed)
    wait_for(lambda: Counter(http.ids("/t")) == expected, 30, "everything after the time redelivered")
    wait_for(lambda: committed(kafka_running, topic, group) == ends(kafka_running, topic), 15, "replay committed")
    time.sleep(1.5)
    assert Counter(http.ids("/t")) == expected  # exactly: none of the first batch, nothing else twice
