"""The hub itself: the state its parts share, their composition, and the clock that drives
heartbeats, liveness and the stats line it logs every 10 s.

The parts, each a protocol of its own:

- :mod:`~federation.hub.sessions`: Register, Deregister and the members' sessions, with what
  they carry (heartbeats, acks, results);
- :mod:`~federation.hub.running`: fleet-wide fault plans (RunPlan, CancelRun);
- :mod:`~federation.hub.dispatching`: fleet workloads (SubmitWorkload, and the loop that
  places and sends their Jobs);
- :mod:`~federation.hub.watching`: WatchClusters.

The hub owns what they share (membership, the store, the open sessions, the clock, the
tracer), starts and stops them, and ticks: a heartbeat to every session at the interval, a
sweep of the members' liveness, the stats line. A change is stored before the hub acts on it,
and a restarted hub carries on from what it stored (or from a fleet snapshot's state, when a
restore left one to take in: :mod:`federation.hub.importing`).

No gRPC here: sessions are queues of outgoing messages, watchers are queues of events;
:mod:`federation.hub.services` puts them on the wire. Nor does the hub decide what its parts
do: it calls them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

from opentelemetry import trace

from federation.client.discovery import HubFiles
from federation.hub import importing
from federation.hub.dispatching import Dispatching
from federation.hub.membership import Membership, State
from federation.hub.running import Running
from federation.hub.sending import Session
from federation.hub.sessions import Counters, Sessions
from federation.hub.shared import Shared
from federation.hub.store import Snapshot, Store
from federation.hub.watching import Watching
from primitives.clocks import SYSTEM_CLOCK, Clock
from primitives.tasks import spawn

logger = logging.getLogger(__name__)

#: Seconds from RunPlan or SubmitWorkload to the start, when the call names none.
DEFAULT_START_DELAY = 2.0
#: Seconds between two "hub stats" lines in the log.
STATS_INTERVAL = 10.0
#: Workloads running at once, by default: each is dispatched on every round of the loop, and
#: written with every change of the state.
MAX_LIVE_WORKLOADS = 50


@dataclasses.dataclass(frozen=True)
class HubSettings:
    state_dir: Path
    heartbeat_interval: float = 2.0
    grace: float = 6.0
    fsync: bool = True
    max_live_workloads: int = MAX_LIVE_WORKLOADS


class Hub:
    def __init__(self, settings: HubSettings, *, clock: Clock = SYSTEM_CLOCK,
                 tracer_provider: trace.TracerProvider | None = None) -> None:
        self.settings = settings
        self.clock = clock
        self.tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self.store = Store(HubFiles(settings.state_dir).state, fsync=settings.fsync,
                           clock=clock)
        self.membership = Membership(grace=settings.grace)
        self.connected: dict[str, Session] = {}
        shared = Shared(membership=self.membership, store=self.store, connected=self.connected,
                        clock=clock, tracer=self.tracer)
        self.watching = Watching(shared)
        self.running = Running(shared, start_delay=DEFAULT_START_DELAY)
        self.dispatching = Dispatching(shared, start_delay=DEFAULT_START_DELAY,
                                       max_live=settings.max_live_workloads)
        self.sessions = Sessions(shared, running=self.running, dispatching=self.dispatching,
                                 watching=self.watching)
        self.hub_id = ""
        self._stats_from = (0.0, Counters())
        self._ticker: asyncio.Task[None] | None = None
        self._dispatcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        files = HubFiles(self.settings.state_dir)
        snapshot = self.store.load()
        imported = importing.take(files, snapshot, self.clock.now())
        snapshot = imported or snapshot
        self.hub_id = snapshot.hub_id
        self.membership.restore(snapshot.members, self.clock.now())
        # A member that echoes the highest heartbeat number it has seen across sessions (ours
        # start again per session; others may not) still answers a restarted hub: numbers
        # counted on from the clock (milliseconds) stay above those of a hub that ran here
        # before, where numbers counted from zero would go unanswered until they passed them.
        self.sessions.seq = int(self.clock.now() * 1000)
        self.running.runs = {run.id: run for run in snapshot.runs}
        self.dispatching.workloads = {workload.id: workload for workload in snapshot.workloads}
        self.store.start(self.snapshot)
        await self.store.commit()
        if imported is not None:
            importing.taken(files)
        self._stats_from = (self.clock.now(), Counters())
        # A defect in either must not leave the hub serving without heartbeats or
        # dispatching: each runs again after a back-off, its error logged.
        self._ticker = spawn("hub-ticker", self._tick, clock=self.clock)
        self._dispatcher = spawn("hub-dispatcher", self.dispatching.dispatch_forever,
                                 clock=self.clock)
        logger.info("hub %s: %d members, %d runs, %d workloads", self.hub_id,
                    len(self.membership.members), len(self.running.runs),
                    len(self.dispatching.workloads))

    async def stop(self) -> None:
        for task in (self._ticker, self._dispatcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for session in list(self.connected.values()):
            session.close()
        self.watching.end()
        await self.store.stop()

    def snapshot(self) -> Snapshot:
        return Snapshot(hub_id=self.hub_id, members=list(self.membership.members.values()),
                        runs=list(self.running.runs.values()),
                        workloads=list(self.dispatching.workloads.values()))

    async def _tick(self) -> None:
        interval = self.settings.heartbeat_interval
        step = min(0.5, interval / 2)
        next_beat = 0.0
        next_stats = self.clock.now() + STATS_INTERVAL
        while True:
            now = self.clock.now()
            if now >= next_beat:
                self.sessions.heartbeat_all(now)
                next_beat = now + interval
            if now >= next_stats:
                logger.info("%s", self.stats(now))
                next_stats = now + STATS_INTERVAL
            self.watching.publish(self.membership.sweep(now))
            await self.clock.sleep(step)

    def stats(self, now: float) -> str:
        """Where the hub stands, and what it processed per second since the last call."""
        since, before = self._stats_from
        counters = self.sessions.counters
        self._stats_from = (now, dataclasses.replace(counters))
        seconds = max(now - since, 1e-6)
        ready = sum(member.state is State.READY for member in self.membership.members.values())
        runs, workloads = self.running.runs, self.dispatching.workloads
        running = sum(not run.finished_at for run in runs.values())
        return (f"hub stats: {len(self.membership.members)} members ({ready} Ready), "
                f"{len(self.connected)} sessions, "
                f"{(counters.heartbeats - before.heartbeats) / seconds:.1f} heartbeats/s, "
                f"{(counters.acknowledged - before.acknowledged) / seconds:.1f} acks/s "
                f"({counters.heartbeats} heartbeats, {counters.acknowledged} acks in all), "
                f"{len(runs)} runs ({running} Running), "
                f"{len(workloads)} workloads "
                f"({sum(not w.finished_at for w in workloads.values())} Running), "
                f"{len(self.watching.watchers)} watchers")
