"""Stages: how fake pods and nodes live, as data, in the spirit of KWOK's Stage kind.

A stage is *selector* (which objects, in which phase) + *delay* (fixed, jitter, or a named
timer such as the pod's run time) + *effect* (next phase, container exit with code, reason and
message, conditions, Events, heartbeat on or off). The engine keeps, for every object, the first
stage whose selector matches; when its delay has passed, the effect is written to the API, and
the next stage is chosen from the new state. A stage that still matches after its effect fires
again (the node status report every 5 minutes)::

    - name: pod-complete
      resource: Pod
      selector:
        phases: [Running]
        matchExpressions:
        - {key: deleting, operator: In, values: ["false"]}
        - {key: finite, operator: In, values: ["true"]}
      delay: {source: runTime}
      effect: {exit: {}}          # the pod's own exit code; restartPolicy decides the phase

The default lifecycles are ``operators/engine/stages.yaml``; ``python -m operators.engine
--stages FILE`` runs others. Everything is validated on load, and every error names the stage,
the field, the value and what would be accepted.

Faults bring stages of their own, per object (:mod:`operators.api.injections`): they come
before the lifecycle's, and only they may end their fault (``endFault``); either may ``hold``.

The same document may say what ``kubectl logs`` shows: a ``logs`` section of log scripts
(:mod:`operators.api.logs`), each with a name and a pod selector; the first that matches a pod
and names the container is its script (the pod's annotation ``fakefleet.dev/logs`` before
them; none: an empty log)::

    logs:
    - name: trainer
      selector:
        matchExpressions:
        - {key: "labels[app]", operator: In, values: [trainer]}
      start: ["starting on {gpus} GPU(s)"]
      every: {interval: 30s, lines: ["step {n}: loss {rand:1..9}"]}

It also says what a fake container answers: ``exec`` (what a command exec'd into it
prints and exits with) and ``portForward`` (what a forwarded port answers), each a list matched
first to last, with the pod's annotations ``fakefleet.dev/exec`` and
``fakefleet.dev/port-forward`` (lists in the same schema) before them::

    exec:
    - name: nvidia-smi-list
      selector: {matchExpressions: [{key: gpus, operator: NotIn, values: ["0"]}]}
      command: [nvidia-smi, -L]
      stdout: "{nvidiaSmiL}"
    portForward:
    - {name: api, ports: [8000], http: {contentType: application/json, body: '{"ok":true}'}}
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from operators.api.base import Model
from operators.api.durations import DURATION_LENGTH, DURATION_PATTERN
from operators.api.logs import LogLines

Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=DURATION_LENGTH)]
PodPhase = Literal["Pending", "Initializing", "Running", "BackOff", "Succeeded", "Failed"]

#: What a pod selector may test; values compare as strings ("true"/"false" for flags).
POD_FIELDS: dict[str, str] = {
    "name": "the pod's name",
    "namespace": "the pod's namespace",
    "deleting": "the pod has a deletionTimestamp",
    "initPending": "init containers remain to complete",
    "finite": "the pod has a run time: annotation fakefleet.dev/run-time, or a Job owns it",
    "job": "a Job owns the pod",
    "ownerKind": "the kind of the pod's controller (ReplicaSet, Job, ...)",
    "exitCode": "the code its containers exit with (annotation fakefleet.dev/exit-code, else 0)",
    "restartPolicy": "Always, OnFailure or Never",
    "waiting": "the reason the containers wait with, as a stage set it (empty: not waiting)",
    "restarts": "how often the containers restarted (the status's restartCount)",
    "claimsPrepared": "its ResourceClaims (DRA) are reserved for it, as the kubelet checks "
                      "before it starts a pod: true when it uses none, unset until the engine "
                      "has looked",
}
#: What a node selector may test.
NODE_FIELDS: dict[str, str] = {
    "name": "the node's name",
    "pool": "the FakeNodePool the node belongs to",
    "ready": "the Ready condition as the API shows it: True, False or Unknown",
    "heartbeat": "whether the node renews its Lease and reports status",
    "unschedulable": "spec.unschedulable: true or false",
}
#: Keys of the form ``labels[KEY]`` and ``annotations[KEY]`` test metadata of either kind;
#: for nodes ``conditions[TYPE]`` is a condition's status and ``taints[KEY]`` a taint's effect,
#: ``allocatable[RESOURCE]`` an allocatable amount as the API shows it.
MAP_FIELDS = ("labels", "annotations")
NODE_MAP_FIELDS = ("conditions", "taints", "allocatable")

#: Named timers a delay may add, with where their value comes from.
DELAY_SOURCES: dict[str, str] = {
    "startDelay": "annotation fakefleet.dev/start-delay, else the pool's startDelay, plus up to "
                  "the pool's startJitter",
    "initDelay": "the pool's initDelay",
    "runTime": "annotation fakefleet.dev/run-time, else the pool's jobRunTime plus up to its "
               "jobRunJitter",
    "crashLoopBackOff": "the kubelet's wait: none after a first exit, then 10 s doubling "
                        "to 300 s, from none again after 600 s of running",
    "gracePeriod": "the pod's deletion grace period, at most the pool's "
                   "terminationGracePeriodCap",
}


class StageError(ValueError):
    """Stages that cannot be used; the message names each problem and its place."""


class Requirement(Model):
    """One test of a field, as in a Kubernetes label selector's matchExpressions."""

    key: str = Field(min_length=1)
    """A field name (see POD_FIELDS / NODE_FIELDS), or labels[KEY] / annotations[KEY]."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """In/NotIn compare the field with values; Exists/DoesNotExist test that it is set."""
    values: list[str] = Field(default_factory=list)
    """For In and NotIn: the values to compare with."""

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> Requirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values, e.g. values: [\"true\"]")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values: remove them")
        return self

    def field(self) -> str:
        """The field name, with ``labels[KEY]``/``annotations[KEY]`` reduced to its map."""
        return self.key.split("[", 1)[0] if self.key.endswith("]") else self.key


class Selector(Model):
    """Which objects a stage applies to: all the expressions must hold."""

    phases: list[PodPhase] = Field(default_factory=list)
    """Pods only: the phases the stage applies in (empty: any phase)."""
    matchExpressions: list[Requirement] = Field(default_factory=list)
    """Tests of the object's fields, all of which must hold."""


class Delay(Model):
    """How long after the object entered its current state the effect happens."""

    duration: Duration = "0s"
    """A fixed part, e.g. 5m."""
    jitter: Duration = "0s"
    """Up to this much more, drawn per object from its seed (repeatable)."""
    source: Literal["startDelay", "initDelay", "runTime", "crashLoopBackOff",
                    "gracePeriod"] | None = None
    """A named timer added to the fixed part (see DELAY_SOURCES)."""
    since: Literal["transition", "deletion"] = "transition"
    """Measured from the object's last transition, or from when its deletion was asked."""


class Condition(Model):
    """A condition an effect sets (replacing one of the same type)."""

    type: str = Field(min_length=1)
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""


class Event(Model):
    """A Kubernetes Event an effect emits about the object."""

    type: Literal["Normal", "Warning"] = "Normal"
    reason: str = Field(min_length=1)
    message: str = ""


class ContainerExit(Model):
    """The pod's containers terminate; the kubelet's rules pick the phase: exit code 0 ends
    Succeeded, another code Failed under restartPolicy Never and CrashLoopBackOff otherwise."""

    exitCode: int | None = Field(default=None, ge=0, le=255)
    """None: the pod's own (annotation fakefleet.dev/exit-code, else 0)."""
    reason: str = ""
    """Default: Completed for code 0, Error otherwise (e.g. OOMKilled)."""
    message: str = ""
    """Shown in the container's terminated state."""


class ContainerWait(Model):
    """The pod's containers wait to start, e.g. ContainerCreating or ImagePullBackOff."""

    reason: str = Field(min_length=1)
    message: str = ""


class Eviction(Model):
    """The kubelet evicts the pod (node pressure): phase Failed, the pod's reason and message,
    its containers terminated, whatever its restartPolicy."""

    reason: str = "Evicted"
    message: str = "The node was low on resource: memory."


class PodEffect(Model):
    """What a pod stage does."""

    phase: Literal["Initializing", "Running"] | None = None
    """Running (re)starts the containers: IP, start times, Ready (readiness gates permitting)."""
    initContainerDone: bool = False
    """The next init container completes (a sidecar keeps running)."""
    exit: ContainerExit | None = None
    """The containers terminate."""
    wait: ContainerWait | None = None
    """The containers wait, with this reason (the pod stays Pending)."""
    conditions: list[Condition] = Field(default_factory=list)
    """Extra pod conditions, e.g. DisruptionTarget."""
    events: list[Event] = Field(default_factory=list)
    """Events about the pod, emitted once the effect is written."""
    delete: bool = False
    """Finalise a deleted pod: delete it with grace period 0, as the kubelet does."""
    evict: Eviction | None = None
    """The kubelet evicts the pod: Failed with reason Evicted."""
    hold: bool = False
    """Nothing happens while this stage matches, and no later stage applies: a fault keeps the
    pod where it put it (StuckPending). Takes no other outcome."""
    endFault: bool = False
    """Fault stages only: once the effect is written, the fault entry that carried this stage
    is marked done (see :mod:`operators.api.injections`)."""

    @model_validator(mode="after")
    def _one_outcome(self) -> PodEffect:
        outcomes = [name for name, set_ in (("phase", self.phase is not None),
                                            ("exit", self.exit is not None),
                                            ("wait", self.wait is not None),
                                            ("delete", self.delete),
                                            ("evict", self.evict is not None),
                                            ("hold", self.hold)) if set_]
        if len(outcomes) > 1:
            raise ValueError(f"an effect has one outcome, not {' and '.join(outcomes)}: "
                             f"split it into stages")
        if self.hold and (self.initContainerDone or self.conditions or self.events
                          or self.endFault):
            raise ValueError("hold does nothing by definition: it takes no other field")
        if not outcomes and not (self.initContainerDone or self.conditions or self.events
                                 or self.endFault):
            raise ValueError("the effect does nothing: set phase, exit, wait, delete, evict, "
                             "hold, initContainerDone, conditions, events or endFault")
        return self


class NodeTaint(Model):
    """A taint a node stage adds."""

    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


#: GPUs a node may have (a pool's gpu.count is at most this).
MAX_GPUS = 16


class GPUEffect(Model):
    """What a node stage does to some of the node's GPUs, as GPU telemetry (DCGM) and a GPU
    driver (the device plugin, DRA) see them. The engine keeps it with the node's life from the
    moment the stage is written until a stage resets those GPUs; after an engine restart it is
    read back from the fault entries the node still carries (in state inject or recover)."""

    indices: list[Annotated[int, Field(ge=0, lt=MAX_GPUS)]] = Field(
        min_length=1, max_length=MAX_GPUS)
    """The GPUs hit, by index on the node (0 to 15); indices the node does not have are
    ignored. GPUXid faults hit the first of the node's GPUs: indices 0 to gpus-1."""
    xid: int | None = Field(default=None, ge=1, le=65535)
    """An Xid the driver reported on them: DCGM_FI_DEV_XID_ERRORS shows it."""
    healthy: bool | None = None
    """False: out of service (the device plugin reports them unhealthy; a DRA driver takes
    their devices out) until a stage sets true or resets them."""
    temperature: int | None = Field(default=None, ge=0, le=150)
    """The temperature they report (DCGM_FI_DEV_GPU_TEMP, degrees C), busy or not."""
    smClock: int | None = Field(default=None, ge=0, le=5000)
    """The SM clock they run at (DCGM_FI_DEV_SM_CLOCK, MHz), e.g. throttled."""
    reset: bool = False
    """The GPUs are reset: no Xid, healthy, temperature and clocks their own again. Takes no
    other field."""

    @model_validator(mode="after")
    def _reset_alone(self) -> GPUEffect:
        changes = (self.xid is not None or self.healthy is not None
                   or self.temperature is not None or self.smClock is not None)
        if self.reset and changes:
            raise ValueError("reset restores everything of the GPUs: it takes no xid, healthy, "
                             "temperature or smClock")
        if not (self.reset or changes):
            raise ValueError("the GPU effect does nothing: set xid, healthy, temperature, "
                             "smClock or reset")
        return self


class NodeEffect(Model):
    """What a node stage does."""

    conditions: list[Condition] = Field(default_factory=list)
    """Node conditions to set (written to the node's status at once)."""
    heartbeat: bool | None = None
    """False: stop renewing the Lease and reporting status (the node-lifecycle controller then
    marks the node Unknown); True: resume."""
    reportStatus: bool = False
    """Rewrite the node's conditions with a fresh heartbeat time, as the kubelet does."""
    events: list[Event] = Field(default_factory=list)
    """Events about the node."""
    taints: list[NodeTaint] = Field(default_factory=list)
    """Taints to add (replacing one with the same key and effect); others' taints stay."""
    removeTaints: list[str] = Field(default_factory=list)
    """Keys of taints to remove (every effect)."""
    unschedulable: bool | None = None
    """Set spec.unschedulable: True cordons the node, False uncordons it."""
    allocatable: dict[str, str | None] = Field(default_factory=dict)
    """Resources whose allocatable changes, e.g. {"nvidia.com/gpu": "7"}; None: back to the
    node's capacity."""
    gpus: GPUEffect | None = None
    """What happens to some of the node's GPUs (an Xid, a thermal slowdown, a reset)."""
    hold: bool = False
    """Nothing happens while this stage matches, and no later stage applies (a fault keeps the
    node as it made it). Takes no other field."""
    endFault: bool = False
    """Fault stages only: once the effect is written, the fault entry that carried this stage
    is marked done (see :mod:`operators.api.injections`)."""

    @model_validator(mode="after")
    def _does_something(self) -> NodeEffect:
        acts = (self.conditions or self.heartbeat is not None or self.reportStatus
                or self.events or self.taints or self.removeTaints
                or self.unschedulable is not None or self.allocatable or self.gpus
                or self.endFault)
        if self.hold and acts:
            raise ValueError("hold does nothing by definition: it takes no other field")
        if not (acts or self.hold):
            raise ValueError("the effect does nothing: set conditions, heartbeat, reportStatus, "
                             "events, taints, removeTaints, unschedulable, allocatable, gpus, "
                             "hold or endFault")
        return self


class _Stage(Model):
    name: str = Field(min_length=1, max_length=63)
    """Names the stage in logs and errors."""
    selector: Selector = Field(default_factory=Selector)
    delay: Delay = Field(default_factory=Delay)


class PodStage(_Stage):
    resource: Literal["Pod"]
    effect: PodEffect

    @field_validator("selector")
    @classmethod
    def _pod_fields(cls, selector: Selector) -> Selector:
        _check_keys(selector, POD_FIELDS, "pod")
        return selector


class NodeStage(_Stage):
    resource: Literal["Node"]
    effect: NodeEffect

    @field_validator("selector")
    @classmethod
    def _node_fields(cls, selector: Selector) -> Selector:
        if selector.phases:
            raise ValueError("phases are for pods; select nodes with matchExpressions")
        _check_keys(selector, NODE_FIELDS, "node", maps=MAP_FIELDS + NODE_MAP_FIELDS)
        return selector

    @field_validator("delay")
    @classmethod
    def _node_delays(cls, delay: Delay) -> Delay:
        if delay.source is not None or delay.since != "transition":
            raise ValueError("node stages take a fixed duration and jitter only")
        return delay


Stage = Annotated[PodStage | NodeStage, Field(discriminator="resource")]


class LogScript(LogLines):
    """A log script for the pods its selector matches."""

    name: str = Field(min_length=1, max_length=63)
    """Names the script in errors."""
    selector: Selector = Field(default_factory=Selector)
    """Which pods (empty: all): matchExpressions over the pod fields, as stages' selectors."""

    @field_validator("selector")
    @classmethod
    def _pod_fields(cls, selector: Selector) -> Selector:
        if selector.phases:
            raise ValueError("phases are for stages: a log is a run's, whatever the phase; "
                             "select pods with matchExpressions")
        _check_keys(selector, POD_FIELDS, "pod")
        return selector


#: The most log scripts a document may have (each is tried in turn for a pod's log).
MAX_LOG_SCRIPTS = 256


# -- exec and port-forward: what a fake container answers ----------------------------------

#: What an exec script's selector may test (and labels[KEY], annotations[KEY] of the pod).
EXEC_FIELDS: dict[str, str] = {
    "name": "the pod's name",
    "namespace": "the pod's namespace",
    "container": "the name of the container exec'd into",
    "gpus": "how many GPUs the container holds through the device plugin (nvidia.com/gpu)",
}
#: What a port-forward rule's selector may test (and labels[KEY], annotations[KEY]).
PORT_FORWARD_FIELDS: dict[str, str] = {
    "name": "the pod's name",
    "namespace": "the pod's namespace",
}
#: Placeholders an exec script's stdout and stderr may hold, as ``{name}``; also
#: ``{labels[KEY]}`` and ``{annotations[KEY]}`` (empty when the pod has no such key).
EXEC_PLACEHOLDERS: dict[str, str] = {
    "pod": "the pod's name",
    "namespace": "the pod's namespace",
    "container": "the container's name",
    "node": "the node's name",
    "args": "the command's arguments after its name, joined by spaces",
    "nvidiaSmiL": "what nvidia-smi -L prints for the GPUs the container holds: a line "
                  "'GPU i: <model> (UUID: <uuid>)' each, numbered from 0 as in the container",
}
#: ``{name}`` or ``{labels[KEY]}``: any other text between braces (JSON, say) is literal.
PLACEHOLDER = re.compile(r"\{([A-Za-z]+)(?:\[([^\]{}]*)\])?\}")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Most bytes a scripted output or answer may hold.
MAX_OUTPUT = 1024 * 1024

Output = Annotated[str, Field(max_length=MAX_OUTPUT)]
#: The most exec scripts, or port-forward rules, a document may have (each is tried in turn).
MAX_SCRIPTS = 256


def placeholders_known(text: str) -> str:
    """``text`` if every placeholder in it is known; ValueError naming the first that is not."""
    for match in PLACEHOLDER.finditer(text):
        name, key = match.group(1), match.group(2)
        if (name in MAP_FIELDS) if key is not None else (name in EXEC_PLACEHOLDERS):
            continue
        raise ValueError(
            f"placeholder {match.group(0)!r} is not known; known: "
            f"{', '.join('{' + known + '}' for known in EXEC_PLACEHOLDERS)}, "
            f"{{labels[KEY]}}, {{annotations[KEY]}}")
    return text


class ExecScript(Model):
    """What a command exec'd into a fake container prints and exits with: the first script
    whose selector holds and whose command matches answers (the pod's annotation
    fakefleet.dev/exec before the Lifecycle's ``exec``). A command no script matches fails as a
    container runtime fails it: executable file not found in $PATH."""

    name: str = Field(min_length=1, max_length=63)
    """Names the script in errors."""
    selector: Selector = Field(default_factory=Selector)
    """Which pods and containers (keys: EXEC_FIELDS, labels[KEY], annotations[KEY]); no phases:
    only a running container can be exec'd into."""
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None, min_length=1, max_length=64)
    """The whole command, word for word (also matched when run as sh -c "<the same words>");
    its first word also matches a path that ends in it (/usr/bin/nvidia-smi)."""
    commandPrefix: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None, max_length=64)
    """The command's first words; [] matches every command."""
    stdout: Output = ""
    """What the command prints on stdout (placeholders: EXEC_PLACEHOLDERS)."""
    stderr: Output = ""
    """What it prints on stderr (with a TTY both go to the terminal)."""
    exitCode: int = Field(default=0, ge=0, le=255)
    """Non-zero: kubectl prints "command terminated with exit code N" and exits N."""
    delay: Duration = "0s"
    """How long the command runs before it prints and exits."""

    @field_validator("selector")
    @classmethod
    def _exec_fields(cls, selector: Selector) -> Selector:
        if selector.phases:
            raise ValueError("phases are for stages: an exec script applies to running "
                             "containers only")
        _check_keys(selector, EXEC_FIELDS, "pod or container")
        return selector

    @field_validator("stdout", "stderr")
    @classmethod
    def _placeholders(cls, text: str) -> str:
        return placeholders_known(text)

    @model_validator(mode="after")
    def _one_command(self) -> ExecScript:
        if (self.command is None) == (self.commandPrefix is None):
            raise ValueError("give command (the whole command) or commandPrefix (its first "
                             "words), one of them")
        return self


class HTTPReply(Model):
    """An HTTP response, sent once the request's head has arrived, then the connection ends."""

    status: int = Field(default=200, ge=100, le=599)
    contentType: str = Field(default="text/plain; charset=utf-8", max_length=256)
    headers: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=64)
    """More response headers (Content-Length and Connection: close are always sent)."""
    body: Output = ""

    @field_validator("headers")
    @classmethod
    def _header_lines(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not HEADER_NAME.fullmatch(name) or "\r" in value or "\n" in value:
                raise ValueError(f"header {name!r}: a name is a token (letters, digits, "
                                 f"-_.!#$%&'*+^`|~) and a value one line")
        return headers

    @field_validator("contentType")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\r" in value or "\n" in value:
            raise ValueError("a content type is one line")
        return value


class PortForwardRule(Model):
    """What a forwarded connection to a port of a fake pod gets: the first rule whose selector
    holds and that names the port answers (the pod's annotation fakefleet.dev/port-forward before
    the Lifecycle's ``portForward``). A port no rule names refuses the connection, as a port
    nothing listens on."""

    name: str = Field(min_length=1, max_length=63)
    selector: Selector = Field(default_factory=Selector)
    """Which pods (keys: PORT_FORWARD_FIELDS, labels[KEY], annotations[KEY])."""
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(min_length=1, max_length=64)
    http: HTTPReply | None = None
    """Answer each connection with this HTTP response."""
    raw: Output | None = None
    """Or send these bytes (UTF-8) as soon as the connection opens, then end it."""

    @field_validator("selector")
    @classmethod
    def _port_fields(cls, selector: Selector) -> Selector:
        if selector.phases:
            raise ValueError("phases are for stages: a pod is forwarded to while it runs")
        _check_keys(selector, PORT_FORWARD_FIELDS, "pod")
        return selector

    @model_validator(mode="after")
    def _one_answer(self) -> PortForwardRule:
        if (self.http is None) == (self.raw is None):
            raise ValueError("give http (an HTTP response) or raw (bytes), one of them")
        return self


class Lifecycle(Model):
    """A document of stages: ``kind: Lifecycle``."""

    apiVersion: Literal["fakefleet.dev/v1alpha1"] = "fakefleet.dev/v1alpha1"
    kind: Literal["Lifecycle"] = "Lifecycle"
    stages: list[Stage] = Field(min_length=1)
    logs: list[LogScript] = Field(default_factory=list, max_length=MAX_LOG_SCRIPTS)
    """What ``kubectl logs`` shows, by pod and container: the first script that matches."""
    exec: list[ExecScript] = Field(default_factory=list, max_length=MAX_SCRIPTS)
    """What commands exec'd into containers print and exit with, first match first."""
    portForward: list[PortForwardRule] = Field(default_factory=list, max_length=MAX_SCRIPTS)
    """What forwarded ports answer, first match first."""

    @model_validator(mode="after")
    def _unique_names(self) -> Lifecycle:
        for kind, names in (("stages", [stage.name for stage in self.stages]),
                            ("log scripts", [script.name for script in self.logs]),
                            ("exec scripts", [script.name for script in self.exec]),
                            ("port-forward rules", [rule.name for rule in self.portForward])):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise ValueError(f"two {kind} are named {name!r}: names must be unique")
                seen.add(name)
        return self

    @model_validator(mode="after")
    def _no_fault_endings(self) -> Lifecycle:
        ending = [stage.name for stage in self.stages if stage.effect.endFault]
        if ending:
            raise ValueError(f"stage {ending[0]!r} sets endFault, which only a fault entry's "
                             f"stages may set (see operators/api/injections.py): remove it")
        return self

    @property
    def pods(self) -> list[PodStage]:
        return [stage for stage in self.stages if isinstance(stage, PodStage)]

    @property
    def nodes(self) -> list[NodeStage]:
        return [stage for stage in self.stages if isinstance(stage, NodeStage)]


def _check_keys(selector: Selector, known: dict[str, str], kind: str,
                maps: tuple[str, ...] = MAP_FIELDS) -> None:
    for requirement in selector.matchExpressions:
        field = requirement.field()
        if field in maps and requirement.key.endswith("]") and len(requirement.key) > \
                len(field) + 2:
            continue
        if field not in known:
            raise ValueError(
                f"key {requirement.key!r} is not a {kind} field; known: "
                f"{', '.join(sorted(known))}, " + ", ".join(f"{m}[KEY]" for m in maps))


def load_lifecycle(text: str, *, source: str = "the stages") -> Lifecycle:
    """Parse and validate a ``kind: Lifecycle`` YAML document."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise StageError(f"{source} is not valid YAML: {error}") from error
    try:
        return Lifecycle.model_validate(document)
    except ValidationError as error:
        raise StageError(f"{source} is invalid:\n  " + "\n  ".join(_problems(error))) \
            from error


ScriptT = TypeVar("ScriptT", ExecScript, PortForwardRule)


def load_scripts(text: str, kind: type[ScriptT], *, source: str) -> list[ScriptT]:
    """A pod annotation's list of exec scripts or port-forward rules, in JSON (no YAML: its
    aliases could make a short annotation a large document), in the schema of the Lifecycle's
    ``exec`` or ``portForward``; StageError naming the place and the problem."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise StageError(f"{source} is not valid JSON: {error}") from error
    try:
        return TypeAdapter(list[kind]).validate_python(document)  # type: ignore[valid-type]
    except ValidationError as error:
        raise StageError(f"{source} is invalid: " + "; ".join(_problems(error))) from error


def _problems(error: ValidationError) -> list[str]:
    problems = []
    for problem in error.errors(include_url=False):
        place = ".".join(str(part) for part in problem["loc"]
                         if not str(part).startswith(("function-", "Pod", "Node")))
        value = problem.get("input")
        shown = f" (got {value!r})" if isinstance(value, str | int | float) else ""
        problems.append(f"{place or 'the document'}: {problem['msg']}{shown}")
    return problems
