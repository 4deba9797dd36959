"""metrics-server, built with ``go install`` into the per-user cache.

``sigs.k8s.io/metrics-server/cmd/metrics-server@vX`` builds as it is (its go.mod has no
replaces), so it is a :class:`~operators.controlplane.tools.GoTool`: staged and renamed into
place under a file lock, with a progress line at least every 15 s while it builds.
``$FAKEFLEET_METRICS_SERVER`` names a binary to use instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from operators.addons.metricsserver import METRICS_SERVER_MODULE, METRICS_SERVER_VERSION
from operators.controlplane.compiling import Progress, Spawn, popen
from operators.controlplane.tools import GoTool

OVERRIDE = "FAKEFLEET_METRICS_SERVER"


def tool(version: str = METRICS_SERVER_VERSION) -> GoTool:
    return GoTool(name="metrics-server", title="metrics-server",
                  package=f"{METRICS_SERVER_MODULE}/cmd/metrics-server", version=version,
                  override=OVERRIDE)


def cache_path(version: str = METRICS_SERVER_VERSION, root: Path | None = None) -> Path:
    """Where the cached build of ``version`` is (or will be)."""
    return tool(version).cache_path(root)


def find(version: str = METRICS_SERVER_VERSION, root: Path | None = None) -> Path | None:
    """``$FAKEFLEET_METRICS_SERVER``, else the cached build, else None (nothing is built)."""
    return tool(version).find(root)


def ensure(version: str = METRICS_SERVER_VERSION, *, root: Path | None = None,
           progress: Progress = lambda _: None,
           clock: Callable[[], float] = time.monotonic, spawn: Spawn = popen) -> Path:
    """The metrics-server binary: found, or built into the cache (one builder at a time)."""
    return tool(version).ensure(root=root, progress=progress, clock=clock, spawn=spawn)
