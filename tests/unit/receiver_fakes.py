"""Fakes for receiver unit tests: a producer whose delivery reports succeed, fail or never come."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from kafka_eventing.core.channels import Channel, ChannelKey
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.app import create_app
from kafka_eventing.receiver.sender import KafkaSender


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]


@dataclass
class FakeProducer:
    """``mode`` decides each report: ok | error | never | hold (until release()) | buffer (BufferError) |
    too_large (KafkaException).

    ``modes`` (per produce call, in order) overrides ``mode`` while it lasts. Reports are handed out from
    ``poll``, as librdkafka does, so the receiver's poll thread is exercised.
    """

    mode: str = "ok"
    modes: list[str] = field(default_factory=list)
    reachable: bool = True
    produced: list[Produced] = field(default_factory=list)
    _reports: list[tuple[Callable[[Any, Any], None], Any]] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    flushed: int = 0
    held: list[Callable[[Any, Any], None]] = field(default_factory=list)

    def release(self, err: Any = None) -> None:
        with self._cond:
            self._reports.extend((cb, err) for cb in self.held)
            self.held.clear()
            self._cond.notify_all()

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                headers: Any = None, on_delivery: Callable[[Any, Any], None] | None = None) -> None:
        mode = self.modes.pop(0) if self.modes else self.mode
        if mode == "buffer":
            raise BufferError("Local: Queue full")
        if mode == "too_large":
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.produced.append(Produced(topic, value, key, list(headers or [])))
        if mode == "never" or on_delivery is None:
            return
        if mode == "hold":  # reported later, by release()
            self.held.append(on_delivery)
            return
        err = KafkaError(KafkaError._MSG_TIMED_OUT) if mode == "error" else None
        with self._cond:
            self._reports.append((on_delivery, err))
            self._cond.notify_all()

    def poll(self, timeout: float = -1) -> int:
        with self._cond:
            if not self._reports:
                self._cond.wait(timeout if timeout >= 0 else None)
            reports, self._reports = self._reports, []
        for callback, err in reports:
            callback(err, None)
        return len(reports)

    def flush(self, timeout: float = -1) -> int:
        self.flushed += 1
        self.poll(0)
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        if not self.reachable:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return object()


class FakeChannels:
    """A ChannelSource with a fixed set."""

    def __init__(self, *channels: Channel, synced: bool = True) -> None:
        self.channels: dict[ChannelKey, Channel] = {c.key: c for c in channels}
        self._synced = synced

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def synced(self) -> bool:
        return self._synced

    def get(self, key: ChannelKey) -> Channel | None:
        return self.channels.get(key)

    def snapshot(self) -> dict[ChannelKey, Channel]:
        return dict(self.channels)

    def subscribe(self, callback: Callable[[dict[ChannelKey, Channel]], None]) -> None:
        pass


def make_app(producer: FakeProducer, *channels: Channel, settings: Settings | None = None,
             message_max_bytes: int = 1_000_000, synced: bool = True) -> tuple[Any, KafkaSender]:
    settings = settings or Settings(produce_timeout_seconds=0.3, max_event_bytes=4096, retry_after_seconds=7)
    sender = KafkaSender(producer, timeout=settings.produce_timeout_seconds, poll_interval=0.05)
    app = create_app(producer, FakeChannels(*channels, synced=synced), settings, sender=sender,
                     message_max_bytes=message_max_bytes)
    return app, sender
