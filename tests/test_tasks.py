"""Background tasks never die silently: an unexpected error is logged with its traceback and
the task starts again after a back-off, on the injected clock."""

from __future__ import annotations

import asyncio
import logging

import pytest

from primitives.tasks import spawn, supervised
from tests.fakes.clocks import FakeClock


async def test_a_task_that_raises_is_logged_and_restarted_with_back_off(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    started: list[float] = []

    async def work() -> None:
        started.append(clock.now() - clock_start)
        if len(started) < 4:
            raise RuntimeError(f"boom {len(started)}")

    clock_start = clock.now()
    with caplog.at_level(logging.ERROR, logger="primitives.tasks"):
        task = spawn("the ticker", work, clock=clock, first=1.0, cap=8.0)
        await clock.advance(20)
        assert task.done()
        await task
    # Back-off doubles: 1, 2, 4 s after each failure.
    assert started == [0.0, 1.0, 3.0, 7.0]
    failures = [r for r in caplog.records if "the ticker failed" in r.getMessage()]
    assert [r.exc_info is not None for r in failures] == [True] * 3, "with its traceback"
    assert "starting it again in 4.0s" in failures[-1].getMessage()


async def test_the_back_off_starts_over_after_a_long_healthy_run() -> None:
    clock = FakeClock()
    started: list[float] = []
    origin = clock.now()

    async def work() -> None:
        started.append(clock.now() - origin)
        if len(started) == 3:
            await clock.sleep(100)  # healthy for longer than the cap, then fails again
        if len(started) < 5:
            raise RuntimeError("boom")

    task = asyncio.create_task(supervised("work", work, clock=clock, first=1.0, cap=10.0))
    await clock.advance(200)
    await task
    assert started == [0.0, 1.0, 3.0, 104.0, 106.0]


async def test_each_failure_is_told_and_cancelling_ends_the_supervisor() -> None:
    clock = FakeClock()
    told: list[str] = []

    async def work() -> None:
        raise ValueError("broken")

    task = spawn("doomed", work, clock=clock, on_failure=lambda error: told.append(str(error)))
    await clock.advance(2.5)  # failures at 0 s and 1 s; the next at 3 s
    assert told == ["broken", "broken"]
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
