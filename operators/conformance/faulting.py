"""Checks repeated under a FaultPlan: which requirements still hold when the hardware fails.
The upstream program does not test this; fakefleet reports it in junit.xml and the evidence,
never in PRODUCT.yaml.

:data:`FAULTS` says, per requirement, what fault is injected while its check runs again;
:func:`plan` writes the FaultPlan (pure). The plan targets only the checked cluster, starts at
once, lasts until it is deleted after the check, and has a fixed seed, so a rerun chooses the
same victims: the check sees only the fault it injects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from primitives import keys

#: Longer than any check's deadline: the plan is deleted (and its fault recovered) after the
#: check, not by its own end.
DURATION = "30m"
SEED = 29


@dataclasses.dataclass(frozen=True)
class Fault:
    """A fault injected under one requirement's check."""

    name: str
    """Short, for ids and names: gpu-xid-79."""
    description: str
    fault: Mapping[str, Any]
    """The FaultPlan step's fault."""
    pools: Callable[[Sequence[Mapping[str, Any]]], list[str]]
    """The cluster's pools whose nodes may be hit."""
    visible: Callable[[Mapping[str, Any]], bool]
    """Whether a member's node shows the fault."""


def _static_gpu_pools(pools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pools
            if p["spec"].get("gpu") and not p["spec"].get("provisioner")]


def _static_pools(pools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pools if not p["spec"].get("provisioner")]


def _tainted(node: Mapping[str, Any]) -> bool:
    return any(t.get("key") == keys.GPU_XID for t in node.get("spec", {}).get("taints") or [])


def _not_ready(node: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") != "True"
               for c in (node.get("status") or {}).get("conditions") or [])


FAULTS: dict[str, Fault] = {
    "gang_scheduling": Fault(
        "gpu-xid-79", "Xid 79 (GPU fallen off the bus) on one GPU node while the gangs run",
        {"type": "GPUXid", "xid": 79}, _static_gpu_pools, _tainted),
    "robust_controller": Fault(
        "node-lost", "one node NotReady under the RayCluster",
        {"type": "NotReady", "reason": "KubeletNotReady"}, _static_pools, _not_ready),
}


def plan(cluster: Mapping[str, Any], pools: Sequence[Mapping[str, Any]], id: str,
         run: str) -> dict[str, Any] | None:
    """The FaultPlan for requirement ``id``'s rerun, or None when the cluster has no pool the
    fault could hit."""
    fault = FAULTS[id]
    targets = fault.pools(pools)
    if not targets:
        return None
    meta = cluster["metadata"]
    return {
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": f"ffc-{run}-{id.replace('_', '-')}", "namespace": meta["namespace"],
                     "labels": {"fakefleet.dev/conformance": run}},
        "spec": {"seed": SEED, "steps": [{
            "name": fault.name, "at": "0s", "duration": DURATION,
            "target": {"clusters": {"names": [meta["name"]]}, "nodes": {"pools": targets},
                       "mode": "one"},
            "fault": dict(fault.fault)}]},
    }
