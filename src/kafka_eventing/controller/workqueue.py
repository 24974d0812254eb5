"""A rate-limited work queue: one entry per key, never two workers on one key, exponential requeue.

Semantics follow client-go's workqueue: a key added while it is being processed is queued again once its
worker calls ``done``; ``add_after`` delays; ``add_rate_limited`` delays by ``base × 2^failures`` (capped) and
``forget`` resets the count after a success.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, base_delay: float = 0.05, max_delay: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._waiting: list[tuple[float, int, K]] = []  # heap of (due, seq, key)
        self._seq = itertools.count()
        self._failures: dict[K, int] = {}
        self._shutdown = False

    # -- producers ----------------------------------------------------------------------------------
    def add(self, key: K) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            heapq.heappush(self._waiting, (self._clock() + delay, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: K) -> float:
        """Requeue after a failure; returns the delay chosen."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = float(min(self.max_delay, self.base_delay * 2 ** min(failures, 30)))
        delay *= random.uniform(0.9, 1.1)  # spread keys that failed together (Kafka down) apart
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    # -- consumers ----------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process (marks it processing), or None on shutdown/timeout."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                self._promote_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutdown:
                    return None
                wait = None if deadline is None else deadline - self._clock()
                if wait is not None and wait <= 0:
                    return None
                if self._waiting:
                    due = self._waiting[0][0] - self._clock()
                    wait = due if wait is None else min(wait, due)
                self._cond.wait(timeout=max(wait, 0.001) if wait is not None else None)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def _promote_locked(self) -> None:
        now = self._clock()
        while self._waiting and self._waiting[0][0] <= now:
            _, _, key = heapq.heappop(self._waiting)
            self._add_locked(key)

    # -- introspection / lifecycle ------------------------------------------------------------------
    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def delayed(self) -> int:
        with self._cond:
            return len(self._waiting)

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    @property
    def is_shutdown(self) -> bool:
        return self._shutdown
