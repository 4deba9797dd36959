"""The hub's heart: membership, runs, open sessions and watchers, and the clock that drives
heartbeats, liveness and the stats line it logs every 10 s. No gRPC here: sessions are queues
of outgoing messages, watchers are queues of events; :mod:`federation.hub.services` puts them
on the wire.

Rules it keeps:

- a change is stored before the hub acts on it (a run's commands go out after the run is on
  disk), and a restarted hub carries on from what it stored;
- a command goes to a member only while it has a session, and again only if the member never
  acknowledged it (after a reconnect, its Hello says what it has);
- one session per member: a new one (a reconnect the hub had not noticed yet) replaces the old.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from federation.api import fleet_pb2, member_pb2
from federation.hub import convert
from federation.hub.membership import (
    HostConflict,
    Identity,
    Inventory,
    Member,
    Membership,
    State,
)
from federation.hub.runs import MemberPart, Part, Phase, Report, Run, parse_command_id
from federation.hub.store import Snapshot, Store

logger = logging.getLogger(__name__)

#: Messages waiting for a member's stream; a member that falls this far behind is dropped and
#: resyncs when it reconnects (commands are in the runs, not only in the queue).
SESSION_QUEUE = 1000
#: Events waiting for one watcher; one that falls behind is ended and may watch again.
WATCH_QUEUE = 20_000
DEFAULT_START_DELAY = 2.0
#: Finished runs kept (the oldest go first).
KEEP_RUNS = 200
#: ... and at most this many member parts in all: every store write encodes every kept run
#: (about 4.5 ms per 1000 parts, on the hub's loop).
KEEP_PARTS = 20_000
#: Seconds between two "hub stats" lines in the log.
STATS_INTERVAL = 10.0


@dataclasses.dataclass(frozen=True)
class HubSettings:
    state_dir: Path
    heartbeat_interval: float = 2.0
    grace: float = 6.0
    fsync: bool = True


@dataclasses.dataclass
class Counters:
    """What the hub processed since it started, for its stats line."""

    heartbeats: int = 0
    acknowledged: int = 0


class Refused(Exception):
    """A request the hub cannot carry out; ``code`` says why in gRPC's terms."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Session:
    """One member's open stream: what waits to be written to it."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.outbox: asyncio.Queue[member_pb2.HubMessage | None] = \
            asyncio.Queue(maxsize=SESSION_QUEUE)
        self.closed = False

    def send(self, message: member_pb2.HubMessage) -> bool:
        if self.closed:
            return False
        try:
            self.outbox.put_nowait(message)
        except asyncio.QueueFull:
            logger.warning("member %s fell %d messages behind: its session is dropped",
                           self.cluster, SESSION_QUEUE)
            self.close()
            return False
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(asyncio.QueueFull):
                self.outbox.put_nowait(None)


class Watcher:
    def __init__(self, selector: dict[str, Any]) -> None:
        self.selector = selector
        self.events: asyncio.Queue[fleet_pb2.ClusterEvent | None] = \
            asyncio.Queue(maxsize=WATCH_QUEUE)
        self.overflowed = False


class Hub:
    def __init__(self, settings: HubSettings, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.store = Store(settings.state_dir / "state.json", fsync=settings.fsync)
        self.membership = Membership(grace=settings.grace)
        self.runs: dict[str, Run] = {}
        self.sessions: dict[str, Session] = {}
        self.watchers: set[Watcher] = set()
        self._run_changed: dict[str, asyncio.Event] = {}
        self.hub_id = ""
        self.seq = 0
        self.counters = Counters()
        self._stats_from = (0.0, Counters())
        self._ticker: asyncio.Task[None] | None = None

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> None:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        snapshot = self.store.load()
        self.hub_id = snapshot.hub_id
        self.membership.restore(snapshot.members, self.clock())
        # A member that echoes the highest heartbeat number it has seen across sessions (ours
        # start again per session; others may not) still answers a restarted hub: numbers
        # counted on from the clock (milliseconds) stay above those of a hub that ran here
        # before, where numbers counted from zero would go unanswered until they passed them.
        self.seq = int(self.clock() * 1000)
        self.runs = {run.id: run for run in snapshot.runs}
        self.store.start(self.snapshot)
        await self.store.commit()
        self._stats_from = (self.clock(), Counters())
        self._ticker = asyncio.create_task(self._tick(), name="hub-ticker")
        logger.info("hub %s: %d members, %d runs", self.hub_id, len(self.membership.members),
                    len(self.runs))

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for session in list(self.sessions.values()):
            session.close()
        for watcher in list(self.watchers):
            with contextlib.suppress(asyncio.QueueFull):
                watcher.events.put_nowait(None)
        await self.store.stop()

    def snapshot(self) -> Snapshot:
        return Snapshot(hub_id=self.hub_id, members=list(self.membership.members.values()),
                        runs=list(self.runs.values()))

    async def _tick(self) -> None:
        interval = self.settings.heartbeat_interval
        step = min(0.5, interval / 2)
        next_beat = 0.0
        next_stats = self.clock() + STATS_INTERVAL
        while True:
            now = self.clock()
            if now >= next_beat:
                self.heartbeat_all(now)
                next_beat = now + interval
            if now >= next_stats:
                logger.info("%s", self.stats(now))
                next_stats = now + STATS_INTERVAL
            self._publish(self.membership.sweep(now))
            await asyncio.sleep(step)

    def heartbeat_all(self, now: float) -> None:
        self.seq += 1
        beat = member_pb2.HubMessage(heartbeat=member_pb2.HubHeartbeat(
            seq=self.seq, sent_at=convert.timestamp(now)))
        for session in list(self.sessions.values()):
            session.send(beat)

    def stats(self, now: float) -> str:
        """Where the hub stands, and what it processed per second since the last call."""
        since, before = self._stats_from
        self._stats_from = (now, dataclasses.replace(self.counters))
        seconds = max(now - since, 1e-6)
        ready = sum(member.state is State.READY for member in self.membership.members.values())
        running = sum(not run.finished_at for run in self.runs.values())
        counters = self.counters
        return (f"hub stats: {len(self.membership.members)} members ({ready} Ready), "
                f"{len(self.sessions)} sessions, "
                f"{(counters.heartbeats - before.heartbeats) / seconds:.1f} heartbeats/s, "
                f"{(counters.acknowledged - before.acknowledged) / seconds:.1f} acks/s "
                f"({counters.heartbeats} heartbeats, {counters.acknowledged} acks in all), "
                f"{len(self.runs)} runs ({running} Running), {len(self.watchers)} watchers")

    # -- members -----------------------------------------------------------------------------

    async def register(self, identity: Identity, inventory: Inventory) -> Member:
        known = identity.name in self.membership.members
        try:
            member = self.membership.register(identity, inventory, self.clock())
        except HostConflict as conflict:
            raise Refused("ALREADY_EXISTS", str(conflict)) from conflict
        self._publish([member], added=not known)
        await self.store.commit()
        return member

    def open_session(self, cluster: str, reports: list[Report]) -> Session:
        """A member said hello: its old session (if any) ends, what it reports is taken as
        the truth about its commands, and what it never got is sent."""
        if cluster not in self.membership.members:
            raise Refused("FAILED_PRECONDITION",
                          f"cluster {cluster!r} is not registered: call Register first")
        for report in reports:
            parsed = parse_command_id(report.command_id)
            if parsed is not None and parsed[1] != cluster:
                raise Refused("PERMISSION_DENIED",
                              f"hello.commands: command {report.command_id!r} belongs to "
                              f"cluster {parsed[1]!r}; a member reports its own commands only")
        old = self.sessions.pop(cluster, None)
        if old is not None:
            old.close()
        session = Session(cluster)
        self.sessions[cluster] = session
        now = self.clock()
        reported = [report.command_id for report in reports]
        changed = False
        for report in reports:
            changed |= self._apply_report(report, now)
        for run in self._runs_of(cluster):
            changed |= run.resynced(cluster, reported, now)
            self._settle(run, now)
        self._publish([self.membership.connect(cluster, now)])
        changed |= self._send_outstanding(session, now)
        if changed:
            self.store.changed()
        return session

    def close_session(self, session: Session) -> None:
        session.close()
        if self.sessions.get(session.cluster) is session:
            del self.sessions[session.cluster]
            self._publish([self.membership.disconnect(session.cluster, self.clock())])

    def current(self, session: Session) -> bool:
        return self.sessions.get(session.cluster) is session

    def heartbeat(self, session: Session, message: member_pb2.MemberHeartbeat) -> None:
        self.counters.heartbeats += 1
        inventory = convert.inventory(message.inventory) if message.HasField("inventory") \
            else None
        changed = self.membership.heartbeat(session.cluster, message.hub_seq, inventory,
                                            self.clock())
        if changed is not None:
            self._publish([changed])
            self.store.changed()

    def acknowledged(self, session: Session, command_id: str) -> None:
        self._check_owner(session.cluster, command_id, "ack.command_id")
        self.counters.acknowledged += 1
        self.membership.heard(session.cluster, self.clock())
        run = self._run_of(command_id)
        if run is not None and run.acknowledged(command_id, self.clock()):
            self._changed(run)

    def reported(self, session: Session, report: Report) -> None:
        self._check_owner(session.cluster, report.command_id, "result.command_id")
        self.membership.heard(session.cluster, self.clock())
        if self._apply_report(report, self.clock()):
            self.store.changed()

    async def deregister(self, cluster: str) -> None:
        session = self.sessions.pop(cluster, None)
        if session is not None:
            session.close()
        member = self.membership.remove(cluster)
        now = self.clock()
        for run in self._runs_of(cluster):
            part = run.parts[cluster]
            if not part.state.finished:
                part.state, part.finished_at = Part.FAILED, now
                part.message = "the member left the fleet (deregistered)"
                self._changed(run)
        if member is not None:
            self._publish([member], deleted=True)
        await self.store.commit()

    # -- runs --------------------------------------------------------------------------------

    async def run_plan(self, plan: str, selector: dict[str, Any], start_delay: float | None,
                       name: str) -> Run:
        members = sorted(m.name for m in self.membership.members.values()
                         if convert.selects(selector, m.identity))
        if not members:
            known = ", ".join(sorted(self.membership.members)) or "none yet"
            raise Refused("FAILED_PRECONDITION",
                          f"clusters: the selector picks no registered member (members: "
                          f"{known}); change the selector or let the clusters join first")
        now = self.clock()
        run = Run(id=f"r{secrets.token_hex(4)}", name=name, plan=plan, selector=selector,
                  created_at=now,
                  start_at=now + (DEFAULT_START_DELAY if start_delay is None else start_delay),
                  parts={cluster: MemberPart(cluster=cluster) for cluster in members})
        self.runs[run.id] = run
        self._forget_old_runs()
        await self.store.commit()  # stored before any member hears of it
        for cluster in members:
            session = self.sessions.get(cluster)
            if session is not None:
                self._send_outstanding(session, self.clock(), runs=[run])
        self._changed(run)
        return run

    async def cancel_run(self, run_id: str) -> Run:
        run = self.get_run(run_id)
        if run.cancel(self.clock()):
            await self.store.commit()
            for cluster in run.parts:
                session = self.sessions.get(cluster)
                if session is not None:
                    self._send_outstanding(session, self.clock(), runs=[run])
            self._changed(run)
        return run

    def get_run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise Refused("NOT_FOUND", f"run_id: no run {run_id!r} (the hub keeps the "
                                       f"{KEEP_RUNS} newest finished runs, with at most "
                                       f"{KEEP_PARTS} member parts in all)")
        return run

    def run_changed(self, run_id: str) -> asyncio.Event:
        """Set at the next change of the run."""
        return self._run_changed.setdefault(run_id, asyncio.Event())

    # -- watchers ----------------------------------------------------------------------------

    def watch(self, selector: dict[str, Any]) -> Watcher:
        watcher = Watcher(selector)
        for member in sorted(self.membership.members.values(), key=lambda m: m.name):
            if convert.selects(selector, member.identity):
                watcher.events.put_nowait(fleet_pb2.ClusterEvent(
                    type=fleet_pb2.EVENT_TYPE_ADDED, member=convert.member_message(member)))
                if watcher.events.full():
                    break
        watcher.events.put_nowait(fleet_pb2.ClusterEvent(type=fleet_pb2.EVENT_TYPE_SYNCED))
        self.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    # -- internals ---------------------------------------------------------------------------

    def _publish(self, members: Iterable[Member | None], *, added: bool = False,
                 deleted: bool = False) -> None:
        kind = fleet_pb2.EVENT_TYPE_DELETED if deleted else \
            fleet_pb2.EVENT_TYPE_ADDED if added else fleet_pb2.EVENT_TYPE_MODIFIED
        for member in members:
            if member is None:
                continue
            if not deleted:
                self.store.changed()
            event: fleet_pb2.ClusterEvent | None = None
            for watcher in list(self.watchers):
                if not convert.selects(watcher.selector, member.identity):
                    continue
                event = event or fleet_pb2.ClusterEvent(type=kind,
                                                        member=convert.member_message(member))
                try:
                    watcher.events.put_nowait(event)
                except asyncio.QueueFull:
                    watcher.overflowed = True
                    self.watchers.discard(watcher)

    def _send_outstanding(self, session: Session, now: float,
                          runs: Iterable[Run] | None = None) -> bool:
        changed = False
        for run in runs if runs is not None else self._runs_of(session.cluster):
            for command in run.outstanding(session.cluster):
                if not session.send(convert.command_message(command)):
                    return changed
                changed |= run.sent(session.cluster, now)
        return changed

    def _runs_of(self, cluster: str) -> list[Run]:
        return sorted((run for run in self.runs.values() if cluster in run.parts),
                      key=lambda run: run.created_at)

    def _run_of(self, command_id: str) -> Run | None:
        parsed = parse_command_id(command_id)
        return None if parsed is None else self.runs.get(parsed[0])

    def _check_owner(self, cluster: str, command_id: str, field: str) -> None:
        parsed = parse_command_id(command_id)
        if parsed is not None and parsed[1] != cluster:
            raise Refused("PERMISSION_DENIED",
                          f"{field}: command {command_id!r} belongs to cluster {parsed[1]!r}; "
                          f"this session speaks for {cluster!r}")

    def _apply_report(self, report: Report, now: float) -> bool:
        run = self._run_of(report.command_id)
        if run is None or not run.reported(report, now):
            return False
        self._changed(run, store=False)
        return True

    def _changed(self, run: Run, *, store: bool = True) -> None:
        self._settle(run, self.clock())
        if store:
            self.store.changed()
        event = self._run_changed.pop(run.id, None)
        if event is not None:
            event.set()

    def _settle(self, run: Run, now: float) -> None:
        # finished_at first: the phase looks at every part, and a finished run is asked again
        # at every session a member of it opens.
        if not run.finished_at and run.phase is not Phase.RUNNING:
            run.settle(now)
            logger.info("run %s %s (verdict %s)", run.id, run.phase.value,
                        run.verdict or "none")

    def _forget_old_runs(self) -> None:
        """Keep the newest finished runs, within KEEP_RUNS and KEEP_PARTS."""
        finished = sorted((run for run in self.runs.values() if run.finished_at),
                          key=lambda run: run.created_at, reverse=True)
        kept = parts = 0
        for run in finished:
            kept, parts = kept + 1, parts + len(run.parts)
            if kept > KEEP_RUNS or parts > KEEP_PARTS:
                del self.runs[run.id]
