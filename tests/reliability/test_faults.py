"""Faults under load, checked against the senders' ledger: every event answered 202 reaches every subscription.

Real processes on loopback: gunicorn + uvicorn workers (the receiver), ``python -m kafka_eventing.dispatcher``
(one process per replica), one KRaft Kafka node, aiohttp subscribers. Faults are real: SIGKILL, SIGTERM, the
broker stopped and started on its data, partitions added, consumer groups rebalanced by starting and stopping
dispatcher processes. The short version (``-m "reliability and not slow"``: crashes, growth, rebalance) runs in
``make test``; everything, with the 10-minute soak, in ``make chaos``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from harness import Route, committed, grow_topic, subscription, topic_index
from rig import Rig, Watch

from waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]
slow = pytest.mark.slow

MakeRig = Callable[..., Rig]
#: The offered load of the short scenarios (events/s, all senders together) and how long it lasts.
RATE, SECONDS = 40.0, 20.0


def one_subscription(rig: Rig, *, ordered: bool = True, delay: float = 0.0) -> dict[str, Watch]:
    rig.subscribers.routes["/s"] = Route(delay=delay)
    rig.channel([subscription("s", rig.subscribers.url("/s"), ordered=ordered)])
    return {"s": Watch("/s")}


def delivered_count(rig: Rig, path: str) -> int:
    return len(rig.subscribers.delivered(path))


# -- receiver crashes -------------------------------------------------------------------------------------------
def test_receiver_worker_kill9(rig: MakeRig) -> None:
    r = rig()
    watches = one_subscription(r)
    r.start_receiver()
    r.add_dispatcher()
    load = r.load(rate=RATE, duration=SECONDS)
    load.wait_accepted(150)
    killed = [r.receiver.kill_worker()]  # type: ignore[union-attr]
    load.wait_accepted(len(r.ledger.accepted()) + 150)
    killed.append(r.receiver.kill_worker())  # type: ignore[union-attr]
    load.wait()
    r.verdict("receiver worker kill -9", watches, notes=[f"workers {killed} killed, replaced by the master"])


@slow
def test_receiver_master_kill9(rig: MakeRig) -> None:
    r = rig()
    watches = one_subscription(r)
    receiver = r.start_receiver()
    r.add_dispatcher()
    load = r.load(rate=RATE, duration=SECONDS + 10)
    load.wait_accepted(200)
    receiver.kill_pod()
    down = time.monotonic()
    receiver.start()
    back = time.monotonic() - down
    load.wait()
    r.verdict("gunicorn master kill -9 (pod restarted)", watches,
              notes=[f"master and workers SIGKILLed as a dying pod; back on the same port after {back:.1f} s"])


@slow
def test_receiver_sigterm_mid_load(rig: MakeRig) -> None:
    r = rig()
    watches = one_subscription(r)
    receiver = r.start_receiver()
    r.add_dispatcher()
    load = r.load(rate=RATE, duration=SECONDS + 10)
    load.wait_accepted(200)
    code = receiver.sigterm()
    receiver.start()
    load.wait()
    r.verdict("receiver SIGTERM mid-load", watches, notes=[f"gunicorn exited {code}, restarted on the same port"])
    assert code == 0


# -- dispatcher crashes and rebalances --------------------------------------------------------------------------
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_dispatcher_kill9_mid_delivery(rig: MakeRig, ordered: bool) -> None:
    r = rig()
    watches = one_subscription(r, ordered=ordered, delay=0.02)  # deliveries are in flight when it dies
    r.start_receiver()
    first = r.add_dispatcher()
    load = r.load(rate=RATE, duration=SECONDS)
    wait_for(lambda: delivered_count(r, "/s") >= 200, 60, "200 deliveries before the crash")
    in_flight = len(r.subscribers.at("/s"))
    first.kill()
    r.add_dispatcher()
    load.wait()
    kind = "ordered" if ordered else "unordered"
    r.verdict(f"dispatcher kill -9 mid-delivery ({kind})", watches,
              notes=[f"killed after {in_flight} requests; a new process took over"])


def test_dispatcher_scaled_1_3_1(rig: MakeRig) -> None:
    r = rig(partitions=6)
    watches = one_subscription(r, delay=0.005)
    r.start_receiver()
    r.add_dispatcher()
    load = r.load(rate=RATE, duration=SECONDS + 10)
    load.wait_accepted(100)
    extra = [r.add_dispatcher(wait=False), r.add_dispatcher(wait=False)]
    r.wait_spread("s", 3)
    load.wait_accepted(len(r.ledger.accepted()) + 150)
    for proc in extra:
        proc.stop()
    r.wait_spread("s", 1)
    load.wait()
    r.verdict("dispatcher scaled 1→3→1", watches, notes=["6 partitions; each step waited until the group settled"])


# -- the topic grows --------------------------------------------------------------------------------------------
def test_topic_grown_while_events_flow(rig: MakeRig) -> None:
    r = rig(partitions=2)
    watches = one_subscription(r)
    # Producer and consumers refresh their metadata on their own clocks, as in a cluster: the receiver writes to
    # the new partitions before the dispatcher's group is rebalanced onto them.
    r.start_receiver(env={"KE_KAFKA_EXTRA": "topic.metadata.refresh.interval.ms=1000"})
    r.add_dispatcher(kafka_extra="topic.metadata.refresh.interval.ms=5000")
    load = r.load(rate=RATE, duration=SECONDS + 5)
    load.wait_accepted(150)
    grow_topic(r.kafka, r.topic, 4)
    r.channel(r._subs, partitions=4)  # the channel says so too, as the controller's spec change would
    load.wait()
    tallies = r.verdict("topic grown 2→4 partitions", watches)
    placed = topic_index(r.kafka, r.topic)
    in_new = sum(1 for p, _o in placed.values() if p >= 2)
    assert in_new > 0, "no event landed in the new partitions: the scenario proved nothing"
    assert tallies["s"].delivered == len(r.ledger.accepted())


# -- the broker -------------------------------------------------------------------------------------------------
@slow
def test_broker_stopped_and_started_on_same_data(rig: MakeRig) -> None:
    r = rig()
    watches = one_subscription(r)
    r.start_receiver(env={"KE_PRODUCE_TIMEOUT_SECONDS": "3"})
    r.add_dispatcher()
    load = r.load(rate=RATE, duration=SECONDS + 25)
    load.wait_accepted(200)
    r.kafka.stop()
    stopped = time.monotonic()
    try:
        # Down until the senders have clearly felt it (refusals or unanswered requests), at least 10 s.
        wait_for(lambda: time.monotonic() - stopped >= 10, 30, "10 s of broker downtime")
    finally:
        r.kafka.start()
    down = time.monotonic() - stopped
    load.wait()
    refused = sum(1 for answers in r.ledger.answers.values() for a in answers if a != 202)
    r.verdict("broker stopped and started", watches,
              notes=[f"broker down {down:.0f} s; {refused} answers other than 202 were retried by the senders"],
              settle_timeout=180)
    assert refused > 0, "the senders never noticed the broker was down: the scenario proved nothing"


# -- subscribers and sinks misbehaving --------------------------------------------------------------------------
def _good_beside(r: Rig) -> dict[str, object]:
    r.subscribers.routes["/good"] = Route()
    return subscription("good", r.subscribers.url("/good"))


@slow
def test_subscriber_500_for_30s_then_200(rig: MakeRig) -> None:
    r = rig()
    fail_until: list[float] = [float("inf")]
    r.subscribers.routes["/flaky"] = Route(answer=lambda _i, _a: 500 if time.monotonic() < fail_until[0] else 200)
    delivery = {"retry": 12, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"}  # outlasts 30 s
    r.channel([_good_beside(r), subscription("flaky", r.subscribers.url("/flaky"), delivery=delivery)])
    r.start_receiver()
    r.add_dispatcher()
    start = time.monotonic()
    fail_until[0] = start + 30
    load = r.load(rate=30, duration=45)
    load.wait()
    kept = r.kept_rate("/good", start + 2, fail_until[0])
    r.verdict("subscriber 500 for 30 s, then 200", {"good": Watch("/good"), "flaky": Watch("/flaky")},
              notes=[f"good subscription kept {kept:.1%} of its events within 2 s while the other failed"])
    assert kept >= 0.9, f"a failing subscription lowered another's rate: {kept:.1%} kept"


@slow
def test_subscriber_taking_2s(rig: MakeRig) -> None:
    r = rig()
    r.subscribers.routes["/slow"] = Route(delay=2.0)
    r.channel([_good_beside(r), subscription("slow", r.subscribers.url("/slow"), ordered=False)])
    r.start_receiver()
    r.add_dispatcher()
    start = time.monotonic()
    load = r.load(rate=20, duration=25)
    load.wait()
    kept = r.kept_rate("/good", start + 2, time.monotonic())
    r.verdict("subscriber taking 2 s (unordered)", {"good": Watch("/good"), "slow": Watch("/slow")},
              notes=[f"good subscription kept {kept:.1%} of its events within 2 s"])
    assert kept >= 0.9, f"a slow subscription lowered another's rate: {kept:.1%} kept"


@slow
def test_dead_letter_sink_down_then_up(rig: MakeRig) -> None:
    from harness import Recorder

    r = rig()
    sink = Recorder()  # not started: connection refused until it comes up
    r.extra.append(sink)
    r.subscribers.routes["/reject"] = Route(answer=lambda _i, _a: 400)
    delivery = {"retry": 0, "backoffDelay": "PT0.2S", "deadLetterSink": {"uri": sink.url("/dls")}}
    r.channel([_good_beside(r), subscription("reject", r.subscribers.url("/reject"), delivery=delivery)])
    r.start_receiver()
    r.add_dispatcher()
    start = time.monotonic()
    load = r.load(rate=30, duration=40)
    wait_for(lambda: time.monotonic() - start >= 20, 30, "20 s with the sink down")
    down_until = time.monotonic()
    sink.start()
    load.wait()
    kept = r.kept_rate("/good", start + 2, down_until)
    tallies = r.verdict("dead-letter sink down 20 s, then up",
                        {"good": Watch("/good"), "reject": Watch("/reject", dls="/dls", sink=sink)},
                        notes=[f"good subscription kept {kept:.1%} of its events within 2 s while the sink was down"])
    assert tallies["reject"].dead_lettered == tallies["reject"].accepted
    assert kept >= 0.9, f"a subscription stuck on its sink lowered another's rate: {kept:.1%} kept"


@slow
def test_always_failing_event_dead_lettered_after_its_retries_during_rebalances(rig: MakeRig) -> None:
    r = rig()
    retries = 4
    r.subscribers.routes["/p"] = Route(answer=lambda i, _a: 500 if i.startswith("poison") else 200)
    delivery = {"retry": retries, "backoffPolicy": "linear", "backoffDelay": "PT1S",
                "deadLetterSink": {"uri": r.subscribers.url("/dls")}}
    r.channel([subscription("p", r.subscribers.url("/p"), delivery=delivery)])
    r.start_receiver()
    r.add_dispatcher()

    def ids(prefix: str, sender: int, seq: int) -> str:
        return f"poison-{sender}-{seq}" if sender == 0 and seq % 100 == 20 else f"{prefix}-{sender}-{seq}"

    load = r.load(rate=20, duration=40, make_id=ids)
    rebalances = 0
    while load.running:
        extra = r.add_dispatcher(wait=False)
        r.wait_spread("p", 2)
        time.sleep(2.0)  # the fault's rhythm (not a wait for anything): scaled out for a while, under load
        extra.stop()
        r.wait_spread("p", 1)
        rebalances += 2
    poison = sorted(i for i in r.ledger.accepted() if i.startswith("poison"))
    r.verdict("always-failing event during rebalances", {"p": Watch("/p", dls="/dls")},
              notes=[f"{rebalances} rebalances; {len(poison)} always-failing events, retry={retries}"],
              settle_timeout=180)
    assert poison, "no always-failing event was accepted"
    attempts = {i: r.subscribers.attempts("/p", i) for i in poison}
    sunk = [x.event_id for x in r.subscribers.delivered("/dls")]
    assert all(a == retries + 1 for a in attempts.values()), f"attempts per event (want {retries + 1}): {attempts}"
    assert sorted(sunk) == poison, f"dead-lettered: {sunk}"


@slow
def test_dispatcher_restart_never_replays_committed(rig: MakeRig) -> None:
    r = rig()
    watches = one_subscription(r, delay=0.01)
    r.start_receiver()
    first = r.add_dispatcher()
    load = r.load(rate=RATE, duration=SECONDS + 20)
    marks: list[tuple[str, float, dict[int, int]]] = []
    for how, proc in (("SIGTERM", first), ("kill -9", None)):
        wait_for(lambda: delivered_count(r, "/s") >= 200 * (len(marks) + 1), 60, "deliveries before the restart")
        current = proc or r.dispatchers[-1]
        current.stop() if how == "SIGTERM" else current.kill()
        marks.append((how, time.monotonic(), committed(r.kafka, r.topic, r.group("s"), r.partitions)))
        r.add_dispatcher()
    load.wait()
    r.verdict("dispatcher restart replays nothing committed", watches,
              notes=[f"restarted after {how}, committed then {c}" for how, _t, c in marks])
    placed = topic_index(r.kafka, r.topic)
    for how, at, marks_then in marks:
        replayed = [x.event_id for x in r.subscribers.delivered("/s")
                    if x.at > at and placed[x.event_id][1] < marks_then.get(placed[x.event_id][0], -1)]
        assert not replayed, f"after {how}: {len(replayed)} committed events delivered again, e.g. {replayed[:5]}"


# -- the soak ---------------------------------------------------------------------------------------------------
SOAK_SECONDS = float(os.environ.get("RELIABILITY_SOAK_SECONDS", "600"))


@slow
@pytest.mark.timeout(SOAK_SECONDS + 900)
def test_soak_100_per_second_from_4_senders(rig: MakeRig) -> None:
    r = rig()
    watches = one_subscription(r)
    r.start_receiver()
    r.add_dispatcher()
    load = r.load(rate=100, senders=4, duration=SOAK_SECONDS)
    load.wait()
    sent = len(r.ledger.sent())
    r.verdict(f"soak {SOAK_SECONDS / 60:.0f} min at 100/s from 4 senders", watches, max_duplicate_ratio=0.001,
              notes=[f"offered {sent / SOAK_SECONDS:.1f} events/s on average"], settle_timeout=180)
    assert sent >= 0.9 * 100 * SOAK_SECONDS, f"the senders managed only {sent} events"
