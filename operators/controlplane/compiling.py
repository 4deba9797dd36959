"""Run one ``go`` command (build, install, mod tidy) and say what it does while it runs.

A cold ``go build`` of kube-apiserver compiles for many minutes and prints nothing without
``-v``; with ``-v`` it names each package as it is compiled, and every ``go`` command names the
modules it downloads (``go: downloading M V``). :class:`Tracker` turns those lines and the
passing time into a progress line at least every :data:`PROGRESS_INTERVAL` seconds (elapsed
time, packages compiled, modules downloaded); :func:`run_go` runs the command and feeds it.

Every tool fakefleet builds (etcd, the Kubernetes binaries, Kueue, Helm) goes through
:func:`run_go`, so they all report alike. The process, the clock and the pace of the watch loop
are injectable: unit tests drive a fake process on a fake clock. This module knows nothing of
caches or recipes; :mod:`operators.controlplane.building` and the tools' own modules do.
"""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from operators.controlplane.errors import BuildError

Progress = Callable[[str], None]
#: Seconds between two progress lines while ``go`` is quiet about what it does.
PROGRESS_INTERVAL = 15.0
#: Lines of output kept for the error message of a failed command.
TAIL = 20


class Process(Protocol):
    """What :func:`run_go` needs of a started process (``subprocess.Popen`` has it)."""

    @property
    def stderr(self) -> Iterable[str] | None: ...

    @property
    def returncode(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


Spawn = Callable[[Sequence[str], Mapping[str, str] | None, Path | None], Process]


def popen(argv: Sequence[str], env: Mapping[str, str] | None, cwd: Path | None) -> Process:
    """The real process: stdout dropped (``go build`` writes nothing there), stderr as text
    lines, merged with nothing else."""
    return subprocess.Popen(list(argv), env=None if env is None else dict(env), cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


@dataclasses.dataclass
class Tracker:
    """What to tell a person while a ``go`` command runs: pure, fed lines and times."""

    what: str
    started: float
    interval: float = PROGRESS_INTERVAL
    hint: str = ""
    packages: int = 0
    downloads: int = 0
    last_said: float = dataclasses.field(default=0.0)

    def __post_init__(self) -> None:
        self.last_said = self.started

    def line(self, text: str) -> None:
        """One stderr line: ``go: downloading M V``, or (``-v``) a compiled package's path."""
        text = text.strip()
        if text.startswith("go: downloading "):
            self.downloads += 1
        elif text and " " not in text and not text.startswith(("go:", "#")):
            self.packages += 1

    def tick(self, now: float) -> str | None:
        """A progress message when the last one is ``interval`` old, else None."""
        if now - self.last_said < self.interval:
            return None
        self.last_said = now
        return self.message(now)

    def counts(self) -> str:
        parts = [f"{self.packages} packages compiled"]
        if self.downloads:
            parts.append(f"{self.downloads} modules downloaded")
        return ", ".join(parts)

    def message(self, now: float) -> str:
        hint = f" ({self.hint})" if self.hint else ""
        return f"{self.what}: {now - self.started:.0f}s, {self.counts()}{hint}"

    def done(self, now: float) -> str:
        """The line that ends the command: how long it took and what it compiled."""
        return f"{self.what}: done in {now - self.started:.0f}s ({self.counts()})"


def run_go(argv: Sequence[str], *, what: str, progress: Progress,
           env: Mapping[str, str] | None = None, cwd: Path | None = None,
           log_path: Path | None = None, hint: str = "",
           clock: Callable[[], float] = time.monotonic, spawn: Spawn = popen,
           interval: float = PROGRESS_INTERVAL, poll: float = 1.0) -> Tracker:
    """Run ``argv`` to the end, telling ``progress`` how it goes at least every ``interval``
    seconds; append its output to ``log_path``. A failure raises :class:`BuildError` with the
    last lines of output. Returns the tracker (how long, how many packages)."""
    tracker = Tracker(what, clock(), interval=interval, hint=hint)
    lines: list[str] = []
    lock = threading.Lock()  # the reader thread and this one both tick

    def tick() -> None:
        with lock:
            said = tracker.tick(clock())
        if said:
            progress(said)

    process = spawn(argv, env, cwd)

    def read() -> None:
        for text in process.stderr or ():
            with lock:
                lines.append(text)
                tracker.line(text)
            tick()

    reader = threading.Thread(target=read, name=f"go-output:{what}", daemon=True)
    reader.start()
    while reader.is_alive():
        reader.join(timeout=poll)
        tick()
    code = process.wait()
    close = getattr(process.stderr, "close", None)
    if close is not None:
        close()
    if log_path is not None:
        with log_path.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n{''.join(lines)}\n")
    if code != 0:
        tail = "".join(lines[-TAIL:]).strip()
        where = f"; full log: {log_path}" if log_path is not None else ""
        command = " ".join(["go", *argv[1:]])
        raise BuildError(f"{what} failed ({command} exited with code {code}{where}):\n{tail}")
    return tracker

