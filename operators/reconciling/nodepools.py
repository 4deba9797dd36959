"""What a FakeNodePool's status says, from the counts its engine reports: pure."""

from __future__ import annotations

from typing import Literal

from operators.api.base import Condition
from operators.api.nodepools import FakeNodePool, FakeNodePoolStatus, pool_selector


def pool_status(pool: FakeNodePool, replicas: int, ready: int, *, cluster_running: bool,
                now: str) -> FakeNodePoolStatus:
    """Pure: the status of a pool whose engine reports ``replicas`` nodes, ``ready`` Ready."""
    generation = int(pool.metadata.get("generation", 0))
    desired = pool.spec.replicas
    settled = cluster_running and replicas == ready == desired
    if not cluster_running:
        reason = "ClusterNotReady"
        message = f"waiting for FakeCluster {pool.spec.clusterRef} to run"
    elif settled:
        reason, message = "NodesReady", f"{ready}/{desired} nodes Ready"
    else:
        reason, message = "Scaling", f"{ready}/{desired} nodes Ready ({replicas} exist)"
    previous = {c.type: c for c in (pool.status.conditions if pool.status else [])}

    def condition(kind: str, holds: bool) -> Condition:
        old = previous.get(kind)
        status: Literal["True", "False"] = "True" if holds else "False"
        transition = old.lastTransitionTime if old and old.status == status else now
        return Condition(type=kind, status=status, reason=reason, message=message,
                         lastTransitionTime=transition, observedGeneration=generation)

    return FakeNodePoolStatus(
        replicas=replicas, readyReplicas=ready,
        selector=pool_selector(pool.metadata["name"]),
        observedGeneration=generation,
        conditions=[condition("Ready", settled), condition("Reconciling", not settled),
                    condition("Stalled", False)],
    )
