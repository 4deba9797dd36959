"""Time as a dependency: the wall clock in production; tests pass a fake one that they move by
hand (``tests.fakes.clocks.FakeClock``).

Everything that waits (retry back-off, delay queues, dispatchers, watch timeouts) asks a
:class:`Clock`, never ``time`` or ``asyncio.sleep`` directly, so a unit test can run an hour of
engine life in milliseconds and in a repeatable order::

    clock = FakeClock()
    task = asyncio.create_task(engine.run())
    await clock.advance(30)      # timers due within 30 s fire, in time order

Times are seconds since the epoch (they end up in RFC 3339 stamps in Kubernetes objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    """What waits and timestamps need of time."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds``."""
        ...

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set (True) or ``timeout`` seconds passed (False)."""
        ...


class SystemClock:
    """The wall clock and the event loop's timers."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        if timeout is None:
            await event.wait()
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout))
        return event.is_set()


SYSTEM_CLOCK = SystemClock()
