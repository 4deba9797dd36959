"""Status as kstatus reads it (Ready, Reconciling, Stalled, observedGeneration), and the
status of a FakeNodePool. Pure: the writers (the engine, the operator) decide when to write.

A FakeNodePool's status has two writers that never overlap: its cluster's engine while that
runs (it counts the nodes it observes), and the operator while no engine runs (it says why).
Both build it here, so they describe the same pool the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Literal

from operators.api.base import Condition
from operators.api.nodepools import (
    HEARTBEATS_AT_RISK,
    FakeNodePool,
    FakeNodePoolStatus,
    pool_selector,
)


def condition(kind: str, holds: bool, *, reason: str, message: str, generation: int, now: str,
              previous: Iterable[Condition]) -> Condition:
    """A condition that keeps its lastTransitionTime while its status holds."""
    status: Literal["True", "False"] = "True" if holds else "False"
    transition = now
    for old in previous:
        if old.type == kind and old.status == status and old.lastTransitionTime:
            transition = old.lastTransitionTime
    return Condition(type=kind, status=status, reason=reason, message=message,
                     lastTransitionTime=transition, observedGeneration=generation)


def pool_status(pool: FakeNodePool, *, replicas: int, ready: int, generation: int, now: str,
                waiting: str = "", problem: str = "",
                heartbeats: tuple[bool, str] | None = None) -> FakeNodePoolStatus:
    """The status of a pool with ``replicas`` nodes of which ``ready`` are Ready, as its engine
    last acted on ``generation``. ``waiting``: no engine serves the pool, and why;
    ``problem``: what stops the engine from reaching the desired state (Stalled);
    ``heartbeats``: its engine's :data:`~operators.api.nodepools.HEARTBEATS_AT_RISK` (status,
    message), None when it was never at risk (no such condition)."""
    # A provisioner's pool has the nodes it made: all of them Ready is the goal.
    desired = replicas if pool.spec.provisioner else pool.spec.replicas
    made = f", made by {pool.spec.provisioner.capitalize()}" if pool.spec.provisioner else ""
    current = generation == int(pool.metadata.get("generation", 0))
    settled = not waiting and not problem and current and replicas == ready == desired
    if waiting:
        reason, message = "ClusterNotReady", waiting
    elif problem:
        reason, message = "Stalled", problem
    elif settled:
        reason, message = "NodesReady", f"{ready}/{desired} nodes Ready{made}"
    else:
        reason, message = "Scaling", f"{ready}/{desired} nodes Ready ({replicas} exist{made})"
    described = functools.partial(
        condition, reason=reason, message=message, generation=generation, now=now,
        previous=pool.status.conditions if pool.status else [])
    return FakeNodePoolStatus(
        replicas=replicas, readyReplicas=ready,
        selector=pool_selector(pool.metadata["name"]),
        observedGeneration=generation,
        conditions=[described("Ready", settled), described("Reconciling", not settled
                                                           and not problem),
                    described("Stalled", bool(problem)),
                    *_heartbeats(heartbeats, generation=generation, now=now,
                                 previous=pool.status.conditions if pool.status else [])],
    )


def _heartbeats(heartbeats: tuple[bool, str] | None, *, generation: int, now: str,
                previous: Iterable[Condition]) -> list[Condition]:
    if heartbeats is None:
        return []
    at_risk, message = heartbeats
    return [condition(HEARTBEATS_AT_RISK, at_risk,
                      reason="RenewalsLate" if at_risk else "RenewalsOnTime", message=message,
                      generation=generation, now=now, previous=previous)]
