"""How many Lease renewals may be in flight: a window that follows what the API server serves,
additive increase and multiplicative decrease on the server's 429s (as TCP's congestion window
follows a network's losses). Pure: times come in as arguments; no I/O, no logging.

Why: the API server's priority and fairness (APF) puts all of the engine's renewals, from one
user, in one flow of ``node-high``; past the seats and queue places that flow gets, it answers
429. Without a window, 384 renewals in flight on a server that serves fewer were answered 429
by the thousand, waited out in random order and went out late (nodes turned NotReady). With
it, what the server cannot take yet waits in the engine's own queue, most overdue first, and
is sent as soon as the window has room.

The rules:

- the window starts at its ceiling (the heartbeat connections): a server that never answers
  429 sees the engine as before;
- a 429 shrinks it to :data:`DECREASE` of its size, once per congestion: 429s to renewals
  sent before the last decrease were sent into the old window and say nothing new (TCP's "one
  decrease per window", kept with an epoch that each decrease bumps);
- each renewal that succeeds while the window is in use (at least half of it in flight)
  grows it by ``1 / size``: one renewal more per round trip, TCP's congestion avoidance; an
  idle window does not grow, so its size keeps meaning what the server took;
- never below :data:`FLOOR`: there the window stops shrinking and the server's
  ``Retry-After`` is honoured instead, no renewal going out until it has passed.

Only 429s move it. A 5xx, a refused or broken connection is an outage or a defect of the
server, not a sign of its throughput, and shrinking the window for it would slow the catch-up
after the outage, when every node is overdue at once; a timeout comes only after the
transport's 30 s, far too late to steer by.
"""

from __future__ import annotations

import math

#: What a 429 leaves of the window (TCP CUBIC's beta): a shallower cut than halving, so that
#: a server that takes N in flight keeps the window between 0.7 N and N, and few enough cuts
#: (nine) to come from 384 down to 16.
DECREASE = 0.7
#: The fewest renewals in flight a 429 leaves: 5000 nodes at the longest interval (35 s)
#: need 143 renewals a second, which 16 in flight carry at round trips up to 0.11 s.
FLOOR = 16


class Window:
    """The number of Lease renewals that may be in flight, between a floor and ``ceiling``."""

    def __init__(self, ceiling: int, *, floor: int = FLOOR) -> None:
        if ceiling < 1:
            raise ValueError(f"a window's ceiling must be 1 or more, not {ceiling}")
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.size = float(ceiling)
        #: Bumped by every decrease (and every pause): what a renewal read when it was sent.
        self.epoch = 0
        #: No renewal goes out before this time (a 429 at the floor and its Retry-After).
        self.paused_until = float("-inf")
        #: 429s answered in all.
        self.throttled_total = 0

    @property
    def limit(self) -> int:
        """Renewals that may be in flight, the pause aside."""
        return math.floor(self.size)

    def allowed(self, now: float) -> int:
        """Renewals that may be in flight at ``now``: none while paused."""
        return 0 if now < self.paused_until else self.limit

    def succeeded(self, in_flight: int) -> None:
        """A renewal succeeded with ``in_flight`` renewals in flight (itself included)."""
        if in_flight * 2 >= self.size:
            self.size = min(float(self.ceiling), self.size + 1.0 / self.size)

    def throttled(self, epoch: int, now: float, retry_after: float) -> None:
        """A renewal sent in ``epoch`` was answered 429 at ``now``, to be tried again after
        ``retry_after`` seconds."""
        self.throttled_total += 1
        if epoch != self.epoch:
            return  # sent before the last decrease: that decrease answered it already
        self.epoch += 1
        if self.size > self.floor:
            self.size = max(float(self.floor), self.size * DECREASE)
        else:
            self.paused_until = max(self.paused_until, now + retry_after)
