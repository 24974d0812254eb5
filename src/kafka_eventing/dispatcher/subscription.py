"""One subscription's consumer: poll without blocking, deliver in order (or N in flight), commit the low-water mark.

Everything here runs on the dispatcher's event loop. ``consume(timeout=0)`` only drains librdkafka's local
queue (fetching happens on librdkafka's own threads), so polling never blocks other subscriptions, and the
rebalance callbacks run on the loop too — no locks. Polling continues whatever the deliveries do (a partition
whose local queue is full is paused, not starved of polls), so a long retry sequence never pushes the member
past ``max.poll.interval.ms`` and never gets its partition revoked for being slow.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.dispatcher.delivery import Deliverer, Outcome
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.offsets import OffsetTracker
from kafka_eventing.dispatcher.status import StatusBoard

log = logging.getLogger(__name__)

#: Most records one partition's local queue holds; the byte budget (``queue_bytes``) usually binds first.
QUEUE_RECORDS = 512
#: Per-partition local queue in bytes when no budget is given (see SubscriptionConsumer.queue_bytes).
DEFAULT_QUEUE_BYTES = 256 * 1024
#: Longest pause between polls when nothing arrives (also bounds how late a rebalance is noticed).
MAX_IDLE_POLL = 0.05
#: Poll interval while an open partition has records at the broker that librdkafka has not handed over yet
#: (a refetch after a resume): the local queue may run dry meanwhile, so notice the records at once...
HUNGRY_POLL = 0.001
#: ... but only for this many empty polls in a row (transaction markers also leave the watermark ahead).
HUNGRY_POLLS = 100
CONSUME_BATCH = 500
LAG_INTERVAL = 5.0
#: Tries at pinning and committing a new group's start offsets before falling back.
PIN_ATTEMPTS = 3

ConsumerFactory = Callable[[dict[str, Any]], Any]
_Headers = list[tuple[str, bytes | str | None]] | None


class TokenBucket:
    """Events-per-second limit with a burst of one second's worth (at least one event)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.clock = clock
        self.stamp = clock()

    def take(self) -> float:
        """Take a token: 0.0 if granted, else the seconds until one is available."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(eq=False)
class _Partition:
    number: int
    consumed: Any  # the prometheus child counter, looked up once
    tp: TopicPartition
    queue: deque[Message] = field(default_factory=deque)
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    in_flight: int = 0
    paused: bool = False
    cap: int = QUEUE_RECORDS
    queued_bytes: int = 0
    #: Commit position not yet handed to ``store_offsets`` (stored once per poll round, not per event).
    unstored: int | None = None


class SubscriptionConsumer:
    """The consumer group member of one subscriber; ``run()`` until ``stop()``."""

    def __init__(
        self,
        channel: Channel,
        subscriber: Subscriber,
        *,
        group_id: str,
        consumer_config: dict[str, Any],
        deliverer: Deliverer,
        metrics: Metrics,
        board: StatusBoard,
        max_in_flight: int,
        consumer_factory: ConsumerFactory = Consumer,
        shutdown_grace: float = 5.0,
        queue_bytes: int = 4 * DEFAULT_QUEUE_BYTES,
    ) -> None:
        self.topic = channel.topic
        self.group_id = group_id
        self.labels = Labels(channel.namespace, channel.name, subscriber.uid)
        self._subscriber = subscriber
        self._ordered = subscriber.ordered  # channels.py already defaults it to the channel's order
        self._config = {**consumer_config, "error_cb": self._on_error}
        self._initial = str(consumer_config.get("auto.offset.reset", "latest"))
        self._deliverer = deliverer
        self._metrics = metrics
        self._board = board
        self.max_in_flight = max(1, max_in_flight)
        self._factory = consumer_factory
        self._grace = shutdown_grace
        #: Bytes of record values this subscription may hold in its local queues (all partitions together).
        self.queue_bytes = queue_bytes
        self._byte_cap = DEFAULT_QUEUE_BYTES
        self._avg_size = 1024.0  # running mean of record sizes, to turn free bytes into a record count
        self._consumer: Any = None
        self._parts: dict[int, _Partition] = {}
        self._in_flight = 0
        self._stopping = False
        self._waiter: asyncio.Future[None] | None = None
        self._bucket = TokenBucket(subscriber.rate_limit) if subscriber.rate_limit else None
        self._rate_timer: asyncio.TimerHandle | None = None
        self._joined = False
        self._next_lag = 0.0
        self._lag_seen: set[tuple[str, str, str]] = set()
        self._unstored: list[_Partition] = []
        self._rotation: deque[_Partition] = deque()  # unordered round robin over the partitions
        # Read when scraped instead of two updates per event; a replacement consumer of the same subscriber
        # takes the gauge over.
        metrics.in_flight.labels(*self.labels).set_function(lambda: self._in_flight)
        self._outcomes = {o: metrics.outcomes.labels(*self.labels, o.value) for o in Outcome}

    # -- public -------------------------------------------------------------------------------------
    @property
    def subscriber(self) -> Subscriber:
        return self._subscriber

    @property
    def joined(self) -> bool:
        return self._joined

    @property
    def ordered(self) -> bool:
        return self._ordered

    def update(self, subscriber: Subscriber) -> None:
        """A changed delivery spec, URI, order or rate limit applies to the next event, without a restart."""
        self._subscriber = subscriber
        self._ordered = subscriber.ordered
        self._bucket = TokenBucket(subscriber.rate_limit) if subscriber.rate_limit else None
        self._resize()
        current = self._board.get(subscriber.uid)
        if current is not None:
            self._board.set(subscriber.uid, subscriber.generation, current.ready, current.message)
        self._pump()

    def stop(self) -> None:
        self._stopping = True
        self._wake()

    def stats(self) -> dict[str, Any]:
        return {
            "group": self.group_id, "joined": self._joined, "ordered": self._ordered, "in_flight": self._in_flight,
            "partitions": {p.number: {"queued": len(p.queue), "in_flight": p.in_flight, "paused": p.paused,
                                      "committable": p.tracker.commit_position} for p in self._parts.values()},
        }

    async def run(self) -> None:
        self._consumer = self._factory(self._config)
        try:
            self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_lost)
            idle = 0
            while not self._stopping:
                room, full = self._room()
                try:
                    messages = self._consumer.consume(room, 0)
                except KafkaException as exc:
                    log.warning("consume failed", extra={**self.labels.as_dict(), "error": str(exc)})
                    messages = []
                for message in messages:
                    self._accept(message)
                if messages:
                    self._pump()
                self._store_done()
                self._flow_control()
                self._report_lag()
                if len(messages) >= room > 1:
                    await asyncio.sleep(0)  # a full batch: more is probably waiting
                    continue
                # Nothing or a partial batch: librdkafka's queue is drained. Sleep a little (longer while idle)
                # instead of spinning on one-record polls; a freed queue slot wakes the loop early.
                # A full budget counts as idle too: one record per poll would otherwise grow the queues past it.
                idle = idle + 1 if not messages or full else 1
                if not messages and idle <= HUNGRY_POLLS and self._hungry():
                    await self._sleep(HUNGRY_POLL)
                else:
                    await self._sleep(min(MAX_IDLE_POLL, 0.002 * idle))
            await self._drain()
        finally:
            consumer, self._consumer = self._consumer, None
            try:
                consumer.close()  # leaves the group now instead of after session.timeout.ms
            except (KafkaException, RuntimeError) as exc:
                log.warning("consumer close failed", extra={**self.labels.as_dict(), "error": str(exc)})
            self._drop_all()

    # -- intake -------------------------------------------------------------------------------------
    def _accept(self, message: Message) -> None:
        err = message.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            self._on_error(err)
            return
        number, offset = message.partition(), message.offset()
        part = self._parts.get(number) if number is not None else None
        if part is None or offset is None:
            return  # revoked between fetch and now: the new owner reads it
        if not part.tracker.add(offset):
            log.debug("record below an offset already seen, skipped", extra={"offset": offset})
            return
        part.queue.append(message)
        size = len(message.value() or b"")
        part.queued_bytes += size
        self._avg_size += (size - self._avg_size) * 0.05
        part.consumed.inc()

    async def _sleep(self, seconds: float) -> None:
        """Sleep until ``seconds`` pass or ``_wake()`` is called (cheaper than wait_for on an Event)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, self._wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _room(self) -> tuple[int, bool]:
        """How many records to take now: the free local queue space, so Python never holds more than the budget.

        Ordered, each partition has its own share of the byte budget (``queue_bytes``): its events wait for
        nothing but its own, so a full partition is paused rather than let it hold records that another, idle
        one needs (librdkafka hands records over in fetch order). Unordered, the partitions feed one in-flight
        budget, so they share the byte budget: while it is full, records wait in librdkafka's own (bounded)
        prefetch instead of being dropped by a pause (see ``_flow_control``). At least one: polling must go on for
        rebalance callbacks and ``max.poll.interval.ms``; the flag says the budget is full.
        """
        records = 0
        queued = 0
        open_free = 0
        for p in self._parts.values():
            queued += p.queued_bytes
            if not p.paused:
                records += max(0, p.cap - len(p.queue))
                open_free += max(0, self._byte_cap - p.queued_bytes)
        free_bytes = open_free if self._ordered else min(open_free, max(0, self.queue_bytes - queued))
        free = min(records, int(free_bytes / max(1.0, self._avg_size)))
        return max(1, min(CONSUME_BATCH, free)), free < 1

    def _hungry(self) -> bool:
        """The local queues run low while an open partition has records at the broker past the last one seen.

        That is a fetch under way (or a refetch after a resume: pausing dropped the partition's prefetched
        records), not an idle topic, so records are polled for every millisecond instead of after the idle
        back-off. Uses the watermarks librdkafka cached from its last fetch responses (no request).
        """
        if sum(p.queued_bytes for p in self._parts.values()) > self.queue_bytes // 2:
            return False  # plenty left to deliver: the normal back-off notices new records in time
        for part in self._parts.values():
            last = part.tracker.last
            if part.paused or last < 0:
                continue
            try:
                _low, high = self._consumer.get_watermark_offsets(part.tp, cached=True)
            except KafkaException:
                continue
            if high > last + 1:
                return True
        return False

    def _resize(self) -> None:
        """Local queue length per partition: enough to hide the poll interval, small enough for flat RSS."""
        partitions = max(1, len(self._parts))
        cap = QUEUE_RECORDS
        if not self._ordered:
            cap = max(QUEUE_RECORDS, math.ceil(4 * self.max_in_flight / partitions))
        share = self.queue_bytes // partitions
        # Unordered, no partition is paused for its share (see _flow_control); the cap only spreads _room()'s
        # intake. Pausing drops librdkafka's prefetched records of the partition, and librdkafka takes 0.1-0.5 s
        # to fetch again after a resume.
        self._byte_cap = max(32 * 1024, share if self._ordered else 2 * share)
        for part in self._parts.values():
            part.cap = cap
        self._rotation = deque(self._parts.values())

    def _flow_control(self) -> None:
        pause, resume = [], []
        queued = sum(p.queued_bytes for p in self._parts.values())
        for part in self._parts.values():
            if not part.paused and self._must_pause(part, queued):
                part.paused = True
                pause.append(part.tp)
            elif part.paused and self._may_resume(part, queued):
                part.paused = False
                resume.append(part.tp)
        try:
            if pause:
                self._consumer.pause(pause)
            if resume:
                self._consumer.resume(resume)
        except KafkaException as exc:
            log.warning("pause/resume failed", extra={**self.labels.as_dict(), "error": str(exc)})

    def _must_pause(self, part: _Partition, queued: int) -> bool:
        """Ordered: a partition over its share. Unordered: every partition, once together they hold twice the budget.

        Unordered, no partition is paused for holding more than its share. A pause drops librdkafka's prefetched
        records, and a resumed partition is fetched again only after the fetch under way returns (up to
        fetch.wait.max.ms), from the start of the record batch: with a producer's large batches, pausing at a
        share delivered ~500 records per pause/resume cycle, ~1,000 events/s, once only one partition had records
        left (docs/dispatcher.md). The intake is bounded by _room(); pausing stays as the valve for a subscriber
        that takes nothing (one record per poll beyond the budget).
        """
        if self._ordered:
            return len(part.queue) >= part.cap or part.queued_bytes >= self._byte_cap
        return queued >= 2 * self.queue_bytes

    def _may_resume(self, part: _Partition, queued: int) -> bool:
        """``queued``: the bytes all partitions hold (only the unordered rule reads it)."""
        if self._ordered:
            return len(part.queue) <= part.cap // 2 and part.queued_bytes <= self._byte_cap // 2
        return queued <= self.queue_bytes

    # -- scheduling ---------------------------------------------------------------------------------
    def _rate_ok(self) -> bool:
        if self._bucket is None:
            return True
        wait = self._bucket.take()
        if wait == 0.0:
            return True
        if self._rate_timer is None:
            loop = asyncio.get_running_loop()
            self._rate_timer = loop.call_later(wait, self._rate_wakeup)
        return False

    def _rate_wakeup(self) -> None:
        self._rate_timer = None
        self._pump()

    def _pump(self) -> None:
        """Start as many queued events as ordering, the in-flight budget and the rate limit allow."""
        if self._stopping or self._consumer is None:
            return
        if self._ordered:
            for part in self._parts.values():
                if part.in_flight == 0 and part.queue:
                    if not self._rate_ok():
                        return
                    self._start(part, part.queue.popleft())
            return
        # Round robin that goes on across calls (each finished event frees one slot, and the next partition in
        # turn gets it): one busy partition never takes the whole budget while the others sit paused, full.
        rotation = self._rotation
        skipped = 0
        while self._in_flight < self.max_in_flight and skipped < len(rotation):
            part = rotation[0]
            rotation.rotate(-1)
            if not part.queue:
                skipped += 1
                continue
            skipped = 0
            if not self._rate_ok():
                return
            self._start(part, part.queue.popleft())

    def _start(self, part: _Partition, message: Message) -> None:
        part.queued_bytes -= len(message.value() or b"")
        part.in_flight += 1
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._deliver(part, message))
        part.tasks.add(task)
        task.add_done_callback(part.tasks.discard)

    async def _deliver(self, part: _Partition, message: Message) -> None:
        failures = 0
        while True:
            try:
                outcome = await self._deliverer.handle(
                    cast(_Headers, message.headers()), message.value(), self._subscriber, self.labels)
                break
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug, not a delivery failure: never commit past it; try again after a pause.
                failures += 1
                log.exception("dispatching failed unexpectedly, will retry", extra=self.labels.as_dict())
                await asyncio.sleep(min(30.0, 0.1 * 2**failures))
        self._outcomes[outcome].inc()
        if self._parts.get(part.number) is not part:
            return  # revoked meanwhile; the new owner redelivers from the committed offset
        part.in_flight -= 1
        self._in_flight -= 1
        position = part.tracker.done(cast(int, message.offset()))
        if position is not None:
            if part.unstored is None:
                self._unstored.append(part)
            part.unstored = position
        self._pump()
        if part.paused and self._may_resume(part, sum(p.queued_bytes for p in self._parts.values())):
            self._wake()  # let the poll loop resume the partition now rather than after its idle sleep

    def _store_done(self) -> None:
        """Hand the moved marks to librdkafka's auto-commit: once per poll round, in one call.

        The round comes at least every ``MAX_IDLE_POLL`` and the commit itself only every
        ``auto.commit.interval.ms``, so storing per event bought nothing but a call (and a TopicPartition) each.
        Revoke and shutdown commit the trackers' marks directly, so nothing waits on this.
        """
        if not self._unstored:
            return
        offsets = []
        for part in self._unstored:
            if part.unstored is not None and self._parts.get(part.number) is part:
                offsets.append(TopicPartition(self.topic, part.number, part.unstored))
            part.unstored = None
        self._unstored.clear()
        if not offsets:
            return
        try:
            self._consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:
            log.debug("store_offsets failed", extra={**self.labels.as_dict(), "error": str(exc)})

    # -- rebalance ----------------------------------------------------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._position(consumer, partitions)
        for tp in partitions:
            child = self._metrics.consumed.labels(self.group_id, str(tp.partition), tp.topic)
            self._parts[tp.partition] = _Partition(tp.partition, child, TopicPartition(self.topic, tp.partition))
        self._resize()
        log.info("partitions assigned", extra={**self.labels.as_dict(), "group": self.group_id,
                                                "partitions": [tp.partition for tp in partitions]})
        self._joined = True
        sub = self._subscriber
        if partitions or self._topic_exists(consumer):
            # The group has been joined (an empty assignment counts: more members than partitions).
            self._board.set(sub.uid, sub.generation, True, "")
        else:
            self._board.set(sub.uid, sub.generation, False, f"topic {self.topic} does not exist")

    def _topic_exists(self, consumer: Any) -> bool:
        try:
            metadata = consumer.list_topics(self.topic, timeout=5)
        except KafkaException:
            return True  # unknown: do not report a problem we could not see
        found = metadata.topics.get(self.topic)
        return found is not None and found.error is None and bool(found.partitions)

    def _position(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Pin where a new group starts and commit it, before reporting the group as joined.

        Left to ``auto.offset.reset``, "latest" is resolved lazily after the assignment: events produced in
        between — or while the dispatcher is down before its first commit — would be skipped. Committed
        offsets always win; only partitions without one get the initial position.
        """
        if not partitions:
            return
        # The group coordinator may still be loading right after a join (or the broker busy): a few tries
        # before falling back, since the fallback can skip events produced before the first commit.
        positions: list[TopicPartition] | None = None
        start: list[TopicPartition] = []
        for attempt in range(PIN_ATTEMPTS):
            try:
                positions, start = self._start_positions(consumer, partitions)
                break
            except KafkaException as exc:
                if attempt == PIN_ATTEMPTS - 1:
                    log.warning("could not pin start offsets; falling back to auto.offset.reset",
                                extra={**self.labels.as_dict(), "error": str(exc)})
                    return
                time.sleep(0.5)
        assert positions is not None
        try:
            consumer.incremental_assign(positions)
        except KafkaException:
            consumer.assign(positions)  # an eager assignment strategy configured through KE_KAFKA_EXTRA
        for attempt in range(PIN_ATTEMPTS if start else 0):
            try:
                consumer.commit(offsets=start, asynchronous=False)
                break
            except KafkaException as exc:
                if attempt == PIN_ATTEMPTS - 1:
                    log.warning("commit of start offsets failed",
                                extra={**self.labels.as_dict(), "error": str(exc)})
                else:
                    time.sleep(0.5)

    def _start_positions(self, consumer: Any,
                         partitions: list[TopicPartition]) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Committed offsets, and the initial position for partitions that have none (to be committed)."""
        positions = consumer.committed(partitions, timeout=10)
        start: list[TopicPartition] = []
        for tp in positions:
            if tp.offset < 0:
                low, high = consumer.get_watermark_offsets(tp, timeout=10)
                tp.offset = high if self._initial == "latest" else low
                start.append(TopicPartition(tp.topic, tp.partition, tp.offset))
        return positions, start

    def _release(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Forget the partitions; cancel their in-flight deliveries; return what may be committed."""
        done = []
        for tp in partitions:
            part = self._parts.pop(tp.partition, None)
            if part is None:
                continue
            self._in_flight -= part.in_flight
            for task in list(part.tasks):
                task.cancel()
            if part.tracker.commit_position is not None:
                done.append(TopicPartition(self.topic, part.number, part.tracker.commit_position))
            key = (self.group_id, str(part.number), self.topic)
            if key in self._lag_seen:
                self._lag_seen.discard(key)
                self._metrics.lag.remove(*key)
        self._resize()
        return done

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        done = self._release(partitions)
        log.info("partitions revoked",
                 extra={**self.labels.as_dict(), "partitions": [tp.partition for tp in partitions]})
        if done:
            try:
                consumer.commit(offsets=done, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed", extra={**self.labels.as_dict(), "error": str(exc)})

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        # Another member may own them already: committing now could move its offsets backwards.
        self._release(partitions)
        log.warning("partitions lost", extra={**self.labels.as_dict(),
                                               "partitions": [tp.partition for tp in partitions]})

    def _on_error(self, err: KafkaError) -> None:
        code = err.code()
        if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            message = f"topic {self.topic} does not exist"
        elif err.fatal() or code in (KafkaError._AUTHENTICATION, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                     KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError._ALL_BROKERS_DOWN):
            message = f"Kafka: {err.str()}"
        else:
            log.debug("consumer error", extra={**self.labels.as_dict(), "error": err.str()})
            return
        log.warning("subscription cannot consume", extra={**self.labels.as_dict(), "error": message})
        if not self._joined or code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            self._board.set(self._subscriber.uid, self._subscriber.generation, False, message)

    # -- shutdown -----------------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Let in-flight deliveries finish (bounded), then commit what is done."""
        tasks = [t for p in self._parts.values() for t in p.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=self._grace)
        done = []
        for part in self._parts.values():
            for task in list(part.tasks):
                task.cancel()
            if part.tracker.commit_position is not None:
                done.append(TopicPartition(self.topic, part.number, part.tracker.commit_position))
        if done:
            try:
                self._consumer.commit(offsets=done, asynchronous=False)
            except KafkaException as exc:
                log.warning("final commit failed", extra={**self.labels.as_dict(), "error": str(exc)})

    def _drop_all(self) -> None:
        for part in self._parts.values():
            for task in list(part.tasks):
                task.cancel()
        self._parts.clear()
        self._in_flight = 0

    def _report_lag(self) -> None:
        now = time.monotonic()
        if now < self._next_lag:
            return
        self._next_lag = now + LAG_INTERVAL
        for part in self._parts.values():
            position = part.tracker.commit_position
            if position is None:
                continue
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, part.number), cached=True)
            except KafkaException:
                continue
            if high < 0:
                continue
            key = (self.group_id, str(part.number), self.topic)
            self._lag_seen.add(key)
            self._metrics.lag.labels(*key).set(max(0, high - position))
