"""`kafka-eventing offsets` on a fake admin: which group and Broker the arguments name, and when a reset is refused
because someone would commit over it (the group's own members, or for a Trigger its Broker's running dispatcher,
whose shared read is the only sign of it: the Trigger's group never has members)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.group_offsets import Committed, Members, Watermarks
from kafka_eventing.core.offsets_cli import named, parser, refusal, run
from kafka_eventing.core.settings import Settings, SettingsError

TRIGGER_GROUP = kb.trigger_group("shop", "audit")
READER = kb.reader_group("shop", "default")
TOPIC = kb.broker_topic("shop", "default")


@dataclass
class FakeOffsets:
    """One topic of two partitions, committed at 5, high watermark 10; ``members[group]`` is the member count
    the next ``members`` call answers (a list: one answer per call, the last one kept)."""

    members_of: dict[str, list[int]] = field(default_factory=dict)
    commits: list[tuple[str, list[TopicPartition]]] = field(default_factory=list)

    def partitions(self, topic: str) -> list[int]:
        return [0, 1]

    def committed(self, group: str, topic: str, partitions: Any) -> dict[int, Committed]:
        return {p: Committed(5, "") for p in partitions}

    def watermarks(self, topic: str, partitions: Any) -> dict[int, Watermarks]:
        return {p: Watermarks(0, 10) for p in partitions}

    def members(self, group: str) -> Members:
        answers = self.members_of.get(group, [0])
        count = answers.pop(0) if len(answers) > 1 else answers[0]
        return Members("STABLE" if count else "EMPTY", count, tuple(f"client-{i}" for i in range(count)))

    def commit(self, group: str, offsets: list[TopicPartition]) -> None:
        self.commits.append((group, offsets))


def args(*argv: str) -> Any:
    return parser().parse_args(list(argv))


def reset_trigger(*extra: str) -> Any:
    return args("reset", "--trigger", "shop/audit", "--to", "latest", "--yes", *extra)


def test_a_trigger_names_its_group_topic_and_its_brokers_shared_read() -> None:
    target = named(args("show", "--trigger", "shop/audit"), Settings())
    assert (target.group, target.topics, target.broker, target.reader) == (TRIGGER_GROUP, [TOPIC], "shop/default",
                                                                           READER)
    other = named(args("show", "--trigger", "shop/audit", "--broker", "b2", "--topic", "ext"), Settings())
    assert (other.topics, other.broker, other.reader) == (["ext"], "shop/b2", kb.reader_group("shop", "b2"))
    plain = named(args("show", "--group", "g", "--topic", "t"), Settings())
    assert (plain.broker, plain.reader) == (None, None)


def test_a_triggers_group_is_reset_only_through_trigger() -> None:
    """Without the Broker its dispatcher cannot be checked; showing it is harmless."""
    with pytest.raises(SettingsError, match="--trigger NS/NAME --broker NAME"):
        named(args("reset", "--group", TRIGGER_GROUP, "--topic", TOPIC, "--to", "latest"), Settings())
    assert named(args("show", "--group", TRIGGER_GROUP, "--topic", TOPIC), Settings()).group == TRIGGER_GROUP


def test_refusal_names_the_groups_members_first_then_the_running_broker_dispatcher() -> None:
    trigger = named(reset_trigger(), Settings())
    assert refusal(FakeOffsets(), trigger) is None  # type: ignore[arg-type]
    busy = refusal(FakeOffsets({READER: [2]}), trigger)  # type: ignore[arg-type]
    assert busy is not None and busy.startswith("refused: the dispatcher of Broker shop/default is running")
    assert f"2 member(s) in {READER}: client-0, client-1" in busy and "ResetOffset" in busy
    both = refusal(FakeOffsets({TRIGGER_GROUP: [1], READER: [1]}), trigger)  # type: ignore[arg-type]
    assert both is not None and both.startswith("refused: the group has 1 active member(s)")
    # A group that is not a Trigger's has no shared read to ask about.
    assert refusal(FakeOffsets({READER: [1]}), named(args("reset", "--group", "g", "--topic", TOPIC, "--to", "latest"),
                                                       Settings())) is None  # type: ignore[arg-type]


def test_reset_of_a_trigger_under_its_running_dispatcher_moves_nothing() -> None:
    offsets = FakeOffsets({READER: [1]})
    lines: list[str] = []
    assert run(reset_trigger(), offsets, Settings(), out=lines.append) == 3  # type: ignore[arg-type]
    assert offsets.commits == [] and lines[-1].startswith("refused: the dispatcher of Broker shop/default")


def test_wait_waits_for_the_broker_dispatcher_to_stop() -> None:
    offsets = FakeOffsets({READER: [1, 1, 0]})
    assert run(reset_trigger("--wait", "10"), offsets, Settings(), out=lambda _l: None) == 0  # type: ignore[arg-type]
    assert [(g, [(tp.partition, tp.offset) for tp in tps]) for g, tps in offsets.commits] == [
        (TRIGGER_GROUP, [(0, 10), (1, 10)])]


def test_a_dispatcher_started_while_asking_stops_the_commit() -> None:
    offsets = FakeOffsets()

    def yes_while_it_starts(_question: str) -> str:
        offsets.members_of[READER] = [1]
        return "y"

    lines: list[str] = []
    code = run(args("reset", "--trigger", "shop/audit", "--to", "latest"), offsets, Settings(),  # type: ignore[arg-type]
               ask=yes_while_it_starts, out=lines.append)
    assert code == 3 and offsets.commits == []
    assert lines[-1].startswith("nothing moved: refused: the dispatcher of Broker shop/default is running")


def test_a_dispatcher_that_joined_during_the_commit_is_reported() -> None:
    """Kafka took the commit, but the dispatcher may have read the old offsets first: exit 4, not a silent 0."""
    offsets = FakeOffsets({READER: [0, 0, 1]})  # empty at the first check and just before the commit
    lines: list[str] = []
    assert run(reset_trigger(), offsets, Settings(), out=lines.append) == 4  # type: ignore[arg-type]
    assert len(offsets.commits) == 1
    assert lines[-2] == "moved 2 of 2 partitions"
    assert lines[-1].startswith("but the dispatcher of Broker shop/default started meanwhile")
