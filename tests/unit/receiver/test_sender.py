"""The receiver's event-loop machinery: answers through the whole app, and delivery reports served on the loop."""

from __future__ import annotations

import pytest
from falcon import testing

from kafka_eventing.core.channels import Channel
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.app import create_app
from kafka_eventing.receiver.sender import KafkaSender

from .fakes import FakeChannels, FakeProducer

ORDERS = Channel("shop", "orders", "shop.orders")
HEADERS = {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/t", "ce-type": "t",
           }
HOST = "orders-kn-channel.shop.svc"  # falcon's ASGI simulator sets Host from its `host` argument


def client_for(producer: FakeProducer) -> tuple[testing.TestClient, KafkaSender]:
    settings = Settings(produce_timeout_seconds=0.3, max_event_bytes=4096)
    sender = KafkaSender(producer, timeout=0.3)
    app = create_app(producer, FakeChannels(ORDERS), settings, sender=sender)
    return testing.TestClient(app), sender


@pytest.mark.parametrize(("mode", "body", "status"), [
    ("ok", b"data", 202), ("error", b"data", 503), ("never", b"data", 503), ("buffer", b"data", 503),
    ("ok", b"x" * 4097, 413), ("broker_too_large", b"data", 413),
])
def test_status_codes(mode: str, body: bytes, status: int) -> None:
    producer = FakeProducer(mode=mode)
    client, sender = client_for(producer)
    try:
        res = client.simulate_post("/", body=body, headers=HEADERS, host=HOST)
    finally:
        sender.close(0.5)
    assert res.status_code == status, res.text
    if status == 202:
        assert producer.produced[0].value == body


def test_routing_and_other_endpoints() -> None:
    producer = FakeProducer()
    client, sender = client_for(producer)
    try:
        assert client.simulate_post("/shop/nope", body=b"x", headers=HEADERS).status_code == 404
        assert client.simulate_post("/", body=b"x", headers={**HEADERS, "ce-id": ""}, host=HOST).status_code == 400
        res = client.simulate_options("/", headers={"WebHook-Request-Origin": "o.example"})
        assert res.headers["WebHook-Allowed-Origin"] == "o.example"
        assert client.simulate_get("/").status_code == 405
        # falcon's own errors answer in the same JSON shape as ours
        for res in (client.simulate_post("/x", body=b"x", headers=HEADERS), client.simulate_put("/shop/orders")):
            assert res.status_code in (404, 405) and "error" in res.json, res.text
        assert client.simulate_get("/healthz").status_code == 200
        assert client.simulate_get("/readyz").json == {"channels": True, "accepting": True}
        assert "kafka_receiver_events_total" in client.simulate_get("/metrics").text
    finally:
        sender.close(0.5)


def test_reports_are_served_on_the_event_loop_thread() -> None:
    """No poll thread: the loop polls, so the report callback runs on the loop's own thread."""
    import asyncio
    import threading

    from kafka_eventing.core.binding import KafkaRecord
    from kafka_eventing.receiver.sender import AsyncPending, LoopPoller, Outcome

    async def run() -> tuple[list[int], Outcome, Outcome, int]:
        producer = FakeProducer(modes=["ok", "hold"])
        sender = KafkaSender(producer, timeout=1.0)
        poller = LoopPoller([producer], asyncio.get_running_loop(), busy_interval=0.001, idle_interval=0.05)
        poller.start()
        threads: list[int] = []
        record = KafkaRecord(None, b"v", [])
        first = sender.submit_async("t", [record], poller)
        assert isinstance(first, AsyncPending)
        callback = first.on_delivery
        first_threads = threads

        def spy(err: object, msg: object) -> None:
            first_threads.append(threading.get_ident())
            callback(err, msg)

        # The fake hands reports to whatever callback produce() got: wrap it before the first poll.
        producer._reports[0] = (spy, producer._reports[0][1])
        await asyncio.wait_for(first.future, 1.0)
        second = sender.submit_async("t", [record], poller)
        assert isinstance(second, AsyncPending)
        await asyncio.sleep(0.02)
        assert not second.future.done() and poller.outstanding == 1  # held: still waiting, still polled
        producer.release()
        await asyncio.wait_for(second.future, 1.0)
        poller.stop()
        return threads, first.result().outcome, second.result().outcome, poller.outstanding

    threads, first, second, outstanding = asyncio.run(run())
    assert threads == [threading.get_ident()]  # asyncio.run's loop runs on this thread
    assert first is second is Outcome.DELIVERED
    assert outstanding == 0


def test_a_report_served_by_another_thread_still_resolves_on_the_loop() -> None:
    """At shutdown, flush() serves reports from a worker thread: the future is still set on the loop."""
    import asyncio

    from kafka_eventing.core.binding import KafkaRecord
    from kafka_eventing.receiver.sender import AsyncPending, LoopPoller, Outcome

    async def run() -> Outcome:
        producer = FakeProducer(mode="ok")
        sender = KafkaSender(producer, timeout=1.0)
        poller = LoopPoller([producer], asyncio.get_running_loop(), busy_interval=10, idle_interval=10)
        pending = sender.submit_async("t", [KafkaRecord(None, b"v", [])], poller)
        assert isinstance(pending, AsyncPending)
        await asyncio.to_thread(producer.flush, 1.0)
        await asyncio.wait_for(pending.future, 1.0)
        poller.stop()
        return pending.result().outcome

    assert asyncio.run(run()) is Outcome.DELIVERED


def test_linger_batches_only_above_its_rate_and_comes_back_below_three_quarters() -> None:
    from kafka_eventing.receiver.sender import Linger

    linger = Linger(batch_above=1000, window=0.1)

    def run(rate: float, start: float, seconds: float) -> list[bool]:
        return [linger.batch(start + i / rate) for i in range(int(rate * seconds))]

    assert not any(run(500, 0.0, 1.0))  # lightly loaded: every request goes out at once
    assert run(2000, 1.0, 1.0)[-100:] == [True] * 100  # busy: batched once a window has seen the rate
    assert all(run(900, 2.0, 1.0)[100:])  # 900/s is over three quarters of 1,000: still batching
    assert not any(run(600, 3.0, 1.0)[100:])  # below three quarters: back to sending at once
    assert not linger.batch(60.0)  # the first request after a quiet minute goes out at once


def test_linger_batches_a_backlog_below_its_rate_and_comes_back_once_it_clears() -> None:
    """A worker too slow to reach the threshold rate sending at once (saturated, its records waiting for their
    reports) batches anyway; once the records waiting fall back and the rate is low, it sends at once again."""
    from kafka_eventing.receiver.sender import Linger

    linger = Linger(batch_above=1000, window=0.1)
    assert linger.backlog_above == 10  # 10 ms of the threshold rate

    def run(rate: float, start: float, seconds: float, waiting: int) -> list[bool]:
        return [linger.batch(start + i / rate, waiting) for i in range(int(rate * seconds))]

    assert not any(run(600, 0.0, 1.0, waiting=5))  # records answered promptly: at once
    assert all(run(600, 1.0, 1.0, waiting=200)[100:])  # the same rate with 200 records waiting: batched
    assert not any(run(600, 2.0, 1.0, waiting=3)[100:])  # the backlog gone: at once again
    assert run(600, 3.0, 1.0, waiting=11)[-1]  # just past 10 ms of the threshold rate


def test_two_producers_take_requests_by_rate_and_both_are_served_and_flushed() -> None:
    import asyncio
    import threading

    from kafka_eventing.core.binding import KafkaRecord
    from kafka_eventing.receiver.sender import AsyncPending, Linger, LoopPoller

    batching, immediate = FakeProducer(), FakeProducer()
    linger = Linger(batch_above=1000, window=0.1)
    sender = KafkaSender(batching, timeout=1.0, immediate=immediate, linger=linger)
    assert sender.producers == (batching, immediate)

    async def main() -> None:
        # The ticks poll the batching producer only: the immediate producer's report comes through its thread.
        poller = LoopPoller([batching], asyncio.get_running_loop(), busy_interval=0.001, idle_interval=0.05,
                            threaded=[immediate])
        poller.start()
        try:
            pending = sender.submit_async("t", [KafkaRecord(key=None, value=b"quiet", headers=[])], poller)
            assert isinstance(pending, AsyncPending)
            await asyncio.wait_for(pending.future, 1.0)
            assert pending.result().ok
            assert poller.outstanding == 0  # counted down on the loop, after the thread's hand-off
            assert poller.threaded_outstanding == 0  # its own count, also down once the report reached the loop
            linger.batching = True  # as after a busy window
            linger.started = poller.loop.time()
            pending = sender.submit_async("t", [KafkaRecord(key=None, value=b"busy", headers=[])], poller)
            assert isinstance(pending, AsyncPending)
            await asyncio.wait_for(pending.future, 1.0)
        finally:
            poller.stop()
        assert not any(t.name == "producer-poll" for t in threading.enumerate())  # stopped with the poller

    asyncio.run(main())
    assert [r.value for r in immediate.produced] == [b"quiet"]
    assert [r.value for r in batching.produced] == [b"busy"]
    assert sender.close(0.5) == 0
    assert batching.flushed and immediate.flushed


def test_a_request_on_the_threaded_producer_leaves_the_tick_idle_and_still_times_out_at_its_deadline() -> None:
    """The immediate producer's reports come through its thread: no 1 ms ticks for them, but a report that never
    comes still ends the wait at the request's deadline, not at the next idle tick (here 10 s away)."""
    import asyncio

    from kafka_eventing.core.binding import KafkaRecord
    from kafka_eventing.receiver.sender import AsyncPending, Linger, LoopPoller, Outcome

    batching, immediate = FakeProducer(), FakeProducer(modes=["ok", "never"])
    sender = KafkaSender(batching, timeout=0.2, immediate=immediate, linger=Linger(batch_above=1000))

    async def main() -> tuple[Outcome, Outcome, float]:
        loop = asyncio.get_running_loop()
        poller = LoopPoller([batching], loop, busy_interval=0.001, idle_interval=10.0, threaded=[immediate])
        poller.start()
        try:
            record = [KafkaRecord(key=None, value=b"v", headers=[])]
            answered = sender.submit_async("t", record, poller)
            assert isinstance(answered, AsyncPending)
            poller.expire_at(answered, loop.time() + sender.timeout)
            assert poller.outstanding == 0 and not poller._busy  # not counted, no busy tick asked for
            await asyncio.wait_for(answered.future, 1.0)
            lost = sender.submit_async("t", record, poller)
            assert isinstance(lost, AsyncPending)
            started = loop.time()
            poller.expire_at(lost, started + sender.timeout)
            poller._tick()  # as the idle tick would run: the next one is due at the deadline, not in 10 s
            await asyncio.wait_for(lost.future, 2.0)
            return answered.result().outcome, lost.result().outcome, loop.time() - started
        finally:
            poller.stop()

    answered, lost, waited = asyncio.run(main())
    assert answered is Outcome.DELIVERED
    assert lost is Outcome.TIMEOUT
    assert 0.15 <= waited < 1.0
