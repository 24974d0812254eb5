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
