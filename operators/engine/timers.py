"""Timers on the engine's clock for the sessions of exec, attach and port-forward: a command's
delay, attach looking again whether its container still runs, a forwarded connection's wait
for its second stream. One delay queue and one task for all of them, as the followed logs
have, rather than a loop timer each: the tests drive them with the fake clock as they drive the
rest of the engine.

It must not block: a callback runs on the event loop, and one that fails is logged and stops
nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from operators.engine.dispatching import Dispatcher
from operators.engine.queues import DelayQueue
from operators.engine.remotecommand import Timer
from primitives.clocks import Clock

logger = logging.getLogger(__name__)


class _Due:
    """One timer: what it calls, and the queue it waits in."""

    __slots__ = ("_queue", "callback")

    def __init__(self, queue: DelayQueue[_Due], callback: Callable[[], object]) -> None:
        self._queue = queue
        self.callback = callback

    def cancel(self) -> None:
        self._queue.cancel(self)


class ClockTimers:
    """A :class:`~operators.engine.remotecommand.Timers` on a clock; :meth:`run` fires them."""

    def __init__(self, *, clock: Clock) -> None:
        self._queue: DelayQueue[_Due] = DelayQueue(clock)
        self._dispatcher: Dispatcher[_Due] = Dispatcher(
            self._queue, self._fire, clock=clock, limit=1, name="kubelet API: session timers")

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        due = _Due(self._queue, callback)
        self._queue.schedule(due, delay)
        self._dispatcher.wake()
        return due

    async def run(self) -> None:
        """Call each timer when it is due, until cancelled."""
        await self._dispatcher.run()

    @staticmethod
    def _fire(due: _Due) -> None:
        try:
            due.callback()
        except Exception:
            logger.exception("kubelet API: a session's timer failed")
