"""Processes as Linux shows them: who a pid is (``/proc``), a process that is not this one's
child (a pidfd), and which children this process started itself.

- :func:`identify` reads a pid's start time (``/proc/<pid>/stat`` field 22, clock ticks after
  boot) and command line: together with the pid they name one process for good, so a record of
  them tells a process that still runs from another that got its pid since.
- :class:`Watched` holds a pidfd (``pidfd_open(2)``): the event loop sees the process exit
  (the pidfd turns readable), and signals reach that process even after its pid was reused.
  Only its parent can read its exit code: here it is unknown.
- :func:`start_child` and :func:`wait_child` keep the pids of the children this process
  started and asyncio has not reaped yet (:func:`own_children`): a child subreaper reaps the
  other ones (:mod:`~operators.controlplane.reaping`), and must leave these to asyncio's child
  watcher, which waits for each by its pid.

Linux only, as the rest of the substrate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import select
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclasses.dataclass(frozen=True)
class Identity:
    """One process for good: its pid, when it started and what it runs."""

    pid: int
    start_time: int
    """Clock ticks after boot (``/proc/<pid>/stat`` field 22)."""
    argv: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/<pid>/stat`` that fakefleet reads."""

    state: str
    parent: int
    start_time: int

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def stat(pid: int, proc: Path = PROC) -> Stat | None:
    """``/proc/<pid>/stat``, None when there is no such process."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses itself.
    fields = text[text.rindex(")") + 2:].split()
    return Stat(state=fields[0], parent=int(fields[1]), start_time=int(fields[19]))


def identify(pid: int, proc: Path = PROC) -> Identity | None:
    """Who ``pid`` is now; None when no process runs under it (a zombie has exited)."""
    found = stat(pid, proc)
    if found is None or found.zombie:
        return None
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if not raw:  # it exited meanwhile (or is a kernel thread)
        return None
    return Identity(pid, found.start_time, tuple(raw.decode(errors="replace")
                                                 .removesuffix("\0").split("\0")))


def children(parent: int, proc: Path = PROC, *, exited: bool = False) -> list[int]:
    """The pids of ``parent``'s children that run (with ``exited``: that exited, and wait
    for their parent to reap them)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        child = stat(int(entry.name), proc)
        if child is not None and child.parent == parent and child.zombie == exited:
            found.append(int(entry.name))
    return found


class Watched:
    """A running process through a pidfd, whoever its parent is."""

    def __init__(self, pid: int) -> None:
        """ProcessLookupError when ``pid`` is gone."""
        self.pid = pid
        self._pidfd: int | None = os.pidfd_open(pid)
        self._exited: asyncio.Future[None] | None = None

    @property
    def running(self) -> bool:
        """Whether it runs; it changes nothing, so any thread may ask (the pidfd is closed
        by the loop that waits on it, or by :meth:`close`)."""
        pidfd = self._pidfd
        if pidfd is None:
            return False
        poll = select.poll()  # not select(): descriptors past 1024 are common in the operator
        poll.register(pidfd, select.POLLIN)
        return not poll.poll(0)  # readable once it exited (POLLNVAL once closed meanwhile)

    async def wait(self) -> None:
        """Until it exited; its code is its parent's to read, not this process's."""
        if self._exited is None:
            self._exited = asyncio.get_running_loop().create_future()
            if self.running:
                assert self._pidfd is not None
                asyncio.get_running_loop().add_reader(self._pidfd, self._gone)
            else:
                self._gone()
        await asyncio.shield(self._exited)

    def send_signal(self, signum: int) -> None:
        """ProcessLookupError once it exited."""
        if self._pidfd is None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, signum)

    def close(self) -> None:
        """Stop watching (the process runs on). Taken first, the descriptor is closed once,
        never a number the kernel has given to another file since."""
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is None:
            return
        with contextlib.suppress(RuntimeError):  # no loop: nothing was registered
            asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)

    def _gone(self) -> None:
        self.close()
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(None)


async def terminate(process: Watched, timeout: float) -> bool:
    """SIGTERM ``process``, SIGKILL it after ``timeout``; whether SIGTERM was enough."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout)
        return True
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        await process.wait()
        return False


@dataclasses.dataclass
class _Children:
    pids: set[int] = dataclasses.field(default_factory=set)
    starting: int = 0


# One per process, as the kernel's table of its children is.
_CHILDREN = _Children()


async def start_child(argv: Sequence[str], **options: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec(*argv, **options)``, its pid kept among
    :func:`own_children` until :func:`wait_child` saw it exit."""
    _CHILDREN.starting += 1
    try:
        process = await asyncio.create_subprocess_exec(*argv, **options)
        _CHILDREN.pids.add(process.pid)
    finally:
        _CHILDREN.starting -= 1
    return process


async def wait_child(process: asyncio.subprocess.Process) -> int:
    """Its exit code, once asyncio reaped it."""
    code = await process.wait()
    _CHILDREN.pids.discard(process.pid)
    return code


def own_children() -> frozenset[int] | None:
    """The children this process started and asyncio has not reaped yet; None while one is
    being started (its pid is not known yet, and it may have exited already)."""
    return None if _CHILDREN.starting else frozenset(_CHILDREN.pids)
