"""Long-lived background tasks that never die silently.

A loop that runs beside a process's main work (a hub's ticker and store writer, a hub link's
observer and watches, a collector's retention) handles the errors it expects itself. What it
does not expect is a defect, and without a supervisor it ends the task unseen: the hub stops
heartbeating, a member stops reporting, and nothing says why. :func:`supervised` runs such a
loop again: the error is logged with its traceback, and the loop starts over after a back-off
(doubling from ``first`` to ``cap``; a run that lasted longer than ``cap`` starts it over).
A loop that returns is done; cancelling the task ends it.

Processes whose loops cannot be restarted one by one (the engine, whose loops share state in
one task group) let the error end the process instead, and their supervisor starts it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from primitives.clocks import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

#: The first wait before a failed loop runs again, and the longest (s).
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0


async def supervised(what: str, work: Callable[[], Awaitable[None]], *,
                     clock: Clock = SYSTEM_CLOCK, first: float = FIRST_BACKOFF,
                     cap: float = MAX_BACKOFF,
                     on_failure: Callable[[Exception], None] | None = None) -> None:
    """Run ``work()`` until it returns, again after each unexpected error (``what`` names it
    in the log). ``on_failure`` hears of each error first (to tell those who wait on the
    loop's progress that none will come for now)."""
    delay = first
    while True:
        started = clock.now()
        try:
            await work()
            return
        except Exception as error:
            if clock.now() - started > cap:
                delay = first  # it ran well for a while: this is a new failure
            logger.exception("%s failed; starting it again in %.1fs", what, delay)
            if on_failure is not None:
                on_failure(error)
        await clock.sleep(delay)
        delay = min(cap, delay * 2)


def spawn(what: str, work: Callable[[], Awaitable[None]], *, clock: Clock = SYSTEM_CLOCK,
          first: float = FIRST_BACKOFF, cap: float = MAX_BACKOFF,
          on_failure: Callable[[Exception], None] | None = None) -> asyncio.Task[None]:
    """A task that runs ``work`` :func:`supervised`, named ``what``."""
    return asyncio.create_task(supervised(what, work, clock=clock, first=first, cap=cap,
                                          on_failure=on_failure), name=what)
