"""The runner's loop on a fake clock: it keeps the plan's time by the clock it is given (time
zero, when a step is due, when its duration is over, how long it sleeps between rounds), and
stops when told or when the plan ended."""

from __future__ import annotations

import asyncio

import pytest

from operators.api.faultplans import FaultPlan
from operators.handlers.faultplans import PlanRunner
from operators.k8s.times import micro_time, parse
from tests.fakes.clocks import FAKE_EPOCH
from tests.test_faultplan_runner import CORDON, PLANS, World


async def runner_of(world: World) -> PlanRunner:
    plan = FaultPlan.model_validate(await world.host.get(f"{PLANS}/p"))
    return PlanRunner(world.runtime, plan, connect=lambda _, name: world.members[name],
                      clock=world.clock)


async def test_a_plan_keeps_time_by_the_clock_it_is_given() -> None:
    world = World()
    world.plan({**CORDON, "at": "30s"})
    runner = await runner_of(world)
    task = asyncio.create_task(runner.run(lambda: False))
    await world.clock.advance(1)
    assert runner.status.startedAt == micro_time(FAKE_EPOCH), "time zero is the clock's now"
    await world.clock.advance(28)
    assert runner.status.injections[0].state == "Scheduled", "asleep until its moment"
    await world.clock.advance(2)
    injection = runner.status.injections[0]
    assert injection.state == "Injected"
    assert parse(injection.injectedAt) == pytest.approx(FAKE_EPOCH + 30, abs=0.5)
    assert injection.recoverAt == pytest.approx(40, abs=0.5)
    await world.clock.advance(10)
    assert runner.status.injections[0].state == "Recovering"
    await world.engine_marks_done()
    await world.clock.advance(1.5)
    assert runner.status.injections[0].state == "Recovered"
    await world.clock.advance(1)  # the round's last sleep
    await asyncio.wait_for(task, 1)
    assert runner.status.phase == "Succeeded", "the loop ends with the plan"
    written = await world.host.get(f"{PLANS}/p")
    assert written["status"]["phase"] == "Succeeded"


async def test_a_runner_told_to_stop_stops_within_its_poll() -> None:
    world = World()
    world.plan({**CORDON, "at": "1h"})
    runner = await runner_of(world)
    stopped = False
    task = asyncio.create_task(runner.run(lambda: stopped))
    await world.clock.advance(5)
    stopped = True
    await world.clock.advance(0.5)
    await asyncio.wait_for(task, 1)
    assert runner.status.phase == "Running", "stopped, not ended: a successor carries on"
