"""The heap delay queue on a fake clock, and the dispatcher that fires its keys."""

from __future__ import annotations

import asyncio

from operators.engine.dispatching import RETRY_UNEXPECTED, Dispatcher
from operators.engine.queues import DelayQueue
from operators.engine.windowing import Window
from primitives.clocks import SYSTEM_CLOCK
from tests.fakes.clocks import FakeClock


async def test_keys_come_out_when_due_in_order() -> None:
    clock = FakeClock()
    queue: DelayQueue[str] = DelayQueue(clock)
    queue.schedule("b", 2)
    queue.schedule("a", 1)
    queue.schedule("c", 3)
    assert queue.pop_due(10) == []
    assert queue.next_delay() == 1
    await clock.advance(2.5)
    assert queue.pop_due(10) == ["a", "b"]
    assert len(queue) == 1


async def test_rescheduling_replaces_the_earlier_time() -> None:
    clock = FakeClock()
    queue: DelayQueue[str] = DelayQueue(clock)
    queue.schedule("a", 1)
    queue.schedule("a", 5)
    await clock.advance(2)
    assert queue.pop_due(10) == []
    assert queue.next_delay() == 3
    await clock.advance(3)
    assert queue.pop_due(10) == ["a"]


def test_cancelled_keys_never_come_out() -> None:
    queue: DelayQueue[str] = DelayQueue(FakeClock())
    queue.schedule("a", 0)
    queue.cancel("a")
    assert "a" not in queue
    assert queue.pop_due(10) == []
    assert queue.next_delay() is None


def test_limit_bounds_a_batch() -> None:
    queue: DelayQueue[int] = DelayQueue(FakeClock())
    for key in range(10):
        queue.schedule(key, 0)
    assert queue.pop_due(4) == [0, 1, 2, 3]
    assert queue.pop_due(100) == [4, 5, 6, 7, 8, 9]


def test_a_time_in_the_past_is_due_now() -> None:
    clock = FakeClock()
    queue: DelayQueue[str] = DelayQueue(clock)
    queue.schedule_at("late", clock.now() - 60)
    assert queue.due_at("late") == clock.now() - 60
    assert queue.pop_due(1) == ["late"]


async def test_the_dispatcher_fires_on_the_fake_clock_in_time_order() -> None:
    clock = FakeClock()
    queue: DelayQueue[str] = DelayQueue(clock)
    fired: list[tuple[float, str]] = []

    async def fire(key: str) -> None:
        fired.append((clock.now(), key))

    dispatcher = Dispatcher(queue, fire, clock=clock, limit=4, name="test")
    running = asyncio.create_task(dispatcher.run())
    queue.schedule("later", 30)
    queue.schedule("soon", 10)
    dispatcher.wake()
    await clock.advance(60)
    running.cancel()
    start = clock.now() - 60
    assert fired == [(start + 10, "soon"), (start + 30, "later")]


async def test_a_throttled_dispatcher_keeps_few_in_flight_and_still_progresses() -> None:
    queue: DelayQueue[int] = DelayQueue(SYSTEM_CLOCK)
    for key in range(40):
        queue.schedule(key, 0)
    behind = True
    in_flight, peak, done = 0, 0, []

    async def fire(key: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        done.append(key)

    dispatcher = Dispatcher(queue, fire, clock=SYSTEM_CLOCK, limit=16, name="test",
                            throttle=lambda: behind, throttled_limit=2)
    running = asyncio.create_task(dispatcher.run())
    while len(done) < 20:
        await asyncio.sleep(0.01)
    assert peak == 2, "held back to the throttled limit"
    behind = False
    while len(done) < 40:
        await asyncio.sleep(0.01)
    running.cancel()
    assert peak > 2, "full speed once the throttle lifts"
    assert sorted(done) == list(range(40))


async def test_a_step_that_raises_unexpectedly_fires_again_later() -> None:
    """Defect: a step raising anything but an API error lost its key (a Lease never renewed)."""
    clock = FakeClock()
    queue: DelayQueue[str] = DelayQueue(clock)
    fired: list[float] = []

    async def fire(key: str) -> None:
        fired.append(clock.now())
        if len(fired) == 1:
            raise ValueError("a response that is not JSON")

    dispatcher = Dispatcher(queue, fire, clock=clock, limit=4, name="test")
    running = asyncio.create_task(dispatcher.run())
    start = clock.now()
    queue.schedule("lease", 10)
    dispatcher.wake()
    await clock.advance(60)
    running.cancel()
    assert fired == [start + 10, start + 10 + RETRY_UNEXPECTED]


async def test_a_step_that_plans_its_next_one_due_at_once_gets_it() -> None:
    """Defect: a step planning a next step due at once (a fault stage after a restart) woke the
    loop while it was still in flight; the loop dropped the key, and the step never came."""
    queue: DelayQueue[str] = DelayQueue(SYSTEM_CLOCK)
    fired: list[str] = []
    dispatcher: Dispatcher[str]

    async def fire(key: str) -> None:
        fired.append(key)
        await asyncio.sleep(0)
        if len(fired) == 1:
            queue.schedule(key, 0)  # the owner plans the next step from what it wrote
            dispatcher.wake()

    dispatcher = Dispatcher(queue, fire, clock=SYSTEM_CLOCK, limit=4, name="test")
    running = asyncio.create_task(dispatcher.run())
    queue.schedule("pod", 0)
    dispatcher.wake()
    for _ in range(100):
        await asyncio.sleep(0.001)
        if len(fired) == 2:
            break
    running.cancel()
    assert fired == ["pod", "pod"]


async def test_a_key_put_back_at_its_due_time_goes_before_those_due_after_it() -> None:
    """Defect: the dispatcher took a batch of due keys out of the queue and held them while it
    waited for a slot, so a renewal put back at its due time (answered 429) went out after
    every key of that batch, due later than it."""
    clock = FakeClock()
    queue: DelayQueue[str] = DelayQueue(clock)
    fired: list[str] = []

    async def fire(key: str) -> None:
        fired.append(key)
        await clock.sleep(1)
        if key == "a" and fired.count("a") == 1:
            queue.schedule_at("a", start)  # answered 429: back at its due time

    start = clock.now() - 10
    for index, key in enumerate("abcdef"):  # all overdue, "a" the most
        queue.schedule_at(key, start + index)
    dispatcher = Dispatcher(queue, fire, clock=clock, limit=2, name="test")
    running = asyncio.create_task(dispatcher.run())
    await clock.advance(10)
    running.cancel()
    assert fired == ["a", "b", "a", "c", "d", "e", "f"]


async def test_a_dispatcher_keeps_in_flight_what_its_window_allows() -> None:
    clock = FakeClock()
    queue: DelayQueue[int] = DelayQueue(clock)
    window = Window(32, floor=2)
    in_flight, peaks = 0, []

    async def fire(key: int) -> None:
        nonlocal in_flight
        in_flight += 1
        peaks.append(in_flight)
        await clock.sleep(1)
        in_flight -= 1

    for key in range(40):
        queue.schedule(key, 0)
    while window.limit > 8:
        window.throttled(window.epoch, now=clock.now(), retry_after=1)
    dispatcher = Dispatcher(queue, fire, clock=clock, limit=32, name="test", window=window)
    running = asyncio.create_task(dispatcher.run())
    await clock.advance(0.5)
    assert max(peaks) == window.limit
    while window.size > window.floor:
        window.throttled(window.epoch, now=clock.now(), retry_after=1)
    window.throttled(window.epoch, now=clock.now(), retry_after=3)  # at the floor: a pause
    started = len(peaks)
    await clock.advance(2.9)
    assert len(peaks) == started, "nothing goes out while paused"
    await clock.advance(0.2)
    assert len(peaks) == started + 2
    running.cancel()
