"""FakeNodePool: a scalable group of fake nodes in one FakeCluster."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from operators.api import usage
from operators.api.base import (
    Condition,
    CustomResource,
    Model,
    PrinterColumn,
    Quantity,
    ResourceInfo,
    immutable,
)
from operators.api.clusters import MAX_CLUSTER_NAME_LENGTH
from operators.api.durations import DURATION_LENGTH, DURATION_PATTERN
from operators.api.gpus import PRESETS, GPUAllocation, GPUPresetName
from operators.api.instancetypes import GPU_COUNTS
from operators.api.names import (
    MAX_ENTRIES,
    Annotations,
    Labels,
    keys_are_qualified_names,
    label_value,
    qualified_name,
    rule,
    validations,
)
from primitives import keys
from primitives.names import LABEL_VALUE_MAX_LENGTH

#: Every node gets a /24 pod CIDR of 10.128.0.0/9 (2**(24-9) of them), so no cluster can
#: address more nodes than this, whatever its pools ask for.
MAX_NODES_PER_CLUSTER = 32768
#: Every fake node is labelled node.kubernetes.io/instance-type=<this><pool>.
INSTANCE_TYPE_PREFIX = "fakefleet."
#: Extended resources and taints one pool may declare; bounds the cost of their rules.
MAX_CAPACITY_ENTRIES = 32
MAX_TAINTS = 32
#: clusterRef names a FakeCluster: a DNS subdomain, as every object name, of at most
#: MAX_CLUSTER_NAME_LENGTH characters; a pool naming anything else could never get nodes.
CLUSTER_REF_RULE = rule(
    "!format.dns1123Subdomain().validate(self).hasValue()",
    "clusterRef must be the name of a FakeCluster: lower-case letters, digits, '-' and '.', "
    "alphanumeric at both ends",
)


def pool_selector(pool: str) -> str:
    return f"{keys.POOL}={pool}"


def node_name(pool: str, index: int) -> str:
    """Nodes are ``<pool>-<index>``, so scale-down removes the highest indices first."""
    return f"{pool}-{index}"


#: The pool's name is in three label values on each of its nodes (kubernetes.io/hostname is the
#: node name), so the tightest of them bounds it. Node names themselves are DNS subdomains of up
#: to 253 characters: a pool name, a DNS subdomain as every object name, with '-' and digits
#: appended is still one, and every label value made of it matches the label-value syntax.
MAX_POOL_NAME_LENGTH = min(
    LABEL_VALUE_MAX_LENGTH - len(node_name("", MAX_NODES_PER_CLUSTER - 1)),
    LABEL_VALUE_MAX_LENGTH - len(INSTANCE_TYPE_PREFIX),
)
NAME_RULE = rule(
    f"size(self.metadata.name) <= {MAX_POOL_NAME_LENGTH}",
    f"a FakeNodePool name has at most {MAX_POOL_NAME_LENGTH} characters: its nodes are labelled "
    f"kubernetes.io/hostname=<pool>-<index> (index up to {MAX_NODES_PER_CLUSTER - 1}), "
    f"{keys.POOL}=<pool> and node.kubernetes.io/instance-type={INSTANCE_TYPE_PREFIX}<pool>, and "
    f"label values hold at most {LABEL_VALUE_MAX_LENGTH} characters; choose a shorter name",
    field_path=".metadata.name",
)


#: Node validation wants whole units of pods and of extended resources (those with a domain
#: prefix other than kubernetes.io, such as nvidia.com/gpu): a node with 1.5 of them is refused.
_COUNTED = ("(k == 'pods' || (k.contains('/') && !k.contains('kubernetes.io/') "
            "&& !k.startsWith('requests.')))")
_WHOLE = "(type(self[k]) == int || quantity(self[k]).isInteger())"
WHOLE_UNITS_RULE = rule(
    f"self.all(k, !{_COUNTED} || {_WHOLE})",
    "pods and extended resources such as nvidia.com/gpu are counted in whole units: use an "
    "integer such as 8, not 500m or 1.5",
    message_expression=(f"\"'\" + self.filter(k, {_COUNTED} && !{_WHOLE})[0] + \"' needs a "
                        "whole number: pods and extended resources such as nvidia.com/gpu are "
                        "counted in whole units; use an integer such as 8, not 500m or 1.5\""),
)


DEFAULT_CAPACITY: dict[str, Any] = {
    "cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti",
}


class Taint(Model):
    """A node taint, as in core/v1."""

    key: Annotated[str, qualified_name("taint key")]
    """Taint key, a qualified name, e.g. nvidia.com/gpu."""
    value: Annotated[str, label_value("taint value")] = ""
    """Taint value, a label value (at most 63 characters)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    """What happens to pods that do not tolerate the taint."""


class NodeTemplate(Model):
    """What every node of the pool looks like."""

    labels: Labels = Field(default_factory=dict)
    """Extra labels on every node (at most 64; keys and values as Kubernetes labels)."""
    annotations: Annotations = Field(default_factory=dict)
    """Extra annotations on every node (at most 64; keys are qualified names)."""
    taints: list[Taint] = Field(default_factory=list, max_length=MAX_TAINTS)
    """Taints on every node (at most 32)."""
    capacity: dict[str, Quantity] = Field(
        default_factory=lambda: dict(DEFAULT_CAPACITY),
        max_length=MAX_CAPACITY_ENTRIES,
        json_schema_extra={"default": DEFAULT_CAPACITY, **validations(
            keys_are_qualified_names("resource name"), WHOLE_UNITS_RULE)},
    )
    """Node capacity (allocatable is the same), at most 32 resources, none negative; pods and
    extended resources in whole units. GPU presets add nvidia.com/gpu."""


#: A driver version is in several label values (at most 63 characters) and a DRA version
#: attribute (at most 64); real ones are far shorter.
MAX_DRIVER_VERSION_LENGTH = 32
#: A pool whose GPUs are only offered through DRA cannot also declare them as an extended
#: resource: the scheduler would count them as both.
DRA_CAPACITY_RULE = rule(
    "!has(self.gpu) || self.gpu.allocation != 'dra' || "
    "!('nvidia.com/gpu' in self.template.capacity)",
    "gpu.allocation dra offers the GPUs through DRA only: remove nvidia.com/gpu from "
    "template.capacity, or use allocation both to offer them both ways",
    field_path=".gpu.allocation",
)


#: Who makes a pool's nodes besides the engine itself.
Provisioner = Literal["karpenter"]
_PROVISIONED = "has(self.provisioner)"
PROVISIONER_RULES = (
    rule(f"{_PROVISIONED} == has(oldSelf.provisioner) && "
         f"(!{_PROVISIONED} || self.provisioner == oldSelf.provisioner)",
         "provisioner is immutable: the nodes of a pool are made either by the engine or by "
         "Karpenter; create another pool instead", field_path=".provisioner"),
    rule(f"!{_PROVISIONED} || self.replicas == oldSelf.replicas",
         "replicas means nothing for a pool with provisioner karpenter: Karpenter decides how "
         "many nodes it makes for the pods that wait (status.replicas counts them); scale the "
         "pods instead", field_path=".replicas"),
    rule(f"!{_PROVISIONED} || !has(self.gpu) || self.gpu.allocation == 'extended'",
         "a pool with provisioner karpenter offers its GPUs as the extended resource "
         "nvidia.com/gpu only (Karpenter ignores DRA requests): set gpu.allocation: extended",
         field_path=".gpu.allocation"),
    rule(f"!{_PROVISIONED} || !has(self.gpu) || !has(self.gpu.count) || "
         f"self.gpu.count in {list(GPU_COUNTS)}",
         f"Karpenter's instance types have {', '.join(map(str, GPU_COUNTS))} GPUs: set "
         f"gpu.count to one of these, or remove it for the preset's usual count",
         field_path=".gpu.count"),
)


class GPUSpec(Model):
    """GPUs on every node of the pool, described as GPU Feature Discovery would."""

    preset: GPUPresetName
    """GPU product: A100-SXM4-80GB, H100-SXM5-80GB, H200-SXM-141GB, B200 or GB200."""
    count: int | None = Field(default=None, ge=1, le=16)
    """GPUs per node; default: the product's usual server (8, or 4 for GB200)."""
    taint: bool = True
    """Add the usual nvidia.com/gpu=present:NoSchedule taint."""
    driverVersion: str = Field(default="570.133.20", pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$",
                               max_length=MAX_DRIVER_VERSION_LENGTH)
    """NVIDIA driver version reported in the nvidia.com/cuda.driver-version.* labels and the
    DRA devices' driverVersion attribute, e.g. 570.133.20 (at most 32 characters)."""
    allocation: GPUAllocation = "extended"
    """How pods get the GPUs: extended (the device plugin's nvidia.com/gpu resource), dra
    (Dynamic Resource Allocation only: a ResourceSlice per node with a device per GPU, selected
    through DeviceClass gpu.fakefleet.dev; the node has no nvidia.com/gpu) or both (each GPU
    offered both ways at once, as during a migration: the scheduler does not know they are the
    same GPUs, so each can be given to two pods)."""


class TopologySpec(Model):
    """How nodes spread over failure domains (topology.kubernetes.io labels)."""

    region: Annotated[str, label_value("region")] = ""
    """Value of topology.kubernetes.io/region on every node (empty: no label)."""
    zones: list[Annotated[str, label_value("zone")]] = Field(
        default_factory=list, max_length=MAX_ENTRIES,
        json_schema_extra={"x-kubernetes-list-type": "set"})
    """Zones to spread the nodes over, round-robin (empty: no zone label); at most 64, each a
    label value."""
    racks: int = Field(default=0, ge=0, le=10_000)
    """Racks per zone to spread nodes over (label fakefleet.dev/rack; 0: no rack label)."""


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=DURATION_LENGTH)]


class PodBehaviour(Model):
    """How pods on the pool's nodes live, unless their annotations say otherwise
    (fakefleet.dev/start-delay, fakefleet.dev/run-time, fakefleet.dev/exit-code,
    fakefleet.dev/seed)."""

    startDelay: Duration = "0s"
    """Time from binding to Running (containers started)."""
    startJitter: Duration = "0s"
    """Up to this much is added to startDelay, drawn per pod."""
    initDelay: Duration = "0s"
    """Time each init container takes to complete."""
    jobRunTime: Duration = "10s"
    """How long a Job's pod runs before it completes with exit code 0."""
    jobRunJitter: Duration = "0s"
    """Up to this much is added to jobRunTime, drawn per pod."""
    terminationGracePeriodCap: Duration = "1s"
    """A deleted pod is finalised after its grace period, but never later than this."""
    seed: int = Field(default=0, ge=0)
    """Seed of the per-pod draws; the same seed and pod name give the same timings."""


def _profile(kind: usage.Kind, what: str) -> Any:
    """A usage amount or profile (:mod:`operators.api.usage`), checked by a CEL rule whose
    message says what is accepted (a failed pattern would show the whole grammar instead)."""
    regex = usage.pattern(kind)
    return Field(max_length=usage.MAX_LENGTH, json_schema_extra=validations(rule(
        f"self.matches(r'{regex}')", f"{what} must be {usage.syntax(kind)}")))


class NodeUsage(Model):
    """What each node uses itself (kubelet, system daemons), before its pods."""

    cpu: Annotated[str, _profile("cpu", "usage.node.cpu")] = "100m"
    """CPU in cores, or a profile such as sine(100m, 300m, 10m)."""
    memory: Annotated[str, _profile("memory", "usage.node.memory")] = "1Gi"
    """Memory (working set) in bytes, or a profile."""


class PodUsage(Model):
    """What a pod uses when its annotations do not say (fakefleet.dev/usage-cpu,
    fakefleet.dev/usage-memory), split over its containers by their requests."""

    cpu: Annotated[str, _profile("cpu", "usage.pod.cpu")] = "1m"
    """CPU in cores, or a profile such as ramp(100m, 1, 2m)."""
    memory: Annotated[str, _profile("memory", "usage.pod.memory")] = "1Mi"
    """Memory (working set) in bytes, or a profile."""


class GPUUsage(Model):
    """How busy a GPU held by a running pod is when the pod's annotations do not say
    (fakefleet.dev/usage-gpu-util, fakefleet.dev/usage-gpu-memory); a GPU no pod holds idles."""

    utilization: Annotated[str, _profile("percent", "usage.gpu.utilization")] = "90"
    """DCGM_FI_DEV_GPU_UTIL in percent, or a profile such as sine(60, 100, 1m)."""
    memory: Annotated[str, _profile("percent", "usage.gpu.memory")] = "80"
    """Framebuffer in use, in percent of the GPU's memory, or a profile."""


class UsageSpec(Model):
    """Simulated usage: what the engine serves as each node's kubelet resource metrics (read by
    metrics-server: kubectl top, HorizontalPodAutoscalers) and as DCGM GPU metrics. A pod's
    annotations override the pod and GPU defaults; a node reports its own usage plus its
    pods'."""

    node: NodeUsage = Field(default_factory=NodeUsage,
                            json_schema_extra={"default": NodeUsage().model_dump(mode="json")})
    """The node's own usage."""
    pod: PodUsage = Field(default_factory=PodUsage,
                          json_schema_extra={"default": PodUsage().model_dump(mode="json")})
    """A pod's usage when its annotations do not say."""
    gpu: GPUUsage = Field(default_factory=GPUUsage,
                          json_schema_extra={"default": GPUUsage().model_dump(mode="json")})
    """A held GPU's usage when its pod's annotations do not say."""


class FakeNodePoolSpec(Model):
    """Desired state of a FakeNodePool."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        DRA_CAPACITY_RULE, *PROVISIONER_RULES)}

    clusterRef: str = Field(
        min_length=1, max_length=MAX_CLUSTER_NAME_LENGTH, json_schema_extra=validations(
            CLUSTER_REF_RULE,
            immutable("clusterRef is immutable: create a new pool in the other cluster instead"),
        ))
    """Name of the FakeCluster (same namespace) the nodes belong to; engines list their pools
    with fieldSelector=spec.clusterRef=<name>."""
    replicas: int = Field(default=1, ge=0, le=MAX_NODES_PER_CLUSTER)
    """Number of nodes, at most 32768: each node gets a /24 pod CIDR of 10.128.0.0/9, which
    holds 32768 of them; the pools of one cluster share that limit. Not used with
    provisioner karpenter (it cannot be changed there: Karpenter decides)."""
    provisioner: Provisioner | None = None
    """Who makes the nodes. Absent: the engine makes spec.replicas of them. 'karpenter': the
    cluster's Karpenter (spec.addons.karpenter) makes them for pods that wait, from the
    NodePool and KWOKNodeClass of the pool's name that fakefleet writes into the cluster (the
    pool's GPU preset, labels, taints and zones; an instance type of the preset's size), and
    deletes them when consolidation finds them empty; the engine plays each node Karpenter
    makes (Ready, Lease, pods, usage, faults) and never makes or deletes one. Immutable."""
    template: NodeTemplate = Field(
        default_factory=NodeTemplate,
        json_schema_extra={"default": NodeTemplate().model_dump(mode="json")})
    """What every node looks like."""
    gpu: GPUSpec | None = None
    """GPUs on every node (optional)."""
    topology: TopologySpec = Field(
        default_factory=TopologySpec,
        json_schema_extra={"default": TopologySpec().model_dump(mode="json")})
    """Spread over zones and racks."""
    leaseDurationSeconds: int = Field(default=40, ge=10, le=3600)
    """Node lease duration; leases are renewed every quarter of it, as the kubelet does."""
    pods: PodBehaviour = Field(
        default_factory=PodBehaviour,
        json_schema_extra={"default": PodBehaviour().model_dump(mode="json")})
    """Default timing of the pods that run on the pool's nodes."""
    usage: UsageSpec = Field(
        default_factory=UsageSpec,
        json_schema_extra={"default": UsageSpec().model_dump(mode="json")})
    """Simulated CPU, memory and GPU usage of the pool's nodes and of the pods on them."""

    @property
    def engine_replicas(self) -> int:
        """How many nodes the engine itself makes (none when a provisioner does)."""
        return 0 if self.provisioner else self.replicas

    @property
    def gpus_per_node(self) -> int:
        if self.gpu is None:
            return 0
        return self.gpu.count or PRESETS[self.gpu.preset].gpus_per_node

    @property
    def publishes_devices(self) -> bool:
        """The nodes offer their GPUs through DRA (a ResourceSlice each)."""
        return self.gpu is not None and self.gpu.allocation != "extended"

    def node_capacity(self) -> dict[str, str]:
        """What each node of the pool has (and offers: allocatable is the same)."""
        capacity = {key: str(value) for key, value in self.template.capacity.items()}
        if self.gpu is not None and self.gpu.allocation != "dra":
            capacity["nvidia.com/gpu"] = str(self.gpus_per_node)
        return capacity


#: The condition a pool's engine sets True while a Lease renewal gap of its nodes passed 3/4 of
#: the node-lifecycle controller's grace (37.5 s of 50 s; its FakeCluster's
#: spec.controlPlane.nodeMonitorGracePeriod if set), with the gap measured and its node;
#: False once every renewal is within that again. Absent while its engine never found it so (an
#: engine that starts again measures anew, the gap across its restart included).
HEARTBEATS_AT_RISK = "HeartbeatsAtRisk"


class FakeNodePoolStatus(Model):
    """Observed state of a FakeNodePool."""

    replicas: int = 0
    """Nodes that exist."""
    readyReplicas: int = 0
    """Nodes that are Ready."""
    selector: str = ""
    """Label selector of the pool's nodes (for the scale subresource)."""
    observedGeneration: int = 0
    """The metadata.generation the status describes."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Reconciling, Stalled; HeartbeatsAtRisk once its engine found Lease renewals
    late (True while a renewal gap passes 3/4 of the node-lifecycle controller's grace)."""


class FakeNodePool(CustomResource):
    """A group of fake nodes in a FakeCluster; scalable with kubectl scale."""

    resource = ResourceInfo(
        kind="FakeNodePool",
        plural="fakenodepools",
        short_names=("fnp",),
        printer_columns=(
            PrinterColumn("Cluster", ".spec.clusterRef"),
            PrinterColumn("Desired", ".spec.replicas", "integer"),
            PrinterColumn("Nodes", ".status.replicas", "integer"),
            PrinterColumn("Ready", ".status.readyReplicas", "integer"),
            PrinterColumn("GPU", ".spec.gpu.preset"),
            PrinterColumn("Provisioner", ".spec.provisioner"),
            PrinterColumn("Allocation", ".spec.gpu.allocation", priority=1),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
        scale=True,
        rules=(NAME_RULE,),
        selectable_fields=(".spec.clusterRef",),
    )
    kind: str = "FakeNodePool"
    spec: FakeNodePoolSpec
    status: FakeNodePoolStatus | None = None
