"""Between wire messages and the hub's state: the only module that knows both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api import common_pb2, fleet_pb2, member_pb2
from federation.hub import workloads as wl
from federation.hub.arrivals import Arrivals, RunTime
from federation.hub.membership import Identity, Inventory, Member, Pool, State
from federation.hub.outcomes import Outcome
from federation.hub.runs import (
    Command,
    MemberPart,
    Part,
    Phase,
    Report,
    Run,
    start_id,
)
from primitives import keys, names
from primitives.selectors import LabelSelector
from primitives.stamps import Stamps

_STATES = {State.READY: common_pb2.MEMBER_STATE_READY,
           State.UNREACHABLE: common_pb2.MEMBER_STATE_UNREACHABLE}
OUTCOMES = {member_pb2.COMMAND_PHASE_RUNNING: Outcome.RUNNING,
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
                    kubernetes_version=message.kubernetes_version, endpoint=message.endpoint,
                    namespace=message.namespace or names.DEFAULT_NAMESPACE)


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
            kubernetes_version=identity_.kubernetes_version, endpoint=identity_.endpoint,
            namespace=identity_.namespace),
        state=_STATES[member.state], reason=member.reason, message=member.message,
        registered_at=timestamp(member.registered_at),
        last_heartbeat=timestamp(member.last_heartbeat),
        state_since=timestamp(member.state_since), inventory=inventory_message(member.inventory))


def report(message: member_pb2.CommandResult) -> Report:
    return Report(command_id=message.command_id, outcome=OUTCOMES[message.phase],
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
    """A selector as plain data (persisted with its run); names as the fleet spells them."""
    return {"names": [names.canonical_member_name(name) for name in message.names],
            "matchLabels": dict(message.match_labels),
            "matchExpressions": [{"key": r.key, "operator": r.operator, "values": list(r.values)}
                                 for r in message.match_expressions]}


def selector_message(value: Mapping[str, Any]) -> common_pb2.ClusterSelector:
    return common_pb2.ClusterSelector(
        names=value.get("names", []), match_labels=value.get("matchLabels", {}),
        match_expressions=[common_pb2.LabelRequirement(**r)
                           for r in value.get("matchExpressions", [])])


def selects(value: Mapping[str, Any], member: Identity) -> bool:
    """Whether the selector picks ``member``: every given part must hold."""
    chosen = value.get("names") or []
    if chosen and member.key not in chosen:
        return False
    return LabelSelector.of(value).matches(member.labels)


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


# -- workloads ----------------------------------------------------------------------------------

_WORKLOAD_PHASES = {wl.Phase.RUNNING: fleet_pb2.WORKLOAD_PHASE_RUNNING,
                    wl.Phase.SUCCEEDED: fleet_pb2.WORKLOAD_PHASE_SUCCEEDED,
                    wl.Phase.FAILED: fleet_pb2.WORKLOAD_PHASE_FAILED,
                    wl.Phase.CANCELLED: fleet_pb2.WORKLOAD_PHASE_CANCELLED}
DEFAULT_NAMESPACE = "default"


def seconds(stamp: Timestamp) -> float:
    return stamp.ToNanoseconds() / 1e9


def workload_settings(spec: fleet_pb2.WorkloadSpec) -> wl.Settings:
    """The validated spec as the hub acts on it (defaults filled in)."""
    target = spec.target
    return wl.Settings(
        jobs=spec.jobs, pods=spec.pods_per_job, resources=dict(spec.resources),
        namespace=spec.namespace or DEFAULT_NAMESPACE, labels=dict(spec.labels),
        priority_class=spec.priority_class, queue=target.queue,
        placement=target.placement,  # type: ignore[arg-type]  # validated
        selector=selector(target.clusters),
        weights={names.canonical_member_name(name): w for name, w in target.weights.items()},
        manager=names.canonical_member_name(target.manager) if target.manager else "",
        seed=spec.seed, max_attempts=spec.max_attempts or 1)


def arrivals(message: fleet_pb2.ArrivalProcess) -> Arrivals:
    return Arrivals(kind=message.process,  # type: ignore[arg-type]  # validated
                    rate=message.rate, times=tuple(message.times))


def run_time(message: fleet_pb2.RunTimeDistribution) -> RunTime:
    return RunTime(kind=message.distribution,  # type: ignore[arg-type]  # validated
                   seconds=message.seconds, low=message.low, high=message.high,
                   sigma=message.sigma, cap=message.cap or None)


def spec_data(spec: fleet_pb2.WorkloadSpec) -> dict[str, object]:
    return json_format.MessageToDict(spec)


def progress(message: member_pb2.CommandResult) -> wl.Progress:
    job = message.job
    return wl.Progress(
        outcome=OUTCOMES[message.phase],
        stamps=Stamps(created=seconds(job.created_at), admitted=seconds(job.admitted_at),
                      running=seconds(job.running_at), finished=seconds(job.finished_at),
                      released=seconds(job.released_at)),
        placed_on=job.placed_on, redispatched=job.redispatched, message=message.message)


def job_command_message(workload: wl.Workload, job: wl.JobRecord) -> member_pb2.HubMessage:
    command = workload.command(job)
    settings = workload.settings
    labels = dict(settings.labels) | {keys.WORKLOAD: workload.id}
    return member_pb2.HubMessage(command=member_pb2.Command(
        id=command.id, run_id=workload.id,
        create_job=member_pb2.CreateJob(
            namespace=settings.namespace, name=command.name, pods=settings.pods,
            resources=settings.resources, run_time=duration(command.run_seconds),
            priority_class=settings.priority_class, labels=labels, queue=settings.queue,
            workload_id=workload.id, index=job.index)))


def delete_command_message(workload: wl.Workload, cluster: str) -> member_pb2.HubMessage:
    return member_pb2.HubMessage(command=member_pb2.Command(
        id=wl.delete_id(workload.id, cluster), run_id=workload.id,
        delete_jobs=member_pb2.DeleteJobs(workload_id=workload.id,
                                          namespace=workload.settings.namespace)))


def _counts(counts: wl.Counts) -> fleet_pb2.JobCounts:
    return fleet_pb2.JobCounts(**vars(counts))


def _latency(value: wl.Latency) -> fleet_pb2.Latency:
    return fleet_pb2.Latency(count=value.count, p50=value.p50, p99=value.p99, max=value.max)


def report_message(workload: wl.Workload, now: float) -> fleet_pb2.WorkloadReport:
    report = workload.report(now)
    return fleet_pb2.WorkloadReport(
        counts=_counts(report.counts),
        to_admission=_latency(report.timings.to_admission),
        to_running=_latency(report.timings.to_running),
        to_completion=_latency(report.timings.to_completion),
        clusters=[fleet_pb2.ClusterReport(
            cluster=c.cluster, counts=_counts(c.counts),
            to_admission=_latency(c.timings.to_admission),
            to_running=_latency(c.timings.to_running),
            to_completion=_latency(c.timings.to_completion)) for c in report.clusters],
        admitted_per_second=report.admitted_per_second, makespan_seconds=report.makespan,
        gpu_utilisation_mean=report.utilisation_mean,
        gpu_utilisation_peak=report.utilisation_peak,
        utilisation=[fleet_pb2.UtilisationSample(at=timestamp(at), allocated=int(allocated),
                                                 total=int(total))
                     for at, allocated, total in workload.samples],
        redispatched=report.redispatched, recovery=_latency(report.recovery))


def workload_message(workload: wl.Workload, now: float, *,
                     jobs: bool = False) -> fleet_pb2.Workload:
    message = fleet_pb2.Workload(
        id=workload.id, name=workload.name, phase=_WORKLOAD_PHASES[workload.phase],
        created_at=timestamp(workload.created_at), start_at=timestamp(workload.start_at),
        finished_at=timestamp(workload.finished_at),
        report=report_message(workload, now), reason=workload.reason,
        message=workload.message, deleting=sorted(workload.deleting))
    json_format.ParseDict(workload.spec, message.spec)
    if jobs:
        message.jobs.extend(fleet_pb2.WorkloadJob(
            index=job.index, name=wl.job_name(workload.id, job.index, job.attempt),
            cluster=job.cluster, placed_on=job.placed_on, attempt=job.attempt,
            state=job.state.value, message=job.message, arrive_at=timestamp(job.arrive_at),
            admitted_at=timestamp(job.admitted_at), running_at=timestamp(job.running_at),
            finished_at=timestamp(job.finished_at), run_seconds=job.run_seconds,
            released_at=timestamp(job.released_at))
            for job in workload.jobs)
    return message
