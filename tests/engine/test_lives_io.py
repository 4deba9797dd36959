"""Replayed controllers' pods take their recorded lives from a lives set before they start
(operators/engine/lives.py): one ordinal each, kept across an engine restart."""

from __future__ import annotations

import json
from typing import Any

from operators.api import lives
from operators.k8s.times import parse
from primitives import keys
from tests.engine.harness import PODS, POOLS, Fleet, pod, pool

SET = f"{lives.CONFIGMAPS}/lives-batch"
RECORDED = [lives.Life(start_delay=2.0, run_time=10.0, exit_code=0),
            lives.Life(start_delay=1.0, run_time=4.0, exit_code=3)]


def job_pod(name: str) -> dict[str, Any]:
    return pod(name, "cpu-0", restart="Never", job=True,
               annotations={keys.LIVES: "lives-batch"})


def taken(fleet: Fleet) -> dict[str, int]:
    found = fleet.member.object(SET)
    assert found is not None
    result: dict[str, int] = json.loads(found["data"]["taken"])
    return result


def uids(fleet: Fleet, *names: str) -> dict[str, int]:
    return {fleet.pod(name)["metadata"]["uid"]: n for n, name in enumerate(names)}


def terminated(fleet: Fleet, name: str) -> dict[str, Any]:
    status = fleet.pod(name)["status"]
    result: dict[str, Any] = status["containerStatuses"][0]["state"]["terminated"]
    return result


async def started(fleet: Fleet) -> None:
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    fleet.member.put(lives.CONFIGMAPS, lives.render("lives-batch", owner="default/Job/j",
                                                    writer="Replay/t", lives=RECORDED))


async def test_pods_take_the_recorded_lives_in_order_through_the_stages() -> None:
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, job_pod("first"))
        await fleet.clock.advance(0.5)
        fleet.member.put(PODS, job_pod("second"))
        fleet.member.put(PODS, job_pod("third"))
        await fleet.clock.advance(30)
    # The third is past the last life: nothing is written for it.
    assert taken(fleet) == uids(fleet, "first", "second")
    assert len(fleet.member.sent("GET", SET)) == 1, "read once, then each choice written"
    assert len(fleet.member.sent("PATCH", SET)) == 2
    first, second = terminated(fleet, "first"), terminated(fleet, "second")
    assert (first["exitCode"], second["exitCode"]) == (0, 3)
    assert parse(first["finishedAt"]) - parse(first["startedAt"]) == 10
    assert parse(second["finishedAt"]) - parse(second["startedAt"]) == 4
    assert fleet.pod("first")["status"]["phase"] == "Succeeded"
    assert fleet.pod("second")["status"]["phase"] == "Failed"
    # Past the last recorded life: the pod's own (its pool's Job run time), no failure.
    assert fleet.pod("third")["status"]["phase"] in ("Running", "Succeeded")


async def test_a_restarted_engine_keeps_each_pods_life() -> None:
    """A pod running when the engine stops finishes on its recorded run time after the
    restart; the set is not written again, and no ordinal is taken twice."""
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, job_pod("first"))
        await fleet.clock.advance(6)  # Running since 2 s (its start delay), 10 s to run
        assert fleet.pod("first")["status"]["phase"] == "Running"
    async with fleet.running(fleet.engine(seed=5)):
        fleet.member.put(PODS, job_pod("second"))
        await fleet.clock.advance(30)
    assert taken(fleet) == uids(fleet, "first", "second")
    first = terminated(fleet, "first")
    assert parse(first["finishedAt"]) - parse(first["startedAt"]) == 10
    assert terminated(fleet, "second")["exitCode"] == 3
    assert len(fleet.member.sent("PATCH", SET)) == 2, "one choice written per pod"


async def test_a_missing_set_leaves_the_pod_its_defaults_and_says_so() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web", "cpu-0", annotations={keys.LIVES: "lives-gone"}))
        await fleet.clock.advance(5)
    assert fleet.pod("web")["status"]["phase"] == "Running"
    events = fleet.member.objects("/api/v1/namespaces/default/events")
    assert any("lives-gone" in e["message"] and e["reason"] == "InvalidAnnotation"
               for e in events)


async def test_an_unanswered_read_is_retried_and_the_pod_waits() -> None:
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.fail("GET", SET, status=503, times=2)
        fleet.member.put(PODS, job_pod("first"))
        await fleet.clock.advance(2.5)
        assert fleet.pod("first")["status"] == {}, "no life before its recorded one"
        await fleet.clock.advance(20)
    assert terminated(fleet, "first")["exitCode"] == 0
    assert taken(fleet) == uids(fleet, "first")


async def test_two_pods_of_a_set_taken_at_once_never_share_an_ordinal() -> None:
    """Defect guard: the conditional write of the choice; a conflict chooses again."""
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", SET, status=409, reason="Conflict")
        for name in ("a", "b", "c", "d"):
            fleet.member.put(PODS, job_pod(name))
        await fleet.clock.advance(1)
    # Two lives for four pods: each life taken by one pod, the other two past the last.
    assert sorted(taken(fleet).values()) == [0, 1]


def test_pods_past_the_last_life_write_nothing_so_the_set_stays_its_size() -> None:
    """A controller that keeps replacing pods (a Deployment's churn over a long replay) never
    grows the set: past the last life, a pod takes its defaults and nothing is recorded."""
    found = lives.render("lives-batch", owner="default/Job/j", writer="Replay/t",
                         lives=RECORDED)
    found["metadata"]["resourceVersion"] = "7"
    found["data"]["taken"] = json.dumps({"uid-a": 0, "uid-b": 1})
    for n in range(1000):
        ordinal, life, patch = lives.claim(found, f"uid-{n:06d}")
        assert (ordinal, life, patch) == (2, None, None)
    assert lives.claim(found, "uid-b") == (1, RECORDED[1], None), "its own, as taken"
