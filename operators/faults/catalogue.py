"""What each fault does to a node or pod, as stages: the fault entry a plan's fault set carries
to the object (:mod:`operators.api.faultsets`, :mod:`operators.api.injections`). Pure.

A fault's ``stages`` run ahead of the object's default lifecycle while it is injected; each
ends in a ``hold`` where the defaults would otherwise undo it (a NotReady node would be made
Ready again). Its ``recovery`` restores what the fault changed and ends with ``endFault``, so the
engine marks the entry done once everything is written back. A one-shot fault (a container
exit, an eviction) ends its own stages with ``endFault``: it happens once, and the pod then
lives on by its restartPolicy.

A cluster fault is an entry on the FakeCluster without stages: the components it stops, the
latency of its engine's writes, or what happens to its link to the federation hub. Nobody marks
it done: the plan removes it when the fault ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter

from operators.api.faultplans import Fault
from operators.api.injections import FaultEntry, HubLink
from operators.api.stages import Stage
from operators.faults.xid import describe
from primitives import keys

#: The node condition an Xid sets, as a GPU health monitor (DCGM, NVSentinel) reports it.
GPU_CONDITION = "GPUHealthy"
NOT_READY_MESSAGE = ("container runtime network not ready: NetworkReady=false "
                     "reason:NetworkPluginNotReady message:Network plugin returns error: "
                     "cni plugin not initialized")
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "kubelet is posting ready status"}
_STAGES: TypeAdapter[list[Stage]] = TypeAdapter(list[Stage])


def _stages(*documents: dict[str, Any]) -> list[Stage]:
    return _STAGES.validate_python(list(documents))


def _node(name: str, effect: dict[str, Any], *expressions: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "resource": "Node", "effect": effect,
            "selector": {"matchExpressions": list(expressions)}}


def _pod(name: str, effect: dict[str, Any], *expressions: dict[str, Any],
         phases: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"name": name, "resource": "Pod", "effect": effect,
            "selector": {"phases": list(phases), "matchExpressions": [
                {"key": "deleting", "operator": "In", "values": ["false"]}, *expressions]}}


def _is(key: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": list(values)}


def _is_not(key: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": "NotIn", "values": list(values)}


HOLD_NODE = _node("fault-hold", {"hold": True})
END_NODE = _node("fault-end", {"endFault": True})


def gpu_indices(count: int, gpus: int) -> list[int]:
    """The GPUs a fault on ``count`` of a node's ``gpus`` GPUs hits: the first ones by index,
    so that a fault plan, DCGM's series and a DRA driver name the same devices."""
    return list(range(min(count, gpus)))


def node_gpus(node: Mapping[str, Any]) -> tuple[int, bool]:
    """How many GPUs a Node has, and whether it offers them as the nvidia.com/gpu resource:
    its capacity says so for the device plugin's resource; a node that offers them only as DRA
    devices counts them in its GPU Feature Discovery label nvidia.com/gpu.count."""
    capacity = (node.get("status") or {}).get("capacity") or {}
    if "nvidia.com/gpu" in capacity:
        return _count(capacity["nvidia.com/gpu"]), True
    labels = (node.get("metadata") or {}).get("labels") or {}
    return _count(labels.get("nvidia.com/gpu.count", "0")), False


def _count(value: Any) -> int:
    text = str(value)
    return int(text) if text.isdigit() else 0


def node_entry(entry_id: str, fault: Fault, *, gpus: int = 0, extended: bool = True
               ) -> FaultEntry:
    """The entry for a node fault (not Delete: the pool holds a deleted node). ``gpus``: how
    many GPUs the node has; ``extended``: whether it offers them as the nvidia.com/gpu resource
    (else only as DRA devices).

    A GPUXid hits the node's first GPUs by index (gpu-0 first, as many as the fault's
    ``gpus``, default 1), recorded in its stage's ``gpus.indices`` so that DCGM's series and
    the DRA devices name the same ones. One that needs a reset takes them out of service:
    allocatable nvidia.com/gpu drops by that many, and their DRA devices, if the node
    publishes any, are tainted out. A Condition that heats or throttles GPUs (``fault.gpu``)
    hits the first ``fault.gpus`` of them, default all."""
    kind = fault.type
    if kind == "NotReady":
        condition = {"type": "Ready", "status": "False",
                     "reason": fault.reason or "KubeletNotReady",
                     "message": fault.message or NOT_READY_MESSAGE}
        stages = _stages(_node("fault-not-ready", {"heartbeat": True, "conditions": [condition]},
                               _is_not("ready", "False")), HOLD_NODE)
        recovery = _stages(_node("fault-recover", {"heartbeat": True, "conditions": [READY],
                                                   "endFault": True}))
    elif kind == "Unreachable":
        stages = _stages(_node("fault-unreachable", {"heartbeat": False},
                               _is("heartbeat", "true")), HOLD_NODE)
        recovery = _stages(_node("fault-recover", {"heartbeat": True, "conditions": [READY],
                                                   "endFault": True}))
    elif kind == "Condition":
        assert fault.condition is not None
        wanted = fault.condition.model_dump()
        effect: dict[str, Any] = {"conditions": [wanted]}
        healthy = {"type": wanted["type"], "status": "False" if wanted["status"] == "True"
                   else "True", "reason": "FaultRecovered",
                   "message": f"{wanted['type']} cleared: the fault plan recovered it"}
        undo: dict[str, Any] = {"conditions": [healthy], "endFault": True}
        hit = gpu_indices(fault.gpus or gpus, gpus)
        if fault.gpu is not None and hit:
            effect["gpus"] = {"indices": hit, **fault.gpu.model_dump(exclude_none=True)}
            undo["gpus"] = {"indices": hit, "reset": True}
        stages = _stages(_node("fault-condition", effect,
                               _is_not(f"conditions[{wanted['type']}]", wanted["status"])))
        recovery = _stages(_node("fault-recover", undo))
    elif kind == "GPUXid":
        assert fault.xid is not None
        xid = describe(fault.xid)
        failed = min(fault.gpus or 1, gpus) if gpus else 0
        message = fault.message or (f"Xid {xid.code} ({xid.description}) on {failed or 1} "
                                    f"GPU(s)" + ("; the GPU needs a reset" if xid.fatal else ""))
        effect = {"events": [{"type": "Warning", "reason": "GPUXid", "message": message}]}
        hit = gpu_indices(failed, gpus)
        if hit:
            # Which GPUs, recorded where every reader of the stage finds them: DCGM's series
            # and a DRA driver's devices name the same ones.
            effect["gpus"] = {"indices": hit, "xid": xid.code,
                              **({"healthy": False} if xid.fatal else {})}
        if xid.fatal:
            effect["conditions"] = [{"type": GPU_CONDITION, "status": "False",
                                     "reason": f"Xid{xid.code}", "message": message}]
            effect["taints"] = [{"key": keys.GPU_XID, "value": str(xid.code),
                                 "effect": "NoExecute"}]
            if gpus and extended:
                effect["allocatable"] = {"nvidia.com/gpu": str(gpus - failed)}
            stages = _stages(_node("fault-xid", effect,
                                   _is_not(f"conditions[{GPU_CONDITION}]", "False")))
            reset: dict[str, Any] = {
                "conditions": [{"type": GPU_CONDITION, "status": "True", "reason": "GPUReset",
                                "message": "the GPUs were reset and pass health checks"}],
                "removeTaints": [keys.GPU_XID], "endFault": True}
            if gpus and extended:
                reset["allocatable"] = {"nvidia.com/gpu": None}
            if hit:
                reset["gpus"] = {"indices": hit, "reset": True}
            recovery = _stages(_node("fault-recover", reset))
        else:
            # Signals only: an Event, once; nothing to undo.
            effect["endFault"] = True
            stages = _stages(_node("fault-xid", effect))
            recovery = _stages(END_NODE)
    elif kind == "Cordon":
        stages = _stages(_node("fault-cordon", {"unschedulable": True},
                               _is_not("unschedulable", "true")))
        recovery = _stages(_node("fault-recover", {"unschedulable": False, "endFault": True}))
    elif kind == "Taint":
        assert fault.taint is not None
        taint = fault.taint.model_dump()
        stages = _stages(_node("fault-taint", {"taints": [taint]},
                               _is_not(f"taints[{taint['key']}]", taint["effect"])))
        recovery = _stages(_node("fault-recover", {"removeTaints": [taint["key"]],
                                                   "endFault": True}))
    else:
        raise ValueError(f"{kind} is not a fault the node carries")
    return FaultEntry(id=entry_id, stages=stages, recovery=recovery)


RUNNING = ("Running",)
ALIVE = ("Pending", "Initializing", "Running", "BackOff")


def one_shot_restarts(entries: list[FaultEntry], restarts: int) -> int:
    """The restart count a new one-shot exit is written for, given the pod's ``restarts`` and
    the entries already on it: one past the last exit still waiting to fire. Two exits injected
    before the engine got to the first (an engine restart, a pod in back-off) then make two
    restarts, one after the other, rather than one exit at a count both were written for."""
    waiting = [int(requirement.values[0]) for entry in entries if entry.state == "inject"
               for stage in entry.stages if stage.resource == "Pod"
               for requirement in stage.selector.matchExpressions
               if requirement.key == "restarts" and requirement.operator == "In"
               and requirement.values and requirement.values[0].isdigit()
               and int(requirement.values[0]) >= restarts]
    return max(waiting) + 1 if waiting else restarts


def pod_entry(entry_id: str, fault: Fault, *, restarts: int = 0) -> FaultEntry:
    """The entry for a pod fault. ``restarts``: the pod's restart count when the fault is
    written; a one-shot exit fires only while it is still that, so an engine restarted between
    writing the exit and marking the entry done does not make the container exit again."""
    kind = fault.type
    once = _is("restarts", str(restarts))
    if kind == "ContainerExit":
        stages = _stages(_pod("fault-exit", {"exit": {
            "exitCode": fault.exitCode, "reason": fault.reason or "Error",
            "message": fault.message or ""}, "endFault": True}, once, phases=RUNNING))
    elif kind == "OOMKilled":
        stages = _stages(_pod("fault-oom", {"exit": {
            "exitCode": 137, "reason": "OOMKilled", "message": fault.message or ""},
            "endFault": True}, once, phases=RUNNING))
    elif kind == "Evict":
        stages = _stages(_pod("fault-evict", {"evict": {
            "reason": fault.reason or "Evicted",
            "message": fault.message or "The node was low on resource: memory."},
            "conditions": [{"type": "DisruptionTarget", "status": "True",
                            "reason": "TerminationByKubelet",
                            "message": fault.message or "The node was low on resource: "
                                                        "memory."}],
            "endFault": True}, phases=ALIVE))
    elif kind == "CrashLoop":
        # Every start crashes at once; the default pod-restart stage restarts it after the
        # kubelet's back-off, which grows as it would.
        stages = _stages(_pod("fault-crash", {"exit": {
            "exitCode": fault.exitCode or 1, "reason": "Error",
            "message": fault.message or ""}}, phases=RUNNING))
    elif kind == "StuckPending":
        reason = fault.reason or "ContainerCreating"
        message = fault.message or _WAITING.get(reason, "")
        stages = _stages(
            _pod("fault-wait", {"wait": {"reason": reason, "message": message}},
                 _is_not("waiting", reason), phases=("Pending",)),
            _pod("fault-hold", {"hold": True}, phases=("Pending",)))
    else:
        raise ValueError(f"{kind} is not a fault the pod carries")
    recovery = _stages({"name": "fault-end", "resource": "Pod", "effect": {"endFault": True}})
    return FaultEntry(id=entry_id, stages=stages, recovery=recovery)


_WAITING = {
    "ImagePullBackOff": 'Back-off pulling image: the image registry is unreachable',
    "ErrImagePull": "failed to pull and unpack image: the image registry is unreachable",
    "CreateContainerConfigError": 'configmap "config" not found',
}

#: Control-plane faults and the component each stops.
COMPONENTS = {
    "APIServerDown": "kube-apiserver",
    "SchedulerDown": "kube-scheduler",
    "ControllerManagerDown": "kube-controller-manager",
}


def cluster_entry(entry_id: str, fault: Fault) -> FaultEntry:
    """The FakeCluster's entry for a cluster fault: of its control plane, or of its link to the
    federation hub."""
    if fault.type == "APIServerSlow":
        return FaultEntry(id=entry_id, latency=fault.latency)
    if fault.type == "HubPartition":
        return FaultEntry(id=entry_id, hub=HubLink(partition=fault.direction or "both"))
    if fault.type == "HubLatency":
        return FaultEntry(id=entry_id, hub=HubLink(latency=fault.latency))
    return FaultEntry.model_validate({"id": entry_id, "stop": [COMPONENTS[fault.type]]})
