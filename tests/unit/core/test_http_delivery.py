"""core.http_delivery: the delay before a retry, from the DeliverySpec backoff and Retry-After."""

from __future__ import annotations

import email.utils
from datetime import timedelta

import pytest

from kafka_eventing.core.delivery import BackoffPolicy, DeliverySpec, DeliverySpecError
from kafka_eventing.core.http_delivery import Attempt, parse_retry_after, retry_delay


def spec(policy: BackoffPolicy = BackoffPolicy.EXPONENTIAL) -> DeliverySpec:
    return DeliverySpec(retry=3, backoff_policy=policy, backoff_delay=timedelta(seconds=0.1))


def test_backoff_linear_and_exponential() -> None:
    assert [retry_delay(spec(BackoffPolicy.LINEAR), n, None, 600) for n in (1, 2, 3)] == pytest.approx(
        [0.1, 0.2, 0.3])
    assert [retry_delay(spec(), n, None, 600) for n in (1, 2, 3)] == pytest.approx([0.2, 0.4, 0.8])


def test_retry_after_is_honoured_up_to_the_maximum() -> None:
    assert retry_delay(spec(), 1, 5.0, 600) == 5.0
    assert retry_delay(spec(), 1, 5000.0, 600) == 600
    assert retry_delay(spec(), 3, 0.1, 600) == pytest.approx(0.8)  # the backoff is longer


def test_retry_after_max_of_the_delivery_spec_wins() -> None:
    # Knative's delivery.retryAfterMax: its own cap; zero opts out of Retry-After (the backoff alone).
    capped = DeliverySpec.from_dict({"retryAfterMax": "PT2S", "backoffDelay": "PT0.1S"})
    assert capped.retry_after_max == timedelta(seconds=2)
    assert retry_delay(capped, 1, 5.0, 600) == 2.0
    ignored = DeliverySpec.from_dict({"retryAfterMax": "PT0S", "backoffDelay": "PT0.1S"})
    assert retry_delay(ignored, 1, 5.0, 600) == pytest.approx(0.2)
    with pytest.raises(DeliverySpecError, match="retryAfterMax"):
        DeliverySpec.from_dict({"retryAfterMax": "soon"})


def test_parse_retry_after() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(30)
    assert Attempt(429, headers={"Retry-After": "3"}).retry_after == 3.0
    assert Attempt(500, headers={"Retry-After": "3"}).retry_after is None


