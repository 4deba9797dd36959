"""Fetch one Go module version from the Go module proxy: ``go mod download -json``.

The Kubernetes build reads ``k8s.io/kubernetes``'s go.mod, Helm's build its own go.mod, and each
add-on its manifests from its module source; they all fetch through :func:`download`, so the
command and the reading of its answer are written once. Go keeps what it fetched in its per-user
module cache (a second fetch is a cache hit); this module keeps nothing and builds nothing:
:mod:`operators.controlplane.compiling` runs the builds.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from operators.controlplane.errors import BuildError


@dataclasses.dataclass(frozen=True)
class Module:
    """Where Go's module cache holds one module version."""

    source: Path
    """Its source tree (``Dir``)."""
    gomod: Path
    """Its go.mod (``GoMod``)."""
    sum: str = ""
    """The hash of its source tree, as a go.sum line gives it (``Sum``)."""
    gomod_sum: str = ""
    """The hash of its go.mod (``GoModSum``)."""


def find_go(missing: str) -> str:
    """The ``go`` on PATH; else :class:`BuildError` with ``missing``, which says what needs Go
    and what to do instead."""
    go = shutil.which("go")
    if go is None:
        raise BuildError(missing)
    return go


def download(go: str, module: str, version: str, *, failed: Callable[[str], str],
             cwd: Path | None = None) -> Module:
    """``module@version`` in the module cache, fetched from the proxy unless it is there
    already. A failure raises :class:`BuildError` with ``failed(reason)``, the reason being
    Go's own error (an unknown version, no network), else its stderr."""
    proc = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"],
                          cwd=cwd, capture_output=True, text=True, check=False)
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info or "GoMod" not in info:
        raise BuildError(failed(info.get("Error") or proc.stderr.strip() or "no answer"))
    return Module(source=Path(info["Dir"]), gomod=Path(info["GoMod"]), sum=info.get("Sum", ""),
                  gomod_sum=info.get("GoModSum", ""))
