"""A restarted hub and the members that come back to it, with the hub driven directly on a fake
clock (the gRPC side of restarts is in test_hub.py and ``python -m bench.hub``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from federation.api import member_pb2
from federation.hub.core import Hub, HubSettings
from federation.hub.membership import Identity, Inventory, State
from federation.hub.sending import Session
from tests.federation.hubs import HandClock

INTERVAL, GRACE = 2.0, 6.0
PLAN = json.dumps({"steps": [{"name": "xid", "target": {}, "fault": {"type": "GPUXid",
                                                                     "xid": 79}}]})


class EchoingMember:
    """Echoes the highest hub heartbeat number it has seen, across sessions (as MemberLink)."""

    def __init__(self) -> None:
        self.highest = 0

    def beat(self, hub: Hub, session: Session) -> None:
        while not session.outbox.empty():
            message = session.outbox.get_nowait()
            if message is not None and message.WhichOneof("kind") == "heartbeat":
                self.highest = max(self.highest, message.heartbeat.seq)
        hub.sessions.heartbeat(session, member_pb2.MemberHeartbeat(seq=1, hub_seq=self.highest))


async def test_a_member_stays_ready_across_a_hub_restart(tmp_path: Path) -> None:
    clock = HandClock()
    settings = HubSettings(state_dir=tmp_path, heartbeat_interval=INTERVAL, grace=GRACE,
                           fsync=False)
    member = EchoingMember()
    for _ in range(2):  # the first hub, then the one restarted on its state
        hub = Hub(settings, clock=clock)
        await hub.start()
        try:
            await hub.sessions.register(Identity(name="west"), Inventory())
            session = hub.sessions.open_session("west", [])
            # Long past the grace, and longer than the first hub ran before it.
            for _ in range(int(10 * GRACE / INTERVAL)):
                hub.sessions.heartbeat_all(clock.now())
                member.beat(hub, session)
                clock.at += INTERVAL
                hub.membership.sweep(clock.now())
                west = hub.membership.members["west"]
                assert west.state is State.READY, west.message
        finally:
            await hub.stop()
        clock.at += 1.0


async def test_a_session_opened_while_a_run_is_being_stored_gets_its_command_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member whose Hello arrives while RunPlan waits for the run to be on disk hears of
    the run only after the write, and only once (from the fan-out)."""
    settings = HubSettings(state_dir=tmp_path, heartbeat_interval=INTERVAL, grace=GRACE,
                           fsync=False)
    hub = Hub(settings, clock=HandClock())
    await hub.start()
    try:
        await hub.sessions.register(Identity(name="west"), Inventory())
        writing, written = asyncio.Event(), asyncio.Event()
        commit = hub.store.commit

        async def slow_commit(*, changed: bool = True) -> None:
            writing.set()
            await written.wait()
            await commit(changed=changed)

        monkeypatch.setattr(hub.store, "commit", slow_commit)
        planned = asyncio.create_task(hub.running.run_plan(PLAN, {}, 0, "xid"))
        await writing.wait()
        session = hub.sessions.open_session("west", [])
        early = commands(session)
        written.set()
        run = await planned
        assert early == [], "a command of a run not yet on disk was sent"
        assert commands(session) == [f"{run.id}/west/start"]
    finally:
        written.set()
        await hub.stop()


def commands(session: Session) -> list[str]:
    sent = []
    while not session.outbox.empty():
        message = session.outbox.get_nowait()
        if message is not None and message.WhichOneof("kind") == "command":
            sent.append(message.command.id)
    return sent
