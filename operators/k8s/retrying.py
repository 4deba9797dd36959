"""Capped, jittered exponential back-off, for every retry that waits.

Jitter spreads the retries of many watchers and writers that failed together (an API server
restart) so they do not all come back in the same instant; the cap bounds how stale a watch can
get while its server is away; :meth:`Backoff.reset` after a success starts the next outage at
the short end again.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays of ``base * 2**n`` seconds, at most ``cap``, each drawn from [half, full]."""

    def __init__(self, base: float = 0.5, cap: float = 30.0,
                 rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        """The delay before the next attempt; each call doubles the one after (up to the cap)."""
        ceiling = min(self.cap, self.base * 2.0 ** self.failures)
        self.failures += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0
