"""Workload Jobs in a member: the Job a ``CreateJob`` command asks for, and what the member's
API shows of it, as the hub's ``JobProgress``. Pure: no I/O.

Times. The API's own timestamps have whole seconds, too coarse for the latencies a scheduler
tester reads (admission within a second is the common case), so the hub link stamps each step
when its watch shows it, to the millisecond. A Job first seen already past a step (after an
operator restart, or a relist) takes the API's timestamp for that step instead: late news gets
the time the API recorded, never the time it was read.

The Job carries the trace context of the member's execution of its command
(``fakefleet.dev/traceparent``, as FaultPlans do), so that its results reach the hub in the
workload's trace.

Steps: created (the object exists), admitted (``status.startTime`` is set: the Job controller
let it start; or, with Kueue, its Workload's ``Admitted`` condition, whichever shows first),
running (``status.ready`` equals the gang: every pod ready at once), finished (condition
Complete or Failed).

A Job that a MultiKueue manager sent to a worker runs as a copy there, and the manager's Job
shows the copy's status only once the manager's Kueue copies it over, which under load came
minutes late (1000 Jobs over 3 workers: the manager's Jobs showed their pods running only when
they were done). So for such a Job the manager's Workload tells admitted and the worker chosen,
and the worker's copy tells running and released (its pods ended, their GPUs free again; the
manager's Job is marked finished when Kueue syncs it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from federation.api import member_pb2
from operators.hublink import convert
from operators.k8s.times import parse
from primitives import keys
from primitives.names import DEFAULT_NAMESPACE, member_name
from primitives.stamps import STEPS, Stamps

COMMAND_ANNOTATION = keys.FLEET_COMMAND
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU = "nvidia.com/gpu"
#: Never pulled: the nodes are simulated, the image only has to be a valid reference.
IMAGE = "registry.k8s.io/pause:3.10"
JOBS_PATH = "/apis/batch/v1/jobs"


def job_object(command: member_pb2.Command, traceparent: str = "") -> dict[str, Any]:
    """The batch/v1 Job of a CreateJob: a gang of ``pods`` that each succeed after the run
    time, failing as a whole at the first pod that fails (the hub decides about retries);
    ``traceparent``: the context of the command's execution, if traced."""
    job = command.create_job
    resources = dict(job.resources)
    labels = dict(job.labels)
    job_labels = labels | ({QUEUE_LABEL: job.queue} if job.queue else {})
    seconds = job.run_time.ToNanoseconds() / 1e9
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": IMAGE,
                        "resources": {"requests": resources, "limits": resources}}],
    }
    if GPU in resources:
        # As NVIDIA's device plugin deployments do (ExtendedResourceToleration): GPU nodes are
        # tainted nvidia.com/gpu:NoSchedule, and a pod that asks for GPUs tolerates it.
        pod_spec["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    if job.priority_class:
        pod_spec["priorityClassName"] = job.priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": job_labels,
                     "annotations": convert.command_annotations(command, traceparent)},
        "spec": {
            "parallelism": job.pods,
            "completions": job.pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels,
                             "annotations": {keys.RUN_TIME: f"{seconds:.3f}s"}},
                "spec": pod_spec,
            },
        },
    }


def api_time(value: str | None) -> float:
    return parse(value) if value else 0.0


@dataclasses.dataclass
class Seen(Stamps):
    """When the hub link saw each step of one Job (0: not yet; ``released`` stays 0 for a Job
    that ran here, whose end is ``finished``), and where a scheduler here placed it."""

    placed_on: str = ""
    clusters: tuple[str, ...] = ()


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition  # type: ignore[no-any-return]
    return None


def _stamp(now: float, live: bool, api_value: str | None, floor: float = 0.0) -> float:
    """``now`` for a live change (a watch event); else the API's own time of it, which has
    whole seconds, so no earlier than ``floor`` (the step before it)."""
    return now if live else max(api_time(api_value) or now, floor)


def observe(job: Mapping[str, Any], seen: Seen, now: float, *, live: bool) -> None:
    """Stamp the steps ``job`` shows that ``seen`` has not: with ``now`` when the change is
    ``live`` (a watch event), else with the API's own time of it."""
    status = job.get("status") or {}
    spec = job.get("spec") or {}

    def stamp(api_value: str | None) -> float:
        return _stamp(now, live, api_value)

    if not seen.created:
        seen.created = stamp(job["metadata"].get("creationTimestamp"))
    if not seen.admitted and status.get("startTime"):
        seen.admitted = stamp(status.get("startTime"))
    gang = int(spec.get("parallelism") or 1)
    if not seen.running and int(status.get("ready") or 0) >= gang:
        seen.running = now if live else (seen.admitted or now)
    finished = _condition(job, "Complete") or _condition(job, "Failed")
    if not seen.finished and finished is not None:
        seen.finished = stamp(status.get("completionTime")
                              or finished.get("lastTransitionTime"))
        seen.admitted = seen.admitted or seen.finished
        seen.running = seen.running or seen.finished  # too quick to see: as long as it took


def admitted(workload: Mapping[str, Any]) -> bool:
    """Whether Kueue admitted the Workload."""
    return _condition(workload, "Admitted") is not None


def observe_workload(workload: Mapping[str, Any], seen: Seen, now: float, *,
                     live: bool) -> None:
    """Stamp admission from the Job's Kueue Workload (condition ``Admitted``: with MultiKueue,
    once a worker reserved quota for it) and take the worker it names. The condition's time
    has whole seconds: late news of it is taken as no earlier than the Job's creation."""
    place(seen, str((workload.get("status") or {}).get("clusterName") or ""))
    admitted = _condition(workload, "Admitted")
    if not seen.admitted and admitted is not None:
        seen.admitted = _stamp(now, live, admitted.get("lastTransitionTime"), seen.created)


def observe_copy(copy: Mapping[str, Any], seen: Seen, now: float, *, live: bool) -> None:
    """Stamp running and released from the copy of the Job in the worker it was placed on."""
    status = copy.get("status") or {}
    gang = int((copy.get("spec") or {}).get("parallelism") or 1)
    if not seen.running and int(status.get("ready") or 0) >= gang:
        seen.running = _stamp(now, live, status.get("startTime"), seen.admitted)
    finished = _condition(copy, "Complete") or _condition(copy, "Failed")
    if not seen.released and finished is not None:
        seen.released = _stamp(now, live, status.get("completionTime")
                               or finished.get("lastTransitionTime"), seen.running)
        seen.running = seen.running or seen.released  # too quick to see: as long as it took
    # Pods running on the worker mean Kueue admitted the Job: if the Workload's watch is
    # behind the worker's, admission is no later than that.
    seen.admitted = seen.admitted or seen.running


def place(seen: Seen, cluster: str) -> None:
    """The cluster a scheduler in the member put the Job on (its latest, counting changes).
    A move forgets what the copy on the cluster before showed: the Job starts over there."""
    if cluster and cluster != seen.placed_on:
        if seen.placed_on:
            seen.released = 0.0
            if not seen.finished:
                seen.running = 0.0
        seen.placed_on = cluster
        if cluster not in seen.clusters:
            seen.clusters = (*seen.clusters, cluster)


def result(job: Mapping[str, Any], seen: Seen,
           namespace: str = DEFAULT_NAMESPACE) -> member_pb2.CommandResult | None:
    """The Job's result for the hub; None for a Job no command made. ``namespace``: the
    member's, where the workers a scheduler places Jobs on are FakeClusters too (the hub
    knows them by their names in the fleet)."""
    command = ((job.get("metadata") or {}).get("annotations") or {}).get(COMMAND_ANNOTATION)
    if not command:
        return None
    failed = _condition(job, "Failed")
    complete = _condition(job, "Complete")
    if complete is not None:
        phase, message = member_pb2.COMMAND_PHASE_SUCCEEDED, ""
    elif failed is not None:
        phase = member_pb2.COMMAND_PHASE_FAILED
        message = f"{failed.get('reason', '')}: {failed.get('message', '')}".strip(": ")
    else:
        phase, message = member_pb2.COMMAND_PHASE_RUNNING, ""
    metadata = job["metadata"]
    out = member_pb2.CommandResult(
        command_id=command, phase=phase, message=message,
        object=f"Job {metadata.get('namespace', '')}/{metadata.get('name', '')}")
    progress = out.job
    for step in STEPS:
        if value := getattr(seen, step):
            getattr(progress, f"{step}_at").FromNanoseconds(int(value * 1e9))
    progress.placed_on = member_name(namespace, seen.placed_on) if seen.placed_on else ""
    progress.redispatched = max(0, len(seen.clusters) - 1)
    return out
