"""A Broker's fan-out with fakes: one read, the matching lanes, each Trigger's commits in its own group, the start
positions, and a Trigger that holds the others back past the window falling behind and rejoining."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from kafka_eventing.broker.filters import RecordFilter, compile_trigger
from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.dispatcher.delivery import AttemptCount, Decoded, Outcome
from kafka_eventing.dispatcher.fanout import REJOIN_SLACK, SharedReader
from kafka_eventing.dispatcher.flow import CONSUME_BATCH
from kafka_eventing.dispatcher.lane import TriggerLane
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.offsets import OffsetTracker
from kafka_eventing.dispatcher.status import MemoryStatusWriter, StatusBoard

from .fakes import FakeOffsets

TOPIC = "knative-broker-ns-b"


class FakeMessage:
    def __init__(self, partition: int, offset: int, headers: list[tuple[str, bytes]], value: bytes) -> None:
        self._p, self._o, self._h, self._v = partition, offset, headers, value

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def headers(self) -> list[tuple[str, bytes]]:
        return self._h

    def value(self) -> bytes:
        return self._v

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC


class Log:
    """The topic: records per partition."""

    def __init__(self, partitions: int = 2) -> None:
        self.records: dict[int, list[FakeMessage]] = {p: [] for p in range(partitions)}

    def append(self, partition: int, event_type: str, n: int) -> None:
        for _ in range(n):
            offset = len(self.records[partition])
            event = CloudEvent({"id": f"{partition}-{offset}", "source": "/s", "type": event_type,
                                "specversion": "1.0"}, b"{}")
            rec = event_to_kafka(event)
            self.records[partition].append(FakeMessage(partition, offset, list(rec.headers), rec.value))


class LogConsumer:
    """Reads a ``Log``: the shared reader's (subscribe: every partition assigned at the first consume) or a
    catch-up consumer's (assign)."""

    def __init__(self, log: Log, config: dict[str, Any], made: list[LogConsumer]) -> None:
        self.log, self.config = log, config
        self.positions: dict[int, int] = {}
        self.paused: set[int] = set()
        self.callbacks: dict[str, Any] = {}
        self.subscribed = False
        made.append(self)

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.subscribed, self.callbacks = True, callbacks

    def consume(self, num: int, timeout: float) -> list[FakeMessage]:
        if self.subscribed and "assigned" not in self.callbacks:
            self.callbacks["assigned"] = True
            self.callbacks["on_assign"](self, [TopicPartition(TOPIC, p) for p in self.log.records])
        out: list[FakeMessage] = []
        for p in sorted(self.positions):
            if p in self.paused:
                continue
            while len(out) < num and self.positions[p] < len(self.log.records[p]):
                out.append(self.log.records[p][self.positions[p]])
                self.positions[p] += 1
        if not out and timeout:
            time.sleep(min(timeout, 0.005))
        return out

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.positions[tp.partition] = tp.offset

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.positions.pop(tp.partition, None)

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        return 0, len(self.log.records[tp.partition])

    def list_topics(self, topic: str, timeout: float) -> Any:
        parts = {p: object() for p in self.log.records}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=parts, error=None)})

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}

    def close(self) -> None: ...




class FakeDeliverer:
    """Delivers at once, except to the URIs in ``hold`` (they wait until released)."""

    def __init__(self) -> None:
        self.delivered: dict[str, list[str]] = {}
        self.decoded: dict[str, list[Any]] = {}
        self.hold: dict[str, asyncio.Event] = {}

    async def handle(self, headers: Sequence[tuple[str, bytes | str | None]] | None, value: bytes | None,
                     subscriber: Subscriber, labels: Labels, count: AttemptCount | None = None, *,
                     record: Any = None, decoded: Decoded | None = None) -> Outcome:
        gate = self.hold.get(subscriber.subscriber_uri)
        if gate is not None:
            await gate.wait()
        assert decoded is not None
        head, _body = decoded()
        self.delivered.setdefault(subscriber.uid, []).append(head["ce-id"])
        self.decoded.setdefault(subscriber.uid, []).append(getattr(decoded, "__self__", None))
        return Outcome.DELIVERED


def sub(uid: str, *, ordered: bool = False, filters: list[dict[str, Any]] | None = None) -> Subscriber:
    flt = RecordFilter(compile_trigger({"filters": filters})) if filters else None
    return Subscriber(uid=uid, subscriber_uri=f"http://{uid}/", ordered=ordered, event_filter=flt, hop_ttl=True)


class Rig:
    def __init__(self, log: Log, offsets: FakeOffsets | None = None, window: float = 5.0,
                 queue_bytes: int = 256 * 1024) -> None:
        self.log = log
        self.offsets = offsets or FakeOffsets()
        self.metrics = Metrics(CollectorRegistry())
        self.board = StatusBoard(("ns", "b"), MemoryStatusWriter())
        self.deliverer = FakeDeliverer()
        self.consumers: list[LogConsumer] = []
        self.queue_bytes = queue_bytes
        channel = Channel(namespace="ns", name="b", topic=TOPIC, ordered=False)
        self.reader = SharedReader(channel, group_id="reader", consumer_config={"auto.offset.reset": "latest"},
                                   catchup_config=lambda group: {"group.id": group}, offsets=self.offsets,
                                   board=self.board, metrics=self.metrics, window=window,
                                   consumer_factory=lambda config: LogConsumer(self.log, config, self.consumers))

    def lane(self, subscriber: Subscriber) -> TriggerLane:
        return TriggerLane(TOPIC, "ns", "b", subscriber, group_id=f"knative-trigger-ns-{subscriber.uid}",
                           deliverer=self.deliverer, metrics=self.metrics,  # type: ignore[arg-type]
                           max_in_flight=8, queue_bytes=self.queue_bytes)

    def add(self, subscriber: Subscriber) -> TriggerLane:
        lane = self.lane(subscriber)
        self.reader.add(lane)
        return lane

    async def until(self, check: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)


def run(scenario: Callable[[], Any]) -> None:
    asyncio.run(scenario())


def test_each_record_is_decoded_once_and_goes_to_the_matching_triggers_which_commit_to_their_own_groups() -> None:
    log = Log()

    async def scenario() -> None:
        rig = Rig(log)
        rig.add(sub("all"))
        rig.add(sub("created", filters=[{"exact": {"type": "created"}}]))
        rig.add(sub("none", filters=[{"exact": {"type": "nothing"}}]))
        task = asyncio.create_task(rig.reader.run())
        await rig.until(lambda: rig.reader.joined and not rig.reader._unplaced)
        log.append(0, "created", 5)
        log.append(1, "deleted", 5)
        await rig.until(lambda: len(rig.deliverer.delivered.get("all", [])) == 10)
        await rig.until(lambda: all(rig.offsets.groups.get(f"knative-trigger-ns-{g}") == {0: 5, 1: 5}
                                    for g in ("all", "created", "none")), 5)
        rig.reader.stop()
        await task
        delivered = rig.deliverer.delivered
        assert sorted(delivered["created"]) == [f"0-{i}" for i in range(5)]
        assert "none" not in delivered
        # One shared reader; every Trigger's lane got the same decoded record.
        assert len([c for c in rig.consumers if c.subscribed]) == 1 and len(rig.consumers) == 1
        shared = {id(r) for r in rig.deliverer.decoded["created"]}
        assert shared <= {id(r) for r in rig.deliverer.decoded["all"]}
        # A new group starts at the latest offset, pinned and committed before anything is read.
        assert ("knative-trigger-ns-all", [(0, 0), (1, 0)]) in rig.offsets.commits
        assert rig.offsets.groups.get("reader") is None  # the shared read commits nothing of its own

    run(scenario)


def test_start_positions_come_from_each_triggers_group_and_a_far_one_starts_behind() -> None:
    log = Log()
    log.append(0, "t", REJOIN_SLACK + 20)
    log.append(1, "t", 10)
    offsets = FakeOffsets({"knative-trigger-ns-a": {0: REJOIN_SLACK + 10, 1: 10},
                           "knative-trigger-ns-b": {0: REJOIN_SLACK + 5, 1: 8},
                           "knative-trigger-ns-far": {0: 0, 1: 10}})

    async def scenario() -> None:
        rig = Rig(log, offsets)
        lanes = {n: rig.add(sub(n)) for n in ("a", "b", "far")}
        task = asyncio.create_task(rig.reader.run())
        await rig.until(lambda: len(rig.deliverer.delivered.get("far", [])) == REJOIN_SLACK + 20)
        await rig.until(lambda: len(rig.deliverer.delivered.get("b", [])) == 15 + 2)
        await rig.until(lambda: not lanes["far"].behind)
        rig.reader.stop()
        await task
        delivered = rig.deliverer.delivered
        # Each Trigger gets exactly what its group had not committed.
        assert sorted(delivered["a"]) == sorted(f"0-{i}" for i in range(REJOIN_SLACK + 10, REJOIN_SLACK + 20))
        assert sorted(delivered["b"]) == sorted([f"0-{i}" for i in range(REJOIN_SLACK + 5, REJOIN_SLACK + 20)]
                                                + ["1-8", "1-9"])
        assert len(set(delivered["far"])) == len(delivered["far"])
        # The shared read started where the near ones were; the far one caught up on its own consumer.
        (catchup,) = [c for c in rig.consumers if not c.subscribed]
        assert catchup.config["group.id"] == "knative-trigger-ns-far"

    run(scenario)


def test_a_trigger_holding_the_read_back_past_the_window_falls_behind_and_rejoins_when_caught_up() -> None:
    log = Log()

    async def scenario() -> None:
        # A small budget: an ordered Trigger whose subscriber hangs fills its queues after a few dozen events.
        rig = Rig(log, window=0.2, queue_bytes=32 * 1024)
        gate = rig.deliverer.hold["http://stuck/"] = asyncio.Event()
        stuck = rig.add(sub("stuck", ordered=True))
        rig.add(sub("ok"))
        task = asyncio.create_task(rig.reader.run())
        await rig.until(lambda: rig.reader.joined and not rig.reader._unplaced)
        log.append(0, "t", 2000)
        log.append(1, "t", 2000)
        started = time.monotonic()
        await rig.until(lambda: len(rig.deliverer.delivered.get("ok", [])) == 4000, 10)
        assert time.monotonic() - started < 5
        assert stuck.behind == {0, 1}
        # Its memory stays within its own budget: the queue cap (tiny records here), plus at most one poll batch
        # taken before the pause.
        assert all(len(p.queue) <= p.cap + CONSUME_BATCH for p in stuck.parts.values())
        await rig.until(lambda: rig.offsets.groups["knative-trigger-ns-ok"] == {0: 2000, 1: 2000})
        assert rig.offsets.groups["knative-trigger-ns-stuck"] == {0: 0, 1: 0}
        gate.set()
        await rig.until(lambda: len(rig.deliverer.delivered.get("stuck", [])) == 4000, 10)
        await rig.until(lambda: not stuck.behind)
        log.append(0, "t", 10)
        await rig.until(lambda: len(rig.deliverer.delivered["stuck"]) == 4010
                        and len(rig.deliverer.delivered["ok"]) == 4010)
        await rig.until(lambda: rig.offsets.groups["knative-trigger-ns-stuck"] == {0: 2010, 1: 2000})
        rig.reader.stop()
        await task
        stuck_ids = rig.deliverer.delivered["stuck"]
        assert len(set(stuck_ids)) == len(stuck_ids)  # nothing twice across the hand-overs
        for p in (0, 1):  # ordered: per-partition order kept through falling behind and rejoining
            seq = [int(i.split("-")[1]) for i in stuck_ids if i.startswith(f"{p}-")]
            assert seq == sorted(seq)
        assert rig.metrics.fell_behind.labels("ns", "b", "stuck")._value.get() >= 1

    run(scenario)


def test_a_removed_trigger_commits_then_its_group_is_deleted_a_held_one_keeps_it() -> None:
    log = Log()

    async def scenario() -> None:
        rig = Rig(log)
        rig.add(sub("gone"))
        rig.add(sub("held"))
        task = asyncio.create_task(rig.reader.run())
        await rig.until(lambda: rig.reader.joined and not rig.reader._unplaced)
        log.append(0, "t", 3)
        await rig.until(lambda: len(rig.deliverer.delivered.get("held", [])) == 3
                        and len(rig.deliverer.delivered.get("gone", [])) == 3)
        rig.reader.remove("gone", delete_group=True)
        rig.reader.remove("held", delete_group=False)
        await rig.until(lambda: not rig.reader._retiring)
        rig.reader.stop()
        await task
        assert rig.offsets.deleted == ["knative-trigger-ns-gone"]
        assert rig.offsets.groups["knative-trigger-ns-held"] == {0: 3, 1: 0}
        last_gone = max(i for i, (g, _o) in enumerate(rig.offsets.commits) if g == "knative-trigger-ns-gone")
        assert "knative-trigger-ns-gone" not in rig.offsets.groups and last_gone >= 0

    run(scenario)


def test_a_filtered_out_record_moves_the_mark_without_queueing() -> None:
    tracker = OffsetTracker()
    tracker.start_at(10)
    assert tracker.skip(5) is None  # below the start
    assert tracker.skip(10) == 11 and tracker.outstanding == 0
    tracker.add(11)
    assert tracker.skip(12) is None  # behind an unfinished one: the mark waits
    assert tracker.done(11) == 13


def test_a_changed_filter_applies_from_the_next_record_read() -> None:
    log = Log()

    async def scenario() -> None:
        rig = Rig(log)
        lane = rig.add(sub("t", filters=[{"exact": {"type": "a"}}]))
        task = asyncio.create_task(rig.reader.run())
        await rig.until(lambda: rig.reader.joined and not rig.reader._unplaced)
        log.append(0, "a", 2)
        log.append(0, "b", 2)
        await rig.until(lambda: rig.reader.next.get(0) == 4)
        lane.update(sub("t", filters=[{"exact": {"type": "b"}}]))
        log.append(0, "a", 2)
        log.append(0, "b", 2)
        await rig.until(lambda: rig.reader.next.get(0) == 8)
        await rig.until(lambda: rig.offsets.groups.get("knative-trigger-ns-t", {}).get(0) == 8)
        rig.reader.stop()
        await task
        assert sorted(rig.deliverer.delivered["t"]) == ["0-0", "0-1", "0-6", "0-7"]

    run(scenario)
