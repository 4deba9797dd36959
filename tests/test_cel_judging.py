"""CEL expectations judged by the plan runner: a hostile expression fails its expectation, saying
it went over its budget, while the event loop and another plan keep their pace; a sane one
passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from operators.api.faultplans import FaultPlan
from operators.handlers.faultplans import PlanRunner
from operators.k8s.times import micro_time
from tests.test_faultplan_runner import CORDON, PLANS, World

NUMBERS = "[" + ",".join(str(i) for i in range(100)) + "]"
#: 10^6 steps: seconds of CPU in cel-python, far over 100 ms.
HOSTILE = f"{NUMBERS}.all(a, {NUMBERS}.all(b, {NUMBERS}.all(c, a + b + c >= 0)))"
SANE = "self.metadata.name.startsWith('n-')"


def with_expectation(name: str, cel: str) -> dict[str, Any]:
    return {**CORDON, "expectations": [{"name": name, "within": "60s",
                                        "objects": {"kind": "Node", "victims": True},
                                        "cel": cel}]}


async def runner_for(world: World, plan: str, step: dict[str, Any]) -> PlanRunner:
    """A started runner of plan ``plan`` (one step, due now) in ``world``."""
    world.host_api.put(PLANS, {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
                               "metadata": {"name": plan, "uid": f"{plan:0<16}"},
                               "spec": {"seed": 1, "steps": [step]}})
    runner = PlanRunner(world.runtime, FaultPlan.model_validate(
        await world.host.get(f"{PLANS}/{plan}")), connect=lambda _, name: world.members[name])
    await runner.start()
    runner.status = runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 1)})
    return runner


@pytest.fixture
async def world() -> AsyncIterator[World]:
    world = World()
    world.member_api.discover("v1", [{"name": "nodes", "kind": "Node", "namespaced": False}])
    yield world
    await world.runtime.cel.close()


class Pace:
    """The event loop's longest lag behind a 10 ms ticker while it runs."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            self.longest = max(self.longest, time.monotonic() - before - 0.01)

    def __enter__(self) -> Pace:
        self._task = asyncio.create_task(self._tick())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_a_hostile_expression_fails_over_budget_while_the_loop_and_other_plans_go_on(
        world: World) -> None:
    hostile = await runner_for(world, "hostile", with_expectation("costly", HOSTILE))
    sane = await runner_for(world, "sane", with_expectation("cordoned", SANE))
    finished: dict[str, float] = {}

    async def advance(runner: PlanRunner) -> None:
        await runner.advance()
        finished[runner.name] = time.monotonic()

    began = time.monotonic()
    with Pace() as pace:
        await asyncio.gather(advance(hostile), advance(sane))
    (costly,) = hostile.status.injections[0].expectations
    assert costly.outcome == "Failed"
    assert "went over its budget of 100 ms of CPU time per object (on Node n-" in \
        costly.message
    (cordoned,) = sane.status.injections[0].expectations
    assert cordoned.outcome == "Passed", cordoned.message
    assert pace.longest < 0.5, f"the event loop stalled for {pace.longest:.2f}s"
    assert finished["hostile"] - began < 30, "one budget, not the expression's whole cost"


async def test_an_expression_over_budget_is_not_judged_again(world: World) -> None:
    runner = await runner_for(world, "hostile", with_expectation("costly", HOSTILE))
    await runner.advance()
    started = world.runtime.cel.started
    await runner.advance()
    await runner.advance()
    assert runner.status.injections[0].expectations[0].outcome == "Failed"
    assert world.runtime.cel.started == started


async def test_an_expression_that_does_not_parse_fails_its_expectation_saying_so(
        world: World) -> None:
    runner = await runner_for(world, "broken", with_expectation("broken", "self.("))
    await runner.advance()
    (broken,) = runner.status.injections[0].expectations
    assert broken.outcome == "Failed"
    assert "is not a CEL expression" in broken.message
