"""A FaultPlan's status is bounded in bytes, not only in counts: at the CRD's limits (200
occurrences, 10 expectations each, 20,000 victims with the longest names) it stays under
MAX_STATUS_BYTES with every count exact; victims that do not fit go to a ConfigMap of the plan,
written before the status names it, so a successor injects into and recovers exactly them."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json

import pytest

from operators.api import faultplans as api
from operators.api.base import Condition
from operators.faults import deciding, executing
from operators.faults.running import CONFIGMAPS, TARGETS_KEY
from operators.faults.targets import Victim
from operators.k8s.times import micro_time
from primitives import keys
from tests.test_faultplan_runner import CORDON, PLANS, World, started

LONG = "x" * 10_000


def victim(occurrence: int, index: int) -> Victim:
    """A pod victim with names at Kubernetes' limits."""
    return Victim("c" * 63, "Pod", f"{occurrence:03d}-{index:05d}-" + "p" * 243, "n" * 63,
                  "k" * 63)


def test_the_largest_status_stays_under_its_byte_bound_with_exact_counts() -> None:
    steps = 20
    per_step = api.MAX_OCCURRENCES // steps
    per_occurrence = deciding.MAX_RECORDED // api.MAX_OCCURRENCES
    status = api.FaultPlanStatus(phase="Running", startedAt=micro_time(0), injections=[
        api.InjectionStatus(
            step=f"{step:02d}" + "s" * 61, occurrence=occurrence, injectAt=1e9, recoverAt=1e9,
            injectedAt=micro_time(1e9), recoveredAt=micro_time(1e9), message=LONG,
            expectations=[api.ExpectationStatus(name=f"{e}" + "e" * 62, outcome="Failed",
                                                latencySeconds=1e9, message=LONG)
                          for e in range(api.MAX_EXPECTATIONS)])
        for step in range(steps) for occurrence in range(per_step)],
        conditions=[Condition(type=kind, status="True", reason="Running", message=LONG,
                              lastTransitionTime=micro_time(0))
                    for kind in ("Ready", "Reconciling", "Stalled")],
        traceId="0" * 32, traceparent=f"00-{'0' * 32}-{'0' * 16}-01")
    for index, injection in enumerate(status.injections):
        victims = [victim(index, n) for n in range(per_occurrence)]
        assert deciding.skip_reason(status, injection, victims) == ""
        # As the runner records them: apart (a ConfigMap, written first) once they do not fit.
        listed_in = executing.targets_name("0123456789abcdef", injection.step,
                                           injection.occurrence) \
            if deciding.apart(status, victims) else ""
        status = deciding.chosen(status, index, victims, listed_in=listed_in)
    written = deciding.bounded(status)
    size = len(json.dumps(written.model_dump(mode="json")).encode())
    assert size <= deciding.MAX_STATUS_BYTES, f"{size} bytes"
    assert sum(executing.target_count(i) for i in written.injections) == deciding.MAX_RECORDED
    assert any(i.targets for i in written.injections), "the first ones stay in the status"
    assert any(i.targetsRef for i in written.injections)
    assert all(len(i.message) <= deciding.MESSAGE_LENGTH for i in written.injections)


def test_a_list_that_does_not_fit_even_compressed_is_skipped_saying_why() -> None:
    status = api.FaultPlanStatus(phase="Running", injections=[api.InjectionStatus(step="a")])
    # Names that do not compress, at the longest: 5000 of them are about 1 MB gzipped.
    victims = [Victim("c", "Pod", "".join(
        base64.urlsafe_b64encode(hashlib.sha256(f"{i}/{part}".encode()).digest()).decode()
        for part in range(6))[:253], "n") for i in range(deciding.MAX_VICTIMS)]
    reason = deciding.skip_reason(status, status.injections[0], victims)
    assert "even compressed, more than 786432 a list of them may: set target.maxTargets" in \
        reason
    assert deciding.skip_reason(status, status.injections[0], victims[:1000]) == ""


async def test_victims_listed_apart_are_written_first_and_a_successor_recovers_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deciding, "INLINE_TARGETS", 10)  # two victims do not fit
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    await runner.write()
    injection = runner.status.injections[0]
    assert (injection.state, injection.targets, injection.targetCount) == ("Injected", [], 2)
    name = injection.targetsRef
    assert name == "faultplan-targets-01234567-cordon-0"
    configmap = world.host_api.object(f"{CONFIGMAPS.format(namespace='default')}/{name}")
    assert configmap is not None
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == "0123456789abcdef"
    assert configmap["metadata"]["annotations"][keys.OWNED_BY] == "FaultPlan/p"
    texts = gzip.decompress(base64.b64decode(configmap["binaryData"][TARGETS_KEY])).decode()
    victims = [text.rsplit("/", 1)[-1] for text in texts.split("\n")]
    assert world.targets() == sorted(victims)
    assert [found.state for found in world.sets()] == ["inject"]
    status_writes = [r.json()["status"] for r in world.host_api.sent("PATCH", f"{PLANS}/p/status")]
    first_naming = next(s for s in status_writes if s["injections"][0]["targetsRef"])
    assert first_naming["injections"][0]["state"] == "Scheduled", \
        "the list was named before anything was written to the victims"
    # A successor, once the fault's duration is over, recovers exactly those.
    successor = await world.runner()
    successor.status = successor.status.model_copy(update={"startedAt": micro_time(
        executing.parse(successor.status.startedAt) - 20)})
    await successor.advance()
    assert successor.status.injections[0].state == "Recovering"
    assert [found.state for found in world.sets()] == ["recover"]
