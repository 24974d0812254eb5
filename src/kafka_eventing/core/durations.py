"""ISO-8601 durations (``PT0.2S``, ``PT1M``, ``P7D``) as Knative writes them, parsed with ``isodate``: the
DeliverySpec's backoff and timeout, a KafkaChannel's ``retentionDuration``."""

from __future__ import annotations

from datetime import timedelta

import isodate


class DurationError(ValueError):
    """Not a usable duration; the message names the field and the value."""


def parse_duration(value: str, field: str) -> timedelta:
    """ISO-8601 duration → timedelta; years/months are refused (their length is not fixed)."""
    try:
        parsed = isodate.parse_duration(value)
    except (isodate.ISO8601Error, ValueError, TypeError):
        raise DurationError(f"{field}: {value!r} is not an ISO-8601 duration (e.g. PT0.5S, PT2M)") from None
    if not isinstance(parsed, timedelta):
        raise DurationError(f"{field}: {value!r} uses years or months; use days or smaller units")
    if parsed < timedelta(0):
        raise DurationError(f"{field}: {value!r} is negative")
    return parsed
