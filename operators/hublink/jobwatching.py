"""Job commands in a member: the Job a ``CreateJob`` asks for is created in the member's API
server, and three watches follow it until it is done (each supervised: a defect in one is
logged, and it starts again), each step reported as it shows:

- the member's workload Jobs (created, admitted, running, finished);
- once a queued Job exists, Kueue's Workloads (admission, and the worker MultiKueue chose; they
  may show before their Job);
- in each worker a scheduler placed Jobs on, their copies (running, and released).

A command is done once its Job exists: a Job of that name is this command's, delivered before.
One the member's API server refuses is reported Refused. A ``DeleteJobs`` (the hub stopped the
workload) deletes every Job of the workload that a CreateJob made here, with its pods
(propagation Background; a Job already gone is fine), and nothing else: a Job counts only if
it carries the workload's label and the annotation of a CreateJob of this cluster for that
workload, and it is deleted only if it is still the object that was listed (its uid). The
Hello lists every workload Job from the watch once it has listed them, else from a list made
then (a Hello that left one out would tell the hub it was lost).

What a Job looks like and what its steps mean is :mod:`operators.hublink.jobs` (pure); this
module creates, watches and reports. It must not retry a command (the member's
:meth:`~operators.hublink.member.HostMember.execute` does) nor stamp steps itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from federation.api import member_pb2
from operators.hublink import jobs
from operators.hublink.reporting import Reporting
from operators.k8s.client import Client
from operators.k8s.errors import (
    BadRequest,
    Conflict,
    Invalid,
    K8sError,
    NotFound,
    TransportError,
    Unauthorized,
)
from operators.k8s.requests import delete_options
from operators.k8s.watching import list_all, list_and_watch
from primitives import keys, propagation
from primitives.clocks import Clock
from primitives.names import member_name
from primitives.tasks import spawn

logger = logging.getLogger(__name__)

#: Kueue's Workloads, newest version first: watched (for admission and the worker MultiKueue
#: chose) once a queued Job exists; looked for again this often while Kueue serves neither (s).
KUEUE_WORKLOADS = ("/apis/kueue.x-k8s.io/v1beta2/workloads",
                   "/apis/kueue.x-k8s.io/v1beta1/workloads")
KUEUE_RETRY = 10.0
#: How often a worker with no client yet (its FakeCluster not up) is asked for again (s).
WORKER_RETRY = 5.0
#: Connections the member's client needs: each of its two watches (workload Jobs, Kueue's
#: Workloads) holds one for as long as it runs, and requests need their own beside them (with
#: two in all, both watches held both and every request timed out waiting for one). A worker's
#: client runs one watch.
MEMBER_CONNECTIONS = 4
WORKER_CONNECTIONS = 2
#: Keys of the watches among the running ones.
JOBS, KUEUE, WORKER = "jobs", "kueue", "worker/"


class JobWatching:
    """The workload Jobs of one member, as its watches show them."""

    def __init__(self, namespace: str, name: str, *, reporting: Reporting,
                 member_client: Callable[[], Client | None],
                 worker_client: Callable[[str], Awaitable[Client | None]],
                 clock: Clock) -> None:
        self.namespace = namespace
        self.name = name
        #: What the ids of this member's commands name it: its name in the fleet, and its
        #: FakeCluster's name alone in the ids of hubs from before namespaces counted.
        self._names = {member_name(namespace, name), name}
        self.reporting = reporting
        self._member_client = member_client
        #: A client of the FakeCluster of that name beside this one (a MultiKueue worker).
        self._worker_client = worker_client
        self.clock = clock
        #: Workload Jobs of the member as its watch shows them, by command id, with when each
        #: step was seen; ``_jobs_synced`` once the watch listed them all.
        self._jobs: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, jobs.Seen] = {}
        self._jobs_synced = False
        #: Kueue's Workloads of those Jobs by the Job's uid, with when the watch first showed
        #: each admitted (0: not yet, or listed); they may show before the Job. And the Jobs'
        #: commands by uid.
        self._workloads: dict[str, tuple[dict[str, Any], float]] = {}
        self._commands: dict[str, str] = {}
        #: The watches running, by key; the client the Jobs' watch is on; when each worker
        #: with no client yet may be asked for again.
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._watched: Client | None = None
        self._worker_at: dict[str, float] = {}

    # -- commands --------------------------------------------------------------------------------

    async def create(self, command: member_pb2.Command) -> bool:
        """Create the Job (its namespace too, if missing); a Job of that name is this
        command's, delivered before."""
        if command.id in self.reporting.refused:
            return True
        client = self._member_client()
        if client is None:
            raise TransportError(f"cluster {self.name} has no API server yet")
        job = jobs.job_object(command, propagation.traceparent())
        namespace = job["metadata"]["namespace"]
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        for _ in range(2):
            try:
                created = await client.create(path, job)
            except Conflict:
                return True
            except NotFound:
                with contextlib.suppress(Conflict):  # the namespace is missing: make it
                    await client.create("/api/v1/namespaces", {
                        "apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": namespace}})
                continue
            except (Invalid, BadRequest, Unauthorized) as error:
                self.reporting.refuse(command, f"the API server of {self.name} refused Job "
                                               f"{namespace}/{job['metadata']['name']}: {error}")
                return False
            self.on_job(created, live=True)
            return False
        raise TransportError(f"namespace {namespace} vanished while creating Job "
                             f"{job['metadata']['name']}")

    async def delete(self, command: member_pb2.Command) -> bool:
        """Delete the Jobs CreateJob commands made here for the workload, with their pods;
        repeated, it deletes what is left (nothing, once done)."""
        if command.id in self.reporting.refused:
            return True
        client = self._member_client()
        if client is None:
            raise TransportError(f"cluster {self.name} has no API server yet")
        order = command.delete_jobs
        path = f"/apis/batch/v1/namespaces/{order.namespace}/jobs"
        deleted = gone = 0
        try:
            _, items = await list_all(client, path,
                                      {"labelSelector": f"{keys.WORKLOAD}={order.workload_id}"})
            for job in items:
                if not self._made_for(job, order.workload_id):
                    continue  # labelled so, but no CreateJob of this cluster made it
                metadata = job["metadata"]
                try:
                    # Background: the Job goes now, its pods after it (the default for a
                    # Job through the API is Orphan, which would leave them running).
                    await client.delete(f"{path}/{metadata['name']}", body=delete_options(
                        uid=metadata.get("uid", ""), propagation="Background"))
                    deleted += 1
                except (NotFound, Conflict):
                    gone += 1  # gone, or replaced by another object since it was listed
        except (Invalid, BadRequest, Unauthorized) as error:
            self.reporting.refuse(command, f"the API server of {self.name} refused to delete "
                                           f"the Jobs of workload {order.workload_id}: {error}")
            return False
        logger.info("hub command %s: %d Jobs of workload %s deleted in %s (%d gone already)",
                    command.id, deleted, order.workload_id, self.name, gone)
        self.reporting.send(member_pb2.CommandResult(
            command_id=command.id, phase=member_pb2.COMMAND_PHASE_SUCCEEDED,
            message=f"{deleted} Jobs deleted, {gone} gone already"), propagation.traceparent())
        return False

    async def results(self) -> list[member_pb2.CommandResult]:
        """Every workload Job of the member: from the watch once it has listed them, else
        read now (a Hello that left one out would tell the hub it was lost)."""
        if not self._jobs_synced:
            client = self._member_client()
            if client is None:
                return []  # no API server yet: no Job can exist
            _, items = await list_all(client, jobs.JOBS_PATH,
                                      {"labelSelector": keys.WORKLOAD})
            self._on_jobs_listed(items, live=False)
        return [r for job in self._jobs.values()
                if (r := jobs.result(job, self._seen_of(job), self.namespace)) is not None]

    def commands(self) -> set[str]:
        """The commands whose Jobs the watch shows."""
        return set(self._jobs)

    # -- the watches -----------------------------------------------------------------------------

    async def watch_member(self) -> None:
        """Watch the Jobs of the member's API server (again, if it is a new one), and Kueue's
        Workloads once a queued Job exists."""
        client = self._member_client()
        if client is not self._watched:  # a (new) API server: watch its Jobs
            await _cancel(self._watchers.pop(JOBS, None), self._watchers.pop(KUEUE, None))
            self._jobs_synced = False
            self._watched = client
            if client is not None:
                self._watchers[JOBS] = spawn(f"hublink-jobs-{self.name}",
                                             functools.partial(self._watch_jobs, client),
                                             clock=self.clock)
        if client is not None and KUEUE not in self._watchers and self._queued_jobs():
            self._watchers[KUEUE] = spawn(f"hublink-kueue-{self.name}",
                                          functools.partial(self._watch_workloads, client),
                                          clock=self.clock)

    async def watch_workers(self, now: float) -> None:
        """Watch the copies in each worker a scheduler here placed unfinished Jobs on."""
        for worker in self._workers():
            if WORKER + worker not in self._watchers and now >= self._worker_at.get(worker, 0.0):
                self._worker_at[worker] = now + WORKER_RETRY
                if (worker_api := await self._worker_client(worker)) is not None:
                    self._watchers[WORKER + worker] = spawn(
                        f"hublink-copies-{self.name}-{worker}",
                        functools.partial(self._watch_copies, worker, worker_api),
                        clock=self.clock)

    async def unwatch(self) -> None:
        """Stop every watch; watching again starts them anew."""
        watchers, self._watchers = self._watchers, {}
        self._watched, self._worker_at = None, {}
        await _cancel(*watchers.values())

    async def _watch_jobs(self, client: Client) -> None:
        await list_and_watch(client, jobs.JOBS_PATH, {"labelSelector": keys.WORKLOAD},
                             on_list=lambda items: self._on_jobs_listed(items, live=False),
                             on_event=self.on_job_event, clock=self.clock)

    def _on_jobs_listed(self, items: list[Any], *, live: bool) -> None:
        listed = {}
        for job in items:
            command = self._command_of(job)
            if command:
                listed[command] = job
        self._jobs = listed
        self._commands = {}
        self._seen = {command: seen for command, seen in self._seen.items()
                      if command in listed}
        self._jobs_synced = True
        for job in listed.values():
            self.on_job(job, live=live)

    def on_job_event(self, kind: str, job: Any) -> None:
        command = self._command_of(job)
        if not command:
            return
        if kind == "DELETED":
            self._jobs.pop(command, None)
            self._seen.pop(command, None)
            self._commands.pop(job["metadata"].get("uid", ""), None)
            return
        self.on_job(job, live=True)

    def on_job(self, job: dict[str, Any], *, live: bool) -> None:
        command = self._command_of(job)
        if not command:
            return
        self._jobs[command] = job
        self._commands[job["metadata"].get("uid", "")] = command
        seen = self._seen_of(job)
        jobs.observe(job, seen, self.clock.now(), live=live)
        workload, at = self._workloads.get(job["metadata"].get("uid", ""), ({}, 0.0))
        if workload:  # its Workload showed first: as of then
            jobs.observe_workload(workload, seen, at or self.clock.now(), live=bool(at))
        self._report_job(job)

    def _command_of(self, job: Mapping[str, Any]) -> str:
        """The hub command that made ``job`` here; "" for any other Job, including the copy
        a MultiKueue manager made of its own Job in this worker (labels and annotations
        copied: the command is the manager's to report, not this member's)."""
        command = str(((job.get("metadata") or {}).get("annotations") or {})
                      .get(jobs.COMMAND_ANNOTATION, ""))
        _, _, rest = command.partition("/")
        cluster, _, _ = rest.rpartition("/")
        return command if cluster in self._names else ""

    def _made_for(self, job: Mapping[str, Any], workload_id: str) -> bool:
        """Whether a CreateJob of this cluster for ``workload_id`` made ``job`` (its command
        names the cluster as the fleet does, or, from a hub of before, by its name alone)."""
        labels = (job.get("metadata") or {}).get("labels") or {}
        command = self._command_of(job)
        return labels.get(keys.WORKLOAD) == workload_id and any(
            command.startswith(f"{workload_id}/{name}/job-") for name in self._names)

    def _seen_of(self, job: dict[str, Any]) -> jobs.Seen:
        return self._seen.setdefault(self._command_of(job), jobs.Seen())

    def _report_job(self, job: dict[str, Any]) -> None:
        result = jobs.result(job, self._seen_of(job), self.namespace)
        if result is not None:
            self.reporting.update(result, job)

    def _queued_jobs(self) -> bool:
        return any(jobs.QUEUE_LABEL in (job["metadata"].get("labels") or {})
                   for job in self._jobs.values())

    def _workers(self) -> set[str]:
        """The other clusters a scheduler here placed Jobs on that are not finished."""
        return {seen.placed_on for seen in self._seen.values()
                if seen.placed_on and seen.placed_on != self.name and not seen.finished}

    async def _watch_workloads(self, client: Client) -> None:
        """Kueue's Workloads: when each queued Job was admitted, and the worker MultiKueue
        chose for it. Waits for Kueue's API (its CRDs may come after the first queued Job)."""
        while True:
            for path in KUEUE_WORKLOADS:
                try:
                    await client.get(path, {"limit": "1"})
                except NotFound:
                    continue
                except K8sError as error:
                    logger.debug("kueue workloads of %s: %s", self.name, error)
                    break
                await list_and_watch(client, path, {}, on_list=self._on_workloads_listed,
                                     on_event=self.on_workload_event, clock=self.clock)
            await self.clock.sleep(KUEUE_RETRY)

    def _on_workloads_listed(self, items: list[Any]) -> None:
        self._workloads = {}
        for workload in items:
            self._on_workload(workload, live=False)

    def on_workload_event(self, kind: str, workload: Any) -> None:
        if kind == "DELETED":
            self._workloads.pop(_job_uid(workload), None)
        else:
            self._on_workload(workload, live=True)

    def _on_workload(self, workload: dict[str, Any], *, live: bool) -> None:
        uid = _job_uid(workload)
        if not uid:
            return
        at = self._workloads.get(uid, ({}, 0.0))[1] or (
            self.clock.now() if live and jobs.admitted(workload) else 0.0)
        self._workloads[uid] = (workload, at)
        job = self._jobs.get(self._commands.get(uid, ""))
        if job is not None:
            jobs.observe_workload(workload, self._seen_of(job), self.clock.now(), live=live)
            self._report_job(job)

    async def _watch_copies(self, worker: str, client: Client) -> None:
        """The copies a scheduler here made of this member's Jobs in ``worker``."""
        def on_event(kind: str, copy: Any) -> None:
            if kind != "DELETED":
                self._on_copy(worker, copy, live=True)

        def on_list(items: list[Any]) -> None:
            for copy in items:
                self._on_copy(worker, copy, live=False)

        await list_and_watch(client, jobs.JOBS_PATH, {"labelSelector": keys.WORKLOAD},
                             on_list=on_list, on_event=on_event, clock=self.clock)

    def _on_copy(self, worker: str, copy: dict[str, Any], *, live: bool) -> None:
        command = self._command_of(copy)
        job = self._jobs.get(command)
        seen = self._seen.get(command)
        if job is None or seen is None or seen.placed_on != worker:
            return  # not ours, or not (or no longer) placed there
        jobs.observe_copy(copy, seen, self.clock.now(), live=live)
        self._report_job(job)


def _job_uid(workload: Mapping[str, Any]) -> str:
    return str(((workload.get("metadata") or {}).get("labels") or {})
               .get("kueue.x-k8s.io/job-uid", ""))


async def _cancel(*tasks: asyncio.Task[None] | None) -> None:
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
