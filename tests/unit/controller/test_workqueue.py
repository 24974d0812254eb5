"""controller.workqueue: dedup, one key per worker, rate limits, delayed adds, shutdown."""

from __future__ import annotations

import threading

import pytest

from kafka_eventing.controller.workqueue import WorkQueue


def test_queue_dedups_and_never_hands_one_key_to_two_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(0) == "a"
    q.add("a")  # changed while processing: queued again only after done()
    assert q.get(0) == "b"
    assert q.get(0) is None
    q.done("a")
    assert q.get(0) == "a"


def test_queue_rate_limit_grows_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=5.0)
    delays = [q.add_rate_limited("k") for _ in range(5)]
    assert delays[0] == pytest.approx(1.0, rel=0.11) and delays[1] == pytest.approx(2.0, rel=0.11)
    assert max(delays) <= 5.5 and q.failures("k") == 5
    q.forget("k")
    assert q.failures("k") == 0


def test_queue_add_after_is_delivered_when_due() -> None:
    now = [0.0]
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0])
    q.add_after("late", 10)
    q.add_after("early", 1)
    assert q.get(0) is None
    now[0] = 5
    assert q.get(0) == "early"
    now[0] = 11
    assert q.get(0) == "late"


def test_queue_shutdown_wakes_waiters() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(2)
    assert got == [None]
