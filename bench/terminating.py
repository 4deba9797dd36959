"""SIGTERM stops a benchmark as Ctrl-C does: the control planes, engines, hogs and collectors
it started are stopped, its temporary directory removed, before it exits.

By default SIGTERM (``pkill -f bench.engines``, ``kill``, a CI job's timeout) ends a Python
process at once, skipping every ``finally``: what the benchmark started stays behind (the
engine process, KWOK's controller, the busy loop of ``--hog``, a collector; the control plane's
processes die only through their death signal) and holds cores that the next run measures on.
Ctrl-C runs the cleanup: inside ``asyncio.run`` the first SIGINT cancels the main task, whose
``finally`` blocks and ``async with`` exits stop what it started, then KeyboardInterrupt ends
the run; outside it, KeyboardInterrupt unwinds the ``with`` blocks. So SIGTERM is handed to
the SIGINT handler in force, and the two stop a benchmark the same way.
"""

from __future__ import annotations

import signal
from types import FrameType


def sigterm_interrupts() -> None:
    """From now on SIGTERM (and SIGINT) stop this process as Ctrl-C does in a terminal (call
    it first in ``main``)."""
    # A shell starts a background job with SIGINT ignored, and asyncio.run then puts in no
    # handler of its own: a benchmark run from a script must stop the same way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # Called, not raised again as SIGINT: a signal raised in a handler waits for the next
    # bytecode, while an idle event loop blocks in select(); asyncio.run's handler wakes it.
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored or defaulted since
        raise KeyboardInterrupt
