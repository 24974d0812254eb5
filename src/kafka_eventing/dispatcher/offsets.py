"""Which offset of a partition may be committed: the contiguous low-water mark of finished events.

Events of one partition arrive in offset order but may finish in any order (unordered delivery). Only the
prefix of received offsets that are all finished may be committed, otherwise a crash would skip the ones
still in flight. Offsets are tracked as received (not assumed contiguous): compaction and transaction
markers leave gaps that must not stall the mark.
"""

from __future__ import annotations

from collections import deque


class OffsetTracker:
    """Per-partition bookkeeping; ``commit_position`` is the next offset to read after a restart."""

    __slots__ = ("_done", "_last", "_pending", "commit_position")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # received, in offset order, not yet below the mark
        self._done: set[int] = set()
        self._last = -1
        #: Kafka's commit convention: the offset of the next event to consume (last finished + 1).
        self.commit_position: int | None = None

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, offset: int) -> bool:
        """Track a received offset; False (and ignored) if it is not past every offset seen before."""
        if offset <= self._last:
            return False
        self._last = offset
        self._pending.append(offset)
        return True

    def start_at(self, offset: int) -> None:
        """Receive nothing below ``offset`` (where this subscriber's committed position is)."""
        if not self._pending:
            self._last = max(self._last, offset - 1)

    def skip(self, offset: int) -> int | None:
        """A received offset that needs no delivery (filtered out): ``add`` then ``done``, without the queue
        when nothing is pending. Returns the new commit position if the mark moved."""
        if offset <= self._last:
            return None
        if not self._pending:
            self._last = offset
            self.commit_position = offset + 1
            return self.commit_position
        self.add(offset)
        return self.done(offset)

    def done(self, offset: int) -> int | None:
        """Mark ``offset`` finished; return the new commit position if the mark moved, else None."""
        if not self._pending or offset < self._pending[0]:
            return None  # already below the mark (a duplicate completion) — nothing changes
        self._done.add(offset)
        moved = False
        while self._pending and self._pending[0] in self._done:
            head = self._pending.popleft()
            self._done.discard(head)
            self.commit_position = head + 1
            moved = True
        return self.commit_position if moved else None

    @property
    def last(self) -> int:
        """The highest offset received so far (-1 before the first)."""
        return self._last

    @property
    def first(self) -> int | None:
        """The oldest offset received and not yet below the mark (None if there is none)."""
        return self._pending[0] if self._pending else None

    @property
    def outstanding(self) -> int:
        """Events received and not yet below the mark (queued, in flight, or finished out of order)."""
        return len(self._pending)
