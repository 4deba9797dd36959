"""FaultPlan: scheduled, seeded, recoverable faults in the fleet, and expectations on how the
system under test reacts to them.

A plan is a list of steps. Each step picks its victims (``target``), says what happens to them
(``fault``), when (``at`` or ``after``, ``delay``, ``jitter``, ``repeat``) and for how long
(``duration``, then recovery), and optionally what must become true within a deadline after
each injection (``expectations``)::

    spec:
      seed: 7
      steps:
      - name: xid
        target:
          clusters: {names: [west]}
          nodes: {pools: [h100]}
          mode: percent
          percent: 2
        fault: {type: GPUXid, xid: 79}
        at: 30s
        duration: 5m
        expectations:
        - name: tainted
          within: 60s
          objects: {kind: Node, victims: true}
          taint: {key: fakefleet.dev/gpu-xid}

``startAt`` fixes the plan's time zero and ``clusters`` narrows every step to some
FakeClusters: a fleet-wide run through the federation hub gives each member a copy with the same
``startAt`` and that member's name in ``clusters``, so the members keep one clock and each copy
hits only its own cluster.

Everything the API server can check, it checks (schema, enums, CEL): a bad plan is refused
when it is applied, with the field named, never accepted and left Pending.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from operators.api.base import Condition, CustomResource, Model, PrinterColumn, ResourceInfo
from operators.api.durations import DURATION_LENGTH, DURATION_PATTERN
from operators.api.injections import TRACEPARENT_PATTERN, HubDirection
from operators.api.names import rule, validations
from operators.api.nodepools import Taint
from primitives.names import LABEL_VALUE_MAX_LENGTH, QUALIFIED_NAME_MAX_LENGTH

#: Bounds on every list: they bound the cost of the CEL rules over them, and no plan needs more.
MAX_STEPS = 20
MAX_AFTER = 4
MAX_NAMES = 100
MAX_VALUES = 16
MAX_EXPECTATIONS = 10
#: Occurrences of all steps together (repeat.times summed): each is recorded in the status.
MAX_OCCURRENCES = 200
MAX_EXPRESSION_LENGTH = 1024
STEP_NAME_LENGTH = 63

Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=DURATION_LENGTH)]
"""A duration such as 90s, 1m30s, 500ms or 2h."""
StepName = Annotated[str, Field(
    min_length=1, max_length=STEP_NAME_LENGTH, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
ObjectName = Annotated[str, Field(min_length=1, max_length=253)]
#: An RFC 3339 time such as 2030-01-02T15:04:05Z (Kubernetes' metav1.Time, optionally with a
#: fraction and an offset). A pattern, not a CEL rule: it costs nothing of the CEL budget.
TIME_PATTERN = (r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
                r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?"
                r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")

FaultType = Literal[
    # nodes
    "NotReady", "Unreachable", "Condition", "GPUXid", "Delete", "Cordon", "Taint",
    # pods
    "ContainerExit", "OOMKilled", "CrashLoop", "StuckPending", "Evict",
    # the cluster's control plane
    "APIServerDown", "SchedulerDown", "ControllerManagerDown", "APIServerSlow",
    # the cluster's link to its federation hub
    "HubPartition", "HubLatency",
]
NODE_FAULTS = ("NotReady", "Unreachable", "Condition", "GPUXid", "Delete", "Cordon", "Taint")
POD_FAULTS = ("ContainerExit", "OOMKilled", "CrashLoop", "StuckPending", "Evict")
CLUSTER_FAULTS = ("APIServerDown", "SchedulerDown", "ControllerManagerDown", "APIServerSlow",
                  "HubPartition", "HubLatency")
#: Faults that happen once and are over (a container exits): they have nothing to recover.
INSTANT_FAULTS = ("ContainerExit", "OOMKilled", "Evict")


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


# -- targets -----------------------------------------------------------------------------------

#: Label syntax as patterns, not CEL rules: a pattern costs nothing of the CRD's CEL budget, and
#: selectors sit deep in lists (steps, expectations) where every rule's cost multiplies.
LabelKey = Annotated[str, Field(min_length=1, max_length=QUALIFIED_NAME_MAX_LENGTH, pattern=(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"))]
LabelValue = Annotated[str, Field(max_length=LABEL_VALUE_MAX_LENGTH,
                                  pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")]


class Requirement(Model):
    """A label selector requirement, as in Kubernetes."""

    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = Field(default_factory=list, max_length=MAX_VALUES)


class LabelSelector(Model):
    """matchLabels and matchExpressions, all of which must hold; empty selects everything."""

    matchLabels: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_VALUES)
    matchExpressions: list[Requirement] = Field(default_factory=list, max_length=MAX_VALUES)


class ClusterTarget(Model):
    """Which FakeClusters (in the plan's namespace): by name, or by a selector over their
    spec.labels; neither: all of them."""

    model_config = Model.model_config | {"json_schema_extra": validations(rule(
        "!(has(self.names) && size(self.names) > 0 && has(self.selector))",
        "give clusters.names or clusters.selector, not both"))}

    names: list[ObjectName] = Field(default_factory=list, max_length=MAX_NAMES)
    """FakeCluster names."""
    selector: LabelSelector | None = None
    """A selector over the FakeClusters' spec.labels."""


class NodeTarget(Model):
    """Nodes of the chosen clusters; every condition given must hold."""

    pools: list[ObjectName] = Field(default_factory=list, max_length=MAX_NAMES)
    """FakeNodePool names (their nodes carry fakefleet.dev/pool)."""
    selector: LabelSelector | None = None
    """A selector over the nodes' labels."""
    names: list[ObjectName] = Field(default_factory=list, max_length=MAX_NAMES)
    """Node names."""


class PodTarget(Model):
    """Pods of the chosen clusters; every condition given must hold."""

    namespace: Annotated[str, Field(max_length=63)] = ""
    """Only pods in this namespace (empty: any)."""
    selector: LabelSelector | None = None
    """A selector over the pods' labels."""
    ownerKind: Annotated[str, Field(max_length=63)] = ""
    """Only pods whose controller is of this kind (Job, ReplicaSet, StatefulSet, ...)."""
    ownerName: Annotated[str, Field(max_length=253)] = ""
    """Only pods whose controller has this name."""
    container: Annotated[str, Field(max_length=63)] = ""
    """Only pods with a container of this name."""


class Target(Model):
    """Which clusters, then within each nodes, pods or (neither) the cluster itself, and how many
    of them (per cluster; maxTargets caps the whole step)."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        rule("!(has(self.nodes) && has(self.pods))",
             "give target.nodes or target.pods, not both: use two steps to hit both"),
        rule("self.mode != 'fixed' || has(self.count)",
             "mode fixed needs target.count, the number of victims per cluster",
             field_path=".count"),
        rule("self.mode != 'percent' || has(self.percent)",
             "mode percent needs target.percent, from 1 to 100", field_path=".percent"),
        rule("!has(self.count) || self.mode == 'fixed'",
             "target.count is for mode fixed: set mode: fixed or remove count",
             field_path=".count"),
        rule("!has(self.percent) || self.mode == 'percent'",
             "target.percent is for mode percent: set mode: percent or remove percent",
             field_path=".percent"),
    )}

    clusters: ClusterTarget = Field(default_factory=ClusterTarget)
    """Which FakeClusters; default: all in the plan's namespace."""
    nodes: NodeTarget | None = None
    """Hit nodes of those clusters (node faults)."""
    pods: PodTarget | None = None
    """Hit pods of those clusters (pod faults)."""
    mode: Literal["one", "all", "fixed", "percent"] = "all"
    """How many of the matching objects of each cluster: one, all, a fixed count, or a percent
    (rounded up: 2 % of 10 nodes is one node)."""
    count: int | None = Field(default=None, ge=1, le=100_000)
    """For mode fixed: victims per cluster."""
    percent: int | None = Field(default=None, ge=1, le=100)
    """For mode percent: 1 to 100."""
    maxTargets: int | None = Field(default=None, ge=1, le=100_000)
    """At most this many victims in the whole step (the blast radius of one injection)."""


# -- faults ------------------------------------------------------------------------------------

class FaultCondition(Model):
    """A node condition the fault sets, e.g. KernelDeadlock as Node Problem Detector reports it."""

    type: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z][A-Za-z0-9]*$")]
    status: Literal["True", "False", "Unknown"] = "True"
    reason: Annotated[str, Field(max_length=128)] = ""
    message: Annotated[str, Field(max_length=1024)] = ""


class FaultGPU(Model):
    """What a Condition fault does to the node's GPUs, as DCGM reports them."""

    model_config = Model.model_config | {"json_schema_extra": validations(rule(
        "has(self.temperature) || has(self.smClock)",
        "fault.gpu needs temperature or smClock (or both), e.g. {temperature: 92, smClock: 1005}"
    ))}

    temperature: int | None = Field(default=None, ge=0, le=150)
    """DCGM_FI_DEV_GPU_TEMP the GPUs report while the fault lasts (degrees C), e.g. 92."""
    smClock: int | None = Field(default=None, ge=0, le=5000)
    """DCGM_FI_DEV_SM_CLOCK the GPUs run at while the fault lasts (MHz), e.g. 1005."""


_PARAMETERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reason", ("NotReady", "ContainerExit", "StuckPending", "Evict")),
    ("message", ("NotReady", "ContainerExit", "CrashLoop", "StuckPending", "Evict", "GPUXid")),
    ("condition", ("Condition",)),
    ("xid", ("GPUXid",)),
    ("gpus", ("GPUXid", "Condition")),
    ("gpu", ("Condition",)),
    ("taint", ("Taint",)),
    ("exitCode", ("ContainerExit", "CrashLoop")),
    ("latency", ("APIServerSlow", "HubLatency")),
    ("direction", ("HubPartition",)),
)


class Fault(Model):
    """What happens to each victim. Node faults: NotReady, Unreachable, Condition, GPUXid,
    Delete, Cordon, Taint. Pod faults: ContainerExit, OOMKilled, CrashLoop, StuckPending, Evict.
    Cluster faults: APIServerDown, SchedulerDown, ControllerManagerDown, APIServerSlow (the
    control plane); HubPartition, HubLatency (the cluster's link to its federation hub)."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        rule("self.type != 'Condition' || has(self.condition)",
             "fault type Condition needs fault.condition (type, status, reason, message)",
             field_path=".condition"),
        rule("self.type != 'GPUXid' || has(self.xid)",
             "fault type GPUXid needs fault.xid, a positive Xid code such as 79",
             field_path=".xid"),
        rule("self.type != 'Taint' || has(self.taint)",
             "fault type Taint needs fault.taint (key, value, effect)", field_path=".taint"),
        rule("self.type != 'APIServerSlow' || has(self.latency)",
             "fault type APIServerSlow needs fault.latency, e.g. 500ms",
             field_path=".latency"),
        rule("self.type != 'HubLatency' || has(self.latency)",
             "fault type HubLatency needs fault.latency, e.g. 500ms", field_path=".latency"),
        rule("self.type != 'ContainerExit' || has(self.exitCode)",
             "fault type ContainerExit needs fault.exitCode, e.g. 3", field_path=".exitCode"),
        rule("self.type != 'StuckPending' || !has(self.reason) || "
             "self.reason in ['ContainerCreating', 'ImagePullBackOff', 'ErrImagePull', "
             "'CreateContainerConfigError']",
             "StuckPending's reason is one of the kubelet's: ContainerCreating, "
             "ImagePullBackOff, ErrImagePull or CreateContainerConfigError",
             field_path=".reason"),
        *(rule(f"!has(self.{field}) || self.type in {_cel_list(types)}",
               f"fault.{field} is for fault type {' or '.join(types)} only: remove it or "
               f"change the type", field_path=f".{field}")
          for field, types in _PARAMETERS),
    )}

    type: FaultType
    """The fault; see the fault catalogue in docs/faults.md."""
    reason: Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9]*$")] | None = None
    """NotReady: the Ready condition's reason (default KubeletNotReady); ContainerExit: the
    container's terminated reason (default Error); StuckPending: the waiting reason
    (default ContainerCreating); Evict: the pod's reason (default Evicted)."""
    message: Annotated[str, Field(max_length=1024)] | None = None
    """The message that goes with it (the condition's, the container's or the pod's)."""
    condition: FaultCondition | None = None
    """Condition: the node condition to set."""
    xid: int | None = Field(default=None, ge=1, le=65535)
    """GPUXid: the Xid code (a positive integer). Codes that need a GPU reset or a drain (48,
    63, 64, 74, 79, 92, 94, 95, 119, 120) also take GPUs out of allocatable and taint the node;
    13, 31, 43, 45 and unknown codes only signal."""
    gpus: int | None = Field(default=None, ge=1, le=16)
    """GPUXid: how many of the node's GPUs fail (default 1); Condition: how many of them
    fault.gpu affects (default all). Always the first ones by index: GPUs 0 to gpus-1."""
    gpu: FaultGPU | None = None
    """Condition: the temperature or SM clock the node's GPUs report while it lasts (a
    thermal slowdown, say), in DCGM_FI_DEV_GPU_TEMP and DCGM_FI_DEV_SM_CLOCK."""
    taint: Taint | None = None
    """Taint: the taint to add."""
    exitCode: int | None = Field(default=None, ge=1, le=255)
    """ContainerExit: the code the containers exit with; CrashLoop: the code of every crash
    (default 1)."""
    latency: Duration | None = None
    """APIServerSlow: added to every write the cluster's engine makes (node and pod status,
    Leases, Events), as a slow or overloaded API server would answer them. HubLatency: added to
    every message between the cluster and its hub, each way (so twice to a round trip)."""
    direction: HubDirection | None = None
    """HubPartition: which way the link drops messages: both (default), toHub (what the
    cluster sends is lost) or fromHub (what the hub sends is lost)."""


# -- expectations ------------------------------------------------------------------------------

class ObjectsRef(Model):
    """The objects an expectation looks at: of one kind, in each cluster the step targets (or
    in the host cluster)."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        rule("!self.onVictimNodes || self.kind == 'Pod'",
             "objects.onVictimNodes is for kind Pod (pods on the nodes the fault hit)",
             field_path=".onVictimNodes"),
        rule("!self.offVictimNodes || self.kind == 'Pod'",
             "objects.offVictimNodes is for kind Pod (pods off the nodes the fault hit)",
             field_path=".offVictimNodes"),
        rule("!(self.onVictimNodes && self.offVictimNodes)",
             "give objects.onVictimNodes or objects.offVictimNodes, not both",
             field_path=".offVictimNodes"),
        rule("self.cluster == 'member' || !(self.victims || self.onVictimNodes || "
             "self.offVictimNodes)",
             "victims, onVictimNodes and offVictimNodes are member objects: set "
             "objects.cluster: member", field_path=".cluster"),
    )}

    apiVersion: Annotated[str, Field(min_length=1, max_length=253)] = "v1"
    """The objects' apiVersion, e.g. v1 or batch/v1."""
    kind: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Z][A-Za-z0-9]*$")]
    """The objects' kind, e.g. Node, Pod, Job."""
    namespace: Annotated[str, Field(max_length=63)] = ""
    """Only objects in this namespace (empty: all namespaces)."""
    name: Annotated[str, Field(max_length=253)] = ""
    """Only the object of this name."""
    selector: LabelSelector | None = None
    """Only objects whose labels match."""
    victims: bool = False
    """Only the objects the fault hit."""
    onVictimNodes: bool = False
    """Pods only: only pods on the nodes the fault hit."""
    offVictimNodes: bool = False
    """Pods only: only pods not on the nodes the fault hit (where they were rescheduled)."""
    cluster: Literal["member", "host"] = "member"
    """Look in each member cluster the step targets, or in the host cluster."""


class FieldMatcher(Model):
    path: Annotated[str, Field(min_length=1, max_length=256)]
    """A dotted path; ['key.with.dots'] for map keys, [N] for list items, [field=value] for the
    first list item whose field has that value, e.g. spec.taints[key=nvidia.com/gpu].effect."""
    equals: Annotated[str, Field(max_length=1024)]
    """The value as text ("8", "true", "Running")."""


class ConditionMatcher(Model):
    type: Annotated[str, Field(min_length=1, max_length=63)]
    status: Literal["True", "False", "Unknown"] = "True"
    reason: Annotated[str, Field(max_length=128)] = ""


class TaintMatcher(Model):
    key: LabelKey
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class Where(Model):
    """Which of the picked objects a count counts: one matcher."""

    model_config = Model.model_config | {"json_schema_extra": validations(rule(
        "[has(self.field), has(self.condition), has(self.taint), has(self.cel)]"
        ".filter(x, x).size() == 1",
        "count.where takes exactly one of field, condition, taint or cel"))}

    field: FieldMatcher | None = None
    condition: ConditionMatcher | None = None
    taint: TaintMatcher | None = None
    cel: Annotated[str, Field(min_length=1, max_length=MAX_EXPRESSION_LENGTH)] | None = None
    """A CEL expression over the object (named self), e.g. self.status.phase == 'Running'."""


class CountMatcher(Model):
    model_config = Model.model_config | {"json_schema_extra": validations(rule(
        "has(self.equals) || has(self.atLeast) || has(self.atMost)",
        "count needs equals, atLeast or atMost"))}

    where: Where | None = None
    """Count only the objects this matcher accepts (default: every picked object)."""
    equals: int | None = Field(default=None, ge=0)
    atLeast: int | None = Field(default=None, ge=0)
    atMost: int | None = Field(default=None, ge=0)


class Expectation(Model):
    """What must become true within a deadline after each injection of the step. Field,
    condition, taint and cel hold when at least one object is picked and all picked objects
    match; count holds on the number of objects."""

    model_config = Model.model_config | {"json_schema_extra": validations(rule(
        "[has(self.field), has(self.condition), has(self.taint), has(self.count), "
        "has(self.cel)].filter(x, x).size() == 1",
        "an expectation takes exactly one matcher: field, condition, taint, count or cel"))}

    name: StepName
    within: Duration
    """The deadline after the injection, e.g. 60s. Required: an expectation without one could
    never fail."""
    objects: ObjectsRef
    field: FieldMatcher | None = None
    condition: ConditionMatcher | None = None
    taint: TaintMatcher | None = None
    count: CountMatcher | None = None
    cel: Annotated[str, Field(min_length=1, max_length=MAX_EXPRESSION_LENGTH)] | None = None
    """A CEL expression over each object (named self), e.g.
    self.status.succeeded >= 8."""


# -- steps and the plan ------------------------------------------------------------------------

class Repeat(Model):
    every: Duration
    """Time between occurrences (each picks new victims)."""
    times: int = Field(ge=1, le=MAX_OCCURRENCES)
    """How many occurrences in all."""


class Step(Model):
    """One fault, its victims, its timing and what must follow."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        rule("has(self.at) != (has(self.after) && size(self.after) > 0)",
             "give exactly one of at (an offset from the plan's start, e.g. 30s) and after "
             "(names of steps that must have finished)"),
        rule("!(self.fault.type in " + _cel_list(CLUSTER_FAULTS)
             + ") || (!has(self.target.nodes) && !has(self.target.pods))",
             "a cluster fault (control plane or hub link) targets clusters: remove "
             "target.nodes and target.pods", field_path=".target"),
        rule("!(self.fault.type in " + _cel_list(NODE_FAULTS) + ") || has(self.target.nodes)",
             "a node fault needs target.nodes (use {} for all nodes of the clusters)",
             field_path=".target"),
        rule("!(self.fault.type in " + _cel_list(POD_FAULTS) + ") || has(self.target.pods)",
             "a pod fault needs target.pods (use {} for all pods of the clusters)",
             field_path=".target"),
        rule("!(self.fault.type in " + _cel_list(INSTANT_FAULTS) + ") || !has(self.duration)",
             "this fault happens once and has nothing to recover: remove duration",
             field_path=".duration"),
    )}

    name: StepName
    """Unique in the plan; other steps' after names it."""
    target: Target
    fault: Fault
    at: Duration | None = None
    """When to inject, from the plan's start (give at or after)."""
    after: list[StepName] = Field(default_factory=list, max_length=MAX_AFTER,
                                  json_schema_extra={"x-kubernetes-list-type": "set"})
    """Inject once these steps have finished (recovered, or injected if they have no
    duration); they must be listed before this step."""
    delay: Duration = "0s"
    """Added to at or after."""
    jitter: Duration = "0s"
    """Up to this much more, drawn from the plan's seed."""
    duration: Duration | None = None
    """Recover this long after the injection; without it the fault stays until the plan is
    deleted."""
    repeat: Repeat | None = None
    """Inject again every so often (new victims each time)."""
    expectations: list[Expectation] = Field(
        default_factory=list, max_length=MAX_EXPECTATIONS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """What must become true after each injection, within its deadline."""


class FaultPlanSpec(Model):
    """Desired state of a FaultPlan. Immutable once created: delete and re-create to change."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        rule("self.steps.all(s, !has(s.after) || s.after.all(a, "
             "self.steps.exists(t, t.name == a)))",
             "a step's after names a step that does not exist: after takes names of steps "
             "of this plan",
             field_path=".steps"),
        rule("!self.steps.exists(s, has(s.after) && (s.name in s.after || self.steps.exists("
             "t, has(t.after) && t.name in s.after && s.name in t.after)))",
             "steps wait for each other in a cycle (a step's after names itself, or two steps "
             "name each other): remove one of the names",
             field_path=".steps"),
        rule(f"self.steps.map(s, has(s.repeat) ? s.repeat.times : 1).sum() <= {MAX_OCCURRENCES}",
             f"the steps have more than {MAX_OCCURRENCES} occurrences in all (repeat.times "
             f"summed over the steps): each is recorded in the plan's status; use fewer "
             f"repeats, or split the plan", field_path=".steps"),
        rule("self == oldSelf", "spec is immutable: delete the FaultPlan and apply it again"),
    )}

    seed: int = Field(default=0, ge=0, le=2**53)
    """Seed of every random choice (victims, jitter): the same seed and fleet give the same
    victims at the same times."""
    steps: list[Step] = Field(
        min_length=1, max_length=MAX_STEPS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """The steps, at most 20; names unique."""
    startAt: str | None = Field(default=None, max_length=64, pattern=TIME_PATTERN)
    """The plan's time zero, an RFC 3339 time such as 2030-01-02T15:04:05Z: at and repeat
    count from here. Default: when the operator first runs the plan. A fleet-wide run gives
    every member the same startAt, so that all members keep one clock; steps already due when
    the plan starts (a startAt in the past) run at once."""
    clusters: list[ObjectName] = Field(default_factory=list, max_length=MAX_NAMES,
                                       json_schema_extra={"x-kubernetes-list-type": "set"})
    """Only these FakeClusters (of the plan's namespace) take the plan's faults: every step's
    target is narrowed to them, and a step that selects none of them is Skipped. Empty: no
    restriction. A fleet-wide run names the one member each copy of the plan runs for, so that
    members on one host each run their own copy without touching each other."""


# -- status ------------------------------------------------------------------------------------

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Aborted"]


class ExpectationStatus(Model):
    name: str
    outcome: Literal["Pending", "Passed", "Failed"] = "Pending"
    latencySeconds: float | None = None
    """From the injection to the first time it held (Passed), or the deadline (Failed)."""
    message: str = ""


class InjectionStatus(Model):
    """One occurrence of one step, as planned and as done."""

    step: str
    occurrence: int = 0
    state: Literal["Scheduled", "Injected", "Recovering", "Recovered", "Done",
                   "Skipped"] = "Scheduled"
    """Scheduled, Injected (fault in place), Recovering (undoing it), Recovered, Done (an
    instant fault such as a container exit happened), Skipped (nothing matched the target)."""
    injectAt: float | None = None
    """Planned injection, seconds after the plan's start (None: waits for steps in after)."""
    recoverAt: float | None = None
    """Planned recovery, seconds after the plan's start (None: when the plan is deleted)."""
    injectedAt: str = ""
    """When the fault was in place in every victim (RFC 3339)."""
    recoveredAt: str = ""
    """When every victim was recovered (RFC 3339)."""
    targets: list[str] = Field(default_factory=list)
    """The victims, as cluster/Kind/namespace/name; empty when they are listed apart (see
    targetsRef)."""
    targetCount: int = 0
    """How many victims were chosen (exact, also when they are listed apart)."""
    targetsRef: str = ""
    """The ConfigMap (in the plan's namespace, owned by the plan) that lists the victims when
    they would not fit in the status: gzipped lines under binaryData targets.gz."""
    expectations: list[ExpectationStatus] = Field(default_factory=list)
    message: str = ""
    """What went wrong with a victim, if anything."""


class FaultPlanStatus(Model):
    """Observed state of a FaultPlan: its schedule and what was done."""

    phase: Phase = "Pending"
    startedAt: str = ""
    """The plan's time zero (RFC 3339): spec.startAt, or when the operator first ran the plan;
    at and repeat count from here."""
    stepsDone: str = ""
    """Steps finished / steps, e.g. 3/5."""
    verdict: Literal["", "Passed", "Failed"] = ""
    """Passed when every expectation passed; Failed as soon as one failed."""
    injections: list[InjectionStatus] = Field(default_factory=list)
    observedGeneration: int = 0
    conditions: list[Condition] = Field(default_factory=list)
    """Ready (the plan finished), Reconciling, Stalled."""
    traceId: str = Field(default="", pattern=r"^([0-9a-f]{32})?$")
    """The plan's trace (W3C trace id): everything the plan caused, in every cluster;
    'fakefleet trace show ID' prints it."""
    traceparent: str = Field(default="", pattern=f"^({TRACEPARENT_PATTERN[1:-1]})?$")
    """The W3C trace context of the span that started the plan: every later span of the plan
    is its child, so an operator restarted mid-plan carries on in the same trace."""


class FaultPlan(CustomResource):
    """Scheduled, seeded, recoverable faults in FakeClusters, with verdicts on how the system
    under test reacted."""

    resource = ResourceInfo(
        kind="FaultPlan",
        plural="faultplans",
        short_names=("fp",),
        printer_columns=(
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Steps", ".status.stepsDone"),
            PrinterColumn("Verdict", ".status.verdict"),
            PrinterColumn("Trace", ".status.traceId", priority=1),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )
    kind: str = "FaultPlan"
    spec: FaultPlanSpec
    status: FaultPlanStatus | None = None
