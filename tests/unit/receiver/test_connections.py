"""The receiver's producer per Kafka connection (fakes for Kafka and the sources): each target's events go to the
producer of the cluster it names, made once, bounded, closed when unused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from falcon import testing

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.channels import Channel
from kafka_eventing.core.kafka_config import ConnectionRef, connection_ref
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.app import create_app
from kafka_eventing.receiver.sender import KafkaSender

from .fakes import BINARY, FakeChannels, FakeProducer

FAR = ConnectionRef("far:9092", "knative-eventing", "far-auth", "c1")
ROTATED = ConnectionRef("far:9092", "knative-eventing", "far-auth", "c2")
OTHER = ConnectionRef("other:9092")
NEAR = Channel("shop", "near", kb.broker_topic("shop", "near"), ordered=False)


def broker(name: str, ref: ConnectionRef | None) -> Channel:
    return Channel("shop", name, kb.broker_topic("shop", name), ordered=False, connection=ref)


class Factory:
    """Makes a KafkaSender on a fresh FakeProducer per connection, and remembers them."""

    def __init__(self, fail: set[ConnectionRef] | None = None) -> None:
        self.made: dict[ConnectionRef, FakeProducer] = {}
        self.calls: list[ConnectionRef] = []
        self.fail = fail or set()

    def __call__(self, ref: ConnectionRef) -> KafkaSender:
        self.calls.append(ref)
        if ref in self.fail:
            raise RuntimeError(f"Secret {ref.secret} does not exist")
        producer = self.made[ref] = FakeProducer()
        return KafkaSender(producer, timeout=0.3)


Post = Callable[[str], Awaitable[Any]]


def run(brokers: FakeChannels, factory: Factory, test: Callable[[Post], Awaitable[None]],
        limit: int = 16) -> FakeProducer:
    """``test`` gets a ``post(name)`` on one running app (one loop, one lifespan), as a worker serves them."""
    settings = Settings(produce_timeout_seconds=0.3, max_event_bytes=4096, retry_after_seconds=7,
                        max_kafka_connections=limit)
    own = FakeProducer()
    sender = KafkaSender(own, timeout=settings.produce_timeout_seconds)
    app = create_app(own, FakeChannels(), settings, sender=sender, brokers=brokers, connect=factory)

    async def main() -> None:
        async with testing.ASGIConductor(app) as conductor:
            async def post(name: str) -> Any:
                return await conductor.simulate_post(f"/shop/{name}", body=b'{"n":1}', headers=BINARY)

            await test(post)

    try:
        asyncio.run(main())
    finally:
        sender.close(1.0)
    return own


def test_each_target_writes_to_the_cluster_it_names_through_one_producer_per_connection() -> None:
    factory = Factory()

    async def test(post: Post) -> None:
        for name in ("near", "far", "far2", "other", "far", "near"):
            assert (await post(name)).status_code == 202

    own = run(FakeChannels(NEAR, broker("far", FAR), broker("far2", FAR), broker("other", OTHER)), factory, test)
    assert [p.topic for p in own.produced] == [kb.broker_topic("shop", "near")] * 2
    assert [p.topic for p in factory.made[FAR].produced] == [kb.broker_topic("shop", n) for n in ("far", "far2", "far")]
    assert [p.topic for p in factory.made[OTHER].produced] == [kb.broker_topic("shop", "other")]
    assert factory.calls == [FAR, OTHER]  # made on first use, once
    assert factory.made[FAR].flushed and factory.made[OTHER].flushed  # and flushed at shutdown


def test_past_the_bound_a_new_connection_is_a_503_and_nothing_is_written() -> None:
    factory = Factory()

    async def test(post: Post) -> None:
        assert (await post("far")).status_code == 202
        refused = await post("other")
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "7"
        assert "KE_MAX_KAFKA_CONNECTIONS" in refused.json["error"]

    own = run(FakeChannels(broker("far", FAR), broker("other", OTHER)), factory, test, limit=1)
    assert factory.calls == [FAR] and not own.produced


def test_a_connection_that_cannot_be_made_is_a_503_and_is_not_retried_at_once() -> None:
    factory = Factory(fail={FAR})

    async def test(post: Post) -> None:
        for _ in range(3):
            answer = await post("far")
            assert answer.status_code == 503 and answer.headers["Retry-After"] == "7"
            assert "Secret knative-eventing/far-auth does not exist" in answer.json["error"]

    own = run(FakeChannels(broker("far", FAR)), factory, test)
    assert factory.calls == [FAR] and not own.produced


def test_concurrent_first_requests_make_one_connection() -> None:
    factory = Factory()

    async def test(post: Post) -> None:
        answers = await asyncio.gather(*(post("far") for _ in range(5)))
        assert [a.status_code for a in answers] == [202] * 5

    run(FakeChannels(broker("far", FAR)), factory, test)
    assert factory.calls == [FAR] and len(factory.made[FAR].produced) == 5


def test_an_unused_or_rotated_connection_is_flushed_and_closed() -> None:
    factory = Factory()
    brokers = FakeChannels(broker("far", FAR), broker("other", OTHER))

    async def test(post: Post) -> None:
        assert (await post("far")).status_code == 202 and (await post("other")).status_code == 202
        brokers.publish(broker("far", ROTATED))  # "other" deleted; far's Secret rotated
        for _ in range(500):
            if factory.made[FAR].flushed and factory.made[OTHER].flushed:
                break
            await asyncio.sleep(0.01)
        assert factory.made[FAR].flushed and factory.made[OTHER].flushed
        assert (await post("far")).status_code == 202

    run(brokers, factory, test)
    assert [p.topic for p in factory.made[ROTATED].produced] == [kb.broker_topic("shop", "far")]
    assert len(factory.made[FAR].produced) == 1
    assert factory.calls == [FAR, OTHER, ROTATED]


def test_connection_ref_from_status_annotations() -> None:
    assert connection_ref(None) is None and connection_ref({"annotations": {}}) is None
    ref = connection_ref({"annotations": FAR.annotations()})
    assert ref == FAR and ref.secret == "knative-eventing/far-auth"
    assert connection_ref({"annotations": OTHER.annotations()}) == OTHER
