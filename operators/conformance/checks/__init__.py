"""One check per requirement, and what each is given to finish in.

:data:`CHECKS` maps a requirement's id to its check and deadline; :data:`EXTRA` are checks
that no requirement of the checklist asks for (reported in junit.xml and evidence only);
:data:`stated.STATED` is what fakefleet states without a check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from operators.conformance.checking import Context, Verdict
from operators.conformance.checks import (
    controllers,
    dra,
    gangs,
    metrics,
    nodescaling,
    podscaling,
    stated,
)


@dataclasses.dataclass(frozen=True)
class Check:
    run: Callable[[Context], Awaitable[Verdict]]
    deadline: float
    """Seconds it may take, cleanup apart."""


CHECKS: dict[str, Check] = {
    "gang_scheduling": Check(gangs.check, 180.0),
    # Karpenter's node in seconds; its removal after consolidateAfter and 30-40 s of its own.
    "cluster_autoscaling": Check(nodescaling.check, 300.0),
    "pod_autoscaling": Check(podscaling.check, 240.0),
    "accelerator_metrics": Check(metrics.accelerators, 60.0),
    "ai_service_metrics": Check(metrics.services, 120.0),
    "robust_controller": Check(controllers.check, 240.0),
    "ai_inference": Check(stated.ai_inference, 30.0),
}
EXTRA: dict[str, Check] = {dra.ID: Check(dra.check, 90.0)}
#: The MUSTs a run checks automatically; it exits 0 only when all of them are Implemented.
AUTOMATABLE_MUSTS = ("gang_scheduling", "cluster_autoscaling", "pod_autoscaling",
                     "accelerator_metrics", "ai_service_metrics", "robust_controller")
