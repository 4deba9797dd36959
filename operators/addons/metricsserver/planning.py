"""What to do about a member's metrics-server, and what its MetricsServerReady condition says:
pure.

:func:`plan` compares ``spec.addons.metricsServer`` (on by default for a local control plane)
with what the operator observes (is the binary in the cache or being built, does the process run
and answer ``/livez``, is its APIService applied) and returns actions; :func:`condition` tells
the truth about it in one line. The APIService is applied once metrics-server answers, never
before: an APIService whose server does not answer makes the API server's discovery fail,
which holds up namespace deletion and the garbage collector. The kopf glue
(:mod:`operators.handlers.metricsserver`) observes, calls these and applies.
"""

from __future__ import annotations

import dataclasses

from operators.addons.kueue.planning import crash_summary
from operators.addons.metricsserver import METRICS_SERVER_VERSION
from operators.api.clusters import FakeCluster


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the operator sees of one member's metrics-server."""

    control_plane_running: bool = False
    binary: bool = False
    building_for: float | None = None
    """Seconds the background build has run, None when none runs."""
    build_error: str = ""
    installed: bool = False
    """Its files exist in the member's state (it was set up, and may need tearing down)."""
    supervised: bool = False
    live: bool = False
    """``/livez`` answers 200: it serves metrics.k8s.io."""
    ready: bool = False
    """``/readyz`` answers 200: it has scraped metrics (from two rounds)."""
    hooked: bool = False
    """Its Service and APIService were applied since it started."""
    restarts: int = 0
    log_tail: str = ""
    port: int = 0
    resolution: str = ""
    """The resolution the running process was started with ("" when none runs)."""


@dataclasses.dataclass(frozen=True)
class BuildMetricsServer:
    """Build the metrics-server binary into the cache, in the background."""


@dataclasses.dataclass(frozen=True)
class StartMetricsServer:
    """Apply its RBAC, then start it."""


@dataclasses.dataclass(frozen=True)
class HookMetricsServer:
    """Apply its Service and APIService: the aggregation layer routes metrics.k8s.io to it."""


@dataclasses.dataclass(frozen=True)
class StopMetricsServer:
    """Stop it; ``unhook``: delete its APIService too (the member stays)."""

    unhook: bool = True


Action = BuildMetricsServer | StartMetricsServer | HookMetricsServer | StopMetricsServer


@dataclasses.dataclass(frozen=True)
class MetricsServerState:
    """The MetricsServerReady condition."""

    ready: bool
    reason: str
    message: str


def plan(cluster: FakeCluster, observed: Observed) -> list[Action]:
    """Actions that bring the member's metrics-server to its spec."""
    spec = cluster.spec.metrics_server
    if spec is None:
        return [StopMetricsServer()] if observed.supervised or observed.installed else []
    if not observed.binary:
        return [BuildMetricsServer()] if observed.building_for is None and \
            not observed.build_error else []
    if not observed.control_plane_running:
        return []
    if observed.supervised and observed.resolution != spec.resolution:
        return [StopMetricsServer(unhook=False), StartMetricsServer()]  # a new resolution
    if not observed.supervised:
        return [StartMetricsServer()]
    if observed.live and not observed.hooked:
        return [HookMetricsServer()]
    return []


def condition(cluster: FakeCluster, observed: Observed) -> MetricsServerState | None:
    """MetricsServerReady, or None when metrics-server is off."""
    spec = cluster.spec.metrics_server
    if spec is None:
        return None
    version = f"metrics-server {METRICS_SERVER_VERSION}"
    if observed.build_error:
        return MetricsServerState(False, "BuildFailed",
                                  f"{version} could not be built: {observed.build_error}")
    if not observed.binary:
        so_far = f" ({observed.building_for:.0f}s so far)" if observed.building_for else ""
        return MetricsServerState(False, "Building",
                                  f"building {version} from the Go module proxy into the "
                                  f"cache{so_far}; a cold build takes a few minutes ('fakefleet "
                                  f"binaries' builds it ahead of time)")
    if not observed.control_plane_running:
        return MetricsServerState(False, "Waiting", "waiting for the cluster's API server")
    if not (observed.live and observed.hooked):
        if observed.restarts:
            return MetricsServerState(False, "Crashed",
                                      f"{version} exited and was restarted {observed.restarts} "
                                      f"times: {crash_summary(observed.log_tail)}")
        return MetricsServerState(False, "Starting", f"starting {version}")
    served = (f"{version} serving metrics.k8s.io (kubectl top, HPAs) at "
              f"https://127.0.0.1:{observed.port}, scraping every {spec.resolution}")
    if not observed.ready:
        return MetricsServerState(True, "Running", f"{served}; no metrics yet: they come "
                                                   f"after two scrapes of the nodes")
    return MetricsServerState(True, "Running", served)
