"""Find the control-plane binaries: an explicit override, then the cache, then a build.

The cache lives outside any checkout (``$FAKEFLEET_CACHE_DIR``, else
``$XDG_CACHE_HOME/fakefleet``, else ``~/.cache/fakefleet``) and is keyed by the Kubernetes
version and a fingerprint of the build recipe, so a second run, a fresh clone on the same
machine and later work all reuse one build. A build lands in a temporary directory and is
renamed into place only when complete, so an interrupted build never leaves a half-filled entry.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from operators.controlplane import building
from operators.controlplane.compiling import Progress
from operators.controlplane.errors import BinaryError

DEFAULT_KUBERNETES_VERSION = "v1.36.3"

#: Binary name → environment variable that overrides it.
OVERRIDES = {
    "etcd": "FAKEFLEET_ETCD",
    "kube-apiserver": "FAKEFLEET_KUBE_APISERVER",
    "kube-scheduler": "FAKEFLEET_KUBE_SCHEDULER",
    "kube-controller-manager": "FAKEFLEET_KUBE_CONTROLLER_MANAGER",
}


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Paths of the four upstream binaries of one Kubernetes version."""

    version: str
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path

    def path(self, name: str) -> Path:
        path: Path = getattr(self, name.replace("-", "_"))
        return path


def cache_root() -> Path:
    """The per-user cache directory for everything fakefleet builds or downloads."""
    explicit = os.environ.get("FAKEFLEET_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fakefleet"


def cache_entry(version: str, root: Path | None = None) -> Path:
    """The directory that holds (or will hold) the build of ``version`` with today's recipe."""
    fingerprint = json.dumps(building.recipe_fingerprint(version), sort_keys=True)
    key = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
    return (root or cache_root()) / "kubernetes" / f"{version}-{key}"


def resolve(
    version: str = DEFAULT_KUBERNETES_VERSION,
    *,
    root: Path | None = None,
    allow_build: bool = True,
    progress: Progress = lambda _: None,
) -> Binaries:
    """Return usable binaries for ``version``, building them if nothing else provides them."""
    building.parse_version(version)
    overrides = {name: _override(name) for name in OVERRIDES}
    if all(path is not None for path in overrides.values()):
        return _assemble(version, overrides)

    entry = cache_entry(version, root)
    if not _complete(entry):
        if not allow_build:
            raise BinaryError(
                f"no build of Kubernetes {version} in the cache ({entry}) and building is "
                f"disabled: run 'fakefleet binaries' or set {', '.join(OVERRIDES.values())}"
            )
        _build_locked(version, entry, progress)
    cached: dict[str, Path | None] = {name: entry / name for name in OVERRIDES}
    return _assemble(version, {name: overrides[name] or cached[name] for name in OVERRIDES})


def _override(name: str) -> Path | None:
    variable = OVERRIDES[name]
    value = os.environ.get(variable)
    if not value:
        return None
    path = Path(value)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise BinaryError(
            f"{variable}={value} does not name an executable {name} binary: fix the path or "
            f"unset {variable} to use the cached build"
        )
    return path


def _assemble(version: str, paths: dict[str, Path | None]) -> Binaries:
    resolved: dict[str, Path] = {}
    for name, path in paths.items():
        if path is None or not path.is_file():
            raise BinaryError(f"the {name} binary is missing at {path}")
        resolved[name.replace("-", "_")] = path
    return Binaries(version=version, **resolved)


def _complete(entry: Path) -> bool:
    return (entry / "manifest.json").is_file()


def _build_locked(version: str, entry: Path, progress: Progress) -> None:
    """Build into ``entry`` unless another process does so first (serialised by a file lock)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with (entry.parent / f".{entry.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(entry):
            return
        staging = entry.parent / f".{entry.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        started = time.monotonic()
        facts = building.build(
            version, staging, entry.parent / f".{entry.name}.work", progress=progress
        )
        manifest = {
            **building.recipe_fingerprint(version),
            **facts,
            "buildSeconds": round(time.monotonic() - started, 1),
            "builtAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(entry, ignore_errors=True)
        staging.rename(entry)
