"""Run as ``python -I -S orphaning.py PARENT SIGNAL PROGRAM ARGS...``: ask the kernel for
SIGNAL when PARENT dies (``PR_SET_PDEATHSIG``, kept across exec), then become PROGRAM.

Or, detached, as ``python -I -S orphaning.py --detach REAPER SIGNAL REPORT GO PROGRAM ARGS...``:
fork, and let the first process exit at once, so that the second is reparented to REAPER, the
nearest child subreaper above it (the daemon of ``fakefleet up``); there it asks for SIGNAL
when REAPER dies, writes its pid to the file descriptor REPORT, and becomes PROGRAM only once
its starter wrote to the file descriptor GO (which it does after it recorded the pid: a
program never runs unrecorded). GO closed without a word (the starter died) ends it instead.
So PROGRAM outlives the process that started it, and still dies with REAPER
(:mod:`~operators.controlplane.detaching`).

Why a program of its own: a supervisor that runs gRPC (the hub link, span exporters) has
threads, and code run between fork and exec in such a process (Python's ``preexec_fn``, and
with it gRPC's fork handlers) can crash or hang the child before it ever becomes the program
(seen: kube-apiservers aborting with gRPC's ``ev_epoll1_linux.cc Check failed`` right after
an operator restart). Without ``preexec_fn`` Python starts children with vfork and exec alone,
so nothing of the supervisor runs in them; this file is what such a child execs first.

It imports nothing but the standard library (it runs isolated, without site-packages).
"""

import ctypes
import os
import sys
import time

PR_SET_PDEATHSIG = 1
#: How long the second process waits to be reparented to REAPER (s): the first one only exits.
REPARENTING = 5.0


def main(argv: list[str]) -> None:
    if argv[1] == "--detach":
        detach(int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5]), argv[6:])
    parent, death_signal, program = int(argv[1]), int(argv[2]), argv[3:]
    arm(death_signal, parent)
    os.execvp(program[0], program)


def arm(death_signal: int, parent: int) -> None:
    """Ask for ``death_signal`` when ``parent`` dies; exit if it died before that took effect."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:
        sys.exit(1)


def detach(reaper: int, death_signal: int, report: int, go: int, program: list[str]) -> None:
    if os.fork() != 0:
        os._exit(0)
    deadline = time.monotonic() + REPARENTING
    while os.getppid() != reaper:  # until the first process's exit reparented this one
        if time.monotonic() > deadline:
            sys.exit(f"not reparented to the subreaper {reaper} within {REPARENTING:.0f}s "
                     f"(is it still running?)")
        time.sleep(0.001)
    arm(death_signal, reaper)
    os.setsid()  # its own session, as every supervised child has (the first one led its own)
    os.write(report, f"{os.getpid()}\n".encode())
    os.close(report)
    if os.read(go, 1) == b"":
        sys.exit(1)  # the starter died before it recorded this process: never run unrecorded
    os.close(go)
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv)
