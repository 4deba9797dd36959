"""Tools that ``go install`` builds as they are (Kueue, Helm, Prometheus), and fakefleet's own
Go programs (the custom-metrics adapter), each kept in the per-user cache.

``go install MODULE/cmd/NAME@VERSION`` needs no wrapper module when the tool's go.mod has no
replaces (:class:`GoTool`). A tool whose main package gets files of ours (KubeRay) is built
with ``go build`` in a wrapper module (:mod:`operators.controlplane.wrapping`), and its cache
entry is named after those files too, so that a change of them builds it anew. A program of
fakefleet's own is not on the module proxy: it is a module in fakefleet's source (shipped in
the wheel), built with ``go build`` in its directory and kept under a digest of its sources, so
that a changed source is built anew (:class:`GoSourceTool`).

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
import functools
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

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
    tags: str = ""
    """Build tags, comma-separated (Prometheus' ``remove_all_sd,enable_kubernetes_sd``)."""
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
        return _find(self.name, self.override, self.cache_path(root))

    def install_argv(self, go: str) -> list[str]:
        """The build: static, reproducible paths, every package compiled named on stderr."""
        return [go, "install", *self._flags(), f"{self.package}@{self.version}"]

    def build_argv(self, go: str, output: Path) -> list[str]:
        """The build of a wrapper module's main package (in its directory), into ``output``."""
        return [go, "build", *self._flags(), "-o", str(output), "."]

    def _flags(self) -> list[str]:
        return ["-v", "-trimpath", *(["-tags", self.tags] if self.tags else []),
                *(["-ldflags", self.ldflags] if self.ldflags else [])]

    def ensure(self, *, root: Path | None = None, progress: Progress = lambda _: None,
               clock: Callable[[], float] = time.monotonic, spawn: Spawn = popen) -> Path:
        """The binary: found, or built into the cache (one builder at a time)."""
        found = self.find(root)
        if found is not None:
            return found
        return _build_into(self.cache_path(root), self.installs or self.name,
                           lambda staging: self._install(staging, progress, clock, spawn))

    def _install(self, staging: Path, progress: Progress, clock: Callable[[], float],
                 spawn: Spawn) -> None:
        go = find_go(f"building {self.title} {self.version} needs the Go toolchain ('go') on "
                     f"PATH: install Go 1.26 or newer, or set {self.override} to a "
                     f"{self.name} binary")
        env = {**_go_environment(), "GOBIN": str(staging)}
        what = f"building {self.title} {self.version}"
        log = _fresh_log(staging)
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


#: The files of a Go module of fakefleet's own that its build depends on.
SOURCE_FILES = ("go.mod", "go.sum", "*.go")


@dataclasses.dataclass(frozen=True)
class GoSourceTool:
    """A Go program of fakefleet's own: the main package of the module in ``source`` (its
    go.mod and go.sum committed), built with ``go build`` into the cache under
    ``<cache>/<name>/<digest of its sources>/<name>``."""

    name: str
    title: str
    source: Path
    override: str
    """The environment variable that names a binary to use instead."""
    hint: str = "a cold build takes a few minutes"

    @functools.cached_property
    def version(self) -> str:
        """The digest of its sources (names and contents, its tests aside): a build of other
        sources is another entry of the cache."""
        digest = hashlib.sha256()
        for path in sorted({path for pattern in SOURCE_FILES
                            for path in self.source.glob(pattern)
                            if not path.name.endswith("_test.go")}):
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()[:12]

    def cache_path(self, root: Path | None = None) -> Path:
        return (root or cache_root()) / self.name / self.version / self.name

    def find(self, root: Path | None = None) -> Path | None:
        """The override, else the cached build, else None (nothing is built here)."""
        return _find(self.name, self.override, self.cache_path(root))

    def build_argv(self, go: str, output: Path) -> list[str]:
        """The build: the module's go.sum as committed (never edited: the source may be an
        installed wheel's), static, reproducible paths, every package compiled named on
        stderr; no VCS stamp (the digest is its version)."""
        return [go, "build", "-v", "-trimpath", "-mod=readonly", "-buildvcs=false", "-o",
                str(output), "."]

    def ensure(self, *, root: Path | None = None, progress: Progress = lambda _: None,
               clock: Callable[[], float] = time.monotonic, spawn: Spawn = popen) -> Path:
        """The binary: found, or built into the cache (one builder at a time)."""
        found = self.find(root)
        if found is not None:
            return found
        if not (self.source / "go.mod").is_file():
            raise BinaryError(f"{self.title}'s Go source is not at {self.source} (no go.mod): "
                              f"reinstall fakefleet, or set {self.override} to a {self.name} "
                              f"binary")
        return _build_into(self.cache_path(root), self.name,
                           lambda staging: self._build(staging, progress, clock, spawn))

    def _build(self, staging: Path, progress: Progress, clock: Callable[[], float],
               spawn: Spawn) -> None:
        go = find_go(f"building {self.title} needs the Go toolchain ('go') on PATH: install "
                     f"Go 1.26 or newer, or set {self.override} to a {self.name} binary")
        what = f"building {self.title} ({self.version})"
        progress(f"{what} with go build from {self.source} (its modules from the Go module "
                 f"proxy)")
        # GOWORK off: a go.work above the source (a checkout's) must not change the build.
        env = {**_go_environment(), "GOWORK": "off"}
        tracker = run_go(self.build_argv(go, staging / self.name), what=what,
                         progress=progress, env=env, cwd=self.source,
                         log_path=_fresh_log(staging), clock=clock, spawn=spawn,
                         hint=self.hint)
        progress(tracker.done(clock()))


class Tool(Protocol):
    """What runs an add-on's binary needs of its tool, whichever kind it is."""

    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str: ...

    def find(self, root: Path | None = None) -> Path | None: ...

    def ensure(self, *, root: Path | None = None, progress: Progress = ...,
               clock: Callable[[], float] = ..., spawn: Spawn = ...) -> Path: ...


def _find(name: str, override: str, target: Path) -> Path | None:
    explicit = os.environ.get(override)
    if explicit:
        path = Path(explicit)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise BinaryError(
                f"{override}={explicit} does not name an executable {name} binary: fix the "
                f"path or unset {override} to use the cached build")
        return path
    return target if target.is_file() else None


def _build_into(target: Path, built: str, build: Callable[[Path], None]) -> Path:
    """``build`` writes the file ``built`` into a staging directory, renamed to ``target``
    once complete; under a lock, so that one process builds and the others wait for it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # another process built it while we waited
            return target
        staging = target.parent / ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            build(staging)
            (staging / built).rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _go_environment() -> dict[str, str]:
    env = {**os.environ, "CGO_ENABLED": "0"}
    env.pop("GOFLAGS", None)  # a -mod=... of the caller's environment breaks go install
    return env


def _fresh_log(staging: Path) -> Path:
    log = staging.parent / "build.log"
    log.unlink(missing_ok=True)
    return log
