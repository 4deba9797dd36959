"""Lease renewals on a server that serves a few at a time and answers 429 past them (as one APF
flow whose seats and queue are full): the renewal window follows what the server serves, the
most overdue renewal goes first so that none is lost, and the window grows back once the 429s
stop."""

from __future__ import annotations

import logging

import pytest

from operators.engine.windowing import DECREASE
from operators.k8s.times import parse
from operators.k8s.transport import Transport
from tests.engine.harness import LEASES, Fleet, spec
from tests.fakes.k8s import Saturated

NODES = 200
LEASE = 10  # seconds: renewals every 2.5 s, at most every 8.75 s stretched
SERVED = 40  # requests the server serves at a time
LATENCY = 2.5  # seconds each takes: 16 renewals a second, fewer than 200 nodes want
#: even at their longest interval (23 a second)
MEASURED = 90  # seconds


def renewed(fleet: Fleet) -> dict[str, float]:
    return {name: parse(lease["spec"]["renewTime"]) for name, lease in fleet.leases().items()}


async def test_the_window_follows_what_the_server_serves_and_grows_back(
        caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet()
    servers: list[Saturated] = []

    def saturated(transport: Transport) -> Transport:
        servers.append(Saturated(transport, fleet.clock, limit=SERVED, latency=LATENCY,
                                 pattern=f"{LEASES}.*"))
        return servers[-1]

    engine = fleet.engine(hosted=False,
                          pools={"cpu": spec(replicas=NODES, leaseDurationSeconds=LEASE)},
                          heartbeat_server=saturated)
    window = engine.heartbeats.window
    with caplog.at_level(logging.INFO, logger="operators.engine.heartbeating"):
        async with fleet.running(engine):
            server = servers[0]
            await fleet.clock.advance(60)  # every node made, every renewal overdue
            assert len(fleet.leases()) == NODES
            served, throttled, sizes = server.served, server.throttled, []
            gaps = dict.fromkeys(fleet.leases(), 0.0)
            last = renewed(fleet)
            for _ in range(MEASURED):
                await fleet.clock.advance(1)
                sizes.append(window.limit)
                for name, at in renewed(fleet).items():
                    gaps[name] = max(gaps[name], at - last[name])
                    last[name] = at
            # Near what the server serves: between a cut and the next 429.
            assert min(sizes) >= int(SERVED * DECREASE) - 1, sizes
            assert max(sizes) <= SERVED + 1, sizes
            assert sum(sizes) / len(sizes) >= 0.75 * SERVED, sizes
            # 429s only as the window probes the server's limit, not one per renewal a second.
            assert server.throttled - throttled < 0.05 * (server.served - served), (
                server.throttled - throttled, server.served - served, sizes)
            # Overloaded, the server renews every node in turn: each waits for the others once
            # (the most overdue first), none is left behind by the luck of its back-offs, none
            # goes ahead of the others.
            rate = (server.served - served) / MEASURED
            longest, shortest = max(gaps.values()), min(gaps.values())
            assert longest < 1.5 * NODES / rate, (longest, rate)
            assert shortest > 0.6 * longest, (shortest, longest)

            throttled, at_most = server.throttled, max(sizes)
            server.limit = 10 * NODES  # the 429s stop
            await fleet.clock.advance(60)
            assert server.throttled == throttled
            assert window.limit > at_most + 5, (window.limit, at_most)
    lines = [r.getMessage() for r in caplog.records if "renewals in flight at most" in
             r.getMessage()]
    assert lines, "the window's changes are logged"
    assert len(lines) <= (60 + MEASURED + 60) / 10 + 1, "at most one line every 10 s"


async def test_a_renewal_answered_429_goes_again_at_once_and_cuts_the_window() -> None:
    """Defect: a renewal answered 429 slept the server's Retry-After on its connection and
    was sent again as late; one the client gave up on was backed off at random."""
    fleet = Fleet()
    engine = fleet.engine(hosted=False, pools={"cpu": spec(replicas=2)})
    async with fleet.running(engine):
        await fleet.clock.advance(30)
        due = engine.book.records["cpu-1"].renew_at
        fleet.member.fail("PATCH", f"{LEASES}/cpu-1", status=429,
                          headers={"Retry-After": "5"})
        await fleet.clock.advance(due - fleet.clock.now() + 1)
        assert renewed(fleet)["cpu-1"] == pytest.approx(due, abs=0.01)
        assert engine.heartbeats.window.limit == int(384 * DECREASE)
        assert engine.book.records["cpu-1"].failures == 0
