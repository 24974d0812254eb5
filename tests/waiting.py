"""One polling helper for every test that waits on another thread, process or the API server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class NotYet(Exception):
    """Raised by a check to say "not yet" together with what it saw, which a timeout then reports."""


def wait_for(check: Callable[[], T], timeout: float = 30.0, what: str = "condition", *, interval: float = 0.05,
             tolerate: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``check`` until it returns something truthy, and return that.

    Exceptions of the ``tolerate`` types, and :class:`NotYet`, count as "not yet" (an object not created yet, a field
    not set yet); the last result or exception is in the failure message, so a timeout says what was seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = result = check()
        except (NotYet, *tolerate) as exc:
            last = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def seconds_until(check: Callable[[], object], timeout: float = 30.0, what: str = "condition", *,
                  interval: float = 0.05, tolerate: tuple[type[BaseException], ...] = ()) -> float:
    """How long, from now, until ``check`` holds (polled as ``wait_for`` does): for tests that assert a latency —
    start the clock at the cause, then assert on the returned seconds, with ``timeout`` well past the bound so a
    failure says how late it was (or that it never came)."""
    start = time.monotonic()
    wait_for(check, timeout, what, interval=interval, tolerate=tolerate)
    return time.monotonic() - start
