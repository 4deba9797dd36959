"""Pods as the engine keeps them (a few slots each, never whole objects) and the status a real
kubelet would report for them. Pure: no I/O, no clock of its own.

Annotations a pod can carry to shape its life:

    fakefleet.dev/run-time: 90s     run this long, then exit (Job pods default to the pool's)
    fakefleet.dev/exit-code: "3"    exit with this code (non-zero: restartPolicy decides)
    fakefleet.dev/start-delay: 2s   time from binding to Running
    fakefleet.dev/seed: anything    seed of this pod's random draws (jitter)
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from operators.api.durations import parse_duration

logger = logging.getLogger(__name__)

RUN_TIME = "fakefleet.dev/run-time"
EXIT_CODE = "fakefleet.dev/exit-code"
START_DELAY = "fakefleet.dev/start-delay"
SEED = "fakefleet.dev/seed"

# Phases as stored in PodFacts.phase (the names of operators.engine.stages.Phase).
PENDING, INITIALIZING, RUNNING, BACKOFF = "Pending", "Initializing", "Running", "BackOff"
SUCCEEDED, FAILED = "Succeeded", "Failed"
TERMINAL = frozenset({SUCCEEDED, FAILED})


class PodFacts:
    """What the engine remembers of one pod."""

    __slots__ = (
        "changed_at", "containers", "created", "deleting", "exit_code", "finalizers", "gates",
        "grace", "host_ip", "init_containers", "init_finished", "ip", "job", "last_exit",
        "name", "namespace", "node", "phase", "problems", "readiness_gates", "ready_since",
        "restart_policy", "restarts", "run_time", "scheduled_at", "seed", "start_delay",
        "start_time", "started_at", "uid",
    )

    def __init__(self, pod: Mapping[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        annotations = metadata.get("annotations") or {}
        self.problems: tuple[str, ...] = ()  # annotations ignored, and why (for an Event)
        self.uid: str = metadata["uid"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        self.node: str = spec["nodeName"]
        self.created: str = metadata.get("creationTimestamp", "")
        self.containers = tuple((c["name"], c.get("image", "")) for c in spec["containers"])
        self.init_containers = tuple(
            (c["name"], c.get("image", ""), c.get("restartPolicy") == "Always")
            for c in spec.get("initContainers") or ())
        self.readiness_gates = tuple(g["conditionType"] for g in spec.get("readinessGates") or ())
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.job = any(ref.get("kind") == "Job" for ref in metadata.get("ownerReferences") or ())
        self.run_time = _duration(annotations, RUN_TIME, self)
        self.start_delay = _duration(annotations, START_DELAY, self)
        self.exit_code = _integer(annotations, EXIT_CODE, self)
        self.seed: str = annotations.get(SEED, "")
        self.deleting = False
        self.grace: float | None = None
        self.finalizers = False
        self.gates: dict[str, str] = {}
        self.scheduled_at = self.created
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("lastTransitionTime"):
                self.scheduled_at = condition["lastTransitionTime"]
        self.observe(pod)
        # The life the engine gives it:
        self.phase = PENDING
        self.ip: str | None = None
        self.host_ip = ""
        self.start_time: str | None = None
        self.started_at = ""
        self.ready_since = ""
        self.changed_at = ""
        self.init_finished: list[str] = []
        self.restarts = 0
        self.last_exit: tuple[int, str, str] | None = None  # exit code, started, finished

    @property
    def init_done(self) -> int:
        return len(self.init_finished)

    def observe(self, pod: Mapping[str, Any]) -> bool:
        """Take in what others changed (deletion, finalizers, readiness gates); True if any of
        it matters for the pod's next step or its Ready condition."""
        metadata = pod["metadata"]
        deleting = metadata.get("deletionTimestamp") is not None
        grace = metadata.get("deletionGracePeriodSeconds")
        finalizers = bool(metadata.get("finalizers"))
        gates = {}
        if self.readiness_gates:
            for condition in (pod.get("status") or {}).get("conditions") or ():
                if condition.get("type") in self.readiness_gates:
                    gates[condition["type"]] = condition.get("status", "False")
        changed = (deleting, finalizers, gates) != (self.deleting, self.finalizers, self.gates)
        self.deleting, self.finalizers, self.gates = deleting, finalizers, gates
        self.grace = float(grace) if grace is not None else None
        return changed

    def gates_ready(self) -> bool:
        return all(self.gates.get(gate) == "True" for gate in self.readiness_gates)


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
        return int(value)
    except ValueError:
        _ignore(pod, f"annotation {key} ignored: {value!r} is not an integer exit code such "
                     f"as \"0\" or \"3\"")
        return 0


def _ignore(pod: PodFacts, problem: str) -> None:
    logger.warning("pod %s/%s: %s", pod.namespace, pod.name, problem)
    pod.problems += (problem,)


def render_warning(pod: PodFacts, problem: str, now: str) -> dict[str, Any]:
    """A core/v1 Event on the pod, as ``kubectl describe pod`` and ``kubectl events`` show it:
    the user learns there, not in the engine's log, that an annotation was ignored."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod.name}.{_digest(pod.uid, problem)[:16]}",
                     "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                           "name": pod.name, "uid": pod.uid},
        "type": "Warning",
        "reason": "InvalidAnnotation",
        "message": problem,
        "source": {"component": "fakefleet-engine", "host": pod.node},
        "reportingComponent": "fakefleet-engine",
        "reportingInstance": pod.node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _container_id(pod: PodFacts, name: str, restarts: int) -> str:
    return f"containerd://{_digest(pod.uid, name, str(restarts))}"


def _image_id(image: str) -> str:
    return f"{image.split(':')[0]}@sha256:{_digest(image)}"


def _condition(kind: str, holds: bool, since: str, reason: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {"type": kind, "status": "True" if holds else "False",
                                 "lastProbeTime": None, "lastTransitionTime": since}
    if reason and not holds:
        condition["reason"] = reason
    return condition


def _terminated(pod: PodFacts, name: str, code: int, started: str, finished: str,
                restarts: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                           "startedAt": started, "finishedAt": finished,
                           "containerID": _container_id(pod, name, restarts)}}


def render_status(pod: PodFacts, now: str) -> dict[str, Any]:
    """The whole pod status for ``pod.phase`` (merge patches replace lists, so send it all)."""
    phase = pod.phase
    terminal = phase in TERMINAL
    running = phase == RUNNING
    initialized = pod.init_done >= len(pod.init_containers)
    since = pod.changed_at or now
    containers_ready = _condition("ContainersReady", running, pod.ready_since if running
                                  else since, "PodCompleted" if terminal else "ContainersNotReady")
    ready = running and pod.gates_ready()
    ready_reason = ("ReadinessGatesNotReady" if running else
                    "PodCompleted" if terminal else "ContainersNotReady")
    conditions = [
        _condition("PodReadyToStartContainers", not terminal, since),
        _condition("Initialized", initialized,
                   pod.init_finished[-1] if pod.init_finished else pod.start_time or since,
                   "ContainersNotInitialized"),
        _condition("Ready", ready, pod.ready_since if ready else since, ready_reason),
        containers_ready,
        _condition("PodScheduled", True, pod.scheduled_at or since),
    ]
    for gate in pod.readiness_gates:  # others own these: carry them through unchanged
        if gate in pod.gates:
            conditions.append({"type": gate, "status": pod.gates[gate]})
    status: dict[str, Any] = {
        "phase": ("Pending" if phase in (PENDING, INITIALIZING) else
                  "Running" if phase in (RUNNING, BACKOFF) else phase),
        "conditions": conditions,
        "hostIP": pod.host_ip,
        "hostIPs": [{"ip": pod.host_ip}],
        "startTime": pod.start_time or now,
        "containerStatuses": [_main_status(pod, name, image, now)
                              for name, image in pod.containers],
    }
    if pod.ip is not None:
        status["podIP"] = pod.ip
        status["podIPs"] = [{"ip": pod.ip}]
    if pod.init_containers:
        status["initContainerStatuses"] = [
            _init_status(pod, index, name, image, sidecar, now)
            for index, (name, image, sidecar) in enumerate(pod.init_containers)
        ]
    return status


def _main_status(pod: PodFacts, name: str, image: str, now: str) -> dict[str, Any]:
    phase = pod.phase
    entry: dict[str, Any] = {
        "name": name, "image": image, "imageID": _image_id(image),
        "containerID": _container_id(pod, name, pod.restarts),
        "ready": phase == RUNNING, "started": phase == RUNNING,
        "restartCount": pod.restarts,
    }
    if phase in (PENDING, INITIALIZING):
        entry["state"] = {"waiting": {"reason": "PodInitializing"}}
        del entry["containerID"]
        del entry["imageID"]
    elif phase == RUNNING:
        entry["state"] = {"running": {"startedAt": pod.started_at}}
    elif phase == BACKOFF:
        wait = min(10 * 2 ** max(pod.restarts - 1, 0), 300)
        entry["state"] = {"waiting": {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {wait}s restarting failed container={name} "
                       f"pod={pod.name}_{pod.namespace}({pod.uid})"}}
    else:
        code = pod.exit_code if phase == FAILED else 0
        entry["state"] = _terminated(pod, name, code, pod.started_at, pod.changed_at or now,
                                     pod.restarts)
    if pod.last_exit is not None and phase in (RUNNING, BACKOFF):
        code, started, finished = pod.last_exit
        entry["lastState"] = _terminated(pod, name, code, started, finished, pod.restarts - 1)
    return entry


def _init_status(pod: PodFacts, index: int, name: str, image: str, sidecar: bool,
                 now: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "image": image, "restartCount": 0,
                             "ready": False, "started": False}
    done = index < pod.init_done
    current = index == pod.init_done and pod.phase == INITIALIZING
    if done and sidecar and pod.phase not in TERMINAL:
        started = pod.init_finished[index]
        entry.update(ready=True, started=True, state={"running": {"startedAt": started}})
    elif done:
        started = pod.init_finished[index - 1] if index else (pod.start_time or now)
        entry["state"] = _terminated(pod, name, 0, started, pod.init_finished[index], 0)
    elif current:
        entry.update(started=True, state={"running": {
            "startedAt": pod.init_finished[-1] if pod.init_finished else pod.start_time or now}})
    else:
        entry["state"] = {"waiting": {"reason": "PodInitializing"}}
    if "waiting" not in entry["state"]:
        entry["imageID"] = _image_id(image)
        entry["containerID"] = _container_id(pod, name, 0)
    return entry
