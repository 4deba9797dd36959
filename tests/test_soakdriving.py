"""The soak's activities on a fake clock: kills go at their seeded moments whatever an earlier
kill waits for, a kill whose target is down looks again instead of giving up, a pool's size is
recorded only once its write succeeded and scaling goes on after failures, and a submission
whose answer was lost is never made twice."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from bench import soakdriving
from bench.soakcheck import Kill, Scale, Sighting, nodes_made_once
from bench.soakdriving import COMEBACK, RETRY_EVERY, RETRY_FOR, Killer, Planned, Published
from federation.api import fleet_pb2
from operators.controlplane.state import (
    ComponentState,
    HostState,
    OperatorState,
    StateDir,
    publish,
)
from operators.k8s.client import Client
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

POOLS = "/apis/fakefleet.dev/v1alpha1/namespaces/bench/fakenodepools"


class Table:
    """A fake process table: per (target, cluster) the pid running now, if any; a kill takes
    it down, and the test says when a successor runs."""

    def __init__(self) -> None:
        self.pids: dict[tuple[str, str], int | None] = {}
        self.killed: list[int] = []

    def running(self, target: str, cluster: str) -> int | None:
        return self.pids.get((target, cluster))

    def kill(self, pid: int) -> None:
        self.killed.append(pid)
        for key, running in self.pids.items():
            if running == pid:
                self.pids[key] = None


def killer(table: Table, clock: FakeClock) -> Killer:
    return Killer(table, clock=clock, started=clock.now(), say=lambda _: None)


def test_the_schedule_comes_from_the_seed_within_the_quiet_minutes() -> None:
    planned = soakdriving.schedule(7, 20, 600, ["operator", "engine", "etcd"], ["a", "b"])
    assert planned == soakdriving.schedule(7, 20, 600, ["operator", "engine", "etcd"],
                                           ["a", "b"])
    assert all(60 <= p.at <= 540 for p in planned)
    assert [p.at for p in planned] == sorted(p.at for p in planned)
    assert {p.cluster for p in planned if p.target == "engine"} <= {"a", "b"}
    assert {p.cluster for p in planned if p.target != "engine"} == {""}


async def test_a_kill_whose_target_is_down_looks_again_and_says_how_late_it_went() -> None:
    clock, table = FakeClock(), Table()
    table.pids[("hub", "")] = None  # an earlier kill's: not back yet
    soak = killer(table, clock)
    run = asyncio.create_task(soak.run([Planned(10.0, "hub", "")]))
    await clock.advance(10 + 3 * RETRY_EVERY)
    table.pids[("hub", "")] = 41
    await clock.advance(RETRY_EVERY)
    assert table.killed == [41]
    table.pids[("hub", "")] = 42
    await clock.advance(COMEBACK)
    await run
    [kill] = soak.kills
    assert kill.pid == 41
    assert kill.tries == 5
    assert kill.drift == pytest.approx(4 * RETRY_EVERY)
    assert kill.back_after is not None


async def test_a_target_that_never_runs_is_reported_not_killed() -> None:
    clock, table = FakeClock(), Table()
    soak = killer(table, clock)
    run = asyncio.create_task(soak.run([Planned(5.0, "collector", "")]))
    await clock.advance(5 + RETRY_FOR + RETRY_EVERY)
    await run
    assert soak.kills == [Kill(5.0, "collector", "", 0, None, soak.kills[0].tries, None)]
    assert soak.kills[0].tries > 1


async def test_waiting_for_a_comeback_never_holds_back_the_next_kill() -> None:
    clock, table = FakeClock(), Table()
    table.pids |= {("operator", ""): 10, ("engine", "a"): 20}
    soak = killer(table, clock)
    run = asyncio.create_task(soak.run([Planned(10.0, "operator", ""),
                                        Planned(15.0, "engine", "a")]))
    await clock.advance(15)  # the operator is not back: its kill still waits
    assert table.killed == [10, 20]
    table.pids[("operator", "")] = 11
    table.pids[("engine", "a")] = 21
    await clock.advance(COMEBACK)
    await run
    assert sorted((k.target, k.drift) for k in soak.kills) == [("engine", 0.0),
                                                              ("operator", 0.0)]


async def test_two_kills_of_one_target_never_pick_the_same_process() -> None:
    clock, table = FakeClock(), Table()
    table.pids[("etcd", "")] = 30
    # The published file still names the killed process for a while.
    table.kill = table.killed.append  # type: ignore[method-assign]
    soak = killer(table, clock)
    run = asyncio.create_task(soak.run([Planned(10.0, "etcd", ""), Planned(11.0, "etcd", "")]))
    await clock.advance(12)
    assert table.killed == [30]
    table.pids[("etcd", "")] = 31
    await clock.advance(RETRY_EVERY)
    assert table.killed == [30, 31]
    table.pids[("etcd", "")] = 32
    await clock.advance(COMEBACK)
    await run
    assert sorted(k.pid for k in soak.kills) == [30, 31]


@pytest.fixture
def sleeping(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A process that runs the program the table expects of etcd."""
    monkeypatch.setitem(soakdriving.PROGRAMS, "etcd", "sleep")
    monkeypatch.setitem(soakdriving.PROGRAMS, "engine", "sleep")
    with subprocess.Popen(["sleep", "30"]) as process:
        yield process.pid
        process.kill()


def test_published_processes_are_checked_in_proc(tmp_path: Path, sleeping: int) -> None:
    state = StateDir(tmp_path).create()
    publish(state.host_file, HostState(pid=1, components=[
        ComponentState(cluster=None, name="etcd", pid=sleeping, log="")]))
    publish(state.operator_file, OperatorState(pid=1, components=[
        ComponentState(cluster="bench.b", name="engine", pid=sleeping, log=""),
        ComponentState(cluster="bench.a", name="engine", pid=2 ** 22 + 1, log="")]))
    published = Published(state)
    assert published.running("etcd", "") == sleeping
    assert published.running("engine", "b") == sleeping
    assert published.running("engine", "a") is None  # published, but dead
    assert published.running("hub", "") is None


def test_a_program_is_the_binary_or_the_python_module() -> None:
    assert soakdriving.program_of(["/cache/bin/etcd", "--data-dir", "/x/etcd"]) == "etcd"
    assert soakdriving.program_of(["/venv/bin/python", "-m", "operators.engine"]) == \
        "operators.engine"
    assert soakdriving.program_of([""]) == ""


async def test_a_size_is_recorded_once_written_and_scaling_goes_on_after_failures() -> None:
    clock = FakeClock()
    api = MemoryTransport(clock)
    api.put(POOLS, {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
                    "metadata": {"name": "b-elastic"}, "spec": {"replicas": 3}})
    api.fail("PATCH", f"{POOLS}/b-elastic", status=503, times=2)
    scales: list[Scale] = []
    stop = asyncio.Event()
    task = asyncio.create_task(soakdriving.scaling(
        Client(api, clock=clock), f"{POOLS}/b-elastic", "b", "b-elastic", (3, 6), every=100,
        clock=clock, started=clock.now(), stop=stop, scales=scales, say=lambda _: None))
    await clock.advance(100 + RETRY_EVERY)
    assert scales == []  # asked twice, refused twice: the pool never changed
    await clock.advance(RETRY_EVERY)
    assert scales == [Scale(100.0, "b", "b-elastic", 6)]  # from when it was first asked
    assert api.object(f"{POOLS}/b-elastic")["spec"]["replicas"] == 6  # type: ignore[index]
    await clock.advance(100)
    assert [s.replicas for s in scales] == [6, 3]
    stop.set()
    await clock.advance(1)
    await task


async def test_a_deletion_the_engine_makes_at_once_is_excused_by_the_size_asked() -> None:
    # Soak 2: the engine deleted b-elastic-3 and -4 within tens of milliseconds of the run
    # asking for 3 nodes, a moment recorded rounded up (1000.4): sighted before it, the
    # deletions looked unasked.
    clock = FakeClock()
    api = MemoryTransport(clock)
    api.put(POOLS, {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
                    "metadata": {"name": "b-elastic"}, "spec": {"replicas": 6}})
    scales: list[Scale] = []
    stop = asyncio.Event()
    started = clock.now() - 0.37
    task = asyncio.create_task(soakdriving.scaling(
        Client(api, clock=clock), f"{POOLS}/b-elastic", "b", "b-elastic", (6, 3), every=1000,
        clock=clock, started=started, stop=stop, scales=scales, say=lambda _: None))
    await clock.advance(1000)
    stop.set()
    await clock.advance(1)
    await task
    made = Sighting(at=900.4, cluster="b", kind="Node", name="b-elastic-3", uid="u1",
                    ready="True")
    gone = dataclasses.replace(made, at=1000.38, deleted=True)
    assert nodes_made_once([made, gone], [Scale(900.3, "b", "b-elastic", 6), *scales]) == []
    assert [s.replicas for s in scales] == [3]
    assert scales[0].at == pytest.approx(1000.37)  # when it was asked, to the millisecond


class Hub:
    """A hub whose answer to the first submission is lost (it was made all the same)."""

    def __init__(self) -> None:
        self.workloads: list[fleet_pb2.Workload] = []
        self.lose_answer = True

    async def list_workloads(self) -> list[fleet_pb2.Workload]:
        return list(self.workloads)

    async def submit_workload(self, spec: fleet_pb2.WorkloadSpec, *, name: str = "",
                              start_delay: float | None = None,
                              traceparent: str = "") -> fleet_pb2.Workload:
        made = fleet_pb2.Workload(id=f"w{len(self.workloads)}", name=name)
        self.workloads.append(made)
        if self.lose_answer:
            self.lose_answer = False
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "the hub was killed")
        return made

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Hub]:
        yield self


async def test_a_submission_whose_answer_was_lost_is_found_not_made_twice() -> None:
    clock, hub = FakeClock(), Hub()
    submitted: list[str] = []
    stop = asyncio.Event()
    task = asyncio.create_task(soakdriving.submitting(
        hub.connect, lambda index: fleet_pb2.WorkloadSpec(), every=120, last=300,
        clock=clock, started=clock.now(), stop=stop, submitted=submitted, say=lambda _: None))
    await clock.advance(RETRY_EVERY)
    assert submitted == ["w0"]
    await clock.advance(300)
    await task  # the next one would start after ``last``
    assert [w.name for w in hub.workloads] == ["soak-0", "soak-1", "soak-2"]
    assert submitted == ["w0", "w1", "w2"]
