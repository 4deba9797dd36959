"""Workload Jobs in the hub link: the Job a CreateJob makes and the progress a Job shows (pure),
then the member creating and watching Jobs over an in-memory member API with injected faults
on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from federation.api import member_pb2
from federation.hub import validation
from operators.api.base import API_VERSION
from operators.hublink import jobs
from operators.hublink.member import HostMember
from operators.k8s.client import Client
from operators.k8s.clock import FakeClock
from operators.k8s.memory import MemoryTransport

T = TypeVar("T")
JOBS = "/apis/batch/v1/namespaces/team/jobs"
NOW = 1_800_000_000.0
RUNNING = member_pb2.COMMAND_PHASE_RUNNING


def create(index: int = 0, attempt: int = 1, **fields: Any) -> member_pb2.Command:
    values: dict[str, Any] = {"resources": {"nvidia.com/gpu": "8", "cpu": "1"}} | fields
    job = member_pb2.CreateJob(namespace="team", name=f"w1-{index}", pods=2,
                               labels={"fakefleet.dev/workload": "w1", "team": "ml"},
                               workload_id="w1", index=index, **values)
    job.run_time.FromNanoseconds(12_500_000_000)
    return member_pb2.Command(id=f"w1/west/job-{index}-{attempt}", run_id="w1", create_job=job)


def test_a_create_job_makes_a_gang_that_tolerates_gpu_nodes_and_runs_its_time() -> None:
    job = jobs.job_object(create(queue="user-queue", priority_class="high"))
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (2, 2, 0)
    assert job["metadata"]["labels"] == {"fakefleet.dev/workload": "w1", "team": "ml",
                                         "kueue.x-k8s.io/queue-name": "user-queue"}
    assert job["metadata"]["annotations"] == {jobs.COMMAND_ANNOTATION: "w1/west/job-0-1"}
    template = spec["template"]
    assert template["metadata"]["annotations"] == {jobs.RUN_TIME_ANNOTATION: "12.500s"}
    assert "kueue.x-k8s.io/queue-name" not in template["metadata"]["labels"]
    pod = template["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8", "cpu": "1"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                   "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "high"
    assert "tolerations" not in jobs.job_object(create(resources={"cpu": "1"}))["spec"][
        "template"]["spec"]


def _job(status: dict[str, Any] | None = None, created: str = "2027-01-15T08:00:00Z"
         ) -> dict[str, Any]:
    obj = jobs.job_object(create())
    obj["metadata"] |= {"creationTimestamp": created, "uid": "u1"}
    obj["status"] = status or {}
    return obj


def test_live_changes_are_stamped_when_seen_and_late_news_with_the_apis_times() -> None:
    seen = jobs.Seen()
    jobs.observe(_job(), seen, NOW, live=True)
    jobs.observe(_job({"startTime": "2027-01-15T08:00:01Z"}), seen, NOW + 0.25, live=True)
    jobs.observe(_job({"startTime": "x", "ready": 2}), seen, NOW + 0.5, live=True)
    assert (seen.created, seen.admitted, seen.running) == (NOW, NOW + 0.25, NOW + 0.5)
    late = jobs.Seen()  # first seen after the fact (a restart): the API's own times
    complete = {"startTime": "2027-01-15T08:00:01Z", "completionTime": "2027-01-15T08:00:20Z",
                "conditions": [{"type": "Complete", "status": "True"}]}
    jobs.observe(_job(complete), late, NOW, live=False)
    created = jobs.api_time("2027-01-15T08:00:00Z")
    assert (late.created, late.admitted, late.finished) == (created, created + 1, created + 20)
    result = jobs.result(_job(complete), late)
    assert result is not None
    assert result.phase == member_pb2.COMMAND_PHASE_SUCCEEDED
    assert result.job.finished_at.ToSeconds() == int(created + 20)
    assert validation.result(result, "result") == []


def test_a_failed_job_says_why_and_a_scheduler_moving_it_counts() -> None:
    seen = jobs.Seen()
    for cluster in ("worker-a", "worker-a", "worker-b"):
        jobs.place(seen, cluster)
    failed = _job({"conditions": [{"type": "Failed", "status": "True",
                                   "reason": "BackoffLimitExceeded",
                                   "message": "Job has reached the specified backoff limit"}]})
    jobs.observe(failed, seen, NOW, live=True)
    result = jobs.result(failed, seen)
    assert result is not None
    assert result.phase == member_pb2.COMMAND_PHASE_FAILED
    assert result.message.startswith("BackoffLimitExceeded: Job has reached")
    assert (result.job.placed_on, result.job.redispatched) == ("worker-b", 1)


# -- the member over an in-memory member API -------------------------------------------------

class Member:
    def __init__(self) -> None:
        self.clock = FakeClock(NOW)
        self.host = MemoryTransport(self.clock)
        self.api = MemoryTransport(self.clock)
        self.client = Client(self.api, clock=self.clock)
        self.member = HostMember(Client(self.host, clock=self.clock), "default", "west",
                                 host_id="h", annotations=dict,
                                 member_client=lambda: self.client, clock=self.clock)
        self.reports: list[member_pb2.CommandResult] = []
        self.member.report = self.reports.append

    async def drive(self, work: Awaitable[T], *, limit: int = 120) -> T:
        task = asyncio.ensure_future(work)
        for _ in range(limit):
            if task.done():
                break
            await self.clock.advance(1.0)
        assert task.done(), f"still waiting after {limit} fake seconds"
        return task.result()


async def test_a_job_is_created_once_and_a_repeat_delivery_is_a_duplicate() -> None:
    member = Member()
    assert await member.member.execute(create()) is False
    [made] = member.api.objects(JOBS)
    assert made["metadata"]["name"] == "w1-0"
    assert [r.phase for r in member.reports] == [RUNNING]
    assert member.reports[0].job.created_at.ToNanoseconds() == int(NOW * 1e9)
    assert await member.member.execute(create()) is True
    assert len(member.api.objects(JOBS)) == 1


@pytest.mark.parametrize("fault", [{"status": 500, "times": 2}, {"status": 429, "times": 1},
                                   {"reset": True}], ids=["500", "429", "reset"])
async def test_a_job_create_that_failed_on_the_way_is_sent_again(fault: dict[str, Any]) -> None:
    member = Member()
    member.api.fail("POST", JOBS, **fault)
    assert await member.drive(member.member.execute(create())) is False
    assert len(member.api.objects(JOBS)) == 1


async def test_a_job_the_api_server_refuses_is_reported_refused_and_kept_for_the_hello(
        ) -> None:
    member = Member()
    member.api.fail("POST", JOBS, status=422, reason="Invalid")
    assert await member.drive(member.member.execute(create())) is False
    [refused] = member.reports
    assert refused.phase == member_pb2.COMMAND_PHASE_REFUSED
    assert "refused Job team/w1-0" in refused.message
    assert refused in await member.member.resync()
    assert await member.member.execute(create()) is True  # not created on a repeat


async def test_the_hello_lists_the_jobs_the_member_has_read_from_its_api() -> None:
    member = Member()
    member.api.put(JOBS, _job({"startTime": "2027-01-15T08:00:01Z"}))
    other = _job()
    other["metadata"]["name"] = "not-ours"
    other["metadata"]["labels"] = {}
    member.api.put(JOBS, other)
    [hello] = await member.member.resync()
    assert hello.command_id == "w1/west/job-0-1"
    assert hello.job.admitted_at.ToSeconds() == int(jobs.api_time("2027-01-15T08:00:01Z"))


async def test_observe_watches_jobs_and_reports_each_step_once() -> None:
    member = Member()
    member.api.put(f"/apis/{API_VERSION}/namespaces/default/fakenodepools", {
        "apiVersion": API_VERSION, "kind": "FakeNodePool",
        "metadata": {"name": "p", "namespace": "default"}, "spec": {"clusterRef": "west"}})
    stop = asyncio.Event()
    task = asyncio.create_task(member.member.observe(stop))
    await member.member.execute(create())
    await member.clock.advance(1.0)
    path = f"{JOBS}/w1-0"
    current = member.api.object(path)
    assert current is not None
    current["status"] = {"startTime": "2027-01-15T08:00:01Z", "ready": 2}
    member.api.put(JOBS, current)
    await member.clock.advance(1.0)
    current["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    member.api.put(JOBS, current)
    await member.clock.advance(1.0)
    stop.set()
    await member.clock.advance(1.0)
    await task
    phases = [(r.phase, r.job.HasField("running_at")) for r in member.reports]
    assert phases == [(RUNNING, False), (RUNNING, True),
                      (member_pb2.COMMAND_PHASE_SUCCEEDED, True)]
    assert member.reports[-1].job.finished_at.ToNanoseconds() > \
        member.reports[-1].job.created_at.ToNanoseconds()


async def test_a_copy_of_another_clusters_job_is_not_this_members_to_report() -> None:
    """MultiKueue copies a manager's Job, annotations included, into the worker it chose: the
    worker's link must leave it to the manager (reporting it would be acting for another
    cluster, which the hub refuses)."""
    member = Member()
    copy = _job({"startTime": "2027-01-15T08:00:01Z"})
    copy["metadata"]["annotations"][jobs.COMMAND_ANNOTATION] = "w1/manager/job-0-1"
    member.api.put(JOBS, copy)
    assert await member.member.resync() == []
    member.member._on_job(copy, live=True)
    assert member.reports == []
