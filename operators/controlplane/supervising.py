"""Keep child processes alive: start them with their logs in files, restart them when they die,
stop them cleanly, and adopt those that an earlier supervisor left running.

Children never outlive their supervisor unless they are detached: each one asks the kernel
(``PR_SET_PDEATHSIG``) for a signal when the supervising process dies, even by SIGKILL, so
there are no orphans to clean. They ask through :mod:`~operators.controlplane.orphaning`,
which they exec first: no code of the supervisor runs between fork and exec (its gRPC threads
make that unsafe).
The signal is SIGKILL unless the caller picks another: a kube-apiserver that gets SIGTERM while
its etcd dies with it waits in its graceful shutdown for a long time.
Each child also gets its own session, so a Ctrl-C in the supervisor's terminal reaches the
supervisor, which then stops the children in order, rather than every child at once.

With a ``subreaper`` (the daemon of ``fakefleet up``), children are detached instead
(:mod:`~operators.controlplane.detaching`): they are the subreaper's children, get their
signal when it dies, outlive this supervisor, and are recorded beside their logs, so that the
next supervisor of the same child adopts the running process (:meth:`Supervised.adopt`)
rather than starting another one. Such a child is watched through a pidfd, and its exit code
is not this process's to read.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from operators.controlplane import detaching
from operators.controlplane.processes import Watched, identify, start_child, terminate, wait_child

logger = logging.getLogger(__name__)

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


class _Process(Protocol):
    """A started child as :class:`Supervised` watches it."""

    @property
    def pid(self) -> int: ...

    @property
    def running(self) -> bool: ...

    async def wait(self) -> int | None:
        """Its exit code once it exited; None when it is not this process's to read."""

    def send_signal(self, signum: int) -> None: ...


class _Child:
    """A child of this process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.pid = process.pid

    @property
    def running(self) -> bool:
        return self._process.returncode is None

    async def wait(self) -> int | None:
        return await wait_child(self._process)

    def send_signal(self, signum: int) -> None:
        self._process.send_signal(signum)


class _Detached:
    """A detached child: the subreaper's, watched through a pidfd."""

    def __init__(self, watched: Watched) -> None:
        self._watched = watched
        self.pid = watched.pid

    @property
    def running(self) -> bool:
        return self._watched.running

    async def wait(self) -> int | None:
        await self._watched.wait()
        return None

    def send_signal(self, signum: int) -> None:
        self._watched.send_signal(signum)


class Supervised:
    """One child process, restarted with back-off whenever it exits unasked."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        min_backoff: float = 0.5,
        max_backoff: float = 10.0,
        stable_after: float = 30.0,
        death_signal: signal.Signals = signal.SIGKILL,
        env: Mapping[str, str] | None = None,
        subreaper: int | None = None,
    ) -> None:
        """``env``: variables set for the child on top of this process's environment.
        ``subreaper``: the pid of the child subreaper to detach the child to (it then outlives
        this process, and dies with the subreaper); None: it dies with this process."""
        self.name = name
        self.argv = list(argv)
        self.env = dict(env or {})
        self.log_path = log_path
        self.restarts = 0
        self.adopted = False
        """Its process now was started by an earlier supervisor (:meth:`adopt`)."""
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._stable_after = stable_after
        self._death_signal = death_signal
        self._subreaper = subreaper
        self._process: _Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._started_at = 0.0

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.running else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def supervised(self) -> bool:
        """Started and not stopped since (it may be between a crash and its restart)."""
        return self._watcher is not None

    @property
    def record(self) -> Path:
        """Where a detached child's identity is kept, beside its log."""
        return detaching.record_path(self.log_path)

    async def adopt(self, timeout: float = 15.0) -> bool:
        """Supervise the process recorded for this child if it still runs as recorded and as
        this child would start now (:func:`~operators.controlplane.detaching.judge`), and say
        so. Else forget the record; a recorded process of ours that would start otherwise now
        (other ports, flags or binary) is stopped first (SIGKILL after ``timeout``)."""
        if self._watcher is not None:
            raise RuntimeError(f"{self.name} is already supervised")
        recorded = detaching.read_record(self.record)
        if recorded is None:
            return False
        try:
            watched: Watched | None = Watched(recorded.pid)
        except ProcessLookupError:
            watched = None
        # Identified after the pidfd is open: a match then means the pidfd is that process.
        found = identify(recorded.pid) if watched is not None else None
        verdict = detaching.judge(recorded, found, self.argv)
        if verdict is detaching.Verdict.ADOPT and watched is not None:
            logger.info("%s: adopted its running process (pid %d)", self.name, watched.pid)
            self._process = _Detached(watched)
            self._stopping = False
            self.adopted = True
            self._started_at = time.monotonic()
            self._watcher = asyncio.create_task(self._watch(), name=f"supervise:{self.name}")
            return True
        if verdict is detaching.Verdict.OUTDATED and watched is not None:
            logger.info("%s: its running process (pid %d) was started otherwise than it would "
                        "be now; stopping it", self.name, watched.pid)
            await terminate(watched, timeout)
        elif watched is not None:
            watched.close()
        self.record.unlink(missing_ok=True)
        return False

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
        if process is None:
            return  # never started: a record beside the log is another supervisor's to judge
        if process.running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                logger.warning("%s did not stop within %.0fs; killing it", self.name, timeout)
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
                await process.wait()
        self.record.unlink(missing_ok=True)

    async def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Said here, as exec would have said it, rather than as an exit code of the child.
        if shutil.which(self.argv[0]) is None:
            raise FileNotFoundError(errno.ENOENT, "no such executable", self.argv[0])
        env = {**os.environ, **self.env} if self.env else None
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            detached = " detached" if self._subreaper is not None else ""
            log.write(f"--- fakefleet: starting {self.name}{detached} at {stamp}\n".encode())
            log.flush()
            if self._subreaper is not None:
                self._process = _Detached(await detaching.spawn(
                    self.argv, reaper=self._subreaper, death_signal=self._death_signal,
                    log=log, env=env, record=self.record))
            else:
                self._process = _Child(await start_child(
                    [sys.executable, "-I", "-S", str(detaching.ORPHANING), str(os.getpid()),
                     str(int(self._death_signal)), *self.argv],
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                ))
        self.adopted = False
        self._started_at = time.monotonic()

    async def _watch(self) -> None:
        backoff = self._min_backoff
        while True:
            assert self._process is not None
            code = await self._process.wait()
            if self._stopping:
                return
            last_words = tail(self.log_path, CRASH_LINES)[-CRASH_CHARS:]
            how = f"with code {code}" if code is not None else "(detached: its code is unknown)"
            logger.warning("%s exited %s; restarting in %.1fs; its log ends:\n%s",
                           self.name, how, backoff, last_words)
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
