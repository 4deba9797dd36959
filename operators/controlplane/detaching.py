"""Children that outlive the process that starts them, and that its successor adopts.

The daemon of ``fakefleet up`` is a child subreaper (:mod:`~operators.controlplane.reaping`)
and tells the operator it starts so, in :data:`SUBREAPER`. The operator then starts the
members' processes (kube-apiserver, kube-scheduler, kube-controller-manager, add-ons, engines)
detached (:func:`spawn`): :mod:`~operators.controlplane.orphaning` forks once more and the
first process exits, so the program is reparented to the daemon, asks for its death signal
when the daemon dies, and only then runs. ``kill -9`` of the operator leaves it running; the
daemon's death (even by SIGKILL) still ends it.

Each one is recorded before it runs, beside its log (:func:`record_path`): its pid, its start
time and its command line (:class:`~operators.controlplane.processes.Identity`; the command
line holds its ports). A successor adopts a recorded process when :func:`judge` finds it
still running as recorded, and started as it would start it now: a pid that names another
process since (same pid, other start time or command line) is never taken for it.

Without a subreaper (the operator run by hand, or in the Helm chart's pod) nothing is
detached: the members die with the operator, as its children.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from operators.controlplane import orphaning
from operators.controlplane.processes import (
    Identity,
    Watched,
    identify,
    start_child,
    wait_child,
)
from primitives.files import write_private

#: Set by the daemon of ``fakefleet up`` for the operator it starts: the daemon's pid.
SUBREAPER = "FAKEFLEET_SUBREAPER"
#: The program every supervised child execs first (isolated: the standard library only).
ORPHANING = Path(orphaning.__file__)
#: How long a detached start may take before it counts as failed (s).
START_TIMEOUT = 15.0


def subreaper(environ: Mapping[str, str], parent: int) -> int | None:
    """The subreaper to detach children to: this process's parent, if it said in
    :data:`SUBREAPER` that it is one (a variable inherited from further up does not count)."""
    value = environ.get(SUBREAPER, "")
    return parent if value.isdigit() and int(value) == parent else None


def record_path(log: Path) -> Path:
    """Where the identity of the detached process that logs to ``log`` is kept."""
    return log.with_name(f"{log.stem}.process.json")


def write_record(path: Path, identity: Identity) -> None:
    write_private(path, (json.dumps({
        "pid": identity.pid, "startTime": identity.start_time, "argv": list(identity.argv),
    }, indent=2) + "\n").encode())


def read_record(path: Path) -> Identity | None:
    """The recorded identity; None when there is none (or it is torn: nothing to adopt)."""
    try:
        found = json.loads(path.read_text())
        return Identity(int(found["pid"]), int(found["startTime"]),
                        tuple(str(arg) for arg in found["argv"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


class Verdict(enum.Enum):
    ADOPT = "adopt"
    """It runs as recorded, and as it would be started now."""
    OUTDATED = "outdated"
    """It runs as recorded, but would be started otherwise now (other ports, flags, binary):
    it is ours to stop."""
    GONE = "gone"
    """It does not run: no process has its pid, or another one has (pid reuse)."""


def judge(recorded: Identity, found: Identity | None, wanted: Sequence[str]) -> Verdict:
    """What to do with the recorded process, from what ``/proc`` shows under its pid now."""
    if found is None or found.pid != recorded.pid or found.start_time != recorded.start_time \
            or found.argv != recorded.argv:
        return Verdict.GONE
    return Verdict.ADOPT if recorded.argv == tuple(wanted) else Verdict.OUTDATED


def running_as_recorded(record: Path) -> bool:
    """Whether the process recorded at ``record`` still runs as recorded."""
    recorded = read_record(record)
    return recorded is not None and judge(
        recorded, identify(recorded.pid), recorded.argv) is Verdict.ADOPT


async def spawn(argv: Sequence[str], *, reaper: int, death_signal: signal.Signals,
                log: IO[bytes], env: Mapping[str, str] | None, record: Path) -> Watched:
    """Start ``argv`` under the subreaper ``reaper``, record it at ``record``, and let it run.

    The handshake with :mod:`~operators.controlplane.orphaning`: it writes the program's pid
    to one pipe once it is the reaper's child with its death signal armed; the record is
    written; a byte on the other pipe lets it exec. If this process dies before that byte,
    the other pipe closes and the program never runs: nothing runs unrecorded."""
    report_read, report_write = os.pipe()
    go_read, go_write = os.pipe()
    try:
        try:
            first = await start_child(
                [sys.executable, "-I", "-S", str(ORPHANING), "--detach", str(reaper),
                 str(int(death_signal)), str(report_write), str(go_read), *argv],
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True, env=env, pass_fds=(report_write, go_read))
        finally:
            os.close(report_write)
            os.close(go_read)
        try:
            said = await asyncio.wait_for(_read_to_end(report_read), START_TIMEOUT)
        finally:
            await wait_child(first)  # it exits at once, whatever the second one does
        if not said.strip().isdigit():
            raise OSError(f"{argv[0]} could not be started detached (see its log)")
        watched = Watched(int(said))
        found = identify(watched.pid)
        if found is None:
            watched.close()
            raise OSError(f"{argv[0]} exited before it ran (see its log)")
        try:
            write_record(record, Identity(watched.pid, found.start_time, tuple(argv)))
        except BaseException:  # a full disk: the program never runs (the pipe closes)
            watched.close()
            raise
        os.write(go_write, b"\n")
        return watched
    except TimeoutError:
        raise OSError(f"{argv[0]} was not started detached within {START_TIMEOUT:.0f}s "
                      f"(see its log)") from None
    finally:
        os.close(go_write)
        os.close(report_read)


async def _read_to_end(descriptor: int) -> bytes:
    """Everything written to the pipe ``descriptor`` until its last writer closed it."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    os.set_blocking(descriptor, False)
    loop.add_reader(descriptor, readable.set)
    chunks: list[bytes] = []
    try:
        while True:
            await readable.wait()
            readable.clear()
            try:
                chunk = os.read(descriptor, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        loop.remove_reader(descriptor)
