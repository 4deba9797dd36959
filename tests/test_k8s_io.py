"""The API I/O paths over the in-memory transport and a fake clock: throttling, expired
credentials, watches that break, lists that expire, streams with very long lines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from operators.k8s import errors
from operators.k8s.client import Client
from operators.k8s.retrying import Backoff
from operators.k8s.transport import SlowWrites, split_lines
from operators.k8s.watching import list_and_watch
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

NODES = "/api/v1/nodes"


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def api(clock: FakeClock) -> MemoryTransport:
    return MemoryTransport(clock)


@pytest.fixture
def client(api: MemoryTransport, clock: FakeClock) -> Client:
    return Client(api, clock=clock)


class Recorder:
    """Callbacks of list_and_watch that keep what they saw."""

    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def listed(self, items: list[Any]) -> None:
        self.lists.append([item["metadata"]["name"] for item in items])

    def changed(self, kind: str, obj: Any) -> None:
        self.events.append((kind, obj["metadata"]["name"]))


@contextlib.asynccontextmanager
async def watching(client: Client, clock: FakeClock, recorder: Recorder,
                   params: dict[str, str] | None = None) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(list_and_watch(
        client, NODES, params or {}, on_list=recorder.listed, on_event=recorder.changed,
        clock=clock, backoff=Backoff(base=1, cap=8)))
    try:
        await clock.settle()
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_throttled_request_waits_retry_after_then_succeeds(
        api: MemoryTransport, client: Client, clock: FakeClock) -> None:
    api.put(NODES, node("a"))
    api.fail("GET", f"{NODES}/a", status=429, headers={"Retry-After": "7"}, times=2)
    call = asyncio.create_task(client.get(f"{NODES}/a"))
    await clock.advance(13)
    assert not call.done(), "two waits of 7 s each"
    await clock.advance(1)
    assert (await call)["metadata"]["name"] == "a"
    assert len(api.sent("GET", f"{NODES}/a")) == 3


async def test_errors_carry_their_class_and_message(api: MemoryTransport, client: Client) -> None:
    with pytest.raises(errors.NotFound):
        await client.get(f"{NODES}/missing")
    api.fail("PATCH", f"{NODES}/x", status=500, reason="InternalError")
    with pytest.raises(errors.ServerError) as raised:
        await client.patch(f"{NODES}/x", {})
    assert errors.transient(raised.value)
    await client.create(NODES, node("x"))
    with pytest.raises(errors.Conflict) as conflict:
        await client.create(NODES, node("x"))
    assert conflict.value.already_exists
    assert not errors.transient(conflict.value)


async def test_a_401_asks_for_fresh_credentials_once(api: MemoryTransport, client: Client) -> None:
    refreshed: list[bool] = []
    api.refresh_credentials = lambda: refreshed.append(True)  # type: ignore[method-assign]
    api.fail("GET", "/version", status=401, times=1)
    assert (await client.get("/version"))["gitVersion"] == "v1.36.3"
    assert refreshed == [True]
    api.fail("GET", "/version", status=401, times=2)
    with pytest.raises(errors.Unauthorized):
        await client.get("/version")


async def test_slow_answer_past_the_timeout_is_a_transport_error(
        api: MemoryTransport, client: Client, clock: FakeClock) -> None:
    api.fail("GET", "/version", delay=45)
    call = asyncio.create_task(client.get("/version"))
    await clock.advance(31)
    with pytest.raises(errors.TransportError, match="timed out"):
        await call


async def test_watch_sees_the_list_then_every_change(
        api: MemoryTransport, client: Client, clock: FakeClock) -> None:
    api.put(NODES, node("a", pool="p"))
    api.put(NODES, node("b"))
    recorder = Recorder()
    async with watching(client, clock, recorder, {"labelSelector": "pool"}):
        api.put(NODES, node("c", pool="p"))
        api.put(NODES, node("d"))
        await client.patch(f"{NODES}/a", {"metadata": {"labels": {"x": "1"}}})
        await client.delete(f"{NODES}/c")
        await clock.settle()
    assert recorder.lists == [["a"]]
    assert recorder.events == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "c")]


@pytest.mark.parametrize("status", [500, 503, 403, 429])
async def test_failing_list_is_retried_with_growing_capped_backoff(
        api: MemoryTransport, client: Client, clock: FakeClock, status: int) -> None:
    api.put(NODES, node("a"))
    api.fail("GET", NODES, status=status, times=6)
    recorder = Recorder()
    async with watching(client, clock, recorder) as task:
        await clock.advance(1)
        assert recorder.lists == [], "still backing off"
        await clock.advance(120)
        assert not task.done(), "the watch never gives up"
    assert recorder.lists == [["a"]]
    # Waits grow from 1 s and stop growing at the cap of 8 s (jittered in [half, full]).
    times = [r for r in api.sent("GET", NODES) if "watch" not in r.query]
    assert len(times) == 7 if status != 429 else len(times) >= 7


async def test_expired_continue_token_starts_a_clean_relist(
        api: MemoryTransport, client: Client, clock: FakeClock) -> None:
    for index in range(1200):
        api.put(NODES, node(f"n{index:04d}"))
    api.compact()
    original = api._list

    def expiring(target: Any, query: Any) -> Any:
        if query.get("continue") and not expiring.done:  # type: ignore[attr-defined]
            expiring.done = True  # type: ignore[attr-defined]
            api.put(NODES, node("late"))
            api.compact()
        return original(target, query)

    expiring.done = False  # type: ignore[attr-defined]
    api._list = expiring  # type: ignore[method-assign]
    recorder = Recorder()
    async with watching(client, clock, recorder):
        pass
    assert len(recorder.lists) == 1
    assert len(recorder.lists[0]) == 1201, "one whole, consistent list; no partial one"


async def test_dropped_watch_resumes_and_a_gone_version_relists(
        api: MemoryTransport, client: Client, clock: FakeClock) -> None:
    api.put(NODES, node("a"))
    recorder = Recorder()
    async with watching(client, clock, recorder):
        api.break_watches()
        await clock.settle()
        api.put(NODES, node("b"))
        await clock.advance(2)  # back-off, then resume from the last version: b arrives
        assert recorder.events == [("ADDED", "b")]
        assert len(recorder.lists) == 1
        api.break_watches()
        await clock.settle()
        api.put(NODES, node("c"))
        api.compact()  # the resume's version is gone: 410, relist
        await clock.advance(2)
        assert recorder.lists[-1] == ["a", "b", "c"]
        api.put(NODES, node("d"))
        await clock.settle()
    assert recorder.events[-1] == ("ADDED", "d")


async def test_watch_line_that_is_not_json_reconnects(
        api: MemoryTransport, client: Client, clock: FakeClock) -> None:
    recorder = Recorder()
    original = api._watch

    async def garbled(request: Any) -> AsyncIterator[bytes]:
        if not garbled.done:  # type: ignore[attr-defined]
            garbled.done = True  # type: ignore[attr-defined]
            yield b'{"type": "ADDED", "obj'
            return
        async for line in original(request):
            yield line

    garbled.done = False  # type: ignore[attr-defined]
    api._watch = garbled  # type: ignore[method-assign]
    async with watching(client, clock, recorder):
        await clock.advance(2)
        api.put(NODES, node("a"))
        await clock.settle()
    assert recorder.events == [("ADDED", "a")]


async def test_lines_of_any_length_are_split_whole() -> None:
    big = b'{"x":"' + b"y" * (2 * 1024 * 1024) + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        data = b"first\n" + big + b"\n\nlast"
        for start in range(0, len(data), 65536):
            yield data[start:start + 65536]

    lines = [line async for line in split_lines(chunks())]
    assert lines == [b"first", big, b"last"]


def test_backoff_doubles_to_the_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(base=1, cap=8)
    delays = [backoff.next() for _ in range(6)]
    for delay, ceiling in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    backoff.reset()
    assert backoff.next() <= 1


async def test_slowed_writes_wait_and_reads_do_not(api: MemoryTransport, clock: FakeClock) -> None:
    slowed = SlowWrites(api, clock=clock)
    client = Client(slowed, clock=clock)
    slowed.delay = 2.0
    start = clock.now()
    write = asyncio.create_task(client.create(NODES, node("a")))
    await clock.advance(1.0)
    assert not write.done(), "a write waits the delay first"
    await clock.advance(1.5)
    await write
    read = asyncio.create_task(client.get(f"{NODES}/a"))
    await clock.advance(0.01)
    assert read.done(), "reads are not held up"
    assert clock.now() - start < 3.0
    slowed.delay = 0.0
    await client.delete(f"{NODES}/a")  # no delay once the fault is gone
