"""Due timers to requests: a bounded number in flight, no waiting for a whole batch to finish.

When a slot frees, the next due key goes out at once; when all slots are busy, the loop waits
(back-pressure: a slow or throttling API server slows the engine down, it does not pile up
requests). Used by the heartbeats and by the pod lifecycle, each with its own slots and
connections. Slots alone do not keep pod churn from starving Lease renewals: under load the API
server serves every client in proportion to its requests in flight. So a dispatcher can be
*throttled*: while its ``throttle`` says so, it keeps at most ``throttled_limit`` in flight
(the pod lifecycle yields to heartbeats that fall behind, and still makes progress). And it
can follow a :class:`~operators.engine.windowing.Window`: at most as many in flight as the
window allows (the Lease renewals', which the API server's 429s shrink).

A key leaves the queue only when it can go out at once: while there is no room, the due keys
wait in the queue in due-time order, so a key put back at its old due time (a renewal answered
429) goes out before every key due after it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

from operators.engine.queues import DelayQueue
from operators.engine.windowing import Window
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
THROTTLE_POLL = 0.05
BUSY_WINDOW = 2.0
RETRY_UNEXPECTED = 5.0  # seconds before a step that raised an unexpected error fires again


class Dispatcher(Generic[K]):
    """Fires the keys of one :class:`DelayQueue` as they come due."""

    def __init__(
        self,
        timers: DelayQueue[K],
        fire: Callable[[K], Coroutine[Any, Any, None] | None],
        *,
        clock: Clock,
        limit: int,
        batch: int = 512,
        name: str,
        throttle: Callable[[], bool] | None = None,
        throttled_limit: int = 4,
        window: Window | None = None,
    ) -> None:
        self._timers = timers
        self._fire = fire
        self._clock = clock
        self._limit = limit
        self._batch = batch
        self._name = name
        self._changed = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._keys: set[K] = set()  # the keys of the steps in flight
        self._again: set[K] = set()  # keys that fell due while their step was in flight
        self._throttle = throttle
        self._throttled_limit = throttled_limit
        self._throttled = False
        self._window = window
        self._waited_at = float("-inf")  # when a due key last had to wait for room

    def wake(self) -> None:
        """Tell the loop that the queue changed (a key may be due sooner than it waits)."""
        self._changed.set()

    async def run(self) -> None:
        try:
            while True:
                wait = self._timers.next_delay()
                if wait == 0.0:  # keys are due
                    room = self._room()
                    if room > 0:
                        for key in self._timers.pop_due(min(room, self._batch)):
                            self._start(key)
                        continue
                    self._waited_at = self._clock.now()
                    wait = self._blocked_for()
                self._changed.clear()
                await self._clock.wait(self._changed, wait)
        finally:
            for task in list(self._inflight):
                task.cancel()

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def busy(self, window: float = BUSY_WINDOW) -> bool:
        """Whether due keys had to wait for room within the last ``window`` seconds: more is
        due than the API server takes."""
        return self._clock.now() - self._waited_at < window

    def _room(self) -> int:
        """How many more steps may start now."""
        limit = self._limit
        if self._window is not None:
            limit = min(limit, self._window.allowed(self._clock.now()))
        if self._throttle is not None:
            throttled = self._throttle()
            if throttled != self._throttled:  # say so when it starts and when it ends
                self._throttled = throttled
                logger.info("%s: %s", self._name, f"holding back to {self._throttled_limit} "
                            f"in flight" if throttled else "back to full speed")
            if throttled:
                limit = min(limit, self._throttled_limit)
        return limit - len(self._inflight)

    def _blocked_for(self) -> float | None:
        """How long due keys wait for room at most before the loop looks again (None: until a
        step ends, which wakes it)."""
        if self._window is not None:
            paused = self._window.paused_until - self._clock.now()
            if paused > 0:
                return paused
        if self._throttled:
            return THROTTLE_POLL  # the throttle says nothing when it lifts: look again
        return None

    def _start(self, key: K) -> None:
        # One step per key at a time: a key due again while its step is written (the object
        # changed meanwhile, or the step planned a next one due at once) fires again once that
        # step is over, from what its write committed.
        if key in self._keys:
            self._again.add(key)
            return
        call = self._fire(key)
        if call is None:  # created only once it can run: never left unawaited
            return
        task = asyncio.create_task(call)
        self._inflight.add(task)
        self._keys.add(key)
        task.add_done_callback(functools.partial(self._finished, key))

    def _finished(self, key: K, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._keys.discard(key)
        self.wake()  # room for the next due key
        if key in self._again:
            self._again.discard(key)
            if key not in self._timers:  # its owner did not plan it anew meanwhile
                self._timers.schedule(key, 0.0)
        if not task.cancelled() and task.exception() is not None:
            # A step handles the API's errors itself; anything else is a defect, and still its
            # key must not be lost (a Lease never renewed again): it fires again later.
            logger.error("%s: a step for %s failed; trying again in %.0fs", self._name, key,
                         RETRY_UNEXPECTED, exc_info=task.exception())
            if key not in self._timers:
                self._timers.schedule(key, RETRY_UNEXPECTED)
