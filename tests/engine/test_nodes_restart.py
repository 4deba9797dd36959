"""The node half over in-memory API servers: creation, adoption after a restart, Leases."""

from __future__ import annotations

import itertools

from operators.k8s.times import parse
from tests.engine.harness import LEASES, NODES, POOLS, Fleet, pool, ready


async def test_engine_makes_the_pool_s_nodes_with_leases_and_reports_them() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=3))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        assert sorted(fleet.nodes()) == ["cpu-0", "cpu-1", "cpu-2"]
        assert all(ready(node) == "True" for node in fleet.nodes().values())
        assert sorted(fleet.leases()) == ["cpu-0", "cpu-1", "cpu-2"]
        status = fleet.pool_status("cpu")
    assert (status["replicas"], status["readyReplicas"]) == (3, 3)
    assert status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True", "Reconciling": "False", "Stalled": "False"}


async def test_restarted_engine_adopts_every_node_and_deletes_none_before_pools_are_known(
) -> None:
    """Defect: a new engine started with no pools planned the deletion of every node."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", replicas=25, gpu={"preset": "H100-SXM5-80GB"}))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
    before = fleet.uids()
    assert len(before) == 25
    writes = len(fleet.member.sent("POST", NODES)) + len(fleet.member.sent("DELETE", ".*"))

    fleet.host.fail("GET", POOLS, status=503, times=5)  # the host is slow to answer
    async with fleet.running(fleet.engine(seed=2)) as engine:
        await fleet.clock.advance(5)
        assert not engine.pools.known.is_set(), "pools still unknown"
        assert len(engine.book.records) == 25, "adopted at once"
        await fleet.clock.advance(60)
        assert engine.pools.known.is_set()
        assert engine.synced.is_set()
    assert fleet.uids() == before, "the same nodes, no node made again"
    assert len(fleet.member.sent("POST", NODES)) + len(fleet.member.sent("DELETE", ".*")) == \
        writes, "no create and no delete of a node or lease"
    assert all(ready(node) == "True" for node in fleet.nodes().values())


async def test_lease_renewals_resume_from_each_lease_s_renew_time() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=4))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(6)  # leases renewed at t≈0; next due at t≈10
    stopped = fleet.clock.now()
    fleet.member.requests.clear()
    async with fleet.running(fleet.engine(seed=3)):
        await fleet.clock.advance(2)
        assert fleet.member.sent("PATCH", f"{LEASES}/.*") == [], "not renewed early"
        await fleet.clock.advance(3)
        renewed = fleet.member.sent("PATCH", f"{LEASES}/.*")
        assert len(renewed) == 4, "each renewed about 10 s after its last renewal, not later"
    assert fleet.clock.now() - stopped < 10


async def test_a_lease_missing_after_a_restart_is_created_at_once() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
    fleet.member._objects[("coordination.k8s.io/v1", "leases")].clear()
    async with fleet.running(fleet.engine(seed=4)):
        await fleet.clock.advance(1)
        assert sorted(fleet.leases()) == ["cpu-0", "cpu-1"]


async def test_renewals_stretch_while_pods_wait_for_the_api_server() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    engine = fleet.engine()

    def gaps() -> list[float]:
        renewed = [parse(r.json()["spec"]["renewTime"])
                   for r in fleet.member.sent("PATCH", f"{LEASES}/cpu-0")]
        return [later - earlier for earlier, later in itertools.pairwise(renewed)]

    async with fleet.running(engine):
        await fleet.clock.advance(11)
        fleet.member.requests.clear()
        await fleet.clock.advance(60)
        calm = gaps()
        engine.pods.busy = lambda: True  # type: ignore[method-assign]
        await fleet.clock.advance(11)
        fleet.member.requests.clear()
        await fleet.clock.advance(100)
        loaded = gaps()
    assert len(calm) >= 4
    assert all(9.5 < gap < 10.5 for gap in calm), f"a quarter of 40 s: {calm}"
    assert len(loaded) >= 2
    assert all(18.5 < gap <= 25.1 for gap in loaded), f"stretched, at most 25 s: {loaded}"


async def test_the_pace_stretches_when_renewals_run_late_and_recovers() -> None:
    from operators.engine.heartbeating import Pace
    from tests.fakes.clocks import FakeClock

    clock = FakeClock()
    pace = Pace(clock)
    assert pace.interval(40) == 10.0, "a quarter of the lease, as the kubelet"
    for _ in range(10):
        await clock.advance(1)
        pace.observe(12.0, 0.01, loaded=False)  # renewals 12 s late: too much demand
    assert pace.interval(40) == 35.0, "stretched to the ceiling, never beyond"
    assert pace.interval(10) == 8.75, "nor beyond seven eighths of a short lease"
    for _ in range(30):
        await clock.advance(1)
        pace.observe(0.0, 0.01, loaded=False)
    assert pace.interval(40) == 10.0, "back to the kubelet's pace once punctual"
    await clock.advance(1)
    pace.observe(0.0, 0.01, loaded=True)
    assert pace.interval(40) == 25.0, "stretched while pods wait for the API server"
    for _ in range(30):
        await clock.advance(1)
        pace.observe(0.0, 0.01, loaded=False)
    for _ in range(100):  # renewals answered in half a second: the server is busy
        pace.observe(0.0, 0.5, loaded=False)
    await clock.advance(1)
    pace.observe(0.0, 0.5, loaded=False)
    assert pace.interval(40) == 25.0


def test_a_shorter_grace_scales_the_pace_down_and_a_longer_one_changes_nothing() -> None:
    from operators.engine.heartbeating import Pace
    from tests.fakes.clocks import FakeClock

    clock = FakeClock()
    short, long = Pace(clock, grace=20), Pace(clock, grace=300)
    assert short.interval(40) == 4.0, "a fifth of a 20 s grace, not the kubelet's 10 s"
    assert long.interval(40) == 10.0, "the kubelet's pace: a longer grace is no reason to slow"
    short.stretch = long.stretch = Pace.MOST
    assert short.interval(40) == 14.0, "stretched to 7/10 of the grace, below the 3/4 at risk"
    assert long.interval(40) == 35.0, "the ceiling of the default grace"


async def test_renewals_under_a_short_grace_stay_inside_it_calm_and_loaded() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    engine = fleet.engine(node_grace=20.0)

    def gaps() -> list[float]:
        renewed = [parse(r.json()["spec"]["renewTime"])
                   for r in fleet.member.sent("PATCH", f"{LEASES}/cpu-0")]
        return [later - earlier for earlier, later in itertools.pairwise(renewed)]

    async with fleet.running(engine):
        assert engine.alarm.threshold == 15.0, "at risk past 3/4 of the 20 s grace"
        await fleet.clock.advance(5)
        fleet.member.requests.clear()
        await fleet.clock.advance(40)
        calm = gaps()
        engine.pods.busy = lambda: True  # type: ignore[method-assign]
        await fleet.clock.advance(11)
        fleet.member.requests.clear()
        await fleet.clock.advance(60)
        loaded = gaps()
        condition = engine.alarm.condition("cpu")
    assert len(calm) >= 8
    assert all(3.8 < gap < 4.2 for gap in calm), f"a fifth of the 20 s grace: {calm}"
    assert len(loaded) >= 4
    assert all(7.4 < gap <= 10.01 for gap in loaded), f"stretched 2.5 times, no more: {loaded}"
    assert condition is None, "never at risk"
