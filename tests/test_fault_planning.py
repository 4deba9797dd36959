"""The pure fault planner: target selection, percent rounding, caps, seeds, timing, after, repeat.

Example tests pin the rules; property tests (hypothesis) check them over generated fleets and
steps: a seed always gives the same victims and times, whatever order the fleet is listed in;
no injection exceeds maxTargets; every injection with a duration recovers after it injects;
a step waiting for others starts only once they finished; occurrences of a step never overlap;
a plan narrowed to one cluster picks there what the whole plan picks there.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.faults import xid
from operators.faults.planning import PlanError, Step, Timing, plan
from operators.faults.targets import (
    Clusters,
    ClusterView,
    Fleet,
    Mode,
    Nodes,
    NodeView,
    Pods,
    PodView,
    Target,
    TargetError,
    Victim,
    how_many,
    unknown_names,
)
from primitives.selectors import LabelSelector, Requirement


def cluster(name: str, nodes: int, *, region: str = "eu", pool: str = "gpu",
            pods: tuple[PodView, ...] = ()) -> ClusterView:
    return ClusterView(name, {"region": region},
                       tuple(NodeView(f"{pool}-{i}", pool, {"zone": f"z{i % 3}"})
                             for i in range(nodes)), pods)


FLEET = Fleet((cluster("west", 50, region="eu"), cluster("east", 10, region="us"),
               cluster("north", 0, region="eu")))


def step(name: str = "s", *, target: Target | None = None, fault: str = "NotReady",
         **timing: object) -> Step:
    return Step(name, target or Target(nodes=Nodes()), fault,
                Timing(**({"at": 0.0} | timing)))  # type: ignore[arg-type]


def victims_of(schedule_steps: list[Step], seed: int | str = 7,
               fleet: Fleet = FLEET) -> tuple[Victim, ...]:
    return plan(schedule_steps, fleet, seed).injections[0].victims


# -- selection ---------------------------------------------------------------------------------

def test_percent_rounds_up_per_cluster() -> None:
    victims = victims_of([step(target=Target(nodes=Nodes(), mode=Mode.PERCENT, percent=2))])
    # 2 % of 50 is 1, 2 % of 10 is 0.2: still one node, so a small cluster is not spared
    assert sorted(v.cluster for v in victims) == ["east", "west"]


@pytest.mark.parametrize(("available", "percent", "taken"),
                         [(50, 2, 1), (10, 2, 1), (10, 50, 5), (3, 50, 2), (7, 100, 7), (1, 1, 1),
                          (0, 50, 0)])
def test_percent_takes_the_ceiling(available: int, percent: int, taken: int) -> None:
    assert how_many(Target(mode=Mode.PERCENT, percent=percent), available) == taken


def test_max_targets_caps_the_whole_step() -> None:
    target = Target(nodes=Nodes(), mode=Mode.ALL, max_targets=7)
    assert len(victims_of([step(target=target)])) == 7


def test_fixed_count_is_per_cluster_and_never_more_than_there_is() -> None:
    victims = victims_of([step(target=Target(nodes=Nodes(), mode=Mode.FIXED, count=20))])
    assert sum(v.cluster == "west" for v in victims) == 20
    assert sum(v.cluster == "east" for v in victims) == 10


def test_clusters_by_label_then_nodes_by_pool_label_and_name() -> None:
    fleet = Fleet((cluster("west", 6, pool="a100"), cluster("east", 6, region="us")))
    target = Target(clusters=Clusters(selector=LabelSelector({"region": "eu"})),
                    nodes=Nodes(pools=("a100",), selector=LabelSelector(match_expressions=(
                        Requirement("zone", "In", ("z0", "z1")),))))
    victims = victims_of([step(target=target)], fleet=fleet)
    assert [v.name for v in victims] == ["a100-0", "a100-1", "a100-3", "a100-4"]
    named = Target(nodes=Nodes(names=("a100-5", "gpu-2")))
    assert [str(v) for v in victims_of([step(target=named)], fleet=fleet)] == [
        "east: Node gpu-2", "west: Node a100-5"]


def test_selector_operators_follow_kubernetes() -> None:
    labels = {"app": "train", "tier": "gpu"}
    assert Requirement("app", "In", ("train", "eval")).holds(labels)
    assert not Requirement("app", "NotIn", ("train",)).holds(labels)
    assert Requirement("missing", "NotIn", ("x",)).holds(labels)
    assert Requirement("tier", "Exists").holds(labels)
    assert Requirement("missing", "DoesNotExist").holds(labels)
    assert not LabelSelector({"app": "train"}, (Requirement("tier", "DoesNotExist"),)).matches(
        labels)
    assert LabelSelector().matches({})


def test_pods_by_namespace_owner_and_container() -> None:
    pods = (PodView("ml", "nccl-0", {"app": "nccl"}, "Job", "nccl", ("test", "sidecar")),
            PodView("ml", "nccl-1", {"app": "nccl"}, "Job", "nccl", ("test",)),
            PodView("ml", "other", {"app": "nccl"}, "Job", "other", ("test",)),
            PodView("default", "nccl-2", {"app": "nccl"}, "Job", "nccl", ("test",)))
    fleet = Fleet((cluster("west", 1, pods=pods),))
    target = Target(pods=Pods(namespace="ml", owner_kind="Job", owner_name="nccl",
                              container="sidecar", selector=LabelSelector({"app": "nccl"})))
    assert victims_of([step(target=target)], fleet=fleet) == (
        Victim("west", "Pod", "nccl-0", "ml", "sidecar"),)


def test_a_cluster_target_hits_each_cluster_once() -> None:
    target = Target(clusters=Clusters(names=("west", "gone")), mode=Mode.ALL)
    schedule = plan([step("outage", target=target, fault="APIServerDown")], FLEET, 1)
    assert schedule.injections[0].victims == (Victim("west", "Cluster", "west"),)
    assert schedule.unknown_clusters == {"outage": ("gone",)}


def test_a_plan_narrowed_to_clusters_hits_no_other() -> None:
    steps = [step("all", target=Target(nodes=Nodes(), mode=Mode.ONE)),
             step("west", target=Target(clusters=Clusters(names=("west",)), nodes=Nodes()))]
    schedule = plan(steps, FLEET, 1, within=("east",))
    assert {v.cluster for v in schedule.of("all")[0].victims} == {"east"}
    assert schedule.of("west")[0].victims == ()
    assert schedule.unknown_clusters == {}, "west exists: it is another copy's business"


def test_unknown_names_count_only_the_clusters_a_plan_is_narrowed_to() -> None:
    named = Target(clusters=Clusters(names=("west", "gone", "elsewhere")))
    assert unknown_names(named, FLEET.clusters) == ["gone", "elsewhere"]
    assert unknown_names(named, FLEET.clusters, within=("west", "gone")) == ["gone"]
    assert unknown_names(named, FLEET.clusters, within=("east",)) == []
    # A target naming none hits the clusters the plan runs for: one missing is worth saying.
    assert unknown_names(Target(), FLEET.clusters, within=("west", "gone")) == ["gone"]
    assert unknown_names(Target(), FLEET.clusters) == []


def test_a_fleet_within_no_names_is_the_whole_fleet() -> None:
    assert FLEET.within(()) is FLEET
    assert [c.name for c in FLEET.within(("north", "gone")).clusters] == ["north"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Target(mode=Mode.PERCENT), "target.percent: mode percent needs a percent"),
    (lambda: Target(mode=Mode.PERCENT, percent=101), "from 1 to 100"),
    (lambda: Target(mode=Mode.PERCENT, percent=0), "from 1 to 100"),
    (lambda: Target(mode=Mode.FIXED), "target.count: mode fixed needs a count"),
    (lambda: Target(max_targets=0), "target.maxTargets: at least 1"),
    (lambda: Target(nodes=Nodes(), pods=Pods()), "give nodes or pods, not both"),
    (lambda: Clusters(names=("a",), selector=LabelSelector()), "names or selector, not both"),
])
def test_bad_targets_are_refused_naming_the_field(make: object, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        make()  # type: ignore[operator]


# -- seeds -------------------------------------------------------------------------------------

def test_same_seed_same_victims_other_seed_other_victims() -> None:
    steps = [step(target=Target(nodes=Nodes(), mode=Mode.FIXED, count=3))]
    assert victims_of(steps, seed=1) == victims_of(steps, seed=1)
    assert len({victims_of(steps, seed=s) for s in range(10)}) > 1


def test_adding_a_step_or_a_cluster_keeps_the_other_choices() -> None:
    one = step("a", target=Target(nodes=Nodes(), mode=Mode.ONE), jitter=30.0)
    alone = plan([one], FLEET, 3).of("a")
    with_another = plan([step("b", fault="Cordon"), one], FLEET, 3).of("a")
    assert alone == with_another
    bigger = Fleet((*FLEET.clusters, cluster("south", 40)))
    west = [v for v in plan([one], bigger, 3).of("a")[0].victims if v.cluster == "west"]
    assert west == [v for v in alone[0].victims if v.cluster == "west"]


# -- timing ------------------------------------------------------------------------------------

def test_delay_jitter_duration() -> None:
    [injection] = plan([step(at=30.0, delay=10.0, jitter=5.0, duration=60.0)], FLEET, 1).of("s")
    assert 40.0 <= injection.inject_at <= 45.0
    assert injection.recover_at == injection.inject_at + 60.0


def test_repeat_every_with_new_victims_each_time() -> None:
    target = Target(nodes=Nodes(), mode=Mode.ONE, clusters=Clusters(names=("west",)))
    injections = plan([step(target=target, at=5.0, every=100.0, times=4, duration=30.0)],
                      FLEET, 2).of("s")
    assert [i.inject_at for i in injections] == [5.0, 105.0, 205.0, 305.0]
    assert [i.occurrence for i in injections] == [0, 1, 2, 3]
    assert len({i.victims for i in injections}) > 1


def test_after_waits_for_the_last_recovery_of_every_step_named() -> None:
    schedule = plan([
        step("drain", after=("xid", "outage"), at=None, delay=5.0),
        step("xid", at=10.0, duration=60.0, every=100.0, times=2),  # finishes at 170
        step("outage", at=0.0),  # no duration: finished when injected
    ], FLEET, 4)
    assert schedule.finished == {"xid": 170.0, "outage": 0.0, "drain": 175.0}
    assert [(a.at, a.kind, a.injection.step) for a in schedule.actions()] == [
        (0.0, "inject", "outage"), (10.0, "inject", "xid"), (70.0, "recover", "xid"),
        (110.0, "inject", "xid"), (170.0, "recover", "xid"), (175.0, "inject", "drain")]


def test_at_the_same_moment_recovery_comes_before_the_next_injection() -> None:
    actions = plan([step(every=30.0, times=2, duration=30.0)], FLEET, 1).actions()
    assert [(a.at, a.kind) for a in actions] == [
        (0.0, "inject"), (30.0, "recover"), (30.0, "inject"), (60.0, "recover")]


@pytest.mark.parametrize(("steps", "message"), [
    ([step(at=None)], r"steps\[0\] \('s'\).timing: give exactly one of at .* and after"),
    ([step("a"), step("b", after=("a",))], "give exactly one of at"),
    ([step("b", at=None, after=("nope",))], r"steps\[0\] \('b'\).after: no step is named 'nope'"),
    ([step("a", at=None, after=("a",))], "a step cannot wait for itself"),
    ([step("a"), step("a")], "'a' is used by an earlier step"),
    ([step("")], r"steps\[0\].name: every step needs a name"),
    ([step(delay=-1.0)], "delay must not be negative"),
    ([step(times=3)], "repeat.times above 1 needs repeat.every"),
    ([step(times=0)], "repeat.times must be at least 1"),
    ([step(times=2, every=10.0, duration=20.0)], "duration plus jitter is longer than repeat"),
    ([step(times=2, every=10.0, duration=6.0, jitter=5.0)], "duration plus jitter is longer"),
    ([step("a", at=None, after=("c",)), step("b", at=None, after=("a",)),
      step("c", at=None, after=("b",))], "cycle: a → c → b → a"),
])
def test_bad_steps_are_refused_naming_the_step_and_field(steps: list[Step], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan(steps, FLEET, 1)


# -- properties --------------------------------------------------------------------------------

labels = st.dictionaries(st.sampled_from(["zone", "rack", "gpu"]), st.sampled_from("abc"),
                         max_size=3)
fleets = st.lists(
    st.tuples(st.integers(0, 40), labels, st.sampled_from(["eu", "us"])), min_size=1,
    max_size=5,
).map(lambda specs: Fleet(tuple(
    ClusterView(f"c{index}", {"region": region},
                tuple(NodeView(f"n{i}", "pool", node_labels) for i in range(nodes)))
    for index, (nodes, node_labels, region) in enumerate(specs))))
targets = st.builds(
    Target,
    clusters=st.sampled_from([Clusters(), Clusters(selector=LabelSelector({"region": "eu"}))]),
    nodes=st.sampled_from([Nodes(), Nodes(selector=LabelSelector({"zone": "a"}))]),
    mode=st.sampled_from(list(Mode)),
    count=st.integers(1, 60),
    percent=st.integers(1, 100),
    max_targets=st.none() | st.integers(1, 80),
)
timings = st.builds(
    Timing, at=st.floats(0, 600), delay=st.floats(0, 60), jitter=st.floats(0, 60),
    duration=st.none() | st.floats(0, 40), every=st.just(100.0), times=st.integers(1, 4))
seeds = st.integers(0, 2**32) | st.text(max_size=8)


def shuffled(fleet: Fleet, rng: random.Random) -> Fleet:
    clusters = [ClusterView(c.name, c.labels, tuple(rng.sample(c.nodes, len(c.nodes))))
                for c in fleet.clusters]
    return Fleet(tuple(rng.sample(clusters, len(clusters))))


@settings(max_examples=200, deadline=None)
@given(fleet=fleets, target=targets, timing=timings, seed=seeds, order=st.randoms())
def test_a_seed_always_gives_the_same_schedule(fleet: Fleet, target: Target, timing: Timing,
                                               seed: int | str, order: random.Random) -> None:
    steps = [Step("s", target, "NotReady", timing)]
    assert plan(steps, fleet, seed) == plan(steps, shuffled(fleet, order), seed)


@settings(max_examples=200, deadline=None)
@given(fleet=fleets, target=targets, timing=timings, seed=seeds)
def test_victims_are_candidates_within_the_caps(fleet: Fleet, target: Target, timing: Timing,
                                                seed: int | str) -> None:
    for injection in plan([Step("s", target, "NotReady", timing)], fleet, seed).injections:
        victims = injection.victims
        assert len(set(victims)) == len(victims)
        if target.max_targets is not None:
            assert len(victims) <= target.max_targets
        per_cluster: dict[str, int] = {}
        for victim in victims:
            per_cluster[victim.cluster] = per_cluster.get(victim.cluster, 0) + 1
        for view in fleet.clusters:
            available = sum(target.nodes.holds(n) for n in view.nodes) if target.nodes else 0
            wanted = how_many(target, available) if target.clusters.holds(view) else 0
            assert per_cluster.get(view.name, 0) <= wanted
            if target.max_targets is None:
                assert per_cluster.get(view.name, 0) == wanted
            if target.mode is Mode.PERCENT and target.clusters.holds(view):
                assert target.percent is not None
                assert wanted == math.ceil(available * target.percent / 100)


@settings(max_examples=200, deadline=None)
@given(fleet=fleets, target=targets, timing=timings, seed=seeds, pick=st.randoms())
def test_a_copy_for_one_cluster_picks_there_what_the_whole_plan_picks(
        fleet: Fleet, target: Target, timing: Timing, seed: int | str,
        pick: random.Random) -> None:
    target = dataclasses.replace(target, max_targets=None)  # a cap weighs the whole fleet
    steps = [Step("s", target, "NotReady", timing)]
    name = pick.choice(fleet.clusters).name
    whole = plan(steps, fleet, seed)
    copy = plan(steps, fleet, seed, within=(name,))
    for mine, everyone in zip(copy.injections, whole.injections, strict=True):
        assert mine.inject_at == everyone.inject_at
        assert mine.victims == tuple(v for v in everyone.victims if v.cluster == name)


@settings(max_examples=200, deadline=None)
@given(fleet=fleets, first=timings, second=timings, seed=seeds)
def test_every_duration_recovers_and_after_waits(fleet: Fleet, first: Timing, second: Timing,
                                                 seed: int | str) -> None:
    waiting = Timing(after=("first",), delay=second.delay, jitter=second.jitter,
                     duration=second.duration, every=second.every, times=second.times)
    schedule = plan([Step("second", Target(nodes=Nodes()), "Cordon", waiting),
                     Step("first", Target(nodes=Nodes()), "NotReady", first)], fleet, seed)
    for injection in schedule.injections:
        duration = (first if injection.step == "first" else waiting).duration
        if duration is None:
            assert injection.recover_at is None
        else:
            assert injection.recover_at == pytest.approx(injection.inject_at + duration)
    recoveries = [a for a in schedule.actions() if a.kind == "recover"]
    assert len(recoveries) == sum(i.recover_at is not None for i in schedule.injections)
    for name in ("first", "second"):
        occurrences = sorted(schedule.of(name), key=lambda i: i.occurrence)
        for earlier, later in itertools.pairwise(occurrences):
            assert later.inject_at >= earlier.finished_at, "occurrences never overlap"
    first_done = max(i.finished_at for i in schedule.of("first"))
    assert all(i.inject_at >= first_done for i in schedule.of("second"))
    assert schedule.finished["first"] == first_done


# -- Xid codes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120])
def test_xids_that_need_a_reset_or_a_drain_are_fatal(code: int) -> None:
    assert xid.describe(code).fatal


@pytest.mark.parametrize("code", [13, 31, 43, 45, 154, 9999])
def test_application_and_unlisted_xids_only_signal(code: int) -> None:
    described = xid.describe(code)
    assert not described.fatal
    assert described.code == code


@pytest.mark.parametrize("code", [0, -79, True, "79"])
def test_an_xid_must_be_a_positive_integer(code: object) -> None:
    with pytest.raises(ValueError, match="give a positive integer such as 79"):
        xid.describe(code)  # type: ignore[arg-type]
