"""Handing work from a Kafka callback thread to the dispatcher's event loop, where all consumer state lives."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

#: Longest a rebalance callback waits for the loop to apply its state change (the loop never blocks that long).
LOOP_HANDOFF_TIMEOUT = 60.0

T = TypeVar("T")


class LoopBound:
    """Owns state on one event loop (``_loop``, set with ``_loop_thread`` when it starts running there)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _loop_thread: int | None = None

    def _on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the event loop and return its result: from a rebalance callback on the poll thread."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread or not loop.is_running():
            # On the loop already, or the loop has finished (a close() outliving it): nothing runs concurrently.
            return fn(*args)
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                result.set_result(fn(*args))
            except BaseException as exc:
                result.set_exception(exc)

        loop.call_soon_threadsafe(call)
        return result.result(LOOP_HANDOFF_TIMEOUT)
