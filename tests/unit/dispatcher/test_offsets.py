"""offsets.OffsetTracker: the contiguous low-water mark of finished offsets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafka_eventing.dispatcher.offsets import OffsetTracker


def test_low_water_mark_waits_for_the_oldest() -> None:
    t = OffsetTracker()
    for offset in (10, 11, 12, 13):
        t.add(offset)
    assert t.done(12) is None
    assert t.done(11) is None
    assert t.commit_position is None
    assert t.done(10) == 13  # 10, 11, 12 finished: next to read is 13
    assert t.done(13) == 14
    assert t.outstanding == 0


def test_low_water_mark_skips_offset_gaps() -> None:
    t = OffsetTracker()
    for offset in (5, 7, 9):  # compaction / transaction markers leave holes
        t.add(offset)
    t.done(7)
    assert t.done(5) == 8
    assert t.done(9) == 10


def test_duplicate_completion_and_out_of_order_add() -> None:
    t = OffsetTracker()
    t.add(1)
    assert t.done(1) == 2
    assert t.done(1) is None
    assert t.add(1) is False  # a record seen before (e.g. refetched) is not tracked twice
    assert t.add(2) is True


@given(st.permutations(list(range(30))))
def test_mark_never_passes_an_unfinished_offset(order: list[int]) -> None:
    t = OffsetTracker()
    for offset in range(30):
        t.add(offset)
    finished: set[int] = set()
    for offset in order:
        t.done(offset)
        finished.add(offset)
        if t.commit_position is not None:
            assert set(range(t.commit_position)) <= finished
            assert t.commit_position == 30 or t.commit_position not in finished
    assert t.commit_position == 30


