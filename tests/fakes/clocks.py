"""A clock that tests move by hand: time passes only when a test says so, and sleepers wake
in time order, so an hour of engine life runs in milliseconds and in a repeatable order."""

from __future__ import annotations

import asyncio
import heapq
import itertools

#: 2026-01-01T00:00:00Z: a fixed, readable start for fake time.
FAKE_EPOCH = 1_767_225_600.0


class FakeClock:
    """Time that moves only when a test calls :meth:`advance`; sleepers wake in time order."""

    def __init__(self, start: float = FAKE_EPOCH) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self.sleep(timeout)) if timeout is not None else None
        pending = {waiter} if sleeper is None else {waiter, sleeper}
        try:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pending:
                task.cancel()
        return event.is_set()

    async def settle(self, rounds: int = 50) -> None:
        """Let every task that can run without time passing run (and what it wakes, in turn)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking sleepers one deadline at a time."""
        target = self._now + seconds
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not future.done():
                future.set_result(None)
            await self.settle()
        self._now = target
        await self.settle()
