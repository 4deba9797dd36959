"""fakefleet's custom resources as pydantic models: the single source of the CRDs.

The lowest layer: imports nothing else of fakefleet.
"""

from operators.api.base import API_VERSION, GROUP, VERSION, Condition, CustomResource
from operators.api.clusters import FakeCluster, FakeClusterSpec, FakeClusterStatus
from operators.api.faultplans import FaultPlan, FaultPlanSpec, FaultPlanStatus
from operators.api.nodepools import FakeNodePool, FakeNodePoolSpec, FakeNodePoolStatus

RESOURCES: tuple[type[CustomResource], ...] = (FakeCluster, FakeNodePool, FaultPlan)

__all__ = [
    "API_VERSION", "GROUP", "RESOURCES", "VERSION", "Condition", "CustomResource",
    "FakeCluster", "FakeClusterSpec", "FakeClusterStatus", "FakeNodePool",
    "FakeNodePoolSpec", "FakeNodePoolStatus", "FaultPlan", "FaultPlanSpec", "FaultPlanStatus",
]
