"""Fake GPUs as DRA devices: the ResourceSlice of a node, the DeviceClass that selects them,
what the engine reads back from a slice, and the plan that keeps one slice per node. Pure: no
I/O.

A node of a pool with ``gpu.allocation`` dra or both publishes one ResourceSlice (API
``resource.k8s.io/v1``), named ``<node>-gpu.fakefleet.dev``, the only slice of a pool of its
own named after the node, as a kubelet plugin publishes it. It holds a device ``gpu-<i>`` per
GPU with the attributes productName, architecture, uuid (:func:`~operators.api.gpus.gpu_uuid`,
the same UUID as everywhere else), index, memory (MiB) and driverVersion (a semver version),
and the capacity memory. The Node owns it, so the garbage collector removes it with the node.
A digest of what the slice is made of sits in an annotation: the engine compares digests,
never objects the API server has defaulted, and writes a slice only when its digest changes.

Out of service: a failed GPU (a GPUXid fault) keeps its device, with the device taint
``gpu.fakefleet.dev/unhealthy=<reason>:NoExecute``. At Kubernetes 1.36 device taints in a
ResourceSlice are beta and on by default (feature gate DRADeviceTaints), so no flag is needed:
the scheduler allocates a tainted device to no claim that does not tolerate the taint, and the
controller-manager's device-taint eviction controller evicts the pods that use it. The taints
live in the slice only: a restarted engine reads back from it which GPUs are out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from operators.api.gpus import DEVICE_CLASS, DRA_DRIVER, PRESETS, gpu_uuid
from operators.api.nodepools import FakeNodePoolSpec
from primitives import keys

API_VERSION = "resource.k8s.io/v1"
SLICES = f"/apis/{API_VERSION}/resourceslices"
DEVICE_CLASSES = f"/apis/{API_VERSION}/deviceclasses"
#: The engine's slices, and nobody else's, in one list and watch.
OWN_SLICES = {"fieldSelector": f"spec.driver={DRA_DRIVER}"}
UNHEALTHY = f"{DRA_DRIVER}/unhealthy"
#: NoExecute, as the node taint of the same fault: pods using the GPU are evicted, and no new
#: claim gets it unless it tolerates the taint.
UNHEALTHY_EFFECT = "NoExecute"
DEVICE_PREFIX = "gpu-"
#: Bump when :func:`render_slice` writes anything new or different: the digests of the
#: slices change with it, so a new engine writes each slice once again (a test pins it).
FORMAT = 1

Taint = Mapping[str, Any]


def slice_name(node: str) -> str:
    """``<node>-gpu.fakefleet.dev``: a DNS subdomain, since node names are."""
    return f"{node}-{DRA_DRIVER}"


def device_name(index: int) -> str:
    return f"{DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    suffix = name[len(DEVICE_PREFIX):] if name.startswith(DEVICE_PREFIX) else ""
    return int(suffix) if suffix.isdigit() else None


def semver(version: str) -> str:
    """A driver version as the semantic version a DRA version attribute must be: three parts,
    no leading zeros (NVIDIA's 535.104.05 is 535.104.5)."""
    parts = [str(int(part)) for part in version.split(".")]
    return ".".join([*parts, "0", "0"][:3])


def unhealthy_taint(reason: str) -> dict[str, str]:
    """The device taint of a GPU out of service (``reason`` e.g. Xid79, a label value)."""
    return {"key": UNHEALTHY, "value": reason, "effect": UNHEALTHY_EFFECT}


def device_class() -> dict[str, Any]:
    """DeviceClass gpu.fakefleet.dev: every device of the engine's driver."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS,
                     "labels": {"app.kubernetes.io/managed-by": "fakefleet"}},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]},
    }


@dataclasses.dataclass(frozen=True)
class Wanted:
    """A node that publishes devices: its name, uid (the slice's owner) and pool."""

    node: str
    uid: str
    pool: str
    spec: FakeNodePoolSpec


def devices(cluster: str, want: Wanted, out: Mapping[int, Taint]) -> list[dict[str, Any]]:
    """The node's devices, those in ``out`` (GPU index → taint) tainted out of service."""
    gpu = want.spec.gpu
    assert gpu is not None
    preset = PRESETS[gpu.preset]
    version = semver(gpu.driverVersion)
    rendered = []
    for index in range(want.spec.gpus_per_node):
        device: dict[str, Any] = {
            "name": device_name(index),
            "attributes": {
                "productName": {"string": preset.product},
                "architecture": {"string": preset.family},
                "uuid": {"string": gpu_uuid(cluster, want.node, index)},
                "index": {"int": index},
                "memory": {"int": preset.memory_mib},
                "driverVersion": {"version": version},
            },
            "capacity": {"memory": {"value": f"{preset.memory_mib}Mi"}},
        }
        if index in out:
            device["taints"] = [dict(out[index])]
        rendered.append(device)
    return rendered


def render_slice(cluster: str, want: Wanted, *, out: Mapping[int, Taint],
                 generation: int) -> dict[str, Any]:
    """The whole ResourceSlice of ``want``'s node, at pool ``generation``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(want.node),
            "labels": {keys.POOL: want.pool},
            "annotations": {keys.SLICE_DIGEST: digest(cluster, want, out)},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": want.node,
                                 "uid": want.uid, "controller": True}],
        },
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": want.node,
            "pool": {"name": want.node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices(cluster, want, out),
        },
    }


def pool_shape(cluster: str, want: Wanted) -> str:
    """What the slices of ``want``'s pool are made of, apart from each node's own."""
    gpu = want.spec.gpu
    assert gpu is not None
    return json.dumps([FORMAT, cluster, want.pool, gpu.model_dump(mode="json"),
                       want.spec.gpus_per_node], sort_keys=True)


def digest(cluster: str, want: Wanted, out: Mapping[int, Taint], *,
           shape: str | None = None) -> str:
    """The digest of the slice :func:`render_slice` makes of these, from what it is made of
    (the pool's ``shape``, the node, its uid, the GPUs out of service): a few microseconds,
    where rendering and hashing the slice takes a quarter of a millisecond, and the plan
    takes one of every node. A taint counts by key, value and effect: the API server stamps
    its timeAdded."""
    taints = sorted((index, taint.get("key"), taint.get("value"), taint.get("effect"))
                    for index, taint in out.items() if index < want.spec.gpus_per_node)
    made_of = json.dumps([shape or pool_shape(cluster, want), want.node, want.uid, taints])
    return hashlib.sha256(made_of.encode()).hexdigest()[:16]


# -- what the engine reads of a slice ---------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class SliceFacts:
    """One of the engine's ResourceSlices, as last observed."""

    name: str
    node: str
    uid: str
    owner: str  # the uid of the Node that owns it ("": none)
    digest: str
    generation: int
    resource_version: str
    #: GPUs out of service: index → the taint as the API shows it (timeAdded included, so a
    #: rewrite of the slice keeps it and an eviction's clock does not start again).
    out: Mapping[int, Taint] = dataclasses.field(default_factory=dict)


def observe_slice(obj: Mapping[str, Any]) -> SliceFacts | None:
    """The facts of a slice of the engine's driver (None: someone else's, or no node's)."""
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    if spec.get("driver") != DRA_DRIVER or not node:
        return None
    metadata = obj.get("metadata") or {}
    owner = next((ref.get("uid", "") for ref in metadata.get("ownerReferences") or ()
                  if ref.get("kind") == "Node" and ref.get("name") == node), "")
    out: dict[int, Taint] = {}
    for device in spec.get("devices") or ():
        index = device_index(str(device.get("name", "")))
        taint = next((t for t in device.get("taints") or () if t.get("key") == UNHEALTHY), None)
        if index is not None and taint is not None:
            out[index] = taint
    return SliceFacts(
        name=metadata.get("name", ""), node=str(node), uid=metadata.get("uid", ""),
        owner=owner, digest=(metadata.get("annotations") or {}).get(keys.SLICE_DIGEST, ""),
        generation=int((spec.get("pool") or {}).get("generation") or 0),
        resource_version=metadata.get("resourceVersion", ""), out=out)


def with_health(out: Mapping[int, Taint], indices: Iterable[int], *, healthy: bool,
                reason: str, gpus: int) -> dict[int, Taint]:
    """``out`` with the GPUs ``indices`` (those the node has) back in service or taken out
    (one already out keeps its taint, and so its timeAdded)."""
    changed = dict(out)
    for index in indices:
        if not 0 <= index < gpus:
            continue
        if healthy:
            changed.pop(index, None)
        else:
            changed.setdefault(index, unhealthy_taint(reason))
    return changed


# -- planning ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Publish:
    """Create the node's slice, or bring it to its digest (replacing one another node owned)."""

    node: str


@dataclasses.dataclass(frozen=True)
class Withdraw:
    """Delete a slice whose node is gone, or no longer publishes devices."""

    name: str
    uid: str


SliceAction = Publish | Withdraw


def plan(cluster: str, wanted: Iterable[Wanted],
         observed: Mapping[str, SliceFacts]) -> list[SliceAction]:
    """What to do so each wanted node has its slice, as it should be, and no other node has
    one: withdrawals first, then publications, each in a stable order. A slice keeps the GPUs
    it shows out of service out; only :func:`with_health` changes that."""
    publish: list[SliceAction] = []
    names = set()
    shapes: dict[int, str] = {}  # per pool spec: most nodes share a handful
    for want in sorted(wanted, key=lambda w: w.node):
        name = slice_name(want.node)
        names.add(name)
        found = observed.get(name)
        if found is None or found.owner != want.uid:
            publish.append(Publish(want.node))
            continue
        shape = shapes.get(id(want.spec))
        if shape is None:
            shape = shapes[id(want.spec)] = pool_shape(cluster, want)
        if found.digest != digest(cluster, want, found.out, shape=shape):
            publish.append(Publish(want.node))
    withdraw: list[SliceAction] = [Withdraw(name, facts.uid)
                                   for name, facts in sorted(observed.items())
                                   if name not in names]
    return withdraw + publish
