"""A Broker's dispatch: each record read and decoded once per replica, fanned out to the matching Triggers.

``SharedReader`` is the one consumer of the Broker's topic in this replica, a member of the group
``knative-broker-dispatcher-<ns>-<name>`` that only spreads the partitions over the replicas (it commits nothing).
Each record it reads goes to every Trigger's ``lane.TriggerLane`` (filter, queue, ordered/unordered scheduler,
delivery, offset marks). Each Trigger's progress is committed to the Trigger's own group
``knative-trigger-<ns>-<name>`` (``group_offsets``), so that group's committed offsets are what they were when each
Trigger had its own consumer: at-least-once per Trigger, visible to lag tools, alerts and KEDA.

* Where a partition starts (assignment): each Trigger's committed offset; a Trigger whose group has none starts at
  the latest offset (earliest if its group has commits on other partitions: a partition added later), pinned and
  committed. The reader starts at the lowest of the Triggers' positions that lie within ``REJOIN_SLACK`` records
  of the highest; a Trigger further back starts *behind*.
* Holding back, bounded: the reader takes only what every attached lane has room for (each lane's byte budget,
  as in the channel dispatcher), so a slow Trigger slows the shared read. A lane that has held the reader back for
  longer than ``window`` seconds while another lane had room falls *behind*: the reader stops feeding it and goes
  on; the lane reads its partitions itself with a ``CatchUp`` consumer (assigned, never subscribed: no group
  membership) from its own position. Its memory stays within its own budget, and the others wait at most
  ``window``. Once the catch-up has reached the reader's position and the lane has room again, the partition
  rejoins the shared read (offsets already seen are skipped, so the handover loses and repeats nothing).
* Revoke commits every lane's marks synchronously before the partition moves; lost commits nothing; a crash
  replays, per Trigger, what that Trigger had not committed.
* A Trigger added later is placed on the assigned partitions (its group has no commits: the latest offset); a
  removed one drains, commits, and — when the Trigger is gone from the Broker, not merely held — its group is
  deleted (after its last commit, so the commit does not bring it back).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.brokers import reader_group
from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.dispatcher.app import Dispatcher, consumer_settings
from kafka_eventing.dispatcher.flow import CONSUME_BATCH, WakeableSleep
from kafka_eventing.dispatcher.group_offsets import AdminGroupOffsets, GroupOffsets
from kafka_eventing.dispatcher.lane import Record, TriggerLane
from kafka_eventing.dispatcher.loop import LoopBound
from kafka_eventing.dispatcher.metrics import Metrics
from kafka_eventing.dispatcher.status import (
    JOINING,
    REASON_FAILED,
    REASON_JOINED,
    REASON_JOINING,
    REASON_TOPIC,
    StatusBoard,
    consumer_problem,
)
from kafka_eventing.dispatcher.subscription import MAX_IDLE_POLL, ConsumerFactory

log = logging.getLogger(__name__)

#: Seconds a lane may hold the shared read back (while another lane has room) before it falls behind.
DEFAULT_WINDOW = 5.0
#: At assignment, Triggers this many records or fewer behind the most advanced one start in the shared read.
REJOIN_SLACK = 1000
#: How often the moved marks are committed (the channel dispatcher's auto.commit.interval.ms).
COMMIT_INTERVAL = 1.0
LAG_INTERVAL = 5.0
COMMIT_TIMEOUT = 10.0

T = TypeVar("T")


class SharedReader(LoopBound):
    """The Broker's topic read once in this replica and fanned out to the Triggers' lanes; ``run()`` until
    ``stop()``."""

    def __init__(
        self,
        channel: Channel,
        *,
        group_id: str,
        consumer_config: dict[str, Any],
        catchup_config: Callable[[str], dict[str, Any]],
        offsets: GroupOffsets,
        board: StatusBoard,
        metrics: Metrics,
        consumer_factory: ConsumerFactory = Consumer,
        window: float = DEFAULT_WINDOW,
        shutdown_grace: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = channel.topic
        self.namespace, self.name = channel.namespace, channel.name
        self.group_id = group_id
        self.initial = str(consumer_config.get("auto.offset.reset", "latest"))
        self._config = {**consumer_config, "enable.auto.commit": False, "error_cb": self._on_error}
        self._catchup_config = catchup_config
        self.offsets = offsets
        self.board = board
        self.metrics = metrics
        self.window = window
        self.grace = shutdown_grace
        self.clock = clock
        self._factory = consumer_factory
        self.lanes: dict[str, TriggerLane] = {}
        self.catchups: dict[str, CatchUp] = {}
        #: Per assigned partition: the next offset the reader hands to the lanes.
        self.next: dict[int, int] = {}
        self.paused: set[int] = set()
        self.joined = False
        #: Lanes not yet placed on the assigned partitions (added after the assignment).
        self._unplaced: set[str] = set()
        self._retiring: set[asyncio.Task[None]] = set()
        #: Removed lanes still draining: a revoke meanwhile commits their marks too, before the partition moves.
        self._draining: set[TriggerLane] = set()
        self._commits: dict[str, tuple[concurrent.futures.Future[Any], TriggerLane, list[int]]] = {}
        self._consumer: Any = None
        self._poller: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopping = False
        self.stop_requested = False
        self._alarm = WakeableSleep()
        self._next_commit = 0.0
        self._next_lag = 0.0
        self._lag_seen: set[tuple[str, str, str]] = set()

    # -- lanes (on the loop) ----------------------------------------------------------------------
    def add(self, lane: TriggerLane) -> None:
        lane.wake = self._wake_all
        self.lanes[lane.subscriber.uid] = lane
        self._unplaced.add(lane.subscriber.uid)
        self.board.set(lane.subscriber.uid, lane.subscriber.generation, False, JOINING, REASON_JOINING)
        self._wake()

    def remove(self, uid: str, *, delete_group: bool) -> None:
        """Stop the lane: drain, commit its marks, and delete its group if the Trigger is gone."""
        lane = self.lanes.pop(uid, None)
        self._unplaced.discard(uid)
        if lane is None:
            return
        lane.stopping = True
        self._draining.add(lane)
        catchup = self.catchups.pop(uid, None)
        task = asyncio.get_running_loop().create_task(self._retire(lane, catchup, delete_group))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        log.info("trigger removed", extra={"subscriber": uid, "delete_group": delete_group})

    async def _retire(self, lane: TriggerLane, catchup: CatchUp | None, delete_group: bool) -> None:
        if catchup is not None:
            catchup.stop()
            await catchup.done.wait()
        points = await lane.drain(self.grace)
        self._draining.discard(lane)
        await asyncio.to_thread(self._commit_now, lane.group_id, points)
        lane.release(list(lane.parts))
        if delete_group:
            try:
                await asyncio.to_thread(self.offsets.delete, lane.group_id)
                log.info("consumer group deleted", extra={"group": lane.group_id})
            except KafkaException as exc:
                log.warning("consumer group not deleted", extra={"group": lane.group_id, "error": str(exc)})

    async def retired(self) -> None:
        """Until every lane removed so far has drained and committed its marks."""
        await asyncio.gather(*list(self._retiring), return_exceptions=True)

    def stop(self) -> None:
        self.stop_requested = self._stopping = True
        self._wake()

    def stats(self) -> dict[str, Any]:
        return {uid: lane.stats() for uid, lane in self.lanes.items()}

    # -- the read loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        poller = self._poller = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="poll-broker")
        self._consumer = self._factory(self._config)
        try:
            self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_lost)
            idle = 0
            wait = 0.0
            while not self._stopping:
                if self._unplaced and self.next:
                    await self._place()
                room, blocked = self._room()
                try:
                    messages = await loop.run_in_executor(poller, self._take, room, wait)
                except KafkaException as exc:
                    log.warning("consume failed", extra={"broker": self.name, "error": str(exc)})
                    messages = []
                wait = 0.0
                if messages:
                    self._fan_out(messages)
                self._flow()
                self._commit_moved()
                self._report_lag()
                if len(messages) >= room > 1:
                    await asyncio.sleep(0)
                    continue
                idle = idle + 1 if not messages or blocked else 1
                if not blocked and not self.paused and self.next:
                    wait = min(MAX_IDLE_POLL, 0.002 * idle)
                else:
                    await self._sleep(min(MAX_IDLE_POLL, 0.002 * idle))
            await self._drain()
        finally:
            try:
                await asyncio.shield(loop.run_in_executor(poller, self._consumer.close))
            except (KafkaException, RuntimeError) as exc:
                log.warning("consumer close failed", extra={"broker": self.name, "error": str(exc)})
            finally:
                self._consumer = None
                poller.shutdown(wait=False)
                for catchup in self.catchups.values():
                    catchup.stop()
                if self._retiring:
                    await asyncio.gather(*self._retiring, return_exceptions=True)

    def _take(self, room: int, wait: float) -> list[Message]:
        consumer = self._consumer
        if wait <= 0:
            return cast(list[Message], consumer.consume(room, 0))
        first = cast(list[Message], consumer.consume(1, wait))
        if not first or room <= 1:
            return first
        return first + cast(list[Message], consumer.consume(room - 1, 0))

    def _room(self) -> tuple[int, bool]:
        """Records to take: what the fullest attached lane has room for (at least one: polling goes on)."""
        room, blocked = CONSUME_BATCH, False
        for lane in self.lanes.values():
            if lane.stopping:
                continue
            attached = lane.attached()
            if not attached:
                continue
            free, full = lane.room(attached)
            room = min(room, free)
            blocked = blocked or full
        return max(1, room), blocked

    def _fan_out(self, messages: list[Message]) -> None:
        feeds: dict[int, list[TriggerLane]] = {}
        for lane in self.lanes.values():
            if lane.stopping:
                continue
            for number in lane.parts:
                if number not in lane.behind:
                    feeds.setdefault(number, []).append(lane)
        nxt = self.next
        for message in messages:
            err = message.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self._error(err)
                continue
            number, offset = cast(int, message.partition()), cast(int, message.offset())
            expected = nxt.get(number)
            if expected is None or offset < expected:
                continue  # revoked meanwhile, or seen already
            nxt[number] = offset + 1
            lanes = feeds.get(number)
            if lanes:
                record = Record(message)
                for lane in lanes:
                    lane.offer(record)
        for lane in self.lanes.values():
            lane.count_consumed()
            lane.pump()

    def _flow(self) -> None:
        """Pause the partitions an attached lane has no room for; let a lane that has held the others back for
        longer than the window fall behind; start the catch-up of lanes that are behind."""
        now = self.clock()
        want: set[int] = set()
        blocking: list[TriggerLane] = []
        free = False
        for lane in self.lanes.values():
            if lane.stopping:
                continue
            attached = lane.attached()
            if not attached:
                lane.blocked_since = None
                continue
            holds = lane.room(attached)[1]
            queued = lane.flow.queued(attached)
            for part in attached:
                if lane.wants_paused(part, queued):
                    want.add(part.number)
                    holds = True
            if holds:
                if lane.blocked_since is None:
                    lane.blocked_since = now
                blocking.append(lane)
            else:
                lane.blocked_since = None
                free = True
        if free:
            for lane in blocking:
                since = lane.blocked_since
                if since is not None and now - since >= self.window:
                    self._fall_behind(lane)
        for lane in self.lanes.values():
            if lane.behind and lane.subscriber.uid not in self.catchups and not lane.stopping:
                self._start_catchup(lane)
        self._pause(want)

    def _pause(self, want: set[int]) -> None:
        want &= set(self.next)
        pause = [TopicPartition(self.topic, n) for n in want - self.paused]
        resume = [TopicPartition(self.topic, n) for n in self.paused - want if n in self.next]
        self.paused = want
        try:
            if pause:
                self._consumer.pause(pause)
            if resume:
                self._consumer.resume(resume)
        except KafkaException as exc:
            log.warning("pause/resume failed", extra={"broker": self.name, "error": str(exc)})

    def _fall_behind(self, lane: TriggerLane) -> None:
        numbers = [p.number for p in lane.attached()]
        lane.behind.update(numbers)
        lane.blocked_since = None
        for part in lane.parts.values():
            part.paused = False
        self.metrics.fell_behind.labels(*lane.labels).inc()
        log.warning("trigger fell behind the shared read; it reads on its own until it catches up",
                    extra={"subscriber": lane.subscriber.uid, "partitions": numbers, "window": self.window})

    def _start_catchup(self, lane: TriggerLane) -> None:
        catchup = CatchUp(lane, self, self._catchup_config(lane.group_id), self._factory)
        self.catchups[lane.subscriber.uid] = catchup
        task = asyncio.get_running_loop().create_task(catchup.run(), name=f"catchup-{lane.subscriber.uid}")

        def finished(_task: asyncio.Task[None]) -> None:
            if self.catchups.get(lane.subscriber.uid) is catchup:
                del self.catchups[lane.subscriber.uid]
            if not _task.cancelled() and _task.exception() is not None:
                log.error("catch-up failed", exc_info=_task.exception(), extra={"subscriber": lane.subscriber.uid})

        task.add_done_callback(finished)

    def rejoin(self, lane: TriggerLane, number: int) -> bool:
        """Back to the shared read, if the lane has all the reader handed out and room for more."""
        nxt = self.next.get(number)
        part = lane.parts.get(number)
        if nxt is None or part is None or lane.position(number) < nxt:
            return False
        attached = [*lane.attached(), part]
        if lane.room(attached)[1] or lane.scheduler.must_pause(part, lane.flow.queued(attached),
                                                                lane.flow.queue_bytes, lane.flow.byte_cap):
            return False
        lane.behind.discard(number)
        log.info("trigger rejoined the shared read", extra={"subscriber": lane.subscriber.uid, "partition": number})
        return True

    async def _sleep(self, seconds: float) -> None:
        await self._alarm.sleep(seconds)

    def _wake(self) -> None:
        self._alarm.wake()

    def _wake_all(self) -> None:
        self._wake()
        for catchup in self.catchups.values():
            catchup.wake()

    # -- positions --------------------------------------------------------------------------------
    def _starts(self, consumer: Any, group: str, numbers: list[int]) -> dict[int, tuple[int, str | None]]:
        """On the poll thread: where one Trigger starts on ``numbers`` (committed, else pinned and committed)."""
        committed = self.offsets.committed(group, [TopicPartition(self.topic, n) for n in numbers])
        missing = [tp for tp in committed if tp.offset < 0]
        if missing:
            initial = self.initial
            if initial != "earliest" and (any(tp.offset >= 0 for tp in committed)
                                          or self.offsets.has_commits(group, self.topic)):
                initial = "earliest"  # partitions added to the topic after the Trigger started
            for tp in missing:
                low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, tp.partition), timeout=10)
                tp.offset = high if initial == "latest" else low
            pin = [TopicPartition(self.topic, tp.partition, tp.offset) for tp in missing]
            self.offsets.commit(group, pin).result(COMMIT_TIMEOUT)
        return {tp.partition: (tp.offset, tp.metadata) for tp in committed}

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        lanes = self._on_loop(lambda: [lane for lane in self.lanes.values() if not lane.stopping])
        starts: dict[str, dict[int, tuple[int, str | None]]] = {}
        for lane in lanes:
            if numbers:
                starts[lane.subscriber.uid] = self._with_retries(self._starts, consumer, lane.group_id, numbers)
        positions = []
        reader_starts: dict[int, int] = {}
        for number in numbers:
            offsets = [s[number][0] for s in starts.values()]
            if offsets:
                top = max(offsets)
                start = min(o for o in offsets if o >= top - REJOIN_SLACK)
            else:
                start = consumer.get_watermark_offsets(TopicPartition(self.topic, number), timeout=10)[1]
            reader_starts[number] = start
            positions.append(TopicPartition(self.topic, number, start))
        if positions:
            try:
                consumer.incremental_assign(positions)
            except KafkaException:
                consumer.assign(positions)
        self._on_loop(self._assigned, lanes, starts, reader_starts)
        log.info("partitions assigned", extra={"broker": self.name, "partitions": numbers})
        exists = bool(partitions) or self._topic_exists(consumer)
        self._on_loop(self._group_joined, exists)

    def _with_retries(self, fn: Callable[..., T], *args: Any) -> T:
        for attempt in range(3):
            try:
                return fn(*args)
            except KafkaException as exc:
                if attempt == 2:
                    raise
                log.warning("start offsets not read yet, retrying", extra={"broker": self.name, "error": str(exc)})
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def _assigned(self, lanes: list[TriggerLane], starts: dict[str, dict[int, tuple[int, str | None]]],
                  reader_starts: dict[int, int]) -> None:
        self.next.update(reader_starts)
        for lane in lanes:
            if self.lanes.get(lane.subscriber.uid) is not lane:
                continue
            self._unplaced.discard(lane.subscriber.uid)
            for number, (start, metadata) in starts.get(lane.subscriber.uid, {}).items():
                lane.add_partition(number, start, metadata, behind=start < reader_starts[number])

    async def _place(self) -> None:
        """Put the lanes added since the assignment on every assigned partition."""
        uids = list(self._unplaced)
        self._unplaced.clear()
        lanes = [self.lanes[u] for u in uids if u in self.lanes]
        numbers = list(self.next)
        assert self._poller is not None
        consumer = self._consumer
        loop = asyncio.get_running_loop()
        for lane in lanes:
            todo = [n for n in numbers if n not in lane.parts]
            if not todo:
                if self.joined:
                    self._report_joined(lane)
                continue
            try:
                starts = await loop.run_in_executor(self._poller, self._starts, consumer, lane.group_id, todo)
            except KafkaException as exc:
                log.warning("trigger's start offsets not read, retrying", extra={"subscriber": lane.subscriber.uid,
                                                                                 "error": str(exc)})
                self._unplaced.add(lane.subscriber.uid)
                continue
            if self.lanes.get(lane.subscriber.uid) is not lane:
                continue
            for number, (start, metadata) in starts.items():
                if number in self.next:  # not revoked meanwhile
                    lane.add_partition(number, start, metadata, behind=start < self.next[number])
            if self.joined:
                self._report_joined(lane)

    def _report_joined(self, lane: TriggerLane) -> None:
        sub = lane.subscriber
        self.board.set(sub.uid, sub.generation, True, "", REASON_JOINED)

    def _group_joined(self, exists: bool) -> None:
        self.joined = True
        for lane in self.lanes.values():
            sub = lane.subscriber
            if sub.uid in self._unplaced:
                continue
            if exists:
                self._report_joined(lane)
            else:
                self.board.set(sub.uid, sub.generation, False, f"topic {self.topic} does not exist", REASON_TOPIC)

    def _topic_exists(self, consumer: Any) -> bool:
        try:
            metadata = consumer.list_topics(self.topic, timeout=5)
        except KafkaException:
            return True
        found = metadata.topics.get(self.topic)
        return found is not None and found.error is None and bool(found.partitions)

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        points = self._on_loop(self._release, [tp.partition for tp in partitions])
        for group, offsets in points.items():
            self._commit_now(group, offsets)
        log.info("partitions revoked", extra={"broker": self.name, "partitions": [tp.partition for tp in partitions]})

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._on_loop(self._release, [tp.partition for tp in partitions])
        log.warning("partitions lost", extra={"broker": self.name, "partitions": [tp.partition for tp in partitions]})

    def _release(self, numbers: list[int]) -> dict[str, list[TopicPartition]]:
        points: dict[str, list[TopicPartition]] = {}
        for number in numbers:
            self.next.pop(number, None)
            self.paused.discard(number)
        for lane in [*self.lanes.values(), *self._draining]:
            done = lane.release(numbers)
            if done:
                points[lane.group_id] = done
            for number in numbers:
                key = (lane.group_id, str(number), self.topic)
                if key in self._lag_seen:
                    self._lag_seen.discard(key)
                    self.metrics.lag.remove(*key)
        return points

    # -- commits ----------------------------------------------------------------------------------
    def _commit_moved(self) -> None:
        """Every ``COMMIT_INTERVAL``: each lane's moved marks to its group, at most one commit in flight per
        group (two could land out of order and move the offset back)."""
        now = self.clock()
        if now < self._next_commit:
            return
        self._next_commit = now + COMMIT_INTERVAL
        for group, (future, lane, numbers) in list(self._commits.items()):
            if not future.done():
                continue
            del self._commits[group]
            if future.exception() is not None:
                log.warning("commit failed, retrying", extra={"group": group, "error": str(future.exception())})
                lane.moved.update(n for n in numbers if n in lane.parts)
        for lane in self.lanes.values():
            if lane.group_id in self._commits or not lane.moved:
                continue
            offsets = lane.take_moved()
            if offsets:
                self._commits[lane.group_id] = (self.offsets.commit(lane.group_id, offsets), lane,
                                                [tp.partition for tp in offsets])

    def _commit_now(self, group: str, offsets: list[TopicPartition]) -> None:
        """Synchronously, after any commit of the group still in flight (off the loop)."""
        pending = self._commits.get(group)
        if pending is not None:
            concurrent.futures.wait([pending[0]], timeout=COMMIT_TIMEOUT)
        if not offsets:
            return
        try:
            self.offsets.commit(group, offsets).result(COMMIT_TIMEOUT)
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            log.warning("commit failed", extra={"group": group, "error": str(exc)})

    async def _drain(self) -> None:
        """Shutdown: every lane drains (bounded) and commits what is done."""
        for catchup in self.catchups.values():
            catchup.stop()
        lanes = list(self.lanes.values())
        results = await asyncio.gather(*(lane.drain(self.grace) for lane in lanes))
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, self._commit_now, lane.group_id, points)
                               for lane, points in zip(lanes, results, strict=True)))

    def _report_lag(self) -> None:
        now = self.clock()
        if now < self._next_lag or self._consumer is None:
            return
        self._next_lag = now + LAG_INTERVAL
        highs: dict[int, int] = {}
        for number in self.next:
            try:
                highs[number] = self._consumer.get_watermark_offsets(TopicPartition(self.topic, number),
                                                                     cached=True)[1]
            except KafkaException:
                continue
        for lane in self.lanes.values():
            for part in lane.parts.values():
                high, position = highs.get(part.number, -1), part.tracker.commit_position
                if high < 0 or position is None:
                    continue
                key = (lane.group_id, str(part.number), self.topic)
                self._lag_seen.add(key)
                self.metrics.lag.labels(*key).set(max(0, high - position))

    # -- errors -----------------------------------------------------------------------------------
    def _on_error(self, err: KafkaError) -> None:
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            self._error(err)
        else:
            loop.call_soon_threadsafe(self._error, err)

    def _error(self, err: KafkaError) -> None:
        problem = consumer_problem(err, self.topic)
        if problem is None:
            log.debug("consumer error", extra={"broker": self.name, "error": err.str()})
            return
        message, reason = problem
        log.warning("broker cannot consume", extra={"broker": self.name, "error": message})
        if not self.joined or reason == REASON_TOPIC:
            for lane in self.lanes.values():
                self.board.set(lane.subscriber.uid, lane.subscriber.generation, False, message, reason)


class CatchUp:
    """A lane's own reader while it is behind: a consumer *assigned* the lane's behind partitions at the lane's
    positions (no group membership, nothing committed by it: the shared reader commits the lane's marks), fed
    into the same lane within the lane's own budget, until each partition rejoins the shared read."""

    def __init__(self, lane: TriggerLane, reader: SharedReader, config: dict[str, Any],
                 factory: ConsumerFactory) -> None:
        self.lane = lane
        self.reader = reader
        self.config = {**config, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        self.factory = factory
        self.done = asyncio.Event()
        self._stopping = False
        self._alarm = WakeableSleep()
        self._assigned: set[int] = set()

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    def wake(self) -> None:
        self._alarm.wake()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        lane, topic = self.lane, self.lane.topic
        poller = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"catchup-{lane.subscriber.uid}"[:40])
        consumer = self.factory(self.config)
        try:
            while not self._stopping:
                for number in sorted(lane.behind):
                    if self.reader.rejoin(lane, number):
                        lane.parts[number].paused = False
                want = {n for n in lane.behind if n in lane.parts}
                add = [TopicPartition(topic, n, lane.position(n)) for n in want - self._assigned]
                drop = [TopicPartition(topic, n) for n in self._assigned - want]
                if add or drop:
                    await loop.run_in_executor(poller, self._reassign, consumer, add, drop)
                    self._assigned = want
                if not want:
                    return
                parts = lane.behind_parts()
                room, full = lane.room(parts)
                queued = lane.flow.queued(parts)
                pause = [p for p in parts if lane.wants_paused(p, queued)]
                if full or len(pause) == len(parts):
                    await self._sleep(MAX_IDLE_POLL)
                    continue
                await loop.run_in_executor(poller, self._pause, consumer, pause, parts)
                messages = await loop.run_in_executor(poller, consumer.consume, room, MAX_IDLE_POLL)
                for message in messages:
                    if message.error() is not None:
                        continue
                    number = cast(int, message.partition())
                    if number in lane.behind:
                        lane.offer(Record(message))
                lane.count_consumed()
                lane.pump()
        finally:
            try:
                await asyncio.shield(loop.run_in_executor(poller, consumer.close))
            except (KafkaException, RuntimeError) as exc:
                log.warning("catch-up consumer close failed", extra={"subscriber": lane.subscriber.uid,
                                                                      "error": str(exc)})
            poller.shutdown(wait=False)
            self.done.set()

    @staticmethod
    def _reassign(consumer: Any, add: list[TopicPartition], drop: list[TopicPartition]) -> None:
        if drop:
            consumer.incremental_unassign(drop)
        if add:
            consumer.incremental_assign(add)

    @staticmethod
    def _pause(consumer: Any, pause: list[Any], parts: list[Any]) -> None:
        paused = {p.number for p in pause}
        if paused:
            consumer.pause([p.tp for p in pause])
        resume = [p.tp for p in parts if p.number not in paused]
        if resume:
            consumer.resume(resume)

    async def _sleep(self, seconds: float) -> None:
        await self._alarm.sleep(seconds)


class BrokerDispatcher(Dispatcher):
    """The dispatcher of one Broker: one ``SharedReader`` fanning out to a lane per Trigger ready for dispatch."""

    def __init__(self, *args: Any, group_offsets: GroupOffsets | None = None, window: float = DEFAULT_WINDOW,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group_offsets = group_offsets
        self.window = window
        self._reader: SharedReader | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._old_readers: set[asyncio.Task[None]] = set()

    async def pause_group(self, group: str) -> None:
        """A Trigger's group is being reset (``Resets.holds``): its lane leaves the shared read, drains and commits
        its marks (the group keeps no members, so the reset's commit is accepted) before the reset commits."""
        self._reconcile()
        if self._reader is not None:
            await self._reader.retired()
        if self._old_readers:
            await asyncio.gather(*list(self._old_readers), return_exceptions=True)

    def _apply(self, channel: Channel | None, wanted: dict[str, Subscriber]) -> None:
        reader = self._reader
        if reader is not None and (channel is None or reader.topic != channel.topic):
            self._stop_reader()
            reader = None
        if channel is None:
            return
        known = {s.uid for s in channel.subscribers}
        if reader is None:
            if not wanted:
                return
            reader = self._start_reader(channel)
        for uid in list(reader.lanes):
            if uid not in wanted:
                reader.remove(uid, delete_group=uid not in known)
        if not wanted:
            self._stop_reader()  # nothing to read for (the Broker not ready, every Trigger held or gone)
            return
        for uid, sub in wanted.items():
            lane = reader.lanes.get(uid)
            if lane is None:
                reader.add(self._lane(channel, sub))
            elif lane.subscriber != sub:
                log.info("trigger changed, applying", extra={"subscriber": uid})
                lane.update(sub)

    def _lane(self, channel: Channel, sub: Subscriber) -> TriggerLane:
        assert self._deliverer is not None
        return TriggerLane(channel.topic, channel.namespace, channel.name, sub,
                           group_id=kb.trigger_group(channel.namespace, sub.uid), deliverer=self._deliverer,
                           metrics=self.metrics, max_in_flight=self.settings.max_in_flight,
                           queue_bytes=max(128, self.settings.queued_max_messages_kbytes) * 1024 // 4,
                           max_outstanding=self.max_outstanding)

    def _start_reader(self, channel: Channel) -> SharedReader:
        group = reader_group(channel.namespace, channel.name)
        config = consumer_settings(self.settings, self.connection, group, self.initial_offset,
                                   channel.num_partitions)

        def catchup_config(trigger_group: str) -> dict[str, Any]:
            return consumer_settings(self.settings, self.connection, trigger_group, "earliest",
                                     channel.num_partitions)

        if self._group_offsets is None:
            self._group_offsets = AdminGroupOffsets(self.connection.admin_config())
        kwargs: dict[str, Any] = {} if self._factory is None else {"consumer_factory": self._factory}
        reader = self._reader = SharedReader(channel, group_id=group, consumer_config=config,
                                             catchup_config=catchup_config, offsets=self._group_offsets,
                                             board=self.board, metrics=self.metrics, window=self.window,
                                             shutdown_grace=self.shutdown_grace, **kwargs)
        previous = set(self._old_readers)
        self._reader_task = asyncio.get_running_loop().create_task(self._supervise_reader(reader, previous),
                                                                   name=f"broker-{channel.name}")
        log.info("broker reader started", extra={"group": group, "topic": channel.topic})
        return reader

    async def _supervise_reader(self, reader: SharedReader, previous: set[asyncio.Task[None]]) -> None:
        if previous:
            await asyncio.gather(*previous, return_exceptions=True)
        failures = 0
        while True:
            try:
                await reader.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if reader.stop_requested:
                    return
                failures += 1
                log.exception("broker reader failed, restarting")
                for lane in reader.lanes.values():
                    sub = lane.subscriber
                    self.board.set(sub.uid, sub.generation, False, f"consumer failed: {type(exc).__name__}: {exc}",
                                   REASON_FAILED)
                    lane.release(list(lane.parts))
                    reader._unplaced.add(sub.uid)
                reader.next.clear()
                reader.paused.clear()
                reader._stopping = False
                await asyncio.sleep(min(30.0, 0.5 * 2**failures))

    def _stop_reader(self) -> None:
        reader, task = self._reader, self._reader_task
        self._reader = self._reader_task = None
        if reader is None or task is None:
            return
        reader.stop()
        self._old_readers.add(task)
        task.add_done_callback(self._old_readers.discard)

    async def _stop_all(self) -> None:
        self._stop_reader()
        if self._old_readers:
            await asyncio.gather(*self._old_readers, return_exceptions=True)

    def _waiting(self) -> list[str]:
        reader = self._reader
        if reader is None:
            return []
        if not reader.joined:
            return sorted(reader.lanes)
        return sorted(uid for uid in reader.lanes if uid in reader._unplaced)

    def _stats(self) -> dict[str, Any]:
        return {} if self._reader is None else self._reader.stats()
