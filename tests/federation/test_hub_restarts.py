"""A restarted hub and the members that come back to it, with the hub driven directly on a fake
clock (the gRPC side of restarts is in test_hub.py and ``python -m bench.hub``)."""

from __future__ import annotations

from pathlib import Path

from federation.api import member_pb2
from federation.hub.core import Hub, HubSettings, Session
from federation.hub.membership import Identity, Inventory, State

INTERVAL, GRACE = 2.0, 6.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class EchoingMember:
    """Echoes the highest hub heartbeat number it has seen, across sessions (as MemberLink)."""

    def __init__(self) -> None:
        self.highest = 0

    def beat(self, hub: Hub, session: Session) -> None:
        while not session.outbox.empty():
            message = session.outbox.get_nowait()
            if message is not None and message.WhichOneof("kind") == "heartbeat":
                self.highest = max(self.highest, message.heartbeat.seq)
        hub.heartbeat(session, member_pb2.MemberHeartbeat(seq=1, hub_seq=self.highest))


async def test_a_member_stays_ready_across_a_hub_restart(tmp_path: Path) -> None:
    clock = Clock()
    settings = HubSettings(state_dir=tmp_path, heartbeat_interval=INTERVAL, grace=GRACE,
                           fsync=False)
    member = EchoingMember()
    for _ in range(2):  # the first hub, then the one restarted on its state
        hub = Hub(settings, clock=clock)
        await hub.start()
        try:
            await hub.register(Identity(name="west"), Inventory())
            session = hub.open_session("west", [])
            # Long past the grace, and longer than the first hub ran before it.
            for _ in range(int(10 * GRACE / INTERVAL)):
                hub.heartbeat_all(clock.now)
                member.beat(hub, session)
                clock.now += INTERVAL
                hub.membership.sweep(clock.now)
                west = hub.membership.members["west"]
                assert west.state is State.READY, west.message
        finally:
            await hub.stop()
        clock.now += 1.0
