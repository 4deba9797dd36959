"""The CEL worker pool: answers in order, refusals that keep the worker, the CPU, memory and
stall limits, a killed worker replaced, a worker that cannot start backed off, and every
worker ended by close()."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import pytest

from operators.faults.evaluating import CelRefused, CelUnavailable, CelWorkers, Limits
from tests.test_cel_judging import HOSTILE

POD = {"kind": "Pod", "metadata": {"namespace": "default", "name": "p-0"}}
WORDS = "[" + ", ".join(["self.text"] * 20) + "]"
#: 400 strings of 2 MB each, from an object's 1 MB field: far beyond a small address space.
GREEDY = f"{WORDS}.map(a, {WORDS}.map(b, a + b)).size() > 0"
BIG = {**POD, "text": "x" * (1 << 20)}


@pytest.fixture
async def workers() -> AsyncIterator[CelWorkers]:
    pool = CelWorkers()
    yield pool
    await pool.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pids(pool: CelWorkers) -> list[int]:
    return [worker.process.pid for worker in pool._idle]


async def test_each_object_is_judged_in_order(workers: CelWorkers) -> None:
    objects = [{"status": {"phase": "Running"}}, {"status": {}},
               {"status": {"phase": "Pending"}}] * 200
    matched = await workers.matches("self.status.phase == 'Running'", objects)
    assert matched == [True, False, False] * 200
    assert await workers.matches("true", []) == []


async def test_an_expression_that_does_not_parse_is_refused_and_the_worker_stays(
        workers: CelWorkers) -> None:
    with pytest.raises(CelRefused, match="is not a CEL expression"):
        await workers.matches("self.(", [POD] * 50)
    assert await workers.matches("self.kind == 'Pod'", [POD]) == [True]
    assert workers.started == 1


async def test_an_expression_over_its_cpu_budget_is_refused_naming_the_object(
        workers: CelWorkers) -> None:
    began = time.monotonic()
    with pytest.raises(CelRefused, match=r"budget of 100 ms of CPU time per object "
                                         r"\(on Pod default/p-0\)"):
        await workers.matches(HOSTILE, [POD, POD])
    assert time.monotonic() - began < 30
    assert await workers.matches("self.kind == 'Pod'", [POD, POD]) == [True, True]
    assert workers.started == 1, "the worker interrupted itself and went on"


async def test_an_expression_over_the_memory_limit_is_refused_and_its_worker_replaced() -> None:
    pool = CelWorkers(Limits(budget=60, memory=128 << 20))
    try:
        with pytest.raises(CelRefused, match="memory limit of 128 MiB"):
            await pool.matches(GREEDY, [BIG])
        assert await pool.matches("self.kind == 'Pod'", [POD]) == [True]
        assert pool.started == 2
    finally:
        await pool.close()


async def test_a_killed_worker_is_replaced(workers: CelWorkers) -> None:
    assert await workers.matches("true", [POD]) == [True]
    (pid,) = pids(workers)
    os.kill(pid, signal.SIGKILL)
    while alive(pid) and workers._idle[0].process.returncode is None:
        await asyncio.sleep(0.05)
    assert await workers.matches("true", [POD]) == [True]
    assert workers.started == 2


async def test_a_worker_that_dies_in_every_judgement_fails_it_after_one_more_try() -> None:
    # Says ready, then dies as soon as it is asked anything.
    dying = [sys.executable, "-c", "import sys; print('{\"ready\": true}', flush=True); "
                                   "sys.stdin.readline()"]
    pool = CelWorkers(argv=dying)
    try:
        with pytest.raises(CelRefused, match="killed the worker that evaluated it twice"):
            await pool.matches("true", [POD])
        assert pool.started == 2
    finally:
        await pool.close()


async def test_a_worker_that_stalls_is_killed_and_the_expression_refused() -> None:
    stalling = [sys.executable, "-c", "import sys, time; print('{\"ready\": true}', "
                                      "flush=True); sys.stdin.readline(); time.sleep(600)"]
    pool = CelWorkers(Limits(stall=0.5), argv=stalling)
    try:
        with pytest.raises(CelRefused, match=r"made no progress for 0\.5s"):
            await pool.matches("true", [POD])
        assert pool._idle == []
    finally:
        await pool.close()


async def test_a_worker_that_cannot_start_is_tried_again_after_a_back_off() -> None:
    pool = CelWorkers(argv=[sys.executable, "-c", "raise SystemExit(7)"])
    try:
        with pytest.raises(CelUnavailable, match="exited at its start"):
            await pool.matches("true", [POD])
        with pytest.raises(CelUnavailable, match="trying again in"):
            await pool.matches("true", [POD])
        assert pool.started == 0
    finally:
        await pool.close()


async def test_close_ends_every_worker() -> None:
    pool = CelWorkers()
    await asyncio.gather(pool.matches(HOSTILE, [POD]), pool.matches("true", [POD]),
                         return_exceptions=True)
    started = pids(pool)
    assert len(started) == 2
    await pool.close()
    assert not any(alive(pid) for pid in started)
    with pytest.raises(CelUnavailable):
        await pool.matches("true", [POD])


def test_limits_out_of_range_are_refused() -> None:
    for wrong in ({"budget": 0.0}, {"budget": float("nan")}, {"workers": 0},
                  {"memory": 1 << 20}, {"stall": float("inf")}):
        with pytest.raises(ValueError, match="CEL limits out of range"):
            Limits(**wrong)  # type: ignore[arg-type]
