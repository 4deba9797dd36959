"""Kueue's manager binary, built with ``go install`` into the per-user cache.

``sigs.k8s.io/kueue/cmd/kueue@vX`` builds as it is (its go.mod needs no replaces), so it is a
:class:`~operators.controlplane.tools.GoTool`: staged and renamed into place under a file lock,
with a progress line at least every 15 s while it builds. ``$FAKEFLEET_KUEUE`` names a binary to
use instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from operators.addons.kueue import KUEUE_MODULE, KUEUE_VERSION
from operators.controlplane.compiling import Progress, Spawn, popen
from operators.controlplane.tools import GoTool

OVERRIDE = "FAKEFLEET_KUEUE"


def tool(version: str = KUEUE_VERSION) -> GoTool:
    return GoTool(name="kueue", title="Kueue", package=f"{KUEUE_MODULE}/cmd/kueue",
                  version=version, override=OVERRIDE)


def cache_path(version: str = KUEUE_VERSION, root: Path | None = None) -> Path:
    """Where the cached build of ``version`` is (or will be)."""
    return tool(version).cache_path(root)


def find(version: str = KUEUE_VERSION, root: Path | None = None) -> Path | None:
    """``$FAKEFLEET_KUEUE``, else the cached build, else None (nothing is built here)."""
    return tool(version).find(root)


def ensure(version: str = KUEUE_VERSION, *, root: Path | None = None,
           progress: Progress = lambda _: None,
           clock: Callable[[], float] = time.monotonic, spawn: Spawn = popen) -> Path:
    """The Kueue binary: found, or built into the cache (one builder at a time)."""
    return tool(version).ensure(root=root, progress=progress, clock=clock, spawn=spawn)
