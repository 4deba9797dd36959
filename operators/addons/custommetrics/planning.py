"""What to do about a member's custom-metrics adapter, and what its CustomMetricsReady
condition says: pure.

:func:`plan` compares ``spec.addons.customMetrics`` with what the operator observes (the life
every add-on lives, :mod:`operators.addons.lifecycle`: built, started once the member's
Prometheus has its port, which the adapter queries; hooked once it answers ``/readyz``;
restarted when the metrics it serves or Prometheus' port change); :func:`condition` tells the
truth about it in one line. Its hooks are its Service and APIServices, applied once it
answers, never before: an APIService whose server does not answer makes the API server's
discovery fail. The add-on runner (:mod:`operators.addons.custommetrics.running`) observes,
calls these and applies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from operators.addons import lifecycle
from operators.addons.custommetrics import LIBRARY, LIBRARY_VERSION, rendering
from operators.api.clusters import CustomMetricsSpec, FakeCluster
from operators.reconciling.clusters import AddonCondition, AddonState

#: Not part of Ready: only HPAs on application metrics wait for it.
CONDITION = AddonCondition("CustomMetricsReady", "the custom-metrics adapter")
TITLE = f"the custom-metrics adapter ({LIBRARY} {LIBRARY_VERSION})"


@dataclasses.dataclass(frozen=True)
class Observed(lifecycle.Observed):
    """What the operator sees of one member's adapter (its hooks: its Service and
    APIServices)."""

    ready: bool = False
    """``/readyz`` answers 200: it serves custom.metrics.k8s.io."""
    port: int = 0
    prometheus: int = 0
    """The member's Prometheus' port, which it queries (0: none yet)."""
    settings: str = ""
    """What the running process was started with (:func:`settings`; "" when none runs)."""


def settings(spec: CustomMetricsSpec, prometheus: int) -> str:
    """What its command line is made of: a change restarts it."""
    return json.dumps({"metrics": sorted(spec.metrics), "prometheus": prometheus},
                      sort_keys=True)


def plan(cluster: FakeCluster, observed: Observed) -> Sequence[lifecycle.Step]:
    """Actions that bring the member's adapter to ``spec.addons.customMetrics``."""
    spec = cluster.spec.custom_metrics
    # It is started with Prometheus' address: it waits for it as for the API server.
    waiting = dataclasses.replace(observed, control_plane_running=(
        observed.control_plane_running and observed.prometheus > 0))
    steps = lifecycle.plan(waiting, wanted=spec is not None, serving=observed.ready,
                           restart=spec is not None and
                           observed.settings != settings(spec, observed.prometheus))
    return [] if steps is None else steps


def condition(cluster: FakeCluster, observed: Observed) -> AddonState | None:
    """CustomMetricsReady, or None when the custom-metrics path is off."""
    spec = cluster.spec.custom_metrics
    if spec is None:
        return None
    said = lifecycle.condition(observed, serving=observed.ready, title=TITLE,
                               crashed="the custom-metrics adapter",
                               cold_build="about 14 minutes after Prometheus'")
    if said is not None and said.reason in ("BuildFailed", "Building", "Waiting"):
        return said
    if not observed.prometheus:
        return AddonState(False, "Waiting", "waiting for the cluster's Prometheus, which the "
                                            "adapter queries")
    if said is not None:
        return said
    which = ", ".join(spec.metrics) if spec.metrics else "every metric Prometheus has of a pod"
    return AddonState(True, "Running",
                      f"{TITLE} serving {rendering.GROUP} "
                      f"({', '.join(rendering.VERSIONS)}) for pods at "
                      f"https://127.0.0.1:{observed.port}, from Prometheus at "
                      f"http://127.0.0.1:{observed.prometheus}: {which}")
