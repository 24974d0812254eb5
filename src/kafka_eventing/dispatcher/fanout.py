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

from kafka_eventing.core.channels import Channel
from kafka_eventing.dispatcher.catchup import CatchUp
from kafka_eventing.dispatcher.flow import CONSUME_BATCH, WakeableSleep
from kafka_eventing.dispatcher.group_offsets import GroupOffsets
from kafka_eventing.dispatcher.lane import Record, TriggerLane
from kafka_eventing.dispatcher.loop import LoopBound
from kafka_eventing.dispatcher.metrics import Metrics
from kafka_eventing.dispatcher.status import (
    JOINING,
    REASON_JOINED,
    REASON_JOINING,
    REASON_TOPIC,
    StatusBoard,
    consumer_problem,
)
from kafka_eventing.dispatcher.subscription import MAX_IDLE_POLL, ConsumerFactory
from kafka_eventing.dispatcher.trigger_commits import COMMIT_TIMEOUT, TriggerCommits, TriggerLag

log = logging.getLogger(__name__)

#: Seconds a lane may hold the shared read back (while another lane has room) before it falls behind.
DEFAULT_WINDOW = 5.0
#: At assignment, Triggers this many records or fewer behind the most advanced one start in the shared read.
REJOIN_SLACK = 1000

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
        self.commits = TriggerCommits(offsets, clock)
        self.lag = TriggerLag(self.topic, metrics, clock)
        self._consumer: Any = None
        self._poller: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopping = False
        self.stop_requested = False
        self._alarm = WakeableSleep()

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
                self.lag.forget(lane.group_id, number)
        return points

    # -- commits and lag (trigger_commits.py) -----------------------------------------------------
    def _commit_moved(self) -> None:
        self.commits.commit_moved(self.lanes.values())

    def _commit_now(self, group: str, offsets: list[TopicPartition]) -> None:
        self.commits.commit_now(group, offsets)

    def _report_lag(self) -> None:
        if self._consumer is not None:
            self.lag.report(self._consumer, self.next, self.lanes.values())

    async def _drain(self) -> None:
        """Shutdown: every lane drains (bounded) and commits what is done."""
        for catchup in self.catchups.values():
            catchup.stop()
        lanes = list(self.lanes.values())
        results = await asyncio.gather(*(lane.drain(self.grace) for lane in lanes))
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, self._commit_now, lane.group_id, points)
                               for lane, points in zip(lanes, results, strict=True)))

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
