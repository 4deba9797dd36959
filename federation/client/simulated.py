"""Simulated members: the member side of the hub protocol with no API server behind it.

For scale tests and the hub benchmark: a thousand of them in one process speak real gRPC to a
hub. Each keeps its commands in memory (what a real member keeps in FaultPlans and Jobs), runs
each once however often it is delivered, and finishes a StartPlan after ``run_seconds``. A
CreateJob is admitted at once, runs after ``job_start_seconds`` and succeeds after its run time
(or fails then, when ``fail_job`` says so for that command); a DeleteJobs stops and forgets the
workload's Jobs, as deleting them does in a real member.

Like a real member, it reports each command's results in the context of the span that
executed it (the link's ``member.execute_command``), so they join the hub's trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Coroutine

from federation.api import common_pb2, member_pb2
from federation.client.member import NO_FAULTS, LinkFaults, MemberLink
from federation.client.tracing import within
from primitives import propagation


@dataclasses.dataclass
class Executed:
    command: member_pb2.Command
    received_at: float
    result: member_pb2.CommandResult
    #: The context of the span that executed it ("" untraced), kept as a real member keeps
    #: it in the annotation of what it created.
    traceparent: str = ""


class SimulatedMember:
    def __init__(self, name: str, *, labels: dict[str, str] | None = None, nodes: int = 8,
                 gpus_per_node: int = 8, run_seconds: float = 0.0, verdict: str = "Passed",
                 host: str = "simulator", job_start_seconds: float = 0.0,
                 fail_job: Callable[[member_pb2.Command], bool] = lambda command: False,
                 ) -> None:
        self.name = name
        self.labels = labels or {}
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.run_seconds = run_seconds
        self.verdict = verdict
        self.host = host
        self.job_start_seconds = job_start_seconds
        self.fail_job = fail_job
        self.link: MemberLink | None = None
        self.executed: dict[str, Executed] = {}
        #: How often each command id arrived (duplicates included).
        self.deliveries: dict[str, int] = {}
        #: The CreateJob commands whose Job a DeleteJobs deleted.
        self.deleted: set[str] = set()
        self._running_jobs: dict[str, asyncio.Task[None]] = {}
        self.link_faults = NO_FAULTS
        self.up = False
        self.up_since = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    def _inventory(self) -> common_pb2.Inventory:
        gpus = str(self.nodes * self.gpus_per_node)
        return common_pb2.Inventory(
            pools=[common_pb2.PoolInventory(name="gpu", ready=self.nodes, total=self.nodes,
                                            allocatable={"nvidia.com/gpu":
                                                         str(self.gpus_per_node)})],
            nodes_ready=self.nodes, nodes_total=self.nodes,
            allocatable={"nvidia.com/gpu": gpus}, pods_by_phase={"Running": 0})

    async def introduce(self) -> member_pb2.RegisterRequest:
        return member_pb2.RegisterRequest(
            cluster=common_pb2.ClusterIdentity(name=self.name, host=self.host,
                                               labels=self.labels,
                                               kubernetes_version="v1.36.3",
                                               endpoint="https://127.0.0.1:6443"),
            capacity=self._inventory())

    async def inventory(self) -> common_pb2.Inventory | None:
        return None  # unchanged since Register

    async def resync(self) -> list[member_pb2.CommandResult]:
        return [executed.result for executed in self.executed.values()]

    async def execute(self, command: member_pb2.Command) -> bool:
        self.deliveries[command.id] = self.deliveries.get(command.id, 0) + 1
        if command.id in self.executed:
            return True
        kind = command.WhichOneof("action")
        if kind == "stop_plan":
            started = self.executed.get(command.stop_plan.command_id)
            if started is not None and started.result.phase == member_pb2.COMMAND_PHASE_RUNNING:
                started.result.phase = member_pb2.COMMAND_PHASE_FAILED
                started.result.message = "stopped"
            result = member_pb2.CommandResult(command_id=command.id,
                                              phase=member_pb2.COMMAND_PHASE_SUCCEEDED)
        elif kind == "create_job":
            result = member_pb2.CommandResult(
                command_id=command.id, phase=member_pb2.COMMAND_PHASE_RUNNING,
                object=f"Job {command.create_job.namespace}/{command.create_job.name}")
            result.job.created_at.GetCurrentTime()
            result.job.admitted_at.GetCurrentTime()
            task = self._running_jobs[command.id] = self._spawn(self._run_job(command))
            task.add_done_callback(lambda _: self._running_jobs.pop(command.id, None))
        elif kind == "delete_jobs":
            result = member_pb2.CommandResult(
                command_id=command.id, phase=member_pb2.COMMAND_PHASE_SUCCEEDED,
                message=f"{self._delete_jobs(command.delete_jobs.workload_id)} Jobs deleted")
        else:
            result = member_pb2.CommandResult(
                command_id=command.id, phase=member_pb2.COMMAND_PHASE_RUNNING,
                steps_done="0/1", object=f"FaultPlan default/{command.run_id}-{self.name}")
            self._spawn(self._finish(command.id))
        self.executed[command.id] = Executed(command, time.time(), result,
                                             propagation.traceparent())
        self._report(result)
        return False

    async def _finish(self, command_id: str) -> None:
        await asyncio.sleep(self.run_seconds)
        result = self.executed[command_id].result
        if result.phase == member_pb2.COMMAND_PHASE_RUNNING:
            result.phase = member_pb2.COMMAND_PHASE_SUCCEEDED
            result.steps_done, result.verdict = "1/1", self.verdict
            self._report(result)

    async def _run_job(self, command: member_pb2.Command) -> None:
        await asyncio.sleep(self.job_start_seconds)
        result = self.executed[command.id].result
        result.job.running_at.GetCurrentTime()
        self._report(result)
        await asyncio.sleep(command.create_job.run_time.ToNanoseconds() / 1e9)
        failed = self.fail_job(command)
        result.phase = member_pb2.COMMAND_PHASE_FAILED if failed \
            else member_pb2.COMMAND_PHASE_SUCCEEDED
        result.message = "BackoffLimitExceeded: Job has reached the specified backoff limit" \
            if failed else ""
        result.job.finished_at.GetCurrentTime()
        self._report(result)

    def _delete_jobs(self, workload_id: str) -> int:
        doomed = [executed.command.id for executed in self.executed.values()
                  if executed.command.create_job.workload_id == workload_id]
        for command_id in doomed:
            del self.executed[command_id]
            self.deleted.add(command_id)
            task = self._running_jobs.pop(command_id, None)
            if task is not None:
                task.cancel()
        return len(doomed)

    def _report(self, result: member_pb2.CommandResult) -> None:
        if self.link is not None:
            copy = member_pb2.CommandResult()
            copy.CopyFrom(result)
            executed = self.executed.get(result.command_id)
            with within(executed.traceparent if executed is not None else ""):
                self.link.report(copy)

    def _spawn(self, work: Coroutine[None, None, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def faults(self) -> LinkFaults:
        return self.link_faults

    def connected(self, up: bool, message: str) -> None:
        if up and not self.up:
            self.up_since = time.time()
        self.up = up

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
