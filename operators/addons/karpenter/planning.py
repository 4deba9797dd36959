"""What to do about a member's Karpenter, and what its KarpenterReady condition says: pure.

:func:`plan` compares ``spec.addons.karpenter`` with what the operator observes (the life every
add-on lives, :mod:`operators.addons.lifecycle`: built, started once its CRDs are in the member,
restarted when its zones or feature gates change; it has nothing to hook, no webhook and no
APIService), then whether the member's NodePools and KWOKNodeClasses are those of the cluster's
provisioner pools (:func:`pool_objects`): the NodePools fakefleet made for pools that are gone
or going are deleted, and Karpenter deletes their nodes. :func:`condition` tells the truth in
one line. The add-on runner (:mod:`operators.addons.karpenter.running`) observes, calls these
and applies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from operators.addons import lifecycle
from operators.addons.karpenter import KARPENTER_VERSION, rendering
from operators.api.clusters import FakeCluster, KarpenterSpec
from operators.api.nodepools import FakeNodePoolSpec
from operators.reconciling.clusters import AddonCondition, AddonState

#: Not part of Ready: only the pods of provisioner pools wait for it.
CONDITION = AddonCondition("KarpenterReady", "Karpenter")


@dataclasses.dataclass(frozen=True)
class NodePoolState:
    """A NodePool fakefleet made in the member, as Karpenter's status shows it."""

    name: str
    ready: bool = False
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Observed(lifecycle.Observed):
    """What the operator sees of one member's Karpenter."""

    ready: bool = False
    """``/readyz`` on its health port answers 200: its caches synced, its CRDs mapped."""
    ports: rendering.KarpenterPorts | None = None
    settings: str = ""
    """What the running process was started with (:func:`settings`; "" when none runs)."""
    pools: Mapping[str, FakeNodePoolSpec] = dataclasses.field(default_factory=dict)
    """The cluster's FakeNodePools with provisioner karpenter, by name (none being deleted)."""
    nodepools: tuple[NodePoolState, ...] = ()
    """The NodePools fakefleet made in the member (labelled as its own)."""
    applied: str = ""
    """Fingerprint of the objects last applied ("" none yet since it started)."""


@dataclasses.dataclass(frozen=True)
class ApplyNodePools:
    """Apply a NodePool and a KWOKNodeClass per provisioner pool; delete fakefleet's others."""

    objects: tuple[dict[str, Any], ...]
    keep: frozenset[str]
    """Names of the pools whose objects stay."""
    fingerprint: str


Action = lifecycle.Step | ApplyNodePools


def settings(spec: KarpenterSpec) -> str:
    """What the process is started with that a change of the spec restarts it for: the
    instance types' zones and the feature gates (the NodePools change without a restart)."""
    return json.dumps({"zones": spec.zones, "nodeRepair": spec.nodeRepair}, sort_keys=True)


def plan(cluster: FakeCluster, observed: Observed) -> Sequence[Action]:
    """Actions that bring the member's Karpenter to ``spec.addons.karpenter``."""
    spec = cluster.spec.karpenter
    steps = lifecycle.plan(observed, wanted=spec is not None, serving=observed.ready,
                           restart=spec is not None and observed.settings != settings(spec))
    if steps is not None:
        return steps
    assert spec is not None, "the lifecycle is done only when Karpenter is asked for"
    objects = pool_objects(observed.pools, spec)
    fingerprint = _fingerprint(objects)
    present = {nodepool.name for nodepool in observed.nodepools}
    if fingerprint != observed.applied or present != set(observed.pools):
        return [ApplyNodePools(tuple(objects), frozenset(observed.pools), fingerprint)]
    return []


def pool_objects(pools: Mapping[str, FakeNodePoolSpec],
                 spec: KarpenterSpec) -> list[dict[str, Any]]:
    """The KWOKNodeClass and the NodePool of each provisioner pool, in a stable order."""
    objects: list[dict[str, Any]] = []
    for name in sorted(pools):
        objects += [rendering.nodeclass(name), rendering.nodepool(name, pools[name], spec)]
    return objects


def condition(cluster: FakeCluster, observed: Observed) -> AddonState | None:
    """KarpenterReady, or None when Karpenter is off."""
    spec = cluster.spec.karpenter
    if spec is None:
        return None
    title = f"Karpenter {KARPENTER_VERSION} (KWOK provider)"
    said = lifecycle.condition(observed, serving=observed.ready, title=title,
                               crashed="Karpenter", cold_build="about 17 minutes")
    if said is not None:
        return said
    ports = observed.ports
    where = (f"health http://127.0.0.1:{ports.health}/readyz, metrics on port {ports.metrics}"
             f" (both on every interface)") if ports is not None else ""
    if not observed.pools:
        return AddonState(True, "Running", f"{title} running ({where}); no FakeNodePool of this "
                                           f"cluster has provisioner: karpenter, so it makes "
                                           f"no nodes")
    states = {nodepool.name: nodepool for nodepool in observed.nodepools}
    waiting = [name for name in sorted(observed.pools)
               if name not in states or not states[name].ready]
    if waiting:
        name = waiting[0]
        why = states[name].message if name in states else "not applied yet"
        return AddonState(False, "NodePoolNotReady",
                          f"{title} running, but its NodePool {name} is not Ready: "
                          f"{why or 'Karpenter has not judged it yet'}")
    return AddonState(True, "Running", f"{title} running ({where}); NodePools: "
                                       + ", ".join(sorted(observed.pools)))


def _fingerprint(objects: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()[:16]
