"""What to do about a member's metrics-server, and what its MetricsServerReady condition says:
pure.

:func:`plan` compares ``spec.addons.metricsServer`` (on by default for a local control plane)
with what the operator observes (the life every add-on lives, :mod:`operators.addons.lifecycle`:
built, started, hooked once it answers ``/livez``; restarted when its resolution changes) and
returns actions; :func:`condition` tells the truth about it in one line. Its hooks are its
Service and APIService, applied once metrics-server answers, never before: an APIService whose
server does not answer makes the API server's discovery fail, which holds up namespace deletion
and the garbage collector. The add-on runner (:mod:`operators.addons.metricsserver.running`)
observes, calls these and applies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from operators.addons import lifecycle
from operators.addons.metricsserver import METRICS_SERVER_VERSION
from operators.api.clusters import FakeCluster
from operators.reconciling.clusters import AddonCondition, AddonState

#: Not part of Ready: kubectl top waits for its scrapes, nothing else does.
CONDITION = AddonCondition("MetricsServerReady", "metrics-server")


@dataclasses.dataclass(frozen=True)
class Observed(lifecycle.Observed):
    """What the operator sees of one member's metrics-server (its hooks: its Service and
    APIService)."""

    live: bool = False
    """``/livez`` answers 200: it serves metrics.k8s.io."""
    ready: bool = False
    """``/readyz`` answers 200: it has scraped metrics (from two rounds)."""
    port: int = 0
    resolution: str = ""
    """The resolution the running process was started with ("" when none runs)."""


def plan(cluster: FakeCluster, observed: Observed) -> Sequence[lifecycle.Step]:
    """Actions that bring the member's metrics-server to its spec."""
    spec = cluster.spec.metrics_server
    steps = lifecycle.plan(observed, wanted=spec is not None, serving=observed.live,
                           restart=spec is not None and observed.resolution != spec.resolution)
    return [] if steps is None else steps


def condition(cluster: FakeCluster, observed: Observed) -> AddonState | None:
    """MetricsServerReady, or None when metrics-server is off."""
    spec = cluster.spec.metrics_server
    if spec is None:
        return None
    version = f"metrics-server {METRICS_SERVER_VERSION}"
    said = lifecycle.condition(observed, serving=observed.live, title=version, crashed=version,
                               cold_build="a few minutes")
    if said is not None:
        return said
    served = (f"{version} serving metrics.k8s.io (kubectl top, HPAs) at "
              f"https://127.0.0.1:{observed.port}, scraping every {spec.resolution}")
    if not observed.ready:
        return AddonState(True, "Running", f"{served}; no metrics yet: they come after two "
                                           f"scrapes of the nodes")
    return AddonState(True, "Running", served)
