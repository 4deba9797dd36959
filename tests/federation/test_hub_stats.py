"""The hub's counters and the stats line it logs, with the hub driven directly on a fake
clock."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from federation.api import member_pb2
from federation.hub import core
from federation.hub.core import Hub, HubSettings
from federation.hub.membership import Identity, Inventory
from tests.fakes.clocks import FakeClock
from tests.federation.hubs import HandClock


async def test_the_stats_line_counts_heartbeats_and_acks_per_second(tmp_path: Path) -> None:
    clock = HandClock()
    hub = Hub(HubSettings(state_dir=tmp_path, fsync=False), clock=clock)
    await hub.start()
    try:
        sessions = {}
        for name in ("east", "west"):
            await hub.sessions.register(Identity(name=name), Inventory())
            sessions[name] = hub.sessions.open_session(name, [])
        run = await hub.running.run_plan('{"steps": [{}]}', {}, 0.0, "")
        for _ in range(30):
            hub.sessions.heartbeat(sessions["east"], member_pb2.MemberHeartbeat(seq=1))
        hub.sessions.acknowledged(sessions["east"], f"{run.id}/east/start")
        clock.at += 10
        assert hub.stats(clock.now()) == (
            "hub stats: 2 members (2 Ready), 2 sessions, 3.0 heartbeats/s, 0.1 acks/s "
            "(30 heartbeats, 1 acks in all), 1 runs (1 Running), 0 workloads (0 Running), "
            "0 watchers")
        hub.sessions.close_session(sessions["west"])
        hub.sessions.heartbeat(sessions["east"], member_pb2.MemberHeartbeat(seq=2))
        clock.at += 5
        # Rates are over the time since the last line; the totals go on.
        assert hub.stats(clock.now()) == (
            "hub stats: 2 members (1 Ready), 1 sessions, 0.2 heartbeats/s, 0.0 acks/s "
            "(31 heartbeats, 1 acks in all), 1 runs (1 Running), 0 workloads (0 Running), "
            "0 watchers")
    finally:
        await hub.stop()


async def test_the_ticker_logs_the_stats_line_every_interval(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = HandClock()
    hub = Hub(HubSettings(state_dir=tmp_path, heartbeat_interval=0.1, grace=1.0, fsync=False),
              clock=clock)
    with caplog.at_level(logging.INFO, logger=core.__name__):
        await hub.start()
        try:
            await asyncio.sleep(0.2)
            assert not [r for r in caplog.messages if r.startswith("hub stats:")]
            clock.at += core.STATS_INTERVAL
            async with asyncio.timeout(2):
                while not [r for r in caplog.messages if r.startswith("hub stats:")]:
                    await asyncio.sleep(0.02)
        finally:
            await hub.stop()


async def test_a_ticker_that_fails_is_logged_and_ticks_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A defect in one tick must not leave the hub serving without heartbeats."""
    clock = FakeClock()
    hub = Hub(HubSettings(state_dir=tmp_path, heartbeat_interval=1.0, grace=3.0, fsync=False),
              clock=clock)
    beats: list[float] = []
    heartbeat_all = hub.sessions.heartbeat_all

    def flaky(now: float) -> None:
        beats.append(now)
        if len(beats) == 1:
            raise RuntimeError("a defect")
        heartbeat_all(now)

    monkeypatch.setattr(hub.sessions, "heartbeat_all", flaky)
    with caplog.at_level(logging.ERROR, logger="primitives.tasks"):
        await hub.start()
        try:
            await clock.advance(5.0)
        finally:
            await hub.stop()
    assert len(beats) >= 4, "it ticked again after the failure"
    assert any("hub-ticker failed" in r.getMessage() and r.exc_info is not None
               for r in caplog.records)
