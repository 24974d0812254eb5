"""The dispatcher of one Broker: the channel dispatcher's lifecycle (probes, status, resets) around one
``fanout.SharedReader`` fanning out to a lane per Trigger ready for dispatch."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.brokers import reader_group
from kafka_eventing.core.channels import Channel, Subscriber
from kafka_eventing.dispatcher.app import Dispatcher, consumer_settings
from kafka_eventing.dispatcher.fanout import DEFAULT_WINDOW, SharedReader
from kafka_eventing.dispatcher.group_offsets import AdminGroupOffsets, GroupOffsets
from kafka_eventing.dispatcher.lane import TriggerLane
from kafka_eventing.dispatcher.status import REASON_FAILED

log = logging.getLogger(__name__)


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
