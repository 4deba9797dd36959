"""The daemon of ``fakefleet up`` as a child subreaper (``PR_SET_CHILD_SUBREAPER``): the
processes the operator starts detached (:mod:`~operators.controlplane.detaching`) become the
daemon's children, and so does any other process orphaned below it (what a killed operator
leaves).

The daemon reaps them when they exit (:func:`reap`, every second), and stops those still
running when it stops (:func:`stop_orphans`), after the operator, which stops its own first.
Its own children (etcd, the host's components, the hub, the collector, the operator) are
asyncio's to reap, each by its pid: :func:`reap` takes only the pids that
:func:`~operators.controlplane.processes.own_children` does not list. Killed, the daemon takes
them all with it: each asked for a death signal once it was reparented to the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
from collections.abc import Callable

from operators.controlplane.processes import Watched, children, stat, terminate

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
#: How often exited orphans are reaped (s): until then each is a zombie (a pid, no memory).
REAP_INTERVAL = 1.0

Own = Callable[[], frozenset[int] | None]


def become_subreaper(on: bool = True) -> None:
    """Make this process (with ``on=False``: no longer) the nearest child subreaper of every
    process below it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap(own: Own) -> list[int]:
    """Reap every exited child that is not one of ``own``; their pids. The kernel shows one
    at a time without reaping it (``WNOWAIT``); when that one is one of ``own``, left for its
    waiter, the others are found in ``/proc``."""
    reaped = []
    while (ours := own()) is not None:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # no children at all
            break
        if found is None:
            break
        if found.si_pid in ours:
            reaped += [pid for pid in children(os.getpid(), exited=True)
                       if pid not in ours and _reaped(pid)]
            break
        if not _reaped(found.si_pid):
            break
        reaped.append(found.si_pid)
    return reaped


def _reaped(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    return False


async def keep_reaping(own: Own, *, interval: float = REAP_INTERVAL) -> None:
    """:func:`reap` every ``interval`` until cancelled."""
    while True:
        reap(own)
        await asyncio.sleep(interval)


async def stop_orphans(own: Own, *, timeout: float) -> int:
    """SIGTERM every running child that is not one of ``own``, SIGKILL those left after
    ``timeout``, and reap them; how many there were."""
    ours = own() or frozenset()
    me = os.getpid()
    orphans = []
    for pid in children(me):
        if pid in ours:
            continue
        with contextlib.suppress(ProcessLookupError):
            watched = Watched(pid)
            found = stat(pid)
            if found is not None and found.parent == me:  # not a new process with its pid
                orphans.append(watched)
            else:
                watched.close()
    if orphans:
        logger.info("stopping %d processes the operator left running: %s", len(orphans),
                    ", ".join(str(orphan.pid) for orphan in orphans))
        await asyncio.gather(*(terminate(orphan, timeout) for orphan in orphans))
    reap(own)
    return len(orphans)
