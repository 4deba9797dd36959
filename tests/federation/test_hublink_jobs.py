"""Workload Jobs in the hub link: the Job a CreateJob makes and the progress a Job shows (pure),
then the member creating and watching Jobs over an in-memory member API with injected faults
on a fake clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from federation.api import member_pb2
from federation.hub import validation
from operators.api.base import API_VERSION
from operators.hublink import jobs
from operators.hublink.member import HostMember
from operators.k8s.client import Client
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

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
    assert template["metadata"]["annotations"] == {keys.RUN_TIME: "12.500s"}
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


def _workload(conditions: list[dict[str, Any]], cluster: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions}
    if cluster:
        status["clusterName"] = cluster
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "job-w1-0-abcde", "namespace": "team",
                         "labels": {"kueue.x-k8s.io/job-uid": "u1"}},
            "status": status}


ADMITTED = {"type": "Admitted", "status": "True", "lastTransitionTime": "2027-01-15T08:00:03Z"}


def test_admission_comes_from_kueues_workload_and_the_worker_it_names() -> None:
    seen = jobs.Seen(created=NOW)
    reserved = {"type": "QuotaReserved", "status": "True"}
    jobs.observe_workload(_workload([reserved]), seen, NOW + 1, live=True)
    assert (seen.admitted, seen.placed_on) == (0.0, "")  # quota alone is not admission
    jobs.observe_workload(_workload([reserved, ADMITTED], "worker-a"), seen, NOW + 2,
                          live=True)
    assert (seen.admitted, seen.placed_on) == (NOW + 2, "worker-a")
    late = jobs.Seen()  # listed after the fact: the condition's own time
    jobs.observe_workload(_workload([ADMITTED], "worker-a"), late, NOW + 9, live=False)
    assert late.admitted == jobs.api_time("2027-01-15T08:00:03Z")
    # That time has whole seconds: never before the Job was seen created.
    created = jobs.api_time("2027-01-15T08:00:03.6Z")
    truncated = jobs.Seen(created=created)
    jobs.observe_workload(_workload([ADMITTED]), truncated, NOW + 9, live=False)
    assert truncated.admitted == created
    # The manager's Job showing startTime later changes nothing.
    jobs.observe(_job({"startTime": "2027-01-15T08:09:00Z"}), seen, NOW + 500, live=True)
    assert seen.admitted == NOW + 2


def test_the_workers_copy_tells_running_and_released_before_the_manager_knows() -> None:
    seen = jobs.Seen(created=NOW, admitted=NOW + 1)
    jobs.place(seen, "worker-a")
    jobs.observe_copy(_job({"ready": 1}), seen, NOW + 2, live=True)
    assert seen.running == 0.0  # half a gang is not running
    jobs.observe_copy(_job({"ready": 2}), seen, NOW + 3, live=True)
    done = {"ready": 0, "conditions": [{"type": "Complete", "status": "True"}]}
    jobs.observe_copy(_job(done), seen, NOW + 15, live=True)
    assert (seen.running, seen.released, seen.finished) == (NOW + 3, NOW + 15, 0.0)
    result = jobs.result(_job({}), seen)  # the manager's Job: not synced yet
    assert result is not None
    assert result.phase == RUNNING
    assert result.job.released_at.ToNanoseconds() == int((NOW + 15) * 1e9)
    assert not result.job.HasField("finished_at")
    assert validation.result(result, "result") == []
    jobs.observe(_job(done | {"completionTime": "2027-01-15T08:10:00Z"}), seen, NOW + 300,
                 live=True)
    assert (seen.running, seen.finished) == (NOW + 3, NOW + 300)


def test_a_copy_running_before_the_workload_shows_admitted_means_admitted() -> None:
    seen = jobs.Seen(created=NOW)
    jobs.place(seen, "worker-a")
    jobs.observe_copy(_job({"ready": 2}), seen, NOW + 3, live=True)
    jobs.observe_workload(_workload([ADMITTED], "worker-a"), seen, NOW + 4, live=True)
    assert (seen.admitted, seen.running) == (NOW + 3, NOW + 3)


def test_a_job_moved_to_another_worker_starts_over_there() -> None:
    seen = jobs.Seen(created=NOW, admitted=NOW + 1)
    jobs.place(seen, "worker-a")
    jobs.observe_copy(_job({"ready": 2}), seen, NOW + 3, live=True)
    jobs.place(seen, "worker-b")  # worker-a lost: Kueue admitted it again on worker-b
    assert (seen.running, seen.released, seen.admitted) == (0.0, 0.0, NOW + 1)
    assert (seen.placed_on, seen.clusters) == ("worker-b", ("worker-a", "worker-b"))


# -- the member over an in-memory member API -------------------------------------------------

class Member:
    def __init__(self, name: str = "west", namespace: str = "default") -> None:
        self.clock = FakeClock(NOW)
        self.host = MemoryTransport(self.clock)
        self.api = MemoryTransport(self.clock)
        self.client = Client(self.api, clock=self.clock)
        #: Other FakeClusters' APIs (MultiKueue workers), served once listed in ``up``.
        self.workers: dict[str, MemoryTransport] = {}
        self.up: set[str] = set()
        self.member = HostMember(Client(self.host, clock=self.clock), namespace, name,
                                 host_id="h", annotations=dict,
                                 member_client=lambda: self.client,
                                 worker_client=self._worker, clock=self.clock)
        self.reports: list[member_pb2.CommandResult] = []
        self.member.report = self.reports.append

    async def _worker(self, name: str) -> Client | None:
        if name not in self.up:
            return None
        return Client(self.workers.setdefault(name, MemoryTransport(self.clock)),
                      clock=self.clock)

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


async def test_a_job_watch_that_fails_is_logged_and_watches_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """A defect while handling one event must not end the watch for good (every later step
    of every Job would go unreported): the watch starts again, lists, and reports."""
    member = Member()
    watching = member.member.jobs
    handle = watching.on_job_event
    failures = []

    def once_broken(kind: str, job: Any) -> None:
        if not failures:
            failures.append(kind)
            raise KeyError("a defect")
        handle(kind, job)

    watching.on_job_event = once_broken  # type: ignore[method-assign]
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger="primitives.tasks"):
        task = asyncio.create_task(member.member.observe(stop))
        await member.member.execute(create())
        await member.clock.advance(1.0)
        current = member.api.object(f"{JOBS}/w1-0")
        assert current is not None
        current["status"] = {"startTime": "2027-01-15T08:00:01Z", "ready": 2,
                             "conditions": [{"type": "Complete", "status": "True"}]}
        member.api.put(JOBS, current)
        await member.clock.advance(5.0)
        stop.set()
        await member.clock.advance(1.0)
        await task
    assert len(failures) == 1
    assert any("hublink-jobs-west failed" in r.getMessage() and r.exc_info is not None
               for r in caplog.records)
    assert member.reports[-1].phase == member_pb2.COMMAND_PHASE_SUCCEEDED


async def test_a_copy_of_another_clusters_job_is_not_this_members_to_report() -> None:
    """MultiKueue copies a manager's Job, annotations included, into the worker it chose: the
    worker's link must leave it to the manager (reporting it would be acting for another
    cluster, which the hub refuses)."""
    member = Member()
    copy = _job({"startTime": "2027-01-15T08:00:01Z"})
    copy["metadata"]["annotations"][jobs.COMMAND_ANNOTATION] = "w1/manager/job-0-1"
    member.api.put(JOBS, copy)
    assert await member.member.resync() == []
    member.member.jobs.on_job(copy, live=True)
    assert member.reports == []


WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/team/workloads"


async def test_a_manager_reports_kueues_admission_and_the_workers_copy_as_they_happen(
        ) -> None:
    """MultiKueue: admission and the worker from the manager's Workload watch, running and
    released from a watch of the copy in that worker, each reported once as it happens; the
    worker's API comes up late and its first list fails, and the Workloads' newer version is
    not served."""
    member = Member("manager")
    worker = member.workers["worker-a"] = MemoryTransport(member.clock)
    worker.fail("GET", "/apis/batch/v1/jobs", status=500, times=1)
    member.api.fail("GET", "/apis/kueue.x-k8s.io/v1beta2/workloads", status=404, times=99)
    member.api.fail("GET", "/apis/kueue.x-k8s.io/v1beta1/workloads", status=404, times=1)
    stop = asyncio.Event()
    task = asyncio.create_task(member.member.observe(stop))
    command = create(queue="user-queue")
    command.id = "w1/manager/job-0-1"
    await member.member.execute(command)
    await member.clock.advance(1.0)
    [job] = member.api.objects(JOBS)
    admitted_at = member.clock.now()
    member.api.put("/apis/kueue.x-k8s.io/v1beta1/namespaces/team/workloads",
                   _workload([ADMITTED], "worker-a") | {"metadata": {
                       "name": "job-w1-0", "namespace": "team",
                       "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]}}})
    await member.clock.advance(jobs_retry := 11.0)  # Kueue's API looked for again
    assert member.reports[-1].job.placed_on == "worker-a"
    assert member.reports[-1].job.admitted_at.ToNanoseconds() >= int(admitted_at * 1e9)
    copy = dict(job, status={"ready": 2})
    worker.put(JOBS, copy)
    await member.clock.advance(jobs_retry)
    assert not member.reports[-1].job.HasField("running_at")  # the worker is not up yet
    member.up.add("worker-a")
    await member.clock.advance(jobs_retry)
    running = member.reports[-1].job
    assert running.HasField("running_at")
    assert not running.HasField("released_at")
    copy = worker.object(f"{JOBS}/w1-0") or {}
    copy["status"] = {"ready": 0, "conditions": [{"type": "Complete", "status": "True"}]}
    worker.put(JOBS, copy)
    await member.clock.advance(1.0)
    released = member.reports[-1]
    assert released.phase == RUNNING
    assert released.job.HasField("released_at")
    reports = len(member.reports)
    await member.clock.advance(5.0)
    assert len(member.reports) == reports  # nothing new: nothing sent again
    stop.set()
    await member.clock.advance(1.0)
    await task


async def test_a_workload_admitted_before_its_job_shows_is_stamped_when_it_was_seen() -> None:
    member = Member("manager")
    command = create(queue="user-queue")
    command.id = "w1/manager/job-0-1"
    await member.member.execute(command)
    [job] = member.api.objects(JOBS)
    uid = job["metadata"]["uid"]
    workload = _workload([ADMITTED], "worker-a")
    workload["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] = uid
    member.member.jobs.on_workload_event("ADDED", workload)  # the Job's watch is behind
    seen_at = member.clock.now()
    await member.clock.advance(3.0)
    member.member.jobs.on_job(job, live=True)
    assert member.reports[-1].job.admitted_at.ToNanoseconds() == int(seen_at * 1e9)
    assert member.reports[-1].job.placed_on == "worker-a"


# -- deleting a stopped workload's Jobs --------------------------------------------------------

def delete(workload: str = "w1") -> member_pb2.Command:
    return member_pb2.Command(id=f"{workload}/west/delete", run_id=workload,
                              delete_jobs=member_pb2.DeleteJobs(workload_id=workload,
                                                                namespace="team"))


async def test_deleting_takes_the_workloads_jobs_with_their_pods_and_nothing_else() -> None:
    member = Member()
    for index in (0, 1):
        await member.member.execute(create(index))
    # A user's Job with the workload's label, and the copy of east's Job that a MultiKueue
    # manager made here: neither was made by a CreateJob of this cluster.
    users = _job()
    users["metadata"] |= {"name": "users", "annotations": {}, "uid": "u-users"}
    copy = _job()
    copy["metadata"] |= {"name": "copy", "uid": "u-copy",
                         "annotations": {jobs.COMMAND_ANNOTATION: "w1/east/job-5-1"}}
    other = jobs.job_object(create(2))  # another workload's
    other["metadata"]["labels"]["fakefleet.dev/workload"] = "w2"
    other["metadata"]["annotations"] = {jobs.COMMAND_ANNOTATION: "w2/west/job-2-1"}
    for job in (users, copy, other):
        member.api.put(JOBS, job)
    assert await member.member.execute(delete()) is False
    assert sorted(job["metadata"]["name"] for job in member.api.objects(JOBS)) == [
        "copy", "users", "w1-2"]
    sent = member.api.sent("DELETE", f"{JOBS}/.*")
    assert sorted(request.path.rsplit("/", 1)[1] for request in sent) == ["w1-0", "w1-1"]
    for request in sent:
        body = request.json()
        assert body["propagationPolicy"] == "Background"  # the pods go too
        assert body["preconditions"]["uid"]  # only the object that was listed
    assert member.reports[-1].command_id == "w1/west/delete"
    assert member.reports[-1].phase == member_pb2.COMMAND_PHASE_SUCCEEDED
    assert member.reports[-1].message == "2 Jobs deleted, 0 gone already"
    # Delivered again: nothing left to delete, and that is fine.
    assert await member.member.execute(delete()) is False
    assert member.reports[-1].message == "0 Jobs deleted, 0 gone already"


async def test_a_member_outside_the_default_namespace_deletes_the_jobs_it_made() -> None:
    member = Member(namespace="team-a")  # the fleet names it team-a/west
    command = create()
    command.id = "w1/team-a/west/job-0-1"
    await member.member.execute(command)
    order = delete()
    order.id = "w1/team-a/west/delete"
    assert await member.member.execute(order) is False
    assert member.api.objects(JOBS) == []
    assert member.reports[-1].message == "1 Jobs deleted, 0 gone already"


async def test_a_job_gone_before_its_delete_counts_as_deleted() -> None:
    member = Member()
    await member.member.execute(create())
    member.api.fail("DELETE", f"{JOBS}/w1-0", status=404, reason="NotFound")
    assert await member.member.execute(delete()) is False
    assert member.reports[-1].message == "0 Jobs deleted, 1 gone already"


async def test_a_delete_that_failed_on_the_way_is_tried_again() -> None:
    member = Member()
    await member.member.execute(create())
    member.api.fail("DELETE", f"{JOBS}/w1-0", status=500, times=2)
    assert await member.drive(member.member.execute(delete())) is False
    assert member.api.objects(JOBS) == []


async def test_a_delete_the_api_server_forbids_is_refused_and_kept_for_the_hello() -> None:
    member = Member()
    await member.member.execute(create())
    member.api.fail("GET", JOBS, status=403, reason="Forbidden")
    assert await member.drive(member.member.execute(delete())) is False
    refused = member.reports[-1]
    assert refused.phase == member_pb2.COMMAND_PHASE_REFUSED
    assert "refused to delete the Jobs of workload w1" in refused.message
    assert refused in await member.member.resync()
    assert await member.member.execute(delete()) is True
    assert len(member.api.objects(JOBS)) == 1
