from __future__ import annotations

from datetime import timedelta

import pytest

from kafka_eventing.core.delivery import BackoffPolicy, DeliverySpec, DeliverySpecError, is_retryable


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
