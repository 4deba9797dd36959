"""bench.replay's pure parts: the synthetic trace (its size, its timeline, the same for a seed,
what the planner makes of it), the order the write ceiling sends the writes in and the ceiling
against an in-memory API, and the figures: lags from a replay's progress, the fastest speed
within the budget, the speeds given (the measuring itself runs in `make bench`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from bench import replay
from bench.replaytrace import (
    CLUSTER,
    Size,
    SpeedRun,
    chains,
    fastest_within,
    measured,
    parse_speeds,
    synthetic,
)
from operators.k8s.client import Client
from operators.recording import files, planning, replaying
from operators.recording.planning import Write
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

SMALL = Size(configmaps=30, deployments=2, jobs=3, seconds=20.0)


def test_the_trace_holds_the_changes_its_size_says_within_its_length() -> None:
    trace = synthetic(Size(), namespace="ns")
    assert len(trace.changes) == Size().changes >= 10_000
    assert trace.clusters == (CLUSTER,)
    assert trace.duration == 150 * 10**9
    times = [change.at for change in trace.changes]
    assert times == sorted(times)
    assert times[0] >= 0
    assert times[-1] <= trace.duration
    assert times[-1] > trace.duration * 0.6, "the changes spread over the timeline"
    assert {change.target.namespace for change in trace.changes} == {"ns"}


def test_each_object_is_created_first_and_deleted_last() -> None:
    by_object: dict[str, list[str]] = {}
    for change in synthetic(SMALL, namespace="ns", seed=3).changes:
        key = f"{change.target.resource.resource}/{change.target.name}"
        by_object.setdefault(key, []).append(change.method)
    assert len(by_object) == 35
    assert by_object["configmaps/cm-0"] == ["create", "patch", "patch", "delete"]
    assert by_object["deployments/web-1"] == ["create", "patch", "patch", "patch", "delete"]
    assert by_object["jobs/batch-2"] == ["create", "delete"]


def test_a_seed_gives_the_same_trace_and_another_seed_another() -> None:
    assert synthetic(SMALL, namespace="ns", seed=5) == synthetic(SMALL, namespace="ns", seed=5)
    assert synthetic(SMALL, namespace="ns", seed=5).changes != \
        synthetic(SMALL, namespace="ns", seed=6).changes


def test_the_trace_file_reads_back_as_written(tmp_path: Path) -> None:
    trace = synthetic(SMALL, namespace="ns")
    path = tmp_path / "synthetic.trace"
    assert files.write(path, trace) == path.stat().st_size
    assert files.read(path) == trace


def test_the_planner_replays_every_change_after_the_namespace_it_makes() -> None:
    trace = synthetic(SMALL, namespace="ns")
    plan = planning.plan(trace, planning.Options(speed=10))
    assert not plan.skipped
    assert len(plan.writes) == SMALL.changes + 1
    first = plan.writes[0]
    assert (first.kind, first.name, first.if_missing) == ("Namespace", "ns", True)
    assert plan.writes[-1].due <= SMALL.seconds / 10
    jobs = [w for w in plan.writes if w.kind == "Job" and w.method == "create"]
    assert jobs[0].body is not None
    assert jobs[0].body["spec"]["suspend"] is True


def test_the_ceiling_sends_namespaces_first_then_each_objects_writes_in_order() -> None:
    plan = planning.plan(synthetic(SMALL, namespace="ns"), planning.Options(speed=0))
    namespaces, objects = chains(plan)
    assert [w.name for w in namespaces] == ["ns"]
    assert len(objects) == 35
    assert sum(map(len, objects)) + len(namespaces) == len(plan.writes)
    for chain in objects:
        assert len({w.identity for w in chain}) == 1
        assert chain[0].method == "create"
        assert chain[-1].method == "delete"
        assert [w.due for w in chain] == sorted(w.due for w in chain)


def test_the_ceiling_takes_every_write_of_an_api_that_answers() -> None:
    clock = FakeClock()
    transport = MemoryTransport(clock, namespaces=True)
    plan = planning.plan(synthetic(SMALL, namespace="ns"), planning.Options(speed=0))

    async def main() -> replay.Ceiling:
        return await replay.write_ceiling(Client(transport, clock=clock), plan, 4)
    ceiling = asyncio.run(main())
    assert (ceiling.writes, ceiling.failed, ceiling.first_failure) == \
        (len(plan.writes), 0, "")
    assert len(transport.sent("POST")) == 1 + 35
    assert len(transport.sent("DELETE")) == 35
    assert transport.objects("/api/v1/namespaces/ns/configmaps") == []
    assert transport.object("/api/v1/namespaces/ns") is not None


def test_the_ceiling_counts_what_the_api_refuses() -> None:
    clock = FakeClock()
    transport = MemoryTransport(clock, namespaces=True)
    plan = planning.plan(synthetic(SMALL, namespace="ns"), planning.Options(speed=0))
    transport.fail("POST", "/apis/batch/v1/namespaces/ns/jobs", status=422, reason="Invalid",
                   times=3)

    async def main() -> replay.Ceiling:
        return await replay.write_ceiling(Client(transport, clock=clock), plan, 4)
    ceiling = asyncio.run(main())
    assert ceiling.failed == 6, "3 creates refused, and the deletes of what is not there"
    assert ceiling.first_failure.startswith("create Job ns/batch-")


def write(name: str) -> Write:
    return Write(0.0, "create", "v1", "ConfigMap", "configmaps", "ns", name, {})


def test_a_runs_figures_come_from_the_replays_progress() -> None:
    progress = replaying.Progress(total=5, applied=4, lags=[0.4, 0.1, 0.3, 0.2],
                                  refused=[replaying.Refusal(write("a"), "Invalid")])
    run = measured(10, progress, wall=2.0, timeline=15.0)
    assert (run.writes, run.applied, run.refused, run.dropped) == (5, 4, 1, 0)
    assert (run.lag_p50, run.lag_p99, run.lag_max) == (0.3, 0.4, 0.4)
    assert run.first_refusal == "create ConfigMap ns/a: Invalid"
    assert run.rate == 2.0
    assert run.label == "10"
    assert measured(0, replaying.Progress(total=0), wall=0.0, timeline=0.0).label == "max"


def run_at(speed: float, p99: float, *, refused: int = 0, applied: int = 10) -> SpeedRun:
    return SpeedRun(speed=speed, writes=10, applied=applied, refused=refused, lag_p99=p99)


def test_the_fastest_speed_within_the_budget_is_on_a_timeline_and_took_every_write() -> None:
    runs = [run_at(1, 0.01), run_at(10, 0.9), run_at(100, 1.5), run_at(0, 0.2)]
    found = fastest_within(runs)
    assert found is not None
    assert found.speed == 10
    assert fastest_within([run_at(1, 0.01), run_at(10, 0.2, refused=1)]) == run_at(1, 0.01)
    assert fastest_within([run_at(1, 0.01, applied=9)]) is None
    assert fastest_within([run_at(1, 2.0), run_at(0, 0.1)]) is None
    assert fastest_within([run_at(1, 0.4)], budget=0.3) is None


def test_speeds_are_factors_or_max_each_once() -> None:
    assert parse_speeds("1, 10,max") == [1.0, 10.0, 0.0]
    assert parse_speeds("0.5") == [0.5]
    for wrong in ("fast", "1,1", "2e7", "", "-1"):
        with pytest.raises(ValueError, match="speed"):
            parse_speeds(wrong)


def test_the_determinism_scenario_is_valid_yaml_with_the_lives_it_says() -> None:
    jobs, plan = replay.scenario("7")
    found = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(jobs)}
    assert sorted(found) == ["batch", "flaky", "victim"]
    flaky = found["flaky"]["spec"]
    assert flaky["template"]["metadata"]["annotations"] == {keys.RUN_TIME: "2s",
                                                            keys.EXIT_CODE: "2"}
    assert flaky["backoffLimit"] == 1
    assert yaml.safe_load(plan)["spec"]["seed"] == 7
    assert yaml.safe_load(replay.scenario("x")[1])["spec"]["seed"] == 1


def test_both_replays_go_into_clusters_and_pools_of_the_same_names() -> None:
    items = yaml.safe_load(replay.fleet_manifest(3))["items"]
    pools = {(i["metadata"]["namespace"], i["metadata"]["name"], i["spec"]["clusterRef"])
             for i in items if i["kind"] == "FakeNodePool"}
    assert pools == {("default", "src-workers", "src"), ("replay-a", "workers", "again"),
                     ("replay-b", "workers", "again")}
    assert all(i["spec"]["replicas"] == 3 for i in items if i["kind"] == "FakeNodePool")
