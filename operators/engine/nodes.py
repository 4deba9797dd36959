"""Fake nodes as data: names, addresses, the Node object of a pool member, and the plan that
turns desired pools and observed nodes into creations, updates and deletions.

Pure: no I/O, no clock of its own (``now`` is passed in). Names are ``<pool>-<index>``, so
scale-down is deterministic: the highest indices go first, as with a StatefulSet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping
from typing import Any

from operators.api.gpus import PRESETS, gfd_labels
from operators.api.nodepools import POOL_LABEL, FakeNodePoolSpec

RACK_LABEL = "fakefleet.dev/rack"
TEMPLATE_HASH = "fakefleet.dev/template-hash"
MANAGED_SELECTOR = POOL_LABEL  # every node we own carries the pool label

#: Pod CIDRs are /24 slices of 10.128.0.0/9 (32768 nodes per cluster); node InternalIPs come
#: from 172.16.0.0/12. Neither overlaps the service range 10.96.0.0/12.
POD_NETWORK = ipaddress.ip_network("10.128.0.0/9")
NODE_NETWORK = ipaddress.ip_network("172.16.0.0/12")
MAX_NODES_PER_CLUSTER = 2 ** (24 - POD_NETWORK.prefixlen)
KUBELET_PORT = 10250


def node_name(pool: str, index: int) -> str:
    return f"{pool}-{index}"


def node_index(pool: str, name: str) -> int | None:
    """The index of ``name`` in ``pool``, or None if the name is not of that pool's form."""
    prefix = f"{pool}-"
    suffix = name[len(prefix):] if name.startswith(prefix) else ""
    return int(suffix) if suffix.isdigit() else None


def pod_cidr(slot: int) -> str:
    base = int(POD_NETWORK.network_address) + (slot << 8)
    return f"{ipaddress.ip_address(base)}/24"


def node_ip(slot: int) -> str:
    return str(ipaddress.ip_address(int(NODE_NETWORK.network_address) + slot + 1))


def template_hash(spec: FakeNodePoolSpec) -> str:
    """Changes whenever what a node looks like changes (not on a replica count change)."""
    shape = spec.model_dump(mode="json", exclude={"replicas", "clusterRef", "pods"})
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def gpu_count(spec: FakeNodePoolSpec) -> int:
    if spec.gpu is None:
        return 0
    return spec.gpu.count or PRESETS[spec.gpu.preset].gpus_per_node


def node_shape(cluster: str, pool: str, spec: FakeNodePoolSpec, index: int) -> dict[str, Any]:
    """Labels, annotations, taints and capacity of node ``index`` of ``pool``."""
    name = node_name(pool, index)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"fakefleet.{pool}",
        "type": "fakefleet",
    }
    topology = spec.topology
    zone_count = max(len(topology.zones), 1)
    if topology.region:
        labels["topology.kubernetes.io/region"] = topology.region
    if topology.zones:
        labels["topology.kubernetes.io/zone"] = topology.zones[index % zone_count]
    rack = (index // zone_count) % topology.racks if topology.racks else None
    if rack is not None:
        labels[RACK_LABEL] = f"rack-{rack}"
    capacity: dict[str, str] = {key: str(value) for key, value in spec.template.capacity.items()}
    taints = [taint.model_dump(mode="json", exclude_defaults=False)
              for taint in spec.template.taints]
    if spec.gpu is not None:
        count = gpu_count(spec)
        clique = f"{cluster}.{rack if rack is not None else 0}"
        labels.update(gfd_labels(spec.gpu.preset, count,
                                 driver_version=spec.gpu.driverVersion, clique=clique))
        capacity["nvidia.com/gpu"] = str(count)
        if spec.gpu.taint and not any(t["key"] == "nvidia.com/gpu" for t in taints):
            taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    labels.update(spec.template.labels)
    labels[POOL_LABEL] = pool
    # No node.alpha.kubernetes.io/ttl: the controller-manager's TTL controller owns it.
    annotations = {**spec.template.annotations, TEMPLATE_HASH: template_hash(spec)}
    return {"labels": labels, "annotations": annotations, "taints": taints,
            "capacity": capacity}


def node_conditions(now: str) -> list[dict[str, str]]:
    """The conditions of a healthy kubelet's node, all heartbeating at ``now``."""
    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    return [
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                  "kubelet has sufficient memory available"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                  "kubelet has no disk pressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID",
                  "kubelet has sufficient PID available"),
        condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]


def render_node(
    cluster: str, pool: str, spec: FakeNodePoolSpec, index: int, slot: int, *,
    now: str, kubelet_version: str,
) -> dict[str, Any]:
    """The whole Node object, status included (nodes accept status on create)."""
    name = node_name(pool, index)
    shape = node_shape(cluster, pool, spec, index)
    cidr = pod_cidr(slot)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": shape["labels"],
                     "annotations": shape["annotations"]},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": shape["taints"],
                 "providerID": f"fakefleet://{cluster}/{name}"},
        "status": {
            "capacity": shape["capacity"],
            "allocatable": shape["capacity"],
            "conditions": node_conditions(now),
            "addresses": [{"type": "InternalIP", "address": node_ip(slot)},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "nodeInfo": {
                "machineID": hashlib.md5(f"{cluster}/{name}".encode()).hexdigest(),
                "systemUUID": hashlib.md5(f"uuid/{cluster}/{name}".encode()).hexdigest(),
                "bootID": hashlib.md5(f"boot/{cluster}/{name}".encode()).hexdigest(),
                "kernelVersion": "6.8.0-fakefleet",
                "osImage": "fakefleet",
                "containerRuntimeVersion": "fakefleet://1.0.0",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "phase": "Running",
        },
    }


def reshape_patches(
    cluster: str, pool: str, spec: FakeNodePoolSpec, index: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Merge patches (object, status) that bring an existing node to the current template."""
    shape = node_shape(cluster, pool, spec, index)
    meta = {"metadata": {"labels": shape["labels"], "annotations": shape["annotations"]},
            "spec": {"taints": shape["taints"]}}
    status = {"status": {"capacity": shape["capacity"], "allocatable": shape["capacity"]}}
    return meta, status


@dataclasses.dataclass(frozen=True)
class ObservedNode:
    name: str
    pool: str
    template_hash: str
    slot: int | None
    uid: str = ""


@dataclasses.dataclass(frozen=True)
class Create:
    pool: str
    index: int


@dataclasses.dataclass(frozen=True)
class Reshape:
    pool: str
    index: int


@dataclasses.dataclass(frozen=True)
class Delete:
    name: str


Action = Create | Reshape | Delete


def plan(desired: Mapping[str, FakeNodePoolSpec], observed: Iterable[ObservedNode]) -> list[
        Action]:
    """What to do so the nodes match the pools: deletions first (they free pod CIDRs), then
    reshapes, then creations, each in a stable order."""
    deletions: list[Action] = []
    reshapes: list[Action] = []
    present: dict[str, set[int]] = {pool: set() for pool in desired}
    hashes = {pool: template_hash(spec) for pool, spec in desired.items()}
    for node in sorted(observed, key=lambda n: n.name):
        spec = desired.get(node.pool)
        index = node_index(node.pool, node.name)
        if spec is None or index is None or index >= spec.replicas:
            deletions.append(Delete(node.name))
            continue
        present[node.pool].add(index)
        if node.template_hash != hashes[node.pool]:
            reshapes.append(Reshape(node.pool, index))
    creations: list[Action] = [
        Create(pool, index)
        for pool, spec in sorted(desired.items())
        for index in range(spec.replicas)
        if index not in present[pool]
    ]
    return deletions + reshapes + creations


def observe(node: Mapping[str, Any]) -> ObservedNode | None:
    """The compact facts the planner needs of a Node object (None if not one of ours)."""
    metadata = node.get("metadata", {})
    pool = (metadata.get("labels") or {}).get(POOL_LABEL)
    if pool is None:
        return None
    cidr = (node.get("spec") or {}).get("podCIDR")
    slot = None
    if cidr:
        network = ipaddress.ip_network(cidr, strict=False)
        if network.subnet_of(POD_NETWORK):  # type: ignore[arg-type]
            slot = (int(network.network_address) - int(POD_NETWORK.network_address)) >> 8
    return ObservedNode(
        name=metadata["name"], pool=pool,
        template_hash=(metadata.get("annotations") or {}).get(TEMPLATE_HASH, ""), slot=slot,
        uid=metadata.get("uid", ""),
    )
