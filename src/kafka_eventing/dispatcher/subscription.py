"""One subscription's consumer: the coordinator of polling, scheduling, delivery, commits and rebalances.

The subscription's state lives on the dispatcher's event loop (no locks). The Kafka calls that can block run on
the subscription's own poll thread: ``consume`` (it drains librdkafka's local queue, and while every partition
has room waits there up to the idle back-off for the next record; librdkafka runs the rebalance callbacks inside
it, and they wait on the group coordinator: ``committed()``, watermarks, the synchronous commit on revoke),
``close()`` and the final commit. A slow rebalance of one subscription therefore stalls neither the other
subscriptions nor the probes; the callbacks hand their state changes to the loop and wait for them
(``_on_loop``), so the ordering guarantees are those of a callback on the loop: a revoked partition's deliveries
are cancelled and its mark taken before the commit. Polling continues whatever the deliveries do (a partition
whose local queue is full is paused, not starved of polls), so a long retry sequence never pushes the member past
``max.poll.interval.ms`` and never gets its partition revoked for being slow.

The parts: ``worker.PartitionWorker`` (pacing, delivery and commit marks, shared with the Broker's Trigger lanes),
``flow.FlowControl`` (how much to take, which partitions to pause, the rate limit),
``ordered.OrderedScheduler`` / ``unordered.UnorderedScheduler`` (which event starts next),
``rebalance.Rebalancer`` (assign/revoke/lost and start positions), ``offsets.OffsetTracker`` (what may be
committed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.dispatcher.delivery import AttemptCount, Deliverer, Outcome
from kafka_eventing.dispatcher.flow import DEFAULT_QUEUE_BYTES, WakeableSleep
from kafka_eventing.dispatcher.loop import LoopBound
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.partition import Partition
from kafka_eventing.dispatcher.rebalance import Rebalancer
from kafka_eventing.dispatcher.scheduler import MAX_OUTSTANDING
from kafka_eventing.dispatcher.status import REASON_JOINED, REASON_TOPIC, StatusBoard, consumer_problem
from kafka_eventing.dispatcher.worker import PartitionWorker

log = logging.getLogger(__name__)

#: Longest pause between polls when nothing arrives (also bounds how late a rebalance is noticed).
MAX_IDLE_POLL = 0.05
#: Poll interval while an open partition has records at the broker that librdkafka has not handed over yet
#: (a refetch after a resume): the local queue may run dry meanwhile, so notice the records at once...
HUNGRY_POLL = 0.001
#: ... but only for this many empty polls in a row (transaction markers also leave the watermark ahead).
HUNGRY_POLLS = 100
LAG_INTERVAL = 5.0
ConsumerFactory = Callable[[dict[str, Any]], Any]
#: Decides from the record whether the subscriber wants the event; a record it rejects is finished (its offset
#: committed) without a delivery.
EventFilter = Callable[[Message], bool]
_Headers = list[tuple[str, bytes | str | None]] | None


class SubscriptionConsumer(PartitionWorker[Message], LoopBound):
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
        event_filter: EventFilter | None = None,
        max_outstanding: int = MAX_OUTSTANDING,
    ) -> None:
        topic = subscriber.topic or channel.topic
        super().__init__(topic, subscriber, Labels(channel.namespace, channel.name, subscriber.uid),
                         group_id=group_id, deliverer=deliverer, metrics=metrics, max_in_flight=max_in_flight,
                         queue_bytes=queue_bytes, max_outstanding=max_outstanding)
        self._config = {**consumer_config, "error_cb": self._on_error}
        self._board = board
        self._rebalancer = Rebalancer(self.topic, str(consumer_config.get("auto.offset.reset", "latest")), self,
                                      {**self.labels.as_dict(), "group": group_id})
        self._poller: concurrent.futures.ThreadPoolExecutor | None = None
        self._factory = consumer_factory
        self._filter = event_filter
        self._grace = shutdown_grace
        self._consumer: Any = None
        self._alarm = WakeableSleep()
        self._joined = False
        self._next_lag = 0.0
        self._lag_seen: set[tuple[str, str, str]] = set()
        self._unstored: list[Partition] = []
        #: While the poll loop sleeps on a full budget: bytes still to start before it is woken (0: not waiting).
        self._wake_after = 0

    # -- public -------------------------------------------------------------------------------------
    @property
    def joined(self) -> bool:
        return self._joined

    @property
    def queue_bytes(self) -> int:
        return self.flow.queue_bytes

    def _updated(self, subscriber: Subscriber) -> None:
        current = self._board.get(subscriber.uid)
        if current is not None:
            self._board.set(subscriber.uid, subscriber.generation, current.ready, current.message, current.reason)

    def stop(self) -> None:
        self.stopping = True
        self._wake()

    def stats(self) -> dict[str, Any]:
        partitions = {p.number: {"queued": len(p.queue), "in_flight": p.in_flight, "paused": p.paused,
                                 "outstanding": p.tracker.outstanding, "committable": p.tracker.commit_position}
                      for p in self.parts.values()}
        return {"group": self.group_id, "joined": self._joined, "ordered": self.ordered,
                "in_flight": self.in_flight, "partitions": partitions}

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        poller = self._poller = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"poll-{self._subscriber.uid}"[:40])
        self._consumer = self._factory(self._config)
        try:
            rebalancer = self._rebalancer
            self._consumer.subscribe([self.topic], on_assign=rebalancer.on_assign, on_revoke=rebalancer.on_revoke,
                                     on_lost=rebalancer.on_lost)
            idle = 0
            wait = 0.0  # > 0: the next poll waits up to this long for a first record (see _take)
            while not self.stopping:
                room, full = self.flow.room(self.parts.values(), self.scheduler)
                try:
                    messages = await loop.run_in_executor(poller, self._take, room, wait)
                except KafkaException as exc:
                    log.warning("consume failed", extra={**self.labels.as_dict(), "error": str(exc)})
                    messages = []
                wait = 0.0
                for message in messages:
                    self._accept(message)
                if messages:
                    for part in self.parts.values():
                        if part.received:  # one counter update per partition and poll round, not per record
                            part.consumed.inc(part.received)
                            part.received = 0
                    self.pump()
                self._store_done()
                self.flow.apply(self._consumer, self.parts.values(), self.scheduler, self.labels.as_dict())
                self._report_lag()
                if len(messages) >= room > 1:
                    await asyncio.sleep(0)  # a full batch: more is probably waiting
                    continue
                # Nothing or a partial batch: librdkafka's queue is drained. Sleep a little (longer while idle)
                # instead of spinning on one-record polls; a freed queue slot wakes the loop early.
                # A full budget counts as idle too: one record per poll would otherwise grow the queues past it.
                idle = idle + 1 if not messages or full else 1
                if not messages and idle <= HUNGRY_POLLS and self.flow.hungry(self._consumer, self.parts.values()):
                    await self._sleep(HUNGRY_POLL)
                elif not full and self.parts and not any(p.paused for p in self.parts.values()):
                    # Room everywhere, so nothing waits on a wake-up (a resume, a freed budget): wait in the poll
                    # itself, which a record arriving ends at once, instead of sleeping past it.
                    wait = min(MAX_IDLE_POLL, 0.002 * idle)
                else:
                    if full:
                        # The local queues hold the whole budget: poll again as soon as deliveries have taken half
                        # of it out (not after the idle back-off, up to 50 ms, by when a 64-in-flight subscription
                        # has emptied them and waits on the next poll with nothing to start).
                        self._wake_after = max(1, self.flow.queue_bytes // 2)
                    await self._sleep(min(MAX_IDLE_POLL, 0.002 * idle))
                    self._wake_after = 0
            await self._drain()
        finally:
            consumer = self._consumer
            try:
                # Leaves the group now instead of after session.timeout.ms; its revoke callback commits.
                await asyncio.shield(loop.run_in_executor(poller, consumer.close))
            except (KafkaException, RuntimeError) as exc:
                log.warning("consumer close failed", extra={**self.labels.as_dict(), "error": str(exc)})
            finally:
                self._consumer = None
                poller.shutdown(wait=False)
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
        part = self.parts.get(number) if number is not None else None
        if part is None or offset is None:
            return  # revoked between fetch and now: the new owner reads it
        if not part.tracker.add(offset):
            log.debug("record below an offset already seen, skipped", extra={"offset": offset})
            return
        part.queue.append(message)
        size = len(message.value() or b"")
        part.queued_bytes += size
        self.flow.taken(size)
        part.received += 1

    def _take(self, room: int, wait: float) -> list[Message]:
        """On the poll thread: up to ``room`` records from librdkafka's local queue. With ``wait``, first block
        up to that long for one record (its arrival ends the wait), then take the rest without waiting."""
        consumer = self._consumer
        if wait <= 0:
            return cast(list[Message], consumer.consume(room, 0))
        first = cast(list[Message], consumer.consume(1, wait))
        if not first or room <= 1:
            return first
        return first + cast(list[Message], consumer.consume(room - 1, 0))

    async def _sleep(self, seconds: float) -> None:
        """Sleep until ``seconds`` pass or ``_wake()`` is called."""
        await self._alarm.sleep(seconds)

    def _wake(self) -> None:
        self._alarm.wake()

    # -- the worker's adapter -----------------------------------------------------------------------
    def _size(self, item: Message) -> int:
        return len(item.value() or b"")

    def _offset(self, item: Message) -> int:
        return cast(int, item.offset())

    def _wants(self, item: Message) -> bool:
        accept = self._subscriber.event_filter or self._filter
        return accept is None or accept(item)

    async def _send(self, item: Message, count: AttemptCount) -> Outcome:
        return await self._deliverer.handle(cast(_Headers, item.headers()), item.value(), self._subscriber,
                                            self.labels, count, record=item)

    def _may_start(self) -> bool:
        return self._consumer is not None

    def _started(self, size: int) -> None:
        if self._wake_after > 0:
            self._wake_after -= size
            if self._wake_after <= 0:
                self._wake()  # the poll loop waits for room in a full budget: there is room now

    def _moved(self, part: Partition, position: int) -> None:
        if part.unstored is None:
            self._unstored.append(part)
        part.unstored = position

    def _delivered(self, part: Partition) -> None:
        if part.paused and self.flow.may_resume(part, self.parts.values(), self.scheduler):
            self._wake()  # let the poll loop resume the partition now rather than after its idle sleep

    def _forget(self, number: int) -> None:
        key = (self.group_id, str(number), self.topic)
        if key in self._lag_seen:
            self._lag_seen.discard(key)
            self._metrics.lag.remove(*key)

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
            if part.unstored is not None and self.parts.get(part.number) is part:
                offsets.append(TopicPartition(self.topic, part.number, part.unstored))
            part.unstored = None
        self._unstored.clear()
        if not offsets:
            return
        try:
            self._consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:
            log.debug("store_offsets failed", extra={**self.labels.as_dict(), "error": str(exc)})

    # -- rebalance (rebalance.Owner) ----------------------------------------------------------------
    def assigned(self, partitions: list[TopicPartition]) -> None:
        self._on_loop(self._assigned, partitions)

    def group_joined(self, topic_exists: bool) -> None:
        self._on_loop(self._group_joined, topic_exists)

    def release(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return self._on_loop(self._release, [tp.partition for tp in partitions])

    def _assigned(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._new_partition(tp.partition, tp.offset, tp.metadata)
        self.flow.resize(self.parts.values(), self.scheduler)

    def _group_joined(self, topic_exists: bool) -> None:
        self._joined = True
        sub = self._subscriber
        if topic_exists:
            self._board.set(sub.uid, sub.generation, True, "", REASON_JOINED)
        else:
            self._board.set(sub.uid, sub.generation, False, f"topic {self.topic} does not exist", REASON_TOPIC)

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error callback (on the poll thread): handled on the loop."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            self._error(err)
        else:
            loop.call_soon_threadsafe(self._error, err)

    def _error(self, err: KafkaError) -> None:
        problem = consumer_problem(err, self.topic)
        if problem is None:
            log.debug("consumer error", extra={**self.labels.as_dict(), "error": err.str()})
            return
        message, reason = problem
        log.warning("subscription cannot consume", extra={**self.labels.as_dict(), "error": message})
        if not self._joined or reason == REASON_TOPIC:
            self._board.set(self._subscriber.uid, self._subscriber.generation, False, message, reason)

    # -- shutdown -----------------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Let in-flight deliveries finish (bounded), then commit what is done."""
        done = await self._finish(self._grace)
        if done:
            commit = self._consumer.commit
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._poller, lambda: commit(offsets=done, asynchronous=False))
            except KafkaException as exc:
                log.warning("final commit failed", extra={**self.labels.as_dict(), "error": str(exc)})

    def _drop_all(self) -> None:
        for part in self.parts.values():
            for task in list(part.tasks):
                task.cancel()
        self.parts.clear()
        self.in_flight = 0

    def _report_lag(self) -> None:
        now = time.monotonic()
        if now < self._next_lag:
            return
        self._next_lag = now + LAG_INTERVAL
        for part in self.parts.values():
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
