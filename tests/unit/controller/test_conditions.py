"""controller.conditions: status conditions, their transition times and the Ready summary."""

from __future__ import annotations

from kafka_eventing.controller import conditions as cond
from kafka_eventing.core.conditions import Condition, merge


def test_merge_keeps_transition_time_unless_status_changes() -> None:
    first = merge(None, [Condition.false(cond.TOPIC_READY, "KafkaUnreachable", "down")], now="t1")
    same = merge(first, [Condition.false(cond.TOPIC_READY, "KafkaUnreachable", "still down")], now="t2")
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["message"] == "still down"
    flipped = merge(same, [Condition.true(cond.TOPIC_READY)], now="t3")
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["status"] == "True"


def test_ready_reports_the_first_false_dependent() -> None:
    all_true = [Condition.true(kind) for kind in cond.DEPENDENTS]
    assert cond.ready_condition(all_true).is_true
    some = [*all_true[1:], Condition.false(cond.TOPIC_READY, "TopicQuotaExceeded", "quota")]
    ready = cond.ready_condition(some)
    assert (ready.status, ready.reason, ready.message) == ("False", "TopicQuotaExceeded", "quota")
    missing = cond.ready_condition(all_true[:-1])
    assert missing.status == "Unknown"
    with_dls = cond.ready_condition([*all_true, Condition.false(cond.DEAD_LETTER_SINK_RESOLVED, "X", "y")])
    assert with_dls.status == "False" and with_dls.reason == "X"
