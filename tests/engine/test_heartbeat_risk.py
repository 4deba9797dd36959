"""Heartbeats at risk, said loudly: a Lease renewal gap past 3/4 of the node-lifecycle
controller's grace (37.5 s of 50 s) makes a warning and the pool's HeartbeatsAtRisk condition,
with the gap measured; it clears once renewals are on time again. On a fake clock."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from operators.engine.alerting import GapAlarm
from tests.engine.harness import LEASES, POOLS, Fleet, entry, pool
from tests.engine.test_node_faults import RECOVER, UNREACHABLE


def at_risk(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or ()
                 if c["type"] == "HeartbeatsAtRisk"), None)


def test_a_gap_past_three_quarters_of_the_grace_puts_the_pool_at_risk_until_calm(
        caplog: pytest.LogCaptureFixture) -> None:
    changes: list[str] = []
    alarm = GapAlarm("west", grace=50, on_change=lambda: changes.append("changed"))
    assert alarm.threshold == 37.5
    alarm.measured("cpu", "cpu-1", 37.5, now=100)
    assert alarm.condition("cpu") is None, "at 3/4 exactly: not yet"
    with caplog.at_level(logging.WARNING):
        alarm.measured("cpu", "cpu-1", 38.0, now=101)
    assert "heartbeats at risk in pool cpu" in caplog.text
    assert "38.0s (node cpu-1)" in caplog.text
    status, message = alarm.condition("cpu") or (False, "")
    assert status is True
    assert "38.0s (node cpu-1)" in message
    assert "37.5s of 50s" in message
    alarm.measured("cpu", "cpu-2", 38.5, now=102)  # less than a second more: said as it was
    assert changes == ["changed"]
    alarm.measured("cpu", "cpu-2", 41.2, now=103)
    assert "41.2s (node cpu-2)" in (alarm.condition("cpu") or (False, ""))[1]
    assert changes == ["changed"] * 2
    alarm.review(now=103 + 37.0)
    assert (alarm.condition("cpu") or (False, ""))[0] is True, "not calm for long enough"
    alarm.review(now=103 + 37.5)
    status, message = alarm.condition("cpu") or (True, "")
    assert status is False
    assert "largest gap was 41.2s (node cpu-2)" in message
    assert alarm.condition("gpu") is None, "another pool was never at risk"


async def test_renewals_failing_make_the_pool_say_so_and_clear_once_on_time(
        caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(30)
        assert at_risk(fleet.pool_status("cpu")) is None, "renewed every 10 s: none"
        fleet.member.fail("PATCH", f"{LEASES}/cpu-1", status=503, times=1000)
        with caplog.at_level(logging.WARNING):
            await fleet.clock.advance(45)
        assert "heartbeats at risk in pool cpu" in caplog.text
        condition = at_risk(fleet.pool_status("cpu"))
        assert condition is not None
        assert condition["status"] == "True"
        assert condition["reason"] == "RenewalsLate"
        assert "(node cpu-1)" in condition["message"]
        gap = float(condition["message"].split("gap of ")[1].split("s ")[0])
        assert 37.5 < gap < 50, "measured while still open, before the grace ran out"
        fleet.member.faults.clear()
        await fleet.clock.advance(15)  # renewed again: the gap closed
        assert at_risk(fleet.pool_status("cpu"))["status"] == "True"  # type: ignore[index]
        await fleet.clock.advance(45)
        condition = at_risk(fleet.pool_status("cpu"))
        assert condition is not None
        assert condition["status"] == "False"
        assert condition["reason"] == "RenewalsOnTime"
        assert "largest gap was" in condition["message"]


async def test_a_node_silent_on_purpose_is_not_at_risk() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        fleet.inject(entry("ns/plan/gone/0", UNREACHABLE, RECOVER), "cpu-0")
        await fleet.clock.advance(120)
        await fleet.recover("ns/plan/gone/0")
        await fleet.clock.advance(60)
        assert at_risk(fleet.pool_status("cpu")) is None


async def test_a_restart_after_a_long_silence_counts_the_gap_across_it() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
    await fleet.clock.advance(45)  # no engine: nothing renews
    async with fleet.running(fleet.engine(seed=3)):
        await fleet.clock.advance(2)
        condition = at_risk(fleet.pool_status("cpu"))
        assert condition is not None
        assert condition["status"] == "True"
