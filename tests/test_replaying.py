"""A replay against an in-memory API on a fake clock (operators/recording/replaying.py): writes
on their timeline, refusals named and passed over, retries, the lag."""

from __future__ import annotations

import asyncio
from typing import Any

from operators.k8s.client import Client
from operators.recording import planning, replaying
from operators.recording.planning import Options
from operators.recording.trace import Change, Owner, PodLife, Resource, Target, Trace
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

S = 1_000_000_000
CONFIGMAPS = Resource("", "v1", "configmaps")
DEPLOYMENTS = "/apis/apps/v1/namespaces/apps/deployments"


def configmap(name: str, value: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "apps"}, "data": {"v": value}}


def widget(name: str) -> dict[str, Any]:
    return {"apiVersion": "widgets.example/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": "apps"}}


def deployment(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "apps"}, "spec": {"replicas": 1}}


def at(seconds: float, method: str, name: str, body: dict[str, Any] | None = None) -> Change:
    return Change(int(seconds * S), method, Target("c1", CONFIGMAPS, "apps", name),  # type: ignore[arg-type]
                  body)


def api(clock: FakeClock, *, namespaces: bool = False) -> MemoryTransport:
    transport = MemoryTransport(clock, namespaces=namespaces)
    transport.discover("v1", [{"name": "configmaps", "kind": "ConfigMap", "namespaced": True},
                              {"name": "namespaces", "kind": "Namespace", "namespaced": False}])
    transport.discover("apps/v1", [{"name": "deployments", "kind": "Deployment",
                                    "namespaced": True}])
    return transport


async def run(trace: Trace, transport: MemoryTransport, clock: FakeClock, seconds: float,
              speed: float = 1) -> replaying.Progress:
    task = asyncio.create_task(replaying.replay(trace, Options(speed=speed), Client(
        transport, clock=clock), clock=clock))
    await clock.advance(seconds)
    assert task.done(), "the replay ended"
    return task.result()[1]


def trace(initial: list[dict[str, Any]], changes: list[Change]) -> Trace:
    return Trace(("c1",), "2026-01-01T00:00:00Z", 60 * S, tuple(("c1", o) for o in initial),
                 tuple(changes))


async def test_writes_reach_the_api_when_due_and_in_order_per_object() -> None:
    clock = FakeClock()
    transport = api(clock)
    started = clock.now()
    changes = [at(4, "create", "a", configmap("a")), at(6, "patch", "a", {"data": {"v": "2"}}),
               at(8, "delete", "a"), at(8, "create", "b", configmap("b"))]
    progress = await run(trace([deployment("web")], changes), transport, clock, 10, speed=2)
    # The trace holds no namespace apps: it is made first, if missing.
    assert (progress.applied, progress.total, progress.refused) == (6, 6, [])
    sent = [(r.method, r.path.rsplit("/", 1)[-1]) for r in transport.requests
            if r.method != "GET"]
    assert sent[:4] == [("POST", "namespaces"), ("POST", "deployments"), ("POST", "configmaps"),
                        ("PATCH", "a")]
    assert sorted(sent[4:]) == [("DELETE", "a"), ("POST", "configmaps")], \
        "two objects' writes due at once go together"
    assert transport.object(f"{DEPLOYMENTS}/web") is not None
    assert transport.object("/api/v1/namespaces/apps/configmaps/a") is None
    assert transport.object("/api/v1/namespaces/apps/configmaps/b") is not None
    assert progress.lag() == (0.0, 0.0, 0.0), "on a fake clock, each write when due"
    assert clock.now() - started == 10


async def test_refused_objects_are_named_with_the_reason_and_the_replay_goes_on() -> None:
    clock = FakeClock()
    transport = api(clock)
    transport.put(DEPLOYMENTS, deployment("taken"))
    transport.fail("GET", "/apis/widgets.example/v1", status=404, reason="NotFound")
    changes = [at(1, "patch", "gone", {"data": {"v": "2"}}),
               Change(2 * S, "patch", Target("c1", Resource("apps", "v1", "deployments"),
                                             "apps", "taken"), {"spec": {"replicas": 3}}),
               at(3, "create", "ok", configmap("ok"))]
    progress = await run(trace([widget("w"), deployment("taken")], changes), transport,
                         clock, 5)
    refused = {r.write.describe(): r.reason for r in progress.refused}
    assert set(refused) == {"create Widget apps/w", "create Deployment apps/taken",
                            "patch ConfigMap apps/gone"}
    assert "install its CustomResourceDefinition" in refused["create Widget apps/w"]
    assert refused["create Deployment apps/taken"].startswith("name collision")
    assert "its create was not replayed" in refused["patch ConfigMap apps/gone"]
    # The later patch of the Deployment whose create was refused is left out with it: the
    # one that stands there is not ours to change.
    assert progress.dropped == 1
    assert transport.object(f"{DEPLOYMENTS}/taken")["spec"] == {"replicas": 1}  # type: ignore[index]
    assert progress.applied == 2, "the namespace apps, and the ConfigMap ok"
    assert transport.object(
        "/api/v1/namespaces/apps/configmaps/ok") is not None


async def test_an_api_error_that_may_pass_is_tried_again_and_counts_in_the_lag() -> None:
    clock = FakeClock()
    transport = api(clock)
    transport.fail("POST", "/api/v1/namespaces/apps/configmaps", status=503, times=2)
    progress = await run(trace([], [at(1, "create", "a", configmap("a"))]), transport, clock,
                         10)
    assert progress.applied == 2, "its namespace, and it"
    assert not progress.refused
    assert progress.lag()[2] == 3.0, "1 s then 2 s of back-off"


async def test_the_lag_says_how_far_the_api_fell_behind() -> None:
    clock = FakeClock()
    transport = api(clock)
    transport.fail("POST", "/api/v1/namespaces/apps/configmaps", delay=0.5, times=1)
    progress = await run(trace([], [at(1, "create", "a", configmap("a")),
                                    at(1, "create", "b", configmap("b"))]), transport, clock, 5)
    assert progress.applied == 3, "their namespace, and them"
    assert sorted(progress.lags) == [0.0, 0.0, 0.5]


def test_a_write_describes_the_object_it_writes() -> None:
    plan = planning.plan(trace([deployment("web")], []), Options(speed=1))
    assert [w.describe() for w in plan.writes] == ["create Namespace apps",
                                                   "create Deployment apps/web"]


async def test_a_refused_lives_set_leaves_its_owner_replayed() -> None:
    """Without its set the owner's pods run on their defaults (the engine says so); the
    owner itself is not the set's refusal's to drop."""
    clock = FakeClock()
    transport = api(clock)
    transport.fail("POST", "/api/v1/namespaces/fakefleet-system/configmaps", status=403,
                   reason="Forbidden")
    web = {**deployment("web"), "spec": {"replicas": 1, "template": {
        "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    pods = (PodLife("c1", "apps", "web-5d4f8c7b9-a", Owner("ReplicaSet", "web-5d4f8c7b9"), 0,
                    created=0, started=S),)
    recorded = Trace(("c1",), "2026-01-01T00:00:00Z", S, (("c1", web),), (), pods)
    progress = await run(recorded, transport, clock, 1)
    assert [r.write.describe() for r in progress.refused] == [
        f"create ConfigMap fakefleet-system/{progress.refused[0].write.name}"]
    assert progress.applied == 2, "the namespace apps, and the Deployment"
    assert transport.object(f"{DEPLOYMENTS}/web") is not None


async def test_a_namespace_the_trace_lacks_is_made_before_what_goes_in_it() -> None:
    """Into an API that refuses an object whose namespace is not there: the namespace the
    trace lacks is made first (its objects wait for it, however slow its answer), one of
    that name already there is left as it stands, and nothing is refused."""
    clock = FakeClock()
    transport = api(clock, namespaces=True)
    transport.put("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": "kept", "labels": {"a": "b"}}})
    transport.fail("POST", "/api/v1/namespaces", delay=0.5)
    kept = {**configmap("c"), "metadata": {"name": "c", "namespace": "kept"}}
    progress = await run(trace([deployment("web"), configmap("a"), kept], []), transport,
                         clock, 2)
    assert progress.refused == []
    assert (progress.applied, progress.total) == (5, 5)
    assert [(w.kind, w.name) for w in progress.present] == [("Namespace", "kept")]
    made = transport.object("/api/v1/namespaces/apps")
    assert made is not None
    assert made["metadata"]["annotations"] == {"fakefleet.dev/owned-by": "Replay/0"}
    assert transport.object("/api/v1/namespaces/kept")["metadata"]["labels"] == {"a": "b"}  # type: ignore[index]
    assert "annotations" not in transport.object("/api/v1/namespaces/kept")["metadata"]  # type: ignore[index]
    assert transport.object(f"{DEPLOYMENTS}/web") is not None
    assert transport.object("/api/v1/namespaces/kept/configmaps/c") is not None


async def test_a_create_into_a_namespace_not_there_says_so() -> None:
    clock = FakeClock()
    transport = api(clock, namespaces=True)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}
    changes = [Change(S, "delete", Target("c1", Resource("", "v1", "namespaces"), "", "apps")),
               at(2, "create", "late", configmap("late"))]
    progress = await run(trace([namespace], changes), transport, clock, 3)
    [refused] = progress.refused
    assert refused.write.describe() == "create ConfigMap apps/late"
    assert refused.reason.startswith("its namespace apps is not in the cluster")


async def test_settled_counts_only_the_writes_answered_in_the_plan_s_order() -> None:
    """A write answered before an earlier one is settled once that one is: a replay carried on
    from ``settled.through`` sends again only what may not have been answered."""
    clock = FakeClock()
    transport = api(clock)
    transport.fail("POST", "/api/v1/namespaces/apps/configmaps", delay=3, times=1)
    seen: list[tuple[int, int]] = []
    task = asyncio.create_task(replaying.replay(
        trace([], [at(1, "create", "slow", configmap("slow")),
                   at(2, "create", "quick", configmap("quick"))]),
        Options(speed=1), Client(transport, clock=clock), clock=clock,
        on_progress=lambda p: seen.append((p.applied, p.settled.through))))
    await clock.advance(2.5)
    assert transport.object("/api/v1/namespaces/apps/configmaps/quick") is not None
    # Write 0 is the namespace the trace lacks (made if missing), answered at once.
    assert seen == [(1, 1), (2, 1)], "answered, but after one that is not"
    await clock.advance(2)
    progress = task.result()[1]
    assert seen[-1] == (3, 3)
    assert (progress.settled.through, progress.settled.applied) == (3, 3)


async def test_a_run_from_a_write_on_takes_the_timeline_it_is_given() -> None:
    clock = FakeClock()
    transport = api(clock)
    plan = planning.plan(trace([], [at(1, "create", "a", configmap("a")),
                                    at(3, "create", "b", configmap("b")),
                                    at(4, "create", "c", configmap("c"))]), Options(speed=1))
    replayer = replaying.Replayer(Client(transport, clock=clock), clock=clock)
    assert plan.writes[0].kind == "Namespace", "the namespace the trace lacks, made first"
    task = asyncio.create_task(replayer.run(plan, start=2, zero=clock.now() - 3))
    await clock.settle()
    assert transport.object("/api/v1/namespaces/apps/configmaps/b") is not None, "due at once"
    assert transport.object("/api/v1/namespaces/apps/configmaps/c") is None
    await clock.advance(1)
    progress = await task
    assert transport.object("/api/v1/namespaces/apps/configmaps/a") is None, "before start"
    assert (progress.applied, progress.settled.through, progress.total) == (2, 4, 4)
