"""The Replay kind's runner (operators/recording/running.py) and its daemon, over in-memory API
servers on a fake clock: a Replay waits for its cluster and its trace and says for what, replays
on the timeline with the status written at a bounded rate, fails with the refused writes named
(bounded), carries on after a restart from the status on a shifted timeline without writing
anything twice, recognises its own creates sent before a restart, stops when stopped, and
refuses a trace it cannot read or that changed under it."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import kopf
import yaml

from operators.api.replays import MAX_REFUSED_LISTED, Replay, ReplayStatus
from operators.handlers import replays as handler
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.times import micro_time, parse
from operators.recording import files, planning
from operators.recording.running import ReplayRun
from operators.recording.trace import Change, Resource, Target, Trace
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

S = 1_000_000_000
EXAMPLES = Path(__file__).parent.parent / "examples" / "replay"
HOST = "/apis/fakefleet.dev/v1alpha1/namespaces/default"
REPLAYS = f"{HOST}/replays"
CLUSTERS = f"{HOST}/fakeclusters"
TRACES = "/api/v1/namespaces/default/configmaps"
MEMBER_CONFIGMAPS = "/api/v1/namespaces/apps/configmaps"
CONFIGMAPS = Resource("", "v1", "configmaps")
WIDGETS = Resource("widgets.example", "v1", "widgets")


def configmap(name: str, value: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "apps"}, "data": {"v": value}}


def create(seconds: float, name: str, resource: Resource = CONFIGMAPS) -> Change:
    body = configmap(name) if resource == CONFIGMAPS else {
        "apiVersion": "widgets.example/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": "apps"}}
    return Change(int(seconds * S), "create", Target("c1", resource, "apps", name), body)


def recorded(changes: list[Change], clusters: tuple[str, ...] = ("c1",)) -> Trace:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}
    return Trace(clusters, "2026-01-01T00:00:00Z", 600 * S, (("c1", namespace),),
                 tuple(changes))


def every_second(count: int, start: float = 1) -> list[Change]:
    return [create(start + n, f"cm-{n}") for n in range(count)]


class World:
    """A host API with the FakeCluster west (Ready), a trace in a ConfigMap and a Replay; the
    member API west serves ConfigMaps and Namespaces (no Widgets)."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.host_api = MemoryTransport(self.clock)
        self.host = Client(self.host_api, clock=self.clock)
        self.member_api = MemoryTransport(self.clock)
        self.member_api.discover("v1", [
            {"name": "configmaps", "kind": "ConfigMap", "namespaced": True},
            {"name": "namespaces", "kind": "Namespace", "namespaced": False}])
        self.member_api.fail("POST", "/apis/widgets.example/v1/.*", status=404,
                             reason="NotFound", times=10**6)
        self.member = Client(self.member_api, clock=self.clock)
        self.stop = False

    def cluster(self, phase: str = "Ready") -> None:
        self.host_api.put(CLUSTERS, {"apiVersion": "fakefleet.dev/v1alpha1",
                                     "kind": "FakeCluster", "metadata": {"name": "west"},
                                     "spec": {}, "status": {"phase": phase}})

    def trace(self, trace: Trace | bytes, *, text: bool = False) -> None:
        data = trace if isinstance(trace, bytes) else files.encode(trace)
        found = self.host_api.object(f"{TRACES}/monday")
        content = {"data": {"trace": data.decode()}} if text else \
            {"binaryData": {"trace": base64.b64encode(data).decode()}}
        if found is None:
            self.host_api.put(TRACES, {"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": "monday"}, **content})
        else:
            self.host_api._objects[("v1", "configmaps")][("default", "monday")].update(content)

    def replay(self, status: dict[str, Any] | None = None, **spec: Any) -> None:
        obj = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "Replay",
               "metadata": {"name": "r", "generation": 1},
               "spec": {"clusterRef": "west",
                        "trace": {"configMapRef": {"name": "monday", "key": "trace"}},
                        **spec}}
        if status is not None:
            obj["status"] = status
        self.host_api.put(REPLAYS, obj)

    async def runner(self) -> ReplayRun:
        """A runner as the daemon makes one: from the Replay as the API shows it now."""
        replay = Replay.model_validate(await self.host.get(f"{REPLAYS}/r"))
        return ReplayRun(replay, host=self.host, connect=lambda _, name: self.member,
                         clock=self.clock)

    def status(self) -> ReplayStatus:
        found = self.host_api.object(f"{REPLAYS}/r")
        assert found is not None
        return ReplayStatus.model_validate(found.get("status") or {})

    def condition(self, kind: str) -> dict[str, Any]:
        found = self.host_api.object(f"{REPLAYS}/r") or {}
        return next(c for c in found["status"]["conditions"] if c["type"] == kind)

    def created(self, name: str) -> int:
        """How many creates of ``name`` reached the member."""
        return sum(1 for r in self.member_api.sent("POST", MEMBER_CONFIGMAPS)
                   if r.json()["metadata"]["name"] == name)

    def status_writes(self) -> int:
        return len(self.host_api.sent("PATCH", f"{REPLAYS}/r/status"))

    async def start(self) -> asyncio.Task[None]:
        runner = await self.runner()
        return asyncio.create_task(runner.run(lambda: self.stop))


class Flag:
    """What the daemon reads of kopf's DaemonStopped: whether it is set."""

    flag = False

    def __bool__(self) -> bool:
        return self.flag


async def until(what: Callable[[], bool], clock: FakeClock) -> None:
    """Let the runner's threads (reading and planning the trace) finish, as fake time does not
    wait for them."""
    for _ in range(500):
        if what():
            return
        await asyncio.sleep(0.01)
        await clock.settle()
    raise AssertionError("it never happened")


async def test_a_replay_goes_on_its_timeline_and_succeeds_with_every_write_counted() -> None:
    world = World()
    world.cluster()
    patch = Change(6 * S, "patch", Target("c1", CONFIGMAPS, "apps", "a"), {"data": {"v": "2"}})
    delete = Change(8 * S, "delete", Target("c1", CONFIGMAPS, "apps", "b"), None)
    world.trace(recorded([create(4, "a"), create(4, "b"), patch, delete]))
    world.replay(speed="2")
    task = await world.start()
    await until(lambda: world.status().phase == "Running", world.clock)
    assert world.status().total == 5
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/a") is None
    await world.clock.advance(2.1)
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/a") is not None, "due at 4 s / 2"
    await world.clock.advance(3)
    await task
    status = world.status()
    assert (status.phase, status.applied, status.total, status.progress) == \
        ("Succeeded", 5, 5, "5/5")
    assert (status.refusedCount, status.lagSeconds, status.maxLagSeconds) == (0, 0.0, 0.0)
    assert world.condition("Ready")["status"] == "True"
    assert "5 of 5 writes applied into FakeCluster west" in world.condition("Ready")["message"]
    assert world.condition("Stalled")["status"] == "False"
    made = world.member_api.object(f"{MEMBER_CONFIGMAPS}/a")
    assert made is not None
    assert made["data"] == {"v": "2"}
    assert made["metadata"]["annotations"][keys.OWNED_BY] == planning.writer(status.run)
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/b") is None
    assert status.startedAt
    assert status.finishedAt
    assert 4 <= parse(status.finishedAt) - parse(status.startedAt) <= 4.2


async def test_the_status_is_written_at_a_bounded_rate_and_shows_progress_meanwhile() -> None:
    world = World()
    world.cluster()
    world.trace(recorded(every_second(100)))
    world.replay(speed=1)
    task = await world.start()
    await until(lambda: world.status().phase == "Running", world.clock)
    before = world.status_writes()
    await world.clock.advance(50.1)
    halfway = world.status()
    assert 40 <= halfway.applied <= 51
    assert halfway.progress == f"{halfway.resumeFrom}/101"
    await world.clock.advance(60)
    await task
    assert world.status().applied == 101
    writes = world.status_writes() - before
    assert 20 <= writes <= 100 / 2 + 3, f"{writes} status writes for 100 s of replay"


async def test_refused_writes_fail_the_replay_with_their_reasons_listed_up_to_a_bound() -> None:
    world = World()
    world.cluster()
    widgets = [create(1, f"w{n}", WIDGETS) for n in range(30)]
    world.trace(recorded([*widgets, create(2, "ok")]))
    world.replay(speed=1)
    task = await world.start()
    await until(lambda: world.status().phase == "Running", world.clock)
    await world.clock.advance(5)
    await task
    status = world.status()
    assert (status.phase, status.applied, status.refusedCount) == ("Failed", 2, 30)
    assert len(status.refused) == MAX_REFUSED_LISTED
    assert status.refused[0].write.startswith("create Widget apps/w")
    assert "install its CustomResourceDefinition" in status.refused[0].reason
    stalled = world.condition("Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "WritesRefused")
    assert "the API refused 30" in stalled["message"]
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/ok") is not None


async def test_a_restarted_operator_carries_on_from_the_status_on_a_shifted_timeline() -> None:
    world = World()
    world.cluster()
    world.trace(recorded(every_second(10)))
    world.replay(speed=1)
    task = await world.start()
    await until(lambda: world.status().phase == "Running", world.clock)
    await world.clock.advance(4.5)
    world.stop = True  # the operator stops: what was settled is written
    await world.clock.advance(1)
    await task
    stopped = world.status()
    assert (stopped.phase, stopped.resumeFrom, stopped.applied) == ("Running", 5, 5)
    await world.clock.advance(100)  # the operator is away
    world.stop = False
    task = await world.start()
    await until(lambda: world.status().resumes == 1, world.clock)
    resumed = world.condition("Reconciling")
    assert resumed["reason"] == "Resumed"
    assert "carried on at write 5 of 11" in resumed["message"]
    await world.clock.advance(0.5)
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/cm-4") is not None, \
        "the first write not answered is due at once"
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/cm-5") is None, \
        "the next ones as far apart as recorded"
    await world.clock.advance(1)
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/cm-5") is not None
    await world.clock.advance(10)
    await task
    status = world.status()
    assert (status.phase, status.applied, status.total, status.refusedCount) == \
        ("Succeeded", 11, 11, 0)
    assert all(world.created(f"cm-{n}") == 1 for n in range(10)), "nothing written twice"


async def test_its_own_creates_sent_before_a_restart_count_as_applied_others_collide() -> None:
    """The status said write 1 was the first not answered; the earlier operator had sent it
    and the next one. The member has both, one marked as this run's, one not."""
    world = World()
    world.cluster()
    trace = recorded([create(1, "mine"), create(1, "theirs")])
    world.trace(trace)
    digest = hashlib.sha256(files.encode(trace)).hexdigest()
    world.replay(speed=1, status={
        "phase": "Running", "run": "feed", "traceSha256": digest,
        "startedAt": micro_time(world.clock.now() - 30), "total": 3, "applied": 1,
        "resumeFrom": 1, "progress": "1/3"})
    world.member_api.put(MEMBER_CONFIGMAPS, {
        **configmap("mine"), "metadata": {"name": "mine", "namespace": "apps", "annotations": {
            keys.OWNED_BY: planning.writer("feed")}}})
    world.member_api.put(MEMBER_CONFIGMAPS, configmap("theirs"))
    task = await world.start()
    await until(lambda: world.status().resumes == 1, world.clock)
    await world.clock.advance(2)
    await task
    status = world.status()
    assert (status.applied, status.refusedCount) == (2, 1)
    assert [r.write for r in status.refused] == ["create ConfigMap apps/theirs"]
    assert status.refused[0].reason.startswith("name collision")


async def test_a_replay_waits_for_its_cluster_and_its_trace_and_says_what_for() -> None:
    world = World()
    world.replay(speed="max")
    task = await world.start()
    await until(lambda: world.status_writes() == 1, world.clock)
    assert world.status().phase == "Pending"
    assert world.condition("Reconciling")["reason"] == "ClusterNotFound"
    assert "FakeCluster west is not in namespace default" in \
        world.condition("Reconciling")["message"]
    world.cluster("Provisioning")
    await world.clock.advance(5)
    await until(lambda: world.status_writes() == 2, world.clock)
    assert "FakeCluster west is Provisioning" in world.condition("Reconciling")["message"]
    world.host_api._objects[("fakefleet.dev/v1alpha1", "fakeclusters")][
        ("default", "west")]["status"]["phase"] = "Ready"
    await world.clock.advance(5)
    await until(lambda: world.status_writes() == 3, world.clock)
    waiting = world.condition("Reconciling")
    assert waiting["reason"] == "TraceNotFound"
    assert "kubectl create configmap monday --from-file=trace=FILE" in waiting["message"]
    world.trace(recorded(every_second(3)))
    await world.clock.advance(5)
    await until(lambda: world.status().phase == "Succeeded", world.clock)
    await task
    assert world.status().applied == 4


async def test_a_gzipped_trace_and_kwok_s_yaml_in_data_are_read() -> None:
    world = World()
    world.cluster()
    world.trace(gzip.compress(files.encode(recorded(every_second(2)))))
    world.replay(speed="max")
    await (await world.start())  # nothing to wait for at speed max but the threads
    assert (world.status().phase, world.status().applied) == ("Succeeded", 3)

    world = World()
    world.cluster()
    kwok = ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: k, namespace: apps}\n"
            "data: {v: '1'}\n")
    world.trace(kwok.encode(), text=True)
    world.replay(speed="max")
    await (await world.start())
    # The namespace the YAML lacks is made first if missing, then the ConfigMap.
    assert (world.status().phase, world.status().applied) == ("Succeeded", 2)
    assert world.member_api.object(f"{MEMBER_CONFIGMAPS}/k") is not None


async def test_a_trace_that_cannot_be_read_or_planned_fails_the_replay_naming_the_fix() -> None:
    world = World()
    world.cluster()
    world.trace(b"fakefleet-trace\n{\"format\": 1")
    world.replay()
    await (await world.start())
    stalled = world.condition("Stalled")
    assert (world.status().phase, stalled["reason"]) == ("Failed", "TraceUnreadable")
    assert stalled["message"].startswith(
        "trace ConfigMap default/monday key trace is truncated inside its header")
    assert "delete the Replay and apply it again" in stalled["message"]

    world = World()
    world.cluster()
    world.trace(recorded(every_second(1), clusters=("c1", "c2")))
    world.replay()
    await (await world.start())
    stalled = world.condition("Stalled")
    assert (world.status().phase, stalled["reason"]) == ("Failed", "PlanRefused")
    assert "name the one to replay in spec.from" in stalled["message"]
    assert not world.member_api.sent("POST")


async def test_a_trace_changed_under_a_running_replay_stops_it() -> None:
    world = World()
    world.cluster()
    world.trace(recorded(every_second(10)))
    world.replay(speed=1)
    task = await world.start()
    await until(lambda: world.status().phase == "Running", world.clock)
    await world.clock.advance(3.5)
    world.stop = True
    await world.clock.advance(1)
    await task
    world.trace(recorded(every_second(12)))
    world.stop = False
    await (await world.start())
    stalled = world.condition("Stalled")
    assert (world.status().phase, stalled["reason"]) == ("Failed", "TraceChanged")
    assert "put the trace it started with back" in stalled["message"]


async def test_start_at_holds_the_replay_pending_until_it_comes() -> None:
    world = World()
    world.cluster()
    world.trace(recorded(every_second(2)))
    world.replay(startAt=micro_time(world.clock.now() + 60).replace(".000000", ""))
    task = await world.start()
    await until(lambda: world.status_writes() == 1, world.clock)
    assert world.condition("Reconciling")["reason"] == "Scheduled"
    assert world.status().phase == "Pending"
    await world.clock.advance(59)
    assert not world.member_api.sent("POST")
    await world.clock.advance(5)
    await task
    status = world.status()
    assert (status.phase, status.applied) == ("Succeeded", 3)
    assert parse(status.startedAt) == world.clock.now() - 4


async def test_the_daemon_of_a_replay_waits_for_a_member_the_operator_does_not_reach() -> None:
    """The handler as kopf calls it: the FakeCluster is Ready in the host, but this operator
    runs no control plane for it (yet): Pending, and it says so; stopping ends the daemon."""
    world = World()
    world.cluster()
    world.trace(recorded(every_second(1)))
    world.replay()
    runtime = cast(Runtime, types.SimpleNamespace(
        host=world.host, substrate=types.SimpleNamespace(clusters={}), external={}))
    stopped = Flag()
    task = asyncio.create_task(handler.run(
        body=kopf.Body(kopf.RawBody(world.host_api.object(f"{REPLAYS}/r") or {})),
        memo=kopf.Memo(runtime=runtime), stopped=cast(kopf.DaemonStopped, stopped),
        clock=world.clock))
    await until(lambda: world.status_writes() == 1, world.clock)
    assert world.condition("Reconciling")["message"] == \
        "FakeCluster west has no API server this operator reaches yet"
    stopped.flag = True
    await world.clock.advance(1)
    await task
    assert world.status().phase == "Pending"


async def test_the_example_replays_as_its_comment_says() -> None:
    world = World()
    world.member_api.discover("apps/v1", [{"name": "deployments", "kind": "Deployment",
                                           "namespaced": True}])
    world.cluster()
    trace_map, replay = yaml.safe_load_all((EXAMPLES / "checkout.yaml").read_text())
    world.host_api.put(TRACES, trace_map)
    world.host_api.put(REPLAYS, {**replay, "metadata": {"name": "r", "generation": 1}})
    task = await world.start()
    await until(lambda: world.status().phase == "Running", world.clock)
    await world.clock.advance(16)
    await task
    status = world.status()
    assert (status.phase, status.applied, status.total) == ("Succeeded", 7, 7)
    web = world.member_api.object("/apis/apps/v1/namespaces/shop/deployments/web")
    assert web is not None
    assert web["spec"]["replicas"] == 4
    assert world.member_api.object("/apis/batch/v1/namespaces/shop/jobs/report") is not None
    assert world.member_api.object("/api/v1/namespaces/shop/configmaps/flags") is None


async def test_a_long_reason_is_cut_so_that_the_status_stays_small() -> None:
    world = World()
    world.cluster()
    world.trace(recorded(every_second(1), clusters=tuple(f"c{n:04d}" for n in range(2000))))
    world.replay()
    await (await world.start())
    message = world.condition("Stalled")["message"]
    assert len(message) == 1024
    assert message.endswith("…")
