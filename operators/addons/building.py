"""An add-on's binary and manifests from the Go module proxy, fetched once for every member.

:class:`ToolBuild` builds the binary (a :class:`~operators.controlplane.tools.GoTool`: ``go
install`` into the per-user cache, a progress line at least every 15 s) in a thread, while the
members' reconciles report it in their conditions; builds that share a ``slot`` run one at a
time (the operator builds the Kubernetes releases FakeClusters ask for this way too).
:class:`Fetched` reads what an add-on takes from its module source (its manifests) once, in a
thread. Nothing of either needs to survive a restart: the caches have the binary and the
source or not, and a new operator builds or reads again. This module knows no member;
:mod:`operators.addons.running` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from operators.controlplane.errors import ControlPlaneError

logger = logging.getLogger(__name__)

#: Seconds after a failed build of an add-on's binary before a reconcile builds it again.
BUILD_RETRY = 120.0

T = TypeVar("T")


@dataclasses.dataclass
class ToolBuild:
    """An add-on's binary, built once for every member in a thread while reconciles report it
    in the member's condition."""

    title: str
    find: Callable[[], Path | None]
    ensure: Callable[..., Path]
    future: asyncio.Future[Path] | None = None
    started: float = 0.0
    error: str = ""
    failed_at: float = 0.0
    #: Builds that share it run one at a time (each takes every core for minutes).
    slot: asyncio.Semaphore | None = None
    #: Started, and waiting for the slot.
    waiting: bool = False

    def observe(self) -> tuple[bool, str, float | None]:
        """Whether the binary is there; why it is not (a failed build, forgotten after
        :data:`BUILD_RETRY` so that the plan builds again, or an override that names no
        binary); how long the build has been running (None: none runs)."""
        if self.error and time.monotonic() - self.failed_at > BUILD_RETRY:
            self.error = ""
        try:
            found, error = self.find() is not None, self.error
        except ControlPlaneError as problem:  # an override that names no binary
            found, error = False, str(problem)
        running = self.future is not None and not self.future.done() and not self.waiting
        return found, error, time.monotonic() - self.started if running else None

    def start(self) -> None:
        """Build in a thread (once the slot is free), unless a build runs already."""
        if self.future is not None and not self.future.done():
            return
        self.started, self.error = time.monotonic(), ""
        self.future = asyncio.ensure_future(self._build())
        self.future.add_done_callback(self._finished)

    async def _build(self) -> Path:
        if self.slot is None:
            return await self._run()
        self.waiting = True
        try:
            async with self.slot:
                self.waiting = False
                self.started = time.monotonic()
                return await self._run()
        finally:
            self.waiting = False

    async def _run(self) -> Path:
        return await asyncio.to_thread(self.ensure,
                                       progress=lambda line: logger.info("%s", line))

    def _finished(self, done: asyncio.Future[Path]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            self.error, self.failed_at = str(error), time.monotonic()
            # A build's failure is said in the conditions and retried after BUILD_RETRY; the
            # traceback tells a defect of ours from a failed go command.
            logger.error("building %s failed: %s", self.title, error, exc_info=error)


@dataclasses.dataclass
class Fetched(Generic[T]):
    """What an add-on reads from its module source (``go mod download``, then its files), read
    once in a thread: ``read`` blocks."""

    read: Callable[[], T]
    value: T | None = None

    async def get(self) -> T:
        if self.value is None:
            self.value = await asyncio.to_thread(self.read)
        return self.value
