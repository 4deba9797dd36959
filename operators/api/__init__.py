"""fakefleet's custom resources as pydantic models: the single source of the CRDs.

The lowest layer of ``operators``: imports nothing of it, only the shared floor
(:mod:`primitives`).
"""

from operators.api.base import API_VERSION, VERSION, Condition, CustomResource
from operators.api.clusters import FakeCluster, FakeClusterSpec, FakeClusterStatus
from operators.api.faultplans import FaultPlan, FaultPlanSpec, FaultPlanStatus
from operators.api.nodepools import FakeNodePool, FakeNodePoolSpec, FakeNodePoolStatus
from operators.api.replays import Replay, ReplaySpec, ReplayStatus

RESOURCES: tuple[type[CustomResource], ...] = (FakeCluster, FakeNodePool, FaultPlan, Replay)

__all__ = [
    "API_VERSION", "RESOURCES", "VERSION", "Condition", "CustomResource",
    "FakeCluster", "FakeClusterSpec", "FakeClusterStatus", "FakeNodePool",
    "FakeNodePoolSpec", "FakeNodePoolStatus", "FaultPlan", "FaultPlanSpec", "FaultPlanStatus",
    "Replay", "ReplaySpec", "ReplayStatus",
]
