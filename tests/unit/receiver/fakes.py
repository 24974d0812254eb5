"""The receiver's unit tests' fakes: channels, a producer, an app and its client, an OIDC issuer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from falcon import testing

from kafka_eventing.core.channels import Channel, ChannelKey
from kafka_eventing.core.settings import Settings
from kafka_eventing.localstack import oidc
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
    too_large (KafkaException) | broker_too_large (a failed report, as when the topic accepts less).

    ``modes`` (per produce call, in order) overrides ``mode`` while it lasts. Reports are handed out from
    ``poll``, as librdkafka does, so the receiver's event-loop poller is exercised.
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
        err = {"error": KafkaError(KafkaError._MSG_TIMED_OUT),
               "broker_too_large": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)}.get(mode)
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
    """A ChannelSource whose set changes only by ``publish``, which tells its subscribers, as the real sources do."""

    def __init__(self, *channels: Channel, synced: bool = True) -> None:
        self.channels: dict[ChannelKey, Channel] = {c.key: c for c in channels}
        self._synced = synced
        self.callbacks: list[Callable[[dict[ChannelKey, Channel]], None]] = []

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
        self.callbacks.append(callback)

    def publish(self, *channels: Channel) -> None:
        self.channels = {c.key: c for c in channels}
        for callback in self.callbacks:
            callback(self.snapshot())


class Client(testing.TestClient):
    """falcon's ASGI simulator takes Host from its ``host`` argument, not from the headers: move it there."""

    def simulate_request(self, *args: Any, **kwargs: Any) -> Any:
        headers = dict(kwargs.get("headers") or {})
        for name in [n for n in headers if n.lower() == "host"]:
            kwargs["host"] = headers.pop(name)
        kwargs["headers"] = headers
        return super().simulate_request(*args, **kwargs)


def make_app(producer: FakeProducer, *channels: Channel, settings: Settings | None = None,
             message_max_bytes: int = 1_000_000, synced: bool = True) -> tuple[Any, KafkaSender]:
    settings = settings or Settings(produce_timeout_seconds=0.3, max_event_bytes=4096, retry_after_seconds=7)
    sender = KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    app = create_app(producer, FakeChannels(*channels, synced=synced), settings, sender=sender,
                     message_max_bytes=message_max_bytes)
    return app, sender


BINARY = {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/test", "ce-type": "order.created",
          "content-type": "application/json"}


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()




AUD = "messaging.knative.dev/kafkachannel/shop/orders"


class Issuer(oidc.Issuer):
    """Tokens for ``AUD`` from one ServiceAccount unless the claims say otherwise."""

    def token(self, kid: str | None = None, **claims: Any) -> str:
        return super().token(kid, **{"aud": [AUD], "sub": "system:serviceaccount:x:y", **claims})
