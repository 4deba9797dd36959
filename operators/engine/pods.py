"""Pods as the engine keeps them, and the status a real kubelet would report. Pure: no I/O, no
clock of its own.

A pod is two things here: :class:`PodFacts`, what the engine reads from the object (spec,
annotations, deletion, readiness gates), and :class:`PodLife`, where the pod is in its life
(phase, IP, start and exit times, restarts). A life is immutable: a stage computes the next one,
the engine writes its status, and only when the write succeeded does the new life replace the
old (a failed write retried never applies a step twice). A life can also be read back from a
status the engine wrote (:func:`life_from_status`), so a restarted engine carries on where the
API says each pod is.

Annotations a pod can carry to shape its life:

    fakefleet.dev/run-time: 90s     run this long, then exit (Job pods default to the pool's)
    fakefleet.dev/exit-code: "3"    exit with this code (non-zero: restartPolicy decides)
    fakefleet.dev/start-delay: 2s   time from binding to Running
    fakefleet.dev/seed: anything    seed of this pod's random draws (jitter, log lines)
    fakefleet.dev/lives: <set>      take the three above from a replay's lives set
                                    (:mod:`operators.api.lives`) before it starts
    fakefleet.dev/logs: <script>    what `kubectl logs` shows (:mod:`operators.api.logs`)

and its simulated usage (:mod:`operators.engine.usage`): ``fakefleet.dev/usage-cpu``,
``fakefleet.dev/usage-memory``, ``fakefleet.dev/usage-gpu-util``,
``fakefleet.dev/usage-gpu-memory``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from operators.api.durations import parse_duration
from operators.api.lives import Life
from operators.api.logs import load_log_lines
from operators.api.usage import quantity
from operators.engine.claims import claim_refs, claim_statuses
from operators.engine.logs import Script, compile_script
from operators.k8s.times import parse
from primitives import keys

logger = logging.getLogger(__name__)


# Phases of a pod's life as the engine sees them (the stages' PodPhase values).
PENDING, INITIALIZING, RUNNING, BACKOFF = "Pending", "Initializing", "Running", "BackOff"
SUCCEEDED, FAILED = "Succeeded", "Failed"
TERMINAL = frozenset({SUCCEEDED, FAILED})
BACKOFF_BASE, BACKOFF_MAX = 10.0, 300.0
#: The kubelet forgets a container's back-off when it exits more than this after its last
#: restart (kubelet.go gives its crash-loop Backoff a HasExpiredFunc of 600 s, 2 x the cap).
BACKOFF_RESET = 600.0
DISRUPTION_TARGET = "DisruptionTarget"


@dataclasses.dataclass(frozen=True, slots=True)
class Exit:
    """How the containers ended: code, reason, message, and when they started and finished."""

    code: int
    reason: str
    message: str
    started: str
    finished: str


#: How the kubelet reports the containers of a pod it evicted: they are removed with the pod,
#: and a container it cannot locate any more shows this, with no times and no container ID.
UNLOCATED = Exit(137, "ContainerStatusUnknown",
                 "The container could not be located when the pod was terminated", "", "")


@dataclasses.dataclass(frozen=True, slots=True)
class ExtraCondition:
    """A pod condition a stage set (DisruptionTarget, ...)."""

    type: str
    status: str
    reason: str
    message: str
    since: str


@dataclasses.dataclass(frozen=True, slots=True)
class PodLife:
    """Where a pod is in its life; every field is what its status shows."""

    phase: str = PENDING
    changed_at: str = ""  # the last transition: the stages' delays count from here
    ip: str | None = None
    start_time: str | None = None
    started_at: str = ""  # the containers' current (or last) start
    ready_since: str = ""
    init_finished: tuple[str, ...] = ()  # completion time of each init container done
    restarts: int = 0
    # The kubelet's crash-loop back-off entry of the containers (flowcontrol.Backoff, keyed by
    # container): the wait it applies while in BackOff, otherwise the next wait (0: none), and
    # when it was last updated (the last restart).
    backoff: float = 0.0
    restarted_at: str = ""
    exit: Exit | None = None  # the current termination (Succeeded, Failed)
    last_exit: Exit | None = None  # the previous run's, while crash-looping
    waiting: tuple[str, str] | None = None  # (reason, message) set by a stage
    conditions: tuple[ExtraCondition, ...] = ()
    reason: str = ""  # the pod's own (status.reason), e.g. Evicted
    message: str = ""

    @property
    def init_done(self) -> int:
        return len(self.init_finished)

    @property
    def evicted(self) -> bool:
        return self.phase == FAILED and bool(self.reason)


class PodFacts:
    """What the engine reads of one pod: a few slots, never the whole object."""

    __slots__ = (
        "annotations", "claim_status", "claims", "claims_prepared", "containers", "created",
        "deleting", "deletion_asked", "exit_code", "finalizers", "gates", "grace",
        "host_ip", "init_containers", "job", "labels", "life_taken", "lives", "logs", "name",
        "namespace", "node",
        "owner_kind", "problems", "readiness_gates", "resources",
        "restart_policy", "run_time", "scheduled_at", "seed", "start_delay", "uid",
    )

    def __init__(self, pod: Mapping[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        annotations = metadata.get("annotations") or {}
        self.problems: tuple[str, ...] = ()  # annotations ignored, and why (for an Event)
        self.uid: str = metadata["uid"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        self.node: str = spec["nodeName"]
        self.host_ip = ""
        self.labels: Mapping[str, str] = metadata.get("labels") or {}
        self.annotations: Mapping[str, str] = annotations
        self.created: str = metadata.get("creationTimestamp", "")
        self.containers = tuple((c["name"], c.get("image", "")) for c in spec["containers"])
        self.resources = tuple(_requests(c) for c in spec["containers"])
        self.init_containers = tuple(
            (c["name"], c.get("image", ""), c.get("restartPolicy") == "Always")
            for c in spec.get("initContainers") or ())
        self.readiness_gates = tuple(g["conditionType"] for g in spec.get("readinessGates") or ())
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        owner = next((ref for ref in metadata.get("ownerReferences") or ()
                      if ref.get("controller")), None) or next(
            iter(metadata.get("ownerReferences") or ()), None)
        self.owner_kind: str | None = owner.get("kind") if owner else None
        self.job = any(ref.get("kind") == "Job" for ref in metadata.get("ownerReferences") or ())
        self.run_time = _duration(annotations, keys.RUN_TIME, self)
        self.start_delay = _duration(annotations, keys.START_DELAY, self)
        self.exit_code = _integer(annotations, keys.EXIT_CODE, self)
        self.seed: str = annotations.get(keys.SEED, "")
        #: The lives set the pod takes its life from, and whether it took it (or has none).
        self.lives: str = annotations.get(keys.LIVES, "")
        self.life_taken = not self.lives
        self.logs: Script | None = None  # its own log script (annotation fakefleet.dev/logs)
        self.problems += self.read_logs()
        self.scheduled_at = self.created
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("lastTransitionTime"):
                self.scheduled_at = condition["lastTransitionTime"]
        self.deleting = False
        self.deletion_asked = 0.0
        self.grace: float | None = None
        self.finalizers = False
        self.gates: dict[str, str] = {}
        self.claims = claim_refs(spec)  # its ResourceClaims (DRA), as the spec names them
        self.claim_status: tuple[tuple[str, str | None], ...] = ()
        #: Whether its claims are reserved for it (:mod:`~operators.engine.claims`): True when
        #: it has none, None until the engine has looked.
        self.claims_prepared: bool | None = None if self.claims else True
        self.observe(pod)

    @property
    def finite(self) -> bool:
        return self.run_time is not None or self.job

    def observe(self, pod: Mapping[str, Any]) -> bool:
        """Take in what others changed (deletion, finalizers, readiness gates, the claims made
        for it); True if any of it matters for the pod's next step or its Ready condition."""
        metadata = pod["metadata"]
        deleting = metadata.get("deletionTimestamp") is not None
        grace = metadata.get("deletionGracePeriodSeconds")
        finalizers = bool(metadata.get("finalizers"))
        gates = {}
        if self.readiness_gates:
            for condition in (pod.get("status") or {}).get("conditions") or ():
                if condition.get("type") in self.readiness_gates:
                    gates[condition["type"]] = condition.get("status", "False")
        self.recorded(metadata)
        changed = (deleting, finalizers, gates) != (self.deleting, self.finalizers, self.gates)
        if self.claims:
            statuses = claim_statuses(pod.get("status") or {})
            if statuses != self.claim_status:
                self.claim_status = statuses
                if not self.claims_prepared:
                    self.claims_prepared = None  # its claims are made now: look again
                    changed = True
        self.deleting, self.finalizers, self.gates = deleting, finalizers, gates
        self.grace = float(grace) if grace is not None else None
        if deleting:
            # deletionTimestamp is when the grace period ends: the request came that much before.
            self.deletion_asked = parse(metadata["deletionTimestamp"]) - (self.grace or 0.0)
        return changed

    def recorded(self, metadata: Mapping[str, Any]) -> None:
        """Take in the annotations of a newer version of the pod (as the watch shows it)."""
        self.annotations = metadata.get("annotations") or {}

    def read_logs(self) -> tuple[str, ...]:
        """Take in the log script of the annotation ``fakefleet.dev/logs`` (again, once it
        changed); what is wrong with it, if anything (then it is ignored)."""
        self.logs = None
        text = self.annotations.get(keys.LOGS)
        if text is None:
            return ()
        try:
            self.logs = compile_script(load_log_lines(text, source=f"annotation {keys.LOGS}"))
        except ValueError as error:
            problem = f"{error}; the pod's log is its stages' script, if any"
            logger.warning("pod %s/%s: %s", self.namespace, self.name, problem)
            return (problem,)
        return ()

    def take(self, life: Life | None) -> None:
        """The life the pod took from its lives set (None: past the set's last, or no set to
        read): what it recorded replaces the pod's annotations, the rest stays as it is."""
        if life is not None:
            if life.start_delay is not None:
                self.start_delay = life.start_delay
            if life.run_time is not None:
                self.run_time = life.run_time
            if life.exit_code is not None:
                self.exit_code = life.exit_code
        self.life_taken = True

    def gates_ready(self) -> bool:
        return all(self.gates.get(gate) == "True" for gate in self.readiness_gates)


@dataclasses.dataclass(frozen=True, slots=True)
class Requests:
    """What one container asks for: CPU in cores, memory in bytes, whole GPUs."""

    cpu: float = 0.0
    memory: float = 0.0
    gpus: int = 0


def _requests(container: Mapping[str, Any]) -> Requests:
    """A container's requests; a resource with only a limit requests the limit (as the API
    server defaults it); an amount that is not a quantity counts as none."""
    resources = container.get("resources") or {}
    asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    if not asked:
        return _NOTHING

    def amount(name: str) -> float:
        try:
            return quantity(str(asked.get(name, "0")))
        except ValueError:
            return 0.0
    return Requests(amount("cpu"), amount("memory"), int(amount("nvidia.com/gpu")))


_NOTHING = Requests()


def crash_wait(backoff: float, restarted: float | None, crashed: float) -> float:
    """The kubelet's wait before restarting containers that exited at ``crashed``, given their
    back-off entry (``backoff``, 0: none) and their last restart (seconds since the epoch), as
    kuberuntime's doBackOff decides it: none when they have no entry or it expired (an exit
    more than BACKOFF_RESET after the last restart), else the entry's."""
    if not backoff or restarted is None or crashed - restarted > BACKOFF_RESET:
        return 0.0
    return backoff


def next_backoff(wait: float) -> float:
    """The entry after a restart that waited ``wait`` (flowcontrol.Backoff.Next): 10 s after
    none, else double, at most 300 s."""
    return BACKOFF_BASE if not wait else min(2.0 * wait, BACKOFF_MAX)


def backoff_from_status(status: Mapping[str, Any]) -> tuple[float, str]:
    """The back-off entry (wait or next wait, last restart) a container status shows: the wait
    of the restart before the current run tells the entry the kubelet then made (10 s, or
    double the wait); a waiting container's message names its wait. So a restarted engine
    goes on as its kubelets, which did not restart, would."""
    state = status.get("state") or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    message = (state.get("waiting") or {}).get("message", "")
    if "waiting" in state and message.startswith("back-off "):
        seconds = _go_seconds(message.split()[1])
        return (seconds, last.get("startedAt", "")) if seconds is not None else (0.0, "")
    started = (state.get("running") or {}).get("startedAt", "")
    if not started or not last.get("finishedAt"):
        return 0.0, ""
    waited = parse(started) - parse(last["finishedAt"])
    ladder = BACKOFF_BASE
    while ladder <= waited and ladder < BACKOFF_MAX:  # the loop's latency rounds down
        ladder *= 2.0
    return min(ladder, BACKOFF_MAX), started


def go_duration(seconds: float) -> str:
    """A wait as Go's time.Duration prints it (the kubelet's message: "1m20s", "5m0s")."""
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def _go_seconds(text: str) -> float | None:
    minutes, _, rest = text.rpartition("m")
    try:
        return float(int(minutes or "0") * 60 + int(rest.rstrip("s")))
    except ValueError:
        return None


def life_from_status(facts: PodFacts, status: Mapping[str, Any]) -> PodLife:
    """The life a status shows (one the engine wrote before a restart, or nothing yet)."""
    phase = status.get("phase")
    containers = status.get("containerStatuses") or []
    first: Mapping[str, Any] = containers[0] if containers else {}
    state: Mapping[str, Any] = first.get("state") or {}
    restarts = int(first.get("restartCount", 0))
    init_finished = _init_progress(facts, status.get("initContainerStatuses") or [])
    extra = tuple(ExtraCondition(c["type"], c.get("status", "True"), c.get("reason", ""),
                                 c.get("message", ""), c.get("lastTransitionTime", ""))
                  for c in status.get("conditions") or () if c.get("type") not in _OWN
                  and c.get("type") not in facts.readiness_gates)
    backoff, restarted_at = backoff_from_status(first)
    base = PodLife(ip=status.get("podIP"), start_time=status.get("startTime"),
                   init_finished=init_finished, restarts=restarts, conditions=extra,
                   backoff=backoff, restarted_at=restarted_at,
                   reason=status.get("reason", ""), message=status.get("message", ""))
    ready_since = next((c.get("lastTransitionTime", "") for c in status.get("conditions") or ()
                        if c.get("type") == "Ready" and c.get("status") == "True"), "")
    if phase == "Running":
        last = _exit(first.get("lastState", {}).get("terminated"))
        if "waiting" in state:
            return dataclasses.replace(base, phase=BACKOFF, last_exit=last,
                                       changed_at=last.finished if last else "",
                                       started_at=last.started if last else "")
        started = (state.get("running") or {}).get("startedAt", "")
        return dataclasses.replace(base, phase=RUNNING, started_at=started, changed_at=started,
                                   ready_since=ready_since or started, last_exit=last)
    if phase in TERMINAL:
        ended = _exit(state.get("terminated"))
        disrupted = next((c.since for c in extra if c.type == DISRUPTION_TARGET), "")
        return dataclasses.replace(base, phase=str(phase), exit=ended,
                                   started_at=ended.started if ended else "",
                                   changed_at=ended.finished if ended and ended.finished
                                   else disrupted)
    waiting = state.get("waiting") or {}
    stage_wait = None
    if waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
        stage_wait = (waiting["reason"], waiting.get("message", ""))
    if init_finished:
        return dataclasses.replace(base, phase=INITIALIZING, changed_at=init_finished[-1],
                                   waiting=stage_wait)
    return dataclasses.replace(base, changed_at=facts.scheduled_at, waiting=stage_wait)


def _init_progress(facts: PodFacts, statuses: list[Mapping[str, Any]]) -> tuple[str, ...]:
    done = []
    by_name = {status.get("name"): status for status in statuses}
    for name, _, sidecar in facts.init_containers:
        state = (by_name.get(name) or {}).get("state") or {}
        if (state.get("terminated") or {}).get("reason") == UNLOCATED.reason:
            break  # removed with an evicted pod: it never completed
        if "terminated" in state and not sidecar:
            done.append(state["terminated"].get("finishedAt", ""))
        elif sidecar and "running" in state and (by_name.get(name) or {}).get("ready"):
            # Ready, not only started: the sidecar being started is running (and started) too.
            done.append(state["running"].get("startedAt", ""))
        else:
            break
    return tuple(done)


def _exit(terminated: Mapping[str, Any] | None) -> Exit | None:
    if not terminated:
        return None
    return Exit(int(terminated.get("exitCode", 0)), terminated.get("reason", ""),
                terminated.get("message", ""), terminated.get("startedAt", ""),
                terminated.get("finishedAt", ""))


def _duration(annotations: Mapping[str, str], key: str, pod: PodFacts) -> float | None:
    value = annotations.get(key)
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as error:
        _ignore(pod, f"annotation {key} ignored: {error}")
        return None


def _integer(annotations: Mapping[str, str], key: str, pod: PodFacts) -> int:
    value = annotations.get(key)
    if value is None:
        return 0
    try:
        code = int(value)
    except ValueError:
        code = -1
    if not 0 <= code <= 255:
        _ignore(pod, f"annotation {key} ignored: {value!r} is not an exit code from 0 to 255 "
                     f"such as \"0\" or \"3\"")
        return 0
    return code


def _ignore(pod: PodFacts, problem: str) -> None:
    logger.warning("pod %s/%s: %s", pod.namespace, pod.name, problem)
    pod.problems += (problem,)


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _container_id(pod: PodFacts, name: str, restarts: int) -> str:
    return f"containerd://{_digest(pod.uid, name, str(restarts))}"


def _image_id(image: str) -> str:
    return f"{image.split(':')[0]}@sha256:{_digest(image)}"


#: The conditions the engine renders itself; others (readiness gates, stages') are carried.
_OWN = frozenset({"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                  "PodScheduled"})


def _condition(kind: str, holds: bool, since: str, reason: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {"type": kind, "status": "True" if holds else "False",
                                 "lastProbeTime": None, "lastTransitionTime": since}
    if reason and not holds:
        condition["reason"] = reason
    return condition


def _terminated(pod: PodFacts, name: str, ended: Exit, restarts: int) -> dict[str, Any]:
    terminated: dict[str, Any] = {
        "exitCode": ended.code, "reason": ended.reason or (
            "Completed" if ended.code == 0 else "Error")}
    if ended != UNLOCATED:
        terminated.update(startedAt=ended.started, finishedAt=ended.finished,
                          containerID=_container_id(pod, name, restarts))
    if ended.message:
        terminated["message"] = ended.message
    return {"terminated": terminated}


def render_status(pod: PodFacts, life: PodLife, now: str) -> dict[str, Any]:
    """The whole pod status for ``life`` (merge patches replace lists, so send it all)."""
    phase = life.phase
    terminal = phase in TERMINAL
    running = phase == RUNNING
    initialized = life.init_done >= len(pod.init_containers)
    since = life.changed_at or now
    containers_ready = _condition("ContainersReady", running, life.ready_since if running
                                  else since, "PodCompleted" if terminal else "ContainersNotReady")
    ready = running and pod.gates_ready()
    ready_reason = ("ReadinessGatesNotReady" if running else
                    "PodCompleted" if terminal else "ContainersNotReady")
    conditions = [
        _condition("PodReadyToStartContainers", not terminal, since),
        _condition("Initialized", initialized,
                   life.init_finished[-1] if life.init_finished else life.start_time or since,
                   "ContainersNotInitialized"),
        _condition("Ready", ready, life.ready_since if ready else since, ready_reason),
        containers_ready,
        _condition("PodScheduled", True, pod.scheduled_at or since),
    ]
    for gate in pod.readiness_gates:  # others own these: carry them through unchanged
        if gate in pod.gates:
            conditions.append({"type": gate, "status": pod.gates[gate]})
    for extra in life.conditions:
        conditions.append({"type": extra.type, "status": extra.status, "reason": extra.reason,
                           "message": extra.message, "lastTransitionTime": extra.since})
    status: dict[str, Any] = {
        "phase": ("Pending" if phase in (PENDING, INITIALIZING) else
                  "Running" if phase in (RUNNING, BACKOFF) else phase),
        "conditions": conditions,
        "hostIP": pod.host_ip,
        "hostIPs": [{"ip": pod.host_ip}],
        "startTime": life.start_time or now,
        "containerStatuses": [_main_status(pod, life, name, image)
                              for name, image in pod.containers],
    }
    if life.reason:
        status["reason"] = life.reason
        status["message"] = life.message
    if life.ip is not None:
        status["podIP"] = life.ip
        status["podIPs"] = [{"ip": life.ip}]
    if pod.init_containers:
        status["initContainerStatuses"] = [
            _init_status(pod, life, index, name, image, sidecar, now)
            for index, (name, image, sidecar) in enumerate(pod.init_containers)
        ]
    return status


def _main_status(pod: PodFacts, life: PodLife, name: str, image: str) -> dict[str, Any]:
    phase = life.phase
    entry: dict[str, Any] = {
        "name": name, "image": image, "imageID": _image_id(image),
        "containerID": _container_id(pod, name, life.restarts),
        "ready": phase == RUNNING, "started": phase == RUNNING,
        "restartCount": life.restarts,
    }
    if phase in (PENDING, INITIALIZING):
        reason, message = life.waiting or ("PodInitializing", "")
        entry["state"] = {"waiting": {"reason": reason, **({"message": message}
                                                            if message else {})}}
        del entry["containerID"]
        del entry["imageID"]
    elif phase == RUNNING:
        entry["state"] = {"running": {"startedAt": life.started_at}}
    elif phase == BACKOFF:
        entry["state"] = {"waiting": {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {go_duration(life.backoff)} restarting failed container={name} "
                       f"pod={pod.name}_{pod.namespace}({pod.uid})"}}
    elif life.exit is not None:
        entry["state"] = _terminated(pod, name, life.exit, life.restarts)
        if life.exit == UNLOCATED:
            del entry["containerID"]
            del entry["imageID"]
    if life.last_exit is not None and phase in (RUNNING, BACKOFF):
        entry["lastState"] = _terminated(pod, name, life.last_exit, life.restarts - 1)
    return entry


def _init_status(pod: PodFacts, life: PodLife, index: int, name: str, image: str,
                 sidecar: bool, now: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "image": image, "restartCount": 0,
                             "ready": False, "started": False}
    done = index < life.init_done
    current = index == life.init_done and life.phase == INITIALIZING
    if life.evicted and not (done and not sidecar):
        entry["state"] = _terminated(pod, name, UNLOCATED, 0)
        return entry
    if done and sidecar and life.phase not in TERMINAL:
        started = life.init_finished[index]
        entry.update(ready=True, started=True, state={"running": {"startedAt": started}})
    elif done:
        started = life.init_finished[index - 1] if index else (life.start_time or now)
        entry["state"] = _terminated(pod, name, Exit(0, "Completed", "", started,
                                                     life.init_finished[index]), 0)
    elif current:
        entry.update(started=True, state={"running": {
            "startedAt": life.init_finished[-1] if life.init_finished else
            life.start_time or now}})
    else:
        entry["state"] = {"waiting": {"reason": "PodInitializing"}}
    if "waiting" not in entry["state"]:
        entry["imageID"] = _image_id(image)
        entry["containerID"] = _container_id(pod, name, 0)
    return entry
