"""What a member's Karpenter is made of, rendered as pure data: no processes, no API calls.

Upstream runs Karpenter as a Deployment; here it is a process on the member's host. Its
settings are environment variables, as the chart sets them: ``KUBECONFIG`` (the only way:
Karpenter parses its own flags, and ``--kubeconfig`` is not among them), the member's admin
kubeconfig; leader election off (one replica, and out of a cluster it has no namespace to
hold its Lease in); its metrics and health ports, its own per member since it binds them on
every interface (``:<port>``, which no setting narrows); the instance types file; the feature
gates (Karpenter merges them into its defaults).

The instance types are fakefleet's catalogue (:mod:`operators.api.instancetypes`), in the
format of the provider's ``InstanceTypeOptions``: each offering names its zone and capacity
type in ``Requirements`` (the format of ``kwok/examples/aws_instance_types.json``; the older
``zone``/``capacityType`` keys of ``instance_types.json`` are ignored by this version). Every
type is offered on demand in every zone of ``spec.addons.karpenter.zones``.

Each FakeNodePool with ``provisioner: karpenter`` becomes a NodePool and a KWOKNodeClass of its
name. Instance types set no labels, so what makes a node of the pool look like one of the
engine's (GPU Feature Discovery's labels, the GPU taint, the pool's own labels and taints, and
the pool label by which the engine takes the node over) is in the NodePool's template, which
Karpenter copies onto every node it makes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from operators.api.clusters import KarpenterSpec
from operators.api.gpus import gfd_labels
from operators.api.instancetypes import CATALOGUE, cpu_types, gpu_type_name
from operators.api.nodepools import FakeNodePoolSpec
from primitives import keys

FIELD_MANAGER = "fakefleet-karpenter"
MANAGED_BY = {"app.kubernetes.io/managed-by": "fakefleet"}
NODEPOOL_API = "karpenter.sh/v1"
NODECLASS_GROUP = "karpenter.kwok.sh"
NODECLASS_API = f"{NODECLASS_GROUP}/v1alpha1"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
ZONE = "topology.kubernetes.io/zone"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class KarpenterPorts:
    """One member's Karpenter ports (on every interface); kept in its state."""

    metrics: int
    health: int


def environment(*, kubeconfig: Path, ports: KarpenterPorts, instance_types: Path,
                node_repair: bool) -> dict[str, str]:
    """Karpenter's settings, as the environment of its process."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(ports.metrics),
        "HEALTH_PROBE_PORT": str(ports.health),
        "INSTANCE_TYPES_FILE_PATH": str(instance_types),
        "FEATURE_GATES": f"NodeRepair={'true' if node_repair else 'false'}",
        # Set, so that the operator's own environment cannot hand it an invalid level (a
        # value Karpenter does not know stops it at start).
        "LOG_LEVEL": "info",
    }


def instance_types(zones: list[str]) -> list[Object]:
    """The instance types file: every type of the catalogue, on demand in every zone."""
    return [{
        "name": instance_type.name,
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": dict(instance_type.resources),
        "offerings": [{
            "Price": instance_type.price,
            "Available": True,
            "Requirements": [
                {"key": CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]},
                {"key": ZONE, "operator": "In", "values": [zone]},
            ],
        } for zone in zones],
    } for instance_type in CATALOGUE]


def pool_types(spec: FakeNodePoolSpec) -> list[str]:
    """The instance types a pool's nodes may have: its preset with its GPU count, or, without
    GPUs, every CPU-only type (Karpenter picks the cheapest that fits)."""
    if spec.gpu is not None:
        return [gpu_type_name(spec.gpu.preset, spec.gpus_per_node)]
    return [instance_type.name for instance_type in cpu_types()]


def nodepool(name: str, spec: FakeNodePoolSpec, settings: KarpenterSpec) -> Object:
    """The NodePool of the provisioner pool ``name``."""
    labels: dict[str, str] = {}
    taints = [taint.model_dump(mode="json") for taint in spec.template.taints]
    if spec.gpu is not None:
        labels.update(gfd_labels(spec.gpu.preset, spec.gpus_per_node,
                                 driver_version=spec.gpu.driverVersion))
        if spec.gpu.taint and not any(taint["key"] == GPU_TAINT["key"] for taint in taints):
            taints.append(dict(GPU_TAINT))
    if spec.topology.region:
        labels["topology.kubernetes.io/region"] = spec.topology.region
    labels.update(spec.template.labels)
    labels[keys.POOL] = name  # what the engine takes its nodes over by
    requirements: list[Object] = [
        {"key": INSTANCE_TYPE, "operator": "In", "values": pool_types(spec)},
        {"key": CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]},
    ]
    if spec.topology.zones:
        requirements.append({"key": ZONE, "operator": "In", "values": list(spec.topology.zones)})
    metadata: Object = {"labels": labels}
    if spec.template.annotations:
        metadata["annotations"] = dict(spec.template.annotations)
    return {
        "apiVersion": NODEPOOL_API, "kind": "NodePool",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {
            "template": {
                "metadata": metadata,
                "spec": {
                    "nodeClassRef": {"group": NODECLASS_GROUP, "kind": "KWOKNodeClass",
                                     "name": name},
                    "requirements": requirements,
                    "taints": taints,
                    # Nodes are replaced for their age only if a user asks for it.
                    "expireAfter": "Never",
                },
            },
            "disruption": {
                "consolidationPolicy": settings.consolidationPolicy,
                "consolidateAfter": settings.consolidateAfter,
                "budgets": [{"nodes": settings.disruptionBudget}],
            },
        },
    }


def nodeclass(name: str) -> Object:
    """The KWOKNodeClass of the provisioner pool ``name``: its nodes register at once."""
    return {"apiVersion": NODECLASS_API, "kind": "KWOKNodeClass",
            "metadata": {"name": name, "labels": dict(MANAGED_BY)}, "spec": {}}
