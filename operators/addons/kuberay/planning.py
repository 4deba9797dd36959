"""What to do about a member's KubeRay, and what its KubeRayReady condition says: pure.

:func:`plan` compares ``spec.addons.kuberay`` with what the operator observes (the life every
add-on lives, :mod:`operators.addons.lifecycle`: built, started once its CRDs and RBAC are in
the member, hooked once ``/readyz`` answers, which includes its webhook server accepting
connections) and returns actions; :func:`condition` tells the truth about it in one line. Its
hook is its validating webhook configuration, applied once it serves, never before: its failure
policy is Fail, so a webhook whose server does not answer refuses every RayCluster. The add-on
runner (:mod:`operators.addons.kuberay.running`) observes, calls these and applies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from operators.addons import lifecycle
from operators.addons.kuberay import KUBERAY_VERSION
from operators.addons.kuberay.rendering import KubeRayPorts
from operators.api.clusters import FakeCluster
from operators.reconciling.clusters import AddonCondition, AddonState

#: Not part of Ready: only RayClusters, RayJobs and RayServices wait for it.
CONDITION = AddonCondition("KubeRayReady", "KubeRay")
TITLE = f"KubeRay {KUBERAY_VERSION}"


@dataclasses.dataclass(frozen=True)
class Observed(lifecycle.Observed):
    """What the operator sees of one member's KubeRay (its hook: its webhook configuration)."""

    ready: bool = False
    """``/readyz`` answers 200: its manager runs and its webhook server accepts connections."""
    ports: KubeRayPorts | None = None


def plan(cluster: FakeCluster, observed: Observed) -> Sequence[lifecycle.Step]:
    """Actions that bring the member's KubeRay to ``spec.addons.kuberay``."""
    steps = lifecycle.plan(observed, wanted=cluster.spec.kuberay is not None,
                           serving=observed.ready)
    return [] if steps is None else steps


def condition(cluster: FakeCluster, observed: Observed) -> AddonState | None:
    """KubeRayReady, or None when the add-on is not asked for."""
    if cluster.spec.kuberay is None:
        return None
    said = lifecycle.condition(observed, serving=observed.ready, title=TITLE, crashed="KubeRay",
                               cold_build="4 to 13 minutes")
    if said is not None:
        return said
    where = f", webhook at https://127.0.0.1:{observed.ports.webhook}" if observed.ports else ""
    return AddonState(True, "Running", f"{TITLE} running{where}; it makes the pods of "
                                       f"RayClusters, which the engine runs")
