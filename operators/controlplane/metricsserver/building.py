"""Build metrics-server with ``go install`` into the per-user cache, saying how long it has run.

``sigs.k8s.io/metrics-server/cmd/metrics-server@vX`` builds as it is (its go.mod has no
replaces). The build lands in a staging directory renamed into place only when complete, under
a file lock, so two processes never build twice and an interrupted build leaves nothing
half-made (the same shape as :mod:`operators.controlplane.kueue.building`).
``$FAKEFLEET_METRICS_SERVER`` names a binary to use instead.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from operators.controlplane.binaries import cache_root
from operators.controlplane.building import Progress
from operators.controlplane.errors import BinaryError, BuildError
from operators.controlplane.metricsserver import METRICS_SERVER_MODULE, METRICS_SERVER_VERSION

OVERRIDE = "FAKEFLEET_METRICS_SERVER"
NAME = "metrics-server"
#: Seconds between two progress lines while ``go install`` runs.
PROGRESS_INTERVAL = 15.0


def cache_path(version: str = METRICS_SERVER_VERSION, root: Path | None = None) -> Path:
    return (root or cache_root()) / NAME / version / NAME


def find(version: str = METRICS_SERVER_VERSION, root: Path | None = None) -> Path | None:
    """``$FAKEFLEET_METRICS_SERVER``, else the cached build, else None (nothing is built)."""
    explicit = os.environ.get(OVERRIDE)
    if explicit:
        path = Path(explicit)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise BinaryError(f"{OVERRIDE}={explicit} does not name an executable "
                              f"metrics-server binary: fix the path or unset {OVERRIDE}")
        return path
    target = cache_path(version, root)
    return target if target.is_file() else None


def install_argv(go: str, version: str = METRICS_SERVER_VERSION) -> list[str]:
    return [go, "install", "-trimpath", f"{METRICS_SERVER_MODULE}/cmd/{NAME}@{version}"]


def ensure(version: str = METRICS_SERVER_VERSION, *, root: Path | None = None,
           progress: Progress = lambda _: None,
           clock: Callable[[], float] = time.monotonic) -> Path:
    """The metrics-server binary: found, or built into the cache (one builder at a time)."""
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
            (staging / NAME).rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _go_install(version: str, staging: Path, progress: Progress,
                clock: Callable[[], float]) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError(f"building metrics-server {version} needs the Go toolchain ('go') on "
                         f"PATH: install Go 1.26 or newer, or set {OVERRIDE} to a binary")
    env = {**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"}
    env.pop("GOFLAGS", None)  # a -mod=... of the caller's environment would break the install
    started = clock()
    progress(f"building metrics-server {version} with go install (from the Go module proxy)")
    log = staging / "build.log"
    with log.open("w") as output, subprocess.Popen(
            install_argv(go, version), env=env, stdout=output, stderr=subprocess.STDOUT,
            cwd=staging) as process:
        while True:
            try:
                process.wait(timeout=PROGRESS_INTERVAL)
                break
            except subprocess.TimeoutExpired:
                progress(f"building metrics-server {version}: {clock() - started:.0f}s "
                         f"(a cold build takes a few minutes)")
    if process.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:]).strip()
        raise BuildError(f"go install {METRICS_SERVER_MODULE}/cmd/{NAME}@{version} failed "
                         f"with exit code {process.returncode}:\n{tail}")
    progress(f"built metrics-server {version} in {clock() - started:.0f}s")
