"""Build Kueue's manager binary with ``go install`` into the per-user cache, showing progress.

``sigs.k8s.io/kueue/cmd/kueue@vX`` builds as it is (its go.mod needs no replaces). As with the
control-plane binaries (:mod:`operators.controlplane.binaries`), the build lands in a staging
directory that is renamed into place only when complete, under a file lock, so two processes
never build twice and an interrupted build leaves nothing half-made. ``$FAKEFLEET_KUEUE`` names
a binary to use instead.

A cold build takes minutes: :class:`BuildProgress` turns the package lines of ``go install -v``
and the passing time into a progress line at least every :data:`PROGRESS_INTERVAL` seconds.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from operators.controlplane.binaries import cache_root
from operators.controlplane.building import Progress
from operators.controlplane.errors import BinaryError, BuildError
from operators.controlplane.kueue import KUEUE_MODULE, KUEUE_VERSION

OVERRIDE = "FAKEFLEET_KUEUE"
#: Seconds between two progress lines while ``go install`` is quiet about what it does.
PROGRESS_INTERVAL = 15.0


def cache_path(version: str = KUEUE_VERSION, root: Path | None = None) -> Path:
    """Where the cached build of ``version`` is (or will be)."""
    return (root or cache_root()) / "kueue" / version / "kueue"


def find(version: str = KUEUE_VERSION, root: Path | None = None) -> Path | None:
    """``$FAKEFLEET_KUEUE``, else the cached build, else None (nothing is built here)."""
    explicit = os.environ.get(OVERRIDE)
    if explicit:
        path = Path(explicit)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise BinaryError(f"{OVERRIDE}={explicit} does not name an executable kueue "
                              f"binary: fix the path or unset {OVERRIDE} to use the cached build")
        return path
    target = cache_path(version, root)
    return target if target.is_file() else None


def install_argv(go: str, version: str = KUEUE_VERSION) -> list[str]:
    """The build: static, reproducible paths, every package compiled named on stderr (-v)."""
    return [go, "install", "-v", "-trimpath", f"{KUEUE_MODULE}/cmd/kueue@{version}"]


@dataclasses.dataclass
class BuildProgress:
    """What to tell a person while ``go install -v`` runs: pure, fed lines and times."""

    version: str
    started: float
    interval: float = PROGRESS_INTERVAL
    packages: int = 0
    last_said: float = dataclasses.field(default=0.0)

    def __post_init__(self) -> None:
        self.last_said = self.started

    def line(self, text: str) -> None:
        """One stderr line of ``go install -v``: a package path per compiled package."""
        text = text.strip()
        if text and " " not in text and not text.startswith("go:"):
            self.packages += 1

    def tick(self, now: float) -> str | None:
        """A progress message when the last one is ``interval`` old, else None."""
        if now - self.last_said < self.interval:
            return None
        self.last_said = now
        return self.message(now)

    def message(self, now: float) -> str:
        return (f"building Kueue {self.version}: {now - self.started:.0f}s, "
                f"{self.packages} packages compiled (a cold build takes a few minutes)")


def ensure(version: str = KUEUE_VERSION, *, root: Path | None = None,
           progress: Progress = lambda _: None,
           clock: Callable[[], float] = time.monotonic) -> Path:
    """The Kueue binary: found, or built into the cache (one builder at a time)."""
    found = find(version, root)
    if found is not None:
        return found
    target = cache_path(version, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # another process built it while we waited
            return target
        staging = target.parent / ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            _go_install(version, staging, progress, clock)
            (staging / "kueue").rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _go_install(version: str, staging: Path, progress: Progress,
                clock: Callable[[], float]) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError(f"building Kueue {version} needs the Go toolchain ('go') on PATH: "
                         f"install Go 1.26 or newer, or set {OVERRIDE} to a kueue binary")
    env = {**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"}
    env.pop("GOFLAGS", None)  # a -mod=... of the caller's environment would break the install
    status = BuildProgress(version, clock())
    progress(f"building Kueue {version} with go install (from the Go module proxy)")
    log = staging / "build.log"
    with subprocess.Popen(install_argv(go, version), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=staging) as process:
        assert process.stderr is not None
        lines: list[str] = []

        def read() -> None:
            assert process.stderr is not None
            for text in process.stderr:
                lines.append(text)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        seen = 0
        while process.poll() is None or reader.is_alive():
            reader.join(timeout=1.0)
            for text in lines[seen:]:
                status.line(text)
            seen = len(lines)
            said = status.tick(clock())
            if said:
                progress(said)
        log.write_text("".join(lines))
        if process.returncode != 0:
            tail = "".join(lines[-20:]).strip()
            raise BuildError(f"go install {KUEUE_MODULE}/cmd/kueue@{version} failed with exit "
                             f"code {process.returncode}:\n{tail}")
    progress(f"built Kueue {version} in {clock() - status.started:.0f}s "
             f"({status.packages} packages)")
