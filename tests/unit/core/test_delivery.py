from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from kafka_eventing.core.delivery import (
    BackoffPolicy,
    DeliverySpec,
    DeliverySpecError,
    is_retryable,
    trigger_delivery,
)


def test_parse_and_backoff() -> None:
    spec = DeliverySpec.from_dict({"retry": 3, "backoffPolicy": "linear", "backoffDelay": "PT0.5S", "timeout": "PT2S",
                                   "deadLetterSink": {"uri": "http://dls"}})
    assert spec.retry == 3 and spec.backoff_policy is BackoffPolicy.LINEAR
    assert [spec.backoff(n) for n in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert spec.timeout == timedelta(seconds=2)
    assert spec.dead_letter_uri == "http://dls"
    exp = DeliverySpec.from_dict({"backoffDelay": "PT1S"})
    assert [exp.backoff(n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]


@pytest.mark.parametrize(
    ("spec", "match"),
    [({"retry": -1}, "retry"), ({"backoffPolicy": "random"}, "backoffPolicy"),
     ({"backoffDelay": "5s"}, "backoffDelay"), ({"timeout": "P1M"}, "months")],
)
def test_invalid(spec: dict[str, object], match: str) -> None:
    with pytest.raises(DeliverySpecError, match=match):
        DeliverySpec.from_dict(spec)


@pytest.mark.parametrize(("status", "retry"), [(None, True), (500, True), (503, True), (404, True), (408, True),
                                                (409, True), (429, True), (400, False), (401, False), (413, False),
                                                (200, False)])
def test_retryable(status: int | None, retry: bool) -> None:
    assert is_retryable(status) is retry


DLS_T = {"uri": "http://trigger-dls"}
DLS_B = {"uri": "http://broker-dls"}


@pytest.mark.parametrize(("trigger", "broker", "merged"), [
    # Either side absent, or setting none of deadLetterSink/retry/timeout: the other whole.
    (None, {"retry": 3, "backoffPolicy": "linear"}, {"retry": 3, "backoffPolicy": "linear"}),
    ({"retry": 2}, None, {"retry": 2}),
    ({"backoffDelay": "PT9S"}, {"retry": 3, "backoffDelay": "PT1S"}, {"retry": 3, "backoffDelay": "PT1S"}),
    ({"retry": 2}, {"backoffPolicy": "linear"}, {"retry": 2}),
    # The Trigger's retry brings its own backoff (defaults when unnamed); the Broker's dead-letter sink stays.
    ({"retry": 2}, {"retry": 5, "backoffPolicy": "linear", "backoffDelay": "PT3S", "deadLetterSink": DLS_B},
     {"retry": 2, "deadLetterSink": DLS_B}),
    ({"retry": 2, "backoffPolicy": "linear", "backoffDelay": "PT1S"}, {"retry": 5, "deadLetterSink": DLS_B},
     {"retry": 2, "backoffPolicy": "linear", "backoffDelay": "PT1S", "deadLetterSink": DLS_B}),
    # The Trigger sets only a sink: the Broker's retry and delay, the default (exponential) policy.
    ({"deadLetterSink": DLS_T}, {"retry": 5, "backoffPolicy": "linear", "backoffDelay": "PT3S", "timeout": "PT2S"},
     {"deadLetterSink": DLS_T, "retry": 5, "backoffDelay": "PT3S", "timeout": "PT2S"}),
    # retry 0 counts as unset; the Trigger's timeout wins.
    ({"retry": 0, "timeout": "PT1S"}, {"retry": 4, "timeout": "PT9S"}, {"retry": 4, "timeout": "PT1S"}),
    # Outside upstream's merge: the Trigger's if set, else the Broker's.
    ({"timeout": "PT1S", "format": "json"}, {"retry": 1, "retryAfterMax": "PT30S", "format": "binary"},
     {"timeout": "PT1S", "retry": 1, "format": "json", "retryAfterMax": "PT30S"}),
    ({"format": "json"}, None, {"format": "json"}),
    ({"format": "json"}, {"retry": 2, "format": "binary"}, {"retry": 2, "format": "json"}),
    (None, None, None),
])
def test_a_triggers_delivery_is_merged_over_its_brokers_as_upstream(
        trigger: dict[str, Any] | None, broker: dict[str, Any] | None, merged: dict[str, Any] | None) -> None:
    assert trigger_delivery(trigger, broker) == merged
