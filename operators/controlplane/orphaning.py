"""Run as ``python -I -S orphaning.py PARENT SIGNAL PROGRAM ARGS...``: ask the kernel for
SIGNAL when PARENT dies (``PR_SET_PDEATHSIG``, kept across exec), then become PROGRAM.

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

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    parent, death_signal, program = int(argv[1]), int(argv[2]), argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(1)
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv)
