"""Between wire messages and the hub's state: the only module that knows both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api import common_pb2, fleet_pb2, member_pb2
from federation.hub.membership import Identity, Inventory, Member, Pool, State
from federation.hub.runs import (
    Command,
    MemberPart,
    Outcome,
    Part,
    Phase,
    Report,
    Run,
    start_id,
)

_STATES = {State.READY: common_pb2.MEMBER_STATE_READY,
           State.UNREACHABLE: common_pb2.MEMBER_STATE_UNREACHABLE}
_OUTCOMES = {member_pb2.COMMAND_PHASE_RUNNING: Outcome.RUNNING,
             member_pb2.COMMAND_PHASE_SUCCEEDED: Outcome.SUCCEEDED,
             member_pb2.COMMAND_PHASE_FAILED: Outcome.FAILED,
             member_pb2.COMMAND_PHASE_REFUSED: Outcome.REFUSED}
_PARTS = {Part.PENDING: fleet_pb2.MEMBER_RUN_STATE_PENDING,
          Part.SENT: fleet_pb2.MEMBER_RUN_STATE_SENT,
          Part.ACKNOWLEDGED: fleet_pb2.MEMBER_RUN_STATE_ACKNOWLEDGED,
          Part.RUNNING: fleet_pb2.MEMBER_RUN_STATE_RUNNING,
          Part.SUCCEEDED: fleet_pb2.MEMBER_RUN_STATE_SUCCEEDED,
          Part.FAILED: fleet_pb2.MEMBER_RUN_STATE_FAILED,
          Part.REFUSED: fleet_pb2.MEMBER_RUN_STATE_REFUSED,
          Part.CANCELLED: fleet_pb2.MEMBER_RUN_STATE_CANCELLED}
_PHASES = {Phase.RUNNING: fleet_pb2.RUN_PHASE_RUNNING,
           Phase.SUCCEEDED: fleet_pb2.RUN_PHASE_SUCCEEDED,
           Phase.FAILED: fleet_pb2.RUN_PHASE_FAILED,
           Phase.CANCELLED: fleet_pb2.RUN_PHASE_CANCELLED}


def timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    if seconds:
        stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def duration(seconds: float) -> Duration:
    value = Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


def identity(message: common_pb2.ClusterIdentity) -> Identity:
    return Identity(name=message.name, host=message.host, labels=dict(message.labels),
                    kubernetes_version=message.kubernetes_version, endpoint=message.endpoint)


def inventory(message: common_pb2.Inventory) -> Inventory:
    return Inventory(
        pools=tuple(Pool(name=p.name, ready=p.ready, total=p.total,
                         allocatable=dict(p.allocatable)) for p in message.pools),
        nodes_ready=message.nodes_ready, nodes_total=message.nodes_total,
        allocatable=dict(message.allocatable), pods_by_phase=dict(message.pods_by_phase))


def inventory_message(value: Inventory) -> common_pb2.Inventory:
    return common_pb2.Inventory(
        pools=[common_pb2.PoolInventory(name=p.name, ready=p.ready, total=p.total,
                                        allocatable=p.allocatable) for p in value.pools],
        nodes_ready=value.nodes_ready, nodes_total=value.nodes_total,
        allocatable=value.allocatable, pods_by_phase=value.pods_by_phase)


def member_message(member: Member) -> common_pb2.Member:
    identity_ = member.identity
    return common_pb2.Member(
        cluster=common_pb2.ClusterIdentity(
            name=identity_.name, host=identity_.host, labels=identity_.labels,
            kubernetes_version=identity_.kubernetes_version, endpoint=identity_.endpoint),
        state=_STATES[member.state], reason=member.reason, message=member.message,
        registered_at=timestamp(member.registered_at),
        last_heartbeat=timestamp(member.last_heartbeat),
        state_since=timestamp(member.state_since), inventory=inventory_message(member.inventory))


def report(message: member_pb2.CommandResult) -> Report:
    return Report(command_id=message.command_id, outcome=_OUTCOMES[message.phase],
                  verdict=message.verdict, steps_done=message.steps_done,
                  message=message.message, object=message.object)


def command_message(command: Command) -> member_pb2.HubMessage:
    if command.stop:
        wire = member_pb2.Command(id=command.id, run_id=command.run_id,
                                  stop_plan=member_pb2.StopPlan(command_id=command.start_id))
    else:
        wire = member_pb2.Command(id=command.id, run_id=command.run_id,
                                  start_plan=member_pb2.StartPlan(
                                      plan=command.plan, start_at=timestamp(command.start_at)))
    return member_pb2.HubMessage(command=wire)


def selector(message: common_pb2.ClusterSelector) -> dict[str, Any]:
    """A selector as plain data (persisted with its run)."""
    return {"names": list(message.names), "matchLabels": dict(message.match_labels),
            "matchExpressions": [{"key": r.key, "operator": r.operator, "values": list(r.values)}
                                 for r in message.match_expressions]}


def selector_message(value: Mapping[str, Any]) -> common_pb2.ClusterSelector:
    return common_pb2.ClusterSelector(
        names=value.get("names", []), match_labels=value.get("matchLabels", {}),
        match_expressions=[common_pb2.LabelRequirement(**r)
                           for r in value.get("matchExpressions", [])])


def selects(value: Mapping[str, Any], member: Identity) -> bool:
    """Whether the selector picks ``member``: every given part must hold."""
    names = value.get("names") or []
    if names and member.name not in names:
        return False
    labels = member.labels
    if any(labels.get(k) != v for k, v in (value.get("matchLabels") or {}).items()):
        return False
    for requirement in value.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], \
            requirement.get("values", [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def run_message(run: Run) -> fleet_pb2.Run:
    return fleet_pb2.Run(
        id=run.id, name=run.name, phase=_PHASES[run.phase], verdict=run.verdict,
        created_at=timestamp(run.created_at), start_at=timestamp(run.start_at),
        finished_at=timestamp(run.finished_at), plan=run.plan,
        clusters=selector_message(run.selector),
        members=[_part_message(run, part) for _, part in sorted(run.parts.items())])


def _part_message(run: Run, part: MemberPart) -> fleet_pb2.MemberRun:
    return fleet_pb2.MemberRun(
        cluster=part.cluster, command_id=start_id(run.id, part.cluster),
        state=_PARTS[part.state], verdict=part.verdict, steps_done=part.steps_done,
        message=part.message, object=part.object,
        acknowledged_at=timestamp(part.acknowledged_at),
        finished_at=timestamp(part.finished_at))
