"""Between the hub's messages and the host's objects: pure functions, no I/O.

A fleet run reaches a member as a ``StartPlan`` command; the member makes it a FaultPlan in the
FakeCluster's namespace, named ``<run id>-<cluster>`` (so a repeated delivery finds it there),
labelled with the run and the cluster, its spec the run's plan with ``startAt`` (the run's
common time zero) and ``clusters: [<cluster>]`` (only this member, however many share the
host). What the FaultPlan's status says goes back as the command's result.

The FaultPlan carries the trace context of the member's execution of the command
(``fakefleet.dev/traceparent``): the operator's FaultPlan handler continues the run's trace
from it, and the results reported of it go to the hub in that context.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from typing import Any

from federation.api import common_pb2, member_pb2
from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.faultplans import FaultPlan
from operators.api.nodepools import FakeNodePool
from primitives import keys

POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def plan_name(run_id: str, cluster: str) -> str:
    return f"{run_id}-{cluster}"


def register_request(cluster: FakeCluster, host: str,
                     capacity: common_pb2.Inventory) -> member_pb2.RegisterRequest:
    status = cluster.status
    version = (status.kubernetesVersion if status else "") or cluster.spec.kubernetesVersion
    return member_pb2.RegisterRequest(cluster=common_pb2.ClusterIdentity(
        name=cluster.metadata["name"], namespace=cluster.metadata["namespace"], host=host,
        labels=cluster.spec.labels, kubernetes_version=version.split("+")[0] if version else "",
        endpoint=status.endpoint if status else ""), capacity=capacity)


def inventory(pools: Iterable[FakeNodePool],
              pods_by_phase: Mapping[str, int]) -> common_pb2.Inventory:
    """Nodes per pool (as the engines wrote the pools' status) and what Ready nodes offer."""
    message = common_pb2.Inventory(pods_by_phase={phase: count for phase, count
                                                  in pods_by_phase.items() if count})
    totals: dict[str, int] = {}
    for pool in sorted(pools, key=lambda p: p.metadata["name"]):
        status = pool.status
        ready, total = (status.readyReplicas, status.replicas) if status else (0, 0)
        capacity = pool.spec.node_capacity()
        message.pools.append(common_pb2.PoolInventory(
            name=pool.metadata["name"], ready=ready, total=total, allocatable=capacity))
        message.nodes_ready += ready
        message.nodes_total += total
        for resource, quantity in capacity.items():
            if quantity.isdigit():  # whole units (pods, GPUs); others are summed by name only
                totals[resource] = totals.get(resource, 0) + int(quantity) * ready
    message.allocatable.update({resource: str(count) for resource, count in totals.items()})
    return message


def count_phases(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(POD_PHASES, 0)
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        counts[phase if phase in counts else "Unknown"] += 1
    return counts


def fault_plan(command: member_pb2.Command, cluster: FakeCluster,
               traceparent: str = "") -> dict[str, Any]:
    """The FaultPlan a StartPlan command makes (the plan JSON is checked by the API server);
    ``traceparent``: the context of the command's execution, if traced."""
    name = cluster.metadata["name"]
    spec = json.loads(command.start_plan.plan)
    if not isinstance(spec, dict):
        raise ValueError("the plan is not a JSON object")
    start = command.start_plan.start_at.ToDatetime(tzinfo=datetime.UTC)
    spec["startAt"] = start.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec["clusters"] = [name]
    return {
        "apiVersion": API_VERSION, "kind": "FaultPlan",
        "metadata": {
            "name": plan_name(command.run_id, name),
            "namespace": cluster.metadata["namespace"],
            "labels": {keys.FLEET_RUN: command.run_id, keys.CLUSTER: name},
            "annotations": command_annotations(command, traceparent),
        },
        "spec": spec,
    }


def command_annotations(command: member_pb2.Command, traceparent: str) -> dict[str, str]:
    """What an object made for a hub command says of it: the command, and the trace context
    of its execution (when traced)."""
    made = {keys.FLEET_COMMAND: command.id}
    if traceparent:
        made[keys.TRACEPARENT] = traceparent
    return made


_PHASES = {
    "Pending": member_pb2.COMMAND_PHASE_RUNNING,
    "Running": member_pb2.COMMAND_PHASE_RUNNING,
    "Succeeded": member_pb2.COMMAND_PHASE_SUCCEEDED,
    "Failed": member_pb2.COMMAND_PHASE_FAILED,
    "Aborted": member_pb2.COMMAND_PHASE_FAILED,
}


def result(plan: Mapping[str, Any]) -> member_pb2.CommandResult | None:
    """Where the FaultPlan of a fleet command stands (None: not one of a fleet run)."""
    metadata = plan.get("metadata") or {}
    command_id = (metadata.get("annotations") or {}).get(keys.FLEET_COMMAND)
    if not command_id:
        return None
    parsed = FaultPlan.model_validate(plan)
    status = parsed.status
    phase = status.phase if status else "Pending"
    message = ""
    if status is not None:
        stalled = next((c for c in status.conditions if c.type == "Stalled"
                        and c.status == "True"), None)
        ready = next((c for c in status.conditions if c.type == "Ready"), None)
        message = stalled.message if stalled else ready.message if ready else ""
    return member_pb2.CommandResult(
        command_id=command_id, phase=_PHASES.get(phase, member_pb2.COMMAND_PHASE_RUNNING),
        verdict=status.verdict if status else "", steps_done=status.stepsDone if status else "",
        message=message[:4096],
        object=f"FaultPlan {metadata.get('namespace')}/{metadata.get('name')}")


def refused(command: member_pb2.Command, why: str) -> member_pb2.CommandResult:
    return member_pb2.CommandResult(command_id=command.id,
                                    phase=member_pb2.COMMAND_PHASE_REFUSED, message=why[:4096])
