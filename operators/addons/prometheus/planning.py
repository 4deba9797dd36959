"""What to do about a member's Prometheus, and what its PrometheusReady condition says: pure.

:func:`plan` compares ``spec.addons.customMetrics`` with what the operator observes (the life
every add-on lives, :mod:`operators.addons.lifecycle`: built, started once the member's engine
has its plain port, which the scrape configuration names; restarted when its configuration
changes; it has nothing to hook, nothing in the member calls it); :func:`condition` tells the
truth about it in one line. The add-on runner (:mod:`operators.addons.prometheus.running`)
observes, calls these and applies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from operators.addons import lifecycle
from operators.addons.prometheus import PROMETHEUS_RELEASE
from operators.api.clusters import CustomMetricsSpec, FakeCluster
from operators.api.durations import parse_duration
from operators.reconciling.clusters import AddonCondition, AddonState

#: Not part of Ready: only HPAs on application metrics wait for it.
CONDITION = AddonCondition("PrometheusReady", "Prometheus")
TITLE = f"Prometheus {PROMETHEUS_RELEASE}"


@dataclasses.dataclass(frozen=True)
class Observed(lifecycle.Observed):
    """What the operator sees of one member's Prometheus."""

    ready: bool = False
    """``/-/ready`` answers 200: its TSDB is open, it scrapes."""
    port: int = 0
    engine_port: int = 0
    """The member's engine's plain port (not its TLS kubelet API's), which it scrapes the pods
    through (0: not known yet)."""
    settings: str = ""
    """What the running process was started with (:func:`settings`; "" when none runs)."""


def settings(spec: CustomMetricsSpec, engine_port: int) -> str:
    """What its configuration is made of: a change restarts it."""
    return json.dumps({"scrapeInterval": parse_duration(spec.scrapeInterval),
                       "retention": parse_duration(spec.retention),
                       "metrics": sorted(spec.metrics), "enginePort": engine_port},
                      sort_keys=True)


def plan(cluster: FakeCluster, observed: Observed) -> Sequence[lifecycle.Step]:
    """Actions that bring the member's Prometheus to ``spec.addons.customMetrics``."""
    spec = cluster.spec.custom_metrics
    # Its configuration names the engine's port: it waits for the engine as for the API
    # server.
    waiting = dataclasses.replace(observed, control_plane_running=(
        observed.control_plane_running and observed.engine_port > 0))
    steps = lifecycle.plan(waiting, wanted=spec is not None, serving=observed.ready,
                           restart=spec is not None and
                           observed.settings != settings(spec, observed.engine_port))
    return [] if steps is None else steps


def condition(cluster: FakeCluster, observed: Observed) -> AddonState | None:
    """PrometheusReady, or None when the custom-metrics path is off."""
    spec = cluster.spec.custom_metrics
    if spec is None:
        return None
    said = lifecycle.condition(observed, serving=observed.ready, title=TITLE,
                               crashed="Prometheus", cold_build="about 16 minutes")
    if said is not None and said.reason in ("BuildFailed", "Building", "Waiting"):
        return said
    if not observed.engine_port:
        return AddonState(False, "Waiting", "waiting for the cluster's engine: Prometheus "
                                            "scrapes the pods through its plain port")
    if said is not None:
        return said
    which = "prometheus.io/scrape: \"true\"" + (
        f" or an annotation of {', '.join(spec.metrics)}" if spec.metrics else "")
    return AddonState(True, "Running", f"{TITLE} at http://127.0.0.1:{observed.port} (its "
                                       f"HTTP API; no web UI), scraping every "
                                       f"{spec.scrapeInterval} the pods annotated {which}")
