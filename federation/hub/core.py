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

Tracing (:mod:`federation.hub.tracing`): a run and a workload each get a span, whose context
is stored with them before any command goes out; every sending of a command is a span in that
trace, and the HubMessage carries its context, so a command sent again after a reconnect or a
restart stays in the run's trace. Acks and results are taken in as children of the context
the member's message carries.
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

from opentelemetry import trace

from federation.api import fleet_pb2, member_pb2
from federation.client.tracing import RESEND, RUN_ID, WORKLOAD_ID, command_attributes
from federation.hub import convert, tracing
from federation.hub.arrivals import Arrivals, RunTime, arrival_times, run_times
from federation.hub.membership import (
    HostConflict,
    Identity,
    Inventory,
    Member,
    Membership,
    State,
)
from federation.hub.placement import Job as Gang
from federation.hub.placement import Policy, place
from federation.hub.runs import MemberPart, Part, Phase, Report, Run, parse_command_id
from federation.hub.store import Snapshot, Store
from federation.hub.workloads import JobRecord, JobState, Settings, Workload, gpu_count
from federation.hub.workloads import parse_command_id as parse_job_command_id
from primitives import propagation

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
#: Finished workloads kept (the oldest go first).
KEEP_WORKLOADS = 50
#: How often waiting Jobs look for room in the fleet, at most (s); arrivals are met on time.
DISPATCH_EVERY = 0.25
#: Room for Jobs without GPUs: the member's scheduler decides where they fit.
UNBOUNDED = 10**9


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
                 clock: Callable[[], float] = time.time,
                 tracer_provider: trace.TracerProvider | None = None) -> None:
        self.settings = settings
        self.clock = clock
        self.tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self.store = Store(settings.state_dir / "state.json", fsync=settings.fsync)
        self.membership = Membership(grace=settings.grace)
        self.runs: dict[str, Run] = {}
        self.workloads: dict[str, Workload] = {}
        self._workload_changed: dict[str, asyncio.Event] = {}
        self.sessions: dict[str, Session] = {}
        self.watchers: set[Watcher] = set()
        self._run_changed: dict[str, asyncio.Event] = {}
        #: Runs whose newest change is being written: no member hears of it until it is stored
        #: (a session opened meanwhile would otherwise be sent it, and the fan-out again).
        self._storing: set[str] = set()
        self.hub_id = ""
        self.seq = 0
        self.counters = Counters()
        self._stats_from = (0.0, Counters())
        self._ticker: asyncio.Task[None] | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._wake_dispatcher = asyncio.Event()

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
        self.workloads = {workload.id: workload for workload in snapshot.workloads}
        self.store.start(self.snapshot)
        await self.store.commit()
        self._stats_from = (self.clock(), Counters())
        self._ticker = asyncio.create_task(self._tick(), name="hub-ticker")
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="hub-dispatcher")
        logger.info("hub %s: %d members, %d runs, %d workloads", self.hub_id,
                    len(self.membership.members), len(self.runs), len(self.workloads))

    async def stop(self) -> None:
        for task in (self._ticker, self._dispatcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for session in list(self.sessions.values()):
            session.close()
        for watcher in list(self.watchers):
            with contextlib.suppress(asyncio.QueueFull):
                watcher.events.put_nowait(None)
        await self.store.stop()

    def snapshot(self) -> Snapshot:
        return Snapshot(hub_id=self.hub_id, members=list(self.membership.members.values()),
                        runs=list(self.runs.values()), workloads=list(self.workloads.values()))

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
                f"{len(self.runs)} runs ({running} Running), "
                f"{len(self.workloads)} workloads "
                f"({sum(not w.finished_at for w in self.workloads.values())} Running), "
                f"{len(self.watchers)} watchers")

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

    def open_session(self, cluster: str,
                     results: Iterable[member_pb2.CommandResult]) -> Session:
        """A member said hello: its old session (if any) ends, what it reports is taken as
        the truth about its commands, and what it never got is sent."""
        if cluster not in self.membership.members:
            raise Refused("FAILED_PRECONDITION",
                          f"cluster {cluster!r} is not registered: call Register first")
        results = list(results)
        for result in results:
            owner = _owner(result.command_id)
            if owner is not None and owner != cluster:
                raise Refused("PERMISSION_DENIED",
                              f"hello.commands: command {result.command_id!r} belongs to "
                              f"cluster {owner!r}; a member reports its own commands only")
        old = self.sessions.pop(cluster, None)
        if old is not None:
            old.close()
        session = Session(cluster)
        self.sessions[cluster] = session
        now = self.clock()
        reported = [result.command_id for result in results]
        changed = False
        for result in results:
            changed |= self._apply_result(result, now)
        for run in self._runs_of(cluster):
            changed |= run.resynced(cluster, reported, now)
            self._settle(run, now)
        for workload in self._running_workloads():
            if workload.resynced(cluster, reported, now):
                changed = True
                self._workload_touched(workload)
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

    def acknowledged(self, session: Session, command_id: str, traceparent: str = "") -> None:
        """The member has the command; ``traceparent``: the context of its execution."""
        self._check_owner(session.cluster, command_id, "ack.command_id")
        self.counters.acknowledged += 1
        self.membership.heard(session.cluster, self.clock())
        with self._taking_in("hub.command_acknowledged", traceparent, command_id,
                             tracing.command_id_attributes(session.cluster, command_id)):
            self._acknowledge(command_id)

    def _acknowledge(self, command_id: str) -> None:
        workload = self._workload_of(command_id)
        if workload is not None:
            if workload.acknowledged(command_id, self.clock()):
                self._workload_touched(workload)
            return
        run = self._run_of(command_id)
        if run is not None and run.acknowledged(command_id, self.clock()):
            self._changed(run)

    def reported(self, session: Session, result: member_pb2.CommandResult,
                 traceparent: str = "") -> None:
        """A command's result; ``traceparent``: the context the member reported it in."""
        self._check_owner(session.cluster, result.command_id, "result.command_id")
        self.membership.heard(session.cluster, self.clock())
        with self._taking_in("hub.command_result", traceparent, result.command_id,
                             tracing.result_attributes(session.cluster, result)):
            if self._apply_result(result, self.clock()):
                self.store.changed()

    def _taking_in(self, name: str, traceparent: str, command_id: str,
                   attributes: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """A member's message about a command, handled as a child of the context it carries
        (else of the command's first sending: a member that sent none stays in the trace)."""
        return tracing.continuing(self.tracer, name,
                                  traceparent or self._traceparent_of(command_id), attributes,
                                  kind=trace.SpanKind.CONSUMER)

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
        for workload in self._running_workloads():
            if workload.resynced(cluster, (), now):  # its Jobs went with it
                self._workload_touched(workload)
        if member is not None:
            self._publish([member], deleted=True)
        await self.store.commit()

    # -- runs --------------------------------------------------------------------------------

    async def run_plan(self, plan: str, selector: dict[str, Any], start_delay: float | None,
                       name: str, *, traceparent: str = "") -> Run:
        """Store a run, then send its commands; ``traceparent`` names the parent of the run's
        span (default: the current span, the call's)."""
        members = sorted(m.name for m in self.membership.members.values()
                         if convert.selects(selector, m.identity))
        if not members:
            known = ", ".join(sorted(self.membership.members)) or "none yet"
            raise Refused("FAILED_PRECONDITION",
                          f"clusters: the selector picks no registered member (members: "
                          f"{known}); change the selector or let the clusters join first")
        with self.tracer.start_as_current_span(
                "fleet.run", context=propagation.parent(traceparent),
                attributes={"fakefleet.run.name": name,
                            "fakefleet.run.members": len(members)}) as span:
            now = self.clock()
            run = Run(id=f"r{secrets.token_hex(4)}", name=name, plan=plan, selector=selector,
                      created_at=now,
                      start_at=now + (DEFAULT_START_DELAY if start_delay is None
                                      else start_delay),
                      parts={cluster: MemberPart(cluster=cluster) for cluster in members},
                      traceparent=propagation.traceparent(span))
            span.set_attribute(RUN_ID, run.id)
            self.runs[run.id] = run
            self._forget_old_runs()
            await self._store_run(run)  # stored (with its trace) before any member hears of it
            with self.tracer.start_as_current_span("hub.fanout",
                                                   attributes={RUN_ID: run.id}) as fanout:
                connected = self._fan_out(run, members, propagation.traceparent(fanout))
                fanout.set_attribute("fakefleet.fanout.connected", connected)
            self._changed(run)
        return run

    async def _store_run(self, run: Run) -> None:
        """Write the state with ``run``'s change; until then no session is sent its commands."""
        self._storing.add(run.id)
        try:
            await self.store.commit()
        finally:
            self._storing.discard(run.id)

    def _fan_out(self, run: Run, clusters: Iterable[str], parent: str) -> int:
        """Send what ``run`` still owes each connected member of ``clusters``, each sending a
        child of ``parent``; returns how many were connected."""
        connected = 0
        for cluster in clusters:
            session = self.sessions.get(cluster)
            if session is not None:
                connected += 1
                self._send_outstanding(session, self.clock(), runs=[run], parent=parent)
        return connected

    async def cancel_run(self, run_id: str) -> Run:
        run = self.get_run(run_id)
        if run.cancel(self.clock()):
            # In the run's trace, which holds all that the run did; linked to the call that
            # asked for it.
            with tracing.continuing(self.tracer, "hub.cancel_run", run.traceparent,
                                    {RUN_ID: run.id},
                                    links=propagation.links(propagation.traceparent())) as span:
                await self._store_run(run)
                self._fan_out(run, run.parts, tracing.of(span))
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

    # -- workloads ---------------------------------------------------------------------------

    async def submit_workload(self, settings: Settings, arrivals: Arrivals, run_time: RunTime,
                              spec: dict[str, object], name: str,
                              start_delay: float | None, *, traceparent: str = "") -> Workload:
        """Store a workload for the dispatcher; ``traceparent`` names the parent of its span
        (default: the current span, the call's). Its Jobs' commands go out in its trace."""
        self._check_targets(settings)
        with self.tracer.start_as_current_span(
                "fleet.workload", context=propagation.parent(traceparent),
                attributes={"fakefleet.workload.name": name,
                            "fakefleet.workload.jobs": settings.jobs,
                            "fakefleet.workload.placement": settings.placement}) as span:
            workload = self._new_workload(settings, arrivals, run_time, spec, name,
                                          start_delay, propagation.traceparent(span))
            span.set_attribute(WORKLOAD_ID, workload.id)
            self.workloads[workload.id] = workload
            self._forget_old_workloads()
            await self.store.commit()  # stored before any Job is dispatched
        logger.info("workload %s (%s): %d Jobs of %d pods, placement %s", workload.id,
                    name or "unnamed", settings.jobs, settings.pods, settings.placement)
        self._wake_dispatcher.set()
        return workload

    def _new_workload(self, settings: Settings, arrivals: Arrivals, run_time: RunTime,
                      spec: dict[str, object], name: str, start_delay: float | None,
                      traceparent: str) -> Workload:
        now = self.clock()
        start = now + (DEFAULT_START_DELAY if start_delay is None else start_delay)
        arrive = arrival_times(arrivals, settings.jobs, settings.seed)
        runs = run_times(run_time, settings.jobs, settings.seed)
        return Workload(
            id=f"w{secrets.token_hex(4)}", name=name, spec=spec, settings=settings,
            created_at=now, start_at=start,
            jobs=[JobRecord(index=index, arrive_at=start + at, run_seconds=seconds)
                  for index, (at, seconds) in enumerate(zip(arrive, runs, strict=True))],
            traceparent=traceparent)

    def get_workload(self, workload_id: str) -> Workload:
        workload = self.workloads.get(workload_id)
        if workload is None:
            raise Refused("NOT_FOUND", f"workload_id: no workload {workload_id!r} (the hub "
                                       f"keeps the {KEEP_WORKLOADS} newest finished ones)")
        return workload

    def workload_changed(self, workload_id: str) -> asyncio.Event:
        """Set at the next change of the workload."""
        return self._workload_changed.setdefault(workload_id, asyncio.Event())

    def _check_targets(self, settings: Settings) -> None:
        members = self.membership.members
        if settings.placement == "manager":
            if settings.manager not in members:
                raise Refused("FAILED_PRECONDITION",
                              f"target.manager: {settings.manager!r} is not a member of the "
                              f"fleet (members: {', '.join(sorted(members)) or 'none yet'}); "
                              f"let it join first")
            return
        selected = self._selected(settings)
        if not selected:
            raise Refused("FAILED_PRECONDITION",
                          f"target.clusters: the selector picks no registered member "
                          f"(members: {', '.join(sorted(members)) or 'none yet'}); change it "
                          f"or let the clusters join first")
        unknown = [name for name in _names(settings) if name not in members]
        if unknown:
            raise Refused("FAILED_PRECONDITION",
                          f"target.clusters.names: {', '.join(unknown)} not in the fleet")
        gang = settings.gpus_per_job
        largest = max(self._capacity(members[name], settings.gpus_per_pod) for name in selected)
        if gang and largest < gang:
            raise Refused("FAILED_PRECONDITION",
                          f"spec: a Job needs {gang} GPUs ({settings.pods} pods x "
                          f"{settings.gpus_per_pod}), and the largest selected member has room "
                          f"for {largest}; it could never be placed: ask for fewer pods or "
                          f"GPUs, or select larger clusters")

    def _selected(self, settings: Settings) -> list[str]:
        return sorted(name for name, member in self.membership.members.items()
                      if convert.selects(dict(settings.selector), member.identity)
                      and name != settings.manager)

    @staticmethod
    def _capacity(member: Member, gpus_per_pod: int) -> int:
        """GPUs a member has room for in gangs of such pods (whole pods per Ready node)."""
        if gpus_per_pod <= 0:
            return UNBOUNDED
        return sum(pool.ready * (gpu_count(pool.allocatable.get("nvidia.com/gpu", "0"))
                                 // gpus_per_pod) * gpus_per_pod
                   for pool in member.inventory.pools)

    async def _dispatch_loop(self) -> None:
        while True:
            now = self.clock()
            try:
                wait = self.dispatch(now)
            except Exception:
                logger.exception("dispatching workloads failed")
                wait = 1.0
            self._wake_dispatcher.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_dispatcher.wait(), wait)

    def dispatch(self, now: float) -> float:
        """Place what arrived, send what is placed, sample utilisation; returns how long
        until there may be more to do."""
        wait = DISPATCH_EVERY
        for workload in self._running_workloads():
            changed = False
            due = workload.due(now)
            if due:
                if workload.settings.placement == "manager":
                    for job in due:
                        workload.place(job, workload.settings.manager)
                    changed = True
                else:
                    changed |= self._place(workload, due)
            for job in workload.jobs:
                if job.state is JobState.PLACED:
                    session = self.sessions.get(job.cluster)
                    if session is not None and \
                            (sent := self._send_job(session, workload, job)) is not None:
                        changed |= workload.sent(job, now)
                        changed |= workload.traced(job, sent)
            changed |= workload.sample(now, self._total_gpus(workload.settings))
            if changed:
                self._workload_touched(workload)
            upcoming = workload.next_arrival()
            if upcoming is not None and upcoming > now:
                wait = min(wait, upcoming - now)
        return max(wait, 0.01)

    def _place(self, workload: Workload, due: list[JobRecord]) -> bool:
        settings = workload.settings
        held: dict[str, int] = {}
        for other in self._running_workloads():
            for cluster, gpus in other.gpus_held().items():
                held[cluster] = held.get(cluster, 0) + gpus
        members = self.membership.members
        free = {name: self._capacity(members[name], settings.gpus_per_pod) - held.get(name, 0)
                for name in self._selected(settings)
                if members[name].state is State.READY}
        if settings.placement == "clusters":
            names = [name for name in _names(settings) if name in free]
            if not names:
                return False
        else:
            names = []
        policy: Policy = "named" if settings.placement == "clusters" else \
            "spread" if settings.placement == "manager" else settings.placement
        gang = Gang(pods=settings.pods, gpus_per_pod=settings.gpus_per_pod)

        def choose(options: dict[str, int], seed: int) -> str | None:
            if policy == "named" and not any(n in options for n in names):
                return None
            return place([gang], options, policy, seed=seed,
                         weights={n: w for n, w in settings.weights.items() if n in options},
                         names=[n for n in names if n in options],
                         after=workload.last_turn)[0]

        placed_any = False
        for job in due:
            seed = settings.seed * 1_000_003 + job.index * 31 + job.attempt
            chosen = None
            if job.avoid and len(free) > 1:  # a retry goes elsewhere if it can
                chosen = choose({n: g for n, g in free.items() if n != job.avoid}, seed)
            if chosen is None:
                chosen = choose(free, seed)
            if chosen is None:
                continue
            free[chosen] -= settings.gpus_per_job
            workload.place(job, chosen)
            workload.last_turn = chosen
            placed_any = True
        return placed_any

    def _total_gpus(self, settings: Settings) -> int:
        members = self.membership.members
        return sum(gpu_count(members[name].inventory.allocatable.get("nvidia.com/gpu", "0"))
                   for name in self._selected(settings))

    def _running_workloads(self) -> list[Workload]:
        return sorted((w for w in self.workloads.values() if not w.finished_at),
                      key=lambda w: w.created_at)

    def _workload_of(self, command_id: str) -> Workload | None:
        parsed = parse_job_command_id(command_id)
        return None if parsed is None else self.workloads.get(parsed[0])

    def _workload_touched(self, workload: Workload) -> None:
        now = self.clock()
        if workload.settle(now):
            report = workload.report(now)
            logger.info("workload %s %s: %d succeeded, %d failed in %.1fs", workload.id,
                        workload.phase.value, report.counts.succeeded, report.counts.failed,
                        report.makespan)
        self.store.changed()
        self._wake_dispatcher.set()
        event = self._workload_changed.pop(workload.id, None)
        if event is not None:
            event.set()

    def _forget_old_workloads(self) -> None:
        finished = sorted((w for w in self.workloads.values() if w.finished_at),
                          key=lambda w: w.created_at, reverse=True)
        for workload in finished[KEEP_WORKLOADS:]:
            del self.workloads[workload.id]

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
                          runs: Iterable[Run] | None = None, *, parent: str = "") -> bool:
        """Send the member what it must still be sent: of ``runs`` (default: of every run and
        workload); a first sending is a child of ``parent`` (default: the run's span)."""
        changed = False
        for run in runs if runs is not None else self._runs_of(session.cluster):
            if run.id in self._storing:  # its fan-out follows the write
                continue
            for command in run.outstanding(session.cluster):
                sent = self._send_command(session, convert.command_message(command),
                                          run.traceparent_of(command.id),
                                          parent or run.traceparent)
                if sent is None:
                    return changed
                changed |= run.sent(session.cluster, now)
                changed |= run.traced(command.id, sent)
        if runs is None:
            for workload in self._running_workloads():
                for job in workload.jobs:
                    if job.cluster == session.cluster and job.state in (JobState.PLACED,
                                                                        JobState.SENT):
                        sent = self._send_job(session, workload, job)
                        if sent is None:
                            return changed
                        workload.sent(job, now)
                        workload.traced(job, sent)
                        changed = True
        return changed

    def _send_job(self, session: Session, workload: Workload, job: JobRecord) -> str | None:
        return self._send_command(session, convert.job_command_message(workload, job),
                                  job.traceparent, workload.traceparent)

    def _send_command(self, session: Session, message: member_pb2.HubMessage, first: str,
                      parent: str) -> str | None:
        """Send a command in a ``hub.send_command`` span, whose context the message carries:
        a child of the command's first sending (``first``) when this one repeats it, else of
        ``parent``. Returns that context ("" untraced), or None when the session took
        nothing."""
        if session.closed:
            return None
        attributes = command_attributes(session.cluster, message.command) | {RESEND: bool(first)}
        with tracing.continuing(self.tracer, "hub.send_command", first or parent, attributes,
                                kind=trace.SpanKind.PRODUCER) as span:
            message.traceparent = tracing.of(span)
            if not session.send(message):
                if span is not None:
                    span.set_status(trace.StatusCode.ERROR,
                                    "the member's session fell behind and was dropped")
                return None
        return message.traceparent

    def _runs_of(self, cluster: str) -> list[Run]:
        return sorted((run for run in self.runs.values() if cluster in run.parts),
                      key=lambda run: run.created_at)

    def _run_of(self, command_id: str) -> Run | None:
        parsed = parse_command_id(command_id)
        return None if parsed is None else self.runs.get(parsed[0])

    def _traceparent_of(self, command_id: str) -> str:
        """The context of the first sending of a command of this hub ("" if none)."""
        workload = self._workload_of(command_id)
        if workload is not None:
            return workload.traceparent_of(command_id)
        run = self._run_of(command_id)
        return run.traceparent_of(command_id) if run is not None else ""

    def _check_owner(self, cluster: str, command_id: str, field: str) -> None:
        owner = _owner(command_id)
        if owner is not None and owner != cluster:
            raise Refused("PERMISSION_DENIED",
                          f"{field}: command {command_id!r} belongs to cluster {owner!r}; "
                          f"this session speaks for {cluster!r}")

    def _apply_result(self, result: member_pb2.CommandResult, now: float) -> bool:
        workload = self._workload_of(result.command_id)
        if workload is not None:
            if not workload.reported(result.command_id, convert.progress(result), now):
                return False
            self._workload_touched(workload)
            return True
        return self._apply_report(convert.report(result), now)

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


def _owner(command_id: str) -> str | None:
    """The cluster a command of this hub was made for (its id's middle part)."""
    if parse_command_id(command_id) is None and parse_job_command_id(command_id) is None:
        return None
    return command_id.split("/")[1]


def _names(settings: Settings) -> list[str]:
    names = settings.selector.get("names") or []
    assert isinstance(names, list)
    return [str(name) for name in names]
