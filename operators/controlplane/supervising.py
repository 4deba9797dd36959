"""Keep child processes alive: start them with their logs in files, restart them when they die,
stop them cleanly.

Children never outlive their supervisor: each one asks the kernel (``PR_SET_PDEATHSIG``) for a
signal when the supervising process dies, even by SIGKILL, so there are no orphans to clean.
They ask through :mod:`~operators.controlplane.orphaning`, which they exec first: no code of
the supervisor runs between fork and exec (its gRPC threads make that unsafe).
The signal is SIGKILL unless the caller picks another: a kube-apiserver that gets SIGTERM while
its etcd dies with it waits in its graceful shutdown for a long time.
Each child also gets its own session, so a Ctrl-C in the supervisor's terminal reaches the
supervisor, which then stops the children in order, rather than every child at once.

This module knows nothing of Kubernetes: what to run and when it is healthy is decided by
callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: The program each child execs first; isolated (-I -S): it needs the standard library only.
ORPHANING = Path(__file__).with_name("orphaning.py")
#: How much of a crashed child's log its supervisor's log repeats (lines, then characters).
CRASH_LINES, CRASH_CHARS = 5, 2000


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file (empty if there is none), for error messages."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 64 * 1024))
            text = log.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Supervised:
    """One child process, restarted with back-off whenever it exits unasked."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        on_exit: Callable[[Supervised, int], None] | None = None,
        min_backoff: float = 0.5,
        max_backoff: float = 10.0,
        stable_after: float = 30.0,
        death_signal: signal.Signals = signal.SIGKILL,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: variables set for the child on top of this process's environment."""
        self.name = name
        self.argv = list(argv)
        self.env = dict(env or {})
        self.log_path = log_path
        self.restarts = 0
        self._on_exit = on_exit
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._stable_after = stable_after
        self._death_signal = death_signal
        self._process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._started_at = 0.0

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def supervised(self) -> bool:
        """Started and not stopped since (it may be between a crash and its restart)."""
        return self._watcher is not None

    async def start(self) -> None:
        """Start the child and watch it; returns as soon as the process exists."""
        if self._watcher is not None:
            raise RuntimeError(f"{self.name} is already supervised")
        self._stopping = False
        await self._spawn()
        self._watcher = asyncio.create_task(self._watch(), name=f"supervise:{self.name}")

    async def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the child, SIGKILL it after ``timeout``, and stop watching it."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            logger.warning("%s did not stop within %.0fs; killing it", self.name, timeout)
            process.kill()
            await process.wait()

    async def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Said here, as exec would have said it, rather than as an exit code of the child.
        if shutil.which(self.argv[0]) is None:
            raise FileNotFoundError(errno.ENOENT, "no such executable", self.argv[0])
        wrapped = [sys.executable, "-I", "-S", str(ORPHANING), str(os.getpid()),
                   str(int(self._death_signal)), *self.argv]
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"--- fakefleet: starting {self.name} at {stamp}\n".encode())
            log.flush()
            self._process = await asyncio.create_subprocess_exec(
                *wrapped,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
        self._started_at = time.monotonic()

    async def _watch(self) -> None:
        backoff = self._min_backoff
        while True:
            assert self._process is not None
            code = await self._process.wait()
            if self._stopping:
                return
            last_words = tail(self.log_path, CRASH_LINES)[-CRASH_CHARS:]
            logger.warning("%s exited with code %s; restarting in %.1fs; its log ends:\n%s",
                           self.name, code, backoff, last_words)
            if self._on_exit is not None:
                self._on_exit(self, code)
            if time.monotonic() - self._started_at > self._stable_after:
                backoff = self._min_backoff
            while True:  # a start that fails (binary gone, no file descriptors) is retried too
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                try:
                    await self._spawn()
                    break
                except OSError as error:
                    logger.error("%s could not be started (%s); trying again in %.1fs",
                                 self.name, error, backoff)
            self.restarts += 1
