"""core.durations: ISO-8601 durations for every field that holds one, with errors of their own — a bad
``retentionDuration`` is a duration error, not a DeliverySpec error; DeliverySpec wraps it as its own."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kafka_eventing.core.delivery import DeliverySpec, DeliverySpecError
from kafka_eventing.core.durations import DurationError, parse_duration


@pytest.mark.parametrize(("value", "expected"), [("PT0.2S", timedelta(milliseconds=200)),
                                                 ("PT168H", timedelta(days=7)), ("P7D", timedelta(days=7))])
def test_parses(value: str, expected: timedelta) -> None:
    assert parse_duration(value, "retentionDuration") == expected


@pytest.mark.parametrize(("value", "match"), [("1 week", "not an ISO-8601"), ("P1M", "months"), ("-PT1S", "negative")])
def test_bad_retention_is_a_duration_error_naming_the_field(value: str, match: str) -> None:
    with pytest.raises(DurationError, match=match) as caught:
        parse_duration(value, "retentionDuration")
    assert not isinstance(caught.value, DeliverySpecError)
    assert str(caught.value).startswith("retentionDuration: ")


def test_delivery_spec_reports_its_own_error_for_a_bad_duration() -> None:
    with pytest.raises(DeliverySpecError, match="^backoffDelay: 'soon' is not an ISO-8601"):
        DeliverySpec.from_dict({"backoffDelay": "soon"})
