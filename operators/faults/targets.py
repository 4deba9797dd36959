"""Which objects a fault step hits: the fleet as observed, the step's target, and its mode.

Pure: the fleet is a snapshot (:class:`Fleet`) that the caller read from the API, and every
random choice comes from a :class:`random.Random` the caller derives from the plan's seed. Given
the same snapshot (in any order) and the same random source, the same victims come out.

Selection runs per cluster (``percent: 2`` means 2 % of the nodes of *each* cluster the step
targets), then ``maxTargets`` caps the whole step: the blast radius of one injection.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Literal

from primitives.selectors import EVERYTHING, LabelSelector


class TargetError(ValueError):
    """A target that cannot be planned; the message names the field and the fix."""


# -- the fleet as observed ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NodeView:
    name: str
    pool: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The pod's controller (its ownerReference with controller: true), if any.
    owner_kind: str = ""
    owner_name: str = ""
    containers: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """A FakeCluster: its ``spec.labels`` and what its member API shows."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    nodes: tuple[NodeView, ...] = ()
    pods: tuple[PodView, ...] = ()


@dataclasses.dataclass(frozen=True)
class Fleet:
    clusters: tuple[ClusterView, ...] = ()

    def within(self, names: Collection[str]) -> Fleet:
        """The fleet narrowed to the clusters ``names`` gives (a plan's spec.clusters); all of
        it when ``names`` is empty."""
        if not names:
            return self
        return Fleet(tuple(cluster for cluster in self.clusters if cluster.name in names))


# -- what a step targets -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Clusters:
    """FakeClusters by name, or by a selector over their ``spec.labels``; neither: all."""

    names: tuple[str, ...] = ()
    selector: LabelSelector | None = None

    def __post_init__(self) -> None:
        if self.names and self.selector is not None:
            raise TargetError("target.clusters: give names or selector, not both")

    def holds(self, cluster: ClusterView) -> bool:
        if self.names:
            return cluster.name in self.names
        return (self.selector or EVERYTHING).matches(cluster.labels)


@dataclasses.dataclass(frozen=True)
class Nodes:
    """Nodes of the chosen clusters: every condition given must hold."""

    pools: tuple[str, ...] = ()
    selector: LabelSelector | None = None
    names: tuple[str, ...] = ()

    def holds(self, node: NodeView) -> bool:
        return ((not self.pools or node.pool in self.pools)
                and (not self.names or node.name in self.names)
                and (self.selector or EVERYTHING).matches(node.labels))


@dataclasses.dataclass(frozen=True)
class Pods:
    """Pods of the chosen clusters: every condition given must hold. With ``container`` only
    pods that have it, and the fault acts on that container."""

    namespace: str = ""
    selector: LabelSelector | None = None
    owner_kind: str = ""
    owner_name: str = ""
    container: str = ""

    def holds(self, pod: PodView) -> bool:
        return ((not self.namespace or pod.namespace == self.namespace)
                and (not self.owner_kind or pod.owner_kind == self.owner_kind)
                and (not self.owner_name or pod.owner_name == self.owner_name)
                and (not self.container or self.container in pod.containers)
                and (self.selector or EVERYTHING).matches(pod.labels))


class Mode(enum.Enum):
    ONE = "one"
    ALL = "all"
    FIXED = "fixed"  # with count
    PERCENT = "percent"  # with percent, rounded up: 2 % of 10 nodes is one node


@dataclasses.dataclass(frozen=True)
class Target:
    """Which clusters, then within each nodes, pods or (neither) the cluster itself; how many."""

    clusters: Clusters = Clusters()
    nodes: Nodes | None = None
    pods: Pods | None = None
    mode: Mode = Mode.ALL
    count: int | None = None
    percent: int | None = None
    max_targets: int | None = None

    def __post_init__(self) -> None:
        if self.nodes is not None and self.pods is not None:
            raise TargetError("target: give nodes or pods, not both (two steps hit both)")
        if self.mode is Mode.FIXED and (self.count is None or self.count < 1):
            raise TargetError("target.count: mode fixed needs a count of at least 1")
        if self.mode is Mode.PERCENT and (self.percent is None
                                          or not 1 <= self.percent <= 100):
            raise TargetError("target.percent: mode percent needs a percent from 1 to 100")
        if self.max_targets is not None and self.max_targets < 1:
            raise TargetError("target.maxTargets: at least 1 (or leave it out: no cap)")

    @property
    def kind(self) -> Literal["Node", "Pod", "Cluster"]:
        return "Node" if self.nodes is not None else "Pod" if self.pods is not None else "Cluster"


@dataclasses.dataclass(frozen=True, order=True)
class Victim:
    """One object a fault acts on."""

    cluster: str
    kind: Literal["Cluster", "Node", "Pod"]
    name: str
    namespace: str = ""
    container: str = ""

    def __str__(self) -> str:
        place = f"{self.namespace}/{self.name}" if self.namespace else self.name
        suffix = f" ({self.container})" if self.container else ""
        return f"{self.cluster}: {self.kind} {place}{suffix}"


# -- selection ---------------------------------------------------------------------------------

def candidates(target: Target, cluster: ClusterView) -> list[Victim]:
    """Every object of ``cluster`` the target could hit, sorted (snapshot order is irrelevant)."""
    if target.nodes is not None:
        found = [Victim(cluster.name, "Node", node.name)
                 for node in cluster.nodes if target.nodes.holds(node)]
    elif target.pods is not None:
        container = target.pods.container
        found = [Victim(cluster.name, "Pod", pod.name, pod.namespace, container)
                 for pod in cluster.pods if target.pods.holds(pod)]
    else:
        found = [Victim(cluster.name, "Cluster", cluster.name)]
    return sorted(set(found))


def how_many(target: Target, available: int) -> int:
    """How many of ``available`` candidates the mode takes (before the maxTargets cap)."""
    if available == 0:
        return 0
    if target.mode is Mode.ONE:
        return 1
    if target.mode is Mode.FIXED:
        assert target.count is not None
        return min(target.count, available)
    if target.mode is Mode.PERCENT:
        assert target.percent is not None
        return min(available, math.ceil(available * target.percent / 100))
    return available


def choose(target: Target, fleet: Fleet,
           rng: Callable[[str], random.Random]) -> tuple[Victim, ...]:
    """The victims of one injection. ``rng(part)`` gives the random source for a part of the
    choice (a cluster's name, or the cap), so adding a cluster does not change another's
    picks."""
    picked: list[Victim] = []
    for cluster in sorted(fleet.clusters, key=lambda c: c.name):
        if not target.clusters.holds(cluster):
            continue
        found = candidates(target, cluster)
        picked.extend(rng(cluster.name).sample(found, how_many(target, len(found))))
    if target.max_targets is not None and len(picked) > target.max_targets:
        # Not a cluster name: those are lower case, so the cap has a random source of its own.
        picked = rng("MaxTargets").sample(sorted(picked), target.max_targets)
    return tuple(sorted(picked))


def unknown_names(target: Target, fleet: Iterable[ClusterView],
                  within: Collection[str] = ()) -> list[str]:
    """Cluster names the target gives that the fleet does not have (for a status message).
    With ``within`` (a plan's spec.clusters), only names in it count, and when the target gives
    none those of ``within`` do: the plan runs for them, so one missing is worth saying, and
    one outside is none of the plan's business."""
    present = {cluster.name for cluster in fleet}
    names = target.clusters.names or tuple(within)
    return [name for name in names
            if name not in present and (not within or name in within)]
