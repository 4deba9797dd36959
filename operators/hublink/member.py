"""The member a hub link speaks for: a FakeCluster, observed and acted on through the host API.

It implements :class:`federation.client.member.Member`. Everything it tells the hub comes from
what the API shows, never from memory alone: the Hello lists the FaultPlans of fleet runs that
exist for the cluster (so after an operator restart the hub still resends nothing that ran),
and a command is acknowledged once its FaultPlan exists (a delivery that finds it there is a
duplicate, executed once). A plan the API server refuses is reported Refused with its message.
Transient API errors are retried with back-off; the command waits, and the hub keeps it.

:meth:`HostMember.observe` runs beside the link: it reports each fleet FaultPlan whose result
changed, and refreshes the inventory (pools often, the member's pods more rarely: listing every
pod is the one expensive read here).

Tracing: :meth:`HostMember.execute` runs in the link's ``member.execute_command`` span; the
FaultPlan or Job it creates carries that span's context (annotation
``fakefleet.dev/traceparent``), and every result of a command is reported in the context its
object carries, read back from the API like the rest of the result (so after an operator
restart too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from federation.api import common_pb2, member_pb2
from federation.client.member import LinkFaults
from federation.client.tracing import within
from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.injections import hub_link_faults
from operators.api.nodepools import FakeNodePool
from operators.hublink import convert, jobs
from operators.k8s.client import Client
from operators.k8s.errors import (
    BadRequest,
    Conflict,
    Invalid,
    K8sError,
    NotFound,
    TransportError,
    Unauthorized,
    transient,
)
from operators.k8s.retrying import Backoff
from operators.k8s.watching import list_all, list_and_watch
from primitives import keys, propagation
from primitives.clocks import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

BASE = f"/apis/{API_VERSION}/namespaces/{{namespace}}"
#: How often fleet FaultPlans are looked at for results, pools for node counts (s).
OBSERVE_EVERY = 1.0
POOLS_EVERY = 5.0
#: How often the member's pods are counted by phase (a list of every pod) (s).
PODS_EVERY = 30.0
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


async def _no_workers(name: str) -> Client | None:
    return None


class HostMember:
    def __init__(self, host: Client, namespace: str, name: str, *, host_id: str,
                 annotations: Callable[[], Mapping[str, str]],
                 member_client: Callable[[], Client | None] = lambda: None,
                 worker_client: Callable[[str], Awaitable[Client | None]] = _no_workers,
                 on_state: Callable[[bool, str], None] = lambda up, message: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.host = host
        self.namespace = namespace
        self.name = name
        self.host_id = host_id
        self._annotations = annotations
        self._member_client = member_client
        #: A client of the FakeCluster of that name beside this one (a MultiKueue worker).
        self._worker_client = worker_client
        self._on_state = on_state
        self.clock = clock
        #: Where results go (the link's report, once it exists).
        self.report: Callable[[member_pb2.CommandResult], None] = lambda result: None
        self._inventory = common_pb2.Inventory()
        self._inventory_sent: bytes = b""
        self._pods: dict[str, int] = {}
        self._reported: dict[str, bytes] = {}
        #: Commands refused by the API server (nothing exists for them to observe).
        self._refused: dict[str, member_pb2.CommandResult] = {}
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

    @property
    def _plans(self) -> str:
        return BASE.format(namespace=self.namespace) + "/faultplans"

    @property
    def _selector(self) -> dict[str, str]:
        return {"labelSelector": f"{keys.FLEET_RUN},{keys.CLUSTER}={self.name}"}

    # -- what the link asks ---------------------------------------------------------------------

    async def introduce(self) -> member_pb2.RegisterRequest:
        cluster = FakeCluster.model_validate(await self.host.get(
            BASE.format(namespace=self.namespace) + f"/fakeclusters/{self.name}"))
        await self._refresh_pools()
        return convert.register_request(cluster, self.host_id, self._inventory)

    async def inventory(self) -> common_pb2.Inventory | None:
        encoded = self._inventory.SerializeToString(deterministic=True)
        if encoded == self._inventory_sent:
            return None
        self._inventory_sent = encoded
        return self._inventory

    async def resync(self) -> list[member_pb2.CommandResult]:
        self._inventory_sent = b""  # a new session: the hub gets the inventory again
        listed = await self.host.get(self._plans, self._selector)
        results = [r for plan in listed.get("items", []) if (r := convert.result(plan))]
        results += await self._job_results()
        self._reported = {r.command_id: r.SerializeToString() for r in results}
        return results + list(self._refused.values())

    async def _job_results(self) -> list[member_pb2.CommandResult]:
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
                if (r := jobs.result(job, self._seen_of(job))) is not None]

    async def execute(self, command: member_pb2.Command) -> bool:
        backoff = Backoff(base=0.5, cap=10.0)
        while True:
            try:
                action = command.WhichOneof("action")
                if action == "stop_plan":
                    return await self._stop(command)
                if action == "create_job":
                    return await self._create_job(command)
                return await self._start(command)
            except K8sError as error:
                if not transient(error):
                    raise
                logger.warning("hub command %s in %s/%s: %s (retrying)", command.id,
                               self.namespace, self.name, error)
                await self.clock.sleep(backoff.next())

    async def _start(self, command: member_pb2.Command) -> bool:
        if command.id in self._refused:
            return True
        cluster = FakeCluster.model_validate(await self.host.get(
            BASE.format(namespace=self.namespace) + f"/fakeclusters/{self.name}"))
        try:
            plan = convert.fault_plan(command, cluster, propagation.traceparent())
        except ValueError as error:
            self._refuse(command, f"the plan is not a FaultPlan spec: {error}")
            return False
        try:
            created = await self.host.create(self._plans, plan)
        except Conflict:
            return True  # delivered before: it exists, so it ran (or runs) once
        except (Invalid, BadRequest) as error:
            self._refuse(command, f"the API server refused FaultPlan "
                                  f"{plan['metadata']['name']}: {error}")
            return False
        logger.info("hub command %s: FaultPlan %s/%s created", command.id, self.namespace,
                    created["metadata"]["name"])
        if (result := convert.result(created)) is not None:
            self._send(result, _traceparent_of(created))
        return False

    async def _stop(self, command: member_pb2.Command) -> bool:
        start_id = command.stop_plan.command_id
        name = convert.plan_name(command.run_id, self.name)
        try:
            await self.host.delete(f"{self._plans}/{name}")
            message = f"FaultPlan {self.namespace}/{name} deleted: its faults are recovered"
        except NotFound:
            message = f"FaultPlan {self.namespace}/{name} was not there"
        self._refused.pop(start_id, None)
        self._send(member_pb2.CommandResult(command_id=command.id, message=message,
                                            phase=member_pb2.COMMAND_PHASE_SUCCEEDED),
                   propagation.traceparent())
        return False

    async def _create_job(self, command: member_pb2.Command) -> bool:
        """Create the Job (its namespace too, if missing); a Job of that name is this
        command's, delivered before."""
        if command.id in self._refused:
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
                self._refuse(command, f"the API server of {self.name} refused Job "
                                      f"{namespace}/{job['metadata']['name']}: {error}")
                return False
            self._on_job(created, live=True)
            return False
        raise TransportError(f"namespace {namespace} vanished while creating Job "
                             f"{job['metadata']['name']}")

    def _refuse(self, command: member_pb2.Command, why: str) -> None:
        logger.warning("hub command %s refused: %s", command.id, why)
        result = convert.refused(command, why)
        self._refused[command.id] = result
        self._send(result, propagation.traceparent())

    def _send(self, result: member_pb2.CommandResult, traceparent: str) -> None:
        """Report ``result`` in the context of its command's execution ("": untraced)."""
        self._reported[result.command_id] = result.SerializeToString()
        with within(traceparent):
            self.report(result)

    def faults(self) -> LinkFaults:
        faults = hub_link_faults(self._annotations())
        return LinkFaults(to_hub_dropped=faults.to_hub_dropped,
                          from_hub_dropped=faults.from_hub_dropped, latency=faults.latency)

    def connected(self, up: bool, message: str) -> None:
        self._on_state(up, message)

    # -- beside the link ------------------------------------------------------------------------

    async def observe(self, stop_flag: asyncio.Event) -> None:
        """Report results as the FaultPlans and workload Jobs change; keep the inventory
        fresh. Watches: the member's workload Jobs; once a queued Job exists, Kueue's Workloads;
        and in each worker a scheduler placed Jobs on, their copies."""
        pools_at = pods_at = 0.0
        watchers: dict[str, asyncio.Task[None]] = {}
        worker_at: dict[str, float] = {}
        watched: Client | None = None
        try:
            while not stop_flag.is_set():
                client = self._member_client()
                if client is not watched:  # a (new) API server: watch its Jobs
                    await _cancel(watchers.pop(JOBS, None), watchers.pop(KUEUE, None))
                    self._jobs_synced = False
                    watched = client
                    if client is not None:
                        watchers[JOBS] = asyncio.create_task(
                            self._watch_jobs(client), name=f"hublink-jobs-{self.name}")
                if client is not None and KUEUE not in watchers and self._queued_jobs():
                    watchers[KUEUE] = asyncio.create_task(
                        self._watch_workloads(client), name=f"hublink-kueue-{self.name}")
                now = self.clock.now()
                for worker in self._workers():
                    if WORKER + worker not in watchers and now >= worker_at.get(worker, 0.0):
                        worker_at[worker] = now + WORKER_RETRY
                        if (worker_api := await self._worker_client(worker)) is not None:
                            watchers[WORKER + worker] = asyncio.create_task(
                                self._watch_copies(worker, worker_api),
                                name=f"hublink-copies-{self.name}-{worker}")
                try:
                    await self._report_changes()
                    if now >= pods_at:
                        await self._refresh_pods()
                        pods_at = now + PODS_EVERY
                    if now >= pools_at:
                        await self._refresh_pools()
                        pools_at = now + POOLS_EVERY
                except K8sError as error:
                    logger.warning("hub link of %s/%s cannot observe: %s", self.namespace,
                                   self.name, error)
                await self.clock.wait(stop_flag, OBSERVE_EVERY)
        finally:
            await _cancel(*watchers.values())

    async def _watch_jobs(self, client: Client) -> None:
        await list_and_watch(client, jobs.JOBS_PATH, {"labelSelector": keys.WORKLOAD},
                             on_list=lambda items: self._on_jobs_listed(items, live=False),
                             on_event=self._on_job_event, clock=self.clock)

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
            self._on_job(job, live=live)

    def _on_job_event(self, kind: str, job: Any) -> None:
        command = self._command_of(job)
        if not command:
            return
        if kind == "DELETED":
            self._jobs.pop(command, None)
            self._seen.pop(command, None)
            self._commands.pop(job["metadata"].get("uid", ""), None)
            return
        self._on_job(job, live=True)

    def _on_job(self, job: dict[str, Any], *, live: bool) -> None:
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
        parts = command.split("/")
        return command if len(parts) == 3 and parts[1] == self.name else ""

    def _seen_of(self, job: dict[str, Any]) -> jobs.Seen:
        return self._seen.setdefault(self._command_of(job), jobs.Seen())

    def _report_job(self, job: dict[str, Any]) -> None:
        result = jobs.result(job, self._seen_of(job))
        if result is None:
            return
        if self._reported.get(result.command_id) != result.SerializeToString():
            self._send(result, _traceparent_of(job))

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
                                     on_event=self._on_workload_event, clock=self.clock)
            await self.clock.sleep(KUEUE_RETRY)

    def _on_workloads_listed(self, items: list[Any]) -> None:
        self._workloads = {}
        for workload in items:
            self._on_workload(workload, live=False)

    def _on_workload_event(self, kind: str, workload: Any) -> None:
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

    async def _report_changes(self) -> None:
        listed = await self.host.get(self._plans, self._selector)
        for plan in listed.get("items", []):
            result = convert.result(plan)
            if result is None:
                continue
            encoded = result.SerializeToString()
            if self._reported.get(result.command_id) != encoded:
                self._send(result, _traceparent_of(plan))

    async def _refresh_pools(self) -> None:
        listed = await self.host.get(BASE.format(namespace=self.namespace) + "/fakenodepools")
        pools = [FakeNodePool.model_validate(item) for item in listed.get("items", [])
                 if (item.get("spec") or {}).get("clusterRef") == self.name]
        self._inventory = convert.inventory(pools, self._pods)

    async def _refresh_pods(self) -> None:
        client = self._member_client()
        if client is None:
            return
        # From the API server's watch cache (resourceVersion=0): no etcd read for it.
        listed: dict[str, Any] = await client.get("/api/v1/pods", {"resourceVersion": "0"})
        self._pods = convert.count_phases(listed.get("items", []))


#: Keys of the watches among the link's watchers.
JOBS, KUEUE, WORKER = "jobs", "kueue", "worker/"


def _job_uid(workload: Mapping[str, Any]) -> str:
    return str(((workload.get("metadata") or {}).get("labels") or {})
               .get("kueue.x-k8s.io/job-uid", ""))


async def _cancel(*tasks: asyncio.Task[None] | None) -> None:
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


def _traceparent_of(obj: Mapping[str, Any]) -> str:
    """The trace context an object made for a hub command carries ("" if none)."""
    return propagation.from_annotations((obj.get("metadata") or {}).get("annotations"))
