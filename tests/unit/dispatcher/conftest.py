"""Shared helpers of the dispatcher unit tests."""

from __future__ import annotations

from datetime import timedelta

from kafka_eventing.core.delivery import BackoffPolicy, DeliverySpec
from kafka_eventing.dispatcher.metrics import Labels

LABELS = Labels("ns", "ch", "uid")


def spec(policy: BackoffPolicy = BackoffPolicy.EXPONENTIAL, retry: int = 3, sink: str | None = None) -> DeliverySpec:
    return DeliverySpec(retry=retry, backoff_policy=policy, backoff_delay=timedelta(seconds=0.1),
                        dead_letter_uri=sink)
