"""Fake nodes as data: names, addresses, the Node object of a pool member, what the engine
reads back from one, and the plan that turns desired pools and observed nodes into creations,
updates and deletions. Pure: no I/O, no clock of its own (``now`` is passed in).

Names are ``<pool>-<index>``, so scale-down is deterministic: the highest indices go first, as
with a StatefulSet. A name a Delete fault holds (the pool's ``fakefleet.dev/held-nodes``) is
planned as if scaled away until it is released, then made again like any missing index. A
node is the engine's own when its ``spec.providerID`` says so (``fakefleet://<cluster>/<node>``);
a node that carries the pool label without it (a real node someone labelled, a copy from
elsewhere) is *foreign*: never adopted, never deleted, reported.

The nodes of a pool with a provisioner (``spec.provisioner: karpenter``) are made and deleted
by Karpenter, and *taken over* by the engine: a node is one of them when its providerID is
Karpenter's KWOK provider's (``kwok://<name>``) and both its pool label and Karpenter's
``karpenter.sh/nodepool`` name the pool (fakefleet writes the pool label into the Karpenter
NodePool of the pool's name, which copies it onto every node it makes). The engine gives such a
node what a kubelet would (:func:`take_patches`: a slot, hence pod CIDR and InternalIP, the
kubelet endpoint, conditions, node info, and the real size of its instance type as capacity,
where Karpenter wrote only its pods' requests) and plays it like its own; its labels, taints,
finalizers and owner references stay Karpenter's, and the engine never creates or deletes
one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from operators.api import stages as stage_api
from operators.api.gpus import gfd_labels
from operators.api.injections import FaultEntry
from operators.api.instancetypes import BY_NAME as INSTANCE_TYPES
from operators.api.nodepools import INSTANCE_TYPE_PREFIX, FakeNodePoolSpec

# The API defines these (its limits come from them); the engine speaks of nodes through here.
from operators.api.nodepools import MAX_NODES_PER_CLUSTER as MAX_NODES_PER_CLUSTER
from operators.api.nodepools import node_name as node_name
from operators.api.usage import quantity
from primitives import keys
from primitives.names import LABEL_VALUE_MAX_LENGTH

MANAGED_SELECTOR = keys.POOL  # every node we own carries the pool label

#: Pod CIDRs are /24 slices of 10.128.0.0/9 (MAX_NODES_PER_CLUSTER of them), clear of the
#: service range 10.96.0.0/12. Node InternalIPs are loopback addresses of 127.64.0.0/16, one per
#: node (every address of 127.0.0.0/8 is local on Linux): the engine serves each node's kubelet
#: endpoints there (:mod:`operators.engine.serving`), so metrics-server, or anything else that
#: scrapes kubelets by node address, reaches the right fake node.
POD_NETWORK = ipaddress.ip_network("10.128.0.0/9")
NODE_NETWORK = ipaddress.ip_network("127.64.0.0/16")
#: The kubelet port a node advertises (status.daemonEndpoints) when the engine serves none.
KUBELET_PORT = 10250
#: What marks a node Karpenter's KWOK provider made: its providerID's prefix, and the label
#: with its NodePool's name.
PROVISIONED_PREFIX = "kwok://"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def node_index(pool: str, name: str) -> int | None:
    """The index of ``name`` in ``pool``, or None if the name is not of that pool's form."""
    prefix = f"{pool}-"
    suffix = name[len(prefix):] if name.startswith(prefix) else ""
    return int(suffix) if suffix.isdigit() else None


def provider_id(cluster: str, name: str) -> str:
    return f"fakefleet://{cluster}/{name}"


def pod_cidr(slot: int) -> str:
    base = int(POD_NETWORK.network_address) + (slot << 8)
    return f"{ipaddress.ip_address(base)}/24"


def node_ip(slot: int) -> str:
    return str(ipaddress.ip_address(int(NODE_NETWORK.network_address) + slot + 1))


def slot_of(address: str) -> int | None:
    """The slot whose node has InternalIP ``address`` (None: not a node address)."""
    try:
        value = int(ipaddress.IPv4Address(address)) - int(NODE_NETWORK.network_address) - 1
    except ValueError:
        return None
    return value if 0 <= value < MAX_NODES_PER_CLUSTER else None


def kubelet_status(slot: int, port: int) -> dict[str, Any]:
    """Where the node's kubelet is reached: its addresses and daemon endpoint."""
    return {"addresses": [{"type": "InternalIP", "address": node_ip(slot)}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}


def template_hash(spec: FakeNodePoolSpec) -> str:
    """Changes whenever what a node looks like changes (not on a replica count change)."""
    shape = spec.model_dump(mode="json", exclude={"replicas", "clusterRef", "pods", "usage",
                                                  "provisioner"})
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def node_shape(cluster: str, pool: str, spec: FakeNodePoolSpec, index: int) -> dict[str, Any]:
    """Labels, annotations, taints and capacity of node ``index`` of ``pool``."""
    name = node_name(pool, index)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"{INSTANCE_TYPE_PREFIX}{pool}",
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
        labels[keys.RACK] = f"rack-{rack}"
    capacity = spec.node_capacity()
    taints = [taint.model_dump(mode="json", exclude_defaults=False)
              for taint in spec.template.taints]
    if spec.gpu is not None:
        count = spec.gpus_per_node
        clique = _label_value(f"{cluster}.{rack if rack is not None else 0}")
        labels.update(gfd_labels(spec.gpu.preset, count,
                                 driver_version=spec.gpu.driverVersion, clique=clique))
        if spec.gpu.taint and not any(t["key"] == "nvidia.com/gpu" for t in taints):
            taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    labels.update(spec.template.labels)
    labels[keys.POOL] = pool
    # No node.alpha.kubernetes.io/ttl: the controller-manager's TTL controller owns it.
    annotations = {**spec.template.annotations, keys.TEMPLATE_HASH: template_hash(spec)}
    annotations[keys.TEMPLATE_KEYS] = json.dumps({
        "labels": sorted(labels), "annotations": sorted(spec.template.annotations),
        "capacity": sorted(capacity), "taints": sorted({t["key"] for t in taints})},
        separators=(",", ":"))
    return {"labels": labels, "annotations": annotations, "taints": taints,
            "capacity": capacity}


def _label_value(text: str) -> str:
    """``text`` if it fits a label value, else a prefix of it and a digest (still unique)."""
    if len(text) <= LABEL_VALUE_MAX_LENGTH:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[:LABEL_VALUE_MAX_LENGTH - 11].rstrip('-_.')}-{digest}"


# -- conditions and the node's life -----------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: str
    reason: str
    message: str
    heartbeat: str  # lastHeartbeatTime
    since: str  # lastTransitionTime


@dataclasses.dataclass(frozen=True, slots=True)
class GPUState:
    """What stages did to one GPU of the node; its telemetry follows from this and its pods."""

    xid: int = 0  # the last Xid reported (0: none)
    healthy: bool = True
    temperature: int | None = None  # a fault's reading, else the GPU's own
    sm_clock: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class NodeLife:
    """The node as the engine plays it: its conditions, whether it heartbeats, and what stages
    did to its GPUs."""

    conditions: tuple[NodeCondition, ...] = ()
    heartbeat: bool = True
    changed_at: str = ""  # the last status write: the stages' delays count from here
    #: (index, state) of the GPUs a stage changed, by index; the others are as made.
    gpus: tuple[tuple[int, GPUState], ...] = ()

    def gpu(self, index: int) -> GPUState:
        return next((state for at, state in self.gpus if at == index), HEALTHY_GPU)

    def status(self, kind: str) -> str | None:
        return next((c.status for c in self.conditions if c.type == kind), None)


HEALTHY_GPU = GPUState()


def apply_gpus(current: tuple[tuple[int, GPUState], ...],
               effect: stage_api.GPUEffect) -> tuple[tuple[int, GPUState], ...]:
    """The GPUs' states after ``effect``."""
    states = dict(current)
    for index in effect.indices:
        if effect.reset:
            states.pop(index, None)
            continue
        state = states.get(index, HEALTHY_GPU)
        states[index] = GPUState(
            xid=effect.xid if effect.xid is not None else state.xid,
            healthy=effect.healthy if effect.healthy is not None else state.healthy,
            temperature=effect.temperature if effect.temperature is not None
            else state.temperature,
            sm_clock=effect.smClock if effect.smClock is not None else state.sm_clock)
    return tuple(sorted(states.items()))


def gpus_from_entries(entries: Iterable[FaultEntry]) -> tuple[tuple[int, GPUState], ...]:
    """What the fault entries a node carries did to its GPUs, for an engine that starts again:
    the GPU effects of the stages of every entry still in force (inject, or recover with its
    reset not written yet), in order. A signal-only Xid whose entry is done is forgotten, as a
    restarted DCGM forgets the last Xid it saw."""
    gpus: tuple[tuple[int, GPUState], ...] = ()
    for entry in entries:
        if entry.state == "done":
            continue
        for stage in entry.stages:
            effect = stage.effect
            if isinstance(effect, stage_api.NodeEffect) and effect.gpus is not None:
                gpus = apply_gpus(gpus, effect.gpus)
    return gpus


def healthy_life(now: str) -> NodeLife:
    """A new node: the conditions of a healthy kubelet, all heartbeating at ``now``."""
    return NodeLife(conditions=set_conditions((), [
        stage_api.Condition(type="MemoryPressure", status="False",
                            reason="KubeletHasSufficientMemory",
                            message="kubelet has sufficient memory available"),
        stage_api.Condition(type="DiskPressure", status="False",
                            reason="KubeletHasNoDiskPressure",
                            message="kubelet has no disk pressure"),
        stage_api.Condition(type="PIDPressure", status="False",
                            reason="KubeletHasSufficientPID",
                            message="kubelet has sufficient PID available"),
        stage_api.Condition(type="Ready", status="True", reason="KubeletReady",
                            message="kubelet is posting ready status"),
    ], now), changed_at=now)


def set_conditions(current: tuple[NodeCondition, ...], changes: Sequence[stage_api.Condition],
                   now: str, observed: Mapping[str, str] | None = None
                   ) -> tuple[NodeCondition, ...]:
    """``current`` with ``changes`` applied by type (new types appended, in order). A status
    changes at ``now`` when it differs from the engine's own or from what the API shows
    (``observed``, type → status: the kubelet compares with the node it reads, so a node
    the node-lifecycle controller marked Unknown gets a new transition when it is Ready again).
    """
    observed = observed or {}
    by_type = {condition.type: condition for condition in current}
    for change in changes:
        old = by_type.get(change.type)
        kept = old is not None and old.status == change.status and \
            observed.get(change.type, change.status) == change.status
        by_type[change.type] = NodeCondition(change.type, change.status, change.reason,
                                             change.message, now, old.since if kept and old
                                             else now)
    return tuple(by_type.values())


def posted_again(conditions: tuple[NodeCondition, ...], observed: Mapping[str, str],
                 now: str) -> tuple[NodeCondition, ...]:
    """``conditions`` as a kubelet posts them after the API showed others in their place (the
    node-lifecycle controller's Unknown): each of those anew, heartbeat and transition
    ``now``; the others as they are."""
    return tuple(dataclasses.replace(c, heartbeat=now, since=now)
                 if observed.get(c.type, c.status) != c.status else c for c in conditions)


def life_from_node(node: Mapping[str, Any], entries: Iterable[FaultEntry] = ()) -> NodeLife:
    """The life a Node object shows (after an engine restart): its conditions as they are,
    its last report when the newest heartbeat was, its GPUs as the fault ``entries`` it
    carries left them."""
    conditions = tuple(
        NodeCondition(c["type"], c.get("status", "Unknown"), c.get("reason", ""),
                      c.get("message", ""), c.get("lastHeartbeatTime", ""),
                      c.get("lastTransitionTime", ""))
        for c in (node.get("status") or {}).get("conditions") or ())
    return NodeLife(conditions=conditions,
                    changed_at=max((c.heartbeat for c in conditions), default=""),
                    gpus=gpus_from_entries(entries))


def render_conditions(life: NodeLife) -> list[dict[str, str]]:
    return [{"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
             "lastHeartbeatTime": c.heartbeat, "lastTransitionTime": c.since}
            for c in life.conditions]


def render_node(
    cluster: str, pool: str, spec: FakeNodePoolSpec, index: int, slot: int, *,
    life: NodeLife, kubelet_version: str, kubelet_port: int = KUBELET_PORT,
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
                 "providerID": provider_id(cluster, name)},
        "status": {
            "capacity": shape["capacity"],
            "allocatable": shape["capacity"],
            "conditions": render_conditions(life),
            "addresses": [{"type": "InternalIP", "address": node_ip(slot)},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            "nodeInfo": node_info(cluster, name, kubelet_version),
            "phase": "Running",
        },
    }


def node_info(cluster: str, name: str, kubelet_version: str,
              architecture: str = "amd64") -> dict[str, str]:
    """What a kubelet says of its machine, stable per node name."""
    return {
        "machineID": hashlib.md5(f"{cluster}/{name}".encode()).hexdigest(),
        "systemUUID": hashlib.md5(f"uuid/{cluster}/{name}".encode()).hexdigest(),
        "bootID": hashlib.md5(f"boot/{cluster}/{name}".encode()).hexdigest(),
        "kernelVersion": "6.8.0-fakefleet",
        "osImage": "fakefleet",
        "containerRuntimeVersion": "fakefleet://1.0.0",
        "kubeletVersion": kubelet_version,
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": architecture,
    }


# -- nodes a provisioner made -----------------------------------------------------------------

def instance_capacity(labels: Mapping[str, str]) -> dict[str, str] | None:
    """The real size of the node's instance type (its label), None for a type fakefleet does
    not offer (then its capacity stays as Karpenter wrote it)."""
    found = INSTANCE_TYPES.get(labels.get(INSTANCE_TYPE_LABEL, ""))
    return dict(found.resources) if found is not None else None


def take_patches(cluster: str, facts: NodeFacts, slot: int, *, kubelet_version: str,
                 kubelet_port: int, life: NodeLife | None) -> tuple[dict[str, Any],
                                                                    dict[str, Any]]:
    """Merge patches (object, status) that make a node a provisioner made one the engine
    plays: its pod CIDR (only while it has none: the API refuses to change one), where its
    kubelet is reached, its machine, its capacity, and (``life``, the first time) a healthy
    kubelet's conditions. Nothing of its labels, taints or metadata."""
    cidr = pod_cidr(slot)
    spec = {} if facts.slot is not None else {"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}
    kubelet = kubelet_status(slot, kubelet_port)
    kubelet["addresses"].append({"type": "Hostname", "address": facts.name})
    status: dict[str, Any] = {
        **kubelet, "phase": "Running",
        "nodeInfo": node_info(cluster, facts.name, kubelet_version,
                              facts.labels.get("kubernetes.io/arch", "amd64"))}
    capacity = instance_capacity(facts.labels)
    if capacity is not None:
        status["capacity"] = capacity
    if life is not None:
        status["conditions"] = render_conditions(life)
    return spec, {"status": status}


def _taken(facts: NodeFacts, kubelet_port: int) -> bool:
    """Whether a provisioner's node is as the engine makes it: its kubelet where the engine
    serves it, its capacity its instance type's, some condition posted."""
    if facts.slot is None or facts.kubelet != (node_ip(facts.slot), kubelet_port) \
            or not facts.ready:
        return False
    capacity = instance_capacity(facts.labels)
    return capacity is None or all(
        _same_quantity(facts.capacity.get(resource), amount)
        for resource, amount in capacity.items())


def _same_quantity(observed: str | None, wanted: str) -> bool:
    try:
        return observed is not None and quantity(observed) == quantity(wanted)
    except ValueError:
        return False


def reshape_patches(
    cluster: str, pool: str, spec: FakeNodePoolSpec, index: int, observed: Mapping[str, Any],
    *, slot: int, kubelet_port: int = KUBELET_PORT,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Merge patches (object, status) that bring the ``observed`` node to the current template
    and kubelet endpoint: keys the old template gave and the new one has not are removed; keys
    and taints others added (controllers' taints, users' labels) stay. The object patch carries
    the observed resourceVersion, so a change made meanwhile makes it fail (409) rather than be
    undone."""
    shape = node_shape(cluster, pool, spec, index)
    metadata = observed.get("metadata") or {}
    try:
        old = json.loads((metadata.get("annotations") or {}).get(keys.TEMPLATE_KEYS, "{}"))
    except ValueError:
        old = {}
    old = old if isinstance(old, dict) else {}

    def removed(kind: str, kept: Mapping[str, Any]) -> dict[str, None]:
        return {key: None for key in old.get(kind) or () if key not in kept}

    template_taints = set(old.get("taints") or ()) | {t["key"] for t in shape["taints"]}
    others = [taint for taint in (observed.get("spec") or {}).get("taints") or ()
              if taint.get("key") not in template_taints]
    meta = {"metadata": {
        "resourceVersion": metadata.get("resourceVersion"),
        "labels": {**removed("labels", shape["labels"]), **shape["labels"]},
        "annotations": {**removed("annotations", shape["annotations"]),
                        **shape["annotations"]}},
        "spec": {"taints": others + shape["taints"]}}
    capacity = {**removed("capacity", shape["capacity"]), **shape["capacity"]}
    kubelet = kubelet_status(slot, kubelet_port)
    kubelet["addresses"].append({"type": "Hostname", "address": node_name(pool, index)})
    status = {"status": {"capacity": capacity, "allocatable": capacity, **kubelet}}
    return meta, status


# -- what the engine reads of a node ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """A node carrying the pool label, as last observed."""

    name: str
    pool: str
    template_hash: str
    slot: int | None
    uid: str = ""
    ready: str = ""  # the Ready condition's status as the API shows it
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Not made by this engine: never adopted, never deleted, its name never created.
    foreign: bool = False
    #: Why the engine cannot use this node as it is (empty: it can), for a Warning Event.
    problem: str = ""
    resource_version: str = ""
    conditions: Mapping[str, str] = dataclasses.field(default_factory=dict)  # type → status
    taints: tuple[Mapping[str, Any], ...] = ()
    unschedulable: bool = False
    capacity: Mapping[str, str] = dataclasses.field(default_factory=dict)
    allocatable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    created: str = ""  # metadata.creationTimestamp
    #: Where its kubelet is reached, as its status says: InternalIP and daemon endpoint port.
    kubelet: tuple[str, int] = ("", 0)
    #: Made by a provisioner (Karpenter) for the pool: taken over, never created or deleted.
    provisioned: bool = False

    def taint_effect(self, key: str) -> str | None:
        return next((taint.get("effect") for taint in self.taints if taint.get("key") == key),
                    None)


def observe(node: Mapping[str, Any], cluster: str) -> NodeFacts | None:
    """The facts the engine needs of a Node object (None if it carries no pool label)."""
    metadata = node.get("metadata", {})
    labels = metadata.get("labels") or {}
    pool = labels.get(keys.POOL)
    if pool is None:
        return None
    name = metadata["name"]
    spec = node.get("spec") or {}
    slot, problem = None, ""
    provisioned = str(spec.get("providerID") or "").startswith(PROVISIONED_PREFIX) and \
        labels.get(NODEPOOL_LABEL) == pool
    foreign = not provisioned and spec.get("providerID") != provider_id(cluster, name)
    if provisioned:
        slot = _slot(spec.get("podCIDR"))
        if slot is None and spec.get("podCIDR"):
            foreign = True
            problem = (f"node {name}, made by Karpenter for pool {pool}, has pod CIDR "
                       f"{spec['podCIDR']}, not a /24 of {POD_NETWORK}, so its pods could get "
                       f"no addresses: the engine does not play it; delete it, and Karpenter "
                       f"makes another")
    elif foreign:
        problem = (f"node {name} carries the label {keys.POOL}={pool} but was not made by this "
                   f"engine (providerID {spec.get('providerID') or 'unset'}, expected "
                   f"{provider_id(cluster, name)}): it is left alone; remove the label, or "
                   f"delete the node to let the pool use its name")
    else:
        slot = _slot(spec.get("podCIDR"))
        if slot is None:
            problem = (f"node {name} has pod CIDR {spec.get('podCIDR') or 'unset'}, not a /24 "
                       f"of {POD_NETWORK}, so its pods could get no addresses: the engine "
                       f"replaces it")
    status = node.get("status") or {}
    conditions = {c.get("type", ""): c.get("status", "") for c in status.get("conditions") or ()}
    return NodeFacts(
        name=name, pool=pool,
        template_hash=(metadata.get("annotations") or {}).get(keys.TEMPLATE_HASH, ""), slot=slot,
        uid=metadata.get("uid", ""), ready=conditions.get("Ready", ""), labels=labels,
        annotations=metadata.get("annotations") or {}, foreign=foreign, problem=problem,
        resource_version=metadata.get("resourceVersion", ""), conditions=conditions,
        taints=tuple(spec.get("taints") or ()), unschedulable=bool(spec.get("unschedulable")),
        capacity=status.get("capacity") or {}, allocatable=status.get("allocatable") or {},
        created=metadata.get("creationTimestamp", ""), kubelet=_kubelet(status),
        provisioned=provisioned,
    )


def _kubelet(status: Mapping[str, Any]) -> tuple[str, int]:
    address = next((a.get("address", "") for a in status.get("addresses") or ()
                    if a.get("type") == "InternalIP"), "")
    endpoint = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {})
    port = endpoint.get("Port", 0)
    return address, port if isinstance(port, int) else 0


def _slot(cidr: str | None) -> int | None:
    if not cidr:
        return None
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return None
    if not isinstance(network, ipaddress.IPv4Network) or network.prefixlen != 24 or \
            not network.subnet_of(POD_NETWORK):  # type: ignore[arg-type]
        return None
    return (int(network.network_address) - int(POD_NETWORK.network_address)) >> 8


# -- planning ---------------------------------------------------------------------------------

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


@dataclasses.dataclass(frozen=True)
class Take:
    """Make a node a provisioner made one the engine plays (:func:`take_patches`)."""

    pool: str
    name: str


Action = Create | Reshape | Delete | Take


def plan(desired: Mapping[str, FakeNodePoolSpec], observed: Iterable[NodeFacts],
         held: Mapping[str, AbstractSet[str]] | None = None, *,
         kubelet_port: int = KUBELET_PORT) -> list[Action]:
    """What to do so the nodes match the pools: deletions first (they free pod CIDRs), then
    reshapes and take-overs, then creations, each in a stable order. Foreign nodes are never
    touched, and their names never created; the engine's own nodes without a usable pod CIDR
    are replaced. A provisioner's node is never deleted: it is taken over once its pool asks
    for a provisioner, and again while it is not as the engine makes it (:func:`_taken`).
    ``held``: per pool, the names a Delete fault holds (:func:`~operators.api.injections.
    read_held`): deleted if present, not created while held, as if scaled down. A node whose
    template changed, or whose kubelet endpoint is not where the engine serves it (another
    port, or the addresses of an older engine), is reshaped."""
    held = held or {}
    deletions: list[Action] = []
    reshapes: list[Action] = []
    present: dict[str, set[int]] = {pool: set() for pool in desired}
    taken: set[str] = set()
    hashes = {pool: template_hash(spec) for pool, spec in desired.items()}
    for node in sorted(observed, key=lambda n: n.name):
        taken.add(node.name)
        if node.foreign:
            continue
        spec = desired.get(node.pool)
        if node.provisioned:
            # One already played is kept right even once its pool is gone (until Karpenter
            # deletes it); a new one is taken only for a pool that asks for a provisioner.
            wanted = node.slot is not None or (spec is not None and spec.provisioner)
            if wanted and not _taken(node, kubelet_port):
                reshapes.append(Take(node.pool, node.name))
            continue
        index = node_index(node.pool, node.name)
        if spec is None or index is None or index >= spec.engine_replicas or \
                node.slot is None or node.name in held.get(node.pool, ()):
            deletions.append(Delete(node.name))
            continue
        present[node.pool].add(index)
        if node.template_hash != hashes[node.pool] or \
                node.kubelet != (node_ip(node.slot), kubelet_port):
            reshapes.append(Reshape(node.pool, index))
    creations: list[Action] = [
        Create(pool, index)
        for pool, spec in sorted(desired.items())
        for index in range(spec.engine_replicas)
        if index not in present[pool] and node_name(pool, index) not in taken
        and node_name(pool, index) not in held.get(pool, ())
    ]
    return deletions + reshapes + creations
