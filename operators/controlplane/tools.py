"""Tools that ``go install`` builds as they are (Kueue, Helm), each kept in the per-user cache.

``go install MODULE/cmd/NAME@VERSION`` needs no wrapper module when the tool's go.mod has no
replaces. A tool whose main package gets files of ours (KubeRay) is built with ``go build`` in a
wrapper module (:mod:`operators.controlplane.wrapping`), and its cache entry is named after
those files too, so that a change of them builds it anew.

As with the control-plane binaries (:mod:`operators.controlplane.binaries`), a build lands in a
staging directory that is renamed into place only when complete, under a file lock, so two
processes never build twice and an interrupted build leaves nothing half-made. An environment
variable per tool names a binary to use instead.

The build runs through :func:`operators.controlplane.compiling.run_go`: a progress line (elapsed
time, packages compiled) at least every 15 s.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from operators.controlplane import wrapping
from operators.controlplane.binaries import cache_root
from operators.controlplane.compiling import Progress, Spawn, popen, run_go
from operators.controlplane.errors import BinaryError
from operators.controlplane.modules import download, find_go


@dataclasses.dataclass(frozen=True)
class GoTool:
    """One tool: its binary's name, the package ``go install`` builds, and the release."""

    name: str
    """The binary, and the cache directory: ``<cache>/<name>/<version>/<name>``."""
    title: str
    """How people call it in progress lines and errors (``Kueue``, ``Helm``)."""
    package: str
    version: str
    override: str
    """The environment variable that names a binary to use instead."""
    ldflags: str = ""
    hint: str = "a cold build takes a few minutes"
    installs: str = ""
    """The file ``go install`` writes (the package's last element), when it is not ``name``:
    Karpenter's KWOK provider is the package ``.../kwok``, a name KWOK's own binary has."""
    module: str = ""
    """The module the package is in; needed with ``additions``."""
    additions: tuple[Path, ...] = ()
    """Go files of ours added to the main package: it is then built in a wrapper module."""

    def cache_path(self, root: Path | None = None) -> Path:
        return (root or cache_root()) / self.name / self.release() / self.name

    def release(self) -> str:
        """The version, and with ``additions`` a digest of them (``v1.5.0+0123abcd``)."""
        if not self.additions:
            return self.version
        digest = hashlib.sha256()
        for path in self.additions:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return f"{self.version}+{digest.hexdigest()[:8]}"

    def find(self, root: Path | None = None) -> Path | None:
        """The override, else the cached build, else None (nothing is built here)."""
        explicit = os.environ.get(self.override)
        if explicit:
            path = Path(explicit)
            if not path.is_file() or not os.access(path, os.X_OK):
                raise BinaryError(
                    f"{self.override}={explicit} does not name an executable {self.name} "
                    f"binary: fix the path or unset {self.override} to use the cached build")
            return path
        target = self.cache_path(root)
        return target if target.is_file() else None

    def install_argv(self, go: str) -> list[str]:
        """The build: static, reproducible paths, every package compiled named on stderr."""
        return [go, "install", *self._flags(), f"{self.package}@{self.version}"]

    def build_argv(self, go: str, output: Path) -> list[str]:
        """The build of a wrapper module's main package (in its directory), into ``output``."""
        return [go, "build", *self._flags(), "-o", str(output), "."]

    def _flags(self) -> list[str]:
        return ["-v", "-trimpath", *(["-ldflags", self.ldflags] if self.ldflags else [])]

    def ensure(self, *, root: Path | None = None, progress: Progress = lambda _: None,
               clock: Callable[[], float] = time.monotonic, spawn: Spawn = popen) -> Path:
        """The binary: found, or built into the cache (one builder at a time)."""
        found = self.find(root)
        if found is not None:
            return found
        target = self.cache_path(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        with (target.parent / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if target.is_file():  # another process built it while we waited
                return target
            staging = target.parent / ".partial"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            try:
                self._install(staging, progress, clock, spawn)
                (staging / (self.installs or self.name)).rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return target

    def _install(self, staging: Path, progress: Progress, clock: Callable[[], float],
                 spawn: Spawn) -> None:
        go = find_go(f"building {self.title} {self.version} needs the Go toolchain ('go') on "
                     f"PATH: install Go 1.26 or newer, or set {self.override} to a "
                     f"{self.name} binary")
        env = {**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"}
        env.pop("GOFLAGS", None)  # a -mod=... of the caller's environment breaks go install
        what = f"building {self.title} {self.version}"
        log = staging.parent / "build.log"
        log.unlink(missing_ok=True)
        if self.additions:
            progress(f"{what} with go build, its main package in a wrapper module with "
                     f"fakefleet's {', '.join(path.name for path in self.additions)}")
            wrapper = staging / "module"
            wrapper.mkdir()
            wrapping.write(wrapper, download(go, self.module, self.version, failed=lambda why: (
                f"cannot fetch {self.module}@{self.version} from the Go module proxy ({why})")),
                module=self.module, package=self.package, version=self.version,
                additions=self.additions)
            argv, cwd = self.build_argv(go, staging / (self.installs or self.name)), wrapper
        else:
            progress(f"{what} with go install (from the Go module proxy)")
            argv, cwd = self.install_argv(go), staging
        tracker = run_go(argv, what=what, progress=progress, env=env, cwd=cwd, log_path=log,
                         clock=clock, spawn=spawn, hint=self.hint)
        progress(tracker.done(clock()))
