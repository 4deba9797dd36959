"""Fleet workloads: the pure Job state and report, then the hub over real gRPC with simulated
members (placement, gangs waiting for room, retries elsewhere, restarts, refusals)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from federation.api import fleet_pb2, member_pb2
from federation.client.fleet import FleetClient
from federation.client.member import MemberLink
from federation.client.simulated import SimulatedMember
from federation.hub import convert
from federation.hub.__main__ import main as hub_main
from federation.hub.outcomes import Outcome
from federation.hub.store import Snapshot, decode, encode
from federation.hub.workloads import (
    CANCELLED,
    DISPATCH_FAILED,
    JobRecord,
    JobState,
    Progress,
    Settings,
    Workload,
    command_id,
    delete_id,
    latency,
    owner,
    parse_command_id,
)
from primitives.stamps import Stamps
from tests.federation.hubs import RawMember, RunningHub, running_hub

# -- pure --------------------------------------------------------------------------------------


def _settings(**overrides: object) -> Settings:
    values: dict[str, object] = dict(
        jobs=3, pods=2, resources={"nvidia.com/gpu": "8"}, namespace="default", labels={},
        priority_class="", queue="", placement="spread", selector={}, weights={}, manager="",
        seed=1, max_attempts=2)
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def _workload(jobs: int = 3, **overrides: object) -> Workload:
    return Workload(id="w1", name="t", spec={}, settings=_settings(jobs=jobs, **overrides),
                    created_at=0.0, start_at=100.0,
                    jobs=[JobRecord(index=i, arrive_at=100.0 + i, run_seconds=10.0)
                          for i in range(jobs)])


def test_command_ids_round_trip_and_foreign_ids_are_not_jobs() -> None:
    assert parse_command_id(command_id("w1a2b", "west-1", 12, 3)) == ("w1a2b", "west-1", 12, 3)
    for foreign in ("r1/west/start", "w1/west/job-1", "w1/west/job-a-1", "w1//job-1-1"):
        assert parse_command_id(foreign) is None


def test_a_job_moves_through_its_states_with_the_members_times() -> None:
    workload = _workload()
    job = workload.jobs[0]
    assert workload.due(99.0) == []
    assert workload.due(100.0) == [job]
    workload.place(job, "west")
    assert workload.sent(job, 100.1)
    assert not workload.sent(job, 100.2)
    cid = command_id("w1", "west", 0, 1)
    assert workload.acknowledged(cid, 100.2)
    assert job.state is JobState.PENDING
    assert workload.reported(cid, Progress(Outcome.RUNNING,
                                           Stamps(created=100.2, admitted=100.5)), 100.6)
    assert job.state is JobState.ADMITTED
    workload.reported(cid, Progress(Outcome.RUNNING, Stamps(running=101.0)), 101.1)
    assert job.state is JobState.RUNNING
    assert workload.gpus_running() == 16
    workload.reported(cid, Progress(Outcome.SUCCEEDED, Stamps(finished=111.0)), 111.1)
    assert job.state is JobState.SUCCEEDED
    # What finished stays finished; another cluster's or attempt's news is not this Job's.
    assert not workload.reported(cid, Progress(Outcome.FAILED), 112.0)
    assert not workload.reported(command_id("w1", "east", 1, 1), Progress(Outcome.RUNNING),
                                 112.0)
    report = workload.report(120.0)
    assert report.counts.succeeded == 1
    assert report.counts.waiting == 2
    assert report.timings.to_admission.p50 == pytest.approx(0.5)
    assert report.timings.to_running.p50 == pytest.approx(1.0)
    assert report.timings.to_completion.p50 == pytest.approx(11.0)
    assert [c.cluster for c in report.clusters] == ["west"]


def test_a_job_whose_pods_ended_on_a_worker_frees_its_gpus_before_it_is_marked_finished(
        ) -> None:
    """A MultiKueue manager marks its Job finished when it syncs the worker's copy, which may
    come long after the copy's pods ended: utilisation follows the pods."""
    workload = _workload()
    job = workload.jobs[0]
    workload.place(job, "manager")
    workload.sent(job, 100.0)
    cid = command_id("w1", "manager", 0, 1)
    workload.acknowledged(cid, 100.1)
    workload.reported(cid, Progress(Outcome.RUNNING, Stamps(admitted=100.5, running=101.0),
                                    placed_on="worker-a"), 101.1)
    assert workload.gpus_running() == 16
    workload.reported(cid, Progress(Outcome.RUNNING, Stamps(admitted=100.5, running=101.0,
                                                            released=111.0),
                                    placed_on="worker-a"), 111.1)
    assert (job.state, workload.gpus_running()) == (JobState.RUNNING, 0)
    workload.reported(cid, Progress(Outcome.SUCCEEDED, Stamps(running=101.0, released=111.0,
                                                              finished=140.0),
                                    placed_on="worker-a"), 140.1)
    assert job.state is JobState.SUCCEEDED
    assert workload.report(150.0).timings.to_completion.p50 == pytest.approx(40.0)


def test_a_failed_attempt_waits_again_until_attempts_run_out() -> None:
    workload = _workload(jobs=1)
    job = workload.jobs[0]
    workload.place(job, "west")
    workload.sent(job, 100.0)
    workload.reported(command_id("w1", "west", 0, 1), Progress(Outcome.FAILED, message="boom"),
                      105.0)
    assert job.state is JobState.WAITING
    assert job.attempt == 2
    assert job.avoid == "west"
    assert "attempt 1 failed: boom" in job.message
    workload.place(job, "east")
    workload.sent(job, 105.5)
    cid = command_id("w1", "east", 0, 2)
    workload.reported(cid, Progress(Outcome.RUNNING, Stamps(admitted=106.0, running=107.0)), 107.0)
    assert job.recovered_in == pytest.approx(2.0)
    workload.reported(cid, Progress(Outcome.FAILED, Stamps(finished=110.0)), 110.0)
    assert job.state is JobState.FAILED  # two attempts were all it had
    assert workload.settle(110.0)
    assert workload.phase.value == "Failed"
    report = workload.report(110.0)
    assert report.redispatched == 1
    assert report.recovery.p50 == pytest.approx(2.0)


def test_a_hello_without_an_acknowledged_job_fails_that_attempt() -> None:
    workload = _workload(jobs=2)
    for job in workload.jobs:
        workload.place(job, "west")
        workload.sent(job, 100.0)
        workload.acknowledged(command_id("w1", "west", job.index, 1), 100.0)
    assert workload.resynced("west", [command_id("w1", "west", 0, 1)], 101.0)
    assert workload.jobs[0].state is JobState.PENDING
    assert workload.jobs[1].state is JobState.WAITING
    assert workload.jobs[1].attempt == 2


def test_a_stopped_workload_is_failed_at_once_and_creates_nothing_more() -> None:
    workload = _workload(jobs=3)
    first, second, third = workload.jobs
    workload.place(first, "west")
    workload.sent(first, 100.0)
    workload.place(second, "east")
    workload.stop(101.0, DISPATCH_FAILED, "the hub could not dispatch it: boom")
    assert workload.settle(101.0)
    assert workload.phase.value == "Failed"
    assert (first.state, second.state, third.state) == (
        JobState.CANCELLED, JobState.CANCELLED, JobState.CANCELLED)
    assert "deleted" in first.message
    assert "never created" in second.message
    assert workload.deleting == {"west": False}  # the member it was sent to deletes it
    assert workload.due(200.0) == []
    assert workload.report(101.0).counts.cancelled == 3
    stored = decode(json.loads(json.dumps(encode(Snapshot("h", [], [], [workload])))))
    [again] = stored.workloads
    assert (again.reason, again.message, again.phase) == (
        DISPATCH_FAILED, "the hub could not dispatch it: boom", workload.phase)


def test_samples_keep_their_span_when_thinned() -> None:
    workload = _workload(jobs=1)
    for second in range(3000):
        workload.sample(float(second), 64)
    assert len(workload.samples) <= 1200
    assert workload.samples[0][0] == 0.0
    assert workload.samples[-1][0] >= 2990
    assert workload.sample_every > 1.0


def test_latency_percentiles_are_nearest_rank() -> None:
    value = latency(float(v) for v in range(1, 101))
    assert (value.count, value.p50, value.p99, value.max) == (100, 50.0, 99.0, 100.0)
    assert latency([]).count == 0


# -- over gRPC ---------------------------------------------------------------------------------

def _spec(**fields: object) -> fleet_pb2.WorkloadSpec:
    spec = fleet_pb2.WorkloadSpec(
        jobs=10, pods_per_job=2, resources={"nvidia.com/gpu": "8", "cpu": "1"},
        run_time=fleet_pb2.RunTimeDistribution(distribution="fixed", seconds=0.2),
        arrivals=fleet_pb2.ArrivalProcess(process="rate", rate=50), seed=7,
        target=fleet_pb2.WorkloadTarget(placement="spread"))
    for name, value in fields.items():
        if isinstance(value, dict) and name not in ("resources", "labels"):
            getattr(spec, name).MergeFrom(type(getattr(spec, name))(**value))
        elif isinstance(value, dict):
            getattr(spec, name).update(value)
        else:
            setattr(spec, name, value)
    return spec


@contextlib.asynccontextmanager
async def fleet_of(hub: RunningHub, members: list[SimulatedMember]
                   ) -> AsyncIterator[FleetClient]:
    stop = asyncio.Event()
    tasks = []
    for member in members:
        member.link = MemberLink(hub.address, hub.member_token(member.name), member,
                                 member.name)
        tasks.append(asyncio.create_task(member.link.run(stop)))
    async with hub.fleet() as fleet:
        async with asyncio.timeout(5):
            while len([m for m in await fleet.list_clusters()
                       if m.state == 1]) < len(members):
                await asyncio.sleep(0.05)
        try:
            yield fleet
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            for member in members:
                await member.stop()


async def _finished(fleet: FleetClient, workload_id: str,
                    timeout: float = 20.0) -> fleet_pb2.Workload:
    async with asyncio.timeout(timeout):
        async for workload in fleet.watch_workload(workload_id):
            if workload.phase != fleet_pb2.WORKLOAD_PHASE_RUNNING:
                return await fleet.get_workload(workload_id, jobs=True)
    raise AssertionError("the watch ended before the workload finished")


def _jobs_of(member: SimulatedMember) -> list[member_pb2.Command]:
    return [e.command for e in member.executed.values()
            if e.command.WhichOneof("action") == "create_job"]


async def test_spread_places_gangs_in_turn_and_reports_every_job(tmp_path: Path) -> None:
    members = [SimulatedMember(name, nodes=4) for name in ("east", "west")]
    async with running_hub(tmp_path) as hub, fleet_of(hub, members) as fleet:
        submitted = await fleet.submit_workload(_spec(), name="spread", start_delay=0)
        workload = await _finished(fleet, submitted.id)
    assert workload.phase == fleet_pb2.WORKLOAD_PHASE_SUCCEEDED
    report = workload.report
    assert report.counts.jobs == report.counts.succeeded == 10
    assert {c.cluster: c.counts.succeeded for c in report.clusters} == {"east": 5, "west": 5}
    for member in members:  # each Job once, as asked, and the members agree with the report
        jobs = _jobs_of(member)
        assert len(jobs) == 5
        assert all(member.deliveries[c.id] == 1 for c in jobs)
        job = jobs[0].create_job
        assert (job.pods, job.resources["nvidia.com/gpu"], job.namespace) == (2, "8", "default")
        assert job.labels["fakefleet.dev/workload"] == submitted.id
        assert job.run_time.ToNanoseconds() == 200_000_000
    assert report.to_completion.count == 10
    assert report.to_completion.p50 >= 0.2
    assert report.utilisation
    assert report.utilisation[-1].total == 64
    assert [j.state for j in workload.jobs] == ["Succeeded"] * 10


async def test_binpack_fills_one_cluster_before_the_next(tmp_path: Path) -> None:
    members = [SimulatedMember("big", nodes=4), SimulatedMember("small", nodes=2)]
    async with running_hub(tmp_path) as hub, fleet_of(hub, members) as fleet:
        spec = _spec(jobs=3, run_time={"distribution": "fixed", "seconds": 2.0},
                     arrivals={"process": "times", "times": [0, 0, 0]},
                     target={"placement": "binpack"})
        submitted = await fleet.submit_workload(spec, start_delay=0)
        workload = await _finished(fleet, submitted.id)
    # 16 GPUs each: "small" (16 free) fits the first exactly, "big" (32) the other two.
    assert {j.cluster for j in workload.jobs if j.index == 0} == {"small"}
    assert sorted(j.cluster for j in workload.jobs) == ["big", "big", "small"]


async def test_a_gang_waits_at_the_hub_until_a_member_has_room(tmp_path: Path) -> None:
    # One node of 8 GPUs per member, Jobs of 1 pod x 8 GPUs: one Job per member at a time.
    members = [SimulatedMember(name, nodes=1) for name in ("east", "west")]
    async with running_hub(tmp_path) as hub, fleet_of(hub, members) as fleet:
        spec = _spec(jobs=6, pods_per_job=1,
                     run_time={"distribution": "fixed", "seconds": 0.4},
                     arrivals={"process": "times", "times": [0] * 6})
        submitted = await fleet.submit_workload(spec, start_delay=0)
        workload = await _finished(fleet, submitted.id)
    assert workload.report.counts.succeeded == 6
    for member in members:
        received = sorted(e.received_at for e in member.executed.values())
        # Never two at once: each arrived only after the one before had run its 0.4 s.
        assert all(b - a >= 0.35 for a, b in itertools.pairwise(received))
    assert workload.report.to_admission.max >= 0.8  # the last ones waited two rounds


async def test_a_failed_job_is_dispatched_again_elsewhere(tmp_path: Path) -> None:
    def fail_first(command: member_pb2.Command) -> bool:
        return command.id.endswith("-1")  # every first attempt fails

    members = [SimulatedMember("east", nodes=4, fail_job=fail_first),
               SimulatedMember("west", nodes=4)]
    async with running_hub(tmp_path) as hub, fleet_of(hub, members) as fleet:
        spec = _spec(jobs=1, max_attempts=3, target={"placement": "clusters",
                                                     "clusters": {"names": ["east", "west"]}})
        submitted = await fleet.submit_workload(spec, start_delay=0)
        workload = await _finished(fleet, submitted.id)
    [job] = workload.jobs
    assert (workload.phase, job.state, job.attempt, job.cluster) == (
        fleet_pb2.WORKLOAD_PHASE_SUCCEEDED, "Succeeded", 2, "west")
    assert workload.report.redispatched == 1
    assert workload.report.recovery.count == 1
    assert job.name == f"{submitted.id}-0-2"


async def test_manager_placement_sends_every_job_to_the_manager(tmp_path: Path) -> None:
    members = [SimulatedMember("manager", nodes=0), SimulatedMember("worker", nodes=2)]
    async with running_hub(tmp_path) as hub, fleet_of(hub, members) as fleet:
        spec = _spec(jobs=4, target={"placement": "manager", "manager": "manager",
                                     "queue": "user-queue"})
        submitted = await fleet.submit_workload(spec, start_delay=0)
        workload = await _finished(fleet, submitted.id)
    jobs = _jobs_of(members[0])
    assert len(jobs) == 4
    assert _jobs_of(members[1]) == []
    assert all(c.create_job.queue == "user-queue" for c in jobs)
    # Utilisation counts the workers' GPUs, not the manager's.
    assert workload.report.utilisation[-1].total == 16


async def test_a_restarted_hub_carries_on_and_creates_nothing_twice(tmp_path: Path) -> None:
    members = [SimulatedMember(name, nodes=4) for name in ("east", "west")]
    state = tmp_path / "hub"
    stop = asyncio.Event()
    async with running_hub(state) as hub:
        listen = hub.info.address
        tasks = []
        for member in members:
            member.link = MemberLink(hub.address, hub.member_token(member.name), member,
                                     member.name)
            tasks.append(asyncio.create_task(member.link.run(stop)))
        async with hub.fleet() as fleet:
            async with asyncio.timeout(5):
                while len(await fleet.list_clusters()) < 2 or not all(
                        m.state == 1 for m in await fleet.list_clusters()):
                    await asyncio.sleep(0.05)
            spec = _spec(jobs=20, run_time={"distribution": "fixed", "seconds": 0.5},
                         arrivals={"process": "rate", "rate": 10})
            submitted = await fleet.submit_workload(spec, start_delay=0)
            await asyncio.sleep(0.8)
    async with running_hub(state, listen=listen) as hub, hub.fleet() as fleet:
        workload = await _finished(fleet, submitted.id, timeout=30)
        stop.set()
        await asyncio.gather(*tasks)
    assert workload.report.counts.succeeded == 20
    created = [c.id for member in members for c in _jobs_of(member)]
    assert len(created) == len(set(created)) == 20
    for member in members:
        await member.stop()


@pytest.mark.parametrize(("change", "expected"), [
    ({"jobs": 0}, "spec.jobs: 0; give 1 to 100000"),
    ({"resources": {"nvidia.com/gpu": "1.5"}}, "spec.resources[nvidia.com/gpu]: '1.5'"),
    ({"arrivals": {"process": "poisson", "rate": -1}}, "spec.arrivals.rate: -1"),
    ({"arrivals": {"process": "times", "times": [1, 2]}}, "spec.arrivals.times: 2 times"),
    ({"run_time": {"distribution": "gamma"}}, "spec.run_time.distribution: 'gamma'"),
    ({"run_time": {"distribution": "uniform", "low": 5, "high": 1}}, "spec.run_time.low"),
    ({"target": {"placement": "manager"}}, "spec.target.manager: missing"),
    ({"target": {"placement": "clusters"}}, "spec.target.clusters.names"),
    ({"target": {"placement": "spread", "weights": {"east": 1}}}, "spec.target.weights"),
    ({"labels": {"fakefleet.dev/workload": "x"}}, "set by the hub"),
    ({"namespace": "Not_A_Namespace"}, "spec.namespace"),
    # Past what Duration, Timestamp and the dispatcher's arithmetic hold (a run time of 1e300
    # once wedged the dispatcher for every workload).
    ({"run_time": {"distribution": "fixed", "seconds": 1e300}},
     "spec.run_time.seconds: 1e+300; give seconds from 0 to 2592000 (30 days)"),
    ({"run_time": {"distribution": "fixed", "seconds": float("nan")}}, "spec.run_time.seconds"),
    ({"run_time": {"distribution": "uniform", "low": 1, "high": float("inf")}},
     "spec.run_time.high: inf"),
    ({"run_time": {"distribution": "lognormal", "seconds": 60, "sigma": 1, "cap": 1e300}},
     "spec.run_time.cap"),
    ({"jobs": 2, "arrivals": {"process": "times", "times": [0, float("inf")]}},
     "spec.arrivals.times[1]: inf"),
    ({"arrivals": {"process": "rate", "rate": 5000}},
     "spec.arrivals.rate: 5000.0; give Jobs per second from 1.16e-05 (one a day) to 1000"),
    ({"arrivals": {"process": "poisson", "rate": 1e-300}}, "spec.arrivals.rate: 1e-300"),
    ({"jobs": 100_000, "arrivals": {"process": "rate", "rate": 0.01}},
     "spec.arrivals.rate: 0.01 Jobs/s brings the last of 100000 Jobs"),
])
async def test_bad_workloads_are_refused_naming_the_field(
        tmp_path: Path, change: dict[str, object], expected: str) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await fleet.submit_workload(_spec(**change))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (raised.value.details() or "")


@pytest.mark.parametrize(("spec", "expected"), [
    (lambda: _spec(pods_per_job=9), "a Job needs 72 GPUs"),
    (lambda: _spec(target={"placement": "manager", "manager": "nobody", "queue": "q"}),
     "target.manager: 'nobody' is not a member"),
    (lambda: _spec(target={"placement": "clusters", "clusters": {"names": ["nobody"]}}),
     "target.clusters"),
])
async def test_workloads_that_could_never_run_are_refused(
        tmp_path: Path, spec: Callable[[], fleet_pb2.WorkloadSpec], expected: str) -> None:
    async with running_hub(tmp_path) as hub, \
            fleet_of(hub, [SimulatedMember("east", nodes=8)]) as fleet:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await fleet.submit_workload(spec())
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert expected in (raised.value.details() or "")


async def test_a_member_reporting_a_time_past_the_year_9999_is_refused_naming_the_field(
        tmp_path: Path) -> None:
    """Times a member reports become Timestamps in every answer about the workload: one past
    what a Timestamp holds is refused where it comes in, and the workload is not touched."""
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = RawMember(hub, "west")
        await member.register()
        await member.hello()
        spec = _spec(jobs=1, resources={"nvidia.com/gpu": "0"})
        submitted = await fleet.submit_workload(spec, start_delay=0)
        command = await member.next_command()
        report = member_pb2.CommandResult(command_id=command.id,
                                          phase=member_pb2.COMMAND_PHASE_SUCCEEDED)
        report.job.finished_at.seconds = 2**62
        await member.send(member_pb2.MemberMessage(result=report))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await member.next_command()
        await member.close()
        workload = await fleet.get_workload(submitted.id, jobs=True)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith(
        f"result.job.finished_at: {2**62}s 0ns; give a time from 1970")
    assert [job.state for job in workload.jobs] == ["Sent"]


async def test_a_workload_whose_dispatch_fails_fails_alone_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """As a run time of 1e300 once did (before it was refused): sending the Jobs of one
    workload raises. That workload is Failed with the error, once; the others run on."""
    make = convert.job_command_message

    def breaking(workload: Workload, job: JobRecord) -> member_pb2.HubMessage:
        if workload.name == "bad" and job.index == 1:
            raise OverflowError("cannot convert float infinity to integer")
        return make(workload, job)

    monkeypatch.setattr(convert, "job_command_message", breaking)
    members = [SimulatedMember(name, nodes=4) for name in ("east", "west")]
    async with running_hub(tmp_path) as hub, fleet_of(hub, members) as fleet:
        bad = await fleet.submit_workload(
            _spec(jobs=3, arrivals={"process": "times", "times": [0, 1.0, 1.5]}), name="bad",
            start_delay=0)
        good = await fleet.submit_workload(_spec(), name="good", start_delay=0)
        failed = await _finished(fleet, bad.id)
        succeeded = await _finished(fleet, good.id)
    assert succeeded.phase == fleet_pb2.WORKLOAD_PHASE_SUCCEEDED
    assert succeeded.report.counts.succeeded == 10
    assert failed.phase == fleet_pb2.WORKLOAD_PHASE_FAILED
    assert failed.reason == "DispatchFailed"
    assert failed.message == ("the hub could not dispatch it: "
                              "OverflowError('cannot convert float infinity to integer')")
    # The Job sent before the failure ran on; those after it were never created.
    assert [job.state for job in failed.jobs] == ["Succeeded", "Cancelled", "Cancelled"]
    assert failed.report.counts.cancelled == 2
    tracebacks = [r for r in caplog.records if r.exc_info and bad.id in r.getMessage()]
    assert len(tracebacks) == 1



async def test_a_workload_that_fails_to_send_at_a_members_hello_fails_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a member never got goes out when its session opens: a workload that fails there
    fails alone, and the session opens all the same."""
    def breaking(workload: Workload, job: JobRecord) -> member_pb2.HubMessage:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(convert, "job_command_message", breaking)
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        manager = RawMember(hub, "manager")
        await manager.register()
        # Placed on the manager at once, sent once it has a session.
        submitted = await fleet.submit_workload(
            _spec(jobs=1, target={"placement": "manager", "manager": "manager",
                                  "queue": "q"}), start_delay=0)
        await _until(fleet, submitted.id, lambda w: w.jobs[0].cluster == "manager")
        await manager.hello()
        with pytest.raises(TimeoutError):  # the session stays open, with nothing to send
            await manager.next_command(timeout=0.5)
        workload = await fleet.get_workload(submitted.id)
        await manager.close()
    assert (workload.phase, workload.reason) == (fleet_pb2.WORKLOAD_PHASE_FAILED,
                                                 "DispatchFailed")


# -- cancelling --------------------------------------------------------------------------------

def test_a_cancelled_workload_asks_every_member_it_sent_jobs_to_until_each_is_done() -> None:
    workload = _workload(jobs=4)
    done, running, sent, _ = workload.jobs
    for job, cluster in ((done, "west"), (running, "east"), (sent, "north")):
        workload.place(job, cluster)
        workload.sent(job, 100.0)
    workload.reported(command_id("w1", "west", 0, 1), Progress(Outcome.SUCCEEDED), 101.0)
    workload.reported(command_id("w1", "east", 1, 1),
                      Progress(Outcome.RUNNING, Stamps(admitted=100.5, running=101.0)), 101.0)
    workload.stop(102.0, CANCELLED, "cancelled")
    assert workload.settle(102.0)
    assert workload.phase.value == "Cancelled"
    assert [job.state for job in workload.jobs] == [
        JobState.SUCCEEDED, JobState.CANCELLED, JobState.CANCELLED, JobState.CANCELLED]
    assert running.running_at == 101.0  # what ran stays in the report
    assert sorted(workload.deleting) == ["east", "north", "west"]
    report = workload.report(102.0)
    assert (report.counts.succeeded, report.counts.cancelled) == (1, 3)
    # Nothing that comes later moves a Job on.
    assert not workload.reported(command_id("w1", "east", 1, 1), Progress(Outcome.SUCCEEDED),
                                 103.0)
    assert workload.due(200.0) == []
    # A member's Hello that still lists a Job of the workload: it is asked again.
    assert not workload.resynced_deleting("west", [command_id("w1", "west", 0, 1)])
    # One whose Hello lists none (or that left the fleet) has nothing left to delete.
    assert workload.resynced_deleting("north", [command_id("w2", "north", 0, 1)])
    assert workload.deleted("east", "could not delete its Jobs: forbidden")
    assert not workload.deleted("east")
    assert list(workload.deleting) == ["west"]
    assert workload.message == "cancelled; east: could not delete its Jobs: forbidden"
    stored = decode(json.loads(json.dumps(encode(Snapshot("h", [], [], [workload])))))
    assert stored.workloads[0].deleting == {"west": False}


def test_deletion_ids_belong_to_their_workload_and_cluster() -> None:
    assert owner(delete_id("w1a2b", "west-1")) == ("w1a2b", "west-1")
    assert owner(command_id("w1a2b", "west-1", 3, 1)) == ("w1a2b", "west-1")
    for foreign in ("r1/west/start", "w1/west/remove", "w1//delete", "w1/west/delete/x"):
        assert owner(foreign) is None


async def _until(fleet: FleetClient, workload_id: str,
                 holds: Callable[[fleet_pb2.Workload], bool],
                 timeout: float = 10.0) -> fleet_pb2.Workload:
    async with asyncio.timeout(timeout):
        while not holds(workload := await fleet.get_workload(workload_id, jobs=True)):
            await asyncio.sleep(0.05)
    return workload


def _one_at_a_time(jobs: int, seconds: float) -> fleet_pb2.WorkloadSpec:
    """Jobs of 1 pod x 8 GPUs, all arrived at once: one at a time on a 1-node member."""
    return _spec(jobs=jobs, pods_per_job=1, run_time={"distribution": "fixed",
                                                      "seconds": seconds},
                 arrivals={"process": "times", "times": [0] * jobs})


async def test_cancelling_a_workload_deletes_its_jobs_and_keeps_what_ran(
        tmp_path: Path) -> None:
    members = [SimulatedMember(name, nodes=1) for name in ("east", "west")]
    async with running_hub(tmp_path) as hub, fleet_of(hub, members) as fleet:
        submitted = await fleet.submit_workload(_one_at_a_time(6, 1.5), start_delay=0)
        # Two done, one running on each member, two waiting for room.
        await _until(fleet, submitted.id, lambda w: w.report.counts.succeeded == 2
                     and w.report.counts.running == 2)
        cancelled = await fleet.cancel_workload(submitted.id)
        assert cancelled.phase == fleet_pb2.WORKLOAD_PHASE_CANCELLED
        assert cancelled.reason == "Cancelled"
        workload = await _until(fleet, submitted.id, lambda w: not w.deleting)
        await asyncio.sleep(1.6)  # the deleted Jobs' run time: nothing of them comes back
        after = await fleet.get_workload(submitted.id, jobs=True)
        again = await fleet.cancel_workload(submitted.id)  # cancelled already: as it is
    counts = after.report.counts
    assert (counts.jobs, counts.succeeded, counts.cancelled, counts.running) == (6, 2, 4, 0)
    assert after.report.to_running.count == 4  # the deleted ones ran, and the report says so
    assert [job.state for job in after.jobs] == [job.state for job in workload.jobs]
    assert again.phase == fleet_pb2.WORKLOAD_PHASE_CANCELLED
    for member in members:  # its two Jobs created, then deleted; the waiting ones never
        assert len(member.deleted) == 2
        assert _jobs_of(member) == []
        [deletion] = [e.command for e in member.executed.values()
                      if e.command.WhichOneof("action") == "delete_jobs"]
        assert deletion.id == f"{submitted.id}/{member.name}/delete"
        assert deletion.delete_jobs.namespace == "default"


async def test_cancelling_a_finished_or_unknown_workload_says_so(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, \
            fleet_of(hub, [SimulatedMember("east", nodes=4)]) as fleet:
        submitted = await fleet.submit_workload(_spec(jobs=1), start_delay=0)
        await _finished(fleet, submitted.id)
        with pytest.raises(grpc.aio.AioRpcError) as finished:
            await fleet.cancel_workload(submitted.id)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await fleet.cancel_workload("wnone")
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await fleet.cancel_workload("")
    assert finished.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert finished.value.details() == (
        f"workload_id: workload {submitted.id} Succeeded already, with nothing left to "
        f"cancel; only a Running workload can be cancelled")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_restarted_hub_finishes_a_cancel_a_member_did_not_hear_of(
        tmp_path: Path) -> None:
    """West is away when the workload is cancelled, and the hub restarts before it is back:
    the stored cancel still reaches it, and its Jobs are deleted."""
    east, west = (SimulatedMember(name, nodes=1) for name in ("east", "west"))
    state = tmp_path / "hub"
    stops = {name: asyncio.Event() for name in ("east", "west")}
    links: dict[str, asyncio.Task[None]] = {}

    def link(member: SimulatedMember, hub: RunningHub) -> None:
        member.link = MemberLink(hub.address, hub.member_token(member.name), member,
                                 member.name)
        links[member.name] = asyncio.create_task(member.link.run(stops[member.name]))

    async with running_hub(state) as hub, hub.fleet() as fleet:
        listen = hub.info.address
        for member in (east, west):
            link(member, hub)
        async with asyncio.timeout(5):
            while len([m for m in await fleet.list_clusters() if m.state == 1]) < 2:
                await asyncio.sleep(0.05)
        submitted = await fleet.submit_workload(_one_at_a_time(4, 30), start_delay=0)
        await _until(fleet, submitted.id, lambda w: w.report.counts.running == 2)
        stops["west"].set()
        await links["west"]
        await fleet.cancel_workload(submitted.id)
        await _until(fleet, submitted.id, lambda w: list(w.deleting) == ["west"])
    assert len(_jobs_of(west)) == 1
    async with running_hub(state, listen=listen) as hub, hub.fleet() as fleet:
        stops["west"] = asyncio.Event()
        link(west, hub)
        workload = await _until(fleet, submitted.id, lambda w: not w.deleting, timeout=15)
        for stop in stops.values():
            stop.set()
        await asyncio.gather(*links.values())
    assert workload.phase == fleet_pb2.WORKLOAD_PHASE_CANCELLED
    assert _jobs_of(west) == _jobs_of(east) == []
    assert len(west.deleted) == len(east.deleted) == 1
    for member in (east, west):
        await member.stop()


# -- the limit on live workloads ---------------------------------------------------------------

async def test_workloads_past_the_hubs_limit_are_refused_until_one_ends(tmp_path: Path) -> None:
    async with running_hub(tmp_path, max_live_workloads=2) as hub, \
            fleet_of(hub, [SimulatedMember("east", nodes=4)]) as fleet:
        first, _ = [await fleet.submit_workload(_one_at_a_time(1, 30), start_delay=0)
                    for _ in range(2)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await fleet.submit_workload(_one_at_a_time(1, 30), start_delay=0)
        await fleet.cancel_workload(first.id)
        third = await fleet.submit_workload(_one_at_a_time(1, 30), start_delay=0)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (refused.value.details() or "").startswith(
        "the hub runs 2 workloads, its limit (--max-live-workloads 2); wait for one to finish, "
        "cancel one ('fakefleet fleet cancel-workload ID')")
    assert third.phase == fleet_pb2.WORKLOAD_PHASE_RUNNING


def test_the_limit_is_one_workload_at_least(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        hub_main(["--state-dir", str(tmp_path), "--insecure", "--max-live-workloads", "0"])
    assert exited.value.code == 2
    assert "argument --max-live-workloads: '0' is not a number of workloads from 1 to 100000" \
        in capsys.readouterr().err
