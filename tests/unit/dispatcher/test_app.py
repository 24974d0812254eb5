"""app: the dispatcher consumes only for Triggers that are not held, reports the held ones, and starts consuming
for a Trigger once it is released."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.brokers import reader_group
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher.factory import create_dispatcher
from kafka_eventing.dispatcher.status import (
    JOINING,
    REASON_JOINING,
    REASON_TRIGGER_NOT_READY,
    MemoryStatusWriter,
    SubscriberStatus,
)

from .fakes import (
    Source,
    trigger,
    with_condition,
)


class Consumer:
    """Never assigned anything: enough to see which groups the dispatcher joins."""

    def __init__(self, config: dict[str, Any], groups: list[str]) -> None:
        groups.append(config["group.id"])

    def subscribe(self, topics: list[str], **_callbacks: Any) -> None: ...
    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return []

    def close(self) -> None: ...


def test_held_triggers_are_reported_and_joined_only_once_released() -> None:
    async def scenario() -> tuple[list[str], list[SubscriberStatus], list[str], list[SubscriberStatus]]:
        groups: list[str] = []
        source = Source()
        held = with_condition(trigger("later"), kb.DEPENDENCY_READY, "False", "DependencyNotReady", "Broker dep")
        source.publish([trigger("now"), held])
        settings = Settings(bootstrap_servers="127.0.0.1:1", broker_namespace="ns", broker_name="b")
        writer = MemoryStatusWriter()
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source, status_writer=writer,
                                       consumer_factory=lambda config: Consumer(config, groups),
                                       registry=CollectorRegistry(), port=-1)
        task = asyncio.create_task(dispatcher.run())
        await dispatcher.wait_started()
        await asyncio.sleep(0.05)
        first_groups, first = list(groups), list(dispatcher.board.statuses())
        assert set(dispatcher.status_document()["subscriptions"]) == {"now"}
        source.publish([trigger("now"), trigger("later")])  # the dependency became ready
        await asyncio.sleep(0.05)
        then_groups, then = list(groups), list(dispatcher.board.statuses())
        assert set(dispatcher.status_document()["subscriptions"]) == {"now", "later"}
        # A consuming Trigger that stops being ready for dispatch (its Broker went away) leaves its group.
        source.publish([with_condition(trigger("now"), kb.BROKER_READY, "False", "BrokerDoesNotExist"),
                        trigger("later")])
        await asyncio.sleep(0.05)
        assert set(dispatcher.status_document()["subscriptions"]) == {"later"}
        assert dispatcher.board.get("now") == SubscriberStatus("now", 3, False, "BrokerReady is False "
                                                               "(BrokerDoesNotExist)", REASON_TRIGGER_NOT_READY)
        dispatcher.stop()
        await task
        return first_groups, first, then_groups, then

    first_groups, first, then_groups, then = asyncio.run(scenario())
    # One shared read for the Broker (its Triggers are lanes of it, each committing to its own group).
    assert first_groups == [reader_group("ns", "b")]
    assert first == [SubscriberStatus("later", 3, False, "DependencyReady is False (DependencyNotReady: Broker dep)",
                                      REASON_TRIGGER_NOT_READY),
                     SubscriberStatus("now", 3, False, JOINING, REASON_JOINING)]
    assert then_groups == first_groups
    assert then[0] == SubscriberStatus("later", 3, False, JOINING, REASON_JOINING)
