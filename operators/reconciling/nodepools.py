"""What a FakeNodePool's status says, from the counts its engine reports: pure."""

from __future__ import annotations

import functools

from operators.api.nodepools import FakeNodePool, FakeNodePoolStatus, pool_selector
from operators.reconciling.conditions import condition


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
    described = functools.partial(
        condition, reason=reason, message=message, generation=generation, now=now,
        previous=pool.status.conditions if pool.status else [])
    return FakeNodePoolStatus(
        replicas=replicas, readyReplicas=ready,
        selector=pool_selector(pool.metadata["name"]),
        observedGeneration=generation,
        conditions=[described("Ready", settled), described("Reconciling", not settled),
                    described("Stalled", False)],
    )
