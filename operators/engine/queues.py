"""A heap-based delay queue: one structure for thousands of timers, instead of a task each."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

from primitives.clocks import Clock

K = TypeVar("K", bound=Hashable)


class DelayQueue(Generic[K]):
    """Keys due at a time; scheduling a key again replaces its earlier time (lazy deletion)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, K]] = []
        self._due: dict[K, tuple[float, int]] = {}
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: K) -> bool:
        return key in self._due

    def schedule(self, key: K, delay: float) -> None:
        """Make ``key`` due ``delay`` seconds from now."""
        self.schedule_at(key, self._clock.now() + delay)

    def schedule_at(self, key: K, when: float) -> None:
        """Make ``key`` due at ``when`` (seconds since the epoch; the past means now)."""
        entry = (when, next(self._sequence))
        self._due[key] = entry
        heapq.heappush(self._heap, (*entry, key))

    def due_at(self, key: K) -> float | None:
        entry = self._due.get(key)
        return entry[0] if entry is not None else None

    def cancel(self, key: K) -> None:
        self._due.pop(key, None)

    def pop_due(self, limit: int) -> list[K]:
        """Up to ``limit`` keys whose time has come, earliest first."""
        now = self._clock.now()
        found: list[K] = []
        while self._heap and len(found) < limit:
            at, sequence, key = self._heap[0]
            if self._due.get(key) != (at, sequence):
                heapq.heappop(self._heap)  # cancelled or rescheduled: a stale entry
                continue
            if at > now:
                break
            heapq.heappop(self._heap)
            del self._due[key]
            found.append(key)
        return found

    def next_delay(self) -> float | None:
        """Seconds until the earliest key is due (0 if overdue), None when empty."""
        while self._heap:
            at, sequence, key = self._heap[0]
            if self._due.get(key) == (at, sequence):
                return max(0.0, at - self._clock.now())
            heapq.heappop(self._heap)
        return None
